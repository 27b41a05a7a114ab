//! A whole rack in one process: every node's [`Station`] wired to its neighbours through
//! simulated links, driven by a discrete-event loop in simulated time. Deterministic for a
//! given seed. This is what the rack tests and the switch benchmark run on.
//!
//! Links serialise cells at their kind's rate (16 or 10 Gb/s) and deliver them after a
//! fixed latency plus seeded jitter; credit frames and hellos take the latency but no
//! bandwidth. A link is a connection between two stations, as a QUIC connection is between
//! two daemons: each end runs a session with a hello, the lower-numbered end dials, a cut
//! link (`down`) closes it, and what was in flight on a closed or replaced connection is
//! lost with it.
//!
//! With `SwitchConfig::modeled_order`, the simulator also sets every link's horizon after
//! each event (`Sim::reorder`), so that switches forward cells in modeled-time order
//! whatever the simulated links' real-time jitter (see [`crate::order`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use bytes::BytesMut;

use crate::capture::{self, CaptureFilter, Direction, Record, Seen};
use crate::cell::{Cell, CellError};
use crate::fault::{FaultError, FaultStats, LinkFaults};
use crate::frame::{Frame, FrameError, Hello};
use crate::horizon::{self, Begin, Coordinator, CutView, NodeCut};
use crate::link::Departure;
use crate::model::ModelTime;
use crate::ni::{Memory, Ni};
use crate::node::{Node, NodeError, NodeEvent};
use crate::routing::{self, Feeds, Vc};
use crate::shape::{NodeId, Shape};
use crate::station::{SessionId, Station, StationEvent, Wire};
use crate::switch::{SwitchConfig, SwitchError};
use crate::time::Instant;
use crate::topology::{links, neighbour, port_to, LinkKind, Port, NPORTS};
use crate::workload::{Finished, WorkloadService};

#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub switch: SwitchConfig,
    /// Propagation latency of every link.
    pub latency_ns: u64,
    /// Up to this much extra latency per cell, drawn from the seeded generator. Links stay
    /// FIFO: a cell never overtakes the one before it.
    pub jitter_ns: u64,
    /// How long a link's dialer waits before dialing again after its connection closed
    /// (a daemon's first backoff).
    pub redial_ns: u64,
    /// With modeled order: `Some(ns)` takes horizons from consistent cuts gathered by a
    /// [`Coordinator`] this far (one way) from every node, as daemons must, instead of
    /// from the whole rack after every event (see [`crate::horizon`]).
    pub coordinator_ns: Option<u64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            switch: SwitchConfig::default(),
            latency_ns: 120,
            jitter_ns: 0,
            redial_ns: 50_000_000,
            coordinator_ns: None,
        }
    }
}

/// The rack's identity in the simulated stations' hellos.
const SIM_RACK: u64 = 0x5157_5241_434b;

/// A simulated link connection, shared by its two ends: frames carry it, and are lost
/// when it is no longer the one their receiving end is on.
type ConnId = u64;

/// A link end's current connection and the session its station runs over it.
#[derive(Clone, Copy, Debug)]
struct Conn {
    id: ConnId,
    sid: SessionId,
}

enum Ev {
    Cell {
        node: NodeId,
        port: Port,
        conn: ConnId,
        vc: Vc,
        cell: Cell,
    },
    Credit {
        node: NodeId,
        port: Port,
        conn: ConnId,
        vc: Vc,
        bytes: u32,
        freed: ModelTime,
    },
    Hello {
        node: NodeId,
        port: Port,
        conn: ConnId,
        hello: Hello,
    },
    /// A cell refused by the receiver's CRC check: the receiver refunds its credit.
    Refused {
        node: NodeId,
        port: Port,
        conn: ConnId,
        error: FrameError,
    },
    /// The node's NI timer.
    Timer { node: NodeId },
    /// Frames the faults of a link direction held back fall due.
    Release { node: NodeId, port: Port },
    /// The credit of cells the faults of a link direction dropped goes back to its output.
    Owed { node: NodeId, port: Port },
    /// The far end closed the connection.
    Closed {
        node: NodeId,
        port: Port,
        conn: ConnId,
    },
    /// The link's dialer connects.
    Dial { node: NodeId, port: Port },
    /// A cut's marker comes in.
    Marker {
        node: NodeId,
        port: Port,
        conn: ConnId,
        epoch: u64,
    },
    /// The coordinator's order to begin a cut reaches a node.
    BeginCut {
        node: NodeId,
        epoch: u64,
        waits: u16,
    },
    /// A node's part of a cut reaches the coordinator.
    Part { node: NodeId, cut: Box<NodeCut> },
    /// The coordinator's horizons reach a node.
    Horizons {
        node: NodeId,
        horizons: Vec<(Port, ModelTime)>,
        pending: bool,
    },
}

