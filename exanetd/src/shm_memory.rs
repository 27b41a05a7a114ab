//! The memory the ranks of this node registered, as the NI reads and writes it: shared
//! memory regions the daemon made, at the VAs the workload service placed them
//! (`exanet_proto::workload::WorkloadService::place_region`), looked up by the core's
//! `Regions`. Each region is counted against the host's budget
//! ([`crate::host_budget`]) from before it is made until it is forgotten.

use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use exanet_proto::ni::{Backing, BackingFault, MemFault, Memory, Regions};
use exanet_shm::Region;
use tracing::debug;

use crate::host_budget::{Budget, BudgetError, HostBudget, Reservation};

/// How long an unregistration or a detach waits for its regions to give their share of the
/// host's budget back before it is answered.
pub const SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// A shared memory region as the NI's backing store, with what it holds of the host's
/// budget: dropping it (forgotten, its rank detached, or never placed) gives that back.
pub struct ShmRegion {
    region: Region,
    _held: Option<Reservation>,
}

impl From<Region> for ShmRegion {
    /// A region counted against no budget.
    fn from(region: Region) -> ShmRegion {
        ShmRegion {
            region,
            _held: None,
        }
    }
}

impl std::fmt::Debug for ShmRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmRegion")
            .field("len", &self.region.len())
            .field("held", &self._held)
            .finish()
    }
}

impl Backing for ShmRegion {
    fn len(&self) -> usize {
        self.region.len()
    }

    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), BackingFault> {
        self.region.read(off, buf).map_err(|_| BackingFault)
    }

    fn write_at(&mut self, off: usize, data: &[u8]) -> Result<(), BackingFault> {
        self.region.write(off, data).map_err(|_| BackingFault)
    }
}

/// Memory registered by the ranks of this node: what the NI reads and writes. Shared
/// between the core (the NI's accesses) and the attach threads (registration).
#[derive(Clone, Default)]
pub struct ShmMemory {
    regions: Arc<RwLock<Regions<ShmRegion>>>,
    /// Set once by the daemon at start ([`ShmMemory::use_budget`]); a memory never given
    /// one (a node built in a test) takes one of its own at its first region.
    budget: Arc<OnceLock<HostBudget>>,
}

impl ShmMemory {
    pub fn new() -> ShmMemory {
        ShmMemory::default()
    }

    /// Counts this node's regions against `budget`; false (and `budget` unused) when the
    /// memory has one already.
    pub fn use_budget(&self, budget: HostBudget) -> bool {
        self.budget.set(budget).is_ok()
    }

    pub fn budget(&self) -> &HostBudget {
        self.budget.get_or_init(|| {
            let own = HostBudget::own("this node", Budget::own_host(100));
            tracing::warn!(
                "registered memory: no budget was set up; this node has one of its own: {}",
                own.budget()
            );
            own
        })
    }

    /// Makes `size` bytes of registered memory for `rank` of `job`, named `name`, and a
    /// descriptor of it for the workload, once the host's budget has room: reserved
    /// before it is allocated, so two daemons cannot both allocate the last of it. The
    /// reservation goes with the region: given back when it is dropped, forgotten
    /// ([`ShmMemory::remove`]) or its rank cleared ([`ShmMemory::clear`]), so no error
    /// path keeps it.
    pub fn create_region(
        &self,
        name: &str,
        size: usize,
        rank: u8,
        job: &str,
    ) -> Result<(ShmRegion, OwnedFd), BudgetError> {
        let budget = self.budget();
        // What this rank forgot before was given back before its forgetting was answered
        // (`GivenBack`), so the budget is up to date here.
        let held = budget.reserve(rank, job, size as u64)?;
        let create = |e: &dyn std::fmt::Display| BudgetError::Create {
            node: budget.node().to_string(),
            asked: size as u64,
            message: e.to_string(),
        };
        let region = Region::create(name, size).map_err(|e| create(&e))?;
        let fd = region.try_clone_fd().map_err(|e| create(&e))?;
        Ok((
            ShmRegion {
                region,
                _held: Some(held),
            },
            fd,
        ))
    }

    fn read_guard(&self) -> RwLockReadGuard<'_, Regions<ShmRegion>> {
        self.regions.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_guard(&self) -> RwLockWriteGuard<'_, Regions<ShmRegion>> {
        self.regions.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps `region` at `va` of `rank`, where the service placed it: a
    /// region [`ShmMemory::create_region`] made, or a bare [`Region`] counted against no
    /// budget.
    pub fn insert(&self, rank: u8, va: u64, region: impl Into<ShmRegion>) {
        self.write_guard().insert(rank, va, region.into());
    }

    /// Unmaps the region at `va` of `rank`: its length, if there was one, and the end of
    /// its give-back (see [`GivenBack`]).
    pub fn remove(&self, rank: u8, va: u64) -> Option<(u64, GivenBack)> {
        let gone = self.write_guard().remove(rank, va)?;
        Some(release(gone))
    }

    /// Unmaps every region of `rank`; the ends of their give-backs.
    pub fn clear(&self, rank: u8) -> Vec<GivenBack> {
        let gone = self.write_guard().clear(rank);
        gone.into_iter().map(|r| release(r).1).collect()
    }
}

