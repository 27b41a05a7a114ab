//! Single-path, dimension-order routing with a dateline on every torus ring (SPEC §3).
//!
//! Inside a QFDB a cell takes the direct link to the target FPGA. Between QFDBs it goes
//! source F -> source F1 -> torus (X, then Y, then Z, the shorter way round each ring, ties
//! to `+`) -> destination F1 -> destination F.
//!
//! # Why this cannot deadlock
//! A deadlock needs a cycle of buffers each waiting for the next. Give every (link direction,
//! virtual channel) a rank:
//!
//! | rank | channel |
//! |---|---|
//! | 0 | F2..F4 -> F1 of the same QFDB |
//! | 1 + 2d + v | torus dimension d (X=0, Y=1, Z=2), VC v |
//! | 7 | F1 -> F2..F4 of the same QFDB |
//! | 8 | F2..F4 -> F2..F4 of the same QFDB |
//!
//! Every route uses channels of strictly increasing rank: it climbs to F1 (0), crosses the
//! dimensions in order X, Y, Z (1..6), descends from F1 (7); a direct hop between two
//! non-F1 FPGAs (8) ends at its destination. Within one ring a cell starts on VC0 and moves
//! to VC1 when it crosses the ring's dateline (the wrap-around link between positions k-1
//! and 0). The shorter way round a ring is at most k/2 hops, so a cell crosses the dateline
//! at most once and never uses VC0 after VC1; the VC0 channels of a ring then form a line
//! (the dateline link carries no VC0 traffic), as do the VC1 channels. With the ranks
//! ordered by dimension and VC within dimension, a cell only waits on a channel of a higher
//! rank than the one it holds, so no cycle of waits exists. Ejection into the destination
//! NI is the last step and depends on nothing in the fabric, so a receiver that stops
//! draining causes backpressure, not deadlock. `tests/rack_sim.rs` checks this by
//! saturating whole racks.
//!
//! # Two classes
//! Answers (ACK and NACK cells) travel in a class of virtual channels of their own, VC2
//! and VC3, laid out exactly as VC0 and VC1 are for everything else: the same route, the
//! same dateline. The argument above holds within each class, and no buffer of one class
//! waits on the other: an NI takes in a cell whatever answer it produces (its answers
//! queue in the NI), and answers are delivered like any cell. So an answer never queues
//! behind data on its way back, and a loaded link cannot starve it (the switch also
//! serves answers first; they are small and at most one per message or block). Deliveries
//! to the node's own NI share one channel: the NI consumes them as they come.

use thiserror::Error;

use crate::cell::CellType;
use crate::shape::{Coord, NodeId, Shape};
use crate::topology::{Dir, Port, NPORTS};

/// A virtual channel on a link: bit 0 is the dateline VC (only torus links use it), bit 1
/// the class (set for answers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vc(pub u8);

pub const NVCS: usize = 4;

impl Vc {
    pub const ZERO: Vc = Vc(0);
    pub const ONE: Vc = Vc(1);
    const ANSWER: u8 = 2;

    /// The channel a cell of `kind` is injected on: VC0 of its class.
    pub fn injection(kind: CellType) -> Vc {
        if matches!(kind, CellType::Ack | CellType::Nack) {
            Vc(Vc::ANSWER)
        } else {
            Vc::ZERO
        }
    }

    /// Whether this is a channel of the answer class.
    pub const fn is_answer(self) -> bool {
        self.0 & Vc::ANSWER != 0
    }

    /// Whether this is the channel a ring uses after its dateline.
    pub fn past_dateline(self) -> bool {
        self.0 & 1 != 0
    }

    fn class(self) -> u8 {
        self.0 & Vc::ANSWER
    }
}

/// Where a cell goes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hop {
    pub port: Port,
    pub vc: Vc,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RouteError {
    #[error("destination node {dst} is not in the {shape} rack")]
    NoSuchNode { dst: NodeId, shape: Shape },
    #[error("node {here} is not in the {shape} rack")]
    NotHere { here: NodeId, shape: Shape },
}

/// The next hop for a cell at `here` bound for `dst`, which arrived on `(in_port, in_vc)`
/// (`Port::Local` and [`Vc::injection`], which gives the class, for a cell the node
/// injects itself).
pub fn route(
    shape: &Shape,
    here: NodeId,
    dst: NodeId,
    in_port: Port,
    in_vc: Vc,
) -> Result<Hop, RouteError> {
    let h = shape.coord(here).map_err(|_| RouteError::NotHere {
        here,
        shape: *shape,
    })?;
    let d = shape
        .coord(dst)
        .map_err(|_| RouteError::NoSuchNode { dst, shape: *shape })?;
    if here == dst {
        return Ok(Hop {
            port: Port::Local,
            vc: Vc::ZERO,
        });
    }
    let class = in_vc.class();
    if h.same_qfdb(&d) {
        return Ok(Hop {
            port: Port::Qfdb(d.fpga as u8),
            vc: Vc(class),
        });
    }
    if h.fpga != 1 {
        return Ok(Hop {
            port: Port::Qfdb(1),
            vc: Vc(class),
        });
    }
    Ok(torus_hop(shape, &h, &d, in_port, in_vc))
}

