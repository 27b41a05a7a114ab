//! Messages between endpoints the way ExaNet-MPI sends them (report §5.2.1, Fig. 11), as a
//! state machine without I/O: the provider's endpoint drives it with the client library
//! and carries out what it asks.
//!
//! - **Eager**: a message of at most the eager limit (ExaNet-MPI's 32 bytes by default,
//!   [`wire::EAGER_MAX`] at most) travels in one packetizer message to the receiver's
//!   mailbox, with its tag and remote CQ data. The send completes when the destination NI
//!   ACKs it.
//! - **Rendezvous**, for anything longer: the sender stages the data in its registered
//!   memory and sends a request to send (RTS: tag, length, where the data is). When a
//!   receive matches it, the receiver reads the data with the RDMA engine into staging
//!   memory of its own ([`Fetch`]) and tells the sender it is done (FIN), which completes
//!   the send and frees its staging. The receiver reads, as the report's read-based
//!   protocol does (its hardware emulated the read by a write from the receiver; this NI
//!   reads).
//!
//! Messages from one endpoint to another match in the order they were sent: each carries
//! a sequence number per destination, and the receiver takes them in that order whatever
//! order the packetizer's channels delivered them in (a message refused for a full mailbox
//! is sent again with its number).
//!
//! Messages that come before their receive wait, unexpected, in arrival order. Their
//! queue is bounded: while it is full the endpoint takes nothing more from its mailbox
//! ([`Engine::has_room`]), the mailbox fills, and the NI refuses further messages, which
//! their senders send again: the bound pushes back on the senders instead of losing
//! anything.
//!
//! **One-sided operations** (`FI_RMA`) are carried out by the target's provider, in its
//! progress, on memory the target's application registered: the NI reads and writes only
//! memory registered with it (shared memory of the client library), not an application's
//! own buffers. A write of up to [`EAGER_MAX`] bytes travels in its request; a longer one
//! is staged at the writer and read by the target ([`Fetch`]), which then stores it
//! ([`Store`]). A read asks the target to load the bytes and write them with the RDMA
//! engine into the reader's staging ([`Push`]). Either ends with the target's answer,
//! which completes the operation at its initiator (so a write completes once delivered).
//! Requests being served are bounded ([`RMA_SERVED_MAX`]) the way unexpected messages
//! are: past it the endpoint takes nothing more from its mailbox.

pub mod matching;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use thiserror::Error;

use matching::{Accepts, Matcher, Posting};
pub use wire::RmaData;
use wire::{FinStatus, Packet, RmaStatus, WireError, EAGER_MAX};

/// An endpoint: a mailbox of a rank of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Peer {
    pub node: u32,
    pub rank: u8,
    pub vi: u8,
}

/// ExaNet-MPI's eager limit.
pub const DEFAULT_EAGER_LIMIT: usize = 32;
/// Unexpected messages one endpoint keeps before it stops taking more in.
pub const DEFAULT_MAX_UNEXPECTED: usize = 4096;
/// Messages from one sender held for an earlier one still to come. A sender keeps its
/// messages to one destination within this many of the earliest its NI has not yet
/// delivered ([`Outbound`]), so more is a protocol error.
const HELD_MAX: usize = 64;
/// One-sided requests one endpoint serves at once, from all its peers.
pub const RMA_SERVED_MAX: usize = 64;
/// The largest message: what one rendezvous moves (the NI's largest RDMA transfer is far
/// beyond what a message needs). The protocol's, which the provider's offer states.
pub const MAX_MSG_SIZE: usize = 1 << 30;
/// The longest one-sided operation: the largest message.
pub const RMA_MAX: u64 = MAX_MSG_SIZE as u64;
/// How long a destination may have no endpoint at the address before a message for it
/// fails: long enough for a peer to open its endpoint after learning ours (a job's ranks
/// start seconds apart on a loaded host), short enough that nothing waits for ever on a
/// peer that is gone.
pub const DEFAULT_PATIENCE_NS: u64 = 10_000_000_000;
/// How long an answer (a FIN, an RMA answer) may be owed before the peer that owes it is
/// asked whether it is still there.
pub const DEFAULT_PROBE_AFTER_NS: u64 = 2_000_000_000;

/// See [`Config::resend_first_ns`]: about a round trip between two daemons of a loaded
/// host, so a mailbox its program is draining is tried again about as soon as a copy
/// could tell.
pub const DEFAULT_RESEND_FIRST_NS: u64 = 20_000;

/// See [`Config::resend_first_ns`]. Sent again at network speed, a message to an endpoint
/// not yet opened went once a round trip between daemons for the whole 10 s of patience,
/// and one to a full mailbox as often for as long as the mailbox stayed full, taking the
/// cores from the program that would empty it; past this a destination still refusing is
/// asked a thousand times a second.
pub const DEFAULT_RESEND_MAX_NS: u64 = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Longest message sent eager; longer ones go by rendezvous.
    pub eager_limit: usize,
    pub max_unexpected: usize,
    /// Where the ids of rendezvous and one-sided requests start. The driver picks a
    /// different one for each endpoint it opens, so that a late FIN or answer meant for
    /// an earlier endpoint on the same mailbox does not end one of this one's.
    pub first_id: u32,
    /// A destination with no endpoint for this long fails what is sent to it.
    pub patience_ns: u64,
    /// A peer that owes an answer this long is probed ([`Engine::handle_timeout`]).
    pub probe_after_ns: u64,
    /// A message refused by a full mailbox or finding no endpoint goes again at once the
    /// first time, then this long after the next refusal, twice as long after each
    /// further one, up to [`resend_max_ns`](Config::resend_max_ns).
    pub resend_first_ns: u64,
    pub resend_max_ns: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            eager_limit: DEFAULT_EAGER_LIMIT,
            max_unexpected: DEFAULT_MAX_UNEXPECTED,
            first_id: 0,
            patience_ns: DEFAULT_PATIENCE_NS,
            probe_after_ns: DEFAULT_PROBE_AFTER_NS,
            resend_first_ns: DEFAULT_RESEND_FIRST_NS,
            resend_max_ns: DEFAULT_RESEND_MAX_NS,
        }
    }
}

/// What a send carries: the bytes themselves (eager), or where the driver staged them in
/// registered memory (rendezvous).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outgoing {
    Inline(Vec<u8>),
    Staged {
        va: u64,
        len: u64,
        /// When the send completes: once the receiver's provider has the request (the
        /// data is staged, so the application's buffer is free: libfabric's transmit
        /// completion), or only once the receiver has read it (`FI_DELIVERY_COMPLETE`).
        complete: Complete,
    },
}

