//! Memory regions the application registers (`fi_mr_reg`) as targets of one-sided
//! operations: which keys name which of its buffers, with which remote access. Safe Rust:
//! it resolves a (key, address, length) to a range of the application's memory; the C
//! entry points copy in and out of it, under the table's lock, so that a region closed
//! meanwhile is never touched.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::abi::{FI_REMOTE_READ, FI_REMOTE_WRITE};
use crate::msg::RmaRefusal;

/// A registered buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Where it is in the application's memory, and how long.
    pub base: usize,
    pub len: usize,
    /// The remote accesses it allows (`FI_REMOTE_READ`, `FI_REMOTE_WRITE`).
    pub access: u64,
    /// The address its first byte has in operations: its virtual address
    /// (`FI_MR_VIRT_ADDR`), else the `offset` it was registered with.
    pub start: u64,
}

/// How the domain names regions, from the `mr_mode` it was opened with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Naming {
    /// Operations give virtual addresses (`FI_MR_VIRT_ADDR`, `FI_MR_BASIC`), else offsets.
    pub virt_addr: bool,
    /// The provider picks keys (`FI_MR_PROV_KEY`, `FI_MR_BASIC`), else the application.
    pub prov_key: bool,
}

impl Naming {
    pub fn of(mr_mode: i32) -> Naming {
        use crate::abi::{FI_MR_BASIC, FI_MR_PROV_KEY, FI_MR_VIRT_ADDR};
        let basic = mr_mode == FI_MR_BASIC;
        Naming {
            virt_addr: basic || mr_mode & FI_MR_VIRT_ADDR != 0,
            prov_key: basic || mr_mode & FI_MR_PROV_KEY != 0,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum RegError {
    /// The key asked for names a region already (`-FI_ENOKEY`).
    KeyInUse(u64),
    /// No buffer, or one that wraps the address space.
    BadBuffer,
}

/// One domain's regions.
#[derive(Debug)]
pub struct MrTable {
    naming: Naming,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    regions: BTreeMap<u64, Region>,
    next_key: u64,
}

impl MrTable {
    /// `first_key`: where provider keys start (the owner picks one per process, so that
    /// a key of an earlier run does not name a region of this one).
    pub fn new(naming: Naming, first_key: u64) -> MrTable {
        MrTable {
            naming,
            inner: Mutex::new(Inner {
                regions: BTreeMap::new(),
                next_key: first_key,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `len` bytes at `base`; returns its key.
    pub fn register(
        &self,
        base: usize,
        len: usize,
        access: u64,
        offset: u64,
        requested_key: u64,
    ) -> Result<u64, RegError> {
        if (base == 0 && len > 0) || base.checked_add(len).is_none() {
            return Err(RegError::BadBuffer);
        }
        let mut i = self.lock();
        let key = if self.naming.prov_key {
            loop {
                let k = i.next_key;
                i.next_key = i.next_key.wrapping_add(1);
                if !i.regions.contains_key(&k) {
                    break k;
                }
            }
        } else if i.regions.contains_key(&requested_key) {
            return Err(RegError::KeyInUse(requested_key));
        } else {
            requested_key
        };
        let start = if self.naming.virt_addr {
            base as u64
        } else {
            offset
        };
        i.regions.insert(
            key,
            Region {
                base,
                len,
                access,
                start,
            },
        );
        Ok(key)
    }

    pub fn deregister(&self, key: u64) {
        self.lock().regions.remove(&key);
    }

    /// Runs `f` on the application's address of `len` bytes at `addr` of region `key`,
    /// if the region allows the remote access asked (`write`: `FI_REMOTE_WRITE`, else
    /// `FI_REMOTE_READ`), under the lock: the region stays registered meanwhile.
    pub fn with_range<T>(
        &self,
        key: u64,
        addr: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(usize) -> T,
    ) -> Result<T, RmaRefusal> {
        let i = self.lock();
        let r = i.regions.get(&key).ok_or(RmaRefusal::Denied)?;
        let need = if write {
            FI_REMOTE_WRITE
        } else {
            FI_REMOTE_READ
        };
        if r.access & need == 0 {
            return Err(RmaRefusal::Denied);
        }
        let off = addr.checked_sub(r.start).ok_or(RmaRefusal::Denied)?;
        let end = off.checked_add(len as u64).ok_or(RmaRefusal::Denied)?;
        if end > r.len as u64 {
            return Err(RmaRefusal::Denied);
        }
        Ok(f(r.base + off as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RW: u64 = FI_REMOTE_READ | FI_REMOTE_WRITE;

    #[test]
    fn ranges_resolve_inside_their_region_with_its_access_only() {
        let t = MrTable::new(
            Naming {
                virt_addr: false,
                prov_key: false,
            },
            0,
        );
        let k = t.register(0x10_000, 4096, FI_REMOTE_WRITE, 100, 7).unwrap();
        assert_eq!(k, 7);
        assert_eq!(
            t.register(0x20_000, 1, RW, 0, 7),
            Err(RegError::KeyInUse(7))
        );
        // Offsets from the registered one.
        assert_eq!(t.with_range(7, 100, 4096, true, |a| a), Ok(0x10_000));
        assert_eq!(t.with_range(7, 110, 10, true, |a| a), Ok(0x10_00a));
        assert_eq!(t.with_range(7, 99, 1, true, |a| a), Err(RmaRefusal::Denied));
        assert_eq!(
            t.with_range(7, 101, 4096, true, |a| a),
            Err(RmaRefusal::Denied)
        );
        assert_eq!(
            t.with_range(7, u64::MAX, 2, true, |a| a),
            Err(RmaRefusal::Denied)
        );
        // Write access only.
        assert_eq!(
            t.with_range(7, 100, 1, false, |a| a),
            Err(RmaRefusal::Denied)
        );
        assert_eq!(
            t.with_range(8, 100, 1, true, |a| a),
            Err(RmaRefusal::Denied)
        );
        t.deregister(7);
        assert_eq!(
            t.with_range(7, 100, 1, true, |a| a),
            Err(RmaRefusal::Denied)
        );
        assert_eq!(t.register(0, 16, RW, 0, 1), Err(RegError::BadBuffer));
        assert_eq!(
            t.register(usize::MAX, 16, RW, 0, 1),
            Err(RegError::BadBuffer)
        );
    }

    #[test]
    fn provider_keys_and_virtual_addresses() {
        let t = MrTable::new(Naming::of(crate::abi::FI_MR_BASIC), 40);
        let a = t.register(0x10_000, 64, RW, 999, 5).unwrap();
        let b = t.register(0x20_000, 64, RW, 999, 5).unwrap();
        assert_eq!((a, b), (40, 41), "the requested key is not used");
        assert_eq!(t.with_range(b, 0x20_010, 16, false, |x| x), Ok(0x20_010));
        assert_eq!(
            t.with_range(b, 0x10_010, 16, false, |x| x),
            Err(RmaRefusal::Denied)
        );
        assert_eq!(
            Naming::of(0),
            Naming {
                virt_addr: false,
                prov_key: false
            }
        );
    }
}