/// The hop along the first dimension in which `h` and `d` (on different QFDBs) differ.
fn torus_hop(shape: &Shape, h: &Coord, d: &Coord, in_port: Port, in_vc: Vc) -> Hop {
    let dim = (0..3)
        .find(|&i| h.dim(i) != d.dim(i))
        .expect("different QFDBs differ in some dimension");
    let k = shape.ring(dim);
    let (from, to) = (h.dim(dim), d.dim(dim));
    let ahead = (to + k - from) % k;
    let dir = if ahead <= k - ahead {
        Dir::Plus
    } else {
        Dir::Minus
    };
    // A ring of two is one link, reached through the + port from both ends.
    let dir = if k == 2 { Dir::Plus } else { dir };
    let crosses_dateline = match dir {
        Dir::Plus => from == k - 1,
        Dir::Minus => from == 0,
    };
    let continuing = matches!(in_port, Port::Torus(pd, _) if pd as usize == dim);
    let vc = if crosses_dateline || (continuing && in_vc.past_dateline()) {
        Vc(in_vc.class() | 1)
    } else {
        Vc(in_vc.class())
    };
    Hop {
        port: Port::Torus(dim as u8, dir),
        vc,
    }
}

/// The whole path from `src` to `dst` as the nodes visited (both ends included) and the
/// hop taken out of each node but the last.
pub fn path(shape: &Shape, src: NodeId, dst: NodeId) -> Result<Vec<(NodeId, Hop)>, RouteError> {
    path_from(shape, src, dst, Vc::ZERO)
}

/// [`path`] for a cell injected on `vc` (which gives its class).
fn path_from(
    shape: &Shape,
    src: NodeId,
    dst: NodeId,
    vc: Vc,
) -> Result<Vec<(NodeId, Hop)>, RouteError> {
    let mut out = Vec::new();
    let (mut here, mut in_port, mut in_vc) = (src, Port::Local, vc);
    // Longest dimension-order path: 2 intra hops plus half of each ring.
    let limit = 4 + (shape.x() + shape.y() + shape.z()) as usize;
    loop {
        let hop = route(shape, here, dst, in_port, in_vc)?;
        out.push((here, hop));
        if hop.port == Port::Local {
            return Ok(out);
        }
        let (next, arrive) = crate::topology::neighbour(shape, here, hop.port)
            .expect("routing only uses ports that have links");
        here = next;
        in_port = arrive;
        in_vc = hop.vc;
        assert!(out.len() <= limit, "routing loop from {src} to {dst}");
    }
}

/// Where what comes in on each port of a node can make cells leave, over every route of
/// the rack (bit `o` of a mask is port index `o`; the NI is port 0 both ways: what it
/// injects, what it takes in). Modeled ordering ([`crate::order`]) needs it: a cell waits
/// only for the inputs that can send cells to its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feeds {
    /// By input: the outputs its cells take, passing through or delivered to the NI.
    pub through: [u16; NPORTS],
    /// By input: the outputs the NI's replies to its cells take, back toward their
    /// sources (answers, the blocks an answer lets go, the data of a read it serves).
    pub replies: [u16; NPORTS],
}

const ALL_PORTS: u16 = (1 << NPORTS) - 1;

/// Every port feeding every port: what a switch assumes when it knows no routes.
pub const FEEDS_ALL: Feeds = Feeds {
    through: [ALL_PORTS; NPORTS],
    replies: [ALL_PORTS; NPORTS],
};