/// Why per-link faults cannot be set.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LinkFaultError {
    #[error("node {from} has no link to node {to}")]
    NotLinked { from: NodeId, to: NodeId },
    #[error(transparent)]
    Fault(#[from] FaultError),
}

/// The simulator's generator (see [`crate::SplitMix64`]).
pub type SimRng = crate::rng::SplitMix64;

/// What one take of a station's output put on a simulated link.
#[derive(Default)]
struct Outbox {
    hello: Option<Hello>,
    frames: Vec<Departure>,
}

impl Wire for Outbox {
    fn hello(&mut self, hello: &Hello) {
        self.hello = Some(hello.clone());
    }

    fn frame(&mut self, d: Departure) -> Result<(), CellError> {
        self.frames.push(d);
        Ok(())
    }
}

/// A capture on one simulated node: its filter and the records it took, encoded as a
/// daemon's capture hands them to `exactl capture`.
struct Tap {
    filter: CaptureFilter,
    records: Vec<Vec<u8>>,
}

pub struct Sim {
    shape: Shape,
    cfg: SimConfig,
    stations: Vec<Station>,
    now: Instant,
    heap: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    slab: Vec<Option<Ev>>,
    free: Vec<usize>,
    seq: u64,
    /// When each link direction (node, out port) finishes serialising its last cell.
    busy_until: Vec<[Instant; NPORTS]>,
    /// Arrival time of the last cell on each link direction, to keep links FIFO.
    last_arrival: Vec<[Instant; NPORTS]>,
    rng: SimRng,
    events: Vec<(NodeId, Instant, NodeEvent)>,
    errors: Vec<(NodeId, SwitchError)>,
    processed: u64,
    /// The NI timer each node has scheduled.
    timer_at: Vec<Option<Instant>>,
    /// The release event each link direction has scheduled for its held frames.
    release_at: HashMap<(NodeId, Port), Instant>,
    /// Link directions with an `Ev::Owed` scheduled.
    owed_pending: HashSet<(NodeId, Port)>,
    /// Operations of attached workloads that ended, by node.
    finished: Vec<(NodeId, Finished)>,
    /// The connection each link end is on, by node and port.
    conns: Vec<[Option<Conn>; NPORTS]>,
    next_conn: ConnId,
    /// Link ends whose dialer has an `Ev::Dial` scheduled.
    dialing: HashSet<(NodeId, Port)>,
    taps: HashMap<NodeId, Tap>,
    /// With modeled ordering on: heads of the cells on each link, by the (node, port)
    /// they go to, and each link port's horizon as last set.
    in_flight: HashMap<(NodeId, Port), BTreeMap<ModelTime, u32>>,
    horizons: HashMap<(NodeId, Port), ModelTime>,
    /// With horizons from cuts: the coordinator (every node joined). Each station knows
    /// whether the rack was idle, so that work appearing wakes it.
    coordinator: Option<Coordinator>,
}

impl Sim {
    /// A rack with every link up: each link's sessions begin and exchange their hellos at
    /// time zero, as a rack that has come up.
    pub fn new(shape: Shape, cfg: SimConfig) -> Result<Sim, NodeError> {
        let stations = shape
            .node_ids()
            .map(|id| {
                let node = Node::new(shape, id, cfg.switch)?;
                let workloads = WorkloadService::new(cfg.seed ^ u64::from(id.0).rotate_left(32));
                Ok(Station::new(node, workloads, SIM_RACK, cfg.seed))
            })
            .collect::<Result<Vec<_>, NodeError>>()?;
        let n = stations.len();
        let mut sim = Sim {
            shape,
            cfg,
            stations,
            now: Instant::ZERO,
            heap: BinaryHeap::new(),
            slab: Vec::new(),
            free: Vec::new(),
            seq: 0,
            busy_until: vec![[Instant::ZERO; NPORTS]; n],
            last_arrival: vec![[Instant::ZERO; NPORTS]; n],
            rng: SimRng::new(cfg.seed),
            events: Vec::new(),
            errors: Vec::new(),
            processed: 0,
            timer_at: vec![None; n],
            release_at: HashMap::new(),
            owed_pending: HashSet::new(),
            finished: Vec::new(),
            conns: vec![[None; NPORTS]; n],
            next_conn: 1,
            dialing: HashSet::new(),
            taps: HashMap::new(),
            in_flight: HashMap::new(),
            horizons: HashMap::new(),
            coordinator: match cfg.coordinator_ns {
                Some(_) => {
                    let mut c = Coordinator::new(shape).map_err(SwitchError::from)?;
                    for node in shape.node_ids() {
                        c.join(node, None);
                    }
                    Some(c)
                }
                None => None,
            },
        };
        if cfg.switch.modeled_order {
            for (i, f) in routing::feeds(&shape)
                .map_err(SwitchError::from)?
                .into_iter()
                .enumerate()
            {
                sim.stations[i].node_mut().set_feeds(f);
            }
        }
        for l in links(&shape) {
            sim.connect(l.a, l.a_port, true);
        }
        Ok(sim)
    }

