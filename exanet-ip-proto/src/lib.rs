//! IP over ExaNet (SPEC §5, report §5.3): a user-level service per node carries the IP
//! packets of the node's TUN device to the services of other nodes as an ordinary
//! workload of the NI. Each service keeps, in its registered memory, one receive ring per
//! peer; a sender RDMA-writes batches of packets into its ring at the peer, with a
//! completion notification that tells the peer a batch arrived, and the peer returns the
//! space it consumed in mailbox messages (credits), so a slow receiver is never overrun.
//!
//! - [`addr`]: which IPv4 address each node has, and which node an address names;
//! - [`packet`]: what the service checks of an IP packet before it carries it;
//! - [`wire`]: the formats that cross the fabric (batches, hello and credit messages);
//! - [`service`]: the per-node state machine, without I/O: packets from the host in,
//!   RDMA writes and messages out; notifications and messages in, packets for the host out.

#![forbid(unsafe_code)]

pub mod addr;
pub mod packet;
pub mod service;
pub mod wire;

pub use addr::RackSubnet;
pub use service::{Drop, IpConfig, IpService, IpStats, Outgoing, PeerOp};

/// The rank and mailbox the service attaches at, kept for it by every NI.
pub use exanet_proto::reserved::{IP_MAILBOX_VI, IP_RANK};

/// Largest batch written: several MTU-sized packets at the default MTU, and the
/// receive ring (four batches at least) stays small enough for a ring per peer.
pub const MAX_BATCH: u32 = 64 * 1024 + 64;
/// Batches in flight to one peer: enough to keep a path busy while each waits for its
/// notification's round trip (see docs/ip.md for the figures).
pub const MAX_IN_FLIGHT: u32 = 8;
/// Bytes of each per-peer receive ring at most: room for every batch in flight and as
/// many again while the receiver's credit comes back.
pub const RING_LEN: u32 = 2 * MAX_IN_FLIGHT * MAX_BATCH;
/// Bytes of receive rings per node at most (when the MTU allows): registered memory is
/// committed (the daemon allocates it so that no first touch can fail), and a ring per
/// peer at full size would take 128 MiB per node of a 128-node rack.
pub const AREA_BUDGET: u64 = 32 << 20;
/// Receive rings registered together, when a peer among them first opens a stream: a
/// 128-node rack's service registers at most 8 slabs, an idle one none.
pub const SLAB_RINGS: u32 = 16;
/// Slabs a service registers at most: a rank may hold 64 regions, and the service has
/// others (its send buffers).
pub const MAX_SLABS: u32 = 48;

/// Rings per slab in a rack of `nodes`: [`SLAB_RINGS`], or more in a rack so large that
/// the slabs would be more than [`MAX_SLABS`].
pub fn slab_rings(nodes: u32) -> u32 {
    SLAB_RINGS.max(nodes.div_ceil(MAX_SLABS))
}

/// The per-peer ring for a rack of `nodes` at `mtu`: the full size when the budget allows,
/// else the budget's share, but never less than four batches of an MTU-sized packet. The
/// IP service sizes its rings so, and `exactl rack up` the memory a rack will take.
pub fn ring_len(nodes: u32, mtu: u32) -> u32 {
    let floor = 4 * (mtu + 64);
    let share = (AREA_BUDGET / u64::from(nodes.max(1))).min(u64::from(RING_LEN)) as u32;
    share.max(floor).div_ceil(4096) * 4096
}
