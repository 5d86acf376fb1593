//! Namespaces and their backing store: a raw file (or block device) or
//! anonymous memory, with 512- or 4096-byte logical blocks.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use p2plab_dma::VolatileSlice;

use crate::spec::{put_u32, put_u64, put_u8, Status};

/// Block storage behind a namespace. Offsets and lengths are in bytes and
/// already checked against [`size`](Self::size) by the caller.
pub trait BlockBackend: Send + Sync {
    fn size(&self) -> u64;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Reads `offset..` into `bufs`, in order: zero-copy into guest memory
    /// (one `preadv`). The default copies through a heap buffer.
    fn read_vectored_at(&self, offset: u64, bufs: &[VolatileSlice<'_>]) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            let mut bytes = vec![0u8; buf.len()];
            self.read_at(at, &mut bytes)?;
            buf.copy_from(&bytes);
            at += buf.len() as u64;
        }
        Ok(())
    }
    /// Writes `bufs`, in order, at `offset..`: zero-copy from guest memory
    /// (one `pwritev`). The default copies through a heap buffer.
    fn write_vectored_at(&self, offset: u64, bufs: &[VolatileSlice<'_>]) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            let mut bytes = vec![0u8; buf.len()];
            buf.copy_to(&mut bytes);
            self.write_at(at, &bytes)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    /// Makes completed writes durable (fdatasync).
    fn flush(&self) -> io::Result<()>;
    /// Deallocates a range; it reads back as zeroes afterwards.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Writes zeroes over a range, keeping it allocated when possible.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// What backs it, for logs and stats.
    fn describe(&self) -> String;
}

/// How a file namespace reaches its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Caching {
    /// Through the host's page cache (like QEMU's `cache=writeback`).
    #[default]
    Page,
    /// O_DIRECT, past the page cache (like QEMU's `cache=none`).
    Direct,
}

impl FromStr for Caching {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "page" => Ok(Caching::Page),
            "direct" => Ok(Caching::Direct),
            other => Err(format!("caching {other:?}: use page or direct")),
        }
    }
}

/// O_DIRECT needs buffers, offsets and lengths aligned to the file
/// system's block; 4 KiB suits every block size Linux file systems use
/// below the page size, so nothing needs to be queried.
pub const DIRECT_ALIGN: usize = 4096;

/// A file, a block device or a memfd, accessed with pread/pwrite so every
/// queue's worker can use it at once.
pub struct FileBackend {
    file: File,
    /// The same file opened O_DIRECT (`--caching direct`). Aligned
    /// transfers use it; the rest (a 512-byte partition-table read, an
    /// unaligned bounce buffer) go through `file`, which Linux keeps
    /// coherent with direct I/O by flushing and invalidating the range.
    direct: Option<File>,
    size: u64,
    label: String,
}

fn direct_aligned(offset: u64, buf: &[u8]) -> bool {
    offset.is_multiple_of(DIRECT_ALIGN as u64)
        && buf.len().is_multiple_of(DIRECT_ALIGN)
        && (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
}

const ZERO_CHUNK: usize = 1 << 20;

/// Which way [`vectored_io`] moves bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Vectored {
    /// File to memory (preadv).
    Read,
    /// Memory to file (pwritev).
    Write,
}

/// At most this many iovecs per preadv/pwritev (Linux's UIO_MAXIOV).
const IOV_MAX: usize = 1024;