/// The daemon made the memory and allocated its pages; the workload may still map it after
/// the daemon stops serving it, so give the pages back: what the workload keeps from then on
/// is its own allocation, not the daemon's (which would let register/unregister loops pile
/// up memory outside every quota). Its reservation goes back to the budget after, as `r`
/// is dropped: the pages are given back before other daemons may count on them.
///
/// On a closer thread (`crate::closer::later`), as callers hold the core lock: the punch
/// takes the memfd's inode lock, which the workload can hold for as long as it likes (a
/// `write(2)` into the memfd from a buffer whose fault never ends), and the reservation's
/// give-back writes the host's ledger under a file lock.
fn release(r: ShmRegion) -> (u64, GivenBack) {
    let len = r.region.len() as u64;
    let (done, given) = std::sync::mpsc::sync_channel(1);
    crate::closer::later(move || {
        if let Err(e) = r.region.discard() {
            debug!(error = %e, "cannot give a region's pages back");
        }
        drop(r);
        let _ = done.send(());
    });
    (len, GivenBack(given))
}

/// The end of a region's give-back on a closer thread: its pages returned and its share of
/// the host's budget written back. Whoever answers the workload waits for it, outside every
/// lock and for a bounded time, so that a program that unregisters and then registers on
/// another node finds the share there (another daemon cannot know it is on its way).
#[derive(Debug)]
pub struct GivenBack(std::sync::mpsc::Receiver<()>);

impl GivenBack {
    /// Waits for the give-back until `deadline`; whether it ended.
    pub fn wait_until(&self, deadline: std::time::Instant) -> bool {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // A dropped sender is an ended job too (the job ran, or was dropped unrun).
        !matches!(
            self.0.recv_timeout(left),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        )
    }
}

impl Memory for ShmMemory {
    fn contains(&self, rank: u8, va: u64, len: u64) -> bool {
        self.read_guard().contains(rank, va, len)
    }

    fn read(&self, rank: u8, va: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        self.read_guard().read(rank, va, buf)
    }

    fn write(&mut self, rank: u8, va: u64, data: &[u8]) -> Result<(), MemFault> {
        // Shared memory is written through `&self`: the map is only read, so the NI's
        // writes (one per cell received) take the read lock, as its reads do.
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: data.len(),
        };
        let map = self.read_guard();
        let (region, off) = map.locate(rank, va, data.len()).ok_or(fault)?;
        region.region.write(off, data).map_err(|_| fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// A node whose jobs may register 4 MiB in all, 3 MiB each.
    fn memory() -> ShmMemory {
        let m = ShmMemory::new();
        assert!(m.use_budget(HostBudget::own(
            "N0",
            Budget {
                total: 4 * MIB as u64,
                ip_reserve: 0,
                per_job: 3 * MIB as u64,
            },
        )));
        m
    }

    #[test]
    fn a_region_holds_its_budget_until_forgotten_cleared_or_never_placed() {
        let m = memory();
        let name = "exanet-N0-r0";
        let (r, _fd) = m.create_region(name, 3 * MIB, 0, "alice").unwrap();
        let e = m.create_region(name, MIB, 1, "alice").unwrap_err();
        assert!(
            matches!(&e, BudgetError::Job { node, left: 0, .. } if node == "N0"),
            "{e:?}"
        );
        // Made but never placed (the service refused it): dropping it gives it back.
        drop(r);
        let (r, _fd) = m.create_region(name, 3 * MIB, 0, "alice").unwrap();
        m.insert(0, 1 << 30, r);
        assert!(m.create_region(name, MIB, 1, "alice").is_err());
        let soon = || std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (len, given) = m.remove(0, 1 << 30).unwrap();
        assert_eq!(len, 3 * MIB as u64);
        assert!(given.wait_until(soon()), "not given back");
        let (r, _fd) = m.create_region(name, 3 * MIB, 0, "alice").unwrap();
        m.insert(0, 1 << 30, r);
        let (r, _fd) = m.create_region(name, MIB, 2, "bob").unwrap();
        m.insert(2, 1 << 30, r);
        assert!(matches!(
            m.create_region(name, MIB, 2, "bob"),
            Err(BudgetError::Host { .. })
        ));
        assert!(m.clear(0).iter().all(|g| g.wait_until(soon())));
        let (r, _fd) = m.create_region(name, 2 * MIB, 2, "bob").unwrap();
        m.insert(2, 2 << 30, r);
        // A bare region (no budget) still maps, counted against nothing.
        m.insert(3, 1 << 30, Region::create(name, 4096).unwrap());
        assert!(m.contains(3, 1 << 30, 4096));
    }

    #[test]
    fn memory_that_cannot_be_made_gives_its_reservation_back() {
        let m = memory();
        // A name the kernel refuses: reserved, then not made.
        let e = m.create_region("bad\0name", MIB, 0, "alice").unwrap_err();
        assert_eq!(e.kind(), "workload_request", "{e}");
        assert!(e.to_string().starts_with("N0: cannot make 1.0 MiB"), "{e}");
        let _kept = m
            .create_region("exanet-N0-r0", 3 * MIB, 0, "alice")
            .unwrap();
    }
}
