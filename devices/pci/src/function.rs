//! A PCI function served over vfio-user: config space, BARs and interrupts
//! routed between the transport and a device model.
//!
//! Region indices follow vfio-pci: 0..=5 are BARs, 6 the expansion ROM, 7
//! config space, 8 VGA. IRQ indices: INTx, MSI, MSI-X, ERR, REQ.

use std::ops::Range;
use std::os::fd::RawFd;
use std::sync::Arc;

use p2plab_vfio_user::{Device, DeviceError, DeviceInfo, IrqInfo, IrqSet, MmapArea, RegionInfo};
use tracing::{debug, trace};
use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS, VFIO_REGION_INFO_FLAG_CAPS,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};

use crate::config::{BuildError, ConfigChange, ConfigSpace};
use crate::interrupt::InterruptController;
use crate::msix::MsixAccessError;
use crate::regs;

/// Page size the mmappable areas are trimmed to (QEMU maps whole pages).
const PAGE_SIZE: u64 = 4096;

/// A file that backs (part of) a BAR, so the client can mmap it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarBacking {
    /// Owned by the model; must stay open while the function lives.
    pub fd: RawFd,
    /// Where BAR offset 0 is in the file.
    pub fd_offset: u64,
    /// Mappable parts of the BAR; empty = the whole BAR.
    pub areas: Vec<MmapArea>,
}

/// The device-specific part of a PCI function. Plain state machine: the
/// [`PciFunction`] calls it on the socket thread. BAR accesses that hit the
/// MSI-X table or PBA never reach it.
pub trait PciModel: Send {
    /// A trapped read of `data.len()` bytes at `offset` in BAR `bar`; the
    /// access is inside the BAR.
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), DeviceError>;
    /// A trapped write.
    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), DeviceError>;
    /// Device reset (DEVICE_RESET, or the client went away). Config space
    /// and interrupts are already back to power-on state when this runs:
    /// COMMAND is 0 (no decode, no bus mastering), BARs are unprogrammed,
    /// MSI-X is off and every eventfd is dropped. No `ConfigChange` is sent
    /// for that; the model drops whatever it derived from them.
    ///
    /// Must return only once the model's DMA is quiesced: every access its
    /// threads started has finished or failed, and none starts again until
    /// the guest sets Bus Master Enable and restarts the device. DMA is
    /// fenced by the transport meanwhile, so waiting for workers blocked in
    /// DMA cannot deadlock (see [`p2plab_vfio_user::Device::reset`]). A
    /// model that cannot quiesce in bounded time returns an error, which
    /// the client gets as the reset's answer.
    fn reset(&mut self) -> Result<(), DeviceError>;
    /// The guest changed something in config space.
    fn config_changed(&mut self, _change: &ConfigChange) {}
    /// A file backing BAR `bar`, to let the client mmap it.
    fn bar_backing(&self, _bar: u8) -> Option<BarBacking> {
        None
    }
    /// The client's DMA map changed.
    fn dma_changed(&mut self) {}
}

/// A PCI function: [`ConfigSpace`] + [`InterruptController`] + a model.
/// Implements the transport's [`Device`].
pub struct PciFunction<M: PciModel> {
    config: ConfigSpace,
    irq: Arc<InterruptController>,
    model: M,
}

fn access_error(error: MsixAccessError) -> DeviceError {
    match error {
        MsixAccessError::BadSize { .. } => {
            DeviceError::invalid("bad MSI-X access size or alignment")
        }
        MsixAccessError::OutOfRange { .. } => DeviceError::invalid("MSI-X access out of range"),
    }
}

/// Where a BAR access lands.
enum BarTarget {
    /// In the MSI-X table, at this offset inside it.
    MsixTable(u64),
    /// In the MSI-X Pending Bit Array, at this offset inside it.
    MsixPba(u64),
    /// Anywhere else: the model serves it.
    Model,
}

impl<M: PciModel> PciFunction<M> {
    /// Builds the interrupt controller from `config` (MSI-X vectors, INTx
    /// pin) and hands it to `make_model`, so the model's workers can notify.
    pub fn new(
        config: ConfigSpace,
        make_model: impl FnOnce(Arc<InterruptController>) -> M,
    ) -> Self {
        let irq = InterruptController::for_config(&config);
        let model = make_model(Arc::clone(&irq));
        Self { config, irq, model }
    }

