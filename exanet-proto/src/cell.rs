//! The cell: the unit the fabric switches (SPEC §3).
//!
//! A cell is a 16-byte header, 0..=256 bytes of payload and a 16-byte footer. All integers
//! are big-endian.
//!
//! Header (16 B):
//!
//! | bytes | field |
//! |---|---|
//! | 0..10 | destination GVAS (PDID 16 / node 22 / rank 3 / VA 39) |
//! | 10 | cell type ([`CellType`]) |
//! | 11 | reserved, must be 0 |
//! | 12..14 | payload length, 0..=256 |
//! | 14..16 | header CRC: CRC-16/IBM-3740 (CCITT-FALSE) over bytes 0..14 |
//!
//! Footer (16 B):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | transaction id |
//! | 4..7 | source node id (22 bits; the top 2 bits must be 0) |
//! | 7 | bits 0-2 source rank, bit 3 first, bit 4 last, bit 5 notify, bits 6-7 the NI engine ([`Engine`]; 3 is refused) |
//! | 8..10 | sequence number |
//! | 10 | aux: cell index in its RDMA block, or the NACK reason of a NACK |
//! | 11 | footer CRC: CRC-8/SMBUS over footer bytes 0..11 and 12..16 |
//! | 12..16 | payload CRC: CRC-32 (IEEE) over the payload |
//!
//! The header CRC guards routing (a corrupt destination must not be delivered anywhere),
//! the footer CRC the end-to-end protocol fields; a cell failing either is refused. The
//! payload CRC is end to end, as in the hardware: a cell whose header and footer are sound
//! but whose payload CRC fails still decodes, marked corrupt ([`Cell::corrupt_crc`]), and
//! travels on to its destination, whose NI refuses it with a CRC NACK so the sender
//! retransmits. Encoding a corrupt cell writes the bad CRC back, so it stays corrupt.

use bytes::{BufMut, Bytes, BytesMut};
use crc::{Crc, CRC_16_IBM_3740, CRC_8_SMBUS};
use thiserror::Error;

use crate::code::numeric_code;
use crate::gvas::{Gvas, GVAS_LEN};
use crate::shape::NodeId;
use crate::time::Stamp;

pub const HEADER_LEN: usize = 16;
pub const FOOTER_LEN: usize = 16;
pub const MAX_PAYLOAD: usize = 256;
/// Header and footer together: a cell with no payload.
pub const OVERHEAD: usize = HEADER_LEN + FOOTER_LEN;
pub const MAX_CELL: usize = OVERHEAD + MAX_PAYLOAD;

/// Where each field of the header and footer sits, named once for the encoder and the
/// decoder (the tables of the module's documentation).
mod field {
    pub mod header {
        use std::ops::Range;
        pub const DST: Range<usize> = 0..10;
        pub const TYPE: usize = 10;
        pub const RESERVED: usize = 11;
        pub const LEN: Range<usize> = 12..14;
        /// What the header CRC covers: everything before it.
        pub const CRC_OVER: Range<usize> = 0..14;
        pub const CRC: Range<usize> = 14..16;
    }
    pub mod footer {
        use std::ops::Range;
        pub const TXN: Range<usize> = 0..4;
        /// The source node id, 22 bits in 3 bytes.
        pub const SRC: Range<usize> = 4..7;
        /// Source rank (bits 0-2), flags (bits 3-5) and engine (bits 6-7).
        pub const RANK_FLAGS: usize = 7;
        pub const SEQ: Range<usize> = 8..10;
        pub const AUX: usize = 10;
        /// The footer CRC, over every other footer byte.
        pub const CRC: usize = 11;
        pub const PAYLOAD_CRC: Range<usize> = 12..16;
    }
}
const _: () = assert!(field::header::DST.end - field::header::DST.start == GVAS_LEN);
const _: () = assert!(field::header::CRC.end == HEADER_LEN);
const _: () = assert!(field::footer::PAYLOAD_CRC.end == FOOTER_LEN);

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

const CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_IBM_3740);
const CRC8: Crc<u8> = Crc::<u8>::new(&CRC_8_SMBUS);

numeric_code! {
    /// What a cell is. Values 1..=6 are the NI cell types of the thesis (§3); 0x40.. are
    /// the emulator's own diagnostic cells.
    pub enum CellType {
        /// Remote write data (RDMA and packetizer payloads).
        Write = 1 => "write",
        /// Remote read request.
        ReadRequest = 2 => "read_request",
        /// RDMA completion-notification control cell.
        NotifyControl = 3 => "notify_control",
        /// Completion notification written at the receiver.
        Notify = 4 => "notify",
        Ack = 5 => "ack",
        Nack = 6 => "nack",
        /// A step of an accelerated collective (the NI's allreduce accelerator).
        Collective = 7 => "collective",
        /// Diagnostic: a probe that records its path, answered by the destination's switch.
        Probe = 0x40 => "probe",
        /// Diagnostic: the answer to a probe, recording the way back.
        ProbeReply = 0x41 => "probe_reply",
        /// Diagnostic: synthetic load, counted and discarded by the destination.
        Load = 0x42 => "load",
    }
}

impl CellType {
    /// Cells of the NI protocols (as opposed to the fabric's diagnostics).
    pub fn is_ni(self) -> bool {
        (self as u8) < 0x40
    }
}

numeric_code! {
    /// Which engine of the NI a cell belongs to: its data cells carry it, and an ACK or
    /// NACK carries that of the cell it answers, so that it reaches the engine waiting for
    /// it without guessing from other fields.
    pub enum Engine {
        /// Packetizer messages (mailbox or memory writes of up to 64 B).
        Packetizer = 0 => "packetizer",
        /// The RDMA engine: block writes, read requests, completion notifications.
        Rdma = 1 => "rdma",
        /// The allreduce accelerator.
        Accelerator = 2 => "accelerator",
    }
}

/// Where the engine sits in footer byte 7.
const ENGINE_SHIFT: u8 = 6;

/// Footer flag bits (byte 7).
pub const FLAG_FIRST: u8 = 1 << 3;
pub const FLAG_LAST: u8 = 1 << 4;
pub const FLAG_NOTIFY: u8 = 1 << 5;
const FLAGS_MASK: u8 = FLAG_FIRST | FLAG_LAST | FLAG_NOTIFY;

/// A decoded, valid cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub dst: Gvas,
    pub kind: CellType,
    pub txn: u32,
    pub src: NodeId,
    pub src_rank: u8,
    /// FLAG_FIRST | FLAG_LAST | FLAG_NOTIFY.
    pub flags: u8,
    /// The NI engine the cell belongs to (for an answer, that of the cell answered).
    pub engine: Engine,
    pub seq: u16,
    pub aux: u8,
    pub payload: Bytes,
    /// The payload CRC the cell carried when it did not match its payload: the cell is
    /// corrupt and must not be delivered as data.
    pub corrupt_crc: Option<u32>,
    /// When the cell reaches the input it travels to, in modeled time. Not part of the
    /// cell's 32 bytes: it rides in the link framing ([`crate::frame`]).
    pub stamp: Stamp,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CellError {
    #[error("cell truncated: {got} bytes, need {need}")]
    Truncated { got: usize, need: usize },
    #[error("cell header CRC mismatch (carried {carried:#06x}, computed {computed:#06x})")]
    HeaderCrc { carried: u16, computed: u16 },
    #[error("cell payload length {0} exceeds {MAX_PAYLOAD}")]
    PayloadTooLong(usize),
    #[error("unknown cell type {0:#04x}")]
    UnknownType(u8),
    #[error("reserved header byte is {0:#04x}, must be 0")]
    ReservedHeader(u8),
    #[error("cell footer CRC mismatch (carried {carried:#04x}, computed {computed:#04x})")]
    FooterCrc { carried: u8, computed: u8 },
    #[error("cell footer has reserved bits set (source {src:#08x}, flags {flags:#04x})")]
    ReservedFooter { src: u32, flags: u8 },
    #[error("cell payload CRC mismatch (carried {carried:#010x}, computed {computed:#010x})")]
    PayloadCrc { carried: u32, computed: u32 },
    #[error("source rank {0} is outside 0..=7")]
    BadRank(u8),
    #[error("source node {0} does not fit 22 bits")]
    BadSource(u32),
}

