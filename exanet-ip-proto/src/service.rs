//! The IP service of one node as a state machine without I/O.
//!
//! The shell (the `exanet-ip` program) feeds it packets from the TUN device
//! ([`IpService::from_host`]), the control messages and completion notifications its
//! endpoint receives, and the results of what it posted; it pulls RDMA writes and messages
//! to post ([`IpService::poll_write`], [`IpService::poll_message`]) whenever it has a
//! free channel, and writes the packets [`IpService::on_notification`] returns to the TUN
//! device. Every packet the service does not deliver is counted under a [`Drop`] reason.
//!
//! Per peer, the service keeps the stream it writes (its head and the credit the peer
//! returned) and the stream it reads (its tail). One batch per peer is in flight at a
//! time: packets that queue meanwhile go together in the next batch, which is what packs
//! several packets into one transfer under load and costs nothing when idle.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use crate::addr::RackSubnet;
use crate::packet::{ipv4_destination, NotIpv4};
use crate::wire::{self, Control, WireError, BATCH_HEADER, PACKET_PREFIX};
use exanet_proto::Instant;
use exanet_proto::NodeId;

/// Batches a writer may have in flight to one peer at most: each has a notification slot
/// of its own after the ring, so the reader tells them apart when they complete out of
/// order.
pub const NOTIFY_SLOTS: u32 = 8;
/// Bytes of one notification slot (the NI writes 16).
const NOTIFY_BYTES: u64 = 16;
/// Bytes kept after each ring for its notification slots.
pub const NOTIFY_SLOT: u64 = NOTIFY_SLOTS as u64 * NOTIFY_BYTES;
/// How long ring space taken back (less than a quarter of the ring) may wait before it is
/// returned: a stream of small packets returns it once per this, not once per batch, and
/// a writer that fell quiet has all of it back this long after the last batch was read.
pub const CREDIT_DELAY_NS: u64 = 5_000_000;

/// Why a packet (or a batch or message of a peer) was not carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Drop {
    /// From the host: not IPv4 (IPv6, or not IP at all).
    NotIpv4,
    /// From the host: to an address that is not a node of the rack.
    NotInRack,
    /// From the host: larger than the MTU or than a batch for that peer can hold.
    TooBig,
    /// The peer's service is not running (or stopped answering); it is asked again after
    /// the retry interval.
    PeerDown,
    /// More bytes queued for the peer than the queue holds (the peer is slow or its
    /// ring is full): the host's congestion control backs off, as with a full qdisc.
    QueueFull,
    /// From the fabric: a batch, packet or message that does not parse or add up.
    Malformed,
    /// From the fabric: a packet not addressed to this node.
    NotForMe,
    /// From the fabric: a batch or credit of a stream that was replaced.
    Stale,
}

impl Drop {
    pub const ALL: [Drop; 8] = [
        Drop::NotIpv4,
        Drop::NotInRack,
        Drop::TooBig,
        Drop::PeerDown,
        Drop::QueueFull,
        Drop::Malformed,
        Drop::NotForMe,
        Drop::Stale,
    ];

    /// The `reason` label of its metric.
    pub fn label(self) -> &'static str {
        match self {
            Drop::NotIpv4 => "not_ipv4",
            Drop::NotInRack => "not_in_rack",
            Drop::TooBig => "too_big",
            Drop::PeerDown => "peer_down",
            Drop::QueueFull => "queue_full",
            Drop::Malformed => "malformed",
            Drop::NotForMe => "not_for_me",
            Drop::Stale => "stale",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The service's settings.
#[derive(Clone, Debug)]
pub struct IpConfig {
    pub me: NodeId,
    pub subnet: RackSubnet,
    /// The TUN device's MTU: the largest packet carried.
    pub mtu: u32,
    /// Bytes of each per-peer receive ring.
    pub ring_len: u32,
    /// Largest batch this service writes (also bounded by a quarter of the peer's ring).
    pub max_batch: u32,
    /// Bytes of packets queued per peer before new ones are dropped.
    pub queue_limit: usize,
    /// Rings per slab of receive memory: a slab is registered when the first peer among
    /// its rings opens a stream to this service, so that an idle rack does not commit a
    /// ring per pair of nodes (which took 4.4 GB at 128 nodes).
    pub slab_rings: u32,
    /// First stream number this service opens (random per start, so that a peer tells a
    /// restarted service from the old one).
    pub first_stream: u32,
    /// How long to wait for a `Ring` answer, and before asking a peer found down again.
    pub retry_ns: u64,
    /// Batches in flight to one peer at most (1..=[`NOTIFY_SLOTS`]): more keep the path
    /// busy while each batch waits for its notification's round trip.
    pub max_in_flight: u32,
}

impl IpConfig {
    /// Bytes from one ring (with its notification slot) to the next in the receive area.
    pub fn stride(&self) -> u64 {
        u64::from(self.ring_len) + NOTIFY_SLOT
    }

    /// Bytes of the receive area if every slab were registered: a ring for every node id
    /// of the rack (the own one unused keeps the arithmetic plain). Offsets in it name a
    /// ring's bytes whichever slab holds them.
    pub fn area_len(&self) -> u64 {
        self.stride() * u64::from(self.subnet.nodes())
    }

    /// Rings per slab (a slab holds one at least, whatever `check` was asked).
    fn rings_per_slab(&self) -> u32 {
        self.slab_rings.max(1)
    }

    /// The slab holding the ring node `id` writes.
    pub fn slab_of(&self, id: NodeId) -> u32 {
        id.0 / self.rings_per_slab()
    }

    /// Offset in the receive area from one slab to the next: `slab_rings` rings with
    /// their notification slots.
    pub fn slab_span(&self) -> u64 {
        self.stride() * u64::from(self.rings_per_slab())
    }

    /// Bytes of slab `slab`: its rings (the last slab holds what is left of the rack's).
    pub fn slab_len(&self, slab: u32) -> u64 {
        let per = self.rings_per_slab();
        let rings = self
            .subnet
            .nodes()
            .saturating_sub(slab.saturating_mul(per))
            .min(per);
        self.stride() * u64::from(rings)
    }

    /// Slabs of the whole area.
    pub fn slabs(&self) -> u32 {
        self.subnet.nodes().div_ceil(self.rings_per_slab())
    }

    /// The smallest batch limit that still carries an MTU-sized packet.
    pub fn min_batch(&self) -> u32 {
        (BATCH_HEADER + PACKET_PREFIX) as u32 + self.mtu
    }

    /// Settings that cannot work, in words.
    pub fn check(&self) -> Result<(), String> {
        if self.mtu < 68 || self.mtu > 65535 {
            return Err(format!("MTU {} outside 68..=65535", self.mtu));
        }
        if self.slab_rings == 0 {
            return Err("a slab of receive memory must hold at least one ring".to_string());
        }
        if !(1..=NOTIFY_SLOTS).contains(&self.max_in_flight) {
            return Err(format!(
                "{} batches in flight per peer: 1..={NOTIFY_SLOTS}",
                self.max_in_flight
            ));
        }
        if self.max_batch < self.min_batch() {
            return Err(format!(
                "a batch of {} bytes cannot hold a packet of the MTU ({})",
                self.max_batch, self.mtu
            ));
        }
        if u64::from(self.ring_len) < 4 * u64::from(self.min_batch()) {
            return Err(format!(
                "a ring of {} bytes must hold four batches of an MTU-sized packet ({} bytes)",
                self.ring_len,
                4 * self.min_batch()
            ));
        }
        Ok(())
    }
}

/// What the service counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IpStats {
    pub packets_out: u64,
    pub bytes_out: u64,
    pub packets_in: u64,
    pub bytes_in: u64,
    pub batches_out: u64,
    pub batches_in: u64,
    /// Times a batch waited for the peer to return ring space.
    pub credit_stalls: u64,
    /// Streams opened (the first to each peer and one after every failed write).
    pub streams_opened: u64,
    drops: [u64; Drop::ALL.len()],
}

impl IpStats {
    pub fn dropped(&self, why: Drop) -> u64 {
        self.drops[why.index()]
    }

    pub fn drops_total(&self) -> u64 {
        self.drops.iter().sum()
    }
}

/// Which kind of message a posted message was, so its result goes to the right state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerOp {
    Open,
    Ring,
    Credit,
    Batch,
}

/// Something for the shell to post.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outgoing {
    /// RDMA-write `batch` at `dst_va` of the peer's service rank, with a completion
    /// notification at `notify_va`; report with [`IpService::write_done`] and `seq`.
    Write {
        peer: NodeId,
        seq: u32,
        dst_va: u64,
        notify_va: u64,
        batch: Vec<u8>,
    },
    /// Send `bytes` to the peer service's mailbox; report with
    /// [`IpService::message_done`].
    Message {
        peer: NodeId,
        op: PeerOp,
        bytes: Vec<u8>,
    },
}

