//! The memory the ranks of this node registered, as the NI reads and writes it: shared
//! memory regions the daemon made, at the VAs the workload service placed them
//! (`exanet_proto::workload::WorkloadService::place_region`).

use std::sync::{Arc, RwLock};

use exanet_proto::ni::{MemFault, Memory, RANKS};
use exanet_proto::workload::Placed;
use exanet_shm::Region;
use tracing::debug;

/// Memory registered by the ranks of this node: what the NI reads and writes.
#[derive(Clone, Default)]
pub struct ShmMemory {
    ranks: Arc<RwLock<Vec<Vec<Registered>>>>,
}

#[derive(Clone)]
struct Registered {
    placed: Placed,
    region: Arc<Region>,
}

impl ShmMemory {
    pub fn new() -> ShmMemory {
        ShmMemory {
            ranks: Arc::new(RwLock::new(vec![Vec::new(); RANKS])),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Vec<Vec<Registered>>) -> T) -> T {
        let mut g = self.ranks.write().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Maps `region` at the place the service gave it in `rank`'s VA space.
    pub fn insert(&self, rank: u8, placed: Placed, region: Region) {
        self.with(|ranks| {
            if let Some(list) = ranks.get_mut(usize::from(rank)) {
                list.push(Registered {
                    placed,
                    region: Arc::new(region),
                });
            }
        })
    }

    /// Unmaps region `id` of `rank`; its length, if it had one.
    pub fn remove(&self, rank: u8, id: u32) -> Option<u64> {
        let gone = self.with(|ranks| {
            let list = ranks.get_mut(usize::from(rank))?;
            let i = list.iter().position(|r| r.placed.id == id)?;
            Some(list.remove(i))
        })?;
        Some(release(gone))
    }

    /// Unmaps every region of `rank`.
    pub fn clear(&self, rank: u8) {
        let gone = self.with(|ranks| {
            ranks
                .get_mut(usize::from(rank))
                .map(std::mem::take)
                .unwrap_or_default()
        });
        for r in gone {
            release(r);
        }
    }

    fn find(&self, rank: u8, va: u64, len: usize) -> Option<(Arc<Region>, usize)> {
        let g = self.ranks.read().unwrap_or_else(|p| p.into_inner());
        let list = g.get(usize::from(rank))?;
        list.iter().find_map(|r| {
            let off = usize::try_from(va.checked_sub(r.placed.va)?).ok()?;
            (off.checked_add(len)? <= r.region.len()).then(|| (r.region.clone(), off))
        })
    }
}

/// The daemon made the memory and allocated its pages; the workload may still map it after
/// the daemon stops serving it, so give the pages back: what the workload keeps from then on
/// is its own allocation, not the daemon's (which would let register/unregister loops pile
/// up memory outside every quota).
fn release(r: Registered) -> u64 {
    let len = r.region.len() as u64;
    if let Err(e) = r.region.discard() {
        debug!(error = %e, "cannot give a region's pages back");
    }
    len
}

impl Memory for ShmMemory {
    fn contains(&self, rank: u8, va: u64, len: u64) -> bool {
        usize::try_from(len).is_ok_and(|len| self.find(rank, va, len).is_some())
    }

    fn read(&self, rank: u8, va: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: buf.len(),
        };
        let (r, off) = self.find(rank, va, buf.len()).ok_or(fault)?;
        r.read(off, buf).map_err(|_| fault)
    }

    fn write(&mut self, rank: u8, va: u64, data: &[u8]) -> Result<(), MemFault> {
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: data.len(),
        };
        let (r, off) = self.find(rank, va, data.len()).ok_or(fault)?;
        r.write(off, data).map_err(|_| fault)
    }
}
