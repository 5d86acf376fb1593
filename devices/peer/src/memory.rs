//! The memory that travels over a peer socket: a BAR's sealed memfd
//! (mapped; copied through the mapping only where its pages are known to
//! be in memory, else with pread/pwrite: a read through a mapping would
//! allocate pages in VRAM's holes, a write into a hole costs a page fault
//! more than a pwrite) and two small shared pages:
//!
//! - the owner's **placement page**: per BAR slot, the sequence number of
//!   the BAR's current placement. The owner writes it before it sends a
//!   PLACE, and fills it with [`REVOKED`] when it cuts a user off; a
//!   user's window serves an access only while the page still holds the
//!   placement the window was made for, so revocation takes effect at
//!   once, whether or not the user is listening. Per slot it also holds
//!   the **hole count**, which the owner raises right before and right
//!   after it punches holes into the BAR's memory (a GPU zero fill): a
//!   user forgets which pages it knew to be in memory when it sees the
//!   count change;
//! - the user's **counter page**: per slot, the bytes the user moved into
//!   and out of the owner's BAR, which the owner's stats show.
//!
//! Each page is written by exactly one process, the one that made it: it
//! maps it writable, then seals it with `F_SEAL_FUTURE_WRITE`, so the
//! other side can only map it read-only (mmap with PROT_WRITE, mprotect
//! and write(2) all fail) and gets [`ReadOnlyPage`], which has no way to
//! store. The reader treats every value as hostile: the owner sums
//! counters in 128 bits, and a counter that goes backwards cuts its
//! writer off (see `session`).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use p2plab_vfio_user::fdkind::{fd_kind, FdKind};
use p2plab_vfio_user::{populate_for_write, Access, DmaError, LocalMemory, VolatileSlice};
use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory};

/// Bytes of a shared page (placement or counter page).
pub const PAGE: usize = 4096;
/// Slots in a page (one per BAR a function can have).
pub const SLOTS: u64 = 6;
/// Words of a page.
const WORDS: usize = PAGE / 8;
/// A placement page word meaning "this user is cut off": no window of it
/// is current any more.
pub const REVOKED: u64 = u64::MAX;

/// Seals every shared fd must carry: its size can never change, so no
/// access can fault and no pwrite can grow it.
pub const REQUIRED_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
/// Seals a shared page also carries: nobody but the process that made
/// it can write it.
pub const PAGE_SEALS: i32 = REQUIRED_SEALS | libc::F_SEAL_FUTURE_WRITE;

fn os_error(call: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{call}: {e}"))
}

/// What a received fd must be.
#[derive(Debug, Clone, Copy)]
struct FdRule {
    /// At least this many bytes.
    min_size: u64,
    /// At most this many bytes (a page is exactly one).
    max_size: u64,
    /// Seals it must carry (all of them).
    seals: i32,
    /// Open for reading and writing (else for reading at least).
    read_write: bool,
}

/// Checks a received fd against `rule`: a memfd (the kernel's own name
/// for it, as the vfio-user transport checks DMA_MAP fds), carrying the
/// seals, of an acceptable size, open for the access we need. Returns
/// its size.
fn verify_fd(fd: &OwnedFd, rule: FdRule) -> Result<u64, String> {
    match fd_kind(fd.as_fd()) {
        Ok(FdKind::Memfd) => {}
        Ok(other) => return Err(format!("not a memfd ({other:?})")),
        Err(e) => return Err(format!("cannot tell what the fd is: {e}")),
    }
    // SAFETY: `stat` is plain data, for which all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into a valid stat struct; `fd` is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!("fstat: {}", io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("not a regular file".into());
    }
    // SAFETY: F_GET_SEALS takes no argument and only reads the fd's state.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & rule.seals != rule.seals {
        return Err(format!(
            "not sealed as required: seals {seals:#x} lack {:#x} (shrink 0x2, grow 0x4, future write 0x10)",
            rule.seals & !seals.max(0)
        ));
    }
    // SAFETY: F_GETFL takes no argument and only reads the fd's state.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    let mode = flags & libc::O_ACCMODE;
    if flags < 0 || (rule.read_write && mode != libc::O_RDWR) || mode == libc::O_WRONLY {
        return Err(if rule.read_write {
            "not open for reading and writing".into()
        } else {
            "not open for reading".into()
        });
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size < rule.min_size || size > rule.max_size {
        return Err(format!(
            "{size} bytes, expected {}",
            if rule.min_size == rule.max_size {
                format!("{}", rule.min_size)
            } else {
                format!("at least {}", rule.min_size)
            }
        ));
    }
    Ok(size)
}