/// Where the ring the peer gave us is.
#[derive(Clone, Copy, Debug)]
struct Remote {
    ring_va: u64,
    ring_len: u32,
    notify_va: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opening {
    /// No stream open and none asked for.
    Closed,
    /// An `Open` is to be sent (or is being sent).
    Wanted,
    /// `Open` delivered at `at`; waiting for `Ring`.
    Asked { at: Instant },
    /// `Ring` received: writing.
    Open,
    /// The peer's service did not answer; packets for it are dropped until `until`.
    Down { until: Instant },
}

#[derive(Debug)]
struct InFlight {
    seq: u32,
    packets: u64,
    bytes: u64,
    stream: u32,
}

#[derive(Debug)]
struct Peer {
    // Writing: our stream into the peer's ring.
    stream: u32,
    opening: Opening,
    open_posted: bool,
    remote: Option<Remote>,
    head: u64,
    credit: u64,
    seq: u32,
    queue: VecDeque<Vec<u8>>,
    queued: usize,
    writing: Vec<InFlight>,
    /// The `Batch` message to send for the batch just written to an idle path.
    early: Option<Control>,
    // Reading: the peer's stream into our ring.
    rx_stream: Option<u32>,
    tail: u64,
    rx_seq: u32,
    /// Lengths of batches whose notification came before an earlier batch's, by slot.
    arrived: [Option<u64>; NOTIFY_SLOTS as usize],
    /// Batches taken, in order, with where they end and whether their notification came:
    /// ring space is returned only up to the first batch whose notification has not, since
    /// until then the NI may still be writing (retransmitting) into it.
    unconfirmed: VecDeque<(u32, u64, bool)>,
    /// Where the ring space that may be returned ends.
    credit_pos: u64,
    /// What the last credit posted returned up to.
    credit_sent: u64,
    ring_owed: bool,
    /// The peer opened a stream before its ring's slab was registered: the `Ring` answer
    /// waits for it.
    ring_waits: bool,
    credit_wanted: bool,
    credit_posted: bool,
    // Whether the peer is in the message queue.
    listed: bool,
}

impl Peer {
    fn new(stream: u32) -> Peer {
        Peer {
            stream,
            opening: Opening::Closed,
            open_posted: false,
            remote: None,
            head: 0,
            credit: 0,
            seq: 0,
            queue: VecDeque::new(),
            queued: 0,
            writing: Vec::new(),
            early: None,
            rx_stream: None,
            tail: 0,
            rx_seq: 0,
            arrived: [None; NOTIFY_SLOTS as usize],
            unconfirmed: VecDeque::new(),
            credit_pos: 0,
            credit_sent: 0,
            ring_owed: false,
            ring_waits: false,
            credit_wanted: false,
            credit_posted: false,
            listed: false,
        }
    }

    /// Whether no write of a replaced stream is still in flight. A new stream is opened
    /// only then: the reader forgets the old stream on `Open`, and a notification of the
    /// old stream arriving after it would be taken for one of the new.
    fn old_writes_done(&self) -> bool {
        self.writing.iter().all(|w| w.stream == self.stream)
    }

    /// Ring space up to the first unconfirmed batch may be returned. It is, once a
    /// quarter of the ring (`ring_len`) is owed, not after every batch: each credit is a
    /// message and a wake-up of both services (of NetPIPE's small messages, one in three
    /// messages and wake-ups was a credit). The writer never waits for what is held back:
    /// a batch takes at most a quarter of the ring, and the padding before it less than
    /// that, so with everything it wrote taken it still has room for the next. Returns
    /// whether space is owed but held back (see [`CREDIT_DELAY_NS`]).
    fn settle(&mut self, ring_len: u32) -> bool {
        while let Some(&(_, end, true)) = self.unconfirmed.front() {
            self.unconfirmed.pop_front();
            self.credit_pos = end;
        }
        let owed = self.credit_pos.saturating_sub(self.credit_sent);
        if owed >= u64::from(ring_len / 4) {
            self.credit_wanted = true;
        }
        owed > 0 && !self.credit_wanted
    }

    fn has_message(&self) -> bool {
        (self.opening == Opening::Wanted && !self.open_posted && self.old_writes_done())
            || self.early.is_some()
            || self.ring_owed
            || (self.credit_wanted && !self.credit_posted)
    }
}

/// Where a batch of `len` bytes goes in a ring of `ring` bytes whose writer is at `head`:
/// its offset and the padding skipped before it. A batch never wraps: when it does not fit
/// before the ring's end it starts at offset 0. Writer and reader apply the same rule.
fn place(head: u64, ring: u32, len: u64) -> (u64, u64) {
    let ring = u64::from(ring);
    let start = head % ring;
    if start + len > ring {
        (0, ring - start)
    } else {
        (start, 0)
    }
}

/// The IP service of one node.
#[derive(Debug)]
pub struct IpService {
    cfg: IpConfig,
    me_addr: Option<Ipv4Addr>,
    peers: Vec<Peer>,
    messages: VecDeque<u32>,
    next_write: usize,
    /// The earliest moment an unanswered `Open` is due to be sent again, if any is waiting:
    /// [`IpService::on_tick`] runs on every event, and looks at the peers only then.
    retry_due: Option<Instant>,
    /// Some peer is owed ring space below the quarter that sends it at once: it goes when
    /// `credit_due` comes (set at the first tick after it was owed).
    credit_owed: bool,
    credit_due: Option<Instant>,
    stats: IpStats,
    /// Each slab of receive memory: its VA once registered.
    slabs: Vec<Slab>,
    /// Slabs to register, in the order peers asked.
    slabs_wanted: VecDeque<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slab {
    Absent,
    /// Asked of the shell ([`IpService::poll_register`]).
    Asked,
    At(u64),
}

impl IpService {
    pub fn new(cfg: IpConfig) -> IpService {
        let peers = (0..cfg.subnet.nodes())
            .map(|_| Peer::new(cfg.first_stream))
            .collect();
        IpService {
            me_addr: cfg.subnet.node_addr(cfg.me),
            slabs: vec![Slab::Absent; cfg.slabs() as usize],
            slabs_wanted: VecDeque::new(),
            cfg,
            peers,
            messages: VecDeque::new(),
            next_write: 0,
            retry_due: None,
            credit_owed: false,
            credit_due: None,
            stats: IpStats::default(),
        }
    }

    pub fn config(&self) -> &IpConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &IpStats {
        &self.stats
    }

    fn drop(&mut self, why: Drop, n: u64) -> Drop {
        self.stats.drops[why.index()] += n;
        why
    }

    /// Bytes written into peers' rings and not yet returned, over all peers.
    pub fn ring_occupancy(&self) -> u64 {
        self.peers.iter().map(|p| p.head - p.credit).sum()
    }

    /// Bytes of packets waiting for a batch, over all peers.
    pub fn queued_bytes(&self) -> u64 {
        self.peers.iter().map(|p| p.queued as u64).sum()
    }

    fn peer_index(&self, id: NodeId) -> Option<usize> {
        let i = id.0 as usize;
        (i < self.peers.len() && id != self.cfg.me).then_some(i)
    }

    fn list(&mut self, i: usize) {
        let p = &mut self.peers[i];
        if !p.listed && p.has_message() {
            p.listed = true;
            self.messages.push_back(i as u32);
        }
    }

    /// VAs of the ring node `id` writes and of its notification slots, once its slab is
    /// registered.
    fn ring_of(&self, id: NodeId) -> Option<(u64, u64)> {
        let slab = self.cfg.slab_of(id);
        let Some(Slab::At(va)) = self.slabs.get(slab as usize) else {
            return None;
        };
        let base = va + (self.ring_offset(id) - u64::from(slab) * self.cfg.slab_span());
        Some((base, base + u64::from(self.cfg.ring_len)))
    }

    /// A slab of receive memory to register (its index and length), if a peer waits for
    /// one. Answer with [`IpService::registered`].
    pub fn poll_register(&mut self) -> Option<(u32, u64)> {
        let slab = self.slabs_wanted.pop_front()?;
        self.slabs[slab as usize] = Slab::Asked;
        Some((slab, self.cfg.slab_len(slab)))
    }

    /// Slab `slab` is registered at `va` (`None`: it could not be; a peer's next `Open`
    /// asks again). The peers that wait for a ring in it get their answer.
    pub fn registered(&mut self, slab: u32, va: Option<u64>) {
        let Some(s) = self.slabs.get_mut(slab as usize) else {
            return;
        };
        if *s != Slab::Asked {
            return;
        }
        *s = va.map_or(Slab::Absent, Slab::At);
        if va.is_none() {
            return;
        }
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if p.ring_waits && self.cfg.slab_of(NodeId(i as u32)) == slab {
                p.ring_waits = false;
                p.ring_owed = true;
                self.list(i);
            }
        }
    }

