//! The driver: opens GPUs, registers files and GPU buffers, and runs reads
//! and writes (plan, then execute), remembering which (file system, GPU)
//! pairs the kernel refused P2P for, so later calls go straight to compat.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use crate::buffer::{GpuBuffer, Refusal};
use crate::error::{ErrorCode, GdsError, Result};
use crate::exec;
use crate::file::FileHandle;
use crate::gpu::{list_gpus, GpuDevice};
use crate::plan::{plan, BufferFacts, Request, Verdict};
use crate::platform::{Kernel, Platform};
use crate::report::{IoReport, Reason};
use crate::topology::{pci_device_chain, PciChain, Relation};
use crate::vram::{locate_with, VramLocation, VramMapping};

/// Environment variable: `1` forces compat mode for every transfer
/// (like cuFile's `force_compat_mode`).
pub const ENV_FORCE_COMPAT: &str = "P2PLAB_GDS_FORCE_COMPAT";

/// What the driver knows about P2P between a file and a GPU.
#[derive(Clone, Debug)]
pub struct RouteInfo {
    pub storage: Option<PciChain>,
    pub gpu: Option<PciChain>,
    pub relation: Option<Relation>,
    pub refusal: Option<Refusal>,
}

#[derive(Debug)]
pub struct Driver {
    sysfs: PathBuf,
    platform: Arc<dyn Platform>,
    force_compat: AtomicBool,
    gpus: Mutex<HashMap<String, Arc<GpuDevice>>>,
    refusals: Mutex<HashMap<(u64, String), Refusal>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these maps leaves it consistent (every
    // update is a single insert), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Driver {
    /// Opens the driver on the real /sys, with the policy from the
    /// environment (P2PLAB_GDS_FORCE_COMPAT).
    pub fn open() -> Result<Driver> {
        let driver = Driver::with_sysfs("/sys");
        let force = std::env::var(ENV_FORCE_COMPAT).is_ok_and(|v| v == "1" || v == "yes");
        driver.set_force_compat(force);
        Ok(driver)
    }

    pub fn with_sysfs(sysfs: impl Into<PathBuf>) -> Driver {
        Self::with_platform(sysfs, Arc::new(Kernel))
    }

    /// A driver that reads `sysfs` and asks `platform` what it would ask
    /// the kernel (a test GPU's, in tests).
    pub fn with_platform(sysfs: impl Into<PathBuf>, platform: Arc<dyn Platform>) -> Driver {
        Driver {
            sysfs: sysfs.into(),
            platform,
            force_compat: AtomicBool::new(false),
            gpus: Mutex::new(HashMap::new()),
            refusals: Mutex::new(HashMap::new()),
        }
    }

    pub fn sysfs(&self) -> &Path {
        &self.sysfs
    }

    pub fn set_force_compat(&self, on: bool) {
        self.force_compat.store(on, Ordering::Relaxed);
    }

    pub fn force_compat(&self) -> bool {
        self.force_compat.load(Ordering::Relaxed)
    }

    /// p2plab GPUs bound to their driver.
    pub fn list_gpus(&self) -> Vec<String> {
        list_gpus(&self.sysfs)
    }

    /// `gpu`, or the first p2plab GPU that publishes p2pmem.
    pub fn pick_gpu(&self, gpu: Option<&str>) -> Result<String> {
        if let Some(bdf) = gpu {
            return Ok(bdf.to_owned());
        }
        let gpus = self.list_gpus();
        gpus.iter()
            .find(|bdf| {
                let published = self
                    .sysfs
                    .join("bus/pci/devices")
                    .join(bdf)
                    .join("p2pmem/published");
                std::fs::read_to_string(published).is_ok_and(|s| s.trim() == "1")
            })
            .or(gpus.first())
            .cloned()
            .ok_or_else(|| {
                GdsError::new(
                    ErrorCode::DeviceNotFound,
                    "no PCI device is bound to p2plab_gpu (is the module loaded?)",
                )
                .with_errno(libc::ENODEV)
            })
    }

    /// The open GPU at `bdf` (opened once, shared).
    pub fn gpu(&self, bdf: &str) -> Result<Arc<GpuDevice>> {
        let mut gpus = lock(&self.gpus);
        if let Some(gpu) = gpus.get(bdf) {
            return Ok(gpu.clone());
        }
        let gpu = Arc::new(GpuDevice::open_with(&self.sysfs, bdf, &|path| {
            self.platform.open_gpu_node(path)
        })?);
        gpus.insert(bdf.to_owned(), gpu.clone());
        Ok(gpu)
    }

    pub fn register_file(&self, fd: BorrowedFd<'_>) -> Result<FileHandle> {
        FileHandle::register(&self.sysfs, fd)
    }

    /// VRAM from the GPU's p2pmem (O_DIRECT-capable): the `cudaMalloc`.
    pub fn alloc_vram(&self, gpu: Option<&str>, len: u64) -> Result<VramMapping> {
        let bdf = self.pick_gpu(gpu)?;
        // Fails early and clearly when bdf is no p2plab GPU.
        self.gpu(&bdf)?;
        VramMapping::allocate(&self.sysfs, &bdf, len)
    }

    /// VRAM at `vram_offset` through /dev/p2plab-gpuN (compat only).
    pub fn map_vram(&self, gpu: Option<&str>, vram_offset: u64, len: u64) -> Result<VramMapping> {
        let bdf = self.pick_gpu(gpu)?;
        let gpu = self.gpu(&bdf)?;
        VramMapping::map_device(&gpu, vram_offset, len)
    }

    /// Registers a mapping the library made.
    pub fn register_mapping(&self, mapping: Arc<VramMapping>) -> Result<GpuBuffer> {
        let addr = mapping.as_ptr() as u64;
        let len = mapping.len() as u64;
        let location = self.locate(addr, len)?;
        let gpu = self.gpu(&location.bdf)?;
        Ok(GpuBuffer::new(addr, len, location, gpu, Some(mapping)))
    }

    /// Registers `[addr, addr + len)` of GPU memory the caller mapped
    /// (p2pmem/allocate or /dev/p2plab-gpuN).
    ///
    /// # Safety
    /// The range must stay mapped, and not be used as Rust memory, while
    /// the buffer is registered: reads write into it through the kernel
    /// and the GPU.
    pub unsafe fn register_buffer(&self, addr: *mut u8, len: u64) -> Result<GpuBuffer> {
        if addr.is_null() || len == 0 {
            return Err(GdsError::invalid("null buffer or zero size"));
        }
        let addr = addr as u64;
        let location = self.locate(addr, len)?;
        let gpu = self.gpu(&location.bdf)?;
        Ok(GpuBuffer::new(addr, len, location, gpu, None))
    }

    /// Where `[addr, addr + len)` is in VRAM.
    fn locate(&self, addr: u64, len: u64) -> Result<VramLocation> {
        locate_with(&self.sysfs, addr, len, &|addr, len| {
            self.platform.physical_address(addr, len)
        })
    }

    /// What is known about P2P between `file` and the GPU `gpu_bdf`.
    pub fn route(&self, file: &FileHandle, gpu_bdf: &str) -> RouteInfo {
        let gpu = pci_device_chain(&self.sysfs, gpu_bdf);
        let relation = match (&file.storage, &gpu) {
            (Some(s), Some(g)) => Some(Relation::between(s, g)),
            _ => None,
        };
        RouteInfo {
            storage: file.storage.clone(),
            gpu,
            relation,
            refusal: lock(&self.refusals)
                .get(&(file.st_dev, gpu_bdf.to_owned()))
                .cloned(),
        }
    }

    fn verdict(&self, file: &FileHandle, buf: &GpuBuffer) -> Verdict {
        if self.force_compat() {
            return Verdict::Compat {
                reason: Reason::Forced,
                detail: format!("compat mode is forced ({ENV_FORCE_COMPAT}=1)"),
            };
        }
        if file.storage.is_none() {
            return Verdict::Compat {
                reason: Reason::NotPciStorage,
                detail: format!(
                    "the file's device {}:{} is not a PCI device (tmpfs, 9p, loop...): \
                     nothing can DMA into the GPU",
                    libc::major(file.st_dev),
                    libc::minor(file.st_dev)
                ),
            };
        }
        match lock(&self.refusals).get(&(file.st_dev, buf.location.bdf.clone())) {
            Some(r) => Verdict::Compat {
                reason: r.reason,
                detail: r.detail.clone(),
            },
            None => Verdict::Try,
        }
    }

    /// Classifies and remembers a refused P2P attempt.
    pub(crate) fn refused(&self, file: &FileHandle, buf: &GpuBuffer, errno: i32) -> Refusal {
        let route = self.route(file, &buf.location.bdf);
        let err = std::io::Error::from_raw_os_error(errno);
        let storage = route
            .storage
            .as_ref()
            .map(|c| c.device().to_owned())
            .unwrap_or_default();
        let refusal = match &route.relation {
            Some(rel @ (Relation::HostBridgeOnly { .. } | Relation::NoCommonHostBridge)) => {
                Refusal {
                    reason: Reason::Topology,
                    errno,
                    detail: format!(
                        "the kernel refused P2P between storage {storage} and GPU {} ({err}): {}",
                        buf.location.bdf,
                        rel.describe()
                    ),
                }
            }
            _ => Refusal {
                reason: Reason::FsRefused,
                errno,
                detail: format!(
                    "O_DIRECT into GPU memory failed on this file system ({err}); storage \
                     {storage} and GPU {} are {}",
                    buf.location.bdf,
                    route
                        .relation
                        .as_ref()
                        .map(Relation::describe)
                        .unwrap_or_else(|| "of unknown topology".to_owned())
                ),
            },
        };
        lock(&self.refusals).insert((file.st_dev, buf.location.bdf.clone()), refusal.clone());
        refusal
    }

    /// Reads `size` bytes at `file_offset` into the buffer at `buf_offset`.
    pub fn read(
        &self,
        file: &FileHandle,
        buf: &GpuBuffer,
        size: u64,
        file_offset: u64,
        buf_offset: u64,
    ) -> Result<IoReport> {
        self.transfer(false, file, buf, size, file_offset, buf_offset)
    }

    /// Writes `size` bytes of the buffer at `buf_offset` to `file_offset`.
    pub fn write(
        &self,
        file: &FileHandle,
        buf: &GpuBuffer,
        size: u64,
        file_offset: u64,
        buf_offset: u64,
    ) -> Result<IoReport> {
        self.transfer(true, file, buf, size, file_offset, buf_offset)
    }

    fn transfer(
        &self,
        write: bool,
        file: &FileHandle,
        buf: &GpuBuffer,
        size: u64,
        file_offset: u64,
        buf_offset: u64,
    ) -> Result<IoReport> {
        buf.check_range(buf_offset, size)?;
        if size > isize::MAX as u64
            || file_offset
                .checked_add(size)
                .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(GdsError::invalid("offset + size overflows a file offset"));
        }
        if write && !file.writable || !write && !file.readable {
            return Err(GdsError::new(
                ErrorCode::IoNotSupported,
                format!(
                    "the handle was opened {}",
                    if write { "read-only" } else { "write-only" }
                ),
            )
            .with_errno(libc::EBADF));
        }
        let req = Request {
            write,
            file_offset,
            buf_offset,
            len: size,
        };
        let facts = file.facts()?;
        let buffer = BufferFacts {
            addr: buf.addr,
            p2pmem: buf.p2pmem(),
        };
        let verdict = self.verdict(file, buf);
        let holes = |start, end| file.holes(start, end);
        let planned = plan(&req, &facts, &buffer, &verdict, &holes);
        exec::execute(file, buf, &req, planned, &|errno| {
            self.refused(file, buf, errno)
        })
    }
}
