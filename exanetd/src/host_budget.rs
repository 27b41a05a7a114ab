//! The registered memory the daemons of one host may hold together.
//!
//! Registered memory is real memory each daemon allocates in full (`Region::create`), and a
//! job's quota ([`exanet_control::quota::JOB_DEFAULTS`], 8 GiB) is per node: one job on three nodes
//! of a 23 GiB host could take it all. So the daemons of a host share a budget, per job and
//! in total, from what `exactl rack up` measured ([`MemoryBudget`],
//! `run/memory-budget.toml`): the total is three quarters of what was available after the
//! rack's own needs (the last quarter is for the workloads' own processes, the page cache
//! and whatever else runs on the host; MemAvailable is a snapshot, not a promise), plus
//! what `rack up` counted for the IP services' rings, which only the IP job may use, so
//! that no job can deny a node IP over ExaNet. One job may hold `[ni]
//! job_host_memory_percent` of the rest (half by default when the rack has several jobs).
//!
//! What each daemon holds is in a ledger beside the budget, `run/memory-ledger`, a file of
//! fixed-size slots: one per rank of every node, each the job the rank belongs to (a hash
//! of its name) and the bytes it holds. Why this shape:
//!
//! - **Only its own daemon writes a slot**, so a slot is never contended and never left
//!   for someone else to clean: a daemon that restarts (crashed or not) zeroes its node's
//!   slots when it opens the ledger, one that stops zeroes them as it exits, and nothing a
//!   dead daemon held stays counted past its restart. A slot per rank rather than per job:
//!   a rank belongs to one job at a time and a detach frees all of it at once.
//! - **A reservation is checked and written under `flock`**: read every slot, add this
//!   daemon's own (kept in memory, the truth of its slots), refuse or write. The critical
//!   section is a read of the slots (16 KiB for 128 nodes) and one 128-byte write; the lock
//!   is tried, not waited on, with a deadline ([`RESERVE_WAIT`]): a stuck daemon delays
//!   others' registrations by at most that and then they are refused with a typed error,
//!   never blocked.
//! - **A release never waits**: it is called where a region is forgotten, under the core
//!   lock. It lowers the daemon's own count in memory and writes its slots only if the
//!   lock is free at once; else a thread of the ledger's own (which holds nothing else)
//!   writes them as soon as it can. Until then other daemons count this one's old, higher
//!   figure: a delay errs toward refusing, never toward overcommitting.
//! - **Plain file reads and writes, not a shared mapping**: exanetd has no unsafe code, and
//!   a registration is a control request, not the command path.
//!
//! The ledger and the budget are the rack's user's (mode 0600, in the rack's run
//! directory): the daemons of a rack trust each other, and a workload of that user could
//! stop a daemon anyway. A daemon without a budget file (a container, a daemon started by
//! hand, a rack brought up before this existed) or whose ledger is unusable falls back to
//! a budget of its own from what its cgroup or host has available, and says so in its
//! log: it still works, but only its own node is bounded.
//!
//! A refusal is a [`BudgetError`] naming the node, the job, the size asked and what the
//! budget has left; the daemon counts it as `host_memory_refused` (a ledger it could not
//! use in time: `host_memory_ledger`).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use exanet_control::host::{bytes, memory_available};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use tracing::{info, warn};

use exanet_control::rack::{MemoryBudget, Rack};

/// How long a registration tries for the ledger's lock before it is refused.
pub const RESERVE_WAIT: Duration = Duration::from_millis(500);
/// How long a starting daemon tries for it (to create or join the ledger).
const OPEN_WAIT: Duration = Duration::from_secs(5);
/// Between two tries of the lock.
const LOCK_RETRY: Duration = Duration::from_millis(1);

const MAGIC: [u8; 8] = *b"EXNMEML1";
const VERSION: u32 = 1;
const HEADER: usize = 64;
const RANKS: usize = exanet_proto::ni::RANKS;
/// A rank's slot: the job's tag and the bytes it holds, little-endian u64s.
const SLOT: usize = 16;
const NODE_SLOTS: usize = RANKS * SLOT;
/// Far more nodes than a host runs; bounds the ledger's size whatever a rack file says.
const MAX_NODES: usize = 1 << 16;

/// What the daemons sharing a budget may register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Every job together, the IP service's included.
    pub total: u64,
    /// Of `total`, what only the IP service's job may take.
    pub ip_reserve: u64,
    /// One job other than the IP service's.
    pub per_job: u64,
}

