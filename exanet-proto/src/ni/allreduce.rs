//! The NI's allreduce accelerator (report §4.7, SPEC §4): sum, min and max of vectors of
//! up to 256 bytes of i32, i64, f32 or f64, over up to 1024 ranks, one rank per node and
//! whole QFDBs.
//!
//! The algorithm is the report's. Level 0: every client (the FPGAs of a QFDB other than
//! its network FPGA, F1) sends its vector to its F1, the *server*, which reduces the
//! QFDB's four vectors. Levels 1..=L (L = log2 of the QFDBs): servers exchange their
//! vectors with the server 1, 2, 4, ... QFDBs away (ranks 4, 8, 16, ... away) and reduce.
//! Last level: each server sends the result to its clients. Every member then writes the
//! result to its memory and completes.
//!
//! Every rank gets a bit-identical result: a QFDB's vectors are combined in member order,
//! and at each exchange both partners compute (lower half) op (upper half).
//!
//! # Wire
//! Accelerator cells are [`CellType::Collective`] cells to the peer's node and rank (so
//! the destination NI checks their PDID like any other): `txn` is the collective's id,
//! `seq` says which step it is (level << 10 | sender's index), `aux` the operation and
//! type (op << 4 | type), the destination VA the same step (for the dissector), and the
//! payload the vector. A cell counts only if it came from the member its `seq` names,
//! that member's node *and* rank: another rank of the same job on the member's node can
//! neither post as that member ([`AllreduceError::NotAMember`]) nor have its cells taken
//! for the member's (refused, `bad_address`). Each is answered (an ACK or NACK of the
//! accelerator's [`crate::cell::Engine`], as every answer carries the engine of
//! the cell it answers) and sent again until it is, like a packetizer message. A member
//! that fails (an answer never comes, a peer refuses) sends an abort step to every member,
//! so the collective fails everywhere with a reason; a member that never posts is covered
//! by the collective's deadline ([`super::NiConfig::collective_ns`]). A result is never
//! written unless every contribution arrived intact.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;
use thiserror::Error;

use super::{backoff, Ctx, Failure, Memory, NackReason, NiEvent};
use crate::cell::{Cell, CellType, Engine, FLAG_FIRST, FLAG_LAST};
use crate::code::numeric_code;
use crate::gvas::{Gvas, Pdid};
use crate::model::{ModelTime, Stamp};
use crate::shape::{NodeId, FPGAS_PER_QFDB};
use crate::time::Instant;

/// The largest vector one operation reduces (longer vectors take several operations).
pub const MAX_VECTOR: usize = 256;
/// The most ranks an operation spans.
pub const MAX_MEMBERS: usize = 1024;
/// Collectives one rank may have posted and going at once.
pub const MAX_CONTEXTS: usize = 64;
/// Collectives peers may announce to one rank (send cells of) before it posts them. Kept
/// apart from [`MAX_CONTEXTS`], so that what peers announce never keeps the rank from
/// posting its own.
pub const MAX_ANNOUNCED: usize = 64;
/// Of those, what one peer (a node and rank) may announce: a member runs ahead of another
/// by a collective or a few, and one sender must not take every slot and leave the
/// others' early cells refused.
pub const MAX_ANNOUNCED_PER_SENDER: usize = 8;
/// The step of the result's way from a server to its clients.
const SCATTER: u8 = 0xE;
/// The step that tells every member the collective failed (payload: the failure).
const ABORT: u8 = 0xF;

numeric_code! {
    /// The arithmetic of an operation.
    pub enum ReduceOp {
        Sum = 0 => "sum",
        Min = 1 => "min",
        Max = 2 => "max",
    }
}

numeric_code! {
    /// The element type of a vector: little-endian, as the ARM cores keep them.
    pub enum DataType {
        I32 = 0 => "i32",
        I64 = 1 => "i64",
        F32 = 2 => "f32",
        F64 = 3 => "f64",
    }
}

impl DataType {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            DataType::I32 | DataType::F32 => 4,
            DataType::I64 | DataType::F64 => 8,
        }
    }
}

/// `a = a op b`, element by element. Integer sums wrap, as the hardware's adders do.
pub fn combine(op: ReduceOp, ty: DataType, a: &mut [u8], b: &[u8]) {
    macro_rules! each {
        ($t:ty, $n:expr, $sum:expr) => {
            for (x, y) in a.chunks_exact_mut($n).zip(b.chunks_exact($n)) {
                let p = <$t>::from_le_bytes(x.try_into().expect("chunk size"));
                let q = <$t>::from_le_bytes(y.try_into().expect("chunk size"));
                let r: $t = match op {
                    ReduceOp::Sum => $sum(p, q),
                    ReduceOp::Min => {
                        if q < p {
                            q
                        } else {
                            p
                        }
                    }
                    ReduceOp::Max => {
                        if q > p {
                            q
                        } else {
                            p
                        }
                    }
                };
                x.copy_from_slice(&r.to_le_bytes());
            }
        };
    }
    match ty {
        DataType::I32 => each!(i32, 4, i32::wrapping_add),
        DataType::I64 => each!(i64, 8, i64::wrapping_add),
        DataType::F32 => each!(f32, 4, |p: f32, q: f32| p + q),
        DataType::F64 => each!(f64, 8, |p: f64, q: f64| p + q),
    }
}

