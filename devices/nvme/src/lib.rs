//! An NVMe controller with a Controller Memory Buffer, as a plain state
//! machine plus its own worker threads, for the `p2plab-nvme` vfio-user
//! server.
//!
//! - [`NvmeController`]: BAR0 registers and doorbells, the CMB, reset and
//!   shutdown, statistics. Register accesses never block on DMA.
//! - Queue workers (one thread per submission queue) run the admin command
//!   set ([`admin`](crate::spec::admin) opcodes) and the NVM command set on
//!   [`Namespace`]s backed by files or memory.
//! - The controller reaches memory through [`GuestMemory`] (guest RAM via
//!   the transport) and [`RegionMemory`] (its own CMB); the [`DmaRouter`]
//!   serves addresses inside the enabled CMB locally.
//!
//! Tests drive it with [`memory::testing`] fakes: no socket, no QEMU.

pub mod command;
pub mod config;
pub mod controller;
pub mod datapointer;
pub mod features;
pub mod identify;
pub mod logs;
pub mod memory;
pub mod namespace;
pub mod server;
pub mod spec;
pub mod stats;

mod admin;
mod io;
mod queues;
mod worker;

#[cfg(test)]
mod tests;

pub use command::{Command, CommandBuilder, Completion, CompletionEntry};
pub use config::{Bar0Layout, ConfigError, ControllerConfig};
pub use controller::{Interrupts, NvmeController};
pub use memory::{DmaFault, DmaRouter, GuestMemory, HeapRegion, Placement, RegionMemory};
pub use namespace::{
    BlockBackend, FileBackend, Namespace, NamespaceError, NamespaceIds, NamespaceSpec,
};
pub use spec::Status;
pub use stats::{Stats, StatsSnapshot};

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex, recovering the data if another thread panicked with it
/// held: a worker's panic must not take the whole server down.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
