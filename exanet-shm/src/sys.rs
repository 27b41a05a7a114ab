//! The one module of this crate that contains `unsafe` code.
//!
//! Everything here is a thin wrapper around a Linux system call or a raw-pointer operation on a
//! shared mapping, shaped so that the *wrapper itself is sound for every input*: callers in the
//! rest of the crate (which is `#![deny(unsafe_code)]`) cannot cause undefined behaviour through
//! it, whatever arguments they pass. Concretely:
//!
//! - descriptors come in as [`BorrowedFd`] (live for the call) and go out as [`OwnedFd`]
//!   (closed exactly once), except in [`send_with_fds`], where a bad [`RawFd`] only makes the
//!   kernel answer `EBADF`;
//! - [`Mapping`] checks the bounds (and, for atomics, the alignment) of every access itself, and
//!   never hands out a reference to mapped bytes, only copies of them; the sole exception is
//!   `&AtomicU32`/`&AtomicU64`, whose interior mutability makes concurrent mutation by the peer
//!   legitimate (see [`Mapping::atomic_u32`]).
//!
//! # Why plain `copy_nonoverlapping` on memory another process may be writing
//!
//! The peer process is outside the Rust abstract machine: the compiler knows nothing about it,
//! and the only way our code observes the shared bytes is through the raw pointer returned by
//! `mmap`. We never hold a `&[u8]`/`&T` into the mapping (that would promise the compiler the
//! bytes cannot change under it), we copy into private buffers with `ptr::copy_nonoverlapping`,
//! and every byte pattern is a valid `u8`, so a torn or concurrently-modified copy yields garbage
//! *values*, never an invalid Rust value. Callers read each field they validate exactly once
//! into a private copy and validate the copy (no time-of-check/time-of-use window), and every
//! cross-process ordering goes through the atomics, whose Acquire/Release edges keep the copies
//! from being reordered across them. This is the same discipline as a kernel's
//! `copy_from_user`.

use std::ffi::CStr;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicU32;
#[cfg(target_has_atomic = "64")]
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// Turns a `-1`-on-error return value into an [`io::Result`].
fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Wraps a descriptor the kernel has just returned to us.
///
/// # Safety
///
/// `fd` must be open and owned by nobody else: a fresh return value of a descriptor-creating
/// system call, or a descriptor installed in our table by an `SCM_RIGHTS` receive.
unsafe fn owned(fd: RawFd) -> OwnedFd {
    debug_assert!(fd >= 0);
    // SAFETY: the caller guarantees `fd` is open and unowned; `OwnedFd` becomes its single
    // owner and closes it exactly once.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

// --- memfd and seals ----------------------------------------------------------------------

/// `memfd_create(2)`.
pub(crate) fn memfd_create(name: &CStr, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call; the kernel only
    // reads (copies) it. No other memory is touched.
    let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), flags) })?;
    // SAFETY: `fd` is the fresh descriptor memfd_create just returned.
    Ok(unsafe { owned(fd) })
}

/// `fcntl(fd, F_ADD_SEALS, seals)`.
pub(crate) fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: F_ADD_SEALS takes a plain int argument and accesses none of our memory; `fd` is
    // kept open by the borrow for the duration of the call.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

/// `fcntl(fd, F_GET_SEALS)`: the seals of a memfd (`EINVAL` for files that cannot be sealed).
pub(crate) fn get_seals(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: F_GET_SEALS takes no argument and accesses none of our memory; `fd` is kept open
    // by the borrow.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// `fallocate(fd, 0, 0, len)`: reserves the backing pages so that a later first touch cannot
/// fail with SIGBUS for lack of memory in the tmpfs.
pub(crate) fn fallocate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain integer arguments, no memory of ours is accessed; `fd` is kept open by the
    // borrow.
    cvt(unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len) })?;
    Ok(())
}

/// `fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, len)`: gives the pages of a
/// tmpfs file back to the system; the size stays and the range reads as zeros.
pub(crate) fn punch_hole(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain integer arguments, no memory of ours is accessed; `fd` is kept open by the
    // borrow.
    cvt(unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            len,
        )
    })?;
    Ok(())
}

// --- peer credentials ------------------------------------------------------------------------

/// `getsockopt(fd, SOL_SOCKET, SO_PEERCRED)`: the pid, uid and gid of the process at the
/// other end of a connected Unix socket, as the kernel recorded them when it connected.
pub(crate) fn peer_credentials(fd: BorrowedFd<'_>) -> io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a valid, writable `ucred` and `len` holds its exact size; the kernel
    // writes at most `len` bytes into it and updates `len`. `fd` is borrowed for the call.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    if len as usize != mem::size_of::<libc::ucred>() {
        return Err(io::Error::other("SO_PEERCRED returned a short answer"));
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

/// `geteuid(2)`.
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    unsafe { libc::geteuid() }
}

