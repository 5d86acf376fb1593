//! The p2plab lab: builds what is missing, starts the device servers and
//! QEMU, runs scripts in the guest, and cleans up. Shared by the
//! `p2plab-vm` CLI (behind `scripts/run-vm`), the end-to-end suites, the
//! kill campaign and the bench.

pub mod accel;
pub mod attach;
pub mod console;
pub mod control;
pub mod facts;
pub mod guest_script;
pub mod kernel_log;
pub mod lab;
pub mod paths;
pub mod process;
pub mod qmp;
pub mod routing;
pub mod setup;
pub mod topology;

pub use accel::{Accel, Timeout};
pub use guest_script::GuestScript;
pub use lab::{GuestControl, Lab, LabOptions, Mode, Outcome};
pub use paths::LabPaths;
