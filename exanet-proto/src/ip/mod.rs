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

pub mod addr;
pub mod packet;
pub mod service;
pub mod wire;

pub use addr::RackSubnet;
pub use service::{Drop, IpConfig, IpService, IpStats, Outgoing, PeerOp};

/// The rank the IP service attaches at on every node, so peers find its mailbox without a
/// directory: the highest, leaving the low ranks to jobs, which are given the lowest free.
pub const IP_RANK: u8 = crate::ni::RANKS as u8 - 1;

/// The mailbox (virtual interface) the service receives its control messages on: the
/// last, since workloads are given the lowest free one and expect to start at 0.
pub const IP_MAILBOX_VI: u8 = crate::ni::MAILBOX_VIS as u8 - 1;