// --- doorbell sockets ----------------------------------------------------------------------

/// `socketpair(AF_UNIX, SOCK_STREAM)` with `SOCK_CLOEXEC | SOCK_NONBLOCK`. The two ends are
/// two open file descriptions, so the flags of the end handed to a peer are the peer's
/// business.
pub(crate) fn socketpair_nonblocking() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as RawFd; 2];
    // SAFETY: `fds` is an array of two `c_int`s that lives across the call, as socketpair
    // expects.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: on success socketpair returned two fresh descriptors that nobody else owns.
    Ok(unsafe { (owned(fds[0]), owned(fds[1])) })
}

/// `shutdown(2)` of one direction (`SHUT_RD` or `SHUT_WR`) of a connected socket.
pub(crate) fn shutdown(fd: BorrowedFd<'_>, how: libc::c_int) -> io::Result<()> {
    // SAFETY: plain integer arguments; `fd` is borrowed, so it is open.
    cvt(unsafe { libc::shutdown(fd.as_raw_fd(), how) })?;
    Ok(())
}

/// Sets `O_NONBLOCK` on the open file description of `fd` (keeping its other status flags).
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument and touches no memory of ours; `fd` is borrowed.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    if flags & libc::O_NONBLOCK == 0 {
        // SAFETY: F_SETFL takes an int argument; `fd` is borrowed, so it is open.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    }
    Ok(())
}

