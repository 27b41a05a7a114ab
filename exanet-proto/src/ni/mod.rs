//! The network interface of a node (SPEC §4): packetizer, mailbox and RDMA engine, as
//! deterministic state machines. The NI sits behind the switch's local port: cells for
//! this node come in through [`Ni::on_cell`], cells it wants to send leave through
//! [`Ni::poll_cell`], timers are explicit ([`Ni::poll_timeout`], [`Ni::handle_timeout`]).
//! Memory is whatever the node's ranks registered ([`Memory`]).
//!
//! # Wire conventions (on top of [`crate::cell`])
//! - Every cell carries the NI engine it belongs to ([`Engine`]: packetizer, RDMA,
//!   accelerator), and an answer that of the cell it answers, which is how it finds its
//!   engine. Transaction ids: a packetizer channel's are `vi` (6 bits) and channel (2 bits)
//!   in bits 23..31 and a counter below; an RDMA transfer's are in [`rdma`].
//! - Packetizer messages are `Write` cells of <= 64 B. One whose destination VA lies in
//!   the mailbox window ([`mailbox_gvas`]) is queued in that mailbox; any other is written
//!   to memory. Each is answered with an `Ack` or `Nack` (reason in `aux`).
//! - `Ack`/`Nack` cells go to the sender's node and rank with the original `txn` and
//!   `seq`; RDMA block answers carry the block number (destination VA / 16 KB) as 8
//!   payload bytes, and an `Incomplete` NACK then the bitmap of the cells that arrived.

pub mod allreduce;
pub mod mailbox;
pub mod memory;
pub mod nack;
pub mod op;
pub mod packetizer;
mod program;
pub mod rdma;
mod recent;

use std::collections::VecDeque;

use bytes::Bytes;
use thiserror::Error;

use crate::cell::{Cell, CellType, Engine};
use crate::gvas::{Gvas, Pdid};
use crate::model::{Model, ModelTime, Stamp};
use crate::shape::NodeId;
use crate::time::Instant;
use crate::topology::{Port, NPORTS};

pub use allreduce::{Accelerator, Allreduce, AllreduceError, DataType, ReduceOp};
pub use mailbox::{Mailboxes, Message, MAILBOX_VIS};
pub use memory::{Backing, BackingFault, MemFault, Memory, Regions, VecMemory};
pub use nack::{NackReason, REASONS};
pub use op::{RdmaRead, RdmaWrite, SendMessage};
pub use packetizer::{ChannelState, Packetizer, CHANNELS, MAX_MESSAGE, PACKETIZER_VIS};
pub use program::Program;
pub use rdma::{RdmaEngine, TransferId, BLOCK_SIZE, RDMA_PAGES};

/// Ranks (local ports) per node.
pub const RANKS: usize = 8;
/// The mailbox window: VAs with the top three of 39 bits set (the thesis's peripheral
/// window), mailbox VI in the low bits.
pub const MAILBOX_WINDOW: u64 = 0b111 << 36;
/// How far ahead of its rank's clock a workload may stamp a command, in picoseconds (a
/// day): a program's stamp runs ahead of what its rank has seen only by the compute it
/// did since, and a stamp past this is taken as this far ahead (and counted), so that one
/// absurd stamp cannot carry the rank, and the cells it sends, to the end of time.
pub const MAX_LEAD: u64 = 86_400 * 1_000_000_000_000;

/// The GVAS of mailbox `vi` of `rank` on `node`.
pub fn mailbox_gvas(pdid: Pdid, node: NodeId, rank: u8, vi: u8) -> Option<Gvas> {
    Gvas::new(pdid, node, rank, MAILBOX_WINDOW | u64::from(vi)).ok()
}

