//! The node core behind a lock, shared by the link tasks, the control server and the
//! metrics endpoint. Every task that hears something feeds it in here, calls
//! [`Core::pump`], and the pump encodes what the core wants sent into the per-link output
//! buffers and wakes those links' writers. Critical sections never await.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use exanet_proto::attach::{CollectiveKind, CollectivePath, CollectiveReport};
use exanet_proto::fault::{FaultError, LinkFaults};
use exanet_proto::frame::{self, Frame, Hello};
use exanet_proto::link::{Departure, LinkSender};
use exanet_proto::model::ModelTime;
use exanet_proto::node::NodeStats;
use exanet_proto::topology::{neighbour, node_links, NPORTS};
use exanet_proto::{
    CellError, Instant, LinkKind, Node, NodeError, NodeEvent, NodeId, Port, Shape, Vc,
};
use tokio::sync::{oneshot, Notify};
use tracing::{debug, warn};

use exanet_proto::ni::{Memory, Ni};
use exanet_proto::reserved::Reservations;
use exanet_proto::workload::{Relayed, WorkloadService};

use crate::control::{LinkState, LinkStatus, NiStatus, NodeStatus, PingReport, QuicStats};
use crate::rack::Rack;
use crate::session::Session;
use crate::shm_memory::ShmMemory;

/// What a link's output buffer is allocated with once frames are written into it.
const OUT_BUFFER: usize = 64 * 1024;

/// One port's link: who is at the other end and the state of the current session.
pub struct LinkSlot {
    pub peer: NodeId,
    pub peer_port: Port,
    pub kind: LinkKind,
    session: Option<u64>,
    /// Wakes the current session's writer.
    wake: Option<Arc<Notify>>,
    /// Encoded frames waiting for the writer.
    out: BytesMut,
    pub sessions: u64,
    /// The QUIC connection of the current session, for its transport statistics.
    conn: Option<quinn::Connection>,
    /// What this node sends over the link passes through here: the operator's faults, the
    /// frames they hold back, the credit of cells they lost.
    sender: LinkSender,
    /// Cut by the operator: no session is started until it is set up again.
    admin_down: bool,
    /// Wakes the dialer waiting for the operator to set the link up again.
    pub up_wake: Arc<Notify>,
    /// Cells from the peer refused as undecodable (CRC errors and the like).
    pub rx_corrupt_cells: u64,
}

impl LinkSlot {
    /// Writes what leaves the sender now into the writer's buffer.
    fn put(&mut self, d: Option<Departure>) -> Result<(), CellError> {
        match d {
            Some(d) => {
                // The writer takes the whole buffer each time; a fresh one starts at a
                // writer's batch, not at one frame grown by doubling (copying each time).
                if self.out.is_empty() && self.out.capacity() < OUT_BUFFER / 2 {
                    self.out.reserve(OUT_BUFFER);
                }
                d.encode(&mut self.out)
            }
            None => Ok(()),
        }
    }
}

pub struct Core {
    pub node: Node,
    /// The NI's service to attached workloads: their commands, completions and memory
    /// placement.
    workloads: WorkloadService,
    /// What the daemon keeps of each attached workload beside it, by rank.
    pub sessions: Vec<Option<Session>>,
    /// The NI deadline the timer task sleeps towards.
    pub timer_armed: Option<Instant>,
    timer_wake: Arc<Notify>,
    slots: Vec<Option<LinkSlot>>,
    pings: HashMap<u32, oneshot::Sender<NodeEvent>>,
    next_probe: u32,
    /// How long workloads' operations take, from command to completion.
    pub latency: crate::metrics::Latency,
    /// Collectives the workloads' libraries reported, by kind and path.
    /// By job: what one job's workloads report moves only that job's counts.
    pub collectives:
        std::collections::BTreeMap<(String, CollectiveKind, CollectivePath), CollectiveReport>,
}

