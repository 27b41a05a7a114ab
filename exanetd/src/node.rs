//! The node's station behind a lock, shared by the link tasks, the control server and the
//! metrics endpoint. Every task that hears something feeds it in here, calls
//! [`Core::pump`], and the pump wakes the writers of the links with something to send.
//! What a link session is (its hello, replacement, the operator's cut) is decided by the
//! station (`exanet_proto::station`); this is the QUIC connections and wake-ups around
//! it. Critical sections never await.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use exanet_proto::fault::{FaultError, LinkFaults};
use exanet_proto::frame::{Frame, FrameError, Hello};
use exanet_proto::topology::NPORTS;
use exanet_proto::NodeStats;
use exanet_proto::{
    Departure, HelloError, SessionEnd, SessionId, SessionRefused, Station, StationEvent, Wire,
};
use exanet_proto::{Instant, LinkKind, Node, NodeError, NodeEvent, NodeId, Port};
use tokio::sync::{oneshot, Notify};
use tracing::debug;

use exanet_proto::ni::{Memory, Ni};
use exanet_proto::reserved::Reservations;
use exanet_proto::workload::WorkloadService;

use crate::session::Session;
use crate::shm_memory::ShmMemory;
use exanet_control::control::{LinkState, LinkStatus, NiStatus, NodeStatus, PingReport, QuicStats};
use exanet_control::rack::Rack;

/// What a link's output buffer is allocated with once frames are written into it.
const OUT_BUFFER: usize = 64 * 1024;

/// Seeds each link direction's fault draws (with the node and port; a fault plan reseeds).
const FAULT_SEED: u64 = 0x5eed_0000_0000;

/// One port's connection: the QUIC side of the station's link end.
struct Connection {
    /// Wakes the current session's writer.
    wake: Option<Arc<Notify>>,
    /// Encoded frames waiting for the writer.
    out: BytesMut,
    /// The QUIC connection of the current session, for its transport statistics.
    conn: Option<quinn::Connection>,
    /// Wakes the dialer waiting for the operator to set the link up again.
    up_wake: Arc<Notify>,
}

impl Connection {
    /// Drops the session's connection state, waking its writer to notice.
    fn clear(&mut self) {
        self.conn = None;
        self.out.clear();
        if let Some(w) = self.wake.take() {
            w.notify_one();
        }
    }
}

pub struct Core {
    /// The node, its workload service and its links' sessions.
    pub station: Station,
    /// What the daemon keeps of each attached workload beside it, by rank.
    pub sessions: Vec<Option<Session>>,
    /// The NI deadline the timer task sleeps towards.
    pub timer_armed: Option<Instant>,
    timer_wake: Arc<Notify>,
    conns: Vec<Connection>,
    pings: HashMap<u32, oneshot::Sender<NodeEvent>>,
    next_probe: u32,
    /// How long workloads' operations take, from command to completion.
    pub latency: crate::metrics::Latency,
    /// With cells in modeled order: the connection to the rack's cut coordinator
    /// (`crate::cuts`), which looks at the station after every pump.
    pub cuts: Option<Box<dyn AfterPump>>,
}

impl Core {
    pub fn node(&self) -> &Node {
        self.station.node()
    }

    /// Lets the station act on what it was given and wakes the writers of the links it
    /// has output for.
    pub fn pump(&mut self, now: Instant) {
        self.station.pump(now);
        if let Some(c) = self.cuts.as_mut() {
            c.after_pump(&mut self.station);
        }
        for port in self.station.take_ready() {
            if let Some(w) = self.conns[port.index()].wake.as_ref() {
                w.notify_one();
            }
        }
        while let Some(ev) = self.station.poll_event() {
            match ev {
                StationEvent::Node(ev @ NodeEvent::ProbeReply { id, .. }) => {
                    if let Some(tx) = self.pings.remove(&id) {
                        let _ = tx.send(ev);
                    }
                }
                StationEvent::Node(NodeEvent::LoadSent) => debug!("load generator done"),
                StationEvent::Node(_) => {}
                StationEvent::Finished(f) => self.latency.observe(f.op, f.ok, f.latency_ns),
            }
        }
        for e in self.station.take_errors() {
            debug!(error = %e, "switch refused a frame");
        }
        // A sooner NI deadline than the timer task sleeps towards: wake it to re-arm.
        if let Some(t) = self.station.poll_timeout() {
            if self.timer_armed.is_none_or(|a| t < a) {
                self.timer_armed = Some(t);
                self.timer_wake.notify_one();
            }
        }
    }

