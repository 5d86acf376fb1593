//! The p2plab VM harness: builds what is missing, starts the device servers
//! and QEMU, runs commands in the guest, and cleans up. Shared by the
//! `p2plab-vm` CLI (behind `scripts/run-vm`), the end-to-end tests and the
//! benchmarks.

pub mod attach;
pub mod console;
pub mod control;
pub mod elf;
pub mod kernel_log;
pub mod kill;
pub mod lab;
pub mod paths;
pub mod pattern;
pub mod process;
pub mod qemu_fix;
pub mod qmp;
pub mod setup;
pub mod topology;

pub use lab::{Lab, LabOptions, Mode, Outcome};
pub use paths::LabPaths;