    /// Bytes of receive memory registered.
    pub fn registered_bytes(&self) -> u64 {
        (0..self.slabs.len() as u32)
            .filter(|&k| matches!(self.slabs[k as usize], Slab::At(_)))
            .map(|k| self.cfg.slab_len(k))
            .sum()
    }

    /// Offset in the receive area of the ring that node `id` writes.
    pub fn ring_offset(&self, id: NodeId) -> u64 {
        self.cfg.stride() * u64::from(id.0)
    }

    /// A packet the host sent. `Err` says why it was dropped (and counted).
    pub fn from_host(&mut self, pkt: &[u8], now: Instant) -> Result<(), Drop> {
        let dst = match ipv4_destination(pkt) {
            Ok(d) => d,
            Err(NotIpv4::Version(_)) => return Err(self.drop(Drop::NotIpv4, 1)),
            Err(NotIpv4::Malformed) => return Err(self.drop(Drop::Malformed, 1)),
        };
        let Some(i) = self
            .cfg
            .subnet
            .node_of(dst)
            .and_then(|id| self.peer_index(id))
        else {
            return Err(self.drop(Drop::NotInRack, 1));
        };
        if pkt.len() > self.cfg.mtu as usize {
            return Err(self.drop(Drop::TooBig, 1));
        }
        let limit = self.cfg.queue_limit;
        let p = &mut self.peers[i];
        match p.opening {
            Opening::Down { until } if now < until => return Err(self.drop(Drop::PeerDown, 1)),
            Opening::Down { .. } | Opening::Closed => {
                p.opening = Opening::Wanted;
                p.open_posted = false;
            }
            _ => {}
        }
        if p.queued + pkt.len() > limit {
            return Err(self.drop(Drop::QueueFull, 1));
        }
        p.queued += pkt.len();
        p.queue.push_back(pkt.to_vec());
        self.list(i);
        Ok(())
    }

    /// When [`IpService::on_tick`] next has something to do (an unanswered ring request to
    /// ask again), if ever: a driver sleeps until then, not on a fixed period.
    pub fn next_tick(&self) -> Option<Instant> {
        match (self.retry_due, self.credit_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passes: `Open`s unanswered for the retry interval are sent again, and ring
    /// space held back for [`CREDIT_DELAY_NS`] is returned.
    pub fn on_tick(&mut self, now: Instant) {
        self.return_held_credit(now);
        if self.retry_due.is_none_or(|due| now < due) {
            return;
        }
        let retry = self.cfg.retry_ns;
        self.retry_due = None;
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if let Opening::Asked { at } = p.opening {
                let due = Instant(at.0.saturating_add(retry));
                if now >= due {
                    p.opening = Opening::Wanted;
                    p.open_posted = false;
                    self.list(i);
                } else {
                    self.retry_due = Some(self.retry_due.map_or(due, |d| d.min(due)));
                }
            }
        }
    }

    fn return_held_credit(&mut self, now: Instant) {
        if !self.credit_owed {
            return;
        }
        let due = *self
            .credit_due
            .get_or_insert(Instant(now.0.saturating_add(CREDIT_DELAY_NS)));
        if now < due {
            return;
        }
        self.credit_owed = false;
        self.credit_due = None;
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if p.rx_stream.is_some() && p.credit_pos > p.credit_sent && !p.credit_wanted {
                p.credit_wanted = true;
                self.list(i);
            }
        }
    }

    /// The next message to send, if any (call while a packetizer channel is free).
    pub fn poll_message(&mut self) -> Option<Outgoing> {
        while let Some(i) = self.messages.pop_front() {
            let i = i as usize;
            let peer = NodeId(i as u32);
            // A ring is owed only once its slab is registered.
            let ring = self.ring_of(peer);
            let p = &mut self.peers[i];
            p.listed = false;
            let out = if let Some(m) = p.early.take() {
                Some((PeerOp::Batch, m))
            } else if let Some((ring_va, notify_va)) = ring.filter(|_| p.ring_owed) {
                p.ring_owed = false;
                let stream = p.rx_stream.unwrap_or_default();
                Some((
                    PeerOp::Ring,
                    Control::Ring {
                        stream,
                        ring_va,
                        ring_len: self.cfg.ring_len,
                        notify_va,
                    },
                ))
            } else if p.opening == Opening::Wanted && !p.open_posted && p.old_writes_done() {
                p.open_posted = true;
                Some((PeerOp::Open, Control::Open { stream: p.stream }))
            } else if p.credit_wanted && !p.credit_posted {
                p.credit_wanted = false;
                p.credit_posted = true;
                p.credit_sent = p.credit_pos;
                Some((
                    PeerOp::Credit,
                    Control::Credit {
                        stream: p.rx_stream.unwrap_or_default(),
                        consumed: p.credit_pos,
                    },
                ))
            } else {
                None
            };
            // Whatever else it has goes behind the other peers' messages.
            self.list(i);
            if let Some((op, msg)) = out {
                return Some(Outgoing::Message {
                    peer,
                    op,
                    bytes: msg.encode(),
                });
            }
        }
        None
    }

    /// How a message from [`IpService::poll_message`] ended.
    pub fn message_done(&mut self, peer: NodeId, op: PeerOp, delivered: bool, now: Instant) {
        let Some(i) = self.peer_index(peer) else {
            return;
        };
        let retry = self.cfg.retry_ns;
        let p = &mut self.peers[i];
        match op {
            PeerOp::Open => {
                p.open_posted = false;
                if p.opening != Opening::Wanted {
                    // Answered (or given up) while the message was in flight.
                } else if delivered {
                    p.opening = Opening::Asked { at: now };
                    let due = Instant(now.0.saturating_add(retry));
                    self.retry_due = Some(self.retry_due.map_or(due, |d| d.min(due)));
                } else {
                    let n = p.queue.len() as u64;
                    p.queue.clear();
                    p.queued = 0;
                    p.opening = Opening::Down {
                        until: Instant(now.0.saturating_add(retry)),
                    };
                    self.drop(Drop::PeerDown, n);
                }
            }
            // A lost answer is asked for again by the peer's retry; a lost Batch message
            // leaves the batch to its notification.
            PeerOp::Ring | PeerOp::Batch => {}
            PeerOp::Credit => {
                p.credit_posted = false;
                // A credit that did not arrive is sent again, with what is consumed now.
                if !delivered {
                    p.credit_wanted = true;
                }
            }
        }
        self.list(i);
    }

    /// A control message from `src`'s service; `read` as for
    /// [`IpService::on_notification`]. Returns the packets for the host (of a batch a
    /// `Batch` message announced).
    pub fn on_message(
        &mut self,
        src: NodeId,
        bytes: &[u8],
        mut read: impl FnMut(u64, &mut [u8]) -> bool,
    ) -> Result<Vec<Vec<u8>>, Drop> {
        let Some(i) = self.peer_index(src) else {
            return Err(self.drop(Drop::Malformed, 1));
        };
        let msg = Control::decode(bytes).map_err(|_| self.drop(Drop::Malformed, 1))?;
        let p = &mut self.peers[i];
        match msg {
            Control::Open { stream } => {
                if p.rx_stream != Some(stream) {
                    p.rx_stream = Some(stream);
                    p.tail = 0;
                    p.rx_seq = 0;
                    p.arrived = [None; NOTIFY_SLOTS as usize];
                    p.unconfirmed.clear();
                    p.credit_pos = 0;
                    p.credit_sent = 0;
                    p.credit_wanted = false;
                }
                let slab = self.cfg.slab_of(src);
                match self.slabs.get(slab as usize) {
                    Some(Slab::At(_)) => p.ring_owed = true,
                    Some(state) => {
                        // Its ring's memory first: the answer goes once it is there.
                        p.ring_waits = true;
                        if *state == Slab::Absent && !self.slabs_wanted.contains(&slab) {
                            self.slabs_wanted.push_back(slab);
                        }
                    }
                    None => return Err(self.drop(Drop::Malformed, 1)),
                }
            }
            Control::Batch {
                stream,
                seq,
                len,
                crc,
            } => {
                // Only the next batch, and only when all its bytes are there; otherwise
                // its notification brings it.
                let len = u64::from(len);
                let next = p.rx_stream == Some(stream) && seq == p.rx_seq;
                if !next || len < BATCH_HEADER as u64 || len > u64::from(self.cfg.ring_len / 4) {
                    return Ok(Vec::new());
                }
                let (start, _) = place(p.tail, self.cfg.ring_len, len);
                let mut buf = vec![0u8; len as usize];
                let base = self.ring_offset(src);
                if !read(base + start, &mut buf) || crc32fast::hash(&buf) != crc {
                    return Ok(Vec::new());
                }
                let mut out = Vec::new();
                self.take_batch(
                    i,
                    src,
                    len,
                    false,
                    &mut |o, b: &mut [u8]| {
                        let at = (o - base - start) as usize;
                        b.copy_from_slice(&buf[at..at + b.len()]);
                        true
                    },
                    &mut out,
                );
                // Later batches whose notifications came first are due now.
                self.take_arrived(i, src, &mut read, &mut out);
                self.list(i);
                return Ok(out);
            }
            Control::Ring {
                stream,
                ring_va,
                ring_len,
                notify_va,
            } => {
                if stream != p.stream
                    || !matches!(p.opening, Opening::Wanted | Opening::Asked { .. })
                {
                    return Err(self.drop(Drop::Stale, 1));
                }
                let limit = (ring_len / 4).min(self.cfg.max_batch);
                let fits = ring_va.checked_add(u64::from(ring_len)).is_some()
                    && notify_va.checked_add(NOTIFY_SLOT).is_some();
                if limit < self.cfg.min_batch() || !fits {
                    return Err(self.drop(Drop::Malformed, 1));
                }
                p.remote = Some(Remote {
                    ring_va,
                    ring_len,
                    notify_va,
                });
                p.opening = Opening::Open;
                p.head = 0;
                p.credit = 0;
                p.seq = 0;
                self.stats.streams_opened += 1;
            }
            Control::Credit { stream, consumed } => {
                if stream != p.stream || p.opening != Opening::Open {
                    return Err(self.drop(Drop::Stale, 1));
                }
                if consumed > p.head {
                    return Err(self.drop(Drop::Malformed, 1));
                }
                p.credit = p.credit.max(consumed);
            }
        }
        self.list(i);
        Ok(Vec::new())
    }