impl CellError {
    /// A short stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            CellError::Truncated { .. } => "truncated",
            CellError::HeaderCrc { .. } => "header_crc",
            CellError::PayloadTooLong(_) => "payload_too_long",
            CellError::UnknownType(_) => "unknown_type",
            CellError::ReservedHeader(_) => "reserved_header",
            CellError::FooterCrc { .. } => "footer_crc",
            CellError::ReservedFooter { .. } => "reserved_footer",
            CellError::PayloadCrc { .. } => "payload_crc",
            CellError::BadRank(_) => "bad_rank",
            CellError::BadSource(_) => "bad_source",
        }
    }
}

impl Cell {
    /// A cell with the given destination, type, source and payload; other fields zero.
    pub fn new(dst: Gvas, kind: CellType, src: NodeId, payload: Bytes) -> Result<Cell, CellError> {
        if payload.len() > MAX_PAYLOAD {
            return Err(CellError::PayloadTooLong(payload.len()));
        }
        if src.0 >= 1 << 22 {
            return Err(CellError::BadSource(src.0));
        }
        Ok(Cell {
            dst,
            kind,
            txn: 0,
            src,
            src_rank: 0,
            flags: 0,
            engine: Engine::Packetizer,
            seq: 0,
            aux: 0,
            payload,
            corrupt_crc: None,
            stamp: Stamp::default(),
        })
    }

    /// The cell, belonging to `engine`.
    pub fn of(mut self, engine: Engine) -> Cell {
        self.engine = engine;
        self
    }

    pub fn is_corrupt(&self) -> bool {
        self.corrupt_crc.is_some()
    }

    /// Bytes on the wire, which is also what the cell costs in flow-control credit.
    pub fn wire_len(&self) -> usize {
        OVERHEAD + self.payload.len()
    }

    /// Appends the encoded cell to `out`. Fails only on fields out of range, which
    /// [`Cell::new`] and [`Cell::decode`] never produce.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), CellError> {
        let len = self.payload.len();
        if len > MAX_PAYLOAD {
            return Err(CellError::PayloadTooLong(len));
        }
        if self.src_rank > 7 {
            return Err(CellError::BadRank(self.src_rank));
        }
        if self.src.0 >= 1 << 22 || self.flags & !FLAGS_MASK != 0 {
            return Err(CellError::ReservedFooter {
                src: self.src.0,
                flags: self.flags,
            });
        }
        out.reserve(OVERHEAD + len);
        use field::{footer as ft, header as hd};
        let mut h = [0u8; HEADER_LEN];
        h[hd::DST].copy_from_slice(&self.dst.to_bytes());
        h[hd::TYPE] = self.kind as u8;
        h[hd::LEN].copy_from_slice(&(len as u16).to_be_bytes());
        let hcrc = CRC16.checksum(&h[hd::CRC_OVER]);
        h[hd::CRC].copy_from_slice(&hcrc.to_be_bytes());
        out.put_slice(&h);
        out.put_slice(&self.payload);
        let mut f = [0u8; FOOTER_LEN];
        f[ft::TXN].copy_from_slice(&self.txn.to_be_bytes());
        f[ft::SRC].copy_from_slice(&self.src.0.to_be_bytes()[1..4]);
        f[ft::RANK_FLAGS] = self.src_rank | self.flags | self.engine.code() << ENGINE_SHIFT;
        f[ft::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        f[ft::AUX] = self.aux;
        let crc = self
            .corrupt_crc
            .unwrap_or_else(|| crc32fast::hash(&self.payload));
        f[ft::PAYLOAD_CRC].copy_from_slice(&crc.to_be_bytes());
        f[ft::CRC] = footer_crc(&f);
        out.put_slice(&f);
        Ok(())
    }

