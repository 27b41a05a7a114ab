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

use std::collections::{BTreeMap, VecDeque};

use bytes::{BufMut, Bytes, BytesMut};

use super::{
    answer, answer_with, backoff, Failure, Memory, NackReason, NiConfig, NiError, NiEvent, NiStats,
    Out, RANKS,
};
use crate::cell::{Cell, CellType, FLAG_FIRST, FLAG_LAST, FLAG_NOTIFY};
use crate::gvas::Gvas;
use crate::shape::NodeId;
use crate::time::Instant;

pub const RDMA_PAGES: usize = 16;
pub const WRITE_CHANNELS: usize = 32;
pub const READ_CHANNELS: usize = 32;
pub const BLOCK_SIZE: u64 = 16 * 1024;
pub const CELL_SIZE: u64 = 256;
/// Longest single transfer.
pub const MAX_TRANSFER: u64 = 1 << 32;
/// Repairs of one block that a sender makes on its receiver's word (see
/// [`NackReason::Incomplete`]); past them only its own timer and attempt limit count.
const REPAIRS: u8 = 64;
/// Writes serving remote reads at once; further requests are NACKed (no context).
pub const MAX_SERVED: usize = 512;
/// Cells the engine keeps queued for injection; more blocks are cut only below this.
const OUTBOX_CELLS: usize = 512;

pub(crate) const TXN_RDMA: u32 = 1 << 31;
const TXN_SERVED: u32 = 1 << 30;
const TXN_READ: u32 = 1 << 29;
const GEN_MASK: u32 = (1 << 20) - 1;
/// The block "number" that answers to a notification cell carry.
const NOTIFY_BLOCK: u64 = u64::MAX;
const VA_LIMIT: u64 = 1 << crate::gvas::VA_BITS;

const NOTE_WRITE: u8 = 1;
const NOTE_READ_DONE: u8 = 2;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Pending,
    InFlight { deadline: Instant },
    Retry { at: Instant },
    Done,
}

impl Step {
    /// When the step needs the timer, if it does.
    fn deadline(&self) -> Option<Instant> {
        match self {
            Step::InFlight { deadline } => Some(*deadline),
            Step::Retry { at } => Some(*at),
            _ => None,
        }
    }
}

/// Lowers the engine's wake-up hint to `at`.
fn arm(wake: &mut Option<Instant>, at: Instant) {
    *wake = Some(wake.map_or(at, |w| w.min(at)));
}

/// A block that was cut and is not finished yet. Which block it is (its offset and
/// length) follows from its index in the transfer, so nothing is kept for blocks not cut
/// yet or already acknowledged: a transfer costs its window, not its length.
#[derive(Clone, Copy, Debug)]
struct Block {
    seq: u16,
    attempts: u8,
    /// Resends of missing cells (see [`NackReason::Incomplete`]), over all attempts.
    repairs: u8,
    /// Sends of the block's last cell (each asks for one answer) since the last answer:
    /// an answer dates the send unambiguously (Karn) only when there was one.
    unanswered: u8,
    step: Step,
    sent_at: Instant,
}

/// Round-trip estimate of blocks to one destination (RFC 6298's smoothing). The time a
/// block waits for its answer includes the whole window queued ahead of it, so a fixed
/// timeout either fires spuriously on a busy path or waits needlessly on an idle one.
#[derive(Clone, Copy, Debug, Default)]
struct Rtt {
    srtt: u64,
    rttvar: u64,
    valid: bool,
}

impl Rtt {
    fn sample(&mut self, ns: u64) {
        if self.valid {
            let d = self.srtt.abs_diff(ns);
            self.rttvar = (3 * self.rttvar + d) / 4;
            self.srtt = (7 * self.srtt + ns) / 8;
        } else {
            self.srtt = ns;
            self.rttvar = ns / 2;
            self.valid = true;
        }
    }

