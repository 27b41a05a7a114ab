//! Link framing: what two neighbouring switches exchange over one emulated link (in the
//! daemon, one QUIC stream per link). Sans-IO: [`FrameDecoder`] takes bytes as they come
//! and yields frames.
//!
//! | frame | bytes |
//! |---|---|
//! | Hello  | `0x48`, version u8, node u32, port u8, shape X u16, Y u16, Z u16, rack u64, grant u32 per VC, VC0 first (37 B) |
//! | Cell   | `0x10 + vc`, length u16, modeled head u64, modeled tail u64, the cell ([`crate::cell`]) |
//! | Credit | `0x20 + vc`, bytes u32, modeled time the space was freed u64 |
//! | Marker | `0x4d`, epoch u64: every frame before it was sent before the sender's part of cut `epoch` ([`crate::cut`]) |
//!
//! Modeled times are picoseconds ([`crate::model`]): when the cell's first and last byte
//! reach the far end, and when the credited buffer space became free. They travel here,
//! beside the cell, because the cell's own header and footer model the hardware's.
//!
//! A cell frame carries its own length so that a corrupt cell (bad CRC, garbage) is
//! dropped without losing the framing; only a bad tag or an impossible length is fatal to
//! the link's byte stream, and the link is then reset.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

use crate::cell::{Cell, CellError, MAX_CELL, OVERHEAD};
use crate::model::{ModelTime, Stamp};
use crate::routing::{Vc, NVCS};
use crate::shape::{NodeId, Shape};
use crate::topology::Port;

/// 2: four VCs (answers in a class of their own). 3: modeled time in cell and credit
/// frames. 5: cut markers.
pub const VERSION: u8 = 5;
const TAG_HELLO: u8 = 0x48;
const TAG_CELL: u8 = 0x10;
const TAG_CREDIT: u8 = 0x20;
const TAG_MARKER: u8 = 0x4d;
pub const HELLO_LEN: usize = 21 + 4 * NVCS;

/// The first frame each end sends on a new link session: who it is, which port of it this
/// link is, which rack it belongs to, and how much buffer (per VC) the peer may fill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u8,
    pub node: NodeId,
    pub port: Port,
    pub shape: (u16, u16, u16),
    /// A digest of the rack's identity, so that daemons of different racks never link.
    pub rack: u64,
    pub grant: [u32; NVCS],
}

impl Hello {
    pub fn new(node: NodeId, port: Port, shape: &Shape, rack: u64, grant: [u32; NVCS]) -> Hello {
        Hello {
            version: VERSION,
            node,
            port,
            shape: (shape.x() as u16, shape.y() as u16, shape.z() as u16),
            rack,
            grant,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Hello(Hello),
    /// A cell; its modeled [`Stamp`] is in [`Cell::stamp`].
    Cell(Vc, Cell),
    /// Credit of `bytes` on a VC, freed at a modeled time.
    Credit(Vc, u32, ModelTime),
    /// The sender's marker of a cut (see [`crate::cut`]).
    Marker(u64),
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The cell frame was well formed but the cell inside is not; the stream goes on.
    #[error("bad cell of {len} B on {vc:?}: {err}")]
    Cell { vc: Vc, len: u32, err: CellError },
    #[error("unknown frame tag {0:#04x}; link byte stream is out of sync")]
    BadTag(u8),
    #[error("cell frame length {0} outside {OVERHEAD}..={MAX_CELL}")]
    BadLength(usize),
    #[error("hello names port index {0}, which does not exist")]
    BadPort(u8),
}

impl FrameError {
    /// True when the byte stream can no longer be trusted and the link must be reset.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, FrameError::Cell { .. })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            FrameError::Cell { err, .. } => err.kind(),
            FrameError::BadTag(_) => "frame_tag",
            FrameError::BadLength(_) => "frame_length",
            FrameError::BadPort(_) => "hello_port",
        }
    }
}

pub fn encode_hello(h: &Hello, out: &mut BytesMut) {
    out.reserve(HELLO_LEN);
    out.put_u8(TAG_HELLO);
    out.put_u8(h.version);
    out.put_u32(h.node.0);
    out.put_u8(h.port.index() as u8);
    out.put_u16(h.shape.0);
    out.put_u16(h.shape.1);
    out.put_u16(h.shape.2);
    out.put_u64(h.rack);
    for g in h.grant {
        out.put_u32(g);
    }
}

