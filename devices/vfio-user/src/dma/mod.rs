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

mod access;
mod ranges;
mod types;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use vm_memory::mmap::MmapRegion;

use crate::link::Link;

pub use types::*;

/// Default time a device thread waits for the client to answer one of our
/// DMA_READ / DMA_WRITE messages.
pub const DEFAULT_DMA_TIMEOUT: Duration = Duration::from_secs(10);
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

    pub fn stats(&self) -> DmaStats {
        DmaStats {
            mmap: self.inner.mmap.snapshot(),
            message: self.inner.message.snapshot(),
            local: self.inner.local.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests;