impl Budget {
    /// The budget `rack up` measured, one job holding `percent` of what jobs share.
    pub fn from_file(b: &MemoryBudget, percent: u8) -> Budget {
        Budget {
            total: b.total_bytes,
            ip_reserve: b.ip_bytes.min(b.total_bytes),
            per_job: b.per_job(percent),
        }
    }

    /// A budget of this daemon's own: the share `rack up` would give of what its host (or
    /// its cgroup, in a container) has available now. Unbounded when that cannot be read.
    pub fn own_host(percent: u8) -> Budget {
        let total = memory_available().map_or(u64::MAX, |a| {
            (u128::from(a) * u128::from(MemoryBudget::AVAILABLE_PERCENT) / 100) as u64
        });
        Budget::from_file(
            &MemoryBudget {
                total_bytes: total,
                ip_bytes: 0,
                available_bytes: 0,
                rack_bytes: 0,
            },
            percent,
        )
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} in all ({} of it for IP over ExaNet), {} per job",
            bytes(self.total),
            bytes(self.ip_reserve),
            bytes(self.per_job)
        )
    }
}

/// Why registered memory was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum BudgetError {
    /// The job holds what one job may hold on the host.
    Job {
        node: String,
        job: String,
        asked: u64,
        limit: u64,
        left: u64,
    },
    /// The host's daemons hold what they may hold together.
    Host {
        node: String,
        job: String,
        asked: u64,
        limit: u64,
        left: u64,
    },
    /// The ledger's lock stayed taken longer than [`RESERVE_WAIT`].
    Busy {
        node: String,
        job: String,
        asked: u64,
        path: PathBuf,
    },
    /// The ledger cannot be read or written (damaged, truncated, an I/O error).
    Ledger {
        node: String,
        path: PathBuf,
        message: String,
    },
    /// Within the budget, but the memory could not be made.
    Create {
        node: String,
        asked: u64,
        message: String,
    },
}

impl BudgetError {
    /// What the daemon counts it under (`exanet_node_errors_total{kind}`).
    pub fn kind(&self) -> &'static str {
        match self {
            BudgetError::Job { .. } | BudgetError::Host { .. } => "host_memory_refused",
            BudgetError::Busy { .. } | BudgetError::Ledger { .. } => "host_memory_ledger",
            BudgetError::Create { .. } => "workload_request",
        }
    }
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetError::Job {
                node,
                job,
                asked,
                limit,
                left,
            } => write!(
                f,
                "{node}: job {job} may not register {} more: one job may hold {} of registered \
                 memory on this host, and job {job} has {} of it left",
                bytes(*asked),
                bytes(*limit),
                bytes(*left)
            ),
            BudgetError::Host {
                node,
                job,
                asked,
                limit,
                left,
            } => write!(
                f,
                "{node}: job {job} may not register {} more: this host's daemons may hold {} \
                 of registered memory for it, and {} of it is left",
                bytes(*asked),
                bytes(*limit),
                bytes(*left)
            ),
            BudgetError::Busy {
                node,
                job,
                asked,
                path,
            } => write!(
                f,
                "{node}: job {job} may not register {} now: the host's memory ledger {} \
                 stayed locked for {} ms",
                bytes(*asked),
                path.display(),
                RESERVE_WAIT.as_millis()
            ),
            BudgetError::Ledger {
                node,
                path,
                message,
            } => write!(f, "{node}: memory ledger {}: {message}", path.display()),
            BudgetError::Create {
                node,
                asked,
                message,
            } => write!(
                f,
                "{node}: cannot make {} of registered memory: {message}",
                bytes(*asked)
            ),
        }
    }
}

impl std::error::Error for BudgetError {}

/// The budget of this daemon: shared through a ledger with the host's other daemons, or
/// its own.
#[derive(Clone)]
pub struct HostBudget {
    inner: Arc<Inner>,
}

struct Inner {
    node: String,
    budget: Budget,
    /// `None`: a budget of this daemon's own.
    ledger: Option<LedgerAt>,
    /// The ledger, taken while locked. Also serializes this daemon's own reservations
    /// (`flock` is per open file: it does not keep this process's threads apart).
    file: Mutex<Option<File>>,
    /// What this daemon's ranks hold: the truth of its slots in the ledger.
    mine: [Own; RANKS],
    /// Its slots in the ledger are behind `mine`.
    dirty: AtomicBool,
}

