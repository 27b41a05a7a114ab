//! The NI's service to the workloads attached to one node, as a state machine: which rank
//! each holds, command slots decoded and dispatched to the NI, NI events turned into the
//! completions a workload reads (matched to the tags it gave), mailbox messages moved into
//! its completion ring as room appears, and where its registered memory goes in its VA
//! space. The attach protocol is [`crate::attach`]; this is what serves it.
//!
//! The daemon wraps it in sockets, shared memory and threads (`exanetd`'s `ni_service`);
//! the simulator ([`crate::sim`]) and the tests drive the same service directly, so a
//! workload behaves the same on a real rack and in a simulated one. Control requests
//! (registering memory, taking and giving back NI resources, collective counts) are
//! answered here too ([`WorkloadService::control`]), within the quotas each workload
//! attached with ([`Joining`], [`crate::quota`]); who may attach (job keys, process
//! credentials) is the daemon's.
//!
//! Nothing a workload sends is trusted: a slot that does not decode, a command the NI
//! refuses, an index it does not hold all become a completion or error naming why, and
//! what the service queues for a workload is bounded whatever the workload or its peers do.

use std::collections::{BTreeMap, HashMap, VecDeque};

use thiserror::Error;

use crate::attach::{
    self, status, AllreducePost, CollectiveKind, CollectivePath, CollectiveReport, Command,
    Completion, Reply, Request, Resource, SlotError, MAX_COLLECTIVE_REPORTS, MEMBER_ENTRY,
};
use crate::gvas::Pdid;
use crate::ni::allreduce::MAX_MEMBERS;
use crate::ni::mailbox::ConsumedCount;
use crate::ni::{
    Allreduce, AllreduceError, ChannelState, Memory, Ni, NiError, NiEvent, Program, TransferId,
    MAILBOX_WINDOW, RANKS,
};
use crate::quota::{self, Exceeded, Holding, Kind, Limits};
use crate::reserved::{Owner, Reservations};
use crate::rng::SplitMix64;
use crate::shape::NodeId;
use crate::time::{Instant, ModelTime};

/// Completions queued for a workload whose ring is full, beyond which its commands wait
/// (see [`WorkloadService::held_back`]).
pub const MAX_BACKLOG: usize = 1024;
/// Queued completions past which peers' notifications are no longer relayed to a workload
/// that does not read its ring (the notification is in its memory all the same).
pub const MAX_NOTIFY_BACKLOG: usize = 4096;
/// Most memory regions one rank may register.
pub const MAX_REGIONS: usize = 64;
/// Largest mailbox capacity (a larger request gets this).
pub const MAX_MAILBOX_CAPACITY: u32 = 65_536;
/// Mailbox capacity when the workload names none.
pub const DEFAULT_MAILBOX_CAPACITY: u32 = 64;
/// Registered memory starts here in each rank's VA space, each region 2 MiB aligned.
pub const VA_BASE: u64 = 1 << 30;
pub const VA_ALIGN: u64 = 2 << 20;

/// How long a workload may go unheard from (no command, not seen asleep on its ring)
/// before its program is no longer taken to be running, unless its thread is runnable
/// (see [`WorkloadService::refresh_programs`]).
pub const SILENT_NS: u64 = 2_000_000;
/// How long a workload whose thread stays runnable (on a CPU or waiting for one) may go
/// unheard from before it is no longer taken to be running either: it may be spinning
/// on something outside the rack.
pub const RUNNABLE_SILENT_NS: u64 = 200_000_000;

/// A workload's completion ring, as the service needs it: the daemon's is a ring in
/// shared memory with a doorbell, a test's a queue.
pub trait CompletionRing: Send {
    /// Puts one encoded completion into the ring; false when the ring is full.
    fn push(&mut self, slot: &[u8; attach::SLOT]) -> bool;
    /// Whether the ring has room for one more completion.
    fn has_room(&mut self) -> bool;
    /// Completions were pushed: wake the workload if it sleeps.
    fn wake(&mut self);
    /// Where the workload counts the messages it took from mailbox `vi` (read, never
    /// trusted: see [`crate::ni::mailbox`]).
    fn consumed(&self, vi: u8) -> Box<dyn ConsumedCount>;
    /// What the workload is doing, as far as its ring shows: `None` where it cannot
    /// tell (the workload's work is then taken as given, see [`crate::ni::Program`]).
    fn activity(&mut self) -> Option<Activity> {
        None
    }
    /// Whether the thread that last called the workload's library is on a CPU or waiting
    /// for one: computing, or descheduled by the host, rather than waiting for something
    /// outside the rack. `None` where it cannot tell.
    fn runnable(&mut self) -> Option<bool> {
        None
    }
}

/// What a workload is doing, as its completion ring shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activity {
    /// It waits on the ring for a completion, asleep or spinning before it sleeps.
    pub waiting: bool,
    /// It took every completion pushed.
    pub drained: bool,
    /// Commands it posted wait in its command ring, not read yet, or it waits for the
    /// answer to a control request: either way it is not waiting for anything else.
    pub posting: bool,
}

impl Activity {
    /// What the ring alone says the program does: it runs while commands it posted wait
    /// unread (taken for asleep, its posts came after the promise it was given, out of
    /// modeled order), it waits while it sleeps on the ring; `None`: neither.
    fn shows(self) -> Option<Program> {
        if self.posting {
            Some(Program::Running)
        } else if self.waiting {
            Some(Program::Waiting)
        } else {
            None
        }
    }
}

/// The kind of a finished operation, for latency metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A packetizer or mailbox message, until ACKed (or NACKed, or given up).
    Send,
    Write,
    Read,
    /// An allreduce on the NI's accelerator.
    Allreduce,
}

impl OpKind {
    /// Every kind, in the order of their indices (`kind as usize`).
    pub const ALL: [OpKind; 4] = [OpKind::Send, OpKind::Write, OpKind::Read, OpKind::Allreduce];

    /// The `op` label of the latency family.
    pub fn label(self) -> &'static str {
        match self {
            OpKind::Send => "send",
            OpKind::Write => "rdma_write",
            OpKind::Read => "rdma_read",
            OpKind::Allreduce => "allreduce",
        }
    }
}

/// A workload's operation ended: how long it took from command to completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    pub op: OpKind,
    pub ok: bool,
    pub latency_ns: u64,
}

/// What became of an NI event handed to the service.
#[derive(Debug, PartialEq)]
pub enum Relayed {
    /// Queued for its workload; an operation of the workload's may have finished.
    Queued(Option<Finished>),
    /// A peer's notification not relayed to a workload that does not read its ring.
    NotRelayed,
    /// No workload of this service holds the event's rank.
    NotAttached(NiEvent),
}

