//! The DMA address space device models use to reach guest-physical memory.
//!
//! Three kinds of ranges exist:
//! - client ranges with an fd (DMA_MAP + SCM_RIGHTS): mmapped here, so
//!   accesses are plain memory copies ("guest memory");
//! - client ranges without an fd (typically peer BARs): reached through
//!   DMA_READ / DMA_WRITE messages to the client ("message only");
//! - local windows a device registers over its own memory (its CMB or VRAM
//!   at the address the guest gave its BAR): served here without any
//!   message, and taking precedence over client ranges;
//! - peer windows: another p2plab server's BAR memory (a sealed memfd it
//!   shared with us) at the bus address the guest gave that BAR. Served
//!   like local windows, but counted apart (`peer`), and moved or removed
//!   only once the accesses running through them have finished (the
//!   owner waits for that, for a bounded time, before it lets the guest's
//!   BAR change complete). Guest RAM wins in both orders: a peer window
//!   over an fd-backed client range is refused, and such a range mapped
//!   over a peer window removes the window. A window whose memory says it
//!   is no longer current ([`LocalMemory::is_current`]: its owner revoked
//!   the placement) is skipped by every access, so an owner never depends
//!   on its user's promptness for new accesses to stop.
//!
//! [`DmaSpace`] is a cheap `Arc` handle: clone it into device threads.

mod access;
pub use access::PREFAULT_STEP;
mod backing;
mod inflight;
mod message;
mod ranges;
mod types;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use tracing::warn;
use vm_memory::VolatileSlice;

use backing::Backing;
pub(crate) use inflight::{RangeUse, RangeUsers};
pub(crate) use message::MessageDma;
pub use types::*;

/// Default time a device thread waits for the client to answer one of our
/// DMA_READ / DMA_WRITE messages, and the longest DMA_UNMAP, a reset or a
/// disconnect waits for device accesses still running in a range.
pub const DEFAULT_DMA_TIMEOUT: Duration = Duration::from_secs(10);

struct ClientRange {
    gpa: u64,
    len: u64,
    perms: Perms,
    backing: Backing,
    /// Accesses running through this range right now.
    users: Arc<RangeUsers>,
}

impl ClientRange {
    fn end(&self) -> u64 {
        // Checked when the range was inserted.
        self.gpa.saturating_add(self.len)
    }
}

struct LocalWindow {
    id: LocalWindowId,
    gpa: u64,
    len: u64,
    memory: Arc<dyn LocalMemory>,
    mem_offset: u64,
    /// A peer server's memory (counted as `peer`) rather than our own.
    peer: bool,
    /// Accesses running through the window (only peer windows wait for
    /// them when they move or go away).
    users: Arc<RangeUsers>,
}

#[derive(Default)]
struct AddressMap {
    client: BTreeMap<u64, Arc<ClientRange>>,
    windows: BTreeMap<u64, Arc<LocalWindow>>,
    next_window: u64,
}

/// One contiguous piece of an access, resolved while the map is locked and
/// performed after the lock is released.
///
/// Client chunks hold a [`RangeUse`]: the range cannot finish an unmap,
/// a reset or a disconnect while the chunk lives.
enum Chunk {
    Mmap {
        range: Arc<ClientRange>,
        offset: usize,
        len: usize,
        _use: RangeUse,
    },
    File {
        range: Arc<ClientRange>,
        /// Offset inside the range.
        offset: u64,
        len: usize,
        _use: RangeUse,
    },
    Message {
        gpa: u64,
        len: usize,
        range_use: RangeUse,
    },
    Local {
        window: Arc<LocalWindow>,
        offset: u64,
        len: usize,
        _use: RangeUse,
    },
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Mmap { len, .. }
            | Chunk::File { len, .. }
            | Chunk::Message { len, .. }
            | Chunk::Local { len, .. } => *len,
        }
    }
}

