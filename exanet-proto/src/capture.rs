//! Capturing cells: which cells a capture takes ([`CaptureFilter`]) and the record each
//! captured cell becomes ([`Record`]), the packet data of an `exactl capture` pcapng file
//! that Wireshark reads with the project's dissector ([`dissector`], which `exactl
//! dissector` prints).
//!
//! A record is a 24-byte capture header, then the cell exactly as it crossed the link
//! (16-byte header, payload, 16-byte footer; corrupt cells too, as they arrived), all
//! big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | magic `0x584E` ("XN") |
//! | 2 | record version ([`RECORD_VERSION`]) |
//! | 3 | direction: 0 received by the capturing node, 1 sent by it |
//! | 4..8 | the capturing node's id |
//! | 8..12 | the node at the link's other end |
//! | 12 | the capturing node's port index ([`crate::topology::Port`]) |
//! | 13 | virtual channel |
//! | 14..16 | reserved, 0 |
//! | 16..24 | modeled time, picoseconds: when the cell's last byte reaches the link's far end |
//!
//! The filter reads the cell's raw header, without checking its CRCs, so that a capture
//! shows corrupt cells too: a capture is for looking at what is on the wire.

use crate::cell::{CellType, Engine, HEADER_LEN, OVERHEAD};
use crate::gvas::{Pdid, GVAS_LEN, NODE_BITS, PDID_BITS, RANK_BITS, VA_BITS};
use crate::model::ModelTime;
use crate::ni::NackReason;
use crate::routing::Vc;
use crate::shape::NodeId;
use crate::topology::Port;

/// The Wireshark dissector (Lua) for these records, with the names of this build's wire
/// codes. The template is `dissector.lua` beside this file; the tables of cell types, NACK
/// reasons and engines come from their declarations, so a new code needs no edit of the
/// dissector and a capture is never read with names of another build.
pub fn dissector() -> String {
    fn table(codes: impl IntoIterator<Item = (u8, &'static str)>) -> String {
        codes
            .into_iter()
            .map(|(code, label)| format!("[{code}] = \"{label}\""))
            .collect::<Vec<_>>()
            .join(", ")
    }
    DISSECTOR_TEMPLATE
        .replace(
            "@CELL_TYPES@",
            &table(CellType::ALL.map(|k| (k.code(), k.label()))),
        )
        .replace(
            "@NACK_REASONS@",
            &table(NackReason::ALL.map(|k| (k.code(), k.label()))),
        )
        .replace(
            "@ENGINES@",
            &table(Engine::ALL.map(|k| (k.code(), k.label()))),
        )
}

const DISSECTOR_TEMPLATE: &str = include_str!("dissector.lua");

pub const RECORD_MAGIC: u16 = 0x584E;
pub const RECORD_VERSION: u8 = 1;
pub const RECORD_HEADER_LEN: usize = 24;

/// Which way the cell crossed the capturing node's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Received = 0,
    Sent = 1,
}

impl Direction {
    pub fn label(self) -> &'static str {
        match self {
            Direction::Received => "rx",
            Direction::Sent => "tx",
        }
    }
}

/// Which cells a capture takes; every field that is set must match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureFilter {
    pub kind: Option<CellType>,
    pub pdid: Option<Pdid>,
    /// The destination node of the cell's GVAS.
    pub dst: Option<NodeId>,
}

/// The fields of a cell's header that a filter reads, taken from raw bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawHeader {
    pub pdid: Pdid,
    pub dst: NodeId,
    pub kind: u8,
}

impl RawHeader {
    /// Reads the header of `cell` (the cell's wire bytes); `None` when the bytes are too
    /// short to be a cell.
    pub fn read(cell: &[u8]) -> Option<RawHeader> {
        if cell.len() < OVERHEAD {
            return None;
        }
        let mut g = [0u8; 16];
        g[16 - GVAS_LEN..].copy_from_slice(&cell[..GVAS_LEN]);
        let v = u128::from_be_bytes(g);
        let node_mask = (1u128 << NODE_BITS) - 1;
        Some(RawHeader {
            pdid: Pdid((v >> (NODE_BITS + RANK_BITS + VA_BITS)) as u16),
            dst: NodeId(((v >> (RANK_BITS + VA_BITS)) & node_mask) as u32),
            kind: cell[GVAS_LEN],
        })
    }
}

