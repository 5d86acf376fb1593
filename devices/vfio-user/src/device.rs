//! The contract between the vfio-user transport and a device model.
//!
//! The transport owns the socket and calls these methods on its connection
//! thread. An implementation must never block on guest DMA inside them: QEMU
//! holds its global lock while a vCPU waits for the reply to a trapped access,
//! and it serves our DMA_READ/DMA_WRITE requests under that same lock.
//! Long work (command processing) belongs on the device's own threads, which
//! use [`crate::DmaSpace`] freely.

use std::os::fd::RawFd;

use vmm_sys_util::eventfd::EventFd;

/// An error a device returns for a client request. The transport turns it
/// into an error reply carrying `errno`; the stream stays in sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} (errno {errno})")]
pub struct DeviceError {
    pub errno: i32,
    pub what: &'static str,
}

impl DeviceError {
    pub const fn new(errno: i32, what: &'static str) -> Self {
        Self { errno, what }
    }
    pub const fn invalid(what: &'static str) -> Self {
        Self::new(libc::EINVAL, what)
    }
}

/// Answer to VFIO_USER_DEVICE_GET_INFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// VFIO_DEVICE_FLAGS_* (PCI, RESET).
    pub flags: u32,
    pub num_regions: u32,
    pub num_irqs: u32,
}

/// A part of a region QEMU may mmap from the region's fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapArea {
    /// Offset inside the region.
    pub offset: u64,
    pub size: u64,
}

/// Answer to VFIO_USER_DEVICE_GET_REGION_INFO for one index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// VFIO_REGION_INFO_FLAG_* (READ, WRITE, MMAP, CAPS).
    pub flags: u32,
    pub size: u64,
    /// File that backs the mmappable areas; sent with SCM_RIGHTS. The device
    /// keeps ownership; the transport only borrows it while sending.
    pub fd: Option<RawFd>,
    /// Offset of the region's start inside `fd`.
    pub fd_offset: u64,
    /// Sparse-mmap areas; empty with an fd means the whole region.
    pub mmap_areas: Vec<MmapArea>,
}

/// Answer to VFIO_USER_DEVICE_GET_IRQ_INFO for one index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IrqInfo {
    /// VFIO_IRQ_INFO_* (EVENTFD, MASKABLE, AUTOMASKED, NORESIZE).
    pub flags: u32,
    pub count: u32,
}

/// What VFIO_USER_DEVICE_SET_IRQS asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IrqAction {
    Mask,
    Unmask,
    Trigger,
}

/// The data part of a SET_IRQS request, already decoded and checked by the
/// transport (counts match, fds received).
#[derive(Debug)]
pub enum IrqData {
    /// DATA_NONE: act on every vector in the range.
    None,
    /// DATA_BOOL: act on the vectors whose flag is set.
    Bool(Vec<bool>),
    /// DATA_EVENTFD: one entry per vector; `None` (fd -1) unbinds it.
    /// With count 0 and DATA_NONE|ACTION_TRIGGER the transport sends
    /// `EventFds(vec![])` with `count == 0`, which means "disable all".
    EventFds(Vec<Option<EventFd>>),
}

#[derive(Debug)]
pub struct IrqSet {
    pub index: u32,
    pub action: IrqAction,
    pub start: u32,
    pub count: u32,
    pub data: IrqData,
}

/// A device model as the transport sees it: regions, interrupts, reset.
pub trait Device: Send {
    fn device_info(&self) -> DeviceInfo;
    fn region_info(&self, index: u32) -> Result<RegionInfo, DeviceError>;
    fn irq_info(&self, index: u32) -> Result<IrqInfo, DeviceError>;
    /// A trapped read. `data.len()` is the access size; the transport has
    /// already checked that `offset + len` fits in the region.
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError>;
    /// A trapped write, posted or not.
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError>;
    fn set_irqs(&mut self, request: IrqSet) -> Result<(), DeviceError>;
    /// VFIO_USER_DEVICE_RESET, and also called when a client disconnects.
    fn reset(&mut self) -> Result<(), DeviceError>;
    /// A DMA range was added or removed; the [`crate::DmaSpace`] is already
    /// updated when this is called. Most devices need not care.
    fn dma_changed(&mut self) {}
}
