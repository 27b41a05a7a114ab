//! Closing and letting go of what a workload could have touched, where a blocked call
//! holds nothing.
//!
//! The last `close(2)` of some descriptors blocks for as long as someone else likes: a TCP
//! socket with a long `SO_LINGER` whose FIN is stuck behind a zero window blocks in
//! `tcp_close`, and closing the last reference to a Unix socket closes every descriptor still
//! queued in it, which may be such a socket. A workload cannot hand the daemon a descriptor
//! any more where the kernel can refuse them (the doorbells and the attach socket refuse
//! `SCM_RIGHTS`: see `ni_service`), but the attach connection and the doorbells are still
//! Unix sockets the workload is the peer of, and kernels older than 6.16 cannot refuse
//! descriptors. So whatever a workload
//! could have put something into is closed here, on threads of their own that hold no lock
//! and own nothing else: a close that blocks there blocks only that thread.
//!
//! The same goes for giving a registered region back ([`later`]): the workload maps the
//! region's memfd and may `write(2)` into it from a buffer whose page fault never ends (a
//! FUSE file it serves, a userfaultfd range), holding the inode's lock meanwhile, and the
//! daemon's hole punch takes that lock. A punch under the core lock froze the node.
//!
//! A closer stuck for longer than [`STUCK_AFTER`] is left to its close and another one takes
//! over the queue, up to [`MAX_CLOSERS`]; past that, descriptors wait in the queue (counted by
//! [`pending`]) rather than block anyone. No caller ever waits.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::warn;

/// How long a close may take before its closer counts as stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(1);
/// Closer threads at most, stuck ones included.
pub const MAX_CLOSERS: usize = 8;

/// Something to let go of where blocking holds nothing.
type Job = Box<dyn FnOnce() + Send>;

struct Closers {
    queue: Mutex<Sender<Job>>,
    rx: Arc<Mutex<Receiver<Job>>>,
    /// Per closer: when its current close began (ms since `epoch`, +1), 0 when idle.
    busy_since: Mutex<Vec<Arc<AtomicU64>>>,
    epoch: Instant,
    pending: AtomicUsize,
}

fn closers() -> &'static Closers {
    static CLOSERS: OnceLock<Closers> = OnceLock::new();
    CLOSERS.get_or_init(|| {
        let (tx, rx) = channel();
        Closers {
            queue: Mutex::new(tx),
            rx: Arc::new(Mutex::new(rx)),
            busy_since: Mutex::new(Vec::new()),
            epoch: Instant::now(),
            pending: AtomicUsize::new(0),
        }
    })
}

impl Closers {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Starts a closer if there is none, or if every one is stuck and there is room.
    fn ensure_one_free(&'static self) {
        let mut all = self.busy_since.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.now_ms();
        let stuck_ms = STUCK_AFTER.as_millis() as u64;
        let free = all.iter().any(|b| {
            let since = b.load(Ordering::Acquire);
            since == 0 || now.saturating_sub(since) < stuck_ms
        });
        if free {
            return;
        }
        if all.len() >= MAX_CLOSERS {
            return;
        }
        if !all.is_empty() {
            warn!(
                closers = all.len(),
                "a descriptor's close is blocked; another closer takes over"
            );
        }
        let busy = Arc::new(AtomicU64::new(0));
        let rx = Arc::clone(&self.rx);
        let mine = Arc::clone(&busy);
        let spawned = std::thread::Builder::new()
            .name("exanet-closer".into())
            .spawn(move || loop {
                let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok(job) = next else { return };
                let me = closers();
                mine.store(me.now_ms(), Ordering::Release);
                job();
                mine.store(0, Ordering::Release);
                me.pending.fetch_sub(1, Ordering::AcqRel);
            });
        match spawned {
            Ok(_) => all.push(busy),
            Err(e) => warn!(error = %e, "cannot start a closer thread"),
        }
    }
}

/// Starts the first closer now, so that the daemon's threads are all there from the start
/// (a close later needs no thread made on the spot).
pub fn start() {
    closers().ensure_one_free();
}

/// Closes `fd` on a closer thread, never on the caller's.
pub fn close_later(fd: impl Into<OwnedFd>) {
    let fd: OwnedFd = fd.into();
    later(move || drop(fd));
}

/// Runs `job` (a close, a hole punch, the drop of what it owns) on a closer thread, never
/// on the caller's.
pub fn later(job: impl FnOnce() + Send + 'static) {
    let c = closers();
    c.pending.fetch_add(1, Ordering::AcqRel);
    c.ensure_one_free();
    let sent = c
        .queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(Box::new(job));
    if sent.is_err() {
        // The receiver lives in a static: this cannot happen; the job was dropped with the
        // error, here.
        c.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Jobs (descriptors) handed to [`later`] ([`close_later`]) and not done yet.
pub fn pending() -> usize {
    closers().pending.load(Ordering::Acquire)
}

/// Owns a descriptor a workload could have put something into, and closes it with
/// [`close_later`] when dropped, wherever that is (under the core lock, say).
#[derive(Debug)]
pub struct CloseLater<T: Into<OwnedFd>>(Option<T>);

impl<T: Into<OwnedFd>> CloseLater<T> {
    pub fn new(inner: T) -> CloseLater<T> {
        CloseLater(Some(inner))
    }
}

impl<T: Into<OwnedFd>> std::ops::Deref for CloseLater<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // Only `drop` takes it out.
        self.0.as_ref().expect("present until dropped")
    }
}

impl<T: Into<OwnedFd>> Drop for CloseLater<T> {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            close_later(inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn closes_happen_on_a_closer_thread() {
        let (a, b) = UnixStream::pair().unwrap();
        let guard = CloseLater::new(a);
        // Usable through the guard.
        assert!(guard.peer_addr().is_ok());
        drop(guard);
        // The peer sees the close soon, from a closer.
        b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &b, &mut buf).unwrap(), 0);
        let t = Instant::now();
        while pending() > 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(pending(), 0);
    }
}