// The GVAS layout this module reads must stay the one gvas.rs writes.
const _: () = assert!(PDID_BITS + NODE_BITS + RANK_BITS + VA_BITS == 80);
const _: () = assert!(HEADER_LEN == 16);

impl CaptureFilter {
    /// Whether a cell with these wire bytes is taken. Bytes too short to be a cell are
    /// taken only by a filter that sets nothing (they are still what crossed the link).
    pub fn matches(&self, cell: &[u8]) -> bool {
        if *self == CaptureFilter::default() {
            return true;
        }
        let Some(h) = RawHeader::read(cell) else {
            return false;
        };
        self.kind.is_none_or(|k| k as u8 == h.kind)
            && self.pdid.is_none_or(|p| p == h.pdid)
            && self.dst.is_none_or(|d| d == h.dst)
    }
}

/// Where a captured cell was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub direction: Direction,
    pub node: NodeId,
    pub peer: NodeId,
    pub port: Port,
    pub vc: Vc,
    pub modeled: ModelTime,
}

/// Offers every cell in `frames` (whole frames, as a link's writer hands them to the wire)
/// to `offer`, seen as `seen` says with each cell's own VC and modeled time: what a
/// capture of a link's sent cells records. The daemon's link writers and the simulator's
/// links both capture through here, so their records are the same bytes.
pub fn sent_cells(frames: bytes::Bytes, seen: Seen, mut offer: impl FnMut(&Seen, &[u8])) {
    let mut dec = crate::frame::FrameDecoder::new();
    dec.push_bytes(frames);
    while let Some((_, raw)) = dec.next_frame_and_cell_bytes() {
        if let Some(raw) = raw {
            let seen = Seen {
                vc: raw.vc,
                modeled: raw.stamp.tail,
                ..seen
            };
            offer(&seen, &raw.wire);
        }
    }
}

/// One captured cell: the capture header and the cell's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub seen: Seen,
    pub cell: Vec<u8>,
}

