//! An attached workload as the daemon sees it, beside what the workload service
//! (`exanet_proto::workload`) keeps of it (its job and what it holds against its quotas):
//! the process, its control connection, and its completion ring in shared memory.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use exanet_proto::attach;
use exanet_proto::ni::mailbox::ConsumedCount;
use exanet_proto::workload::{Activity, CompletionRing};
use exanet_shm::{PeerCredentials, Producer, Region, Ring, Ringer};

use tracing::warn;

use crate::closer::CloseLater;

/// A ring of a workload's doorbell that costs the ringing thread more CPU time than this
/// (under the core lock) makes its later rings go to a closer thread. A ring costs
/// microseconds. CPU time, not wall time: on a loaded host a thread preempted in the middle
/// of a ring takes milliseconds of wall time (seen on the 2-core test machine: both daemons
/// of an 8 B ping-pong demoted their well-behaved workloads, 2.1 ms each), and a demoted
/// workload's every wake-up takes a thread hop. What a hostile workload adds, the
/// waiters' callbacks, runs on the ringing thread and counts.
pub const SLOW_RING: std::time::Duration = std::time::Duration::from_millis(2);

/// The daemon's half of an attached workload, kept in the core by rank.
pub struct Session {
    /// Who attached (`SO_PEERCRED`); its job and holdings are the workload service's.
    pub peer: PeerCredentials,
    /// A copy of the control connection, to tell that the workload is gone before the
    /// session's own thread has noticed (closed by a closer, as the workload is its peer);
    /// and the end of its teardown.
    pub conn: CloseLater<OwnedFd>,
    pub ended: Arc<Ended>,
}

/// A workload's completion ring in the shared memory the daemon made for it.
pub struct ShmRing {
    pub completions: Producer,
    /// The daemon's ringer of the workload's doorbell, closed by a closer when the rank is
    /// detached (under the core lock).
    pub to_workload: Arc<CloseLater<Ringer>>,
    /// Rings of this workload take long (see [`SLOW_RING`]): they are made on a closer
    /// thread, at most one at a time.
    pub slow_rings: Option<Arc<AtomicBool>>,
    /// The region of the rings, and where in it the workload counts what it took from
    /// each mailbox (`attach`'s consumed counters).
    pub rings: Arc<Region>,
    pub consumed_offset: usize,
    /// The workload's process (`SO_PEERCRED`), whose threads' states say whether it runs.
    pub pid: i32,
    /// The workload's command ring in `rings`, to see whether it posted what the daemon
    /// has not read yet.
    pub commands: Ring,
}

impl CompletionRing for ShmRing {
    fn push(&mut self, slot: &[u8; attach::SLOT]) -> bool {
        self.completions.push(slot).is_ok()
    }

    fn has_room(&mut self) -> bool {
        self.completions.free().is_ok_and(|n| n > 0)
    }

    fn wake(&mut self) {
        // Under the core lock. A ring costs what the workload makes it cost: the wake-up
        // runs every waiter's callback on its socket, and a workload can register its end
        // in as many epoll instances as it has descriptors (some 90 ns each). A workload
        // whose rings take long is rung off the lock from then on.
        if let Some(pending) = &self.slow_rings {
            if self.completions.take_sleeping_consumer().unwrap_or(false)
                && !pending.swap(true, Ordering::AcqRel)
            {
                let (ringer, pending) = (Arc::clone(&self.to_workload), Arc::clone(pending));
                crate::closer::later(move || {
                    pending.store(false, Ordering::Release);
                    let _ = ringer.ring();
                });
            }
            return;
        }
        if !self.completions.take_sleeping_consumer().unwrap_or(false) {
            return;
        }
        let t0 = thread_cpu();
        let _ = self.to_workload.ring();
        let took = thread_cpu().zip(t0).map(|(t1, t0)| t1.saturating_sub(t0));
        if let Some(took) = took.filter(|&t| t > SLOW_RING) {
            warn!(
                pid = self.pid,
                cpu = ?took,
                "ringing a workload took long: it is rung off the core lock from now on"
            );
            self.slow_rings = Some(Arc::new(AtomicBool::new(false)));
        }
    }

