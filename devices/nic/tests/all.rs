//! The crate's integration suites that can share a process, as one test
//! binary: linking one binary instead of one per suite is most of what
//! these suites cost to build (docs/user-guide/testing.md, "Timings").
//! Each suite stays its own file and module; a suite that changes
//! process-wide state is its own binary instead (Cargo.toml's [[test]]).

mod binary;
mod caller_engines;
mod guest_header;
mod hostile_client;
mod model;
mod reset_quiesce;
mod tcp_wire;
mod wire_wedge;