/// Why a peer's hello was refused.
#[derive(Debug, thiserror::Error)]
pub enum HelloError {
    #[error("peer speaks link version {0}, this daemon {ver}", ver = frame::VERSION)]
    Version(u8),
    #[error("peer belongs to another rack (digest {0:#x})")]
    OtherRack(u64),
    #[error("peer runs a {x}x{y}x{z} rack, this one is {mine}", x = .0 .0, y = .0 .1, z = .0 .2, mine = .1)]
    Shape((u16, u16, u16), Shape),
    #[error("peer claims to be node {claimed} on port {port}, which is not our neighbour there")]
    NotNeighbour { claimed: NodeId, port: Port },
}

impl HelloError {
    pub fn kind(&self) -> &'static str {
        match self {
            HelloError::Version(_) => "hello_version",
            HelloError::OtherRack(_) => "hello_rack",
            HelloError::Shape(..) => "hello_shape",
            HelloError::NotNeighbour { .. } => "hello_neighbour",
        }
    }
}

impl Core {
    /// Encodes everything the core wants to send and wakes the writers concerned.
    pub fn pump(&mut self, now: Instant) {
        let mut woken = [false; NPORTS];
        while let Some(t) = self.node.poll_transmit(now) {
            let i = t.port.index();
            match self.slots[i].as_mut().filter(|s| s.session.is_some()) {
                Some(slot) => {
                    woken[i] = true;
                    let d = slot.sender.send_cell(now, t.vc, t.cell);
                    if let Err(e) = slot.put(d) {
                        // Cells in the core were validated on the way in; a bug.
                        warn!(error = %e, "dropping unencodable cell");
                        self.node.count_error("encode");
                    }
                }
                None => {
                    // The core only transmits on ports whose session granted credit.
                    warn!(port = %t.port, "cell for a link without a session dropped");
                    self.node.count_error("no_session");
                }
            }
        }
        while let Some((port, vc, bytes, freed)) = self.node.poll_credit() {
            let i = port.index();
            if let Some(slot) = self.slots[i].as_mut().filter(|s| s.session.is_some()) {
                let d = slot.sender.send_credit(now, vc, bytes, freed);
                let _ = slot.put(d);
                woken[i] = true;
            }
        }
        while let Some(ev) = self.node.poll_event() {
            match ev {
                NodeEvent::ProbeReply { id, .. } => {
                    if let Some(tx) = self.pings.remove(&id) {
                        let _ = tx.send(ev);
                    }
                }
                NodeEvent::LoadSent => debug!("load generator done"),
                NodeEvent::LoadDelivered { .. } => {}
                NodeEvent::Ni(ev) => {
                    let (ni, _) = self.node.ni_mut();
                    match self.workloads.on_event(ni, ev, now) {
                        Relayed::Queued(Some(f)) => self.latency.observe(f.op, f.ok, f.latency_ns),
                        Relayed::Queued(None) | Relayed::NotAttached(_) => {}
                        Relayed::NotRelayed => self.node.count_error("notification_not_relayed"),
                    }
                }
            }
        }
        // A sooner NI deadline than the timer task sleeps towards: wake it to re-arm.
        if let Some(t) = self.node.poll_timeout() {
            if self.timer_armed.is_none_or(|a| t < a) {
                self.timer_armed = Some(t);
                self.timer_wake.notify_one();
            }
        }
        for (i, w) in woken.iter().enumerate() {
            if *w {
                if let Some(n) = self.slots[i].as_ref().and_then(|s| s.wake.as_ref()) {
                    n.notify_one();
                }
            }
        }
    }

    /// The workload service, with the NI and memory it serves the workloads with.
    pub fn workloads(&mut self) -> (&mut WorkloadService, &mut Ni, &mut (dyn Memory + Send)) {
        let (ni, mem) = self.node.ni_mut();
        (&mut self.workloads, ni, mem)
    }

