//! The data path: the two rings, the client-side queues, and the progress engine.
//!
//! # Threads
//! Everything is behind an `Arc<Shared>`, so an endpoint and its handles may be used from
//! several threads. Completions are read by one thread at a time, the *leader*: a thread
//! that needs progress (waiting for a tag, a message, a free channel...) takes the lead if
//! nobody has it, drains the completion ring into the client-side queues, and sleeps on the
//! daemon's doorbell when the ring is empty; the other waiting threads wait on a condition
//! variable that the leader signals after every batch. Posting a command only takes the
//! command ring's lock, never waits for the leader.
//!
//! Lock order: `cpl` (leader) -> `state` -> `cmd`; `ctrl` alone.
//!
//! # Mailboxes
//! A mailbox of capacity N holds N unread messages end to end: the daemon counts a message
//! until this library says it was taken (`exanet_proto::attach`'s consumed counters), so
//! its queue here never holds more than N. A message is counted as taken when `recv`
//! hands it out, or when it is dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use exanet_proto::attach::{Command, Completion, Reply, Request, Resource, CONSUMED_LEN, SLOT};
use exanet_proto::gvas::{Gvas, Pdid, VA_BITS};
use exanet_proto::model::ModelTime;
use exanet_proto::ni::{mailbox_gvas, MAILBOX_VIS, PACKETIZER_VIS, RANKS, RDMA_PAGES};
use exanet_proto::{NodeId, Shape};
use exanet_shm::{
    Consumer, Doorbell, Producer, Region, RingError, Ringer, ThreadMark, WaitError, Waiter,
};
use std::sync::Arc;

use crate::control::Control;
use crate::error::{Error, OpError, Result};

/// Ring slot size of both rings (each message is one [`SLOT`]).
pub const RING_SLOT_SIZE: u32 = 256;
/// How long the leader sleeps at most before checking that the daemon is still there: a
/// safety net only, since the daemon's end of our doorbell closes with the session (and
/// with the daemon), which ends a sleep at once. Long, so that an idle workload does not
/// wake on a period (an idle rack's 128 IP services woke 5 times a second each for it).
const LIVENESS_SLICE: Duration = Duration::from_secs(2);
/// How long a waiting follower sleeps at most before re-checking (a safety net: the leader
/// signals after every batch).
const FOLLOWER_SLICE: Duration = Duration::from_millis(50);
/// How long the leader sleeps at most while a command waits for room in the command ring
/// (the daemon may not ring us when it frees command slots).
const FULL_SLICE: Duration = Duration::from_micros(200);
/// Completions decoded before they are dispatched under the state lock.
const BATCH: usize = 64;
/// Messages kept for mailboxes this endpoint does not (yet) own.
const MAX_STRAYS: usize = 4096;
/// Notifications kept before the oldest are dropped.
const MAX_NOTIFICATIONS: usize = 1 << 16;
/// VA limit of a GVAS.
pub(crate) const VA_LIMIT: u64 = 1 << VA_BITS;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One channel of one interface: at most one operation in flight on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Chan {
    Packetizer {
        vi: u8,
        ch: u8,
    },
    RdmaWrite {
        page: u8,
        ch: u8,
    },
    RdmaRead {
        page: u8,
        ch: u8,
    },
    /// An accelerated allreduce, by collective id.
    Collective {
        id: u32,
    },
}

impl Chan {
    fn busy_error(self, tag: u32) -> Error {
        let (what, index, ch) = match self {
            Chan::Packetizer { vi, ch } => ("packetizer", vi, ch),
            Chan::RdmaWrite { page, ch } => ("RDMA page (write)", page, ch),
            Chan::RdmaRead { page, ch } => ("RDMA page (read)", page, ch),
            Chan::Collective { id } => ("collective", (id >> 16) as u8, id as u8),
        };
        Error::ChannelBusy {
            what,
            index,
            ch,
            tag,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum TagState {
    Pending {
        chan: Chan,
        forget: bool,
    },
    /// The result, when it happened in modeled time, and its place in the order the
    /// daemon handed events over (see [`Shared::next_event`]).
    Done(Result<(), OpError>, ModelTime, u64),
}

/// A message taken from a mailbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The mailbox it arrived in.
    pub vi: u8,
    /// The sending node.
    pub src_node: NodeId,
    /// The sending rank on that node.
    pub src_rank: u8,
    /// 0..=64 bytes.
    pub payload: Vec<u8>,
    /// When the reader could see it, in modeled time.
    pub at: ModelTime,
    /// Its place in the order the daemon handed events over (see [`Shared::next_event`]).
    pub(crate) seq: u64,
}

/// A completion notification an RDMA write left in this rank's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notification {
    /// Where in this rank's memory it was written.
    pub va: u64,
    /// The node that wrote.
    pub src_node: NodeId,
    /// The length of the transfer it announces.
    pub len: u64,
    /// When it was written, in modeled time.
    pub at: ModelTime,
    /// Its place in the order the daemon handed events over (see [`Shared::next_event`]).
    pub(crate) seq: u64,
}

/// Counters of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Completion slots read from the ring.
    pub completions: u64,
    /// Messages delivered into mailboxes.
    pub messages: u64,
    /// Notifications received.
    pub notifications: u64,
    /// Operation completions naming a tag this endpoint does not know (ignored).
    pub unexpected: u64,
    /// Messages dropped: of a mailbox closed meanwhile, or for a mailbox this endpoint does
    /// not own beyond the stray limit.
    pub dropped_messages: u64,
    /// Notifications dropped because nobody collected them.
    pub dropped_notifications: u64,
    /// Forgotten operations that failed.
    pub forgotten_failures: u64,
    /// Times the leader went to sleep on the doorbell (after its spin budget).
    pub sleeps: u64,
}

/// The client side of an open mailbox.
#[derive(Debug, Default)]
struct Inbox {
    /// Which allocation of the session it is (its messages carry it).
    generation: u32,
    capacity: usize,
    queue: VecDeque<Message>,
}