struct LedgerAt {
    path: PathBuf,
    index: usize,
    nodes: usize,
    /// Wakes the thread that writes this daemon's slots when a release could not.
    flusher: mpsc::SyncSender<()>,
}

#[derive(Default)]
struct Own {
    tag: AtomicU64,
    bytes: AtomicU64,
}

/// Registered memory counted against the budget until this is dropped.
pub struct Reservation {
    inner: Arc<Inner>,
    rank: u8,
    bytes: u64,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reservation({} bytes, rank {})", self.bytes, self.rank)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.inner.release(self.rank, self.bytes);
    }
}

impl HostBudget {
    /// The budget this daemon should use: the host's (`rack up`'s budget file and the ledger
    /// beside it), else one of its own; the log says which and why.
    pub fn for_daemon(rack: &Rack, id: exanet_proto::NodeId, name: &str) -> HostBudget {
        let layout = rack.layout();
        let percent = rack.file.job_host_memory_percent();
        let why = match MemoryBudget::read(&layout.memory_budget()) {
            Ok(Some(b)) => {
                let budget = Budget::from_file(&b, percent);
                let nodes = rack.shape().nodes() as usize;
                let ledger = layout.memory_ledger();
                match HostBudget::open(&ledger, budget, name, id.0 as usize, nodes) {
                    Ok(h) => {
                        info!(ledger = %ledger.display(), "registered memory: the host's budget, shared with its other daemons: {budget}");
                        return h;
                    }
                    Err(e) => e.to_string(),
                }
            }
            Ok(None) => format!(
                "no {} (a rack not brought up by `exactl rack up` on this host)",
                layout.memory_budget().display()
            ),
            Err(e) => e.to_string(),
        };
        let own = HostBudget::own(name, Budget::own_host(percent));
        warn!(
            "registered memory: no host-wide budget ({why}); this daemon has one of its own, \
             from what its host or cgroup has available: {}",
            own.budget()
        );
        own
    }

    /// A budget of this daemon's own, shared with no one.
    pub fn own(node: &str, budget: Budget) -> HostBudget {
        HostBudget {
            inner: Arc::new(Inner {
                node: node.to_string(),
                budget,
                ledger: None,
                file: Mutex::new(None),
                mine: Default::default(),
                dirty: AtomicBool::new(false),
            }),
        }
    }

