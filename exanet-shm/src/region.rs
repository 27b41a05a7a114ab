//! [`Region`]: a sealed memfd mapped shared into both processes.
//!
//! # Lifecycle
//!
//! The side that owns the memory (normally the daemon) calls [`Region::create`]:
//!
//! 1. `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)`;
//! 2. `ftruncate` to the requested size, then `fallocate` so that the tmpfs pages exist
//!    (a later first touch can then not fail with SIGBUS for lack of memory);
//! 3. `F_ADD_SEALS(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)`: from now on *nobody*, us
//!    included, can change the size or the seals;
//! 4. `mmap(MAP_SHARED, PROT_READ | PROT_WRITE)` of the whole file.
//!
//! The descriptor ([`Region::as_fd`] / [`Region::try_clone_fd`]) is then passed to the peer
//! (see [`crate::fdpass`]), which calls [`Region::from_fd`] (or [`Region::from_fd_with_len`]):
//! it requires `F_SEAL_SHRINK` (a file that can shrink under a mapping turns the next access
//! past the new end into SIGBUS, i.e. lets the peer kill us), reads the size with `fstat`, and
//! maps exactly that.
//!
//! # Accessing the memory
//!
//! The peer may write any byte at any time, so the region is a bag of *untrusted bytes*:
//! - [`Region::read`] / [`Region::write`] copy between the region and private buffers; they
//!   are bounds-checked and return [`RegionError::OutOfBounds`] instead of panicking;
//! - [`Region::atomic_u32`] / [`Region::atomic_u64`] give handles for aligned atomic words
//!   (indices, flags), checked for bounds and alignment.
//!
//! No API hands out `&[u8]` or `&T` into the region: such a reference would promise the
//! compiler that the bytes don't change while it lives, which the peer can break.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
#[cfg(target_has_atomic = "64")]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::sys;

/// Errors from creating, opening or accessing a [`Region`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// A region must be at least one byte long.
    #[error("a shared memory region cannot be empty")]
    Empty,
    /// The size does not fit the address space (`> isize::MAX`).
    #[error("region size {size} is too large to map")]
    TooLarge {
        /// The requested or found size in bytes.
        size: u64,
    },
    /// The memfd name contains a NUL byte.
    #[error("memfd name contains a NUL byte")]
    InvalidName,
    /// The descriptor does not support sealing at all (not a memfd, or a memfd created
    /// without `MFD_ALLOW_SEALING` and therefore permanently `F_SEAL_SEAL`ed with nothing
    /// else, or a file system that has no seals).
    #[error("descriptor cannot be sealed (not a memfd?)")]
    NotSealable,
    /// The descriptor is a sealable file but is not sealed against shrinking: the peer could
    /// truncate it under our mapping and make us die of SIGBUS.
    #[error("shared memory is not sealed against shrinking (seals {seals:#x})")]
    NotSealed {
        /// The `F_GET_SEALS` value found.
        seals: u32,
    },
    /// The region does not have the size that was agreed on.
    #[error("shared memory is {actual} bytes, expected {expected}")]
    SizeMismatch {
        /// Size agreed on.
        expected: usize,
        /// Size found with `fstat`.
        actual: u64,
    },
    /// An access falls (partly) outside the region.
    #[error("access of {len} bytes at offset {offset} is outside the {region_len}-byte region")]
    OutOfBounds {
        /// Start of the access.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// Length of the region.
        region_len: usize,
    },
    /// An atomic access is not naturally aligned.
    #[error("atomic access at offset {offset} is not {align}-byte aligned")]
    Misaligned {
        /// Start of the access.
        offset: usize,
        /// Required alignment.
        align: usize,
    },
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// The operation (system call) that failed.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl RegionError {
    fn io(op: &'static str) -> impl FnOnce(io::Error) -> RegionError {
        move |source| RegionError::Io { op, source }
    }
}