/// A packetizer message to send; the driver reports how it ended with
/// [`Engine::packet_done`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub token: u64,
    pub to: Peer,
    pub bytes: Vec<u8>,
}

/// An RDMA read to carry out, into staging memory of the driver's, of `len` bytes at `va`
/// of `node`'s `rank`; reported with [`Engine::fetch_done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetch {
    pub id: u64,
    pub node: u32,
    pub rank: u8,
    pub va: u64,
    pub len: u64,
    /// For an RMA write: the region it is to be stored into, which the driver checks
    /// allows it before reading anything (else [`Engine::fetch_denied`]).
    pub into: Option<RmaTarget>,
    /// Not before this time, in the caller's time ([`Engine::on_packet`]'s `at`): when
    /// the request it answers arrived (0: no such bound).
    pub after: u64,
}

/// Stores `data` at `addr` of the application's region `key` (the target of an RMA
/// write); the driver answers with [`Engine::rma_served`] and `reply`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    pub reply: u64,
    pub key: u64,
    pub addr: u64,
    pub data: Data,
}

/// Loads `len` bytes at `addr` of the application's region `key` and writes them with the
/// RDMA engine to `va` of `node`'s `rank` (the target of an RMA read); the driver answers
/// with [`Engine::rma_served`] and `reply`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Push {
    pub reply: u64,
    pub key: u64,
    pub addr: u64,
    pub len: u64,
    pub node: u32,
    pub rank: u8,
    pub va: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Transmit(Transmit),
    Fetch(Fetch),
    Store(Store),
    Push(Push),
}

/// Where a one-sided operation acts: an address in a region its target registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmaTarget {
    pub key: u64,
    pub addr: u64,
}

/// A received message's bytes: in the event, or in the staging memory of a fetch (the
/// driver copies them out and frees it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    Inline(Vec<u8>),
    Fetched { fetch: u64, len: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Failure {
    #[error("cancelled")]
    Cancelled,
    #[error("the destination could not be reached: {0}")]
    Unreachable(String),
    #[error("the destination refused it: {0}")]
    Denied(String),
    #[error("the receiver did not take the message")]
    Refused,
    #[error("reading the message failed: {0}")]
    ReadFailed(String),
    #[error("the target has no region with that key, or not there, or not with that access")]
    RmaDenied,
    #[error("the target could not carry the operation out")]
    RmaFailed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A send completed: its buffer may be reused. `delivered`: when, where its delivery
    /// or the receiver's answer ended it (the [`Delivery::Delivered`] time, the FIN's
    /// arrival, a refusing FIN's too); `None` where it failed unanswered.
    Sent {
        ctx: u64,
        result: Result<(), Failure>,
        delivered: Option<u64>,
    },
    /// A staged send's staging may be freed: the receiver read it or never will (after
    /// its `Sent`, or with it).
    Released { ctx: u64 },
    /// A receive took a message of `len` bytes; `data` holds what fitted. `at`: when
    /// the message arrived ([`Engine::on_packet`]), where that is what it waited for
    /// (`None` where a read of its data was, whose completion the caller took).
    Received {
        ctx: u64,
        from: Peer,
        tag: Option<u64>,
        cq_data: Option<u64>,
        len: u64,
        data: Data,
        at: Option<u64>,
    },
    /// A receive ended without a message.
    RecvFailed { ctx: u64, error: Failure },
    /// A receive that takes only whole messages ([`Engine::post_recv_whole`]) ended
    /// without one: the next message it accepted was longer than it.
    Unfit { ctx: u64 },
    /// A receive that takes only whole messages took one of `len` bytes: its
    /// [`Event::Received`] follows (at once, or once a rendezvous is read), and what is
    /// left of its buffer can take the next message now.
    Taken { ctx: u64, len: u64 },
    /// A one-sided operation ended (a read's bytes are in the staging it named).
    RmaDone {
        ctx: u64,
        result: Result<(), Failure>,
        /// The answer's modeled time (none when the operation failed here).
        at: Option<u64>,
    },
    /// What a one-sided operation's request names (its staged data, its landing place)
    /// may be freed: the target will not touch it (after its `RmaDone`, or with it).
    RmaReleased { ctx: u64 },
    /// A probe found `peer` gone (its node does not answer, or no endpoint is there any
    /// more): what waited on it failed with `why`, in the events before this one. For
    /// the driver to say so, naming the node: an MPI library reports only an error code.
    PeerGone {
        peer: Peer,
        why: String,
        failed: usize,
    },
}

/// What [`Engine::on_packet`] did with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrived {
    /// Acted on it at once (a one-sided request to serve): its time is the caller's now.
    Acted,
    /// Kept it for a receive (matched now or later, or a duplicate dropped), for a
    /// send's completion (a FIN) or a one-sided operation's (its answer), or it was
    /// bookkeeping only: its time comes back with the event the program learns of it by
    /// ([`Event::Received`], [`Peeked`], [`Event::Sent`], [`Event::RmaDone`]), if any.
    Kept,
}

/// A waiting message, as a probe sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peeked {
    pub from: Peer,
    pub tag: Option<u64>,
    pub len: u64,
    pub cq_data: Option<u64>,
    /// When it arrived, in the caller's time ([`Engine::on_packet`]'s `at`).
    pub at: u64,
}

/// How the packetizer message of a [`Transmit`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Delivered at `at`, in the caller's time (the provider's: the rank's modeled
    /// picoseconds): handed back on the [`Event::Sent`] it completes, if any, since only
    /// where the program is told of it does that time become the program's.
    Delivered { at: u64 },
    /// Refused for now by a full mailbox: to send again (its endpoint is there, only
    /// busy, so for as long as it takes).
    Refused,
    /// No endpoint at the address (not yet, or no longer): sent again for the engine's
    /// patience ([`Config::patience_ns`]), then failed.
    Absent,
    /// Refused for good (another job's endpoint, an address that names nothing).
    Denied(String),
    /// Not posted at all: the destination never saw it.
    NotSent(String),
    /// Posted, and ended without an answer (timed out): the destination may have it.
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum MsgError {
    #[error("an eager message of {len} B: the eager limit is {limit}")]
    TooLongForEager { len: usize, limit: usize },
    #[error("malformed message from node {node} rank {rank}: {error}")]
    Malformed {
        node: u32,
        rank: u8,
        error: WireError,
    },
    #[error("message {seq} from {from:?} is too far ahead of {next}")]
    TooFarAhead { from: Peer, seq: u32, next: u32 },
    #[error("no packet {0} in flight")]
    UnknownToken(u64),
    #[error("no fetch {0} in flight")]
    UnknownFetch(u64),
}

