//! Link horizons from a view of the whole rack, and the coordinator that gathers that view
//! from nodes that each see only themselves.
//!
//! A switch serving cells in modeled order ([`crate::order`]) needs, for each link input,
//! a horizon: no cell with an earlier order key will come in on it any more. It is the
//! cells already on the link, and what the upstream forwards to it from now on: from the
//! earliest key the upstream holds for that link, may inject, or may still receive,
//! behind everything already booked on that output, plus a traversal and the link's
//! latency. What may still reach a node is a shortest path over the rack from what every
//! node holds (each hop adds at least a traversal and a latency, so the search ends).
//! [`horizons`] computes all of them from a [`CutView`] of the rack.
//!
//! The simulator sees the whole rack at once and computes horizons after every event.
//! Daemons see only themselves, so the view is assembled from a **consistent cut**
//! ([`crate::cut`]) of the nodes that may matter: each node of the cut records its part
//! when it begins the cut and sends a marker to its neighbours in the cut, and records the
//! cells that come in on those links until their markers arrive: those were on the link
//! at the cut. A node left out is quiet (it holds nothing and sends nothing until it is in
//! a cut again), and one that was sent cells joins the cut under way ([`Coordinator`]).
//! Links are FIFO, so every cell is in one node's part or on one link, at a position no
//! further along than it really is. Horizons computed from it are lower bounds on what
//! arrives after the cut: a cell that moved on since only arrives later, with a later key,
//! because every hop adds its lookahead. Older horizons remain bounds while every promise
//! holds, so nodes act on the last cut's while the next is taken; each cut's replace the
//! last's (a later cut knows more).
//!
//! A node's part carries its outputs' timelines only from its own earliest key on, and at
//! most [`OUTLOOK_INTERVALS`] of them: an output's timeline cut short finds gaps no later
//! than the whole one, so horizons from it are looser, never wrong.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::model::Timeline;
use crate::routing::{self, Feeds, RouteError};
use crate::shape::{NodeId, Shape};
use crate::time::ModelTime;
use crate::topology::{neighbour, Port, NPORTS};

/// Busy intervals of an output a node's part of a cut carries.
pub const OUTLOOK_INTERVALS: usize = 64;

/// When a cell ready at an output reaches the far end of its link: after a traversal, in
/// the first gap of the output's timeline, and the link's latency.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outlook {
    /// A traversal toward this port of a cell from the NI or a link inside the QFDB.
    pub traversal_ps: u64,
    /// A traversal toward this port of a cell that came in on a torus port (through the
    /// QFDB's router).
    pub from_torus_ps: u64,
    /// The shortest cell's time on the output.
    pub shortest_ps: u64,
    pub latency_ps: u64,
    pub busy: Timeline,
}

impl Outlook {
    /// The earliest a cell ready at `ready` or later reaches the far end; `from` is the
    /// port it came in on, when known (a cell from a torus port crosses the router).
    pub fn arrival(&self, from: Option<Port>, ready: ModelTime) -> ModelTime {
        self.arrival_on(&self.busy, from, ready)
    }

    /// [`Outlook::arrival`] on the timeline `busy` in place of the output's own.
    fn arrival_on(&self, busy: &Timeline, from: Option<Port>, ready: ModelTime) -> ModelTime {
        let traversal = match from {
            Some(Port::Torus(..)) => self.traversal_ps.max(self.from_torus_ps),
            _ => self.traversal_ps,
        };
        arrival(busy, ready, traversal, self.shortest_ps, self.latency_ps)
    }
}

/// See [`Outlook::arrival`]; shared with the switch, which computes it on its own timeline.
/// A traversal is never less than a picosecond, so that a switch configured with none
/// still cannot wait on itself.
pub(crate) fn arrival(
    busy: &Timeline,
    ready: ModelTime,
    traversal_ps: u64,
    shortest_ps: u64,
    latency_ps: u64,
) -> ModelTime {
    if ready == ModelTime::NEVER {
        return ready;
    }
    busy.first_gap(ready + traversal_ps.max(1), shortest_ps) + latency_ps
}