/// A shared memory region backed by a sealed memfd, mapped `MAP_SHARED` and read-write.
///
/// Unmapped (and the descriptor closed) on drop. `Region` is `Send + Sync`; share it between
/// threads or between [`crate::Producer`]/[`crate::Consumer`] handles through an `Arc`.
#[derive(Debug)]
pub struct Region {
    // Field order matters only for readability: the mapping keeps its own reference to the
    // file, so closing the descriptor first would be fine too.
    map: sys::Mapping,
    file: File,
}

/// The seals [`Region::create`] applies.
const CREATE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

impl Region {
    /// Creates a new zero-filled region of `size` bytes, sealed against any size change.
    ///
    /// `name` only shows up in `/proc/<pid>/fd` and `/proc/<pid>/maps` (as
    /// `/memfd:<name>`); the kernel limits it to 249 bytes.
    pub fn create(name: &str, size: usize) -> Result<Region, RegionError> {
        if size == 0 {
            return Err(RegionError::Empty);
        }
        if size > isize::MAX as usize {
            return Err(RegionError::TooLarge { size: size as u64 });
        }
        let cname = CString::new(name).map_err(|_| RegionError::InvalidName)?;
        let fd = sys::memfd_create(&cname, libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
            .map_err(RegionError::io("memfd_create"))?;
        let file = File::from(fd);
        file.set_len(size as u64)
            .map_err(RegionError::io("ftruncate"))?;
        match sys::fallocate(file.as_fd(), size as u64) {
            Ok(()) => {}
            // Not every kernel configuration supports fallocate on shmem; the region still
            // works, the pages are then allocated on first touch.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
            Err(e) => {
                return Err(RegionError::Io {
                    op: "fallocate",
                    source: e,
                })
            }
        }
        sys::add_seals(file.as_fd(), CREATE_SEALS)
            .map_err(RegionError::io("fcntl(F_ADD_SEALS)"))?;
        let map = sys::Mapping::map_shared(file.as_fd(), size).map_err(RegionError::io("mmap"))?;
        Ok(Region { map, file })
    }

    /// Gives the memory back to the system (`fallocate` `PUNCH_HOLE`): the region keeps its
    /// size and reads as zeros from now on. A daemon calls it when it stops serving memory it
    /// created for a workload, so that memory the workload still maps is no longer the
    /// daemon's allocation.
    pub fn discard(&self) -> Result<(), RegionError> {
        sys::punch_hole(self.file.as_fd(), self.len() as u64)
            .map_err(RegionError::io("fallocate(PUNCH_HOLE)"))
    }

    /// Maps a region received from the peer, whatever its size.
    ///
    /// Refuses descriptors that are not sealed against shrinking ([`RegionError::NotSealed`],
    /// [`RegionError::NotSealable`]) and empty ones. Prefer [`Region::from_fd_with_len`] when
    /// the size was agreed on: it also stops a peer from making us map a huge file.
    pub fn from_fd(fd: OwnedFd) -> Result<Region, RegionError> {
        Self::open(fd, None)
    }

    /// Like [`Region::from_fd`], but also requires the region to be exactly `len` bytes long
    /// ([`RegionError::SizeMismatch`] otherwise).
    pub fn from_fd_with_len(fd: OwnedFd, len: usize) -> Result<Region, RegionError> {
        Self::open(fd, Some(len))
    }

    fn open(fd: OwnedFd, expected: Option<usize>) -> Result<Region, RegionError> {
        let file = File::from(fd);
        let seals = match sys::get_seals(file.as_fd()) {
            Ok(seals) => seals,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(RegionError::NotSealable)
            }
            Err(e) => {
                return Err(RegionError::Io {
                    op: "fcntl(F_GET_SEALS)",
                    source: e,
                })
            }
        };
        if seals & libc::F_SEAL_SHRINK == 0 {
            // A file with only F_SEAL_SEAL can never be sealed: tell that case apart, it is
            // the usual mistake (memfd without MFD_ALLOW_SEALING, or a plain tmpfs file).
            if seals == libc::F_SEAL_SEAL {
                return Err(RegionError::NotSealable);
            }
            return Err(RegionError::NotSealed {
                seals: seals as u32,
            });
        }
        // The size cannot shrink any more (sealed), so this fstat is a lower bound for the
        // whole life of the mapping. It may still grow if F_SEAL_GROW is missing; we only
        // ever map and access the first `actual` bytes, so growth is harmless.
        let actual = file.metadata().map_err(RegionError::io("fstat"))?.len();
        if let Some(expected) = expected {
            if actual != expected as u64 {
                return Err(RegionError::SizeMismatch { expected, actual });
            }
        }
        if actual == 0 {
            return Err(RegionError::Empty);
        }
        let len = usize::try_from(actual)
            .ok()
            .filter(|&l| l <= isize::MAX as usize)
            .ok_or(RegionError::TooLarge { size: actual })?;
        let map = sys::Mapping::map_shared(file.as_fd(), len).map_err(RegionError::io("mmap"))?;
        Ok(Region { map, file })
    }

