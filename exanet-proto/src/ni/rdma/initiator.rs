//! The sending half of the RDMA engine: the channels ranks post on, writes cut into
//! blocks within their windows, read requests, the writes that serve remote reads, and
//! what brings each to an end: answers, repairs of blocks the receiver found incomplete,
//! retransmission timers with their round-trip estimates, and the notices sent after a
//! transfer's last block.

use std::collections::{BTreeMap, VecDeque};

use bytes::{BufMut, Bytes, BytesMut};

use super::{
    answered_bitmap, answered_block, arm, check_range, failure_code, Note, TransferId, BLOCK_SIZE,
    CELL_SIZE, GEN_MASK, NOTIFY_BLOCK, RDMA_PAGES, READ_CHANNELS, TXN_READ, TXN_SERVED,
    WRITE_CHANNELS,
};
use crate::cell::{Cell, CellType, Engine, FLAG_FIRST, FLAG_LAST, FLAG_NOTIFY};
use crate::gvas::Gvas;
use crate::model::{ModelTime, Stamp};
use crate::ni::{
    backoff, Ctx, Failure, Memory, NackReason, NiConfig, NiError, NiEvent, Out, RdmaRead,
    RdmaWrite, RANKS,
};
use crate::shape::NodeId;
use crate::time::Instant;

/// Repairs of one block that a sender makes on its receiver's word (see
/// [`NackReason::Incomplete`]); past them only its own timer and attempt limit count.
const REPAIRS: u8 = 64;
/// Cells the engine keeps queued for injection; more blocks are cut only below this.
const OUTBOX_CELLS: usize = 512;

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
    /// When its first attempt was cut: no copy goes after `NiConfig::copy_limit_ns`.
    first_sent: Instant,
    /// When the latest attempt's cells were cut, in modeled time.
    modeled: ModelTime,
    /// In modeled order: when the latest attempt's last cell left the node's switch, in
    /// modeled time (`None` while it has not). Its copy is due a timer's length after.
    left: Option<ModelTime>,
}

impl Block {
    /// A block cut now, to start at `modeled`, not sent yet.
    fn cut(modeled: ModelTime, now: Instant) -> Block {
        Block {
            seq: 0,
            attempts: 0,
            repairs: 0,
            unanswered: 0,
            step: Step::Pending,
            sent_at: now,
            first_sent: now,
            modeled,
            left: None,
        }
    }
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

/// Answers kept by [`ModeledRtt`]: enough to know the timeout in force when any block of a
/// window still waiting was sent.
const MODELED_RTT_HISTORY: usize = 256;

/// In modeled order, the round trips of blocks to one destination in modeled time (from
/// a block's last cell leaving the node to its answer) and the timeout each left in
/// force, never below `[model] retransmit_ns`. Behind a deep queue (two flows through
/// one link, 32 blocks in each window) answers take far longer than that floor: by a
/// fixed modeled timer their copies were due, and whether one went depended on whether
/// the real-time timer had fired before the answer came in real time, which is the host's
/// (a fresh rack's first runs sent copies, later runs fewer, and their figures differed).
/// The copy of a block is due once the timeout in force has run since it left; the
/// history gives the timeout in force at each modeled time, so that the due time follows
/// from answers earlier than it, which are all in whenever the NI may act on it
/// (`Ctx::copy_due`), and not from how many the host happened to have delivered.
#[derive(Clone, Debug, Default)]
struct ModeledRtt {
    rtt: Rtt,
    /// (the answer's modeled time, the timeout from then on in ps), in modeled order.
    history: VecDeque<(ModelTime, u64)>,
}

impl ModeledRtt {
    fn sample(&mut self, at: ModelTime, ps: u64, floor: u64) {
        self.rtt.sample(ps);
        let rto = floor.max(self.rtt.srtt.saturating_add(4 * self.rtt.rttvar));
        if self.history.len() >= MODELED_RTT_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((at, rto));
    }