    /// The workload service, with the NI and memory it serves the workloads with.
    pub fn workloads(&mut self) -> (&mut WorkloadService, &mut Ni, &mut (dyn Memory + Send)) {
        self.station.workloads()
    }

    /// Moves what `rank`'s completion ring has room for into it (call it when the
    /// workload may have made room).
    pub fn drain(&mut self, rank: u8) {
        self.station.drain(rank);
    }

    /// Starts a session on `port` over `conn`, replacing any older one, and queues our
    /// hello for `wake`'s writer.
    pub fn begin_session(
        &mut self,
        port: Port,
        wake: Arc<Notify>,
        conn: quinn::Connection,
        now: Instant,
    ) -> Result<SessionId, SessionRefused> {
        let sid = self.station.begin_session(port, now)?;
        let c = &mut self.conns[port.index()];
        c.clear();
        c.wake = Some(wake.clone());
        c.conn = Some(conn);
        wake.notify_one();
        Ok(sid)
    }

    /// The peer's hello on session `sid`: checked (refusals are counted), then the link
    /// carries cells.
    pub fn on_hello(
        &mut self,
        port: Port,
        sid: SessionId,
        h: &Hello,
        now: Instant,
    ) -> Result<(), HelloError> {
        self.station.on_hello(port, sid, h, now)?;
        self.pump(now);
        Ok(())
    }

    /// Applies frames received on session `sid` of `port`. Returns false when the session
    /// is no longer current (the caller should stop).
    pub fn apply(&mut self, port: Port, sid: SessionId, frames: Vec<Frame>, now: Instant) -> bool {
        let current = self.station.on_frames(port, sid, frames, now).is_ok();
        self.pump(now);
        current
    }

    /// A frame from `port` that could not be decoded; true when the stream is out of sync.
    pub fn on_bad_frame(&mut self, port: Port, e: &FrameError, now: Instant) -> bool {
        let fatal = self.station.on_bad_frame(port, e);
        self.pump(now);
        fatal
    }

    /// Ends session `sid` on `port` if it is still the current one.
    pub fn end_session(&mut self, port: Port, sid: SessionId, now: Instant) {
        if self.station.end_session(port, sid, now) {
            self.conns[port.index()].clear();
        }
    }

    /// The bytes the writer of session `sid` should send next, and when frames held back
    /// by shaping fall due; `None` when the session is over and the writer should stop.
    pub fn take_output(&mut self, port: Port, sid: SessionId, now: Instant) -> Option<Output> {
        if self.station.end(port)?.session() != Some(sid) {
            return None;
        }
        if self.station.settle_owed(port, now) {
            self.pump(now);
        }
        let out = &mut self.conns[port.index()].out;
        // The writer takes the whole buffer each time; a fresh one starts at a writer's
        // batch, not at one frame grown by doubling (copying each time).
        if out.is_empty() && out.capacity() < OUT_BUFFER / 2 {
            out.reserve(OUT_BUFFER);
        }
        let mut counted = Counted {
            wire: out,
            credit: 0,
            others: false,
        };
        let next_due = self
            .station
            .take_output(port, sid, now, &mut counted)
            .ok()?;
        let credit_only = (!counted.others && counted.credit > 0).then_some(counted.credit);
        Some(Output {
            bytes: out.split().freeze(),
            next_due,
            credit_only,
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
        let set = self.station.set_faults(port, faults, seed, now)?;
        let c = &mut self.conns[port.index()];
        if set.ended.is_some() {
            if let Some(conn) = c.conn.take() {
                let end = SessionEnd::AdminDown;
                conn.close(quinn::VarInt::from_u32(end.code()), end.label().as_bytes());
            }
            c.clear();
        }
        if set.up_again {
            c.up_wake.notify_one();
        }
        self.pump(now);
        Ok(())
    }

    /// The operator has cut the link on `port`.
    pub fn is_admin_down(&self, port: Port) -> bool {
        self.station.is_admin_down(port)
    }
}

/// What a link writer sends next.
pub struct Output {
    pub bytes: Bytes,
    /// When the next frame held back by shaping falls due.
    pub next_due: Option<Instant>,
    /// The bytes are credit frames only, returning this much buffer space: the writer may
    /// hold them for the next frames to ride with (`crate::held_credit`).
    pub credit_only: Option<u64>,
}

/// The daemon's [`Wire`]: frames encoded into the output buffer, noting whether they are
/// all credit.
struct Counted<'a> {
    wire: &'a mut BytesMut,
    credit: u64,
    others: bool,
}

impl Wire for Counted<'_> {
    fn hello(&mut self, hello: &Hello) {
        self.others = true;
        self.wire.hello(hello);
    }