/// How a posted operation ended, when it did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The destination refused it for good, or kept refusing it until the retries ran out.
    Nacked(NackReason),
    /// No answer after the allowed attempts.
    TimedOut,
    /// The local source memory could not be read.
    LocalFault,
    /// The rank detached while the operation was going on.
    Detached,
    /// Another member of a collective failed and told this one (its failure code, see
    /// [`allreduce::abort_label`]).
    Aborted(u8),
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NiError {
    #[error("rank {0} is outside 0..=7")]
    BadRank(u8),
    #[error("rank {0} is not attached")]
    NotAttached(u8),
    #[error("{what} {index} does not exist")]
    NoSuch { what: &'static str, index: usize },
    #[error("{what} {index} belongs to another rank")]
    NotOwner { what: &'static str, index: usize },
    #[error("{what} {index} is busy")]
    Busy { what: &'static str, index: usize },
    #[error("no free {0}")]
    Exhausted(&'static str),
    #[error("message of {0} B exceeds {MAX_MESSAGE} B")]
    TooLong(usize),
    #[error("transfer of {0} B: length must be 1..={max}", max = rdma::MAX_TRANSFER)]
    BadLength(u64),
    #[error("address range {va:#x}+{len} does not fit the 39-bit VA space")]
    BadRange { va: u64, len: u64 },
    #[error("destination {0} is not a node of this rack")]
    BadDestination(NodeId),
    #[error("allreduce: {0}")]
    Allreduce(AllreduceError),
}

/// What the NI reports to the node's owner (the daemon relays it to workloads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NiEvent {
    /// A packetizer channel reached a final state.
    Packetizer {
        rank: u8,
        vi: u8,
        ch: u8,
        state: ChannelState,
        /// When, in modeled time (the answer's arrival).
        at: ModelTime,
    },
    /// A message was queued in a mailbox (each entry carries its own modeled time).
    Mailbox {
        rank: u8,
        vi: u8,
        /// When, in modeled time.
        at: ModelTime,
    },
    /// An RDMA write or read ended.
    Rdma {
        rank: u8,
        id: TransferId,
        result: Result<(), Failure>,
        /// When, in modeled time.
        at: ModelTime,
    },
    /// A completion notification was written into this node's memory.
    Notified {
        rank: u8,
        va: u64,
        src: NodeId,
        len: u64,
        /// When it was written, in modeled time.
        at: ModelTime,
    },
    /// An accelerated allreduce ended on this rank (its result is in the rank's memory
    /// when it succeeded).
    Allreduce {
        rank: u8,
        id: u32,
        result: Result<(), Failure>,
        at: ModelTime,
    },
}

/// Counters of the NI, declared in the metric catalog with the family each one feeds.
pub use crate::metric::NiStats;

/// Timing and sizing of the NI protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NiConfig {
    /// How long a sender waits for an ACK before retransmitting.
    pub retransmit_ns: u64,
    /// How long a sender waits after a transient NACK before retrying.
    pub nack_retry_ns: u64,
    /// Attempts per message or block before the operation fails.
    pub max_attempts: u8,
    /// RDMA blocks of one transfer in flight at once; must cover the path's round trip
    /// (a 16 KB block is ~40 us at 3 Gb/s, so 32 blocks cover ~1.3 ms).
    pub window_blocks: usize,
    /// RDMA blocks in flight at once for all the transfers reading one rank's memory
    /// (its own writes and the remote reads it serves): what bounds one rank's share of
    /// the engine, and the engine's state, whatever number of channels it keeps busy.
    pub rank_window_blocks: usize,
    /// Receive contexts (blocks being reassembled) per node.
    pub rx_contexts: usize,
    /// How long a finished block or message is remembered at least, to recognise late
    /// duplicates (longer when the senders' retry budget is: see [`NiConfig::keep_ns`]).
    pub remember_ns: u64,
    /// Where transaction ids start. The owner picks a different one each time it creates
    /// an NI (the daemon: from the clock), so that a restarted node's new transfers are
    /// not taken for duplicates of the old ones its peers still remember.
    pub epoch: u32,
    /// The modeled hardware (the NI's costs and datapath rate).
    pub model: Model,
    /// How long an accelerated collective may wait for its members before it fails
    /// everywhere (a member that never posts must not hang the others).
    pub collective_ns: u64,
}

impl Default for NiConfig {
    fn default() -> Self {
        NiConfig {
            // Links are lossless; only injected faults and link failures lose cells, so
            // the floor favours not retransmitting what is merely queued. The RDMA engine
            // raises it from measured round trips.
            retransmit_ns: 20_000_000,
            nack_retry_ns: 2_000_000,
            max_attempts: 8,
            window_blocks: 32,
            // 4 MiB: eight transfers at full window.
            rank_window_blocks: 256,
            rx_contexts: 1024,
            remember_ns: 2_000_000_000,
            epoch: 0,
            model: Model::default(),
            collective_ns: 30_000_000_000,
        }
    }
}

impl NiConfig {
    /// How long a sender may go on sending copies of a block or message: the backoff of
    /// every attempt. A receiver that forgets a finished one sooner may take a late copy
    /// for a new one.
    pub fn retry_budget_ns(&self) -> u64 {
        (1..=self.max_attempts)
            .map(|a| backoff(self.retransmit_ns, a))
            .fold(0, u64::saturating_add)
    }

    /// The fewest attempts, and never fewer than these settings have, whose retry budget
    /// lasts `ns`: what a sender needs to outlast an outage of that length (the owner
    /// passes the time after which the rack calls a link down, so that a cut it would
    /// not call down heals). At most 100.
    pub fn attempts_outlasting(&self, ns: u64) -> u8 {
        let mut c = *self;
        while c.retry_budget_ns() < ns && c.max_attempts < 100 {
            c.max_attempts += 1;
        }
        c.max_attempts
    }

    /// How long a receiver remembers a finished block, message, served read or
    /// collective, to drop late copies: `remember_ns`, or twice the senders' retry budget
    /// when that is longer. A sender stops sending copies half this long after its first
    /// send (see `copy_limit_ns`), so no copy can outlive the receiver's memory of what
    /// it duplicates and be taken for new data.
    pub fn keep_ns(&self) -> u64 {
        self.remember_ns
            .max(self.retry_budget_ns().saturating_mul(2))
    }

    /// How long after its first send a sender may still send copies of a block or notice
    /// whose retransmission timeout follows measured round trips (and so may have grown
    /// past the configured one the retry budget counts): half of what receivers keep,
    /// leaving the other half for a copy's way through the fabric. A transfer that needs
    /// longer fails as timed out rather than risk a copy landing over newer data.
    pub fn copy_limit_ns(&self) -> u64 {
        self.keep_ns() / 2
    }
}

/// The retransmission timeout of the `attempt`-th send (1-based): doubling from the base
/// and capped at 64 times it, so a congested path is not flooded with copies of blocks
/// that are merely queued (the timer starts when a block is cut, not when it leaves).
pub(crate) fn backoff(base_ns: u64, attempt: u8) -> u64 {
    base_ns.saturating_mul(1 << attempt.saturating_sub(1).min(6))
}

/// The cells and events produced while handling one input.
#[derive(Default)]
pub struct Out {
    /// Everything but answers.
    pub cells: VecDeque<Cell>,
    /// ACKs and NACKs: injected ahead of `cells`, into a class of virtual channels of
    /// their own (see [`crate::routing`]), so they never wait behind data.
    pub answers: VecDeque<Cell>,
    pub events: VecDeque<NiEvent>,
}

#[derive(Clone, Copy, Debug)]
struct RankCtx {
    pdid: Pdid,
}

pub struct Ni {
    node: NodeId,
    nodes: u32,
    cfg: NiConfig,
    ranks: [Option<RankCtx>; RANKS],
    // The engines are the NI's own: what the workload service and tools do with them
    // goes through the NI's methods below, which name it.
    pub(crate) packetizer: Packetizer,
    pub(crate) mailboxes: Mailboxes,
    pub(crate) rdma: RdmaEngine,
    pub(crate) accelerator: Accelerator,
    out: Out,
    pub(crate) stats: NiStats,
    /// Each rank's modeled clock: the latest modeled time the NI handled an input of that
    /// rank at (its posts, the cells and answers addressed to it). One per rank, not one
    /// for the node: a rank's clock must not move because another job's did (the NI's own
    /// work, timers and refills, happens at the clock of the rank it is for).
    clocks: [ModelTime; RANKS],
    /// What the NI promises on behalf of its ranks' programs (see [`program`]).
    programs: program::Programs,
    /// In modeled order, no cell with an earlier modeled time can still reach the NI
    /// (set by the node from its switch); `None` when cells go in the host's order.
    arrival_bound: Option<ModelTime>,
    /// In modeled order, no cell with an earlier modeled time can still come in on the
    /// node's links (set by the node before it takes the NI's cells); `None` in the host's
    /// order. What the NI's own cells wait for: what comes in may make it cut blocks
    /// earlier than those it holds (see [`Ni::poll_cell_of`]).
    inject_bound: Option<ModelTime>,
}

/// What the parts of the NI borrow while they handle one input: this node, the
/// configuration, the time, and where the cells, events and counts they produce go.
pub(crate) struct Ctx<'a> {
    pub(crate) me: NodeId,
    pub(crate) cfg: &'a NiConfig,
    pub(crate) now: Instant,
    /// The modeled time of the input being handled: what the NI makes of it starts then.
    pub(crate) at: ModelTime,
    pub(crate) out: &'a mut Out,
    pub(crate) stats: &'a mut NiStats,
    pub(crate) arrival_bound: Option<ModelTime>,
    /// In modeled order: the RDMA engine cuts blocks in modeled-time order.
    pub(crate) ordered: bool,
}

impl Ctx<'_> {
    /// Whether a copy due at `due` in modeled time may go when its real-time timer
    /// fires. In the host's order, yes. In modeled order only once nothing earlier than
    /// `due` can still reach the NI: the answer that would make the copy needless would
    /// come before it in modeled time, however late in real time it is (a cell waits for
    /// the rack's cuts in real time, while its modeled time is already settled), and a
    /// needless copy would take modeled time on every output it crosses, depending on how
    /// long the host took. Gated copies wait without counting an attempt; what has to be
    /// sent again still goes, at the same modeled time, once the answer is known not to
    /// come before it.
    pub(crate) fn copy_due(&self, due: ModelTime) -> bool {
        self.settled(due)
    }

    /// Whether nothing earlier than `t` in modeled time can still reach the NI: always
    /// in the host's order, where real time is all there is.
    pub(crate) fn settled(&self, t: ModelTime) -> bool {
        self.arrival_bound.is_none_or(|b| b > t)
    }

    /// Queues an ACK or NACK for `cell` back to its sender (with the block it concerns,
    /// for RDMA cells).
    pub(crate) fn answer(&mut self, cell: &Cell, nack: Option<NackReason>) {
        self.answer_with(cell, nack, rdma::answer_payload(cell));
    }

    /// [`Ctx::answer`] with the payload given.
    pub(crate) fn answer_with(&mut self, cell: &Cell, nack: Option<NackReason>, payload: Bytes) {
        let Ok(dst) = Gvas::new(cell.dst.pdid(), cell.src, cell.src_rank, 0) else {
            return;
        };
        let kind = if nack.is_some() {
            CellType::Nack
        } else {
            CellType::Ack
        };
        // The answer goes to the engine of what it answers, wherever it is made (a CRC or
        // PDID refusal too), never to another whose txn and seq happen to match.
        let Ok(mut c) = Cell::new(dst, kind, self.me, payload).map(|c| c.of(cell.engine)) else {
            return;
        };
        // The answer is generated once what it answers is in.
        c.stamp = Stamp::at(self.at + self.cfg.model.ack);
        c.src_rank = cell.dst.rank();
        c.txn = cell.txn;
        c.seq = cell.seq;
        match nack {
            Some(r) => {
                c.aux = r as u8;
                self.stats.nacks_sent[r as usize] += 1;
                if r == NackReason::PdidMismatch {
                    self.stats.pdid_violations += 1;
                }
            }
            None => self.stats.acks_sent += 1,
        }
        self.out.answers.push_back(c);
    }
}

