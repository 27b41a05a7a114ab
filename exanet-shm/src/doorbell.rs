//! Wake-ups: a pipe-based [`Doorbell`] (rung through its [`Ringer`]) and the adaptive
//! spin-then-sleep [`Waiter`].
//!
//! # The protocol
//!
//! A waiting side (say the consumer of a ring) and a notifying side (the producer) share one
//! `sleeping` word in the region and one doorbell: the waiting side holds the [`Doorbell`] (a
//! pipe's read end) and the notifying side its [`Ringer`] (the write end).
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
//! waiter then finds the doorbell already rung on its next sleep, drains it, re-checks and
//! goes back to sleep; every wait loops on the condition.
//!
//! ## Event loops
//!
//! An async daemon does not block in [`Waiter::wait`]: it registers the doorbell's descriptor
//! ([`Doorbell::as_fd`], or a duplicate of it: tokio's `net::unix::pipe::Receiver` takes
//! one safely) with its reactor and runs the
//! waiting half itself with [`Consumer::prepare_sleep`](crate::Consumer::prepare_sleep)
//! (announce + fence + re-check), awaiting readability only if that returned `false`, then
//! [`Doorbell::drain`] and [`Consumer::finish_sleep`](crate::Consumer::finish_sleep).
//!
//! ## Hostile peers: why a pipe
//!
//! One side of every doorbell is a process the other must not trust (a workload and its
//! daemon). A doorbell is one direction of a pipe, and the two ends are two open file
//! descriptions: a peer holding one end cannot change how calls on the other behave (clearing
//! `O_NONBLOCK` on its end changes nothing for ours, and ours is always non-blocking).
//!
//! A pipe carries bytes and nothing else. Two earlier designs carried more:
//! - an eventfd is one description shared by both sides: a peer that cleared its `O_NONBLOCK`
//!   and saturated the counter made the daemon block in `write(2)` for good;
//! - a Unix socket pair carries descriptors (`SCM_RIGHTS`), and a descriptor can be made
//!   whose last `close(2)` blocks for as long as its maker likes (a TCP socket with a long
//!   `SO_LINGER` behind a zero window). A peer could park one in the daemon's end, or send
//!   one along with a ring, and whoever closed it last (the daemon, under a lock) hung.
//!   Neither is possible with a pipe; closing a pipe end never blocks.
//!
//! What a hostile peer can still do, and what it costs:
//! - set `sleeping` permanently: one non-blocking write per message;
//! - never read its end: the pipe fills, our write finds it full (`EAGAIN`), which already is
//!   a pending wake-up, and succeeds without blocking;
//! - flood our end: each wait drains up to [`DRAIN_CHUNK`] bytes and returns; the waiter
//!   loops on its condition, so the flood costs CPU, never correctness;
//! - close its end: `ring` and `wait` fail with `BrokenPipe` (instead of waking forever on a
//!   hung-up descriptor), so a waiter learns that the peer is gone. Ringing never raises
//!   `SIGPIPE` (see `Ringer::ring`).

use std::hint;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use crate::region::SharedU32;
use crate::sys;

/// Bytes one [`Doorbell::drain`] takes off the pipe: any number of rings coalesce into one
/// wake-up, and a peer flooding the pipe gets one wake-up per this many bytes.
pub const DRAIN_CHUNK: usize = 256;

/// The waiting end of a wake-up channel: [`wait`](Doorbell::wait) blocks until its
/// [`Ringer`] rings. Made with [`doorbell`].
#[derive(Debug)]
pub struct Doorbell {
    /// The read end of the pipe, non-blocking.
    rx: OwnedFd,
}

/// The ringing end of a [`Doorbell`]: [`ring`](Ringer::ring) wakes whoever waits on it.
/// Clone it ([`Ringer::try_clone`]) to ring from several places, e.g. to wake one's own
/// waiting thread.
#[derive(Debug)]
pub struct Ringer {
    /// The write end of the pipe, non-blocking.
    tx: OwnedFd,
}