/// Why a target did not carry out a one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaRefusal {
    /// No region with that key, outside it, or without the access asked.
    Denied,
    /// Its memory or the NI failed.
    Failed,
}

/// When a rendezvous send completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Complete {
    /// When the request is delivered: one message, not the read and its FIN after it.
    Transmit,
    /// When the receiver's FIN says it read the data.
    Delivery,
}

/// Counters an endpoint reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgStats {
    pub eager_sent: u64,
    pub rendezvous_sent: u64,
    pub received: u64,
    pub unexpected: u64,
    pub duplicates: u64,
    pub malformed: u64,
    pub resent: u64,
    pub fins_lost: u64,
    /// Rendezvous sends that had completed (transmit completion) and whose receiver then
    /// could not read them; the receive reported the failure.
    pub refused_after_completion: u64,
    /// One-sided operations this endpoint started, and served as their target.
    pub rma_started: u64,
    pub rma_served: u64,
    /// Served ones refused (bad key, range or access) or failed here.
    pub rma_refused: u64,
    /// Answers to served operations that could not be delivered.
    pub rma_answers_lost: u64,
    /// Requests that failed unanswered and may still be served: the memory they name is
    /// kept until an answer comes.
    pub memory_kept: u64,
    /// Probes sent to peers that owed an answer for long, and the operations failed
    /// because such a peer was gone.
    pub probes: u64,
    pub lost_to_gone_peers: u64,
}

fn peeked(from: Peer, tag: Option<u64>, a: &Arrival) -> Peeked {
    let (len, cq_data, at) = match a {
        Arrival::Eager {
            payload,
            cq_data,
            at,
        } => (payload.len() as u64, *cq_data, *at),
        Arrival::Rts {
            len, cq_data, at, ..
        } => (*len, *cq_data, *at),
    };
    Peeked {
        from,
        tag,
        len,
        cq_data,
        at,
    }
}

/// What a posted receive is.
#[derive(Debug)]
struct Posted {
    ctx: u64,
    capacity: u64,
    /// Its place among the posted receives (the rest of a multi-receive buffer keeps
    /// the buffer's).
    order: u64,
    /// It takes only messages it can hold whole (a part of a multi-receive buffer).
    whole: bool,
    /// When it was posted ([`Engine::handle_timeout`]'s clock): a receive from one peer
    /// that waits long has that peer probed.
    since: u64,
}

impl Posted {
    /// Whether it can take `a`: any message, or one that fits whole.
    fn fits(&self, a: &Arrival) -> bool {
        !self.whole || a.len() <= self.capacity
    }
}

/// A message that came in, before or as its receive.
#[derive(Debug)]
enum Arrival {
    Eager {
        cq_data: Option<u64>,
        payload: Vec<u8>,
        at: u64,
    },
    Rts {
        cq_data: Option<u64>,
        id: u32,
        len: u64,
        va: u64,
        at: u64,
    },
}

impl Arrival {
    /// The message's length.
    fn len(&self) -> u64 {
        match self {
            Arrival::Eager { payload, .. } => payload.len() as u64,
            Arrival::Rts { len, .. } => *len,
        }
    }
}

#[derive(Debug)]
enum Owner {
    Eager { ctx: u64 },
    Rts { id: u32 },
    Fin,
    Rma { id: u32 },
    RmaAnswer,
    Probe,
}

/// One destination's messages in sequence.
#[derive(Debug, Default)]
struct Outbound {
    /// The next message's number (the wire carries its low 32 bits).
    next: u64,
    /// Numbers sent and not yet delivered (in flight, or refused and to go again).
    undelivered: BTreeSet<u64>,
    /// Messages numbered but not sent: the earliest undelivered one is [`HELD_MAX`]
    /// behind. A message refused by a full mailbox goes again after a wait that grows
    /// with each refusal, so later ones, refused fewer times, overtook it; past the
    /// receiver's bound they were dropped there as out of protocol, though their NI had
    /// delivered them (a sender that injected 3000 messages into a sleeping receiver lost
    /// half).
    blocked: VecDeque<(u64, Packet, Owner)>,
}

impl Outbound {
    fn open(&self, seq: u64) -> bool {
        self.undelivered
            .first()
            .is_none_or(|&low| seq < low + HELD_MAX as u64)
    }
}

#[derive(Debug)]
struct InFlight {
    to: Peer,
    /// Its number in its destination's sequence (eager messages, requests to send).
    seq: Option<u64>,
    bytes: Vec<u8>,
    owner: Owner,
    /// When the destination first had no endpoint for it.
    absent_since: Option<u64>,
    /// Refusals in a row (full mailbox, no endpoint): how long its next resend waits.
    refusals: u32,
}

/// A rendezvous send, from its request to the receiver's FIN.
#[derive(Debug)]
struct Rendezvous {
    ctx: u64,
    to: Peer,
    complete: Complete,
    /// Its `Sent` went out already.
    completed: bool,
    /// When it was sent: its FIN is owed from then.
    since: u64,
}

#[derive(Debug)]
struct Fetching {
    ctx: u64,
    from: Peer,
    tag: Option<u64>,
    cq_data: Option<u64>,
    len: u64,
    read: u64,
    rts: u32,
}

#[derive(Debug, Default)]
struct Inbound {
    next: u32,
    held: BTreeMap<u32, (Option<u64>, Arrival)>,
}

/// A one-sided operation this endpoint started, until its target answers.
#[derive(Debug)]
struct RmaOp {
    ctx: u64,
    to: Peer,
    /// Its `RmaDone` went out (it failed without an answer that the target may still
    /// give): kept only until that answer releases its memory.
    ended: bool,
    /// When it started: its answer is owed from then.
    since: u64,
}

/// A staged RMA write being read by its target, to store once read.
#[derive(Debug)]
struct RmaFetch {
    reply: u64,
    key: u64,
    addr: u64,
    len: u64,
}

