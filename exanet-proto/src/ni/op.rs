//! The operations a rank posts to its NI, as values. Each is declared once here and
//! reaches the NI unchanged from wherever it was made: a workload's command slot
//! ([`crate::attach::Command`]), the daemon's attach service, the simulator's tests. The
//! rank is not part of them: whoever posts one knows which rank it acts for.

use crate::gvas::Gvas;

/// An RDMA write: `len` bytes at the rank's `src_va` to `dst`, on write channel `ch` of
/// engine page `page`, then (when `notify` is given) a completion notification written at
/// that VA of the destination rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaWrite {
    pub page: u8,
    pub ch: u8,
    pub src_va: u64,
    pub dst: Gvas,
    pub len: u64,
    pub notify: Option<u64>,
}

/// An RDMA read: `len` bytes at `src` (remote) into the rank's `dst_va`, on read channel
/// `ch` of engine page `page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaRead {
    pub page: u8,
    pub ch: u8,
    pub src: Gvas,
    pub dst_va: u64,
    pub len: u64,
}

/// A packetizer message: `payload` (at most [`super::MAX_MESSAGE`] bytes) from channel
/// `ch` of virtual interface `vi` to `dst`, a mailbox or plain memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendMessage {
    pub vi: u8,
    pub ch: u8,
    pub dst: Gvas,
    pub payload: Vec<u8>,
}