/// An allreduce the accelerator runs for one rank: the collective `id` (the same on every
/// member, unique among the job's collectives in progress), the members in rank order
/// (node and rank of each), and where the rank's vector is and its result goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allreduce {
    pub id: u32,
    pub op: ReduceOp,
    pub ty: DataType,
    pub members: Vec<(NodeId, u8)>,
    pub src_va: u64,
    pub dst_va: u64,
    pub len: u16,
}

/// Why the accelerator refused an operation.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum AllreduceError {
    #[error("{0} members: the accelerator takes whole QFDBs, 4, 8, 16, ... up to 1024 ranks")]
    Members(usize),
    #[error("members {at}..{}: not the four FPGAs of one QFDB", at + 4)]
    NotAQfdb { at: usize },
    #[error("member {0} is not a node of this rack")]
    NoSuchNode(usize),
    #[error("QFDB of members {at}..{} appears twice", at + 4)]
    QfdbTwice { at: usize },
    #[error("this node is not among the members")]
    NotAMember,
    #[error("vector of {len} B: 1..=256 B, a whole number of {size}-byte elements")]
    Length { len: usize, size: usize },
    #[error("collective {0} is already in progress on this rank")]
    InProgress(u32),
    #[error("this rank has {MAX_CONTEXTS} collectives in progress")]
    TooMany,
}

/// Whether the accelerator can run an allreduce of `len` bytes of `ty` over `members` in a
/// rack of `nodes` nodes (whole QFDBs, a power of two of them, one rank per node), from
/// the point of view of any member: what a library checks before it chooses the path.
pub fn eligible(
    members: &[(NodeId, u8)],
    ty: DataType,
    len: usize,
    nodes: u32,
) -> Result<(), AllreduceError> {
    let first = members.first().copied().unwrap_or((NodeId(0), 0));
    let op = Allreduce {
        id: 0,
        op: ReduceOp::Sum,
        ty,
        members: members.to_vec(),
        src_va: 0,
        dst_va: 0,
        len: u16::try_from(len).unwrap_or(u16::MAX),
    };
    Accelerator::plan(&op, first, nodes).map(drop)
}

/// What an accelerated collective knows once posted.
#[derive(Clone, Debug)]
struct Plan {
    op: ReduceOp,
    ty: DataType,
    len: usize,
    members: Vec<(NodeId, u8)>,
    me: usize,
    dst_va: u64,
    /// Index of this QFDB's server (its F1) among the members.
    server: usize,
    /// Exchange levels between servers: log2 of the QFDBs.
    levels: u8,
}

impl Plan {
    fn is_server(&self) -> bool {
        self.me == self.server
    }

    /// Whether this member takes step `step` from member `from` in this collective.
    fn expects(&self, step: u8, from: usize) -> bool {
        let per = FPGAS_PER_QFDB as usize;
        if !self.is_server() {
            return step == SCATTER && from == self.server;
        }
        match step {
            0 => from / per == self.block() && from != self.me,
            k if (1..=self.levels).contains(&k) => {
                from == self.server_of(self.block() ^ (1 << (k - 1)))
            }
            _ => false,
        }
    }

    /// Where the vector of `step` from member `from` is kept.
    fn key(&self, step: u8, from: usize) -> StepKey {
        let (node, rank) = self.members[from];
        (step, from as u16, node.0, rank)
    }

    /// Whether a cell came from the member it names, node and rank (another rank of the
    /// same job on that node must not stand in for it), and is either an abort or a step
    /// this member takes, of this operation.
    fn vouches(&self, step: u8, from: usize, src: (NodeId, u8), aux: u8, len: usize) -> bool {
        self.members.get(from) == Some(&src)
            && (step == ABORT
                || (self.expects(step, from)
                    && len == self.len
                    && aux == (self.op as u8) << 4 | self.ty as u8))
    }

    fn block(&self) -> usize {
        self.me / FPGAS_PER_QFDB as usize
    }

    /// The server of the QFDB `b` blocks along the member table.
    fn server_of(&self, block: usize) -> usize {
        let base = block * FPGAS_PER_QFDB as usize;
        (base..base + FPGAS_PER_QFDB as usize)
            .find(|&i| (self.members[i].0 .0 % FPGAS_PER_QFDB) == 0)
            .expect("validated: every block has its F1")
    }
}

#[derive(Clone, Debug)]
struct Pending {
    cell: Cell,
    deadline: Instant,
    attempts: u8,
    /// In modeled order: its timer fired, its copy is not due by the model yet.
    held: bool,
}

/// A step's vector from a peer, and what its cell said (checked again at the post for
/// steps that came before it).
#[derive(Clone, Debug)]
struct Got {
    data: Bytes,
    at: ModelTime,
    /// The sender's node and rank.
    src: (NodeId, u8),
    aux: u8,
}

/// A received step: (step, sender's member index, sender's node, sender's rank).
type StepKey = (u8, u16, u32, u8);