/// One endpoint's messages.
#[derive(Debug)]
pub struct Engine {
    me: Peer,
    cfg: Config,
    matcher: Matcher<Posted, Arrival>,
    /// Receives posted so far: the next one's place.
    posted_count: u64,
    outbound: HashMap<Peer, Outbound>,
    inbound: HashMap<Peer, Inbound>,
    packets: HashMap<u64, InFlight>,
    next_token: u64,
    rendezvous: HashMap<u32, Rendezvous>,
    next_rts: u32,
    fetches: HashMap<u64, Fetching>,
    next_fetch: u64,
    /// Messages a probe claimed, for the receive that names them.
    claimed: HashMap<u64, (Peer, Option<u64>, Arrival)>,
    next_claim: u64,
    actions: VecDeque<Action>,
    events: VecDeque<Event>,
    stats: MsgStats,
    rma: HashMap<u32, RmaOp>,
    next_rma: u32,
    /// Operations being served here: reply -> (initiator, its id).
    served: HashMap<u64, (Peer, u32)>,
    next_reply: u64,
    rma_fetches: HashMap<u64, RmaFetch>,
    /// The driver's clock ([`Engine::handle_timeout`]), in ns.
    now: u64,
    /// Peers with a probe in flight.
    probing: HashSet<Peer>,
    next_probe: u64,
    /// Packets refused, to be sent again at a time: (due, token).
    deferred: BTreeSet<(u64, u64)>,
}

impl Engine {
    pub fn new(me: Peer, cfg: Config) -> Engine {
        Engine {
            me,
            cfg: Config {
                eager_limit: cfg.eager_limit.min(EAGER_MAX),
                ..cfg
            },
            matcher: Matcher::new(cfg.max_unexpected),
            posted_count: 0,
            outbound: HashMap::new(),
            inbound: HashMap::new(),
            packets: HashMap::new(),
            next_token: 0,
            rendezvous: HashMap::new(),
            next_rts: cfg.first_id,
            fetches: HashMap::new(),
            next_fetch: 0,
            claimed: HashMap::new(),
            next_claim: 0,
            actions: VecDeque::new(),
            events: VecDeque::new(),
            stats: MsgStats::default(),
            rma: HashMap::new(),
            next_rma: cfg.first_id,
            served: HashMap::new(),
            next_reply: 0,
            rma_fetches: HashMap::new(),
            now: 0,
            probing: HashSet::new(),
            next_probe: 0,
            deferred: BTreeSet::new(),
        }
    }

    pub fn me(&self) -> Peer {
        self.me
    }

    /// Messages up to this long go eager ([`Outgoing::Inline`]); longer ones are staged.
    pub fn eager_limit(&self) -> usize {
        self.cfg.eager_limit
    }

    pub fn stats(&self) -> MsgStats {
        self.stats
    }

    /// Whether the endpoint may take another message from its mailbox.
    pub fn has_room(&self) -> bool {
        self.matcher.has_room() && self.served.len() < RMA_SERVED_MAX
    }

    /// Writes `data` to `target` at `to` (`fi_write`): inline up to [`EAGER_MAX`] bytes,
    /// else staged in the driver's registered memory. `ctx` comes back in the
    /// [`Event::RmaDone`].
    pub fn rma_write(&mut self, to: Peer, target: RmaTarget, data: RmaData, ctx: u64) {
        if matches!(&data, RmaData::Inline(b) if b.len() > EAGER_MAX) {
            // Longer than a message holds: the driver should have staged it.
            self.events.push_back(Event::RmaDone {
                ctx,
                result: Err(Failure::RmaFailed),
                at: None,
            });
            self.events.push_back(Event::RmaReleased { ctx });
            return;
        }
        let id = self.start_rma(to, ctx);
        let packet = Packet::RmaWrite {
            src_vi: self.me.vi,
            id,
            key: target.key,
            addr: target.addr,
            data,
        };
        self.transmit(to, packet, Owner::Rma { id });
    }

    /// Reads `len` bytes at `target` of `to` into `va` of the driver's registered memory
    /// (`fi_read`); `ctx` comes back in the [`Event::RmaDone`].
    pub fn rma_read(&mut self, to: Peer, target: RmaTarget, len: u64, va: u64, ctx: u64) {
        let id = self.start_rma(to, ctx);
        let packet = Packet::RmaRead {
            src_vi: self.me.vi,
            id,
            key: target.key,
            addr: target.addr,
            len,
            va,
        };
        self.transmit(to, packet, Owner::Rma { id });
    }

    fn start_rma(&mut self, to: Peer, ctx: u64) -> u32 {
        let id = self.next_rma;
        self.next_rma = self.next_rma.wrapping_add(1);
        self.rma.insert(
            id,
            RmaOp {
                ctx,
                to,
                ended: false,
                since: self.now,
            },
        );
        self.stats.rma_started += 1;
        id
    }

    /// The driver carried out (or could not) the [`Store`] or [`Push`] of `reply`.
    pub fn rma_served(&mut self, reply: u64, result: Result<(), RmaRefusal>) {
        let Some((to, id)) = self.served.remove(&reply) else {
            return;
        };
        let status = match result {
            Ok(()) => RmaStatus::Done,
            Err(r) => {
                self.stats.rma_refused += 1;
                match r {
                    RmaRefusal::Denied => RmaStatus::Denied,
                    RmaRefusal::Failed => RmaStatus::Failed,
                }
            }
        };
        let src_vi = self.me.vi;
        self.transmit(to, Packet::RmaDone { src_vi, id, status }, Owner::RmaAnswer);
    }

    /// A one-sided request from `from` arrived: serve it.
    fn serve_rma(&mut self, from: Peer, packet: Packet) {
        let (id, len) = match &packet {
            Packet::RmaWrite { id, data, .. } => match data {
                RmaData::Staged { len, .. } => (*id, *len),
                RmaData::Inline(_) => (*id, 0),
            },
            Packet::RmaRead { id, len, .. } => (*id, *len),
            _ => return,
        };
        let reply = self.next_reply;
        self.next_reply += 1;
        self.stats.rma_served += 1;
        self.served.insert(reply, (from, id));
        // No operation is longer than the largest message: a longer request (a hostile
        // or broken peer's) is refused before anything is allocated for it.
        if len > RMA_MAX {
            self.rma_served(reply, Err(RmaRefusal::Denied));
            return;
        }
        match packet {
            Packet::RmaWrite {
                key,
                addr,
                data: RmaData::Inline(payload),
                ..
            } => self.actions.push_back(Action::Store(Store {
                reply,
                key,
                addr,
                data: Data::Inline(payload),
            })),
            Packet::RmaWrite {
                key,
                addr,
                data: RmaData::Staged { len, va },
                ..
            } => {
                let fetch = self.next_fetch;
                self.next_fetch += 1;
                self.rma_fetches.insert(
                    fetch,
                    RmaFetch {
                        reply,
                        key,
                        addr,
                        len,
                    },
                );
                self.actions.push_back(Action::Fetch(Fetch {
                    id: fetch,
                    node: from.node,
                    rank: from.rank,
                    va,
                    len,
                    into: Some(RmaTarget { key, addr }),
                    // Served as it came: the caller's time is the request's already.
                    after: 0,
                }));
            }
            Packet::RmaRead {
                key, addr, len, va, ..
            } => self.actions.push_back(Action::Push(Push {
                reply,
                key,
                addr,
                len,
                node: from.node,
                rank: from.rank,
                va,
            })),
            _ => {}
        }
    }

