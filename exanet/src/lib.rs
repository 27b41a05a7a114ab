//! exanet: the client library of the emulated ExaNet network interface.
//!
//! A workload process attaches to its node's `exanetd` ([`Endpoint::attach`]), which gives
//! it a rank (0..=7) on that node and the PDID of its job (from the job key, or the rack's
//! default job; never the workload's choice). From then on the data path is shared memory:
//! commands go into a ring the daemon reads, completions come back in a ring the workload
//! reads; nobody makes a system call per message while both sides are busy, and both sleep
//! on a doorbell when idle (after spinning for a budget: [`Endpoint::set_spin`],
//! `EXANET_SPIN_US`).
//!
//! What the NI offers (SPEC §4):
//! - [`Packetizer`]: messages of up to 64 bytes to any GVAS, typically a [`Mailbox`] of
//!   another rank ([`Endpoint::mailbox_addr`]); one message in flight per channel (4);
//! - [`Mailbox`]: a queue of received messages ([`Mailbox::recv`]);
//! - [`MemoryRegion`]: shared memory registered as this rank's memory, which RDMA reads
//!   from and writes into;
//! - [`RdmaPage`]: RDMA writes (with an optional completion notification at the
//!   destination) and reads, one in flight per channel (32 + 32).
//!
//! Every operation returns a [`Tag`]; [`Endpoint::wait`] returns how it ended
//! ([`OpError`] inside [`Error::Op`] when it failed: NACKed with a reason, timed out in the
//! network, refused, local fault).
//!
//! ```no_run
//! use std::time::Duration;
//! # fn main() -> Result<(), exanet::Error> {
//! // EXANET_RACK=/path/to/rack EXANET_NODE=M1QAF2
//! let ep = exanet::Endpoint::attach()?;
//! let mbox = ep.mailbox(64)?;
//! let tx = ep.packetizer()?;
//! let peer = ep.node_by_name("M1QBF3")?;
//! let tag = tx.send(0, ep.mailbox_addr(peer, 0, 0)?, b"hello")?;
//! ep.wait(tag, Some(Duration::from_secs(1)))?;
//! let reply = mbox.recv(Some(Duration::from_secs(1)))?;
//! println!("{} bytes from {}:{}", reply.payload.len(), reply.src_node, reply.src_rank);
//! # Ok(()) }
//! ```
//!
//! The same API is available to C through `include/exanet.h` (the `ffi` module; the
//! crate builds as `libexanet.a` and `libexanet.so`).
//!
//! Nothing the daemon writes is trusted: a corrupt ring or an undecodable slot is an
//! [`Error::Corrupt`] (and the endpoint is unusable afterwards), never a panic.

#![deny(unsafe_code)]

pub mod collective;
pub mod config;
mod control;
mod endpoint;
mod engine;
pub mod error;
#[allow(unsafe_code)]
pub mod ffi;

pub use config::Config;
pub use endpoint::{
    Endpoint, Held, Mailbox, MemoryRegion, Packetizer, RdmaPage, Tag, RDMA_READ_CHANNELS,
    RDMA_WRITE_CHANNELS,
};
pub use engine::{Message, Notification, Stats};
pub use error::{Error, OpError, Result};

pub use exanet_proto::gvas::{Gvas, Pdid};
pub use exanet_proto::model::ModelTime;
pub use exanet_proto::ni::{NackReason, MAILBOX_WINDOW};
pub use exanet_proto::{NameError, NodeId, NodeName, Shape};

/// Bytes a packetizer message carries at most.
pub const MAX_MESSAGE: usize = exanet_proto::ni::MAX_MESSAGE;
/// Channels of a packetizer interface.
pub const PACKETIZER_CHANNELS: u8 = exanet_proto::ni::CHANNELS as u8;
/// Longest RDMA transfer.
pub const MAX_TRANSFER: u64 = exanet_proto::ni::rdma::MAX_TRANSFER;