/// Steps a rank may hold for a collective it has not posted: a server's three clients'
/// vectors and one per exchange level (ten at 1024 ranks), with room to spare.
const MAX_EARLY_STEPS: usize = 16;

/// One collective of one rank: posted, or only announced by peers' cells so far.
struct Context {
    pdid: Pdid,
    plan: Option<Plan>,
    /// Vectors received, by (step, sender index), with their modeled arrival.
    /// Keyed by the sender's node and rank too: before the post nothing says which node
    /// and rank a member index is, and a cell naming another's index must not take the
    /// real one's place.
    got: BTreeMap<StepKey, Got>,
    /// For a collective only announced so far: the peer (node, rank) whose cell
    /// announced it, which the slot counts against.
    announcer: Option<(NodeId, u8)>,
    /// Cells sent and not answered yet, by (step, receiver index).
    sends: BTreeMap<(u8, u16), Pending>,
    acc: Vec<u8>,
    /// The next exchange level (servers), 0 while gathering.
    level: u8,
    /// When what the accelerator has is ready, in modeled time.
    ready: ModelTime,
    /// The result is written (waiting only for the last answers).
    delivered: bool,
    deadline: Instant,
}

/// The accelerator of one NI.
#[derive(Default)]
pub struct Accelerator {
    contexts: HashMap<(u8, u32), Context>,
    /// Finished collectives, remembered to answer late copies of their cells.
    finished: HashMap<(u8, u32), Instant>,
    finished_order: VecDeque<(Instant, (u8, u32))>,
}

fn step_of(seq: u16) -> (u8, u16) {
    ((seq >> 10) as u8, seq & 0x3FF)
}

fn seq_of(step: u8, index: usize) -> u16 {
    (u16::from(step) << 10) | (index as u16 & 0x3FF)
}

impl Accelerator {
    /// Whether a collective is under way here: what reaches it may be forwarded to any
    /// member.
    pub(crate) fn busy(&self) -> bool {
        !self.contexts.is_empty()
    }

    /// Whether a step's copy waits for the rack's horizons to show its answer cannot come
    /// first (see `Packetizer::awaits_horizons`).
    pub(crate) fn awaits_horizons(&self) -> bool {
        self.contexts
            .values()
            .any(|c| c.sends.values().any(|p| p.held))
    }

    /// Checks `op` against the rack (`nodes` nodes) and the posting rank `me` (node and
    /// rank): whole QFDBs, a power of two of them, `me` among them, a vector the
    /// accelerator takes. A node's QFDB and FPGA follow from its id (SPEC §2: id = qfdb *
    /// 4 + fpga - 1).
    fn plan(op: &Allreduce, me: (NodeId, u8), nodes: u32) -> Result<Plan, AllreduceError> {
        let n = op.members.len();
        let per = FPGAS_PER_QFDB as usize;
        if n < per || n > MAX_MEMBERS || n % per != 0 || !(n / per).is_power_of_two() {
            return Err(AllreduceError::Members(n));
        }
        let len = usize::from(op.len);
        if len == 0 || len > MAX_VECTOR || len % op.ty.size() != 0 {
            return Err(AllreduceError::Length {
                len,
                size: op.ty.size(),
            });
        }
        let mut qfdbs = std::collections::HashSet::new();
        for (b, block) in op.members.chunks(per).enumerate() {
            let at = b * per;
            let mut fpgas = 0u32;
            let mut qfdb = None;
            for (i, &(node, rank)) in block.iter().enumerate() {
                if node.0 >= nodes || usize::from(rank) >= super::RANKS {
                    return Err(AllreduceError::NoSuchNode(at + i));
                }
                fpgas |= 1 << (node.0 % FPGAS_PER_QFDB);
                let q = node.0 / FPGAS_PER_QFDB;
                if *qfdb.get_or_insert(q) != q {
                    return Err(AllreduceError::NotAQfdb { at });
                }
            }
            if fpgas != 0b1111 {
                return Err(AllreduceError::NotAQfdb { at });
            }
            if !qfdbs.insert(qfdb) {
                return Err(AllreduceError::QfdbTwice { at });
            }
        }
        // By node and rank: another rank on a member's node is not that member, and
        // taking it for one would let it contribute in the member's place.
        let idx = op
            .members
            .iter()
            .position(|&m| m == me)
            .ok_or(AllreduceError::NotAMember)?;
        let mut plan = Plan {
            op: op.op,
            ty: op.ty,
            len,
            members: op.members.clone(),
            me: idx,
            dst_va: op.dst_va,
            server: 0,
            levels: (n / per).trailing_zeros() as u8,
        };
        plan.server = plan.server_of(plan.block());
        Ok(plan)
    }

    /// Collectives in progress (posted or announced).
    pub fn active(&self) -> usize {
        self.contexts.len()
    }