    /// Sends `data` to `to`, tagged or not, with optional remote CQ data; `ctx` comes back
    /// in the [`Event::Sent`].
    pub fn send(
        &mut self,
        to: Peer,
        tag: Option<u64>,
        cq_data: Option<u64>,
        data: Outgoing,
        ctx: u64,
    ) -> Result<(), MsgError> {
        let seq64 = self.outbound.entry(to).or_default().next;
        // The wire's number: the low 32 bits, compared in wrapping order there.
        let seq = seq64 as u32;
        let src_vi = self.me.vi;
        let (packet, owner) = match data {
            Outgoing::Inline(payload) => {
                if payload.len() > self.cfg.eager_limit {
                    return Err(MsgError::TooLongForEager {
                        len: payload.len(),
                        limit: self.cfg.eager_limit,
                    });
                }
                self.stats.eager_sent += 1;
                (
                    Packet::Eager {
                        src_vi,
                        seq,
                        tag,
                        cq_data,
                        payload,
                    },
                    Owner::Eager { ctx },
                )
            }
            Outgoing::Staged { va, len, complete } => {
                let id = self.next_rts;
                self.next_rts = self.next_rts.wrapping_add(1);
                self.rendezvous.insert(
                    id,
                    Rendezvous {
                        ctx,
                        to,
                        complete,
                        completed: false,
                        since: self.now,
                    },
                );
                self.stats.rendezvous_sent += 1;
                (
                    Packet::Rts {
                        src_vi,
                        seq,
                        tag,
                        cq_data,
                        id,
                        len,
                        va,
                    },
                    Owner::Rts { id },
                )
            }
        };
        let out = self.outbound.get_mut(&to).expect("made above");
        out.next += 1;
        if out.blocked.is_empty() && out.open(seq64) {
            out.undelivered.insert(seq64);
            self.transmit_numbered(to, Some(seq64), packet, owner);
        } else {
            out.blocked.push_back((seq64, packet, owner));
        }
        Ok(())
    }

    /// Message `p` was delivered, or never will be: if it is numbered, the ones it held
    /// back go while they are within [`HELD_MAX`] of the earliest still undelivered.
    fn settled(&mut self, p: &InFlight) {
        let (to, Some(seq)) = (p.to, p.seq) else {
            return;
        };
        let Some(out) = self.outbound.get_mut(&to) else {
            return;
        };
        out.undelivered.remove(&seq);
        let mut go = Vec::new();
        while let Some(&(s, ..)) = out.blocked.front() {
            if !out.open(s) {
                break;
            }
            let (s, packet, owner) = out.blocked.pop_front().expect("looked at");
            out.undelivered.insert(s);
            go.push((s, packet, owner));
        }
        for (s, packet, owner) in go {
            self.transmit_numbered(to, Some(s), packet, owner);
        }
    }

    fn transmit(&mut self, to: Peer, packet: Packet, owner: Owner) {
        self.transmit_numbered(to, None, packet, owner);
    }

    fn transmit_numbered(&mut self, to: Peer, seq: Option<u64>, packet: Packet, owner: Owner) {
        let bytes = packet.encode().expect("the engine builds valid packets");
        let token = self.next_token;
        self.next_token += 1;
        self.packets.insert(
            token,
            InFlight {
                to,
                seq,
                bytes: bytes.clone(),
                owner,
                absent_since: None,
                refusals: 0,
            },
        );
        self.actions
            .push_back(Action::Transmit(Transmit { token, to, bytes }));
    }

    /// Posts a receive of up to `capacity` bytes; `ctx` comes back in its event.
    pub fn post_recv(&mut self, accepts: Accepts, capacity: u64, ctx: u64) {
        let order = self.next_order();
        self.post(accepts, ctx, capacity, order, false);
    }

    /// Posts a receive that takes only messages of up to `capacity` bytes whole (what is
    /// left of a multi-receive buffer): a message it accepts but cannot hold ends it
    /// with [`Event::Unfit`] and goes to the next receive. `order`: the place of the
    /// buffer's earlier part, which this one keeps (none: a new buffer, last). Returns
    /// its place.
    pub fn post_recv_whole(
        &mut self,
        accepts: Accepts,
        capacity: u64,
        ctx: u64,
        order: Option<u64>,
    ) -> u64 {
        let order = order.unwrap_or_else(|| self.next_order());
        self.post(accepts, ctx, capacity, order, true);
        order
    }

    /// Posts a receive in its place `order`: it takes a waiting message now, ends unfit,
    /// or waits.
    fn post(&mut self, accepts: Accepts, ctx: u64, capacity: u64, order: u64, whole: bool) {
        let posted = Posted {
            ctx,
            capacity,
            order,
            whole,
            since: self.now,
        };
        match self
            .matcher
            .post(accepts, posted, Posted::fits, |p| p.order > order)
        {
            Posting::Matched(from, tag, arrival, posted) => {
                self.deliver(posted, from, tag, arrival)
            }
            Posting::Waiting => {}
            Posting::Unfit(p) => self.events.push_back(Event::Unfit { ctx: p.ctx }),
        }
    }

    fn next_order(&mut self) -> u64 {
        self.posted_count += 1;
        self.posted_count
    }

    /// Cancels the posted receive `ctx`; false when it is not waiting (matched already,
    /// or never posted).
    pub fn cancel_recv(&mut self, ctx: u64) -> bool {
        match self.matcher.cancel(|p| p.ctx == ctx) {
            Some(p) => {
                self.events.push_back(Event::RecvFailed {
                    ctx: p.ctx,
                    error: Failure::Cancelled,
                });
                true
            }
            None => false,
        }
    }

    /// The first waiting message `accepts` would take (`FI_PEEK`).
    pub fn peek(&self, accepts: &Accepts) -> Option<Peeked> {
        self.matcher
            .peek(accepts)
            .map(|(from, tag, a)| peeked(from, tag, a))
    }

    /// [`Engine::peek`], and the message is set aside for [`Engine::recv_claimed`]
    /// (`FI_PEEK | FI_CLAIM`): no other receive takes it.
    pub fn claim(&mut self, accepts: &Accepts) -> Option<(u64, Peeked)> {
        let (from, tag, a) = self.matcher.take(accepts)?;
        let p = peeked(from, tag, &a);
        let id = self.next_claim;
        self.next_claim += 1;
        self.claimed.insert(id, (from, tag, a));
        Some((id, p))
    }

