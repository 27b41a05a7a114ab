//! Completion queues. Progress is manual (`FI_PROGRESS_MANUAL`): reading a queue makes
//! progress on every endpoint bound to it first, so an application that only polls its
//! completion queues, as MPI libraries do, keeps its messages moving.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// What a completion queue makes progress on when it is read: its bound endpoints.
pub trait Progress: Send + Sync {
    /// Marks the time until the guard drops as the provider's, not the application's
    /// compute (`exanet::Endpoint::hold`).
    fn hold(&self) -> exanet::Held<'_>;
    fn progress(&self);
    /// The application found nothing and polls again: it waits, it does not compute.
    fn idle(&self);
    /// The application found completions: it computes again after the call it is in,
    /// whatever its earlier polls inside that call said.
    fn busy(&self);
    /// How many NI completions the endpoint's attachment has seen (a wait's starting point).
    fn events(&self) -> u64;
    /// Whether a completion is on its way to the endpoint: its own RDMA read in progress,
    /// or a FIN for a send whose data a receiver is reading.
    fn expecting(&self) -> bool;
    /// Sleeps until the attachment sees more than `seen` completions (true), or
    /// `timeout` (false).
    fn wait(&self, seen: u64, timeout: Duration) -> bool;
}

/// An empty read that comes this soon after the last one returned empty is the MPI
/// library's own loop (MPI_Wait and its kin: a few microseconds around each read), not an
/// application that tests now and then between pieces of its own work.
const POLLING_GAP: Duration = Duration::from_micros(20);

/// Empty reads in such a loop before a read sleeps, at first and at least.
const STREAK_MIN: u32 = 8;

/// The most: a sleep that nothing woke doubles the streak a read needs, one that a
/// completion ended halves it. An application that polls between small pieces of its
/// own work (hpcc's MPIRandomAccess) looks like a waiting MPI library from here, but no
/// completion comes to end its sleeps: with a fixed streak of 8, 93% of its sleeps ran
/// the full millisecond and MPIRandomAccess took 59 to 65 s instead of 8.5 (hpcc, 4 ranks).
const STREAK_MAX: u32 = 1 << 14;

/// Sleeps in a row that nothing woke before the streak a read needs doubles.
const MISSES: u32 = 4;

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

/// What the program's modeled clock owes a completion (its event's time), paid when a
/// read hands the completion to the program, not when progress queued it: progress runs
/// in any call, and paid there the clock would move before the program's next post or
/// not with the host's timing.
///
/// One operation's charge may be held by its completion queue and by counters at once
/// (the program learns of it from whichever it reads first): clones share it, and only
/// the first [`Charge::pay`] pays (taking a message twice would count the software's
/// cost of taking it twice).
#[derive(Clone)]
pub struct Charge(Arc<Mutex<Option<Payment>>>);

/// What paying a [`Charge`] does: moves the program's modeled clock.
type Payment = Box<dyn FnOnce() + Send>;

impl Charge {
    pub fn new(pay: impl FnOnce() + Send + 'static) -> Charge {
        Charge(Arc::new(Mutex::new(Some(Box::new(pay)))))
    }

    /// Whether it was paid (by this or a clone).
    pub fn is_paid(&self) -> bool {
        lock(&self.0).is_none()
    }

    /// Pays the charge, unless a clone of it already did.
    pub fn pay(&self) {
        let pay = lock(&self.0).take();
        if let Some(pay) = pay {
            pay();
        }
    }
}

enum Entry {
    Done(Completion, Option<Charge>),
    Failed(Failed),
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::Done(c, charge) => f
                .debug_tuple("Done")
                .field(c)
                .field(&charge.as_ref().map(|_| "charge"))
                .finish(),
            Entry::Failed(x) => f.debug_tuple("Failed").field(x).finish(),
        }
    }
}

/// What a read in a polling loop does when nothing comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Sleeps on the attachment's doorbell: the cores go to the daemons.
    Sleep,
    /// Gives the core away and returns, as a polling core would, as ExaNeSt's cores did.
    /// After a sleep, Open MPI's own processing of each message took more CPU time (cold
    /// caches, presumably), and that CPU time is modeled compute: an 8 B ping-pong
    /// modeled 8.3 to 9.2 us one-way sleeping against 5.3 to 5.4 polling in a debug
    /// build, 3.0 to 3.1 against 2.5 to 3.0 in a release one.
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

/// Empty reads in a row, as one polling loop.
#[derive(Debug)]
struct Polling {
    /// When the last read that found nothing returned.
    last_empty: Option<Instant>,
    /// Empty reads in a row, each within [`POLLING_GAP`] of the one before.
    streak: u32,
    /// The streak a read needs to sleep (see [`STREAK_MAX`]).
    needed: u32,
    /// Sleeps in a row that nothing woke.
    misses: u32,
}

impl Default for Polling {
    fn default() -> Polling {
        Polling {
            last_empty: None,
            streak: 0,
            needed: STREAK_MIN,
            misses: 0,
        }
    }
}

impl Polling {
    /// A read found something: the loop, if there was one, is over.
    fn found(&mut self) {
        self.last_empty = None;
        self.streak = 0;
    }