    /// Posts `op` for `rank` (in protection domain `pdid`).
    pub(crate) fn post(
        &mut self,
        cx: &mut Ctx,
        rank: u8,
        pdid: Pdid,
        op: &Allreduce,
        nodes: u32,
        mem: &mut dyn Memory,
    ) -> Result<(), AllreduceError> {
        let plan = Self::plan(op, (cx.me, rank), nodes)?;
        let key = (rank, op.id);
        if self.contexts.get(&key).is_some_and(|c| c.plan.is_some()) {
            return Err(AllreduceError::InProgress(op.id));
        }
        // Only the rank's own posts count: collectives peers announced have slots of
        // their own.
        let posted = self
            .contexts
            .iter()
            .filter(|(k, c)| k.0 == rank && c.plan.is_some())
            .count();
        if posted >= MAX_CONTEXTS {
            return Err(AllreduceError::TooMany);
        }
        self.finished.remove(&key);
        cx.stats.allreduce_started += 1;
        let mut data = vec![0u8; plan.len];
        let read = mem.read(rank, op.src_va, &mut data);
        let deadline = cx.now + cx.cfg.collective_ns;
        let ctx = self.contexts.entry(key).or_insert_with(|| Context {
            pdid,
            plan: None,
            got: BTreeMap::new(),
            announcer: None,
            sends: BTreeMap::new(),
            acc: Vec::new(),
            level: 0,
            ready: ModelTime::ZERO,
            delivered: false,
            deadline,
        });
        ctx.deadline = deadline;
        ctx.ready = ctx.ready.max(cx.at + cx.cfg.model.accel_setup);
        ctx.acc = data;
        ctx.plan = Some(plan);
        ctx.announcer = None;
        if read.is_err() {
            self.fail(cx, key, Failure::LocalFault, true);
            return Ok(());
        }
        // What came before the post is kept only if the operation vouches for it: the
        // member it names sent it, for a step this member takes, of this operation.
        let plan = self.contexts[&key].plan.clone().expect("just set");
        let ctx = self.contexts.get_mut(&key).expect("present");
        let before = ctx.got.len();
        ctx.got.retain(|&(step, from, _, _), g| {
            plan.vouches(step, usize::from(from), g.src, g.aux, g.data.len())
        });
        cx.stats.allreduce_early_refused += (before - ctx.got.len()) as u64;
        // A member gave up before this rank posted: the collective is over.
        let abort = ctx
            .got
            .iter()
            .find(|(k, _)| k.0 == ABORT)
            .map(|(_, g)| g.data.first().copied().unwrap_or(0));
        if let Some(code) = abort {
            self.fail(cx, key, failure_of(code), false);
            return Ok(());
        }
        if !plan.is_server() {
            let v = Bytes::from(self.contexts[&key].acc.clone());
            self.send(cx, key, 0, plan.server, v);
        }
        self.advance(cx, key, mem);
        Ok(())
    }

    /// Queues the cell of `step` to member `to` and remembers it until answered.
    fn send(&mut self, cx: &mut Ctx, key: (u8, u32), step: u8, to: usize, v: Bytes) {
        let Some(ctx) = self.contexts.get_mut(&key) else {
            return;
        };
        let Some(plan) = &ctx.plan else { return };
        let (node, rank) = plan.members[to];
        let what = StepCell {
            key,
            step,
            to: (node, rank),
            payload: v,
            at: ctx.ready,
        };
        let Some(cell) = collective_cell(cx, ctx.pdid, plan, what) else {
            return;
        };
        cx.out.cells.push_back(cell.clone());
        cx.stats.allreduce_cells_sent += 1;
        ctx.sends.insert(
            (step, to as u16),
            Pending {
                cell,
                deadline: cx.now + cx.cfg.retransmit_ns,
                attempts: 1,
                held: false,
            },
        );
    }