    /// Length of the region in bytes (never 0).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always `false`: regions are never empty. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// A new descriptor for the same memfd (`F_DUPFD_CLOEXEC`), e.g. to send to the peer
    /// while keeping this mapping.
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.file.as_fd().try_clone_to_owned()
    }

    /// Copies `buf.len()` bytes at `offset` out of the region.
    ///
    /// The bytes are whatever the peer left there, possibly being modified while we copy:
    /// validate them after the copy, never before.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), RegionError> {
        if self.map.copy_out(offset, buf) {
            Ok(())
        } else {
            Err(self.out_of_bounds(offset, buf.len()))
        }
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        if self.map.copy_in(offset, data) {
            Ok(())
        } else {
            Err(self.out_of_bounds(offset, data.len()))
        }
    }

    /// A handle to the 4-byte-aligned atomic `u32` at `offset`.
    pub fn atomic_u32(&self, offset: usize) -> Result<SharedU32<'_>, RegionError> {
        // `sys` checks bounds and alignment itself (it must be sound for any offset); the
        // checks are not repeated here, this is on every ring push and pop.
        self.map
            .atomic_u32(offset)
            .map(SharedU32)
            .ok_or_else(|| self.atomic_error(offset, 4))
    }

    /// A handle to the 8-byte-aligned atomic `u64` at `offset`.
    #[cfg(target_has_atomic = "64")]
    pub fn atomic_u64(&self, offset: usize) -> Result<SharedU64<'_>, RegionError> {
        self.map
            .atomic_u64(offset)
            .map(SharedU64)
            .ok_or_else(|| self.atomic_error(offset, 8))
    }

    /// Why an atomic access of `size` bytes at `offset` was refused: bounds first, then
    /// alignment, so that errors name the more fundamental problem. The mapping is
    /// page-aligned, so an in-bounds access that `sys` refused has a misaligned offset.
    fn atomic_error(&self, offset: usize, size: usize) -> RegionError {
        match offset.checked_add(size) {
            Some(end) if end <= self.len() => RegionError::Misaligned {
                offset,
                align: size,
            },
            _ => self.out_of_bounds(offset, size),
        }
    }

    fn out_of_bounds(&self, offset: usize, len: usize) -> RegionError {
        RegionError::OutOfBounds {
            offset,
            len,
            region_len: self.len(),
        }
    }
}

