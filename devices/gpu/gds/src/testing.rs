//! A test GPU (the `testing` feature): what the kernel and the p2plab_gpu
//! driver show the library, built in a directory. A sysfs tree with the
//! GPU behind a PCIe switch (bound to p2plab_gpu, p2pmem published, BAR2
//! in `resource`, a device node in its class directory); a file standing
//! for its VRAM, which `p2pmem/allocate` is, so the library's mmap of it
//! is a real shared mapping the kernel can do O_DIRECT into; an engine
//! that copies, fills and checksums that file; and physical addresses
//! inside BAR2 for mappings of it. A file system's block device can be
//! placed under the same switch, so that files on it take the P2P path.
//!
//! Only the two kernel questions ([`Platform`]) are answered here; the
//! library's sysfs and /proc/self/maps parsing, mmap, file I/O, planner,
//! executor, registrations and C ABI all run as they do in the guest.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{symlink, FileExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::driver::Driver;
use crate::error::{ErrorCode, GdsError, Result};
use crate::gpu::{
    GpuInfo, GpuJob, GpuNode, INFO_P2PMEM, OP_CHECKSUM, OP_COPY_FROM_VRAM, OP_COPY_TO_VRAM, OP_FILL,
};
use crate::platform::Platform;
use crate::vram::parse_maps_line;

/// The test GPU's PCI function.
pub const GPU_BDF: &str = "0000:04:00.0";
/// Its device node, as its sysfs class directory names it.
pub const GPU_NODE: &str = "/dev/p2plab-gpu0";
/// Where BAR2 (VRAM) is on the bus.
pub const BAR2_START: u64 = 0x8_0000_0000;
/// The switch the GPU (and storage placed on PCI) sits under.
const SWITCH: &str = "devices/pci0000:00/0000:00:10.0/0000:01:00.0";
/// A job status the engine fails an out-of-range operand with.
const STATUS_RANGE: u32 = 0x02;

/// A p2plab GPU that is a directory and a file.
#[derive(Debug)]
pub struct FakeGpu {
    sysfs: PathBuf,
    /// VRAM: `p2pmem/allocate` of the GPU's sysfs directory.
    vram: File,
    vram_path: PathBuf,
    vram_size: u64,
}

fn gpu_dir() -> String {
    format!("{SWITCH}/0000:02:01.0/{GPU_BDF}")
}

fn storage_dir() -> String {
    format!("{SWITCH}/0000:02:00.0/0000:03:00.0/nvme/nvme0/nvme0n1")
}

impl FakeGpu {
    /// A GPU with `vram_size` bytes of VRAM (a multiple of the page size),
    /// its sysfs made anew in `dir/sys`.
    pub fn new(dir: &Path, vram_size: u64) -> io::Result<Arc<FakeGpu>> {
        std::fs::create_dir_all(dir)?;
        let root = std::fs::canonicalize(dir)?.join("sys");
        if root.exists() {
            std::fs::remove_dir_all(&root)?;
        }
        let gpu = root.join(gpu_dir());
        for sub in ["p2pmem", "p2plab-gpu/p2plab-gpu0"] {
            std::fs::create_dir_all(gpu.join(sub))?;
        }
        std::fs::create_dir_all(root.join(storage_dir()))?;
        let bar = |start: u64, size: u64| {
            format!(
                "{start:#018x} {:#018x} 0x000000000014220c\n",
                start + size - 1
            )
        };
        let none = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        std::fs::write(
            gpu.join("resource"),
            format!(
                "{}{none}{}",
                bar(0xfe00_0000, 0x1000),
                bar(BAR2_START, vram_size)
            ),
        )?;
        std::fs::write(gpu.join("p2pmem/published"), "1\n")?;
        let vram_path = gpu.join("p2pmem/allocate");
        let vram = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&vram_path)?;
        vram.set_len(vram_size)?;
        let drivers = root.join("bus/pci/drivers/p2plab_gpu");
        std::fs::create_dir_all(&drivers)?;
        std::fs::create_dir_all(root.join("bus/pci/devices"))?;
        std::fs::create_dir_all(root.join("class/p2plab-gpu/p2plab-gpu0"))?;
        std::fs::create_dir_all(root.join("dev/block"))?;
        symlink(&drivers, gpu.join("driver"))?;
        symlink(&gpu, drivers.join(GPU_BDF))?;
        symlink(&gpu, root.join("bus/pci/devices").join(GPU_BDF))?;
        symlink(&gpu, root.join("class/p2plab-gpu/p2plab-gpu0/device"))?;
        Ok(Arc::new(FakeGpu {
            sysfs: root,
            vram,
            vram_path,
            vram_size,
        }))
    }

    /// The sysfs root to give a [`Driver`].
    pub fn sysfs(&self) -> &Path {
        &self.sysfs
    }

    pub fn vram_size(&self) -> u64 {
        self.vram_size
    }

    /// Puts the block device `st_dev` (a file system's device) under the
    /// GPU's switch: its files take the P2P path (O_DIRECT into the VRAM
    /// mapping) where the file system allows O_DIRECT.
    pub fn put_storage_on_pci(&self, st_dev: u64) -> io::Result<()> {
        let link = self.sysfs.join(format!(
            "dev/block/{}:{}",
            libc::major(st_dev),
            libc::minor(st_dev)
        ));
        let _ = std::fs::remove_file(&link);
        symlink(self.sysfs.join(storage_dir()), link)
    }

    /// A driver over this GPU, as the library's C ABI opens it.
    pub fn driver(self: &Arc<Self>) -> Driver {
        Driver::with_platform(&self.sysfs, Arc::clone(self) as Arc<dyn Platform>)
    }

    /// VRAM bytes at `offset`.
    pub fn read_vram(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.vram.read_exact_at(buf, offset)
    }

    pub fn write_vram(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.vram.write_all_at(data, offset)
    }
}