    /// Receives the claimed message `claim` into up to `capacity` bytes (0 discards
    /// it); false when no such claim is waiting.
    pub fn recv_claimed(&mut self, claim: u64, capacity: u64, ctx: u64) -> bool {
        let Some((from, tag, a)) = self.claimed.remove(&claim) else {
            return false;
        };
        let posted = Posted {
            ctx,
            capacity,
            order: 0,
            whole: false,
            since: self.now,
        };
        self.deliver(posted, from, tag, a);
        true
    }

    /// A message from `node`'s `rank` arrived in this endpoint's mailbox, at `at` in the
    /// caller's time (the provider's: modeled picoseconds). Says whether the engine acted
    /// on it at once, so that its time is the caller's now, or kept it for a receive,
    /// which hands the time back ([`Event::Received`], [`Peeked`]): a message taken early
    /// by the host's timing must not move the program's time before it asks for it.
    pub fn on_packet(
        &mut self,
        node: u32,
        rank: u8,
        bytes: &[u8],
        at: u64,
    ) -> Result<Arrived, MsgError> {
        let packet = Packet::decode(bytes).map_err(|error| {
            self.stats.malformed += 1;
            MsgError::Malformed { node, rank, error }
        })?;
        let from = |src_vi| Peer {
            node,
            rank,
            vi: src_vi,
        };
        match packet {
            Packet::RmaWrite { src_vi, .. } | Packet::RmaRead { src_vi, .. } => {
                self.serve_rma(from(src_vi), packet);
                Ok(Arrived::Acted)
            }
            Packet::RmaDone { src_vi, id, status } => {
                // Only the endpoint the request went to ends it.
                if self.rma.get(&id).is_some_and(|r| r.to == from(src_vi)) {
                    let r = self.rma.remove(&id).expect("checked");
                    let result = match status {
                        RmaStatus::Done => Ok(()),
                        RmaStatus::Denied => Err(Failure::RmaDenied),
                        RmaStatus::Failed => Err(Failure::RmaFailed),
                    };
                    if !r.ended {
                        self.events.push_back(Event::RmaDone {
                            ctx: r.ctx,
                            result,
                            at: Some(at),
                        });
                    }
                    self.events.push_back(Event::RmaReleased { ctx: r.ctx });
                } else {
                    self.stats.duplicates += 1;
                }
                // Its time comes back with the operation's completion, if any.
                Ok(Arrived::Kept)
            }
            // Taking it in was the answer: nothing for the program.
            Packet::Probe { .. } => Ok(Arrived::Kept),
            Packet::Fin { src_vi, id, status } => {
                // Only the endpoint the request went to ends it.
                if self
                    .rendezvous
                    .get(&id)
                    .is_some_and(|r| r.to == from(src_vi))
                {
                    let r = self.rendezvous.remove(&id).expect("checked");
                    let result = match status {
                        FinStatus::Done | FinStatus::Truncated => Ok(()),
                        FinStatus::Refused => Err(Failure::Refused),
                    };
                    if !r.completed {
                        // The send completes by the FIN: its time is the send's.
                        self.events.push_back(Event::Sent {
                            ctx: r.ctx,
                            result,
                            delivered: Some(at),
                        });
                    } else if result.is_err() {
                        self.stats.refused_after_completion += 1;
                    }
                    self.events.push_back(Event::Released { ctx: r.ctx });
                }
                // Otherwise it frees staging only: bookkeeping, not the program's.
                Ok(Arrived::Kept)
            }
            Packet::Eager {
                src_vi,
                seq,
                tag,
                cq_data,
                payload,
            } => self
                .sequenced(
                    from(src_vi),
                    seq,
                    tag,
                    Arrival::Eager {
                        cq_data,
                        payload,
                        at,
                    },
                )
                .map(|()| Arrived::Kept),
            Packet::Rts {
                src_vi,
                seq,
                tag,
                cq_data,
                id,
                len,
                va,
            } => self
                .sequenced(
                    from(src_vi),
                    seq,
                    tag,
                    Arrival::Rts {
                        cq_data,
                        id,
                        len,
                        va,
                        at,
                    },
                )
                .map(|()| Arrived::Kept),
        }
    }

    /// Takes `arrival` in its sender's order.
    fn sequenced(
        &mut self,
        from: Peer,
        seq: u32,
        tag: Option<u64>,
        arrival: Arrival,
    ) -> Result<(), MsgError> {
        let inbound = self.inbound.entry(from).or_default();
        let ahead = seq.wrapping_sub(inbound.next);
        if ahead >= u32::MAX / 2 || inbound.held.contains_key(&seq) {
            // Behind what was taken already, or held already.
            self.stats.duplicates += 1;
            return Ok(());
        }
        if ahead as usize > HELD_MAX {
            return Err(MsgError::TooFarAhead {
                from,
                seq,
                next: inbound.next,
            });
        }
        inbound.held.insert(seq, (tag, arrival));
        loop {
            let inbound = self.inbound.get_mut(&from).expect("made above");
            let Some((tag, arrival)) = inbound.held.remove(&inbound.next) else {
                return Ok(());
            };
            inbound.next = inbound.next.wrapping_add(1);
            self.stats.received += 1;
            let (taken, unfit) = self.matcher.arrive(from, tag, arrival, Posted::fits);
            for p in unfit {
                self.events.push_back(Event::Unfit { ctx: p.ctx });
            }
            match taken {
                Some((posted, arrival)) => self.deliver(posted, from, tag, arrival),
                None => self.stats.unexpected += 1,
            }
        }
    }