/// The [`Ctx`] of an input to `$ni` at `$now`, borrowing only the fields it names so that
/// the NI's parts stay free to be driven with it.
macro_rules! cx {
    ($ni:expr, $now:expr, $at:expr) => {
        &mut Ctx {
            me: $ni.node,
            cfg: &$ni.cfg,
            now: $now,
            at: $at,
            out: &mut $ni.out,
            stats: &mut $ni.stats,
            arrival_bound: $ni.arrival_bound,
            ordered: $ni.inject_bound.is_some(),
        }
    };
}

impl Ni {
    pub fn new(node: NodeId, nodes: u32, cfg: NiConfig) -> Ni {
        Ni {
            node,
            nodes,
            cfg,
            ranks: [None; RANKS],
            packetizer: Packetizer::with_epoch(cfg.epoch),
            mailboxes: Mailboxes::new(),
            rdma: RdmaEngine::with_epoch(cfg.epoch),
            accelerator: Accelerator::default(),
            out: Out::default(),
            stats: NiStats::default(),
            clocks: [ModelTime::ZERO; RANKS],
            programs: program::Programs::default(),
            arrival_bound: None,
            inject_bound: None,
        }
    }

    /// The latest modeled time the NI has handled an input of `rank` at: when an
    /// operation the rank posts without a modeled time of its own happens. Zero for a
    /// rank outside 0..=7.
    pub fn clock(&self, rank: u8) -> ModelTime {
        self.clocks
            .get(usize::from(rank))
            .copied()
            .unwrap_or(ModelTime::ZERO)
    }