    /// Sets `faults` on every direction of every link, each drawing from its own
    /// generator (see [`Sim::set_link_faults`] for one).
    pub fn set_faults(&mut self, faults: LinkFaults) -> Result<(), FaultError> {
        for i in 0..self.stations.len() {
            let node = NodeId(i as u32);
            for (peer, _) in self.neighbours(node) {
                match self.set_link_faults(
                    node,
                    peer,
                    faults,
                    self.cfg.seed ^ u64::from(node.0) << 8 ^ u64::from(peer.0),
                ) {
                    Ok(()) => {}
                    Err(LinkFaultError::Fault(e)) => return Err(e),
                    Err(LinkFaultError::NotLinked { .. }) => {}
                }
            }
        }
        Ok(())
    }

    fn neighbours(&self, node: NodeId) -> Vec<(NodeId, Port)> {
        self.stations[node.0 as usize]
            .ends()
            .map(|(p, e)| (e.peer, p))
            .collect()
    }

    /// Sets the faults on what `from` sends to its neighbour `to`, as `exactl link set`
    /// does on a daemon: loss and corruption drawn per cell from `seed`, delay, jitter and
    /// rate added to the link's own timing, and `down` cutting the link (its connection
    /// closes, and it connects again, with new sessions and hellos, once set up).
    pub fn set_link_faults(
        &mut self,
        from: NodeId,
        to: NodeId,
        faults: LinkFaults,
        seed: u64,
    ) -> Result<(), LinkFaultError> {
        let port = port_to(&self.shape, from, to).ok_or(LinkFaultError::NotLinked { from, to })?;
        let now = self.now;
        let set = self.stations[from.0 as usize].set_faults(port, faults, Some(seed), now)?;
        if set.ended.is_some() {
            self.close(from, port);
        }
        if set.up_again {
            self.schedule_dial(from, port, self.cfg.latency_ns);
        }
        self.pump(from);
        Ok(())
    }

    /// What the faults on `from`'s link to `to` have done (zero if it has none).
    pub fn link_fault_stats(&self, from: NodeId, to: NodeId) -> FaultStats {
        port_to(&self.shape, from, to)
            .and_then(|p| self.stations[from.0 as usize].end(p))
            .map(|e| e.fault_stats())
            .unwrap_or_default()
    }

    /// The link between `a` and `b` connects again while its old connection still stands,
    /// as when a daemon restarts before its neighbour notices: the new sessions replace
    /// the old ones, and what was in flight on the old connection is lost.
    pub fn reconnect(&mut self, a: NodeId, b: NodeId) -> Result<(), LinkFaultError> {
        let port =
            port_to(&self.shape, a, b).ok_or(LinkFaultError::NotLinked { from: a, to: b })?;
        self.schedule_dial(a, port, 0);
        Ok(())
    }

    /// Starts capturing the cells `node` sends and receives that `filter` takes (one
    /// capture per node; starting another replaces it).
    pub fn capture(&mut self, node: NodeId, filter: CaptureFilter) {
        let tap = Tap {
            filter,
            records: Vec::new(),
        };
        self.taps.insert(node, tap);
    }

    /// The records `node`'s capture took since the last call, read back from the bytes a
    /// daemon's capture would have written.
    pub fn take_capture(&mut self, node: NodeId) -> Vec<Record> {
        let records = self
            .taps
            .get_mut(&node)
            .map(|t| std::mem::take(&mut t.records))
            .unwrap_or_default();
        records
            .iter()
            .map(|r| Record::decode(r).expect("a record the simulator encoded reads back"))
            .collect()
    }

