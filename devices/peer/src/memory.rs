//! The memory that travels over a peer socket: a BAR's sealed memfd
//! (reached with pread/pwrite, never mapped: reads through a mapping
//! would allocate pages in VRAM's holes) and a small shared counter page
//! through which users count the bytes they move into and out of the
//! owner's memory, so the owner's stats show them.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use p2plab_vfio_user::{Access, DmaError, LocalMemory, VolatileSlice};
use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory};

/// Bytes of a counter page.
pub const COUNTER_PAGE: usize = 4096;
/// Counter slots in a page (one per BAR a function can have).
pub const SLOTS: u64 = 6;
const SLOT_BYTES: usize = 16;

/// Seals every shared fd must carry: its size can never change, so no
/// access can fault and no pwrite can grow it.
pub const REQUIRED_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

fn os_error(call: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{call}: {e}"))
}

/// Checks a received fd: a regular file (memfd), sealed against shrinking
/// and growing, at least `min_size` bytes long. Returns its size.
pub fn verify_shared_fd(fd: &OwnedFd, min_size: u64) -> Result<u64, String> {
    // SAFETY: `stat` is plain data, for which all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into a valid stat struct; `fd` is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!("fstat: {}", io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("not a memfd (not a regular file)".into());
    }
    // SAFETY: F_GET_SEALS takes no argument and only reads the fd's state.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & REQUIRED_SEALS != REQUIRED_SEALS {
        return Err(format!(
            "not sealed against resizing (seals {seals:#x}, need F_SEAL_SHRINK|F_SEAL_GROW)"
        ));
    }
    // SAFETY: F_GETFL takes no argument and only reads the fd's state.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDWR {
        return Err("not open for reading and writing".into());
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size < min_size {
        return Err(format!("{size} bytes, announced {min_size}"));
    }
    Ok(size)
}

/// A new sealed memfd of `size` bytes (test BARs and counter pages).
pub fn sealed_memfd(name: &std::ffi::CStr, size: u64) -> io::Result<OwnedFd> {
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
    let seals = REQUIRED_SEALS | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS on our own memfd made with MFD_ALLOW_SEALING.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os_error("F_ADD_SEALS"));
    }
    Ok(fd)
}

/// A counter page mapped shared: per slot, bytes peers wrote into and
/// read from one BAR of the owner.
#[derive(Debug)]
pub struct CounterPage {
    ptr: *mut u8,
    fd: OwnedFd,
}

// SAFETY: the mapping is only accessed through atomics, from any thread;
// it stays mapped until drop.
unsafe impl Send for CounterPage {}
// SAFETY: as above: shared access is atomic only.
unsafe impl Sync for CounterPage {}

impl CounterPage {
    /// A fresh zeroed page (owner side).
    pub fn create() -> io::Result<Self> {
        let fd = sealed_memfd(c"p2plab-peer-counters", COUNTER_PAGE as u64)?;
        Self::map(fd)
    }

    /// Maps a received page (user side) after checking it.
    pub fn from_received(fd: OwnedFd) -> Result<Self, String> {
        verify_shared_fd(&fd, COUNTER_PAGE as u64)?;
        Self::map(fd).map_err(|e| e.to_string())
    }

    fn map(fd: OwnedFd) -> io::Result<Self> {
        // SAFETY: a new shared mapping of COUNTER_PAGE bytes of a file
        // sealed against shrinking and at least that long, so accesses
        // never fault; nothing else is placed at the returned address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                COUNTER_PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mmap of the counter page"));
        }
        Ok(Self {
            ptr: ptr.cast(),
            fd,
        })
    }

    /// The page's fd, to send to a user.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn counter(&self, slot: u64, which: usize) -> Option<&AtomicU64> {
        if slot >= SLOTS {
            return None;
        }
        let offset = usize::try_from(slot).ok()? * SLOT_BYTES + which * 8;
        // SAFETY: offset + 8 <= SLOTS * 16 < COUNTER_PAGE, 8-byte aligned
        // (the mapping is page aligned), and the mapping lives as long as
        // `self`; all accesses to it are atomic.
        Some(unsafe { AtomicU64::from_ptr(self.ptr.add(offset).cast()) })
    }

    /// Counts `written` and `read` bytes for `slot`.
    pub fn add(&self, slot: u64, written: u64, read: u64) {
        if let Some(c) = self.counter(slot, 0) {
            c.fetch_add(written, Ordering::Relaxed);
        }
        if let Some(c) = self.counter(slot, 1) {
            c.fetch_add(read, Ordering::Relaxed);
        }
    }

    /// (written, read) bytes of `slot` so far.
    pub fn get(&self, slot: u64) -> (u64, u64) {
        let load = |which| {
            self.counter(slot, which)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        };
        (load(0), load(1))
    }
}

