//! Client ranges (DMA_MAP / DMA_UNMAP) and device-owned local windows.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use tracing::{debug, warn};

use super::backing::Backing;
use super::{
    range_end, AddressMap, ClientRange, DmaError, DmaRange, DmaSpace, LocalMemory, LocalWindow,
    LocalWindowId, Perms, RangeUsers,
};

impl DmaSpace {
    /// Adds a client range backed by `fd` at `file_offset`. The transport
    /// calls this for DMA_MAP with an fd; device-model tests use it to fake
    /// guest RAM (e.g. with a [`crate::SharedMemory`]'s fd).
    ///
    /// The fd must be a regular file (or memfd) at least `file_offset +
    /// len` bytes long, opened for the access `perms` asks for; anything
    /// else is refused with [`DmaError::BadBacking`]. A file sealed with
    /// `F_SEAL_SHRINK` is mmapped MAP_SHARED; any other is reached with
    /// pread/pwrite, so a client shrinking it makes DMA fail
    /// ([`DmaError::Truncated`]) instead of killing the server with SIGBUS.
    pub fn map_fd(
        &self,
        gpa: u64,
        len: u64,
        perms: Perms,
        fd: OwnedFd,
        file_offset: u64,
    ) -> Result<(), DmaError> {
        // Check the address range before any syscall on the fd.
        range_end(gpa, len)?;
        let backing = Backing::from_fd(len, perms, fd, file_offset)?;
        self.insert_client(gpa, len, perms, backing)
    }

    /// Adds a client range without an fd: accesses become messages.
    pub fn map_message_only(&self, gpa: u64, len: u64, perms: Perms) -> Result<(), DmaError> {
        self.insert_client(gpa, len, perms, Backing::Message)
    }

    fn insert_client(
        &self,
        gpa: u64,
        len: u64,
        perms: Perms,
        backing: Backing,
    ) -> Result<(), DmaError> {
        if len == 0 {
            return Err(DmaError::Invalid("empty mapping"));
        }
        let end = range_end(gpa, len)?;
        let mut map = self.map_mut();
        let before = map.client.range(..end).next_back();
        if let Some((_, prev)) = before {
            // The last range starting below our end must end at or before
            // our start (ranges never overlap each other).
            if prev.end() > gpa {
                return Err(DmaError::Overlap { gpa, len });
            }
        }
        if !matches!(backing, Backing::Message) {
            Self::evict_peer_windows(&mut map, gpa, end);
        }
        debug!(
            gpa,
            len,
            read = perms.read,
            write = perms.write,
            backing = match backing {
                Backing::Mmap(_) => "mmap",
                Backing::File(_) => "pread/pwrite",
                Backing::Message => "messages",
            },
            "DMA range added"
        );
        map.client.insert(
            gpa,
            Arc::new(ClientRange {
                gpa,
                len,
                perms,
                backing,
                users: Arc::new(RangeUsers::default()),
            }),
        );
        Ok(())
    }

    /// Guest RAM wins over peer windows in both orders: a placement over
    /// it is refused ([`add_peer_window`](Self::add_peer_window)), and a
    /// DMA_MAP with an fd over a peer window removes the window (it stays
    /// gone until its owner places the BAR again, which is checked anew).
    /// Accesses already running through it finish in the peer's memory,
    /// never in the RAM: they are not waited for, since none of them
    /// touches what the client just mapped.
    fn evict_peer_windows(map: &mut AddressMap, gpa: u64, end: u64) {
        let clashing: Vec<u64> = map
            .windows
            .values()
            .filter(|w| w.peer && w.gpa < end && gpa < w.gpa.saturating_add(w.len))
            .map(|w| w.gpa)
            .collect();
        for key in clashing {
            if let Some(w) = map.windows.remove(&key) {
                w.users.remove();
                warn!(
                    window_gpa = w.gpa,
                    window_len = w.len,
                    ram_gpa = gpa,
                    ram_end = end,
                    "guest RAM mapped over a peer window: the window is removed"
                );
            }
        }
    }

