//! A whole rack in one process: every node's core wired to its neighbours through
//! simulated links, driven by a discrete-event loop in simulated time. Deterministic for a
//! given seed. This is what the rack tests and the switch benchmark run on; the
//! modeled-time mode and fault injection grow from it.
//!
//! Links serialise cells at their kind's rate (16 or 10 Gb/s) and deliver them after a
//! fixed latency plus seeded jitter; credit frames take the latency but no bandwidth.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use bytes::BytesMut;

use crate::cell::{Cell, HEADER_LEN};
use crate::fault::{flip_bit, FaultError, FaultStats, LinkFaults};
use crate::link::{Departure, LinkSender};
use crate::model::ModelTime;
use crate::ni::{Memory, Ni};
use crate::node::{Node, NodeError, NodeEvent};
use crate::routing::Vc;
use crate::shape::{NodeId, Shape};
use crate::switch::{SwitchConfig, SwitchError};
use crate::time::Instant;
use crate::topology::{links, neighbour, port_to, LinkKind, Port, NPORTS};
use crate::workload::{Finished, Relayed, WorkloadService};

#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub switch: SwitchConfig,
    /// Propagation latency of every link.
    pub latency_ns: u64,
    /// Up to this much extra latency per cell, drawn from the seeded generator. Links stay
    /// FIFO: a cell never overtakes the one before it.
    pub jitter_ns: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            switch: SwitchConfig::default(),
            latency_ns: 120,
            jitter_ns: 0,
        }
    }
}

enum Ev {
    Cell {
        node: NodeId,
        port: Port,
        vc: Vc,
        cell: Cell,
    },
    Credit {
        node: NodeId,
        port: Port,
        vc: Vc,
        bytes: u32,
        freed: ModelTime,
    },
    /// The node's NI timer.
    Timer { node: NodeId },
    /// A cell refused by the receiver's CRC check: the receiver refunds its credit.
    Refused {
        node: NodeId,
        port: Port,
        vc: Vc,
        bytes: u32,
    },
    /// Frames the faults of a link direction held back fall due.
    Release { node: NodeId, port: Port },
    /// The credit of cells the faults of a link direction dropped goes back to its output.
    Owed { node: NodeId, port: Port },
}

/// Why per-link faults cannot be set.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LinkFaultError {
    #[error("node {from} has no link to node {to}")]
    NotLinked { from: NodeId, to: NodeId },
    #[error("a cut link is not simulated (the daemon carries out `down`)")]
    Down,
    #[error(transparent)]
    Fault(#[from] FaultError),
}

/// What the receiver makes of `cell` with bit `bit` flipped on the wire: the cell, its
/// payload marked corrupt if the payload CRC fails, or nothing when the header or footer
/// CRC fails and the next switch drops it.
fn flip_and_decode(cell: &Cell, bit: usize) -> Option<Cell> {
    let mut b = BytesMut::with_capacity(cell.wire_len());
    cell.encode(&mut b).ok()?;
    flip_bit(&mut b, bit);
    let mut c = Cell::decode(&b.freeze()).ok()?;
    c.stamp = cell.stamp;
    Some(c)
}

/// The simulator's generator (see [`crate::rng`]).
pub type SimRng = crate::rng::SplitMix64;

pub struct Sim {
    shape: Shape,
    cfg: SimConfig,
    nodes: Vec<Node>,
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
    faults: Faults,
    /// Every link direction's sending end, by node and port: the same one each daemon
    /// sends through, so the operator's faults act here as they do on a real rack.
    senders: Vec<Vec<LinkSender>>,
    /// The release event each link direction has scheduled for its held frames.
    release_at: HashMap<(NodeId, Port), Instant>,
    /// Link directions with an `Ev::Owed` scheduled.
    owed_pending: HashSet<(NodeId, Port)>,
    /// Each node's service to the workloads attached through it: the NI events of their
    /// ranks become their completions, as on a daemon, instead of [`Sim::take_events`].
    workloads: Vec<WorkloadService>,
    /// Operations of attached workloads that ended, by node.
    finished: Vec<(NodeId, Finished)>,
}