    /// Commands taken at [`MAX_LEAD`] ahead of their rank's clock because they were
    /// stamped further ahead.
    pub fn stamps_clamped(&self) -> u64 {
        self.stats.stamps_clamped
    }

    /// Moves `rank`'s modeled clock to `at` if that is later; returns `at`.
    fn tick(&mut self, rank: u8, at: ModelTime) -> ModelTime {
        if let Some(c) = self.clocks.get_mut(usize::from(rank)) {
            *c = (*c).max(at);
        }
        at
    }

    /// When a command of `rank` stamped `at` by its workload reaches the NI: a CPU-to-NI
    /// request later, from a stamp no more than [`MAX_LEAD`] ahead of the rank's clock.
    fn posted(&mut self, rank: u8, at: ModelTime) -> ModelTime {
        let limit = self.clock(rank) + MAX_LEAD;
        let at = if at > limit {
            self.stats.stamps_clamped += 1;
            limit
        } else {
            at
        };
        match self.programs.posted(rank, at) {
            None => {}
            Some(Program::Scripted) => self.stats.late_posts_gone += 1,
            Some(Program::Running) => self.stats.late_posts_running += 1,
            Some(Program::Waiting) => self.stats.late_posts_waiting += 1,
        }
        self.tick(rank, at + self.cfg.model.cpu_ni)
    }

    /// Runs `f`, work the NI does on its own (timers, refills) for every rank at once, with
    /// no modeled time of its own: what it sends again or answers keeps the time of what it
    /// repeats or answers, and whatever it would produce at no time at all (an operation
    /// that fails) is placed at the clock of the rank it is for. A node-wide clock here
    /// would let one job's clock reach every other job's completions.
    fn on_own(&mut self, f: impl FnOnce(&mut Ni)) {
        let (cells, answers, events) = (
            self.out.cells.len(),
            self.out.answers.len(),
            self.out.events.len(),
        );
        f(self);
        let clocks = self.clocks;
        let clock = |rank: u8| clocks.get(usize::from(rank)).copied().unwrap_or_default();
        let new_cells = self.out.cells.range_mut(cells..);
        for c in new_cells.chain(self.out.answers.range_mut(answers..)) {
            if c.stamp.head == ModelTime::ZERO {
                c.stamp = Stamp::at(clock(c.src_rank));
            }
        }
        for e in self.out.events.range_mut(events..) {
            let (rank, at) = match e {
                NiEvent::Packetizer { rank, at, .. }
                | NiEvent::Rdma { rank, at, .. }
                | NiEvent::Notified { rank, at, .. }
                | NiEvent::Allreduce { rank, at, .. } => (*rank, at),
                NiEvent::Mailbox { .. } => continue,
            };
            if *at == ModelTime::ZERO {
                *at = clock(rank);
            }
        }
    }

    pub fn config(&self) -> &NiConfig {
        &self.cfg
    }

    /// The NI's counters.
    pub fn stats(&self) -> &NiStats {
        &self.stats
    }

    /// The packetizer, to look at (channel states).
    pub fn packetizer(&self) -> &Packetizer {
        &self.packetizer
    }

    /// The RDMA engine, to look at (transfers and blocks under way).
    pub fn rdma(&self) -> &RdmaEngine {
        &self.rdma
    }

    /// Gives `rank` a packetizer interface; returns its index.
    pub fn alloc_packetizer(&mut self, rank: u8) -> Result<u8, NiError> {
        self.packetizer.alloc(rank)
    }

    pub fn free_packetizer(&mut self, rank: u8, vi: u8) -> Result<(), NiError> {
        self.packetizer.free(rank, vi)
    }

    /// Gives `rank` an RDMA page; returns its index.
    pub fn alloc_rdma_page(&mut self, rank: u8) -> Result<u8, NiError> {
        self.rdma.alloc_page(rank)
    }

    pub fn free_rdma_page(&mut self, rank: u8, page: u8) -> Result<(), NiError> {
        self.rdma.free_page(rank, page)
    }

    /// Gives `rank` a mailbox of `capacity` messages, read here (see
    /// [`Mailboxes::alloc`]); returns its interface.
    pub fn alloc_mailbox(&mut self, rank: u8, capacity: usize) -> Result<u8, NiError> {
        self.mailboxes.alloc(rank, capacity)
    }

    /// Gives `rank` a mailbox read further away, whose reader reports what it took (see
    /// [`Mailboxes::alloc_counted`]).
    pub fn alloc_counted_mailbox(
        &mut self,
        rank: u8,
        capacity: usize,
        want: Option<u8>,
        kept: impl Fn(u8) -> bool,
        consumed: impl FnOnce(u8) -> Box<dyn mailbox::ConsumedCount>,
    ) -> Result<u8, NiError> {
        self.mailboxes
            .alloc_counted(rank, capacity, want, kept, consumed)
    }