/// A new doorbell and its ringer. Keep one and send the other's descriptor
/// ([`Ringer::into_fd`] or [`Doorbell::into_fd`]) to the peer, or keep both to wake a thread
/// of one's own.
pub fn doorbell() -> io::Result<(Ringer, Doorbell)> {
    let (rx, tx) = sys::pipe_nonblocking()?;
    Ok((Ringer { tx }, Doorbell { rx }))
}

fn peer_closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the other end of the doorbell is closed",
    )
}

/// Checks that `fd` is a pipe end open for `mode` (`O_RDONLY` or `O_WRONLY`) and makes our
/// description of it non-blocking.
fn check_end(fd: &OwnedFd, mode: libc::c_int, what: &str) -> io::Result<()> {
    let not_ours = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor is not {what} ({why})"),
        )
    };
    let (fifo, access) = sys::fifo_access(fd.as_fd()).map_err(|e| not_ours(e.to_string()))?;
    if !fifo {
        return Err(not_ours("not a pipe".into()));
    }
    if access != mode {
        return Err(not_ours("a pipe end of the other direction".into()));
    }
    sys::set_nonblocking(fd.as_fd())
}

impl Doorbell {
    /// Wraps a doorbell received from the peer: the read end of a pipe
    /// ([`io::ErrorKind::InvalidInput`] otherwise). It is made non-blocking.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Doorbell> {
        check_end(&fd, libc::O_RDONLY, "a doorbell (the read end of a pipe)")?;
        Ok(Doorbell { rx: fd })
    }

    /// The descriptor, to send to the peer (an end handed over is not used here any more).
    pub fn into_fd(self) -> OwnedFd {
        self.rx
    }

    /// Consumes pending rings without blocking. Returns whether there were any;
    /// `BrokenPipe` once every ringer is closed and nothing is left to read.
    pub fn drain(&self) -> io::Result<bool> {
        let mut buf = [0u8; DRAIN_CHUNK];
        loop {
            match sys::read(self.rx.as_fd(), &mut buf) {
                Ok(0) => return Err(peer_closed()),
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Blocks until the doorbell is rung (consuming the ring) or `timeout` passes.
    /// `None` waits forever; `Some(Duration::ZERO)` only checks. Returns whether it was rung.
    /// Signals (`EINTR`) do not cut the wait short; once every ringer is closed it ends with
    /// `BrokenPipe`.
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
            match sys::poll_readable(self.rx.as_fd(), remaining) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Ringer {
    /// Wraps a ringer received from the peer: the write end of a pipe
    /// ([`io::ErrorKind::InvalidInput`] otherwise). It is made non-blocking.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Ringer> {
        check_end(&fd, libc::O_WRONLY, "a ringer (the write end of a pipe)")?;
        Ok(Ringer { tx: fd })
    }

    /// The descriptor, to send to the peer (an end handed over is not used here any more).
    pub fn into_fd(self) -> OwnedFd {
        self.tx
    }

    /// A second ringer of the same doorbell (a duplicate descriptor).
    pub fn try_clone(&self) -> io::Result<Ringer> {
        Ok(Ringer {
            tx: self.tx.try_clone()?,
        })
    }

    /// Rings: wakes a waiter on the doorbell. Never blocks and never raises `SIGPIPE`.
    ///
    /// A full pipe (the waiter has many unconsumed rings) is already a pending wake-up and
    /// counts as success; a closed doorbell is `BrokenPipe`.
    pub fn ring(&self) -> io::Result<()> {
        loop {
            match sys::write_without_sigpipe(self.tx.as_fd(), &[1]) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(peer_closed()),
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsFd for Doorbell {
    /// The descriptor `wait` polls (readable = rung), e.g. for an event loop.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

impl AsRawFd for Doorbell {
    /// The descriptor `wait` polls (readable = rung), e.g. for an event loop.
    fn as_raw_fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }
}

impl AsFd for Ringer {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.tx.as_fd()
    }
}

impl AsRawFd for Ringer {
    fn as_raw_fd(&self) -> RawFd {
        self.tx.as_raw_fd()
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
pub fn wake_sleeper(sleeping: SharedU32<'_>, bell: &Ringer) -> io::Result<bool> {
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
