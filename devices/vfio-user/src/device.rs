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
    /// The errno sent to the client (a positive value, e.g. `libc::EINVAL`).
    pub errno: i32,
    /// What went wrong, for the server's log.
    pub what: &'static str,
}

impl DeviceError {
    /// An error with a chosen errno.
    pub const fn new(errno: i32, what: &'static str) -> Self {
        Self { errno, what }
    }
    /// EINVAL: the request itself is wrong (the most common refusal).
    pub const fn invalid(what: &'static str) -> Self {
        Self::new(libc::EINVAL, what)
    }
}

/// Answer to VFIO_USER_DEVICE_GET_INFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// VFIO_DEVICE_FLAGS_* (PCI, RESET).
    pub flags: u32,
    /// Number of region indexes (9 for a vfio-pci device: 6 BARs, ROM,
    /// config, VGA); region requests beyond it are refused.
    pub num_regions: u32,
    /// Number of IRQ indexes (5 for vfio-pci: INTx, MSI, MSI-X, ERR, REQ).
    pub num_irqs: u32,
}

/// A part of a region QEMU may mmap from the region's fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapArea {
    /// Offset inside the region.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
}

/// Answer to VFIO_USER_DEVICE_GET_REGION_INFO for one index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// VFIO_REGION_INFO_FLAG_* (READ, WRITE, MMAP, CAPS).
    pub flags: u32,
    /// Region size in bytes; 0 for an index the device does not implement.
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
    /// Number of vectors behind this index.
    pub count: u32,
}

/// What VFIO_USER_DEVICE_SET_IRQS asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IrqAction {
    /// ACTION_MASK: hold the selected vectors back (they become pending).
    Mask,
    /// ACTION_UNMASK: let them through again (pending ones fire).
    Unmask,
    /// ACTION_TRIGGER: bind eventfds (DATA_EVENTFD) or fire the vectors.
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

/// A decoded VFIO_USER_DEVICE_SET_IRQS request. The transport has checked
/// that `start + count` fits the index's vectors and that `data` holds
/// `count` entries (except for the "disable all" form, see [`IrqData`]).
#[derive(Debug)]
pub struct IrqSet {
    /// The IRQ index (for vfio-pci: `VFIO_PCI_MSIX_IRQ_INDEX` and so on).
    pub index: u32,
    /// What to do with the vectors.
    pub action: IrqAction,
    /// First vector acted on.
    pub start: u32,
    /// Number of vectors acted on.
    pub count: u32,
    /// Which vectors, or which eventfds to bind to them.
    pub data: IrqData,
}

/// A device model as the transport sees it: regions, interrupts, reset.
pub trait Device: Send {
    /// Answer to DEVICE_GET_INFO; also bounds the region and IRQ indexes
    /// the transport lets through.
    fn device_info(&self) -> DeviceInfo;
    /// Answer to GET_REGION_INFO for `index` (below `num_regions`).
    fn region_info(&self, index: u32) -> Result<RegionInfo, DeviceError>;
    /// Answer to GET_IRQ_INFO for `index` (below `num_irqs`).
    fn irq_info(&self, index: u32) -> Result<IrqInfo, DeviceError>;
    /// A trapped read. `data.len()` is the access size; the transport has
    /// already checked that `offset + len` fits in the region.
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError>;
    /// A trapped write, posted or not.
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError>;
    /// A checked SET_IRQS request: bind eventfds, mask, unmask or fire.
    fn set_irqs(&mut self, request: IrqSet) -> Result<(), DeviceError>;
    /// VFIO_USER_DEVICE_RESET, and also called when a client disconnects.
    ///
    /// **Quiesce contract.** Return only once the device has quiesced its
    /// DMA: every access it started through the [`crate::DmaSpace`] (on
    /// any of its threads) has finished or failed, and it starts no new
    /// one until the client programs it again (for PCI: the guest sets Bus
    /// Master Enable and restarts the device). The transport answers
    /// DEVICE_RESET, and serves the next client after a disconnect, right
    /// after this returns, and the client may then reuse the memory; a
    /// late DMA would corrupt it.
    ///
    /// The transport makes this possible without deadlock: while `reset`
    /// runs, DMA to client memory is fenced. New accesses fail with
    /// [`DmaError::Revoked`](crate::DmaError::Revoked) (after a
    /// disconnect: the ranges are gone), and a device thread waiting for a
    /// DMA_READ/DMA_WRITE reply (which only the thread calling `reset`
    /// could route) fails at once. So `reset` may stop its workers and
    /// wait for them; a worker must treat a failed DMA as the end of its
    /// command, not retry it.
    fn reset(&mut self) -> Result<(), DeviceError>;
    /// A DMA range was added or removed; the [`crate::DmaSpace`] is already
    /// updated when this is called, and no device access to a removed
    /// range is still running. Most devices need not care.
    fn dma_changed(&mut self) {}
}