    /// Does whatever the collective can do with what it has.
    fn advance(&mut self, cx: &mut Ctx, key: (u8, u32), mem: &mut dyn Memory) {
        loop {
            let Some(ctx) = self.contexts.get_mut(&key) else {
                return;
            };
            let Some(plan) = ctx.plan.clone() else { return };
            if ctx.delivered {
                if ctx.sends.is_empty() {
                    self.finish(cx, key, Ok(()));
                }
                return;
            }
            let cost = cx.cfg.model.ni_rate.ps(plan.len);
            if !plan.is_server() {
                let Some(Got { data: v, at, .. }) =
                    ctx.got.get(&plan.key(SCATTER, plan.server)).cloned()
                else {
                    return;
                };
                ctx.ready = ctx.ready.max(at);
                ctx.acc = v.to_vec();
                self.deliver(cx, key, mem);
                continue;
            }
            if ctx.level == 0 {
                let base = plan.block() * FPGAS_PER_QFDB as usize;
                let clients: Vec<usize> = (base..base + FPGAS_PER_QFDB as usize)
                    .filter(|&i| i != plan.me)
                    .collect();
                if !clients
                    .iter()
                    .all(|&i| ctx.got.contains_key(&plan.key(0, i)))
                {
                    return;
                }
                // The QFDB's vectors in member order, whoever is the server.
                let mut acc: Option<Vec<u8>> = None;
                for i in base..base + FPGAS_PER_QFDB as usize {
                    let v = if i == plan.me {
                        ctx.acc.clone()
                    } else {
                        let g = &ctx.got[&plan.key(0, i)];
                        ctx.ready = ctx.ready.max(g.at);
                        g.data.to_vec()
                    };
                    match &mut acc {
                        None => acc = Some(v),
                        Some(a) => combine(plan.op, plan.ty, a, &v),
                    }
                }
                ctx.acc = acc.expect("four members");
                ctx.ready = ctx.ready + 3 * cost;
                ctx.level = 1;
                if plan.levels > 0 {
                    let partner = plan.server_of(plan.block() ^ 1);
                    let v = Bytes::from(ctx.acc.clone());
                    self.send(cx, key, 1, partner, v);
                }
                continue;
            }
            if ctx.level <= plan.levels {
                let k = ctx.level;
                let pb = plan.block() ^ (1 << (k - 1));
                let partner = plan.server_of(pb);
                let Some(Got { data: v, at, .. }) = ctx.got.get(&plan.key(k, partner)).cloned()
                else {
                    return;
                };
                ctx.ready = ctx.ready.max(at) + cost;
                // Both partners compute lower op upper: the same bits on both sides.
                if plan.block() < pb {
                    combine(plan.op, plan.ty, &mut ctx.acc, &v);
                } else {
                    let mut lower = v.to_vec();
                    combine(plan.op, plan.ty, &mut lower, &ctx.acc);
                    ctx.acc = lower;
                }
                ctx.level = k + 1;
                if k < plan.levels {
                    let next = plan.server_of(plan.block() ^ (1 << k));
                    let v = Bytes::from(ctx.acc.clone());
                    self.send(cx, key, k + 1, next, v);
                }
                continue;
            }
            // Every level done: the result goes to the QFDB's clients and to memory.
            let base = plan.block() * FPGAS_PER_QFDB as usize;
            let v = Bytes::from(ctx.acc.clone());
            for i in (base..base + FPGAS_PER_QFDB as usize).filter(|&i| i != plan.me) {
                self.send(cx, key, SCATTER, i, v.clone());
            }
            self.deliver(cx, key, mem);
        }
    }

    /// Writes the result to the rank's memory.
    fn deliver(&mut self, cx: &mut Ctx, key: (u8, u32), mem: &mut dyn Memory) {
        let Some(ctx) = self.contexts.get_mut(&key) else {
            return;
        };
        let Some(plan) = &ctx.plan else { return };
        if mem.write(key.0, plan.dst_va, &ctx.acc).is_err() {
            self.fail(cx, key, Failure::LocalFault, true);
            return;
        }
        ctx.ready = ctx.ready + cx.cfg.model.mem_write;
        ctx.delivered = true;
        // What a client sent was answered, or its result could not have come.
        if !plan.is_server() {
            ctx.sends.clear();
        }
    }

    /// Ends the collective for this rank and tells it.
    fn finish(&mut self, cx: &mut Ctx, key: (u8, u32), result: Result<(), Failure>) {
        let Some(ctx) = self.contexts.remove(&key) else {
            return;
        };
        if ctx.plan.is_some() {
            match result {
                Ok(()) => cx.stats.allreduce_done += 1,
                Err(_) => cx.stats.allreduce_failed += 1,
            }
            cx.out.events.push_back(NiEvent::Allreduce {
                rank: key.0,
                id: key.1,
                result,
                // A success is when the result was written; the answers waited for after
                // that are bookkeeping (a late one may answer a copy sent again only
                // because the host was slow, which the modeled hardware never saw).
                at: if result.is_ok() {
                    ctx.ready
                } else {
                    ctx.ready.max(cx.at)
                },
            });
        }
        let until = cx.now + cx.cfg.keep_ns();
        self.finished.insert(key, until);
        self.finished_order.push_back((until, key));
    }

    /// Fails the collective here and, when `tell`, aborts it at every other member.
    fn fail(&mut self, cx: &mut Ctx, key: (u8, u32), f: Failure, tell: bool) {
        if tell {
            if let Some(ctx) = self.contexts.get(&key) {
                if let Some(plan) = &ctx.plan {
                    let code = Bytes::from(vec![failure_code(f)]);
                    for (i, &(node, rank)) in plan.members.iter().enumerate() {
                        if i == plan.me {
                            continue;
                        }
                        let what = StepCell {
                            key,
                            step: ABORT,
                            to: (node, rank),
                            payload: code.clone(),
                            at: ctx.ready.max(cx.at),
                        };
                        if let Some(c) = collective_cell(cx, ctx.pdid, plan, what) {
                            cx.out.cells.push_back(c);
                        }
                    }
                }
            }
        }
        self.finish(cx, key, Err(f));
    }