/// One link port in a node's part of a cut.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PortCut {
    pub port: Port,
    /// The earliest order key of a cell the node holds for this port.
    pub toward: ModelTime,
    /// What the node's NI may still inject by itself onto this port.
    pub ni: ModelTime,
    /// The earliest head of the cells that were on the link coming in on this port.
    pub on_link: ModelTime,
    /// The earliest order key of a cell the node holds that came in on this port and goes
    /// to its NI, which may answer it.
    pub to_ni: ModelTime,
    pub outlook: Outlook,
}

/// A node's part of a cut of the rack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeCut {
    pub epoch: u64,
    /// Whether the node had cells to forward or its NI work under way.
    pub busy: bool,
    /// Whether the node's NI may send anywhere in reaction to what reaches it.
    pub relays: bool,
    /// Its link ports, up or not.
    pub ports: Vec<PortCut>,
    /// Nothing held, nothing on its links, its programs promising nothing before the
    /// attach floor: the coordinator leaves it out of the next cuts until it wakes it or
    /// a neighbour sends it cells, and it sends nothing until it begins a cut again.
    pub quiet: bool,
    /// Ports it sent cells on since its previous part (bit per port index): a neighbour
    /// not in the cut that it sent cells to must join it.
    pub sent: u16,
}

impl NodeCut {
    /// Whether the node had work or cells came in on its links: a rack whose every part
    /// has nothing pending needs no further cut until something happens (what programs
    /// may post is not work: they wake the coordinator when they post).
    pub fn pending(&self) -> bool {
        self.busy || self.ports.iter().any(|p| p.on_link < ModelTime::NEVER)
    }
}

/// The rack as horizons are computed from it.
pub(crate) trait CutView {
    /// The node's link ports, up or not.
    fn ports(&self, node: NodeId) -> Vec<Port>;
    /// What the node's NI may still inject by itself onto `port`.
    fn ni(&self, node: NodeId, port: Port) -> ModelTime;
    /// Whether the node's NI may send anywhere in reaction to what reaches it.
    fn relays(&self, node: NodeId) -> bool;
    /// The earliest key of a cell the node holds for `port`.
    fn toward(&self, node: NodeId, port: Port) -> ModelTime;
    /// The earliest a cell ready at the node at `ready` reaches the far end of `port`,
    /// having come in on `from` when that is known (else the shortest traversal).
    fn arrival(&self, node: NodeId, port: Port, from: Option<Port>, ready: ModelTime) -> ModelTime;
    /// The earliest head of the cells on the link coming in on `port`.
    fn on_link(&self, node: NodeId, port: Port) -> ModelTime;
    /// The earliest key of a cell the node holds that came in on `port` and goes to its NI.
    fn to_ni(&self, node: NodeId, port: Port) -> ModelTime;
    /// Where the cells that come in on each of the node's ports can leave.
    fn feeds(&self, node: NodeId) -> Feeds;
    /// What nodes the view leaves out promise (they hold nothing, their NIs inject
    /// nothing before it): bounds every link at one hop after it. `None`: nothing.
    fn floor(&self) -> Option<ModelTime> {
        None
    }
    /// Whether the node holds nothing, has nothing on its links and its NI injects
    /// nothing by itself before the floor (it only passes on and reacts to what reaches
    /// it): the search need not start anything there.
    /// A silent node's horizons are not computed either: nothing of the cut waits on
    /// them.
    fn silent(&self, _node: NodeId) -> bool {
        false
    }
}

/// A node's port and the far end of its link (none for the NI's port).
type LinkEnd = (Port, Option<(NodeId, Port)>);

