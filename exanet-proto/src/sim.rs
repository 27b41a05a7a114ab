//! A whole rack in one process: every node's core wired to its neighbours through
//! simulated links, driven by a discrete-event loop in simulated time. Deterministic for a
//! given seed. This is what the rack tests and the switch benchmark run on; the
//! modeled-time mode and fault injection grow from it.
//!
//! Links serialise cells at their kind's rate (16 or 10 Gb/s) and deliver them after a
//! fixed latency plus seeded jitter; credit frames take the latency but no bandwidth.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use bytes::BytesMut;

use crate::cell::{Cell, HEADER_LEN};
use crate::fault::{flip_bit, CellFate, FaultError, FaultInjector, FaultStats, LinkFaults};
use crate::node::{Node, NodeError, NodeEvent};
use crate::routing::Vc;
use crate::shape::{NodeId, Shape};
use crate::switch::{SwitchConfig, SwitchError};
use crate::time::Instant;
use crate::topology::{links, neighbour, port_to, LinkKind, Port, NPORTS};

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
    },
    /// The node's NI timer.
    Timer { node: NodeId },
    /// A cell lost on the wire or refused by the receiver's CRC check: its credit is
    /// returned when it would have arrived.
    Lost {
        node: NodeId,
        port: Port,
        vc: Vc,
        bytes: u32,
    },
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
    Cell::decode(&b.freeze()).ok()
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
    /// The fault injectors of link directions given faults, by (node, port): the same
    /// wrapper each daemon puts on its links.
    injectors: HashMap<(NodeId, Port), FaultInjector>,
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
            injectors: HashMap::new(),
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
        let mut fi = FaultInjector::new(seed);
        fi.set(faults, self.now)?;
        self.injectors.insert((from, port), fi);
        Ok(())
    }

    /// What the injector on `from`'s link to `to` has done (zero if it has none).
    pub fn link_fault_stats(&self, from: NodeId, to: NodeId) -> FaultStats {
        port_to(&self.shape, from, to)
            .and_then(|p| self.injectors.get(&(from, p)))
            .map(FaultInjector::stats)
            .unwrap_or_default()
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
        while let Some(t) = self.nodes[i].poll_transmit(now) {
            let Some((peer, peer_port)) = neighbour(&self.shape, id, t.port) else {
                continue;
            };
            let gbps = match t.port {
                Port::Torus(..) => LinkKind::TorusX.gbps(),
                _ => LinkKind::IntraQfdb.gbps(),
            };
            let len = t.cell.wire_len();
            let ser = (len as u64 * 8).div_ceil(u64::from(gbps));
            let p = t.port.index();
            let mut cell = Some(t.cell);
            // The operator's faults on this link direction: the cell's fate, and how long
            // the injector holds it before the link's own timing applies.
            let mut hold = 0;
            if let Some(fi) = self.injectors.get_mut(&(id, t.port)) {
                match fi.cell_fate(len) {
                    CellFate::Pass => {}
                    CellFate::Drop => cell = None,
                    CellFate::Corrupt { bit } => cell = cell.and_then(|c| flip_and_decode(&c, bit)),
                }
                hold = fi.release_at(now, len + crate::frame::CELL_FRAME_HEADER) - now;
            }
            let start = self.busy_until[i][p].max(now + hold);
            self.busy_until[i][p] = start + ser;
            let jitter = self.rng.below(self.cfg.jitter_ns + 1);
            let mut at = (start + ser + self.cfg.latency_ns + jitter).max(self.last_arrival[i][p]);
            self.last_arrival[i][p] = at;
            if self.chance(self.faults.reorder) {
                at = at + 1 + self.rng.below(self.faults.reorder_ns);
            }
            let ev = match cell {
                Some(cell) => Ev::Cell {
                    node: peer,
                    port: peer_port,
                    vc: t.vc,
                    cell,
                },
                None => Ev::Lost {
                    node: peer,
                    port: peer_port,
                    vc: t.vc,
                    bytes: len as u32,
                },
            };
            self.schedule(at, ev);
        }
        while let Some((port, vc, bytes)) = self.nodes[i].poll_credit() {
            if let Some((peer, peer_port)) = neighbour(&self.shape, id, port) {
                let at = now + self.cfg.latency_ns;
                self.schedule(
                    at,
                    Ev::Credit {
                        node: peer,
                        port: peer_port,
                        vc,
                        bytes,
                    },
                );
            }
        }
        while let Some(e) = self.nodes[i].poll_event() {
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
            } => {
                if let Err(e) = self.nodes[node.0 as usize].credit(port, vc, bytes, now) {
                    self.errors.push((node, e));
                }
                node
            }
            Ev::Timer { node } => {
                self.fire_timer(node);
                node
            }
            Ev::Lost {
                node,
                port,
                vc,
                bytes,
            } => {
                let _ = self.nodes[node.0 as usize].refund(port, vc, bytes);
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
