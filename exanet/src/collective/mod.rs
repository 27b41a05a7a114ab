//! Collectives for a group of ranks: barrier, broadcast, reduce and allreduce.
//!
//! An allreduce uses the NI's accelerator ([`Path::Accelerator`]) when the group and the
//! vector allow it (whole QFDBs, a power of two of them, one rank per node; vectors are
//! reduced 256 bytes per operation, as the hardware does); everything else runs in
//! software ([`Path::Software`]): the algorithms of `exanet_collective` (recursive
//! doubling, binomial trees, ring) over the NI's primitives, as ExaNet-MPI sends its
//! messages: a step of up to [`EAGER_LIMIT`] bytes (by default; see
//! [`Collectives::set_eager_limit`]) as packetizer messages to the peer's collective
//! mailbox, a longer one by rendezvous: an RTS message, the peer's CTS naming where it
//! goes, and an RDMA write with a completion notification there. [`Path::Auto`] picks the
//! accelerator when it can.
//!
//! Every member must call the same collectives of a group in the same order (as MPI
//! requires): each call takes the group's next sequence number, which names its messages
//! and its accelerator operations.
//!
//! # Collective mailbox
//! Software collectives of rank `r` arrive in mailbox interface [`COLLECTIVE_VI_BASE`] +
//! `r` of its node, opened by [`Endpoint::collectives`]: peers address it without asking.
//! What the messages carry is in [`wire`]; the rendezvous' memory in [`rendezvous`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use exanet_collective::{Algorithm, Kind, SoftCollective};
use exanet_proto::attach::{
    AllreducePost, CollectiveKind, CollectivePath, CollectiveReport, Command, Request, MEMBER_ENTRY,
};
use exanet_proto::model::ModelTime;
use exanet_proto::ni::allreduce::{eligible, MAX_VECTOR};
pub use exanet_proto::ni::{DataType, ReduceOp};
use exanet_proto::NodeId;

use crate::endpoint::{Endpoint, Mailbox, MemoryRegion, Packetizer, RdmaPage, Tag};
use crate::engine::{Chan, Incoming, Next, Shared};
use crate::error::{Error, OpError, Result};
use exanet_proto::ni::NackReason;

mod rendezvous;
mod wire;

use rendezvous::{Landing, Pool, Staged, Transfers, NOTIFICATION, RETIRED_POOLS};
use wire::{Body, Call, CHUNK, MAX_EAGER};

/// The collective mailbox of rank `r` is interface `COLLECTIVE_VI_BASE + r`.
pub const COLLECTIVE_VI_BASE: u8 = exanet_proto::reserved::COLLECTIVE_MAILBOX_BASE;
/// Messages the collective mailbox holds.
const MAILBOX_CAPACITY: u32 = 4096;
/// The longest step sent as messages by default; longer ones go by rendezvous. ExaNet-MPI's
/// eager limit (report §5.1).
pub const EAGER_LIMIT: usize = 32;
/// How long a collective may take before it is given up.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Messages kept for collectives this member has not started yet.
const MAX_EARLY: usize = 65_536;
/// Scratch memory for the accelerator: the member table, then the vector and the result.
const TABLE_BYTES: usize = exanet_proto::ni::allreduce::MAX_MEMBERS * MEMBER_ENTRY;
const SCRATCH: u64 = (TABLE_BYTES + 2 * MAX_VECTOR) as u64;

/// Which way an allreduce goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Path {
    /// The accelerator when the group and vector allow it, else software.
    #[default]
    Auto,
    /// The NI's accelerator; an error when the group or vector does not allow it.
    Accelerator,
    /// The software algorithms, always.
    Software,
}

/// The ranks of a collective, in rank order, with this endpoint among them.
#[derive(Debug)]
pub struct Group {
    id: u16,
    members: Vec<(NodeId, u8)>,
    me: usize,
    seq: Mutex<u16>,
}

impl Group {
    pub fn id(&self) -> u16 {
        self.id
    }

    pub fn members(&self) -> &[(NodeId, u8)] {
        &self.members
    }

    /// This endpoint's index in the group.
    pub fn me(&self) -> usize {
        self.me
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    fn next_seq(&self) -> u16 {
        let mut s = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        *s = s.wrapping_add(1);
        *s
    }
}

/// Counters of this endpoint's collectives, by path (those started are the completed
/// and the failed: a call counts when it returns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectiveStats {
    pub completed: [u64; 2],
    pub failed: [u64; 2],
    /// Accelerator operations posted (one per 256 bytes of an allreduce).
    pub accelerator_ops: u64,
    /// Steps of software collectives this rank sent by rendezvous (RDMA writes).
    pub rendezvous: u64,
}

