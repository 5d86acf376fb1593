//! The p2plab GPU as the library drives it: `/dev/p2plab-gpuN` of the
//! p2plab_gpu guest driver, whose engine copies between host memory and
//! VRAM (the compat path's "cudaMemcpy") and checksums VRAM (CRC32C).
//! The structs mirror `devices/gpu/guest-driver/p2plab_gpu_uapi.h`.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{ErrorCode, GdsError, Result};

/// The driver's name under /sys/bus/pci/drivers.
pub const DRIVER_NAME: &str = "p2plab_gpu";

/// `struct p2plab_gpu_info` (96 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuInfo {
    pub version: u32,
    pub vendor_id: u16,
    pub device_id: u16,
    pub vram_size: u64,
    pub vram_bus_addr: u64,
    pub ring_entries: u32,
    pub status: u32,
    pub completed_fence: u64,
    pub submitted_fence: u64,
    pub jobs_completed: u32,
    pub jobs_failed: u32,
    pub engine_error: u32,
    pub flags: u32,
    pub pci_name: [u8; 32],
}

/// `struct p2plab_gpu_job` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuJob {
    pub op: u32,
    pub flags: u32,
    pub src: u64,
    pub dst: u64,
    pub len: u64,
    pub pattern: u32,
    pub timeout_ms: u32,
    pub fence: u64,
    pub status: u32,
    pub result: u32,
}

const _: () = assert!(std::mem::size_of::<GpuInfo>() == 96);
const _: () = assert!(std::mem::size_of::<GpuJob>() == 56);

const IOC_MAGIC: u64 = 0xb7;
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (IOC_MAGIC << 8) | nr
}
/// `_IOR(0xb7, 0, struct p2plab_gpu_info)`
const IOC_INFO: u64 = ioc(2, 0, std::mem::size_of::<GpuInfo>());
/// `_IOWR(0xb7, 1, struct p2plab_gpu_job)`
const IOC_SUBMIT: u64 = ioc(3, 1, std::mem::size_of::<GpuJob>());

/// Job operations (`P2PLAB_GPU_OP_*`).
pub const OP_COPY_TO_VRAM: u32 = 1;
pub const OP_COPY_FROM_VRAM: u32 = 2;
pub const OP_FILL: u32 = 4;
pub const OP_CHECKSUM: u32 = 5;

/// `P2PLAB_GPU_INFO_P2PMEM`: BAR2 is published as p2pmem.
pub const INFO_P2PMEM: u32 = 1;

impl GpuInfo {
    pub fn pci_name(&self) -> String {
        let end = self.pci_name.iter().position(|&b| b == 0).unwrap_or(32);
        String::from_utf8_lossy(&self.pci_name[..end]).into_owned()
    }
}

/// An open GPU device node: the p2plab_gpu driver's two ioctls. The
/// kernel's `/dev/p2plab-gpuN` is [`DevNode`]; a test GPU can stand in
/// for it (see [`crate::platform::Platform`]).
pub trait GpuNode: Send + Sync + std::fmt::Debug {
    /// `P2PLAB_GPU_IOC_INFO`: fills `info`.
    fn info(&self, info: &mut GpuInfo) -> std::io::Result<()>;
    /// `P2PLAB_GPU_IOC_SUBMIT`: runs `job`, writes back its status and
    /// result; EIO when the engine failed it. A copy's host side
    /// (`src` of COPY_TO_VRAM, `dst` of COPY_FROM_VRAM) points to `len`
    /// bytes of the caller's memory.
    fn submit(&self, job: &mut GpuJob) -> std::io::Result<()>;
}

/// `/dev/p2plab-gpuN` of the p2plab_gpu guest driver.
#[derive(Debug)]
pub struct DevNode(File);

impl DevNode {
    pub fn open(path: &str) -> std::io::Result<DevNode> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map(DevNode)
    }
}