    /// Moves what `rank`'s completion ring has room for into it (call it when the
    /// workload may have made room).
    pub fn drain(&mut self, rank: u8) {
        let (svc, ni, _) = self.workloads();
        svc.drain(ni, rank);
    }

    fn slot(&mut self, port: Port) -> Option<&mut LinkSlot> {
        self.slots.get_mut(port.index()).and_then(|s| s.as_mut())
    }

    /// Starts session `sid` on `port`, replacing any older one, and queues our hello.
    pub fn begin_session(
        &mut self,
        port: Port,
        sid: u64,
        wake: Arc<Notify>,
        conn: quinn::Connection,
        rack_digest: u64,
        now: Instant,
    ) -> Result<(), SessionRefused> {
        let me = self.node.id();
        let shape = *self.node.switch().shape();
        if self.slot(port).is_some_and(|s| s.admin_down) {
            return Err(SessionRefused::AdminDown);
        }
        if self.slot(port).is_some_and(|s| s.session.is_some()) {
            // A peer that restarted reconnects before we noticed the old session die.
            self.node.link_down(port, now)?;
        }
        let grant = self.node.link_up(port)?;
        let slot = self
            .slot(port)
            .expect("link_up succeeded, so the port has a link");
        if let Some(old) = slot.wake.replace(wake.clone()) {
            old.notify_one();
        }
        slot.session = Some(sid);
        slot.conn = Some(conn);
        slot.sessions += 1;
        slot.out.clear();
        frame::encode_hello(
            &Hello::new(me, port, &shape, rack_digest, grant),
            &mut slot.out,
        );
        wake.notify_one();
        Ok(())
    }

    /// Checks a peer's hello against what this port's neighbour must say.
    pub fn check_hello(&self, port: Port, h: &Hello, rack_digest: u64) -> Result<(), HelloError> {
        let shape = *self.node.switch().shape();
        if h.version != frame::VERSION {
            return Err(HelloError::Version(h.version));
        }
        if h.rack != rack_digest {
            return Err(HelloError::OtherRack(h.rack));
        }
        if h.shape != (shape.x() as u16, shape.y() as u16, shape.z() as u16) {
            return Err(HelloError::Shape(h.shape, shape));
        }
        match neighbour(&shape, self.node.id(), port) {
            Some((n, p)) if n == h.node && p == h.port => Ok(()),
            _ => Err(HelloError::NotNeighbour {
                claimed: h.node,
                port,
            }),
        }
    }

    /// Applies the peer's hello of session `sid`: the link may now carry cells.
    pub fn accept_hello(&mut self, port: Port, sid: u64, h: &Hello, now: Instant) {
        if self.slot(port).and_then(|s| s.session) != Some(sid) {
            return;
        }
        if self.node.peer_grant(port, h.grant, now).is_ok() {
            self.pump(now);
        }
    }

    /// Applies frames received on session `sid` of `port`. Returns false when the session
    /// is no longer current (the caller should stop).
    pub fn apply(&mut self, port: Port, sid: u64, frames: Vec<Frame>, now: Instant) -> bool {
        if self.slot(port).and_then(|s| s.session) != Some(sid) {
            return false;
        }
        for f in frames {
            match f {
                Frame::Cell(vc, cell) => {
                    if let Err(e) = self.node.receive(port, vc, cell, now) {
                        debug!(%port, error = %e, "cell refused");
                    }
                }
                Frame::Credit(vc, n, freed) => {
                    let _ = self.node.credit(port, vc, n, freed, now);
                }
                Frame::Hello(_) => self.node.count_error("hello_repeated"),
            }
        }
        self.pump(now);
        true
    }

    /// Ends session `sid` on `port` if it is still the current one.
    pub fn end_session(&mut self, port: Port, sid: u64, now: Instant) {
        let Some(slot) = self.slot(port) else { return };
        if slot.session != Some(sid) {
            return;
        }
        slot.session = None;
        slot.conn = None;
        slot.out.clear();
        // Held frames and owed credit were on the wire: lost with it.
        slot.sender.reset();
        if let Some(w) = slot.wake.take() {
            w.notify_one();
        }
        let _ = self.node.link_down(port, now);
    }