    /// A receive took a message: hand eager bytes over, or fetch a rendezvous.
    fn deliver(&mut self, posted: Posted, from: Peer, tag: Option<u64>, arrival: Arrival) {
        if posted.whole {
            self.events.push_back(Event::Taken {
                ctx: posted.ctx,
                len: arrival.len(),
            });
        }
        match arrival {
            Arrival::Eager {
                cq_data,
                mut payload,
                at,
            } => {
                let len = payload.len() as u64;
                payload.truncate(posted.capacity.min(len) as usize);
                self.events.push_back(Event::Received {
                    ctx: posted.ctx,
                    from,
                    tag,
                    cq_data,
                    len,
                    data: Data::Inline(payload),
                    at: Some(at),
                });
            }
            Arrival::Rts {
                cq_data,
                id,
                len,
                va,
                at,
            } => {
                let read = posted.capacity.min(len);
                if read == 0 {
                    // Nothing to read: done (or truncated to nothing) at once.
                    self.fin(
                        from,
                        id,
                        if len == 0 {
                            FinStatus::Done
                        } else {
                            FinStatus::Truncated
                        },
                    );
                    self.events.push_back(Event::Received {
                        ctx: posted.ctx,
                        from,
                        tag,
                        cq_data,
                        len,
                        data: Data::Inline(Vec::new()),
                        at: Some(at),
                    });
                    return;
                }
                let fetch = self.next_fetch;
                self.next_fetch += 1;
                self.fetches.insert(
                    fetch,
                    Fetching {
                        ctx: posted.ctx,
                        from,
                        tag,
                        cq_data,
                        len,
                        read,
                        rts: id,
                    },
                );
                self.actions.push_back(Action::Fetch(Fetch {
                    id: fetch,
                    node: from.node,
                    rank: from.rank,
                    va,
                    len: read,
                    into: None,
                    after: at,
                }));
            }
        }
    }

    fn fin(&mut self, to: Peer, id: u32, status: FinStatus) {
        let src_vi = self.me.vi;
        self.transmit(to, Packet::Fin { src_vi, id, status }, Owner::Fin);
    }

    /// The driver refused fetch `id` of an RMA write before reading it: its region does
    /// not allow it ([`Fetch::into`]).
    pub fn fetch_denied(&mut self, id: u64) {
        if let Some(f) = self.rma_fetches.remove(&id) {
            self.rma_served(f.reply, Err(RmaRefusal::Denied));
        }
    }

    /// The read of fetch `id` ended.
    pub fn fetch_done(&mut self, id: u64, result: Result<(), String>) -> Result<(), MsgError> {
        if let Some(f) = self.rma_fetches.remove(&id) {
            match result {
                Ok(()) => self.actions.push_back(Action::Store(Store {
                    reply: f.reply,
                    key: f.key,
                    addr: f.addr,
                    data: Data::Fetched {
                        fetch: id,
                        len: f.len,
                    },
                })),
                Err(_) => self.rma_served(f.reply, Err(RmaRefusal::Failed)),
            }
            return Ok(());
        }
        let f = self.fetches.remove(&id).ok_or(MsgError::UnknownFetch(id))?;
        match result {
            Ok(()) => {
                let status = if f.read < f.len {
                    FinStatus::Truncated
                } else {
                    FinStatus::Done
                };
                self.fin(f.from, f.rts, status);
                self.events.push_back(Event::Received {
                    ctx: f.ctx,
                    from: f.from,
                    tag: f.tag,
                    cq_data: f.cq_data,
                    len: f.len,
                    data: Data::Fetched {
                        fetch: id,
                        len: f.read,
                    },
                    // The read's completion moved the caller's time already.
                    at: None,
                });
            }
            Err(e) => {
                self.fin(f.from, f.rts, FinStatus::Refused);
                self.events.push_back(Event::RecvFailed {
                    ctx: f.ctx,
                    error: Failure::ReadFailed(e),
                });
            }
        }
        Ok(())
    }

    /// The packetizer message `token` ended.
    pub fn packet_done(&mut self, token: u64, how: Delivery) -> Result<(), MsgError> {
        let mut p = self
            .packets
            .remove(&token)
            .ok_or(MsgError::UnknownToken(token))?;
        match how {
            Delivery::Delivered { at } => {
                self.settled(&p);
                match p.owner {
                    Owner::Eager { ctx } => self.events.push_back(Event::Sent {
                        ctx,
                        result: Ok(()),
                        delivered: Some(at),
                    }),
                    Owner::Rts { id } => {
                        if let Some(r) = self.rendezvous.get_mut(&id) {
                            if r.complete == Complete::Transmit && !r.completed {
                                r.completed = true;
                                self.events.push_back(Event::Sent {
                                    ctx: r.ctx,
                                    result: Ok(()),
                                    delivered: Some(at),
                                });
                            }
                        }
                    }
                    Owner::Probe => {
                        self.probing.remove(&p.to);
                    }
                    Owner::Fin | Owner::Rma { .. } | Owner::RmaAnswer => {}
                }
            }
            // A full mailbox: the endpoint is there, so a probe has its answer.
            Delivery::Refused if matches!(p.owner, Owner::Probe) => {
                self.probing.remove(&p.to);
            }
            Delivery::Refused => self.resend_after_refusal(token, p),
            Delivery::Absent => {
                let since = *p.absent_since.get_or_insert(self.now);
                if self.now.saturating_sub(since) < self.cfg.patience_ns {
                    self.resend_after_refusal(token, p);
                } else {
                    // A NACK said the message was not taken: nothing of it is kept there.
                    self.settled(&p);
                    let failure = Failure::Unreachable(format!(
                        "no endpoint at node {} rank {} mailbox {} for {} ms",
                        p.to.node,
                        p.to.rank,
                        p.to.vi,
                        self.cfg.patience_ns / 1_000_000
                    ));
                    self.failed(p.to, p.owner, failure, false);
                }
            }
            Delivery::Failed(_) | Delivery::Denied(_) | Delivery::NotSent(_) => {
                self.settled(&p);
                // Whether the destination may have the message after all: then what it
                // names (staged data, a read's landing place) must stay until it says.
                let maybe = matches!(how, Delivery::Failed(_));
                let failure = match how {
                    Delivery::Denied(e) => Failure::Denied(e),
                    Delivery::Failed(e) | Delivery::NotSent(e) => Failure::Unreachable(e),
                    _ => unreachable!("matched above"),
                };
                self.failed(p.to, p.owner, failure, maybe);
            }
        }
        Ok(())
    }

    /// Sends `p` again after a refusal: at once the first time, then after a wait that
    /// doubles with each refusal in a row (see [`Config::resend_first_ns`]), sent by
    /// [`Engine::handle_timeout`] once due.
    fn resend_after_refusal(&mut self, token: u64, mut p: InFlight) {
        p.refusals = p.refusals.saturating_add(1);
        if p.refusals == 1 {
            self.resend(token, p);
            return;
        }
        let doublings = (p.refusals - 2).min(32);
        let wait = self
            .cfg
            .resend_first_ns
            .saturating_mul(1 << doublings)
            .min(self.cfg.resend_max_ns);
        self.deferred.insert((self.now.saturating_add(wait), token));
        self.packets.insert(token, p);
    }

    /// Sends `p` again, same bytes, same number: the receiver takes it in order.
    fn resend(&mut self, token: u64, p: InFlight) {
        self.stats.resent += 1;
        self.actions.push_back(Action::Transmit(Transmit {
            token,
            to: p.to,
            bytes: p.bytes.clone(),
        }));
        self.packets.insert(token, p);
    }