    pub fn free_mailbox(&mut self, rank: u8, vi: u8) -> Result<(), NiError> {
        self.mailboxes.free(rank, vi)
    }

    /// The oldest message of `rank`'s mailbox `vi`, taken out of the NI's queue.
    pub fn pop_message(&mut self, rank: u8, vi: u8) -> Result<Option<Message>, NiError> {
        self.mailboxes.pop(rank, vi)
    }

    /// Messages in the NI's queue of `rank`'s mailbox `vi`.
    pub fn queued_messages(&mut self, rank: u8, vi: u8) -> Result<usize, NiError> {
        self.mailboxes.len(rank, vi)
    }

    /// Messages that count against the mailbox's capacity (see [`Mailboxes::unread`]).
    pub fn unread_messages(&mut self, rank: u8, vi: u8) -> Result<usize, NiError> {
        self.mailboxes.unread(rank, vi)
    }

    /// A process takes rank `rank` with protection domain `pdid` (the daemon decides it).
    pub fn attach(&mut self, rank: u8, pdid: Pdid) -> Result<(), NiError> {
        self.attach_from(rank, pdid, ModelTime::ZERO)
    }

    /// [`Ni::attach`], the process's modeled clock starting at `start`
    /// ([`ModelTime::from_wall`] for a daemon's workloads).
    pub fn attach_from(&mut self, rank: u8, pdid: Pdid, start: ModelTime) -> Result<(), NiError> {
        let slot = self
            .ranks
            .get_mut(rank as usize)
            .ok_or(NiError::BadRank(rank))?;
        if slot.is_some() {
            return Err(NiError::Busy {
                what: "rank",
                index: rank as usize,
            });
        }
        *slot = Some(RankCtx { pdid });
        // A new process starts its collective ids afresh: what the rank's previous one
        // finished must not pass for late copies of the new one's.
        self.accelerator.forget_rank(rank);
        // And its modeled time from its own start, not where the previous one left it
        // (possibly another job's).
        self.clocks[usize::from(rank)] = start;
        self.programs.attach(rank, start);
        Ok(())
    }

    /// The process on `rank` is gone: its interfaces are freed and everything it had
    /// posted ends with [`Failure::Detached`].
    pub fn detach(&mut self, rank: u8, now: Instant) -> Result<(), NiError> {
        self.rank(rank)?;
        self.ranks[rank as usize] = None;
        let at = self.clock(rank);
        self.packetizer.detach(rank, &mut self.out, at);
        self.mailboxes.detach(rank);
        self.rdma.detach(cx!(self, now, at), rank);
        self.accelerator.detach(cx!(self, now, at), rank);
        self.accelerator.forget_announced(rank);
        self.programs.detach(rank);
        Ok(())
    }

    pub fn pdid(&self, rank: u8) -> Option<Pdid> {
        self.ranks
            .get(rank as usize)
            .copied()
            .flatten()
            .map(|r| r.pdid)
    }

    fn rank(&self, rank: u8) -> Result<Pdid, NiError> {
        match self.ranks.get(rank as usize) {
            None => Err(NiError::BadRank(rank)),
            Some(None) => Err(NiError::NotAttached(rank)),
            Some(Some(r)) => Ok(r.pdid),
        }
    }

    /// The address a cell of `rank` goes to: a node of this rack, in the rank's own
    /// protection domain whatever PDID the caller wrote (a process never chooses it).
    fn stamp(&self, rank: u8, dst: Gvas) -> Result<Gvas, NiError> {
        let pdid = self.rank(rank)?;
        if dst.node().0 >= self.nodes {
            return Err(NiError::BadDestination(dst.node()));
        }
        Ok(dst.with_pdid(pdid))
    }

    /// Sends `op`'s message (up to 64 B) from one of the rank's packetizer channels. The
    /// PDID the cell carries is the rank's, whatever `op.dst` says.
    pub fn send_message(
        &mut self,
        rank: u8,
        op: &SendMessage,
        now: Instant,
    ) -> Result<(), NiError> {
        self.send_message_at(rank, op, now, self.clock(rank))
    }

    /// [`Ni::send_message`] posted at modeled time `at` (the workload's clock): the cell
    /// leaves once the CPU's request has reached the NI.
    pub fn send_message_at(
        &mut self,
        rank: u8,
        op: &SendMessage,
        now: Instant,
        at: ModelTime,
    ) -> Result<(), NiError> {
        self.send_message_of(rank, CellType::Write, op, now, at)
    }

    /// [`Ni::send_message_at`] as one cell of `kind`, which the destination NI acts on
    /// and answers: how an operation carried by the packetizer is posted.
    pub(crate) fn send_message_of(
        &mut self,
        rank: u8,
        kind: CellType,
        op: &SendMessage,
        now: Instant,
        at: ModelTime,
    ) -> Result<(), NiError> {
        let dst = self.stamp(rank, op.dst)?;
        let at = self.posted(rank, at);
        self.packetizer
            .send(cx!(self, now, at), rank, kind, op, dst)?;
        self.stats.messages_sent += 1;
        Ok(())
    }

    /// Posts `op`, an RDMA write from the rank's memory, with its optional completion
    /// notification.
    pub fn rdma_write(
        &mut self,
        rank: u8,
        op: &RdmaWrite,
        now: Instant,
        mem: &dyn Memory,
    ) -> Result<TransferId, NiError> {
        self.rdma_write_at(rank, op, now, self.clock(rank), mem)
    }

