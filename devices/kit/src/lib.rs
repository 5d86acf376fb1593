//! What every p2plab device model is built from. A model depends on this
//! crate for the seams all devices share, so a new device is a register
//! table, a state machine and its engines, and nothing else:
//!
//! - [`PciIds`], [`ClassCode`], [`MsixBar`]: a device's identity and the
//!   config-space parts every device shares.
//! - [`Interrupts`]: how a model signals a vector, from any thread;
//!   implemented once for the PCI layer's interrupt controller, with
//!   [`LateInterrupts`] for a model built before its PCI function, and a
//!   recorder in `testing` (feature `testing`).
//! - [`DmaGate`]: all of a model's DMA goes through it. It follows Bus
//!   Master Enable, and its epoch plus in-flight count let a reset
//!   [`quiesce`](DmaGate::quiesce): after it returns, no access of work
//!   fetched before it can start or still run.
//! - [`registers!`] and [`bit_flags!`]: one way to declare a BAR's
//!   register map and its bits, named as in the C header; [`regs::Half`]
//!   for 64-bit registers split in dwords; [`regs::write_dwords`] and
//!   [`regs::read_bytes`] for trapped accesses.
//! - [`counters!`](macro@crate::counters): live atomic counters and a
//!   serde snapshot.
//! - [`DeviceControl`]: the control verbs (status, inject, clear, reset,
//!   registers, faults, trace), served by p2plab-server's control socket.
//! - [`ServedDevice`]: what p2plab-server's generic wiring needs from a
//!   model (control verbs, the BAR shared with peers, [`PlacementHook`]
//!   for where it decodes, a shutdown step), so a server binary's
//!   `main.rs` is only its flags and how it builds the PCI function.
//!
//! The kit knows no particular device. See
//! `docs/development/add-a-device.md` for a walk through building one.
//!
//! ## Layering
//!
//! Modules import each other in one direction only (checked by
//! `scripts/check-module-cycles`):
//!
//! ```text
//! testing     -> interrupts       RecordingInterrupts
//! interrupts                      Interrupts, LateInterrupts
//! gate                            DmaGate, BoundMemory, Epoch
//! served      -> control, placement   ServedDevice, PeerBar
//! pci, regs, counters, control, placement   (leaves)
//! ```

#![deny(missing_docs)]

pub mod control;
pub mod counters;
pub mod gate;
pub mod interrupts;
pub mod pci;
pub mod placement;
pub mod regs;
pub mod served;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use control::{arm_spec, counters_with, Armed, DeviceControl, StatsLayout};
pub use gate::{BoundMemory, DmaGate, Epoch, QuiesceTimeout, QUIESCE_TIMEOUT};
pub use interrupts::{Interrupts, LateInterrupts};
pub use pci::{ClassCode, MsixBar, PciIds, P2PLAB_VENDOR_ID};
pub use placement::{HoleHook, PlacementHook};
pub use regs::{Half, RegisterMap};
pub use served::{PeerBar, ServedDevice};

/// For [`counters!`](macro@crate::counters): the serde the snapshots
/// serialize with.
pub use serde;
