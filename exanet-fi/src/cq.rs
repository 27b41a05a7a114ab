//! Completion queues. Progress is manual (`FI_PROGRESS_MANUAL`): reading a queue makes
//! progress on every endpoint bound to it first, so an application that only polls its
//! completion queues, as MPI libraries do, keeps its messages moving.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// What a completion queue makes progress on when it is read: its bound endpoints.
pub trait Progress: Send + Sync {
    fn progress(&self);
    /// The application found nothing and polls again: it waits, it does not compute.
    fn idle(&self);
    /// How many NI completions the endpoint's attachment has seen (a wait's starting point).
    fn events(&self) -> u64;
    /// Sleeps until the attachment sees more than `seen` completions, or `timeout`.
    fn wait(&self, seen: u64, timeout: Duration);
}

/// Empty reads closer together than this are a polling loop (MPI_Wait and its kin), not an
/// application that tests now and then between its own work.
const POLLING_LOOP: Duration = Duration::from_micros(200);

/// How long a read in a polling loop sleeps on the doorbell when nothing comes: a message
/// wakes it at once, so this bounds only how late it sees work that rings no doorbell.
const LOOP_SLEEP: Duration = Duration::from_millis(1);

/// One completion, in the widest format (`struct fi_cq_tagged_entry`) plus the source's
/// `fi_addr_t` for `fi_cq_readfrom`; narrower formats are prefixes of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    pub context: usize,
    pub flags: u64,
    pub len: usize,
    pub buf: usize,
    pub data: u64,
    pub tag: u64,
    pub src: u64,
}

/// A failed operation: its completion, how much did not fit (`olen`), and the positive
/// libfabric error number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Failed {
    pub entry: Completion,
    pub olen: usize,
    pub err: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Done(Completion),
    Failed(Failed),
}

/// What a read in a polling loop does when nothing comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Sleeps on the attachment's doorbell: the cores go to the daemons.
    Sleep,
    /// Gives the core away and returns, as a polling core would: what the application
    /// does between polls then runs with warm caches, as on ExaNeSt's cores, which
    /// polled. After a sleep, Open MPI's own processing of an 8 B message took 2-3 times
    /// the CPU time (cold caches; 5.4 vs 9.2 us modeled one-way in a debug build, 2.5-3.0
    /// vs 3.0-3.1 us in a release build), and that CPU time is modeled compute.
    Poll,
}

impl Idle {
    /// `FI_EXANET_IDLE`: `sleep` (the default) or `poll` (what `exactl mpirun --modeled`
    /// sets).
    pub const ENV: &'static str = "FI_EXANET_IDLE";

    pub fn from_env() -> Idle {
        match std::env::var(Self::ENV).as_deref() {
            Ok("poll") => Idle::Poll,
            Ok("sleep") | Err(_) => Idle::Sleep,
            Ok(other) => {
                tracing::warn!(
                    "exanet-fi: {}={other:?} is neither sleep nor poll: sleep",
                    Self::ENV
                );
                Idle::Sleep
            }
        }
    }
}

/// Why a read returned nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Empty {
    /// Nothing completed (`-FI_EAGAIN`).
    Again,
    /// A failure is next: read it with `fi_cq_readerr` (`-FI_EAVAIL`).
    Failure,
}

#[derive(Debug)]
pub struct Cq {
    pub format: i32,
    queue: Mutex<VecDeque<Entry>>,
    endpoints: Mutex<Vec<Weak<dyn Progress>>>,
    /// When the last read that found nothing returned.
    last_empty: Mutex<Option<Instant>>,
    idle: Idle,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cq {
    pub fn new(format: i32, idle: Idle) -> Cq {
        Cq {
            format,
            queue: Mutex::new(VecDeque::new()),
            endpoints: Mutex::new(Vec::new()),
            last_empty: Mutex::new(None),
            idle,
        }
    }

    pub fn bind(&self, ep: Weak<dyn Progress>) {
        lock(&self.endpoints).push(ep);
    }

    pub fn done(&self, c: Completion) {
        lock(&self.queue).push_back(Entry::Done(c));
    }

    pub fn failed(&self, f: Failed) {
        lock(&self.queue).push_back(Entry::Failed(f));
    }

    fn endpoints(&self) -> Vec<std::sync::Arc<dyn Progress>> {
        let mut l = lock(&self.endpoints);
        l.retain(|w| w.strong_count() > 0);
        l.iter().filter_map(Weak::upgrade).collect()
    }

    /// Up to `max` completions, oldest first, stopping before a failure, after progress
    /// on the bound endpoints.
    pub fn read(&self, max: usize) -> Result<Vec<Completion>, Empty> {
        let eps = self.endpoints();
        // Taken before progress, so that a completion between the progress and a sleep
        // below ends the sleep at once instead of being slept through.
        let seen: Vec<u64> = eps.iter().map(|ep| ep.events()).collect();
        for ep in &eps {
            ep.progress();
        }
        let out = self.take(max)?;
        if !out.is_empty() {
            *lock(&self.last_empty) = None;
            return Ok(out);
        }
        // Nothing came: until the next poll the application waits, it does not compute
        // (its polling loop's CPU must not move the modeled clock).
        for ep in &eps {
            ep.idle();
        }
        let now = Instant::now();
        let looping = lock(&self.last_empty).is_some_and(|t| now - t < POLLING_LOOP);
        match (&eps[..], looping) {
            // An MPI library waiting polls again at once, without end. On a host whose
            // cores it shares with the daemons that carry its messages, its spinning is
            // what delays them: sleep on the attachment's doorbell until something comes.
            ([ep], true) if self.idle == Idle::Sleep => {
                ep.wait(seen[0], LOOP_SLEEP);
                for ep in &eps {
                    ep.progress();
                }
            }
            // The first empty poll, or several endpoints (one doorbell each): give the
            // core away once, as Open MPI's mpi_yield_when_idle does for its transports.
            _ => std::thread::yield_now(),
        }
        let out = self.take(max)?;
        *lock(&self.last_empty) = out.is_empty().then(Instant::now);
        if out.is_empty() {
            // The progress after a sleep left the library again: what the application
            // does until its next poll is still waiting.
            for ep in &eps {
                ep.idle();
            }
            Err(Empty::Again)
        } else {
            Ok(out)
        }
    }

    /// Up to `max` queued completions, oldest first, stopping before a failure.
    fn take(&self, max: usize) -> Result<Vec<Completion>, Empty> {
        let mut q = lock(&self.queue);
        let mut out = Vec::new();
        while out.len() < max {
            match q.front() {
                Some(Entry::Done(c)) => {
                    out.push(*c);
                    q.pop_front();
                }
                Some(Entry::Failed(_)) if out.is_empty() => return Err(Empty::Failure),
                _ => break,
            }
        }
        Ok(out)
    }

    /// The failure at the head of the queue, if one is.
    pub fn read_failure(&self) -> Option<Failed> {
        let mut q = lock(&self.queue);
        match q.front() {
            Some(Entry::Failed(f)) => {
                let f = *f;
                q.pop_front();
                Some(f)
            }
            _ => None,
        }
    }
}
