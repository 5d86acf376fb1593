//! How the memory behind a client's DMA_MAP fd is reached, decided once
//! when the range is mapped.
//!
//! A client could hand us a file that ends before the range does, or
//! shrink it later: touching an mmap past a file's end raises SIGBUS and
//! kills the server. So:
//! - the fd must be a regular file (a memfd is one), the range must lie
//!   inside its current size, and its open mode must allow the access;
//! - a file sealed with `F_SEAL_SHRINK` (QEMU's `memory-backend-memfd`
//!   seals by default) can never shrink: it is mmapped (the fast path);
//! - any other regular file (`memory-backend-file`, an unsealed memfd) is
//!   reached with `pread`/`pwrite` on the fd, which return short instead
//!   of raising SIGBUS when the file has shrunk: slower, never fatal.
//! - FUSE files are refused: a FUSE server could block our reads forever.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use vm_memory::mmap::MmapRegion;
use vm_memory::FileOffset;

use super::{page_size, DmaError, Perms};

/// `statfs.f_type` of a FUSE file system.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// An fd-backed client range mapped MAP_SHARED. `delta` is where the range
/// starts inside `region` (the mapping starts page-aligned).
pub(super) struct GuestMapping {
    pub(super) region: MmapRegion,
    pub(super) delta: usize,
}

/// An fd-backed client range reached by pread/pwrite: its file may shrink.
pub(super) struct FileBacking {
    file: File,
    /// Where the range starts in the file.
    offset: u64,
}

/// How a client range's bytes are reached.
pub(super) enum Backing {
    /// Sealed against shrinking: mmapped here.
    Mmap(GuestMapping),
    /// Not sealed: pread/pwrite on the client's fd.
    File(FileBacking),
    /// No fd: DMA_READ/DMA_WRITE messages to the client.
    Message,
}

fn bad(what: String) -> DmaError {
    DmaError::BadBacking(what)
}

/// What the kernel says about `fd`: its size, seals, open mode, file system.
struct FdFacts {
    mode: u32,
    size: u64,
    /// `F_GET_SEALS`, or `None` for files that do not support seals.
    seals: Option<i32>,
    access: i32,
    fs_type: i64,
}

fn fd_facts(fd: &OwnedFd) -> Result<FdFacts, DmaError> {
    let raw = fd.as_raw_fd();
    let os_err = |call: &str| {
        let e = io::Error::last_os_error();
        DmaError::Mmap(
            format!("{call} on the client's fd: {e}"),
            e.raw_os_error().unwrap_or(libc::EINVAL),
        )
    };
    // SAFETY: `stat` is plain data, for which all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into a valid stat struct; `raw` is an open fd.
    if unsafe { libc::fstat(raw, &mut st) } != 0 {
        return Err(os_err("fstat"));
    }
    // SAFETY: F_GET_SEALS takes no argument and only reads the fd's state.
    let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
    // SAFETY: F_GETFL takes no argument and only reads the fd's state.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return Err(os_err("F_GETFL"));
    }
    // SAFETY: `statfs` is plain data, for which all-zero is valid.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes into a valid statfs struct.
    if unsafe { libc::fstatfs(raw, &mut sfs) } != 0 {
        return Err(os_err("fstatfs"));
    }
    Ok(FdFacts {
        mode: st.st_mode,
        size: u64::try_from(st.st_size).unwrap_or(0),
        seals: (seals >= 0).then_some(seals),
        access: flags & libc::O_ACCMODE,
        #[allow(clippy::unnecessary_cast)] // f_type's type differs between targets
        fs_type: sfs.f_type as i64,
    })
}

impl Backing {
    /// Checks a DMA_MAP fd and picks how to reach `[file_offset,
    /// file_offset + len)` of it. Refuses, naming the reason, anything
    /// that could fault later.
    pub(super) fn from_fd(
        len: u64,
        perms: Perms,
        fd: OwnedFd,
        file_offset: u64,
    ) -> Result<Backing, DmaError> {
        if len == 0 {
            return Err(DmaError::Invalid("empty mapping"));
        }
        let facts = fd_facts(&fd)?;
        if facts.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(bad(format!(
                "the fd is not a regular file or memfd (file type {:#o})",
                facts.mode & libc::S_IFMT
            )));
        }
        if facts.fs_type == FUSE_SUPER_MAGIC {
            return Err(bad("the fd is a FUSE file".into()));
        }
        match file_offset.checked_add(len) {
            Some(end) if end <= facts.size => {}
            _ => {
                return Err(bad(format!(
                    "file range {file_offset:#x}+{len:#x} runs past the file's end ({:#x} bytes)",
                    facts.size
                )))
            }
        }
        let readable = facts.access != libc::O_WRONLY;
        let writable = facts.access != libc::O_RDONLY;
        if (perms.read && !readable) || (perms.write && !writable) {
            return Err(bad(format!(
                "the fd's open mode does not allow {} access",
                if perms.write && !writable {
                    "write"
                } else {
                    "read"
                }
            )));
        }
        let sealed = facts
            .seals
            .is_some_and(|seals| seals & libc::F_SEAL_SHRINK != 0);
        if sealed {
            mmap_range(len, perms, fd, file_offset).map(Backing::Mmap)
        } else {
            tracing::debug!(
                file_offset,
                len,
                seals = ?facts.seals,
                "client memory may shrink (no F_SEAL_SHRINK): using pread/pwrite, not mmap"
            );
            Ok(Backing::File(FileBacking {
                file: File::from(fd),
                offset: file_offset,
            }))
        }
    }
}

fn mmap_range(
    len: u64,
    perms: Perms,
    fd: OwnedFd,
    file_offset: u64,
) -> Result<GuestMapping, DmaError> {
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

impl FileBacking {
    /// Reads `buf.len()` bytes at `offset` into the range. A file that
    /// shrank below the range gives [`DmaError::Truncated`].
    pub(super) fn read(&self, gpa: u64, offset: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let at = self.offset.checked_add(offset).ok_or(DmaError::Overflow {
            gpa,
            len: buf.len() as u64,
        })?;
        self.file
            .read_exact_at(buf, at)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => DmaError::Truncated {
                    gpa,
                    len: buf.len() as u64,
                },
                _ => DmaError::Io(format!("pread of client memory: {e}")),
            })
    }

    /// Writes `data` at `offset` into the range. Refuses to write past the
    /// file's current end: pwrite would grow a file the client shrank.
    pub(super) fn write(&self, gpa: u64, offset: u64, data: &[u8]) -> Result<(), DmaError> {
        let len = data.len() as u64;
        let at = self
            .offset
            .checked_add(offset)
            .ok_or(DmaError::Overflow { gpa, len })?;
        let size = self
            .file
            .metadata()
            .map_err(|e| DmaError::Io(format!("fstat of client memory: {e}")))?
            .len();
        if at.checked_add(len).is_none_or(|end| end > size) {
            return Err(DmaError::Truncated { gpa, len });
        }
        self.file
            .write_all_at(data, at)
            .map_err(|e| DmaError::Io(format!("pwrite of client memory: {e}")))
    }
}