    /// [`Ni::rdma_write`] posted at modeled time `at`: the engine starts once the
    /// descriptor has reached it.
    pub fn rdma_write_at(
        &mut self,
        rank: u8,
        op: &RdmaWrite,
        now: Instant,
        at: ModelTime,
        mem: &dyn Memory,
    ) -> Result<TransferId, NiError> {
        let op = RdmaWrite {
            dst: self.stamp(rank, op.dst)?,
            ..*op
        };
        let at = self.posted(rank, at);
        self.rdma.post_write(cx!(self, now, at), rank, &op, mem)
    }

    /// Posts `op`, an RDMA read from remote memory into the rank's.
    pub fn rdma_read(
        &mut self,
        rank: u8,
        op: &RdmaRead,
        now: Instant,
    ) -> Result<TransferId, NiError> {
        self.rdma_read_at(rank, op, now, self.clock(rank))
    }

    /// [`Ni::rdma_read`] posted at modeled time `at`.
    pub fn rdma_read_at(
        &mut self,
        rank: u8,
        op: &RdmaRead,
        now: Instant,
        at: ModelTime,
    ) -> Result<TransferId, NiError> {
        let op = RdmaRead {
            src: self.stamp(rank, op.src)?,
            ..*op
        };
        let at = self.posted(rank, at);
        self.rdma.post_read(cx!(self, now, at), rank, &op)
    }

    /// Posts `op`, an allreduce on the accelerator, for `rank` at modeled time `at`.
    pub fn allreduce_at(
        &mut self,
        rank: u8,
        op: &Allreduce,
        now: Instant,
        at: ModelTime,
        mem: &mut dyn Memory,
    ) -> Result<(), NiError> {
        let pdid = self.rank(rank)?;
        let at = self.posted(rank, at);
        let nodes = self.nodes;
        self.accelerator
            .post(cx!(self, now, at), rank, pdid, op, nodes, mem)
            .map_err(NiError::Allreduce)
    }

    /// Answers `cell` if it is a copy of a message, block, notice, read or collective
    /// cell this NI already delivered or accepted; false when it is not one (or nothing
    /// remembers it: a packetizer write to plain memory).
    fn answer_copy(&mut self, now: Instant, written: ModelTime, cell: &Cell) -> bool {
        match cell.engine {
            Engine::Packetizer
                if cell.kind == CellType::Write
                    && cell.dst.va() & MAILBOX_WINDOW == MAILBOX_WINDOW =>
            {
                let delivered = self.mailboxes.delivered(cell);
                if delivered {
                    cx!(self, now, written).answer(cell, None);
                }
                delivered
            }
            Engine::Rdma => self.rdma.answer_copy(cx!(self, now, written), cell),
            Engine::Accelerator => self.accelerator.answer_copy(cx!(self, now, written), cell),
            Engine::Packetizer => false,
        }
    }

    /// A cell addressed to this node arrived.
    pub fn on_cell(&mut self, cell: Cell, now: Instant, mem: &mut dyn Memory) {
        // The NI acts once the cell's last byte is in; what it writes to memory is there
        // a memory write later. The time moves the clock of the rank the cell is for only
        // once it is known to be that rank's job's (a late answer to the rank's previous
        // process, a cell of another job, must not move it).
        let arrived = cell.stamp.tail;
        let written = arrived + self.cfg.model.mem_write;
        let rank = cell.dst.rank();
        let ours = self.pdid(rank) == Some(cell.dst.pdid());
        if cell.is_corrupt() {
            // The payload failed its end-to-end CRC: refuse it so the sender sends again.
            // A corrupt answer is dropped; its sender's timer covers it.
            if !matches!(cell.kind, CellType::Ack | CellType::Nack) {
                cx!(self, now, written).answer(&cell, Some(NackReason::Crc));
            }
            return;
        }
        match cell.kind {
            CellType::Ack | CellType::Nack => {
                let nack = if cell.kind == CellType::Nack {
                    let r = NackReason::from_u8(cell.aux).unwrap_or(NackReason::BadAddress);
                    self.stats.nacks_received[r as usize] += 1;
                    Some(r)
                } else {
                    self.stats.acks_received += 1;
                    None
                };
                if ours {
                    self.tick(rank, arrived);
                }
                match cell.engine {
                    Engine::Accelerator => {
                        self.accelerator
                            .on_answer(cx!(self, now, arrived), &cell, nack, mem);
                    }
                    Engine::Rdma => {
                        self.rdma
                            .on_answer(cx!(self, now, arrived), &cell, nack, mem);
                    }
                    Engine::Packetizer => {
                        self.packetizer
                            .on_answer(cx!(self, now, arrived), &cell, nack);
                    }
                }
            }
            _ => {
                // A copy of what was delivered to this rank's previous process (its
                // original's answer lost) is answered as the original was.
                if !ours && self.answer_copy(now, written, &cell) {
                    return;
                }
                let Some(pdid) = self.pdid(rank) else {
                    cx!(self, now, written).answer(&cell, Some(NackReason::NoContext));
                    return;
                };
                if !ours {
                    cx!(self, now, written).answer(&cell, Some(NackReason::PdidMismatch));
                    return;
                }
                self.tick(rank, arrived);
                match cell.kind {
                    CellType::Write if cell.engine == Engine::Packetizer => {
                        self.stats.messages_received += 1;
                        let r = if cell.dst.va() & MAILBOX_WINDOW == MAILBOX_WINDOW {
                            self.mailboxes.deliver(cx!(self, now, written), &cell)
                        } else {
                            mem.write(rank, cell.dst.va(), &cell.payload)
                                .map_err(|_| NackReason::PageFault)
                        };
                        cx!(self, now, written).answer(&cell, r.err());
                    }
                    CellType::Write => self.rdma.on_data(cx!(self, now, written), &cell, mem),
                    CellType::ReadRequest => {
                        self.rdma
                            .on_read_request(cx!(self, now, written), &cell, mem)
                    }
                    CellType::Notify => self.rdma.on_notify(cx!(self, now, written), &cell, mem),
                    CellType::Collective => {
                        self.accelerator
                            .on_cell(cx!(self, now, written), &cell, pdid, mem)
                    }
                    _ => {}
                }
            }
        }
    }

