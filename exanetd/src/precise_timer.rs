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
        st.seq += 1;
        let seq = st.seq;
        let sooner = st.heap.peek().is_none_or(|Reverse(e)| at < e.at);
        st.heap.push(Reverse(Entry { at, seq, wake }));
        drop(st);
        if sooner {
            self.cv.notify_one();
        }
    }

    fn run(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            while st.heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
                if let Some(Reverse(e)) = st.heap.pop() {
                    e.wake.notify_one();
                }
            }
            st = match st.heap.peek().map(|Reverse(e)| e.at) {
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
}