/// Moves `bufs.len()` slices' worth of bytes between the file at `offset`
/// and `bufs`, in order, with preadv/pwritev, resuming after short
/// transfers. `direct` (the O_DIRECT twin of `file`) is used for every
/// call whose offset and remaining iovecs are all aligned to
/// [`DIRECT_ALIGN`]; the rest goes through `file`.
fn vectored_io(
    file: &File,
    direct: Option<&File>,
    offset: u64,
    bufs: &[VolatileSlice<'_>],
    way: Vectored,
) -> io::Result<()> {
    let mut iovecs: Vec<libc::iovec> = bufs
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| libc::iovec {
            iov_base: b.ptr_guard_mut().as_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let mut first = 0usize;
    let mut at = offset;
    while first < iovecs.len() {
        let batch = &iovecs[first..iovecs.len().min(first + IOV_MAX)];
        let aligned = at.is_multiple_of(DIRECT_ALIGN as u64)
            && batch.iter().all(|v| {
                (v.iov_base as usize).is_multiple_of(DIRECT_ALIGN)
                    && v.iov_len.is_multiple_of(DIRECT_ALIGN)
            });
        let fd = match direct {
            Some(direct) if aligned => direct.as_raw_fd(),
            _ => file.as_raw_fd(),
        };
        let file_offset =
            libc::off_t::try_from(at).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // `batch` holds at most IOV_MAX entries.
        let count = batch.len() as libc::c_int;
        let n = match way {
            // SAFETY: every iovec points into a VolatileSlice of `bufs`,
            // which the caller keeps mapped (and its range in use) for the
            // call; the kernel writes at most iov_len bytes to each, and
            // the fd is borrowed from a File that outlives the call.
            Vectored::Read => unsafe { libc::preadv(fd, batch.as_ptr(), count, file_offset) },
            // SAFETY: as for preadv; the kernel only reads the memory.
            Vectored::Write => unsafe { libc::pwritev(fd, batch.as_ptr(), count, file_offset) },
        };
        let n = match usize::try_from(n) {
            Ok(0) => {
                return Err(match way {
                    Vectored::Read => io::Error::from(io::ErrorKind::UnexpectedEof),
                    Vectored::Write => io::Error::from(io::ErrorKind::WriteZero),
                })
            }
            Ok(n) => n,
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
        };
        at += n as u64;
        // Skip what was moved: whole iovecs, then part of the next.
        let mut left = n;
        while left > 0 {
            let Some(v) = iovecs.get_mut(first) else {
                break;
            };
            if left >= v.iov_len {
                left -= v.iov_len;
                first += 1;
            } else {
                v.iov_base = v.iov_base.cast::<u8>().wrapping_add(left).cast();
                v.iov_len -= left;
                left = 0;
            }
        }
    }
    Ok(())
}

fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: fallocate only reads its integer arguments; the fd stays
    // open for the duration of the call because `file` is borrowed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) | Some(libc::ENODEV)
    )
}

impl FileBackend {
    /// Opens `path` read-write. A missing file is created sparse with
    /// `size` bytes; an existing one keeps its data and must match `size`
    /// when one is given. `Caching::Direct` also opens it O_DIRECT and
    /// fails when the file system refuses that.
    pub fn open(path: &Path, size: Option<u64>, caching: Caching) -> Result<Self, NamespaceError> {
        let label = path.display().to_string();
        let err = |what: &str, e: io::Error| NamespaceError(format!("{label}: {what}: {e}"));
        let existing = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(!existing)
            // A file we create is ours alone; create_new (O_EXCL) never
            // follows a symlink planted at the path after the check.
            .mode(0o600)
            .truncate(false)
            .open(path)
            .map_err(|e| err("cannot open", e))?;
        let actual = file
            .seek(SeekFrom::End(0))
            .map_err(|e| err("cannot size", e))?;
        let size = match (existing, size) {
            (false, Some(size)) => {
                file.set_len(size).map_err(|e| err("cannot size", e))?;
                size
            }
            (false, None) => {
                let _ = std::fs::remove_file(path);
                return Err(NamespaceError(format!(
                    "{label} does not exist; give a size to create it"
                )));
            }
            (true, Some(size)) if size != actual => {
                return Err(NamespaceError(format!(
                    "{label} exists with {actual} bytes, but size={size} was asked for \
                     (remove the file or drop the size)"
                )));
            }
            (true, _) => actual,
        };
        let direct = match caching {
            Caching::Page => None,
            Caching::Direct => Some(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .map_err(|e| err("cannot open with O_DIRECT (--caching direct)", e))?,
            ),
        };
        let label = match caching {
            Caching::Page => label,
            Caching::Direct => format!("{label} (O_DIRECT)"),
        };
        Ok(Self {
            file,
            direct,
            size,
            label,
        })
    }