    /// For a model built before the function: `irq` must come from
    /// [`InterruptController::for_config`] on the same `config`.
    pub fn from_parts(
        config: ConfigSpace,
        irq: Arc<InterruptController>,
        model: M,
    ) -> Result<Self, BuildError> {
        let vectors = config.msix().map_or(0, |m| m.vectors);
        if irq.msix_vectors() != vectors || irq.intx_pin() != config.interrupt_pin() {
            return Err(BuildError(
                "interrupt controller does not match the config space".into(),
            ));
        }
        Ok(Self { config, irq, model })
    }

    /// The function's config space.
    pub fn config(&self) -> &ConfigSpace {
        &self.config
    }

    /// The function's interrupts (the model holds a clone to notify).
    pub fn irq(&self) -> &Arc<InterruptController> {
        &self.irq
    }

    /// The device model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The device model, to set it up after the function is built.
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    /// The BAR a region index names, with the access checked to fit in it.
    fn bar_access(&self, index: u32, offset: u64, len: usize) -> Result<(u8, u64), DeviceError> {
        let bar = u8::try_from(index).map_err(|_| DeviceError::invalid("no such region"))?;
        let size = self
            .config
            .bar_size(usize::from(bar))
            .ok_or_else(|| DeviceError::invalid("BAR not implemented"))?;
        if len == 0 {
            return Err(DeviceError::invalid("empty BAR access"));
        }
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| DeviceError::invalid("BAR access overflows"))?;
        if end > size {
            return Err(DeviceError::invalid("BAR access beyond the BAR"));
        }
        Ok((bar, size))
    }

    /// Whether `[offset, offset+len)` in `bar` hits the MSI-X table or PBA.
    fn bar_target(&self, bar: u8, offset: u64, len: u64) -> Result<BarTarget, DeviceError> {
        let Some(msix) = self.config.msix() else {
            return Ok(BarTarget::Model);
        };
        let access = offset..offset + len;
        // Where the access lands in one structure (`at` bytes into BAR
        // `bir`), or an error if it hangs over the structure's edge.
        let locate = |bir: u8, at: u32, size: u64, target: fn(u64) -> BarTarget| {
            if bir != bar {
                return Ok(None);
            }
            let range = u64::from(at)..u64::from(at) + size;
            if access.start >= range.start && access.end <= range.end {
                return Ok(Some(target(access.start - range.start)));
            }
            if access.start < range.end && range.start < access.end {
                return Err(DeviceError::invalid("access straddles the MSI-X structure"));
            }
            Ok(None)
        };
        let table = locate(
            msix.table_bar,
            msix.table_offset,
            msix.table_len(),
            BarTarget::MsixTable,
        )?;
        if let Some(target) = table {
            return Ok(target);
        }
        let pba = locate(
            msix.pba_bar,
            msix.pba_offset,
            msix.pba_len(),
            BarTarget::MsixPba,
        )?;
        if let Some(target) = pba {
            return Ok(target);
        }
        Ok(BarTarget::Model)
    }

    /// Trims the model's mmappable areas so no page holding the MSI-X
    /// table or PBA is mapped: those accesses must trap.
    fn mmap_areas(&self, bar: u8, size: u64, areas: &[MmapArea]) -> Vec<MmapArea> {
        let mut holes: Vec<Range<u64>> = Vec::new();
        if let Some(msix) = self.config.msix() {
            let page_span = |start: u64, len: u64| {
                let first = start / PAGE_SIZE * PAGE_SIZE;
                let end = (start + len).div_ceil(PAGE_SIZE) * PAGE_SIZE;
                first..end
            };
            if msix.table_bar == bar {
                holes.push(page_span(u64::from(msix.table_offset), msix.table_len()));
            }
            if msix.pba_bar == bar {
                holes.push(page_span(u64::from(msix.pba_offset), msix.pba_len()));
            }
        }
        let whole = [MmapArea { offset: 0, size }];
        let wanted = if areas.is_empty() { &whole[..] } else { areas };
        let mut pieces: Vec<Range<u64>> = wanted
            .iter()
            .filter_map(|a| {
                let end = a.offset.checked_add(a.size)?.min(size);
                (a.offset < end).then_some(a.offset..end)
            })
            .collect();
        for hole in holes {
            pieces = pieces
                .into_iter()
                .flat_map(|piece| {
                    let before = piece.start..piece.end.min(hole.start);
                    let after = piece.start.max(hole.end)..piece.end;
                    [before, after].into_iter().filter(|r| r.start < r.end)
                })
                .collect();
        }
        pieces
            .into_iter()
            .map(|r| MmapArea {
                offset: r.start,
                size: r.end - r.start,
            })
            .collect()
    }

    fn apply_config_changes(&mut self, changes: Vec<ConfigChange>) {
        for change in &changes {
            match change {
                ConfigChange::CommandChanged { old, new } => {
                    debug!(
                        old = format_args!("{:#06x}", old.0),
                        new = format_args!("{:#06x}", new.0),
                        memory = new.memory_enabled(),
                        bus_master = new.bus_master(),
                        "COMMAND changed"
                    );
                    if old.intx_disabled() != new.intx_disabled() {
                        self.irq.set_intx_disabled(new.intx_disabled());
                    }
                }
                ConfigChange::MsixControlChanged(control) => self.irq.set_msix_control(*control),
                _ => {}
            }
            self.model.config_changed(change);
        }
    }
}