    /// An accelerator cell for `rank` arrived (its PDID already checked against the
    /// rank's). Answers it.
    pub(crate) fn on_cell(&mut self, cx: &mut Ctx, cell: &Cell, pdid: Pdid, mem: &mut dyn Memory) {
        let rank = cell.dst.rank();
        let key = (rank, cell.txn);
        let (step, from) = step_of(cell.seq);
        cx.stats.allreduce_cells_received += 1;
        if self.answer_copy(cx, cell) {
            // A late copy of a cell of a collective that is over: it arrived before.
            return;
        }
        let src = (cell.src, cell.src_rank);
        if !self.contexts.contains_key(&key) {
            if step == ABORT {
                // Nothing here to abort (not posted, or over).
                cx.answer(cell, None);
                return;
            }
            // Announced by a peer before this rank posted it: within the peer's share
            // of the slots announcements have, so no one sender takes them all (and none
            // of them is a slot the rank's own posts need).
            let (mut all, mut theirs) = (0, 0);
            for c in self
                .contexts
                .iter()
                .filter(|(k, _)| k.0 == rank)
                .map(|(_, c)| c)
            {
                if c.plan.is_none() {
                    all += 1;
                    theirs += usize::from(c.announcer == Some(src));
                }
            }
            if all >= MAX_ANNOUNCED || theirs >= MAX_ANNOUNCED_PER_SENDER {
                cx.answer(cell, Some(NackReason::NoContext));
                return;
            }
            self.contexts.insert(
                key,
                Context {
                    pdid,
                    plan: None,
                    got: BTreeMap::new(),
                    announcer: Some(src),
                    sends: BTreeMap::new(),
                    acc: Vec::new(),
                    level: 0,
                    ready: ModelTime::ZERO,
                    delivered: false,
                    deadline: cx.now + cx.cfg.collective_ns,
                },
            );
        }
        let ctx = self.contexts.get_mut(&key).expect("present");
        let from = usize::from(from);
        let at = (step, from as u16, cell.src.0, cell.src_rank);
        let sane = match &ctx.plan {
            Some(plan) => plan.vouches(step, from, src, cell.aux, cell.payload.len()),
            // Kept until the post, which checks it then; bounded meanwhile.
            None => {
                cell.payload.len() <= MAX_VECTOR
                    && (ctx.got.len() < MAX_EARLY_STEPS || ctx.got.contains_key(&at))
            }
        };
        if !sane {
            cx.answer(cell, Some(NackReason::BadAddress));
            return;
        }
        cx.answer(cell, None);
        if step == ABORT && ctx.plan.is_some() {
            let code = cell.payload.first().copied().unwrap_or(0);
            self.fail(cx, key, failure_of(code), false);
            return;
        }
        ctx.got.entry(at).or_insert_with(|| Got {
            data: cell.payload.clone(),
            at: cx.at,
            src,
            aux: cell.aux,
        });
        if ctx.plan.is_some() {
            self.advance(cx, key, mem);
        }
    }

    /// An answer to one of this NI's accelerator cells.
    pub(crate) fn on_answer(
        &mut self,
        cx: &mut Ctx,
        ans: &Cell,
        nack: Option<NackReason>,
        mem: &mut dyn Memory,
    ) {
        let key = (ans.dst.rank(), ans.txn);
        // The answer echoes our cell's step and our own index; which member answered is
        // the answer's source.
        let (step, _) = step_of(ans.seq);
        let Some(ctx) = self.contexts.get_mut(&key) else {
            return;
        };
        let Some(to) = ctx
            .sends
            .iter()
            .find(|((s, _), p)| {
                *s == step && p.cell.dst.node() == ans.src && p.cell.dst.rank() == ans.src_rank
            })
            .map(|(k, _)| *k)
        else {
            return;
        };
        match nack {
            None => {
                ctx.sends.remove(&to);
                self.advance(cx, key, mem);
            }
            Some(r) if r.transient() || r == NackReason::Crc => {
                // Sent again when its timer fires (a busy receiver, a damaged copy).
            }
            Some(r) => self.fail(cx, key, Failure::Nacked(r), true),
        }
    }