    /// Anonymous memory of `size` bytes (a memfd, so unwritten pages cost
    /// nothing and deallocation frees memory).
    pub fn memory(name: &str, size: u64) -> Result<Self, NamespaceError> {
        let cname = std::ffi::CString::new(name)
            .map_err(|_| NamespaceError(format!("bad memory namespace name {name:?}")))?;
        // SAFETY: memfd_create reads a NUL-terminated string that lives
        // across the call and returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(NamespaceError(format!(
                "memfd_create: {}",
                io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)
            .map_err(|e| NamespaceError(format!("sizing memory namespace: {e}")))?;
        Ok(Self {
            file,
            direct: None,
            size,
            label: format!("memory ({name})"),
        })
    }

    fn zero_by_writing(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeroes = vec![0u8; ZERO_CHUNK.min(len as usize)];
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = ((end - at) as usize).min(zeroes.len());
            self.file.write_all_at(&zeroes[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }
}

impl BlockBackend for FileBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match &self.direct {
            Some(direct) if direct_aligned(offset, buf) => direct.read_exact_at(buf, offset),
            _ => self.file.read_exact_at(buf, offset),
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        match &self.direct {
            Some(direct) if direct_aligned(offset, data) => direct.write_all_at(data, offset),
            _ => self.file.write_all_at(data, offset),
        }
    }

    fn read_vectored_at(&self, offset: u64, bufs: &[VolatileSlice<'_>]) -> io::Result<()> {
        vectored_io(
            &self.file,
            self.direct.as_ref(),
            offset,
            bufs,
            Vectored::Read,
        )
    }

    fn write_vectored_at(&self, offset: u64, bufs: &[VolatileSlice<'_>]) -> io::Result<()> {
        vectored_io(
            &self.file,
            self.direct.as_ref(),
            offset,
            bufs,
            Vectored::Write,
        )
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        match fallocate(
            &self.file,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if unsupported(&e) => self.zero_by_writing(offset, len),
            other => other,
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        match fallocate(
            &self.file,
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if unsupported(&e) => self.zero_by_writing(offset, len),
            other => other,
        }
    }

    fn describe(&self) -> String {
        self.label.clone()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NamespaceError(pub String);

/// Where a namespace keeps its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    File(PathBuf),
    Memory,
}

/// A namespace as given on the command line:
/// `file=PATH[,size=SIZE][,lba=512|4096]` or `mem,size=SIZE[,lba=...]`
/// (a bare `PATH` works too). Sizes take K, M, G, T suffixes (powers of
/// 1024).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSpec {
    pub backing: Backing,
    pub size: Option<u64>,
    pub block_size: u32,
}

/// Parses `64M`, `1G`, `4096`, `2MiB`...
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (like 512, 64M, 1G)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

impl FromStr for NamespaceSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut backing = None;
        let mut size = None;
        let mut block_size = 512;
        for (i, part) in text.split(',').enumerate() {
            let part = part.trim();
            let (key, value) = match part.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (part, None),
            };
            match (key, value) {
                ("mem" | "memory", None) => backing = Some(Backing::Memory),
                ("file" | "path", Some(v)) if !v.is_empty() => {
                    backing = Some(Backing::File(PathBuf::from(v)))
                }
                ("size", Some(v)) => size = Some(parse_size(v)?),
                ("lba" | "bs" | "block-size" | "block_size", Some(v)) => {
                    block_size = match v.to_ascii_lowercase().as_str() {
                        "512" => 512,
                        "4096" | "4k" | "4kib" => 4096,
                        _ => {
                            return Err(format!(
                                "block size {v:?}: only 512 and 4096 are supported"
                            ))
                        }
                    }
                }
                (path, None) if i == 0 && !path.is_empty() => {
                    backing = Some(Backing::File(PathBuf::from(path)))
                }
                _ => {
                    return Err(format!(
                        "{part:?} is not understood (use file=PATH or mem, size=SIZE, lba=512|4096)"
                    ))
                }
            }
        }
        let backing = backing.ok_or("a namespace needs file=PATH or mem")?;
        if backing == Backing::Memory && size.is_none() {
            return Err("a memory namespace needs size=SIZE".into());
        }
        if let Some(size) = size {
            if size == 0 || size % u64::from(block_size) != 0 {
                return Err(format!(
                    "size {size} is not a positive multiple of the {block_size}-byte block"
                ));
            }
        }
        Ok(Self {
            backing,
            size,
            block_size,
        })
    }
}

