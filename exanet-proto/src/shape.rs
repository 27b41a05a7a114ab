//! Rack shape, node coordinates, node ids and node names.
//!
//! A rack is an X x Y x Z torus of QFDBs, four nodes (FPGAs F1..F4) per QFDB.
//! Names follow the ExaNeSt report: `M<blade>Q<slot>F<fpga>` with
//! blade = z*Y + y + 1 and slot letter = 'A' + x (SPEC §1). Node ids follow
//! SPEC §2: id = ((z*Y + y)*X + x)*4 + (fpga - 1).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// FPGAs per QFDB board.
pub const FPGAS_PER_QFDB: u32 = 4;
/// Node ids are 22 bits wide in the GVAS (SPEC §2).
pub const NODE_ID_BITS: u32 = 22;
/// Slots are named by a single letter, so a blade holds at most 26 QFDBs.
pub const MAX_X: u32 = 26;

/// A node id: the 22-bit node field of a GVAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The position of a node: QFDB coordinates in the torus plus the FPGA (1..=4) on the board.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Coord {
    pub x: u32,
    pub y: u32,
    pub z: u32,
    pub fpga: u32,
}

impl Coord {
    /// The torus coordinate along dimension `d` (0 = X, 1 = Y, 2 = Z).
    pub fn dim(&self, d: usize) -> u32 {
        [self.x, self.y, self.z][d]
    }

    /// True when both nodes sit on the same QFDB.
    pub fn same_qfdb(&self, other: &Coord) -> bool {
        (self.x, self.y, self.z) == (other.x, other.y, other.z)
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ShapeError {
    #[error("bad rack shape {0:?}: expected XxYxZ, e.g. 4x4x2")]
    Syntax(String),
    #[error("bad rack shape {shape:?}: every dimension must be at least 1")]
    ZeroDimension { shape: String },
    #[error("bad rack shape {shape:?}: X is at most {MAX_X} (slots are named A..Z)")]
    TooWide { shape: String },
    #[error("bad rack shape {shape:?}: {nodes} nodes do not fit the 22-bit node id")]
    TooManyNodes { shape: String, nodes: u64 },
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NameError {
    #[error("bad node name {0:?}: expected M<blade>Q<slot>F<fpga>, e.g. M1QAF1")]
    Syntax(String),
    #[error(
        "node {name} is not in a {shape} rack (blades 1..={blades}, slots A..{last_slot}, F1..F4)"
    )]
    OutOfRack {
        name: String,
        shape: Shape,
        blades: u32,
        last_slot: char,
    },
    #[error("node id {id} is not in a {shape} rack of {nodes} nodes")]
    BadId { id: u32, shape: Shape, nodes: u32 },
}

/// The rack's shape in QFDBs along X (slots per blade), Y (blades per group) and Z (groups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    x: u32,
    y: u32,
    z: u32,
}

impl Shape {
    /// The full prototype: 4x4x2 QFDBs, 128 nodes.
    pub const PROTOTYPE: Shape = Shape { x: 4, y: 4, z: 2 };

    pub fn new(x: u32, y: u32, z: u32) -> Result<Shape, ShapeError> {
        let text = format!("{x}x{y}x{z}");
        if x == 0 || y == 0 || z == 0 {
            return Err(ShapeError::ZeroDimension { shape: text });
        }
        if x > MAX_X {
            return Err(ShapeError::TooWide { shape: text });
        }
        let nodes = u64::from(x) * u64::from(y) * u64::from(z) * u64::from(FPGAS_PER_QFDB);
        if nodes > 1 << NODE_ID_BITS {
            return Err(ShapeError::TooManyNodes { shape: text, nodes });
        }
        Ok(Shape { x, y, z })
    }

    pub fn x(&self) -> u32 {
        self.x
    }
    pub fn y(&self) -> u32 {
        self.y
    }
    pub fn z(&self) -> u32 {
        self.z
    }

