//! The memory the NI reads and writes: what each rank of the node registered with it.
//! There is no pinning: every access is translated when it happens, and an access to
//! memory that is not registered is a fault (the SMMU's page fault, SPEC §4), which the
//! protocols turn into a NACK and a retry.

use std::collections::BTreeMap;

use thiserror::Error;

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum MemFault {
    #[error("rank {rank} has no memory registered at {va:#x}..+{len}")]
    Unmapped { rank: u8, va: u64, len: usize },
}

/// The node's registered memory, by rank and virtual address.
pub trait Memory {
    /// Whether `rank` has `len` bytes registered from `va` on, in one region: what a
    /// transfer is checked against when it is posted, before any of its blocks is cut.
    fn contains(&self, rank: u8, va: u64, len: u64) -> bool;
    fn read(&self, rank: u8, va: u64, buf: &mut [u8]) -> Result<(), MemFault>;
    fn write(&mut self, rank: u8, va: u64, data: &[u8]) -> Result<(), MemFault>;
}

/// Plain in-process memory: regions of bytes per rank. Used by the simulator and tests.
#[derive(Clone, Debug, Default)]
pub struct VecMemory {
    regions: BTreeMap<(u8, u64), Vec<u8>>,
}

impl VecMemory {
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Registers `len` zeroed bytes at `va` for `rank` (replacing a region at that VA).
    pub fn register(&mut self, rank: u8, va: u64, len: usize) {
        self.regions.insert((rank, va), vec![0; len]);
    }

    fn find(&self, rank: u8, va: u64, len: usize) -> Option<(u64, usize)> {
        let (&(r, base), region) = self.regions.range(..=(rank, va)).next_back()?;
        let off = va.checked_sub(base)? as usize;
        (r == rank && off.checked_add(len)? <= region.len()).then_some((base, off))
    }
}

impl Memory for VecMemory {
    fn contains(&self, rank: u8, va: u64, len: u64) -> bool {
        usize::try_from(len).is_ok_and(|len| self.find(rank, va, len).is_some())
    }

    fn read(&self, rank: u8, va: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: buf.len(),
        };
        let (base, off) = self.find(rank, va, buf.len()).ok_or(fault)?;
        buf.copy_from_slice(&self.regions[&(rank, base)][off..off + buf.len()]);
        Ok(())
    }

    fn write(&mut self, rank: u8, va: u64, data: &[u8]) -> Result<(), MemFault> {
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: data.len(),
        };
        let (base, off) = self.find(rank, va, data.len()).ok_or(fault)?;
        let r = self.regions.get_mut(&(rank, base)).expect("found above");
        r[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }
}