struct Inner {
    map: RwLock<AddressMap>,
    /// The connection's DMA_READ/DMA_WRITE path while a client is attached.
    messages: RwLock<Option<Arc<dyn MessageDma>>>,
    timeout: Duration,
    mmap: TrafficCounters,
    file: TrafficCounters,
    message: TrafficCounters,
    local: TrafficCounters,
    peer: TrafficCounters,
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

/// Faults every page `slice` touches in for writing
/// (`MADV_POPULATE_WRITE`): a shared memfd mapping's holes get pages
/// (zero-filled) and every page is mapped writable in this process's page
/// tables, so stores into the slice then take no page fault. Changes no
/// byte (it only faults pages in), so memory that others write meanwhile
/// keeps what they wrote.
pub fn populate_for_write(slice: &VolatileSlice<'_>) -> std::io::Result<()> {
    if slice.is_empty() {
        return Ok(());
    }
    let page = usize::try_from(page_size()).unwrap_or(4096);
    let start = slice.ptr_guard().as_ptr() as usize;
    let aligned = start - start % page;
    let end = start
        .checked_add(slice.len())
        .and_then(|e| e.checked_next_multiple_of(page))
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: MADV_POPULATE_WRITE changes no memory contents and no
    // mapping: it only faults in the pages of `[aligned, end)`, which are
    // the pages `slice` (a view into one of our mappings) lies in. A range
    // outside any mapping is refused with ENOMEM, not touched.
    let rc = unsafe {
        libc::madvise(
            aligned as *mut libc::c_void,
            end - aligned,
            libc::MADV_POPULATE_WRITE,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no side effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096).max(1)
}

impl DmaSpace {
    /// An empty space (no client ranges, no windows, no connection) whose
    /// message DMA waits [`DEFAULT_DMA_TIMEOUT`] for each reply.
    pub fn new() -> Self {
        Self::with_timeout(DEFAULT_DMA_TIMEOUT)
    }

    /// `timeout` bounds every wait for a DMA_READ/DMA_WRITE reply.
    pub fn with_timeout(timeout: Duration) -> Self {
        DmaSpace {
            inner: Arc::new(Inner {
                map: RwLock::new(AddressMap::default()),
                messages: RwLock::new(None),
                timeout,
                mmap: TrafficCounters::default(),
                file: TrafficCounters::default(),
                message: TrafficCounters::default(),
                local: TrafficCounters::default(),
                peer: TrafficCounters::default(),
            }),
        }
    }

    /// How long a DMA_READ/DMA_WRITE waits for its reply, and how long an
    /// unmap, a reset or a disconnect waits for accesses to drain.
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
    fn message_path(&self) -> Option<Arc<dyn MessageDma>> {
        self.inner
            .messages
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether a client connection is attached (message-based DMA works).
    pub fn is_connected(&self) -> bool {
        self.message_path().is_some()
    }

    /// Routes message-only ranges through `messages` (a connection that
    /// negotiated VERSION). A connection attached before is closed.
    pub(crate) fn attach(&self, messages: Arc<dyn MessageDma>) {
        let old = self
            .inner
            .messages
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(messages);
        if let Some(old) = old {
            old.close();
        }
    }

    /// Drops the connection: every client range goes away (local windows
    /// stay: they belong to the device), pending message DMA fails, and
    /// this returns once no device access touches the client's memory any
    /// more (or after [`timeout`](Self::timeout), logged).
    pub(crate) fn detach(&self) {
        let removed = std::mem::take(&mut self.map_mut().client);
        let removed: Vec<Arc<ClientRange>> = removed.into_values().collect();
        for range in &removed {
            range.users.remove();
        }
        let old = self
            .inner
            .messages
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(old) = old {
            old.close();
        }
        if !removed.is_empty() {
            tracing::debug!(count = removed.len(), "all DMA ranges removed");
        }
        if let Err(e) = self.wait_drained(&removed) {
            warn!("disconnect: {e}");
        }
    }

    /// Waits until no access runs through `ranges` (already closed to new
    /// ones), at most [`timeout`](Self::timeout).
    fn wait_drained(&self, ranges: &[Arc<ClientRange>]) -> Result<(), DmaError> {
        let deadline = Instant::now() + self.inner.timeout;
        for range in ranges {
            if !range.users.wait_idle(deadline) {
                return Err(DmaError::StillInUse {
                    gpa: range.gpa,
                    len: range.len,
                    after: self.inner.timeout,
                });
            }
        }
        Ok(())
    }

    /// Fails message DMA waiting on ranges that were just closed.
    fn cancel_closed_waits(&self) {
        if let Some(messages) = self.message_path() {
            messages.cancel_closed();
        }
    }

    /// Stops all DMA to client memory until the returned fence is
    /// dropped: new accesses fail with [`DmaError::Revoked`], message DMA
    /// waiting for a reply fails at once, and this returns once the
    /// accesses already running have finished (at most
    /// [`timeout`](Self::timeout); the error says which range is still in
    /// use, and the fence holds anyway). The transport fences the space
    /// around a device reset, so device threads blocked in DMA return and
    /// the device can quiesce without waiting for the reader thread.
    pub(crate) fn fence(&self) -> (DmaFence, Result<(), DmaError>) {
        let ranges: Vec<Arc<ClientRange>> = self.map().client.values().cloned().collect();
        for range in &ranges {
            range.users.fence();
        }
        self.cancel_closed_waits();
        let drained = self.wait_drained(&ranges);
        (DmaFence { ranges }, drained)
    }

    /// Bytes and operations so far, per access path.
    pub fn stats(&self) -> DmaStats {
        DmaStats {
            mmap: self.inner.mmap.snapshot(),
            file: self.inner.file.snapshot(),
            message: self.inner.message.snapshot(),
            local: self.inner.local.snapshot(),
            peer: self.inner.peer.snapshot(),
        }
    }
}

/// Holds client memory closed to DMA (see [`DmaSpace::fence`]) until
/// dropped.
pub(crate) struct DmaFence {
    ranges: Vec<Arc<ClientRange>>,
}

impl Drop for DmaFence {
    fn drop(&mut self) {
        for range in &self.ranges {
            range.users.unfence();
        }
    }
}

#[cfg(test)]
mod tests;