    /// Joins the ledger at `path` (creating it if this is the first daemon) as node
    /// `index` of `nodes`, zeroing that node's slots: whatever a previous run of this node
    /// held is not held any more.
    pub fn open(
        path: &Path,
        budget: Budget,
        node: &str,
        index: usize,
        nodes: usize,
    ) -> Result<HostBudget, BudgetError> {
        let fail = |message: String| BudgetError::Ledger {
            node: node.to_string(),
            path: path.to_path_buf(),
            message,
        };
        if nodes == 0 || nodes > MAX_NODES || index >= nodes {
            return Err(fail(format!("node {index} of {nodes}: no such slot")));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| fail(format!("cannot open: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat: {e}")))?;
        // Another user's file would let that user refuse every registration of the host
        // (or lift the limits): only one of this daemon's own user is trusted.
        let me = nix::unistd::geteuid().as_raw();
        if !meta.is_file() || meta.uid() != me {
            return Err(fail(format!(
                "not a regular file of this daemon's user (uid {me})"
            )));
        }
        let locked = lock_within(file, OPEN_WAIT).map_err(|(_, e)| fail(e))?;
        let joined = join(&locked, nodes, index).map_err(fail);
        let file = unlock(locked);
        joined?;
        let (flusher, wake) = mpsc::sync_channel(1);
        let inner = Arc::new(Inner {
            node: node.to_string(),
            budget,
            ledger: Some(LedgerAt {
                path: path.to_path_buf(),
                index,
                nodes,
                flusher,
            }),
            file: Mutex::new(file),
            mine: Default::default(),
            dirty: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("memory-ledger".into())
            .spawn(move || flush_loop(weak, wake))
            .map_err(|e| fail(format!("cannot start its writer thread: {e}")))?;
        Ok(HostBudget { inner })
    }

    pub fn budget(&self) -> Budget {
        self.inner.budget
    }

    /// The node this budget counts for, as errors name it.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The ledger this budget is shared through, if any.
    pub fn ledger(&self) -> Option<&Path> {
        self.inner.ledger.as_ref().map(|l| l.path.as_path())
    }

    /// Counts `bytes` for `rank` of `job` if the budget has them: the job's share and the
    /// host's total, over what every daemon sharing the budget holds.
    pub fn reserve(&self, rank: u8, job: &str, bytes: u64) -> Result<Reservation, BudgetError> {
        self.inner.reserve(rank, job, bytes)?;
        Ok(Reservation {
            inner: Arc::clone(&self.inner),
            rank,
            bytes,
        })
    }

    /// Zeroes this daemon's slots in the ledger: it is stopping, and what its workloads
    /// still map is theirs from now on (as after a detach). Waits at most [`RESERVE_WAIT`].
    pub fn leave(&self) {
        let Some(l) = &self.inner.ledger else {
            return;
        };
        let mut guard = lock_mutex(&self.inner.file);
        // Regions dropped after this (sessions still ending) must not write their ranks'
        // figures back.
        for s in &self.inner.mine {
            s.bytes.store(0, Ordering::Release);
        }
        let Some(file) = guard.take() else {
            return;
        };
        match lock_within(file, RESERVE_WAIT) {
            Ok(locked) => {
                if let Err(e) = write_node(&locked, l.index, &[0; NODE_SLOTS]) {
                    warn!(error = %e, "cannot zero this node's slots of the memory ledger");
                }
                *guard = unlock(locked);
            }
            Err((file, e)) => {
                warn!(error = %e, "cannot zero this node's slots of the memory ledger");
                *guard = Some(file);
            }
        }
    }
}

impl Inner {
    fn reserve(&self, rank: u8, job: &str, bytes: u64) -> Result<(), BudgetError> {
        let r = usize::from(rank);
        if r >= RANKS {
            return Err(self.ledger_error(format!("no rank {rank} on a node")));
        }
        // One wait in all, for this daemon's other registrations and for the other
        // daemons': registrations made at once are refused after it, not queued after
        // one another's.
        let deadline = Instant::now() + RESERVE_WAIT;
        let busy = |path: &Path| BudgetError::Busy {
            node: self.node.clone(),
            job: job.to_string(),
            asked: bytes,
            path: path.to_path_buf(),
        };
        let Some(l) = &self.ledger else {
            let _guard = lock_mutex(&self.file);
            return self.check_and_take(&[], r, job, bytes);
        };
        let Some(mut guard) = lock_mutex_until(&self.file, deadline) else {
            return Err(busy(&l.path));
        };
        let Some(file) = guard.take() else {
            return Err(self.ledger_error("lost: its lock could not be let go".into()));
        };
        let locked = match lock_within(file, deadline.saturating_duration_since(Instant::now())) {
            Ok(x) => x,
            Err((file, _)) => {
                *guard = Some(file);
                return Err(busy(&l.path));
            }
        };
        let done = read_slots(&locked, l.nodes)
            .map_err(|e| self.ledger_error(e))
            .and_then(|mut all| {
                // This daemon's own slots from memory: the file may be behind.
                all.drain(l.index * RANKS..(l.index + 1) * RANKS);
                self.check_and_take(&all, r, job, bytes)?;
                if let Err(e) = self.write_mine(&locked, l) {
                    self.give_back(r, bytes);
                    return Err(self.ledger_error(e));
                }
                Ok(())
            });
        *guard = unlock(locked);
        done
    }

    /// Refuses `bytes` more for rank `r` of `job` beyond the budget, counting `others`'
    /// slots and this daemon's own; else counts them as the rank's.
    fn check_and_take(
        &self,
        others: &[(u64, u64)],
        r: usize,
        job: &str,
        bytes: u64,
    ) -> Result<(), BudgetError> {
        let tag = job_tag(job);
        let ip = job_tag(exanet_control::ip::JOB_NAME);
        let own = self.mine.iter().map(|s| {
            (
                s.tag.load(Ordering::Acquire),
                s.bytes.load(Ordering::Acquire),
            )
        });
        let (mut all, mut jobs, mut this) = (0u64, 0u64, 0u64);
        for (t, b) in others.iter().copied().chain(own) {
            all = all.saturating_add(b);
            if t != ip {
                jobs = jobs.saturating_add(b);
            }
            if t == tag {
                this = this.saturating_add(b);
            }
        }
        let mine = &self.mine[r];
        let held = mine.bytes.load(Ordering::Acquire);
        if held > 0 && mine.tag.load(Ordering::Acquire) != tag {
            // A detach frees all of a rank before the rank is given again: a rank holding
            // another job's memory is a bug, and counting it under either job would be wrong.
            return Err(self.ledger_error(format!(
                "rank {r} still holds memory of another job than {job}"
            )));
        }
        let b = &self.budget;
        let refuse = |limit: u64, held: u64, per_job: bool| {
            let (node, job) = (self.node.clone(), job.to_string());
            let left = limit.saturating_sub(held);
            if per_job {
                BudgetError::Job {
                    node,
                    job,
                    asked: bytes,
                    limit,
                    left,
                }
            } else {
                BudgetError::Host {
                    node,
                    job,
                    asked: bytes,
                    limit,
                    left,
                }
            }
        };
        if tag != ip {
            if this.saturating_add(bytes) > b.per_job {
                return Err(refuse(b.per_job, this, true));
            }
            let shared = b.total.saturating_sub(b.ip_reserve);
            // Jobs may not take the IP service's reserve, nor what it took beyond it.
            let room = shared.saturating_sub(jobs).min(b.total.saturating_sub(all));
            if bytes > room {
                return Err(refuse(shared, shared.saturating_sub(room), false));
            }
        } else if all.saturating_add(bytes) > b.total {
            return Err(refuse(b.total, all, false));
        }
        mine.tag.store(tag, Ordering::Release);
        mine.bytes.fetch_add(bytes, Ordering::AcqRel);
        Ok(())
    }

    fn give_back(&self, r: usize, bytes: u64) {
        let _ = self.mine[r]
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(bytes))
            });
    }

    /// Called where memory is forgotten, maybe under the core lock: never waits for the
    /// ledger (see the module's documentation).
    fn release(&self, rank: u8, bytes: u64) {
        let r = usize::from(rank);
        if r >= RANKS || bytes == 0 {
            return;
        }
        self.give_back(r, bytes);
        let Some(l) = &self.ledger else {
            return;
        };
        self.dirty.store(true, Ordering::Release);
        if !self.try_flush(l) {
            // Full: a wake-up is pending already.
            let _ = l.flusher.try_send(());
        }
    }

    /// Writes this daemon's slots if the ledger is free now; whether they are written.
    fn try_flush(&self, l: &LedgerAt) -> bool {
        let Ok(mut guard) = self.file.try_lock() else {
            return false;
        };
        let Some(file) = guard.take() else {
            // Lost: nothing can be written again; others keep counting the old figures.
            return true;
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => {
                let written = self.write_mine(&locked, l);
                *guard = unlock(locked);
                written.is_ok()
            }
            Err((file, _)) => {
                *guard = Some(file);
                false
            }
        }
    }

    /// Writes `mine` as this node's slots; the caller holds the lock.
    fn write_mine(&self, file: &File, l: &LedgerAt) -> Result<(), String> {
        // Cleared before the figures are read: a release after the read marks it again.
        self.dirty.store(false, Ordering::Release);
        let mut buf = [0u8; NODE_SLOTS];
        for (s, out) in self.mine.iter().zip(buf.chunks_exact_mut(SLOT)) {
            let bytes = s.bytes.load(Ordering::Acquire);
            let tag = if bytes == 0 {
                0
            } else {
                s.tag.load(Ordering::Acquire)
            };
            out[..8].copy_from_slice(&tag.to_le_bytes());
            out[8..].copy_from_slice(&bytes.to_le_bytes());
        }
        write_node(file, l.index, &buf).inspect_err(|_| {
            self.dirty.store(true, Ordering::Release);
        })
    }

    fn ledger_error(&self, message: String) -> BudgetError {
        BudgetError::Ledger {
            node: self.node.clone(),
            path: self
                .ledger
                .as_ref()
                .map_or_else(PathBuf::new, |l| l.path.clone()),
            message,
        }
    }
}