    /// The bytes the writer of session `sid` should send next, and when frames held back
    /// by shaping fall due; `None` when the session is over and the writer should stop.
    pub fn take_output(&mut self, port: Port, sid: u64, now: Instant) -> Option<Output> {
        let slot = self.slot(port)?;
        if slot.session != Some(sid) {
            return None;
        }
        if let Some(owed) = slot.sender.take_owed() {
            for (vc, &n) in owed.iter().enumerate().filter(|(_, n)| **n > 0) {
                // Lost on the wire: they never held modeled buffer space.
                let _ = self
                    .node
                    .credit(port, Vc(vc as u8), n, ModelTime::ZERO, now);
            }
            self.pump(now);
        }
        let slot = self.slot(port)?;
        while let Some(d) = slot.sender.poll(now) {
            if let Err(e) = slot.put(Some(d)) {
                warn!(error = %e, "dropping unencodable held cell");
            }
        }
        Some(Output {
            bytes: slot.out.split().freeze(),
            next_due: slot.sender.poll_at(),
        })
    }

    /// Sets the faults on what this node sends to the neighbour on `port`. Setting the
    /// link down ends its session at once (what was in flight is lost; cells queued for
    /// the link wait in the switch) and refuses new sessions until it is set up again.
    pub fn set_faults(
        &mut self,
        port: Port,
        faults: LinkFaults,
        seed: Option<u64>,
        now: Instant,
    ) -> Result<(), FaultError> {
        let Some(slot) = self.slot(port) else {
            return Ok(());
        };
        if let Some(seed) = seed {
            slot.sender.reseed(seed);
        }
        slot.sender.set_faults(faults, now)?;
        let was_down = std::mem::replace(&mut slot.admin_down, faults.down);
        if faults.down && !was_down {
            if let (Some(sid), Some(conn)) = (slot.session, slot.conn.clone()) {
                conn.close(quinn::VarInt::from_u32(CLOSE_ADMIN_DOWN), b"link set down");
                self.end_session(port, sid, now);
            }
        } else if !faults.down && was_down {
            slot.up_wake.notify_one();
        }
        // Held frames may have just fallen due.
        if let Some(w) = self.slot(port).and_then(|s| s.wake.as_ref()) {
            w.notify_one();
        }
        self.pump(now);
        Ok(())
    }

    /// The operator has cut the link on `port`.
    pub fn is_admin_down(&self, port: Port) -> bool {
        self.slots
            .get(port.index())
            .and_then(|s| s.as_ref())
            .is_some_and(|s| s.admin_down)
    }

    /// Counts a cell from the neighbour on `port` refused as undecodable.
    pub fn count_rx_corrupt(&mut self, port: Port) {
        if let Some(slot) = self.slot(port) {
            slot.rx_corrupt_cells += 1;
        }
    }
}

/// QUIC close code of a link the operator set down.
pub const CLOSE_ADMIN_DOWN: u32 = 3;

/// What a link writer sends next.
pub struct Output {
    pub bytes: Bytes,
    /// When the next frame held back by shaping falls due.
    pub next_due: Option<Instant>,
}

