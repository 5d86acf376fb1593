//! The DMA address space device models use to reach guest-physical memory.
//!
//! Three kinds of ranges exist:
//! - client ranges with an fd (DMA_MAP + SCM_RIGHTS): mmapped here, so
//!   accesses are plain memory copies ("guest memory");
//! - client ranges without an fd (typically peer BARs): reached through
//!   DMA_READ / DMA_WRITE messages to the client ("message only");
//! - local windows a device registers over its own memory (its CMB or VRAM
//!   at the address the guest gave its BAR): served here without any
//!   message, and taking precedence over client ranges.
//!
//! [`DmaSpace`] is a cheap `Arc` handle: clone it into device threads.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::ops::Bound;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tracing::debug;
use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory, VolatileSlice};

use crate::link::Link;

/// Default time a device thread waits for the client to answer one of our
/// DMA_READ / DMA_WRITE messages.
pub const DEFAULT_DMA_TIMEOUT: Duration = Duration::from_secs(10);

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
    fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }
    fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// Identifies a local window for moving or removing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LocalWindowId(u64);

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
struct TrafficCounters {
    read_ops: AtomicU64,
    read_bytes: AtomicU64,
    write_ops: AtomicU64,
    write_bytes: AtomicU64,
}

impl TrafficCounters {
    fn record(&self, write: bool, bytes: usize) {
        let (ops, total) = if write {
            (&self.write_ops, &self.write_bytes)
        } else {
            (&self.read_ops, &self.read_bytes)
        };
        ops.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    fn snapshot(&self) -> Traffic {
        Traffic {
            read_ops: self.read_ops.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_ops: self.write_ops.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
        }
    }
}

/// An fd-backed client range, mapped MAP_SHARED. `delta` is where the
/// range starts inside `region` (the mapping starts page-aligned).
struct GuestMapping {
    region: MmapRegion,
    delta: usize,
}

struct ClientRange {
    gpa: u64,
    len: u64,
    perms: Perms,
    mapping: Option<GuestMapping>,
}

struct LocalWindow {
    id: LocalWindowId,
    gpa: u64,
    len: u64,
    memory: Arc<dyn LocalMemory>,
    mem_offset: u64,
}

#[derive(Default)]
struct AddressMap {
    client: BTreeMap<u64, Arc<ClientRange>>,
    windows: BTreeMap<u64, Arc<LocalWindow>>,
    next_window: u64,
}

/// One contiguous piece of an access, resolved while the map is locked and
/// performed after the lock is released.
enum Chunk {
    Mmap {
        range: Arc<ClientRange>,
        offset: usize,
        len: usize,
    },
    Message {
        gpa: u64,
        len: usize,
    },
    Local {
        window: Arc<LocalWindow>,
        offset: u64,
        len: usize,
    },
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Mmap { len, .. } | Chunk::Message { len, .. } | Chunk::Local { len, .. } => *len,
        }
    }
}

struct Inner {
    map: RwLock<AddressMap>,
    link: RwLock<Option<Arc<Link>>>,
    timeout: Duration,
    mmap: TrafficCounters,
    message: TrafficCounters,
    local: TrafficCounters,
}

/// The guest-physical address space as one device sees it. Clone freely;
/// all clones share state.
#[derive(Clone)]
pub struct DmaSpace {
    inner: Arc<Inner>,
}

impl Default for DmaSpace {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for DmaSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = self.map();
        f.debug_struct("DmaSpace")
            .field("client_ranges", &map.client.len())
            .field("local_windows", &map.windows.len())
            .field("connected", &self.is_connected())
            .finish()
    }
}

fn range_end(gpa: u64, len: u64) -> Result<u64, DmaError> {
    gpa.checked_add(len).ok_or(DmaError::Overflow { gpa, len })
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no side effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096).max(1)
}

impl DmaSpace {
    pub fn new() -> Self {
        Self::with_timeout(DEFAULT_DMA_TIMEOUT)
    }