/// Collectives not yet reported to the daemon, and when it last heard.
type Unreported = (
    BTreeMap<(CollectiveKind, CollectivePath), CollectiveReport>,
    Instant,
);

/// How often a busy endpoint reports its collectives to the daemon's metrics (and once
/// more when its collectives close).
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Index of a path in [`CollectiveStats`]' arrays: 0 accelerator, 1 software.
pub const ACCELERATOR: usize = 0;
pub const SOFTWARE: usize = 1;

/// A message for a collective, reassembled from its chunks.
#[derive(Default)]
struct Partial {
    total: usize,
    data: Vec<u8>,
    /// Offsets of the chunks in, so that a copy of one is not counted twice.
    chunks: std::collections::BTreeSet<usize>,
    have: usize,
}

/// The collectives of one endpoint (one rank): its collective mailbox, a packetizer, and
/// scratch memory for the accelerator. Calls from several threads run one at a time: at
/// once they would take each other's messages and share the scratch memory.
pub struct Collectives {
    shared: Arc<Shared>,
    /// This rank: node and rank.
    me: (NodeId, u8),
    nodes: u32,
    mailbox: Mailbox,
    tx: Packetizer,
    scratch: MemoryRegion,
    early: Mutex<Early>,
    stats: Mutex<CollectiveStats>,
    /// What the node's metrics have not heard of yet, and when they last did.
    unreported: Mutex<Unreported>,
    /// An accelerator operation given up on before the NI ended it: it may still write
    /// into the scratch memory, so the next one waits for it first.
    abandoned: Mutex<Option<u32>>,
    /// Memory for rendezvous, staged and landing.
    pool: Mutex<Pool>,
    /// Pools of failed collectives, kept registered a while (see [`rendezvous`]).
    retired: Mutex<VecDeque<Pool>>,
    /// The RDMA page that writes steps by rendezvous; without one (the node's 16 were
    /// taken), every step goes as messages, which bounds a step to 65535 bytes.
    page: Option<RdmaPage>,
    /// Steps up to this many bytes go as messages.
    eager: AtomicUsize,
    /// Held for the length of a collective.
    call: Mutex<()>,
    timeout: Duration,
}

/// One software collective's steps under way.
#[derive(Default)]
struct Steps {
    /// Steps arriving as messages, by member and step.
    partial: BTreeMap<(usize, u16), Partial>,
    /// Messages sent and not answered yet.
    sent: VecDeque<Sent>,
    rdv: Transfers,
    /// Messages of this collective that came before it started, to take first.
    backlog: VecDeque<crate::Message>,
}

impl Endpoint {
    /// Opens this rank's collectives: its collective mailbox (interface 48 + rank), a
    /// packetizer, an RDMA page if one is free, and scratch memory.
    pub fn collectives(&self) -> Result<Collectives> {
        let vi = COLLECTIVE_VI_BASE + self.rank();
        let mailbox = self.mailbox_at(vi, MAILBOX_CAPACITY).map_err(|e| {
            Error::Collective(format!("the collective mailbox (interface {vi}): {e}"))
        })?;
        Ok(Collectives {
            shared: Arc::clone(self.shared()),
            me: (self.node_id(), self.rank()),
            nodes: self.nodes(),
            mailbox,
            tx: self.packetizer()?,
            scratch: self.register(SCRATCH)?,
            early: Mutex::new(Early::default()),
            stats: Mutex::new(CollectiveStats::default()),
            unreported: Mutex::new((BTreeMap::new(), Instant::now())),
            abandoned: Mutex::new(None),
            pool: Mutex::new(Pool::new(self.shared())),
            retired: Mutex::new(VecDeque::new()),
            page: RdmaPage::alloc(self.shared()).ok(),
            eager: AtomicUsize::new(EAGER_LIMIT),
            call: Mutex::new(()),
            timeout: DEFAULT_TIMEOUT,
        })
    }
}

impl Drop for Collectives {
    fn drop(&mut self) {
        let mut u = self.unreported.lock().unwrap_or_else(|p| p.into_inner());
        self.report(&mut u);
    }
}

impl Collectives {
    /// A group `id` of `members` (node and rank of each, in rank order; this endpoint
    /// among them once). Every member must create it with the same id and members.
    pub fn group(&self, id: u16, members: &[(NodeId, u8)]) -> Result<Group> {
        if members.is_empty() || members.len() > usize::from(u16::MAX) {
            return Err(Error::Collective(format!(
                "a group of {} members",
                members.len()
            )));
        }
        let me = self.me;
        let mut seen = std::collections::HashSet::new();
        for &(n, r) in members {
            if n.0 >= self.nodes || r > 7 {
                return Err(Error::Collective(format!(
                    "member {n}:{r} is not a rank of this rack"
                )));
            }
            if !seen.insert((n, r)) {
                return Err(Error::Collective(format!("member {n}:{r} appears twice")));
            }
        }
        let idx = members.iter().position(|&m| m == me).ok_or_else(|| {
            Error::Collective(format!("this rank ({}:{}) is not a member", me.0, me.1))
        })?;
        Ok(Group {
            id,
            members: members.to_vec(),
            me: idx,
            seq: Mutex::new(0),
        })
    }