/// Why the service refused a request.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ServiceError {
    #[error("rank {0} is not attached")]
    NotAttached(u8),
    #[error("every rank this job may hold is taken ({RANKS} ranks, {kept} of them kept for the rack's services)")]
    RanksTaken { kept: usize },
    #[error("only a mailbox can be asked for by index")]
    IndexNotMailbox,
    #[error("rank {0} is taken")]
    RankTaken(u8),
    #[error("rank {rank} is kept for {owner}")]
    RankReserved { rank: u8, owner: Owner },
    #[error("mailbox interface {index} is kept for {owner}")]
    MailboxReserved { index: u8, owner: Owner },
    #[error("there is no rank {0} (ranks are 0..{RANKS})")]
    NoSuchRank(u8),
    #[error("rank {rank} already has {MAX_REGIONS} regions")]
    TooManyRegions { rank: u8 },
    #[error("cannot register {0} bytes")]
    BadLength(u64),
    #[error("no VA space left below the mailbox window for {len} bytes")]
    NoVaSpace { len: u64 },
    #[error("rank {rank} has no region {id}")]
    NoRegion { rank: u8, id: u32 },
    #[error("malformed command slot: {0}")]
    Malformed(SlotError),
    #[error(transparent)]
    Quota(#[from] Exceeded),
    #[error("already attached")]
    AlreadyAttached,
    #[error("{0} collective reports in one request; at most {MAX_COLLECTIVE_REPORTS}")]
    TooManyReports(usize),
    #[error(transparent)]
    Ni(#[from] NiError),
}

impl ServiceError {
    /// The label the daemon counts this refusal under.
    pub fn kind(&self) -> &'static str {
        match self {
            ServiceError::Malformed(_) => "workload_malformed",
            ServiceError::RanksTaken { .. }
            | ServiceError::RankTaken(_)
            | ServiceError::NoSuchRank(_)
            | ServiceError::RankReserved { .. } => "workload_refused",
            ServiceError::MailboxReserved { .. } => "workload_reserved",
            ServiceError::Quota(_) => "quota_refused",
            _ => "workload_request",
        }
    }
}

/// A region of registered memory: where it is in its rank's VA space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub id: u32,
    pub va: u64,
    pub len: u64,
}

/// Who attaches: the job joined, and what the process and its job may hold here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joining {
    pub job: String,
    /// The job's protection domain, for what is kept for one (see [`crate::reserved`]).
    pub pdid: Pdid,
    pub limits: Limits,
    pub job_limits: Limits,
    /// Where its modeled clock starts (see [`ModelTime::from_wall`]).
    pub start: ModelTime,
}

impl Joining {
    /// A process of the only job on the node, with the default limits of that case.
    pub fn new(job: &str, pdid: Pdid) -> Joining {
        Joining {
            job: job.to_string(),
            pdid,
            limits: Limits::for_rank(&quota::RankQuota::default()),
            job_limits: Limits::for_job(&quota::JobQuota::default(), 1),
            start: ModelTime::ZERO,
        }
    }
}

/// What a control request asks of the driver beside the service's answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Control {
    /// Answer the workload with this.
    Answer(Reply),
    /// Make the memory of a new region (already counted against the quotas), then give it
    /// a place with [`WorkloadService::place_region`], or, if it cannot be made, give the
    /// quota back with [`WorkloadService::abandon_region`].
    MakeRegion(PendingRegion),
    /// The region is gone from the rank's VA space: forget its memory, then answer
    /// [`Reply::Ok`].
    ForgetRegion(Placed),
}

/// A region counted against its rank's quotas but not yet placed; it must end in
/// [`WorkloadService::place_region`] or [`WorkloadService::abandon_region`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a pending region holds quota until it is placed or abandoned"]
pub struct PendingRegion {
    rank: u8,
    len: u64,
}

impl PendingRegion {
    pub fn rank(&self) -> u8 {
        self.rank
    }

    /// How many bytes the region will have.
    pub fn bytes(&self) -> u64 {
        self.len
    }
}

struct Workload {
    /// Who attached, and what it holds against its limits.
    joined: Joining,
    holding: Holding,
    ring: Box<dyn CompletionRing>,
    /// Completions the ring had no room for, in order.
    backlog: VecDeque<[u8; attach::SLOT]>,
    /// Mailboxes held, with their generation; and the last generation given.
    mailboxes: Vec<(u8, u32)>,
    generation: u32,
    /// Posted sends and transfers: the workload's tag and when the NI took the command.
    send_tags: HashMap<(u8, u8), (u32, Instant)>,
    /// When it was last heard from: its last command, or the last time it was seen
    /// asleep on its ring (or when it was first looked at). What it did since, it did
    /// outside the rack.
    last_heard: Option<Instant>,
    rdma_tags: HashMap<TransferId, (u32, Instant)>,
    /// Posted accelerated allreduces, by collective id.
    allreduce_tags: HashMap<u32, (u32, Instant)>,
    regions: Vec<Placed>,
}

impl Workload {
    /// Queues a completion (in order, behind any backlog).
    fn push(&mut self, c: &Completion) {
        self.backlog.push_back(c.encode());
        self.flush();
    }

    /// Moves backlog into the ring while it has room and wakes the workload if that moved
    /// anything: a wake-up with nothing new would only cost the workload a spurious
    /// return from its sleep (an idle IP service was woken 50 times a second so).
    fn flush(&mut self) {
        let mut moved = false;
        while let Some(slot) = self.backlog.front() {
            if !self.ring.push(slot) {
                break;
            }
            self.backlog.pop_front();
            moved = true;
        }
        if moved {
            self.ring.wake();
        }
    }

    fn has_room(&mut self) -> bool {
        self.backlog.is_empty() && self.ring.has_room()
    }
}

/// The service of one node's NI to its attached workloads (see the module documentation).
pub struct WorkloadService {
    ranks: Vec<Option<Workload>>,
    /// What no job may take from its owner.
    reserved: Reservations,
    /// Draws where each rank's first region goes (see [`WorkloadService::place_region`]).
    rng: SplitMix64,
    /// Collectives the workloads' libraries reported, by job, kind and path: what one
    /// job's workloads report moves only that job's counts.
    collectives: BTreeMap<(String, CollectiveKind, CollectivePath), CollectiveReport>,
}

impl WorkloadService {
    /// A service with no workload; `seed` draws where registered memory goes.
    pub fn new(seed: u64) -> WorkloadService {
        WorkloadService {
            ranks: (0..RANKS).map(|_| None).collect(),
            reserved: Reservations::ranks_only(),
            rng: SplitMix64::new(seed),
            collectives: BTreeMap::new(),
        }
    }

    /// Keeps what `reserved` names for its owners (the rack's IP service's rank and
    /// mailbox, with [`Reservations::with_service`]).
    pub fn with_reservations(mut self, reserved: Reservations) -> WorkloadService {
        self.reserved = reserved;
        self
    }

    /// What this service keeps for whom.
    pub fn reservations(&self) -> Reservations {
        self.reserved
    }

