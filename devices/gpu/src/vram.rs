//! VRAM: a sparse memfd that QEMU maps as BAR2.
//!
//! The server itself never maps VRAM. It reaches it with pread/pwrite on
//! the memfd, which shares the page cache with QEMU's mapping, so:
//! - untouched pages stay holes (reading a hole returns zeros without
//!   allocating, unlike a read fault through a shared mapping);
//! - the guest may change VRAM at any time through its mapping without
//!   that being a data race on Rust references in this process;
//! - a zero fill punches holes and gives memory back.
//!
//! [`Vram::allocated_bytes`] reports the host memory VRAM really uses.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use p2plab_kit::HoleHook;

/// BAR2's memory: a sealed sparse memfd of the BAR's size.
#[derive(Debug)]
pub struct Vram {
    fd: OwnedFd,
    size: u64,
    /// Told right before and right after each punch (the peer servers
    /// reading VRAM through their mappings must forget which pages they
    /// knew to be there).
    hole_hook: OnceLock<HoleHook>,
}

/// A libc return value, or the errno it stands for.
fn syscall_result(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A byte offset as a file offset (`EOVERFLOW` past `off_t`).
fn file_offset(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
}

impl Vram {
    /// Creates a `size`-byte VRAM. Only the file size is set; no memory is
    /// allocated until pages are written.
    pub fn new(size: u64) -> io::Result<Self> {
        let name: &CStr = c"p2plab-gpu-vram";
        // SAFETY: memfd_create takes a valid NUL-terminated name and flags;
        // it returns a new fd or -1.
        let raw = syscall_result(unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        })?;
        // SAFETY: `raw` is a fresh fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on a valid fd with a checked length.
        syscall_result(unsafe { libc::ftruncate(fd.as_raw_fd(), file_offset(size)?) })?;
        // Nobody (QEMU included) may change the size under a live mapping:
        // a shrink would turn guest accesses into SIGBUS in QEMU.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl F_ADD_SEALS on a valid memfd created with ALLOW_SEALING.
        syscall_result(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
        Ok(Self {
            fd,
            size,
            hole_hook: OnceLock::new(),
        })
    }

    /// Calls `hook` right before and right after every punch of
    /// [`zero`](Self::zero) from now on. Set once (later calls are
    /// ignored): the server wires it to its peer registry at start.
    pub fn on_holes(&self, hook: HoleHook) {
        let _ = self.hole_hook.set(hook);
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The fd QEMU maps (sent as the BAR2 region fd, offset 0).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Whether `[offset, offset + len)` lies inside VRAM (no overflow).
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        if self.contains(offset, len as u64) {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::ERANGE))
        }
    }

    /// Reads `buf.len()` bytes at `offset`. Holes read as zeros.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let mut done = 0usize;
        while let Some(rest) = buf.get_mut(done..).filter(|r| !r.is_empty()) {
            let at = file_offset(offset + done as u64)?;
            // SAFETY: pread into a live, writable buffer of `rest.len()` bytes.
            let n = unsafe {
                libc::pread(
                    self.fd.as_raw_fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    at,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if n == 0 {
                // Cannot happen inside the sealed size; never loop forever.
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            done += n as usize;
        }
        Ok(())
    }

    /// Writes `buf` at `offset`, allocating the pages it touches.
    pub fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let mut done = 0usize;
        while let Some(rest) = buf.get(done..).filter(|r| !r.is_empty()) {
            let at = file_offset(offset + done as u64)?;
            // SAFETY: pwrite from a live buffer of `rest.len()` bytes.
            let n =
                unsafe { libc::pwrite(self.fd.as_raw_fd(), rest.as_ptr().cast(), rest.len(), at) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            done += n as usize;
        }
        Ok(())
    }

    /// Zeroes `[offset, offset + len)` by punching a hole: whole pages are
    /// freed, partial pages at the edges are zeroed in place.
    pub fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.contains(offset, len) {
            return Err(io::Error::from_raw_os_error(libc::ERANGE));
        }
        if len == 0 {
            return Ok(());
        }
        if let Some(hook) = self.hole_hook.get() {
            hook.changing();
        }
        // SAFETY: fallocate on a valid fd with a range checked against the size.
        let punched = syscall_result(unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                file_offset(offset)?,
                file_offset(len)?,
            )
        });
        // Also after a failure: part of the range may be punched.
        if let Some(hook) = self.hole_hook.get() {
            hook.changing();
        }
        punched?;
        Ok(())
    }

    /// Host memory the memfd really holds (allocated blocks), in bytes.
    pub fn allocated_bytes(&self) -> io::Result<u64> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat fills the stat buffer for a valid fd.
        syscall_result(unsafe { libc::fstat(self.fd.as_raw_fd(), st.as_mut_ptr()) })?;
        // SAFETY: fstat succeeded, so the buffer is initialised.
        let st = unsafe { st.assume_init() };
        Ok((st.st_blocks as u64).saturating_mul(512))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_status_kib(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    #[test]
    fn round_trip_and_holes_read_zero() {
        let vram = Vram::new(256 << 20).unwrap();
        let mut buf = [0xaau8; 64];
        vram.read(12345, &mut buf).unwrap();
        assert_eq!(buf, [0u8; 64]);
        vram.write(4090, b"hello across a page boundary").unwrap();
        let mut back = [0u8; 28];
        vram.read(4090, &mut back).unwrap();
        assert_eq!(&back, b"hello across a page boundary");
    }

    #[test]
    fn out_of_range_is_an_error() {
        let vram = Vram::new(256 << 20).unwrap();
        let size = vram.size();
        let mut buf = [0u8; 8];
        assert!(vram.read(size - 4, &mut buf).is_err());
        assert!(vram.write(size, &buf).is_err());
        assert!(vram.write(u64::MAX - 2, &buf).is_err());
        assert!(vram.zero(size - 4096, 8192).is_err());
        assert!(vram.read(size - 8, &mut buf).is_ok());
    }

    #[test]
    fn sparse_64g_uses_only_touched_pages() {
        let rss_before = proc_status_kib("VmRSS:");
        let vram = Vram::new(64 << 30).unwrap();
        assert_eq!(vram.allocated_bytes().unwrap(), 0);
        let page = [0x5au8; 4096];
        // Touch 8 pages spread over the whole 64 GiB.
        for i in 0..8u64 {
            vram.write(i * (8 << 30), &page).unwrap();
        }
        // Read a large hole: must not allocate.
        let mut big = vec![0u8; 4 << 20];
        vram.read(32 << 20, &mut big).unwrap();
        assert!(big.iter().all(|&b| b == 0));
        let allocated = vram.allocated_bytes().unwrap();
        assert!(
            (8 * 4096..=64 * 4096).contains(&allocated),
            "allocated {allocated} bytes after touching 8 pages"
        );
        let rss_after = proc_status_kib("VmRSS:");
        assert!(
            rss_after < rss_before + 64 * 1024,
            "RSS grew from {rss_before} kB to {rss_after} kB"
        );
    }

    #[test]
    fn zero_punches_holes() {
        let vram = Vram::new(256 << 20).unwrap();
        let data = vec![0x11u8; 1 << 20];
        vram.write(1 << 20, &data).unwrap();
        assert!(vram.allocated_bytes().unwrap() >= 1 << 20);
        // Zero the middle, leaving partial pages at both edges.
        vram.zero((1 << 20) + 100, (1 << 20) - 200).unwrap();
        assert!(vram.allocated_bytes().unwrap() <= 3 * 4096);
        let mut edge = [0u8; 200];
        vram.read(1 << 20, &mut edge).unwrap();
        assert!(edge[..100].iter().all(|&b| b == 0x11));
        assert!(edge[100..].iter().all(|&b| b == 0));
        vram.read((2 << 20) - 100, &mut edge[..100]).unwrap();
        assert!(edge[..100].iter().all(|&b| b == 0x11));
    }

    /// Catches a zero fill that does not tell the peer servers right
    /// before and right after it punches: they read VRAM through their
    /// mappings where they know its pages are there, and would allocate
    /// the punched pages again.
    #[test]
    fn the_hole_hook_runs_right_before_and_right_after_each_punch() {
        use std::os::unix::fs::MetadataExt;
        use std::sync::{Arc, Mutex};
        let vram = Vram::new(16 << 20).unwrap();
        vram.write(0, &vec![0x22u8; 1 << 20]).unwrap();
        let view = std::fs::File::from(vram.fd().try_clone_to_owned().unwrap());
        // What VRAM held each time the hook ran.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        vram.on_holes(HoleHook::new(move || {
            log.lock()
                .unwrap()
                .push(view.metadata().unwrap().blocks() * 512);
        }));
        vram.zero(0, 1 << 20).unwrap();
        assert_eq!(*seen.lock().unwrap(), [1 << 20, 0]);
        assert_eq!(vram.allocated_bytes().unwrap(), 0);
        // An empty or refused fill punches nothing and says nothing.
        vram.zero(0, 0).unwrap();
        assert!(vram.zero(16 << 20, 4096).is_err());
        assert_eq!(seen.lock().unwrap().len(), 2);
    }
}
