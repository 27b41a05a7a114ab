//! Passing descriptors (the region's memfd, doorbells) over a Unix stream socket with
//! `SCM_RIGHTS`.
//!
//! Descriptors travel attached to data bytes: [`send_fds`] attaches them to the bytes it
//! sends, and [`recv_fds`] returns them together with the bytes they came with. On a stream
//! socket Linux never merges, in one receive, bytes that came with descriptors with bytes
//! sent by a different `sendmsg`, so a receiver that expects an *n*-byte message with
//! descriptors gets them with the first part of that message; if the kernel returned fewer
//! than *n* bytes, the rest follows in plain reads.
//!
//! Every received descriptor is close-on-exec (`MSG_CMSG_CLOEXEC`) and returned as an
//! [`OwnedFd`], so none can leak into a child process or be forgotten. If the sender passed
//! more descriptors than the receiver made room for, the kernel truncates the control data
//! (`MSG_CTRUNC`); [`recv_fds`] then closes whatever did arrive and fails with
//! [`FdPassError::Truncated`]: a half-received set of descriptors is useless and the
//! connection's framing is lost anyway.

use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::sys;

/// Most descriptors one message may carry (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS: usize = 253;

/// Errors of [`send_fds`] and [`recv_fds`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FdPassError {
    /// Descriptors need at least one data byte to travel with, and receiving needs room for
    /// at least one byte (zero bytes read means end of stream).
    #[error("descriptors must travel with at least one data byte")]
    Empty,
    /// More than [`MAX_FDS`] descriptors.
    #[error("{count} descriptors in one message, at most {MAX_FDS} allowed")]
    TooManyFds {
        /// Number of descriptors asked for.
        count: usize,
    },
    /// The peer sent more descriptors than `max_fds` (`MSG_CTRUNC`); every descriptor that
    /// did arrive has been closed.
    #[error("control data truncated: the peer sent more than {max_fds} descriptors (the received ones were closed)")]
    Truncated {
        /// The `max_fds` the receive was made with.
        max_fds: usize,
    },
    /// `sendmsg`/`recvmsg` failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Sends `bytes` with `fds` attached (duplicated into the receiver; ours stay open).
///
/// Returns how many bytes were sent, as `sendmsg` does: on a blocking socket that is normally
/// all of them, but a short send is possible; the descriptors go with the first byte, send
/// the rest with plain writes. `SIGPIPE` is suppressed (a closed peer gives
/// [`io::ErrorKind::BrokenPipe`]). An invalid descriptor fails with `EBADF`.
pub fn send_fds(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> Result<usize, FdPassError> {
    if bytes.is_empty() {
        return Err(FdPassError::Empty);
    }
    if fds.len() > MAX_FDS {
        return Err(FdPassError::TooManyFds { count: fds.len() });
    }
    loop {
        match sys::send_with_fds(stream.as_fd(), bytes, fds) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives into `buf`, accepting up to `max_fds` descriptors.
///
/// Returns the number of bytes received (0 = the peer closed the connection) and the
/// descriptors that came with them (possibly none). See the [module docs](self) for how
/// descriptors and bytes line up, and for [`FdPassError::Truncated`].
pub fn recv_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> Result<(usize, Vec<OwnedFd>), FdPassError> {
    if buf.is_empty() {
        return Err(FdPassError::Empty);
    }
    if max_fds > MAX_FDS {
        return Err(FdPassError::TooManyFds { count: max_fds });
    }
    let received = sys::recv_with_fds(stream.as_fd(), buf, max_fds, false)?;
    if received.control_truncated {
        // Dropping the descriptors closes them.
        drop(received.fds);
        return Err(FdPassError::Truncated { max_fds });
    }
    Ok((received.bytes, received.fds))
}

/// Who is at the other end of a connected Unix socket: the process's pid, uid and gid as the
/// kernel recorded them when it connected (`SO_PEERCRED`), which the peer cannot forge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's process id.
    pub pid: i32,
    /// Its effective user id.
    pub uid: u32,
    /// Its effective (primary) group id.
    pub gid: u32,
}

/// The [`PeerCredentials`] of `stream`'s peer.
pub fn peer_credentials(stream: &UnixStream) -> std::io::Result<PeerCredentials> {
    let (pid, uid, gid) = crate::sys::peer_credentials(stream.as_fd())?;
    Ok(PeerCredentials { pid, uid, gid })
}

/// Whether the peer of `stream` is gone (closed it or shut down its sending side), asked
/// without waiting: a dead workload's connection, before its session thread notices.
pub fn peer_hung_up(stream: &impl AsFd) -> bool {
    crate::sys::peer_hung_up(stream.as_fd())
}

/// This process's effective user id, to compare [`PeerCredentials::uid`] with.
pub fn effective_uid() -> u32 {
    crate::sys::effective_uid()
}

/// Makes the Unix socket `sock` refuse descriptors: a peer's `sendmsg` with `SCM_RIGHTS`
/// fails (`EPERM`) in the peer, so none ever reaches this side's receive queue, where closing
/// it could block whoever closes last (see the doorbell module's "why a socket pair"). Set on a
/// listening socket, it holds for every connection accepted from it, from the connect on.
///
/// Returns `Ok(false)` on kernels older than Linux 6.16, which lack `SO_PASSRIGHTS`: the
/// caller must then dispose of received descriptors where a blocked close holds nothing.
pub fn refuse_descriptors(sock: &impl AsFd) -> io::Result<bool> {
    sys::refuse_rights(sock.as_fd())
}