impl AsFd for Region {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl AsRawFd for Region {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// A handle to an aligned atomic `u32` inside a [`Region`].
///
/// The methods mirror [`AtomicU32`]'s. The peer can store anything there at any time: treat
/// every loaded value as untrusted input.
#[derive(Clone, Copy, Debug)]
pub struct SharedU32<'a>(&'a AtomicU32);

impl SharedU32<'_> {
    /// [`AtomicU32::load`].
    #[inline]
    pub fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }

    /// [`AtomicU32::store`].
    #[inline]
    pub fn store(&self, value: u32, order: Ordering) {
        self.0.store(value, order)
    }

    /// [`AtomicU32::swap`].
    #[inline]
    pub fn swap(&self, value: u32, order: Ordering) -> u32 {
        self.0.swap(value, order)
    }

    /// [`AtomicU32::fetch_add`] (wrapping).
    #[inline]
    pub fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
        self.0.fetch_add(value, order)
    }

    /// [`AtomicU32::compare_exchange`].
    #[inline]
    pub fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32> {
        self.0.compare_exchange(current, new, success, failure)
    }
}

/// A handle to an aligned atomic `u64` inside a [`Region`]; see [`SharedU32`].
#[cfg(target_has_atomic = "64")]
#[derive(Clone, Copy, Debug)]
pub struct SharedU64<'a>(&'a AtomicU64);

#[cfg(target_has_atomic = "64")]
impl SharedU64<'_> {
    /// [`AtomicU64::load`].
    #[inline]
    pub fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }

    /// [`AtomicU64::store`].
    #[inline]
    pub fn store(&self, value: u64, order: Ordering) {
        self.0.store(value, order)
    }

    /// [`AtomicU64::swap`].
    #[inline]
    pub fn swap(&self, value: u64, order: Ordering) -> u64 {
        self.0.swap(value, order)
    }

    /// [`AtomicU64::fetch_add`] (wrapping).
    #[inline]
    pub fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
        self.0.fetch_add(value, order)
    }

    /// [`AtomicU64::compare_exchange`].
    #[inline]
    pub fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.0.compare_exchange(current, new, success, failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_is_sealed_and_zeroed() {
        let r = Region::create("exanet-shm-unit", 4096 + 13).unwrap();
        assert_eq!(r.len(), 4109);
        let seals = sys::get_seals(r.as_fd()).unwrap();
        assert_eq!(seals & CREATE_SEALS, CREATE_SEALS);
        let mut buf = vec![0xAAu8; r.len()];
        r.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn memfd_without_seals_is_refused() {
        // Sealable, but nobody sealed it.
        let fd = sys::memfd_create(
            c"exanet-shm-unsealed",
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
        .unwrap();
        File::from(fd.try_clone().unwrap()).set_len(4096).unwrap();
        match Region::from_fd(fd) {
            Err(RegionError::NotSealed { seals: 0 }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn memfd_sealed_only_against_growth_is_refused() {
        let fd = sys::memfd_create(
            c"exanet-shm-grow",
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
        .unwrap();
        File::from(fd.try_clone().unwrap()).set_len(4096).unwrap();
        sys::add_seals(fd.as_fd(), libc::F_SEAL_GROW | libc::F_SEAL_SEAL).unwrap();
        match Region::from_fd(fd) {
            Err(RegionError::NotSealed { seals }) => {
                assert_eq!(seals as libc::c_int, libc::F_SEAL_GROW | libc::F_SEAL_SEAL)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn memfd_without_allow_sealing_is_refused() {
        let fd = sys::memfd_create(c"exanet-shm-nosealing", libc::MFD_CLOEXEC).unwrap();
        File::from(fd.try_clone().unwrap()).set_len(4096).unwrap();
        assert!(matches!(Region::from_fd(fd), Err(RegionError::NotSealable)));
    }

    #[test]
    fn shrink_only_sealed_memfd_is_accepted() {
        let fd = sys::memfd_create(
            c"exanet-shm-shrink",
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
        .unwrap();
        File::from(fd.try_clone().unwrap()).set_len(8192).unwrap();
        sys::add_seals(fd.as_fd(), libc::F_SEAL_SHRINK).unwrap();
        let r = Region::from_fd(fd).unwrap();
        assert_eq!(r.len(), 8192);
    }
}