    /// The next batch to write, if a peer has packets, an open stream, no batch in flight
    /// and room in its ring (call while an RDMA write channel is free).
    pub fn poll_write(&mut self) -> Option<Outgoing> {
        let n = self.peers.len();
        for k in 0..n {
            let i = (self.next_write + k) % n;
            let p = &mut self.peers[i];
            // Batches complete out of order (a lost cell delays one), and the reader keeps a
            // notification that came early in its slot until the batches before it are in:
            // so what is bounded is the span of sequence numbers from the oldest batch not
            // completed to the next, not just how many are in flight.
            let span = p
                .writing
                .iter()
                .filter(|w| w.stream == p.stream)
                .map(|w| p.seq.wrapping_sub(w.seq))
                .max()
                .unwrap_or(0);
            let max = self.cfg.max_in_flight;
            let busy = p.writing.len() >= max as usize || span >= max;
            if busy || p.queue.is_empty() || p.opening != Opening::Open {
                continue;
            }
            let Some(remote) = p.remote else { continue };
            let limit = u64::from((remote.ring_len / 4).min(self.cfg.max_batch));
            let mut len = BATCH_HEADER as u64;
            let mut count = 0;
            for pkt in &p.queue {
                let l = (PACKET_PREFIX + pkt.len()) as u64;
                if len + l > limit {
                    break;
                }
                len += l;
                count += 1;
            }
            // The MTU check and the limit's lower bound let every queued packet fit alone.
            debug_assert!(count > 0);
            let (start, skip) = place(p.head, remote.ring_len, len);
            if p.head + skip + len - p.credit > u64::from(remote.ring_len) {
                self.stats.credit_stalls += 1;
                continue;
            }
            let packets: Vec<Vec<u8>> = p.queue.drain(..count).collect();
            let bytes: usize = packets.iter().map(Vec::len).sum();
            p.queued -= bytes;
            let batch = wire::encode_batch(p.stream, p.seq, packets.iter().map(Vec::as_slice));
            debug_assert_eq!(batch.len() as u64, len);
            p.head += skip + len;
            let seq = p.seq;
            p.seq = p.seq.wrapping_add(1);
            if p.writing.is_empty() {
                p.early = Some(Control::Batch {
                    stream: p.stream,
                    seq,
                    len: batch.len() as u32,
                    crc: crc32fast::hash(&batch),
                });
            }
            p.writing.push(InFlight {
                seq,
                packets: count as u64,
                bytes: bytes as u64,
                stream: p.stream,
            });
            self.next_write = (i + 1) % n;
            let out = Outgoing::Write {
                peer: NodeId(i as u32),
                seq,
                dst_va: remote.ring_va + start,
                notify_va: remote.notify_va + NOTIFY_BYTES * u64::from(seq % NOTIFY_SLOTS),
                batch,
            };
            // The Batch message, if any, goes after the write.
            self.list(i);
            return Some(out);
        }
        None
    }

    /// How a write from [`IpService::poll_write`] ended. A failed write leaves the peer's
    /// ring in a state the writer cannot know, so the stream is replaced by a new one.
    pub fn write_done(&mut self, peer: NodeId, seq: u32, delivered: bool, now: Instant) {
        let Some(i) = self.peer_index(peer) else {
            return;
        };
        let p = &mut self.peers[i];
        let Some(k) = p.writing.iter().position(|w| w.seq == seq) else {
            return;
        };
        let w = p.writing.swap_remove(k);
        if delivered {
            self.stats.packets_out += w.packets;
            self.stats.bytes_out += w.bytes;
            self.stats.batches_out += 1;
        } else {
            if w.stream == p.stream {
                p.stream = p.stream.wrapping_add(1);
                p.remote = None;
                p.opening = Opening::Wanted;
                p.open_posted = false;
                let _ = now;
            }
            self.drop(Drop::PeerDown, w.packets);
        }
        self.list(i);
    }

    /// A completion notification `src` left at `va`: a batch of `len` bytes is in its ring.
    /// `read(offset, buf)` copies bytes of the receive area. Returns the packets for the
    /// host; what does not add up is dropped and counted.
    pub fn on_notification(
        &mut self,
        src: NodeId,
        va: u64,
        len: u64,
        mut read: impl FnMut(u64, &mut [u8]) -> bool,
    ) -> Vec<Vec<u8>> {
        let Some(i) = self.peer_index(src) else {
            self.drop(Drop::Malformed, 1);
            return Vec::new();
        };
        let Some((_, notify_base)) = self.ring_of(src) else {
            // No ring of ours was ever given to it: nothing of its can be in our memory.
            self.drop(Drop::Stale, 1);
            return Vec::new();
        };
        let slot = va.wrapping_sub(notify_base) / NOTIFY_BYTES;
        let in_place = va >= notify_base && (va - notify_base) % NOTIFY_BYTES == 0;
        let ring = self.cfg.ring_len;
        if !in_place
            || slot >= u64::from(NOTIFY_SLOTS)
            || len < BATCH_HEADER as u64
            || len > u64::from(ring / 4)
        {
            self.drop(Drop::Malformed, 1);
            return Vec::new();
        }
        let p = &mut self.peers[i];
        if p.rx_stream.is_none() {
            self.drop(Drop::Stale, 1);
            return Vec::new();
        }
        // A batch taken early on its Batch message: its notification says the NI is done
        // writing it, so its space may go back.
        if let Some(u) = p
            .unconfirmed
            .iter_mut()
            .find(|u| !u.2 && u.0 % NOTIFY_SLOTS == slot as u32)
        {
            u.2 = true;
            self.credit_owed |= p.settle(ring);
            let mut out = Vec::new();
            self.take_arrived(i, src, &mut read, &mut out);
            self.list(i);
            return out;
        }
        if p.arrived[slot as usize].replace(len).is_some() {
            // Two batches for one slot: one belongs to a replaced stream.
            self.drop(Drop::Stale, 1);
        }
        let mut out = Vec::new();
        self.take_arrived(i, src, &mut read, &mut out);
        self.list(i);
        out
    }

    /// Takes the batches whose notifications came and whose turn it is. Batches are taken
    /// in order: the ring position of each follows from the ones before it.
    fn take_arrived(
        &mut self,
        i: usize,
        src: NodeId,
        read: &mut impl FnMut(u64, &mut [u8]) -> bool,
        out: &mut Vec<Vec<u8>>,
    ) {
        loop {
            let p = &mut self.peers[i];
            let next = (p.rx_seq % NOTIFY_SLOTS) as usize;
            let Some(len) = p.arrived[next].take() else {
                break;
            };
            if !self.take_batch(i, src, len, true, read, out) {
                break;
            }
        }
    }