/// Faults applied to cells as they arrive over a link, drawn from the seeded generator.
/// A dropped cell returns its credit (the link itself stays lossless in bookkeeping). A
/// corrupted cell gets a flipped payload bit and travels on marked corrupt, as decoding it
/// would mark it, to be NACKed by its destination. Reordering delays a cell past later
/// ones.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Probability (0..=1) that a cell is lost.
    pub loss: f64,
    /// Probability that a cell arrives with a flipped payload bit.
    pub corrupt: f64,
    /// Probability that an NI cell is delivered twice to its destination NI.
    pub duplicate: f64,
    /// Probability that a cell is held back by up to `reorder_ns`.
    pub reorder: f64,
    pub reorder_ns: u64,
}

impl Sim {
    /// A rack with every link up.
    pub fn new(shape: Shape, cfg: SimConfig) -> Result<Sim, NodeError> {
        let nodes = shape
            .node_ids()
            .map(|id| Node::new(shape, id, cfg.switch))
            .collect::<Result<Vec<_>, _>>()?;
        let n = nodes.len();
        let mut sim = Sim {
            shape,
            cfg,
            nodes,
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
            faults: Faults::default(),
            senders: (0..n as u64)
                .map(|i| {
                    (0..NPORTS as u64)
                        .map(|p| LinkSender::new(cfg.seed ^ (i << 8 | p)))
                        .collect()
                })
                .collect(),
            release_at: HashMap::new(),
            owed_pending: HashSet::new(),
            workloads: (0..n as u64)
                .map(|i| WorkloadService::new(cfg.seed ^ i.rotate_left(32)))
                .collect(),
            finished: Vec::new(),
        };
        for l in links(&shape) {
            let ga = sim.nodes[l.a.0 as usize].link_up(l.a_port)?;
            let gb = sim.nodes[l.b.0 as usize].link_up(l.b_port)?;
            sim.nodes[l.a.0 as usize].peer_grant(l.a_port, gb, Instant::ZERO)?;
            sim.nodes[l.b.0 as usize].peer_grant(l.b_port, ga, Instant::ZERO)?;
        }
        Ok(sim)
    }

    /// Applies `f` to every cell arriving over a link from now on.
    pub fn set_faults(&mut self, f: Faults) {
        self.faults = f;
    }

    /// Sets the faults on what `from` sends to its neighbour `to`, as `exactl link set`
    /// does on a daemon: loss and corruption drawn per cell from `seed`, delay, jitter and
    /// rate added to the link's own timing.
    pub fn set_link_faults(
        &mut self,
        from: NodeId,
        to: NodeId,
        faults: LinkFaults,
        seed: u64,
    ) -> Result<(), LinkFaultError> {
        if faults.down {
            return Err(LinkFaultError::Down);
        }
        let port = port_to(&self.shape, from, to).ok_or(LinkFaultError::NotLinked { from, to })?;
        let now = self.now;
        let s = self.sender(from, port);
        s.reseed(seed);
        s.set_faults(faults, now)?;
        // Clearing a shaping fault releases held frames at once.
        self.schedule_release(from, port);
        Ok(())
    }

    /// What the faults on `from`'s link to `to` have done (zero if it has none).
    pub fn link_fault_stats(&self, from: NodeId, to: NodeId) -> FaultStats {
        port_to(&self.shape, from, to)
            .map(|p| self.senders[from.0 as usize][p.index()].stats())
            .unwrap_or_default()
    }

    fn sender(&mut self, node: NodeId, port: Port) -> &mut LinkSender {
        &mut self.senders[node.0 as usize][port.index()]
    }