/// Every link port's horizon, from a view of the whole rack: the earliest head a cell can
/// still come in with on it. That is the cells on the link, and what the upstream sends on
/// it from now on: from what it holds for that link and what its NI may inject, and what
/// may still come in to it on an input whose cells can leave by that link, either passing
/// through or answered by its NI ([`crate::routing::feeds`]). A shortest path over the
/// rack's link directions (Dijkstra: every hop adds at least a traversal and a link's
/// latency). A bound that ignored where cells can go would hold every switch to the
/// earliest cell near it: a sender's own cells, one hop out and back, would bound what
/// may come in to it, and it could send a cell or two per horizon.
pub(crate) fn horizons(shape: &Shape, view: &impl CutView) -> Vec<(NodeId, Port, ModelTime)> {
    let at = |n: NodeId, p: Port| n.0 as usize * NPORTS + p.index();
    let local = 1u16 << Port::Local.index();
    let nodes = shape.nodes() as usize;
    // The view's ports and their far ends, looked up once: the search below visits every
    // port of every node it reaches (on 128 nodes, the coordinator's time went there).
    let ports: Vec<Vec<LinkEnd>> = shape
        .node_ids()
        .map(|n| {
            view.ports(n)
                .into_iter()
                .map(|p| (p, neighbour(shape, n, p)))
                .collect()
        })
        .collect();
    let feeds: Vec<Feeds> = shape.node_ids().map(|n| view.feeds(n)).collect();
    let relays: Vec<bool> = shape.node_ids().map(|n| view.relays(n)).collect();
    let mut h = vec![ModelTime::NEVER; nodes * NPORTS];
    // What each node holds for, or injects onto, each output, and what was on its input
    // links; a silent node has none of it (most of a large rack's nodes, most cuts).
    for up in shape.node_ids().filter(|&n| !view.silent(n)) {
        for &(up_port, far) in &ports[up.0 as usize] {
            let Some((node, port)) = far else {
                continue;
            };
            let held = view.toward(up, up_port).min(view.ni(up, up_port));
            let slot = &mut h[at(node, port)];
            *slot = (*slot).min(view.arrival(up, up_port, None, held));
            let slot = &mut h[at(up, up_port)];
            *slot = (*slot).min(view.on_link(up, up_port));
        }
    }
    // The NI answers what reaches it toward where it came from (a relaying NI may send
    // anywhere): what a node holds for its NI bounds what it sends back. Not a bound on
    // the input it came in on, which would make a cell wait on itself.
    let reacts = |node: NodeId, p: usize| {
        let f = &feeds[node.0 as usize];
        let mut goes = f.replies[p];
        if relays[node.0 as usize] {
            goes |= f.through[Port::Local.index()];
        }
        goes
    };
    for node in shape.node_ids().filter(|&n| !view.silent(n)) {
        for &(port, _) in &ports[node.0 as usize] {
            let t = view.to_ni(node, port);
            if t == ModelTime::NEVER {
                continue;
            }
            let goes = reacts(node, port.index());
            for &(q, far) in &ports[node.0 as usize] {
                if goes & (1 << q.index()) == 0 {
                    continue;
                }
                if let Some((peer, peer_port)) = far {
                    let slot = &mut h[at(peer, peer_port)];
                    *slot = (*slot).min(view.arrival(node, q, Some(Port::Local), t));
                }
            }
        }
    }
    // Bounds from the floor on need no search: every link is bounded a hop after the
    // floor anyway (below), and a bound that starts there only grows along a path. On a
    // rack whose nodes mostly promise the floor, searching from it visited every port.
    let floor = view.floor().unwrap_or(ModelTime::NEVER);
    let mut heap: BinaryHeap<Reverse<(ModelTime, u32, usize)>> = shape
        .node_ids()
        .flat_map(|n| ports[n.0 as usize].iter().map(move |&(p, _)| (n, p)))
        .filter(|&(n, p)| h[at(n, p)] < floor)
        .map(|(n, p)| Reverse((h[at(n, p)], n.0, p.index())))
        .collect();
    while let Some(Reverse((t, n, p))) = heap.pop() {
        let node = NodeId(n);
        if t > h[n as usize * NPORTS + p] {
            continue;
        }
        let mut goes = feeds[n as usize].through[p];
        if goes & local != 0 {
            goes |= reacts(node, p);
        }
        // The exact traversal from the input the bound came in on: with the shortest
        // one, a bound through a router fell 132 ns short at every torus hop, and a
        // cell that had come that way waited for the next cut.
        let from = Port::from_index(p).expect("a port index");
        for &(q, far) in &ports[n as usize] {
            if goes & (1 << q.index()) == 0 {
                continue;
            }
            let Some((peer, peer_port)) = far else {
                continue;
            };
            let t = view.arrival(node, q, Some(from), t);
            let slot = &mut h[at(peer, peer_port)];
            if t < *slot && t < floor {
                *slot = t;
                heap.push(Reverse((t, peer.0, peer_port.index())));
            }
        }
    }
    let mut out = Vec::new();
    for node in shape.node_ids().filter(|&n| !view.silent(n)) {
        for &(port, far) in &ports[node.0 as usize] {
            let Some((up, up_port)) = far else {
                continue;
            };
            // What the nodes left out may inject comes from the floor on, so no sooner
            // than a hop after it, whichever node it starts from (this also stands for
            // the bounds at or after the floor the search left alone).
            let t = h[at(node, port)].min(view.arrival(up, up_port, None, floor));
            out.push((node, port, t));
        }
    }
    out
}