/// Why a link session could not start.
#[derive(Debug, thiserror::Error)]
pub enum SessionRefused {
    #[error("the link is set down by the operator")]
    AdminDown,
    #[error(transparent)]
    Switch(#[from] exanet_proto::SwitchError),
}

fn ni_status(core: &Core) -> NiStatus {
    NiStatus {
        attached: core.sessions.iter().filter(|s| s.is_some()).count() as u32,
        counters: core.node.ni().stats.clone(),
        reserved: core.workloads.reservations().list(),
        workloads: core
            .sessions
            .iter()
            .enumerate()
            .filter_map(|(rank, s)| {
                let s = s.as_ref()?;
                Some(crate::control::WorkloadStatus {
                    rank: rank as u8,
                    job: s.job.clone(),
                    pdid: s.pdid,
                    pid: s.peer.pid,
                    uid: s.peer.uid,
                    rdma_pages: s.holding.rdma_pages,
                    packetizers: s.holding.packetizers,
                    mailboxes: s.holding.mailboxes,
                    registered_bytes: s.holding.registered_bytes,
                })
            })
            .collect(),
    }
}

/// Everything a daemon's tasks share.
pub struct NodeHandle {
    core: Mutex<Core>,
    origin: std::time::Instant,
    pub rack: Rack,
    pub id: NodeId,
    pub name: String,
    sessions: AtomicU64,
    /// Wakes the NI timer task when a sooner deadline appears.
    pub timer_wake: Arc<Notify>,
    /// How long workload command rings are polled after activity before sleeping.
    pub spin: Duration,
    /// The ranks' registered memory, shared with the NI.
    pub memory: ShmMemory,
    /// Operators' captures of the cells crossing the node's links.
    pub taps: Arc<crate::capture::Taps>,
}

#[derive(Debug, thiserror::Error)]
pub enum LinkFaultError {
    #[error("{0} is not a neighbour of this node (no link between them)")]
    NotNeighbour(String),
    #[error(transparent)]
    Fault(#[from] FaultError),
}

#[derive(Debug, thiserror::Error)]
pub enum PingError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("count must be 1..=100000, not {0}")]
    Count(u32),
}

