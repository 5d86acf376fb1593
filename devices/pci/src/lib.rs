//! The PCI device model shared by p2plab's device servers.
//!
//! - [`ConfigSpace`] (built with [`ConfigSpaceBuilder`]): a 4096-byte type-0
//!   PCI Express config space with per-byte write masks, BAR size probing,
//!   Power Management, MSI-X and PCI Express capabilities, and extended
//!   capabilities (Resizable BAR, Device Serial Number, device-defined).
//!   Writes return [`ConfigChange`]s.
//! - [`MsixState`]: the MSI-X table and PBA.
//! - [`InterruptController`]: thread-safe interrupt delivery onto the
//!   eventfds the vfio-user client binds (MSI-X, INTx fallback).
//! - [`PciFunction`]: glues a [`PciModel`] to the vfio-user transport by
//!   implementing [`p2plab_vfio_user::Device`].
//!
//! Everything here is a plain state machine: no sockets, no threads.
//!
//! How QEMU's `vfio-user-pci` client (hw/vfio/pci.c, hw/vfio-user/pci.c)
//! uses this, which shapes the design:
//! - Every config write is forwarded to the server; config reads of the
//!   MSI-X capability and a few other bits are answered by QEMU itself.
//! - QEMU emulates the MSI-X table (it reads the table location from our
//!   capability and overlays it in the BAR), so the guest's table writes
//!   never reach us. It binds one eventfd per live vector with SET_IRQS
//!   (MSIX, TRIGGER, DATA_EVENTFD), binds vector 0 to fd -1 to mean
//!   "MSI-X on, no vectors", and tears everything down with count 0.
//!   It forwards PBA reads to the server. So delivery = MSI-X enabled and
//!   not function-masked in our config space, eventfd bound, not masked by
//!   SET_IRQS; our table copy is kept for completeness.
//! - QEMU re-exposes a Resizable BAR capability read-only, with only the
//!   current size, and emulates its control register: under QEMU the guest
//!   cannot resize a BAR, so [`ConfigChange::BarResized`] only comes from
//!   other clients. Pick the BAR size when the server starts.
//!
//! ## Layering
//!
//! Modules import each other in one direction only (checked by
//! `docs/check/tests/layering.rs`); each line lists what a module uses,
//! top to bottom:
//!
//! ```text
//! function   -> config, interrupt, msix, regs   PciFunction: the vfio-user Device
//! interrupt  -> config, msix                     InterruptController (eventfds)
//! config     -> bar, caps, msix, regs            ConfigSpace and its builder
//! bar, caps  -> regs                             BAR and capability descriptions
//! msix       -> regs                             MSI-X table, PBA, delivery state
//! regs                                           spec offsets and bits: the ground
//! ```
//!
//! Only `function` and `interrupt` know the transport
//! ([`p2plab_vfio_user`]); the rest is plain PCI.

#![deny(missing_docs)]

pub mod bar;
pub mod caps;
pub mod config;
pub mod function;
pub mod interrupt;
pub mod msix;
pub mod regs;

pub use bar::{BarKind, BarSpec};
pub use caps::{ExtCapability, LinkSpeed, MsixCapSpec, PcieCapSpec};
pub use config::{
    BarInfo, BuildError, Command, ConfigChange, ConfigError, ConfigSpace, ConfigSpaceBuilder,
    PowerState,
};
pub use function::{BarBacking, PciFunction, PciModel};
pub use interrupt::{Delivery, InterruptController};
pub use msix::{
    ClientMask, FireOutcome, MsixAccessError, MsixControl, MsixEntry, MsixState, VectorBinding,
};

#[cfg(test)]
mod tests;