    /// Removes every client range inside `[gpa, gpa+len)`. Fails, removing
    /// nothing, if the range cuts a mapping in two or covers none.
    ///
    /// Returns only once no device access touches the removed memory any
    /// more: new accesses fail at once, message DMA waiting for a reply
    /// to a removed range fails ([`DmaError::Revoked`]), and accesses
    /// already copying are waited for, at most
    /// [`timeout`](Self::timeout). If one is still running then, the
    /// ranges stay removed and [`DmaError::StillInUse`] says which is
    /// busy (its memory stays mapped here until that access ends). So a
    /// reply to DMA_UNMAP sent after this returns really gives the memory
    /// back.
    ///
    /// The range may end exactly at 2^64: QEMU unmaps "everything above
    /// X" that way when a vIOMMU is switched off.
    pub fn unmap(&self, gpa: u64, len: u64) -> Result<usize, DmaError> {
        // `None`: the range ends at 2^64, which a u64 cannot hold.
        let end = match gpa.checked_add(len) {
            Some(end) => Some(end),
            None if u128::from(gpa) + u128::from(len) == 1u128 << 64 => None,
            None => return Err(DmaError::Overflow { gpa, len }),
        };
        let removed = {
            let mut map = self.map_mut();
            // A range starting before `gpa` that reaches into it is cut.
            if let Some((_, prev)) = map.client.range(..gpa).next_back() {
                if prev.end() > gpa {
                    return Err(DmaError::PartialUnmap { gpa, len });
                }
            }
            let inside: Vec<u64> = match end {
                Some(end) => map.client.range(gpa..end).map(|(k, _)| *k).collect(),
                None => map.client.range(gpa..).map(|(k, _)| *k).collect(),
            };
            if let (Some(last), Some(end)) = (inside.last().and_then(|k| map.client.get(k)), end) {
                if last.end() > end {
                    return Err(DmaError::PartialUnmap { gpa, len });
                }
            }
            if inside.is_empty() {
                return Err(DmaError::Unmapped { gpa, len });
            }
            inside
                .iter()
                .filter_map(|k| map.client.remove(k))
                .collect::<Vec<_>>()
        };
        debug!(gpa, len, removed = removed.len(), "DMA range removed");
        self.close_and_drain(&removed)?;
        Ok(removed.len())
    }

    /// Removes every client range, with the guarantee of
    /// [`unmap`](Self::unmap).
    pub fn unmap_all(&self) -> Result<usize, DmaError> {
        let removed: Vec<Arc<ClientRange>> = std::mem::take(&mut self.map_mut().client)
            .into_values()
            .collect();
        if !removed.is_empty() {
            debug!(count = removed.len(), "all DMA ranges removed");
        }
        self.close_and_drain(&removed)?;
        Ok(removed.len())
    }

    /// Closes removed ranges to new accesses, fails message DMA waiting on
    /// them, and waits for the running accesses to end.
    fn close_and_drain(&self, removed: &[Arc<ClientRange>]) -> Result<(), DmaError> {
        for range in removed {
            range.users.remove();
        }
        self.cancel_closed_waits();
        self.wait_drained(removed)
    }

    /// Number of client ranges (what `max_dma_maps` limits).
    pub fn mapping_count(&self) -> usize {
        self.map().client.len()
    }

    /// Number of client ranges that came with an fd (each keeps one open).
    pub fn fd_mapping_count(&self) -> usize {
        self.map()
            .client
            .values()
            .filter(|r| !matches!(r.backing, Backing::Message))
            .count()
    }

    /// Bytes of client memory mapped with an fd, all ranges together.
    pub fn fd_mapped_bytes(&self) -> u64 {
        self.map()
            .client
            .values()
            .filter(|r| !matches!(r.backing, Backing::Message))
            .fold(0u64, |sum, r| sum.saturating_add(r.len))
    }