    /// Connects the link on (`node`, `port`): both ends begin a session (replacing any
    /// they had) and send their hellos, which land a link latency later, or at once for a
    /// rack coming up.
    fn connect(&mut self, node: NodeId, port: Port, at_once: bool) {
        let Some((peer, peer_port)) = neighbour(&self.shape, node, port) else {
            return;
        };
        let now = self.now;
        let conn = self.next_conn;
        self.next_conn += 1;
        let mut hellos = Vec::new();
        for (n, p) in [(node, port), (peer, peer_port)] {
            match self.stations[n.0 as usize].begin_session(p, now) {
                Ok(sid) => self.conns[n.0 as usize][p.index()] = Some(Conn { id: conn, sid }),
                // The acceptor refused (the operator cut it): the dialer's session closes
                // with it, and it dials again once the link is set up.
                Err(_) => {
                    if n == peer {
                        self.close(node, port);
                    }
                    return;
                }
            }
            if at_once {
                let mut out = Outbox::default();
                let sid = self.conns[n.0 as usize][p.index()].map(|c| c.sid);
                if let Some(sid) = sid {
                    let _ = self.stations[n.0 as usize].take_output(p, sid, now, &mut out);
                }
                hellos.extend(out.hello.map(|h| (n, h)));
            }
        }
        for (n, h) in hellos {
            let (to, to_port) = if n == node {
                (peer, peer_port)
            } else {
                (node, port)
            };
            self.on_hello(to, to_port, conn, &h);
        }
        self.pump(node);
        self.pump(peer);
    }

    /// Ends the session of (`node`, `port`) and closes its connection: the far end hears
    /// of it a link latency later.
    fn close(&mut self, node: NodeId, port: Port) {
        let Some(c) = self.conns[node.0 as usize][port.index()].take() else {
            return;
        };
        let now = self.now;
        self.stations[node.0 as usize].end_session(port, c.sid, now);
        if let Some((peer, peer_port)) = neighbour(&self.shape, node, port) {
            let ev = Ev::Closed {
                node: peer,
                port: peer_port,
                conn: c.id,
            };
            self.schedule(now + self.cfg.latency_ns, ev);
        }
        self.after_close(node, port);
    }

    /// The dialer of a closed link dials again after its backoff, unless the operator cut
    /// it: then it is dialed when set up again.
    fn after_close(&mut self, node: NodeId, port: Port) {
        let Some((peer, peer_port)) = neighbour(&self.shape, node, port) else {
            return;
        };
        let cut = self.stations[node.0 as usize].is_admin_down(port)
            || self.stations[peer.0 as usize].is_admin_down(peer_port);
        if !cut {
            self.schedule_dial(node, port, self.cfg.redial_ns);
        }
    }

    /// Schedules the dial of the link on (`node`, `port`) by its dialer, the lower-numbered
    /// end, `after` from now.
    fn schedule_dial(&mut self, node: NodeId, port: Port, after: u64) {
        let Some((peer, peer_port)) = neighbour(&self.shape, node, port) else {
            return;
        };
        let (d, dp) = if node < peer {
            (node, port)
        } else {
            (peer, peer_port)
        };
        if self.dialing.insert((d, dp)) {
            self.schedule(self.now + after, Ev::Dial { node: d, port: dp });
        }
    }

    fn on_hello(&mut self, node: NodeId, port: Port, conn: ConnId, h: &Hello) {
        let Some(c) = self.current(node, port, conn) else {
            return;
        };
        let now = self.now;
        if self.stations[node.0 as usize]
            .on_hello(port, c.sid, h, now)
            .is_err()
        {
            self.close(node, port);
        }
    }

    /// The session (`node`, `port`) runs over `conn`, if that is still its connection.
    fn current(&self, node: NodeId, port: Port, conn: ConnId) -> Option<Conn> {
        self.conns[node.0 as usize][port.index()].filter(|c| c.id == conn)
    }

    /// Makes sure a release event is due when the first frame held on (`node`, `port`) is.
    fn schedule_release(&mut self, node: NodeId, port: Port, due: Option<Instant>) {
        let Some(due) = due else {
            return;
        };
        if self
            .release_at
            .get(&(node, port))
            .is_some_and(|&t| t <= due)
        {
            return;
        }
        self.release_at.insert((node, port), due);
        self.schedule(due.max(self.now), Ev::Release { node, port });
    }

