//! The 80-bit Global Virtual Address: `PDID (16) | node (22) | rank (3) | VA (39)`,
//! most significant first (SPEC §2). Encoded as 10 bytes, big-endian.
//!
//! Text form: `PDID:NODE:RANK:VA`, e.g. `7:4:0:0x1000`; every field accepts decimal or
//! `0x` hexadecimal. Display prints PDID, node and rank in decimal and the VA in hex.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::shape::NodeId;

pub const PDID_BITS: u32 = 16;
pub const NODE_BITS: u32 = crate::shape::NODE_ID_BITS;
pub const RANK_BITS: u32 = 3;
pub const VA_BITS: u32 = 39;
/// Encoded size of a GVAS.
pub const GVAS_LEN: usize = 10;

const NODE_MAX: u32 = (1 << NODE_BITS) - 1;
const RANK_MAX: u8 = (1 << RANK_BITS) - 1;
const VA_MAX: u64 = (1 << VA_BITS) - 1;

/// A protection-domain id: which process group a packet belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pdid(pub u16);

impl fmt::Display for Pdid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GvasError {
    #[error("node id {0} does not fit the 22-bit GVAS node field")]
    Node(u32),
    #[error("rank {0} is outside 0..=7")]
    Rank(u8),
    #[error("VA {0:#x} does not fit the 39-bit GVAS VA field")]
    Va(u64),
    #[error("bad GVAS {text:?}: {why}")]
    Syntax { text: String, why: &'static str },
}

/// A global virtual address. The fields are private so that every value is in range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvas(u128);

impl Gvas {
    pub fn new(pdid: Pdid, node: NodeId, rank: u8, va: u64) -> Result<Gvas, GvasError> {
        if node.0 > NODE_MAX {
            return Err(GvasError::Node(node.0));
        }
        if rank > RANK_MAX {
            return Err(GvasError::Rank(rank));
        }
        if va > VA_MAX {
            return Err(GvasError::Va(va));
        }
        Ok(Gvas(
            (u128::from(pdid.0) << (NODE_BITS + RANK_BITS + VA_BITS))
                | (u128::from(node.0) << (RANK_BITS + VA_BITS))
                | (u128::from(rank) << VA_BITS)
                | u128::from(va),
        ))
    }

    pub fn pdid(&self) -> Pdid {
        Pdid((self.0 >> (NODE_BITS + RANK_BITS + VA_BITS)) as u16)
    }

    pub fn node(&self) -> NodeId {
        NodeId(((self.0 >> (RANK_BITS + VA_BITS)) as u32) & NODE_MAX)
    }

    pub fn rank(&self) -> u8 {
        ((self.0 >> VA_BITS) as u8) & RANK_MAX
    }

    pub fn va(&self) -> u64 {
        (self.0 as u64) & VA_MAX
    }

    /// The 42-bit node-level virtual address (rank and VA).
    pub fn node_va(&self) -> u64 {
        (self.0 as u64) & ((1 << (RANK_BITS + VA_BITS)) - 1)
    }

    /// The same address in protection domain `pdid` (the NI stamping the sender's PDID).
    pub fn with_pdid(&self, pdid: Pdid) -> Gvas {
        const PDID_SHIFT: u32 = NODE_BITS + RANK_BITS + VA_BITS;
        Gvas((self.0 & ((1u128 << PDID_SHIFT) - 1)) | (u128::from(pdid.0) << PDID_SHIFT))
    }

    /// The same address with another VA, e.g. the next cell of a transfer.
    pub fn with_va(&self, va: u64) -> Result<Gvas, GvasError> {
        Gvas::new(self.pdid(), self.node(), self.rank(), va)
    }

    pub fn to_bytes(&self) -> [u8; GVAS_LEN] {
        let all = self.0.to_be_bytes();
        let mut out = [0u8; GVAS_LEN];
        out.copy_from_slice(&all[16 - GVAS_LEN..]);
        out
    }