impl NamespaceSpec {
    /// Opens or creates the backing store; `caching` applies to files
    /// (memory namespaces have no page cache to bypass).
    pub fn open(
        &self,
        nsid: u32,
        caching: Caching,
    ) -> Result<Arc<dyn BlockBackend>, NamespaceError> {
        let backend = match &self.backing {
            Backing::File(path) => FileBackend::open(path, self.size, caching)?,
            Backing::Memory => {
                FileBackend::memory(&format!("p2plab-nvme-ns{nsid}"), self.size.unwrap_or(0))?
            }
        };
        if backend.size() == 0 || backend.size() % u64::from(self.block_size) != 0 {
            return Err(NamespaceError(format!(
                "{}: {} bytes is not a positive multiple of the {}-byte block",
                backend.describe(),
                backend.size(),
                self.block_size
            )));
        }
        Ok(Arc::new(backend))
    }
}

/// Unique identifiers reported in Identify Namespace and the namespace
/// identification descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceIds {
    pub eui64: [u8; 8],
    pub nguid: [u8; 16],
    pub uuid: [u8; 16],
}

fn fnv1a(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl NamespaceIds {
    /// Stable identifiers derived from the controller serial number and
    /// NSID: the same device gets the same IDs on every start, and two
    /// devices with different serials never share them.
    pub fn derive(serial: &str, nsid: u32, oui: [u8; 3]) -> Self {
        let n = nsid.to_le_bytes();
        let word = |seed: u64| fnv1a(seed, &[serial.as_bytes(), &n]).to_be_bytes();
        let (a, b, c, d) = (word(1), word(2), word(3), word(4));
        let mut eui64 = [0u8; 8];
        eui64[..3].copy_from_slice(&oui);
        eui64[3..].copy_from_slice(&a[..5]);
        let mut nguid = [0u8; 16];
        nguid[..8].copy_from_slice(&b);
        nguid[8..].copy_from_slice(&a);
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&c);
        uuid[8..].copy_from_slice(&d);
        // RFC 9562 version 8 (custom), variant 10xx.
        uuid[6] = (uuid[6] & 0x0f) | 0x80;
        uuid[8] = (uuid[8] & 0x3f) | 0x80;
        Self { eui64, nguid, uuid }
    }
}

/// Per-namespace I/O counters (SMART log per namespace, stats).
#[derive(Debug, Default)]
pub struct NamespaceCounters {
    pub read_commands: AtomicU64,
    pub write_commands: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

/// LBA format index 0: 512-byte blocks; index 1: 4096-byte blocks.
pub const LBA_FORMATS: [u32; 2] = [9, 12];

/// A namespace attached to the controller.
pub struct Namespace {
    nsid: u32,
    backend: Arc<dyn BlockBackend>,
    lbaf: AtomicU8,
    /// Number of LBA formats usable with this size (1: only 512 bytes).
    formats: u8,
    ids: NamespaceIds,
    formatting: AtomicBool,
    /// A flush failed since the last controller reset (sticky).
    flush_failed: AtomicBool,
    pub counters: NamespaceCounters,
}

/// Why [`Namespace::flush`] failed.
#[derive(Debug)]
pub enum FlushError {
    /// The backing store's fdatasync failed now.
    Failed(io::Error),
    /// An earlier flush failed; writes it covered may be lost.
    Sticky,
}

impl Namespace {
    pub fn new(
        nsid: u32,
        backend: Arc<dyn BlockBackend>,
        block_size: u32,
        ids: NamespaceIds,
    ) -> Self {
        let size = backend.size();
        let formats = if size.is_multiple_of(4096) { 2 } else { 1 };
        let lbaf = if block_size == 4096 && formats == 2 {
            1
        } else {
            0
        };
        Self {
            nsid,
            backend,
            lbaf: AtomicU8::new(lbaf),
            formats,
            ids,
            formatting: AtomicBool::new(false),
            flush_failed: AtomicBool::new(false),
            counters: NamespaceCounters::default(),
        }
    }

    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    /// Makes completed writes durable. Once a flush has failed, every
    /// later one fails too until [`clear_flush_failure`](Self::clear_flush_failure)
    /// (a controller reset): Linux reports a writeback error to fdatasync
    /// once, marks the pages clean and lets the next fdatasync succeed,
    /// so a retried Flush would report success over data that never
    /// reached the disk.
    pub fn flush(&self) -> Result<(), FlushError> {
        if self.flush_failed.load(Ordering::Acquire) {
            return Err(FlushError::Sticky);
        }
        self.backend.flush().map_err(|e| {
            self.flush_failed.store(true, Ordering::Release);
            FlushError::Failed(e)
        })
    }

