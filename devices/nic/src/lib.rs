//! p2plab-nic: a NIC-like PCIe DMA device for GPUDirect-RDMA-style work.
//!
//! - BAR0: trapped control registers ([`regs`]).
//! - BAR4: MSI-X table and PBA (owned by the PCI layer).
//! - TX and RX descriptor rings in guest memory ([`descriptor`]); a TX
//!   engine thread reads each frame from its buffer (guest RAM or a peer
//!   device's BAR) and puts it on the wire; an RX engine thread writes
//!   frames from the wire into posted buffers.
//! - The wire is p2plab-wire's [`Wire`]: two NIC server processes through
//!   a unix socket, or a loopback; it drops, delays or corrupts frames
//!   when the model asks (specs in [`fault`], on p2plab-fault's grammar).
//!
//! The model ([`Nic`]) is a state machine built from p2plab-kit: guest
//! memory behind the kit's DMA gate (Bus Master Enable, reset quiesce)
//! and its `Interrupts`, tested without a socket or QEMU. The
//! `p2plab-nic` binary wires it to the vfio-user transport.

pub mod descriptor;
pub mod fault;
pub mod model;
pub mod pci;
pub mod regs;
pub mod stats;

pub use fault::NicFaultSpec;
pub use model::{Nic, NicControl};
pub use p2plab_kit::PciIds;
pub use p2plab_wire::{Wire, WireConfig, WireOptions};
pub use pci::{nic_function, NicError, NicFunction};
pub use regs::DEFAULT_IDS;
pub use stats::{Stats, StatsSnapshot};
