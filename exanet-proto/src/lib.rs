//! The sans-IO core of exanet, the ExaNeSt rack emulator.
//!
//! Everything here is a deterministic state machine driven by explicit inputs and explicit
//! time ([`time::Instant`]): no sockets, no threads, no clock reads. The daemon (`exanetd`)
//! feeds it bytes and timestamps and carries out what it returns; the simulator
//! ([`sim`]) runs a whole rack of these cores in one process.
//!
//! One concept per module:
//! - [`shape`]: rack shape, node names, ids and coordinates;
//! - [`gvas`]: the 80-bit global virtual address and PDIDs;
//! - [`topology`]: switch ports and the links of a rack;
//! - [`routing`]: dimension-order routing with dateline virtual channels;
//! - [`cell`]: the cell wire format; [`frame`]: link framing between switches; `code`:
//!   the declare-once macro of enums that are numeric codes on the wire;
//! - [`switch`]: input queues, arbitration and credit flow control;
//! - [`fault`]: fault injection and shaping on one direction of a link;
//! - `link` (private): the sending end of one link direction, which both the daemon and the
//!   simulator send through;
//! - [`rng`]: the seeded generator behind simulated jitter and injected faults;
//! - [`probe`]: path-recording probe cells; [`node`]: a switch and its local services;
//! - [`station`]: one node as both drivers run it: its node, its workload service and
//!   its links' sessions (hello, replacement, the operator's cut);
//! - [`workload`]: the NI's service to attached workloads (the attach protocol is
//!   [`attach`]);
//! - [`model`]: modeled time, what the ExaNeSt hardware would have taken;
//! - [`fidelity`]: the report's measurements repeated in modeled time;
//! - [`capture`]: which cells a capture takes and the records it writes;
//! - [`sim`]: a whole rack in simulated time.

//!
//! What runs over the NI rather than inside it lives in crates of its own: the software
//! collectives (`exanet-collective`) and the IP service's state machine (`exanet-ip-proto`).

#![forbid(unsafe_code)]

pub mod attach;
pub mod capture;
pub mod cell;
mod code;
pub mod fault;
pub mod fidelity;
pub mod frame;
pub mod gvas;
mod link;
pub mod metric;
pub mod model;
pub mod ni;
pub mod node;
pub mod probe;
pub mod reserved;
pub mod rng;
pub mod routing;
pub mod shape;
pub mod sim;
pub mod station;
pub mod switch;
pub mod time;
pub mod topology;
pub mod workload;

pub use cell::{Cell, CellError, CellType};
pub use gvas::{Gvas, GvasError, Pdid};
pub use node::{Node, NodeError, NodeEvent};
pub use routing::{Hop, Vc};
pub use shape::{Coord, NameError, NodeId, NodeName, Shape, ShapeError};
pub use switch::{Switch, SwitchConfig, SwitchError, Transmit};
pub use time::Instant;
pub use topology::{Link, LinkKind, Port};