    /// Whether a flush failed since the last controller reset.
    pub fn flush_failed(&self) -> bool {
        self.flush_failed.load(Ordering::Acquire)
    }

    /// A controller reset: the host knows about the failure by now and
    /// starts over.
    pub fn clear_flush_failure(&self) {
        self.flush_failed.store(false, Ordering::Release);
    }
    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        &self.backend
    }
    pub fn ids(&self) -> &NamespaceIds {
        &self.ids
    }
    pub fn lba_format(&self) -> u8 {
        self.lbaf.load(Ordering::Acquire)
    }
    pub fn format_count(&self) -> u8 {
        self.formats
    }
    pub fn block_shift(&self) -> u32 {
        LBA_FORMATS[usize::from(self.lba_format()).min(LBA_FORMATS.len() - 1)]
    }
    pub fn block_size(&self) -> u32 {
        1 << self.block_shift()
    }
    /// Namespace size in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.backend.size() >> self.block_shift()
    }
    pub fn is_formatting(&self) -> bool {
        self.formatting.load(Ordering::Acquire)
    }

    /// Byte range of `nlb` blocks from `slba`, or LBA Out of Range.
    pub fn byte_range(&self, slba: u64, nlb: u64) -> Result<(u64, u64), Status> {
        let shift = self.block_shift();
        let end = slba.checked_add(nlb).ok_or(Status::LBA_OUT_OF_RANGE)?;
        if end > self.blocks() {
            return Err(Status::LBA_OUT_OF_RANGE);
        }
        Ok((slba << shift, nlb << shift))
    }

    /// Format NVM: erases the data and switches to LBA format `lbaf`.
    pub fn format(&self, lbaf: u8) -> Result<(), Status> {
        if lbaf >= self.formats {
            return Err(Status::INVALID_FORMAT);
        }
        self.formatting.store(true, Ordering::Release);
        let result = self.backend.discard(0, self.backend.size());
        if result.is_ok() {
            self.lbaf.store(lbaf, Ordering::Release);
        }
        self.formatting.store(false, Ordering::Release);
        result.map_err(|e| {
            tracing::warn!(nsid = self.nsid, %e, "format failed");
            Status::INTERNAL_ERROR
        })
    }

    /// Identify Namespace (CNS 00h), NVM command set.
    pub fn identify(&self) -> Vec<u8> {
        let mut d = vec![0u8; 4096];
        let blocks = self.blocks();
        put_u64(&mut d, 0, blocks); // NSZE
        put_u64(&mut d, 8, blocks); // NCAP
        put_u64(&mut d, 16, blocks); // NUSE
        put_u8(&mut d, 24, 0); // NSFEAT
        put_u8(&mut d, 25, self.formats - 1); // NLBAF, 0's based
        put_u8(&mut d, 26, self.lba_format()); // FLBAS
                                               // DLFEAT: deallocated blocks read as zeroes (001b); Write Zeroes
                                               // supports the Deallocate bit.
        put_u8(&mut d, 33, 0x08 | 0x01);
        // NVMCAP (128-bit) in bytes.
        put_u64(&mut d, 48, self.backend.size());
        // NPWG/NPWA/NPDG/NPDA/NOWS are left 0: no preferences.
        put_bytes_slice(&mut d, 104, &self.ids.nguid);
        put_bytes_slice(&mut d, 120, &self.ids.eui64);
        for (i, &lbads) in LBA_FORMATS
            .iter()
            .take(usize::from(self.formats))
            .enumerate()
        {
            // MS = 0, LBADS, RP = 0 (best performance).
            put_u32(&mut d, 128 + 4 * i, u32::from(lbads as u8) << 16);
        }
        d
    }

    /// Namespace Identification Descriptor list (CNS 03h).
    pub fn identification_descriptors(&self) -> Vec<u8> {
        let mut d = vec![0u8; 4096];
        let mut at = 0usize;
        let mut push = |nidt: u8, value: &[u8]| {
            put_u8(&mut d, at, nidt);
            put_u8(&mut d, at + 1, value.len() as u8);
            put_bytes_slice(&mut d, at + 4, value);
            at += 4 + value.len();
        };
        push(0x01, &self.ids.eui64);
        push(0x02, &self.ids.nguid);
        push(0x03, &self.ids.uuid);
        push(0x04, &[0x00]); // Command Set Identifier: NVM
        d
    }
}