    /// A read slept; `woken`: a completion ended it; `expected`: one is on its way (an
    /// RDMA read in progress, a FIN), so a sleep it did not end yet says nothing.
    fn slept(&mut self, woken: bool, expected: bool) {
        if woken {
            self.misses = 0;
            self.needed = (self.needed / 2).max(STREAK_MIN);
        } else if !expected {
            // A long wait (a 4 MiB read, a peer the host has not run) lets a few sleeps
            // run out before its completion comes; only a run of them says nobody waits.
            self.misses += 1;
            if self.misses >= MISSES {
                self.misses = 0;
                self.needed = self.needed.saturating_mul(2).min(STREAK_MAX);
            }
        }
        self.streak = 0;
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

/// The endpoints a completion queue or a counter makes progress on when it is read,
/// each once, held weakly: a closed endpoint drops out.
#[derive(Debug, Default)]
pub struct Bound(Mutex<Vec<Weak<dyn Progress>>>);

impl Bound {
    pub fn bind(&self, ep: Weak<dyn Progress>) {
        let mut l = lock(&self.0);
        l.retain(|w| w.strong_count() > 0);
        if !l.iter().any(|w| w.ptr_eq(&ep)) {
            l.push(ep);
        }
    }

    pub fn endpoints(&self) -> Vec<std::sync::Arc<dyn Progress>> {
        let mut l = lock(&self.0);
        l.retain(|w| w.strong_count() > 0);
        l.iter().filter_map(Weak::upgrade).collect()
    }
}

#[derive(Debug)]
pub struct Cq {
    pub format: i32,
    queue: Mutex<VecDeque<Entry>>,
    endpoints: Bound,
    /// How the application has been polling.
    polling: Mutex<Polling>,
    idle: Idle,
    /// `fi_cq_signal` came: the next blocking read, or the one under way, returns.
    signalled: std::sync::atomic::AtomicBool,
}

/// A lock, taken even if a thread panicked while holding it: the provider's state stays
/// usable (whatever it guards is updated whole under it).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cq {
    /// `fi_cq_signal`: wakes a thread blocked in `fi_cq_sread`, or the next one to
    /// block if none is (a signal sent just before the read must not be lost).
    pub fn signal(&self) {
        self.signalled
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Takes a pending signal.
    pub fn take_signal(&self) -> bool {
        self.signalled
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    pub fn new(format: i32, idle: Idle) -> Cq {
        Cq {
            format,
            queue: Mutex::new(VecDeque::new()),
            endpoints: Bound::default(),
            polling: Mutex::new(Polling::default()),
            idle,
            signalled: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn bind(&self, ep: Weak<dyn Progress>) {
        self.endpoints.bind(ep);
    }

    pub fn done(&self, c: Completion) {
        lock(&self.queue).push_back(Entry::Done(c, None));
    }

    /// [`Cq::done`], with what the program's clock owes it when a read returns it.
    pub fn done_charged(&self, c: Completion, charge: Option<Charge>) {
        lock(&self.queue).push_back(Entry::Done(c, charge));
    }

    pub fn failed(&self, f: Failed) {
        lock(&self.queue).push_back(Entry::Failed(f));
    }

    /// Up to `max` completions, oldest first, stopping before a failure, after progress
    /// on the bound endpoints.
    ///
    /// `blocked`: the caller is blocked in the provider until something comes
    /// (`fi_cq_sread`), so an empty read is waiting whatever came before it; otherwise
    /// only an empty read soon after another one is (a library's wait loop).
    pub fn read(&self, max: usize, blocked: bool) -> Result<Vec<Completion>, Empty> {
        let start = Instant::now();
        let eps = self.endpoints.endpoints();
        // The whole read is the provider's time, not only its progress: the bookkeeping
        // around it counted as the application's compute, a few microseconds a message
        // in a debug build, enough to move a modeled 8 B one-way by half.
        let _held: Vec<exanet::Held<'_>> = eps.iter().map(|ep| ep.hold()).collect();
        // Taken before progress, so that a completion between the progress and a sleep
        // below ends the sleep at once instead of being slept through.
        let seen: Vec<u64> = eps.iter().map(|ep| ep.events()).collect();
        for ep in &eps {
            ep.progress();
        }
        let out = self.take(max)?;
        if !out.is_empty() {
            lock(&self.polling).found();
            for ep in &eps {
                ep.busy();
            }
            return Ok(out);
        }
        let (looping, again) = {
            let mut p = lock(&self.polling);
            p.streak = match p.last_empty {
                Some(t) if start.saturating_duration_since(t) < POLLING_GAP => p.streak + 1,
                _ => 0,
            };
            (p.streak >= p.needed, p.streak > 0)
        };
        match (&eps[..], looping) {
            // An MPI library waiting polls again at once, without end. On a host whose
            // cores it shares with the daemons that carry its messages, its spinning is
            // what delays them: sleep on the attachment's doorbell until something comes.
            ([ep], true) if self.idle == Idle::Sleep => {
                let woken = ep.wait(seen[0], LOOP_SLEEP);
                // A sleep through part of a long read (4 MiB take milliseconds, on
                // either side) was still a wait for a completion that comes.
                lock(&self.polling).slept(woken, ep.expecting());
                for ep in &eps {
                    ep.progress();
                }
            }
            // The first empty poll, or several endpoints (one doorbell each): give the
            // core away once, as Open MPI's mpi_yield_when_idle does for its transports.
            _ => std::thread::yield_now(),
        }
        let out = self.take(max)?;
        {
            let mut p = lock(&self.polling);
            if out.is_empty() {
                p.last_empty = Some(Instant::now());
            } else {
                p.found();
            }
        }
        if out.is_empty() {
            // Nothing came again: until the next poll the application waits, it does not
            // compute (its polling loop's CPU must not move the modeled clock). Said
            // under the holds, it holds from where they end. Not the first empty read
            // after others: an MPI library drains the queue until a read finds nothing
            // (Open MPI's progress does), and what follows that is the program's again.
            if again || blocked {
                for ep in &eps {
                    ep.idle();
                }
            }
            Err(Empty::Again)
        } else {
            for ep in &eps {
                ep.busy();
            }
            Ok(out)
        }
    }

    /// Up to `max` queued completions, oldest first, stopping before a failure.
    /// Their charges are paid, in order, outside the queue's lock.
    fn take(&self, max: usize) -> Result<Vec<Completion>, Empty> {
        let mut out = Vec::new();
        let mut charges = Vec::new();
        {
            let mut q = lock(&self.queue);
            while out.len() < max {
                match q.front() {
                    Some(Entry::Done(..)) => {
                        if let Some(Entry::Done(c, charge)) = q.pop_front() {
                            out.push(c);
                            charges.extend(charge);
                        }
                    }
                    Some(Entry::Failed(_)) if out.is_empty() => return Err(Empty::Failure),
                    _ => break,
                }
            }
        }
        for charge in charges {
            charge.pay();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What a completion owes the program's clock is paid when a read hands it over, in
    /// order, and not while it waits in the queue (progress queued it in some other
    /// call, at the host's moment).
    #[test]
    fn a_completion_charges_the_clock_when_a_read_returns_it_not_when_queued() {
        let cq = Cq::new(0, Idle::Poll);
        let paid = Arc::new(Mutex::new(Vec::new()));
        let charge = |n: u64| -> Charge {
            let paid = paid.clone();
            Charge::new(move || lock(&paid).push(n))
        };
        let entry = |context| Completion {
            context,
            ..Completion::default()
        };
        cq.done(entry(1));
        cq.done_charged(entry(2), Some(charge(2)));
        cq.done_charged(entry(3), Some(charge(3)));
        cq.failed(Failed {
            entry: entry(4),
            olen: 0,
            err: 5,
        });
        assert!(lock(&paid).is_empty(), "queued, not read");
        let got = cq.read(2, false).unwrap();
        assert_eq!(got.iter().map(|c| c.context).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(*lock(&paid), [2]);
        let got = cq.read(8, false).unwrap();
        assert_eq!(got.iter().map(|c| c.context).collect::<Vec<_>>(), [3]);
        assert_eq!(*lock(&paid), [2, 3]);
        assert!(matches!(cq.read(8, false), Err(Empty::Failure)));
        assert_eq!(cq.read_failure().map(|f| f.entry.context), Some(4));
    }

    #[test]
    fn a_charge_held_in_two_places_is_paid_once() {
        let paid = Arc::new(Mutex::new(0));
        let p = paid.clone();
        let charge = Charge::new(move || *lock(&p) += 1);
        let other = charge.clone();
        other.pay();
        charge.pay();
        other.pay();
        assert_eq!(*lock(&paid), 1);
    }

    #[test]
    fn sleeps_nothing_wakes_raise_the_streak_and_woken_ones_lower_it() {
        let mut p = Polling::default();
        assert_eq!(p.needed, STREAK_MIN);
        // A long wait: a few sleeps run out, then a completion ends one.
        for _ in 0..MISSES - 1 {
            p.slept(false, false);
        }
        assert_eq!(p.needed, STREAK_MIN);
        p.slept(true, false);
        assert_eq!((p.needed, p.misses), (STREAK_MIN, 0));
        // Sleeps through a long read say nothing.
        for _ in 0..MISSES * 4 {
            p.slept(false, true);
        }
        assert_eq!((p.needed, p.misses), (STREAK_MIN, 0));
        // Nobody waits: runs of sleeps that nothing wakes back the sleeping off, to the
        // most.
        for _ in 0..MISSES * 20 {
            p.slept(false, false);
        }
        assert_eq!(p.needed, STREAK_MAX);
        // Completions ending sleeps bring it back down, halving.
        p.slept(true, false);
        assert_eq!(p.needed, STREAK_MAX / 2);
        for _ in 0..20 {
            p.slept(true, false);
        }
        assert_eq!(p.needed, STREAK_MIN);
        // A read that finds something ends the streak, not what was learnt.
        p.streak = 5;
        p.needed = 64;
        p.found();
        assert_eq!((p.streak, p.needed, p.last_empty), (0, 64, None));
    }
}
