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

/// The store behind a region refused an access (a shared memory region the daemon could
/// not read or write, say).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("the memory behind a registered region refused the access")]
pub struct BackingFault;

/// The bytes behind one registered region: a `Vec` in the simulator, a shared memory
/// region in the daemon. [`Regions`] checks the range before it calls these.
pub trait Backing {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fills `buf` from `off`; an error is a fault of the backing store itself.
    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), BackingFault>;
    fn write_at(&mut self, off: usize, data: &[u8]) -> Result<(), BackingFault>;
}

impl Backing for Vec<u8> {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), BackingFault> {
        buf.copy_from_slice(self.get(off..off + buf.len()).ok_or(BackingFault)?);
        Ok(())
    }

    fn write_at(&mut self, off: usize, data: &[u8]) -> Result<(), BackingFault> {
        self.get_mut(off..off + data.len())
            .ok_or(BackingFault)?
            .copy_from_slice(data);
        Ok(())
    }
}

/// Registered memory as regions placed at VAs of ranks: the lookup (an access must lie
/// inside one region of its rank) and the fault, the same whatever backs the regions. The
/// daemon's shared memory and the simulator's plain bytes are both this.
#[derive(Clone, Debug)]
pub struct Regions<B> {
    map: BTreeMap<(u8, u64), B>,
}

impl<B> Default for Regions<B> {
    fn default() -> Self {
        Regions {
            map: BTreeMap::new(),
        }
    }
}

impl<B: Backing> Regions<B> {
    /// Maps `region` at `va` of `rank` (replacing a region at that VA).
    pub fn insert(&mut self, rank: u8, va: u64, region: B) {
        self.map.insert((rank, va), region);
    }

    /// Unmaps the region at `va` of `rank`.
    pub fn remove(&mut self, rank: u8, va: u64) -> Option<B> {
        self.map.remove(&(rank, va))
    }

    /// Unmaps every region of `rank`.
    pub fn clear(&mut self, rank: u8) -> Vec<B> {
        let vas: Vec<u64> = self
            .map
            .range((rank, 0)..=(rank, u64::MAX))
            .map(|(&(_, va), _)| va)
            .collect();
        vas.into_iter()
            .filter_map(|va| self.map.remove(&(rank, va)))
            .collect()
    }

    /// The region holding `len` bytes from `va` of `rank`, and the offset of `va` in it:
    /// for a backing that can be written through a shared reference (shared memory),
    /// whose owner need not take `&mut` to write.
    pub fn locate(&self, rank: u8, va: u64, len: usize) -> Option<(&B, usize)> {
        let (key, off) = self.find(rank, va, len)?;
        Some((self.map.get(&key)?, off))
    }

    /// Where `len` bytes from `va` of `rank` lie: the region's key and the offset in it.
    fn find(&self, rank: u8, va: u64, len: usize) -> Option<((u8, u64), usize)> {
        let (&(r, base), region) = self.map.range(..=(rank, va)).next_back()?;
        let off = usize::try_from(va.checked_sub(base)?).ok()?;
        (r == rank && off.checked_add(len)? <= region.len()).then_some(((r, base), off))
    }
}

impl<B: Backing> Memory for Regions<B> {
    fn contains(&self, rank: u8, va: u64, len: u64) -> bool {
        usize::try_from(len).is_ok_and(|len| self.find(rank, va, len).is_some())
    }

    fn read(&self, rank: u8, va: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: buf.len(),
        };
        let (key, off) = self.find(rank, va, buf.len()).ok_or(fault)?;
        let region = self.map.get(&key).ok_or(fault)?;
        region.read_at(off, buf).map_err(|_| fault)
    }

    fn write(&mut self, rank: u8, va: u64, data: &[u8]) -> Result<(), MemFault> {
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: data.len(),
        };
        let (key, off) = self.find(rank, va, data.len()).ok_or(fault)?;
        let region = self.map.get_mut(&key).ok_or(fault)?;
        region.write_at(off, data).map_err(|_| fault)
    }
}

/// Plain in-process memory: regions of bytes per rank. Used by the simulator and tests.
pub type VecMemory = Regions<Vec<u8>>;

impl VecMemory {
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Registers `len` zeroed bytes at `va` for `rank` (replacing a region at that VA).
    pub fn register(&mut self, rank: u8, va: u64, len: usize) {
        self.insert(rank, va, vec![0; len]);
    }
}
