//! p2plab-gpu: a GPU-like PCIe device for peer-to-peer DMA experiments.
//!
//! - BAR0: trapped control registers ([`regs`]).
//! - BAR2: VRAM, a sparse memfd QEMU maps directly ([`vram`]).
//! - BAR4: MSI-X table and PBA (owned by the PCI layer).
//! - A copy/fill/checksum engine that consumes a command ring ([`command`])
//!   in guest memory or VRAM on its own thread ([`engine`], driven by the
//!   opcode table in [`engine::opcodes`]).
//!
//! Faults can be injected ([`GpuControl`], specs in [`fault`] on
//! p2plab-fault's grammar): jobs that fail with a chosen status, hang,
//! lose their interrupt, or read a bad VRAM range.
//!
//! The model ([`Gpu`]) is a plain state machine built from p2plab-kit:
//! guest memory behind the kit's DMA gate (Bus Master Enable, reset
//! quiesce) and its `Interrupts`, so it is tested without a socket or
//! QEMU. The `p2plab-gpu` binary wires it to the
//! vfio-user transport.

pub mod cli;
pub mod command;
mod device;
pub mod engine;
pub mod fault;
pub mod model;
pub mod pci;
mod register_file;
pub mod regs;
pub mod stats;
pub mod status;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod vram;

pub use fault::GpuFaultSpec;
pub use model::{Gpu, GpuControl};
pub use p2plab_fault::SpecError;
pub use p2plab_kit::PciIds;
pub use pci::{gpu_function, GpuError, GpuFunction};
pub use regs::DEFAULT_IDS;
pub use stats::{Stats, StatsSnapshot};
pub use vram::Vram;