    /// The earliest deadline of the accelerator's timers.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let sends = self
            .contexts
            .values()
            .flat_map(|c| c.sends.values().map(|p| p.deadline).chain([c.deadline]));
        let forget = self.finished_order.front().map(|f| f.0);
        sends.chain(forget).min()
    }

    /// Retransmissions, collectives past their deadline, and forgetting old ones.
    pub(crate) fn on_timeout(&mut self, cx: &mut Ctx) {
        let now = cx.now;
        while let Some(&(until, key)) = self.finished_order.front() {
            if until > now {
                break;
            }
            self.finished_order.pop_front();
            if self.finished.get(&key) == Some(&until) {
                self.finished.remove(&key);
            }
        }
        let keys: Vec<(u8, u32)> = self.contexts.keys().copied().collect();
        for key in keys {
            let ctx = self.contexts.get_mut(&key).expect("listed");
            if ctx.deadline <= now {
                cx.stats.timeouts += 1;
                if ctx.plan.is_some() {
                    self.fail(cx, key, Failure::TimedOut, true);
                } else {
                    // Announced by a peer and never posted here: forgotten quietly.
                    self.contexts.remove(&key);
                }
                continue;
            }
            let mut exhausted = false;
            for p in ctx.sends.values_mut().filter(|p| p.deadline <= now) {
                p.held = !cx.copy_due(p.cell.stamp.head + cx.cfg.model.retransmit);
                if p.held {
                    p.deadline = now + backoff(cx.cfg.retransmit_ns, p.attempts);
                    continue;
                }
                if p.attempts >= cx.cfg.max_attempts {
                    exhausted = true;
                    break;
                }
                p.attempts += 1;
                p.deadline = now + backoff(cx.cfg.retransmit_ns, p.attempts);
                p.cell.stamp = Stamp::at(p.cell.stamp.head + cx.cfg.model.retransmit);
                cx.out.cells.push_back(p.cell.clone());
                cx.stats.retransmissions += 1;
            }
            if exhausted {
                cx.stats.timeouts += 1;
                self.fail(cx, key, Failure::TimedOut, true);
            }
        }
    }

    /// Forgets everything about `rank`'s collectives: announced ones and finished ones.
    /// Collective ids belong to the process on the rank; the next process on it may reuse
    /// them at once, and a cell of its collective must not be taken for a late copy of a
    /// finished one (which would be answered and dropped, and the collective never end).
    pub(crate) fn forget_rank(&mut self, rank: u8) {
        self.forget_announced(rank);
        self.finished.retain(|k, _| k.0 != rank);
    }

    /// Forgets the collectives peers announced to `rank` that it never posted. What it
    /// finished stays until the next process attaches: a copy whose original's ACK was
    /// lost may still come after the process left (see [`Accelerator::answer_copy`]).
    pub(crate) fn forget_announced(&mut self, rank: u8) {
        self.contexts.retain(|k, c| k.0 != rank || c.plan.is_some());
    }

    /// Answers `cell` if it is a copy of a cell of a collective its rank finished (its
    /// original's ACK lost); false when it is not one. The first look at every cell, and
    /// asked before anything else for cells whose rank's process has left since: refused,
    /// the peer's collective failed for what had been delivered.
    pub(crate) fn answer_copy(&mut self, cx: &mut Ctx, cell: &Cell) -> bool {
        let done = self.finished.contains_key(&(cell.dst.rank(), cell.txn));
        if done {
            cx.answer(cell, None);
        }
        done
    }

    /// The rank goes away: its collectives fail here (peers time out or are told).
    pub(crate) fn detach(&mut self, cx: &mut Ctx, rank: u8) {
        let keys: Vec<(u8, u32)> = self
            .contexts
            .keys()
            .filter(|k| k.0 == rank)
            .copied()
            .collect();
        for key in keys {
            self.fail(cx, key, Failure::Detached, true);
        }
    }
}

/// One cell of a collective: its step of collective `key`, to member `to` (node, rank),
/// at modeled time `at`.
struct StepCell {
    key: (u8, u32),
    step: u8,
    to: (NodeId, u8),
    payload: Bytes,
    at: ModelTime,
}

/// The cell `what` describes, in protection domain `pdid` of `plan`.
fn collective_cell(cx: &Ctx, pdid: Pdid, plan: &Plan, what: StepCell) -> Option<Cell> {
    let StepCell {
        key,
        step,
        to: (node, rank),
        payload,
        at,
    } = what;
    let va = (u64::from(step) << 16) | plan.me as u64;
    let dst = Gvas::new(pdid, node, rank, va).ok()?;
    let mut c = Cell::new(dst, CellType::Collective, cx.me, payload)
        .ok()?
        .of(Engine::Accelerator);
    c.txn = key.1;
    c.src_rank = key.0;
    c.seq = seq_of(step, plan.me);
    c.aux = (plan.op as u8) << 4 | plan.ty as u8;
    c.flags = FLAG_FIRST | FLAG_LAST;
    c.stamp = Stamp::at(at);
    Some(c)
}

fn failure_code(f: Failure) -> u8 {
    match f {
        Failure::Nacked(r) => 0x10 | r as u8,
        Failure::TimedOut => 1,
        Failure::LocalFault => 2,
        Failure::Detached => 3,
        Failure::Aborted(code) => code,
    }
}

fn failure_of(code: u8) -> Failure {
    Failure::Aborted(code)
}