/// One `c_int` socket option of `fd`.
fn socket_option(fd: BorrowedFd<'_>, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `value`, which lives across the
    // call, and the new length into `len`; `fd` is borrowed.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// Whether `fd` is a Unix stream socket (the kind of a doorbell's ends). A descriptor that
/// is not a socket at all is `Ok(false)`.
pub(crate) fn is_unix_stream(fd: BorrowedFd<'_>) -> io::Result<bool> {
    match socket_option(fd, libc::SO_DOMAIN) {
        Ok(domain) => {
            Ok(domain == libc::AF_UNIX && socket_option(fd, libc::SO_TYPE)? == libc::SOCK_STREAM)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `SO_OOBINLINE`: out-of-band data arrives in the normal stream, so that a receive takes
/// it like any other byte, descriptors that came with it included. Otherwise an
/// out-of-band byte's skb is freed by a later plain receive, whose thread then closes the
/// descriptors it carried (kernels without `SO_PASSRIGHTS`).
pub(crate) fn set_oob_inline(fd: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: the option value is one `c_int` that lives across the call, and its size is
    // passed; `fd` is borrowed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_OOBINLINE,
            (&on as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Whether the connected socket `fd` may still send: a send of no bytes fails with `EPIPE`
/// on an end shut down for sending (or whose peer is gone), and sends nothing otherwise.
pub(crate) fn may_send(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let nothing = [0u8; 1];
    // SAFETY: a zero-length send reads no byte of `nothing`, which lives across the call
    // anyway; `fd` is borrowed.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            nothing.as_ptr().cast(),
            0,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n >= 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EPIPE) => Ok(false),
        _ => Err(e),
    }
}

/// Sends one byte on the connected socket `fd` without ever blocking, whatever the file's
/// flags (`MSG_DONTWAIT`), and without `SIGPIPE` (`MSG_NOSIGNAL`): a peer that is gone
/// gives `EPIPE`.
pub(crate) fn send_byte_nowait(fd: BorrowedFd<'_>) -> io::Result<()> {
    let byte = [1u8];
    // SAFETY: the kernel reads at most one byte from `byte`, which lives across the call;
    // `fd` is borrowed.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            byte.as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

// --- refusing descriptors ---------------------------------------------------------------------

/// `SO_PASSRIGHTS` (Linux 6.16's `asm-generic/socket.h`; the libc crate does not have it yet).
const SO_PASSRIGHTS: libc::c_int = 83;

/// Makes the Unix socket `fd` refuse `SCM_RIGHTS`: a peer's `sendmsg` with descriptors fails
/// with `EPERM`, so none can reach its receive queue. A listening socket passes the setting
/// to every connection it accepts. `Ok(false)` when the kernel is older than 6.16 and does not
/// know the option.
pub(crate) fn refuse_rights(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let off: libc::c_int = 0;
    // SAFETY: the option value is one `c_int` that lives across the call, and its size is
    // passed; `fd` is borrowed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&off as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match cvt(rc) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(false),
        Err(e) => Err(e),
    }
}

// --- poll ----------------------------------------------------------------------------------

/// `ppoll(2)` for `POLLIN` on one descriptor. `None` waits forever. Returns whether the
/// descriptor became ready (readable, or in an error/hang-up state that a read will report).
/// `EINTR` is returned as an error of kind [`io::ErrorKind::Interrupted`].
pub(crate) fn poll_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        // Always < 1e9, fits every `c_long`.
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfd` is one valid `pollfd` that the kernel may write `revents` into and that
    // lives across the call (nfds = 1 matches); `ts_ptr` is null or points to a `timespec` that
    // lives across the call; a null sigmask means "keep the current mask". `fd` is borrowed.
    let n = cvt(unsafe { libc::ppoll(&mut pfd, 1, ts_ptr, ptr::null()) })?;
    Ok(n > 0)
}

/// Whether the peer of the stream `fd` is gone: it closed the connection or shut down its
/// sending side (`POLLRDHUP`, `POLLHUP` or `POLLERR` now, without waiting).
pub(crate) fn peer_hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid `pollfd` that lives across the call (nfds = 1 matches);
    // a zero timeout never waits; `fd` is borrowed, so it is open.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

// --- shared mappings -------------------------------------------------------------------------

/// A `MAP_SHARED`, read-write mapping of a whole file, unmapped on drop.
///
/// Deliberately offers no way to obtain a reference to the mapped bytes: only bounds-checked
/// copies in and out, and bounds- and alignment-checked atomics.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` is an address range of process-shared memory that another *process* may
// access at any time anyway. All access through it is by bounds-checked raw copies and atomics,
// never through references with aliasing guarantees, so using it from several threads (or moving
// it to another thread) adds nothing that the cross-process case does not already cover; the
// unmapping in `Drop` needs `&mut self`, i.e. no access in flight.
unsafe impl Send for Mapping {}
// SAFETY: see `Send` above: `&Mapping` only allows raw copies and atomic operations.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` shared and read-write.
    ///
    /// The caller must make sure that the file is at least `len` bytes long *and cannot
    /// shrink* (a memfd sealed with `F_SEAL_SHRINK`), otherwise touching a page beyond the end
    /// of the file raises SIGBUS. That is a robustness requirement, not a memory-safety one:
    /// SIGBUS kills the process, it does not corrupt it.
    pub(crate) fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        if len == 0 || len > isize::MAX as usize {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // SAFETY: a fresh mapping is requested (null hint, no MAP_FIXED), so no existing
        // memory of this process is replaced or aliased; the kernel picks the address. `fd` is
        // kept open by the borrow for the duration of the call (the mapping then holds its own
        // reference to the file).
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(addr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null address"))?;
        Ok(Mapping { ptr, len })
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of `[offset, offset + len)` if that range lies inside the mapping.
    fn range(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // `wrapping_add` is safe; the result is in bounds (or one past the end for an empty
        // range at the very end) by the check above.
        Some(self.ptr.as_ptr().wrapping_add(offset))
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the mapping. Returns `false`
    /// (copying nothing) if the range is out of bounds.
    pub(crate) fn copy_out(&self, offset: usize, dst: &mut [u8]) -> bool {
        let Some(src) = self.range(offset, dst.len()) else {
            return false;
        };
        // SAFETY: `[src, src + dst.len())` lies inside the live mapping (checked by `range`;
        // the mapping lives as long as `&self`). `dst` is an exclusively borrowed private
        // buffer, which cannot overlap the mapping because the mapping is never exposed as a
        // Rust reference. The source bytes may be changed concurrently by the peer; they are
        // copied as `u8`s, for which every bit pattern is valid (see the module docs).
        unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` into the mapping at `offset`. Returns `false` (copying nothing) if the
    /// range is out of bounds.
    pub(crate) fn copy_in(&self, offset: usize, src: &[u8]) -> bool {
        let Some(dst) = self.range(offset, src.len()) else {
            return false;
        };
        // SAFETY: `[dst, dst + src.len())` lies inside the live, writable (PROT_WRITE) mapping
        // (checked by `range`). `src` is a private Rust slice, which cannot overlap the
        // mapping because the mapping is never exposed as a Rust reference. No Rust reference
        // to the destination bytes exists (other than through `AtomicU32`/`AtomicU64`, which
        // permit concurrent mutation), so writing through `&self` invalidates nothing.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        true
    }

    /// A reference to the `AtomicU32` at `offset`, if it is in bounds and 4-byte aligned.
    pub(crate) fn atomic_u32(&self, offset: usize) -> Option<&AtomicU32> {
        let p = self.range(offset, mem::size_of::<AtomicU32>())?;
        if (p as usize) % mem::align_of::<AtomicU32>() != 0 {
            return None;
        }
        // SAFETY: `p` is in bounds of the live mapping for 4 bytes and aligned for `AtomicU32`
        // (checked above); the returned reference borrows `self`, so the mapping outlives it.
        // `AtomicU32` is an `UnsafeCell`, so a shared reference to memory that is mutated
        // concurrently is allowed provided all accesses are atomic: ours are, and the peer is
        // another process whose aligned 4-byte stores the hardware keeps single-copy atomic
        // and coherent with ours. Every bit pattern is a valid `u32`.
        Some(unsafe { &*p.cast::<AtomicU32>() })
    }

    /// A reference to the `AtomicU64` at `offset`, if it is in bounds and 8-byte aligned.
    #[cfg(target_has_atomic = "64")]
    pub(crate) fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        let p = self.range(offset, mem::size_of::<AtomicU64>())?;
        if (p as usize) % mem::align_of::<AtomicU64>() != 0 {
            return None;
        }
        // SAFETY: as for `atomic_u32`: in bounds for 8 bytes, aligned for `AtomicU64`, borrows
        // `self`, interior-mutable, every bit pattern valid.
        Some(unsafe { &*p.cast::<AtomicU64>() })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the mapping created in `map_shared`, which is
        // unmapped only here, once. `&mut self` guarantees no copy is in flight, and no
        // reference into the mapping can outlive `self` (atomic references borrow it).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        // munmap of a range we mapped can only fail on a kernel bug; nothing to do about it.
        debug_assert_eq!(rc, 0, "munmap failed: {}", io::Error::last_os_error());
    }
}

// --- SCM_RIGHTS ------------------------------------------------------------------------------

/// Size of one descriptor in an `SCM_RIGHTS` payload.
const FD_SIZE: usize = mem::size_of::<RawFd>();

/// `CMSG_SPACE(n * sizeof(int))`: the control-buffer room for `n` descriptors.
fn cmsg_space_for(n: usize) -> Option<usize> {
    let bytes = libc::c_uint::try_from(n.checked_mul(FD_SIZE)?).ok()?;
    // SAFETY: `CMSG_SPACE` is pure arithmetic on its argument (marked `unsafe` in libc only
    // because it is a C macro translation); it dereferences nothing.
    Some(unsafe { libc::CMSG_SPACE(bytes) } as usize)
}

/// `CMSG_LEN(len)`.
fn cmsg_len(len: usize) -> Option<usize> {
    let len = libc::c_uint::try_from(len).ok()?;
    // SAFETY: pure arithmetic, as for `CMSG_SPACE`.
    Some(unsafe { libc::CMSG_LEN(len) } as usize)
}

/// A zeroed control buffer of at least `len` bytes, aligned for `cmsghdr` (8 bytes).
fn control_buffer(len: usize) -> Vec<u64> {
    vec![0u64; len.div_ceil(mem::size_of::<u64>())]
}

/// `sendmsg(2)` of `data` with one `SCM_RIGHTS` control message carrying `fds` (none if
/// empty), with `MSG_NOSIGNAL`. Returns the number of data bytes sent. The descriptors are
/// only read by the kernel (duplicated into the receiver); an invalid one fails the call with
/// `EBADF`.
pub(crate) fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `msghdr` is a plain C struct for which all-zeroes is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;

    let payload = fds.len().checked_mul(FD_SIZE).ok_or_else(invalid)?;
    let space = if fds.is_empty() {
        0
    } else {
        cmsg_space_for(fds.len()).ok_or_else(invalid)?
    };
    // Must outlive the `sendmsg` call: `msg` points into it.
    let mut control = control_buffer(space);
    if !fds.is_empty() {
        let len = cmsg_len(payload).ok_or_else(invalid)?;
        msg.msg_control = control.as_mut_ptr().cast();
        // The field's type differs between libcs (size_t on glibc, socklen_t on musl).
        msg.msg_controllen = space as _;
        // SAFETY: `msg.msg_control` points to `space` >= CMSG_SPACE(payload) zeroed bytes
        // aligned for `cmsghdr`, and `msg_controllen` says so; `CMSG_FIRSTHDR` therefore
        // returns a pointer to the start of that buffer (non-null as it is large enough for
        // one header).
        let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        if cmsg.is_null() {
            return Err(invalid());
        }
        // SAFETY: `cmsg` points to a properly aligned `cmsghdr` inside `control` (above), to
        // which we have exclusive access; `CMSG_DATA(cmsg)` is `payload` bytes of room inside
        // the same buffer (CMSG_SPACE(payload) was allocated), and `fds` is a valid slice of
        // `fds.len()` ints that cannot overlap our private buffer. The byte copy makes no
        // alignment assumption about the data area.
        unsafe {
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = len as _;
            ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), payload);
        }
    }
    // SAFETY: `msg` points to one valid `iovec` describing `data` (only read by the kernel for
    // sendmsg) and to `control` (or null/0), all of which live across the call; `sock` is
    // borrowed.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// What [`recv_with_fds`] got.
#[derive(Debug)]
pub(crate) struct Received {
    /// Data bytes received (0 = end of stream).
    pub(crate) bytes: usize,
    /// Every descriptor that arrived, already owned (closed on drop).
    pub(crate) fds: Vec<OwnedFd>,
    /// `MSG_CTRUNC`: the control data did not fit, the kernel dropped some descriptors.
    pub(crate) control_truncated: bool,
}

/// `recvmsg(2)` into `buf` with room for `max_fds` descriptors in the control buffer, with
/// `MSG_CMSG_CLOEXEC` (and `MSG_DONTWAIT` if `dontwait`, whatever the file's flags).
/// `EINTR` is retried. Every received descriptor is wrapped in an
/// [`OwnedFd`] before anything else can fail, so none leaks.
pub(crate) fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
    dontwait: bool,
) -> io::Result<Received> {
    let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
    let space = if max_fds == 0 {
        0
    } else {
        cmsg_space_for(max_fds).ok_or_else(invalid)?
    };
    let mut control = control_buffer(space);
    let control_end = control.as_ptr() as usize + space;
    let header_len = cmsg_len(0).ok_or_else(invalid)?;

    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `msghdr` is a plain C struct for which all-zeroes is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if space > 0 {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
    }
    let flags = libc::MSG_CMSG_CLOEXEC | if dontwait { libc::MSG_DONTWAIT } else { 0 };
    let n = loop {
        // SAFETY: `msg` describes `buf` (exclusively borrowed, `buf.len()` writable bytes) and
        // `control` (`space` writable bytes aligned for `cmsghdr`, or none); both live across
        // the call and the kernel writes at most those lengths. `sock` is borrowed.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };

    let mut fds = Vec::new();
    if space > 0 {
        // SAFETY: `msg` was filled by a successful recvmsg: `msg_control`/`msg_controllen`
        // describe the (possibly shorter) initialised prefix of `control`, so `CMSG_FIRSTHDR`
        // and `CMSG_NXTHDR` walk only headers that lie inside it (they return null once the
        // next header would not fit).
        let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        while !cmsg.is_null() {
            // SAFETY: `cmsg` is non-null, so it points to a whole, aligned `cmsghdr` inside
            // `control` (guaranteed by CMSG_FIRSTHDR/CMSG_NXTHDR above); we only read it.
            let (level, kind, len) = unsafe {
                (
                    (*cmsg).cmsg_level,
                    (*cmsg).cmsg_type,
                    (*cmsg).cmsg_len as usize,
                )
            };
            if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS && len >= header_len {
                // The kernel never reports more data than fits in the buffer, but clamp anyway.
                // SAFETY: `CMSG_DATA(cmsg)` is the data area of a header inside `control`.
                let data = unsafe { libc::CMSG_DATA(cmsg) };
                let available = control_end.saturating_sub(data as usize);
                let count = (len - header_len).min(available) / FD_SIZE;
                for i in 0..count {
                    // SAFETY: `data + i * FD_SIZE .. + FD_SIZE` lies inside the initialised
                    // control data (count is clamped to both the cmsg length and the buffer
                    // end); the data area need not be int-aligned, hence `read_unaligned`.
                    let raw = unsafe { ptr::read_unaligned(data.add(i * FD_SIZE).cast::<RawFd>()) };
                    if raw >= 0 {
                        // SAFETY: SCM_RIGHTS descriptors were installed in our table by this
                        // recvmsg and are owned by nobody else yet; each appears once.
                        fds.push(unsafe { owned(raw) });
                    }
                }
            }
            // SAFETY: `msg` and `cmsg` are as described above; CMSG_NXTHDR returns the next
            // header inside the buffer or null.
            cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
        }
    }
    Ok(Received {
        bytes: n,
        fds,
        control_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}