/// Checks a received BAR memfd: a memfd sealed against shrinking and
/// growing, open read-write, at least `min_size` bytes long. Returns its
/// size.
pub fn verify_shared_fd(fd: &OwnedFd, min_size: u64) -> Result<u64, String> {
    verify_fd(
        fd,
        FdRule {
            min_size,
            max_size: u64::MAX,
            seals: REQUIRED_SEALS,
            read_write: true,
        },
    )
}

/// A new sealed memfd of `size` bytes (test BARs).
pub fn sealed_memfd(name: &std::ffi::CStr, size: u64) -> io::Result<OwnedFd> {
    let fd = memfd(name, size)?;
    add_seals(&fd, REQUIRED_SEALS | libc::F_SEAL_SEAL)?;
    Ok(fd)
}

pub(crate) fn memfd(name: &std::ffi::CStr, size: u64) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a valid NUL-terminated name; returns a new
    // fd or -1.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(os_error("memfd_create"));
    }
    // SAFETY: `raw` is a fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = libc::off_t::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: ftruncate on our own fd with a checked length.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(os_error("ftruncate"));
    }
    Ok(fd)
}

pub(crate) fn add_seals(fd: &OwnedFd, seals: i32) -> io::Result<()> {
    // SAFETY: F_ADD_SEALS on our own memfd made with MFD_ALLOW_SEALING.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os_error("F_ADD_SEALS"));
    }
    Ok(())
}

/// Maps a page shared, with `prot`.
fn map_page(fd: &OwnedFd, prot: i32) -> io::Result<*mut u8> {
    // SAFETY: a new shared mapping of PAGE bytes of a memfd sealed against
    // shrinking that is exactly that long (checked or made so by the
    // caller), so accesses never fault; nothing else is placed at the
    // returned address.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(os_error("mmap of a shared page"));
    }
    Ok(ptr.cast())
}

/// Word `index` of a page mapped at `ptr`.
///
/// # Safety
/// `ptr` must be a live mapping of [`PAGE`] bytes, page aligned, that
/// outlives the returned reference and is only accessed atomically.
unsafe fn word<'a>(ptr: *mut u8, index: usize) -> Option<&'a AtomicU64> {
    if index >= WORDS {
        return None;
    }
    // SAFETY: index * 8 + 8 <= PAGE, 8-byte aligned (the mapping is page
    // aligned); the caller guarantees the mapping's life and atomic-only
    // use.
    Some(unsafe { AtomicU64::from_ptr(ptr.add(index * 8).cast()) })
}

/// A page this process made and writes; a peer maps it read-only.
#[derive(Debug)]
pub struct WritablePage {
    ptr: *mut u8,
    fd: OwnedFd,
}

// SAFETY: the mapping is only accessed through atomics, from any thread;
// it stays mapped until drop.
unsafe impl Send for WritablePage {}
// SAFETY: as above: shared access is atomic only.
unsafe impl Sync for WritablePage {}

impl WritablePage {
    /// A fresh zeroed page, mapped writable here and then sealed so that
    /// no other mapping of it can ever be writable.
    pub fn create(name: &std::ffi::CStr) -> io::Result<Self> {
        let fd = memfd(name, PAGE as u64)?;
        add_seals(&fd, REQUIRED_SEALS)?;
        let ptr = map_page(&fd, libc::PROT_READ | libc::PROT_WRITE)?;
        let page = Self { ptr, fd };
        // After our writable mapping exists: F_SEAL_FUTURE_WRITE refuses
        // every later one (and write(2)), ours keeps working.
        add_seals(&page.fd, libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL)?;
        Ok(page)
    }