/// Where this workload counts the messages it took from each mailbox: in the ring region,
/// read by the daemon.
struct Counters {
    region: Arc<Region>,
    offset: usize,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counters at {:#x}", self.offset)
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    tags: HashMap<u32, TagState>,
    next_tag: u32,
    busy: HashMap<Chan, u32>,
    /// When each channel's last operation completed, in modeled time, until the channel
    /// is used again: the NI frees a channel with its completion (a message's ACK), so
    /// a command on it cannot have been posted before.
    freed: HashMap<Chan, ModelTime>,
    mailboxes: HashMap<u8, Inbox>,
    /// Messages of a mailbox whose allocation reply is not processed yet, with their
    /// generation.
    strays: HashMap<u8, VecDeque<(u32, Message)>>,
    stray_count: usize,
    /// The last generation closed of each mailbox index: its messages still in the ring
    /// are dropped, not given to a new mailbox of the same index.
    closed: HashMap<u8, u32>,
    counters: Option<Counters>,
    notifications: VecDeque<Notification>,
    /// Ranges of this rank's memory whose notifications a part of the library takes for
    /// itself (the collectives' landing memory), so that the program's own
    /// [`Shared::notification`] never sees them, nor they the program's.
    claims: Vec<Claim>,
    events: u64,
    polling: bool,
    /// Threads waiting on the condition variable for the leader's next batch.
    followers: usize,
    broken: Option<String>,
    stats: Stats,
    /// The workload's modeled clock: commands are posted at it, and what the workload
    /// takes (a completion, a message) moves it to that event's modeled time if later.
    clock: ModelTime,
    /// When the program last left a library call (host time), and calls it is inside
    /// now: CPU time its threads spend between calls is its compute.
    left_at: Option<Instant>,
    inside: usize,
    /// The program said it was idle inside a call (a provider holding this library
    /// around its poll): its time from the outermost call's end is waiting, not compute.
    idle_on_leave: bool,
    /// [`Info::software_ps`], for what the state hands out itself.
    software_ps: u64,
}

impl State {
    /// Registers an operation on `chan` and returns its tag.
    fn start(&mut self, chan: Chan) -> Result<u32> {
        if let Some(b) = &self.broken {
            return Err(Error::Broken(b.clone()));
        }
        if let Some(&t) = self.busy.get(&chan) {
            return Err(chan.busy_error(t));
        }
        // Tags wrap; skip those still in use (at most a few thousand are).
        let mut tag = self.next_tag;
        while self.tags.contains_key(&tag) {
            tag = tag.wrapping_add(1);
        }
        self.next_tag = tag.wrapping_add(1);
        self.tags.insert(
            tag,
            TagState::Pending {
                chan,
                forget: false,
            },
        );
        self.busy.insert(chan, tag);
        // A program that waited for the channel (in real time) waited for its completion:
        // its clock says so, else its command would come before what freed the channel,
        // which the daemon, ordering cells, took for its next move.
        if let Some(at) = self.freed.remove(&chan) {
            self.clock = self.clock.max(at);
        }
        Ok(tag)
    }

    /// Undoes [`State::start`] for a command that never reached the ring.
    fn abort(&mut self, tag: u32) {
        if let Some(TagState::Pending { chan, .. }) = self.tags.remove(&tag) {
            if self.busy.get(&chan) == Some(&tag) {
                self.busy.remove(&chan);
            }
        }
    }

    fn finish(&mut self, tag: u32, result: Result<(), OpError>, at: ModelTime) {
        match self.tags.get(&tag).copied() {
            Some(TagState::Pending { chan, forget }) => {
                if self.busy.get(&chan) == Some(&tag) {
                    self.busy.remove(&chan);
                    // Only channels that are used again: a collective's is its own.
                    if !matches!(chan, Chan::Collective { .. }) {
                        self.freed.insert(chan, at);
                    }
                }
                if forget {
                    self.tags.remove(&tag);
                    if result.is_err() {
                        self.stats.forgotten_failures += 1;
                    }
                } else {
                    self.tags
                        .insert(tag, TagState::Done(result, at, self.events));
                }
            }
            // A second completion for the same tag, or one we never posted.
            Some(TagState::Done(..)) | None => self.stats.unexpected += 1,
        }
    }