    /// The earliest time at which [`Ni::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.packetizer.next_deadline(),
            self.rdma.next_deadline(&self.cfg),
            self.mailboxes.next_deadline(&self.cfg),
            self.accelerator.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Retransmits, retries and expiries due at `now`.
    pub fn handle_timeout(&mut self, now: Instant, mem: &dyn Memory) {
        self.on_own(|ni| {
            ni.packetizer.on_timeout(cx!(ni, now, ModelTime::ZERO));
            ni.rdma.on_timeout(cx!(ni, now, ModelTime::ZERO), mem);
            ni.accelerator.on_timeout(cx!(ni, now, ModelTime::ZERO));
        });
        self.mailboxes.expire(now, &self.cfg);
    }

    /// Lets the RDMA engine put more blocks on the wire (call when the fabric has room).
    pub fn refill(&mut self, now: Instant, mem: &dyn Memory) {
        self.on_own(|ni| ni.rdma.refill(cx!(ni, now, ModelTime::ZERO), mem));
        if self.inject_bound.is_some() {
            // In modeled order what it holds goes in modeled order, then by rank. Stable:
            // a block's cells, and a rank's posts at one time, keep their order. Nearly
            // always sorted already (blocks are cut in order), which the sort finds in
            // one pass.
            self.out
                .cells
                .make_contiguous()
                .sort_by_key(|c| (c.stamp.head, c.src_rank));
        }
    }

    /// The next cell to inject, answers first. The NI stamps its node as the source of
    /// every cell.
    pub fn poll_cell(&mut self) -> Option<Cell> {
        self.poll_cell_of(true).or_else(|| self.poll_cell_of(false))
    }

    /// The next answer (`answers`) or other cell to inject: each class has its own
    /// injection queue, so a full data queue does not hold answers back.
    ///
    /// In modeled order ([`Ni::set_inject_bound`]) its own cells go in modeled-time order,
    /// then by rank (the order in which the NI's datapath serialises them decides who
    /// waits for whom, and the host delivers the posts of several ranks in any order),
    /// each only once nothing that goes before it can still be made: no program of the
    /// NI may still post earlier, no block still to cut is earlier, and nothing that can
    /// still come in on a link is earlier (an answer opens a transfer's window, a read
    /// request starts a served transfer). Answers go as they come: they are made of what
    /// came in, in modeled order already. Copies after a timeout are not ordered (see
    /// [`crate::order`]).
    pub fn poll_cell_of(&mut self, answers: bool) -> Option<Cell> {
        if answers {
            let mut c = self.out.answers.pop_front()?;
            c.src = self.node;
            return Some(c);
        }
        if let Some(bound) = self.inject_bound {
            let c = self.out.cells.front()?;
            let key = (c.stamp.head, c.src_rank);
            let uncut = self.rdma.earliest_uncut(&self.cfg);
            if key.0 >= bound
                || uncut.is_some_and(|u| u < key)
                || !self
                    .programs
                    .none_before(key.0, key.1, self.cfg.model.cpu_ni)
            {
                return None;
            }
        }
        let mut c = self.out.cells.pop_front()?;
        c.src = self.node;
        Some(c)
    }

    /// In modeled order: no cell earlier than `bound` can still come in on the node's
    /// links; the NI's own cells then go in modeled order (see [`Ni::poll_cell_of`]), as
    /// [`Ni::refill`] sorts them. `None`: in the host's order.
    pub fn set_inject_bound(&mut self, bound: Option<ModelTime>) {
        self.inject_bound = bound;
    }

    /// The cell from [`Ni::poll_cell`] was injected into the fabric at `now` (the switch
    /// serialises it through the NI's datapath, in the order it takes cells).
    pub fn injected(&mut self, c: &Cell, now: Instant) {
        self.rdma.on_injected(c, now, &self.cfg);
    }

    /// In modeled order, the node's switch forwarded `c`, one of this NI's cells, at the
    /// modeled time of its stamp: what a copy of it waits for is dated from there.
    pub fn departed(&mut self, c: &Cell) {
        match c.engine {
            crate::cell::Engine::Rdma => self.rdma.on_departed(c),
            crate::cell::Engine::Packetizer => self.packetizer.on_departed(c),
            crate::cell::Engine::Accelerator => {}
        }
    }

    /// The earliest heads a cell the NI injects by itself, with nothing more reaching it,
    /// can have, by the output it takes (`port_of` a destination; `None` for one no
    /// route reaches, which counts on every output), as (data, answers): for data, the
    /// cells it holds and the blocks its RDMA engine has still to cut; for answers, those
    /// it holds (see [`crate::order`]). What it would send in reaction to what still
    /// reaches it is the switch's to bound. Not what its ranks' programs may post next: a
    /// driver that orders cells must know that (the simulator's tests post before they
    /// run; see `docs/modeled-time.md`).
    pub fn horizon(
        &self,
        port_of: &dyn Fn(NodeId) -> Option<Port>,
    ) -> ([ModelTime; NPORTS], [ModelTime; NPORTS]) {
        let mut data = [ModelTime::NEVER; NPORTS];
        let mut answers = [ModelTime::NEVER; NPORTS];
        let at = |by: &mut [ModelTime; NPORTS], dst: NodeId, t: ModelTime| match port_of(dst) {
            Some(p) => by[p.index()] = by[p.index()].min(t),
            None => by.iter_mut().for_each(|b| *b = (*b).min(t)),
        };
        for c in &self.out.cells {
            at(&mut data, c.dst.node(), c.stamp.head);
        }
        for c in &self.out.answers {
            at(&mut answers, c.dst.node(), c.stamp.head);
        }
        self.rdma
            .horizon(&self.cfg, &mut |dst, t| at(&mut data, dst, t));
        // A program may post to anyone.
        let promise = self.programs.promise();
        data.iter_mut().for_each(|d| *d = (*d).min(promise));
        // What no output's horizon is below: a post behind it went out of modeled order.
        self.programs
            .given(data.iter().copied().min().unwrap_or(promise));
        (data, answers)
    }

