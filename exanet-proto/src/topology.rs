//! Ports of a node's switch and the links of a rack (SPEC §1, §3).
//!
//! Every node has a local port (its NI) and one port per sibling FPGA on its QFDB (the
//! all-to-all 16 Gb/s links). F1 additionally has up to six torus ports, one per dimension
//! and direction (10 Gb/s). A ring of size 2 is a single link, which both ends reach through
//! their `+` port (routing sends ties the `+` way); a ring of size 1 has no link.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::shape::{Coord, NodeId, Shape};

/// Number of port slots of a switch (see [`Port::index`]).
pub const NPORTS: usize = 11;

pub const INTRA_QFDB_GBPS: u32 = 16;
pub const TORUS_GBPS: u32 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dir {
    Plus,
    Minus,
}

/// A port of a node's switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Port {
    /// The node's own network interface.
    Local,
    /// The link to FPGA `n` (1..=4) of the same QFDB.
    Qfdb(u8),
    /// A torus link of F1: dimension 0 = X, 1 = Y, 2 = Z.
    Torus(u8, Dir),
}

impl Port {
    /// A dense index 0..NPORTS: Local 0, Qfdb(f) f, Torus(d, +) 5+2d, Torus(d, -) 6+2d.
    pub fn index(self) -> usize {
        match self {
            Port::Local => 0,
            Port::Qfdb(f) => f as usize,
            Port::Torus(d, Dir::Plus) => 5 + 2 * d as usize,
            Port::Torus(d, Dir::Minus) => 6 + 2 * d as usize,
        }
    }

    pub fn from_index(i: usize) -> Option<Port> {
        match i {
            0 => Some(Port::Local),
            1..=4 => Some(Port::Qfdb(i as u8)),
            5..=10 => {
                let d = ((i - 5) / 2) as u8;
                Some(Port::Torus(
                    d,
                    if (i - 5) % 2 == 0 {
                        Dir::Plus
                    } else {
                        Dir::Minus
                    },
                ))
            }
            _ => None,
        }
    }

    pub fn all() -> impl Iterator<Item = Port> {
        (0..NPORTS).filter_map(Port::from_index)
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Local => write!(f, "ni"),
            Port::Qfdb(n) => write!(f, "f{n}"),
            Port::Torus(d, dir) => write!(
                f,
                "{}{}",
                ["x", "y", "z"][(*d as usize).min(2)],
                if *dir == Dir::Plus { "+" } else { "-" }
            ),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkKind {
    /// All-to-all link between two FPGAs of one QFDB, 16 Gb/s.
    IntraQfdb,
    /// Torus link between the F1s of two QFDBs along X (slots of a blade), 10 Gb/s.
    TorusX,
    /// Along Y (blades of a quad-blade group), 10 Gb/s.
    TorusY,
    /// Along Z (groups), 10 Gb/s.
    TorusZ,
}

impl LinkKind {
    pub fn gbps(self) -> u32 {
        match self {
            LinkKind::IntraQfdb => INTRA_QFDB_GBPS,
            _ => TORUS_GBPS,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            LinkKind::IntraQfdb => "qfdb",
            LinkKind::TorusX => "torus_x",
            LinkKind::TorusY => "torus_y",
            LinkKind::TorusZ => "torus_z",
        }
    }
}

/// One bidirectional link: `a` reaches `b` through `a_port`, `b` reaches `a` through `b_port`.
/// `a < b` always, so a link has one canonical form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Link {
    pub a: NodeId,
    pub a_port: Port,
    pub b: NodeId,
    pub b_port: Port,
    pub kind: LinkKind,
}

impl Link {
    /// The far end and its port, seen from `n`; `None` if `n` is not an end of this link.
    pub fn other(&self, n: NodeId) -> Option<(NodeId, Port)> {
        if n == self.a {
            Some((self.b, self.b_port))
        } else if n == self.b {
            Some((self.a, self.a_port))
        } else {
            None
        }
    }

