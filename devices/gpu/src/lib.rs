//! p2plab-gpu: a GPU-like PCIe device for peer-to-peer DMA experiments.
//!
//! - BAR0: trapped control registers ([`regs`]).
//! - BAR2: VRAM, a sparse memfd QEMU maps directly ([`vram`]).
//! - BAR4: MSI-X table and PBA (owned by the PCI layer).
//! - A copy/fill/checksum engine that consumes a command ring in guest
//!   memory or VRAM on its own thread ([`model`]).
//!
//! The model is a plain state machine over two small traits,
//! [`GuestMemory`] and [`InterruptSink`], so it is tested without a socket
//! or QEMU. The `p2plab-gpu` binary wires it to the vfio-user transport.

pub mod cli;
pub mod command;
pub mod crc32c;
pub mod model;
pub mod pci;
pub mod regs;
pub mod stats;
pub mod vram;

pub use model::{DmaError, Gpu, GuestMemory, InterruptSink, StatsReader};
pub use pci::{gpu_function, DmaSpaceMemory, GpuError, GpuFunction, GpuIds};
pub use stats::{Stats, StatsSnapshot};
pub use vram::Vram;
