//! exanetd: the I/O shell around one exanet-proto node. It links the node to its
//! neighbours over QUIC, exposes metrics and a control socket, and feeds everything it
//! hears into the sans-IO core, carrying out what the core returns.
//!
//! The rack file, TLS material and the control protocol are shared with `exactl`.

pub mod control;
pub mod control_client;
pub mod control_server;
pub mod daemon;
pub mod http;
pub mod link;
pub mod metrics;
pub mod ni_service;
pub mod node;
pub mod precise_timer;
pub mod quota;
pub mod rack;
pub mod tls;