impl GpuNode for DevNode {
    fn info(&self, info: &mut GpuInfo) -> std::io::Result<()> {
        // SAFETY: INFO writes exactly one struct p2plab_gpu_info, which
        // `info` is (size checked at compile time), into memory we own.
        let rc = unsafe {
            libc::ioctl(
                self.0.as_raw_fd(),
                IOC_INFO as libc::Ioctl,
                info as *mut GpuInfo,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn submit(&self, job: &mut GpuJob) -> std::io::Result<()> {
        // SAFETY: SUBMIT reads and writes one struct p2plab_gpu_job that
        // we own. For COPY_TO/FROM_VRAM, src/dst is a user pointer the
        // caller took from a live slice of job.len bytes (see
        // GpuDevice::copy_*); the driver copies through it with
        // copy_{from,to}_user, which validates it.
        let rc = unsafe {
            libc::ioctl(
                self.0.as_raw_fd(),
                IOC_SUBMIT as libc::Ioctl,
                job as *mut GpuJob,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// An open GPU: its device node and what INFO said about it.
#[derive(Debug)]
pub struct GpuDevice {
    dev: Box<dyn GpuNode>,
    pub bdf: String,
    pub node: String,
    pub vram_size: u64,
    pub p2pmem: bool,
}

impl GpuDevice {
    /// Opens the device node of the p2plab GPU at `bdf`.
    pub fn open(sysfs: &Path, bdf: &str) -> Result<GpuDevice> {
        Self::open_with(sysfs, bdf, &|path| {
            Ok(Box::new(DevNode::open(path)?) as Box<dyn GpuNode>)
        })
    }

    /// Like [`open`](Self::open), with `open_node` opening the device node
    /// (`/dev/p2plab-gpuN`) that sysfs names.
    pub fn open_with(
        sysfs: &Path,
        bdf: &str,
        open_node: &dyn Fn(&str) -> std::io::Result<Box<dyn GpuNode>>,
    ) -> Result<GpuDevice> {
        let class_dir = sysfs.join("bus/pci/devices").join(bdf).join("p2plab-gpu");
        let node = std::fs::read_dir(&class_dir)
            .map_err(|e| {
                GdsError::new(
                    ErrorCode::DeviceNotFound,
                    format!("{bdf} is not a p2plab GPU bound to {DRIVER_NAME} ({e})"),
                )
            })?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .find(|n| n.starts_with("p2plab-gpu"))
            .ok_or_else(|| {
                GdsError::new(
                    ErrorCode::DeviceNotFound,
                    format!("{} lists no device node", class_dir.display()),
                )
            })?;
        let path = format!("/dev/{node}");
        let node_dev =
            open_node(&path).map_err(|e| GdsError::sys(&e, format!("opening {path}")))?;
        let mut dev = GpuDevice {
            dev: node_dev,
            bdf: bdf.to_owned(),
            node: path,
            vram_size: 0,
            p2pmem: false,
        };
        let info = dev.info()?;
        if info.pci_name() != bdf {
            return Err(GdsError::new(
                ErrorCode::DeviceNotFound,
                format!("{} belongs to {}, not {bdf}", dev.node, info.pci_name()),
            ));
        }
        dev.vram_size = info.vram_size;
        dev.p2pmem = info.flags & INFO_P2PMEM != 0;
        Ok(dev)
    }

    pub fn info(&self) -> Result<GpuInfo> {
        let mut info = GpuInfo::default();
        self.dev
            .info(&mut info)
            .map_err(|e| GdsError::sys(&e, format!("{} INFO", self.node)))?;
        Ok(info)
    }

    fn submit(&self, mut job: GpuJob, what: &str) -> Result<GpuJob> {
        let Err(err) = self.dev.submit(&mut job) else {
            return Ok(job);
        };
        if err.raw_os_error() == Some(libc::EIO) {
            return Err(GdsError::new(
                ErrorCode::GpuEngineError,
                format!(
                    "GPU {} engine failed {what}: device status {:#x}",
                    self.bdf, job.status
                ),
            )
            .with_errno(libc::EIO));
        }
        Err(GdsError::sys(&err, format!("GPU {} {what}", self.bdf)))
    }

    /// Engine copy host memory -> VRAM at `vram_offset`.
    pub fn copy_to_vram(&self, vram_offset: u64, data: &[u8]) -> Result<()> {
        let job = GpuJob {
            op: OP_COPY_TO_VRAM,
            src: data.as_ptr() as u64,
            dst: vram_offset,
            len: data.len() as u64,
            ..GpuJob::default()
        };
        self.submit(job, "COPY_TO_VRAM").map(|_| ())
    }

    /// Engine copy VRAM at `vram_offset` -> host memory.
    pub fn copy_from_vram(&self, vram_offset: u64, data: &mut [u8]) -> Result<()> {
        let job = GpuJob {
            op: OP_COPY_FROM_VRAM,
            src: vram_offset,
            dst: data.as_mut_ptr() as u64,
            len: data.len() as u64,
            ..GpuJob::default()
        };
        self.submit(job, "COPY_FROM_VRAM").map(|_| ())
    }

    /// CRC32C of VRAM `[vram_offset, vram_offset + len)`, by the engine.
    pub fn checksum(&self, vram_offset: u64, len: u64) -> Result<u32> {
        let job = GpuJob {
            op: OP_CHECKSUM,
            src: vram_offset,
            len,
            ..GpuJob::default()
        };
        self.submit(job, "CHECKSUM").map(|j| j.result)
    }

    /// Engine fill of VRAM with a repeating 32-bit pattern.
    pub fn fill(&self, vram_offset: u64, len: u64, pattern: u32) -> Result<()> {
        let job = GpuJob {
            op: OP_FILL,
            dst: vram_offset,
            len,
            pattern,
            ..GpuJob::default()
        };
        self.submit(job, "FILL").map(|_| ())
    }
}

/// p2plab GPUs bound to the driver, sorted by BDF.
pub fn list_gpus(sysfs: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(sysfs.join("bus/pci/drivers").join(DRIVER_NAME))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| crate::topology::is_bdf(n))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `(start, end)` of BAR `index` of `bdf`, from its sysfs resource table.
pub fn bar_range(sysfs: &Path, bdf: &str, index: usize) -> Option<(u64, u64)> {
    let table =
        std::fs::read_to_string(sysfs.join("bus/pci/devices").join(bdf).join("resource")).ok()?;
    parse_resource_line(table.lines().nth(index)?)
}

/// One line of a sysfs `resource` file: `0x... 0x... 0x...`.
pub fn parse_resource_line(line: &str) -> Option<(u64, u64)> {
    let mut fields = line
        .split_whitespace()
        .map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok());
    let start = fields.next()??;
    let end = fields.next()??;
    (start != 0 && end > start).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        // _IOR(0xb7, 0, 96 bytes) and _IOWR(0xb7, 1, 56 bytes).
        assert_eq!(IOC_INFO, 0x8060_b700);
        assert_eq!(IOC_SUBMIT, 0xc038_b701);
    }

    #[test]
    fn resource_lines() {
        assert_eq!(
            parse_resource_line("0x0000000840000000 0x000000087fffffff 0x000000000014220c"),
            Some((0x8_4000_0000, 0x8_7fff_ffff))
        );
        assert_eq!(
            parse_resource_line("0x0000000000000000 0x0000000000000000 0x0000000000000000"),
            None
        );
        assert_eq!(parse_resource_line("garbage"), None);
    }

    #[test]
    fn pci_name_stops_at_nul() {
        let mut name = [0u8; 32];
        name[..12].copy_from_slice(b"0000:04:00.0");
        let info = GpuInfo {
            pci_name: name,
            ..GpuInfo::default()
        };
        assert_eq!(info.pci_name(), "0000:04:00.0");
    }
}