    /// Puts what (`node`, `port`) sends now on the link.
    fn write(&mut self, node: NodeId, port: Port) {
        let Some(c) = self.conns[node.0 as usize][port.index()] else {
            return;
        };
        let now = self.now;
        let mut out = Outbox::default();
        let Ok(due) = self.stations[node.0 as usize].take_output(port, c.sid, now, &mut out) else {
            return;
        };
        if let Some(h) = out.hello {
            self.transmit_hello(node, port, c.id, h);
        }
        for d in out.frames {
            self.transmit(node, port, c.id, d);
        }
        self.schedule_release(node, port, due);
        let owes = self.stations[node.0 as usize]
            .end(port)
            .is_some_and(|e| e.owes());
        if owes && self.owed_pending.insert((node, port)) {
            // Handed back as a credit frame from the far end would be: a link latency
            // later, and not from inside this loop (see `LinkSender::send_cell`).
            self.schedule(now + self.cfg.latency_ns, Ev::Owed { node, port });
        }
    }

    fn transmit_hello(&mut self, node: NodeId, port: Port, conn: ConnId, hello: Hello) {
        let Some((peer, peer_port)) = neighbour(&self.shape, node, port) else {
            return;
        };
        let (i, p) = (node.0 as usize, port.index());
        // Before anything the session sends after it.
        let at = (self.now + self.cfg.latency_ns).max(self.last_arrival[i][p]);
        self.last_arrival[i][p] = at;
        let ev = Ev::Hello {
            node: peer,
            port: peer_port,
            conn,
            hello,
        };
        self.schedule(at, ev);
    }

    /// Offers a departing cell to the captures of its two ends, read back from the bytes
    /// that leave the port as a daemon's capture reads them.
    fn tap(&mut self, node: NodeId, port: Port, peer: NodeId, d: &Departure) {
        if !matches!(d, Departure::Cell { .. }) || self.taps.is_empty() {
            return;
        }
        let Some(peer_port) = neighbour(&self.shape, node, port).map(|(_, p)| p) else {
            return;
        };
        let ends = [
            (node, port, peer, Direction::Sent),
            (peer, peer_port, node, Direction::Received),
        ];
        if !ends.iter().any(|e| self.taps.contains_key(&e.0)) {
            return;
        }
        let mut b = BytesMut::new();
        if d.encode(&mut b).is_err() {
            return;
        }
        let b = b.freeze();
        for (at, at_port, other, direction) in ends {
            let Some(tap) = self.taps.get_mut(&at) else {
                continue;
            };
            let seen = Seen {
                direction,
                node: at,
                peer: other,
                port: at_port,
                vc: Vc(0),
                modeled: ModelTime::ZERO,
            };
            capture::sent_cells(b.clone(), seen, |seen, cell| {
                if tap.filter.matches(cell) {
                    let mut rec = Vec::new();
                    Record::encode_into(seen, cell, &mut rec);
                    tap.records.push(rec);
                }
            });
        }
    }

    /// Puts a frame that leaves `node` on `port` now on the link: cells are serialised at
    /// the link's rate and arrive after its latency (plus jitter), in order; credits take
    /// the latency but no bandwidth.
    fn transmit(&mut self, node: NodeId, port: Port, conn: ConnId, d: Departure) {
        let Some((peer, peer_port)) = neighbour(&self.shape, node, port) else {
            return;
        };
        self.tap(node, port, peer, &d);
        let now = self.now;
        let (i, p) = (node.0 as usize, port.index());
        let len = match d {
            Departure::Credit { vc, bytes, freed } => {
                let ev = Ev::Credit {
                    node: peer,
                    port: peer_port,
                    conn,
                    vc,
                    bytes,
                    freed,
                };
                self.schedule(now + self.cfg.latency_ns, ev);
                return;
            }
            Departure::Marker { epoch } => {
                // Behind every cell before it on the link.
                let at = (now + self.cfg.latency_ns).max(self.last_arrival[i][p]);
                self.last_arrival[i][p] = at;
                let ev = Ev::Marker {
                    node: peer,
                    port: peer_port,
                    conn,
                    epoch,
                };
                self.schedule(at, ev);
                return;
            }
            Departure::Cell { ref cell, .. } => cell.wire_len(),
        };
        let gbps = match port {
            Port::Torus(..) => LinkKind::TorusX.gbps(),
            _ => LinkKind::IntraQfdb.gbps(),
        };
        let ser = (len as u64 * 8).div_ceil(u64::from(gbps));
        let start = self.busy_until[i][p].max(now);
        self.busy_until[i][p] = start + ser;
        let jitter = self.rng.below(self.cfg.jitter_ns + 1);
        let at = (start + ser + self.cfg.latency_ns + jitter).max(self.last_arrival[i][p]);
        self.last_arrival[i][p] = at;
        let ev = match d.received_cell() {
            Some(Ok((vc, cell))) => {
                if self.omniscient() {
                    let heads = self.in_flight.entry((peer, peer_port)).or_default();
                    *heads.entry(cell.stamp.head).or_default() += 1;
                }
                Ev::Cell {
                    node: peer,
                    port: peer_port,
                    conn,
                    vc,
                    cell,
                }
            }
            Some(Err(error)) => Ev::Refused {
                node: peer,
                port: peer_port,
                conn,
                error,
            },
            None => return,
        };
        self.schedule(at, ev);
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    pub fn node(&self, id: NodeId) -> &Node {
        self.stations[id.0 as usize].node()
    }

    /// Mutable access to a node; call [`Sim::kick`] after giving it work.
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.stations[id.0 as usize].node_mut()
    }