    /// Ring size along dimension `d` (0 = X, 1 = Y, 2 = Z).
    pub fn ring(&self, d: usize) -> u32 {
        [self.x, self.y, self.z][d]
    }

    pub fn qfdbs(&self) -> u32 {
        self.x * self.y * self.z
    }

    pub fn nodes(&self) -> u32 {
        self.qfdbs() * FPGAS_PER_QFDB
    }

    pub fn blades(&self) -> u32 {
        self.y * self.z
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes()).map(NodeId)
    }

    pub fn contains(&self, id: NodeId) -> bool {
        id.0 < self.nodes()
    }

    fn check_id(&self, id: NodeId) -> Result<(), NameError> {
        if self.contains(id) {
            Ok(())
        } else {
            Err(NameError::BadId {
                id: id.0,
                shape: *self,
                nodes: self.nodes(),
            })
        }
    }

    pub fn coord(&self, id: NodeId) -> Result<Coord, NameError> {
        self.check_id(id)?;
        let fpga = id.0 % FPGAS_PER_QFDB + 1;
        let q = id.0 / FPGAS_PER_QFDB;
        Ok(Coord {
            x: q % self.x,
            y: (q / self.x) % self.y,
            z: q / (self.x * self.y),
            fpga,
        })
    }

    /// The id of the node at `c`; `None` when `c` lies outside the rack.
    pub fn id(&self, c: Coord) -> Option<NodeId> {
        if c.x >= self.x || c.y >= self.y || c.z >= self.z || !(1..=4).contains(&c.fpga) {
            return None;
        }
        Some(NodeId(
            ((c.z * self.y + c.y) * self.x + c.x) * FPGAS_PER_QFDB + (c.fpga - 1),
        ))
    }

    pub fn name(&self, id: NodeId) -> Result<NodeName, NameError> {
        let c = self.coord(id)?;
        Ok(NodeName {
            blade: c.z * self.y + c.y + 1,
            slot: c.x,
            fpga: c.fpga,
        })
    }

    /// Resolves a node name (case-insensitive) to its id in this rack.
    pub fn parse_node(&self, name: &str) -> Result<NodeId, NameError> {
        let n: NodeName = name.parse()?;
        self.id_of(n)
    }

    pub fn id_of(&self, n: NodeName) -> Result<NodeId, NameError> {
        let out = || NameError::OutOfRack {
            name: n.to_string(),
            shape: *self,
            blades: self.blades(),
            last_slot: char::from(b'A' + (self.x - 1) as u8),
        };
        if n.blade == 0 || n.blade > self.blades() || n.slot >= self.x {
            return Err(out());
        }
        let b = n.blade - 1;
        self.id(Coord {
            x: n.slot,
            y: b % self.y,
            z: b / self.y,
            fpga: n.fpga,
        })
        .ok_or_else(out)
    }

    /// Display name of a node id, or the raw id when it is outside the rack.
    pub fn display(&self, id: NodeId) -> String {
        match self.name(id) {
            Ok(n) => n.to_string(),
            Err(_) => format!("node#{}", id.0),
        }
    }
}

impl Default for Shape {
    fn default() -> Self {
        Shape::PROTOTYPE
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}", self.x, self.y, self.z)
    }
}

impl FromStr for Shape {
    type Err = ShapeError;
    fn from_str(s: &str) -> Result<Shape, ShapeError> {
        let parts: Vec<&str> = s.trim().split(['x', 'X']).collect();
        if parts.len() != 3 {
            return Err(ShapeError::Syntax(s.to_string()));
        }
        let mut dims = [0u32; 3];
        for (d, p) in dims.iter_mut().zip(&parts) {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(ShapeError::Syntax(s.to_string()));
            }
            *d = p.parse().map_err(|_| ShapeError::Syntax(s.to_string()))?;
        }
        Shape::new(dims[0], dims[1], dims[2])
    }
}