/// What an abort's failure code says, for people.
pub fn abort_label(code: u8) -> String {
    match code {
        1 => "a member timed out".into(),
        2 => "a member could not read or write its memory".into(),
        3 => "a member detached".into(),
        c if c & 0x10 != 0 => match NackReason::from_u8(c & 0x0F) {
            Some(r) => format!("a member was refused: {}", r.label()),
            None => "a member was refused".into(),
        },
        _ => "a member failed".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type and operation against results written out by hand, not computed with
    /// what is under test: signed integers on both sides of zero and at the wrap (an
    /// unsigned comparison or a saturating add shows), floats of very different
    /// magnitudes and both zeros, compared bit for bit. On a tie (0.0 against -0.0) min
    /// and max keep the first operand: the accelerator's fixed order relies on it.
    #[test]
    fn combine_each_type_and_operation() {
        fn le<T: Copy, const N: usize>(v: &[T], f: fn(T) -> [u8; N]) -> Vec<u8> {
            v.iter().flat_map(|&x| f(x)).collect()
        }
        let i32s = |v: &[i32]| le(v, i32::to_le_bytes);
        let i64s = |v: &[i64]| le(v, i64::to_le_bytes);
        let f32s = |v: &[f32]| le(v, f32::to_le_bytes);
        let f64s = |v: &[f64]| le(v, f64::to_le_bytes);
        const M: i64 = 1 << 40;
        // (type, a, b, [a + b, min, max])
        let cases = [
            (
                DataType::I32,
                i32s(&[1, -5, i32::MAX, i32::MIN, -7, 0]),
                i32s(&[2, 7, 1, -1, -7, -3]),
                [
                    i32s(&[3, 2, i32::MIN, i32::MAX, -14, -3]),
                    i32s(&[1, -5, 1, i32::MIN, -7, -3]),
                    i32s(&[2, 7, i32::MAX, -1, -7, 0]),
                ],
            ),
            (
                DataType::I64,
                i64s(&[-M, 3, i64::MAX, i64::MIN, -1, 0]),
                i64s(&[5, -(1 << 62), 1, -1, -1, -9]),
                [
                    i64s(&[5 - M, 3 - (1 << 62), i64::MIN, i64::MAX, -2, -9]),
                    i64s(&[-M, -(1 << 62), 1, i64::MIN, -1, -9]),
                    i64s(&[5, 3, i64::MAX, -1, -1, 0]),
                ],
            ),
            (
                DataType::F32,
                f32s(&[1.5, -2.0, 0.0, -0.0, -0.0, 1e30, -3.25e-5, 7.0]),
                f32s(&[0.5, -3.0, -0.0, 0.0, -0.0, -1e-30, 2.5e10, 7.0]),
                [
                    f32s(&[2.0, -5.0, 0.0, 0.0, -0.0, 1e30, 2.5e10, 14.0]),
                    f32s(&[0.5, -3.0, 0.0, -0.0, -0.0, -1e-30, -3.25e-5, 7.0]),
                    f32s(&[1.5, -2.0, 0.0, -0.0, -0.0, 1e30, 2.5e10, 7.0]),
                ],
            ),
            (
                DataType::F64,
                f64s(&[1.5, -2.0, 0.0, -0.0, -0.0, 1e300, 0.1, -4e-310]),
                f64s(&[0.5, -3.0, -0.0, 0.0, -0.0, -1e-300, 0.2, 1e-320]),
                [
                    f64s(&[
                        2.0,
                        -5.0,
                        0.0,
                        0.0,
                        -0.0,
                        1e300,
                        0.30000000000000004,
                        -3.9999999999e-310,
                    ]),
                    f64s(&[0.5, -3.0, 0.0, -0.0, -0.0, -1e-300, 0.1, -4e-310]),
                    f64s(&[1.5, -2.0, 0.0, -0.0, -0.0, 1e300, 0.2, 1e-320]),
                ],
            ),
        ];
        let mut covered = std::collections::HashSet::new();
        for (ty, a, b, want) in &cases {
            for (op, want) in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max]
                .into_iter()
                .zip(want)
            {
                let mut got = a.clone();
                combine(op, *ty, &mut got, b);
                assert_eq!(&got, want, "{ty:?} {op:?}");
                covered.insert((ty.label(), op.label()));
            }
        }
        assert_eq!(covered.len(), 12);
    }

    #[test]
    fn plans_take_whole_qfdbs_in_powers_of_two() {
        let shape = 16;
        let q = |b: u32| -> Vec<(NodeId, u8)> { (0..4).map(|f| (NodeId(b * 4 + f), 0)).collect() };
        let op = |members: Vec<(NodeId, u8)>| Allreduce {
            id: 1,
            op: ReduceOp::Sum,
            ty: DataType::I32,
            members,
            src_va: 0,
            dst_va: 0,
            len: 8,
        };
        let two: Vec<_> = q(0).into_iter().chain(q(2)).collect();
        let p = Accelerator::plan(&op(two.clone()), (NodeId(9), 0), shape).unwrap();
        assert_eq!((p.me, p.server, p.levels), (5, 4, 1));
        let three: Vec<_> = two.iter().copied().chain(q(1)).collect();
        assert_eq!(
            Accelerator::plan(&op(three), (NodeId(0), 0), shape).unwrap_err(),
            AllreduceError::Members(12)
        );
        let mut mixed = two.clone();
        mixed.swap(3, 4);
        assert_eq!(
            Accelerator::plan(&op(mixed), (NodeId(0), 0), shape).unwrap_err(),
            AllreduceError::NotAQfdb { at: 0 }
        );
        let twice: Vec<_> = q(1).into_iter().chain(q(1)).collect();
        assert_eq!(
            Accelerator::plan(&op(twice), (NodeId(4), 0), shape).unwrap_err(),
            AllreduceError::QfdbTwice { at: 4 }
        );
        assert_eq!(
            Accelerator::plan(&op(two.clone()), (NodeId(1 + 4), 0), shape).unwrap_err(),
            AllreduceError::NotAMember
        );
        let mut long = op(two);
        long.len = 6;
        assert!(matches!(
            Accelerator::plan(&long, (NodeId(0), 0), shape),
            Err(AllreduceError::Length { len: 6, size: 4 })
        ));
    }
}