    /// The page's fd, to send to the peer.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn word(&self, index: usize) -> Option<&AtomicU64> {
        // SAFETY: `ptr` is our PAGE-byte mapping, alive as long as `self`
        // and accessed atomically only.
        unsafe { word(self.ptr, index) }
    }

    /// Word `index` (0 past the page).
    pub fn load(&self, index: usize) -> u64 {
        self.word(index).map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Sets word `index` (ignored past the page).
    pub fn store(&self, index: usize, value: u64) {
        if let Some(w) = self.word(index) {
            w.store(value, Ordering::Release);
        }
    }

    /// Adds to word `index`, wrapping (a count of our own).
    pub fn add(&self, index: usize, value: u64) {
        if let Some(w) = self.word(index) {
            w.fetch_add(value, Ordering::Relaxed);
        }
    }
}

impl Drop for WritablePage {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `create`; no
        // reference into it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), PAGE) };
    }
}

/// A page a peer made and writes, mapped read-only here. Every value in
/// it may be anything at any time.
#[derive(Debug)]
pub struct ReadOnlyPage {
    ptr: *mut u8,
    _fd: OwnedFd,
}

// SAFETY: the mapping is only read, through atomics, from any thread; it
// stays mapped until drop.
unsafe impl Send for ReadOnlyPage {}
// SAFETY: as above.
unsafe impl Sync for ReadOnlyPage {}

impl ReadOnlyPage {
    /// Maps a received page after checking it: a memfd of exactly one
    /// page, sealed against resizing and against writes by anyone but
    /// its maker.
    pub fn from_received(fd: OwnedFd) -> Result<Self, String> {
        verify_fd(
            &fd,
            FdRule {
                min_size: PAGE as u64,
                max_size: PAGE as u64,
                seals: PAGE_SEALS,
                read_write: false,
            },
        )?;
        let ptr = map_page(&fd, libc::PROT_READ).map_err(|e| e.to_string())?;
        Ok(Self { ptr, _fd: fd })
    }

    /// Word `index` (0 past the page): whatever the peer put there.
    pub fn load(&self, index: usize) -> u64 {
        // SAFETY: `ptr` is our PAGE-byte read-only mapping, alive as long
        // as `self`; the reference is only loaded from (an aligned 8-byte
        // load, which a read-only mapping allows).
        unsafe { word(self.ptr, index) }.map_or(0, |w| w.load(Ordering::Acquire))
    }
}

impl Drop for ReadOnlyPage {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `from_received`; no
        // reference into it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), PAGE) };
    }
}

/// Word of slot `slot`'s placement in a placement page.
pub fn placement_word(slot: u64) -> usize {
    usize::try_from(slot).unwrap_or(WORDS)
}

/// First word of the hole counts in a placement page (one per slot).
const HOLES_BASE: usize = 64;

/// Word of slot `slot`'s hole count in a placement page: the owner raises
/// it right before and right after it punches holes into the slot's BAR
/// memory.
pub fn holes_word(slot: u64) -> usize {
    usize::try_from(slot)
        .ok()
        .and_then(|s| s.checked_add(HOLES_BASE))
        .unwrap_or(WORDS)
}

/// Bytes of a page of peer memory (the unit of residency).
const MEM_PAGE: u64 = 4096;
/// Span looked up by one mincore on the first residency miss in it since
/// the last hole count change: the 2 MiB-aligned chunks around the
/// access, so a stream of packets through one buffer costs one lookup
/// per 2 MiB instead of one syscall per packet.
const LOOKUP_SPAN: u64 = 2 << 20;
/// After a chunk's first lookup, a miss in it (a hole, or a page written
/// since) looks up only the access's own pages, and only every this many
/// misses; the others go straight to pread. A stale "not known" costs
/// only a pread (which reads whatever is there now), so holes cost about
/// one pread per packet as before the cache, and a page written later is
/// learnt within this many misses of its chunk.
pub(crate) const RELOOK_EVERY: u8 = 16;