impl Serialize for Shape {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Shape, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A node name `M<blade>Q<slot>F<fpga>`, valid in some rack (see [`Shape::id_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeName {
    /// 1-based blade (mezzanine) number.
    pub blade: u32,
    /// 0-based slot: 0 is 'A'.
    pub slot: u32,
    /// 1..=4.
    pub fpga: u32,
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slot = char::from(b'A' + self.slot.min(25) as u8);
        write!(f, "M{}Q{}F{}", self.blade, slot, self.fpga)
    }
}

impl FromStr for NodeName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<NodeName, NameError> {
        let bad = || NameError::Syntax(s.to_string());
        let u = s.trim().to_ascii_uppercase();
        let rest = u.strip_prefix('M').ok_or_else(bad)?;
        let q = rest.find('Q').ok_or_else(bad)?;
        let blade_txt = &rest[..q];
        if blade_txt.is_empty()
            || blade_txt.len() > 7
            || !blade_txt.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let blade: u32 = blade_txt.parse().map_err(|_| bad())?;
        let rest = &rest.as_bytes()[q + 1..];
        if rest.len() != 3 || !rest[0].is_ascii_uppercase() || rest[1] != b'F' {
            return Err(bad());
        }
        let fpga = match rest[2] {
            b @ b'1'..=b'4' => u32::from(b - b'0'),
            _ => return Err(bad()),
        };
        Ok(NodeName {
            blade,
            slot: u32::from(rest[0] - b'A'),
            fpga,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_map_to_spec_ids() {
        let s = Shape::PROTOTYPE;
        assert_eq!(s.parse_node("M1QAF1").unwrap(), NodeId(0));
        assert_eq!(s.parse_node("M1QAF2").unwrap(), NodeId(1));
        // M1QBF1: F1 of the second QFDB on blade 1 -> x=1.
        assert_eq!(s.parse_node("M1QBF1").unwrap(), NodeId(4));
        // blade 5 = z=1, y=0.
        let id = s.parse_node("m5qdf4").unwrap();
        assert_eq!(
            s.coord(id).unwrap(),
            Coord {
                x: 3,
                y: 0,
                z: 1,
                fpga: 4
            }
        );
        assert_eq!(s.name(id).unwrap().to_string(), "M5QDF4");
    }

    #[test]
    fn names_outside_the_rack_are_refused() {
        let s: Shape = "2x2x1".parse().unwrap();
        assert!(matches!(
            s.parse_node("M3QAF1"),
            Err(NameError::OutOfRack { .. })
        ));
        assert!(matches!(
            s.parse_node("M1QCF1"),
            Err(NameError::OutOfRack { .. })
        ));
        assert!(matches!(s.parse_node("M1QAF5"), Err(NameError::Syntax(_))));
        assert!(matches!(
            s.parse_node("M0QAF1"),
            Err(NameError::OutOfRack { .. })
        ));
        assert!(matches!(s.parse_node("MQAF1"), Err(NameError::Syntax(_))));
        assert!(s.coord(NodeId(16)).is_err());
    }

    #[test]
    fn bad_shapes_say_why() {
        assert!(matches!("4x4".parse::<Shape>(), Err(ShapeError::Syntax(_))));
        assert!(matches!(
            "4x0x2".parse::<Shape>(),
            Err(ShapeError::ZeroDimension { .. })
        ));
        assert!(matches!(
            "27x1x1".parse::<Shape>(),
            Err(ShapeError::TooWide { .. })
        ));
        assert!(matches!(
            "26x10000x10000".parse::<Shape>(),
            Err(ShapeError::TooManyNodes { .. })
        ));
        assert!(matches!(
            "+4x4x2".parse::<Shape>(),
            Err(ShapeError::Syntax(_))
        ));
        assert_eq!("4X4x2".parse::<Shape>().unwrap(), Shape::PROTOTYPE);
    }
}
