//! An NVMe controller with a Controller Memory Buffer, as a plain state
//! machine plus its own worker threads, for the `p2plab-nvme` vfio-user
//! server.
//!
//! - [`NvmeController`]: BAR0 registers and doorbells, the CMB, reset and
//!   shutdown, statistics. Register accesses never block on DMA.
//! - Queue workers (one thread per submission queue) run the commands of
//!   two command tables, admin and NVM I/O, on [`Namespace`]s backed by
//!   files or memory. A table row holds a command's opcode, name, handler,
//!   Commands Supported and Effects bits and data direction; see the
//!   crate's README for how to add a command.
//! - The controller reaches memory through p2plab-dma's
//!   [`GuestMemory`](p2plab_dma::GuestMemory) (guest RAM via the
//!   transport) and [`RegionMemory`](p2plab_dma::RegionMemory) (its own CMB
//!   and PMR); the [`DmaRouter`] serves addresses inside the enabled CMB or
//!   PMR locally.
//!
//! It is built from p2plab-kit: interrupts through the kit's
//! `Interrupts`, guest memory behind the kit's `DmaGate` (Bus Master
//! Enable; a reset joins the queue workers, then quiesces the gate), the
//! register map declared with `registers!`, counters with `counters!`,
//! and the control verbs as a `DeviceControl`.
//!
//! Tests drive it with p2plab-dma's and p2plab-kit's `testing` fakes (the
//! `testing` feature): no socket, no QEMU.
//!
//! # Module dependencies
//!
//! No module imports one that (directly or not) imports it back; the test
//! `docs/check/tests/layering.rs` checks it. From the bottom up, each layer
//! depends only on layers below it:
//!
//! 1. [`spec`], [`registers`], [`config`], [`stats`]: numbers and plain
//!    data
//! 2. [`command`] (queue entries), [`logs`], [`namespace`], [`fault`]
//!    (fault actions, filters and the armed specs)
//! 3. [`fields`] (typed command views), [`memory`] (the DMA router)
//! 4. [`datapointer`] (PRPs, SGLs), [`features`], `queues`
//! 5. [`identify`], `state` (the controller state every handler works on)
//! 6. `context`: what a handler gets and returns
//! 7. `table`: command table rows and dispatch
//! 8. `io`: the NVM I/O command table and its handlers
//! 9. `admin`: the admin command table and its handlers (it reads the I/O
//!    table for the Commands Supported and Effects log); `fault_filter`:
//!    the text form of fault filters, whose opcode names are both tables'
//!    own
//! 10. `trace`: decoding commands and injected faults into trace events;
//!     `worker`: fetch, dispatch through a table, complete
//! 11. [`controller`]: the register front-end; it hands the state the
//!     worker's body, so handlers that create queues never import the
//!     worker
//! 12. [`server`]: the PCI function over vfio-user, and what the server
//!     binary serves (p2plab-kit's `ServedDevice` and `DeviceControl`)

pub mod command;
pub mod config;
pub mod controller;
pub mod datapointer;
pub mod fault;
pub mod features;
pub mod fields;
pub mod identify;
pub mod logs;
pub mod memory;
pub mod namespace;
pub mod registers;
pub mod server;
pub mod spec;
pub mod stats;

mod admin;
mod context;
mod fault_filter;
mod io;
mod queues;
mod state;
mod table;
mod trace;
mod worker;

#[cfg(test)]
mod tests;

pub use command::{Command, CommandBuilder, Completion, CompletionEntry};
pub use config::{Bar0Layout, ConfigError, ControllerConfig};
pub use controller::NvmeController;
pub use memory::{DmaRouter, FileRegion, Placement, PmrSpec};
pub use namespace::{
    BlockBackend, FileBackend, Namespace, NamespaceError, NamespaceIds, NamespaceSpec,
};
pub use spec::Status;
pub use state::{FaultReport, HeldReport};
pub use stats::{Stats, StatsSnapshot};

/// `(opcode, name)` of every admin command the admin command table has,
/// for tools and documentation checks (`docs/reference/nvme.md`).
pub fn admin_commands() -> Vec<(u8, &'static str)> {
    admin::ADMIN_COMMANDS.list()
}

/// `(opcode, name)` of every NVM I/O command the I/O command table has.
pub fn io_commands() -> Vec<(u8, &'static str)> {
    io::IO_COMMANDS.list()
}

/// `(opcode, name in fault specs)` of every admin command: what
/// `admin-opcode=` takes.
pub fn admin_fault_names() -> Vec<(u8, &'static str)> {
    admin::ADMIN_COMMANDS.fault_names()
}

/// `(opcode, name in fault specs)` of every NVM I/O command: what
/// `opcode=` takes.
pub fn io_fault_names() -> Vec<(u8, &'static str)> {
    io::IO_COMMANDS.fault_names()
}

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex, recovering the data if another thread panicked with it
/// held: a worker's panic must not take the whole server down.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