/// A report the coordinator cannot take.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CutError {
    #[error("node {node} is not in the rack ({nodes} nodes)")]
    NoSuchNode { node: NodeId, nodes: u32 },
    #[error("node {node} reported cut {got}, but cut {want} is under way")]
    WrongEpoch { node: NodeId, got: u64, want: u64 },
    #[error("node {node} reported cut {epoch} twice")]
    Twice { node: NodeId, epoch: u64 },
    #[error("node {node} reported port {port:?}, which it has no link on")]
    NoSuchPort { node: NodeId, port: Port },
}

/// Horizons for the nodes of one cut.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Horizons {
    pub epoch: u64,
    /// Each node of the cut and its link ports' horizons (a node left out keeps the last
    /// it had: older horizons are still bounds).
    pub by_node: Vec<(NodeId, Vec<(Port, ModelTime)>)>,
    /// Whether anything was pending in the cut.
    pub pending: bool,
}

/// The coordinator's order to a node to begin a cut: its part is complete once the
/// marker of `epoch` came in on every port of `waits` (bit per port index), the ports
/// whose neighbours are in the cut (or, for a node that joins a cut under way, the
/// neighbours of the cut that sent it cells).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Begin {
    pub node: NodeId,
    pub epoch: u64,
    pub waits: u16,
}

/// What a part brings about: orders to begin (nodes that must join the cut under way, or
/// every node of the next cut) and, once the cut is complete, its horizons.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    pub begins: Vec<Begin>,
    pub horizons: Option<Horizons>,
}

/// Gathers the nodes' parts of a cut and computes every link's horizon from them. Sans-IO:
/// the driver says which nodes are connected ([`Coordinator::join`], [`Coordinator::leave`])
/// and which have work ([`Coordinator::wake`]), sends each [`Begin`] these return to its
/// node, hands the coordinator each node's part, and hands each node of a complete cut its
/// horizons. A cut starts only with every node connected, while something was pending in
/// the last one or a node woke it: an idle rack takes none.
///
/// **A cut is of the nodes that may matter.** A node whose part said it was quiet (it held
/// nothing, nothing was on its links, its programs promised nothing before the attach
/// floor) is left out of the next cuts; its part is taken to be the same with an empty
/// timeline, its NI promising the floor the driver gives ([`Coordinator::wake`]),
/// and relaying. It sends nothing until it begins a cut again, so it can hold only what it
/// was sent: it wakes the coordinator when a cell comes (the next cut has it), and a node
/// of the cut that sent it cells since its previous part says so (`NodeCut::sent`), so
/// that it joins the cut under way, waiting for the markers of those senders. With every
/// node in every cut, a cut of a 128-node rack cost about 10 ms of this 2-core machine
/// whatever moved, all of it the daemons' messages.
#[derive(Debug)]
pub struct Coordinator {
    shape: Shape,
    feeds: Vec<Feeds>,
    epoch: u64,
    /// Each node's latest part: of the cut under way for those that gave it, else of the
    /// last cut it was of (what a node left out stands in with).
    parts: Vec<Option<NodeCut>>,
    /// Whether each node gave its part of the cut under way.
    got: Vec<bool>,
    /// Nodes of the cut under way (every node of it, joined late or not).
    member: Vec<bool>,
    /// Nodes of the cut under way whose part is still to come.
    missing: usize,
    /// Whether the nodes that must join the cut under way were asked.
    joined_late: bool,
    cuts: u64,
    parts_taken: u64,
    /// Nodes whose driver can reach them.
    joined: Vec<bool>,
    /// Nodes of the next cut: all but those whose last part was quiet and that nothing
    /// woke since.
    active: Vec<bool>,
    /// Nodes that woke the coordinator since the last cut started: in the next one
    /// whatever their part of the cut under way said (they had nothing then).
    woke: Vec<bool>,
    /// The floor when the cut under way started (see [`Coordinator::wake`]): what its
    /// view takes the nodes left out to promise (a process that attached at one of them
    /// before that has woken the coordinator, unless its wake was still on its way).
    floor: Option<ModelTime>,
    /// A cut is wanted: something was pending, or a node woke the coordinator.
    wanted: bool,
}

