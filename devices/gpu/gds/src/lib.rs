//! p2plab-gds: a cuFile-shaped GPUDirect Storage library for the p2plab
//! guest. It moves data between files (ext4, xfs, any file system) and the
//! p2plab GPU's VRAM:
//!
//! - **P2P**: O_DIRECT I/O with a p2pmem mapping of the GPU's BAR as the
//!   buffer, so the NVMe controller DMAs straight into or out of VRAM
//!   (user-space P2PDMA, Linux >= 6.2);
//! - **compat**: when P2P cannot or may not run (alignment, holes, the
//!   end of file, appends, a file system or topology that refuses), page
//!   cache I/O into a bounce buffer in host RAM plus a GPU engine copy.
//!
//! Every read and write returns an [`IoReport`] that says which path moved
//! which bytes and why. The C ABI (`include/p2plab_gds.h`, module
//! [`ffi`]) mirrors cuFile: driver open/close, handle and buffer
//! registration, read/write with file and buffer offsets.
//!
//! The decision is [`plan::plan`], a pure function; [`exec`] runs it.

pub mod buffer;
pub mod driver;
pub mod error;
pub mod exec;
pub mod ffi;
pub mod file;
pub mod gpu;
pub mod plan;
pub mod platform;
pub mod report;
#[cfg(feature = "testing")]
pub mod testing;
pub mod topology;
pub mod vram;

pub use driver::{Driver, GpuBuffer, Refusal, RouteInfo};
pub use error::{ErrorCode, GdsError, Result};
pub use file::FileHandle;
pub use report::{IoReport, Path, Reason, Route};
pub use vram::{VramKind, VramMapping};
