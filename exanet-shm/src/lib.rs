//! Shared-memory transport between an exanet workload process and its node daemon.
//!
//! A workload attaches to its node's `exanetd` (SPEC §4-§5: packetizer, mailboxes, RDMA
//! descriptors, completions) through memory both processes map, so that posting a 64-byte
//! message costs a few copies and atomics instead of a system call. This crate provides the
//! building blocks; the daemon decides what goes where.
//!
//! - [`Region`]: a memfd sealed against shrinking and growing, mapped `MAP_SHARED` in both
//!   processes, accessed only through bounds-checked copies and atomic handles
//!   ([`SharedU32`], [`SharedU64`]), because the peer may scribble on it at any time;
//! - [`Ring`] / [`Producer`] / [`Consumer`]: a single-producer single-consumer ring of
//!   fixed-size slots inside a region, which validates everything the peer writes and reports
//!   a misbehaving peer as [`RingError::Corrupt`] instead of panicking or straying out of
//!   bounds;
//! - [`Doorbell`] and its [`Ringer`] (the ends of a Unix socket pair) and [`Waiter`]: spin
//!   for a short budget, then sleep; the
//!   notifying side only makes a system call when the other side announced it is asleep;
//! - [`fdpass`]: sending and receiving descriptors (`SCM_RIGHTS`) over a Unix socket, which
//!   is how the region and the doorbells reach the peer.
//!
//! # Setting up a connection
//!
//! ```
//! use std::os::fd::AsRawFd;
//! use std::os::unix::net::UnixStream;
//! use std::sync::Arc;
//! use exanet_shm::{fdpass, Doorbell, Region, Ring, Ringer, Waiter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (daemon_sock, client_sock) = UnixStream::pair()?;
//!
//! // Daemon: one ring towards the daemon, one back, each with the doorbell its reader sleeps on.
//! let to_daemon = Ring::new(0, 256, 64)?;
//! let to_client = Ring::new(to_daemon.end(), 256, 64)?;
//! let region = Arc::new(Region::create("exanet-client-7", to_client.end())?);
//! to_daemon.init(&region)?;
//! to_client.init(&region)?;
//! // One doorbell per direction; the daemon keeps one end of each, the client gets the
//! // other (the ends are separate file descriptions with locks of their own: neither side
//! // can make the other block, and they refuse descriptors where the kernel can).
//! let (daemon_bell_ringer, daemon_bell) = exanet_shm::doorbell()?;
//! let (_client_bell_ringer, client_bell) = exanet_shm::doorbell()?;
//! fdpass::send_fds(
//!     &daemon_sock,
//!     b"hello",
//!     &[region.as_raw_fd(), daemon_bell_ringer.as_raw_fd(), client_bell.as_raw_fd()],
//! )?;
//! let mut from_client = to_daemon.consumer(Arc::clone(&region))?;
//!
//! // Client:
//! let mut buf = [0u8; 16];
//! let (_, fds) = fdpass::recv_fds(&client_sock, &mut buf, 3)?;
//! let [mem, daemon_bell_fd, client_bell_fd]: [_; 3] = fds.try_into().expect("three fds");
//! let client_region = Arc::new(Region::from_fd_with_len(mem, to_client.end())?);
//! let daemon_bell_client_side = Ringer::from_fd(daemon_bell_fd)?;
//! let _client_bell = Doorbell::from_fd(client_bell_fd)?;
//! let mut tx = to_daemon.producer(Arc::clone(&client_region))?;
//! tx.push(b"post a packetizer message")?;
//! tx.wake_consumer(&daemon_bell_client_side)?;
//!
//! // Daemon:
//! let mut msg = [0u8; 60];
//! let n = from_client.pop_wait(&mut msg, &Waiter::default(), &daemon_bell, None)?;
//! assert_eq!(n, Some(25));
//! # Ok(()) }
//! ```
//!
//! # Safety
//!
//! All `unsafe` code lives in the private `sys` module (system calls, the mapping, and the
//! raw copies); the rest of the crate is safe code on top of it. Linux only (memfd, seals,
//! Unix sockets).

#![deny(unsafe_code)]
#![warn(missing_docs)]

#[cfg(not(target_os = "linux"))]
compile_error!("exanet-shm uses memfd and file seals: it builds on Linux only");

pub mod doorbell;
pub mod fdpass;
pub mod region;
pub mod ring;
#[allow(unsafe_code)]
mod sys;

pub use doorbell::{doorbell, Doorbell, Ringer, Waiter};
pub use fdpass::{
    effective_uid, peer_credentials, peer_hung_up, recv_fds, refuse_descriptors, send_fds,
    FdPassError, PeerCredentials,
};
#[cfg(target_has_atomic = "64")]
pub use region::SharedU64;
pub use region::{Region, RegionError, SharedU32};
pub use ring::{Consumer, Corruption, Producer, Ring, RingError, ThreadMark, WaitError};
