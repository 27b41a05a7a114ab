//! Completion counters (`fi_cntr`): how many operations of the kinds bound to a counter
//! completed, and how many failed. Progress is manual, as for completion queues: reading
//! a counter or waiting on it makes progress on the endpoints bound to it first. MPICH's
//! ch4:ofi opens one for its one-sided operations whether the program makes any or not.
//!
//! A counter is also how the program learns when what it counts happened: a read that
//! returns a count pays the modeled clock what the operations counted so far owe it (see
//! [`Charge`]), as a completion queue's read pays for the completions it returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use crate::cq::{lock, Bound, Charge, Progress};

/// Charges a counter keeps before it drops those paid meanwhile.
const OWED_PRUNE: usize = 256;

/// How long a wait sleeps on an endpoint's doorbell between looks.
const WAIT_SLICE: Duration = Duration::from_millis(1);

#[derive(Default)]
pub struct Cntr {
    value: AtomicU64,
    errors: AtomicU64,
    endpoints: Bound,
    /// What the operations counted and not yet seen by a read owe the program's clock.
    /// Pushed before the count goes up and taken by a read that loads the count, both
    /// under this lock, so that a read pays for every operation its count includes.
    owed: Mutex<Vec<Charge>>,
}

/// Why a wait ended without the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    /// An operation failed meanwhile (`-FI_EAVAIL`).
    Failed,
    /// The time ran out (`-FI_ETIMEDOUT`).
    TimedOut,
}

impl Cntr {
    pub fn bind(&self, ep: Weak<dyn Progress>) {
        self.endpoints.bind(ep);
    }

    fn progress(&self) {
        for ep in self.endpoints.endpoints() {
            ep.progress();
        }
    }

    /// An operation of a kind bound to the counter completed (`ok`) or failed, owing the
    /// program's clock `charge` once the program learns of it.
    pub fn count(&self, ok: bool, charge: Option<Charge>) {
        let mut owed = lock(&self.owed);
        // Paid already (a completion read first, a failure as it came): nothing owed. A
        // counter nobody reads would otherwise keep every charge its completions paid.
        if owed.len() >= OWED_PRUNE {
            owed.retain(|c| !c.is_paid());
        }
        owed.extend(charge.filter(|c| !c.is_paid()));
        let c = if ok { &self.value } else { &self.errors };
        c.fetch_add(1, Ordering::AcqRel);
    }

    /// Loads `which` and pays what the operations it counts owe.
    fn observe(&self, which: &AtomicU64) -> u64 {
        let (v, owed) = {
            let mut owed = lock(&self.owed);
            (which.load(Ordering::Acquire), std::mem::take(&mut *owed))
        };
        for charge in owed {
            charge.pay();
        }
        v
    }

    pub fn read(&self) -> u64 {
        self.progress();
        self.observe(&self.value)
    }

    pub fn read_errors(&self) -> u64 {
        self.progress();
        self.observe(&self.errors)
    }

    pub fn add(&self, v: u64) {
        self.value.fetch_add(v, Ordering::AcqRel);
    }

    pub fn set(&self, v: u64) {
        self.value.store(v, Ordering::Release);
    }

    pub fn add_errors(&self, v: u64) {
        self.errors.fetch_add(v, Ordering::AcqRel);
    }

    pub fn set_errors(&self, v: u64) {
        self.errors.store(v, Ordering::Release);
    }

