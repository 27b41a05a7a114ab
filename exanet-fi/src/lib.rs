//! exanet-fi: a libfabric provider named `exanet`, over the client library ([`exanet`]),
//! so that unmodified programs written to libfabric (Open MPI's `mtl ofi`, MPICH's
//! `ch4:ofi`, libfabric's own tools) use the emulated NI of the node they run on.
//!
//! libfabric 1.17 loads it from `FI_PROVIDER_PATH` as `libexanet-fi.so` (the cdylib of
//! this crate, `libexanet_fi.so`, under the name libfabric looks for) through its
//! `fi_prov_ini`.
//!
//! - [`offer`]: what the provider offers and how it answers `fi_getinfo`'s hints, in safe
//!   Rust;
//! - [`abi`]: libfabric's structs and constants as the provider uses them, checked
//!   against the installed headers by `tests/abi.rs`;
//! - [`msg`]: messages between endpoints as ExaNet-MPI sends them (eager through mailboxes,
//!   rendezvous read by the receiver), tag matching and the unexpected queue, without I/O;
//! - `mr`: the memory regions an application registers for one-sided operations;
//! - `provider`: the C entry points; `pmpi`: the MPI calls interposed under `exactl
//!   mpirun --modeled`; the crate's only unsafe code.
//!
//! What is built and what is not, with the figures: `docs/mpi.md`.

#![deny(unsafe_code)]

pub mod abi;
mod av;
mod cntr;
mod cq;
mod endpoint;
mod log;
mod mr;
pub mod msg;
pub mod offer;
#[allow(unsafe_code)]
mod pmpi;
#[allow(unsafe_code)]
mod provider;
mod staging;

pub use provider::fi_prov_ini;
