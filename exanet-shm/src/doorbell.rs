//! Wake-ups: a socket-pair [`Doorbell`] and the adaptive spin-then-sleep [`Waiter`].
//!
//! # The protocol
//!
//! A waiting side (say the consumer of a ring) and a notifying side (the producer) share one
//! `sleeping` word in the region and one doorbell (a socket pair) whose one end only the
//! waiting side waits on.
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
//! ([`Doorbell::as_raw_fd`]) with its reactor (e.g. `tokio::io::unix::AsyncFd`) and runs the
//! waiting half itself with [`Consumer::prepare_sleep`](crate::Consumer::prepare_sleep)
//! (announce + fence + re-check), awaiting readability only if that returned `false`, then
//! [`Doorbell::drain`] and [`Consumer::finish_sleep`](crate::Consumer::finish_sleep).
//!
//! ## Hostile peers
//!
//! A doorbell is one end of a Unix stream socket pair: [`Doorbell::ring`] sends a byte to the
//! other end and [`Doorbell::wait`] waits for bytes the other end sent. The two ends are two
//! open file descriptions, so a peer holding one end cannot change how calls on the other
//! behave: clearing `O_NONBLOCK` on its end, say, changes nothing for ours, and every call
//! of ours passes `MSG_DONTWAIT` (and `MSG_NOSIGNAL`) anyway. (An eventfd, which this
//! replaced, is one description shared by both sides: a peer that cleared its `O_NONBLOCK`
//! and saturated the counter made the daemon block in `write(2)` for good.)
//!
//! What a hostile peer can still do, and what it costs:
//! - set `sleeping` permanently: one non-blocking `send` per message;
//! - never read its end: its receive buffer fills, our `send` finds it full (`EAGAIN`), which
//!   already is a pending wake-up, and succeeds without blocking;
//! - flood our end: each wait drains up to [`DRAIN_CHUNK`] bytes and returns; the waiter
//!   loops on its condition, so the flood costs CPU, never correctness;
//! - close its end: `ring` and `wait` fail with `BrokenPipe` (instead of waking forever on a
//!   hung-up descriptor), so a waiter learns that the peer is gone.

use std::hint;
use std::io;
use std::mem::MaybeUninit;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use crate::region::SharedU32;
use crate::sys;

/// Bytes one [`Doorbell::drain`] takes off the socket: any number of rings coalesce into one
/// wake-up, and a peer flooding the socket gets one wake-up per this many bytes.
pub const DRAIN_CHUNK: usize = 256;

/// One end of a wake-up channel: [`ring`](Doorbell::ring) wakes whoever waits on the other
/// end, [`wait`](Doorbell::wait) blocks until the other end rings (see the module docs for
/// why this is a socket pair rather than an eventfd).
///
/// [`Doorbell::pair`] makes two connected ends, one to keep and one to hand to the peer;
/// [`Doorbell::new`] makes a doorbell for use within one process, whose `ring` wakes its
/// own `wait`.
#[derive(Debug)]
pub struct Doorbell {
    /// What `ring` sends on.
    tx: Socket,
    /// What `wait` and `drain` read from; a clone of `tx` for an end of a pair.
    rx: Socket,
}

fn peer_closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the other end of the doorbell is closed",
    )
}

fn stream_pair() -> io::Result<(Socket, Socket)> {
    // socket2 sets SOCK_CLOEXEC on both ends.
    Socket::pair(Domain::UNIX, Type::STREAM, None)
}

impl Doorbell {
    /// A doorbell within one process: `ring` on it wakes `wait` on it (from any thread).
    pub fn new() -> io::Result<Doorbell> {
        let (tx, rx) = stream_pair()?;
        Ok(Doorbell { tx, rx })
    }

    /// Two connected ends: ringing one wakes a wait on the other, in both directions.
    /// Keep one and send the other's descriptor ([`Doorbell::into_fd`]) to the peer.
    pub fn pair() -> io::Result<(Doorbell, Doorbell)> {
        let (a, b) = stream_pair()?;
        Ok((Doorbell::end(a)?, Doorbell::end(b)?))
    }

    fn end(sock: Socket) -> io::Result<Doorbell> {
        let rx = sock.try_clone()?;
        Ok(Doorbell { tx: sock, rx })
    }

    /// Wraps an end received from the peer.
    ///
    /// The descriptor must be a Unix stream socket ([`io::ErrorKind::InvalidInput`]
    /// otherwise). Its flags do not matter: every call passes `MSG_DONTWAIT`.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Doorbell> {
        let sock = Socket::from(fd);
        let not_ours = |what: String| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("descriptor is not a doorbell ({what})"),
            )
        };
        match sock.r#type() {
            Ok(t) if t == Type::STREAM => {}
            Ok(t) => return Err(not_ours(format!("socket type {t:?}"))),
            Err(e) => return Err(not_ours(e.to_string())),
        }
        let addr = sock.local_addr().map_err(|e| not_ours(e.to_string()))?;
        if !addr.is_unix() {
            return Err(not_ours("not a Unix socket".into()));
        }
        Doorbell::end(sock)
    }

    /// The descriptor of this end, to send to the peer (the `Doorbell` is consumed: an end
    /// handed over is not used here any more).
    pub fn into_fd(self) -> OwnedFd {
        drop(self.rx);
        OwnedFd::from(self.tx)
    }

    /// Rings: wakes a waiter on the other end. Never blocks.
    ///
    /// A full socket (the other end has many unconsumed rings) is already a pending wake-up
    /// and counts as success; a closed other end is `BrokenPipe`.
    pub fn ring(&self) -> io::Result<()> {
        loop {
            match self
                .tx
                .send_with_flags(&[1], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            {
                Ok(_) => return Ok(()),
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

    /// Consumes pending rings without blocking. Returns whether there were any;
    /// `BrokenPipe` once the other end is closed and nothing is left to read.
    pub fn drain(&self) -> io::Result<bool> {
        let mut buf = [MaybeUninit::<u8>::uninit(); DRAIN_CHUNK];
        loop {
            match self.rx.recv_with_flags(&mut buf, libc::MSG_DONTWAIT) {
                Ok(0) => return Err(peer_closed()),
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The peer closed its end with rings unread.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Err(peer_closed()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Blocks until the doorbell is rung (consuming the ring) or `timeout` passes.
    /// `None` waits forever; `Some(Duration::ZERO)` only checks. Returns whether it was rung.
    /// Signals (`EINTR`) do not cut the wait short; a closed other end ends it with
    /// `BrokenPipe`, and so does [`Doorbell::shutdown`] from another thread.
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

    /// Ends this doorbell for good: a thread in [`Doorbell::wait`] on it returns at once with
    /// `BrokenPipe`, and the other end sees it closed. Never blocks, whatever the peer does.
    pub fn shutdown(&self) -> io::Result<()> {
        let res = self
            .rx
            .shutdown(Shutdown::Both)
            .and(self.tx.shutdown(Shutdown::Both));
        match res {
            Err(e) if e.raw_os_error() != Some(libc::ENOTCONN) => Err(e),
            _ => Ok(()),
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
