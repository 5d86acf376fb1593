//! Public types of the DMA address space: errors, permissions, targets,
//! counters, and the trait for device-owned memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vm_memory::VolatileSlice;

/// Why a DMA access failed. Nothing here panics on a bad address.
///
/// Address faults carry the guest-physical range (`gpa`, `len` in bytes)
/// that failed, so a device can report exactly which access broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// Some byte of the range is in no client range and no local window.
    #[error("guest address {gpa:#x} (+{len}) is not mapped")]
    Unmapped {
        /// Where the unmapped part starts (for an unmap: the request's
        /// start).
        gpa: u64,
        /// Bytes from there to the end of the access or request.
        len: u64,
    },
    /// `gpa + len` does not fit in 64 bits.
    #[error("guest range {gpa:#x}+{len} wraps around the address space")]
    Overflow {
        /// Start of the range.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// The client mapped the range without the permission the access
    /// needs (DMA_MAP flags).
    #[error("guest address {gpa:#x} is mapped without {} permission", if *.write { "write" } else { "read" })]
    Permission {
        /// First address of the range that lacks the permission.
        gpa: u64,
        /// Write permission was missing (else read permission).
        write: bool,
    },
    /// A zero-copy access ([`DmaSpace::with_slice`](crate::DmaSpace::with_slice))
    /// hit memory that only messages reach, or spans several mappings; the
    /// caller falls back to copying.
    #[error("guest range {gpa:#x}+{len} is not one directly accessible mapping")]
    NotDirect {
        /// Start of the access.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// An access or window leaves the device memory behind it.
    #[error("offset {offset:#x}+{len} is outside memory of {size} bytes")]
    OutOfBounds {
        /// Offset inside the memory.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Size of the memory.
        size: u64,
    },
    /// A new client range or local window overlaps one already there.
    #[error("range {gpa:#x}+{len} overlaps an existing mapping")]
    Overlap {
        /// Start of the refused range.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// DMA_UNMAP would cut a mapping in two, or covers none.
    #[error("range {gpa:#x}+{len} does not cover whole mappings")]
    PartialUnmap {
        /// Start of the unmap request.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// A caller's argument makes no sense (an empty mapping, scatter-gather
    /// lengths that do not add up); the text says which.
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// No local window has this id (it was removed).
    #[error("unknown local window")]
    UnknownWindow,
    /// Message DMA was attempted on the connection's reader thread, which
    /// is the thread that would have to read the reply.
    #[error("message-based DMA from the connection's reader thread would deadlock")]
    WouldDeadlock,
    /// Message DMA was attempted while no client is attached.
    #[error("no client is connected")]
    NotConnected,
    /// The client went away while a DMA message waited for its reply.
    #[error("the client disconnected")]
    Disconnected,
    /// The client did not answer a DMA message in time.
    #[error("the client did not answer within {after:?}")]
    Timeout {
        /// How long we waited.
        after: Duration,
    },
    /// Every message id is taken by a request still waiting.
    #[error("too many DMA requests in flight")]
    Busy,
    /// The client answered a DMA message with an error reply.
    #[error("the client refused the access (errno {errno})")]
    Remote {
        /// The errno in the client's reply.
        errno: i32,
    },
    /// The client's reply to a DMA message does not match the request.
    #[error("malformed reply from the client: {0}")]
    Protocol(String),
    /// Mapping a client's fd failed: the mmap error and its errno.
    #[error("mmap failed: {0}")]
    Mmap(String, i32),
    /// A DMA_MAP fd that could fault later was refused: not a regular
    /// file, too short for the range, or opened without the access the
    /// range needs; the text says which.
    #[error("client memory fd refused: {0}")]
    BadBacking(String),
    /// The client's file behind the range shrank below it (the range was
    /// not sealed against shrinking, so it is reached by pread/pwrite).
    #[error("guest range {gpa:#x}+{len} lies past the end of the client's file (it shrank)")]
    Truncated {
        /// Start of the access.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// The range was unmapped, or the device is being reset (DMA is
    /// fenced), while the access was starting or waiting for a reply.
    #[error("guest range {gpa:#x}+{len} was unmapped or fenced during the access")]
    Revoked {
        /// Start of the access (or of the message that was cancelled).
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// A range was removed, but a device access through it was still
    /// running after this long (an unmap then fails with this error; the
    /// memory stays mapped here until the access ends).
    #[error("guest range {gpa:#x}+{len} still in use by the device after {after:?}")]
    StillInUse {
        /// Start of the range.
        gpa: u64,
        /// Its length.
        len: u64,
        /// How long we waited.
        after: Duration,
    },
    /// Sending a DMA message failed; the connection is being dropped.
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
            DmaError::BadBacking(_) => libc::EINVAL,
            DmaError::Truncated { .. } => libc::EFAULT,
            DmaError::Revoked { .. } => libc::ECANCELED,
            DmaError::StillInUse { .. } => libc::EBUSY,
            DmaError::Io(_) => libc::EIO,
        }
    }
}

/// Read/write permission of a client range (DMA_MAP flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perms {
    /// The device may read the range (DMA_MAP_READ).
    pub read: bool,
    /// The device may write the range (DMA_MAP_WRITE).
    pub write: bool,
}

impl Perms {
    /// What guest RAM usually gets.
    pub const READ_WRITE: Perms = Perms {
        read: true,
        write: true,
    };
    /// Memory the device must not write (e.g. ROM).
    pub const READ_ONLY: Perms = Perms {
        read: true,
        write: false,
    };
}

/// What a zero-copy access intends to do with the memory (defined with
/// the device-side memory traits in p2plab-dma).
pub use p2plab_dma::Access;

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
    /// Entirely inside one peer window (another server's memory, reached
    /// directly).
    Peer(LocalWindowId),
    /// At least one byte is not mapped at all.
    Unmapped,
    /// Mapped, but by ranges of different kinds.
    Mixed,
}

/// Memory a device can expose at a guest-physical address as a local
/// window. [`crate::SharedMemory`] implements it.
pub trait LocalMemory: Send + Sync {
    /// Size in bytes; a window must fit inside it.
    fn size(&self) -> u64;
    /// Copies `buf.len()` bytes from `offset` into `buf`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    /// Copies `data` to `offset`.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DmaError>;
    /// Zero-copy: the memory behind `[offset, offset+len)` for an access
    /// of kind `access`, when it may be touched directly for that kind;
    /// `None` makes the caller copy with `read_at`/`write_at`.
    fn direct_slice(&self, offset: u64, len: usize, access: Access) -> Option<VolatileSlice<'_>> {
        let _ = (offset, len, access);
        None
    }
    /// `len` bytes were moved through slices from
    /// [`direct_slice`](Self::direct_slice): a memory that keeps its own
    /// counters (a peer's counter page) counts them here.
    fn note_direct(&self, len: usize, access: Access) {
        let _ = (len, access);
    }
    /// Faults `[offset, offset+len)` in for writing ahead of use (see
    /// [`DmaSpace::prefault`](crate::DmaSpace::prefault)): moves no data,
    /// counts nothing. Memory that needs nothing of the kind (the
    /// device's own BARs) ignores it.
    fn prefault(&self, offset: u64, len: u64) -> Result<(), DmaError> {
        let _ = (offset, len);
        Ok(())
    }
    /// Whether a window onto this memory may still serve accesses where it
    /// sits. A peer's memory says no as soon as its owner revoked the
    /// placement (moved the BAR, turned decode off, cut us off), even
    /// before we applied that: accesses then skip the window and are
    /// served by whatever lies below it (QEMU's message-only range for the
    /// BAR, or nothing), never by stale memory. Checked once per access,
    /// after the access entered the window, so a revocation either sees
    /// the access (and waits for it) or the access sees the revocation.
    fn is_current(&self) -> bool {
        true
    }
}

