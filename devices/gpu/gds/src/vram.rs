//! GPU memory in the caller's address space, and finding out where a
//! mapping lives in VRAM.
//!
//! Two ways to map VRAM:
//! - **p2pmem** (`/sys/bus/pci/devices/<gpu>/p2pmem/allocate`, user-space
//!   P2PDMA since Linux 6.2): the kernel carves a range from the GPU's BAR
//!   (published by the p2plab_gpu driver) and maps pages that have
//!   `struct page`s, so O_DIRECT can pin them and the NVMe controller DMAs
//!   straight into the BAR. This is what `alloc_vram` gives.
//! - **/dev/p2plab-gpuN** mmap (file offset = VRAM offset): any VRAM
//!   offset, but a raw PFN mapping that O_DIRECT cannot pin; such buffers
//!   always take the compat path (reason `not_p2pmem`).
//!
//! The VRAM offset of a p2pmem mapping comes from /proc/self/pagemap
//! (physical address, needs CAP_SYS_ADMIN) minus the start of BAR2.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{ErrorCode, GdsError, Result};
use crate::gpu::{bar_range, GpuDevice};

/// The GPU's VRAM BAR.
pub const VRAM_BAR: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VramKind {
    /// From p2pmem/allocate: O_DIRECT-capable.
    P2pmem,
    /// From /dev/p2plab-gpuN: compat only.
    DeviceMap,
}

impl VramKind {
    pub fn name(self) -> &'static str {
        match self {
            VramKind::P2pmem => "p2pmem",
            VramKind::DeviceMap => "devmap",
        }
    }
}

/// A VRAM mapping the library made (and unmaps on drop).
#[derive(Debug)]
pub struct VramMapping {
    ptr: *mut u8,
    len: usize,
    _file: File,
    pub bdf: String,
    pub kind: VramKind,
}

// SAFETY: the mapping is device memory shared with the GPU and the kernel;
// the library never creates Rust references into it, only hands its
// address to system calls, so it may move between and be used by threads.
unsafe impl Send for VramMapping {}
// SAFETY: as for Send: no Rust-visible state is mutated through &self.
unsafe impl Sync for VramMapping {}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

fn map_shared(file: &File, len: usize, offset: u64, what: &str) -> Result<*mut u8> {
    let off = libc::off_t::try_from(offset).map_err(|_| GdsError::invalid("offset too large"))?;
    // SAFETY: a fresh shared mapping chosen by the kernel (no fixed
    // address, nothing of ours is replaced); the result is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(GdsError::sys(
            &std::io::Error::last_os_error(),
            format!("mmap of {len} bytes of {what}"),
        ));
    }
    Ok(ptr.cast())
}

