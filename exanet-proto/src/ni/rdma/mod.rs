//! The RDMA engine (SPEC §4, the thesis): 16 pages, each with 32 write and 32 read
//! channels. A write is cut into 16 KB blocks that never cross a 16 KB boundary of the
//! destination, and each block into cells that break at every 256 B boundary of the
//! destination (so no cell crosses 4 KB, and after a short first cell the rest are
//! 256 B aligned). The receiver tracks each block in a 64-bit bitmap and answers once per
//! block; the sender keeps a window of blocks in flight and retransmits only blocks that
//! were NACKed, each time with a higher sequence number. The receiver ignores cells of an
//! older sequence and restarts a block on a newer one, and remembers finished blocks for a
//! while so that a late copy never writes over newer data.
//!
//! Lost cells (an emulator extension; the hardware's links did not lose cells): when a
//! block's last cell arrives and others of its attempt did not, the receiver answers
//! `Incomplete` with its bitmap, and the sender resends only the missing cells, in the
//! same attempt, ending with the last cell again. A block whose answer does not come in
//! time is probed with its last cell alone, which asks for that answer. So a lossy path
//! costs the cells it loses rather than whole 64-cell blocks, and the attempt limit counts
//! timeouts in a row rather than the rounds a block needs.
//!
//! A read is a request to the remote node's engine (acknowledged like a packetizer
//! message), which serves it as a write back into the reader's memory followed by a
//! "read done" notification; the reader's channel completes on that notification.
//!
//! Transaction ids (bit 31 set marks RDMA): a local transfer is
//! `1 | served 0 | read r | page 4 | channel 5 | generation 20`; a write that serves a
//! remote read is `1 | 1 | counter 30`.
//!
//! The engine has two halves, as a QUIC stream has a send and a receive side: the
//! initiator (`initiator.rs`) owns what this node sends (its channels, posted writes and
//! reads, the writes that serve remote reads, their windows, timers and repairs) and the
//! target (`target.rs`) what it receives (blocks being reassembled, finished blocks and
//! served requests remembered, notifications). They meet only here: data arriving for a
//! read keeps that read alive, a "read done" notification ends it, and a read request the
//! target accepts becomes a write the initiator sends.

mod initiator;
mod target;

use bytes::{BufMut, Bytes, BytesMut};

use super::{Ctx, Failure, Memory, NackReason, NiConfig, NiError, RdmaRead, RdmaWrite};
use crate::cell::{Cell, CellType, Engine};
use crate::model::ModelTime;
use crate::shape::NodeId;
use crate::time::Instant;
use initiator::Initiator;
use target::Target;

pub const RDMA_PAGES: usize = 16;
pub const WRITE_CHANNELS: usize = 32;
pub const READ_CHANNELS: usize = 32;
pub const BLOCK_SIZE: u64 = 16 * 1024;
pub const CELL_SIZE: u64 = 256;
/// Longest single transfer.
pub const MAX_TRANSFER: u64 = 1 << 32;
/// Writes serving remote reads at once; further requests are NACKed (no context).
pub const MAX_SERVED: usize = 512;

pub(crate) const TXN_RDMA: u32 = 1 << 31;
const TXN_SERVED: u32 = 1 << 30;
const TXN_READ: u32 = 1 << 29;
const GEN_MASK: u32 = (1 << 20) - 1;
/// The block "number" that answers to a notification cell carry.
const NOTIFY_BLOCK: u64 = u64::MAX;
const VA_LIMIT: u64 = 1 << crate::gvas::VA_BITS;

/// Names a posted transfer; what completions report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransferId {
    pub page: u8,
    pub ch: u8,
    pub read: bool,
    pub gen: u32,
}

impl TransferId {
    fn txn(&self) -> u32 {
        TXN_RDMA
            | if self.read { TXN_READ } else { 0 }
            | (u32::from(self.page) << 25)
            | (u32::from(self.ch) << 20)
            | (self.gen & GEN_MASK)
    }
}

/// Lowers a wake-up hint to `at`.
fn arm(wake: &mut Option<Instant>, at: Instant) {
    *wake = Some(wake.map_or(at, |w| w.min(at)));
}