    /// Every client range, in address order (for logs and tests).
    pub fn mappings(&self) -> Vec<DmaRange> {
        self.map()
            .client
            .values()
            .map(|r| DmaRange {
                gpa: r.gpa,
                len: r.len,
                perms: r.perms,
                fd_backed: !matches!(r.backing, Backing::Message),
                mmapped: matches!(r.backing, Backing::Mmap(_)),
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
        check_window_memory(len, memory.as_ref(), mem_offset)?;
        let mut map = self.map_mut();
        Self::check_window_free(&map, gpa, len, None)?;
        let id = Self::insert_window(&mut map, gpa, len, memory, mem_offset, false);
        debug!(gpa, len, window = id.0, "local window added");
        Ok(id)
    }

    /// Inserts a window already checked against the map.
    fn insert_window(
        map: &mut AddressMap,
        gpa: u64,
        len: u64,
        memory: Arc<dyn LocalMemory>,
        mem_offset: u64,
        peer: bool,
    ) -> LocalWindowId {
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
                peer,
                users: Arc::new(RangeUsers::default()),
            }),
        );
        id
    }

    /// Moves a window to `new_gpa` (the guest reprogrammed the BAR).
    pub fn move_local_window(&self, id: LocalWindowId, new_gpa: u64) -> Result<(), DmaError> {
        let mut map = self.map_mut();
        let old = map
            .windows
            .values()
            .find(|w| w.id == id && !w.peer)
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
                peer: old.peer,
                users: Arc::clone(&old.users),
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
        let key = map
            .windows
            .values()
            .find(|w| w.id == id && !w.peer)
            .map(|w| w.gpa);
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

    // ----- peer windows -----

    /// Serves `[gpa, gpa+len)` from a peer server's `memory` (from
    /// `mem_offset`), ahead of the message-only client range QEMU maps
    /// there for that peer's BAR. Refused where it would overlap another
    /// window or guest RAM (a client range with an fd): a peer never
    /// shadows memory the client gave us.
    pub fn add_peer_window(
        &self,
        gpa: u64,
        len: u64,
        memory: Arc<dyn LocalMemory>,
        mem_offset: u64,
    ) -> Result<LocalWindowId, DmaError> {
        check_window_memory(len, memory.as_ref(), mem_offset)?;
        let mut map = self.map_mut();
        Self::check_window_free(&map, gpa, len, None)?;
        Self::check_no_guest_ram(&map, gpa, len)?;
        let id = Self::insert_window(&mut map, gpa, len, memory, mem_offset, true);
        debug!(gpa, len, window = id.0, "peer window added");
        Ok(id)
    }

    /// Removes a peer window and returns once no access runs through it
    /// any more (at most [`timeout`](Self::timeout); then
    /// [`DmaError::StillInUse`], the window being gone for new accesses
    /// anyway). Returns whether the window existed.
    pub fn remove_peer_window(&self, id: LocalWindowId) -> Result<bool, DmaError> {
        let removed = {
            let mut map = self.map_mut();
            let key = map
                .windows
                .values()
                .find(|w| w.id == id && w.peer)
                .map(|w| w.gpa);
            key.and_then(|gpa| map.windows.remove(&gpa))
        };
        let Some(window) = removed else {
            return Ok(false);
        };
        debug!(gpa = window.gpa, window = id.0, "peer window removed");
        self.drain_window(&window)?;
        Ok(true)
    }

    /// Moves a peer window to `new_gpa`, returning once no access runs
    /// through the old placement any more (as
    /// [`remove_peer_window`](Self::remove_peer_window)). On any error the
    /// window is gone from both places and the caller forgets its id:
    /// - the new placement is refused (overlap): the error says why;
    ///   accesses there then take the message path;
    /// - an access through the old placement still runs after
    ///   [`timeout`](Self::timeout) ([`DmaError::StillInUse`]): the window
    ///   is removed at the new place too, so nothing is left behind that
    ///   nobody owns (a window its user forgot would send DMA into a dead
    ///   peer's memory and refuse that peer's next placement).
    ///
    /// [`DmaError::UnknownWindow`]: no such window (a DMA_MAP over guest
    /// RAM removed it); add it anew.
    pub fn move_peer_window(&self, id: LocalWindowId, new_gpa: u64) -> Result<(), DmaError> {
        let (old, placed) = {
            let mut map = self.map_mut();
            let old = map
                .windows
                .values()
                .find(|w| w.id == id && w.peer)
                .cloned()
                .ok_or(DmaError::UnknownWindow)?;
            map.windows.remove(&old.gpa);
            let placed = Self::check_window_free(&map, new_gpa, old.len, None)
                .and_then(|()| Self::check_no_guest_ram(&map, new_gpa, old.len));
            if placed.is_ok() {
                map.windows.insert(
                    new_gpa,
                    Arc::new(LocalWindow {
                        id,
                        gpa: new_gpa,
                        len: old.len,
                        memory: Arc::clone(&old.memory),
                        mem_offset: old.mem_offset,
                        peer: true,
                        users: Arc::new(RangeUsers::default()),
                    }),
                );
            }
            (old, placed)
        };
        debug!(
            from = old.gpa,
            to = new_gpa,
            window = id.0,
            ok = placed.is_ok(),
            "peer window moved"
        );
        if let Err(busy) = self.drain_window(&old) {
            if placed.is_ok() {
                let mut map = self.map_mut();
                if map.windows.get(&new_gpa).is_some_and(|w| w.id == id) {
                    if let Some(w) = map.windows.remove(&new_gpa) {
                        w.users.remove();
                    }
                }
            }
            warn!(
                from = old.gpa,
                to = new_gpa,
                window = id.0,
                "peer window move timed out on an access in flight: window removed"
            );
            return Err(busy);
        }
        placed
    }

    /// Where a peer window currently sits: (gpa, len).
    pub fn peer_window(&self, id: LocalWindowId) -> Option<(u64, u64)> {
        self.map()
            .windows
            .values()
            .find(|w| w.id == id && w.peer)
            .map(|w| (w.gpa, w.len))
    }

    /// Every peer window as (gpa, len), in address order (for stats and
    /// tests: where this device reaches its peers' memory directly).
    pub fn peer_windows(&self) -> Vec<(u64, u64)> {
        self.map()
            .windows
            .values()
            .filter(|w| w.peer)
            .map(|w| (w.gpa, w.len))
            .collect()
    }

    /// Closes a window that left the map and waits for its accesses.
    fn drain_window(&self, window: &LocalWindow) -> Result<(), DmaError> {
        window.users.remove();
        let deadline = std::time::Instant::now() + self.timeout();
        if window.users.wait_idle(deadline) {
            Ok(())
        } else {
            Err(DmaError::StillInUse {
                gpa: window.gpa,
                len: window.len,
                after: self.timeout(),
            })
        }
    }

    fn check_no_guest_ram(map: &AddressMap, gpa: u64, len: u64) -> Result<(), DmaError> {
        let end = range_end(gpa, len)?;
        let first = map
            .client
            .range(..gpa)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| r.end() > gpa);
        let clash = first
            .into_iter()
            .chain(map.client.range(gpa..end).map(|(_, r)| r))
            .any(|r| !matches!(r.backing, Backing::Message));
        if clash {
            return Err(DmaError::Overlap { gpa, len });
        }
        Ok(())
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

/// A window of `len` bytes must be non-empty and fit in its memory from
/// `mem_offset`.
fn check_window_memory(
    len: u64,
    memory: &dyn LocalMemory,
    mem_offset: u64,
) -> Result<(), DmaError> {
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
    Ok(())
}