/// Which pages of a peer's memory this user saw in memory, and under
/// which hole count of the owner's. A set bit only ever means "was
/// allocated when looked up, and the owner punched no hole since":
/// nothing else removes a page of a memfd sealed against shrinking
/// (swap-out keeps the data; reading a swapped page swaps it in and
/// allocates nothing new).
#[derive(Debug)]
struct Residency {
    /// The owner's hole count the bits were learnt under.
    holes: u64,
    /// One bit per [`MEM_PAGE`]. Allocated zeroed (calloc: for a large
    /// BAR the kernel hands out zero pages lazily, so a 64 GiB VRAM's
    /// 2 MiB of bits cost only what is touched).
    bits: Vec<u64>,
    /// Per [`LOOKUP_SPAN`] chunk: 0 until its first lookup, then the
    /// misses in it since the last lookup, from 1.
    misses: Vec<u8>,
}

impl Residency {
    fn new(size: u64) -> Self {
        Self {
            holes: 0,
            bits: vec![0; Self::words(size)],
            misses: vec![0; usize::try_from(size.div_ceil(LOOKUP_SPAN)).unwrap_or(0)],
        }
    }

    fn words(size: u64) -> usize {
        usize::try_from(size.div_ceil(MEM_PAGE).div_ceil(64)).unwrap_or(0)
    }

    /// Whether every page of `first..=last` is known to be in memory.
    fn all_known(&self, first: u64, last: u64) -> bool {
        (first..=last).all(|p| {
            let (word, bit) = ((p / 64) as usize, p % 64);
            self.bits.get(word).is_some_and(|w| w >> bit & 1 == 1)
        })
    }

    fn mark(&mut self, page: u64) {
        if let Some(w) = self.bits.get_mut((page / 64) as usize) {
            *w |= 1 << (page % 64);
        }
    }
}

/// Words of slot `slot`'s (written, read) counters in a counter page.
pub fn counter_words(slot: u64) -> (usize, usize) {
    let base = usize::try_from(slot).unwrap_or(WORDS).saturating_mul(2);
    (base, base.saturating_add(1))
}

/// A peer's BAR memory as a DMA window on its sealed memfd, counted in
/// our counter page and valid while the owner's placement page says so.
///
/// Copies go through a shared mapping of the memfd where every page they
/// touch is known to be in memory: one memcpy, as for mmapped guest RAM,
/// no syscall. Elsewhere reads are preads, since a read through the
/// mapping would allocate a page for every hole it touches, where pread
/// returns zeros and allocates nothing; and writes are pwrites, which
/// allocate a hole's page without the page fault (and page clearing) of
/// a store through the mapping. Which pages are in memory is learnt with
/// one mincore per 2 MiB around a miss (and from the pwrites) and kept
/// until the owner's hole count changes, so moving a buffer that stays
/// put costs no syscall per packet. Zero-copy slices
/// ([`direct_slice`](LocalMemory::direct_slice)) are handed out for
/// writes always, for reads where the pages are known to be in memory.
pub struct PeerMemory {
    file: Arc<File>,
    /// The memfd's first `size` bytes. The memfd is sealed against
    /// shrinking (checked on receipt), so no access inside can fault.
    mapping: MmapRegion,
    size: u64,
    counters: Arc<WritablePage>,
    placements: Arc<ReadOnlyPage>,
    slot: u64,
    /// The placement (PLACE sequence number) our window was last set up
    /// for; 0 before the first.
    applied: AtomicU64,
    /// Pages known to be in memory (read through the mapping).
    residency: Mutex<Residency>,
    /// Copies served through the mapping, and by pread/pwrite.
    read_mapped: AtomicU64,
    read_pread: AtomicU64,
    write_mapped: AtomicU64,
    write_pwrite: AtomicU64,
}

/// How [`PeerMemory`]'s copies ([`LocalMemory::read_at`],
/// [`LocalMemory::write_at`]) were served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyPaths {
    /// Reads copied out of the mapping (every page known to be in memory).
    pub read_mapped: u64,
    /// Reads by pread (a hole, or a page not known to be in memory).
    pub read_pread: u64,
    /// Writes copied into the mapping (every page known to be in memory).
    pub write_mapped: u64,
    /// Writes by pwrite (a hole, or a page not known to be in memory).
    pub write_pwrite: u64,
}