    /// The retransmission timeout: never below the configured one.
    fn rto(&self, cfg: &NiConfig) -> u64 {
        if self.valid {
            cfg.retransmit_ns.max(self.srtt + 4 * self.rttvar)
        } else {
            cfg.retransmit_ns
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Origin {
    Local(TransferId),
    /// Serving a remote read; the notice tells the reader how it went.
    Served,
}

/// The notification a transfer sends after its last block.
#[derive(Clone, Copy, Debug)]
struct Notice {
    dst: Gvas,
    kind: u8,
    /// The txn the notice names (the reader's read txn for "read done").
    txn: u32,
    seq: u16,
    attempts: u8,
    step: Step,
    status: u8,
}

struct Transfer {
    rank: u8,
    src_va: u64,
    dst: Gvas,
    len: u64,
    /// Blocks in the transfer.
    count: u64,
    /// The next block to cut.
    next: u64,
    /// Blocks acknowledged.
    done: u64,
    /// Blocks cut and not acknowledged, by index: what is in flight or waits for a retry.
    live: BTreeMap<u64, Block>,
    notice: Option<Notice>,
    origin: Origin,
}

impl Transfer {
    fn new(
        rank: u8,
        src_va: u64,
        dst: Gvas,
        len: u64,
        origin: Origin,
        notice: Option<Notice>,
    ) -> Transfer {
        let first = dst.va() / BLOCK_SIZE;
        let last = (dst.va() + len - 1) / BLOCK_SIZE;
        Transfer {
            rank,
            src_va,
            dst,
            len,
            count: last - first + 1,
            next: 0,
            done: 0,
            live: BTreeMap::new(),
            notice,
            origin,
        }
    }

    /// Offset in the transfer and length of block `i`: blocks end at every 16 KB
    /// boundary of the destination.
    fn span(&self, i: u64) -> (u64, u64) {
        let base = self.dst.va() / BLOCK_SIZE;
        let start = if i == 0 {
            self.dst.va()
        } else {
            (base + i) * BLOCK_SIZE
        };
        let end = ((base + i + 1) * BLOCK_SIZE).min(self.dst.va() + self.len);
        (start - self.dst.va(), end - start)
    }

    /// The index of the transfer's block whose destination block number is `block_no`.
    fn block_of(&self, block_no: u64) -> Option<u64> {
        let i = block_no.checked_sub(self.dst.va() / BLOCK_SIZE)?;
        (i < self.count).then_some(i)
    }
}

/// A read this node asked for.
struct PendingRead {
    rank: u8,
    id: TransferId,
    request: Cell,
    /// Where the data lands: arrivals there keep the read alive.
    dst_va: u64,
    len: u64,
    attempts: u8,
    /// Until the request is ACKed: retransmit deadline; after: the whole read's deadline.
    deadline: Instant,
    acked: bool,
}

#[derive(Clone, Copy, Debug)]
struct RxBlock {
    seq: u16,
    bitmap: u64,
    last: Option<u8>,
    touched: Instant,
}

type RxKey = (NodeId, u32, u64);

pub struct RdmaEngine {
    pages: [Option<u8>; RDMA_PAGES],
    write_busy: [[bool; WRITE_CHANNELS]; RDMA_PAGES],
    read_busy: [[bool; READ_CHANNELS]; RDMA_PAGES],
    gens: [[u32; WRITE_CHANNELS + READ_CHANNELS]; RDMA_PAGES],
    transfers: BTreeMap<u32, Transfer>,
    /// Transfers with blocks not yet cut, oldest first.
    sending: VecDeque<u32>,
    reads: BTreeMap<u32, PendingRead>,
    served_next: u32,
    /// Read requests being served or served recently: (reader, read txn) -> when.
    served_seen: BTreeMap<(NodeId, u32), Instant>,
    rx: BTreeMap<RxKey, RxBlock>,
    /// Finished blocks: key -> (sequence, when), to drop late copies.
    finished: BTreeMap<RxKey, (u16, Instant)>,
    finished_order: VecDeque<(Instant, RxKey)>,
    rtt: BTreeMap<NodeId, Rtt>,
    /// Blocks cut and not finished, by the rank whose memory they read (the poster's, or
    /// the served rank's): no rank may have more than `rank_window_blocks` of them, so a
    /// rank with many channels busy neither crowds out the others nor makes the engine
    /// keep more state than the windows.
    rank_live: [usize; RANKS],
    /// No deadline of the engine is earlier than this (`None`: it has none). Every
    /// deadline set lowers it; [`RdmaEngine::on_timeout`] makes it exact again. It spares
    /// [`RdmaEngine::next_deadline`], asked after every input, a scan of every block of
    /// every transfer; an early hint costs one wake-up that finds nothing due.
    wake: Option<Instant>,
}

impl Default for RdmaEngine {
    fn default() -> Self {
        RdmaEngine::new()
    }
}

/// The payload of an answer to `cell`: the block it concerns, for RDMA cells.
pub(crate) fn answer_payload(cell: &Cell) -> Bytes {
    if cell.txn & TXN_RDMA == 0 {
        return Bytes::new();
    }
    let block = match cell.kind {
        CellType::Write => cell.dst.va() / BLOCK_SIZE,
        CellType::Notify => NOTIFY_BLOCK,
        _ => return Bytes::new(),
    };
    Bytes::copy_from_slice(&block.to_be_bytes())
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

fn check_range(va: u64, len: u64) -> Result<(), NiError> {
    if len == 0 || len > MAX_TRANSFER {
        return Err(NiError::BadLength(len));
    }
    if va.checked_add(len).is_none_or(|e| e > VA_LIMIT) {
        return Err(NiError::BadRange { va, len });
    }
    Ok(())
}

impl RdmaEngine {
    pub fn new() -> RdmaEngine {
        RdmaEngine::with_epoch(0)
    }

    /// An engine whose transaction ids start from `epoch`, so that ids of an NI that was
    /// restarted do not repeat ids its peers still remember from the previous run.
    pub fn with_epoch(epoch: u32) -> RdmaEngine {
        RdmaEngine {
            pages: [None; RDMA_PAGES],
            write_busy: [[false; WRITE_CHANNELS]; RDMA_PAGES],
            read_busy: [[false; READ_CHANNELS]; RDMA_PAGES],
            gens: [[epoch & GEN_MASK; WRITE_CHANNELS + READ_CHANNELS]; RDMA_PAGES],
            transfers: BTreeMap::new(),
            sending: VecDeque::new(),
            reads: BTreeMap::new(),
            served_next: epoch & (TXN_SERVED - 1),
            served_seen: BTreeMap::new(),
            rx: BTreeMap::new(),
            finished: BTreeMap::new(),
            finished_order: VecDeque::new(),
            rtt: BTreeMap::new(),
            rank_live: [0; RANKS],
            wake: None,
        }
    }

    /// The last cell of a block (or a notice) left for the fabric: its answer can only be
    /// expected from now on, so its timer starts now rather than when it was cut.
    pub(crate) fn on_injected(&mut self, cell: &Cell, now: Instant, cfg: &NiConfig) {
        if cell.flags & FLAG_LAST == 0 || cell.txn & TXN_RDMA == 0 {
            return;
        }
        let rto = self.rto(cfg, cell.dst.node());
        let Some(t) = self.transfers.get_mut(&cell.txn) else {
            return;
        };
        let step = if cell.kind == CellType::Notify {
            t.notice.as_mut().map(|n| (n.attempts, &mut n.step))
        } else {
            let i = t.block_of(cell.dst.va() / BLOCK_SIZE);
            i.and_then(|i| t.live.get_mut(&i))
                .filter(|b| b.seq == cell.seq)
                .map(|b| {
                    b.sent_at = now;
                    (b.attempts, &mut b.step)
                })
        };
        if let Some((attempts, step @ Step::InFlight { .. })) = step {
            let deadline = now + backoff(rto, attempts);
            *step = Step::InFlight { deadline };
            arm(&mut self.wake, deadline);
        }
    }

    fn rto(&self, cfg: &NiConfig, dst: NodeId) -> u64 {
        self.rtt.get(&dst).map_or(cfg.retransmit_ns, |r| r.rto(cfg))
    }

    /// Gives a free engine page to `rank`.
    pub fn alloc_page(&mut self, rank: u8) -> Result<u8, NiError> {
        let p = self
            .pages
            .iter()
            .position(Option::is_none)
            .ok_or(NiError::Exhausted("RDMA page"))?;
        self.pages[p] = Some(rank);
        Ok(p as u8)
    }

    /// Returns a page; refused while any of its channels is busy.
    pub fn free_page(&mut self, rank: u8, page: u8) -> Result<(), NiError> {
        self.check_page(rank, page)?;
        let p = page as usize;
        if self.write_busy[p]
            .iter()
            .chain(self.read_busy[p].iter())
            .any(|b| *b)
        {
            return Err(NiError::Busy {
                what: "RDMA page",
                index: p,
            });
        }
        self.pages[p] = None;
        Ok(())
    }

    /// The page is the rank's and the channel exists and is free.
    fn check_channel(&self, rank: u8, page: u8, ch: u8, read: bool) -> Result<(), NiError> {
        self.check_page(rank, page)?;
        let (what, busy) = if read {
            ("RDMA read channel", &self.read_busy[page as usize])
        } else {
            ("RDMA write channel", &self.write_busy[page as usize])
        };
        match busy.get(ch as usize) {
            None => Err(NiError::NoSuch {
                what,
                index: ch as usize,
            }),
            Some(true) => Err(NiError::Busy {
                what,
                index: ch as usize,
            }),
            Some(false) => Ok(()),
        }
    }

    fn check_page(&self, rank: u8, page: u8) -> Result<(), NiError> {
        match self.pages.get(page as usize) {
            None | Some(None) => Err(NiError::NoSuch {
                what: "RDMA page",
                index: page as usize,
            }),
            Some(Some(r)) if *r != rank => Err(NiError::NotOwner {
                what: "RDMA page",
                index: page as usize,
            }),
            _ => Ok(()),
        }
    }

    /// Transfers in progress (local and served).
    pub fn active(&self) -> usize {
        self.transfers.len() + self.reads.len()
    }

    /// Blocks cut and not yet acknowledged that read `rank`'s memory: the engine's state
    /// for that rank's transfers, bounded by `rank_window_blocks`.
    pub fn live_blocks(&self, rank: u8) -> usize {
        self.rank_live.get(rank as usize).copied().unwrap_or(0)
    }

    fn next_id(&mut self, page: u8, ch: u8, read: bool) -> TransferId {
        let g = &mut self.gens[page as usize][ch as usize + if read { WRITE_CHANNELS } else { 0 }];
        *g = (*g + 1) & GEN_MASK;
        TransferId {
            page,
            ch,
            read,
            gen: *g,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post_write(
        &mut self,
        _me: NodeId,
        cfg: &NiConfig,
        rank: u8,
        page: u8,
        ch: u8,
        src_va: u64,
        dst: Gvas,
        len: u64,
        notify: Option<u64>,
        now: Instant,
        mem: &dyn Memory,
        out: &mut Out,
        stats: &mut NiStats,
    ) -> Result<TransferId, NiError> {
        self.check_channel(rank, page, ch, false)?;
        check_range(src_va, len)?;
        check_range(dst.va(), len)?;
        let id = self.next_id(page, ch, false);
        let notice = match notify {
            Some(va) => Some(Notice {
                dst: dst
                    .with_va(va)
                    .map_err(|_| NiError::BadRange { va, len: 16 })?,
                kind: NOTE_WRITE,
                txn: id.txn(),
                seq: 0,
                attempts: 0,
                step: Step::Pending,
                status: 0,
            }),
            None => None,
        };
        if !mem.contains(rank, src_va, len) {
            // The source is not registered memory: the transfer fails as it would at its
            // first unreadable block, but before a block record is made for it (a 4 GiB
            // write is 262,144 of them, all made under the daemon's core lock).
            stats.rdma_transfers_failed += 1;
            out.events.push_back(NiEvent::Rdma {
                rank,
                id,
                result: Err(Failure::LocalFault),
            });
            return Ok(id);
        }
        self.write_busy[page as usize][ch as usize] = true;
        let txn = id.txn();
        self.transfers.insert(
            txn,
            Transfer::new(rank, src_va, dst, len, Origin::Local(id), notice),
        );
        self.sending.push_back(txn);
        self.refill(now, cfg, mem, out, stats);
        Ok(id)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post_read(
        &mut self,
        me: NodeId,
        cfg: &NiConfig,
        rank: u8,
        page: u8,
        ch: u8,
        src: Gvas,
        dst_va: u64,
        len: u64,
        now: Instant,
        out: &mut Out,
    ) -> Result<TransferId, NiError> {
        self.check_channel(rank, page, ch, true)?;
        check_range(src.va(), len)?;
        check_range(dst_va, len)?;
        let id = self.next_id(page, ch, true);
        let mut p = BytesMut::with_capacity(16);
        p.put_u64(dst_va);
        p.put_u64(len);
        let mut request =
            Cell::new(src, CellType::ReadRequest, me, p.freeze()).expect("16 B payload");
        request.txn = id.txn();
        request.src_rank = rank;
        request.flags = FLAG_FIRST | FLAG_LAST;
        out.cells.push_back(request.clone());
        self.read_busy[page as usize][ch as usize] = true;
        let deadline = now + cfg.retransmit_ns;
        arm(&mut self.wake, deadline);
        self.reads.insert(
            id.txn(),
            PendingRead {
                rank,
                id,
                request,
                dst_va,
                len,
                attempts: 1,
                deadline,
                acked: false,
            },
        );
        Ok(id)
    }

    /// Cuts more blocks of the transfers in progress, within each transfer's window and
    /// while the outbox is short.
    pub(crate) fn refill(
        &mut self,
        now: Instant,
        cfg: &NiConfig,
        mem: &dyn Memory,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        let mut rounds = self.sending.len();
        while rounds > 0 && out.cells.len() < OUTBOX_CELLS {
            rounds -= 1;
            let Some(txn) = self.sending.pop_front() else {
                break;
            };
            let Some(dst) = self.transfers.get(&txn).map(|t| t.dst.node()) else {
                continue;
            };
            let rto = self.rto(cfg, dst);
            let Some(t) = self.transfers.get_mut(&txn) else {
                continue;
            };
            let mut failed = false;
            let rank = t.rank as usize;
            while t.next < t.count
                && t.live.len() < cfg.window_blocks
                && self.rank_live[rank] < cfg.rank_window_blocks
                && out.cells.len() < OUTBOX_CELLS
            {
                let i = t.next;
                t.next += 1;
                t.live.insert(
                    i,
                    Block {
                        seq: 0,
                        attempts: 0,
                        repairs: 0,
                        unanswered: 0,
                        step: Step::Pending,
                        sent_at: now,
                    },
                );
                self.rank_live[rank] += 1;
                match send_block(t, i, txn, now, rto, mem, out, stats) {
                    Ok(deadline) => arm(&mut self.wake, deadline),
                    Err(()) => {
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                self.fail(txn, Failure::LocalFault, now, cfg, out, stats);
            } else if t.next < t.count {
                self.sending.push_back(txn);
            }
        }
    }

    fn fail(
        &mut self,
        txn: u32,
        f: Failure,
        now: Instant,
        cfg: &NiConfig,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        let Some(t) = self.transfers.get_mut(&txn) else {
            return;
        };
        stats.rdma_transfers_failed += 1;
        match t.origin {
            Origin::Local(_) => {
                let t = self.remove_transfer(txn).expect("present");
                self.finish_local(&t, Err(f), out);
            }
            Origin::Served => match t.notice.as_mut() {
                // Tell the reader its read failed, then forget the transfer when that
                // notice is answered.
                Some(n) if n.step == Step::Pending => {
                    n.status = failure_code(f);
                    // No block of a failed read may be cut after the reader was told.
                    self.rank_live[t.rank as usize] -= t.live.len();
                    t.live.clear();
                    t.next = t.count;
                    t.done = t.count;
                    if let Some(deadline) = send_notice(t, txn, now, cfg, out) {
                        arm(&mut self.wake, deadline);
                    }
                }
                // The notice itself failed: the reader's own deadline ends its read.
                _ => {
                    self.remove_transfer(txn);
                }
            },
        }
    }

    /// Forgets a transfer, and the blocks it had live.
    fn remove_transfer(&mut self, txn: u32) -> Option<Transfer> {
        let t = self.transfers.remove(&txn)?;
        self.rank_live[t.rank as usize] -= t.live.len();
        Some(t)
    }

    fn finish_local(&mut self, t: &Transfer, result: Result<(), Failure>, out: &mut Out) {
        if let Origin::Local(id) = t.origin {
            self.write_busy[id.page as usize][id.ch as usize] = false;
            out.events.push_back(NiEvent::Rdma {
                rank: t.rank,
                id,
                result,
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_answer(
        &mut self,
        ans: &Cell,
        nack: Option<NackReason>,
        now: Instant,
        cfg: &NiConfig,
        mem: &dyn Memory,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        let txn = ans.txn;
        if txn & TXN_READ != 0 && txn & TXN_SERVED == 0 {
            // The answer to a read request.
            let Some(r) = self.reads.get_mut(&txn) else {
                return;
            };
            if r.acked || ans.src != r.request.dst.node() {
                return;
            }
            match nack {
                None => {
                    r.acked = true;
                    // From here the server's write carries the read; its data arriving
                    // keeps the read alive (see on_data), silence ends it.
                    r.deadline = now + read_idle(cfg, self.rtt.get(&ans.src));
                    arm(&mut self.wake, r.deadline);
                }
                Some(reason) if reason.transient() && r.attempts < cfg.max_attempts => {
                    r.deadline = now + cfg.nack_retry_ns;
                    arm(&mut self.wake, r.deadline);
                }
                Some(reason) => {
                    let r = self.reads.remove(&txn).expect("present");
                    self.finish_read(&r, Err(Failure::Nacked(reason)), out, stats);
                }
            }
            return;
        }
        let Some(block_no) = answered_block(ans) else {
            return;
        };
        let Some(t) = self.transfers.get_mut(&txn) else {
            return;
        };
        if ans.src != t.dst.node() && block_no != NOTIFY_BLOCK {
            return;
        }
        if block_no == NOTIFY_BLOCK {
            let Some(n) = t.notice.as_mut() else { return };
            if n.seq != ans.seq || !matches!(n.step, Step::InFlight { .. }) {
                return;
            }
            match nack {
                None => n.step = Step::Done,
                Some(r) if r.transient() && n.attempts < cfg.max_attempts => {
                    n.step = Step::Retry {
                        at: now + cfg.nack_retry_ns,
                    };
                    arm(&mut self.wake, now + cfg.nack_retry_ns);
                }
                Some(r) => {
                    self.fail(txn, Failure::Nacked(r), now, cfg, out, stats);
                    return;
                }
            }
            self.maybe_complete(txn, now, cfg, out, stats);
            return;
        }
        let Some(i) = t.block_of(block_no) else {
            return;
        };
        // A block no longer live was acknowledged already.
        let Some(b) = t
            .live
            .get_mut(&i)
            .filter(|b| b.seq == ans.seq && matches!(b.step, Step::InFlight { .. }))
        else {
            stats.stale_cells += 1;
            return;
        };
        // The round trip of the last cell's send, when this answer is surely its.
        let sample = (b.unanswered == 1).then(|| now.since(b.sent_at));
        b.unanswered = 0;
        if nack.is_none() || nack == Some(NackReason::Incomplete) {
            if let Some(ns) = sample {
                self.rtt.entry(ans.src).or_default().sample(ns);
            }
        }
        if nack == Some(NackReason::Crc) {
            // One cell arrived corrupt and was dropped: the answer to the block's last
            // cell says it is missing, or the timer's probe asks for that answer.
            return;
        }
        if nack == Some(NackReason::Incomplete) {
            // Some cells of this attempt were lost: resend those (and the last cell,
            // which asks for the next answer). A receiver that keeps asking is heard
            // `REPAIRS` times; then only the timer, and its attempt limit, go on.
            let Some(arrived) = answered_bitmap(ans) else {
                return;
            };
            if b.repairs >= REPAIRS {
                return;
            }
            b.repairs += 1;
            // The path answers: the attempt limit counts timeouts in a row, not the
            // rounds a block needs on a lossy path.
            b.attempts = 1;
            stats.retransmissions += 1;
            let rto = self
                .rtt
                .get(&ans.src)
                .map_or(cfg.retransmit_ns, |r| r.rto(cfg));
            match send_cells(t, i, txn, arrived, now, rto, mem, out) {
                Ok(deadline) => arm(&mut self.wake, deadline),
                Err(()) => self.fail(txn, Failure::LocalFault, now, cfg, out, stats),
            }
            return;
        }
        match nack {
            None => {
                t.live.remove(&i);
                self.rank_live[t.rank as usize] -= 1;
                t.done += 1;
                self.maybe_complete(txn, now, cfg, out, stats);
                self.refill(now, cfg, mem, out, stats);
            }
            Some(r) if r.transient() && t.live[&i].attempts < cfg.max_attempts => {
                let b = t.live.get_mut(&i).expect("live");
                b.step = Step::Retry {
                    at: now + cfg.nack_retry_ns,
                };
                arm(&mut self.wake, now + cfg.nack_retry_ns);
            }
            Some(r) => self.fail(txn, Failure::Nacked(r), now, cfg, out, stats),
        }
    }

    fn maybe_complete(
        &mut self,
        txn: u32,
        now: Instant,
        cfg: &NiConfig,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        let Some(t) = self.transfers.get_mut(&txn) else {
            return;
        };
        if t.done < t.count {
            return;
        }
        if let Some(n) = t.notice {
            match n.step {
                Step::Pending => {
                    if let Some(deadline) = send_notice(t, txn, now, cfg, out) {
                        arm(&mut self.wake, deadline);
                    }
                    return;
                }
                Step::Done => {}
                _ => return,
            }
        }
        let t = self.remove_transfer(txn).expect("present");
        match t.origin {
            Origin::Local(_) => {
                stats.rdma_transfers_done += 1;
                self.finish_local(&t, Ok(()), out);
            }
            Origin::Served => stats.rdma_transfers_done += 1,
        }
    }

    fn finish_read(
        &mut self,
        r: &PendingRead,
        result: Result<(), Failure>,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        self.read_busy[r.id.page as usize][r.id.ch as usize] = false;
        if result.is_ok() {
            stats.rdma_transfers_done += 1;
        } else {
            stats.rdma_transfers_failed += 1;
        }
        out.events.push_back(NiEvent::Rdma {
            rank: r.rank,
            id: r.id,
            result,
        });
    }

    /// A data cell of some block arrived.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_data(
        &mut self,
        me: NodeId,
        cell: &Cell,
        now: Instant,
        cfg: &NiConfig,
        mem: &mut dyn Memory,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        let block_no = cell.dst.va() / BLOCK_SIZE;
        let key = (cell.src, cell.txn, block_no);
        let reply = |nack, out: &mut Out, stats: &mut NiStats| answer(me, cell, nack, out, stats);
        if cell.aux >= 64 || cell.payload.is_empty() {
            reply(Some(NackReason::BadAddress), out, stats);
            return;
        }
        if let Some(&(seq, _)) = self.finished.get(&key) {
            if seq_le(cell.seq, seq) {
                stats.duplicates += 1;
                if cell.seq == seq && cell.flags & FLAG_LAST != 0 {
                    reply(None, out, stats);
                }
                return;
            }
        }
        let ctx = match self.rx.get_mut(&key) {
            Some(c) => c,
            None => {
                if self.rx.len() >= cfg.rx_contexts {
                    reply(Some(NackReason::NoContext), out, stats);
                    return;
                }
                self.rx.entry(key).or_insert(RxBlock {
                    seq: cell.seq,
                    bitmap: 0,
                    last: None,
                    touched: now,
                })
            }
        };
        if ctx.seq != cell.seq {
            if seq_le(cell.seq, ctx.seq) {
                stats.stale_cells += 1;
                return;
            }
            *ctx = RxBlock {
                seq: cell.seq,
                bitmap: 0,
                last: None,
                touched: now,
            };
        }
        ctx.touched = now;
        arm(&mut self.wake, now + cfg.remember_ns);
        if mem
            .write(cell.dst.rank(), cell.dst.va(), &cell.payload)
            .is_err()
        {
            // Forget the block rather than hold a receive context for it: the sender
            // retries it whole, and a job faulting on purpose cannot starve the pool.
            self.rx.remove(&key);
            reply(Some(NackReason::PageFault), out, stats);
            return;
        }
        ctx.bitmap |= 1 << cell.aux;
        // Data of a read this node asked for: the read is alive.
        if !self.reads.is_empty() {
            let idle = read_idle(cfg, self.rtt.get(&cell.src));
            let va = cell.dst.va();
            for r in self.reads.values_mut() {
                if r.acked
                    && r.request.dst.node() == cell.src
                    && (r.dst_va..r.dst_va + r.len).contains(&va)
                {
                    r.deadline = now + idle;
                    arm(&mut self.wake, r.deadline);
                }
            }
        }
        if cell.flags & FLAG_LAST != 0 {
            ctx.last = Some(cell.aux);
        }
        let Some(last) = ctx.last else { return };
        let full = if last == 63 {
            u64::MAX
        } else {
            (1u64 << (last + 1)) - 1
        };
        if ctx.bitmap != full {
            // The last cell came and some before it did not (links keep order, so they
            // were lost): say which arrived, so the sender resends only the others. A
            // repair ends with the last cell again, which asks again.
            if cell.flags & FLAG_LAST != 0 {
                let mut p = BytesMut::with_capacity(16);
                p.put_u64(block_no);
                p.put_u64(ctx.bitmap);
                answer_with(
                    me,
                    cell,
                    Some(NackReason::Incomplete),
                    p.freeze(),
                    out,
                    stats,
                );
            }
            return;
        }
        let seq = ctx.seq;
        self.rx.remove(&key);
        self.remember_finished(key, seq, now, cfg);
        stats.rdma_blocks_received += 1;
        reply(None, out, stats);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_read_request(
        &mut self,
        me: NodeId,
        cell: &Cell,
        now: Instant,
        cfg: &NiConfig,
        mem: &mut dyn Memory,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        let mut reply = |nack, out: &mut Out| answer(me, cell, nack, out, stats);
        let key = (cell.src, cell.txn);
        if self.served_seen.contains_key(&key) {
            reply(None, out);
            return;
        }
        let p = &cell.payload;
        if p.len() != 16 {
            reply(Some(NackReason::BadAddress), out);
            return;
        }
        let dst_va = u64::from_be_bytes(p[..8].try_into().expect("8 bytes"));
        let len = u64::from_be_bytes(p[8..16].try_into().expect("8 bytes"));
        let pdid = cell.dst.pdid();
        let (Ok(dst), Ok(done_to)) = (
            Gvas::new(pdid, cell.src, cell.src_rank, dst_va),
            Gvas::new(pdid, cell.src, cell.src_rank, 0),
        ) else {
            reply(Some(NackReason::BadAddress), out);
            return;
        };
        if check_range(cell.dst.va(), len).is_err() || check_range(dst_va, len).is_err() {
            reply(Some(NackReason::BadAddress), out);
            return;
        }
        // A source that is not registered would fail at its first block anyway; refused
        // here, it costs no transfer record (a 4 GiB read asked of unregistered memory
        // must not make this engine do anything but answer).
        if !mem.contains(cell.dst.rank(), cell.dst.va(), len) {
            reply(Some(NackReason::PageFault), out);
            return;
        }
        let served = self
            .transfers
            .values()
            .filter(|t| matches!(t.origin, Origin::Served))
            .count();
        if served >= MAX_SERVED {
            reply(Some(NackReason::NoContext), out);
            return;
        }
        reply(None, out);
        self.served_seen.insert(key, now);
        arm(&mut self.wake, now + served_keep(cfg));
        self.served_next = (self.served_next + 1) & (TXN_SERVED - 1);
        let txn = TXN_RDMA | TXN_SERVED | self.served_next;
        let notice = Notice {
            dst: done_to,
            kind: NOTE_READ_DONE,
            txn: cell.txn,
            seq: 0,
            attempts: 0,
            step: Step::Pending,
            status: 0,
        };
        let origin = Origin::Served;
        self.transfers.insert(
            txn,
            Transfer::new(
                cell.dst.rank(),
                cell.dst.va(),
                dst,
                len,
                origin,
                Some(notice),
            ),
        );
        self.sending.push_back(txn);
        self.refill(now, cfg, mem, out, stats);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_notify(
        &mut self,
        me: NodeId,
        cell: &Cell,
        now: Instant,
        cfg: &NiConfig,
        mem: &mut dyn Memory,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        let key = (cell.src, cell.txn, NOTIFY_BLOCK);
        let reply = |nack, out: &mut Out, stats: &mut NiStats| answer(me, cell, nack, out, stats);
        if self.finished.contains_key(&key) {
            reply(None, out, stats);
            return;
        }
        let p = &cell.payload;
        if p.len() != 16 {
            reply(Some(NackReason::BadAddress), out, stats);
            return;
        }
        let kind = p[0];
        let status = p[1];
        let txn = u32::from_be_bytes(p[4..8].try_into().expect("4 bytes"));
        let len = u64::from_be_bytes(p[8..16].try_into().expect("8 bytes"));
        match kind {
            NOTE_WRITE => {
                if mem.write(cell.dst.rank(), cell.dst.va(), p).is_err() {
                    reply(Some(NackReason::PageFault), out, stats);
                    return;
                }
                out.events.push_back(NiEvent::Notified {
                    rank: cell.dst.rank(),
                    va: cell.dst.va(),
                    src: cell.src,
                    len,
                });
            }
            NOTE_READ_DONE => {
                if let Some(r) = self.reads.get(&txn) {
                    if r.request.dst.node() == cell.src && r.rank == cell.dst.rank() {
                        let r = self.reads.remove(&txn).expect("present");
                        let result = if status == 0 {
                            Ok(())
                        } else {
                            Err(failure_from_code(status))
                        };
                        self.finish_read(&r, result, out, stats);
                    }
                }
            }
            _ => {
                reply(Some(NackReason::BadAddress), out, stats);
                return;
            }
        }
        self.remember_finished(key, cell.seq, now, cfg);
        reply(None, out, stats);
    }

    /// Remembers finished block (or notice) `key` at sequence `seq`, to drop late copies.
    fn remember_finished(&mut self, key: RxKey, seq: u16, now: Instant, cfg: &NiConfig) {
        self.finished.insert(key, (seq, now));
        self.finished_order.push_back((now, key));
        arm(&mut self.wake, now + cfg.remember_ns);
    }

    /// No earlier than the engine's next deadline (see `wake`).
    pub(crate) fn next_deadline(&self, cfg: &NiConfig) -> Option<Instant> {
        // Debug builds check the hint against the scan it replaces.
        debug_assert!(
            self.scan_deadlines(cfg)
                .is_none_or(|d| self.wake.is_some_and(|w| w <= d)),
            "wake-up hint {:?} later than the next deadline {:?}",
            self.wake,
            self.scan_deadlines(cfg)
        );
        self.wake
    }

    /// The engine's next deadline, exactly: a scan of everything that has one.
    fn scan_deadlines(&self, cfg: &NiConfig) -> Option<Instant> {
        // Receive state is forgotten after a while even on a node that sends nothing.
        let keep = served_keep(cfg);
        let forget = self
            .finished_order
            .front()
            .map(|(t, _)| *t + cfg.remember_ns)
            .into_iter()
            .chain(self.rx.values().map(|c| c.touched + cfg.remember_ns))
            .chain(self.served_seen.values().map(|t| *t + keep))
            .min();
        if self.transfers.is_empty() && self.reads.is_empty() {
            return forget;
        }
        let t = self
            .transfers
            .values()
            .flat_map(|t| {
                t.live
                    .values()
                    .filter_map(|b| b.step.deadline())
                    .chain(t.notice.iter().filter_map(|n| n.step.deadline()))
            })
            .min();
        let r = self.reads.values().map(|r| r.deadline).min();
        [t, r, forget].into_iter().flatten().min()
    }

    pub(crate) fn on_timeout(
        &mut self,
        now: Instant,
        cfg: &NiConfig,
        mem: &dyn Memory,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        let txns: Vec<u32> = self.transfers.keys().copied().collect();
        for txn in txns {
            let mut fail = None;
            let Some(dst) = self.transfers.get(&txn).map(|t| t.dst.node()) else {
                continue;
            };
            let rto = self.rto(cfg, dst);
            let Some(t) = self.transfers.get_mut(&txn) else {
                continue;
            };
            let due: Vec<u64> = t
                .live
                .iter()
                .filter(|(_, b)| b.step.deadline().is_some_and(|d| d <= now))
                .map(|(i, _)| *i)
                .collect();
            for i in due {
                let b = t.live.get_mut(&i).expect("listed");
                if b.attempts >= cfg.max_attempts {
                    fail = Some(Failure::TimedOut);
                    break;
                }
                stats.retransmissions += 1;
                let sent = if matches!(b.step, Step::InFlight { .. }) {
                    // No answer came: probe with the last cell alone, in the same
                    // attempt, so that what did arrive is kept and the answer says what
                    // is missing (one cell instead of 64 on a lossy path).
                    stats.timeouts += 1;
                    b.attempts += 1;
                    send_cells(t, i, txn, u64::MAX, now, rto, mem, out)
                } else {
                    // The receiver refused the block and forgot it: send it whole.
                    send_block(t, i, txn, now, rto, mem, out, stats)
                };
                if sent.is_err() {
                    fail = Some(Failure::LocalFault);
                    break;
                }
            }
            if let Some(n) = t.notice {
                let due = n.step.deadline().is_some_and(|d| d <= now);
                if due && fail.is_none() {
                    if n.attempts >= cfg.max_attempts {
                        fail = Some(Failure::TimedOut);
                    } else {
                        stats.retransmissions += 1;
                        send_notice(t, txn, now, cfg, out);
                    }
                }
            }
            if let Some(f) = fail {
                self.fail(txn, f, now, cfg, out, stats);
            }
        }
        let reads: Vec<u32> = self
            .reads
            .iter()
            .filter(|(_, r)| r.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for txn in reads {
            let r = self.reads.get_mut(&txn).expect("listed");
            if r.acked || r.attempts >= cfg.max_attempts {
                stats.timeouts += 1;
                let r = self.reads.remove(&txn).expect("listed");
                self.finish_read(&r, Err(Failure::TimedOut), out, stats);
            } else {
                r.attempts += 1;
                r.request.seq = r.request.seq.wrapping_add(1);
                r.deadline = now + backoff(cfg.retransmit_ns, r.attempts);
                stats.retransmissions += 1;
                out.cells.push_back(r.request.clone());
            }
        }
        // Forget old receive state.
        self.rx
            .retain(|_, c| now.since(c.touched) < cfg.remember_ns);
        while let Some(&(t, key)) = self.finished_order.front() {
            if now.since(t) < cfg.remember_ns {
                break;
            }
            self.finished_order.pop_front();
            if self.finished.get(&key).is_some_and(|(_, w)| *w == t) {
                self.finished.remove(&key);
            }
        }
        let keep = served_keep(cfg);
        self.served_seen.retain(|_, t| now.since(*t) < keep);
        self.wake = self.scan_deadlines(cfg);
    }

    pub(crate) fn detach(
        &mut self,
        rank: u8,
        now: Instant,
        cfg: &NiConfig,
        out: &mut Out,
        stats: &mut NiStats,
    ) {
        // Reads served from this rank's memory stop at once: the memory is going away,
        // and the rank may soon belong to another job.
        let served: Vec<u32> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.rank == rank && matches!(t.origin, Origin::Served))
            .map(|(k, _)| *k)
            .collect();
        for txn in served {
            self.fail(txn, Failure::Detached, now, cfg, out, stats);
        }
        let local: Vec<u32> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.rank == rank && matches!(t.origin, Origin::Local(_)))
            .map(|(k, _)| *k)
            .collect();
        for txn in local {
            let t = self.remove_transfer(txn).expect("listed");
            self.finish_local(&t, Err(Failure::Detached), out);
        }
        let reads: Vec<u32> = self
            .reads
            .iter()
            .filter(|(_, r)| r.rank == rank)
            .map(|(k, _)| *k)
            .collect();
        for txn in reads {
            let r = self.reads.remove(&txn).expect("listed");
            self.read_busy[r.id.page as usize][r.id.ch as usize] = false;
            out.events.push_back(NiEvent::Rdma {
                rank,
                id: r.id,
                result: Err(Failure::Detached),
            });
        }
        for p in self.pages.iter_mut() {
            if *p == Some(rank) {
                *p = None;
            }
        }
    }
}

/// How long a read may go without data before it is declared lost: the serving engine's
/// whole retry budget for one block.
fn read_idle(cfg: &NiConfig, rtt: Option<&Rtt>) -> u64 {
    let rto = rtt.map_or(cfg.retransmit_ns, |r| r.rto(cfg));
    (1..=cfg.max_attempts).map(|a| backoff(rto, a)).sum::<u64>() * 2
}

/// How long a served read request is remembered. A reader retransmits its request for
/// up to its whole backoff budget: remember served requests at least twice that, or a
/// late copy would be served again.
fn served_keep(cfg: &NiConfig) -> u64 {
    cfg.remember_ns.max(
        2 * (1..=cfg.max_attempts)
            .map(|a| backoff(cfg.retransmit_ns, a))
            .sum::<u64>(),
    )
}

/// `a` is not newer than `b` in wrapping 16-bit sequence space.
fn seq_le(a: u16, b: u16) -> bool {
    b.wrapping_sub(a) < 0x8000
}

fn failure_code(f: Failure) -> u8 {
    match f {
        Failure::Nacked(r) => r as u8,
        Failure::TimedOut => 0x80,
        Failure::LocalFault => 0x81,
        Failure::Detached => 0x82,
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

/// (Re)sends block `i` of `t` whole, with a new sequence number.
#[allow(clippy::too_many_arguments)]
fn send_block(
    t: &mut Transfer,
    i: u64,
    txn: u32,
    now: Instant,
    rto: u64,
    mem: &dyn Memory,
    out: &mut Out,
    stats: &mut NiStats,
) -> Result<Instant, ()> {
    let b = t.live.get_mut(&i).expect("a live block");
    if b.attempts > 0 {
        b.seq = b.seq.wrapping_add(1);
    }
    b.attempts += 1;
    let deadline = send_cells(t, i, txn, 0, now, rto, mem, out)?;
    stats.rdma_blocks_sent += 1;
    Ok(deadline)
}

/// Sends the cells of block `i`'s current attempt that `arrived` (a bitmap by cell index)
/// does not hold, and always its last cell, which asks for an answer. Returns the
/// block's new deadline.
#[allow(clippy::too_many_arguments)]
fn send_cells(
    t: &mut Transfer,
    i: u64,
    txn: u32,
    arrived: u64,
    now: Instant,
    rto: u64,
    mem: &dyn Memory,
    out: &mut Out,
) -> Result<Instant, ()> {
    let (start, len) = t.span(i);
    let b = t.live.get_mut(&i).expect("a live block");
    let deadline = now + backoff(rto, b.attempts);
    b.step = Step::InFlight { deadline };
    b.unanswered = b.unanswered.saturating_add(1);
    b.sent_at = now;
    let (mut off, end) = (start, start + len);
    let mut index = 0u8;
    while off < end {
        let va = t.dst.va() + off;
        let n = ((va / CELL_SIZE + 1) * CELL_SIZE).min(t.dst.va() + end) - va;
        let last = off + n == end;
        if last || arrived & (1 << index) == 0 {
            let mut data = vec![0u8; n as usize];
            mem.read(t.rank, t.src_va + off, &mut data)
                .map_err(|_| ())?;
            let dst = t.dst.with_va(va).map_err(|_| ())?;
            // The NI stamps the source node on every cell it emits.
            let mut c =
                Cell::new(dst, CellType::Write, NodeId(0), Bytes::from(data)).map_err(|_| ())?;
            c.txn = txn;
            c.src_rank = t.rank;
            c.seq = b.seq;
            c.aux = index;
            c.flags = if index == 0 { FLAG_FIRST } else { 0 } | if last { FLAG_LAST } else { 0 };
            out.cells.push_back(c);
        }
        off += n;
        index += 1;
    }
    Ok(deadline)
}

/// (Re)sends the notice of `t`; returns its new deadline.
fn send_notice(
    t: &mut Transfer,
    txn: u32,
    now: Instant,
    cfg: &NiConfig,
    out: &mut Out,
) -> Option<Instant> {
    let n = t.notice.as_mut()?;
    if n.attempts > 0 {
        n.seq = n.seq.wrapping_add(1);
    }
    n.attempts += 1;
    let deadline = now + backoff(cfg.retransmit_ns, n.attempts);
    n.step = Step::InFlight { deadline };
    let mut p = BytesMut::with_capacity(16);
    p.put_u8(n.kind);
    p.put_u8(n.status);
    p.put_u16(0);
    p.put_u32(n.txn);
    p.put_u64(t.len);
    if let Ok(mut c) = Cell::new(n.dst, CellType::Notify, NodeId(0), p.freeze()) {
        c.txn = txn;
        c.src_rank = t.rank;
        c.seq = n.seq;
        c.flags = FLAG_FIRST | FLAG_LAST | FLAG_NOTIFY;
        out.cells.push_back(c);
    }
    Some(deadline)
}