/// Writes this daemon's slots whenever a release could not: it holds nothing anyone else
/// waits for, so it may wait for the ledger as long as it takes. Ends with the budget.
fn flush_loop(weak: Weak<Inner>, wake: mpsc::Receiver<()>) {
    while wake.recv().is_ok() {
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let Some(l) = &inner.ledger else {
            return;
        };
        while inner.dirty.load(Ordering::Acquire) && !inner.try_flush(l) {
            std::thread::sleep(LOCK_RETRY * 10);
        }
    }
}

fn lock_mutex<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded file stays usable whatever panicked while holding it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`lock_mutex`], trying until `deadline`.
fn lock_mutex_until<T>(m: &Mutex<T>, deadline: Instant) -> Option<MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(LOCK_RETRY)
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// Takes the ledger's lock, trying until `within` has passed.
fn lock_within(file: File, within: Duration) -> Result<Flock<File>, (File, String)> {
    let t0 = Instant::now();
    let mut file = file;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if t0.elapsed() < within => {
                file = f;
                std::thread::sleep(LOCK_RETRY);
            }
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err((f, format!("still locked after {} ms", within.as_millis())))
            }
            Err((f, e)) => return Err((f, format!("cannot lock: {e}"))),
        }
    }
}

/// Lets the ledger's lock go; `None` (the ledger lost, logged) in the one case it cannot,
/// where dropping the lock would panic in `nix` and closing the file would not help
/// (another descriptor of it may be open): this daemon then stops using the ledger.
fn unlock(locked: Flock<File>) -> Option<File> {
    match locked.unlock() {
        Ok(f) => Some(f),
        Err((l, e)) => {
            warn!(error = %e, "cannot let the memory ledger's lock go; not using it any more");
            std::mem::forget(l);
            None
        }
    }
}