impl PeerMemory {
    /// Wraps a verified memfd of `size` bytes (sealed against shrinking,
    /// at least `size` long), counting into slot `slot` of `counters` and
    /// current while slot `slot` of `placements` holds the placement set
    /// with [`set_applied`](Self::set_applied).
    pub fn new(
        fd: OwnedFd,
        size: u64,
        counters: Arc<WritablePage>,
        placements: Arc<ReadOnlyPage>,
        slot: u64,
    ) -> io::Result<Self> {
        if slot >= SLOTS {
            return Err(io::Error::other(format!("slot {slot} (at most {SLOTS})")));
        }
        let file = Arc::new(File::from(fd));
        let len = usize::try_from(size)
            .map_err(|_| io::Error::other(format!("{size} bytes cannot be mapped here")))?;
        let mapping = MmapRegion::build(
            Some(FileOffset::from_arc(Arc::clone(&file), 0)),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
        )
        .map_err(|e| io::Error::other(format!("mmap of peer memory ({size} bytes): {e}")))?;
        Ok(Self {
            file,
            mapping,
            size,
            counters,
            placements,
            slot,
            applied: AtomicU64::new(0),
            residency: Mutex::new(Residency::new(size)),
            read_mapped: AtomicU64::new(0),
            read_pread: AtomicU64::new(0),
            write_mapped: AtomicU64::new(0),
            write_pwrite: AtomicU64::new(0),
        })
    }

    /// How the copies were served so far.
    pub fn copy_paths(&self) -> CopyPaths {
        CopyPaths {
            read_mapped: self.read_mapped.load(Ordering::Relaxed),
            read_pread: self.read_pread.load(Ordering::Relaxed),
            write_mapped: self.write_mapped.load(Ordering::Relaxed),
            write_pwrite: self.write_pwrite.load(Ordering::Relaxed),
        }
    }

    /// Our window now sits where PLACE `seq` put it.
    pub fn set_applied(&self, seq: u64) {
        self.applied.store(seq, Ordering::Release);
    }

    fn count(&self, written: u64, read: u64) {
        let (w, r) = counter_words(self.slot);
        self.counters.add(w, written);
        self.counters.add(r, read);
    }