impl Coordinator {
    pub fn new(shape: Shape) -> Result<Coordinator, RouteError> {
        let n = shape.nodes() as usize;
        Ok(Coordinator {
            feeds: routing::feeds(&shape)?,
            shape,
            epoch: 0,
            parts: vec![None; n],
            got: vec![false; n],
            member: vec![false; n],
            missing: 0,
            joined_late: false,
            cuts: 0,
            parts_taken: 0,
            joined: vec![false; n],
            active: vec![true; n],
            woke: vec![false; n],
            floor: None,
            wanted: false,
        })
    }

    /// Numbers its cuts from `after` + 1. A node ignores an order to begin a cut no later
    /// than the latest it began, so a coordinator that starts again (its daemon restarted)
    /// must number past every cut of its earlier run: from 1 again, no node took its cuts,
    /// and the rack took none for ever. A daemon passes the wall clock in microseconds: a
    /// run takes fewer cuts than that in the time between.
    pub fn numbering_after(mut self, after: u64) -> Coordinator {
        self.epoch = after;
        self
    }

    /// The ports of `node` whose neighbour is in `set`, as a bit mask.
    fn ports_to(&self, node: NodeId, set: &[bool]) -> u16 {
        let mut mask = 0;
        for p in Port::all() {
            if let Some((peer, _)) = neighbour(&self.shape, node, p) {
                if set[peer.0 as usize] {
                    mask |= 1 << p.index();
                }
            }
        }
        mask
    }

    /// Starts the cut wanted, if none is under way and every node is connected: the
    /// orders to begin it.
    fn start(&mut self, floor: Option<ModelTime>) -> Vec<Begin> {
        if !self.wanted || self.missing > 0 || self.joined.iter().any(|j| !j) {
            return Vec::new();
        }
        self.wanted = false;
        self.epoch += 1;
        self.got.iter_mut().for_each(|g| *g = false);
        self.member.clone_from(&self.active);
        self.floor = floor;
        self.woke.iter_mut().for_each(|w| *w = false);
        self.joined_late = false;
        let epoch = self.epoch;
        let begins: Vec<Begin> = self
            .shape
            .node_ids()
            .filter(|n| self.member[n.0 as usize])
            .map(|node| Begin {
                node,
                epoch,
                waits: self.ports_to(node, &self.member),
            })
            .collect();
        self.missing = begins.len();
        begins
    }

    /// `node` is connected (again). A cut under way may wait for a part it lost, so it is
    /// given up and taken again, with the node in it (it knows nothing of the cuts).
    /// `floor` as for [`Coordinator::wake`].
    pub fn join(&mut self, node: NodeId, floor: Option<ModelTime>) -> Vec<Begin> {
        let Some(j) = self.joined.get_mut(node.0 as usize) else {
            return Vec::new();
        };
        *j = true;
        self.active[node.0 as usize] = true;
        self.abort();
        self.start(floor)
    }

    /// `node` is gone: no cut completes without it until it is back.
    pub fn leave(&mut self, node: NodeId) {
        if let Some(j) = self.joined.get_mut(node.0 as usize) {
            *j = false;
        }
        self.abort();
    }

    /// `node` has work: it is in the next cut, which this starts if none is under way.
    /// `floor` is what a node left out of a cut started now promises: no process attaches
    /// there with an earlier start (a daemon's attach floor, the wall clock; `None`, the
    /// simulator's: nothing).
    pub fn wake(&mut self, node: NodeId, floor: Option<ModelTime>) -> Vec<Begin> {
        if let Some(a) = self.active.get_mut(node.0 as usize) {
            *a = true;
            self.woke[node.0 as usize] = true;
        }
        self.wanted = true;
        self.start(floor)
    }

