//! Server side of the vfio-user protocol (QEMU docs/interop/vfio-user.rst)
//! and the DMA address space device models use to reach guest memory.
//!
//! This crate knows no device: a model implements [`Device`], a binary
//! creates a [`DmaSpace`] (shared with the model) and a [`Server`], and
//! calls [`Server::run`]. The server's reader thread calls the device for
//! every client request; device threads use the [`DmaSpace`] freely.
//!
//! ```no_run
//! use p2plab_vfio_user::{Device, DmaSpace, Server, ServerConfig};
//! # fn build_model(_dma: DmaSpace) -> Box<dyn Device> { unimplemented!() }
//! let dma = DmaSpace::new();
//! // The model keeps a clone for its own threads (command processing).
//! let mut device = build_model(dma.clone());
//! let server = Server::new(ServerConfig::new("/run/lab/nvme0.sock"), dma)?;
//! let stop = server.shutdown_handle(); // e.g. for a SIGTERM handler
//! server.run(&mut *device)?; // returns after `stop.shutdown()`
//! # Ok::<(), p2plab_vfio_user::ServerError>(())
//! ```
//!
//! Threading rules: device callbacks run on the connection's reader thread
//! and must not wait on message-based DMA (the [`DmaSpace`] refuses with
//! [`DmaError::WouldDeadlock`]); fd-backed memory and local windows are fine
//! from any thread.
//!
//! ## Layering
//!
//! Modules import each other in one direction only (checked by
//! `docs/check/tests/layering.rs`); each line lists what a module uses,
//! top to bottom:
//!
//! ```text
//! server   -> session, link, config, device, dma,    accept loop, peer check,
//!             record                                 connection lifecycle
//! session  -> link, config, device, dma, protocol,   one connection: read, check,
//!             socket, record, fdkind                 dispatch, reply
//! link     -> dma, protocol, socket                  writes and our DMA requests;
//!                                                    implements dma's MessageDma
//! config   -> protocol                               ServerConfig, ServerError
//! shm      -> dma                                    memfd memory (a LocalMemory)
//! record   -> fdkind, socket                          session recordings (fuzz inputs)
//! socket   -> protocol                               sendmsg/recvmsg with fds
//! guest_memory -> dma, shm                           DmaSpace as p2plab-dma's
//!                                                    GuestMemory, SharedRegion
//! dma, device, protocol, fdkind                      the ground: no crate imports
//! ```
//!
//! The DMA address space sits at the bottom: it reaches fd-less client
//! memory through the `MessageDma` trait it defines, which `link`
//! implements and the session attaches once VERSION is negotiated, so
//! `dma` never names the connection. `ConnectionEnd` belongs to `session`, which decides it; the
//! server only reports it.

#![deny(missing_docs)]

pub mod config;
pub mod device;
pub mod dma;
pub mod fdkind;
mod guest_memory;
mod link;
pub mod protocol;
pub mod record;
pub mod server;
mod session;
pub mod shm;
mod socket;

pub use config::{ServerConfig, ServerError};
pub use device::*;
pub use dma::{
    populate_for_write, Access, DmaError, DmaRange, DmaSpace, DmaStats, DmaTarget, LocalMemory,
    LocalWindowId, Perms, Traffic, DEFAULT_DMA_TIMEOUT, PREFAULT_STEP,
};
pub use guest_memory::{fault_kind, SharedRegion};
pub use server::{Server, ShutdownHandle};
pub use session::ConnectionEnd;
pub use shm::SharedMemory;
/// recvmsg with SCM_RIGHTS that accounts for every byte and fd (the peer
/// registry's sockets use it too).
pub use socket::{recv_with_fds, Received};

/// VFIO ABI constants and structs (region/irq flags, PCI region indexes),
/// re-exported so device crates need no extra dependency.
pub use vfio_bindings::bindings::vfio as vfio_abi;
/// Volatile memory views handed out by [`DmaSpace::with_slice`].
pub use vm_memory::{ReadVolatile, VolatileSlice, WriteVolatile};
/// Eventfds carried by [`IrqData::EventFds`].
pub use vmm_sys_util::eventfd::EventFd;
