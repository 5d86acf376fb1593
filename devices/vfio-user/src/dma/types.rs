//! Public types of the DMA address space: errors, permissions, targets,
//! counters, and the trait for device-owned memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vm_memory::VolatileSlice;

/// Why a DMA access failed. Nothing here panics on a bad address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    #[error("guest address {gpa:#x} (+{len}) is not mapped")]
    Unmapped { gpa: u64, len: u64 },
    #[error("guest range {gpa:#x}+{len} wraps around the address space")]
    Overflow { gpa: u64, len: u64 },
    #[error("guest address {gpa:#x} is mapped without {} permission", if *.write { "write" } else { "read" })]
    Permission { gpa: u64, write: bool },
    #[error("guest range {gpa:#x}+{len} is not one directly accessible mapping")]
    NotDirect { gpa: u64, len: u64 },
    #[error("offset {offset:#x}+{len} is outside memory of {size} bytes")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    #[error("range {gpa:#x}+{len} overlaps an existing mapping")]
    Overlap { gpa: u64, len: u64 },
    #[error("range {gpa:#x}+{len} does not cover whole mappings")]
    PartialUnmap { gpa: u64, len: u64 },
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("unknown local window")]
    UnknownWindow,
    #[error("message-based DMA from the connection's reader thread would deadlock")]
    WouldDeadlock,
    #[error("no client is connected")]
    NotConnected,
    #[error("the client disconnected")]
    Disconnected,
    #[error("the client did not answer within {after:?}")]
    Timeout { after: Duration },
    #[error("too many DMA requests in flight")]
    Busy,
    #[error("the client refused the access (errno {errno})")]
    Remote { errno: i32 },
    #[error("malformed reply from the client: {0}")]
    Protocol(String),
    #[error("mmap failed: {0}")]
    Mmap(String, i32),
    #[error("socket error: {0}")]
    Io(String),
}

impl DmaError {
    /// The errno that best describes this error in a vfio-user reply.
    pub fn errno(&self) -> i32 {
        match self {
            DmaError::Unmapped { .. } => libc::ENOENT,
            DmaError::Overflow { .. }
            | DmaError::OutOfBounds { .. }
            | DmaError::PartialUnmap { .. }
            | DmaError::Invalid(_)
            | DmaError::NotDirect { .. } => libc::EINVAL,
            DmaError::Permission { .. } => libc::EACCES,
            DmaError::Overlap { .. } => libc::EEXIST,
            DmaError::UnknownWindow => libc::ENOENT,
            DmaError::WouldDeadlock => libc::EDEADLK,
            DmaError::NotConnected | DmaError::Disconnected => libc::ENOTCONN,
            DmaError::Timeout { .. } => libc::ETIMEDOUT,
            DmaError::Busy => libc::EBUSY,
            DmaError::Remote { errno } => *errno,
            DmaError::Protocol(_) => libc::EPROTO,
            DmaError::Mmap(_, errno) => *errno,
            DmaError::Io(_) => libc::EIO,
        }
    }
}

/// Read/write permission of a client range (DMA_MAP flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perms {
    pub read: bool,
    pub write: bool,
}

impl Perms {
    pub const READ_WRITE: Perms = Perms {
        read: true,
        write: true,
    };
    pub const READ_ONLY: Perms = Perms {
        read: true,
        write: false,
    };
}

/// What a zero-copy access intends to do with the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    pub(super) fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }
    pub(super) fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// Identifies a local window for moving or removing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LocalWindowId(pub(super) u64);

/// Where a guest-physical range lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmaTarget {
    /// Client memory mmapped here (fd-backed), possibly several ranges.
    GuestMemory,
    /// Client memory reachable only through DMA_READ/DMA_WRITE messages
    /// (e.g. a peer device's BAR).
    MessageOnly,
    /// Entirely inside one of this device's local windows.
    Local(LocalWindowId),
    /// At least one byte is not mapped at all.
    Unmapped,
    /// Mapped, but by ranges of different kinds.
    Mixed,
}

/// Memory a device can expose at a guest-physical address as a local
/// window. [`crate::SharedMemory`] implements it.
pub trait LocalMemory: Send + Sync {
    fn size(&self) -> u64;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DmaError>;
    /// The whole memory for zero-copy access, if it is plain host memory.
    fn volatile_slice(&self) -> Option<VolatileSlice<'_>> {
        None
    }
}

/// Byte and operation counts for one path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
}

/// Counters per access path, for observability and tests ("did these bytes
/// go to guest RAM, to a peer through messages, or to our own window?").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DmaStats {
    pub mmap: Traffic,
    pub message: Traffic,
    pub local: Traffic,
}

/// A client range as listed by [`DmaSpace::mappings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaRange {
    pub gpa: u64,
    pub len: u64,
    pub perms: Perms,
    pub fd_backed: bool,
}

#[derive(Default)]
pub(super) struct TrafficCounters {
    read_ops: AtomicU64,
    read_bytes: AtomicU64,
    write_ops: AtomicU64,
    write_bytes: AtomicU64,
}

impl TrafficCounters {
    pub(super) fn record(&self, write: bool, bytes: usize) {
        let (ops, total) = if write {
            (&self.write_ops, &self.write_bytes)
        } else {
            (&self.read_ops, &self.read_bytes)
        };
        ops.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub(super) fn snapshot(&self) -> Traffic {
        Traffic {
            read_ops: self.read_ops.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_ops: self.write_ops.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
        }
    }
}