    /// Waits until the count reaches `threshold`, an operation fails, or `timeout` (none:
    /// no limit) passes, making progress meanwhile.
    pub fn wait(&self, threshold: u64, timeout: Option<Duration>) -> Result<(), WaitEnd> {
        let start = Instant::now();
        let errors = self.errors.load(Ordering::Acquire);
        loop {
            let eps = self.endpoints.endpoints();
            let seen: Vec<u64> = eps.iter().map(|ep| ep.events()).collect();
            for ep in &eps {
                ep.progress();
            }
            // The caller learns the count only from a wait that ends with it.
            if self.value.load(Ordering::Acquire) >= threshold {
                self.observe(&self.value);
                return Ok(());
            }
            if self.errors.load(Ordering::Acquire) != errors {
                self.observe(&self.errors);
                return Err(WaitEnd::Failed);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Err(WaitEnd::TimedOut),
                },
                None => WAIT_SLICE,
            };
            let slice = left.min(WAIT_SLICE);
            match (&eps[..], &seen[..]) {
                // One endpoint: sleep on its doorbell until something comes.
                ([ep], [seen]) => {
                    ep.wait(*seen, slice);
                }
                _ => std::thread::sleep(slice.min(Duration::from_micros(50))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// An endpoint whose operations complete as its progress is called.
    struct Fake {
        cntr: Arc<Cntr>,
        pending: Mutex<Vec<bool>>,
    }

    impl Progress for Fake {
        fn hold(&self) -> exanet::Held<'_> {
            unreachable!("counters do not hold")
        }
        fn progress(&self) {
            let done: Vec<bool> = std::mem::take(&mut *self.pending.lock().unwrap());
            for ok in done {
                self.cntr.count(ok, None);
            }
        }
        fn idle(&self) {}
        fn busy(&self) {}
        fn events(&self) -> u64 {
            0
        }
        fn expecting(&self) -> bool {
            false
        }
        fn wait(&self, _: u64, timeout: Duration) -> bool {
            std::thread::sleep(timeout);
            false
        }
    }

    #[test]
    fn a_counter_counts_what_progress_completes_and_waits_for_it() {
        let cntr = Arc::new(Cntr::default());
        let fake = Arc::new(Fake {
            cntr: Arc::clone(&cntr),
            pending: Mutex::new(vec![true, true]),
        });
        let ep: Arc<dyn Progress> = fake.clone();
        cntr.bind(Arc::downgrade(&ep));
        assert_eq!(cntr.read(), 2, "reading made progress");
        assert_eq!(cntr.wait(2, Some(Duration::ZERO)), Ok(()));
        assert_eq!(
            cntr.wait(3, Some(Duration::from_millis(5))),
            Err(WaitEnd::TimedOut)
        );
        fake.pending.lock().unwrap().push(false);
        assert_eq!(cntr.wait(3, None), Err(WaitEnd::Failed));
        assert_eq!(cntr.read_errors(), 1);
        cntr.add(5);
        assert_eq!(cntr.read(), 7);
        cntr.set(1);
        cntr.set_errors(0);
        cntr.add_errors(2);
        assert_eq!((cntr.read(), cntr.read_errors()), (1, 2));
        drop(ep);
        drop(fake);
        // Its endpoints gone, a counter still answers.
        assert_eq!(cntr.read(), 1);
    }

    /// What a counted operation owes the clock is paid by the read or the wait that
    /// returns a count including it, not when progress counted it, and once.
    #[test]
    fn a_read_pays_for_what_its_count_includes() {
        let cntr = Cntr::default();
        let paid = Arc::new(Mutex::new(Vec::new()));
        let charge = |n: u64| {
            let paid = paid.clone();
            Some(Charge::new(move || paid.lock().unwrap().push(n)))
        };
        cntr.count(true, charge(1));
        cntr.count(false, charge(2));
        assert!(paid.lock().unwrap().is_empty(), "counted, not read");
        assert_eq!(cntr.read(), 1);
        assert_eq!(*paid.lock().unwrap(), [1, 2]);
        assert_eq!(cntr.read_errors(), 1);
        assert_eq!(*paid.lock().unwrap(), [1, 2], "paid once");
        // A wait that times out short of its count told the program nothing.
        let shared = charge(3);
        cntr.count(true, shared.clone());
        assert_eq!(
            cntr.wait(5, Some(Duration::from_millis(2))),
            Err(WaitEnd::TimedOut)
        );
        assert_eq!(*paid.lock().unwrap(), [1, 2]);
        // The completion queue paid the same operation's charge first: not again.
        shared.unwrap().pay();
        assert_eq!(cntr.wait(2, None), Ok(()));
        assert_eq!(*paid.lock().unwrap(), [1, 2, 3]);
    }
}
