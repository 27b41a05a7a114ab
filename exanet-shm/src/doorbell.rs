//! Wake-ups: an eventfd [`Doorbell`] and the adaptive spin-then-sleep [`Waiter`].
//!
//! # The protocol
//!
//! A waiting side (say the consumer of a ring) and a notifying side (the producer) share one
//! `sleeping` word in the region and one doorbell (an eventfd) that only the waiting side
//! waits on.
//!
//! Waiting side ([`Waiter::wait`]):
//! 1. check the condition (e.g. "the ring is not empty"); spin with
//!    [`std::hint::spin_loop`] re-checking it until the spin budget is spent;
//! 2. `sleeping := 1`, then a `SeqCst` fence, then check the condition again;
//! 3. block on the doorbell (`ppoll`) until rung or timed out, drain it, `sleeping := 0`,
//!    check the condition; loop to 2 if it is still false.
//!
//! Notifying side ([`wake_sleeper`]), after publishing (e.g. the `Release` store of the tail):
//! 1. a `SeqCst` fence, then load `sleeping`;
//! 2. only if it is non-zero: `swap(0)` and, if that still found it set, ring the doorbell.
//!
//! While both sides are busy the notifier pays one fence and one load per message and never
//! makes a system call.
//!
//! ## Why no wake-up is lost
//!
//! This is the store-buffering ("Dekker") pattern: the waiter stores `sleeping` then loads the
//! condition, the notifier stores the condition then loads `sleeping`. With a `SeqCst` fence
//! between the store and the load on *both* sides, the two fences are totally ordered, and
//! whichever comes second is guaranteed to observe the other side's store. So either the
//! waiter's re-check (step 2) sees the new data and does not sleep, or the notifier sees
//! `sleeping == 1` and rings. Without the fences each side's load could be satisfied before its
//! own store became visible (x86's store buffer does exactly that), and both could miss the
//! other. The other accesses to `sleeping` can be `Relaxed`: the fences carry the ordering,
//! and the flag carries no data.
//!
//! Spurious wake-ups are harmless by construction: both sides may race to clear `sleeping`,
//! and the doorbell may be rung for a waiter that already saw the data in its re-check. The
//! waiter then finds the eventfd already signalled on its next sleep, drains it, re-checks and
//! goes back to sleep; every wait loops on the condition.
//!
//! ## Event loops
//!
//! An async daemon does not block in [`Waiter::wait`]: it registers the eventfd
//! ([`Doorbell::as_raw_fd`]) with its reactor (e.g. `tokio::io::unix::AsyncFd`) and runs the
//! waiting half itself with [`Consumer::prepare_sleep`](crate::Consumer::prepare_sleep)
//! (announce + fence + re-check), awaiting readability only if that returned `false`, then
//! [`Doorbell::drain`] and [`Consumer::finish_sleep`](crate::Consumer::finish_sleep).
//!
//! ## Hostile peers
//!
//! A peer that sets `sleeping` permanently costs the notifier one `write(2)` per message; a peer
//! that never rings leaves the waiter asleep until its timeout. Neither can corrupt anything.
//! The eventfd's `O_NONBLOCK` flag lives on the open file description, which is shared with the
//! peer through `SCM_RIGHTS`; a peer that clears it could make a drain block, so a daemon that
//! must stay responsive should not read a client's eventfd from a thread it cannot afford to
//! block (or should use `tokio::io::unix::AsyncFd` on [`Doorbell::as_raw_fd`], which only reads
//! after readiness).

use std::fs::File;
use std::hint;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use crate::region::SharedU32;
use crate::sys;

/// An eventfd used as a doorbell: [`ring`](Doorbell::ring) adds one to its counter,
/// [`wait`](Doorbell::wait) blocks until the counter is non-zero and resets it.
///
/// The eventfd is non-blocking (`EFD_NONBLOCK`) and close-on-exec.
#[derive(Debug)]
pub struct Doorbell {
    file: File,
}

impl Doorbell {
    /// Creates a new doorbell (`eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`).
    pub fn new() -> io::Result<Doorbell> {
        let fd = sys::eventfd(libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)?;
        Ok(Doorbell {
            file: File::from(fd),
        })
    }