    /// Gives up the cut under way: its parts are dropped and reports of it refused, and
    /// the next cut is wanted in its place.
    fn abort(&mut self) {
        if self.missing > 0 {
            self.missing = 0;
            self.wanted = true;
            // Its nodes are in the next one, whatever they said before (the parts some
            // gave stay their latest, as a node left out stands in with; a node left out
            // of the next cut said it was quiet in one that completed).
            for (a, m) in self.active.iter_mut().zip(&self.member) {
                *a |= *m;
            }
        }
    }

    /// Cuts completed.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// Parts taken in all (a cut of every node takes one per node).
    pub fn parts_taken(&self) -> u64 {
        self.parts_taken
    }

    /// Takes `node`'s part of the cut under way: the orders to begin it that the part
    /// brings about (nodes it sent cells to must join), and once every part is in, the
    /// horizons and the next cut (`floor` as for [`Coordinator::wake`]).
    pub fn report(
        &mut self,
        node: NodeId,
        cut: NodeCut,
        floor: Option<ModelTime>,
    ) -> Result<Reported, CutError> {
        let nodes = self.shape.nodes();
        let i = node.0 as usize;
        if i >= self.parts.len() {
            return Err(CutError::NoSuchNode { node, nodes });
        }
        if cut.epoch != self.epoch || self.missing == 0 || !self.member[i] {
            return Err(CutError::WrongEpoch {
                node,
                got: cut.epoch,
                want: self.epoch,
            });
        }
        if self.got[i] {
            return Err(CutError::Twice {
                node,
                epoch: cut.epoch,
            });
        }
        if let Some(p) = cut
            .ports
            .iter()
            .find(|p| neighbour(&self.shape, node, p.port).is_none())
        {
            return Err(CutError::NoSuchPort { node, port: p.port });
        }
        self.parts[i] = Some(cut);
        self.got[i] = true;
        self.parts_taken += 1;
        self.missing -= 1;
        let mut out = Reported::default();
        if self.missing > 0 {
            return Ok(out);
        }
        if !self.joined_late {
            // Every node of the cut is in: those it sent cells to that are not in it join
            // now, waiting for the markers of the nodes that sent them cells.
            self.joined_late = true;
            let epoch = self.epoch;
            let mut waits = vec![0u16; self.parts.len()];
            for (n, part) in self.parts.iter().enumerate() {
                let Some(part) = part.as_ref().filter(|_| self.got[n]) else {
                    continue;
                };
                for port in Port::all() {
                    if part.sent & (1 << port.index()) == 0 {
                        continue;
                    }
                    if let Some((peer, peer_port)) = neighbour(&self.shape, NodeId(n as u32), port)
                    {
                        if !self.member[peer.0 as usize] {
                            waits[peer.0 as usize] |= 1 << peer_port.index();
                        }
                    }
                }
            }
            for (n, w) in waits.into_iter().enumerate() {
                if w != 0 {
                    self.member[n] = true;
                    self.missing += 1;
                    out.begins.push(Begin {
                        node: NodeId(n as u32),
                        epoch,
                        waits: w,
                    });
                }
            }
            if self.missing > 0 {
                return Ok(out);
            }
        }
        self.cuts += 1;
        for (n, part) in self.parts.iter().enumerate() {
            if let Some(part) = part.as_ref().filter(|_| self.member[n]) {
                self.active[n] = !part.quiet || self.woke[n];
            }
        }
        let view = Parts {
            parts: &self.parts,
            member: &self.member,
            floor: self.floor,
            feeds: &self.feeds,
        };
        let mut all = vec![Vec::new(); nodes as usize];
        for (node, port, h) in horizons(&self.shape, &view) {
            all[node.0 as usize].push((port, h));
        }
        let by_node: Vec<(NodeId, Vec<(Port, ModelTime)>)> = all
            .into_iter()
            .enumerate()
            .filter(|(n, _)| self.member[*n])
            .map(|(n, h)| (NodeId(n as u32), h))
            .collect();
        let pending = self
            .parts
            .iter()
            .zip(&self.member)
            .any(|(p, &m)| m && p.as_ref().is_some_and(NodeCut::pending));
        // A node that woke the coordinator during the cut may have had nothing yet when
        // it recorded its part.
        self.wanted |= pending;
        out.horizons = Some(Horizons {
            epoch: self.epoch,
            by_node,
            pending,
        });
        out.begins.extend(self.start(floor));
        Ok(out)
    }
}