    fn activity(&mut self) -> Option<Activity> {
        // A ring the workload broke says nothing: take it as running, which promises the
        // least.
        // Drained first: a program ends its wait (withdraws `consumer_waiting`) before it
        // takes what woke it (its Release store of the head, which this Acquire load
        // pairs with), so a ring seen drained of it is never followed by the same wait
        // seen still on. The other way round, a program seen waiting and then drained was
        // taken to wait with everything taken, which promises nothing, while it was about
        // to post in reaction to what it had just taken: in modeled order such posts came
        // behind the NI's horizon (`exanet_ni_late_posts_total{program="waiting"}`).
        let drained = self.completions.is_drained().unwrap_or(false);
        // Then waiting, then posting: a program posts before it announces it sleeps, so
        // commands it posted before sleeping are seen.
        // Spinning in its wait for a completion is waiting as much as sleeping is: only
        // the sleep sets `consumer_sleeping`, and the daemon's wake-up withdraws it.
        let waiting = self.completions.consumer_sleeping().unwrap_or(false)
            || self.completions.consumer_waiting().unwrap_or(false);
        Some(Activity {
            waiting,
            drained,
            posting: self.completions.consumer_asking().unwrap_or(false)
                || self.commands.pending(&self.rings).unwrap_or(true),
        })
    }

    fn runnable(&mut self) -> Option<bool> {
        // The thread is the workload's word, so only a thread of its own process is looked
        // at: the most a lie buys is what a command every few milliseconds buys anyway.
        let tid = self
            .completions
            .consumer_thread()
            .ok()
            .filter(|&t| t != 0)?;
        let stat = std::fs::read_to_string(format!("/proc/{}/task/{tid}/stat", self.pid)).ok()?;
        thread_runnable(&stat)
    }

    fn consumed(&self, vi: u8) -> Box<dyn ConsumedCount> {
        Box::new(ShmCount {
            region: Arc::clone(&self.rings),
            offset: self.consumed_offset + usize::from(vi) * 8,
        })
    }
}

/// Whether a thread's `/proc/PID/task/TID/stat` says it is on a CPU or waiting for one
/// (state `R`). The state follows the command name in parentheses, which may itself hold
/// anything, parentheses and spaces included: it is after the last `)`.
fn thread_runnable(stat: &str) -> Option<bool> {
    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
    Some(state == 'R')
}

/// A mailbox's consumed counter in a session's ring region: written by the workload, read
/// (never trusted: see `exanet_proto::ni::mailbox`) when the mailbox looks full.
struct ShmCount {
    region: Arc<Region>,
    offset: usize,
}

impl ConsumedCount for ShmCount {
    fn consumed(&self) -> u64 {
        self.region
            .atomic_u64(self.offset)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }
}

/// The end of a session's teardown, which an attach may wait for.
#[derive(Default)]
pub struct Ended {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Ended {
    pub fn wait_until(&self, deadline: std::time::Instant) -> bool {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            done = self
                .cv
                .wait_timeout(done, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

/// Marks a session's teardown over when dropped (also when its thread panics).
pub struct EndedGuard(pub Arc<Ended>);

impl Drop for EndedGuard {
    fn drop(&mut self) {
        *self.0.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.0.cv.notify_all();
    }
}

/// The calling thread's CPU time (`None` if the clock cannot be read, which demotes nobody).
fn thread_cpu() -> Option<std::time::Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .ok()
        .map(std::time::Duration::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_state_is_after_the_last_parenthesis_of_its_name() {
        assert_eq!(thread_runnable("42 (exanet-perf) R 1 42 42 0"), Some(true));
        assert_eq!(thread_runnable("42 (a) b) S 1 42"), Some(false));
        assert_eq!(thread_runnable("42 (x) D 1"), Some(false));
        assert_eq!(thread_runnable("42 no name"), None);
        assert_eq!(thread_runnable("42 (x)"), None);
    }
}