    /// Gives up a collective after `t` (default 60 s).
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// Sends steps of up to `bytes` (default [`EAGER_LIMIT`], at most 65535) as packetizer
    /// messages, longer ones by rendezvous. Members may differ: the receiver follows what
    /// each sender does.
    pub fn set_eager_limit(&self, bytes: usize) {
        self.eager.store(bytes.min(MAX_EAGER), Ordering::Relaxed);
    }

    /// Whether this rank can send by rendezvous (it got an RDMA page).
    pub fn has_rdma(&self) -> bool {
        self.page.is_some()
    }

    pub fn stats(&self) -> CollectiveStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn one_at_a_time(&self) -> std::sync::MutexGuard<'_, ()> {
        self.call.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one collective of `kind` on `path`, counting it when it starts and when it
    /// ends (so that one that hangs shows as started and not ended).
    fn counted<T>(
        &self,
        kind: CollectiveKind,
        path: usize,
        run: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let reported = if path == ACCELERATOR {
            CollectivePath::Accelerator
        } else {
            CollectivePath::Software
        };
        self.tally(kind, reported, |e| e.started += 1);
        // The whole collective is one library call: the host time its own code takes
        // between the engine's calls is not the program's compute.
        let inside = self.shared.enter();
        let r = run();
        drop(inside);
        {
            let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            match r {
                Ok(_) => s.completed[path] += 1,
                Err(_) => s.failed[path] += 1,
            }
        }
        let ok = r.is_ok();
        self.tally(kind, reported, |e| {
            if ok {
                e.completed += 1
            } else {
                e.failed += 1
            }
        });
        r
    }

    fn tally(
        &self,
        kind: CollectiveKind,
        path: CollectivePath,
        f: impl FnOnce(&mut CollectiveReport),
    ) {
        let mut u = self.unreported.lock().unwrap_or_else(|p| p.into_inner());
        f(u.0.entry((kind, path)).or_insert(CollectiveReport {
            kind,
            path,
            ..CollectiveReport::default()
        }));
        if u.1.elapsed() >= REPORT_EVERY {
            self.report(&mut u);
        }
    }

    /// Tells the daemon what ran since the last report (for the node's metrics). A report
    /// that does not get through is not retried: metrics are not worth failing a
    /// collective for.
    fn report(&self, u: &mut Unreported) {
        u.1 = Instant::now();
        if u.0.is_empty() {
            return;
        }
        let reports = std::mem::take(&mut u.0).into_values().collect();
        let _ = self.shared.control(
            "collective report",
            &Request::CollectiveCounts { reports },
            &[],
        );
    }

    /// The allreduce of `data` (elements of `ty`) over the group: every member gets the
    /// same bytes.
    pub fn allreduce(
        &self,
        g: &Group,
        op: ReduceOp,
        ty: DataType,
        data: &[u8],
        path: Path,
    ) -> Result<Vec<u8>> {
        let _call = self.one_at_a_time();
        if data.is_empty() || data.len() % ty.size() != 0 {
            return Err(Error::Collective(format!(
                "a vector of {} B is not a whole number of {}-byte elements",
                data.len(),
                ty.size()
            )));
        }
        let chunk = MAX_VECTOR.min(data.len());
        let accel = eligible(&g.members, ty, chunk, self.nodes);
        let use_accel = match (path, accel) {
            (Path::Software, _) => false,
            (Path::Auto, r) => r.is_ok(),
            (Path::Accelerator, Ok(())) => true,
            (Path::Accelerator, Err(e)) => {
                return Err(Error::Collective(format!("the accelerator: {e}")));
            }
        };
        if use_accel {
            self.counted(CollectiveKind::Allreduce, ACCELERATOR, || {
                self.accelerated(g, op, ty, data)
            })
        } else {
            self.counted(CollectiveKind::Allreduce, SOFTWARE, || {
                self.software(g, Kind::Allreduce { op, ty }, data.to_vec())
            })
        }
    }