    pub fn to_bytes(&self) -> Result<Bytes, CellError> {
        let mut b = BytesMut::with_capacity(self.wire_len());
        self.encode(&mut b)?;
        Ok(b.freeze())
    }

    /// The length of the cell that starts `buf`, read from its header after checking the
    /// header CRC; `Ok(None)` when fewer than 16 bytes are there yet.
    pub fn peek_len(buf: &[u8]) -> Result<Option<usize>, CellError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        use field::header as hd;
        let carried = be16(&buf[hd::CRC]);
        let computed = CRC16.checksum(&buf[hd::CRC_OVER]);
        if carried != computed {
            return Err(CellError::HeaderCrc { carried, computed });
        }
        let len = usize::from(be16(&buf[hd::LEN]));
        if len > MAX_PAYLOAD {
            return Err(CellError::PayloadTooLong(len));
        }
        Ok(Some(OVERHEAD + len))
    }

    /// Decodes exactly one cell from `buf` (which must hold exactly the cell). The payload
    /// shares `buf`'s memory.
    pub fn decode(buf: &Bytes) -> Result<Cell, CellError> {
        let need = match Cell::peek_len(buf)? {
            Some(n) => n,
            None => {
                return Err(CellError::Truncated {
                    got: buf.len(),
                    need: OVERHEAD,
                })
            }
        };
        if buf.len() != need {
            return Err(CellError::Truncated {
                got: buf.len(),
                need,
            });
        }
        use field::{footer as ft, header as hd};
        let t = buf[hd::TYPE];
        let kind = CellType::from_u8(t).ok_or(CellError::UnknownType(t))?;
        if buf[hd::RESERVED] != 0 {
            return Err(CellError::ReservedHeader(buf[hd::RESERVED]));
        }
        let mut g = [0u8; GVAS_LEN];
        g.copy_from_slice(&buf[hd::DST]);
        let mut f = [0u8; FOOTER_LEN];
        f.copy_from_slice(&buf[need - FOOTER_LEN..]);
        let carried = f[ft::CRC];
        let computed = footer_crc(&f);
        if carried != computed {
            return Err(CellError::FooterCrc { carried, computed });
        }
        let s = &f[ft::SRC];
        let src = u32::from_be_bytes([0, s[0], s[1], s[2]]);
        let rank_flags = f[ft::RANK_FLAGS];
        let engine = Engine::from_u8(rank_flags >> ENGINE_SHIFT);
        let Some(engine) = engine.filter(|_| src < 1 << 22) else {
            return Err(CellError::ReservedFooter {
                src,
                flags: rank_flags,
            });
        };
        let payload = buf.slice(HEADER_LEN..need - FOOTER_LEN);
        let carried = be32(&f[ft::PAYLOAD_CRC]);
        let computed = crc32fast::hash(&payload);
        Ok(Cell {
            dst: Gvas::from_bytes(g),
            kind,
            txn: be32(&f[ft::TXN]),
            src: NodeId(src),
            src_rank: rank_flags & 0x07,
            flags: rank_flags & FLAGS_MASK,
            engine,
            seq: be16(&f[ft::SEQ]),
            aux: f[ft::AUX],
            payload,
            corrupt_crc: (carried != computed).then_some(carried),
            stamp: Stamp::default(),
        })
    }

    /// Like [`Cell::decode`], but a corrupt payload is an error (for callers that have no
    /// destination to report it to).
    pub fn decode_strict(buf: &Bytes) -> Result<Cell, CellError> {
        let c = Cell::decode(buf)?;
        match c.corrupt_crc {
            Some(carried) => Err(CellError::PayloadCrc {
                carried,
                computed: crc32fast::hash(&c.payload),
            }),
            None => Ok(c),
        }
    }
}