    /// `timeout` bounds every wait for a DMA_READ/DMA_WRITE reply.
    pub fn with_timeout(timeout: Duration) -> Self {
        DmaSpace {
            inner: Arc::new(Inner {
                map: RwLock::new(AddressMap::default()),
                link: RwLock::new(None),
                timeout,
                mmap: TrafficCounters::default(),
                message: TrafficCounters::default(),
                local: TrafficCounters::default(),
            }),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    fn map(&self) -> RwLockReadGuard<'_, AddressMap> {
        self.inner
            .map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    fn map_mut(&self) -> RwLockWriteGuard<'_, AddressMap> {
        self.inner
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    fn link(&self) -> Option<Arc<Link>> {
        self.inner
            .link
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether a client connection is attached (message-based DMA works).
    pub fn is_connected(&self) -> bool {
        self.link().is_some()
    }

    pub(crate) fn attach(&self, link: Arc<Link>) {
        let old = self
            .inner
            .link
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(link);
        if let Some(old) = old {
            old.close();
        }
    }

    /// Drops the connection: pending message DMA fails, and every client
    /// range goes away (local windows stay: they belong to the device).
    pub(crate) fn detach(&self) {
        let old = self
            .inner
            .link
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(old) = old {
            old.close();
        }
        self.unmap_all();
    }

    // ----- client ranges (DMA_MAP / DMA_UNMAP) -----

    /// Adds a client range backed by `fd` at `file_offset`, mmapped
    /// MAP_SHARED with the protection `perms` asks for. The transport calls
    /// this for DMA_MAP with an fd; device-model tests use it to fake
    /// guest RAM (e.g. with a [`crate::SharedMemory`]'s fd).
    pub fn map_fd(
        &self,
        gpa: u64,
        len: u64,
        perms: Perms,
        fd: OwnedFd,
        file_offset: u64,
    ) -> Result<(), DmaError> {
        let mapping = Self::mmap_range(len, perms, fd, file_offset)?;
        self.insert_client(ClientRange {
            gpa,
            len,
            perms,
            mapping: Some(mapping),
        })
    }

    /// Adds a client range without an fd: accesses become messages.
    pub fn map_message_only(&self, gpa: u64, len: u64, perms: Perms) -> Result<(), DmaError> {
        self.insert_client(ClientRange {
            gpa,
            len,
            perms,
            mapping: None,
        })
    }

    fn mmap_range(
        len: u64,
        perms: Perms,
        fd: OwnedFd,
        file_offset: u64,
    ) -> Result<GuestMapping, DmaError> {
        if len == 0 {
            return Err(DmaError::Invalid("empty mapping"));
        }
        // mmap wants a page-aligned file offset; map from the page start.
        let page = page_size();
        let aligned = file_offset - file_offset % page;
        let delta = file_offset - aligned;
        let map_len = len
            .checked_add(delta)
            .and_then(|l| usize::try_from(l).ok())
            .ok_or(DmaError::Invalid("mapping too large"))?;
        let mut prot = libc::PROT_NONE;
        if perms.read {
            prot |= libc::PROT_READ;
        }
        if perms.write {
            prot |= libc::PROT_WRITE;
        }
        let region = MmapRegion::build(
            Some(FileOffset::new(File::from(fd), aligned)),
            map_len,
            prot,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
        )
        .map_err(|e| {
            let errno = match &e {
                vm_memory::mmap::MmapRegionError::Mmap(io) => io.raw_os_error(),
                _ => None,
            };
            DmaError::Mmap(e.to_string(), errno.unwrap_or(libc::EINVAL))
        })?;
        Ok(GuestMapping {
            region,
            // delta < page size, which fits any usize.
            delta: usize::try_from(delta).unwrap_or_default(),
        })
    }

    fn insert_client(&self, range: ClientRange) -> Result<(), DmaError> {
        let (gpa, len) = (range.gpa, range.len);
        if len == 0 {
            return Err(DmaError::Invalid("empty mapping"));
        }
        let end = range_end(gpa, len)?;
        let mut map = self.map_mut();
        let before = map.client.range(..end).next_back();
        if let Some((_, prev)) = before {
            // The last range starting below our end must end at or before
            // our start (ranges never overlap each other).
            if prev.gpa + prev.len > gpa {
                return Err(DmaError::Overlap { gpa, len });
            }
        }
        debug!(
            gpa,
            len,
            read = range.perms.read,
            write = range.perms.write,
            fd_backed = range.mapping.is_some(),
            "DMA range added"
        );
        map.client.insert(gpa, Arc::new(range));
        Ok(())
    }

    /// Removes every client range inside `[gpa, gpa+len)`. Fails, removing
    /// nothing, if the range cuts a mapping in two or covers none. A
    /// device thread still using a removed fd-backed range keeps its
    /// mapping alive until it is done.
    pub fn unmap(&self, gpa: u64, len: u64) -> Result<usize, DmaError> {
        let end = range_end(gpa, len)?;
        let mut map = self.map_mut();
        // A range starting before `gpa` that reaches into it is cut.
        if let Some((_, prev)) = map.client.range(..gpa).next_back() {
            if prev.gpa + prev.len > gpa {
                return Err(DmaError::PartialUnmap { gpa, len });
            }
        }
        let inside: Vec<u64> = map.client.range(gpa..end).map(|(k, _)| *k).collect();
        if let Some(last) = inside.last().and_then(|k| map.client.get(k)) {
            if last.gpa + last.len > end {
                return Err(DmaError::PartialUnmap { gpa, len });
            }
        }
        if inside.is_empty() {
            return Err(DmaError::Unmapped { gpa, len });
        }
        for k in &inside {
            map.client.remove(k);
        }
        debug!(gpa, len, removed = inside.len(), "DMA range removed");
        Ok(inside.len())
    }

    /// Removes every client range.
    pub fn unmap_all(&self) {
        let removed = std::mem::take(&mut self.map_mut().client);
        if !removed.is_empty() {
            debug!(count = removed.len(), "all DMA ranges removed");
        }
    }

    pub fn mapping_count(&self) -> usize {
        self.map().client.len()
    }

    pub fn mappings(&self) -> Vec<DmaRange> {
        self.map()
            .client
            .values()
            .map(|r| DmaRange {
                gpa: r.gpa,
                len: r.len,
                perms: r.perms,
                fd_backed: r.mapping.is_some(),
            })
            .collect()
    }

    // ----- local windows -----

    /// Serves `[gpa, gpa+len)` from `memory` starting at `mem_offset`,
    /// ahead of any client range there. Windows must not overlap each
    /// other.
    pub fn add_local_window(
        &self,
        gpa: u64,
        len: u64,
        memory: Arc<dyn LocalMemory>,
        mem_offset: u64,
    ) -> Result<LocalWindowId, DmaError> {
        if len == 0 {
            return Err(DmaError::Invalid("empty window"));
        }
        let mem_end = range_end(mem_offset, len)?;
        if mem_end > memory.size() {
            return Err(DmaError::OutOfBounds {
                offset: mem_offset,
                len,
                size: memory.size(),
            });
        }
        let mut map = self.map_mut();
        Self::check_window_free(&map, gpa, len, None)?;
        let id = LocalWindowId(map.next_window);
        map.next_window += 1;
        map.windows.insert(
            gpa,
            Arc::new(LocalWindow {
                id,
                gpa,
                len,
                memory,
                mem_offset,
            }),
        );
        debug!(gpa, len, window = id.0, "local window added");
        Ok(id)
    }

    /// Moves a window to `new_gpa` (the guest reprogrammed the BAR).
    pub fn move_local_window(&self, id: LocalWindowId, new_gpa: u64) -> Result<(), DmaError> {
        let mut map = self.map_mut();
        let old = map
            .windows
            .values()
            .find(|w| w.id == id)
            .cloned()
            .ok_or(DmaError::UnknownWindow)?;
        Self::check_window_free(&map, new_gpa, old.len, Some(id))?;
        map.windows.remove(&old.gpa);
        map.windows.insert(
            new_gpa,
            Arc::new(LocalWindow {
                id,
                gpa: new_gpa,
                len: old.len,
                memory: Arc::clone(&old.memory),
                mem_offset: old.mem_offset,
            }),
        );
        debug!(
            from = old.gpa,
            to = new_gpa,
            window = id.0,
            "local window moved"
        );
        Ok(())
    }

    /// Removes a window; returns whether it existed.
    pub fn remove_local_window(&self, id: LocalWindowId) -> bool {
        let mut map = self.map_mut();
        let key = map.windows.values().find(|w| w.id == id).map(|w| w.gpa);
        match key {
            Some(gpa) => {
                map.windows.remove(&gpa);
                debug!(gpa, window = id.0, "local window removed");
                true
            }
            None => false,
        }
    }

    /// Where a window currently sits: (gpa, len).
    pub fn local_window(&self, id: LocalWindowId) -> Option<(u64, u64)> {
        self.map()
            .windows
            .values()
            .find(|w| w.id == id)
            .map(|w| (w.gpa, w.len))
    }

    fn check_window_free(
        map: &AddressMap,
        gpa: u64,
        len: u64,
        ignore: Option<LocalWindowId>,
    ) -> Result<(), DmaError> {
        let end = range_end(gpa, len)?;
        let clash = map
            .windows
            .values()
            .filter(|w| Some(w.id) != ignore)
            .any(|w| w.gpa < end && gpa < w.gpa + w.len);
        if clash {
            return Err(DmaError::Overlap { gpa, len });
        }
        Ok(())
    }

    // ----- address resolution -----

    /// Splits `[gpa, gpa+len)` into pieces served by one range each,
    /// checking permissions. Windows win over client ranges.
    fn resolve(&self, gpa: u64, len: usize, access: Access) -> Result<Vec<Chunk>, DmaError> {
        let len64 = len as u64;
        let end = range_end(gpa, len64)?;
        let map = self.map();
        let mut chunks = Vec::new();
        let mut cur = gpa;
        while cur < end {
            if let Some(w) = Self::window_at(&map, cur) {
                let stop = end.min(w.gpa + w.len);
                chunks.push(Chunk::Local {
                    window: Arc::clone(w),
                    offset: w.mem_offset + (cur - w.gpa),
                    len: (stop - cur) as usize,
                });
                cur = stop;
                continue;
            }
            // A client range, cut where the next window begins.
            let next_window = map
                .windows
                .range((Bound::Excluded(cur), Bound::Unbounded))
                .next()
                .map(|(start, _)| *start)
                .unwrap_or(u64::MAX);
            let range = Self::client_at(&map, cur).ok_or(DmaError::Unmapped {
                gpa: cur,
                len: end - cur,
            })?;
            if access.reads() && !range.perms.read {
                return Err(DmaError::Permission {
                    gpa: cur,
                    write: false,
                });
            }
            if access.writes() && !range.perms.write {
                return Err(DmaError::Permission {
                    gpa: cur,
                    write: true,
                });
            }
            let stop = end.min(range.gpa + range.len).min(next_window);
            let piece = (stop - cur) as usize;
            match &range.mapping {
                Some(m) => chunks.push(Chunk::Mmap {
                    offset: m.delta + (cur - range.gpa) as usize,
                    range: Arc::clone(range),
                    len: piece,
                }),
                None => chunks.push(Chunk::Message {
                    gpa: cur,
                    len: piece,
                }),
            }
            cur = stop;
        }
        Ok(chunks)
    }

    fn window_at(map: &AddressMap, gpa: u64) -> Option<&Arc<LocalWindow>> {
        map.windows
            .range(..=gpa)
            .next_back()
            .map(|(_, w)| w)
            .filter(|w| gpa - w.gpa < w.len)
    }

    fn client_at(map: &AddressMap, gpa: u64) -> Option<&Arc<ClientRange>> {
        map.client
            .range(..=gpa)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| gpa - r.gpa < r.len)
    }

    /// Tells where `[gpa, gpa+len)` lands (len 0 is treated as 1 byte).
    pub fn classify(&self, gpa: u64, len: u64) -> DmaTarget {
        let Ok(end) = range_end(gpa, len.max(1)) else {
            return DmaTarget::Unmapped;
        };
        let map = self.map();
        let mut kind: Option<DmaTarget> = None;
        let mut cur = gpa;
        while cur < end {
            let (this, stop) = if let Some(w) = Self::window_at(&map, cur) {
                (DmaTarget::Local(w.id), w.gpa + w.len)
            } else if let Some(r) = Self::client_at(&map, cur) {
                let next_window = map
                    .windows
                    .range((Bound::Excluded(cur), Bound::Unbounded))
                    .next()
                    .map(|(start, _)| *start)
                    .unwrap_or(u64::MAX);
                let k = if r.mapping.is_some() {
                    DmaTarget::GuestMemory
                } else {
                    DmaTarget::MessageOnly
                };
                (k, (r.gpa + r.len).min(next_window))
            } else {
                return DmaTarget::Unmapped;
            };
            match kind {
                None => kind = Some(this),
                Some(k) if k == this => {}
                Some(_) => kind = Some(DmaTarget::Mixed),
            }
            cur = stop.min(end);
        }
        kind.unwrap_or(DmaTarget::Unmapped)
    }

    // ----- data access -----

    /// Reads guest memory at `gpa` into `buf`. On error, part of `buf` may
    /// already be filled.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let chunks = self.resolve(gpa, buf.len(), Access::Read)?;
        let mut rest = buf;
        let mut at = gpa;
        for chunk in chunks {
            let (part, tail) = rest
                .split_at_mut_checked(chunk.len())
                .ok_or(DmaError::Invalid("internal: chunk longer than buffer"))?;
            self.read_chunk(&chunk, at, part)?;
            at = at.wrapping_add(part.len() as u64);
            rest = tail;
        }
        Ok(())
    }

    /// Writes `data` to guest memory at `gpa`. On error, part of it may
    /// already be written.
    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<(), DmaError> {
        let chunks = self.resolve(gpa, data.len(), Access::Write)?;
        let mut rest = data;
        let mut at = gpa;
        for chunk in chunks {
            let (part, tail) = rest
                .split_at_checked(chunk.len())
                .ok_or(DmaError::Invalid("internal: chunk longer than data"))?;
            self.write_chunk(&chunk, at, part)?;
            at = at.wrapping_add(part.len() as u64);
            rest = tail;
        }
        Ok(())
    }

    /// Gathers the `(gpa, len)` segments, in order, into `buf`, whose
    /// length must be the segments' total.
    pub fn read_sg(&self, segments: &[(u64, usize)], buf: &mut [u8]) -> Result<(), DmaError> {
        Self::check_sg_total(segments, buf.len())?;
        let mut rest = buf;
        for &(gpa, len) in segments {
            let (part, tail) = rest
                .split_at_mut_checked(len)
                .ok_or(DmaError::Invalid("segments exceed the buffer"))?;
            self.read(gpa, part)?;
            rest = tail;
        }
        Ok(())
    }

    /// Scatters `data` over the `(gpa, len)` segments, in order.
    pub fn write_sg(&self, segments: &[(u64, usize)], data: &[u8]) -> Result<(), DmaError> {
        Self::check_sg_total(segments, data.len())?;
        let mut rest = data;
        for &(gpa, len) in segments {
            let (part, tail) = rest
                .split_at_checked(len)
                .ok_or(DmaError::Invalid("segments exceed the data"))?;
            self.write(gpa, part)?;
            rest = tail;
        }
        Ok(())
    }

    fn check_sg_total(segments: &[(u64, usize)], want: usize) -> Result<(), DmaError> {
        let total = segments
            .iter()
            .try_fold(0usize, |acc, &(_, len)| acc.checked_add(len));
        if total != Some(want) {
            return Err(DmaError::Invalid(
                "scatter-gather total differs from the buffer length",
            ));
        }
        Ok(())
    }

    /// Zero-copy access: calls `f` with the memory behind `[gpa, gpa+len)`
    /// if it lies in one fd-backed client range or one local window backed
    /// by plain memory. Anything else (message-only, split across ranges,
    /// unmapped) is an error, and the caller falls back to `read`/`write`.
    ///
    /// The mapping stays valid during `f` even if the client unmaps it
    /// concurrently. With `Access::Read` on a read-only range the memory
    /// is mapped without PROT_WRITE: `f` must not write to it.
    pub fn with_slice<R>(
        &self,
        gpa: u64,
        len: usize,
        access: Access,
        f: impl FnOnce(VolatileSlice<'_>) -> R,
    ) -> Result<R, DmaError> {
        let chunks = self.resolve(gpa, len, access)?;
        let not_direct = DmaError::NotDirect {
            gpa,
            len: len as u64,
        };
        let counters = match chunks.first() {
            Some(Chunk::Mmap { .. }) => &self.inner.mmap,
            Some(Chunk::Local { .. }) => &self.inner.local,
            _ => return Err(not_direct),
        };
        if access.reads() {
            counters.record(false, len);
        }
        if access.writes() {
            counters.record(true, len);
        }
        match chunks.as_slice() {
            [Chunk::Mmap { range, offset, len }] => {
                let mapping = range.mapping.as_ref().ok_or(not_direct)?;
                let slice = mapping
                    .region
                    .get_slice(*offset, *len)
                    .map_err(|_| DmaError::Invalid("internal: mmap slice out of range"))?;
                debug!(gpa, len, "zero-copy guest memory access");
                Ok(f(slice))
            }
            [Chunk::Local {
                window,
                offset,
                len,
            }] => {
                let whole = window.memory.volatile_slice().ok_or(not_direct)?;
                let start = usize::try_from(*offset).map_err(|_| DmaError::Overflow {
                    gpa,
                    len: *len as u64,
                })?;
                let slice = whole
                    .subslice(start, *len)
                    .map_err(|_| DmaError::OutOfBounds {
                        offset: *offset,
                        len: *len as u64,
                        size: window.memory.size(),
                    })?;
                debug!(gpa, len, "zero-copy local window access");
                Ok(f(slice))
            }
            _ => Err(not_direct),
        }
    }

    fn read_chunk(&self, chunk: &Chunk, gpa: u64, part: &mut [u8]) -> Result<(), DmaError> {
        match chunk {
            Chunk::Mmap { range, offset, len } => {
                let mapping = range
                    .mapping
                    .as_ref()
                    .ok_or(DmaError::Invalid("internal: no mapping"))?;
                let slice = mapping
                    .region
                    .get_slice(*offset, *len)
                    .map_err(|_| DmaError::Invalid("internal: mmap slice out of range"))?;
                slice.copy_to(part);
                self.inner.mmap.record(false, part.len());
                debug!(gpa, len, "dma read from guest memory");
            }
            Chunk::Message { gpa, .. } => {
                let link = self.link().ok_or(DmaError::NotConnected)?;
                debug!(gpa, len = part.len(), "dma read via DMA_READ messages");
                link.dma_read(*gpa, part)?;
                self.inner.message.record(false, part.len());
            }
            Chunk::Local { window, offset, .. } => {
                window.memory.read_at(*offset, part)?;
                self.inner.local.record(false, part.len());
                debug!(
                    gpa,
                    len = part.len(),
                    window = window.id.0,
                    "dma read from local window"
                );
            }
        }
        Ok(())
    }

    fn write_chunk(&self, chunk: &Chunk, gpa: u64, part: &[u8]) -> Result<(), DmaError> {
        match chunk {
            Chunk::Mmap { range, offset, len } => {
                let mapping = range
                    .mapping
                    .as_ref()
                    .ok_or(DmaError::Invalid("internal: no mapping"))?;
                let slice = mapping
                    .region
                    .get_slice(*offset, *len)
                    .map_err(|_| DmaError::Invalid("internal: mmap slice out of range"))?;
                slice.copy_from(part);
                self.inner.mmap.record(true, part.len());
                debug!(gpa, len, "dma write to guest memory");
            }
            Chunk::Message { gpa, .. } => {
                let link = self.link().ok_or(DmaError::NotConnected)?;
                debug!(gpa, len = part.len(), "dma write via DMA_WRITE messages");
                link.dma_write(*gpa, part)?;
                self.inner.message.record(true, part.len());
            }
            Chunk::Local { window, offset, .. } => {
                window.memory.write_at(*offset, part)?;
                self.inner.local.record(true, part.len());
                debug!(
                    gpa,
                    len = part.len(),
                    window = window.id.0,
                    "dma write to local window"
                );
            }
        }
        Ok(())
    }

    pub fn stats(&self) -> DmaStats {
        DmaStats {
            mmap: self.inner.mmap.snapshot(),
            message: self.inner.message.snapshot(),
            local: self.inner.local.snapshot(),
        }
    }
}

#[cfg(test)]
#[path = "dma_tests.rs"]
mod tests;