    /// Every node, by id.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.stations.iter().map(|s| s.node())
    }

    /// Node `id` as its driver sees it: its links' sessions and faults.
    pub fn station(&self, id: NodeId) -> &Station {
        &self.stations[id.0 as usize]
    }

    /// Events the nodes reported, with the node and the time.
    pub fn take_events(&mut self) -> Vec<(NodeId, Instant, NodeEvent)> {
        std::mem::take(&mut self.events)
    }

    /// Node `id`'s service to attached workloads, with the NI and memory it serves them
    /// with; call [`Sim::kick`] after giving it work.
    pub fn workloads(&mut self, id: NodeId) -> (&mut WorkloadService, &mut Ni, &mut dyn Memory) {
        let (svc, ni, mem) = self.stations[id.0 as usize].workloads();
        (svc, ni, mem)
    }

    /// Operations of attached workloads that ended since the last call, by node.
    pub fn take_finished(&mut self) -> Vec<(NodeId, Finished)> {
        std::mem::take(&mut self.finished)
    }

    /// Errors the nodes' switches returned (credit overruns, bad routes, ...).
    pub fn errors(&self) -> &[(NodeId, SwitchError)] {
        &self.errors
    }

    /// Events processed so far.
    pub fn processed(&self) -> u64 {
        self.processed
    }

    /// Lets every node act on work given to it from outside the event loop.
    pub fn kick_all(&mut self) {
        // Horizons first: the work given from outside may go before what they allow now.
        self.reorder();
        for i in 0..self.stations.len() {
            self.pump(NodeId(i as u32));
        }
        self.reorder();
        for i in 0..self.stations.len() {
            self.after_cut_step(NodeId(i as u32));
        }
    }

    pub fn kick(&mut self, id: NodeId) {
        self.reorder();
        self.pump(id);
        self.reorder();
        self.after_cut_step(id);
    }

    /// A cell on the link to (`node`, `port`) arrived.
    fn landed(&mut self, node: NodeId, port: Port, head: ModelTime) {
        if let Some(heads) = self.in_flight.get_mut(&(node, port)) {
            if let Some(n) = heads.get_mut(&head) {
                *n -= 1;
                if *n == 0 {
                    heads.remove(&head);
                }
            }
        }
    }

    /// Whether horizons come from the whole rack after every event.
    fn omniscient(&self) -> bool {
        self.cfg.switch.modeled_order && self.coordinator.is_none()
    }

    /// With modeled ordering on and no coordinator, sets every link port's horizon from
    /// the whole rack as it is (see [`crate::horizon`]). Nodes whose horizons moved may
    /// forward more, which moves what they hold: repeated until nothing moves.
    fn reorder(&mut self) {
        if !self.omniscient() {
            return;
        }
        loop {
            for s in &mut self.stations {
                // The NIs may have been given work from outside since they last ran.
                s.node_mut().refresh_ni_horizon();
            }
            let view = Whole {
                stations: &self.stations,
                in_flight: &self.in_flight,
            };
            let mut moved = Vec::new();
            for (node, port, h) in horizon::horizons(&self.shape, &view) {
                if self.horizons.insert((node, port), h) != Some(h) {
                    self.stations[node.0 as usize]
                        .node_mut()
                        .set_horizon(port, h);
                    if moved.last() != Some(&node) {
                        moved.push(node);
                    }
                }
            }
            if moved.is_empty() {
                return;
            }
            for node in moved {
                self.pump(node);
            }
        }
    }

    /// Cuts the coordinator completed (with horizons from cuts).
    pub fn cuts(&self) -> u64 {
        self.coordinator.as_ref().map_or(0, Coordinator::cuts)
    }

    /// Parts of cuts the coordinator took (with horizons from cuts): what the cuts cost
    /// the nodes, where a node left out of a cut costs nothing.
    pub fn cut_parts(&self) -> u64 {
        self.coordinator
            .as_ref()
            .map_or(0, Coordinator::parts_taken)
    }

    /// With horizons from cuts: sends `node`'s part of a cut, once complete, to the
    /// coordinator, and wakes the coordinator when `node` has work and no cut is coming.
    fn after_cut_step(&mut self, node: NodeId) {
        let Some(delay) = self.cfg.coordinator_ns else {
            return;
        };
        let now = self.now;
        if let Some(cut) = self.stations[node.0 as usize].take_cut() {
            let cut = Box::new(cut);
            self.schedule(now + delay, Ev::Part { node, cut });
        }
        if self.stations[node.0 as usize].take_wake() {
            let begins = self
                .coordinator
                .as_mut()
                .map(|c| c.wake(node, None))
                .unwrap_or_default();
            self.begin_cut(begins);
        }
    }

    /// Each node the coordinator told to begin a cut hears of it.
    fn begin_cut(&mut self, begins: Vec<Begin>) {
        let Some(delay) = self.cfg.coordinator_ns else {
            return;
        };
        let at = self.now + delay;
        for b in begins {
            self.schedule(
                at,
                Ev::BeginCut {
                    node: b.node,
                    epoch: b.epoch,
                    waits: b.waits,
                },
            );
        }
    }

    /// A node's part of the cut reaches the coordinator; once all have, the horizons go
    /// out, and the next cut if anything was pending.
    fn on_part(&mut self, node: NodeId, cut: NodeCut) {
        let (Some(delay), Some(c)) = (self.cfg.coordinator_ns, self.coordinator.as_mut()) else {
            return;
        };
        let reported = match c.report(node, cut, None) {
            Ok(r) => r,
            Err(e) => panic!("the simulator's coordinator refused a part: {e}"),
        };
        let at = self.now + delay;
        if let Some(horizons) = reported.horizons {
            let pending = horizons.pending;
            for (node, h) in horizons.by_node {
                self.schedule(
                    at,
                    Ev::Horizons {
                        node,
                        horizons: h,
                        pending,
                    },
                );
            }
        }
        self.begin_cut(reported.begins);
    }

    fn schedule(&mut self, at: Instant, ev: Ev) {
        let idx = match self.free.pop() {
            Some(i) => {
                self.slab[i] = Some(ev);
                i
            }
            None => {
                self.slab.push(Some(ev));
                self.slab.len() - 1
            }
        };
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, idx)));
    }

    fn pump(&mut self, id: NodeId) {
        let now = self.now;
        let i = id.0 as usize;
        self.stations[i].pump(now);
        let ready: Vec<Port> = self.stations[i].take_ready().collect();
        for port in ready {
            self.write(id, port);
        }
        while let Some(e) = self.stations[i].poll_event() {
            match e {
                StationEvent::Finished(f) => self.finished.push((id, f)),
                StationEvent::Node(e) => self.events.push((id, now, e)),
            }
        }
        self.errors
            .extend(self.stations[i].take_errors().into_iter().map(|e| (id, e)));
        if let Some(t) = self.stations[i].poll_timeout() {
            if self.timer_at[i].is_none_or(|s| t < s) {
                self.timer_at[i] = Some(t);
                self.schedule(t.max(now), Ev::Timer { node: id });
            }
        }
    }

    /// Processes one event; false when none is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse((at, _, idx))) = self.heap.pop() else {
            return false;
        };
        self.now = self.now.max(at);
        let ev = self.slab[idx].take().expect("scheduled event exists");
        self.free.push(idx);
        self.processed += 1;
        let now = self.now;
        let node = match ev {
            Ev::Cell {
                node,
                port,
                conn,
                vc,
                cell,
            } => {
                if self.omniscient() {
                    self.landed(node, port, cell.stamp.head);
                }
                if let Some(c) = self.current(node, port, conn) {
                    let f = Frame::Cell(vc, cell);
                    let _ = self.stations[node.0 as usize].on_frames(port, c.sid, [f], now);
                }
                node
            }
            Ev::Credit {
                node,
                port,
                conn,
                vc,
                bytes,
                freed,
            } => {
                if let Some(c) = self.current(node, port, conn) {
                    let f = Frame::Credit(vc, bytes, freed);
                    let _ = self.stations[node.0 as usize].on_frames(port, c.sid, [f], now);
                }
                node
            }
            Ev::Hello {
                node,
                port,
                conn,
                hello,
            } => {
                self.on_hello(node, port, conn, &hello);
                node
            }
            Ev::Refused {
                node,
                port,
                conn,
                error,
            } => {
                if self.current(node, port, conn).is_some() {
                    self.stations[node.0 as usize].on_bad_frame(port, &error);
                }
                node
            }
            Ev::Timer { node } => {
                self.timer_at[node.0 as usize] = None;
                self.stations[node.0 as usize].handle_timeout(now);
                node
            }
            Ev::Release { node, port } => {
                self.release_at.remove(&(node, port));
                self.write(node, port);
                node
            }
            Ev::Owed { node, port } => {
                self.owed_pending.remove(&(node, port));
                self.stations[node.0 as usize].settle_owed(port, now);
                node
            }
            Ev::Closed { node, port, conn } => {
                if let Some(c) = self.current(node, port, conn) {
                    self.conns[node.0 as usize][port.index()] = None;
                    self.stations[node.0 as usize].end_session(port, c.sid, now);
                    self.after_close(node, port);
                }
                node
            }
            Ev::Marker {
                node,
                port,
                conn,
                epoch,
            } => {
                if let Some(c) = self.current(node, port, conn) {
                    let f = Frame::Marker(epoch);
                    let _ = self.stations[node.0 as usize].on_frames(port, c.sid, [f], now);
                }
                node
            }
            Ev::BeginCut { node, epoch, waits } => {
                self.stations[node.0 as usize].begin_cut(epoch, waits, now);
                node
            }
            Ev::Part { node, cut } => {
                self.on_part(node, *cut);
                return true;
            }
            Ev::Horizons {
                node,
                horizons,
                pending,
            } => {
                self.stations[node.0 as usize].set_horizons(&horizons, pending);
                node
            }
            Ev::Dial { node, port } => {
                self.dialing.remove(&(node, port));
                // A dialer whose own end is cut waits until it is set up.
                if !self.stations[node.0 as usize].is_admin_down(port) {
                    self.connect(node, port, false);
                }
                node
            }
        };
        self.pump(node);
        self.reorder();
        self.after_cut_step(node);
        true
    }

    /// Runs until no event is left or simulated time passes `until`. Returns true when the
    /// rack went quiet (no events pending).
    pub fn run_until(&mut self, until: Instant) -> bool {
        loop {
            match self.heap.peek() {
                None => return true,
                Some(Reverse((at, _, _))) if *at > until => {
                    self.now = until;
                    return false;
                }
                Some(_) => {
                    self.step();
                }
            }
        }
    }

    /// True when every node is idle and nothing is in flight.
    pub fn is_quiet(&self) -> bool {
        self.heap.is_empty() && self.stations.iter().all(|s| s.is_idle())
    }
}

