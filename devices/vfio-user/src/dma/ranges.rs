//! Client ranges (DMA_MAP / DMA_UNMAP) and device-owned local windows.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use tracing::debug;
use vm_memory::mmap::MmapRegion;
use vm_memory::FileOffset;

use super::{
    page_size, range_end, AddressMap, ClientRange, DmaError, DmaRange, DmaSpace, GuestMapping,
    LocalMemory, LocalWindow, LocalWindowId, Perms,
};

impl DmaSpace {
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
}