    fn frame(&mut self, d: Departure) -> Result<(), exanet_proto::CellError> {
        match &d {
            Departure::Credit { bytes, .. } => self.credit += u64::from(*bytes),
            _ => self.others = true,
        }
        self.wire.frame(d)
    }
}

fn ni_status(core: &Core) -> NiStatus {
    NiStatus {
        attached: core.sessions.iter().filter(|s| s.is_some()).count() as u32,
        counters: core.node().ni().stats().clone(),
        reserved: core.station.workload_service().reservations().list(),
        workloads: core
            .sessions
            .iter()
            .enumerate()
            .filter_map(|(rank, s)| {
                let s = s.as_ref()?;
                let (joined, holding) = core.station.workload_service().member(rank as u8)?;
                Some(exanet_control::control::WorkloadStatus {
                    rank: rank as u8,
                    job: joined.job.clone(),
                    pdid: joined.pdid.0,
                    pid: s.peer.pid,
                    uid: s.peer.uid,
                    rdma_pages: holding.rdma_pages,
                    packetizers: holding.packetizers,
                    mailboxes: holding.mailboxes,
                    registered_bytes: holding.registered_bytes,
                })
            })
            .collect(),
    }
}

/// Everything a daemon's tasks share.
pub struct NodeHandle {
    core: Mutex<Core>,
    origin: std::time::Instant,
    /// Restarts of this node's daemon before this one, as its supervisor counted them.
    pub restarts: std::sync::atomic::AtomicU64,
    pub rack: Rack,
    pub id: NodeId,
    pub name: String,
    /// Wakes the NI timer task when a sooner deadline appears.
    pub timer_wake: Arc<Notify>,
    /// How long workload command rings are polled after activity before sleeping.
    pub spin: Duration,
    /// The ranks' registered memory, shared with the NI.
    pub memory: ShmMemory,
    /// Operators' captures of the cells crossing the node's links.
    pub taps: Arc<crate::capture::Taps>,
}

