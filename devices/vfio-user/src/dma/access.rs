//! Address resolution and data access: plain copies for mmapped memory
//! and local windows, messages for the rest, zero-copy slices.

use std::ops::Bound;
use std::sync::Arc;

use tracing::debug;
use vm_memory::{VolatileMemory, VolatileSlice};

use super::backing::Backing;
use super::{
    populate_for_write, range_end, Access, AddressMap, Chunk, ClientRange, DmaError, DmaSpace,
    DmaTarget, LocalWindow,
};

/// Bytes [`DmaSpace::prefault`] faults in per piece (each piece holds
/// its ranges in use while it runs).
pub const PREFAULT_STEP: u64 = 2 << 20;

impl DmaSpace {
    /// Splits `[gpa, gpa+len)` into pieces served by one range each,
    /// checking permissions. Windows win over client ranges. Each client
    /// piece holds a use of its range (taken under the map lock, so an
    /// unmap either sees it or removed the range first).
    fn resolve(&self, gpa: u64, len: usize, access: Access) -> Result<Vec<Chunk>, DmaError> {
        let len64 = len as u64;
        let end = range_end(gpa, len64)?;
        let map = self.map();
        let mut chunks = Vec::new();
        let mut cur = gpa;
        while cur < end {
            if let Some(w) = Self::window_at(&map, cur) {
                let stop = end.min(w.gpa + w.len);
                // Taken under the map lock: a peer window's move or
                // removal either sees this use or happened first.
                let window_use = w.users.enter().ok_or(DmaError::Revoked {
                    gpa: cur,
                    len: end - cur,
                })?;
                // Checked after entering: a revocation that this check
                // misses waits for the use to end (see `is_current`).
                if w.memory.is_current() {
                    chunks.push(Chunk::Local {
                        window: Arc::clone(w),
                        offset: w.mem_offset + (cur - w.gpa),
                        len: (stop - cur) as usize,
                        _use: window_use,
                    });
                    cur = stop;
                    continue;
                }
                // Revoked by its owner: served as if it were not there.
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
            let stop = end.min(range.end()).min(next_window);
            let piece = (stop - cur) as usize;
            let range_use = range.users.enter().ok_or(DmaError::Revoked {
                gpa: cur,
                len: end - cur,
            })?;
            let offset = cur - range.gpa;
            match &range.backing {
                Backing::Mmap(m) => chunks.push(Chunk::Mmap {
                    offset: m.delta + offset as usize,
                    range: Arc::clone(range),
                    len: piece,
                    _use: range_use,
                }),
                Backing::File(_) => chunks.push(Chunk::File {
                    offset,
                    range: Arc::clone(range),
                    len: piece,
                    _use: range_use,
                }),
                Backing::Message => chunks.push(Chunk::Message {
                    gpa: cur,
                    len: piece,
                    range_use,
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
            let live = Self::window_at(&map, cur).filter(|w| w.memory.is_current());
            let (this, stop) = if let Some(w) = live {
                if w.peer {
                    (DmaTarget::Peer(w.id), w.gpa + w.len)
                } else {
                    (DmaTarget::Local(w.id), w.gpa + w.len)
                }
            } else if let Some(r) = Self::client_at(&map, cur) {
                let next_window = map
                    .windows
                    .range((Bound::Excluded(cur), Bound::Unbounded))
                    .next()
                    .map(|(start, _)| *start)
                    .unwrap_or(u64::MAX);
                let k = if matches!(r.backing, Backing::Message) {
                    DmaTarget::MessageOnly
                } else {
                    DmaTarget::GuestMemory
                };
                (k, r.end().min(next_window))
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
    /// already be filled. Each piece releases its range as soon as it is
    /// copied, so an unmap of one range never waits for message DMA to
    /// another.
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

    /// Faults `[gpa, gpa+len)` in for writing ahead of use, as a device
    /// that pins memory when it is registered: mmapped guest RAM and peer
    /// windows get every page mapped writable in this process (a peer's
    /// holes are allocated, zero-filled), so later writes into them take
    /// no page fault and allocate nothing. Moves no data and counts
    /// nothing; memory reached by pread/pwrite or by messages is left
    /// alone. Goes through the range [`PREFAULT_STEP`] bytes at a time,
    /// each piece resolved on its own, so an unmap waits for one piece at
    /// most. An error (unmapped, read-only, the kernel refusing) stops it:
    /// the pages not faulted in are faulted in when used, as before.
    pub fn prefault(&self, gpa: u64, len: u64) -> Result<(), DmaError> {
        let end = range_end(gpa, len)?;
        let mut at = gpa;
        while at < end {
            let piece = (end - at).min(PREFAULT_STEP);
            // piece <= PREFAULT_STEP, which fits any usize.
            let chunks = self.resolve(at, piece as usize, Access::Write)?;
            for chunk in &chunks {
                match chunk {
                    Chunk::Mmap {
                        range, offset, len, ..
                    } => populate_for_write(&mmap_slice(range, *offset, *len)?)
                        .map_err(|e| DmaError::Io(format!("prefault of guest memory: {e}")))?,
                    Chunk::Local {
                        window,
                        offset,
                        len,
                        ..
                    } => window.memory.prefault(*offset, *len as u64)?,
                    Chunk::File { .. } | Chunk::Message { .. } => {}
                }
            }
            at += piece;
        }
        Ok(())
    }

    /// Zero-copy access: calls `f` with the memory behind `[gpa, gpa+len)`
    /// if it lies in one fd-backed client range or one local window whose
    /// memory may be touched directly for `access` (its
    /// [`LocalMemory::direct_slice`] says). Anything else (message-only,
    /// split across ranges, unmapped) is an error, and the caller falls
    /// back to `read`/`write`.
    ///
    /// The range stays in use while `f` runs: a DMA_UNMAP of it (or a reset
    /// or disconnect) waits for `f` to return before it is answered, so
    /// `f` must be short and must not wait for anything the connection's
    /// reader thread does (message DMA, a DMA_MAP). Ranges without
    /// `F_SEAL_SHRINK` are not mmapped and give [`DmaError::NotDirect`].
    /// With `Access::Read` on a read-only range the memory is mapped
    /// without PROT_WRITE: `f` must not write to it.
    pub fn with_slice<R>(
        &self,
        gpa: u64,
        len: usize,
        access: Access,
        f: impl FnOnce(VolatileSlice<'_>) -> R,
    ) -> Result<R, DmaError> {
        let not_direct = DmaError::NotDirect {
            gpa,
            len: len as u64,
        };
        let chunks = self.resolve(gpa, len, access)?;
        if chunks.len() != 1 {
            return Err(not_direct);
        }
        let slices = self.direct_slices(&chunks, access)?.ok_or(not_direct)?;
        let [slice] = slices.as_slice() else {
            return Err(DmaError::Invalid("internal: one chunk, several slices"));
        };
        self.count_direct(&chunks, access);
        debug!(gpa, len, "zero-copy access");
        Ok(f(*slice))
    }

    /// Zero-copy access to several ranges at once (a command's
    /// scatter-gather list): calls `f` with the memory behind each
    /// `(gpa, len)` of `segments`, in order, as one or more slices each,
    /// when every byte of them is fd-backed guest memory or a local window
    /// that may be touched directly for `access`. Otherwise `f` is not
    /// called and the answer is `Ok(None)`: the caller moves the data with
    /// `read`/`write`, which reach every kind of memory. Unmapped bytes
    /// and missing permissions are errors, as for `read`/`write`.
    ///
    /// Every range stays in use while `f` runs, with the contract of
    /// [`with_slice`](Self::with_slice): `f` must be short (a `preadv` into
    /// the slices is the intended use). The bytes are counted on their
    /// paths once the memory is handed out.
    pub fn with_slices<R>(
        &self,
        segments: &[(u64, usize)],
        access: Access,
        f: impl FnOnce(&[VolatileSlice<'_>]) -> R,
    ) -> Result<Option<R>, DmaError> {
        let mut chunks = Vec::with_capacity(segments.len());
        for &(gpa, len) in segments {
            chunks.extend(self.resolve(gpa, len, access)?);
        }
        let Some(slices) = self.direct_slices(&chunks, access)? else {
            return Ok(None);
        };
        self.count_direct(&chunks, access);
        if tracing::enabled!(tracing::Level::DEBUG) {
            // Chunks follow the segments in order, each segment cut into
            // consecutive pieces: their addresses follow from the lengths.
            let mut pieces = chunks.iter();
            for &(gpa, len) in segments {
                let mut at = gpa;
                let end = gpa.wrapping_add(len as u64);
                while at != end {
                    let Some(chunk) = pieces.next() else { break };
                    log_direct(chunk, at, access);
                    at = at.wrapping_add(chunk.len() as u64);
                }
            }
        }
        Ok(Some(f(&slices)))
    }

    /// The memory behind resolved chunks, if all of it may be touched
    /// directly for `access`.
    fn direct_slices<'c>(
        &self,
        chunks: &'c [Chunk],
        access: Access,
    ) -> Result<Option<Vec<VolatileSlice<'c>>>, DmaError> {
        let mut slices = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            let slice = match chunk {
                Chunk::Mmap {
                    range, offset, len, ..
                } => mmap_slice(range, *offset, *len)?,
                Chunk::Local {
                    window,
                    offset,
                    len,
                    ..
                } => match window.memory.direct_slice(*offset, *len, access) {
                    Some(slice) if slice.len() == *len => slice,
                    _ => return Ok(None),
                },
                Chunk::File { .. } | Chunk::Message { .. } => return Ok(None),
            };
            slices.push(slice);
        }
        Ok(Some(slices))
    }

    /// Counts memory handed out directly on its paths (a caller that got
    /// no slices falls back to read/write, which count).
    fn count_direct(&self, chunks: &[Chunk], access: Access) {
        for chunk in chunks {
            let counters = match chunk {
                Chunk::Local { window, .. } => {
                    window.memory.note_direct(chunk.len(), access);
                    self.window_counters(window)
                }
                _ => &self.inner.mmap,
            };
            if access.reads() {
                counters.record_read(chunk.len());
            }
            if access.writes() {
                counters.record_write(chunk.len());
            }
        }
    }

    fn window_counters(&self, window: &LocalWindow) -> &super::TrafficCounters {
        if window.peer {
            &self.inner.peer
        } else {
            &self.inner.local
        }
    }

    fn read_chunk(&self, chunk: &Chunk, gpa: u64, part: &mut [u8]) -> Result<(), DmaError> {
        match chunk {
            Chunk::Mmap {
                range, offset, len, ..
            } => {
                mmap_slice(range, *offset, *len)?.copy_to(part);
                self.inner.mmap.record_read(part.len());
                debug!(gpa, len, "dma read from guest memory");
            }
            Chunk::File { range, offset, .. } => {
                file_backing(range)?.read(gpa, *offset, part)?;
                self.inner.file.record_read(part.len());
                debug!(gpa, len = part.len(), "dma read from guest memory (pread)");
            }
            Chunk::Message { gpa, range_use, .. } => {
                let messages = self.message_path().ok_or(DmaError::NotConnected)?;
                debug!(gpa, len = part.len(), "dma read via DMA_READ messages");
                messages.dma_read(*gpa, part, range_use)?;
                self.inner.message.record_read(part.len());
            }
            Chunk::Local { window, offset, .. } => {
                window.memory.read_at(*offset, part)?;
                self.window_counters(window).record_read(part.len());
                if window.peer {
                    debug!(
                        gpa,
                        len = part.len(),
                        window = window.id.0,
                        "dma read from peer window"
                    );
                } else {
                    debug!(
                        gpa,
                        len = part.len(),
                        window = window.id.0,
                        "dma read from local window"
                    );
                }
            }
        }
        Ok(())
    }

    fn write_chunk(&self, chunk: &Chunk, gpa: u64, part: &[u8]) -> Result<(), DmaError> {
        match chunk {
            Chunk::Mmap {
                range, offset, len, ..
            } => {
                mmap_slice(range, *offset, *len)?.copy_from(part);
                self.inner.mmap.record_write(part.len());
                debug!(gpa, len, "dma write to guest memory");
            }
            Chunk::File { range, offset, .. } => {
                file_backing(range)?.write(gpa, *offset, part)?;
                self.inner.file.record_write(part.len());
                debug!(gpa, len = part.len(), "dma write to guest memory (pwrite)");
            }
            Chunk::Message { gpa, range_use, .. } => {
                let messages = self.message_path().ok_or(DmaError::NotConnected)?;
                debug!(gpa, len = part.len(), "dma write via DMA_WRITE messages");
                messages.dma_write(*gpa, part, range_use)?;
                self.inner.message.record_write(part.len());
            }
            Chunk::Local { window, offset, .. } => {
                window.memory.write_at(*offset, part)?;
                self.window_counters(window).record_write(part.len());
                if window.peer {
                    debug!(
                        gpa,
                        len = part.len(),
                        window = window.id.0,
                        "dma write to peer window"
                    );
                } else {
                    debug!(
                        gpa,
                        len = part.len(),
                        window = window.id.0,
                        "dma write to local window"
                    );
                }
            }
        }
        Ok(())
    }
}

/// The debug line of a zero-copy piece: the same words as a copied one
/// (tests and users sum bytes by them), marked `zero_copy`.
fn log_direct(chunk: &Chunk, gpa: u64, access: Access) {
    let len = chunk.len();
    match (chunk, access.writes()) {
        (Chunk::Local { window, .. }, true) if window.peer => {
            debug!(
                gpa,
                len,
                window = window.id.0,
                zero_copy = true,
                "dma write to peer window"
            )
        }
        (Chunk::Local { window, .. }, false) if window.peer => {
            debug!(
                gpa,
                len,
                window = window.id.0,
                zero_copy = true,
                "dma read from peer window"
            )
        }
        (Chunk::Local { window, .. }, true) => {
            debug!(
                gpa,
                len,
                window = window.id.0,
                zero_copy = true,
                "dma write to local window"
            )
        }
        (Chunk::Local { window, .. }, false) => {
            debug!(
                gpa,
                len,
                window = window.id.0,
                zero_copy = true,
                "dma read from local window"
            )
        }
        (_, true) => debug!(gpa, len, zero_copy = true, "dma write to guest memory"),
        (_, false) => debug!(gpa, len, zero_copy = true, "dma read from guest memory"),
    }
}

/// The part of a client range's mapping that a resolved chunk covers.
/// `resolve` only makes Mmap chunks for fd-backed ranges, inside them, so
/// the errors here mean an internal inconsistency, never guest input.
fn mmap_slice(
    range: &ClientRange,
    offset: usize,
    len: usize,
) -> Result<VolatileSlice<'_>, DmaError> {
    let Backing::Mmap(mapping) = &range.backing else {
        return Err(DmaError::Invalid("internal: no mapping"));
    };
    mapping
        .region
        .get_slice(offset, len)
        .map_err(|_| DmaError::Invalid("internal: mmap slice out of range"))
}

/// The file behind a pread/pwrite chunk; `resolve` only makes File chunks
/// for such ranges.
fn file_backing(range: &ClientRange) -> Result<&super::backing::FileBacking, DmaError> {
    match &range.backing {
        Backing::File(file) => Ok(file),
        _ => Err(DmaError::Invalid("internal: no file backing")),
    }
}