impl NodeHandle {
    pub fn new(rack: Rack, id: NodeId, spin: Duration) -> Result<Arc<NodeHandle>, NodeError> {
        let shape = rack.shape();
        let mut node = Node::new(shape, id, rack.switch_config())?;
        let mut ni = rack.ni_config();
        // Transaction ids of this run must not repeat those of a previous run of this
        // node that peers may still remember.
        ni.epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| {
                d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(20)
            });
        node.set_ni_config(ni);
        let memory = ShmMemory::new();
        node.set_memory(Box::new(memory.clone()));
        let timer_wake = Arc::new(Notify::new());
        let mut slots: Vec<Option<LinkSlot>> = (0..NPORTS).map(|_| None).collect();
        for l in node_links(&shape, id) {
            let port = l.port_of(id).expect("link of this node");
            let (peer, peer_port) = l.other(id).expect("link of this node");
            slots[port.index()] = Some(LinkSlot {
                peer,
                peer_port,
                kind: l.kind,
                session: None,
                wake: None,
                out: BytesMut::new(),
                sessions: 0,
                conn: None,
                // Each link direction draws its own faults; a fault plan reseeds them.
                sender: LinkSender::new(
                    u64::from(id.0) << 8 | port.index() as u64 ^ 0x5eed_0000_0000,
                ),
                admin_down: false,
                up_wake: Arc::new(Notify::new()),
                rx_corrupt_cells: 0,
            });
        }
        Ok(Arc::new(NodeHandle {
            core: Mutex::new(Core {
                node,
                // Seeded afresh per run: where a rank's memory goes must differ from the
                // previous run's (see `WorkloadService::place_region`).
                workloads: WorkloadService::new(rand::random()).with_reservations(
                    Reservations::with_service(exanet_proto::Pdid(exanet_control::ip::pdid(
                        rack.file.ip.as_ref(),
                    ))),
                ),
                sessions: (0..exanet_proto::ni::RANKS).map(|_| None).collect(),
                timer_armed: None,
                timer_wake: timer_wake.clone(),
                slots,
                pings: HashMap::new(),
                next_probe: 1,
                latency: crate::metrics::Latency::new(&shape.display(id)),
                collectives: Default::default(),
            }),
            origin: std::time::Instant::now(),
            name: shape.display(id),
            rack,
            id,
            sessions: AtomicU64::new(1),
            timer_wake,
            spin,
            memory,
            taps: Arc::default(),
        }))
    }

    /// The core. A panic while holding the lock would be a bug; the data is still
    /// consistent enough to report, so poisoning is ignored.
    pub fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now(&self) -> Instant {
        Instant(self.origin.elapsed().as_nanos() as u64)
    }

    /// The clock time of core time `at`.
    pub fn deadline_std(&self, at: Instant) -> std::time::Instant {
        self.origin + Duration::from_nanos(at.0)
    }

    /// While the link on `port` is set down, what wakes when it is set up again.
    pub fn admin_gate(&self, port: Port) -> Option<Arc<Notify>> {
        let core = self.lock();
        let slot = core.slots.get(port.index())?.as_ref()?;
        slot.admin_down.then(|| slot.up_wake.clone())
    }

    /// Sets faults on the link to `peer` (what this node sends to it).
    pub fn set_link_faults(
        &self,
        peer: NodeId,
        faults: LinkFaults,
        seed: Option<u64>,
    ) -> Result<(), LinkFaultError> {
        let now = self.now();
        let mut core = self.lock();
        let port = Port::all()
            .find(|p| {
                core.slots[p.index()]
                    .as_ref()
                    .is_some_and(|s| s.peer == peer)
            })
            .ok_or_else(|| LinkFaultError::NotNeighbour(self.rack.shape().display(peer)))?;
        core.set_faults(port, faults, seed, now)?;
        Ok(())
    }

    /// Clears every fault on every link of this node, setting cut links up again.
    pub fn clear_link_faults(&self) {
        let now = self.now();
        let mut core = self.lock();
        for p in Port::all() {
            if core.slots[p.index()].is_some() {
                let _ = core.set_faults(p, LinkFaults::default(), None, now);
            }
        }
    }

    pub fn next_session_id(&self) -> u64 {
        self.sessions.fetch_add(1, Ordering::Relaxed)
    }

    /// This node's links: (port, peer, peer port, kind).
    pub fn links(&self) -> Vec<(Port, NodeId, Port, LinkKind)> {
        let core = self.lock();
        Port::all()
            .filter_map(|p| {
                core.slots[p.index()]
                    .as_ref()
                    .map(|s| (p, s.peer, s.peer_port, s.kind))
            })
            .collect()
    }

    pub fn count_error(&self, kind: &'static str) {
        self.lock().node.count_error(kind);
    }

    pub fn status(&self) -> NodeStatus {
        let now = self.now();
        let core = self.lock();
        let sw = core.node.switch();
        let shape = self.rack.shape();
        let links = Port::all()
            .filter_map(|p| {
                let s = core.slots[p.index()].as_ref()?;
                let st = sw.port_stats(p);
                Some(LinkStatus {
                    port: p.to_string(),
                    peer: shape.display(s.peer),
                    kind: s.kind.label().to_string(),
                    gbps: s.kind.gbps(),
                    state: if sw.is_up(p) {
                        LinkState::Up
                    } else {
                        LinkState::Down
                    },
                    sessions: s.sessions,
                    tx_cells: st.tx_cells,
                    tx_bytes: st.tx_bytes,
                    rx_cells: st.rx_cells,
                    rx_bytes: st.rx_bytes,
                    stall_seconds: sw.stall_ns(p, now) as f64 / 1e9,
                    queue_cells: sw.queue_cells(p) as u64,
                    queue_bytes: u64::from(sw.queue_bytes(p)),
                    in_flight_bytes: u64::from(sw.in_flight(p)),
                    admin_down: s.admin_down,
                    faults: (!s.sender.faults().is_clear()).then(|| *s.sender.faults()),
                    fault_stats: s.sender.stats(),
                    held_bytes: s.sender.held_bytes() as u64,
                    rx_corrupt_cells: s.rx_corrupt_cells,
                    modeled_busy_seconds: st.modeled_busy_ps as f64 * 1e-12,
                    quic: s.conn.as_ref().map(|c| {
                        let st = c.stats();
                        QuicStats {
                            rtt_us: st.path.rtt.as_secs_f64() * 1e6,
                            cwnd: st.path.cwnd,
                            mtu: st.path.current_mtu,
                            sent_packets: st.path.sent_packets,
                            lost_packets: st.path.lost_packets,
                            congestion_events: st.path.congestion_events,
                        }
                    }),
                })
            })
            .collect();
        let ns: &NodeStats = core.node.stats();
        NodeStatus {
            node: self.name.clone(),
            id: self.id.0,
            shape: shape.to_string(),
            pid: std::process::id(),
            uptime_seconds: self.origin.elapsed().as_secs_f64(),
            links,
            forwarded_cells: sw.forwarded(),
            injected_cells: ns.injected_cells,
            delivered_cells: ns.delivered_cells,
            load_tx_cells: ns.load_tx_cells,
            load_rx_cells: ns.load_rx_cells,
            load_rx_bytes: ns.load_rx_bytes,
            errors: ns.errors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            modeled_time_seconds: sw.modeled_now().as_secs_f64(),
            collectives: core
                .collectives
                .iter()
                .map(|((job, _, _), r)| crate::control::JobCollectives {
                    job: job.clone(),
                    report: *r,
                })
                .collect(),
            capture: crate::control::CaptureSummary {
                captured: self.taps.captured_total.load(Ordering::Relaxed),
                dropped: self.taps.dropped_total.load(Ordering::Relaxed),
            },
            ni: ni_status(&core),
        }
    }

    /// Probes `dst` `count` times in sequence and reports the path and round trips.
    pub async fn ping(
        &self,
        dst: NodeId,
        count: u32,
        timeout: Duration,
    ) -> Result<PingReport, PingError> {
        if !(1..=100_000).contains(&count) {
            return Err(PingError::Count(count));
        }
        let shape = self.rack.shape();
        let names = |v: &[NodeId]| v.iter().map(|n| shape.display(*n)).collect::<Vec<_>>();
        let mut rtts = Vec::new();
        let mut last = None;
        for _ in 0..count {
            let (tx, rx) = oneshot::channel();
            let id = {
                let mut core = self.lock();
                let id = core.next_probe;
                core.next_probe = core.next_probe.wrapping_add(1).max(1);
                core.node.send_probe(dst, id)?;
                core.pings.insert(id, tx);
                let now = self.now();
                core.pump(now);
                id
            };
            let t0 = std::time::Instant::now();
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(ev)) => {
                    rtts.push(t0.elapsed().as_secs_f64() * 1e6);
                    last = Some(ev);
                }
                _ => {
                    self.lock().pings.remove(&id);
                }
            }
        }
        let (path, back, truncated) = match last {
            Some(NodeEvent::ProbeReply {
                forward,
                back,
                truncated,
                ..
            }) => (names(&forward), names(&back), truncated),
            _ => (Vec::new(), Vec::new(), false),
        };
        let received = rtts.len() as u32;
        let mut sorted = rtts.clone();
        sorted.sort_by(f64::total_cmp);
        let rtt_us = if sorted.is_empty() {
            0.0
        } else if sorted.len() % 2 == 1 {
            sorted[sorted.len() / 2]
        } else {
            (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
        };
        Ok(PingReport {
            src: self.name.clone(),
            dst: shape.display(dst),
            hops: path.len().saturating_sub(1),
            path,
            back,
            rtt_us,
            rtts_us: rtts,
            sent: count,
            received,
            truncated,
        })
    }

    pub fn start_load(&self, dsts: &[NodeId], cells: u64, payload: usize) -> Result<(), NodeError> {
        let now = self.now();
        let mut core = self.lock();
        core.node.start_load(dsts, cells, payload)?;
        core.pump(now);
        Ok(())
    }
}