    /// Whether its programs promise nothing before the attach floor (see
    /// [`crate::horizon::Coordinator`]: such a node, idle, is left out of cuts).
    pub fn promises_nothing_before_floor(&self) -> bool {
        self.programs.quiet()
    }

    /// Whether the NI has cells to inject, transfers under way, or a copy that waits for
    /// the rack's horizons to move on (not what its programs may still post): in modeled
    /// order this is what keeps the rack taking cuts.
    pub fn has_work(&self) -> bool {
        let mut transfers = false;
        self.rdma.horizon(&self.cfg, &mut |_, _| transfers = true);
        transfers
            || self.has_output()
            || self.packetizer.awaits_horizons()
            || self.accelerator.awaits_horizons()
    }

    /// What `rank`'s program is doing, as the driver sees it (see [`Program`]).
    pub fn set_program(&mut self, rank: u8, program: Program) {
        self.programs.set(rank, program);
    }

    /// `rank`'s program took everything delivered to it.
    pub fn program_drained(&mut self, rank: u8) {
        self.programs.drained(rank);
    }

    /// Something was delivered to `rank`'s program at `at` (an event it will take).
    pub fn delivered(&mut self, rank: u8, at: ModelTime) {
        self.programs.delivered(rank, at);
    }

    /// In modeled order: no cell with an earlier modeled time than `bound` can still
    /// reach this NI (the node's switch says, from its inputs' horizons and queues). A
    /// copy after a timeout then goes only once the bound has passed its modeled time
    /// ([`Ctx::copy_due`]). `None`: cells go in the host's order, copies on the timer.
    pub fn set_arrival_bound(&mut self, bound: Option<ModelTime>) {
        self.arrival_bound = bound;
    }

    /// No process attaches to this NI from now on with an earlier clock (`None`: no
    /// process will, as in the simulator's tests).
    pub fn set_attach_floor(&mut self, floor: Option<ModelTime>) {
        self.programs.set_attach_floor(floor);
    }

    /// Whether the NI may send anywhere in reaction to what reaches it, not only back to
    /// where it came from: an accelerated collective under way forwards what it combines.
    pub fn relays(&self) -> bool {
        self.accelerator.busy() || self.programs.relay()
    }

    /// Puts back a cell that could not be injected yet, keeping its place.
    pub fn unpoll_cell(&mut self, c: Cell) {
        if crate::routing::Vc::injection(c.kind).is_answer() {
            self.out.answers.push_front(c);
        } else {
            self.out.cells.push_front(c);
        }
    }

    /// True when cells wait to be injected.
    pub fn has_output(&self) -> bool {
        !self.out.cells.is_empty() || !self.out.answers.is_empty()
    }

    pub fn poll_event(&mut self) -> Option<NiEvent> {
        self.out.events.pop_front()
    }
}

#[cfg(test)]
mod config_tests {
    use super::*;

    /// The retry budget and what receivers keep, as docs/faults.md, docs/operating.md
    /// ("Faults during a job") and docs/emulated.md publish them: a cut shorter than the
    /// budget heals, a longer one fails the job.
    #[test]
    fn the_published_retry_budgets_are_the_configs() {
        let d = NiConfig::default();
        assert_eq!(
            d.retry_budget_ns(),
            3_820_000_000,
            "default budget (3.82 s)"
        );
        assert_eq!(d.keep_ns(), 7_640_000_000, "kept twice the budget (7.64 s)");
        let with = |max_attempts| NiConfig {
            max_attempts,
            ..NiConfig::default()
        };
        assert_eq!(
            with(12).retry_budget_ns(),
            8_940_000_000,
            "12 attempts (8.94 s)"
        );
        assert_eq!(
            with(13).retry_budget_ns(),
            10_220_000_000,
            "13 attempts (10.2 s)"
        );
        assert_eq!(
            with(14).retry_budget_ns(),
            11_500_000_000,
            "14 attempts (11.5 s)"
        );
        assert_eq!(
            with(14).keep_ns(),
            23_000_000_000,
            "kept at 14 attempts (23 s)"
        );
    }

    /// A rack with the default 10 s link timeout asks for a budget of 11 s (the link
    /// timeout and a second for the answer's way back after a heal): 14 attempts.
    #[test]
    fn the_attempts_that_outlast_an_outage_are_the_fewest_that_do() {
        let d = NiConfig::default();
        assert_eq!(d.attempts_outlasting(11_000_000_000), 14);
        assert_eq!(d.attempts_outlasting(11_500_000_000), 14);
        assert_eq!(d.attempts_outlasting(11_500_000_001), 15);
        // Never fewer than configured, never past 100.
        assert_eq!(d.attempts_outlasting(1), d.max_attempts);
        assert_eq!(d.attempts_outlasting(u64::MAX), 100);
    }
}