    /// The reduction of `data` over the group at member `root`; the others get an empty
    /// vector.
    pub fn reduce(
        &self,
        g: &Group,
        root: usize,
        op: ReduceOp,
        ty: DataType,
        data: &[u8],
    ) -> Result<Vec<u8>> {
        let _call = self.one_at_a_time();
        self.counted(CollectiveKind::Reduce, SOFTWARE, || {
            self.software(g, Kind::Reduce { root, op, ty }, data.to_vec())
        })
    }

    /// Member `root`'s `data` at every member (the others pass anything: it is replaced).
    pub fn bcast(&self, g: &Group, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        let _call = self.one_at_a_time();
        self.counted(CollectiveKind::Bcast, SOFTWARE, || {
            self.software(g, Kind::Bcast { root }, data.to_vec())
        })
    }

    /// Returns once every member has entered it.
    pub fn barrier(&self, g: &Group) -> Result<()> {
        let _call = self.one_at_a_time();
        self.counted(CollectiveKind::Barrier, SOFTWARE, || {
            self.software(g, Kind::Barrier, Vec::new()).map(drop)
        })
    }

    /// An allreduce on the accelerator, 256 bytes per operation.
    fn accelerated(&self, g: &Group, op: ReduceOp, ty: DataType, data: &[u8]) -> Result<Vec<u8>> {
        let stale = self
            .abandoned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(tag) = stale {
            // The NI ends every operation by its collective deadline (30 s); whatever
            // this one did, its result is nobody's.
            let _ = self.shared.wait(tag, Some(Duration::from_secs(35)));
        }
        let mut table = Vec::with_capacity(g.members.len() * MEMBER_ENTRY);
        for &(n, r) in &g.members {
            table.extend_from_slice(&n.0.to_be_bytes());
            table.extend_from_slice(&[r, 0, 0, 0]);
        }
        self.scratch.write(0, &table)?;
        let src = TABLE_BYTES as u64;
        let dst = src + MAX_VECTOR as u64;
        let mut out = Vec::with_capacity(data.len());
        for piece in data.chunks(MAX_VECTOR) {
            let id = (u32::from(g.id) << 16) | u32::from(g.next_seq());
            self.scratch.write(src, piece)?;
            let post = AllreducePost {
                id,
                op,
                ty,
                len: piece.len() as u16,
                count: g.members.len() as u16,
                src_va: self.scratch.va() + src,
                dst_va: self.scratch.va() + dst,
                table_va: self.scratch.va(),
            };
            let tag = self
                .shared
                .post(Chan::Collective { id }, |tag| Command::Allreduce {
                    tag,
                    op: post,
                    at: ModelTime::ZERO,
                })?;
            self.stats
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .accelerator_ops += 1;
            match self.shared.wait(tag, Some(self.timeout)) {
                Ok(_) => {}
                Err(Error::Timeout) => {
                    *self.abandoned.lock().unwrap_or_else(|p| p.into_inner()) = Some(tag);
                    return Err(Error::Timeout);
                }
                Err(e) => return Err(e),
            }
            out.extend_from_slice(&self.scratch.to_vec(dst, piece.len() as u64)?);
        }
        Ok(out)
    }

    /// Runs a software collective: sends what the algorithm says, feeds it what arrives.
    /// Its rendezvous memory is emptied when it succeeds; when it fails, a peer's write
    /// may still be under way into or out of it, so it is retired.
    fn software(&self, g: &Group, kind: Kind, data: Vec<u8>) -> Result<Vec<u8>> {
        let seq = g.next_seq();
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let r = self.run_software(g, seq, kind, data, &mut pool);
        if let Err(e) = &r {
            if !matches!(e, Error::CollectiveAborted { .. }) {
                self.abort_others(g, seq, e);
            }
        }
        if r.is_ok() {
            pool.reset();
        } else {
            let old = std::mem::replace(&mut *pool, Pool::new(&self.shared));
            self.retire(old);
        }
        r
    }