    pub fn port_of(&self, n: NodeId) -> Option<Port> {
        if n == self.a {
            Some(self.a_port)
        } else if n == self.b {
            Some(self.b_port)
        } else {
            None
        }
    }
}

/// The neighbour reached through `port` of node `id`, with the port it arrives on.
pub fn neighbour(shape: &Shape, id: NodeId, port: Port) -> Option<(NodeId, Port)> {
    let c = shape.coord(id).ok()?;
    match port {
        Port::Local => None,
        Port::Qfdb(f) => {
            if u32::from(f) == c.fpga || !(1..=4).contains(&f) {
                return None;
            }
            let n = shape.id(Coord {
                fpga: u32::from(f),
                ..c
            })?;
            Some((n, Port::Qfdb(c.fpga as u8)))
        }
        Port::Torus(d, dir) => {
            let du = d as usize;
            if c.fpga != 1 || du > 2 {
                return None;
            }
            let k = shape.ring(du);
            if k == 1 || (k == 2 && dir == Dir::Minus) {
                return None;
            }
            let pos = c.dim(du);
            let next = match dir {
                Dir::Plus => (pos + 1) % k,
                Dir::Minus => (pos + k - 1) % k,
            };
            let mut nc = c;
            match du {
                0 => nc.x = next,
                1 => nc.y = next,
                _ => nc.z = next,
            }
            // In a ring of two both ends use their + port for the one link.
            let back = if k == 2 {
                Dir::Plus
            } else if dir == Dir::Plus {
                Dir::Minus
            } else {
                Dir::Plus
            };
            Some((shape.id(nc)?, Port::Torus(d, back)))
        }
    }
}

/// The port of `from` whose link leads to `to`, if they are neighbours.
pub fn port_to(shape: &Shape, from: NodeId, to: NodeId) -> Option<Port> {
    Port::all().find(|p| neighbour(shape, from, *p).is_some_and(|(n, _)| n == to))
}

/// Every link of a rack, each once, ordered by (a, a_port).
pub fn links(shape: &Shape) -> Vec<Link> {
    let mut out = Vec::new();
    for id in shape.node_ids() {
        for port in Port::all() {
            if let Some((peer, peer_port)) = neighbour(shape, id, port) {
                if id < peer {
                    out.push(Link {
                        a: id,
                        a_port: port,
                        b: peer,
                        b_port: peer_port,
                        kind: match port {
                            Port::Torus(0, _) => LinkKind::TorusX,
                            Port::Torus(1, _) => LinkKind::TorusY,
                            Port::Torus(_, _) => LinkKind::TorusZ,
                            _ => LinkKind::IntraQfdb,
                        },
                    });
                }
            }
        }
    }
    out
}

/// The links of one node.
pub fn node_links(shape: &Shape, id: NodeId) -> Vec<Link> {
    links(shape)
        .into_iter()
        .filter(|l| l.a == id || l.b == id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_to_finds_each_link_from_both_ends_and_nothing_else() {
        let shape: Shape = "2x2x1".parse().unwrap();
        for l in links(&shape) {
            assert_eq!(port_to(&shape, l.a, l.b), Some(l.a_port));
            assert_eq!(port_to(&shape, l.b, l.a), Some(l.b_port));
        }
        assert_eq!(port_to(&shape, NodeId(0), NodeId(0)), None);
        // F2 of the first QFDB and F3 of the second are not neighbours.
        assert_eq!(port_to(&shape, NodeId(1), NodeId(6)), None);
    }

    #[test]
    fn port_index_round_trips() {
        for i in 0..NPORTS {
            assert_eq!(Port::from_index(i).unwrap().index(), i);
        }
        assert_eq!(Port::from_index(NPORTS), None);
    }

    #[test]
    fn prototype_link_census() {
        let s = Shape::PROTOTYPE;
        let l = links(&s);
        let count = |k| l.iter().filter(|x| x.kind == k).count();
        // 32 QFDBs x 6 all-to-all links.
        assert_eq!(count(LinkKind::IntraQfdb), 32 * 6);
        // X and Y rings of 4: 4 links per ring; 8 rings each. Z ring of 2: one link per pair.
        assert_eq!(count(LinkKind::TorusX), 8 * 4);
        assert_eq!(count(LinkKind::TorusY), 8 * 4);
        assert_eq!(count(LinkKind::TorusZ), 16);
        // Every link is seen the same from both ends.
        for k in &l {
            assert_eq!(neighbour(&s, k.a, k.a_port), Some((k.b, k.b_port)));
            assert_eq!(neighbour(&s, k.b, k.b_port), Some((k.a, k.a_port)));
        }
    }

    #[test]
    fn rings_of_one_and_two() {
        let s: Shape = "1x2x1".parse().unwrap();
        let l = links(&s);
        assert_eq!(l.iter().filter(|x| x.kind == LinkKind::TorusX).count(), 0);
        assert_eq!(l.iter().filter(|x| x.kind == LinkKind::TorusY).count(), 1);
        let s: Shape = "1x1x1".parse().unwrap();
        assert_eq!(links(&s).len(), 6);
    }
}