/// What looks at the station after every pump of the core.
pub trait AfterPump: Send {
    fn after_pump(&mut self, station: &mut Station);
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
        let ordered = rack.order() == exanet_control::rack::CellOrder::Modeled;
        if ordered {
            let feeds =
                exanet_proto::routing::feeds(&shape).map_err(exanet_proto::SwitchError::from)?;
            node.set_feeds(feeds[id.0 as usize]);
        }
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
        // Seeded afresh per run: where a rank's memory goes must differ from the previous
        // run's (see `WorkloadService::place_region`).
        let workloads =
            WorkloadService::new(rand::random()).with_reservations(Reservations::with_service(
                exanet_proto::Pdid(exanet_control::ip::pdid(rack.file.ip.as_ref())),
            ));
        let conns = (0..NPORTS)
            .map(|_| Connection {
                wake: None,
                out: BytesMut::new(),
                conn: None,
                up_wake: Arc::new(Notify::new()),
            })
            .collect();
        Ok(Arc::new(NodeHandle {
            core: Mutex::new(Core {
                station: Station::new(node, workloads, rack.digest(), FAULT_SEED),
                sessions: (0..exanet_proto::ni::RANKS).map(|_| None).collect(),
                timer_armed: None,
                timer_wake: timer_wake.clone(),
                conns,
                pings: HashMap::new(),
                next_probe: 1,
                latency: crate::metrics::Latency::new(&shape.display(id)),
                cuts: None,
            }),
            origin: std::time::Instant::now(),
            restarts: Default::default(),
            name: shape.display(id),
            rack,
            id,
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
        core.is_admin_down(port)
            .then(|| core.conns[port.index()].up_wake.clone())
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
        let port = core
            .station
            .port_to(peer)
            .ok_or_else(|| LinkFaultError::NotNeighbour(self.rack.shape().display(peer)))?;
        core.set_faults(port, faults, seed, now)?;
        Ok(())
    }

    /// Clears every fault on every link of this node, setting cut links up again.
    pub fn clear_link_faults(&self) {
        let now = self.now();
        let mut core = self.lock();
        let ports: Vec<Port> = core.station.ends().map(|(p, _)| p).collect();
        for p in ports {
            let _ = core.set_faults(p, LinkFaults::default(), None, now);
        }
    }

    /// This node's links: (port, peer, peer port, kind).
    pub fn links(&self) -> Vec<(Port, NodeId, Port, LinkKind)> {
        let core = self.lock();
        core.station
            .ends()
            .map(|(p, e)| (p, e.peer, e.peer_port, e.kind))
            .collect()
    }

    pub fn count_error(&self, kind: &'static str) {
        self.lock().station.count_error(kind);
    }

    pub fn status(&self) -> NodeStatus {
        let now = self.now();
        let core = self.lock();
        let sw = core.node().switch();
        let shape = self.rack.shape();
        let links = core
            .station
            .ends()
            .map(|(p, s)| {
                let st = sw.port_stats(p);
                let conn = core.conns[p.index()].conn.as_ref();
                LinkStatus {
                    port: p.to_string(),
                    peer: shape.display(s.peer),
                    kind: s.kind.label().to_string(),
                    gbps: s.kind.gbps(),
                    state: if sw.is_up(p) {
                        LinkState::Up
                    } else {
                        LinkState::Down
                    },
                    sessions: s.sessions(),
                    tx_cells: st.tx_cells,
                    tx_bytes: st.tx_bytes,
                    rx_cells: st.rx_cells,
                    rx_bytes: st.rx_bytes,
                    stall_seconds: sw.stall_ns(p, now) as f64 / 1e9,
                    queue_cells: sw.queue_cells(p) as u64,
                    queue_bytes: u64::from(sw.queue_bytes(p)),
                    in_flight_bytes: u64::from(sw.in_flight(p)),
                    admin_down: s.is_admin_down(),
                    faults: (!s.faults().is_clear()).then(|| *s.faults()),
                    fault_stats: s.fault_stats(),
                    held_bytes: s.held_bytes() as u64,
                    counters: *s.stats(),
                    modeled_busy_seconds: st.modeled_busy_ps as f64 * 1e-12,
                    quic: conn.map(|c| {
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
                }
            })
            .collect();
        let ns: &NodeStats = core.node().stats();
        NodeStatus {
            node: self.name.clone(),
            id: self.id.0,
            shape: shape.to_string(),
            pid: std::process::id(),
            uptime_seconds: self.origin.elapsed().as_secs_f64(),
            restarts: self.restarts.load(std::sync::atomic::Ordering::Relaxed),
            links,
            forwarded_cells: sw.forwarded(),
            injected_cells: ns.injected_cells,
            delivered_cells: ns.delivered_cells,
            load_tx_cells: ns.load_tx_cells,
            load_rx_cells: ns.load_rx_cells,
            load_rx_bytes: ns.load_rx_bytes,
            errors: ns.errors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            modeled_time_seconds: sw.modeled_now().as_secs_f64(),
            late_cells: sw.late_cells(),
            collectives: core
                .station
                .workload_service()
                .collective_counts()
                .map(|(job, r)| exanet_control::control::JobCollectives {
                    job: job.to_string(),
                    report: *r,
                })
                .collect(),
            capture: exanet_control::control::CaptureSummary {
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
                core.station.node_mut().send_probe(dst, id)?;
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
        core.station.node_mut().start_load(dsts, cells, payload)?;
        core.pump(now);
        Ok(())
    }
}