impl Platform for FakeGpu {
    fn open_gpu_node(&self, path: &str) -> io::Result<Box<dyn GpuNode>> {
        if path != GPU_NODE {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(Box::new(FakeNode {
            vram: self.vram.try_clone()?,
            vram_size: self.vram_size,
        }))
    }

    /// A mapping of the VRAM file at file offset F is physically at BAR2 +
    /// F, contiguous (as p2pmem pages are); anything else has no
    /// physical address the test knows.
    fn physical_address(&self, addr: u64, len: u64) -> Result<u64> {
        let maps = std::fs::read_to_string("/proc/self/maps")
            .map_err(|e| GdsError::sys(&e, "reading /proc/self/maps"))?;
        let end = addr.saturating_add(len);
        maps.lines()
            .filter_map(parse_maps_line)
            .find(|m| m.start <= addr && end <= m.end && Path::new(&m.path) == self.vram_path)
            .map(|m| BAR2_START + m.offset + (addr - m.start))
            .ok_or_else(|| {
                GdsError::new(
                    ErrorCode::PointerInvalid,
                    "not a mapping of the test GPU's VRAM",
                )
            })
    }
}

/// The test GPU's device node: INFO, and the engine's jobs on the VRAM
/// file.
#[derive(Debug)]
struct FakeNode {
    vram: File,
    vram_size: u64,
}

impl FakeNode {
    /// The VRAM range of a job operand, or the job fails as the device
    /// fails an operand outside VRAM.
    fn range(&self, job: &mut GpuJob, offset: u64) -> io::Result<(u64, usize)> {
        match offset.checked_add(job.len) {
            Some(end) if end <= self.vram_size => Ok((offset, job.len as usize)),
            _ => {
                job.status = STATUS_RANGE;
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }
}

impl GpuNode for FakeNode {
    fn info(&self, info: &mut GpuInfo) -> io::Result<()> {
        let mut pci_name = [0u8; 32];
        pci_name[..GPU_BDF.len()].copy_from_slice(GPU_BDF.as_bytes());
        *info = GpuInfo {
            version: 1,
            vendor_id: 0x1b36,
            device_id: 0x0010,
            vram_size: self.vram_size,
            vram_bus_addr: BAR2_START,
            ring_entries: 64,
            flags: INFO_P2PMEM,
            pci_name,
            ..GpuInfo::default()
        };
        Ok(())
    }

    fn submit(&self, job: &mut GpuJob) -> io::Result<()> {
        job.status = 0;
        match job.op {
            OP_COPY_TO_VRAM => {
                let (at, len) = self.range(job, job.dst)?;
                // SAFETY: the library passes `src` from a live slice of
                // `len` bytes (GpuDevice::copy_to_vram), the contract the
                // real driver's copy_from_user relies on too.
                let data = unsafe { std::slice::from_raw_parts(job.src as *const u8, len) };
                self.vram.write_all_at(data, at)
            }
            OP_COPY_FROM_VRAM => {
                let (at, len) = self.range(job, job.src)?;
                // SAFETY: `dst` comes from a live, exclusively borrowed
                // slice of `len` bytes (GpuDevice::copy_from_vram).
                let data = unsafe { std::slice::from_raw_parts_mut(job.dst as *mut u8, len) };
                self.vram.read_exact_at(data, at)
            }
            OP_FILL => {
                let (at, len) = self.range(job, job.dst)?;
                let pattern = job.pattern.to_le_bytes();
                let data: Vec<u8> = (0..len).map(|i| pattern[i % 4]).collect();
                self.vram.write_all_at(&data, at)
            }
            OP_CHECKSUM => {
                let (at, len) = self.range(job, job.src)?;
                let mut data = vec![0u8; len];
                self.vram.read_exact_at(&mut data, at)?;
                job.result = crc32c::crc32c(&data);
                Ok(())
            }
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
}