    /// Wraps an eventfd received from the peer and makes sure it is non-blocking.
    ///
    /// When `/proc/self/fd` is available the descriptor is checked to really be an eventfd
    /// ([`io::ErrorKind::InvalidInput`] otherwise); without `/proc` the check is skipped.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Doorbell> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        if let Ok(target) = link {
            if target.as_os_str() != "anon_inode:[eventfd]" {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("descriptor is not an eventfd ({})", target.display()),
                ));
            }
        }
        sys::set_nonblocking(fd.as_fd())?;
        Ok(Doorbell {
            file: File::from(fd),
        })
    }

    /// A new descriptor for the same eventfd, e.g. to send to the peer.
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.file.as_fd().try_clone_to_owned()
    }

    /// Rings: adds 1 to the eventfd counter, waking a waiter.
    ///
    /// A saturated counter (`EAGAIN`, after 2^64 - 2 unconsumed rings) is already a pending
    /// wake-up and counts as success.
    pub fn ring(&self) -> io::Result<()> {
        match (&self.file).write(&1u64.to_ne_bytes()) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Consumes a pending ring without blocking. Returns whether there was one.
    pub fn drain(&self) -> io::Result<bool> {
        let mut count = [0u8; 8];
        loop {
            match (&self.file).read(&mut count) {
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Blocks until the doorbell is rung (consuming the ring) or `timeout` passes.
    /// `None` waits forever; `Some(Duration::ZERO)` only checks. Returns whether it was rung.
    /// Signals (`EINTR`) do not cut the wait short.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let deadline = deadline_after(timeout);
        loop {
            if self.drain()? {
                return Ok(true);
            }
            let remaining = time_left(deadline);
            if remaining.is_some_and(|d| d.is_zero()) {
                return Ok(false);
            }
            match sys::poll_readable(self.file.as_fd(), remaining) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl AsRawFd for Doorbell {
    /// The eventfd, e.g. to register it with an event loop (readable = rung).
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// The deadline `timeout` from now (`None`: no deadline, also for a timeout too large for
/// `Instant`, which is as good as none).
pub(crate) fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// Time left until `deadline` (`None`: no deadline).
pub(crate) fn time_left(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

/// The notifying half of the protocol in the [module docs](self): if the peer announced that
/// it is going to sleep on `bell`, ring it. Returns whether it rang.
///
/// Call it *after* publishing what the sleeper waits for (after the `Release` store).
pub fn wake_sleeper(sleeping: SharedU32<'_>, bell: &Doorbell) -> io::Result<bool> {
    // Orders our earlier publication (store) before the load of `sleeping`; pairs with the
    // fence in `Waiter::wait`. See "Why no wake-up is lost".
    fence(Ordering::SeqCst);
    if sleeping.load(Ordering::Relaxed) != 0 && sleeping.swap(0, Ordering::Relaxed) != 0 {
        bell.ring()?;
        return Ok(true);
    }
    Ok(false)
}

/// The default spin budget of a [`Waiter`]: long enough to cover a peer that is busy and
/// answers within a few microseconds, short enough not to burn a core for long.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// How many condition checks happen between two clock reads while spinning.
const SPIN_CHECKS_PER_CLOCK_READ: u32 = 32;

/// Adaptive waiter: spin for a budget, then sleep on a [`Doorbell`] (see the
/// [module docs](self) for the protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    spin: Duration,
}

impl Default for Waiter {
    /// A waiter with the [`DEFAULT_SPIN`] budget.
    fn default() -> Waiter {
        Waiter { spin: DEFAULT_SPIN }
    }
}

impl Waiter {
    /// A waiter that spins for `spin` before sleeping. `Duration::ZERO` sleeps right away
    /// (after one check), [`Duration::MAX`] never sleeps before the timeout.
    pub fn new(spin: Duration) -> Waiter {
        Waiter { spin }
    }

    /// The spin budget.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// Waits until `ready` returns `true` (→ `Ok(true)`), `timeout` passes (→ `Ok(false)`;
    /// `None` = no timeout) or `ready` fails (→ its error).
    ///
    /// `sleeping` is the shared flag the notifier checks in [`wake_sleeper`]; `bell` is the
    /// doorbell the notifier rings. `ready` must load what the notifier publishes with at
    /// least `Acquire` ordering.
    pub fn wait<E, F>(
        &self,
        sleeping: SharedU32<'_>,
        bell: &Doorbell,
        timeout: Option<Duration>,
        mut ready: F,
    ) -> Result<bool, E>
    where
        E: From<io::Error>,
        F: FnMut() -> Result<bool, E>,
    {
        if ready()? {
            return Ok(true);
        }
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));

        // Phase 1: spin.
        let spin = match timeout {
            Some(t) => self.spin.min(t),
            None => self.spin,
        };
        if !spin.is_zero() {
            let spin_end = start.checked_add(spin);
            loop {
                for _ in 0..SPIN_CHECKS_PER_CLOCK_READ {
                    hint::spin_loop();
                    if ready()? {
                        return Ok(true);
                    }
                }
                if spin_end.is_some_and(|end| Instant::now() >= end) {
                    break;
                }
            }
        }

        // Phase 2: announce, re-check, sleep.
        loop {
            sleeping.store(1, Ordering::Relaxed);
            // Orders the store of `sleeping` before the re-check's loads; pairs with the fence
            // in `wake_sleeper`.
            fence(Ordering::SeqCst);
            let outcome: Result<Option<bool>, E> = (|| {
                if ready()? {
                    return Ok(Some(true));
                }
                let remaining = time_left(deadline);
                if remaining.is_some_and(|d| d.is_zero()) {
                    return Ok(Some(false));
                }
                bell.wait(remaining)?;
                Ok(None)
            })();
            // Awake (or never slept): withdraw the announcement whatever happened.
            sleeping.store(0, Ordering::Relaxed);
            match outcome {
                Ok(Some(done)) => return Ok(done),
                Ok(None) => {
                    if ready()? {
                        return Ok(true);
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(false);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}