impl VramMapping {
    /// `len` bytes (rounded up to pages) of the GPU's p2pmem.
    pub fn allocate(sysfs: &Path, bdf: &str, len: u64) -> Result<VramMapping> {
        let len = round_up(len.max(1), page_size())?;
        let len = usize::try_from(len).map_err(|_| GdsError::invalid("size too large"))?;
        let path = sysfs
            .join("bus/pci/devices")
            .join(bdf)
            .join("p2pmem/allocate");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                GdsError::sys(
                    &e,
                    format!("opening {} (p2pmem published?)", path.display()),
                )
            })?;
        let ptr = map_shared(&file, len, 0, &path.display().to_string())?;
        Ok(VramMapping {
            ptr,
            len,
            _file: file,
            bdf: bdf.to_owned(),
            kind: VramKind::P2pmem,
        })
    }

    /// `len` bytes of VRAM at `vram_offset` through /dev/p2plab-gpuN.
    pub fn map_device(gpu: &GpuDevice, vram_offset: u64, len: u64) -> Result<VramMapping> {
        let page = page_size();
        if !vram_offset.is_multiple_of(page) {
            return Err(GdsError::invalid(format!(
                "VRAM offset {vram_offset:#x} is not page aligned"
            )));
        }
        let len = round_up(len.max(1), page)?;
        if vram_offset
            .checked_add(len)
            .is_none_or(|end| end > gpu.vram_size)
        {
            return Err(GdsError::invalid(format!(
                "[{vram_offset:#x}, +{len:#x}) is outside the GPU's {} bytes of VRAM",
                gpu.vram_size
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&gpu.node)
            .map_err(|e| GdsError::sys(&e, format!("opening {}", gpu.node)))?;
        let len = usize::try_from(len).map_err(|_| GdsError::invalid("size too large"))?;
        let ptr = map_shared(&file, len, vram_offset, &gpu.node)?;
        Ok(VramMapping {
            ptr,
            len,
            _file: file,
            bdf: gpu.bdf.clone(),
            kind: VramKind::DeviceMap,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for VramMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range `map_shared` mapped; nothing
        // refers to it any more (registrations hold an Arc to us).
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

fn round_up(value: u64, align: u64) -> Result<u64> {
    value
        .checked_next_multiple_of(align)
        .ok_or_else(|| GdsError::invalid("size too large"))
}

/// Where a range of our address space lives in VRAM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VramLocation {
    pub bdf: String,
    pub kind: VramKind,
    /// VRAM (= BAR2) offset of the range's first byte.
    pub vram_offset: u64,
}

/// One line of /proc/self/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

pub fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let _perms = fields.next()?;
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim().to_owned();
    let (start, end) = range.split_once('-')?;
    Some(MapsEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        path,
    })
}

/// The GPU BDF of a p2pmem mapping's path, `.../<bdf>/p2pmem/allocate`.
pub fn p2pmem_owner(path: &str) -> Option<&str> {
    let dir = path.strip_suffix("/p2pmem/allocate")?;
    let bdf = dir.rsplit('/').next()?;
    crate::topology::is_bdf(bdf).then_some(bdf)
}

/// The PFN in a pagemap entry, if the page is present and the PFN shown.
pub fn pagemap_pfn(entry: u64) -> Option<u64> {
    let present = entry & (1 << 63) != 0;
    let pfn = entry & ((1 << 55) - 1);
    (present && pfn != 0).then_some(pfn)
}

/// Finds `[addr, addr + len)` in VRAM: it must lie inside one mapping of
/// p2pmem of a p2plab GPU or of /dev/p2plab-gpuN.
pub fn locate(sysfs: &Path, addr: u64, len: u64) -> Result<VramLocation> {
    locate_with(sysfs, addr, len, &physical_contiguous)
}

/// Like [`locate`], with `physical` finding the physical address of a
/// p2pmem range (the kernel's is [`physical_contiguous`]).
pub fn locate_with(
    sysfs: &Path,
    addr: u64,
    len: u64,
    physical: &dyn Fn(u64, u64) -> Result<u64>,
) -> Result<VramLocation> {
    let end = addr
        .checked_add(len)
        .ok_or_else(|| GdsError::invalid("buffer range wraps"))?;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| GdsError::sys(&e, "reading /proc/self/maps"))?;
    let entry = maps
        .lines()
        .filter_map(parse_maps_line)
        .find(|m| m.start <= addr && end <= m.end)
        .ok_or_else(|| {
            GdsError::new(
                ErrorCode::PointerInvalid,
                format!("[{addr:#x}, {end:#x}) is not inside one mapping of this process"),
            )
        })?;
    if let Some(bdf) = p2pmem_owner(&entry.path) {
        let driver = std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bdf).join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        if driver.as_deref() != Some(crate::gpu::DRIVER_NAME) {
            return Err(GdsError::new(
                ErrorCode::PointerInvalid,
                format!("the buffer is p2pmem of {bdf}, which is not a p2plab GPU"),
            ));
        }
        let phys = physical(addr, len)?;
        let (bar_start, bar_end) = bar_range(sysfs, bdf, VRAM_BAR).ok_or_else(|| {
            GdsError::new(ErrorCode::DeviceNotFound, format!("{bdf} has no BAR2"))
        })?;
        if phys < bar_start || phys.saturating_add(len) > bar_end.saturating_add(1) {
            return Err(GdsError::new(
                ErrorCode::PointerInvalid,
                format!("physical address {phys:#x} is outside BAR2 of {bdf}"),
            ));
        }
        return Ok(VramLocation {
            bdf: bdf.to_owned(),
            kind: VramKind::P2pmem,
            vram_offset: phys - bar_start,
        });
    }
    if let Some(node) = entry.path.strip_prefix("/dev/") {
        if node.starts_with("p2plab-gpu") {
            let dev =
                std::fs::canonicalize(sysfs.join("class/p2plab-gpu").join(node).join("device"))
                    .map_err(|e| {
                        GdsError::sys(&e, format!("finding the PCI device of /dev/{node}"))
                    })?;
            let bdf = dev
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Ok(VramLocation {
                bdf,
                kind: VramKind::DeviceMap,
                vram_offset: entry.offset + (addr - entry.start),
            });
        }
    }
    Err(GdsError::new(
        ErrorCode::PointerInvalid,
        format!(
            "the buffer is not GPU memory (it maps {:?}); allocate it with alloc_vram",
            if entry.path.is_empty() {
                "anonymous memory"
            } else {
                &entry.path
            }
        ),
    ))
}

/// Physical address of `addr`, checking `[addr, addr + len)` is present
/// and physically contiguous (p2pmem allocations are), from
/// /proc/self/pagemap.
pub fn physical_contiguous(addr: u64, len: u64) -> Result<u64> {
    let page = page_size();
    let first = addr / page;
    let last = addr
        .checked_add(len.max(1) - 1)
        .ok_or_else(|| GdsError::invalid("buffer range wraps"))?
        / page;
    let count = usize::try_from(last - first + 1).map_err(|_| GdsError::invalid("too large"))?;
    let pagemap =
        File::open("/proc/self/pagemap").map_err(|e| GdsError::sys(&e, "opening pagemap"))?;
    let mut raw = vec![0u8; count * 8];
    pagemap
        .read_exact_at(&mut raw, first * 8)
        .map_err(|e| GdsError::sys(&e, "reading pagemap"))?;
    let mut base = None;
    for (i, chunk) in raw.chunks_exact(8).enumerate() {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let pfn = pagemap_pfn(u64::from_le_bytes(word)).ok_or_else(|| {
            GdsError::new(
                ErrorCode::PointerInvalid,
                "pagemap shows no physical page (not mapped, or no CAP_SYS_ADMIN)",
            )
            .with_errno(libc::EPERM)
        })?;
        let base_pfn = *base.get_or_insert(pfn);
        if pfn != base_pfn + i as u64 {
            return Err(GdsError::new(
                ErrorCode::PointerInvalid,
                "the buffer is not physically contiguous VRAM",
            ));
        }
    }
    let base = base.unwrap_or(0);
    Ok(base * page + addr % page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let line = "7f3a00000000-7f3a04000000 rw-s 00000000 00:15 1234                       /sys/devices/pci0000:00/0000:00:10.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/p2pmem/allocate";
        let e = parse_maps_line(line).unwrap();
        assert_eq!(e.start, 0x7f3a_0000_0000);
        assert_eq!(e.end, 0x7f3a_0400_0000);
        assert_eq!(p2pmem_owner(&e.path), Some("0000:04:00.0"));
        let e = parse_maps_line("7f00-8000 rw-s 3ff00000 00:05 9 /dev/p2plab-gpu0").unwrap();
        assert_eq!(e.offset, 0x3ff0_0000);
        assert_eq!(e.path, "/dev/p2plab-gpu0");
        let anon = parse_maps_line("7f00-8000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(anon.path, "");
        assert!(parse_maps_line("nonsense").is_none());
        assert_eq!(p2pmem_owner("/tmp/p2pmem/allocate"), None);
        assert_eq!(p2pmem_owner("/dev/zero"), None);
    }

    #[test]
    fn pagemap_entries() {
        assert_eq!(pagemap_pfn((1 << 63) | 0x840000), Some(0x840000));
        // Not present, or PFN hidden from unprivileged readers.
        assert_eq!(pagemap_pfn(0x840000), None);
        assert_eq!(pagemap_pfn(1 << 63), None);
        // Soft-dirty and exclusive bits are not part of the PFN.
        assert_eq!(pagemap_pfn((1 << 63) | (1 << 55) | (1 << 56) | 5), Some(5));
    }

    #[test]
    fn host_memory_is_not_gpu_memory() {
        let v = vec![0u8; 8192];
        let err = locate(Path::new("/sys"), v.as_ptr() as u64, 8192).unwrap_err();
        assert_eq!(err.code, ErrorCode::PointerInvalid, "{err}");
        let err = locate(Path::new("/sys"), 16, 8).unwrap_err();
        assert_eq!(err.code, ErrorCode::PointerInvalid, "{err}");
        let err = locate(Path::new("/sys"), u64::MAX, 8).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidValue, "{err}");
    }
}
