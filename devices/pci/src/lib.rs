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
pub use msix::{FireOutcome, MsixAccessError, MsixEntry, MsixState};

#[cfg(test)]
mod tests;
