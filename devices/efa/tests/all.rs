//! The crate's integration suites that can share a process, as one test
//! binary: linking one binary instead of one per suite is most of what
//! these suites cost to build (docs/user-guide/testing.md, "Timings").
//! Each suite stays its own file and module; a suite that changes
//! process-wide state is its own binary instead (Cargo.toml's [[test]]).

mod caller_engines;
mod common;
mod hostile_client;
mod hostile_guest;
mod hostile_wire;
mod model;
mod server;