    /// Reads the batch of `len` bytes at peer `i`'s tail; false when it belongs to a
    /// replaced stream (the tail stays).
    fn take_batch(
        &mut self,
        i: usize,
        src: NodeId,
        len: u64,
        confirmed: bool,
        read: &mut impl FnMut(u64, &mut [u8]) -> bool,
        out: &mut Vec<Vec<u8>>,
    ) -> bool {
        let ring = self.cfg.ring_len;
        let base = self.ring_offset(src);
        let p = &mut self.peers[i];
        let stream = p.rx_stream.unwrap_or_default();
        let (start, skip) = place(p.tail, ring, len);
        let mut buf = vec![0u8; len as usize];
        if !read(base + start, &mut buf) {
            self.drop(Drop::Malformed, 1);
            return false;
        }
        let packets = match wire::decode_batch(&buf, stream, p.rx_seq) {
            Ok(pk) => pk,
            // Not the batch at this position (a replaced stream's, or a notification that
            // does not belong here): the position stays for the batch that does.
            Err(WireError::Stream { .. } | WireError::Length { .. }) => {
                self.drop(Drop::Stale, 1);
                return false;
            }
            Err(_) => {
                // The position is known from the length, so the stream goes on past it.
                p.unconfirmed
                    .push_back((p.rx_seq, p.tail + skip + len, confirmed));
                p.tail += skip + len;
                p.rx_seq = p.rx_seq.wrapping_add(1);
                self.credit_owed |= p.settle(ring);
                self.drop(Drop::Malformed, 1);
                return true;
            }
        };
        p.unconfirmed
            .push_back((p.rx_seq, p.tail + skip + len, confirmed));
        p.tail += skip + len;
        p.rx_seq = p.rx_seq.wrapping_add(1);
        self.credit_owed |= p.settle(ring);
        self.stats.batches_in += 1;
        let mut not_for_me = 0;
        let mut malformed = 0;
        for pkt in packets {
            match ipv4_destination(pkt) {
                Ok(dst) if Some(dst) == self.me_addr => {
                    self.stats.packets_in += 1;
                    self.stats.bytes_in += pkt.len() as u64;
                    out.push(pkt.to_vec());
                }
                Ok(_) => not_for_me += 1,
                Err(_) => malformed += 1,
            }
        }
        self.drop(Drop::NotForMe, not_for_me);
        self.drop(Drop::Malformed, malformed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::test_packet;

    const NODES: u32 = 4;

    fn subnet() -> RackSubnet {
        RackSubnet::new(Ipv4Addr::new(10, 200, 0, 0), 16, NODES)
    }

    fn addr(n: u32) -> Ipv4Addr {
        subnet().node_addr(NodeId(n)).unwrap()
    }

    fn cfg(me: u32) -> IpConfig {
        IpConfig {
            me: NodeId(me),
            subnet: subnet(),
            mtu: 1500,
            ring_len: 16 * 1024,
            max_batch: 4096,
            queue_limit: 32 * 1024,
            // Two rings a slab: nodes 0 and 1 share one, 2 and 3 another.
            slab_rings: 2,
            first_stream: 100 * me,
            retry_ns: 1_000_000,
            max_in_flight: 4,
        }
    }

    /// Where node `me` registers its slabs: slab k at `base(me) + k * slab_len`, so that
    /// the area of the fake is one vector whatever was registered.
    fn base(me: usize) -> u64 {
        0x10_0000 * (me as u64 + 1)
    }

    /// Services with a receive area each, and a fabric that carries what they post:
    /// writes land at once (or are refused), messages go to the peer's service.
    struct Rack {
        svc: Vec<IpService>,
        area: Vec<Vec<u8>>,
        /// Notifications each node has not looked at yet: (from, va, len).
        pending: Vec<VecDeque<(NodeId, u64, u64)>>,
        /// Messages each node has not looked at yet: (from, bytes).
        inbox: Vec<VecDeque<(NodeId, Vec<u8>)>>,
        /// Nodes whose service is not running: whatever is posted to them fails.
        down: Vec<bool>,
        now: Instant,
        /// Credit messages each node posted.
        credits: Vec<u64>,
    }

    /// Reads a node's receive area as the shell reads its registered memory.
    fn read_from(area: &[u8]) -> impl FnMut(u64, &mut [u8]) -> bool + '_ {
        move |off, buf| {
            let off = off as usize;
            match area.get(off..off + buf.len()) {
                Some(b) => {
                    buf.copy_from_slice(b);
                    true
                }
                None => false,
            }
        }
    }

    impl Rack {
        /// What the NI does with write `w` of node `from`: its bytes land in the peer's
        /// area. Returns the notification it will bring (from, VA, length).
        fn land(&mut self, from: usize, w: &Outgoing) -> (NodeId, u64, u64) {
            let Outgoing::Write {
                peer,
                dst_va,
                notify_va,
                batch,
                ..
            } = w
            else {
                panic!("not a write: {w:?}")
            };
            let d = peer.0 as usize;
            let off = (dst_va - base(d)) as usize;
            let ring_end = self.svc[d].ring_offset(NodeId(from as u32))
                + u64::from(self.svc[d].config().ring_len);
            // A writer never writes past the ring the reader gave it.
            assert!((off + batch.len()) as u64 <= ring_end);
            self.area[d][off..off + batch.len()].copy_from_slice(batch);
            (NodeId(from as u32), *notify_va, batch.len() as u64)
        }

        fn new() -> Rack {
            let svc: Vec<_> = (0..NODES).map(|n| IpService::new(cfg(n))).collect();
            let area = svc
                .iter()
                .map(|s| vec![0u8; s.config().area_len() as usize])
                .collect();
            Rack {
                svc,
                area,
                pending: (0..NODES).map(|_| VecDeque::new()).collect(),
                inbox: (0..NODES).map(|_| VecDeque::new()).collect(),
                down: vec![false; NODES as usize],
                now: Instant(0),
                credits: vec![0; NODES as usize],
            }
        }

        /// Posts everything the services want to post until nothing moves; receivers
        /// process notifications unless `hold` names them. Returns what reached each host.
        fn run(&mut self, hold: &[u32]) -> Vec<Vec<Vec<u8>>> {
            let mut got = vec![Vec::new(); NODES as usize];
            loop {
                let mut moved = false;
                for n in 0..NODES as usize {
                    while let Some((slab, len)) = self.svc[n].poll_register() {
                        moved = true;
                        let span = self.svc[n].config().slab_span();
                        assert_eq!(len, span, "every slab of the fake holds two rings");
                        self.svc[n].registered(slab, Some(base(n) + u64::from(slab) * span));
                    }
                    while let Some(out) = self.svc[n].poll_message() {
                        moved = true;
                        let Outgoing::Message { peer, op, bytes } = out else {
                            unreachable!()
                        };
                        let d = peer.0 as usize;
                        self.credits[n] += u64::from(op == PeerOp::Credit);
                        let ok = !self.down[d];
                        if ok {
                            // In the mailbox: the receiver takes it when it reads.
                            self.inbox[d].push_back((NodeId(n as u32), bytes));
                        }
                        self.svc[n].message_done(peer, op, ok, self.now);
                    }
                    while let Some(out) = self.svc[n].poll_write() {
                        moved = true;
                        let Outgoing::Write { peer, seq, .. } = out else {
                            unreachable!()
                        };
                        let d = peer.0 as usize;
                        let ok = !self.down[d];
                        if ok {
                            let note = self.land(n, &out);
                            self.pending[d].push_back(note);
                        }
                        self.svc[n].write_done(peer, seq, ok, self.now);
                    }
                }
                for (n, host) in got.iter_mut().enumerate() {
                    if hold.contains(&(n as u32)) {
                        continue;
                    }
                    while let Some((src, bytes)) = self.inbox[n].pop_front() {
                        moved = true;
                        let read = read_from(&self.area[n]);
                        if let Ok(pk) = self.svc[n].on_message(src, &bytes, read) {
                            host.extend(pk);
                        }
                    }
                    while let Some((src, va, len)) = self.pending[n].pop_front() {
                        moved = true;
                        let read = read_from(&self.area[n]);
                        host.extend(self.svc[n].on_notification(src, va, len, read));
                    }
                }
                if !moved {
                    return got;
                }
            }
        }

        /// Lets `ns` pass for every service, then posts what that made ready.
        fn wait(&mut self, ns: u64) -> Vec<Vec<Vec<u8>>> {
            self.now = Instant(self.now.0 + ns);
            for s in &mut self.svc {
                s.on_tick(self.now);
            }
            self.run(&[])
        }

        fn send(&mut self, from: u32, to: u32, payload: &[u8]) -> Result<(), Drop> {
            let p = test_packet(addr(from), addr(to), payload);
            self.svc[from as usize].from_host(&p, self.now)
        }
    }

    #[test]
    fn packets_cross_in_both_directions_and_only_to_their_node() {
        let mut r = Rack::new();
        r.send(0, 3, b"ping").unwrap();
        let got = r.run(&[]);
        assert_eq!(got[3], vec![test_packet(addr(0), addr(3), b"ping")]);
        assert!(got[0].is_empty() && got[1].is_empty() && got[2].is_empty());
        r.send(3, 0, b"pong").unwrap();
        let got = r.run(&[]);
        assert_eq!(got[0], vec![test_packet(addr(3), addr(0), b"pong")]);
        assert_eq!(r.svc[0].stats().packets_out, 1);
        assert_eq!(r.svc[0].stats().packets_in, 1);
        assert_eq!(r.svc[3].stats().bytes_in, 24);
        assert_eq!(
            r.svc[0].stats().drops_total() + r.svc[3].stats().drops_total(),
            0
        );
    }

    /// Receive memory is registered a slab at a time, when a peer of the slab first opens
    /// a stream, and the peer's `Ring` answer waits for it; a registration that failed is
    /// asked again at the peer's next `Open`; a notification from a peer that was never
    /// given a ring reads nothing.
    #[test]
    fn receive_rings_are_registered_when_a_peer_first_sends() {
        let mut r = Rack::new();
        let slab = r.svc[0].config().slab_len(1);
        for s in &mut r.svc {
            assert_eq!(s.poll_register(), None);
            assert_eq!(s.registered_bytes(), 0);
        }
        // 3 -> 0: node 0 registers the slab of rings 2 and 3, and nothing else.
        r.send(3, 0, b"first").unwrap();
        let got = r.run(&[]);
        assert_eq!(got[0], vec![test_packet(addr(3), addr(0), b"first")]);
        assert_eq!(r.svc[0].registered_bytes(), slab);
        assert!(r.svc[0].ring_of(NodeId(3)).is_some() && r.svc[0].ring_of(NodeId(2)).is_some());
        assert!(r.svc[0].ring_of(NodeId(1)).is_none());
        assert_eq!(r.svc[3].registered_bytes(), 0);
        assert_eq!(r.svc[1].registered_bytes() + r.svc[2].registered_bytes(), 0);

        // 1 -> 2, by hand: the Open waits for node 2's slab, which fails once.
        r.send(1, 2, b"second").unwrap();
        let Some(Outgoing::Message { op, bytes, .. }) = r.svc[1].poll_message() else {
            panic!("no Open")
        };
        assert_eq!(op, PeerOp::Open);
        r.svc[1].message_done(NodeId(2), op, true, r.now);
        r.svc[2]
            .on_message(NodeId(1), &bytes, |_, _| false)
            .unwrap();
        assert_eq!(r.svc[2].poll_message(), None, "a Ring before its memory");
        assert_eq!(r.svc[2].poll_register(), Some((0, slab)));
        assert_eq!(r.svc[2].poll_register(), None, "asked once");
        r.svc[2].registered(0, None);
        assert_eq!(r.svc[2].poll_message(), None);
        assert_eq!(r.svc[2].registered_bytes(), 0);
        // The peer asks again; this time the memory is there and the answer goes.
        r.svc[2]
            .on_message(NodeId(1), &bytes, |_, _| false)
            .unwrap();
        assert_eq!(r.svc[2].poll_register(), Some((0, slab)));
        r.svc[2].registered(0, Some(base(2)));
        let Some(Outgoing::Message { op, bytes, .. }) = r.svc[2].poll_message() else {
            panic!("no Ring")
        };
        assert_eq!(op, PeerOp::Ring);
        r.svc[2].message_done(NodeId(1), op, true, r.now);
        r.inbox[1].push_back((NodeId(2), bytes));
        let got = r.run(&[]);
        assert_eq!(got[2], vec![test_packet(addr(1), addr(2), b"second")]);
        assert_eq!(r.svc[2].registered_bytes(), slab);

        // Node 3 never wrote to node 2: its notification is stale, nothing is read.
        let dropped = r.svc[2].stats().drops_total();
        let got = r.svc[2].on_notification(NodeId(3), base(2) + 64, 64, |_, _| {
            panic!("read for a peer without a ring")
        });
        assert!(got.is_empty());
        assert_eq!(r.svc[2].stats().drops_total(), dropped + 1);
    }

    #[test]
    fn packets_that_queue_go_together_in_one_batch_in_order() {
        let mut r = Rack::new();
        r.send(1, 2, b"open the stream").unwrap();
        r.run(&[]);
        let before = r.svc[1].stats().batches_out;
        for k in 0..20u8 {
            r.send(1, 2, &[k; 100]).unwrap();
        }
        let got = r.run(&[]);
        let want: Vec<_> = (0..20u8)
            .map(|k| test_packet(addr(1), addr(2), &[k; 100]))
            .collect();
        assert_eq!(got[2], want);
        // 20 packets of 120 bytes in batches of at most 4096 bytes.
        assert_eq!(r.svc[1].stats().batches_out - before, 1);
    }

    #[test]
    fn a_receiver_that_does_not_read_is_never_overrun_and_the_rest_is_counted() {
        let mut r = Rack::new();
        r.send(0, 1, b"open the stream").unwrap();
        assert_eq!(r.run(&[])[1].len(), 1);
        let mut sent = 0;
        // The receiver stops reading (its notifications and messages wait): the writer
        // fills the ring, then the queue, then drops.
        for k in 0..200u32 {
            if r.send(0, 1, &[k as u8; 1000]).is_ok() {
                sent += 1;
            }
            r.run(&[1]);
        }
        let s = r.svc[0].stats();
        assert!(s.credit_stalls > 0, "the writer waited for credit");
        assert_eq!(s.dropped(Drop::QueueFull), 200 - sent);
        assert!(r.svc[0].ring_occupancy() <= 16 * 1024);
        // Once it reads, everything accepted arrives, in order, nothing else.
        let got = r.run(&[]);
        assert_eq!(got[1].len() as u64, sent);
        for w in got[1].windows(2) {
            assert!(w[0][20] < w[1][20] || w[1][20] == 0, "in order");
        }
        assert_eq!(r.svc[1].stats().drops_total(), 0);
        assert_eq!(r.svc[0].queued_bytes(), 0);
        // What is left owed (under a quarter of the ring) comes back after the delay.
        assert!(r.svc[0].ring_occupancy() < u64::from(r.svc[1].config().ring_len / 4));
        r.wait(1);
        assert!(
            r.svc[1].next_tick().is_some(),
            "a tick is due for the held credit"
        );
        r.wait(CREDIT_DELAY_NS);
        assert_eq!(r.svc[0].ring_occupancy(), 0, "all space returned");
        assert_eq!(r.svc[1].next_tick(), None, "nothing left to wake for");
    }

    /// Ring space goes back once a quarter of the ring is owed, or after
    /// [`CREDIT_DELAY_NS`]: a ping-pong of small packets sends no credit per packet, and
    /// the writer never waits for what is held back.
    #[test]
    fn credit_is_returned_by_the_quarter_ring_or_after_the_delay() {
        let mut r = Rack::new();
        let credits = |r: &Rack| r.credits[1];
        r.send(0, 1, b"open the stream").unwrap();
        r.run(&[]);
        let (before, stalls) = (credits(&r), r.svc[0].stats().credit_stalls);
        let ring = u64::from(r.svc[1].config().ring_len);
        // As many one-packet batches as stay under a quarter of the ring.
        let batch =
            (BATCH_HEADER + PACKET_PREFIX + test_packet(addr(0), addr(1), &[0; 60]).len()) as u64;
        let n = (ring / 4 / batch - 1) as u32;
        assert!(n >= 10, "a ring of {ring} B holds few small batches");
        for k in 0..n {
            r.send(0, 1, &[k as u8; 60]).unwrap();
            r.run(&[]);
            r.send(1, 0, &[k as u8; 60]).unwrap();
            r.run(&[]);
        }
        assert_eq!(
            credits(&r),
            before,
            "no credit for small packets within the delay"
        );
        assert!(r.svc[0].ring_occupancy() > 0);
        // Quiet: after the delay (counted from the first tick after the space was
        // owed, as the shell ticks after each event), one credit returns everything.
        r.wait(1);
        assert_eq!(credits(&r), before);
        r.wait(CREDIT_DELAY_NS);
        assert_eq!(credits(&r), before + 1);
        assert_eq!(r.svc[0].ring_occupancy(), 0);
        // Large packets: a credit per quarter ring, and the writer never waits.
        let before = credits(&r);
        let mut bytes = 0;
        for k in 0..400u32 {
            let pk = [k as u8; 1400];
            r.send(0, 1, &pk).unwrap();
            bytes += pk.len() as u64;
            r.run(&[]);
        }
        let sent = credits(&r) - before;
        assert!(
            sent >= bytes / ring && sent <= bytes / (ring / 4) + 1,
            "{sent} credits for {bytes} bytes through a ring of {ring}"
        );
        assert_eq!(
            r.svc[0].stats().credit_stalls,
            stalls,
            "the writer waited for credit"
        );
    }

    #[test]
    fn a_peer_without_a_service_costs_counted_drops_and_is_asked_again_later() {
        let mut r = Rack::new();
        r.down[2] = true;
        r.send(0, 2, b"anyone?").unwrap();
        r.run(&[]);
        assert_eq!(r.svc[0].stats().dropped(Drop::PeerDown), 1);
        assert_eq!(r.send(0, 2, b"still?"), Err(Drop::PeerDown));
        // Its service starts; after the retry interval the next packet asks again.
        r.down[2] = false;
        r.now = Instant(2_000_000);
        r.send(0, 2, b"now?").unwrap();
        let got = r.run(&[]);
        assert_eq!(got[2], vec![test_packet(addr(0), addr(2), b"now?")]);
    }

    #[test]
    fn a_failed_write_opens_a_new_stream_and_the_reader_follows() {
        let mut r = Rack::new();
        r.send(0, 1, b"one").unwrap();
        r.run(&[]);
        r.down[1] = true;
        r.send(0, 1, b"lost").unwrap();
        r.run(&[]);
        // The new stream's Open found the peer down too: it is asked again later.
        assert_eq!(r.svc[0].stats().dropped(Drop::PeerDown), 1);
        r.down[1] = false;
        r.now = Instant(2_000_000);
        r.send(0, 1, b"three").unwrap();
        let got = r.run(&[]);
        assert_eq!(got[1], vec![test_packet(addr(0), addr(1), b"three")]);
        assert_eq!(r.svc[0].stats().streams_opened, 2);
    }

    #[test]
    fn what_cannot_be_carried_is_refused_by_reason() {
        let mut r = Rack::new();
        let s = &mut r.svc[0];
        let out = test_packet(addr(0), Ipv4Addr::new(8, 8, 8, 8), b"x");
        assert_eq!(s.from_host(&out, Instant(0)), Err(Drop::NotInRack));
        let past = test_packet(addr(0), Ipv4Addr::new(10, 200, 0, 9), b"x");
        assert_eq!(s.from_host(&past, Instant(0)), Err(Drop::NotInRack));
        let me = test_packet(addr(0), addr(0), b"x");
        assert_eq!(s.from_host(&me, Instant(0)), Err(Drop::NotInRack));
        let mut v6 = test_packet(addr(0), addr(1), b"x");
        v6[0] = 0x60;
        assert_eq!(s.from_host(&v6, Instant(0)), Err(Drop::NotIpv4));
        let big = test_packet(addr(0), addr(1), &[0; 1481]);
        assert_eq!(s.from_host(&big, Instant(0)), Err(Drop::TooBig));
        assert_eq!(
            s.from_host(b"\x45garbage", Instant(0)),
            Err(Drop::Malformed)
        );
        assert_eq!(s.stats().drops_total(), 6);
        // Messages that are not the service's are counted too.
        let no_read = |_: u64, _: &mut [u8]| false;
        assert_eq!(
            s.on_message(NodeId(1), b"hello there", no_read),
            Err(Drop::Malformed)
        );
        assert_eq!(
            s.on_message(NodeId(0), b"from myself", no_read),
            Err(Drop::Malformed)
        );
    }

    #[test]
    fn corrupt_and_misaddressed_batches_are_dropped_and_the_stream_goes_on() {
        let mut r = Rack::new();
        r.send(0, 1, b"first").unwrap();
        r.run(&[]);
        // A batch whose bytes were damaged in the ring, then one for another node.
        r.send(0, 1, b"damaged").unwrap();
        r.run(&[1]);
        let (src, va, len) = *r.pending[1].front().unwrap();
        let off = (r.svc[1].ring_offset(src) + r.svc[1].peers[0].tail) as usize + 16;
        // The first packet's length now runs past the batch.
        r.area[1][off..off + 2].copy_from_slice(b"\xff\xff");
        let got = r.run(&[]);
        assert!(got[1].is_empty());
        assert_eq!(r.svc[1].stats().dropped(Drop::Malformed), 1, "{va} {len}");
        let stray = test_packet(addr(0), addr(2), b"not yours");
        let stream = r.svc[0].peers[1].stream;
        let seq = r.svc[1].peers[0].rx_seq;
        let batch = wire::encode_batch(stream, seq, [stray.as_slice()].into_iter());
        let tail = r.svc[1].peers[0].tail;
        let (start, skip) = place(tail, 16 * 1024, batch.len() as u64);
        let off = (r.svc[1].ring_offset(NodeId(0)) + start) as usize;
        r.area[1][off..off + batch.len()].copy_from_slice(&batch);
        let (_, notify) = r.svc[1].ring_of(NodeId(0)).unwrap();
        let notify = notify + NOTIFY_BYTES * u64::from(seq % NOTIFY_SLOTS);
        r.pending[1].push_back((NodeId(0), notify, batch.len() as u64));
        assert!(r.run(&[])[1].is_empty());
        assert_eq!(r.svc[1].stats().dropped(Drop::NotForMe), 1);
        // The writer's own next batch comes after the forged one in number and place.
        r.svc[0].peers[1].seq += 1;
        r.svc[0].peers[1].head += skip + batch.len() as u64;
        r.send(0, 1, b"after").unwrap();
        let got = r.run(&[]);
        assert_eq!(got[1], vec![test_packet(addr(0), addr(1), b"after")]);
        // A notification at the wrong place or of an impossible length is refused.
        let n = r.svc[1].on_notification(NodeId(0), 12, 100, |_, _| true);
        assert!(n.is_empty());
        let n = r.svc[1].on_notification(NodeId(0), notify, 1 << 30, |_, _| true);
        assert!(n.is_empty());
        assert_eq!(r.svc[1].stats().dropped(Drop::Malformed), 3);
    }

    #[test]
    fn a_restarted_peer_is_written_to_on_a_new_stream() {
        let mut r = Rack::new();
        r.send(0, 1, b"before").unwrap();
        r.run(&[]);
        // Node 1's service restarts: the new one knows nothing and its area is new.
        let mut c = cfg(1);
        c.first_stream = 999;
        r.svc[1] = IpService::new(c);
        r.area[1].fill(0);
        // The old stream's ring is gone with the old memory: the NI NACKs the next write
        // (page fault), which the harness models as a refused write.
        r.down[1] = true;
        r.send(0, 1, b"lost in the restart").unwrap();
        r.run(&[]);
        r.down[1] = false;
        r.now = Instant(2_000_000);
        r.send(0, 1, b"after").unwrap();
        let got = r.run(&[]);
        assert_eq!(got[1], vec![test_packet(addr(0), addr(1), b"after")]);
        // And the restarted node reaches the old one, which follows its new stream.
        r.send(1, 0, b"hi").unwrap();
        assert_eq!(r.run(&[])[0], vec![test_packet(addr(1), addr(0), b"hi")]);
    }

    #[test]
    fn batches_in_flight_together_are_delivered_in_order_whatever_order_they_land_in() {
        let mut r = Rack::new();
        r.send(0, 1, b"open").unwrap();
        r.run(&[]);
        // Packets for 3 batches of at most 4096 bytes, and no write completes meanwhile.
        let want: Vec<Vec<u8>> = (0..9u8)
            .map(|k| test_packet(addr(0), addr(1), &[k; 1300]))
            .collect();
        let mut writes = Vec::new();
        for (k, p) in want.iter().enumerate() {
            r.svc[0].from_host(p, r.now).unwrap();
            // One batch per three packets: a new one leaves while the others are in flight.
            if k % 3 == 2 {
                while let Some(w) = r.svc[0].poll_write() {
                    writes.push(w);
                }
            }
        }
        assert_eq!(writes.len(), 3, "three batches in flight at once");
        assert!(r.svc[0].poll_write().is_none());
        // They land last first.
        let mut got = Vec::new();
        let batches_before = r.svc[1].stats().batches_in;
        for w in writes.iter().rev() {
            let (src, va, len) = r.land(0, w);
            got.extend(r.svc[1].on_notification(src, va, len, read_from(&r.area[1])));
            // Nothing is handed over before the first batch is there.
            if got.is_empty() {
                assert_eq!(r.svc[1].stats().batches_in, batches_before);
            }
        }
        assert_eq!(got, want);
        for w in &writes {
            let Outgoing::Write { peer, seq, .. } = w else {
                unreachable!()
            };
            r.svc[0].write_done(*peer, *seq, true, r.now);
        }
        assert_eq!(r.svc[0].stats().packets_out, 9 + 1);
        assert_eq!(r.svc[1].stats().drops_total(), 0);
    }

    #[test]
    fn a_batch_announced_before_its_bytes_land_waits_for_its_notification() {
        let mut r = Rack::new();
        r.send(0, 1, b"open").unwrap();
        r.run(&[]);
        r.send(0, 1, b"early bird").unwrap();
        let (writes, msgs) = outgoing(&mut r.svc[0]);
        let [w] = &writes[..] else {
            panic!("one batch to write: {writes:?}")
        };
        let Outgoing::Write { peer, seq, .. } = *w else {
            unreachable!()
        };
        let [Outgoing::Message {
            bytes,
            op: PeerOp::Batch,
            ..
        }] = &msgs[..]
        else {
            panic!("its Batch message: {msgs:?}")
        };
        // The message overtakes the data: nothing is taken from the ring yet.
        let got = r.svc[1]
            .on_message(NodeId(0), bytes, read_from(&r.area[1]))
            .unwrap();
        assert!(got.is_empty());
        let (src, va, len) = r.land(0, w);
        let credit_before = r.svc[1].peers[0].credit_pos;
        // The data is there: the same message now delivers it...
        let early = r.svc[1]
            .on_message(NodeId(0), bytes, read_from(&r.area[1]))
            .unwrap();
        assert_eq!(early, vec![test_packet(addr(0), addr(1), b"early bird")]);
        // ...but its ring space goes back only with the notification.
        assert_eq!(r.svc[1].peers[0].credit_pos, credit_before);
        let late = r.svc[1].on_notification(src, va, len, read_from(&r.area[1]));
        assert!(late.is_empty(), "delivered once");
        assert!(r.svc[1].peers[0].credit_pos > credit_before);
        r.svc[0].write_done(peer, seq, true, r.now);
        assert_eq!(r.svc[1].stats().packets_in, 2);
        assert_eq!(r.svc[1].stats().drops_total(), 0);
    }

    #[test]
    fn a_batch_that_completes_late_holds_back_the_sequence_numbers_after_the_window() {
        let mut r = Rack::new();
        r.send(0, 1, b"open").unwrap();
        r.run(&[]);
        let mut writes = Vec::new();
        for k in 0..20u8 {
            r.svc[0]
                .from_host(&test_packet(addr(0), addr(1), &[k; 1300]), r.now)
                .unwrap();
            while let Some(w) = r.svc[0].poll_write() {
                writes.push(w);
            }
        }
        let seq_of = |w: &Outgoing| match w {
            Outgoing::Write { seq, .. } => *seq,
            _ => unreachable!(),
        };
        assert_eq!(writes.len(), 4, "max_in_flight batches");
        let first = seq_of(&writes[0]);
        // Every batch but the first completes: the window does not move past the first.
        for w in &writes[1..] {
            r.svc[0].write_done(NodeId(1), seq_of(w), true, r.now);
        }
        while let Some(w) = r.svc[0].poll_write() {
            writes.push(w);
        }
        for w in &writes[4..] {
            assert!(
                seq_of(w).wrapping_sub(first) < 4,
                "batch {} while {first} is not done",
                seq_of(w)
            );
        }
        assert_eq!(writes.len(), 4, "nothing more until the first completes");
        r.svc[0].write_done(NodeId(1), first, true, r.now);
        assert!(r.svc[0].poll_write().is_some());
    }

    /// Collects what `svc` wants to post right now.
    fn outgoing(svc: &mut IpService) -> (Vec<Outgoing>, Vec<Outgoing>) {
        let mut writes = Vec::new();
        while let Some(w) = svc.poll_write() {
            writes.push(w);
        }
        let mut msgs = Vec::new();
        while let Some(m) = svc.poll_message() {
            msgs.push(m);
        }
        (writes, msgs)
    }

    #[test]
    fn a_new_stream_is_opened_only_once_the_old_streams_writes_are_done() {
        let mut r = Rack::new();
        r.send(0, 1, b"open").unwrap();
        r.run(&[]);
        // Two batches in flight; the first fails.
        let mut writes = Vec::new();
        for k in 0..2u8 {
            r.svc[0]
                .from_host(&test_packet(addr(0), addr(1), &[k; 1300]), r.now)
                .unwrap();
            writes.extend(outgoing(&mut r.svc[0]).0);
        }
        assert_eq!(writes.len(), 2);
        let seq = |w: &Outgoing| match w {
            Outgoing::Write { seq, .. } => *seq,
            _ => unreachable!(),
        };
        r.svc[0].write_done(NodeId(1), seq(&writes[0]), false, r.now);
        let (_, msgs) = outgoing(&mut r.svc[0]);
        assert!(
            !msgs.iter().any(|m| matches!(
                m,
                Outgoing::Message {
                    op: PeerOp::Open,
                    ..
                }
            )),
            "no Open while a write of the old stream is in flight: {msgs:?}"
        );
        r.svc[0].write_done(NodeId(1), seq(&writes[1]), true, r.now);
        let (_, msgs) = outgoing(&mut r.svc[0]);
        assert!(msgs.iter().any(|m| matches!(
            m,
            Outgoing::Message {
                op: PeerOp::Open,
                ..
            }
        )));
    }

    #[test]
    fn a_notification_parked_behind_an_early_batch_is_taken_when_that_batch_is() {
        let mut r = Rack::new();
        r.send(0, 1, b"open").unwrap();
        r.run(&[]);
        let a = test_packet(addr(0), addr(1), b"first");
        let b = test_packet(addr(0), addr(1), b"second");
        r.svc[0].from_host(&a, r.now).unwrap();
        let (wa, ma) = outgoing(&mut r.svc[0]);
        r.svc[0].from_host(&b, r.now).unwrap();
        let (wb, mb) = outgoing(&mut r.svc[0]);
        assert_eq!((wa.len(), wb.len()), (1, 1));
        assert!(mb.is_empty(), "only an idle path's batch is announced");
        let (src, na, la) = r.land(0, &wa[0]);
        let (_, nb, lb) = r.land(0, &wb[0]);
        // B's notification first: parked behind A.
        assert!(r.svc[1]
            .on_notification(src, nb, lb, read_from(&r.area[1]))
            .is_empty());
        // A announced and there: A, then B.
        let Outgoing::Message { bytes, .. } = &ma[0] else {
            unreachable!()
        };
        let got = r.svc[1]
            .on_message(src, bytes, read_from(&r.area[1]))
            .unwrap();
        assert_eq!(got, vec![a, b]);
        // A's notification only confirms it.
        assert!(r.svc[1]
            .on_notification(src, na, la, read_from(&r.area[1]))
            .is_empty());
        assert_eq!(r.svc[1].stats().drops_total(), 0);
        assert!(r.svc[1].peers[0].unconfirmed.is_empty());
    }

    #[test]
    fn a_notification_that_does_not_match_the_batch_in_place_leaves_the_position() {
        let mut r = Rack::new();
        r.send(0, 1, b"open").unwrap();
        r.run(&[]);
        r.send(0, 1, b"kept").unwrap();
        r.run(&[1]);
        let (src, va, len) = r.pending[1].pop_front().unwrap();
        let tail = r.svc[1].peers[0].tail;
        assert!(r.svc[1]
            .on_notification(src, va, len + 7, read_from(&r.area[1]))
            .is_empty());
        assert_eq!(r.svc[1].peers[0].tail, tail, "the position stays");
        assert_eq!(r.svc[1].stats().dropped(Drop::Stale), 1);
        let got = r.svc[1].on_notification(src, va, len, read_from(&r.area[1]));
        assert_eq!(got, vec![test_packet(addr(0), addr(1), b"kept")]);
    }

    #[test]
    fn an_unanswered_open_is_sent_again_after_the_retry_interval_and_not_before() {
        let mut r = Rack::new();
        r.send(0, 1, b"anyone?").unwrap();
        let opens = |svc: &mut IpService| {
            outgoing(svc)
                .1
                .into_iter()
                .filter(|m| {
                    matches!(
                        m,
                        Outgoing::Message {
                            op: PeerOp::Open,
                            ..
                        }
                    )
                })
                .count()
        };
        assert_eq!(opens(&mut r.svc[0]), 1);
        // Delivered into the peer's mailbox, and never answered.
        r.svc[0].message_done(NodeId(1), PeerOp::Open, true, Instant(0));
        r.svc[0].on_tick(Instant(999_999));
        assert_eq!(opens(&mut r.svc[0]), 0, "not before the retry interval");
        r.svc[0].on_tick(Instant(1_000_000));
        assert_eq!(opens(&mut r.svc[0]), 1, "again once it is due");
    }
}