/// A cell frame as it arrived, whether or not its cell decodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawCell {
    pub vc: Vc,
    pub stamp: Stamp,
    /// The cell's wire bytes (header, payload, footer).
    pub wire: Bytes,
}

/// Bytes of framing before a cell: the tag (with the VC), the cell's length and its
/// modeled stamp.
pub const CELL_FRAME_HEADER: usize = 3 + 16;

/// Appends a cell frame, with the cell's stamp.
pub fn encode_cell(vc: Vc, cell: &Cell, out: &mut BytesMut) -> Result<(), CellError> {
    out.reserve(CELL_FRAME_HEADER + cell.wire_len());
    out.put_u8(TAG_CELL + vc.0);
    out.put_u16(cell.wire_len() as u16);
    put_stamp(cell.stamp, out);
    cell.encode(out)
}

fn put_stamp(s: Stamp, out: &mut BytesMut) {
    out.put_u64(s.head.0);
    out.put_u64(s.tail.0);
}

/// Appends a cell frame around already-encoded cell bytes (which may be deliberately
/// corrupt, e.g. from fault injection).
pub fn encode_raw_cell(vc: Vc, stamp: Stamp, wire: &[u8], out: &mut BytesMut) {
    out.reserve(CELL_FRAME_HEADER + wire.len());
    out.put_u8(TAG_CELL + vc.0);
    out.put_u16(wire.len() as u16);
    put_stamp(stamp, out);
    out.put_slice(wire);
}

/// Bytes of a credit frame: the tag (with the VC), the credit and when it was freed.
pub const CREDIT_FRAME_LEN: usize = 5 + 8;

pub fn encode_credit(vc: Vc, bytes: u32, freed: ModelTime, out: &mut BytesMut) {
    out.put_u8(TAG_CREDIT + vc.0);
    out.put_u32(bytes);
    out.put_u64(freed.0);
}

/// Bytes of a marker frame: the tag and the epoch.
pub const MARKER_FRAME_LEN: usize = 1 + 8;

pub fn encode_marker(epoch: u64, out: &mut BytesMut) {
    out.put_u8(TAG_MARKER);
    out.put_u64(epoch);
}

/// Incremental decoder for one direction of a link. Frames that lie whole inside a pushed
/// chunk are sliced out of it without copying; only a frame split across chunks is copied.
#[derive(Default)]
pub struct FrameDecoder {
    /// The start of a frame split across chunks.
    partial: BytesMut,
    /// What is left of the latest chunk.
    chunk: Bytes,
    /// Set after a fatal error: the rest of the stream is garbage.
    broken: bool,
}

/// The length of the frame that starts `b`, or `None` if `b` is too short to tell.
fn frame_len(b: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(&tag) = b.first() else {
        return Ok(None);
    };
    match tag {
        TAG_HELLO => Ok(Some(HELLO_LEN)),
        TAG_MARKER => Ok(Some(MARKER_FRAME_LEN)),
        t if (TAG_CELL..TAG_CELL + NVCS as u8).contains(&t) => {
            if b.len() < 3 {
                return Ok(None);
            }
            let len = u16::from_be_bytes([b[1], b[2]]) as usize;
            if (OVERHEAD..=MAX_CELL).contains(&len) {
                Ok(Some(CELL_FRAME_HEADER + len))
            } else {
                Err(FrameError::BadLength(len))
            }
        }
        t if (TAG_CREDIT..TAG_CREDIT + NVCS as u8).contains(&t) => Ok(Some(CREDIT_FRAME_LEN)),
        t => Err(FrameError::BadTag(t)),
    }
}

/// Decodes one whole frame (`frame_len` has vouched for its tag and length).
fn parse(mut b: Bytes) -> Result<Frame, FrameError> {
    let tag = b.get_u8();
    match tag {
        TAG_HELLO => {
            let version = b.get_u8();
            let node = NodeId(b.get_u32());
            let port_idx = b.get_u8();
            let shape = (b.get_u16(), b.get_u16(), b.get_u16());
            let rack = b.get_u64();
            let grant: [u32; NVCS] = std::array::from_fn(|_| b.get_u32());
            match Port::from_index(port_idx as usize) {
                Some(port) => Ok(Frame::Hello(Hello {
                    version,
                    node,
                    port,
                    shape,
                    rack,
                    grant,
                })),
                None => Err(FrameError::BadPort(port_idx)),
            }
        }
        TAG_MARKER => Ok(Frame::Marker(b.get_u64())),
        t if t >= TAG_CREDIT => {
            let bytes = b.get_u32();
            Ok(Frame::Credit(
                Vc(t - TAG_CREDIT),
                bytes,
                ModelTime(b.get_u64()),
            ))
        }
        t => {
            b.advance(2);
            let stamp = Stamp {
                head: ModelTime(b.get_u64()),
                tail: ModelTime(b.get_u64()),
            };
            let vc = Vc(t - TAG_CELL);
            Cell::decode(&b)
                .map(|mut c| {
                    c.stamp = stamp;
                    Frame::Cell(vc, c)
                })
                .map_err(|err| FrameError::Cell {
                    vc,
                    len: b.len() as u32,
                    err,
                })
        }
    }
}

