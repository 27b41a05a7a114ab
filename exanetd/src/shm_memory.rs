//! The memory the ranks of this node registered, as the NI reads and writes it: shared
//! memory regions the daemon made, at the VAs the workload service placed them
//! (`exanet_proto::workload::WorkloadService::place_region`), looked up by the core's
//! `Regions`.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use exanet_proto::ni::{Backing, BackingFault, MemFault, Memory, Regions};
use exanet_shm::Region;
use tracing::debug;

/// A shared memory region as the NI's backing store.
pub struct ShmRegion(Region);

impl Backing for ShmRegion {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), BackingFault> {
        self.0.read(off, buf).map_err(|_| BackingFault)
    }

    fn write_at(&mut self, off: usize, data: &[u8]) -> Result<(), BackingFault> {
        self.0.write(off, data).map_err(|_| BackingFault)
    }
}

/// Memory registered by the ranks of this node: what the NI reads and writes. Shared
/// between the core (the NI's accesses) and the attach threads (registration).
#[derive(Clone, Default)]
pub struct ShmMemory {
    regions: Arc<RwLock<Regions<ShmRegion>>>,
}

impl ShmMemory {
    pub fn new() -> ShmMemory {
        ShmMemory::default()
    }

    fn read_guard(&self) -> RwLockReadGuard<'_, Regions<ShmRegion>> {
        self.regions.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_guard(&self) -> RwLockWriteGuard<'_, Regions<ShmRegion>> {
        self.regions.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps `region` at `va` of `rank`, where the service placed it.
    pub fn insert(&self, rank: u8, va: u64, region: Region) {
        self.write_guard().insert(rank, va, ShmRegion(region));
    }

    /// Unmaps the region at `va` of `rank`; its length, if there was one.
    pub fn remove(&self, rank: u8, va: u64) -> Option<u64> {
        let gone = self.write_guard().remove(rank, va)?;
        Some(release(gone))
    }

    /// Unmaps every region of `rank`.
    pub fn clear(&self, rank: u8) {
        let gone = self.write_guard().clear(rank);
        for r in gone {
            release(r);
        }
    }
}

/// The daemon made the memory and allocated its pages; the workload may still map it after
/// the daemon stops serving it, so give the pages back: what the workload keeps from then on
/// is its own allocation, not the daemon's (which would let register/unregister loops pile
/// up memory outside every quota).
fn release(r: ShmRegion) -> u64 {
    let len = r.0.len() as u64;
    if let Err(e) = r.0.discard() {
        debug!(error = %e, "cannot give a region's pages back");
    }
    len
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
        region.0.write(off, data).map_err(|_| fault)
    }
}