impl Drop for CounterPage {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference
        // into it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), COUNTER_PAGE) };
    }
}

/// A peer's BAR memory as a DMA window on its sealed memfd, counted in the
/// owner's counter page.
///
/// Writes are copies into a shared mapping of the memfd: one memcpy, as a
/// write into mmapped guest RAM is (pwrite adds a syscall and a page-cache
/// lookup per page). Reads stay pread:
/// a read through the mapping would allocate a page for every hole it
/// touches, where pread returns zeros and allocates nothing.
pub struct PeerMemory {
    file: Arc<File>,
    /// The memfd's first `size` bytes. The memfd is sealed against
    /// shrinking (checked on receipt), so no access inside can fault.
    mapping: MmapRegion,
    size: u64,
    counters: Arc<CounterPage>,
    slot: u64,
}

impl PeerMemory {
    /// Wraps a verified memfd of `size` bytes (sealed against shrinking,
    /// at least `size` long).
    pub fn new(fd: OwnedFd, size: u64, counters: Arc<CounterPage>, slot: u64) -> io::Result<Self> {
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
            slot,
        })
    }

    /// Whether every page of `[offset, offset+len)` of the memfd is in
    /// memory (mincore on our mapping looks the memfd's pages up without
    /// faulting any in): a hole, or a page swapped out, says no. Costs a
    /// byte per page of the range, whatever the memfd's size.
    fn has_no_hole(&self, offset: u64, len: u64) -> bool {
        const PAGE: u64 = 4096;
        let Some(end) = offset.checked_add(len).filter(|&end| end <= self.size) else {
            return false;
        };
        let first = offset - offset % PAGE;
        let pages = usize::try_from(end.div_ceil(PAGE) - first / PAGE).unwrap_or(usize::MAX);
        let (Ok(start), Some(span)) = (usize::try_from(first), pages.checked_mul(PAGE as usize))
        else {
            return false;
        };
        let mut resident = vec![0u8; pages];
        let base = self.mapping.as_ptr().wrapping_add(start);
        // SAFETY: `[base, base+span)` lies inside our mapping of the memfd
        // (page-aligned, `end <= size`, and the mapping is `size` bytes
        // rounded up to a page); mincore only writes `pages` bytes into
        // `resident`.
        let rc = unsafe { libc::mincore(base.cast(), span, resident.as_mut_ptr()) };
        rc == 0 && resident.iter().all(|r| r & 1 == 1)
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

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.check(offset, buf.len())?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| DmaError::Io(format!("pread of peer memory: {e}")))?;
        self.counters.add(self.slot, 0, buf.len() as u64);
        Ok(())
    }

    /// Writes always; reads only of a range without holes, since a read
    /// through the mapping allocates a page for every hole it touches
    /// (pread, the copying path, returns zeros instead). A hole punched
    /// while the read runs costs a page, never wrong data.
    fn direct_slice(&self, offset: u64, len: usize, access: Access) -> Option<VolatileSlice<'_>> {
        self.check(offset, len).ok()?;
        if access.reads() && !self.has_no_hole(offset, len as u64) {
            return None;
        }
        let start = usize::try_from(offset).ok()?;
        self.mapping.as_volatile_slice().subslice(start, len).ok()
    }

    fn note_direct(&self, len: usize, access: Access) {
        let len = len as u64;
        match access {
            Access::Write => self.counters.add(self.slot, len, 0),
            Access::Read => self.counters.add(self.slot, 0, len),
            Access::ReadWrite => self.counters.add(self.slot, len, len),
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DmaError> {
        self.check(offset, data.len())?;
        let start = usize::try_from(offset).map_err(|_| DmaError::OutOfBounds {
            offset,
            len: data.len() as u64,
            size: self.size,
        })?;
        self.mapping
            .as_volatile_slice()
            .subslice(start, data.len())
            .map_err(|e| DmaError::Io(format!("peer memory mapping: {e}")))?
            .copy_from(data);
        self.counters.add(self.slot, data.len() as u64, 0);
        Ok(())
    }
}