    pub fn is_attached(&self, rank: u8) -> bool {
        self.ranks
            .get(usize::from(rank))
            .is_some_and(Option::is_some)
    }

    /// How many workloads are attached.
    pub fn attached(&self) -> usize {
        self.ranks.iter().flatten().count()
    }

    fn workload(&mut self, rank: u8) -> Result<&mut Workload, ServiceError> {
        self.ranks
            .get_mut(usize::from(rank))
            .and_then(Option::as_mut)
            .ok_or(ServiceError::NotAttached(rank))
    }

    /// Who attached on `rank`, and what it holds.
    pub fn member(&self, rank: u8) -> Option<(&Joining, &Holding)> {
        let w = self.ranks.get(usize::from(rank))?.as_ref()?;
        Some((&w.joined, &w.holding))
    }

    /// What workloads reported of their collectives: job, then the counts of one kind and
    /// path.
    pub fn collective_counts(&self) -> impl Iterator<Item = (&str, &CollectiveReport)> {
        self.collectives
            .iter()
            .map(|((job, _, _), r)| (job.as_str(), r))
    }

    /// Gives a workload of `who`'s job the lowest free rank it may hold, whose completions
    /// go to `ring`.
    pub fn attach(
        &mut self,
        ni: &mut Ni,
        who: Joining,
        ring: Box<dyn CompletionRing>,
    ) -> Result<u8, ServiceError> {
        let reserved = self.reserved;
        let pdid = who.pdid;
        let rank = (0..RANKS as u8)
            .find(|r| {
                !self.is_attached(*r) && Reservations::may_hold(reserved.rank_owner(*r), *r, pdid)
            })
            .ok_or(ServiceError::RanksTaken {
                kept: (0..RANKS as u8)
                    .filter(|r| !Reservations::may_hold(reserved.rank_owner(*r), *r, pdid))
                    .count(),
            })?;
        self.attach_at(ni, rank, who, ring)
    }

    /// Gives a workload of job `pdid` rank `rank`, if it is free: for services that peers
    /// must find without a directory (the IP service's rank is the same on every node).
    pub fn attach_at(
        &mut self,
        ni: &mut Ni,
        rank: u8,
        who: Joining,
        mut ring: Box<dyn CompletionRing>,
    ) -> Result<u8, ServiceError> {
        let pdid = who.pdid;
        if usize::from(rank) >= RANKS {
            return Err(ServiceError::NoSuchRank(rank));
        }
        let owner = self.reserved.rank_owner(rank);
        if !Reservations::may_hold(owner, rank, pdid) {
            return Err(ServiceError::RankReserved {
                rank,
                owner: owner.unwrap_or(Owner::Rank(rank)),
            });
        }
        if self.is_attached(rank) {
            return Err(ServiceError::RankTaken(rank));
        }
        let job_ranks = self.job_members(&who.job).count() as u32;
        quota::check(
            Kind::Rank,
            1,
            &Holding::default(),
            &who.limits,
            (&who.job, &who.job_limits, &Holding::default(), job_ranks),
        )?;
        ni.attach_from(rank, pdid, who.start)?;
        if ring.activity().is_some() {
            // A process that attaches is running (it makes this call). Left for gone until
            // the next look, its first posts came out of modeled order.
            ni.set_program(rank, Program::Running);
        }
        self.ranks[usize::from(rank)] = Some(Workload {
            joined: who,
            holding: Holding::default(),
            ring,
            backlog: VecDeque::new(),
            mailboxes: Vec::new(),
            generation: 0,
            send_tags: HashMap::new(),
            last_heard: None,
            rdma_tags: HashMap::new(),
            allreduce_tags: HashMap::new(),
            regions: Vec::new(),
        });
        Ok(rank)
    }

    /// The workload on `rank` is gone: the NI forgets it (its transfers end, its
    /// resources are free) and so does the service. False when nothing was attached.
    pub fn detach(&mut self, ni: &mut Ni, rank: u8, now: Instant) -> bool {
        let Some(slot) = self.ranks.get_mut(usize::from(rank)) else {
            return false;
        };
        if slot.take().is_none() {
            return false;
        }
        let _ = ni.detach(rank, now);
        true
    }

    /// The regions `rank` has registered.
    pub fn regions(&self, rank: u8) -> &[Placed] {
        self.ranks
            .get(usize::from(rank))
            .and_then(Option::as_ref)
            .map_or(&[], |w| &w.regions)
    }

    /// Places a new region of `len` bytes in `rank`'s VA space: right after its last one,
    /// 2 MiB aligned; the first at a random 2 MiB boundary in the lower half of the space
    /// below the mailbox window. A rank is reused at once by the next workload, and a
    /// restarted daemon hands the same ranks out again, while senders may still be
    /// retrying blocks meant for the previous workload: at the same address those would
    /// land in the new workload's memory and complete "OK". At a random one they fault
    /// (NACK page_fault) unless they hit the new regions by chance, their share of
    /// ~223 GiB.
    pub fn place_region(&mut self, pending: PendingRegion) -> Result<Placed, ServiceError> {
        let PendingRegion { rank, len } = pending;
        let placed = self.place(rank, len);
        if placed.is_err() {
            self.give_back(rank, Kind::RegisteredBytes, len);
        }
        placed
    }

    /// Counts a region of `len` bytes against `rank`'s quotas, before its memory is made
    /// (so that a refused request allocates nothing).
    pub fn begin_region(&mut self, rank: u8, len: u64) -> Result<PendingRegion, ServiceError> {
        if len == 0 || len > MAILBOX_WINDOW {
            return Err(ServiceError::BadLength(len));
        }
        if self.workload(rank)?.regions.len() >= MAX_REGIONS {
            return Err(ServiceError::TooManyRegions { rank });
        }
        self.reserve(rank, Kind::RegisteredBytes, len)?;
        Ok(PendingRegion { rank, len })
    }

    /// Gives back what a region whose memory could not be made had counted.
    pub fn abandon_region(&mut self, pending: PendingRegion) {
        self.give_back(pending.rank, Kind::RegisteredBytes, pending.len);
    }

    /// Counts and places a region at once, for drivers whose memory needs no making first.
    pub fn register(&mut self, rank: u8, len: u64) -> Result<Placed, ServiceError> {
        let pending = self.begin_region(rank, len)?;
        self.place_region(pending)
    }

    /// Places a region whose length [`WorkloadService::begin_region`] checked.
    fn place(&mut self, rank: u8, len: u64) -> Result<Placed, ServiceError> {
        let rng = &mut self.rng;
        let w = self
            .ranks
            .get_mut(usize::from(rank))
            .and_then(Option::as_mut)
            .ok_or(ServiceError::NotAttached(rank))?;
        if w.regions.len() >= MAX_REGIONS {
            return Err(ServiceError::TooManyRegions { rank });
        }
        let va = w
            .regions
            .iter()
            .map(|r| r.va + r.len)
            .max()
            .unwrap_or_else(|| {
                let slots = (MAILBOX_WINDOW - VA_BASE) / 2 / VA_ALIGN;
                VA_BASE + rng.below(slots) * VA_ALIGN
            })
            .div_ceil(VA_ALIGN)
            * VA_ALIGN;
        if va.checked_add(len).is_none_or(|end| end > MAILBOX_WINDOW) {
            return Err(ServiceError::NoVaSpace { len });
        }
        let id = w.regions.iter().map(|r| r.id + 1).max().unwrap_or(1);
        let placed = Placed { id, va, len };
        w.regions.push(placed);
        Ok(placed)
    }