    /// Every 80-bit pattern is a valid GVAS, so decoding cannot fail.
    pub fn from_bytes(b: [u8; GVAS_LEN]) -> Gvas {
        let mut all = [0u8; 16];
        all[16 - GVAS_LEN..].copy_from_slice(&b);
        Gvas(u128::from_be_bytes(all))
    }
}

impl fmt::Display for Gvas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{:#x}",
            self.pdid().0,
            self.node().0,
            self.rank(),
            self.va()
        )
    }
}

fn parse_field(text: &str, field: &str, what: &'static str) -> Result<u64, GvasError> {
    let bad = || GvasError::Syntax {
        text: text.to_string(),
        why: what,
    };
    let f = field.trim();
    let (digits, radix) = match f.strip_prefix("0x").or_else(|| f.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None => (f, 10),
    };
    if digits.is_empty() || digits.starts_with('+') {
        return Err(bad());
    }
    u64::from_str_radix(digits, radix).map_err(|_| bad())
}

impl FromStr for Gvas {
    type Err = GvasError;
    fn from_str(s: &str) -> Result<Gvas, GvasError> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 4 {
            return Err(GvasError::Syntax {
                text: s.to_string(),
                why: "expected PDID:NODE:RANK:VA",
            });
        }
        let pdid = parse_field(s, parts[0], "PDID is not a number")?;
        let node = parse_field(s, parts[1], "node is not a number")?;
        let rank = parse_field(s, parts[2], "rank is not a number")?;
        let va = parse_field(s, parts[3], "VA is not a number")?;
        let pdid = u16::try_from(pdid).map_err(|_| GvasError::Syntax {
            text: s.to_string(),
            why: "PDID does not fit 16 bits",
        })?;
        let node = u32::try_from(node).map_err(|_| GvasError::Syntax {
            text: s.to_string(),
            why: "node does not fit 22 bits",
        })?;
        let rank = u8::try_from(rank).map_err(|_| GvasError::Syntax {
            text: s.to_string(),
            why: "rank is outside 0..=7",
        })?;
        Gvas::new(Pdid(pdid), NodeId(node), rank, va)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_land_where_spec_puts_them() {
        let g = Gvas::new(Pdid(0xABCD), NodeId(0x3F_FFFF), 7, VA_MAX).unwrap();
        assert_eq!(
            g.to_bytes(),
            [0xAB, 0xCD, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
        );
        let g = Gvas::new(Pdid(1), NodeId(1), 1, 1).unwrap();
        // PDID in the top 16 bits, node next (22), rank (3), VA (39).
        assert_eq!(g.0, (1u128 << 64) | (1u128 << 42) | (1u128 << 39) | 1);
        assert_eq!(g.to_string(), "1:1:1:0x1");
        assert_eq!("0x1:1:0x1:1".parse::<Gvas>().unwrap(), g);
    }

    #[test]
    fn with_pdid_replaces_only_the_pdid() {
        let g = Gvas::new(Pdid(9), NodeId(0x3F_FFFF), 7, VA_MAX).unwrap();
        let h = g.with_pdid(Pdid(0xBEEF));
        assert_eq!(
            h,
            Gvas::new(Pdid(0xBEEF), NodeId(0x3F_FFFF), 7, VA_MAX).unwrap()
        );
        assert_eq!(h.with_pdid(Pdid(9)), g);
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        assert_eq!(
            Gvas::new(Pdid(0), NodeId(1 << 22), 0, 0),
            Err(GvasError::Node(1 << 22))
        );
        assert_eq!(Gvas::new(Pdid(0), NodeId(0), 8, 0), Err(GvasError::Rank(8)));
        assert_eq!(
            Gvas::new(Pdid(0), NodeId(0), 0, 1 << 39),
            Err(GvasError::Va(1 << 39))
        );
        assert!("1:2:3".parse::<Gvas>().is_err());
        assert!("70000:0:0:0".parse::<Gvas>().is_err());
        assert!("1:0:0:-1".parse::<Gvas>().is_err());
        assert!("1:0:0:+1".parse::<Gvas>().is_err());
    }
}
