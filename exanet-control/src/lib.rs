//! What every part of the emulator agrees on about a rack: the rack file (`rack.toml`),
//! the layout of the rack directory, job quotas and the control protocol. The daemon
//! (exanetd), the operator's tool (exactl) and the workloads' client library (exanet) all
//! read them from here, so none re-derives a path or a field.
//!
//! The `net` feature adds what only the daemon and exactl need and what pulls in a TLS
//! and QUIC stack: the rack's PKI ([`tls`]) and the control client ([`control_client`]).

#![forbid(unsafe_code)]

pub mod control;
#[cfg(feature = "net")]
pub mod control_client;
pub mod host;
pub mod ip;
pub mod ports;
pub mod quota;
pub mod rack;
#[cfg(feature = "net")]
pub mod tls;