    /// Tells the daemon that a message of mailbox `vi` was taken (handed out or dropped):
    /// it no longer counts against the mailbox's capacity.
    fn took(&self, vi: u8) {
        if let Some(c) = &self.counters {
            if let Ok(n) = c.region.atomic_u64(c.offset + usize::from(vi) * 8) {
                n.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// The next message of mailbox `vi`, counted as taken; `clocked`: by the program,
    /// whose clock moves to it (else by a library that hands it over later).
    fn take(&mut self, vi: u8, clocked: bool) -> Result<Option<Message>> {
        let m = match self.mailboxes.get_mut(&vi) {
            Some(inbox) => inbox.queue.pop_front(),
            None => return Err(Error::Broken(format!("mailbox {vi} is not open"))),
        };
        if let Some(m) = &m {
            if clocked {
                self.took_event(m.at);
            }
            self.took(vi);
        }
        Ok(m)
    }

    /// The workload took an event of modeled time `at`: its clock moves there if later,
    /// plus the software cost of taking it.
    fn took_event(&mut self, at: ModelTime) {
        self.clock = self.clock.max(at) + self.software_ps;
    }

    fn dispatch(&mut self, c: Completion) {
        self.events += 1;
        self.stats.completions += 1;
        match c {
            Completion::Sent {
                tag,
                status,
                reason,
                at,
                ..
            }
            | Completion::Rdma {
                tag,
                status,
                reason,
                at,
                ..
            } => self.finish(tag, OpError::from_status(status, reason), at),
            Completion::Refused {
                tag,
                status,
                code,
                at,
            } => {
                let r = match OpError::from_status(status, code) {
                    // A refusal with status OK makes no sense; still a refusal.
                    Ok(()) => Err(OpError::Refused { code }),
                    other => other,
                };
                self.finish(tag, r, at)
            }
            Completion::Message {
                vi,
                generation,
                src_node,
                src_rank,
                payload,
                at,
            } => {
                let m = Message {
                    vi,
                    src_node: NodeId(src_node),
                    src_rank,
                    payload,
                    at,
                    seq: self.events,
                };
                let closed = self.closed.get(&vi).is_some_and(|g| generation <= *g);
                match self.mailboxes.get_mut(&vi) {
                    Some(inbox) if inbox.generation == generation => {
                        if inbox.queue.len() < inbox.capacity {
                            self.stats.messages += 1;
                            inbox.queue.push_back(m);
                        } else {
                            // Never from a daemon that counts; kept bounded all the same.
                            self.stats.dropped_messages += 1;
                            self.took(vi);
                        }
                    }
                    // Of a mailbox closed since: the daemon forgot it with the mailbox.
                    _ if closed => self.stats.dropped_messages += 1,
                    Some(inbox) if generation < inbox.generation => {
                        self.stats.dropped_messages += 1
                    }
                    _ if self.stray_count < MAX_STRAYS => {
                        // Possibly for a mailbox whose allocation reply is being processed
                        // by another thread right now: kept, and adopted by the allocation.
                        self.stray_count += 1;
                        self.strays
                            .entry(vi)
                            .or_default()
                            .push_back((generation, m));
                    }
                    _ => {
                        self.stats.dropped_messages += 1;
                        self.took(vi);
                    }
                }
            }
            Completion::Collective {
                tag,
                status,
                reason,
                at,
            } => self.finish(tag, OpError::from_status(status, reason), at),
            Completion::Notified {
                va,
                src_node,
                len,
                at,
            } => {
                self.stats.notifications += 1;
                let queue = match self.claims.iter_mut().find(|c| c.range.contains(&va)) {
                    Some(c) => &mut c.queue,
                    None => &mut self.notifications,
                };
                if queue.len() >= MAX_NOTIFICATIONS {
                    queue.pop_front();
                    self.stats.dropped_notifications += 1;
                }
                queue.push_back(Notification {
                    va,
                    src_node: NodeId(src_node),
                    len,
                    at,
                    seq: self.events,
                });
            }
        }
    }
}

/// Notifications written into `range`, kept apart from the program's.
#[derive(Debug)]
struct Claim {
    range: std::ops::Range<u64>,
    queue: VecDeque<Notification>,
}

/// What arrived for a part of the library that waits on a mailbox and claimed memory.
#[derive(Clone, Debug)]
pub(crate) enum Incoming {
    Message(Message),
    Notification(Notification),
}

/// What [`Shared::next_event`] found first.
pub(crate) enum Next {
    /// Taken, the clock moved to it.
    Incoming(Incoming),
    /// This operation completed: the caller takes its completion (with
    /// [`Shared::wait`], which moves the clock).
    Completed(u32),
}

/// Fixed facts of an attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Info {
    pub node: String,
    pub node_id: NodeId,
    pub rank: u8,
    pub pdid: Pdid,
    pub nodes: u32,
    pub shape: std::result::Result<Shape, String>,
    pub control_timeout: Duration,
    /// Where the consumed counters are in the ring region (checked to fit).
    pub consumed_offset: usize,
    /// Modeled software cost of each call that posts or takes data, picoseconds.
    pub software_ps: u64,
    /// How much of the host time spent outside library calls counts as modeled compute,
    /// in millionths.
    pub compute_scale_ppm: u64,
    /// Where the modeled clock starts (the daemon's choice: after what earlier programs
    /// did on the rack).
    pub clock_start: ModelTime,
}

/// One library call in progress (see [`Shared::enter`]). Not `Send`: it counts the
/// calling thread's own nesting, so it must end on the thread it started on.
pub(crate) struct Call<'a> {
    shared: &'a Shared,
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        st.inside = st.inside.saturating_sub(1);
        let idle = st.inside == 0 && std::mem::take(&mut st.idle_on_leave);
        if st.inside == 0 {
            st.left_at = (!idle).then(Instant::now);
        }
        drop(st);
        let scaled = self.shared.info.compute_scale_ppm > 0;
        thread_calls(self.shared, |t| {
            t.depth = t.depth.saturating_sub(1);
            if t.depth > 0 {
                return;
            }
            // Where this thread leaves its outermost call, its compute starts, unless the
            // program said it only waits. The CPU clock is a system call that takes the
            // scheduler's lock: read at every call's end, nested ones and polls that
            // found nothing included, it was a tenth of the machine under MPI's polling.
            // Read last, outside the lock: the call's own work up to here is the
            // library's.
            t.left_idle = idle;
            if let Some(cpu) = (!idle && scaled).then(thread_cpu).flatten() {
                t.left_cpu = Some(cpu);
            }
        });
    }
}

/// Endpoints a thread keeps its calls' account for; past this it forgets the one it
/// used longest ago that it is not inside (whose next call then counts at most the host
/// time since).
const THREAD_CALLS_ENDPOINTS: usize = 16;

/// A thread's calls of one endpoint.
#[derive(Clone, Copy, Debug, Default)]
struct ThreadCalls {
    /// Calls of the endpoint this thread is inside now (a library built on this one holds
    /// it around its own calls of it).
    depth: u32,
    /// Its CPU clock when it last left its outermost call: what it spent on a CPU since
    /// is what it computed for that endpoint, whatever it did with others meanwhile.
    left_cpu: Option<Duration>,
    /// It left that call idle (`Shared::idle`): until its next one it only waited.
    left_idle: bool,
}

thread_local! {
    /// This thread's account per endpoint (by the address of its shared state), most
    /// recently used last.
    static THREAD_CALLS: std::cell::RefCell<Vec<(usize, ThreadCalls)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn thread_calls<R>(shared: &Shared, f: impl FnOnce(&mut ThreadCalls) -> R) -> R {
    let key = std::ptr::from_ref(shared) as usize;
    THREAD_CALLS.with_borrow_mut(|v| {
        let mut calls = match v.iter().position(|(k, _)| *k == key) {
            Some(i) => v.remove(i).1,
            None => {
                if v.len() >= THREAD_CALLS_ENDPOINTS {
                    // One the thread is inside stays: its depth must not be lost.
                    if let Some(i) = v.iter().position(|(_, c)| c.depth == 0) {
                        v.remove(i);
                    }
                }
                ThreadCalls::default()
            }
        };
        let r = f(&mut calls);
        v.push((key, calls));
        r
    })
}

/// One control request under way (or waiting for the one before it): says so in the ring
/// header while any is, and withdraws it when the last ends, however it ends.
struct Asking<'a> {
    mark: &'a ThreadMark,
    count: &'a Mutex<usize>,
}

impl<'a> Asking<'a> {
    fn new(mark: &'a ThreadMark, count: &'a Mutex<usize>) -> Asking<'a> {
        let mut n = lock(count);
        *n += 1;
        mark.asking(true);
        Asking { mark, count }
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        let mut n = lock(self.count);
        *n -= 1;
        if *n == 0 {
            self.mark.asking(false);
        }
    }
}

thread_local! {
    /// The calling thread's id, asked of the kernel once (0 until then).
    static TID: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The calling thread's kernel id (`gettid`).
fn current_tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            t.set(u32::try_from(nix::unistd::gettid().as_raw()).unwrap_or(0));
        }
        t.get()
    })
}

/// The calling thread's CPU clock: it stands still while the host runs something else,
/// so a program the host descheduled computed nothing meanwhile.
fn thread_cpu() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .ok()
        .map(Duration::from)
}