impl Record {
    /// Appends the record's bytes (capture header, then the cell).
    pub fn encode_into(seen: &Seen, cell: &[u8], out: &mut Vec<u8>) {
        out.reserve(RECORD_HEADER_LEN + cell.len());
        out.extend_from_slice(&RECORD_MAGIC.to_be_bytes());
        out.push(RECORD_VERSION);
        out.push(seen.direction as u8);
        out.extend_from_slice(&seen.node.0.to_be_bytes());
        out.extend_from_slice(&seen.peer.0.to_be_bytes());
        out.push(seen.port.index() as u8);
        out.push(seen.vc.0);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&seen.modeled.0.to_be_bytes());
        out.extend_from_slice(cell);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        Record::encode_into(&self.seen, &self.cell, &mut out);
        out
    }

    /// Reads a record back (tests, tools); says what is wrong with one that is not.
    pub fn decode(b: &[u8]) -> Result<Record, String> {
        if b.len() < RECORD_HEADER_LEN {
            return Err(format!(
                "record of {} B is shorter than its {RECORD_HEADER_LEN}-byte header",
                b.len()
            ));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u16::from_be_bytes([b[0], b[1]]);
        if magic != RECORD_MAGIC || b[2] != RECORD_VERSION {
            return Err(format!(
                "not an exanet capture record (magic {magic:#06x}, version {})",
                b[2]
            ));
        }
        let direction = match b[3] {
            0 => Direction::Received,
            1 => Direction::Sent,
            d => return Err(format!("direction {d} is neither 0 (rx) nor 1 (tx)")),
        };
        let port =
            Port::from_index(b[12] as usize).ok_or_else(|| format!("no port index {}", b[12]))?;
        let mut m = [0u8; 8];
        m.copy_from_slice(&b[16..24]);
        Ok(Record {
            seen: Seen {
                direction,
                node: NodeId(u32_at(4)),
                peer: NodeId(u32_at(8)),
                port,
                vc: Vc(b[13]),
                modeled: ModelTime(u64::from_be_bytes(m)),
            },
            cell: b[RECORD_HEADER_LEN..].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::Cell;
    use crate::gvas::Gvas;
    use bytes::{Bytes, BytesMut};

    #[test]
    fn the_dissector_names_every_wire_code_of_this_build() {
        let lua = dissector();
        assert!(!lua.contains('@'), "a placeholder left in the dissector");
        let line = |name: &str| {
            lua.lines()
                .find(|l| l.starts_with(&format!("local {name} = {{")))
                .unwrap_or_else(|| panic!("no table {name}"))
                .to_string()
        };
        let (types, reasons, engines) = (line("CELL_TYPES"), line("NACK_REASONS"), line("ENGINES"));
        for k in CellType::ALL {
            assert!(
                types.contains(&format!("[{}] = \"{}\"", k.code(), k.label())),
                "{k:?}"
            );
        }
        for r in NackReason::ALL {
            assert!(
                reasons.contains(&format!("[{}] = \"{}\"", r.code(), r.label())),
                "{r:?}"
            );
        }
        for e in Engine::ALL {
            assert!(
                engines.contains(&format!("[{}] = \"{}\"", e.code(), e.label())),
                "{e:?}"
            );
        }
        assert!(
            types.contains(r#"[1] = "write", [2] = "read_request""#),
            "{types}"
        );
    }

    fn wire(pdid: u16, dst: u32, kind: CellType) -> Vec<u8> {
        let c = Cell::new(
            Gvas::new(Pdid(pdid), NodeId(dst), 5, 0x7f_1234_5678).unwrap(),
            kind,
            NodeId(3),
            Bytes::from_static(b"payload"),
        )
        .unwrap();
        let mut out = BytesMut::new();
        c.encode(&mut out).unwrap();
        out.to_vec()
    }

    #[test]
    fn the_raw_header_reads_what_the_gvas_wrote() {
        let h = RawHeader::read(&wire(0xBEEF, (1 << 22) - 2, CellType::Nack)).unwrap();
        assert_eq!(h.pdid, Pdid(0xBEEF));
        assert_eq!(h.dst, NodeId((1 << 22) - 2));
        assert_eq!(h.kind, CellType::Nack as u8);
        assert_eq!(RawHeader::read(&[0u8; OVERHEAD - 1]), None);
    }

    #[test]
    fn a_filter_takes_only_cells_matching_every_field_it_sets() {
        let w = wire(7, 12, CellType::Write);
        assert!(CaptureFilter::default().matches(&w));
        assert!(CaptureFilter::default().matches(b"short"));
        let f = CaptureFilter {
            kind: Some(CellType::Write),
            pdid: Some(Pdid(7)),
            dst: Some(NodeId(12)),
        };
        assert!(f.matches(&w));
        assert!(!f.matches(b"short"));
        for other in [
            wire(8, 12, CellType::Write),
            wire(7, 13, CellType::Write),
            wire(7, 12, CellType::Ack),
        ] {
            assert!(!f.matches(&other));
        }
        // A cell whose CRCs fail is still read: a capture shows corrupt cells.
        let mut bad = w.clone();
        let n = bad.len();
        bad[n - 1] ^= 0xff;
        bad[14] ^= 0xff;
        assert!(f.matches(&bad));
    }

    #[test]
    fn records_round_trip_and_bad_ones_say_why() {
        let r = Record {
            seen: Seen {
                direction: Direction::Sent,
                node: NodeId(4),
                peer: NodeId(32),
                port: Port::from_index(3).unwrap(),
                vc: Vc(2),
                modeled: ModelTime(123_456_789),
            },
            cell: wire(1, 2, CellType::Ack),
        };
        let b = r.encode();
        assert_eq!(&b[..4], &[0x58, 0x4E, RECORD_VERSION, 1]);
        assert_eq!(Record::decode(&b).unwrap(), r);
        assert!(Record::decode(&b[..10]).unwrap_err().contains("shorter"));
        let mut bad = b.clone();
        bad[0] = 0;
        assert!(Record::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = b;
        bad[3] = 9;
        assert!(Record::decode(&bad).unwrap_err().contains("direction"));
    }
}
