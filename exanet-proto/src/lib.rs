//! The sans-IO core of exanet, the ExaNeSt rack emulator.
//!
//! Everything here is a deterministic state machine driven by explicit inputs and explicit
//! time ([`Instant`]): no sockets, no threads, no clock reads. The daemon (`exanetd`)
//! feeds it bytes and timestamps and carries out what it returns; the simulator
//! ([`sim`]) runs a whole rack of these cores in one process.
//!
//! The surface is chosen, as `quinn-proto`'s is. The node and what it is made of (its
//! switch, its links' sessions in the [`Station`], shapes, names and time) are types at the
//! root, from private modules: a user names [`Station`] or [`NodeId`], not the file they
//! live in. Modules stay public where they are a vocabulary of their own, a wire format or
//! a subsystem with many names:
//! - wire formats: [`cell`] (and `code`, the declare-once macro of enums that are numeric
//!   codes on the wire), [`gvas`] (the 80-bit global virtual address and PDIDs), [`frame`]
//!   (link framing between switches), [`attach`] (the workload protocol), [`capture`]
//!   (which cells a capture takes and the records it writes);
//! - the rack: [`topology`] (switch ports and the links of a rack), [`routing`]
//!   (dimension-order routing with dateline virtual channels), [`fault`] (fault injection
//!   and shaping on one direction of a link, one table of kinds);
//! - the NI: [`ni`] (its engines), [`workload`] (its service to attached workloads),
//!   within the quotas of [`quota`], around what [`reserved`] keeps for the rack's services;
//! - time and measurement: [`model`] (what the ExaNeSt hardware would have taken),
//!   [`metric`] (the exporter's catalog); behind the `harness` feature, for tests,
//!   examples and benches only, `fidelity` (the report's measurements repeated in modeled
//!   time) and `bench` (the rack the switch benchmark drives);
//! - [`sim`]: a whole rack in simulated time.
//!
//! Private, behind the root: `shape` (rack shape, node names, ids and coordinates), `time`,
//! `rng` (the seeded generator behind jitter and injected faults), `probe` (path-recording
//! probe cells), `switch` (input queues, arbitration and credit flow control), `link` (the
//! sending end of one link direction), `node` (a switch and its local services) and
//! `station` (one node as both drivers run it: its node, its workload service and its
//! links' sessions with hello, replacement and the operator's cut).
//!
//! What runs over the NI rather than inside it lives in crates of its own: the software
//! collectives (`exanet-collective`) and the IP service's state machine (`exanet-ip-proto`).

#![forbid(unsafe_code)]

pub mod attach;
#[cfg(feature = "harness")]
pub mod bench;
pub mod capture;
pub mod cell;
mod code;
mod cut;
pub mod fault;
#[cfg(feature = "harness")]
pub mod fidelity;
pub mod frame;
pub mod gvas;
pub mod horizon;
mod link;
pub mod metric;
pub mod model;
pub mod ni;
mod node;
mod order;
mod probe;
pub mod quota;
pub mod reserved;
mod rng;
pub mod routing;
mod shape;
pub mod sim;
mod station;
mod switch;
mod time;
pub mod topology;
pub mod workload;

pub use cell::{Cell, CellError, CellType, Engine};
pub use gvas::{Gvas, GvasError, Pdid};
pub use node::{Node, NodeError, NodeEvent, NodeStats, LOAD_MIN_PAYLOAD, OUTBOX_LIMIT};
pub use probe::{ProbeBody, HOP_LEN};
pub use rng::SplitMix64;
pub use routing::{Hop, Vc};
pub use shape::{
    Coord, NameError, NodeId, NodeName, Shape, ShapeError, FPGAS_PER_QFDB, MAX_X, NODE_ID_BITS,
};
pub use station::{
    Departure, FaultsSet, HelloError, LinkEnd, NotCurrent, SessionEnd, SessionId, SessionRefused,
    Station, StationEvent, Wire,
};
pub use switch::{
    PortStats, Switch, SwitchConfig, SwitchError, Transmit, DEFAULT_LOCAL_WINDOW, DEFAULT_WINDOW,
    HW_INPUT_BUFFER, MIN_WINDOW,
};
pub use time::{Instant, ModelTime, Stamp, START_CYCLE_DAYS};
pub use topology::{Link, LinkKind, Port};