/// What the thread entering a call (its CPU clock `now`, `left` when it last left a call
/// of this endpoint) computed since the program left the library `wall` ago: its CPU
/// time since, at most `wall` (a thread that never left one counts its CPU time so far,
/// at most `wall`; without a CPU clock, `wall`).
fn computed(now: Option<Duration>, left: Option<Duration>, wall: Duration) -> Duration {
    let Some(now) = now else {
        return wall;
    };
    now.saturating_sub(left.unwrap_or_default())
        .saturating_sub(cpu_clock_cost())
        .min(wall)
}

/// The CPU time two reads of the thread's CPU clock in a row count between them: the
/// part of each read's system call after it sampled the clock and before the next one
/// did, which every compute between a call's end and the next call's start includes
/// without the program having computed it. Measured once (the least of 32 tries);
/// subtracted from each compute. An MPI ping-pong with compute counted (2x1x1, release,
/// four runs each) modeled 1.7 to 2.1 us more per one-way than without before this,
/// 1.1 to 2.0 after: the reads are part of that excess, not all of it.
fn cpu_clock_cost() -> Duration {
    static COST: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *COST.get_or_init(|| {
        (0..32)
            .filter_map(|_| {
                let a = thread_cpu()?;
                let b = thread_cpu()?;
                Some(b.saturating_sub(a))
            })
            .min()
            .unwrap_or_default()
    })
}

/// Whether the consumed counters fit a ring region of `region_len` bytes at `offset`.
pub(crate) fn counters_fit(offset: u64, region_len: u64) -> bool {
    offset % 8 == 0
        && offset
            .checked_add(CONSUMED_LEN as u64)
            .is_some_and(|end| end <= region_len)
}

/// The completion ring's reader, owned by the leader.
pub(crate) struct Poller {
    pub cons: Consumer,
    pub last_alive_check: Instant,
    /// Completions decoded and not dispatched yet; kept (empty) between drains so that
    /// polling does not allocate.
    batch: Vec<Completion>,
}

pub(crate) struct Shared {
    pub info: Info,
    spin_ns: AtomicU64,
    state: Mutex<State>,
    cv: Condvar,
    cmd: Mutex<Producer>,
    cpl: Mutex<Poller>,
    /// The daemon rings it when it published completions and we announced we sleep.
    from_daemon: Doorbell,
    /// We ring it when we published commands and the daemon announced it sleeps.
    to_daemon: Ringer,
    ctrl: Mutex<Control>,
    /// Where each call says which thread makes it: a program whose thread is on a CPU
    /// or waiting for one is computing, not waiting for something outside the rack, and
    /// the daemon keeps waiting for what it may post (`exanet_proto::workload`).
    thread: Option<ThreadMark>,
    /// Control requests under way or waiting for the one before them (see [`Asking`]).
    asking: Mutex<usize>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("info", &self.info).finish()
    }
}

fn corrupt(e: RingError) -> Error {
    match e {
        RingError::Corrupt(c) => Error::Corrupt(c.to_string()),
        other => Error::Corrupt(other.to_string()),
    }
}

