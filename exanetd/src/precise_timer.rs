//! Sub-millisecond wake-ups for shaped links. tokio's timer wheel has a resolution of one
//! millisecond, so a link delayed by 200 µs would deliver after 1-2 ms, and a 2 ms delay
//! after up to 3 ms: not the link the operator asked for. One thread per daemon sleeps on
//! a condition variable (a futex wait with a nanosecond deadline, tens of microseconds of
//! slack) until the earliest registered deadline and wakes the tasks whose time has come.
//! It exists only once some link is shaped, and sleeps without a deadline when none is.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::Notify;

struct Entry {
    at: Instant,
    seq: u64,
    wake: Arc<Notify>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

impl State {
    /// Registers `wake` for `at`; true when it is now the earliest deadline (the timer
    /// thread must shorten its sleep).
    fn push(&mut self, at: Instant, wake: Arc<Notify>) -> bool {
        self.seq += 1;
        let seq = self.seq;
        let sooner = self.next().is_none_or(|next| at < next);
        self.heap.push(Reverse(Entry { at, seq, wake }));
        sooner
    }

    /// The earliest deadline registered.
    fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// Takes the next entry whose deadline is at or before `now`, earliest first.
    fn pop_due(&mut self, now: Instant) -> Option<Arc<Notify>> {
        if self.next()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse(e)| e.wake)
    }
}

/// How long before a deadline the timer stops sleeping and spins. Spinning costs CPU
/// only while some shaped link holds frames.
const SPIN: std::time::Duration = std::time::Duration::from_micros(80);

pub struct PreciseTimer {
    state: Mutex<State>,
    cv: Condvar,
}

impl PreciseTimer {
    /// The daemon's timer, its thread started on first use.
    pub fn get() -> &'static Arc<PreciseTimer> {
        static TIMER: OnceLock<Arc<PreciseTimer>> = OnceLock::new();
        TIMER.get_or_init(|| {
            let t = Arc::new(PreciseTimer {
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
            });
            let t2 = t.clone();
            // If the thread cannot start, wake-ups fall back to the caller's own timer
            // (see `wake_at`'s users), a millisecond coarser.
            let _ = std::thread::Builder::new()
                .name("exanet-timer".into())
                .spawn(move || t2.run());
            t
        })
    }

    /// Notifies `wake` at `at` (at once if `at` has passed).
    pub fn wake_at(&self, at: Instant, wake: Arc<Notify>) {
        if at <= Instant::now() {
            wake.notify_one();
            return;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let sooner = st.push(at, wake);
        drop(st);
        if sooner {
            self.cv.notify_one();
        }
    }

    fn run(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            while let Some(wake) = st.pop_due(now) {
                wake.notify_one();
            }
            st = match st.next() {
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left <= SPIN {
                        // The kernel's timer slack and the wake-up itself cost tens of
                        // microseconds: the last stretch is spun, unlocked.
                        drop(st);
                        while Instant::now() < at {
                            std::hint::spin_loop();
                        }
                        self.state.lock().unwrap_or_else(|p| p.into_inner())
                    } else {
                        self.cv
                            .wait_timeout(st, left - SPIN)
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                    }
                }
                None => self.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn wakes_in_deadline_order_and_not_before() {
        let t = PreciseTimer::get();
        let a = Arc::new(Notify::new());
        let b = Arc::new(Notify::new());
        let t0 = Instant::now();
        t.wake_at(t0 + Duration::from_millis(30), a.clone());
        t.wake_at(t0 + Duration::from_millis(10), b.clone());
        b.notified().await;
        let tb = t0.elapsed();
        a.notified().await;
        let ta = t0.elapsed();
        assert!(tb >= Duration::from_millis(10), "{tb:?}");
        assert!(ta >= Duration::from_millis(30), "{ta:?}");
        // A deadline already past wakes at once.
        let c = Arc::new(Notify::new());
        t.wake_at(t0, c.clone());
        c.notified().await;
    }

    /// The order itself, without the clock: what is due goes earliest first and nothing
    /// later goes with it (a heap kept the wrong way round woke the 10 ms entry only
    /// behind the 30 ms one, which the timed test above cannot tell from a slow host).
    #[test]
    fn due_entries_come_out_earliest_first_and_only_when_due() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let (a, b, c) = (
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        let mut st = State::default();
        assert!(
            st.push(ms(30), a.clone()),
            "the first deadline is the earliest"
        );
        assert!(
            st.push(ms(10), b.clone()),
            "an earlier one shortens the sleep"
        );
        assert!(!st.push(ms(20), c.clone()), "a later one does not");
        assert_eq!(st.next(), Some(ms(10)));
        assert!(st.pop_due(ms(9)).is_none(), "nothing is due before 10 ms");
        let got = st.pop_due(ms(25)).expect("10 ms is due at 25 ms");
        assert!(Arc::ptr_eq(&got, &b));
        let got = st.pop_due(ms(25)).expect("20 ms is due at 25 ms");
        assert!(Arc::ptr_eq(&got, &c));
        assert!(st.pop_due(ms(25)).is_none(), "30 ms is not due at 25 ms");
        assert_eq!(st.next(), Some(ms(30)));
        let got = st.pop_due(ms(30)).expect("due at its deadline");
        assert!(Arc::ptr_eq(&got, &a));
        assert_eq!(st.next(), None);
    }
}