    /// The driver's clock moved to `now` (ns, monotonic): refused messages whose wait
    /// ended go again (call it at least every millisecond while any wait; an endpoint does
    /// at each progress, and its completion reads sleep no longer). Peers that have owed an answer
    /// for [`Config::probe_after_ns`], and peers a receive that names its source
    /// (`FI_DIRECTED_RECV`, as MPI libraries post them) has waited on for as long, are
    /// asked whether they are still there, at most one probe in flight each. A probe the
    /// peer's NI takes says it is; one that fails (no endpoint there for the engine's
    /// patience, another job's, a node that does not answer) fails what waits for that
    /// peer, so that no operation waits for ever on a peer that died. The memory those
    /// operations name stays: the peer may still be there after all (a node that did not
    /// answer in time). A receive from anyone waits on: no peer in particular owes it.
    pub fn handle_timeout(&mut self, now: u64) {
        self.now = self.now.max(now);
        while let Some(&(due, token)) = self.deferred.first() {
            if due > self.now {
                break;
            }
            self.deferred.pop_first();
            // Gone meanwhile (its peer found gone, its operation cancelled): nothing to send.
            if let Some(p) = self.packets.remove(&token) {
                self.resend(token, p);
            }
        }
        if self.now < self.next_probe {
            return;
        }
        self.next_probe = self.now + self.cfg.probe_after_ns / 2;
        let owed_since = self.now.saturating_sub(self.cfg.probe_after_ns);
        let mut owing: Vec<Peer> = self
            .rma
            .values()
            .filter(|r| !r.ended && r.since <= owed_since)
            .map(|r| r.to)
            .chain(
                self.rendezvous
                    .values()
                    .filter(|r| !r.completed && r.since <= owed_since)
                    .map(|r| r.to),
            )
            .chain(
                self.matcher
                    .posted_receives()
                    .filter(|(_, p)| p.since <= owed_since)
                    .filter_map(|(a, _)| a.from),
            )
            .filter(|p| !self.probing.contains(p))
            .collect();
        owing.sort_unstable();
        owing.dedup();
        for to in owing {
            self.probing.insert(to);
            self.stats.probes += 1;
            let src_vi = self.me.vi;
            self.transmit(to, Packet::Probe { src_vi }, Owner::Probe);
        }
    }

    /// A probe of `peer` failed: fail every operation that waits for its answer.
    fn peer_gone(&mut self, peer: Peer, failure: Failure) {
        self.probing.remove(&peer);
        // One-sided operations first, each kind in the order it started (id order): the
        // same events in the same order on every run.
        let mut owed: Vec<(bool, u32)> = self
            .rma
            .iter()
            .filter(|(_, r)| r.to == peer && !r.ended)
            .map(|(&id, _)| (false, id))
            .chain(
                self.rendezvous
                    .iter()
                    .filter(|(_, r)| r.to == peer && !r.completed)
                    .map(|(&id, _)| (true, id)),
            )
            .collect();
        owed.sort_unstable();
        let mut failed = owed.len();
        for (send, id) in owed {
            self.stats.lost_to_gone_peers += 1;
            let owner = if send {
                Owner::Rts { id }
            } else {
                Owner::Rma { id }
            };
            self.failed(peer, owner, failure.clone(), true);
        }
        // Receives that only this peer could complete, in the order they were posted.
        while let Some(p) = self.matcher.cancel_where(|a, _| a.from == Some(peer)) {
            self.stats.lost_to_gone_peers += 1;
            failed += 1;
            self.events.push_back(Event::RecvFailed {
                ctx: p.ctx,
                error: failure.clone(),
            });
        }
        let why = match failure {
            Failure::Unreachable(why) => why,
            other => other.to_string(),
        };
        self.events.push_back(Event::PeerGone { peer, why, failed });
    }

    /// The packet of `owner` could not be delivered; `maybe`: or it was, unanswered. A
    /// request the destination may have keeps the memory it names (the data it would
    /// read, the place it would write) until the destination answers after all, perhaps
    /// never: freed and reused, it would hand the destination another operation's bytes,
    /// or take its write over them.
    fn failed(&mut self, to: Peer, owner: Owner, failure: Failure, maybe: bool) {
        match owner {
            Owner::Eager { ctx } => self.events.push_back(Event::Sent {
                ctx,
                result: Err(failure),
                delivered: None,
            }),
            Owner::Rts { id } => {
                let Some(r) = self.rendezvous.get_mut(&id) else {
                    return;
                };
                if !r.completed {
                    r.completed = true;
                    self.events.push_back(Event::Sent {
                        ctx: r.ctx,
                        result: Err(failure),
                        delivered: None,
                    });
                }
                if maybe {
                    // Released by a FIN, if one comes.
                    self.stats.memory_kept += 1;
                } else {
                    let r = self.rendezvous.remove(&id).expect("looked up");
                    self.events.push_back(Event::Released { ctx: r.ctx });
                }
            }
            // The sender's staging stays until its own request fails; counted.
            Owner::Fin => self.stats.fins_lost += 1,
            Owner::Rma { id } => {
                let Some(r) = self.rma.get_mut(&id) else {
                    return;
                };
                if !r.ended {
                    r.ended = true;
                    self.events.push_back(Event::RmaDone {
                        ctx: r.ctx,
                        result: Err(failure),
                        at: None,
                    });
                }
                if maybe {
                    // Released by the target's answer, if one comes.
                    self.stats.memory_kept += 1;
                } else {
                    let r = self.rma.remove(&id).expect("looked up");
                    self.events.push_back(Event::RmaReleased { ctx: r.ctx });
                }
            }
            Owner::RmaAnswer => self.stats.rma_answers_lost += 1,
            Owner::Probe => {
                let why = format!("the peer is gone: {failure}");
                self.peer_gone(to, Failure::Unreachable(why));
            }
        }
    }

    /// What the endpoint still owes its peers or waits on from them, as (messages not yet
    /// taken by their destination's NI, rendezvous sends not yet read, reads of others'
    /// data under way, one-sided operations being served): all zero when closing it loses
    /// nothing.
    pub fn unfinished(&self) -> (usize, usize, usize, usize) {
        let blocked: usize = self.outbound.values().map(|o| o.blocked.len()).sum();
        (
            self.packets.len() + self.actions.len() + blocked,
            self.rendezvous.len(),
            self.fetches.len(),
            self.served.len(),
        )
    }

    /// Whether [`Engine::poll_action`] has something.
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests;