    /// Whether every page of `[offset, offset+len)` of the memfd is in
    /// memory, so that touching it through the mapping allocates
    /// nothing: known from an earlier lookup under the owner's current
    /// hole count, or looked up now (mincore on our mapping finds the
    /// memfd's pages without faulting any in) over the 2 MiB-aligned
    /// span around the range, remembering every page found. A hole, or a
    /// page swapped out, says no.
    ///
    /// The owner raises the hole count right before it punches and right
    /// after: what was learnt before the punch is forgotten by every
    /// access that starts after the first raise, and what was learnt
    /// while it ran (a lookup may see a page the punch frees a moment
    /// later) by every access after the second. So a hole punched while
    /// an access runs costs at most the pages of the accesses in flight
    /// (allocated again, reading zeros: never wrong data), as for any
    /// reader of a mapping.
    fn is_resident(&self, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len).filter(|&end| end <= self.size) else {
            return false;
        };
        if len == 0 {
            return true;
        }
        let (first, last) = (offset / MEM_PAGE, (end - 1) / MEM_PAGE);
        let holes = self.placements.load(holes_word(self.slot));
        let mut known = self
            .residency
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if known.holes != holes {
            *known = Residency::new(self.size);
            known.holes = holes;
        }
        if known.all_known(first, last) {
            return true;
        }
        let page_end = self.size.div_ceil(MEM_PAGE) * MEM_PAGE;
        let chunk = (offset / LOOKUP_SPAN) as usize;
        let (span_start, span_end) = match known.misses.get(chunk).copied() {
            // The first miss here: the whole chunks around the access.
            Some(0) => {
                let last_chunk = ((end - 1) / LOOKUP_SPAN) as usize;
                for c in chunk..=last_chunk {
                    if let Some(m) = known.misses.get_mut(c) {
                        *m = 1;
                    }
                }
                let span_end = end.div_ceil(LOOKUP_SPAN).saturating_mul(LOOKUP_SPAN);
                (offset - offset % LOOKUP_SPAN, span_end.min(page_end))
            }
            // Looked up before: holes, or pages written since.
            Some(m) if m < RELOOK_EVERY => {
                known.misses[chunk] = m + 1;
                return false;
            }
            _ => {
                if let Some(m) = known.misses.get_mut(chunk) {
                    *m = 1;
                }
                (
                    first * MEM_PAGE,
                    (last + 1).saturating_mul(MEM_PAGE).min(page_end),
                )
            }
        };
        let Some(resident) = self.lookup(span_start, span_end) else {
            return false;
        };
        let base = span_start / MEM_PAGE;
        for (i, r) in resident.iter().enumerate() {
            if r & 1 == 1 {
                known.mark(base + i as u64);
            }
        }
        known.all_known(first, last)
    }

    /// `[offset, offset+len)` was just written by pwrite or faulted in by
    /// a prefault, either of which allocated every page it touched: known
    /// to be in memory from now on, if the owner's hole count is still
    /// `holes`, the one read before (else a punch may have freed them
    /// since).
    fn learn_written(&self, holes: u64, offset: u64, len: u64) {
        let Some(end) = offset
            .checked_add(len)
            .filter(|&e| e <= self.size && len > 0)
        else {
            return;
        };
        let mut known = self
            .residency
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if known.holes != holes || self.placements.load(holes_word(self.slot)) != holes {
            return;
        }
        for page in offset / MEM_PAGE..=(end - 1) / MEM_PAGE {
            known.mark(page);
        }
    }

    /// mincore over the page-aligned `[start, end)` of our mapping: one
    /// byte per page, bit 0 set for a page in memory.
    fn lookup(&self, start: u64, end: u64) -> Option<Vec<u8>> {
        let pages = usize::try_from((end - start) / MEM_PAGE).ok()?;
        let span = pages.checked_mul(MEM_PAGE as usize)?;
        let mut resident = vec![0u8; pages];
        let base = self
            .mapping
            .as_ptr()
            .wrapping_add(usize::try_from(start).ok()?);
        // SAFETY: `[base, base+span)` lies inside our mapping of the memfd
        // (`start` page-aligned, `end` at most `size` rounded up to a
        // page, which the mapping covers); mincore only writes `pages`
        // bytes into `resident`.
        let rc = unsafe { libc::mincore(base.cast(), span, resident.as_mut_ptr()) };
        (rc == 0).then_some(resident)
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(DmaError::OutOfBounds {
                offset,
                len: len as u64,
                size: self.size,
            }),
        }
    }
}

impl LocalMemory for PeerMemory {
    fn size(&self) -> u64 {
        self.size
    }

