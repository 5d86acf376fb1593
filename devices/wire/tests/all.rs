//! The crate's integration suites that can share a process, as one test
//! binary: linking one binary instead of one per suite is most of what
//! these suites cost to build (docs/user-guide/testing.md, "Timings").
//! Each suite stays its own file and module; a suite that changes
//! process-wide state is its own binary instead (Cargo.toml's [[test]]).

mod fuzz_seeds;
mod socket;
mod tcp;