    /// Forgets region `id` of `rank`.
    pub fn unregister(&mut self, rank: u8, id: u32) -> Result<Placed, ServiceError> {
        let w = self.workload(rank)?;
        let i = w
            .regions
            .iter()
            .position(|r| r.id == id)
            .ok_or(ServiceError::NoRegion { rank, id })?;
        let placed = w.regions.remove(i);
        w.holding.add(Kind::RegisteredBytes, -(placed.len as i64));
        Ok(placed)
    }

    /// The workloads of job `job`.
    fn job_members<'a>(&'a self, job: &'a str) -> impl Iterator<Item = &'a Workload> + 'a {
        self.ranks
            .iter()
            .flatten()
            .filter(move |w| w.joined.job == job)
    }

    /// Takes `n` of `kind` for `rank` if it and its job stay within their limits.
    fn reserve(&mut self, rank: u8, kind: Kind, n: u64) -> Result<(), ServiceError> {
        let me = self.workload(rank)?;
        let (mine, joined) = (me.holding, me.joined.clone());
        let mut job_total = Holding::default();
        let mut job_ranks = 0;
        for w in self.job_members(&joined.job) {
            job_ranks += 1;
            for k in [
                Kind::RdmaPage,
                Kind::Packetizer,
                Kind::Mailbox,
                Kind::RegisteredBytes,
            ] {
                job_total.add(k, w.holding.get(k) as i64);
            }
        }
        quota::check(
            kind,
            n,
            &mine,
            &joined.limits,
            (&joined.job, &joined.job_limits, &job_total, job_ranks),
        )?;
        self.workload(rank)?.holding.add(kind, n as i64);
        Ok(())
    }

    /// Gives back `n` of `kind` that `rank` held.
    fn give_back(&mut self, rank: u8, kind: Kind, n: u64) {
        if let Ok(w) = self.workload(rank) {
            w.holding.add(kind, -(n as i64));
        }
    }

    /// Answers a control request of `rank` (anything but the attach that made it).
    pub fn control(
        &mut self,
        ni: &mut Ni,
        rank: u8,
        req: Request,
    ) -> Result<Control, ServiceError> {
        Ok(match req {
            Request::Attach { .. } => return Err(ServiceError::AlreadyAttached),
            Request::Register { len } => Control::MakeRegion(self.begin_region(rank, len)?),
            Request::Unregister { region } => Control::ForgetRegion(self.unregister(rank, region)?),
            Request::Alloc {
                kind,
                capacity,
                index,
            } => {
                let (index, generation) = self.alloc(ni, rank, kind, capacity, index)?;
                Control::Answer(Reply::Allocated { index, generation })
            }
            Request::Free { kind, index } => {
                self.free(ni, rank, kind, index)?;
                Control::Answer(Reply::Ok)
            }
            Request::CollectiveCounts { reports } => {
                if reports.len() > MAX_COLLECTIVE_REPORTS {
                    return Err(ServiceError::TooManyReports(reports.len()));
                }
                // A workload's own counts: it can only inflate them, and they saturate; and
                // they are its job's, so it cannot move another job's.
                let job = self.workload(rank)?.joined.job.clone();
                for r in reports {
                    let t = self
                        .collectives
                        .entry((job.clone(), r.kind, r.path))
                        .or_insert(CollectiveReport {
                            kind: r.kind,
                            path: r.path,
                            ..CollectiveReport::default()
                        });
                    t.started = t.started.saturating_add(r.started);
                    t.completed = t.completed.saturating_add(r.completed);
                    t.failed = t.failed.saturating_add(r.failed);
                }
                Control::Answer(Reply::Ok)
            }
        })
    }

    /// Gives `rank` an NI resource: its index, and for a mailbox the generation of this
    /// allocation (messages of an earlier holder of the index carry another).
    pub fn alloc(
        &mut self,
        ni: &mut Ni,
        rank: u8,
        kind: Resource,
        capacity: Option<u32>,
        want: Option<u8>,
    ) -> Result<(u8, u32), ServiceError> {
        if want.is_some() && kind != Resource::Mailbox {
            return Err(ServiceError::IndexNotMailbox);
        }
        self.reserve(rank, quota_kind(kind), 1)?;
        let got = self.alloc_held(ni, rank, kind, capacity, want);
        if got.is_err() {
            self.give_back(rank, quota_kind(kind), 1);
        }
        got
    }

    /// [`alloc`](Self::alloc) once the quota has been taken.
    fn alloc_held(
        &mut self,
        ni: &mut Ni,
        rank: u8,
        kind: Resource,
        capacity: Option<u32>,
        want: Option<u8>,
    ) -> Result<(u8, u32), ServiceError> {
        let reserved = self.reserved;
        let w = self.workload(rank)?;
        // A mailbox asked for by number must not be someone else's; one asked for as "any"
        // is never a kept one, not even the rank's own (its collective mailbox would then
        // be busy when it asks for it by number).
        let want = match (kind, want) {
            (Resource::Mailbox, Some(vi)) => {
                let owner = reserved.mailbox_owner(vi);
                if !Reservations::may_hold(owner, rank, w.joined.pdid) {
                    return Err(ServiceError::MailboxReserved {
                        index: vi,
                        owner: owner.unwrap_or(Owner::Rank(rank)),
                    });
                }
                Some(vi)
            }
            (_, w) => w,
        };
        let index = match kind {
            Resource::Packetizer => ni.alloc_packetizer(rank)?,
            Resource::RdmaPage => ni.alloc_rdma_page(rank)?,
            Resource::Mailbox => {
                let cap = capacity
                    .unwrap_or(DEFAULT_MAILBOX_CAPACITY)
                    .clamp(1, MAX_MAILBOX_CAPACITY);
                let ring = &w.ring;
                let kept = |vi| reserved.mailbox_owner(vi).is_some();
                ni.alloc_counted_mailbox(rank, cap as usize, want, kept, |vi| ring.consumed(vi))?
            }
        };
        let mut generation = 0;
        if kind == Resource::Mailbox {
            w.generation = w.generation.wrapping_add(1);
            generation = w.generation;
            w.mailboxes.push((index, generation));
        }
        Ok((index, generation))
    }

    /// Takes back an NI resource `rank` holds.
    pub fn free(
        &mut self,
        ni: &mut Ni,
        rank: u8,
        kind: Resource,
        index: u8,
    ) -> Result<(), ServiceError> {
        let w = self.workload(rank)?;
        match kind {
            Resource::Packetizer => ni.free_packetizer(rank, index),
            Resource::Mailbox => ni.free_mailbox(rank, index),
            Resource::RdmaPage => ni.free_rdma_page(rank, index),
        }?;
        if kind == Resource::Mailbox {
            w.mailboxes.retain(|(v, _)| *v != index);
        }
        w.holding.add(quota_kind(kind), -1);
        Ok(())
    }

    /// Carries out one decoded command slot of `rank` (see [`Command::decode`]). What the
    /// NI takes completes later (see [`on_event`](Self::on_event)); what it refuses, and
    /// a slot that did not decode, complete at once with the reason, and the error says
    /// what to count.
    pub fn execute(
        &mut self,
        ni: &mut Ni,
        mem: &mut dyn Memory,
        rank: u8,
        cmd: Result<Command, (u32, SlotError)>,
        now: Instant,
    ) -> Result<(), ServiceError> {
        let w = self.workload(rank)?;
        w.last_heard = Some(now);
        let cmd = match cmd {
            Ok(c) => c,
            Err((tag, e)) => {
                w.push(&Completion::Refused {
                    tag,
                    status: status::MALFORMED,
                    code: 0,
                    at: ni.clock(rank),
                });
                return Err(ServiceError::Malformed(e));
            }
        };
        let at = cmd.at();
        let (tag, posted) = match cmd {
            Command::Send { tag, op, .. } => (
                tag,
                ni.send_message_at(rank, &op, now, at)
                    .map(|()| w.send_tags.insert((op.vi, op.ch), (tag, now))),
            ),
            Command::Write { tag, op, .. } => (
                tag,
                ni.rdma_write_at(rank, &op, now, at, mem)
                    .map(|id| w.rdma_tags.insert(id, (tag, now))),
            ),
            Command::Read { tag, op, .. } => (
                tag,
                ni.rdma_read_at(rank, &op, now, at)
                    .map(|id| w.rdma_tags.insert(id, (tag, now))),
            ),
            Command::Allreduce { tag, op, .. } => (
                tag,
                post_allreduce(&*mem, rank, &op)
                    .and_then(|a| ni.allreduce_at(rank, &a, now, at, mem))
                    .map(|()| w.allreduce_tags.insert(op.id, (tag, now)))
                    .map(|_| None),
            ),
        };
        match posted {
            Ok(_) => Ok(()),
            Err(e) => {
                w.push(&Completion::Refused {
                    tag,
                    status: status::REFUSED,
                    code: attach::refusal::of(&e),
                    at,
                });
                Err(e.into())
            }
        }
    }

    /// Turns an NI event into its workload's completion.
    pub fn on_event(&mut self, ni: &mut Ni, ev: NiEvent, now: Instant) -> Relayed {
        let rank = match &ev {
            NiEvent::Packetizer { rank, .. }
            | NiEvent::Mailbox { rank, .. }
            | NiEvent::Rdma { rank, .. }
            | NiEvent::Notified { rank, .. }
            | NiEvent::Allreduce { rank, .. } => *rank,
        };
        let Ok(w) = self.workload(rank) else {
            return Relayed::NotAttached(ev);
        };
        let (NiEvent::Packetizer { at, .. }
        | NiEvent::Mailbox { at, .. }
        | NiEvent::Rdma { at, .. }
        | NiEvent::Notified { at, .. }
        | NiEvent::Allreduce { at, .. }) = &ev;
        // It wakes a program that waits for it.
        ni.delivered(rank, *at);
        match ev {
            NiEvent::Packetizer {
                vi, ch, state, at, ..
            } => {
                let (tag, posted) = w.send_tags.remove(&(vi, ch)).unwrap_or((0, now));
                let Some((st, reason)) = status::of_send(state) else {
                    return Relayed::Queued(None);
                };
                w.push(&Completion::Sent {
                    tag,
                    vi,
                    ch,
                    status: st,
                    reason,
                    at,
                });
                Relayed::Queued(Some(Finished {
                    op: OpKind::Send,
                    ok: matches!(state, ChannelState::Acked),
                    latency_ns: now.since(posted),
                }))
            }
            NiEvent::Rdma { id, result, at, .. } => {
                let (tag, posted) = w.rdma_tags.remove(&id).unwrap_or((0, now));
                let (st, reason) = status::of_transfer(result);
                w.push(&Completion::Rdma {
                    tag,
                    page: id.page,
                    ch: id.ch,
                    read: id.read,
                    status: st,
                    reason,
                    at,
                });
                Relayed::Queued(Some(Finished {
                    op: if id.read { OpKind::Read } else { OpKind::Write },
                    ok: result.is_ok(),
                    latency_ns: now.since(posted),
                }))
            }
            NiEvent::Notified {
                va, src, len, at, ..
            } => {
                // Everything else a workload is told about is bounded by what it posted;
                // notifications are posted by its peers. The notification itself is
                // already in its memory, so past a bound the ring copy is dropped.
                if w.backlog.len() >= MAX_NOTIFY_BACKLOG {
                    return Relayed::NotRelayed;
                }
                w.push(&Completion::Notified {
                    va,
                    src_node: src.0,
                    len,
                    at,
                });
                Relayed::Queued(None)
            }
            NiEvent::Allreduce { id, result, at, .. } => {
                let (tag, posted) = w.allreduce_tags.remove(&id).unwrap_or((0, now));
                let (st, reason) = status::of_transfer(result);
                w.push(&Completion::Collective {
                    tag,
                    status: st,
                    reason,
                    at,
                });
                Relayed::Queued(Some(Finished {
                    op: OpKind::Allreduce,
                    ok: result.is_ok(),
                    latency_ns: now.since(posted),
                }))
            }
            NiEvent::Mailbox { .. } => {
                self.drain(ni, rank);
                Relayed::Queued(None)
            }
        }
    }

    /// Tells the NI what each attached workload's program is doing, as its ring shows it
    /// (see [`crate::ni::Program`]): cells in modeled order wait for what it may post. A
    /// program not heard from for [`SILENT_NS`] (no command, and not seen asleep on its
    /// ring), whose thread is not runnable, may be waiting for something outside the rack
    /// (another thread, a lock, another of its endpoints): it promises nothing, so that it
    /// cannot hold the rack, and what it posts next may be late. A thread the host merely
    /// descheduled is runnable: taken for waiting, it made a loaded host's collectives
    /// model other figures from run to run. One runnable and silent for
    /// [`RUNNABLE_SILENT_NS`] may be spinning on something outside the rack. Seen asleep
    /// on its ring, a program is heard from: one whose waits end now and then on a timer
    /// (a library that sends again what was refused) was taken for gone when looked at
    /// awake between two of them, after a long wait for a peer, and everything it then
    /// posted came out of modeled order (the 128-rank software collectives).
    pub fn refresh_programs(&mut self, ni: &mut Ni, now: Instant) {
        for (rank, slot) in self.ranks.iter_mut().enumerate() {
            let Some(w) = slot.as_mut() else { continue };
            let Some(a) = w.ring.activity() else { continue };
            let rank = rank as u8;
            // Completions it has not taken include the backlog behind a full ring.
            if a.drained && w.backlog.is_empty() {
                ni.program_drained(rank);
            }
            let shows = a.shows();
            if shows == Some(Program::Waiting) {
                w.last_heard = Some(now);
            }
            let silent = now.since(*w.last_heard.get_or_insert(now));
            let program = match shows {
                Some(p) => p,
                None if silent <= SILENT_NS => Program::Running,
                None => {
                    // Its thread's state first, then its ring again: one that went to
                    // sleep on the ring in between is waiting, not gone elsewhere (it was
                    // taken for gone, and what woke it came out of modeled order).
                    let runnable = w.ring.runnable();
                    match w.ring.activity().and_then(|b| b.shows()) {
                        Some(p) => p,
                        None if silent > RUNNABLE_SILENT_NS || runnable != Some(true) => {
                            Program::Scripted
                        }
                        None => Program::Running,
                    }
                }
            };
            ni.set_program(rank, program);
        }
    }

    /// Moves `rank`'s backlog, then its queued mailbox messages, into its completion ring
    /// while the ring has room. Messages stay in the NI's queue (which NACKs when full)
    /// until the ring takes them. Call it when the workload may have made room.
    pub fn drain(&mut self, ni: &mut Ni, rank: u8) {
        let Ok(w) = self.workload(rank) else { return };
        w.flush();
        // The reader sees an entry a CPU-to-NI request after the NI wrote it.
        let seen = ni.config().model.cpu_ni;
        for (vi, generation) in w.mailboxes.clone() {
            while w.has_room() {
                let Ok(Some(m)) = ni.pop_message(rank, vi) else {
                    break;
                };
                w.push(&Completion::Message {
                    vi,
                    generation,
                    src_node: m.src.0,
                    src_rank: m.src_rank,
                    payload: m.payload.to_vec(),
                    at: m.at + seen,
                });
            }
        }
    }

    /// Whether `rank` has completions or mailbox messages waiting for room in its ring:
    /// only then does its driver need to look again (with [`WorkloadService::drain`]) when
    /// the workload has said nothing, since room appears without a word from it.
    pub fn waiting_for_room(&mut self, ni: &mut Ni, rank: u8) -> bool {
        let Ok(w) = self.workload(rank) else {
            return false;
        };
        !w.backlog.is_empty()
            || w.mailboxes
                .iter()
                .any(|(vi, _)| ni.queued_messages(rank, *vi).is_ok_and(|n| n > 0))
    }

    /// Whether `rank`'s commands should wait: a workload that does not read its
    /// completions is not served further commands until it does (its command ring fills
    /// and it is held back) instead of having completions queued for it without bound.
    pub fn held_back(&mut self, rank: u8) -> bool {
        match self.workload(rank) {
            Ok(w) => {
                w.flush();
                w.backlog.len() >= MAX_BACKLOG
            }
            Err(_) => false,
        }
    }
}