fn put_bytes_slice(buf: &mut [u8], at: usize, bytes: &[u8]) {
    crate::spec::put_bytes(buf, at, bytes);
}

/// What a command was doing to the media when the backing store failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaAccess {
    Read,
    Write,
}

/// Maps a backing-store error to the status the spec asks for: a full
/// (or over-quota) store is Capacity Exceeded, a read-only one Namespace
/// is Write Protected, any other write failure a Write Fault; a read that
/// hit EIO or ran short is an Unrecovered Read Error, anything else an
/// Internal Error (the media did not fail, the host-side store did).
pub fn io_error_status(error: &io::Error, access: MediaAccess) -> Status {
    match (access, error.raw_os_error()) {
        (MediaAccess::Write, Some(libc::ENOSPC | libc::EDQUOT)) => Status::CAPACITY_EXCEEDED,
        (MediaAccess::Write, Some(libc::EROFS)) => Status::NAMESPACE_WRITE_PROTECTED,
        (MediaAccess::Write, _) => Status::WRITE_FAULT,
        (MediaAccess::Read, Some(libc::EIO)) | (MediaAccess::Read, None) => {
            Status::UNRECOVERED_READ_ERROR
        }
        (MediaAccess::Read, _) => Status::INTERNAL_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_namespace_specs() {
        let s: NamespaceSpec = "file=/tmp/a.img,size=1G,lba=512".parse().unwrap();
        assert_eq!(s.backing, Backing::File("/tmp/a.img".into()));
        assert_eq!(s.size, Some(1 << 30));
        assert_eq!(s.block_size, 512);
        let s: NamespaceSpec = "mem,size=256M,lba=4096".parse().unwrap();
        assert_eq!(s.backing, Backing::Memory);
        assert_eq!(s.block_size, 4096);
        let s: NamespaceSpec = "/dev/loop0".parse().unwrap();
        assert_eq!(s.backing, Backing::File("/dev/loop0".into()));
        assert_eq!(s.size, None);
        assert!(
            "mem".parse::<NamespaceSpec>().is_err(),
            "memory needs a size"
        );
        assert!("mem,size=1000,lba=512".parse::<NamespaceSpec>().is_err());
        assert!("mem,size=1M,lba=1024".parse::<NamespaceSpec>().is_err());
        assert!("size=1M".parse::<NamespaceSpec>().is_err());
        assert!("mem,size=1Q".parse::<NamespaceSpec>().is_err());
        assert!("mem,size=1M,colour=red".parse::<NamespaceSpec>().is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn ids_are_stable_and_unique() {
        let a = NamespaceIds::derive("SN1", 1, [1, 2, 3]);
        assert_eq!(a, NamespaceIds::derive("SN1", 1, [1, 2, 3]));
        let b = NamespaceIds::derive("SN1", 2, [1, 2, 3]);
        let c = NamespaceIds::derive("SN2", 1, [1, 2, 3]);
        for other in [b, c] {
            assert_ne!(a.eui64, other.eui64);
            assert_ne!(a.nguid, other.nguid);
            assert_ne!(a.uuid, other.uuid);
        }
        assert_eq!(a.uuid[6] >> 4, 8);
        assert_eq!(&a.eui64[..3], &[1, 2, 3]);
    }

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("p2plab-nvme-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn file_backend_creates_sparse_files_and_keeps_data() {
        let path = temp_path("create");
        let _ = std::fs::remove_file(&path);
        assert!(
            FileBackend::open(&path, None, Caching::Page).is_err(),
            "missing file without size"
        );
        assert!(!path.exists());
        let b = FileBackend::open(&path, Some(1 << 20), Caching::Page).unwrap();
        // Catches a namespace file created readable by others.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "created 0600");
        b.write_at(4096, b"hello").unwrap();
        b.flush().unwrap();
        drop(b);
        let b = FileBackend::open(&path, None, Caching::Page).unwrap();
        assert_eq!(b.size(), 1 << 20);
        let mut got = [0u8; 5];
        b.read_at(4096, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        assert!(
            FileBackend::open(&path, Some(2 << 20), Caching::Page).is_err(),
            "size mismatch"
        );
        b.discard(0, 8192).unwrap();
        b.read_at(4096, &mut got).unwrap();
        assert_eq!(got, [0; 5]);
        b.write_at(100, &[9; 50]).unwrap();
        b.write_zeroes(110, 10).unwrap();
        let mut row = [0u8; 50];
        b.read_at(100, &mut row).unwrap();
        assert_eq!(&row[..10], &[9; 10]);
        assert_eq!(&row[10..20], &[0; 10]);
        assert_eq!(&row[20..], &[9; 30]);
        let _ = std::fs::remove_file(&path);
    }

    /// `bytes` cut into consecutive slices of `lens`.
    fn cut<'a>(mut bytes: &'a mut [u8], lens: &[usize]) -> Vec<VolatileSlice<'a>> {
        let mut slices = Vec::new();
        for len in lens {
            let (head, tail) = bytes.split_at_mut(*len);
            slices.push(VolatileSlice::from(head));
            bytes = tail;
        }
        slices
    }

    /// Catches a zero-copy transfer that drops, repeats or misplaces bytes:
    /// more iovecs than one preadv takes (two calls), odd lengths and an
    /// empty slice, compared byte for byte with plain pread/pwrite, on both
    /// cachings (O_DIRECT for the aligned pieces).
    #[test]
    fn vectored_transfers_match_plain_ones() {
        for caching in [Caching::Page, Caching::Direct] {
            let path = temp_path(&format!("vectored-{caching:?}"));
            let _ = std::fs::remove_file(&path);
            let b = FileBackend::open(&path, Some(4 << 20), caching).unwrap();
            // 1500 pieces of 1..=7 bytes, one empty, then four aligned pages.
            let mut lens: Vec<usize> = (0..1500).map(|i| 1 + i % 7).collect();
            lens[700] = 0;
            let odd: usize = lens.iter().sum();
            let mut storage = vec![0u8; odd + 6 * DIRECT_ALIGN];
            let pattern: Vec<u8> = (0..storage.len()).map(|i| (i * 13 % 251) as u8).collect();
            storage.copy_from_slice(&pattern);
            let aligned_start = odd + storage[odd..].as_ptr().align_offset(DIRECT_ALIGN);
            lens.push(aligned_start - odd);
            lens.extend([DIRECT_ALIGN; 4]);
            let total: usize = lens.iter().sum();
            let source = storage[..total].to_vec();
            b.write_vectored_at(8192, &cut(&mut storage[..total], &lens))
                .unwrap();
            let mut plain = vec![0u8; total];
            b.read_at(8192, &mut plain).unwrap();
            assert_eq!(
                plain, source,
                "{caching:?}: pwritev wrote the slices in order"
            );
            storage[..total].fill(0);
            b.read_vectored_at(8192, &cut(&mut storage[..total], &lens))
                .unwrap();
            assert_eq!(
                &storage[..total],
                &source[..],
                "{caching:?}: preadv read them back"
            );
            // A read past the end is an error, not a short success.
            let mut tail = [0u8; 16];
            let slices = [VolatileSlice::from(&mut tail[..])];
            assert!(b.read_vectored_at((4 << 20) - 8, &slices).is_err());
            let _ = std::fs::remove_file(&path);
        }
    }

    /// Catches a direct backend that loses data between its O_DIRECT and
    /// page-cache paths, or that silently runs without O_DIRECT.
    #[test]
    fn direct_backend_mixes_aligned_and_unaligned_access() {
        let path = temp_path("direct");
        let _ = std::fs::remove_file(&path);
        let b = FileBackend::open(&path, Some(1 << 20), Caching::Direct).unwrap();
        assert!(b.describe().ends_with("(O_DIRECT)"), "{}", b.describe());
        assert!(b.direct.is_some());
        let mut storage = vec![0u8; 3 * DIRECT_ALIGN];
        let start = storage.as_ptr().align_offset(DIRECT_ALIGN);
        let block = &mut storage[start..start + DIRECT_ALIGN];
        assert!(direct_aligned(8192, block));
        assert!(!direct_aligned(8192 + 512, block));
        assert!(!direct_aligned(8192, &block[..512]));
        block.fill(7);
        b.write_at(8192, block).unwrap();
        // Unaligned: through the page cache, over the directly written block.
        b.write_at(8192 + 100, &[3; 10]).unwrap();
        block.fill(0);
        b.read_at(8192, block).unwrap();
        assert_eq!(&block[..100], &[7; 100]);
        assert_eq!(&block[100..110], &[3; 10]);
        assert_eq!(&block[110..], &[7; DIRECT_ALIGN - 110][..]);
        let mut small = [0u8; 4];
        b.read_at(8192 + 98, &mut small).unwrap();
        assert_eq!(small, [7, 7, 3, 3]);
        b.flush().unwrap();
        drop(b);
        let b = FileBackend::open(&path, None, Caching::Page).unwrap();
        assert!(!b.describe().contains("O_DIRECT"));
        b.read_at(8192 + 98, &mut small).unwrap();
        assert_eq!(small, [7, 7, 3, 3]);
        assert_eq!("direct".parse::<Caching>(), Ok(Caching::Direct));
        assert_eq!("page".parse::<Caching>(), Ok(Caching::Page));
        assert!("none".parse::<Caching>().is_err());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn namespace_geometry_and_format() {
        let backend: Arc<dyn BlockBackend> = Arc::new(FileBackend::memory("t", 1 << 20).unwrap());
        let ns = Namespace::new(1, backend, 512, NamespaceIds::derive("x", 1, [0; 3]));
        assert_eq!(ns.blocks(), 2048);
        assert_eq!(ns.byte_range(2047, 1), Ok((2047 * 512, 512)));
        assert_eq!(ns.byte_range(2047, 2), Err(Status::LBA_OUT_OF_RANGE));
        assert_eq!(ns.byte_range(u64::MAX, 2), Err(Status::LBA_OUT_OF_RANGE));
        ns.backend().write_at(0, &[1; 512]).unwrap();
        ns.format(1).unwrap();
        assert_eq!(ns.block_size(), 4096);
        assert_eq!(ns.blocks(), 256);
        let mut b = [9u8; 512];
        ns.backend().read_at(0, &mut b).unwrap();
        assert_eq!(b, [0; 512], "format erases");
        assert_eq!(ns.format(2), Err(Status::INVALID_FORMAT));
        let id = ns.identify();
        assert_eq!(u64::from_le_bytes(id[0..8].try_into().unwrap()), 256);
        assert_eq!(id[25], 1, "two LBA formats");
        assert_eq!(id[26], 1, "format 1 in use");
        assert_eq!(id[128 + 4 + 2], 12, "LBAF1 LBADS");
        let descs = ns.identification_descriptors();
        assert_eq!((descs[0], descs[1]), (1, 8));
        assert_eq!((descs[12], descs[13]), (2, 16));
        assert_eq!((descs[32], descs[33]), (3, 16));
        assert_eq!((descs[52], descs[53], descs[56]), (4, 1, 0));
    }
}