/// The view of a cut: each node's latest part, the cut's own for its nodes; a node left
/// out is quiet (its part held nothing, nothing was on its links), and stands in with its
/// outputs free, its NI promising the floor and relaying. The parts of a quiet node hold
/// nothing, so only what it promises and how its outputs run need standing in for.
struct Parts<'a> {
    parts: &'a [Option<NodeCut>],
    member: &'a [bool],
    floor: Option<ModelTime>,
    feeds: &'a [Feeds],
}

impl Parts<'_> {
    fn port(&self, node: NodeId, port: Port) -> Option<&PortCut> {
        self.parts[node.0 as usize]
            .as_ref()?
            .ports
            .iter()
            .find(|p| p.port == port)
    }

    fn quiet(&self, node: NodeId) -> bool {
        !self.member[node.0 as usize]
    }
}

impl CutView for Parts<'_> {
    fn ports(&self, node: NodeId) -> Vec<Port> {
        self.parts[node.0 as usize]
            .as_ref()
            .map_or_else(Vec::new, |c| c.ports.iter().map(|p| p.port).collect())
    }

    fn ni(&self, node: NodeId, port: Port) -> ModelTime {
        // Asked of members only: a quiet node is silent, and what its NI injects is bound
        // by the floor.
        self.port(node, port).map_or(ModelTime::NEVER, |p| p.ni)
    }

    fn floor(&self) -> Option<ModelTime> {
        self.floor
    }

    fn silent(&self, node: NodeId) -> bool {
        self.quiet(node)
    }

    fn relays(&self, node: NodeId) -> bool {
        self.quiet(node)
            || self.parts[node.0 as usize]
                .as_ref()
                .is_none_or(|c| c.relays)
    }

    fn toward(&self, node: NodeId, port: Port) -> ModelTime {
        self.port(node, port).map_or(ModelTime::NEVER, |p| p.toward)
    }

    fn arrival(&self, node: NodeId, port: Port, from: Option<Port>, ready: ModelTime) -> ModelTime {
        // A port a node did not report sends nothing. A quiet node's outputs are taken to
        // be free: their timelines only delay.
        let quiet = self.quiet(node);
        self.port(node, port).map_or(ModelTime::NEVER, |p| {
            if quiet {
                p.outlook.arrival_on(&Timeline::default(), from, ready)
            } else {
                p.outlook.arrival(from, ready)
            }
        })
    }

    fn on_link(&self, node: NodeId, port: Port) -> ModelTime {
        self.port(node, port)
            .map_or(ModelTime::NEVER, |p| p.on_link)
    }

    fn to_ni(&self, node: NodeId, port: Port) -> ModelTime {
        self.port(node, port).map_or(ModelTime::NEVER, |p| p.to_ni)
    }

    fn feeds(&self, node: NodeId) -> Feeds {
        self.feeds[node.0 as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(epoch: u64, busy: bool) -> NodeCut {
        NodeCut {
            epoch,
            busy,
            relays: false,
            ports: Vec::new(),
            quiet: !busy,
            sent: 0,
        }
    }

    fn epoch_of(begins: &[Begin]) -> Option<u64> {
        begins.first().map(|b| b.epoch)
    }

    /// Every node of `begins` reports `busy`; what the last report brought about.
    fn all_report(c: &mut Coordinator, begins: &[Begin], busy: bool) -> Reported {
        let (last, rest) = begins.split_last().expect("a cut");
        for b in rest {
            let r = c.report(b.node, part(b.epoch, busy), None).unwrap();
            assert_eq!(r, Reported::default());
        }
        c.report(last.node, part(last.epoch, busy), None).unwrap()
    }

    #[test]
    fn cuts_need_every_node_and_stop_when_nothing_is_pending() {
        let mut c = Coordinator::new("1x1x1".parse().unwrap()).unwrap();
        assert!(c.wake(NodeId(0), None).is_empty(), "no node joined");
        for i in 0..3 {
            assert!(c.join(NodeId(i), None).is_empty());
        }
        // The wake before was remembered: the last node to join starts the cut, of every
        // node (none has said it is quiet).
        let begins = c.join(NodeId(3), None);
        assert_eq!(begins.len(), 4);
        assert_eq!(epoch_of(&begins), Some(1));
        assert!(c.wake(NodeId(0), None).is_empty(), "one cut at a time");
        let r = all_report(&mut c, &begins, true);
        let h = r.horizons.expect("complete");
        assert_eq!((h.epoch, h.pending), (1, true));
        assert_eq!(
            epoch_of(&r.begins),
            Some(2),
            "pending: the next cut at once"
        );
        let r = all_report(&mut c, &r.begins, false);
        let h = r.horizons.expect("complete");
        assert!(!h.pending);
        assert!(r.begins.is_empty(), "an idle rack takes no cut");
        // Every node said it was quiet: a cut now is of the node that woke it alone.
        let begins = c.wake(NodeId(2), None);
        assert_eq!(
            begins.iter().map(|b| b.node).collect::<Vec<_>>(),
            [NodeId(2)]
        );
        assert_eq!(begins[0].waits, 0, "no neighbour in the cut");
        // A node that goes away gives the cut up; its parts are refused from then on.
        c.leave(NodeId(1));
        assert!(matches!(
            c.report(NodeId(2), part(3, true), None),
            Err(CutError::WrongEpoch { .. })
        ));
        let begins = c.join(NodeId(1), None);
        assert_eq!(epoch_of(&begins), Some(4), "back: the cut is taken again");
        let mut nodes: Vec<NodeId> = begins.iter().map(|b| b.node).collect();
        nodes.sort();
        assert_eq!(
            nodes,
            [NodeId(1), NodeId(2)],
            "the node back and the one that woke"
        );
        assert_eq!(
            c.report(NodeId(9), part(4, true), None),
            Err(CutError::NoSuchNode {
                node: NodeId(9),
                nodes: 4
            })
        );
        assert!(
            matches!(
                c.report(NodeId(0), part(4, true), None),
                Err(CutError::WrongEpoch { .. })
            ),
            "a node left out of the cut has no part in it"
        );
        assert_eq!(c.cuts(), 2);
    }

    /// A node of the cut that sent cells to one left out of it brings that one in: it
    /// joins the cut under way, waiting for the sender's marker, and the horizons go to
    /// both.
    #[test]
    fn a_node_sent_cells_joins_the_cut_under_way() {
        let shape: Shape = "1x1x1".parse().unwrap();
        let mut c = Coordinator::new(shape).unwrap();
        let mut begins = Vec::new();
        for i in 0..4 {
            begins = c.join(NodeId(i), None);
        }
        assert!(begins.is_empty(), "nothing woke it");
        let begins = c.wake(NodeId(0), None);
        let r = all_report(&mut c, &begins, false);
        assert!(r.horizons.is_some() && r.begins.is_empty());
        // Node 0 has work; it sends to node 1 (out of the cut) before its cut point.
        let begins = c.wake(NodeId(0), None);
        assert_eq!(begins.len(), 1);
        let to_1 = (0..NPORTS)
            .filter_map(Port::from_index)
            .find(|&p| neighbour(&shape, NodeId(0), p).is_some_and(|(n, _)| n == NodeId(1)))
            .unwrap();
        let mut p0 = part(begins[0].epoch, true);
        p0.sent = 1 << to_1.index();
        let r = c.report(NodeId(0), p0, None).unwrap();
        assert!(r.horizons.is_none(), "node 1 must join first");
        assert_eq!(r.begins.len(), 1);
        let join = r.begins[0];
        assert_eq!(join.node, NodeId(1));
        let (_, back) = neighbour(&shape, NodeId(0), to_1).unwrap();
        assert_eq!(
            join.waits,
            1 << back.index(),
            "it waits for node 0's marker"
        );
        let r = c.report(NodeId(1), part(join.epoch, true), None).unwrap();
        let h = r.horizons.expect("complete");
        let got: Vec<NodeId> = h.by_node.iter().map(|(n, _)| *n).collect();
        assert_eq!(got, [NodeId(0), NodeId(1)]);
        // Both were busy: both are in the next cut, which starts at once.
        let mut next: Vec<NodeId> = r.begins.iter().map(|b| b.node).collect();
        next.sort();
        assert_eq!(next, [NodeId(0), NodeId(1)]);
    }
}
