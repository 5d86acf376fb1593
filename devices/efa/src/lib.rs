//! p2plab-efa: an emulated AWS Elastic Fabric Adapter that the unmodified
//! upstream `efa` driver, rdma-core's efa provider and perftest run on.
//!
//! - [`regs`]: the PCI identity (Amazon 1d0f:efa1), BAR layout and BAR0's
//!   registers, named as in the driver's `efa_regs_defs.h`.
//! - [`defs`]: the interface's codes (admin opcodes and statuses, feature
//!   IDs, completion statuses...), named as in its headers.
//! - [`attrs`]: the attributes GET_FEATURE reports, set by the server.
//! - [`admin`], [`io`], [`pbl`]: the formats the driver and user space
//!   write (admin entries, WQEs, receive descriptors, page lists) and the
//!   device writes (completions, events), parsed without trusting them.
//! - [`fault`]: the EFA's fault vocabulary on p2plab-fault's grammar.
//! - [`frame`] and [`link`]: the fabric between EFAs (packets with a
//!   CRC-32C, and the port they go through).
//! - [`Efa`] ([`model`]): the device as a state machine with its threads,
//!   tested without QEMU over p2plab-dma's fakes and the kit's recording
//!   interrupts; [`pci`] makes it a PCI function, `p2plab-efa` serves it.
//!
//! ## Layering
//!
//! Modules import each other in one direction only:
//!
//! ```text
//! pci      -> model, regs, attrs, link
//! model    -> fault, admin, io, pbl, frame, link, attrs, defs, regs, stats, bytes
//! fault    -> defs
//! admin, io, pbl, frame -> defs, attrs, bytes
//! attrs    -> defs, regs, bytes
//! link, stats, defs, regs, bytes   (leaves)
//! ```

pub mod admin;
pub mod attrs;
pub mod bytes;
pub mod defs;
pub mod fault;
pub mod frame;
pub mod io;
pub mod link;
pub mod model;
pub mod pbl;
pub mod pci;
pub mod regs;
pub mod stats;

pub use attrs::DeviceAttrs;
pub use link::{ChannelLink, Link, LinkError, NoLink, WireLink};
pub use model::{Efa, EfaControl, EfaOptions, ObjectCounts};
pub use p2plab_kit::PciIds;
pub use p2plab_wire::{Wire, WireConfig, WireOptions};
pub use pci::{efa_function, EfaError, EfaFunction};
pub use regs::DEFAULT_IDS;
pub use stats::{Stats, StatsSnapshot};
