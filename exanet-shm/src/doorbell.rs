//! Wake-ups: a [`Doorbell`] (rung through its [`Ringer`]), the two ends of a Unix stream
//! socket pair, and the adaptive spin-then-sleep [`Waiter`].
//!
//! # The protocol
//!
//! A waiting side (say the consumer of a ring) and a notifying side (the producer) share one
//! `sleeping` word in the region and one doorbell: the waiting side holds the [`Doorbell`] (one end
//! of a socket pair, which it reads) and the notifying side its [`Ringer`] (the other end,
//! which it writes).
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
//! ([`Doorbell::as_fd`], or a duplicate of it: tokio's `net::UnixStream` takes one safely)
//! with its reactor and runs the
//! waiting half itself with [`Consumer::prepare_sleep`](crate::Consumer::prepare_sleep)
//! (announce + fence + re-check), awaiting readability only if that returned `false`, then
//! [`Doorbell::drain`] and [`Consumer::finish_sleep`](crate::Consumer::finish_sleep).
//!
//! ## Hostile peers: why a socket pair
//!
//! One side of every doorbell is a process the other must not trust (a workload and its
//! daemon). Whatever the peer does with its end, no call on ours may block: the daemon rings
//! and drains doorbells under its core lock and on its runtime's threads.
//!
//! A doorbell is one direction of a Unix stream socket pair. Its two ends are two open file
//! descriptions, each with its own locks: sending on ours takes only spinlocks of the
//! peer's socket (its receive queue, its state), receiving on ours takes our socket's own
//! `iolock`, which the peer cannot reach, and both are made non-blocking per call
//! (`MSG_DONTWAIT`), whatever anyone set on a description. Each end is shut down in the
//! direction it does not use, so nothing can be queued on a ringer, and each refuses
//! descriptors (`SO_PASSRIGHTS`, Linux >= 6.16), so nothing but bytes reaches a doorbell.
//!
//! Three earlier designs let a peer block us:
//! - an eventfd is one description shared by both sides: a peer that cleared its `O_NONBLOCK`
//!   and saturated the counter made the daemon block in `write(2)` for good;
//! - a socket pair without refusal carried descriptors (`SCM_RIGHTS`), and a descriptor can be
//!   made whose last `close(2)` blocks for as long as its maker likes (a TCP socket with a long
//!   `SO_LINGER` behind a zero window); whoever closed it last (the daemon, under a lock) hung;
//! - a pipe is one inode with one mutex that every read, write and `splice` of either end
//!   takes, sleeping uninterruptibly. A peer that `splice(2)`s from its end into a socket whose
//!   buffer is full (or into its end from a socket that never has data) holds that mutex for
//!   as long as the send (receive) blocks, and our non-blocking write, read or even the
//!   wake-up of a close then slept behind it: a whole node froze on one workload.
//!
//! On kernels without `SO_PASSRIGHTS` descriptors can still arrive on a doorbell (with an
//! out-of-band byte too: doorbells read it inline, `SO_OOBINLINE`, so that no receive frees
//! it with its descriptors behind the caller's back): the caller
//! of [`Doorbell::drain_with`] receives them, to close where a blocked close holds nothing
//! (plain [`Doorbell::drain`] closes them itself, which suits a process that trusts its peer).
//!
//! What a hostile peer can still do, and what it costs:
//! - set `sleeping` permanently: one non-blocking send per message;
//! - never read its end: our socket's send buffer fills, our send finds it full (`EAGAIN`),
//!   which already is a pending wake-up, and succeeds without blocking;
//! - flood our end: each wait drains up to [`DRAIN_CHUNK`] bytes and returns; the waiter
//!   loops on its condition, so the flood costs CPU, never correctness;
//! - `splice` from or into its end: it holds its own socket's locks and its own pipe's, none
//!   of which our calls take;
//! - close its end (or shut it down): `ring` and `wait` fail with `BrokenPipe` (instead of
//!   waking forever on a hung-up descriptor), so a waiter learns that the peer is gone.
//!   Ringing never raises `SIGPIPE`.

use std::hint;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use crate::region::SharedU32;
use crate::sys;

/// Bytes one [`Doorbell::drain`] takes off the socket: any number of rings coalesce into one
/// wake-up, and a peer flooding the socket gets one wake-up per this many bytes.
pub const DRAIN_CHUNK: usize = 256;

/// The waiting end of a wake-up channel: [`wait`](Doorbell::wait) blocks until its
/// [`Ringer`] rings. Made with [`doorbell`].
#[derive(Debug)]
pub struct Doorbell {
    /// The receiving end of the socket pair, non-blocking.
    rx: OwnedFd,
    /// Whether the kernel refuses descriptors sent to it (`SO_PASSRIGHTS`): then receives
    /// need no room for any.
    refuses_fds: bool,
}

/// The ringing end of a [`Doorbell`]: [`ring`](Ringer::ring) wakes whoever waits on it.
/// Clone it ([`Ringer::try_clone`]) to ring from several places, e.g. to wake one's own
/// waiting thread.
#[derive(Debug)]
pub struct Ringer {
    /// The sending end of the socket pair (shut down for receiving), non-blocking.
    tx: OwnedFd,
}