/// [`Feeds`] of every node of the rack, from every route between two of its nodes
/// (answers take the data routes).
pub fn feeds(shape: &Shape) -> Result<Vec<Feeds>, RouteError> {
    let none = Feeds {
        through: [0; NPORTS],
        replies: [0; NPORTS],
    };
    let mut out = vec![none; shape.nodes() as usize];
    for src in shape.node_ids() {
        for dst in shape.node_ids() {
            let mut in_port = Port::Local;
            for (here, hop) in path(shape, src, dst)? {
                out[here.0 as usize].through[in_port.index()] |= 1 << hop.port.index();
                if let Some((_, arrive)) = crate::topology::neighbour(shape, here, hop.port) {
                    in_port = arrive;
                }
            }
            let back = route(shape, dst, src, Port::Local, Vc::ZERO)?.port;
            out[dst.0 as usize].replies[in_port.index()] |= 1 << back.index();
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feeds_follow_the_routes() {
        let s: Shape = "2x1x1".parse().unwrap();
        let f = feeds(&s).unwrap();
        let bit = |p: Port| 1u16 << p.index();
        let f2 = s.parse_node("M1QAF2").unwrap();
        let f1 = s.parse_node("M1QAF1").unwrap();
        let at_f2 = f[f2.0 as usize].through;
        // F2 takes in what comes from F1 and F3, and sends nothing on that it got from
        // another FPGA: routes inside a QFDB are direct, and only F1 has the torus.
        assert_eq!(at_f2[Port::Qfdb(1).index()], bit(Port::Local));
        assert_eq!(at_f2[Port::Qfdb(3).index()], bit(Port::Local));
        assert_eq!(
            at_f2[Port::Local.index()],
            bit(Port::Local) | bit(Port::Qfdb(1)) | bit(Port::Qfdb(3)) | bit(Port::Qfdb(4))
        );
        // F1 passes the other QFDB's cells on to its FPGAs, and theirs to the torus.
        let x = Port::Torus(0, Dir::Plus);
        let at_f1 = f[f1.0 as usize].through;
        assert_eq!(
            at_f1[x.index()],
            bit(Port::Local) | bit(Port::Qfdb(2)) | bit(Port::Qfdb(3)) | bit(Port::Qfdb(4))
        );
        assert_eq!(at_f1[Port::Qfdb(2).index()], bit(Port::Local) | bit(x));
        // Replies go back the way their cells came: F2 answers F3 on F3's link, and the
        // other QFDB by F1.
        let replies = f[f2.0 as usize].replies;
        assert_eq!(replies[Port::Qfdb(3).index()], bit(Port::Qfdb(3)));
        assert_eq!(replies[Port::Qfdb(1).index()], bit(Port::Qfdb(1)));
        assert!(feeds(&Shape::PROTOTYPE).unwrap().iter().all(|n| {
            // Nothing leaves by the port it came in on.
            (0..NPORTS).all(|i| i == 0 || n.through[i] & (1 << i) == 0)
        }));
    }

    #[test]
    fn answers_take_the_data_route_in_their_own_class() {
        let s = Shape::PROTOTYPE;
        let answer = Vc::injection(CellType::Ack);
        assert!(answer.is_answer() && !Vc::injection(CellType::Write).is_answer());
        for src in (0..s.nodes()).step_by(3) {
            for dst in (0..s.nodes()).step_by(5) {
                let (src, dst) = (NodeId(src), NodeId(dst));
                let data = path(&s, src, dst).unwrap();
                let ans = path_from(&s, src, dst, answer).unwrap();
                assert_eq!(data.len(), ans.len());
                for ((n, d), (m, a)) in data.iter().zip(&ans) {
                    assert_eq!((n, d.port), (m, a.port));
                    if d.port == Port::Local {
                        assert_eq!(a.vc, Vc::ZERO, "deliveries share one channel");
                    } else {
                        assert_eq!(a.vc, Vc(d.vc.0 | 2), "{src} -> {dst} at {n}");
                    }
                }
            }
        }
    }

    #[test]
    fn ring_of_four_goes_the_short_way_and_ties_plus() {
        let s = Shape::PROTOTYPE;
        let a = s.parse_node("M1QAF1").unwrap();
        let c = s.parse_node("M1QCF1").unwrap();
        let d = s.parse_node("M1QDF1").unwrap();
        // A -> D is one hop the minus way, across the dateline (0 -> 3).
        let p = path(&s, a, d).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].1.port, Port::Torus(0, Dir::Minus));
        assert_eq!(p[0].1.vc, Vc::ONE);
        // A -> C is a tie of two hops: plus.
        let p = path(&s, a, c).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].1.port, Port::Torus(0, Dir::Plus));
        assert_eq!(p[0].1.vc, Vc::ZERO);
    }

    #[test]
    fn dateline_switches_to_vc1_and_stays() {
        let s: Shape = "5x1x1".parse().unwrap();
        // x=3 -> x=0 goes + (ahead 2 < 3): 3->4 on VC0, 4->0 crosses on VC1.
        let src = s
            .id(Coord {
                x: 3,
                y: 0,
                z: 0,
                fpga: 1,
            })
            .unwrap();
        let dst = s
            .id(Coord {
                x: 0,
                y: 0,
                z: 0,
                fpga: 1,
            })
            .unwrap();
        let vcs: Vec<u8> = path(&s, src, dst)
            .unwrap()
            .iter()
            .map(|(_, h)| h.vc.0)
            .collect();
        assert_eq!(vcs, vec![0, 1, 0]);
        // x=4 -> x=1: crosses first, then continues on VC1.
        let src = s
            .id(Coord {
                x: 4,
                y: 0,
                z: 0,
                fpga: 1,
            })
            .unwrap();
        let dst = s
            .id(Coord {
                x: 1,
                y: 0,
                z: 0,
                fpga: 1,
            })
            .unwrap();
        let vcs: Vec<u8> = path(&s, src, dst)
            .unwrap()
            .iter()
            .map(|(_, h)| h.vc.0)
            .collect();
        assert_eq!(vcs, vec![1, 1, 0]);
    }

    #[test]
    fn unknown_destination_is_an_error() {
        let s: Shape = "1x1x1".parse().unwrap();
        assert!(matches!(
            route(&s, NodeId(0), NodeId(4), Port::Local, Vc::ZERO),
            Err(RouteError::NoSuchNode { .. })
        ));
    }
}
