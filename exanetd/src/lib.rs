//! exanetd: the I/O shell around one exanet-proto node. It links the node to its
//! neighbours over QUIC, exposes metrics and a control socket, and feeds everything it
//! hears into the sans-IO core, carrying out what the core returns.
//!
//! The rack file, TLS material, quotas and the control protocol live in
//! `exanet-control`, shared with `exactl` and the client library, and are used from there
//! by name (`exanet_control::rack`).

#![forbid(unsafe_code)]

pub mod capture;
pub mod closer;
pub mod control_server;
pub mod cuts;
pub mod daemon;
pub mod held_credit;
pub mod host_budget;
pub mod http;
pub mod link;
pub mod metrics;
pub mod ni_service;
pub mod node;
pub mod precise_timer;
pub mod session;
pub mod shm_memory;