impl<M: PciModel> Device for PciFunction<M> {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
            num_regions: VFIO_PCI_NUM_REGIONS,
            num_irqs: VFIO_PCI_NUM_IRQS,
        }
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo, DeviceError> {
        let empty = RegionInfo {
            flags: 0,
            size: 0,
            fd: None,
            fd_offset: 0,
            mmap_areas: Vec::new(),
        };
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        match index {
            0..=5 => {
                let bar = index as u8;
                let Some(size) = self.config.bar_size(usize::from(bar)) else {
                    return Ok(empty);
                };
                let mut info = RegionInfo {
                    flags: rw,
                    size,
                    ..empty
                };
                if let Some(backing) = self.model.bar_backing(bar) {
                    let areas = self.mmap_areas(bar, size, &backing.areas);
                    if !areas.is_empty() {
                        info.flags |= VFIO_REGION_INFO_FLAG_MMAP | VFIO_REGION_INFO_FLAG_CAPS;
                        info.fd = Some(backing.fd);
                        info.fd_offset = backing.fd_offset;
                        info.mmap_areas = areas;
                    }
                }
                Ok(info)
            }
            VFIO_PCI_CONFIG_REGION_INDEX => Ok(RegionInfo {
                flags: rw,
                size: regs::CONFIG_SPACE_SIZE as u64,
                ..empty
            }),
            6 | 8 => Ok(empty),
            _ => Err(DeviceError::invalid("no such region")),
        }
    }

    fn irq_info(&self, index: u32) -> Result<IrqInfo, DeviceError> {
        self.irq.irq_info(index)
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        if index == VFIO_PCI_CONFIG_REGION_INDEX {
            self.config
                .read(offset, data)
                .map_err(|_| DeviceError::invalid("config read out of range"))?;
            trace!(
                offset,
                len = data.len(),
                register = self.config.register_name(offset as usize),
                "config read"
            );
            return Ok(());
        }
        let (bar, _) = self.bar_access(index, offset, data.len())?;
        match self.bar_target(bar, offset, data.len() as u64)? {
            BarTarget::MsixTable(at) => self.irq.msix_table_read(at, data).map_err(access_error),
            BarTarget::MsixPba(at) => self.irq.msix_pba_read(at, data).map_err(access_error),
            BarTarget::Model => self.model.bar_read(bar, offset, data),
        }
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        if index == VFIO_PCI_CONFIG_REGION_INDEX {
            let changes = self
                .config
                .write(offset, data)
                .map_err(|_| DeviceError::invalid("config write out of range"))?;
            self.apply_config_changes(changes);
            return Ok(());
        }
        let (bar, _) = self.bar_access(index, offset, data.len())?;
        match self.bar_target(bar, offset, data.len() as u64)? {
            BarTarget::MsixTable(at) => {
                debug!(at, len = data.len(), "MSI-X table write");
                self.irq.msix_table_write(at, data).map_err(access_error)
            }
            BarTarget::MsixPba(at) => self.irq.msix_pba_write(at, data).map_err(access_error),
            BarTarget::Model => self.model.bar_write(bar, offset, data),
        }
    }

    fn set_irqs(&mut self, request: IrqSet) -> Result<(), DeviceError> {
        self.irq.set_irqs(request)
    }

    fn reset(&mut self) -> Result<(), DeviceError> {
        debug!("function reset");
        self.config.reset();
        self.irq.reset();
        self.model.reset()
    }

    fn dma_changed(&mut self) {
        self.model.dma_changed();
    }
}