/// The whole simulated rack as horizons are computed from it: every node as it is, and
/// the cells on every link.
struct Whole<'a> {
    stations: &'a [Station],
    in_flight: &'a HashMap<(NodeId, Port), BTreeMap<ModelTime, u32>>,
}

impl CutView for Whole<'_> {
    fn ports(&self, node: NodeId) -> Vec<Port> {
        self.stations[node.0 as usize]
            .ends()
            .map(|(p, _)| p)
            .collect()
    }

    fn ni(&self, node: NodeId, port: Port) -> ModelTime {
        self.stations[node.0 as usize]
            .node()
            .switch()
            .ni_toward(port)
    }

    fn relays(&self, node: NodeId) -> bool {
        self.stations[node.0 as usize].node().switch().ni_relays()
    }

    fn toward(&self, node: NodeId, port: Port) -> ModelTime {
        self.stations[node.0 as usize]
            .node()
            .switch()
            .earliest_toward(port)
    }

    fn arrival(&self, node: NodeId, port: Port, from: Option<Port>, ready: ModelTime) -> ModelTime {
        self.stations[node.0 as usize]
            .node()
            .switch()
            .earliest_arrival(port, from, ready)
    }

    fn on_link(&self, node: NodeId, port: Port) -> ModelTime {
        self.in_flight
            .get(&(node, port))
            .and_then(|h| h.keys().next().copied())
            .unwrap_or(ModelTime::NEVER)
    }

    fn to_ni(&self, node: NodeId, port: Port) -> ModelTime {
        self.stations[node.0 as usize]
            .node()
            .switch()
            .earliest_to_ni(port)
    }

    fn feeds(&self, node: NodeId) -> Feeds {
        *self.stations[node.0 as usize].node().switch().feeds()
    }
}