    /// When the copy of an attempt that left at `left` is due: the first modeled time by
    /// which the timeout in force then has run since `left`.
    fn due(&self, left: ModelTime, floor: u64) -> ModelTime {
        let i = self.history.partition_point(|(a, _)| *a <= left);
        let rto = i.checked_sub(1).map_or(floor, |j| self.history[j].1);
        let mut due = left + rto;
        for &(a, rto) in self.history.range(i..) {
            if a >= due {
                break;
            }
            due = a.max(left + rto);
        }
        due
    }
}

/// How long a read may go without data before it is declared lost: the serving engine's
/// whole retry budget for one block.
fn read_idle(cfg: &NiConfig, rtt: Option<&Rtt>) -> u64 {
    let rto = rtt.map_or(cfg.retransmit_ns, |r| r.rto(cfg));
    (1..=cfg.max_attempts).map(|a| backoff(rto, a)).sum::<u64>() * 2
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
    /// When it was first sent: no copy goes after `NiConfig::copy_limit_ns`.
    first_sent: Option<Instant>,
}

impl Notice {
    fn new(dst: Gvas, kind: u8, txn: u32) -> Notice {
        Notice {
            dst,
            kind,
            txn,
            seq: 0,
            attempts: 0,
            step: Step::Pending,
            status: 0,
            first_sent: None,
        }
    }
}

struct Transfer {
    txn: u32,
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
    /// When the engine could start, in modeled time (the descriptor reached it).
    ready: ModelTime,
    /// Modeled times of block answers not yet used to open the window for a later
    /// block, oldest first: a block beyond the window starts once an earlier one is
    /// answered, in modeled time as in real time.
    answers: VecDeque<ModelTime>,
    /// When the latest answer came, in modeled time: when the transfer ends.
    answered: ModelTime,
}

impl Transfer {
    fn new(txn: u32, rank: u8, src_va: u64, dst: Gvas, len: u64, origin: Origin) -> Transfer {
        let first = dst.va() / BLOCK_SIZE;
        let last = (dst.va() + len - 1) / BLOCK_SIZE;
        Transfer {
            txn,
            rank,
            src_va,
            dst,
            len,
            count: last - first + 1,
            next: 0,
            done: 0,
            live: BTreeMap::new(),
            notice: None,
            origin,
            ready: ModelTime::ZERO,
            answers: VecDeque::new(),
            answered: ModelTime::ZERO,
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

    /// (Re)sends block `i` whole, with a new sequence number.
    fn send_block(
        &mut self,
        cx: &mut Ctx,
        i: u64,
        rto: u64,
        mem: &dyn Memory,
    ) -> Result<Instant, ()> {
        let b = self.live.get_mut(&i).expect("a live block");
        if b.attempts > 0 {
            b.seq = b.seq.wrapping_add(1);
        }
        b.attempts += 1;
        let deadline = self.send_cells(cx, i, 0, rto, mem)?;
        cx.stats.rdma_blocks_sent += 1;
        Ok(deadline)
    }

    /// Sends the cells of block `i`'s current attempt that `arrived` (a bitmap by cell
    /// index) does not hold, and always its last cell, which asks for an answer. Returns
    /// the block's new deadline.
    fn send_cells(
        &mut self,
        cx: &mut Ctx,
        i: u64,
        arrived: u64,
        rto: u64,
        mem: &dyn Memory,
    ) -> Result<Instant, ()> {
        let (start, len) = self.span(i);
        let b = self.live.get_mut(&i).expect("a live block");
        let deadline = cx.now + backoff(rto, b.attempts);
        b.step = Step::InFlight { deadline };
        b.unanswered = b.unanswered.saturating_add(1);
        b.sent_at = cx.now;
        b.left = None;
        let (mut off, end) = (start, start + len);
        // A first attempt reads the whole block at once and its cells share it: one
        // allocation per block, not one per cell. A repair reads only what it resends.
        let whole = if arrived == 0 {
            let mut data = vec![0u8; len as usize];
            mem.read(self.rank, self.src_va + start, &mut data)
                .map_err(|_| ())?;
            Some(Bytes::from(data))
        } else {
            None
        };
        let mut index = 0u8;
        while off < end {
            let va = self.dst.va() + off;
            let n = ((va / CELL_SIZE + 1) * CELL_SIZE).min(self.dst.va() + end) - va;
            let last = off + n == end;
            if last || arrived & (1 << index) == 0 {
                let payload = match &whole {
                    Some(b) => b.slice((off - start) as usize..(off - start + n) as usize),
                    None => {
                        let mut data = vec![0u8; n as usize];
                        mem.read(self.rank, self.src_va + off, &mut data)
                            .map_err(|_| ())?;
                        Bytes::from(data)
                    }
                };
                let dst = self.dst.with_va(va).map_err(|_| ())?;
                // The NI stamps the source node on every cell it emits.
                let mut c = Cell::new(dst, CellType::Write, NodeId(0), payload)
                    .map_err(|_| ())?
                    .of(Engine::Rdma);
                c.txn = self.txn;
                c.src_rank = self.rank;
                c.seq = b.seq;
                c.aux = index;
                c.flags =
                    if index == 0 { FLAG_FIRST } else { 0 } | if last { FLAG_LAST } else { 0 };
                // The datapath serialises them from here (see `Ni::injected`).
                c.stamp = Stamp::at(b.modeled);
                cx.out.cells.push_back(c);
            }
            off += n;
            index += 1;
        }
        Ok(deadline)
    }

    /// (Re)sends the notice; returns its new deadline.
    fn send_notice(&mut self, cx: &mut Ctx) -> Option<Instant> {
        let n = self.notice.as_mut()?;
        if n.attempts > 0 {
            n.seq = n.seq.wrapping_add(1);
        }
        n.attempts += 1;
        n.first_sent.get_or_insert(cx.now);
        let deadline = cx.now + backoff(cx.cfg.retransmit_ns, n.attempts);
        n.step = Step::InFlight { deadline };
        let note = Note {
            kind: n.kind,
            status: n.status,
            txn: n.txn,
            len: self.len,
        };
        if let Ok(c) = Cell::new(n.dst, CellType::Notify, NodeId(0), note.encode()) {
            let mut c = c.of(Engine::Rdma);
            c.txn = self.txn;
            c.src_rank = self.rank;
            c.seq = n.seq;
            c.flags = FLAG_FIRST | FLAG_LAST | FLAG_NOTIFY;
            c.stamp = Stamp::at(cx.at.max(self.answered));
            cx.out.cells.push_back(c);
        }
        Some(deadline)
    }
}

/// When the next block a rank cuts can start, by its window: at once while places it
/// never used are left (`live` blocks and `freed` places under `cap`), else when the
/// oldest freed place was freed.
fn next_place(freed: &VecDeque<ModelTime>, live: usize, cap: usize) -> ModelTime {
    if live + freed.len() < cap {
        ModelTime::ZERO
    } else {
        freed.front().copied().unwrap_or(ModelTime::ZERO)
    }
}

/// [`next_place`], and the place is taken. Freed places beyond what the window can have
/// free (blocks failed and were dropped, the window shrank) are forgotten.
fn take_place(freed: &mut VecDeque<ModelTime>, live: usize, cap: usize) -> ModelTime {
    while live + freed.len() > cap {
        freed.pop_front();
    }
    let at = next_place(freed, live, cap);
    if live + freed.len() == cap {
        freed.pop_front();
    }
    at
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
    /// When the request was first sent: no copy of it goes after
    /// `NiConfig::copy_limit_ns`.
    first_sent: Instant,
}

/// A remote read the target accepted: a write of `len` bytes of `rank`'s memory at
/// `src_va` back to `dst`, then a "read done" notice to `done_to` naming `read_txn`.
pub(super) struct ServedRead {
    pub(super) txn: u32,
    pub(super) rank: u8,
    pub(super) src_va: u64,
    pub(super) dst: Gvas,
    pub(super) len: u64,
    pub(super) done_to: Gvas,
    pub(super) read_txn: u32,
}

/// A "read done" notification from `from` to `rank`, naming the read `txn`.
pub(super) struct ReadDone {
    pub(super) from: NodeId,
    pub(super) rank: u8,
    pub(super) txn: u32,
    pub(super) result: Result<(), Failure>,
}

pub(super) struct Initiator {
    pages: [Option<u8>; RDMA_PAGES],
    write_busy: [[bool; WRITE_CHANNELS]; RDMA_PAGES],
    read_busy: [[bool; READ_CHANNELS]; RDMA_PAGES],
    gens: [[u32; WRITE_CHANNELS + READ_CHANNELS]; RDMA_PAGES],
    transfers: BTreeMap<u32, Transfer>,
    /// Transfers with blocks not yet cut, oldest first.
    sending: VecDeque<u32>,
    reads: BTreeMap<u32, PendingRead>,
    rtt: BTreeMap<NodeId, Rtt>,
    modeled_rtt: BTreeMap<NodeId, ModeledRtt>,
    /// Blocks cut and not finished, by the rank whose memory they read (the poster's, or
    /// the served rank's): no rank may have more than `rank_window_blocks` of them, so a
    /// rank with many channels busy neither crowds out the others nor makes the engine
    /// keep more state than the windows.
    rank_live: [usize; RANKS],
    /// By rank, the modeled times at which places of its window were freed by answers
    /// and not taken since, oldest first: a block cut once the window was full starts
    /// when an answer freed its place, not when its transfer could first start.
    rank_freed: [VecDeque<ModelTime>; RANKS],
    /// No deadline of the initiator is earlier than this (`None`: it has none). Every
    /// deadline set lowers it; [`Initiator::on_timeout`] makes it exact again. It spares
    /// [`Initiator::next_deadline`], asked after every input, a scan of every block of
    /// every transfer; an early hint costs one wake-up that finds nothing due.
    wake: Option<Instant>,
}

impl Initiator {
    pub(super) fn with_epoch(epoch: u32) -> Initiator {
        Initiator {
            pages: [None; RDMA_PAGES],
            write_busy: [[false; WRITE_CHANNELS]; RDMA_PAGES],
            read_busy: [[false; READ_CHANNELS]; RDMA_PAGES],
            gens: [[epoch & GEN_MASK; WRITE_CHANNELS + READ_CHANNELS]; RDMA_PAGES],
            transfers: BTreeMap::new(),
            sending: VecDeque::new(),
            reads: BTreeMap::new(),
            rtt: BTreeMap::new(),
            modeled_rtt: BTreeMap::new(),
            rank_live: [0; RANKS],
            rank_freed: std::array::from_fn(|_| VecDeque::new()),
            wake: None,
        }
    }

    /// The last cell of a block (or a notice) left for the fabric: its answer can only be
    /// expected from now on, so its timer starts now rather than when it was cut.
    pub(super) fn on_injected(&mut self, cell: &Cell, now: Instant, cfg: &NiConfig) {
        if cell.flags & FLAG_LAST == 0 || cell.engine != Engine::Rdma {
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

    /// In modeled order, a cell of this engine's left the node's switch at `cell.stamp`:
    /// a block's last cell dates when its copy would be due.
    pub(super) fn on_departed(&mut self, cell: &Cell) {
        if cell.flags & FLAG_LAST == 0 || cell.kind != CellType::Write {
            return;
        }
        let Some(t) = self.transfers.get_mut(&cell.txn) else {
            return;
        };
        let Some(i) = t.block_of(cell.dst.va() / BLOCK_SIZE) else {
            return;
        };
        if let Some(b) = t.live.get_mut(&i).filter(|b| b.seq == cell.seq) {
            b.left = Some(cell.stamp.head);
        }
    }

    fn rto(&self, cfg: &NiConfig, dst: NodeId) -> u64 {
        self.rtt.get(&dst).map_or(cfg.retransmit_ns, |r| r.rto(cfg))
    }

    pub(super) fn alloc_page(&mut self, rank: u8) -> Result<u8, NiError> {
        let p = self
            .pages
            .iter()
            .position(Option::is_none)
            .ok_or(NiError::Exhausted("RDMA page"))?;
        self.pages[p] = Some(rank);
        Ok(p as u8)
    }

    pub(super) fn free_page(&mut self, rank: u8, page: u8) -> Result<(), NiError> {
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

    pub(super) fn active(&self) -> usize {
        self.transfers.len() + self.reads.len()
    }

    pub(super) fn live_blocks(&self, rank: u8) -> usize {
        self.rank_live.get(rank as usize).copied().unwrap_or(0)
    }

    /// Writes serving remote reads in progress.
    pub(super) fn served(&self) -> usize {
        self.transfers
            .values()
            .filter(|t| matches!(t.origin, Origin::Served))
            .count()
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

    pub(super) fn post_write(
        &mut self,
        cx: &mut Ctx,
        rank: u8,
        op: &RdmaWrite,
        mem: &dyn Memory,
    ) -> Result<TransferId, NiError> {
        let RdmaWrite {
            page,
            ch,
            src_va,
            dst,
            len,
            notify,
        } = *op;
        self.check_channel(rank, page, ch, false)?;
        check_range(src_va, len)?;
        check_range(dst.va(), len)?;
        let id = self.next_id(page, ch, false);
        let notice = match notify {
            Some(va) => Some(Notice::new(
                dst.with_va(va)
                    .map_err(|_| NiError::BadRange { va, len: 16 })?,
                Note::WRITE,
                id.txn(),
            )),
            None => None,
        };
        if !mem.contains(rank, src_va, len) {
            // The source is not registered memory: the transfer fails as it would at its
            // first unreadable block, but before a block record is made for it (a 4 GiB
            // write is 262,144 of them, all made under the daemon's core lock).
            cx.stats.rdma_transfers_failed += 1;
            cx.out.events.push_back(NiEvent::Rdma {
                rank,
                id,
                result: Err(Failure::LocalFault),
                at: cx.at,
            });
            return Ok(id);
        }
        self.write_busy[page as usize][ch as usize] = true;
        let txn = id.txn();
        let mut t = Transfer::new(txn, rank, src_va, dst, len, Origin::Local(id));
        t.notice = notice;
        t.ready = cx.at;
        self.transfers.insert(txn, t);
        self.sending.push_back(txn);
        self.refill(cx, mem);
        Ok(id)
    }

    pub(super) fn post_read(
        &mut self,
        cx: &mut Ctx,
        rank: u8,
        op: &RdmaRead,
    ) -> Result<TransferId, NiError> {
        let RdmaRead {
            page,
            ch,
            src,
            dst_va,
            len,
        } = *op;
        self.check_channel(rank, page, ch, true)?;
        check_range(src.va(), len)?;
        check_range(dst_va, len)?;
        let id = self.next_id(page, ch, true);
        let mut p = BytesMut::with_capacity(16);
        p.put_u64(dst_va);
        p.put_u64(len);
        let mut request = Cell::new(src, CellType::ReadRequest, cx.me, p.freeze())
            .expect("16 B payload")
            .of(Engine::Rdma);
        request.txn = id.txn();
        request.src_rank = rank;
        request.flags = FLAG_FIRST | FLAG_LAST;
        request.stamp = Stamp::at(cx.at);
        cx.out.cells.push_back(request.clone());
        self.read_busy[page as usize][ch as usize] = true;
        let deadline = cx.now + cx.cfg.retransmit_ns;
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
                first_sent: cx.now,
            },
        );
        Ok(id)
    }

    /// Starts the write that serves a remote read the target accepted.
    pub(super) fn serve(&mut self, cx: &mut Ctx, s: ServedRead, mem: &dyn Memory) {
        let mut t = Transfer::new(s.txn, s.rank, s.src_va, s.dst, s.len, Origin::Served);
        t.ready = cx.at;
        t.notice = Some(Notice::new(s.done_to, Note::READ_DONE, s.read_txn));
        self.transfers.insert(s.txn, t);
        self.sending.push_back(s.txn);
        self.refill(cx, mem);
    }

    /// Cuts more blocks of the transfers in progress, within each transfer's window and
    /// while the outbox is short.
    pub(super) fn refill(&mut self, cx: &mut Ctx, mem: &dyn Memory) {
        if cx.ordered {
            return self.refill_in_order(cx, mem);
        }
        let mut rounds = self.sending.len();
        while rounds > 0 && cx.out.cells.len() < OUTBOX_CELLS {
            rounds -= 1;
            let Some(txn) = self.sending.pop_front() else {
                break;
            };
            let Some(dst) = self.transfers.get(&txn).map(|t| t.dst.node()) else {
                continue;
            };
            let rto = self.rto(cx.cfg, dst);
            let mut failed = false;
            while cx.out.cells.len() < OUTBOX_CELLS
                && self
                    .transfers
                    .get(&txn)
                    .is_some_and(|t| self.has_room(cx.cfg, t))
            {
                if self.cut_next(cx, txn, rto, mem).is_err() {
                    failed = true;
                    break;
                }
            }
            if failed {
                self.fail(cx, txn, Failure::LocalFault);
            } else if self.transfers.get(&txn).is_some_and(|t| t.next < t.count) {
                self.sending.push_back(txn);
            }
        }
    }

    /// Whether transfer `t` has a block left to cut and room for it: its window and its
    /// rank's.
    fn has_room(&self, cfg: &NiConfig, t: &Transfer) -> bool {
        t.next < t.count
            && t.live.len() < cfg.window_blocks
            && self.rank_live[usize::from(t.rank)] < cfg.rank_window_blocks
    }

    /// Cuts transfer `txn`'s next block (it has room: [`Initiator::has_room`]) and sends
    /// it. The block starts once its transfer is ready, past its first window once an
    /// answer opened its place there, and once its rank has a free place: what
    /// [`Initiator::next_start`] said it would.
    fn cut_next(&mut self, cx: &mut Ctx, txn: u32, rto: u64, mem: &dyn Memory) -> Result<(), ()> {
        let Some(t) = self.transfers.get_mut(&txn) else {
            return Ok(());
        };
        let rank = usize::from(t.rank);
        let i = t.next;
        t.next += 1;
        let opened = if i >= cx.cfg.window_blocks as u64 {
            t.answers.pop_front().unwrap_or(t.answered)
        } else {
            ModelTime::ZERO
        };
        let place = take_place(
            &mut self.rank_freed[rank],
            self.rank_live[rank],
            cx.cfg.rank_window_blocks,
        );
        t.live
            .insert(i, Block::cut(t.ready.max(opened).max(place), cx.now));
        self.rank_live[rank] += 1;
        let deadline = t.send_block(cx, i, rto, mem)?;
        arm(&mut self.wake, deadline);
        Ok(())
    }

    /// The modeled start of transfer `t`'s next block if it can be cut now (its window
    /// and its rank's have room, and past its first window an answer opened it).
    fn next_start(&self, cfg: &NiConfig, t: &Transfer) -> Option<ModelTime> {
        if !self.has_room(cfg, t) {
            return None;
        }
        let rank = usize::from(t.rank);
        let opened = if t.next >= cfg.window_blocks as u64 {
            t.answers.front().copied().unwrap_or(t.answered)
        } else {
            ModelTime::ZERO
        };
        let place = next_place(
            &self.rank_freed[rank],
            self.rank_live[rank],
            cfg.rank_window_blocks,
        );
        Some(t.ready.max(opened).max(place))
    }

    /// The earliest (modeled start, rank) of a block that can be cut now and is not:
    /// what the NI's own cells wait for in modeled order ([`crate::ni::Ni::poll_cell_of`]).
    pub(super) fn earliest_uncut(&self, cfg: &NiConfig) -> Option<(ModelTime, u8)> {
        self.next_cut(cfg).map(|(start, rank, _)| (start, rank))
    }

    /// The block to cut next in modeled order: (its start, its rank, its transfer), the
    /// least of those that can be cut now.
    fn next_cut(&self, cfg: &NiConfig) -> Option<(ModelTime, u8, u32)> {
        self.sending
            .iter()
            .filter_map(|txn| self.transfers.get(txn))
            .filter_map(|t| Some((self.next_start(cfg, t)?, t.rank, t.txn)))
            .min()
    }

    /// [`Initiator::refill`] in modeled order: one block at a time, always the one that
    /// starts first (then by rank, then by transfer), so that the blocks of transfers
    /// posted at one modeled time are cut in the same order whatever order the host
    /// delivered their posts in. The outbox's bound yields to a block that goes before
    /// everything in it: those cells wait for it (`Ni::poll_cell_of`).
    fn refill_in_order(&mut self, cx: &mut Ctx, mem: &dyn Memory) {
        while let Some((start, rank, txn)) = self.next_cut(cx.cfg) {
            if cx.out.cells.len() >= OUTBOX_CELLS {
                let first = cx
                    .out
                    .cells
                    .iter()
                    .map(|c| (c.stamp.head, c.src_rank))
                    .min();
                if first.is_some_and(|f| f <= (start, rank)) {
                    break;
                }
            }
            let Some(dst) = self.transfers.get(&txn).map(|t| t.dst.node()) else {
                break;
            };
            let rto = self.rto(cx.cfg, dst);
            let sent = self.cut_next(cx, txn, rto, mem);
            if self.transfers.get(&txn).is_none_or(|t| t.next >= t.count) {
                self.sending.retain(|&x| x != txn);
            }
            if sent.is_err() {
                self.fail(cx, txn, Failure::LocalFault);
            }
        }
    }

    fn fail(&mut self, cx: &mut Ctx, txn: u32, f: Failure) {
        let Some(t) = self.transfers.get_mut(&txn) else {
            return;
        };
        cx.stats.rdma_transfers_failed += 1;
        match t.origin {
            Origin::Local(_) => {
                let t = self.remove_transfer(txn).expect("present");
                let at = cx.at;
                self.finish_local(&t, Err(f), cx.out, at);
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
                    if let Some(deadline) = t.send_notice(cx) {
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

    fn finish_local(
        &mut self,
        t: &Transfer,
        result: Result<(), Failure>,
        out: &mut Out,
        at: ModelTime,
    ) {
        if let Origin::Local(id) = t.origin {
            self.write_busy[id.page as usize][id.ch as usize] = false;
            out.events.push_back(NiEvent::Rdma {
                rank: t.rank,
                id,
                result,
                at,
            });
        }
    }

    pub(super) fn on_answer(
        &mut self,
        cx: &mut Ctx,
        ans: &Cell,
        nack: Option<NackReason>,
        mem: &dyn Memory,
    ) {
        let (now, cfg) = (cx.now, cx.cfg);
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
                    // keeps the read alive (see data_arrived), silence ends it.
                    r.deadline = now + read_idle(cfg, self.rtt.get(&ans.src));
                    arm(&mut self.wake, r.deadline);
                }
                Some(reason) if reason.transient() && r.attempts < cfg.max_attempts => {
                    r.deadline = now + cfg.nack_retry_ns;
                    arm(&mut self.wake, r.deadline);
                }
                Some(reason) => {
                    let r = self.reads.remove(&txn).expect("present");
                    self.finish_read(cx, &r, Err(Failure::Nacked(reason)));
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
            // An ACK of an earlier copy proves delivery as well as one of the latest (the
            // target drops copies of a notice it took): it comes late in real time when
            // the host was slow and the notice went again, and its modeled time is the
            // delivery's, not the needless retransmission's.
            let this_copy = n.seq == ans.seq && matches!(n.step, Step::InFlight { .. });
            let earlier_ack = nack.is_none()
                && n.seq.wrapping_sub(ans.seq) < u16::from(n.attempts)
                && matches!(n.step, Step::InFlight { .. } | Step::Retry { .. });
            if !this_copy && !earlier_ack {
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
                    self.fail(cx, txn, Failure::Nacked(r));
                    return;
                }
            }
            self.maybe_complete(cx, txn);
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
            cx.stats.stale_cells += 1;
            return;
        };
        // The round trip of the last cell's send, when this answer is surely its.
        let sample = (b.unanswered == 1).then(|| now.since(b.sent_at));
        let modeled = b
            .left
            .filter(|_| b.unanswered == 1)
            .map(|left| cx.at.ps().saturating_sub(left.ps()));
        b.unanswered = 0;
        if nack.is_none() || nack == Some(NackReason::Incomplete) {
            if let Some(ns) = sample {
                self.rtt.entry(ans.src).or_default().sample(ns);
            }
            if let Some(ps) = modeled {
                self.modeled_rtt.entry(ans.src).or_default().sample(
                    cx.at,
                    ps,
                    cx.cfg.model.retransmit,
                );
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
            if now.since(b.first_sent) >= cfg.copy_limit_ns() {
                // No copy this late (see `NiConfig::copy_limit_ns`).
                cx.stats.timeouts += 1;
                self.fail(cx, txn, Failure::TimedOut);
                return;
            }
            b.repairs += 1;
            // The path answers: the attempt limit counts timeouts in a row, not the
            // rounds a block needs on a lossy path.
            b.attempts = 1;
            cx.stats.retransmissions += 1;
            let rto = self
                .rtt
                .get(&ans.src)
                .map_or(cfg.retransmit_ns, |r| r.rto(cfg));
            b.modeled = cx.at;
            match t.send_cells(cx, i, arrived, rto, mem) {
                Ok(deadline) => arm(&mut self.wake, deadline),
                Err(()) => self.fail(cx, txn, Failure::LocalFault),
            }
            return;
        }
        match nack {
            None => {
                t.live.remove(&i);
                self.rank_live[t.rank as usize] -= 1;
                self.rank_freed[t.rank as usize].push_back(cx.at);
                t.done += 1;
                t.answers.push_back(cx.at);
                t.answered = t.answered.max(cx.at);
                self.maybe_complete(cx, txn);
                self.refill(cx, mem);
            }
            Some(r) if r.transient() && t.live[&i].attempts < cfg.max_attempts => {
                let b = t.live.get_mut(&i).expect("live");
                b.step = Step::Retry {
                    at: now + cfg.nack_retry_ns,
                };
                arm(&mut self.wake, now + cfg.nack_retry_ns);
            }
            Some(r) => self.fail(cx, txn, Failure::Nacked(r)),
        }
    }

    fn maybe_complete(&mut self, cx: &mut Ctx, txn: u32) {
        let Some(t) = self.transfers.get_mut(&txn) else {
            return;
        };
        if t.done < t.count {
            return;
        }
        if let Some(n) = t.notice {
            match n.step {
                Step::Pending => {
                    if let Some(deadline) = t.send_notice(cx) {
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
                cx.stats.rdma_transfers_done += 1;
                let at = cx.at.max(t.answered);
                self.finish_local(&t, Ok(()), cx.out, at);
            }
            Origin::Served => cx.stats.rdma_transfers_done += 1,
        }
    }

    fn finish_read(&mut self, cx: &mut Ctx, r: &PendingRead, result: Result<(), Failure>) {
        self.read_busy[r.id.page as usize][r.id.ch as usize] = false;
        if result.is_ok() {
            cx.stats.rdma_transfers_done += 1;
        } else {
            cx.stats.rdma_transfers_failed += 1;
        }
        cx.out.events.push_back(NiEvent::Rdma {
            rank: r.rank,
            id: r.id,
            result,
            at: cx.at,
        });
    }

    /// Data from `src` landed at `va` of this node: a read of this node's waiting for it
    /// there is alive.
    pub(super) fn data_arrived(&mut self, now: Instant, cfg: &NiConfig, src: NodeId, va: u64) {
        if self.reads.is_empty() {
            return;
        }
        let idle = read_idle(cfg, self.rtt.get(&src));
        for r in self.reads.values_mut() {
            if r.acked && r.request.dst.node() == src && (r.dst_va..r.dst_va + r.len).contains(&va)
            {
                r.deadline = now + idle;
                arm(&mut self.wake, r.deadline);
            }
        }
    }

    /// The server of a read says it is done: the read ends, if it is one this node asked
    /// of that server for that rank.
    pub(super) fn read_done(&mut self, cx: &mut Ctx, done: ReadDone) {
        let Some(r) = self.reads.get(&done.txn) else {
            return;
        };
        if r.request.dst.node() == done.from && r.rank == done.rank {
            let r = self.reads.remove(&done.txn).expect("present");
            self.finish_read(cx, &r, done.result);
        }
    }

    /// No earlier than the initiator's next deadline (see `wake`).
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        // Debug builds check the hint against the scan it replaces.
        debug_assert!(
            self.scan_deadlines()
                .is_none_or(|d| self.wake.is_some_and(|w| w <= d)),
            "wake-up hint {:?} later than the next deadline {:?}",
            self.wake,
            self.scan_deadlines()
        );
        self.wake
    }

    /// The initiator's next deadline, exactly: a scan of everything that has one.
    fn scan_deadlines(&self) -> Option<Instant> {
        if self.transfers.is_empty() && self.reads.is_empty() {
            return None;
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
        [t, r].into_iter().flatten().min()
    }

    /// The earliest head a cell this initiator sends by itself can have, with nothing
    /// more arriving (see [`crate::order`]): the next block of each transfer whose window
    /// is open, and a block waiting to be sent again after a refusal (at the refusal's
    /// modeled time). Not a retransmission after a timeout: a promise to send one a
    /// modeled timeout after its attempt would hold every switch below the departures of
    /// the block's own cells when they queue longer than that, and the block's answer,
    /// which lifts it, could never come. A retransmission is rare (a lost cell) and is
    /// taken late.
    /// Each bound goes to `at` with the node the cells go to.
    pub(super) fn horizon(&self, cfg: &NiConfig, at: &mut dyn FnMut(NodeId, ModelTime)) {
        for t in self.transfers.values() {
            // A block that waits for a free place in its transfer's window or its rank's
            // waits for an answer: what it will start at is the answer's to bound.
            let mut h = self.next_start(cfg, t).unwrap_or(ModelTime::NEVER);
            for b in t.live.values() {
                if matches!(b.step, Step::Pending | Step::Retry { .. }) {
                    h = h.min(b.modeled);
                }
            }
            if h < ModelTime::NEVER {
                at(t.dst.node(), h);
            }
        }
    }

    pub(super) fn on_timeout(&mut self, cx: &mut Ctx, mem: &dyn Memory) {
        let (now, cfg) = (cx.now, cx.cfg);
        let limit = cfg.copy_limit_ns();
        let txns: Vec<u32> = self.transfers.keys().copied().collect();
        for txn in txns {
            let mut fail = None;
            let Some(dst) = self.transfers.get(&txn).map(|t| t.dst.node()) else {
                continue;
            };
            let rto = self.rto(cfg, dst);
            let modeled_rtt = self.modeled_rtt.get(&dst);
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
                // A block refused (Retry) was answered: its copy is due whatever comes.
                // One in flight is due a timer's length after its last cell left.
                let floor = cx.cfg.model.retransmit;
                let copy_at = b.left.map_or(ModelTime::NEVER, |l| {
                    let l = l.max(b.modeled);
                    modeled_rtt.map_or(l + floor, |m| m.due(l, floor))
                });
                if matches!(b.step, Step::InFlight { .. }) && !cx.copy_due(copy_at) {
                    if now.since(b.first_sent) >= limit {
                        fail = Some(Failure::TimedOut);
                        break;
                    }
                    b.step = Step::InFlight {
                        deadline: now + rto,
                    };
                    continue;
                }
                if b.attempts >= cfg.max_attempts || now.since(b.first_sent) >= limit {
                    fail = Some(Failure::TimedOut);
                    break;
                }
                cx.stats.retransmissions += 1;
                // In modeled order a copy goes when it was due (never sooner than a
                // timer's length after the attempt); otherwise the modeled timer runs
                // from the attempt's modeled send.
                b.modeled =
                    if matches!(b.step, Step::InFlight { .. }) && copy_at != ModelTime::NEVER {
                        copy_at
                    } else {
                        b.modeled + cx.cfg.model.retransmit
                    };
                let sent = if matches!(b.step, Step::InFlight { .. }) {
                    // No answer came: probe with the last cell alone, in the same
                    // attempt, so that what did arrive is kept and the answer says what
                    // is missing (one cell instead of 64 on a lossy path).
                    cx.stats.timeouts += 1;
                    b.attempts += 1;
                    t.send_cells(cx, i, u64::MAX, rto, mem)
                } else {
                    // The receiver refused the block and forgot it: send it whole.
                    t.send_block(cx, i, rto, mem)
                };
                if sent.is_err() {
                    fail = Some(Failure::LocalFault);
                    break;
                }
            }
            if let Some(n) = t.notice {
                let due = n.step.deadline().is_some_and(|d| d <= now);
                let young = n.first_sent.is_none_or(|f| now.since(f) < limit);
                if due
                    && fail.is_none()
                    && young
                    && !cx.copy_due(t.answered + cx.cfg.model.retransmit)
                {
                    if let Some(n) = t.notice.as_mut() {
                        n.step = Step::InFlight {
                            deadline: now + cfg.retransmit_ns,
                        };
                    }
                } else if due && fail.is_none() {
                    let aged = n.first_sent.is_some_and(|f| now.since(f) >= limit);
                    if n.attempts >= cfg.max_attempts || aged {
                        fail = Some(Failure::TimedOut);
                    } else {
                        cx.stats.retransmissions += 1;
                        t.send_notice(cx);
                    }
                }
            }
            if let Some(f) = fail {
                self.fail(cx, txn, f);
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
            // Held only within the copy limit: past it the read ends timed out below.
            if !r.acked
                && now.since(r.first_sent) < limit
                && !cx.copy_due(r.request.stamp.head + cx.cfg.model.retransmit)
            {
                r.deadline = now + backoff(cfg.retransmit_ns, r.attempts);
                continue;
            }
            if r.acked || r.attempts >= cfg.max_attempts || now.since(r.first_sent) >= limit {
                cx.stats.timeouts += 1;
                let r = self.reads.remove(&txn).expect("listed");
                self.finish_read(cx, &r, Err(Failure::TimedOut));
            } else {
                r.attempts += 1;
                r.request.seq = r.request.seq.wrapping_add(1);
                r.request.stamp = Stamp::at(r.request.stamp.head + cx.cfg.model.retransmit);
                r.deadline = now + backoff(cfg.retransmit_ns, r.attempts);
                cx.stats.retransmissions += 1;
                cx.out.cells.push_back(r.request.clone());
            }
        }
        self.wake = self.scan_deadlines();
    }

    pub(super) fn detach(&mut self, cx: &mut Ctx, rank: u8) {
        // The times its window's places came free are this process's: the next one on
        // the rank (maybe another job's) starts with a window of its own.
        if let Some(f) = self.rank_freed.get_mut(usize::from(rank)) {
            f.clear();
        }
        // Reads served from this rank's memory stop at once: the memory is going away,
        // and the rank may soon belong to another job.
        let served: Vec<u32> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.rank == rank && matches!(t.origin, Origin::Served))
            .map(|(k, _)| *k)
            .collect();
        for txn in served {
            self.fail(cx, txn, Failure::Detached);
        }
        let local: Vec<u32> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.rank == rank && matches!(t.origin, Origin::Local(_)))
            .map(|(k, _)| *k)
            .collect();
        for txn in local {
            let t = self.remove_transfer(txn).expect("listed");
            let at = cx.at;
            self.finish_local(&t, Err(Failure::Detached), cx.out, at);
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
            cx.out.events.push_back(NiEvent::Rdma {
                rank,
                id: r.id,
                result: Err(Failure::Detached),
                at: cx.at,
            });
        }
        for p in self.pages.iter_mut() {
            if *p == Some(rank) {
                *p = None;
            }
        }
    }
}
