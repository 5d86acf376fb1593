//! Server side of the vfio-user protocol (QEMU docs/interop/vfio-user.rst)
//! and the DMA address space device models use to reach guest memory.
//!
//! This crate knows no device: a model implements [`Device`], a binary
//! creates a [`DmaSpace`] (shared with the model) and a [`Server`], and
//! calls [`Server::run`]. The server's reader thread calls the device for
//! every client request; device threads use the [`DmaSpace`] freely.

pub mod device;
pub mod dma;
mod link;
pub mod protocol;
pub mod server;
mod session;
pub mod shm;
mod socket;

pub use device::*;
pub use dma::{
    Access, DmaError, DmaRange, DmaSpace, DmaStats, DmaTarget, LocalMemory, LocalWindowId, Perms,
    Traffic, DEFAULT_DMA_TIMEOUT,
};
pub use server::{ConnectionEnd, Server, ServerConfig, ServerError, ShutdownHandle};
pub use shm::SharedMemory;

/// VFIO ABI constants and structs (region/irq flags, PCI region indexes),
/// re-exported so device crates need no extra dependency.
pub use vfio_bindings::bindings::vfio as vfio_abi;
/// Volatile memory views handed out by [`DmaSpace::with_slice`].
pub use vm_memory::{ReadVolatile, VolatileSlice, WriteVolatile};
/// Eventfds carried by [`IrqData::EventFds`].
pub use vmm_sys_util::eventfd::EventFd;