impl FrameDecoder {
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    pub fn push(&mut self, data: &[u8]) {
        self.push_bytes(Bytes::copy_from_slice(data));
    }

    /// Takes a received chunk; the frames in it share its memory.
    pub fn push_bytes(&mut self, data: Bytes) {
        if self.broken {
            return;
        }
        if !self.chunk.is_empty() {
            // The caller pushed before draining: keep the stream in order.
            self.partial.extend_from_slice(&self.chunk);
        }
        self.chunk = data;
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.partial.len() + self.chunk.len()
    }

    /// The next complete frame, `None` when more bytes are needed.
    pub fn next_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        self.next(false).map(|(r, _)| r)
    }

    /// As [`FrameDecoder::next_frame`], with the wire bytes of the cell a cell frame
    /// carries, sound or not (for captures: they show what crossed the link). They share
    /// the received chunk's memory.
    pub fn next_frame_and_cell_bytes(
        &mut self,
    ) -> Option<(Result<Frame, FrameError>, Option<RawCell>)> {
        self.next(true)
    }

    /// The next frame, and its raw cell when `raw` (only captures pay for it).
    fn next(&mut self, raw: bool) -> Option<(Result<Frame, FrameError>, Option<RawCell>)> {
        if self.broken {
            return None;
        }
        let frame = loop {
            if self.partial.is_empty() {
                match frame_len(&self.chunk) {
                    Err(e) => break Err(e),
                    Ok(Some(n)) if self.chunk.len() >= n => break Ok(self.chunk.split_to(n)),
                    Ok(_) => {
                        self.partial.extend_from_slice(&self.chunk);
                        self.chunk.clear();
                        return None;
                    }
                }
            }
            match frame_len(&self.partial) {
                Err(e) => break Err(e),
                Ok(Some(n)) if self.partial.len() >= n => {
                    break Ok(self.partial.split_to(n).freeze())
                }
                need => {
                    if self.chunk.is_empty() {
                        return None;
                    }
                    // Enough to complete the frame, or to learn its length.
                    let want = match need {
                        Ok(Some(n)) => n - self.partial.len(),
                        _ => 3usize.saturating_sub(self.partial.len()).max(1),
                    };
                    let take = self.chunk.split_to(want.min(self.chunk.len()));
                    self.partial.extend_from_slice(&take);
                }
            }
        };
        let cell = frame
            .as_ref()
            .ok()
            .filter(|f| raw && (TAG_CELL..TAG_CELL + NVCS as u8).contains(&f[0]))
            .map(|f| {
                let mut stamp = f.slice(3..CELL_FRAME_HEADER);
                RawCell {
                    vc: Vc(f[0] - TAG_CELL),
                    stamp: Stamp {
                        head: ModelTime(stamp.get_u64()),
                        tail: ModelTime(stamp.get_u64()),
                    },
                    wire: f.slice(CELL_FRAME_HEADER..),
                }
            });
        let r = frame.and_then(parse);
        if let Err(e) = &r {
            if e.is_fatal() {
                self.broken = true;
                self.partial.clear();
                self.chunk.clear();
            }
        }
        Some((r, cell))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::CellType;
    use crate::gvas::{Gvas, Pdid};

    #[test]
    fn a_cell_frame_hands_out_its_cell_bytes_sound_or_corrupt() {
        let cell = Cell::new(
            Gvas::new(Pdid(3), NodeId(9), 1, 0x40).unwrap(),
            CellType::Write,
            NodeId(2),
            Bytes::from_static(b"abc"),
        )
        .unwrap();
        let mut wire = BytesMut::new();
        cell.encode(&mut wire).unwrap();
        let mut bad = wire.to_vec();
        bad[14] ^= 1; // the header CRC
        let mut out = BytesMut::new();
        encode_cell(Vc::ONE, &cell, &mut out).unwrap();
        encode_raw_cell(Vc::ONE, Stamp::default(), &bad, &mut out);
        out.put_u8(TAG_CREDIT);
        out.put_u32(64);
        out.put_u64(0);
        let mut d = FrameDecoder::new();
        d.push(&out);
        let (r, b) = d.next_frame_and_cell_bytes().unwrap();
        assert!(matches!(r, Ok(Frame::Cell(..))));
        let b = b.unwrap();
        assert_eq!((b.vc, b.stamp), (Vc::ONE, cell.stamp));
        assert_eq!(&b.wire[..], &wire[..]);
        let (r, b) = d.next_frame_and_cell_bytes().unwrap();
        assert!(matches!(r, Err(FrameError::Cell { .. })));
        assert_eq!(&b.unwrap().wire[..], &bad[..]);
        let (r, b) = d.next_frame_and_cell_bytes().unwrap();
        assert!(matches!(r, Ok(Frame::Credit(..))));
        assert_eq!(b, None);
    }

    #[test]
    fn frames_survive_any_split() {
        let shape = Shape::PROTOTYPE;
        let mut cell = Cell::new(
            Gvas::new(Pdid(1), NodeId(3), 0, 64).unwrap(),
            CellType::Load,
            NodeId(0),
            Bytes::from(vec![7u8; 100]),
        )
        .unwrap();
        cell.stamp = Stamp {
            head: ModelTime(1_234_567),
            tail: ModelTime(u64::MAX - 1),
        };
        let hello = Hello::new(
            NodeId(2),
            Port::Qfdb(4),
            &shape,
            99,
            [1000, 2000, 3000, 4000],
        );
        let mut out = BytesMut::new();
        encode_hello(&hello, &mut out);
        encode_cell(Vc::ONE, &cell, &mut out).unwrap();
        encode_credit(Vc::ZERO, 4096, ModelTime(77), &mut out);
        assert_eq!(out.len(), HELLO_LEN + 19 + 132 + 13);
        for split in 0..out.len() {
            let mut d = FrameDecoder::new();
            d.push(&out[..split]);
            let mut got = Vec::new();
            while let Some(f) = d.next_frame() {
                got.push(f.unwrap());
            }
            d.push(&out[split..]);
            while let Some(f) = d.next_frame() {
                got.push(f.unwrap());
            }
            assert_eq!(
                got,
                vec![
                    Frame::Hello(hello.clone()),
                    Frame::Cell(Vc::ONE, cell.clone()),
                    Frame::Credit(Vc::ZERO, 4096, ModelTime(77))
                ]
            );
        }
    }

    #[test]
    fn corrupt_cell_is_dropped_and_stream_continues() {
        let cell = Cell::new(
            Gvas::new(Pdid(1), NodeId(3), 0, 64).unwrap(),
            CellType::Load,
            NodeId(0),
            Bytes::from(vec![7u8; 10]),
        )
        .unwrap();
        let good = cell.to_bytes().unwrap().to_vec();
        // A footer flip: refused, the stream goes on.
        let mut bad_footer = good.clone();
        bad_footer[good.len() - 10] ^= 0x10;
        // A payload flip: decoded, marked corrupt for its destination to NACK.
        let mut bad_payload = good.clone();
        bad_payload[20] ^= 0x10;
        let mut out = BytesMut::new();
        encode_raw_cell(Vc::ZERO, Stamp::default(), &bad_footer, &mut out);
        encode_raw_cell(Vc::ZERO, Stamp::default(), &bad_payload, &mut out);
        encode_credit(Vc::ONE, 5, ModelTime(9), &mut out);
        let mut d = FrameDecoder::new();
        d.push(&out);
        let e = d.next_frame().unwrap().unwrap_err();
        assert!(!e.is_fatal());
        assert_eq!(e.kind(), "footer_crc");
        match d.next_frame().unwrap().unwrap() {
            Frame::Cell(_, c) => assert!(c.is_corrupt()),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            d.next_frame().unwrap().unwrap(),
            Frame::Credit(Vc::ONE, 5, ModelTime(9))
        );
    }

    #[test]
    fn garbage_breaks_the_stream_once() {
        let mut d = FrameDecoder::new();
        d.push(&[0x99, 1, 2, 3]);
        assert_eq!(d.next_frame(), Some(Err(FrameError::BadTag(0x99))));
        d.push(&[0x20, 0, 0, 0, 1]);
        assert_eq!(d.next_frame(), None);
    }
}