/// The payload of an answer to `cell`: the block it concerns, for RDMA cells.
pub(crate) fn answer_payload(cell: &Cell) -> Bytes {
    if cell.engine != Engine::Rdma {
        return Bytes::new();
    }
    let block = match cell.kind {
        CellType::Write => cell.dst.va() / BLOCK_SIZE,
        CellType::Notify => NOTIFY_BLOCK,
        _ => return Bytes::new(),
    };
    Bytes::copy_from_slice(&block.to_be_bytes())
}

/// The payload of an [`NackReason::Incomplete`] answer: the block, then the bitmap of its
/// cells that arrived.
fn incomplete_payload(block_no: u64, arrived: u64) -> Bytes {
    let mut p = BytesMut::with_capacity(16);
    p.put_u64(block_no);
    p.put_u64(arrived);
    p.freeze()
}

fn answered_block(ans: &Cell) -> Option<u64> {
    let b: [u8; 8] = ans.payload.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

/// The cells of the block that arrived, from an [`NackReason::Incomplete`] answer.
fn answered_bitmap(ans: &Cell) -> Option<u64> {
    let b: [u8; 8] = ans.payload.get(8..16)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

/// What a notification says (the 16-byte payload of a `Notify` cell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Note {
    kind: u8,
    /// Of "read done": 0, or how the read failed ([`failure_code`]).
    status: u8,
    /// The txn the notification names (the reader's read txn for "read done").
    txn: u32,
    /// The transfer's length.
    len: u64,
}

impl Note {
    /// A write finished: written into the destination's memory at the notify VA.
    const WRITE: u8 = 1;
    /// A served read finished: its reader's channel completes.
    const READ_DONE: u8 = 2;

    fn encode(&self) -> Bytes {
        let mut p = BytesMut::with_capacity(16);
        p.put_u8(self.kind);
        p.put_u8(self.status);
        p.put_u16(0);
        p.put_u32(self.txn);
        p.put_u64(self.len);
        p.freeze()
    }

    fn decode(p: &[u8]) -> Option<Note> {
        let p: &[u8; 16] = p.try_into().ok()?;
        Some(Note {
            kind: p[0],
            status: p[1],
            txn: u32::from_be_bytes(p[4..8].try_into().expect("4 bytes")),
            len: u64::from_be_bytes(p[8..16].try_into().expect("8 bytes")),
        })
    }
}

fn check_range(va: u64, len: u64) -> Result<(), NiError> {
    if len == 0 || len > MAX_TRANSFER {
        return Err(NiError::BadLength(len));
    }
    if va.checked_add(len).is_none_or(|e| e > VA_LIMIT) {
        return Err(NiError::BadRange { va, len });
    }
    Ok(())
}

fn failure_code(f: Failure) -> u8 {
    match f {
        Failure::Nacked(r) => r as u8,
        Failure::TimedOut => 0x80,
        Failure::LocalFault => 0x81,
        Failure::Detached => 0x82,
        Failure::Aborted(_) => 0x83,
    }
}

fn failure_from_code(c: u8) -> Failure {
    match c {
        0x80 => Failure::TimedOut,
        0x81 => Failure::Nacked(NackReason::PageFault),
        0x82 => Failure::Detached,
        c => Failure::Nacked(NackReason::from_u8(c).unwrap_or(NackReason::BadAddress)),
    }
}

pub struct RdmaEngine {
    initiator: Initiator,
    target: Target,
}

impl Default for RdmaEngine {
    fn default() -> Self {
        RdmaEngine::new()
    }
}

impl RdmaEngine {
    pub fn new() -> RdmaEngine {
        RdmaEngine::with_epoch(0)
    }

    /// An engine whose transaction ids start from `epoch`, so that ids of an NI that was
    /// restarted do not repeat ids its peers still remember from the previous run.
    pub fn with_epoch(epoch: u32) -> RdmaEngine {
        RdmaEngine {
            initiator: Initiator::with_epoch(epoch),
            target: Target::with_epoch(epoch),
        }
    }

    /// Gives a free engine page to `rank`.
    pub fn alloc_page(&mut self, rank: u8) -> Result<u8, NiError> {
        self.initiator.alloc_page(rank)
    }

    /// Returns a page; refused while any of its channels is busy.
    pub fn free_page(&mut self, rank: u8, page: u8) -> Result<(), NiError> {
        self.initiator.free_page(rank, page)
    }

    /// Transfers in progress (local and served).
    pub fn active(&self) -> usize {
        self.initiator.active()
    }

    /// Blocks cut and not yet acknowledged that read `rank`'s memory: the engine's state
    /// for that rank's transfers, bounded by `rank_window_blocks`.
    pub fn live_blocks(&self, rank: u8) -> usize {
        self.initiator.live_blocks(rank)
    }

    /// Posts `op` for `rank` (its destination already stamped with the rank's PDID).
    pub(crate) fn post_write(
        &mut self,
        cx: &mut Ctx,
        rank: u8,
        op: &RdmaWrite,
        mem: &dyn Memory,
    ) -> Result<TransferId, NiError> {
        self.initiator.post_write(cx, rank, op, mem)
    }

    /// Posts `op` for `rank` (its source already stamped with the rank's PDID).
    pub(crate) fn post_read(
        &mut self,
        cx: &mut Ctx,
        rank: u8,
        op: &RdmaRead,
    ) -> Result<TransferId, NiError> {
        self.initiator.post_read(cx, rank, op)
    }

    /// Cuts more blocks of the transfers in progress (call when the fabric has room).
    pub(crate) fn refill(&mut self, cx: &mut Ctx, mem: &dyn Memory) {
        self.initiator.refill(cx, mem);
    }

    /// See `Initiator::earliest_uncut`.
    pub(crate) fn earliest_uncut(&self, cfg: &NiConfig) -> Option<(ModelTime, u8)> {
        self.initiator.earliest_uncut(cfg)
    }

    /// See `Initiator::horizon`: served reads are transfers of the initiator too.
    pub(crate) fn horizon(&self, cfg: &NiConfig, at: &mut dyn FnMut(NodeId, ModelTime)) {
        self.initiator.horizon(cfg, at)
    }

    /// The cell from the NI's queue was injected into the fabric at `now`.
    pub(crate) fn on_injected(&mut self, cell: &Cell, now: Instant, cfg: &NiConfig) {
        self.initiator.on_injected(cell, now, cfg);
    }

    pub(crate) fn on_departed(&mut self, cell: &Cell) {
        self.initiator.on_departed(cell);
    }

    /// An ACK or NACK of something this engine sent.
    pub(crate) fn on_answer(
        &mut self,
        cx: &mut Ctx,
        ans: &Cell,
        nack: Option<NackReason>,
        mem: &dyn Memory,
    ) {
        self.initiator.on_answer(cx, ans, nack, mem);
    }

    /// A data cell of some block arrived.
    pub(crate) fn on_data(&mut self, cx: &mut Ctx, cell: &Cell, mem: &mut dyn Memory) {
        if self.target.on_data(cx, cell, mem) {
            self.initiator
                .data_arrived(cx.now, cx.cfg, cell.src, cell.dst.va());
        }
    }

    /// A remote node asks to read this node's memory.
    pub(crate) fn on_read_request(&mut self, cx: &mut Ctx, cell: &Cell, mem: &dyn Memory) {
        let initiator = &self.initiator;
        if let Some(serve) = self
            .target
            .on_read_request(cx, cell, mem, || initiator.served())
        {
            self.initiator.serve(cx, serve, mem);
        }
    }

    /// Answers `cell` if it is a copy of a block, notice or read this NI's target
    /// finished (see `Target::answer_copy`); false when it is not one.
    pub(crate) fn answer_copy(&mut self, cx: &mut Ctx, cell: &Cell) -> bool {
        self.target.answer_copy(cx, cell)
    }

    /// A notification arrived.
    pub(crate) fn on_notify(&mut self, cx: &mut Ctx, cell: &Cell, mem: &mut dyn Memory) {
        if let Some(done) = self.target.on_notify(cx, cell, mem) {
            self.initiator.read_done(cx, done);
        }
    }

    /// No earlier than the engine's next deadline.
    pub(crate) fn next_deadline(&self, cfg: &NiConfig) -> Option<Instant> {
        [
            self.initiator.next_deadline(),
            self.target.next_deadline(cfg),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Retransmits, retries and expiries due at `cx.now`.
    pub(crate) fn on_timeout(&mut self, cx: &mut Ctx, mem: &dyn Memory) {
        self.initiator.on_timeout(cx, mem);
        self.target.on_timeout(cx);
    }

    /// The process on `rank` is gone: what it posted and what reads its memory end.
    pub(crate) fn detach(&mut self, cx: &mut Ctx, rank: u8) {
        self.initiator.detach(cx, rank);
    }
}