/// Makes the ledger if it is new, checks it is one of `nodes` nodes, zeroes slot `index`.
fn join(file: &File, nodes: usize, index: usize) -> Result<(), String> {
    let want = (HEADER + nodes * NODE_SLOTS) as u64;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot stat: {e}"))?
        .len();
    if len == 0 {
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&(nodes as u32).to_le_bytes());
        header[16..20].copy_from_slice(&(RANKS as u32).to_le_bytes());
        file.set_len(want)
            .map_err(|e| format!("cannot size it: {e}"))?;
        file.write_all_at(&header, 0)
            .map_err(|e| format!("cannot write its header: {e}"))?;
    } else {
        check_header(file, nodes)?;
    }
    write_node(file, index, &[0; NODE_SLOTS])
}

/// The ledger is one of this format for `nodes` nodes, whole.
fn check_header(file: &File, nodes: usize) -> Result<(), String> {
    let want = (HEADER + nodes * NODE_SLOTS) as u64;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot stat: {e}"))?
        .len();
    let mut header = [0u8; HEADER];
    if len < HEADER as u64 {
        return Err(format!("{len} bytes: too short for a ledger"));
    }
    file.read_exact_at(&mut header, 0)
        .map_err(|e| format!("cannot read its header: {e}"))?;
    let u32_at =
        |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    if header[..8] != MAGIC || u32_at(8) != VERSION {
        return Err("not a memory ledger of this version".into());
    }
    if u32_at(12) as usize != nodes || u32_at(16) as usize != RANKS {
        return Err(format!(
            "made for {} nodes of {} ranks, this rack has {nodes} of {RANKS} (left from \
             another rack? `exactl rack up` makes a new one)",
            u32_at(12),
            u32_at(16)
        ));
    }
    if len != want {
        return Err(format!(
            "{len} bytes, where a ledger of {nodes} nodes has {want}"
        ));
    }
    Ok(())
}

/// Every slot of the ledger, node by node: (job tag, bytes).
fn read_slots(file: &File, nodes: usize) -> Result<Vec<(u64, u64)>, String> {
    // Checked on every read: someone may have truncated or rewritten it since.
    check_header(file, nodes)?;
    let mut buf = vec![0u8; nodes * NODE_SLOTS];
    file.read_exact_at(&mut buf, HEADER as u64)
        .map_err(|e| format!("cannot read: {e}"))?;
    let u64_at = |c: &[u8]| {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        u64::from_le_bytes(b)
    };
    Ok(buf
        .chunks_exact(SLOT)
        .map(|s| (u64_at(&s[..8]), u64_at(&s[8..])))
        .collect())
}

fn write_node(file: &File, index: usize, slots: &[u8; NODE_SLOTS]) -> Result<(), String> {
    file.write_all_at(slots, (HEADER + index * NODE_SLOTS) as u64)
        .map_err(|e| format!("cannot write: {e}"))
}