/// A new doorbell and its ringer. Keep one and send the other's descriptor
/// ([`Ringer::into_fd`] or [`Doorbell::into_fd`]) to the peer, or keep both to wake a thread
/// of one's own.
pub fn doorbell() -> io::Result<(Ringer, Doorbell)> {
    let (tx, rx) = sys::socketpair_nonblocking()?;
    // Nothing can be queued on the ringer (a peer sending there gets EPIPE), and the
    // doorbell carries bytes only where the kernel can refuse descriptors.
    sys::shutdown(tx.as_fd(), libc::SHUT_RD)?;
    sys::shutdown(rx.as_fd(), libc::SHUT_WR)?;
    let refuses_fds = sys::refuse_rights(rx.as_fd())?;
    sys::set_oob_inline(rx.as_fd())?;
    Ok((Ringer { tx }, Doorbell { rx, refuses_fds }))
}

fn peer_closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the other end of the doorbell is closed",
    )
}

/// Which end of a doorbell a descriptor must be.
#[derive(Clone, Copy, PartialEq)]
enum End {
    Doorbell,
    Ringer,
}

/// Checks that `fd` is the `end` of a live doorbell (a Unix stream socket, shut down in
/// the direction that end does not use, its peer still there) and makes our description of
/// it non-blocking.
fn check_end(fd: &OwnedFd, end: End) -> io::Result<()> {
    let what = match end {
        End::Doorbell => "a doorbell (the receiving end of a Unix stream socket pair)",
        End::Ringer => "a ringer (the sending end of a Unix stream socket pair)",
    };
    let not_ours = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor is not {what} ({why})"),
        )
    };
    if !sys::is_unix_stream(fd.as_fd()).map_err(|e| not_ours(e.to_string()))? {
        return Err(not_ours("not a Unix stream socket".into()));
    }
    match end {
        // A ringer was shut down for receiving, which a doorbell sees as the end of its
        // stream; so does a doorbell whose ringers are all closed.
        End::Doorbell if sys::peer_hung_up(fd.as_fd()) => {
            return Err(not_ours(
                "a ringer, or a doorbell whose ringers are closed".into(),
            ))
        }
        End::Ringer if !sys::may_send(fd.as_fd()).map_err(|e| not_ours(e.to_string()))? => {
            return Err(not_ours(
                "shut down for sending: a doorbell, or a ringer whose doorbell is closed".into(),
            ))
        }
        _ => {}
    }
    sys::set_nonblocking(fd.as_fd())
}

impl Doorbell {
    /// Wraps a doorbell received from the peer: an end of a Unix stream socket pair
    /// ([`io::ErrorKind::InvalidInput`] otherwise). It is made non-blocking and, where the
    /// kernel can, to refuse descriptors.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Doorbell> {
        check_end(&fd, End::Doorbell)?;
        let refuses_fds = sys::refuse_rights(fd.as_fd()).unwrap_or(false);
        sys::set_oob_inline(fd.as_fd())?;
        Ok(Doorbell {
            rx: fd,
            refuses_fds,
        })
    }

    /// The descriptor, to send to the peer (an end handed over is not used here any more).
    pub fn into_fd(self) -> OwnedFd {
        self.rx
    }

    /// Consumes pending rings without blocking. Returns whether there were any;
    /// `BrokenPipe` once every ringer is closed and nothing is left to read. Descriptors a
    /// peer sent along (only possible where the kernel cannot refuse them) are closed here.
    pub fn drain(&self) -> io::Result<bool> {
        self.drain_with(&mut drop)
    }

    /// [`drain`](Doorbell::drain), handing every descriptor that came with the rings to
    /// `stray` instead of closing it here: a process that must not block in a close its
    /// peer made blocking closes them elsewhere.
    pub fn drain_with(&self, stray: &mut dyn FnMut(OwnedFd)) -> io::Result<bool> {
        let mut buf = [0u8; DRAIN_CHUNK];
        let room = if self.refuses_fds {
            0
        } else {
            crate::fdpass::MAX_FDS
        };
        let received = sys::recv_with_fds(self.rx.as_fd(), &mut buf, room, true);
        match received {
            Ok(r) => {
                r.fds.into_iter().for_each(&mut *stray);
                if r.bytes == 0 {
                    Err(peer_closed())
                } else {
                    Ok(true)
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Err(peer_closed()),
            Err(e) => Err(e),
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
    /// Wraps a ringer received from the peer: an end of a Unix stream socket pair
    /// ([`io::ErrorKind::InvalidInput`] otherwise). It is made non-blocking.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Ringer> {
        check_end(&fd, End::Ringer)?;
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
    /// A full socket (the waiter has many unconsumed rings) is already a pending wake-up and
    /// counts as success; a closed doorbell is `BrokenPipe`.
    pub fn ring(&self) -> io::Result<()> {
        loop {
            match sys::send_byte_nowait(self.tx.as_fd()) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    return Err(peer_closed())
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl From<Ringer> for OwnedFd {
    fn from(r: Ringer) -> OwnedFd {
        r.tx
    }
}

impl From<Doorbell> for OwnedFd {
    fn from(d: Doorbell) -> OwnedFd {
        d.rx
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
    if take_sleeper(sleeping) {
        bell.ring()?;
        return Ok(true);
    }
    Ok(false)
}

/// The check of [`wake_sleeper`] without the ring: whether the peer announced its sleep,
/// withdrawing the announcement. `true` obliges the caller to ring (elsewhere, say, where
/// a ring that takes long holds nothing).
pub fn take_sleeper(sleeping: SharedU32<'_>) -> bool {
    // Orders our earlier publication (store) before the load of `sleeping`; pairs with the
    // fence in `Waiter::wait`. See "Why no wake-up is lost".
    fence(Ordering::SeqCst);
    sleeping.load(Ordering::Relaxed) != 0 && sleeping.swap(0, Ordering::Relaxed) != 0
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