/// The accelerator's operation for `post`: its member table read from the rank's memory.
fn post_allreduce(mem: &dyn Memory, rank: u8, post: &AllreducePost) -> Result<Allreduce, NiError> {
    let count = usize::from(post.count);
    if count > MAX_MEMBERS {
        return Err(NiError::Allreduce(AllreduceError::Members(count)));
    }
    let mut table = vec![0u8; count * MEMBER_ENTRY];
    mem.read(rank, post.table_va, &mut table)
        .map_err(|_| NiError::BadRange {
            va: post.table_va,
            len: table.len() as u64,
        })?;
    let members = table
        .chunks_exact(MEMBER_ENTRY)
        .map(|e| (NodeId(u32::from_be_bytes([e[0], e[1], e[2], e[3]])), e[4]))
        .collect();
    Ok(Allreduce {
        id: post.id,
        op: post.op,
        ty: post.ty,
        members,
        src_va: post.src_va,
        dst_va: post.dst_va,
        len: post.len,
    })
}

/// The quota a resource counts against.
fn quota_kind(r: Resource) -> Kind {
    match r {
        Resource::Packetizer => Kind::Packetizer,
        Resource::Mailbox => Kind::Mailbox,
        Resource::RdmaPage => Kind::RdmaPage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::{CollectiveKind, CollectivePath};
    use crate::ni::{Ni, NiConfig};

    struct Discard;

    impl CompletionRing for Discard {
        fn push(&mut self, _: &[u8; attach::SLOT]) -> bool {
            true
        }
        fn has_room(&mut self) -> bool {
            true
        }
        fn wake(&mut self) {}
        fn consumed(&self, _: u8) -> Box<dyn ConsumedCount> {
            Box::new(|| 0)
        }
    }

    fn joining(job: &str, pdid: u16, rank_pages: u32, job_pages: u32) -> Joining {
        let mut j = Joining::new(job, Pdid(pdid));
        j.limits.rdma_pages = rank_pages;
        j.job_limits.rdma_pages = job_pages;
        j.job_limits.ranks = 2;
        j
    }

    fn alloc_page(
        svc: &mut WorkloadService,
        ni: &mut Ni,
        rank: u8,
    ) -> Result<Control, ServiceError> {
        let req = Request::Alloc {
            kind: Resource::RdmaPage,
            capacity: None,
            index: None,
        };
        svc.control(ni, rank, req)
    }

    #[test]
    fn control_requests_hold_each_rank_and_each_job_to_its_quota() {
        let mut ni = Ni::new(NodeId(0), 4, NiConfig::default());
        let mut svc = WorkloadService::new(1);
        let a0 = svc
            .attach(&mut ni, joining("a", 1, 2, 3), Box::new(Discard))
            .unwrap();
        let a1 = svc
            .attach(&mut ni, joining("a", 1, 2, 3), Box::new(Discard))
            .unwrap();
        // The job's third rank is refused, naming the job's limit; another job's is not.
        let e = svc
            .attach(&mut ni, joining("a", 1, 2, 3), Box::new(Discard))
            .unwrap_err();
        assert_eq!(e.kind(), "quota_refused");
        assert_eq!(e.to_string(), "job a holds 2 of its 2 ranks on this node");
        let b = svc
            .attach(&mut ni, joining("b", 2, 2, 3), Box::new(Discard))
            .unwrap();

        // Rank a0 may hold 2 pages; the job 3 between its ranks.
        let mut held = Vec::new();
        for _ in 0..2 {
            let Ok(Control::Answer(Reply::Allocated { index, .. })) =
                alloc_page(&mut svc, &mut ni, a0)
            else {
                panic!("a0's first two pages are within its quota")
            };
            held.push(index);
        }
        let e = alloc_page(&mut svc, &mut ni, a0).unwrap_err();
        assert_eq!(e.to_string(), "this process holds 2 of its 2 RDMA pages");
        assert!(alloc_page(&mut svc, &mut ni, a1).is_ok());
        let e = alloc_page(&mut svc, &mut ni, a1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "job a holds 3 of its 3 RDMA pages on this node"
        );
        // Job b's share is its own.
        assert!(alloc_page(&mut svc, &mut ni, b).is_ok());
        assert_eq!(svc.member(a0).unwrap().1.rdma_pages, 2);

        // What is given back may be taken again; a refused free gives nothing back.
        let free = |index| Request::Free {
            kind: Resource::RdmaPage,
            index,
        };
        assert!(svc.control(&mut ni, a0, free(99)).is_err());
        assert_eq!(svc.member(a0).unwrap().1.rdma_pages, 2);
        assert_eq!(
            svc.control(&mut ni, a0, free(held[0])).unwrap(),
            Control::Answer(Reply::Ok)
        );
        assert_eq!(svc.member(a0).unwrap().1.rdma_pages, 1);
        assert!(alloc_page(&mut svc, &mut ni, a1).is_ok());
    }

    #[test]
    fn registered_memory_counts_from_request_to_unregister() {
        let mut ni = Ni::new(NodeId(0), 4, NiConfig::default());
        let mut svc = WorkloadService::new(1);
        let mut who = Joining::new("a", Pdid(1));
        who.limits.registered_bytes = 3 << 20;
        let r = svc.attach(&mut ni, who, Box::new(Discard)).unwrap();
        let bytes = |svc: &WorkloadService| svc.member(r).unwrap().1.registered_bytes;

        // Counted before the memory is made, so an over-quota request allocates nothing.
        let Control::MakeRegion(first) = svc
            .control(&mut ni, r, Request::Register { len: 2 << 20 })
            .unwrap()
        else {
            panic!("a register asks for memory")
        };
        assert_eq!(bytes(&svc), 2 << 20);
        let e = svc
            .control(&mut ni, r, Request::Register { len: 2 << 20 })
            .unwrap_err();
        assert_eq!(e.kind(), "quota_refused");
        let placed = svc.place_region(first).unwrap();
        // Memory that could not be made gives its count back.
        let Ok(Control::MakeRegion(second)) =
            svc.control(&mut ni, r, Request::Register { len: 1 << 20 })
        else {
            panic!("1 MiB more fits")
        };
        svc.abandon_region(second);
        assert_eq!(bytes(&svc), 2 << 20);
        assert_eq!(
            svc.control(&mut ni, r, Request::Unregister { region: placed.id }),
            Ok(Control::ForgetRegion(placed))
        );
        assert_eq!(bytes(&svc), 0);
        assert_eq!(
            svc.control(&mut ni, r, Request::Register { len: 0 }),
            Err(ServiceError::BadLength(0))
        );
    }

    #[test]
    fn a_region_that_finds_no_place_gives_its_count_back() {
        let mut ni = Ni::new(NodeId(0), 4, NiConfig::default());
        let mut svc = WorkloadService::new(1);
        let mut who = Joining::new("a", Pdid(1));
        who.limits.registered_bytes = 2 * MAILBOX_WINDOW;
        who.job_limits.registered_bytes = 2 * MAILBOX_WINDOW;
        let r = svc.attach(&mut ni, who, Box::new(Discard)).unwrap();
        let first = svc.register(r, 2 << 20).unwrap();
        // Counted, then no room in the VA space after the first region: refused, and the
        // count is the first region's again.
        let pending = svc.begin_region(r, MAILBOX_WINDOW - VA_BASE).unwrap();
        assert_eq!(
            svc.member(r).unwrap().1.registered_bytes,
            first.len + MAILBOX_WINDOW - VA_BASE
        );
        assert!(matches!(
            svc.place_region(pending),
            Err(ServiceError::NoVaSpace { .. })
        ));
        assert_eq!(svc.member(r).unwrap().1.registered_bytes, first.len);
    }

    #[test]
    fn collective_counts_are_kept_by_job_and_bounded() {
        let mut ni = Ni::new(NodeId(0), 4, NiConfig::default());
        let mut svc = WorkloadService::new(1);
        let a = svc
            .attach(&mut ni, Joining::new("a", Pdid(1)), Box::new(Discard))
            .unwrap();
        let b = svc
            .attach(&mut ni, Joining::new("b", Pdid(2)), Box::new(Discard))
            .unwrap();
        let report = |started| CollectiveReport {
            kind: CollectiveKind::Allreduce,
            path: CollectivePath::Software,
            started,
            completed: started,
            failed: 0,
        };
        for (rank, n) in [(a, 3), (a, u64::MAX), (b, 5)] {
            let req = Request::CollectiveCounts {
                reports: vec![report(n)],
            };
            assert_eq!(
                svc.control(&mut ni, rank, req),
                Ok(Control::Answer(Reply::Ok))
            );
        }
        let counts: Vec<(&str, u64)> = svc
            .collective_counts()
            .map(|(job, r)| (job, r.started))
            .collect();
        // Saturating, and one job's reports never move another's.
        assert_eq!(counts, [("a", u64::MAX), ("b", 5)]);
        let req = Request::CollectiveCounts {
            reports: vec![report(1); MAX_COLLECTIVE_REPORTS + 1],
        };
        assert_eq!(
            svc.control(&mut ni, b, req),
            Err(ServiceError::TooManyReports(MAX_COLLECTIVE_REPORTS + 1))
        );
    }

    /// What a program's ring shows `refresh_programs`, as the test sets it: what it does,
    /// whether its thread is runnable, and whether it goes to sleep on its ring by the
    /// time its thread's state is read.
    type Shown = std::sync::Arc<std::sync::Mutex<(Activity, Option<bool>, bool)>>;

    /// Awake, everything taken, nothing posted, its thread runnable.
    fn shown() -> Shown {
        let a = Activity {
            waiting: false,
            drained: true,
            posting: false,
        };
        std::sync::Arc::new(std::sync::Mutex::new((a, Some(true), false)))
    }

    struct Shows(Shown);

    /// An NI with one program attached, whose ring shows what the test sets.
    fn one_program() -> (Ni, WorkloadService, Shown) {
        let mut ni = Ni::new(NodeId(0), 4, NiConfig::default());
        let mut svc = WorkloadService::new(1);
        let state = shown();
        svc.attach(
            &mut ni,
            Joining::new("a", Pdid(1)),
            Box::new(Shows(state.clone())),
        )
        .unwrap();
        (ni, svc, state)
    }

    /// What the NI's programs promise, as the horizon of its data cells shows it.
    fn promise(ni: &Ni) -> ModelTime {
        ni.horizon(&|_| Some(crate::topology::Port::Local)).0[0]
    }

    impl CompletionRing for Shows {
        fn push(&mut self, _: &[u8; attach::SLOT]) -> bool {
            true
        }
        fn has_room(&mut self) -> bool {
            true
        }
        fn wake(&mut self) {}
        fn consumed(&self, _: u8) -> Box<dyn ConsumedCount> {
            Box::new(|| 0)
        }
        fn activity(&mut self) -> Option<Activity> {
            Some(self.0.lock().unwrap().0)
        }
        fn runnable(&mut self) -> Option<bool> {
            let mut st = self.0.lock().unwrap();
            if st.2 {
                // Asleep by the time its state is read: on its ring.
                st.0.waiting = true;
                return Some(false);
            }
            st.1
        }
    }

    /// A program silent past `SILENT_NS` is still waited for while its thread is
    /// runnable (the host descheduled it: it computes), up to `RUNNABLE_SILENT_NS`; one
    /// whose thread sleeps elsewhere, or whose state cannot be read, is not.
    #[test]
    fn a_silent_program_is_waited_for_only_while_its_thread_is_runnable() {
        let (mut ni, mut svc, state) = one_program();
        let t0 = Instant::from_micros(1_000);
        svc.refresh_programs(&mut ni, t0);
        let running = promise(&ni);
        assert!(
            running < ModelTime::NEVER,
            "a running program promises its clock"
        );
        let at = |ns: u64| Instant::from_micros(1_000 + ns / 1_000);
        svc.refresh_programs(&mut ni, at(SILENT_NS + 1_000));
        assert_eq!(promise(&ni), running, "runnable: still waited for");
        for unknown in [Some(false), None] {
            state.lock().unwrap().1 = unknown;
            svc.refresh_programs(&mut ni, at(SILENT_NS + 1_000));
            assert_eq!(
                promise(&ni),
                ModelTime::NEVER,
                "{unknown:?}: not waited for"
            );
        }
        state.lock().unwrap().1 = Some(true);
        svc.refresh_programs(&mut ni, at(SILENT_NS + 1_000));
        assert_eq!(promise(&ni), running);
        svc.refresh_programs(&mut ni, at(RUNNABLE_SILENT_NS + 1_000));
        assert_eq!(
            promise(&ni),
            ModelTime::NEVER,
            "runnable and silent this long: spinning on something else"
        );
    }

    /// A process that attaches runs: it promises its start before the driver first looks
    /// at its ring (taken for gone, its first posts came out of modeled order).
    #[test]
    fn a_program_promises_its_start_from_its_attach() {
        let (ni, _svc, _state) = one_program();
        assert!(promise(&ni) < ModelTime::NEVER, "running from its attach");
    }

    /// A program whose waits on its ring end now and then on a timer, looked at awake
    /// between two of them long after its last command, is still heard from: it slept on
    /// its ring a moment ago, so it runs (promises its clock), and is not taken for gone
    /// (promising nothing, which put its next posts out of modeled order).
    #[test]
    fn a_program_between_timed_waits_is_not_taken_for_gone() {
        let (mut ni, mut svc, state) = one_program();
        let at = |ns: u64| Instant::from_micros(1_000 + ns / 1_000);
        svc.refresh_programs(&mut ni, at(0));
        let running = promise(&ni);
        state.lock().unwrap().0.waiting = true;
        for t in (0..=RUNNABLE_SILENT_NS).step_by(SILENT_NS as usize) {
            svc.refresh_programs(&mut ni, at(t));
            assert_eq!(promise(&ni), ModelTime::NEVER, "asleep, nothing to wake it");
        }
        // Awake a moment after its last sleep, long after its last command.
        let awake = at(RUNNABLE_SILENT_NS + SILENT_NS / 2);
        state.lock().unwrap().0.waiting = false;
        for runnable in [Some(true), Some(false), None] {
            state.lock().unwrap().1 = runnable;
            svc.refresh_programs(&mut ni, awake);
            assert_eq!(promise(&ni), running, "{runnable:?}: heard from, running");
        }
        // Unheard from since: gone, unless its thread runs.
        let later = at(RUNNABLE_SILENT_NS + 2 * SILENT_NS);
        svc.refresh_programs(&mut ni, later);
        assert_eq!(promise(&ni), ModelTime::NEVER, "asleep elsewhere since");
        state.lock().unwrap().1 = Some(true);
        svc.refresh_programs(&mut ni, later);
        assert_eq!(promise(&ni), running, "runnable: computing");
    }

    /// A program asleep on its ring with everything taken promises nothing (what wakes it
    /// bounds it); one that posted before it slept, whose commands the daemon has not
    /// read, or that waits for a control answer, promises its clock: taken for asleep or
    /// gone, its posts came out of modeled order.
    #[test]
    fn a_program_asleep_with_commands_unread_is_still_running() {
        let (mut ni, mut svc, state) = one_program();
        let now = Instant::from_micros(1_000);
        svc.refresh_programs(&mut ni, now);
        let running = promise(&ni);
        assert!(running < ModelTime::NEVER);
        state.lock().unwrap().0.waiting = true;
        svc.refresh_programs(&mut ni, now);
        assert_eq!(promise(&ni), ModelTime::NEVER, "asleep, nothing to wake it");
        state.lock().unwrap().0.posting = true;
        svc.refresh_programs(&mut ni, now);
        assert_eq!(promise(&ni), running, "asleep after posting: running");
        // Silent, its thread asleep elsewhere, but asking the daemon something: running.
        let late = Instant::from_micros(1_000 + SILENT_NS / 1_000 + 1);
        state.lock().unwrap().0.waiting = false;
        state.lock().unwrap().1 = Some(false);
        svc.refresh_programs(&mut ni, late);
        assert_eq!(promise(&ni), running, "asking: running");
        state.lock().unwrap().0.posting = false;
        svc.refresh_programs(&mut ni, late);
        assert_eq!(promise(&ni), ModelTime::NEVER, "asleep elsewhere: gone");
    }

    /// A silent program whose thread is asleep when its state is read, because it went to
    /// sleep on its ring after the ring was first looked at, waits: it relays what
    /// reaches its NI, which bounds what it posts next. Taken for gone, it did not.
    #[test]
    fn a_program_that_goes_to_sleep_on_its_ring_while_looked_at_waits() {
        let (mut ni, mut svc, state) = one_program();
        svc.refresh_programs(&mut ni, Instant::from_micros(1_000));
        state.lock().unwrap().2 = true;
        let late = Instant::from_micros(1_000 + SILENT_NS / 1_000 + 1);
        svc.refresh_programs(&mut ni, late);
        assert!(ni.relays(), "waiting on its ring: the NI relays for it");
        state.lock().unwrap().2 = false;
        state.lock().unwrap().0.waiting = false;
        state.lock().unwrap().1 = Some(false);
        svc.refresh_programs(&mut ni, late);
        assert!(!ni.relays(), "asleep elsewhere: gone, nothing relayed");
    }
}