/// A job's name as its slots carry it (FNV-1a): the same in every daemon. Two names that
/// collide would share one job's limit, which errs toward refusing. Never 0, an empty
/// slot's.
fn job_tag(job: &str) -> u64 {
    let h = job.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A scratch directory removed at the end of the test.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!(
                "exanetd-budget-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
        fn ledger(&self) -> PathBuf {
            self.0.join("memory-ledger")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// 100 MiB in all, 10 of it for IP, 60 per job.
    const BUDGET: Budget = Budget {
        total: 100 * MIB,
        ip_reserve: 10 * MIB,
        per_job: 60 * MIB,
    };

    /// Node `index` of a two-node host sharing the ledger in `s`.
    fn daemon(s: &Scratch, index: usize) -> HostBudget {
        HostBudget::open(&s.ledger(), BUDGET, &format!("N{index}"), index, 2).unwrap()
    }

    #[test]
    fn a_job_is_refused_past_its_host_share_across_nodes_while_another_registers() {
        let s = Scratch::new("job");
        let (a, b) = (daemon(&s, 0), daemon(&s, 1));
        let _a1 = a.reserve(0, "alice", 40 * MIB).unwrap();
        // Each node alone would allow it; the two together hold more than the job may.
        let e = b.reserve(3, "alice", 30 * MIB).unwrap_err();
        assert_eq!(
            e,
            BudgetError::Job {
                node: "N1".into(),
                job: "alice".into(),
                asked: 30 * MIB,
                limit: 60 * MIB,
                left: 20 * MIB,
            }
        );
        assert_eq!(e.kind(), "host_memory_refused");
        let msg = e.to_string();
        assert!(
            msg.starts_with("N1: job alice may not register 30.0 MiB more")
                && msg.contains("60.0 MiB")
                && msg.contains("20.0 MiB of it left"),
            "{msg}"
        );
        let _b1 = b.reserve(3, "alice", 20 * MIB).unwrap();
        let _b2 = b.reserve(4, "bob", 30 * MIB).unwrap();
    }

    #[test]
    fn the_host_total_refuses_every_job_and_a_release_makes_room_again() {
        let s = Scratch::new("total");
        let (a, b) = (daemon(&s, 0), daemon(&s, 1));
        let a1 = a.reserve(0, "alice", 50 * MIB).unwrap();
        let _b1 = b.reserve(1, "bob", 40 * MIB).unwrap();
        // Jobs share 90 MiB (the other 10 are the IP service's): 0 left.
        let e = b.reserve(2, "carol", MIB).unwrap_err();
        assert!(
            matches!(e, BudgetError::Host { limit, left: 0, .. } if limit == 90 * MIB),
            "{e:?}"
        );
        assert_eq!(e.kind(), "host_memory_refused");
        drop(a1);
        let _b2 = b.reserve(2, "carol", 50 * MIB).unwrap();
    }

    #[test]
    fn the_ip_services_reserve_is_theirs_alone() {
        let s = Scratch::new("ip");
        let (a, b) = (daemon(&s, 0), daemon(&s, 1));
        let _ip = a.reserve(7, "ip", 5 * MIB).unwrap();
        let _x = b.reserve(0, "alice", 60 * MIB).unwrap();
        let _y = b.reserve(1, "bob", 30 * MIB).unwrap();
        assert!(matches!(
            a.reserve(0, "bob", MIB),
            Err(BudgetError::Host { .. })
        ));
        // The IP service still has the rest of its reserve.
        let _ip2 = b.reserve(7, "ip", 5 * MIB).unwrap();
        assert!(matches!(
            b.reserve(7, "ip", MIB),
            Err(BudgetError::Host { left: 0, .. })
        ));
    }

    #[test]
    fn a_restarted_daemon_forgets_what_its_previous_run_held() {
        let s = Scratch::new("restart");
        let (a, b) = (daemon(&s, 0), daemon(&s, 1));
        // A crash: the reservation is never given back, the daemon just goes away.
        std::mem::forget(a.reserve(0, "alice", 60 * MIB).unwrap());
        drop(a);
        assert!(matches!(
            b.reserve(0, "alice", MIB),
            Err(BudgetError::Job { left: 0, .. })
        ));
        let _a = daemon(&s, 0);
        let _b1 = b.reserve(0, "alice", 60 * MIB).unwrap();
    }

    #[test]
    fn a_daemon_that_leaves_gives_its_share_back() {
        let s = Scratch::new("leave");
        let (a, b) = (daemon(&s, 0), daemon(&s, 1));
        let held = a.reserve(0, "alice", 60 * MIB).unwrap();
        a.leave();
        let _b1 = b.reserve(0, "alice", 60 * MIB).unwrap();
        drop(held);
    }

    #[test]
    fn a_release_never_waits_for_the_ledger_and_is_written_once_it_is_free() {
        let s = Scratch::new("busy");
        let (a, b) = (daemon(&s, 0), daemon(&s, 1));
        let held = a.reserve(0, "alice", 60 * MIB).unwrap();
        // Another daemon stuck inside its critical section.
        let stuck = Flock::lock(
            File::open(s.ledger()).unwrap(),
            FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        // Dropped on a thread of its own while the ledger stays locked: a release that
        // waited for the lock could not return before `stuck` lets go, below.
        let (done, dropped) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(held);
            let _ = done.send(());
        });
        assert!(
            dropped.recv_timeout(Duration::from_secs(10)).is_ok(),
            "a release waited for the ledger's lock"
        );
        let t0 = Instant::now();
        let e = b.reserve(0, "alice", MIB).unwrap_err();
        let waited = t0.elapsed();
        assert!(
            matches!(e, BudgetError::Busy { .. }) && e.kind() == "host_memory_ledger",
            "{e:?}"
        );
        // Refused after trying for its whole wait, not at once.
        assert!(waited >= RESERVE_WAIT, "{waited:?}");
        drop(stuck);
        // The ledger's writer thread writes the release as soon as the lock is free.
        let t0 = Instant::now();
        loop {
            match b.reserve(0, "alice", 60 * MIB) {
                Ok(_) => break,
                Err(e) => assert!(t0.elapsed() < Duration::from_secs(10), "{e}"),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_damaged_ledger_is_an_error_not_a_panic() {
        let s = Scratch::new("damaged");
        let open = |nodes| HostBudget::open(&s.ledger(), BUDGET, "N0", 0, nodes);
        let a = open(2).unwrap();
        // Another rack's shape.
        let e = open(3).err().unwrap();
        assert!(e.to_string().contains("made for 2 nodes"), "{e}");
        // Cut short under a running daemon: its next registration says so.
        let f = OpenOptions::new().write(true).open(s.ledger()).unwrap();
        f.set_len(HEADER as u64 + 5).unwrap();
        let e = a.reserve(0, "alice", MIB).unwrap_err();
        assert!(
            matches!(&e, BudgetError::Ledger { message, .. } if message.contains("69 bytes")),
            "{e:?}"
        );
        assert_eq!(e.kind(), "host_memory_ledger");
        for junk in [&b"EXN"[..], &[0xff; 64 + 2 * NODE_SLOTS][..]] {
            std::fs::write(s.ledger(), junk).unwrap();
            assert!(
                matches!(open(2), Err(BudgetError::Ledger { .. })),
                "{junk:?}"
            );
        }
        assert!(HostBudget::open(&s.ledger(), BUDGET, "N0", 2, 2).is_err());
        // A symlink planted in its place is not followed.
        std::fs::remove_file(s.ledger()).unwrap();
        std::os::unix::fs::symlink(s.0.join("elsewhere"), s.ledger()).unwrap();
        assert!(open(2).is_err());
        assert!(!s.0.join("elsewhere").exists());
    }

    #[test]
    fn a_daemon_of_its_own_is_bounded_alone_and_refuses_a_bad_rank() {
        let own = HostBudget::own("N0", BUDGET);
        assert_eq!(own.ledger(), None);
        let _x = own.reserve(0, "alice", 60 * MIB).unwrap();
        assert!(matches!(
            own.reserve(1, "alice", 1),
            Err(BudgetError::Job { .. })
        ));
        let y = own.reserve(1, "bob", 30 * MIB).unwrap();
        assert!(matches!(
            own.reserve(2, "carol", 1),
            Err(BudgetError::Host { .. })
        ));
        drop(y);
        let _z = own.reserve(2, "carol", 30 * MIB).unwrap();
        assert!(matches!(
            own.reserve(8, "carol", 1),
            Err(BudgetError::Ledger { .. })
        ));
        // Measured from this host: something, and never more than it has.
        let b = Budget::own_host(50);
        assert!(b.total > 0 && b.per_job <= b.total / 2 + 1, "{b:?}");
    }

    #[test]
    fn sizes_read_in_their_unit() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(30 * MIB), "30.0 MiB");
        assert_ne!(job_tag("alice"), job_tag("bob"));
        assert_ne!(job_tag(""), 0);
    }
}