impl Shared {
    pub(crate) fn new(
        info: Info,
        spin: Duration,
        cmd: Producer,
        cpl: Consumer,
        from_daemon: Doorbell,
        to_daemon: Ringer,
        ctrl: Control,
    ) -> Shared {
        let counters = Counters {
            region: Arc::clone(cpl.region()),
            offset: info.consumed_offset,
        };
        let (software_ps, clock) = (info.software_ps, info.clock_start);
        let thread = cpl.thread_mark().ok();
        Shared {
            info,
            spin_ns: AtomicU64::new(u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX)),
            state: Mutex::new(State {
                counters: Some(counters),
                software_ps,
                clock,
                ..State::default()
            }),
            cv: Condvar::new(),
            cmd: Mutex::new(cmd),
            cpl: Mutex::new(Poller {
                cons: cpl,
                last_alive_check: Instant::now(),
                batch: Vec::with_capacity(BATCH),
            }),
            from_daemon,
            to_daemon,
            ctrl: Mutex::new(ctrl),
            thread,
            asking: Mutex::new(0),
        }
    }

    pub(crate) fn spin(&self) -> Duration {
        Duration::from_nanos(self.spin_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn set_spin(&self, spin: Duration) {
        self.spin_ns.store(
            u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn stats(&self) -> Stats {
        lock(&self.state).stats
    }

    fn mark_broken(&self, why: &Error) {
        // Every later call fails with this text ([`Error::Broken`]): where a program
        // attaches to several nodes, or a rank's log is read far from its node, the node
        // whose daemon went away is the first thing to know.
        let why = match why {
            Error::Disconnected => format!("node {}: {why}", self.info.node),
            other => other.to_string(),
        };
        let mut st = lock(&self.state);
        if st.broken.is_none() {
            st.broken = Some(why);
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Makes the endpoint unusable and closes the connection (the daemon then detaches the
    /// rank and frees its interfaces).
    pub(crate) fn detach(&self) {
        {
            let mut st = lock(&self.state);
            if st.broken.is_none() {
                st.broken = Some("detached".into());
            }
        }
        self.cv.notify_all();
        lock(&self.ctrl).shutdown();
    }

    // ---- control plane ----

    pub(crate) fn control(
        &self,
        op: &'static str,
        req: &Request,
        fds: &[std::os::fd::RawFd],
    ) -> Result<Reply> {
        let (reply, got) = self.control_with_fds(op, req, fds)?;
        if !got.is_empty() {
            return Err(Error::Protocol(format!(
                "{op}: the daemon sent {} unexpected descriptor(s)",
                got.len()
            )));
        }
        Ok(reply)
    }

    /// A control request whose reply may carry descriptors (the daemon's refusal is an
    /// error, as for [`Shared::control`]).
    pub(crate) fn control_with_fds(
        &self,
        op: &'static str,
        req: &Request,
        fds: &[std::os::fd::RawFd],
    ) -> Result<(Reply, Vec<std::os::fd::OwnedFd>)> {
        if let Some(b) = &lock(&self.state).broken {
            return Err(Error::Broken(b.clone()));
        }
        // Waiting for the daemon's answer is no wait for anything outside the rack: the
        // daemon keeps waiting for what this program posts next (see `Shared::enter`).
        let asking = self.thread.as_ref().map(|m| Asking::new(m, &self.asking));
        let r = lock(&self.ctrl).request(req, fds);
        drop(asking);
        let (reply, got) = r?;
        if let Reply::Error { message } = reply {
            return Err(Error::Daemon { op, message });
        }
        Ok((reply, got))
    }

    pub(crate) fn alloc(&self, kind: Resource, capacity: Option<u32>) -> Result<u8> {
        let (op, limit) = match kind {
            Resource::Packetizer => ("packetizer allocation", PACKETIZER_VIS),
            Resource::Mailbox => ("mailbox allocation", MAILBOX_VIS),
            Resource::RdmaPage => ("RDMA page allocation", RDMA_PAGES),
        };
        match self.control(
            op,
            &Request::Alloc {
                kind,
                capacity,
                index: None,
            },
            &[],
        )? {
            Reply::Allocated { index, .. } if usize::from(index) < limit => Ok(index),
            Reply::Allocated { index, .. } => Err(Error::Protocol(format!(
                "{op}: the daemon gave index {index}, outside 0..{limit}"
            ))),
            other => Err(Error::Protocol(format!("{op}: unexpected reply {other:?}"))),
        }
    }

    pub(crate) fn free(&self, kind: Resource, index: u8) -> Result<()> {
        match self.control("free", &Request::Free { kind, index }, &[])? {
            Reply::Ok => Ok(()),
            other => Err(Error::Protocol(format!("free: unexpected reply {other:?}"))),
        }
    }

    /// Allocates a mailbox of `capacity`: its index and generation.
    pub(crate) fn alloc_mailbox(&self, capacity: u32, index: Option<u8>) -> Result<(u8, u32)> {
        let op = "mailbox allocation";
        let kind = Resource::Mailbox;
        let req = Request::Alloc {
            kind,
            capacity: Some(capacity),
            index,
        };
        match self.control(op, &req, &[])? {
            Reply::Allocated { index, generation } if usize::from(index) < MAILBOX_VIS => {
                Ok((index, generation))
            }
            Reply::Allocated { index, .. } => Err(Error::Protocol(format!(
                "{op}: the daemon gave index {index}, outside 0..{MAILBOX_VIS}"
            ))),
            other => Err(Error::Protocol(format!("{op}: unexpected reply {other:?}"))),
        }
    }

    /// Creates the client-side queue of mailbox `vi` (allocation `generation`, room for
    /// `capacity` messages), adopting what already arrived for it.
    pub(crate) fn open_mailbox(&self, vi: u8, generation: u32, capacity: u32) {
        let mut st = lock(&self.state);
        let early = st.strays.remove(&vi).unwrap_or_default();
        st.stray_count -= early.len();
        let mut inbox = Inbox {
            generation,
            capacity: capacity.try_into().unwrap_or(usize::MAX),
            queue: VecDeque::new(),
        };
        for (g, m) in early {
            if g == generation && inbox.queue.len() < inbox.capacity {
                st.stats.messages += 1;
                inbox.queue.push_back(m);
            } else {
                // Of an earlier mailbox of this index, or more than it may hold.
                st.stats.dropped_messages += 1;
                if g == generation {
                    st.took(vi);
                }
            }
        }
        st.mailboxes.insert(vi, inbox);
    }

    /// Forgets mailbox `vi` of allocation `generation` (freed): its messages still in the
    /// ring will be dropped.
    pub(crate) fn close_mailbox(&self, vi: u8, generation: u32) {
        let mut st = lock(&self.state);
        if st
            .mailboxes
            .get(&vi)
            .is_some_and(|m| m.generation == generation)
        {
            st.mailboxes.remove(&vi);
        }
        let last = st.closed.entry(vi).or_default();
        *last = (*last).max(generation);
        if let Some(q) = st.strays.get_mut(&vi) {
            let before = q.len();
            q.retain(|(g, _)| *g > generation);
            let gone = before - q.len();
            st.stray_count -= gone;
            st.stats.dropped_messages += gone as u64;
        }
    }

    // ---- addresses ----

    pub(crate) fn check_node(&self, node: NodeId) -> Result<()> {
        if node.0 < self.info.nodes {
            Ok(())
        } else {
            Err(Error::BadNode {
                id: node.0,
                nodes: self.info.nodes,
            })
        }
    }

    fn check_node_rank(&self, node: NodeId, rank: u8) -> Result<()> {
        self.check_node(node)?;
        if usize::from(rank) >= RANKS {
            return Err(Error::BadRank(rank));
        }
        Ok(())
    }

    pub(crate) fn gvas(&self, node: NodeId, rank: u8, va: u64) -> Result<Gvas> {
        self.check_node_rank(node, rank)?;
        Gvas::new(self.info.pdid, node, rank, va).map_err(|e| Error::BadAddress(e.to_string()))
    }

    /// The GVAS of mailbox `vi` of `rank` on `node`, in this workload's PDID.
    pub(crate) fn mailbox_gvas(&self, node: NodeId, rank: u8, vi: u8) -> Result<Gvas> {
        if usize::from(vi) >= MAILBOX_VIS {
            return Err(Error::BadAddress(format!(
                "mailbox {vi} outside 0..{MAILBOX_VIS}"
            )));
        }
        self.check_node_rank(node, rank)?;
        mailbox_gvas(self.info.pdid, node, rank, vi)
            .ok_or_else(|| Error::BadAddress(format!("mailbox {vi} of {}:{rank}", node.0)))
    }

    /// Checks a destination given by the caller: this workload's PDID, a node of the rack.
    pub(crate) fn check_dst(&self, dst: &Gvas) -> Result<()> {
        if dst.pdid() != self.info.pdid {
            return Err(Error::ForeignPdid {
                pdid: dst.pdid().0,
                own: self.info.pdid.0,
            });
        }
        self.check_node(dst.node())
    }

    // ---- data plane ----

    /// Pushes one encoded command, waiting (while making progress) when the ring is full.
    fn push(&self, bytes: &[u8; SLOT]) -> Result<()> {
        let try_push = |p: &mut Producer| -> Result<bool> {
            match p.push(bytes) {
                Ok(()) => {
                    // The command is in the ring whatever happens to the wake-up; a failed
                    // doorbell send only delays the daemon until it polls again.
                    let _ = p.wake_consumer(&self.to_daemon);
                    Ok(true)
                }
                Err(RingError::Full) => Ok(false),
                Err(e) => Err(corrupt(e)),
            }
        };
        match try_push(&mut lock(&self.cmd)) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                self.mark_broken(&e);
                return Err(e);
            }
        }
        let r = self.drive(Some(self.info.control_timeout), Some(FULL_SLICE), |_st| {
            Ok(try_push(&mut lock(&self.cmd))?.then_some(()))
        });
        match r {
            Ok(Some(())) => Ok(()),
            Ok(None) => Err(Error::Timeout),
            Err(e) => {
                if matches!(e, Error::Corrupt(_)) {
                    self.mark_broken(&e);
                }
                Err(e)
            }
        }
    }

    /// Posts a command on `chan`, built from its tag.
    pub(crate) fn post(&self, chan: Chan, build: impl FnOnce(u32) -> Command) -> Result<u32> {
        let _call = self.enter();
        let started = lock(&self.state).start(chan);
        let tag = match started {
            Ok(t) => t,
            Err(Error::ChannelBusy { .. }) => {
                // Maybe its completion is already in the ring: one pass without waiting.
                self.drive(Some(Duration::ZERO), None, |st| {
                    Ok((!st.busy.contains_key(&chan)).then_some(()))
                })?;
                lock(&self.state).start(chan)?
            }
            Err(e) => return Err(e),
        };
        self.push_tagged(tag, build(tag))
    }

    /// Posts a command on a free channel of `chans`, waiting for one to free up (`wait`;
    /// without, [`Error::ChannelBusy`] while all are busy).
    pub(crate) fn post_any(
        &self,
        chans: impl Fn(u8) -> Chan,
        count: u8,
        wait: bool,
        build: impl FnOnce(u32, u8) -> Command,
    ) -> Result<u32> {
        let _call = self.enter();
        let timeout = if wait {
            self.info.control_timeout
        } else {
            Duration::ZERO
        };
        // What occupied channel 0 when last seen, for the error if none frees up.
        let mut busy_with = 0;
        let got = self.drive(Some(timeout), None, |st| {
            // The free channel freed earliest in modeled time: which channels the host has
            // freed by now is its timing, but completions come in modeled order, so the
            // earliest freed is the same whenever the program asks.
            let free = (0..count)
                .filter(|&ch| !st.busy.contains_key(&chans(ch)))
                .min_by_key(|&ch| st.freed.get(&chans(ch)).copied().unwrap_or_default());
            match free {
                Some(ch) => Ok(Some((st.start(chans(ch))?, ch))),
                None => {
                    busy_with = st.busy.get(&chans(0)).copied().unwrap_or_default();
                    Ok(None)
                }
            }
        })?;
        let (tag, ch) = match got {
            Some(got) => got,
            None if wait => return Err(Error::Timeout),
            None => return Err(chans(0).busy_error(busy_with)),
        };
        self.push_tagged(tag, build(tag, ch))
    }

    fn push_tagged(&self, tag: u32, cmd: Command) -> Result<u32> {
        let cmd = {
            // The call's software runs before the command reaches the NI.
            let mut st = lock(&self.state);
            st.clock = st.clock + self.info.software_ps;
            cmd.posted_at(st.clock)
        };
        if let Err(e) = self.push(&cmd.encode()) {
            lock(&self.state).abort(tag);
            return Err(e);
        }
        Ok(tag)
    }

    /// Waits for `tag`'s completion; returns when it happened in modeled time.
    pub(crate) fn wait(&self, tag: u32, timeout: Option<Duration>) -> Result<ModelTime> {
        match self.take_result(tag, timeout, |_, _| true, true)? {
            None => Err(Error::Timeout),
            Some((Ok(()), at)) => Ok(at),
            Some((Err(error), _)) => Err(Error::Op { tag, error }),
        }
    }

    /// `tag`'s completion if it came by the workload's modeled clock, without waiting and
    /// without moving the clock (`Ok(None)` if it had not, in modeled or in real time):
    /// what a program polling at its clock would see. Taking a completion later in
    /// modeled time would move the clock as far as the host happened to have delivered,
    /// and the program's figures with it.
    pub(crate) fn done_by_clock(&self, tag: u32) -> Result<Option<ModelTime>> {
        let due = |at, clock| at <= clock;
        match self.take_result(tag, Some(Duration::ZERO), due, false)? {
            None => Ok(None),
            Some((Ok(()), at)) => Ok(Some(at)),
            Some((Err(error), _)) => Err(Error::Op { tag, error }),
        }
    }

    /// `tag`'s result if it came (in real time), with when it ended in modeled time,
    /// without waiting and without moving the clock: see [`crate::Endpoint::try_result`].
    pub(crate) fn try_result(&self, tag: u32) -> Result<Option<(Result<(), OpError>, ModelTime)>> {
        self.take_result(tag, Some(Duration::ZERO), |_, _| true, false)
    }

    /// Collects `tag`'s result once it ended and `due(its time, the clock)` allows it,
    /// waiting up to `timeout` for that; `clocked`: the clock moves to its time.
    fn take_result(
        &self,
        tag: u32,
        timeout: Option<Duration>,
        due: impl Fn(ModelTime, ModelTime) -> bool,
        clocked: bool,
    ) -> Result<Option<(Result<(), OpError>, ModelTime)>> {
        let _call = self.enter();
        self.drive(timeout, None, |st| match st.tags.get(&tag) {
            None => Err(Error::UnknownTag(tag)),
            Some(&TagState::Done(r, at, _)) if due(at, st.clock) => {
                st.tags.remove(&tag);
                if clocked {
                    st.clock = st.clock.max(at);
                }
                Ok(Some((r, at)))
            }
            Some(_) => Ok(None),
        })
    }

    /// The workload's modeled clock.
    pub(crate) fn clock(&self) -> ModelTime {
        lock(&self.state).clock
    }

    /// The program only waits for this endpoint until its next call: that host time is
    /// not compute. Said inside a call, it holds from where the outermost one ends.
    pub(crate) fn idle(&self) {
        let mut st = lock(&self.state);
        if st.inside == 0 {
            st.left_at = None;
        } else {
            st.idle_on_leave = true;
        }
    }

    /// The program has something to do after all: an [`Shared::idle`] said earlier inside
    /// this call no longer holds where it ends.
    pub(crate) fn busy(&self) {
        lock(&self.state).idle_on_leave = false;
    }

    /// The workload waits, in modeled time, until `t`; returns its clock.
    pub(crate) fn advance_clock(&self, t: ModelTime) -> ModelTime {
        let _call = self.enter();
        let mut st = lock(&self.state);
        st.clock = st.clock.max(t);
        st.clock
    }

    /// A library call starts: the CPU time the calling thread spent since it last left a
    /// call of this endpoint (at most the host time since the program last left one) was
    /// its compute, and moves the modeled clock by that, scaled. Time the host gave to
    /// other programs, sleeps, and time blocked inside the library do not count: there the
    /// modeled clock follows the events waited for instead.
    pub(crate) fn enter(&self) -> Call<'_> {
        if let Some(m) = &self.thread {
            m.set(current_tid());
        }
        // Only this thread's outermost call can start after compute (a nested one: a
        // library built on this one holds it around its calls), and only if it did not
        // leave its last one idle. The CPU clock is read first, outside the lock, so that
        // the call's own work is not counted as compute, and only with a compute to
        // charge: it is a system call, and an MPI library's empty polls have none.
        let scaled = self.info.compute_scale_ppm > 0;
        let (cpu, left_cpu) = thread_calls(self, |t| {
            t.depth += 1;
            let charging = t.depth == 1 && !std::mem::take(&mut t.left_idle) && scaled;
            (charging.then(thread_cpu), t.left_cpu)
        });
        let mut st = lock(&self.state);
        if st.inside == 0 {
            st.idle_on_leave = false;
            if let Some(t) = st.left_at.take() {
                let spent = match cpu {
                    Some(now) => computed(now, left_cpu, t.elapsed()),
                    None => Duration::ZERO,
                };
                let ns = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
                let ps = (u128::from(ns) * 1000 * u128::from(self.info.compute_scale_ppm)
                    / 1_000_000)
                    .min(u128::from(u64::MAX)) as u64;
                st.clock = st.clock + ps;
            }
        }
        st.inside += 1;
        Call {
            shared: self,
            _thread: std::marker::PhantomData,
        }
    }

    /// [`Shared::enter`] with no guard, for the C API's `exanet_hold`, which ends it with
    /// [`Shared::unhold`] on the same thread.
    pub(crate) fn hold(&self) {
        std::mem::forget(self.enter());
    }

    /// Ends a hold this thread began with [`Shared::hold`]; `false` if it holds none (the
    /// C program's calls are never inside one of ours, so a depth left is a hold).
    pub(crate) fn unhold(&self) -> bool {
        if thread_calls(self, |t| t.depth) == 0 {
            return false;
        }
        drop(Call {
            shared: self,
            _thread: std::marker::PhantomData,
        });
        true
    }

    pub(crate) fn forget(&self, tag: u32) -> Result<()> {
        let mut st = lock(&self.state);
        match st.tags.get_mut(&tag) {
            None => Err(Error::UnknownTag(tag)),
            Some(TagState::Pending { forget, .. }) => {
                *forget = true;
                Ok(())
            }
            Some(TagState::Done(r, ..)) => {
                if r.is_err() {
                    st.stats.forgotten_failures += 1;
                }
                st.tags.remove(&tag);
                Ok(())
            }
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        let st = lock(&self.state);
        st.tags
            .values()
            .filter(|t| matches!(t, TagState::Pending { .. }))
            .count()
    }

    pub(crate) fn recv(
        &self,
        vi: u8,
        timeout: Option<Duration>,
        clocked: bool,
    ) -> Result<Option<Message>> {
        let _call = self.enter();
        self.drive(timeout, None, |st| st.take(vi, clocked))
    }

    /// The program took an event of modeled time `at` that a library on top had kept
    /// for it: see [`crate::Endpoint::took`].
    pub(crate) fn took(&self, at: ModelTime) -> ModelTime {
        let _call = self.enter();
        let mut st = lock(&self.state);
        st.took_event(at);
        st.clock
    }

    pub(crate) fn queued(&self, vi: u8) -> usize {
        lock(&self.state)
            .mailboxes
            .get(&vi)
            .map_or(0, |m| m.queue.len())
    }

    pub(crate) fn notification(&self, timeout: Option<Duration>) -> Result<Option<Notification>> {
        let _call = self.enter();
        self.drive(timeout, None, |st| {
            let n = st.notifications.pop_front();
            if let Some(n) = &n {
                st.took_event(n.at);
            }
            Ok(n)
        })
    }

    /// Takes the notifications written into `range` of this rank's memory for the caller
    /// (see [`Shared::next_incoming`]) until [`Shared::release_notifications`].
    pub(crate) fn claim_notifications(&self, range: std::ops::Range<u64>) {
        lock(&self.state).claims.push(Claim {
            range,
            queue: VecDeque::new(),
        });
    }

    /// Gives the notifications of the claim starting at `start` back to the program
    /// (those not taken are dropped: the memory they announce is going away).
    pub(crate) fn release_notifications(&self, start: u64) {
        lock(&self.state).claims.retain(|c| c.range.start != start);
    }

    /// The first of what has come for the caller, without waiting: the next message of
    /// mailbox `vi`, the next notification in one of `claims`, or the completion of one of
    /// `tags`, whichever the daemon handed over first. What has not come yet comes after
    /// everything that has, and the NI hands events over in modeled order, so whatever
    /// the host had delivered by now, the first is the same: a caller that takes them one
    /// by one this way sees the same sequence, and its clock the same times, on every
    /// run. (Taking messages before completions, or whatever had come, moved the clock
    /// by the host's timing; so did taking the earliest `at`, which events of different
    /// kinds reach with different costs: one that came later could be earlier.)
    pub(crate) fn next_event(&self, vi: u8, claims: &[u64], tags: &[u32]) -> Result<Option<Next>> {
        enum Which {
            Message,
            Claim(usize),
            Tag(u32),
        }
        let _call = self.enter();
        self.drive(Some(Duration::ZERO), None, |st| {
            let mut best: Option<(u64, Which)> = None;
            let mut offer = |seq: u64, w: Which| {
                if best.as_ref().is_none_or(|(b, _)| seq < *b) {
                    best = Some((seq, w));
                }
            };
            match st.mailboxes.get(&vi) {
                Some(inbox) => {
                    if let Some(m) = inbox.queue.front() {
                        offer(m.seq, Which::Message);
                    }
                }
                None => return Err(Error::Broken(format!("mailbox {vi} is not open"))),
            }
            for (i, c) in st.claims.iter().enumerate() {
                if claims.contains(&c.range.start) {
                    if let Some(n) = c.queue.front() {
                        offer(n.seq, Which::Claim(i));
                    }
                }
            }
            for &tag in tags {
                if let Some(&TagState::Done(_, _, seq)) = st.tags.get(&tag) {
                    offer(seq, Which::Tag(tag));
                }
            }
            Ok(match best {
                None => None,
                Some((_, Which::Message)) => st
                    .take(vi, true)?
                    .map(|m| Next::Incoming(Incoming::Message(m))),
                Some((_, Which::Claim(i))) => st.claims[i].queue.pop_front().map(|n| {
                    st.took_event(n.at);
                    Next::Incoming(Incoming::Notification(n))
                }),
                Some((_, Which::Tag(tag))) => Some(Next::Completed(tag)),
            })
        })
    }

    /// Processes what is in the completion ring without waiting; returns how many
    /// completions that was.
    pub(crate) fn poll(&self) -> Result<u64> {
        let before = lock(&self.state).events;
        self.drive(Some(Duration::ZERO), None, |_| Ok(None::<()>))?;
        Ok(lock(&self.state).events - before)
    }

    /// Completions processed so far (by any thread).
    pub(crate) fn events(&self) -> u64 {
        lock(&self.state).events
    }

    /// Waits until more than `seen` completions were processed (by any thread) or
    /// `timeout`; returns whether there were.
    pub(crate) fn wait_events(&self, seen: u64, timeout: Option<Duration>) -> Result<bool> {
        Ok(self
            .drive(timeout, None, |st| Ok((st.events > seen).then_some(())))?
            .is_some())
    }

    /// Makes progress until `cond` yields a value (`Some`), `timeout` passes (`None`) or
    /// something fails. `cap` bounds each sleep of the leader.
    fn drive<T>(
        &self,
        timeout: Option<Duration>,
        cap: Option<Duration>,
        mut cond: impl FnMut(&mut State) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut last_pass = false;
        loop {
            let mut st = lock(&self.state);
            if let Some(v) = cond(&mut st)? {
                return Ok(Some(v));
            }
            if let Some(b) = &st.broken {
                return Err(Error::Broken(b.clone()));
            }
            if last_pass {
                return Ok(None);
            }
            let left = match (timeout, deadline) {
                (Some(_), Some(d)) => d.saturating_duration_since(Instant::now()),
                _ => Duration::MAX,
            };
            if left.is_zero() {
                // One more pass through the ring (if nobody else is reading it), then give up.
                last_pass = true;
            }
            if st.polling {
                if last_pass {
                    return Ok(None);
                }
                st.followers += 1;
                let (mut g, _) = self
                    .cv
                    .wait_timeout(st, left.min(FOLLOWER_SLICE))
                    .unwrap_or_else(PoisonError::into_inner);
                g.followers -= 1;
                drop(g);
                continue;
            }
            st.polling = true;
            drop(st);
            let slice = left.min(cap.unwrap_or(Duration::MAX)).min(LIVENESS_SLICE);
            let r = self.lead(slice);
            let followers = {
                let mut st = lock(&self.state);
                st.polling = false;
                st.followers
            };
            // Waking nobody would still cost a futex system call per batch.
            if followers > 0 {
                self.cv.notify_all();
            }
            if let Err(e) = r {
                if matches!(e, Error::Corrupt(_) | Error::Disconnected) {
                    self.mark_broken(&e);
                }
                return Err(e);
            }
        }
    }

    /// One step of the leader: drain the completion ring; if it was empty, wait up to
    /// `slice` (spin, then sleep) for completions and drain those.
    fn lead(&self, slice: Duration) -> Result<()> {
        let mut p = lock(&self.cpl);
        if self.drain(&mut p)? > 0 {
            return Ok(());
        }
        if slice.is_zero() {
            // A program that only polls (a libfabric provider's progress, an MPI
            // library's) never waits on the doorbell, where a closed daemon shows: it
            // looks at the daemon itself once per liveness slice instead.
            self.check_alive(&mut p)?;
            return Ok(());
        }
        let waiter = Waiter::new(self.spin());
        let started = Instant::now();
        let ready = match p
            .cons
            .wait_readable(&waiter, &self.from_daemon, Some(slice))
        {
            Ok(r) => r,
            Err(WaitError::Ring(e)) => return Err(corrupt(e)),
            // The daemon closed its end: the session is over. What it completed before is
            // still in the ring; hand that out first.
            Err(WaitError::Doorbell(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.drain(&mut p)?;
                return Err(Error::Disconnected);
            }
            Err(WaitError::Doorbell(e)) => {
                return Err(Error::Io {
                    op: "waiting on the doorbell",
                    source: e,
                })
            }
            Err(e) => {
                return Err(Error::Io {
                    op: "waiting on the doorbell",
                    source: std::io::Error::other(e.to_string()),
                })
            }
        };
        if started.elapsed() > waiter.spin() {
            lock(&self.state).stats.sleeps += 1;
        }
        if ready {
            self.drain(&mut p)?;
        } else {
            self.check_alive(&mut p)?;
        }
        Ok(())
    }

    /// Asks whether the daemon is still there, at most once per liveness slice.
    fn check_alive(&self, p: &mut Poller) -> Result<()> {
        if p.last_alive_check.elapsed() >= LIVENESS_SLICE {
            p.last_alive_check = Instant::now();
            // Skip the check if a control request is going on: it will notice.
            if let Ok(mut c) = self.ctrl.try_lock() {
                c.check_alive()?;
            }
        }
        Ok(())
    }

    /// Moves everything in the completion ring into the client-side queues.
    fn drain(&self, p: &mut Poller) -> Result<usize> {
        let mut buf = [0u8; RING_SLOT_SIZE as usize];
        let mut total = 0;
        loop {
            let mut failure = None;
            while p.batch.len() < BATCH {
                match p.cons.pop(&mut buf) {
                    // `decode` refuses slots of the wrong size too.
                    Ok(Some(n)) => match Completion::decode(&buf[..n]) {
                        Ok(c) => p.batch.push(c),
                        Err(e) => {
                            failure = Some(Error::Corrupt(format!("completion slot: {e}")));
                            break;
                        }
                    },
                    Ok(None) => break,
                    Err(e) => {
                        failure = Some(corrupt(e));
                        break;
                    }
                }
            }
            let n = p.batch.len();
            total += n;
            if n > 0 {
                let mut st = lock(&self.state);
                for c in p.batch.drain(..) {
                    st.dispatch(c);
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            if n < BATCH {
                return Ok(total);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command on a channel comes after the completion that freed it: the program
    /// waited for that channel. A collective's channel is its own, never used again, so
    /// nothing is kept of it.
    #[test]
    fn a_channel_reused_moves_the_clock_to_the_completion_that_freed_it() {
        let mut st = State::default();
        let ch = Chan::Packetizer { vi: 0, ch: 0 };
        let tag = st.start(ch).unwrap();
        assert!(st.start(ch).is_err(), "busy until its completion");
        st.finish(tag, Ok(()), ModelTime(500));
        st.clock = ModelTime(100);
        st.start(ch).unwrap();
        assert_eq!(st.clock, ModelTime(500));
        // Freed before the clock: the clock stays.
        let tag = st.start(Chan::Packetizer { vi: 0, ch: 1 }).unwrap();
        st.finish(tag, Ok(()), ModelTime(200));
        st.start(Chan::Packetizer { vi: 0, ch: 1 }).unwrap();
        assert_eq!(st.clock, ModelTime(500));
        let tag = st.start(Chan::Collective { id: 7 }).unwrap();
        st.finish(tag, Ok(()), ModelTime(900));
        assert!(!st.freed.contains_key(&Chan::Collective { id: 7 }));
        assert_eq!(st.clock, ModelTime(500));
    }
}