fn footer_crc(f: &[u8; FOOTER_LEN]) -> u8 {
    let mut d = CRC8.digest();
    d.update(&f[..field::footer::CRC]);
    d.update(&f[field::footer::CRC + 1..]);
    d.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gvas::Pdid;

    #[test]
    fn every_cell_type_is_listed_once_and_found_by_its_label() {
        for v in 0..=u8::MAX {
            let listed = CellType::ALL.iter().filter(|k| **k as u8 == v).count();
            assert_eq!(listed, usize::from(CellType::from_u8(v).is_some()), "{v}");
        }
        for k in CellType::ALL {
            assert_eq!(CellType::from_label(k.label()), Some(k));
        }
        assert_eq!(CellType::from_label("bogus"), None);
    }

    fn sample() -> Cell {
        let mut c = Cell::new(
            Gvas::new(Pdid(9), NodeId(77), 3, 0x1234).unwrap(),
            CellType::Write,
            NodeId(5),
            Bytes::from_static(b"hello exanet"),
        )
        .unwrap();
        c.txn = 0xDEADBEEF;
        c.src_rank = 6;
        c.flags = FLAG_FIRST | FLAG_NOTIFY;
        c.seq = 513;
        c.aux = 63;
        c
    }

    #[test]
    fn layout_is_as_documented() {
        let c = sample();
        let b = c.to_bytes().unwrap();
        assert_eq!(b.len(), OVERHEAD + 12);
        assert_eq!(&b[..10], &c.dst.to_bytes());
        assert_eq!(b[10], 1);
        assert_eq!(&b[12..14], &[0, 12]);
        assert_eq!(&b[16..28], b"hello exanet");
        let f = &b[28..];
        assert_eq!(&f[0..4], &[0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(&f[4..7], &[0, 0, 5]);
        assert_eq!(f[7], 6 | FLAG_FIRST | FLAG_NOTIFY);
        assert_eq!(&f[8..10], &[2, 1]);
        assert_eq!(f[10], 63);
        assert_eq!(Cell::decode(&b).unwrap(), c);
    }

    #[test]
    fn the_engine_sits_in_the_top_bits_of_footer_byte_7_and_code_3_is_refused() {
        for e in Engine::ALL {
            let c = sample().of(e);
            let b = c.to_bytes().unwrap();
            assert_eq!(b[OVERHEAD + 12 - FOOTER_LEN + 7] >> 6, e.code());
            assert_eq!(Cell::decode(&b).unwrap().engine, e);
        }
        let mut v = sample().to_bytes().unwrap().to_vec();
        let at = v.len() - FOOTER_LEN + 7;
        v[at] |= 3 << 6;
        // Re-seal the footer so that only the engine is wrong.
        let crc_at = v.len() - FOOTER_LEN + 11;
        let foot: Vec<u8> = v[v.len() - FOOTER_LEN..].to_vec();
        v[crc_at] = footer_crc(foot[..].try_into().unwrap());
        assert!(matches!(
            Cell::decode(&Bytes::from(v)),
            Err(CellError::ReservedFooter { .. })
        ));
    }

    #[test]
    fn every_single_bit_flip_is_caught() {
        let b = sample().to_bytes().unwrap();
        for i in 0..b.len() * 8 {
            let mut v = b.to_vec();
            v[i / 8] ^= 1 << (i % 8);
            let v = Bytes::from(v);
            assert!(
                Cell::decode_strict(&v).is_err(),
                "flip of bit {i} went unnoticed"
            );
            // A payload flip still decodes, marked corrupt, and stays corrupt on re-encoding.
            if let Ok(c) = Cell::decode(&v) {
                assert!(c.is_corrupt(), "flip of bit {i} decoded as sound");
                assert_eq!(c.to_bytes().unwrap(), v);
            }
        }
    }

    #[test]
    fn oversized_payload_is_refused() {
        let r = Cell::new(
            Gvas::new(Pdid(0), NodeId(0), 0, 0).unwrap(),
            CellType::Load,
            NodeId(0),
            Bytes::from(vec![0u8; 257]),
        );
        assert_eq!(r, Err(CellError::PayloadTooLong(257)));
    }
}