    /// Makes sure a release event is due when the first frame held on (`node`, `port`) is.
    fn schedule_release(&mut self, node: NodeId, port: Port) {
        let Some(due) = self.sender(node, port).poll_at() else {
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

    /// Puts a frame that leaves `node` on `port` now on the link: cells are serialised at
    /// the link's rate and arrive after its latency (plus jitter), in order; credits take
    /// the latency but no bandwidth.
    fn transmit(&mut self, node: NodeId, port: Port, d: Departure) {
        let Some((peer, peer_port)) = neighbour(&self.shape, node, port) else {
            return;
        };
        let now = self.now;
        let (i, p) = (node.0 as usize, port.index());
        let (vc, received) = match d {
            Departure::Credit { vc, bytes, freed } => {
                let ev = Ev::Credit {
                    node: peer,
                    port: peer_port,
                    vc,
                    bytes,
                    freed,
                };
                self.schedule(now + self.cfg.latency_ns, ev);
                return;
            }
            Departure::Cell { vc, ref cell, .. } => (vc, (cell.wire_len(), d.received_cell())),
        };
        let (len, received) = received;
        let gbps = match port {
            Port::Torus(..) => LinkKind::TorusX.gbps(),
            _ => LinkKind::IntraQfdb.gbps(),
        };
        let ser = (len as u64 * 8).div_ceil(u64::from(gbps));
        let start = self.busy_until[i][p].max(now);
        self.busy_until[i][p] = start + ser;
        let jitter = self.rng.below(self.cfg.jitter_ns + 1);
        let mut at = (start + ser + self.cfg.latency_ns + jitter).max(self.last_arrival[i][p]);
        self.last_arrival[i][p] = at;
        if self.chance(self.faults.reorder) {
            at = at + 1 + self.rng.below(self.faults.reorder_ns);
        }
        let ev = match received {
            Some(Ok((vc, cell))) => Ev::Cell {
                node: peer,
                port: peer_port,
                vc,
                cell,
            },
            Some(Err(bytes)) => Ev::Refused {
                node: peer,
                port: peer_port,
                vc,
                bytes,
            },
            None => return,
        };
        self.schedule(at, ev);
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.chance(p)
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    /// Mutable access to a node; call [`Sim::kick`] after giving it work.
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.0 as usize]
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Events the nodes reported, with the node and the time.
    pub fn take_events(&mut self) -> Vec<(NodeId, Instant, NodeEvent)> {
        std::mem::take(&mut self.events)
    }

    /// Node `id`'s service to attached workloads, with the NI and memory it serves them
    /// with; call [`Sim::kick`] after giving it work.
    pub fn workloads(&mut self, id: NodeId) -> (&mut WorkloadService, &mut Ni, &mut dyn Memory) {
        let (ni, mem) = self.nodes[id.0 as usize].ni_mut();
        (&mut self.workloads[id.0 as usize], ni, mem)
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
        for i in 0..self.nodes.len() {
            self.pump(NodeId(i as u32));
        }
    }

    pub fn kick(&mut self, id: NodeId) {
        self.pump(id);
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
        let mut touched = [false; NPORTS];
        while let Some(t) = self.nodes[i].poll_transmit(now) {
            touched[t.port.index()] = true;
            if let Some(d) = self.senders[i][t.port.index()].send_cell(now, t.vc, t.cell) {
                self.transmit(id, t.port, d);
            }
        }
        while let Some((port, vc, bytes, freed)) = self.nodes[i].poll_credit() {
            touched[port.index()] = true;
            if let Some(d) = self.senders[i][port.index()].send_credit(now, vc, bytes, freed) {
                self.transmit(id, port, d);
            }
        }
        for port in Port::all().filter(|p| touched[p.index()]) {
            self.schedule_release(id, port);
            if self.senders[i][port.index()].owes() && self.owed_pending.insert((id, port)) {
                // Handed back as a credit frame from the far end would be: a link latency
                // later, and not from inside this loop (see `LinkSender::send_cell`).
                self.schedule(now + self.cfg.latency_ns, Ev::Owed { node: id, port });
            }
        }
        while let Some(e) = self.nodes[i].poll_event() {
            let e = match e {
                NodeEvent::Ni(ev) => {
                    let (ni, _) = self.nodes[i].ni_mut();
                    match self.workloads[i].on_event(ni, ev, now) {
                        Relayed::NotAttached(ev) => NodeEvent::Ni(ev),
                        Relayed::Queued(f) => {
                            self.finished.extend(f.map(|f| (id, f)));
                            continue;
                        }
                        Relayed::NotRelayed => continue,
                    }
                }
                e => e,
            };
            self.events.push((id, now, e));
        }
        if let Some(t) = self.nodes[i].poll_timeout() {
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
                vc,
                cell,
            } => {
                let f = self.faults;
                let n = node.0 as usize;
                let mut cell = cell;
                if self.chance(f.corrupt) && !cell.payload.is_empty() {
                    // Bit `b` (least significant first) of payload byte `i` flips.
                    let i = self.rng.below(cell.payload.len() as u64) as usize;
                    let b = self.rng.below(8) as usize;
                    cell = flip_and_decode(&cell, (HEADER_LEN + i) * 8 + 7 - b)
                        .expect("a payload flip leaves the header and footer CRCs sound");
                }
                if self.chance(f.loss) {
                    let _ = self.nodes[n].refund(port, vc, cell.wire_len() as u32);
                } else {
                    let dup = cell.dst.node() == node
                        && !matches!(
                            cell.kind,
                            crate::CellType::Probe
                                | crate::CellType::ProbeReply
                                | crate::CellType::Load
                        )
                        && self.chance(f.duplicate);
                    let copy = dup.then(|| cell.clone());
                    if let Err(e) = self.nodes[n].receive(port, vc, cell, now) {
                        self.errors.push((node, e));
                    }
                    if let Some(c) = copy {
                        // A duplicate bypasses the link (it would need credit nobody paid).
                        self.nodes[n].deliver_to_ni(c, now);
                    }
                }
                node
            }
            Ev::Credit {
                node,
                port,
                vc,
                bytes,
                freed,
            } => {
                if let Err(e) = self.nodes[node.0 as usize].credit(port, vc, bytes, freed, now) {
                    self.errors.push((node, e));
                }
                node
            }
            Ev::Timer { node } => {
                self.fire_timer(node);
                node
            }
            Ev::Refused {
                node,
                port,
                vc,
                bytes,
            } => {
                let _ = self.nodes[node.0 as usize].refund(port, vc, bytes);
                node
            }
            Ev::Release { node, port } => {
                self.release_at.remove(&(node, port));
                while let Some(d) = self.sender(node, port).poll(now) {
                    self.transmit(node, port, d);
                }
                self.schedule_release(node, port);
                node
            }
            Ev::Owed { node, port } => {
                self.owed_pending.remove(&(node, port));
                if let Some(owed) = self.sender(node, port).take_owed() {
                    for (vc, &n) in owed.iter().enumerate().filter(|(_, n)| **n > 0) {
                        if let Err(e) = self.nodes[node.0 as usize].credit(
                            port,
                            Vc(vc as u8),
                            n,
                            ModelTime::ZERO,
                            now,
                        ) {
                            self.errors.push((node, e));
                        }
                    }
                }
                node
            }
        };
        self.pump(node);
        true
    }

    fn fire_timer(&mut self, node: NodeId) {
        let i = node.0 as usize;
        self.timer_at[i] = None;
        let now = self.now;
        if self.nodes[i].poll_timeout().is_some_and(|t| t <= now) {
            self.nodes[i].handle_timeout(now);
        }
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
        self.heap.is_empty() && self.nodes.iter().all(|n| n.is_idle())
    }
}