    fn run_software(
        &self,
        g: &Group,
        seq: u16,
        kind: Kind,
        data: Vec<u8>,
        pool: &mut Pool,
    ) -> Result<Vec<u8>> {
        let mut sc = SoftCollective::new(kind, Algorithm::Auto, g.size(), g.me, data)
            .map_err(|e| Error::Collective(e.to_string()))?;
        let deadline = Instant::now() + self.timeout;
        let mut st = Steps::default();
        let early = self
            .early
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(g.id, seq);
        st.backlog = early.into();
        match self.run_steps(g, seq, &mut sc, &mut st, deadline, pool) {
            Ok(()) => Ok(sc.result().map(<[u8]>::to_vec).unwrap_or_default()),
            // Where it stopped, so that a stall of a rack says where it is.
            Err(Error::Timeout) => Err(Error::CollectiveTimeout {
                waited_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
                round: sc.round(),
                rounds: sc.rounds(),
                awaiting: sc.awaiting(),
                unanswered: st.sent.len(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Takes the steps of `sc` until it is done and what it sent is answered.
    fn run_steps(
        &self,
        g: &Group,
        seq: u16,
        sc: &mut SoftCollective,
        st: &mut Steps,
        deadline: Instant,
        pool: &mut Pool,
    ) -> Result<()> {
        loop {
            while let Some(o) = sc.poll_send() {
                self.send_step(g, seq, o, st, pool)?;
            }
            self.start_writes(g, &mut st.rdv, pool)?;
            self.reap_writes(&mut st.rdv)?;
            if sc.is_done() && st.rdv.sends_done() {
                break;
            }
            let incoming = match st.backlog.pop_front() {
                Some(m) => Incoming::Message(m),
                None => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Error::Timeout);
                    }
                    let seen = self.shared.events();
                    let claims = pool.claims();
                    // Messages, landings and the answers to what this member sent, in
                    // modeled order: taken in the order the host delivered them, they
                    // moved the clock by its timing.
                    let tags: Vec<u32> = st
                        .sent
                        .iter()
                        .map(|s| s.tag.raw())
                        .chain(st.rdv.writing.iter().map(|&(t, _)| t))
                        .collect();
                    match self.shared.next_event(self.mailbox.vi(), &claims, &tags)? {
                        Some(Next::Incoming(i)) => i,
                        Some(Next::Completed(tag)) => {
                            self.completed(tag, st, deadline)?;
                            continue;
                        }
                        None => {
                            // Wake on any event: a message, a write ending, an answer. A
                            // peer's refusal is an answer, taken above and sent again
                            // (`completed`), so nothing needs a look on a timer. Waking
                            // every 2 ms to look anyway cost a 128-rank collective 64,000
                            // wake-ups a second, with their spins: on two cores the
                            // members starved the daemons past their links' timeouts.
                            self.reap(&mut st.sent, deadline)?;
                            self.shared.wait_events(seen, Some(left))?;
                            continue;
                        }
                    }
                }
            };
            match incoming {
                Incoming::Message(m) => self.on_message(g, seq, sc, m, st, pool)?,
                Incoming::Notification(n) => self.on_landed(g, sc, n, &mut st.rdv, pool)?,
            }
        }
        while let Some(s) = st.sent.pop_front() {
            self.settle(s, &mut st.sent, deadline)?;
        }
        Ok(())
    }

    /// The collective mailbox of `member` (node, rank).
    fn mailbox_of(&self, (node, rank): (NodeId, u8)) -> Result<exanet_proto::gvas::Gvas> {
        self.shared
            .mailbox_gvas(node, rank, COLLECTIVE_VI_BASE + rank)
    }

    /// Tells every other member that this one gave up collective `seq`, so that those
    /// still in it fail at once with the reason instead of waiting out their timeout.
    /// Best effort: a member that cannot be reached times out as before.
    fn abort_others(&self, g: &Group, seq: u16, why: &Error) {
        let c = Call {
            group: g.id,
            seq,
            step: 0,
        };
        let msg = wire::abort(c, &why.to_string());
        let mut sent = Vec::new();
        for (i, &member) in g.members.iter().enumerate() {
            if i == g.me {
                continue;
            }
            let Ok(dst) = self.mailbox_of(member) else {
                continue;
            };
            if let Ok(tag) = self.tx.send_any(dst, &msg) {
                sent.push(tag);
            }
        }
        // Not waited for: a member that returns its error and detaches at once leaves its
        // aborts in its command ring at worst, and the daemon carries out what a ring holds
        // at detach (it once dropped them, and a 500 ms wait here hid that). Their
        // completions are nobody's business.
        for tag in sent {
            let _ = self.shared.forget(tag.raw());
        }
    }

    /// A message in the collective mailbox: a chunk of a step, an RTS, a CTS or an abort.
    fn on_message(
        &self,
        g: &Group,
        seq: u16,
        sc: &mut SoftCollective,
        m: crate::Message,
        st: &mut Steps,
        pool: &mut Pool,
    ) -> Result<()> {
        let Some((c, body)) = wire::parse(&m.payload) else {
            return Ok(());
        };
        if (c.group, c.seq) != (g.id, seq) {
            // A CTS answers an RTS of a collective under way: one of another is stale.
            if !matches!(body, Body::Cts { .. }) {
                self.keep_early(c.group, c.seq, m);
            }
            return Ok(());
        }
        let Some(from) = g
            .members
            .iter()
            .position(|&x| x == (m.src_node, m.src_rank))
        else {
            return Ok(());
        };
        let step = c.step;
        match body {
            Body::Data {
                offset,
                total,
                bytes,
            } => {
                let partial = &mut st.partial;
                if !partial.contains_key(&(from, step)) && partial.len() >= 4 * g.size() + 16 {
                    // No algorithm has that many steps in flight from its peers at once.
                    return Err(Error::Collective(format!(
                        "member {from} started step {step} with {} steps already incomplete",
                        partial.len()
                    )));
                }
                let p = partial.entry((from, step)).or_default();
                if p.chunks.is_empty() {
                    p.total = total;
                    p.data = vec![0; total];
                }
                if total != p.total {
                    return Err(Error::Collective(format!(
                        "member {from} sent step {step} as {total} B after {} B",
                        p.total
                    )));
                }
                if !p.chunks.insert(offset) {
                    return Ok(());
                }
                p.data[offset..offset + bytes.len()].copy_from_slice(bytes);
                p.have += bytes.len().max(usize::from(total == 0));
                if p.have >= p.total.max(1) {
                    let p = partial.remove(&(from, step)).expect("present");
                    sc.on_receive(from, step, &p.data)
                        .map_err(|e| Error::Collective(e.to_string()))?;
                }
            }
            Body::Rts { len } => {
                if !st.rdv.announced_to_me.insert((from, step)) {
                    return Ok(()); // a copy
                }
                let want = sc.expected_len(from, step);
                if want.map(|w| w as u64) != Some(len) {
                    return Err(Error::Collective(match want {
                        Some(w) => format!(
                            "member {from} announced step {step:#06x} as {len} B where {w} B were expected"
                        ),
                        None => format!(
                            "member {from} announced step {step:#06x}, which this member does not expect from it"
                        ),
                    }));
                }
                let slot = pool.alloc(NOTIFICATION + len)?;
                st.rdv.landing.insert(slot.va, Landing { from, step, slot });
                let dst = self.mailbox_of(g.members[from])?;
                let cts = wire::cts(c, slot.va + NOTIFICATION, slot.va);
                self.send_message(dst, cts, &mut st.sent)?;
            }
            Body::Cts { buf, notify } => {
                // A copy, or a CTS for nothing this member announced: nothing to do.
                if let Some(s) = st.rdv.announced.remove(&(from, step)) {
                    st.rdv.ready.push_back((s, buf, notify));
                }
            }
            Body::Abort { reason } => {
                return Err(Error::CollectiveAborted {
                    member: from,
                    reason: String::from_utf8_lossy(reason).into_owned(),
                });
            }
        }
        Ok(())
    }

    /// A notification in rendezvous memory: a step that landed where this member's CTS
    /// said, if it is one.
    fn on_landed(
        &self,
        g: &Group,
        sc: &mut SoftCollective,
        n: crate::Notification,
        rdv: &mut Transfers,
        pool: &Pool,
    ) -> Result<()> {
        let Some(&l) = rdv.landing.get(&n.va) else {
            return Ok(()); // not one this member gave out
        };
        let len = l.slot.len - NOTIFICATION;
        if n.src_node != g.members[l.from].0 || n.len != len {
            return Ok(()); // not the write it waits for, which may still come
        }
        rdv.landing.remove(&n.va);
        let data = pool
            .region(&l.slot)
            .to_vec(l.slot.offset + NOTIFICATION, len)?;
        sc.on_receive(l.from, l.step, &data)
            .map_err(|e| Error::Collective(e.to_string()))
    }

    /// Sends one step to member `o.to`: as messages up to the eager limit, else by
    /// rendezvous (its data staged, an RTS sent).
    fn send_step(
        &self,
        g: &Group,
        seq: u16,
        o: exanet_collective::Outgoing,
        st: &mut Steps,
        pool: &mut Pool,
    ) -> Result<()> {
        let dst = self.mailbox_of(g.members[o.to])?;
        let c = Call {
            group: g.id,
            seq,
            step: o.step,
        };
        let total = o.data.len();
        if total > self.eager.load(Ordering::Relaxed) {
            if self.page.is_some() {
                let slot = pool.alloc(total as u64)?;
                pool.region(&slot).write(slot.offset, &o.data)?;
                st.rdv
                    .announced
                    .insert((o.to, o.step), Staged { to: o.to, slot });
                self.stats
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .rendezvous += 1;
                return self.send_message(dst, wire::rts(c, total as u64), &mut st.sent);
            }
            if total > MAX_EAGER {
                return Err(Error::Collective(format!(
                    "a step of {total} B with no RDMA page: messages carry at most {MAX_EAGER} B per step"
                )));
            }
        }
        let mut offset = 0;
        loop {
            let end = (offset + CHUNK).min(total);
            let m = wire::data(c, offset, total, &o.data[offset..end]);
            self.send_message(dst, m, &mut st.sent)?;
            offset = end;
            if offset >= total {
                return Ok(());
            }
        }
    }

    /// Sends a message to a collective mailbox, keeping it to send again if refused.
    fn send_message(
        &self,
        dst: exanet_proto::gvas::Gvas,
        msg: Vec<u8>,
        sent: &mut VecDeque<Sent>,
    ) -> Result<()> {
        let tag = self.tx.send_any(dst, &msg)?;
        sent.push_back(Sent { tag, dst, msg });
        // Collect what finished, so failures surface and tags do not pile up.
        while sent.len() > 64 {
            let s = sent.pop_front().expect("non-empty");
            self.settle(s, sent, Instant::now() + self.timeout)?;
        }
        Ok(())
    }

    /// Posts the writes whose CTS came, on the page's free write channels.
    fn start_writes(&self, g: &Group, rdv: &mut Transfers, pool: &Pool) -> Result<()> {
        let Some(page) = &self.page else {
            return Ok(());
        };
        while let Some(ch) = rdv.free_channel() {
            let Some((s, buf, notify)) = rdv.ready.pop_front() else {
                break;
            };
            let (node, rank) = g.members[s.to];
            let dst = self.shared.gvas(node, rank, buf)?;
            let tag = page.write(
                ch,
                pool.region(&s.slot),
                s.slot.offset,
                dst,
                s.slot.len,
                Some(notify),
            )?;
            rdv.writing.push((tag.raw(), ch));
        }
        Ok(())
    }

    /// Collects the writes that ended; one that failed fails the collective (the NI
    /// already retried it).
    fn reap_writes(&self, rdv: &mut Transfers) -> Result<()> {
        let mut i = 0;
        while i < rdv.writing.len() {
            // Only what completed by the clock (see `answered`); a later completion is
            // taken as an event, in modeled order (`Shared::next_event`).
            match self.shared.done_by_clock(rdv.writing[i].0) {
                Ok(Some(_)) => {
                    rdv.writing.swap_remove(i);
                }
                Ok(None) => i += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Takes the completion of `tag`, one of this member's sends or writes, found first
    /// in modeled order: its clock moves to it.
    fn completed(&self, tag: u32, st: &mut Steps, deadline: Instant) -> Result<()> {
        if let Some(i) = st.rdv.writing.iter().position(|&(t, _)| t == tag) {
            st.rdv.writing.swap_remove(i);
            return self.shared.wait(tag, Some(Duration::ZERO)).map(drop);
        }
        if let Some(i) = st.sent.iter().position(|s| s.tag.raw() == tag) {
            let s = st.sent.remove(i).expect("found");
            if let Some(s) = self.answered(s, &mut st.sent, deadline, Answer::Now)? {
                st.sent.push_back(s);
            }
        }
        Ok(())
    }

    /// Keeps the memory of a failed collective registered a while (see
    /// [`rendezvous`]).
    fn retire(&self, pool: Pool) {
        let mut r = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        r.push_back(pool);
        if r.len() > RETIRED_POOLS {
            r.pop_front();
        }
    }

    /// Waits for a sent message's answer. A peer whose collective mailbox is full (it is
    /// behind, or many members send to it at once) or not open yet (its process has not
    /// got there: members start when they start) refuses it for now: it goes again a
    /// little later, until `deadline`, after which the collective has timed out.
    fn settle(&self, s: Sent, sent: &mut VecDeque<Sent>, deadline: Instant) -> Result<()> {
        self.answered(s, sent, deadline, Answer::Wait(self.timeout))
            .map(drop)
    }

    /// Settles, without waiting, every sent message answered by this member's modeled
    /// clock (one answered later is the final settle's, which waits for it).
    fn reap(&self, sent: &mut VecDeque<Sent>, deadline: Instant) -> Result<()> {
        for _ in 0..sent.len() {
            let s = sent.pop_front().expect("counted");
            if let Some(s) = self.answered(s, sent, deadline, Answer::ByClock)? {
                sent.push_back(s);
            }
        }
        Ok(())
    }

    /// Takes `s`'s answer as `how` says: `Some(s)` when none came yet; a refusal for now
    /// sends it again (onto `sent`).
    fn answered(
        &self,
        s: Sent,
        sent: &mut VecDeque<Sent>,
        deadline: Instant,
        how: Answer,
    ) -> Result<Option<Sent>> {
        let answer = match how {
            // Only what came by the clock: taking an answer later in modeled time would
            // move the clock by what the host had delivered by now, and the figures with
            // it from run to run.
            Answer::ByClock => match self.shared.done_by_clock(s.tag.raw()) {
                Ok(None) => return Ok(Some(s)),
                Ok(Some(at)) => Ok(at),
                Err(e) => Err(e),
            },
            Answer::Now => self.shared.wait(s.tag.raw(), Some(Duration::ZERO)),
            Answer::Wait(d) => self.shared.wait(s.tag.raw(), Some(d)),
        };
        match answer {
            Ok(_) => Ok(None),
            Err(Error::Timeout) if matches!(how, Answer::Now) => Ok(Some(s)),
            Err(Error::Op {
                error:
                    OpError::Nacked {
                        reason: Some(NackReason::QueueFull | NackReason::NoContext),
                        ..
                    },
                ..
            }) => {
                // A peer that still refuses at the deadline never got there in time: that
                // is this member's timeout, whichever of its waits noticed it first.
                if Instant::now() >= deadline {
                    return Err(Error::Timeout);
                }
                std::thread::sleep(Duration::from_micros(200));
                let tag = self.tx.send_any(s.dst, &s.msg)?;
                sent.push_back(Sent { tag, ..s });
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn keep_early(&self, group: u16, seq: u16, m: crate::Message) {
        self.early
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keep(group, seq, m);
    }
}

/// How [`Collectives::answered`] takes an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// If it came by the member's clock, leaving the clock where it is.
    ByClock,
    /// If it came, moving the clock to it.
    Now,
    /// Waiting up to this long for it.
    Wait(Duration),
}

/// Messages of collectives not started yet, by (group, sequence), at most [`MAX_EARLY`].
/// Those of collectives already started (late copies, the data of a collective that
/// failed here) are dropped: kept, they would be taken for the call that reuses their
/// sequence number 65536 calls later.
#[derive(Default)]
struct Early {
    by_call: HashMap<(u16, u16), Vec<crate::Message>>,
    count: usize,
    /// The last software collective started, by group.
    started: HashMap<u16, u16>,
}

impl Early {
    /// Whether `seq` of `group` was started already (sequence numbers compare as
    /// wrapping: half the space ahead is the future).
    fn is_past(&self, group: u16, seq: u16) -> bool {
        self.started
            .get(&group)
            .is_some_and(|&last| (seq.wrapping_sub(last) as i16) <= 0)
    }

    fn keep(&mut self, group: u16, seq: u16, m: crate::Message) {
        if self.count < MAX_EARLY && !self.is_past(group, seq) {
            self.count += 1;
            self.by_call.entry((group, seq)).or_default().push(m);
        }
    }

    /// What came for `seq` of `group`, which starts now.
    fn take(&mut self, group: u16, seq: u16) -> Vec<crate::Message> {
        self.started.insert(group, seq);
        let v = self.by_call.remove(&(group, seq)).unwrap_or_default();
        let stale: Vec<_> = self
            .by_call
            .keys()
            .filter(|&&(g, s)| g == group && self.is_past(g, s))
            .copied()
            .collect();
        for k in stale {
            self.by_call.remove(&k);
        }
        self.count = self.by_call.values().map(Vec::len).sum();
        v
    }
}

/// A message sent and not answered yet, kept to be sent again.
struct Sent {
    tag: Tag,
    dst: exanet_proto::gvas::Gvas,
    msg: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(b: u8) -> crate::Message {
        crate::Message {
            vi: COLLECTIVE_VI_BASE,
            src_node: NodeId(1),
            src_rank: 0,
            payload: vec![b],
            at: ModelTime::ZERO,
            seq: 0,
        }
    }

    #[test]
    fn messages_of_started_collectives_are_not_kept_for_a_later_one() {
        let mut e = Early::default();
        e.keep(1, 5, msg(5));
        e.keep(1, 6, msg(6));
        e.keep(2, 3, msg(23));
        assert_eq!(e.take(1, 5).len(), 1);
        // Group 1's call 5 started: a late copy of it, or of 4, is dropped; 6 stays.
        e.keep(1, 5, msg(5));
        e.keep(1, 4, msg(4));
        assert_eq!(e.count, 2);
        assert_eq!(e.take(1, 6)[0].payload, [6]);
        // Another group is its own.
        assert_eq!(e.take(2, 3)[0].payload, [23]);
        // Sequence numbers wrap: 65535 is before 0, and 1 after it.
        let mut w = Early::default();
        assert!(w.take(1, u16::MAX).is_empty());
        w.keep(1, 0, msg(0));
        w.keep(1, 1, msg(1));
        w.keep(1, u16::MAX - 1, msg(9));
        assert_eq!(w.count, 2);
        // Starting 1 drops what was kept for 0, which this member skipped.
        assert_eq!(w.take(1, 1)[0].payload, [1]);
        assert_eq!(w.count, 0);
    }
}