    /// A copy out of the mapping where every page of the range is known
    /// to be in memory (see [`is_resident`](Self::is_resident)), else a
    /// pread, which reads holes as zeros without allocating them.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.check(offset, buf.len())?;
        if self.is_resident(offset, buf.len() as u64) {
            let start = usize::try_from(offset).map_err(|_| DmaError::OutOfBounds {
                offset,
                len: buf.len() as u64,
                size: self.size,
            })?;
            self.mapping
                .as_volatile_slice()
                .subslice(start, buf.len())
                .map_err(|e| DmaError::Io(format!("peer memory mapping: {e}")))?
                .copy_to(buf);
            self.read_mapped.fetch_add(1, Ordering::Relaxed);
        } else {
            self.file
                .read_exact_at(buf, offset)
                .map_err(|e| DmaError::Io(format!("pread of peer memory: {e}")))?;
            self.read_pread.fetch_add(1, Ordering::Relaxed);
        }
        self.count(0, buf.len() as u64);
        Ok(())
    }

    /// Writes always; reads only of a range known to be in memory, since
    /// a read through the mapping allocates a page for every hole it
    /// touches (pread, the copying path, returns zeros instead). A hole
    /// punched while the read runs costs the pages read, never wrong
    /// data.
    fn direct_slice(&self, offset: u64, len: usize, access: Access) -> Option<VolatileSlice<'_>> {
        self.check(offset, len).ok()?;
        if access.reads() && !self.is_resident(offset, len as u64) {
            return None;
        }
        let start = usize::try_from(offset).ok()?;
        self.mapping.as_volatile_slice().subslice(start, len).ok()
    }

    fn note_direct(&self, len: usize, access: Access) {
        let len = len as u64;
        match access {
            Access::Write => self.count(len, 0),
            Access::Read => self.count(0, len),
            Access::ReadWrite => self.count(len, len),
        }
    }

    /// A copy into the mapping where every page of the range is known to
    /// be in memory; elsewhere a pwrite, which allocates a hole's page
    /// without the page fault (and the clearing of the page) a store
    /// through the mapping costs: a buffer a zero fill just punched (the
    /// receive buffer of a GPU->GPU transfer) is written about 1.6 times
    /// faster so (see docs/reference/servers.md). The pages a pwrite
    /// allocated are then known to be in memory, unless the owner
    /// announced a punch meanwhile.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DmaError> {
        self.check(offset, data.len())?;
        let len = data.len() as u64;
        // Loaded before the pwrite: a punch that ends after it is
        // announced after it, and the pages are then not learnt.
        let holes = self.placements.load(holes_word(self.slot));
        if self.is_resident(offset, len) {
            let start = usize::try_from(offset).map_err(|_| DmaError::OutOfBounds {
                offset,
                len,
                size: self.size,
            })?;
            self.mapping
                .as_volatile_slice()
                .subslice(start, data.len())
                .map_err(|e| DmaError::Io(format!("peer memory mapping: {e}")))?
                .copy_from(data);
            self.write_mapped.fetch_add(1, Ordering::Relaxed);
        } else {
            self.file
                .write_all_at(data, offset)
                .map_err(|e| DmaError::Io(format!("pwrite of peer memory: {e}")))?;
            self.write_pwrite.fetch_add(1, Ordering::Relaxed);
            self.learn_written(holes, offset, len);
        }
        self.count(len, 0);
        Ok(())
    }

    /// Faults the pages of the range in for writing through our mapping
    /// (`MADV_POPULATE_WRITE`: holes get zero-filled pages, every page is
    /// mapped writable here, no byte changes), as an EFA does when a
    /// dma-buf MR with write access is registered (the importer pins the
    /// exporter's memory): the packets written into it later are plain
    /// copies, with no page fault, no page allocation and no pwrite. The
    /// pages are then known to be in memory, unless the owner announced a
    /// punch meanwhile.
    fn prefault(&self, offset: u64, len: u64) -> Result<(), DmaError> {
        let size = usize::try_from(len).map_err(|_| DmaError::OutOfBounds {
            offset,
            len,
            size: self.size,
        })?;
        self.check(offset, size)?;
        let start = usize::try_from(offset).map_err(|_| DmaError::OutOfBounds {
            offset,
            len,
            size: self.size,
        })?;
        // Loaded before the pages are faulted in: a punch that ends after
        // is announced after, and the pages are then not learnt.
        let holes = self.placements.load(holes_word(self.slot));
        let slice = self
            .mapping
            .as_volatile_slice()
            .subslice(start, size)
            .map_err(|e| DmaError::Io(format!("peer memory mapping: {e}")))?;
        populate_for_write(&slice)
            .map_err(|e| DmaError::Io(format!("prefault of peer memory: {e}")))?;
        self.learn_written(holes, offset, len);
        Ok(())
    }

    /// Current while the owner's page still holds the placement our
    /// window was set up for (not before the first, never once revoked).
    fn is_current(&self) -> bool {
        let applied = self.applied.load(Ordering::Acquire);
        applied != 0
            && applied != REVOKED
            && self.placements.load(placement_word(self.slot)) == applied
    }
}
