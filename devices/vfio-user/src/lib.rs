//! Server side of the vfio-user protocol (QEMU docs/interop/vfio-user.rst)
//! and the DMA address space device models use to reach guest memory.
//!
//! This crate knows no device: a model implements [`Device`], and the
//! transport calls it for every client request.

pub mod device;

pub use device::*;
