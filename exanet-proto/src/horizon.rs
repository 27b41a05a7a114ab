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
//! ([`crate::cut`]): each node records its part when it begins the cut and sends a marker
//! on every link, and records the cells that come in on each link until that link's
//! marker arrives: those were on the link at the cut. Links are FIFO, so every cell is
//! in exactly one node's part or on exactly one link, at a position no further along than
//! it really is. Horizons computed from it are lower bounds on what arrives after the
//! cut: a cell that moved on since only arrives later, with a later key, because every
//! hop adds its lookahead. A node applies a horizon no earlier than the one it has (both
//! are bounds), so the [`Coordinator`] can start the next cut while nodes still act on the
//! last.
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
        let traversal = match from {
            Some(Port::Torus(..)) => self.traversal_ps.max(self.from_torus_ps),
            _ => self.traversal_ps,
        };
        arrival(
            &self.busy,
            ready,
            traversal,
            self.shortest_ps,
            self.latency_ps,
        )
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
}

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
    let mut h = vec![ModelTime::NEVER; shape.nodes() as usize * NPORTS];
    for node in shape.node_ids() {
        for port in view.ports(node) {
            let Some((up, up_port)) = neighbour(shape, node, port) else {
                continue;
            };
            let held = view.toward(up, up_port).min(view.ni(up, up_port));
            h[at(node, port)] = view
                .on_link(node, port)
                .min(view.arrival(up, up_port, None, held));
        }
    }
    // The NI answers what reaches it toward where it came from (a relaying NI may send
    // anywhere): what a node holds for its NI bounds what it sends back. Not a bound on
    // the input it came in on, which would make a cell wait on itself.
    let reacts = |node: NodeId, p: usize| {
        let feeds = view.feeds(node);
        let mut goes = feeds.replies[p];
        if view.relays(node) {
            goes |= feeds.through[Port::Local.index()];
        }
        goes
    };
    for node in shape.node_ids() {
        for port in view.ports(node) {
            let t = view.to_ni(node, port);
            if t == ModelTime::NEVER {
                continue;
            }
            let goes = reacts(node, port.index());
            for q in view.ports(node) {
                if goes & (1 << q.index()) == 0 {
                    continue;
                }
                if let Some((peer, peer_port)) = neighbour(shape, node, q) {
                    let slot = &mut h[at(peer, peer_port)];
                    *slot = (*slot).min(view.arrival(node, q, Some(Port::Local), t));
                }
            }
        }
    }
    let mut heap: BinaryHeap<Reverse<(ModelTime, u32, usize)>> = shape
        .node_ids()
        .flat_map(|n| view.ports(n).into_iter().map(move |p| (n, p)))
        .filter(|&(n, p)| h[at(n, p)] < ModelTime::NEVER)
        .map(|(n, p)| Reverse((h[at(n, p)], n.0, p.index())))
        .collect();
    while let Some(Reverse((t, n, p))) = heap.pop() {
        let node = NodeId(n);
        if t > h[at(node, Port::from_index(p).expect("a port index"))] {
            continue;
        }
        let mut goes = view.feeds(node).through[p];
        if goes & local != 0 {
            goes |= reacts(node, p);
        }
        for q in view.ports(node) {
            if goes & (1 << q.index()) == 0 {
                continue;
            }
            let Some((peer, peer_port)) = neighbour(shape, node, q) else {
                continue;
            };
            // The exact traversal from the input the bound came in on: with the shortest
            // one, a bound through a router fell 132 ns short at every torus hop, and a
            // cell that had come that way waited for the next cut.
            let from = Port::from_index(p).expect("a port index");
            let t = view.arrival(node, q, Some(from), t);
            let slot = &mut h[at(peer, peer_port)];
            if t < *slot {
                *slot = t;
                heap.push(Reverse((t, peer.0, peer_port.index())));
            }
        }
    }
    let mut out = Vec::new();
    for node in shape.node_ids() {
        for port in view.ports(node) {
            if neighbour(shape, node, port).is_some() {
                out.push((node, port, h[at(node, port)]));
            }
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

/// Horizons for the nodes, from one cut.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Horizons {
    pub epoch: u64,
    /// By node: each link port's horizon.
    pub by_node: Vec<Vec<(Port, ModelTime)>>,
    /// Whether anything was pending in the cut.
    pub pending: bool,
    /// The next cut, started at once because something was pending: the epoch every node
    /// must begin.
    pub next: Option<u64>,
}

/// Gathers the nodes' parts of a cut and computes every link's horizon from them. Sans-IO:
/// the driver says which nodes are connected ([`Coordinator::join`], [`Coordinator::leave`])
/// and which have work ([`Coordinator::wake`]), tells every node to begin each epoch these
/// return, hands it each node's part, and hands each node its horizons. A cut starts only
/// with every node connected (it needs every part), while something was pending in the
/// last one or a node woke it: an idle rack takes none.
#[derive(Debug)]
pub struct Coordinator {
    shape: Shape,
    feeds: Vec<Feeds>,
    epoch: u64,
    parts: Vec<Option<NodeCut>>,
    missing: usize,
    cuts: u64,
    /// Nodes whose driver can reach them.
    joined: Vec<bool>,
    /// A cut is wanted: something was pending, or a node woke the coordinator.
    wanted: bool,
}

impl Coordinator {
    pub fn new(shape: Shape) -> Result<Coordinator, RouteError> {
        Ok(Coordinator {
            feeds: routing::feeds(&shape)?,
            shape,
            epoch: 0,
            parts: vec![None; shape.nodes() as usize],
            missing: 0,
            cuts: 0,
            joined: vec![false; shape.nodes() as usize],
            wanted: false,
        })
    }

    /// Starts the cut wanted, if none is under way and every node is connected: the epoch
    /// every node must begin.
    fn start(&mut self) -> Option<u64> {
        if !self.wanted || self.missing > 0 || self.joined.iter().any(|j| !j) {
            return None;
        }
        self.wanted = false;
        self.epoch += 1;
        self.parts.iter_mut().for_each(|p| *p = None);
        self.missing = self.parts.len();
        Some(self.epoch)
    }

    /// `node` is connected (again). A cut under way may wait for a part it lost, so it is
    /// given up and taken again.
    pub fn join(&mut self, node: NodeId) -> Option<u64> {
        *self.joined.get_mut(node.0 as usize)? = true;
        self.abort();
        self.start()
    }

    /// `node` is gone: no cut completes without it until it is back.
    pub fn leave(&mut self, node: NodeId) {
        if let Some(j) = self.joined.get_mut(node.0 as usize) {
            *j = false;
        }
        self.abort();
    }

    /// A node has work: the epoch of the cut this starts, if any.
    pub fn wake(&mut self) -> Option<u64> {
        self.wanted = true;
        self.start()
    }

    /// Gives up the cut under way: its parts are dropped and reports of it refused, and
    /// the next cut is wanted in its place.
    fn abort(&mut self) {
        if self.missing > 0 {
            self.missing = 0;
            self.wanted = true;
            self.parts.iter_mut().for_each(|p| *p = None);
        }
    }

    /// Cuts completed.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// Takes `node`'s part of the cut under way; once every node's is in, the horizons.
    pub fn report(&mut self, node: NodeId, cut: NodeCut) -> Result<Option<Horizons>, CutError> {
        let nodes = self.shape.nodes();
        let slot = self
            .parts
            .get_mut(node.0 as usize)
            .ok_or(CutError::NoSuchNode { node, nodes })?;
        if cut.epoch != self.epoch || self.missing == 0 {
            return Err(CutError::WrongEpoch {
                node,
                got: cut.epoch,
                want: self.epoch,
            });
        }
        if slot.is_some() {
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
        *slot = Some(cut);
        self.missing -= 1;
        if self.missing > 0 {
            return Ok(None);
        }
        self.cuts += 1;
        let view = Parts {
            parts: &self.parts,
            feeds: &self.feeds,
        };
        let mut by_node = vec![Vec::new(); nodes as usize];
        for (node, port, h) in horizons(&self.shape, &view) {
            by_node[node.0 as usize].push((port, h));
        }
        let epoch = self.epoch;
        let pending = self.parts.iter().flatten().any(NodeCut::pending);
        // A node that woke the coordinator during the cut may have had nothing yet when
        // it recorded its part.
        self.wanted |= pending;
        let next = self.start();
        Ok(Some(Horizons {
            epoch,
            by_node,
            pending,
            next,
        }))
    }
}

/// The view of a cut every node has reported its part of.
struct Parts<'a> {
    parts: &'a [Option<NodeCut>],
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
}

impl CutView for Parts<'_> {
    fn ports(&self, node: NodeId) -> Vec<Port> {
        self.parts[node.0 as usize]
            .as_ref()
            .map_or_else(Vec::new, |c| c.ports.iter().map(|p| p.port).collect())
    }

    fn ni(&self, node: NodeId, port: Port) -> ModelTime {
        self.port(node, port).map_or(ModelTime::NEVER, |p| p.ni)
    }

    fn relays(&self, node: NodeId) -> bool {
        self.parts[node.0 as usize]
            .as_ref()
            .is_none_or(|c| c.relays)
    }

    fn toward(&self, node: NodeId, port: Port) -> ModelTime {
        self.port(node, port).map_or(ModelTime::NEVER, |p| p.toward)
    }

    fn arrival(&self, node: NodeId, port: Port, from: Option<Port>, ready: ModelTime) -> ModelTime {
        // A port a node did not report sends nothing.
        self.port(node, port)
            .map_or(ModelTime::NEVER, |p| p.outlook.arrival(from, ready))
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
        }
    }

    /// Every node reports `busy`; the last report's horizons.
    fn all_report(c: &mut Coordinator, epoch: u64, busy: bool) -> Horizons {
        let n = c.shape.nodes();
        for i in 0..n - 1 {
            assert_eq!(c.report(NodeId(i), part(epoch, busy)), Ok(None));
        }
        c.report(NodeId(n - 1), part(epoch, busy)).unwrap().unwrap()
    }

    #[test]
    fn cuts_need_every_node_and_stop_when_nothing_is_pending() {
        let mut c = Coordinator::new("1x1x1".parse().unwrap()).unwrap();
        assert_eq!(c.wake(), None, "no node joined");
        for i in 0..3 {
            assert_eq!(c.join(NodeId(i)), None);
        }
        // The wake before was remembered: the last node to join starts the cut.
        assert_eq!(c.join(NodeId(3)), Some(1));
        assert_eq!(c.wake(), None, "one cut at a time");
        let h = all_report(&mut c, 1, true);
        assert_eq!((h.epoch, h.pending, h.next), (1, true, Some(2)));
        let h = all_report(&mut c, 2, false);
        assert_eq!(
            (h.pending, h.next),
            (false, None),
            "an idle rack takes no cut"
        );
        assert_eq!(c.wake(), Some(3));
        // A node that goes away gives the cut up; its parts are refused from then on.
        assert_eq!(c.report(NodeId(0), part(3, true)), Ok(None));
        c.leave(NodeId(2));
        assert!(matches!(
            c.report(NodeId(1), part(3, true)),
            Err(CutError::WrongEpoch { .. })
        ));
        assert_eq!(c.join(NodeId(2)), Some(4), "back: the cut is taken again");
        assert_eq!(
            c.report(NodeId(9), part(4, true)),
            Err(CutError::NoSuchNode {
                node: NodeId(9),
                nodes: 4
            })
        );
        assert_eq!(c.cuts(), 2);
    }
}