/// Byte and operation counts for one path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Reads served by this path (one per resolved piece of an access).
    pub read_ops: u64,
    /// Bytes read through this path.
    pub read_bytes: u64,
    /// Writes served by this path.
    pub write_ops: u64,
    /// Bytes written through this path.
    pub write_bytes: u64,
}

/// Counters per access path, for observability and tests ("did these bytes
/// go to guest RAM, to a peer through messages, or to our own window?").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DmaStats {
    /// Client memory mmapped here (guest RAM sealed against shrinking).
    pub mmap: Traffic,
    /// Client memory reached by pread/pwrite on its fd (a file not sealed
    /// against shrinking, e.g. QEMU's `memory-backend-file`).
    pub file: Traffic,
    /// DMA_READ/DMA_WRITE messages (peer BARs and other fd-less ranges).
    pub message: Traffic,
    /// The device's own local windows.
    pub local: Traffic,
    /// Peer windows: other p2plab servers' BAR memory, reached directly
    /// through the memfd they shared (no message through the client).
    pub peer: Traffic,
}

/// A client range as listed by [`DmaSpace::mappings`](super::DmaSpace::mappings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaRange {
    /// Guest-physical start.
    pub gpa: u64,
    /// Length in bytes.
    pub len: u64,
    /// What the client allowed.
    pub perms: Perms,
    /// Whether it came with an fd (else it is reached by messages).
    pub fd_backed: bool,
    /// Whether it is mmapped here (an fd sealed against shrinking); an
    /// fd-backed range that is not is reached by pread/pwrite.
    pub mmapped: bool,
}

#[derive(Default)]
pub(super) struct TrafficCounters {
    read_ops: AtomicU64,
    read_bytes: AtomicU64,
    write_ops: AtomicU64,
    write_bytes: AtomicU64,
}

impl TrafficCounters {
    /// Counts one read of `bytes` bytes.
    pub(super) fn record_read(&self, bytes: usize) {
        self.read_ops.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    /// Counts one write of `bytes` bytes.
    pub(super) fn record_write(&self, bytes: usize) {
        self.write_ops.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
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
