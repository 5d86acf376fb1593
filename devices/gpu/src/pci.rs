//! The GPU as a PCI function: config space (identity, BARs, capabilities)
//! and the glue between [`Gpu`] and p2plab-pci's [`PciFunction`].

use std::io;
use std::sync::{Arc, OnceLock};

use p2plab_pci::{
    BarBacking, BarSpec, BuildError, ConfigChange, ConfigSpace, ConfigSpaceBuilder, Delivery,
    InterruptController, LinkSpeed, MsixCapSpec, PciFunction, PciModel, PcieCapSpec,
};
use p2plab_vfio_user::{DeviceError, DmaSpace, LocalMemory, LocalWindowId};

use crate::model::{DmaError, Gpu, GuestMemory, InterruptSink};
use crate::regs::*;
use crate::vram::Vram;

/// Why the PCI function could not be built.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("bad PCI configuration: {0}")]
    Config(String),
    #[error("cannot start the engine thread: {0}")]
    Thread(#[source] io::Error),
}

/// The PCI identity of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuIds {
    pub vendor_id: u16,
    pub device_id: u16,
    pub subsystem_vendor_id: u16,
    pub subsystem_id: u16,
}

impl Default for GpuIds {
    fn default() -> Self {
        Self {
            vendor_id: DEFAULT_VENDOR_ID,
            device_id: DEFAULT_DEVICE_ID,
            subsystem_vendor_id: DEFAULT_VENDOR_ID,
            subsystem_id: DEFAULT_DEVICE_ID,
        }
    }
}

/// Config space: class 0x0302, BAR0 registers, BAR2 VRAM (64-bit
/// prefetchable), BAR4 MSI-X, Power Management, MSI-X and a PCIe endpoint
/// capability that looks like a Gen4 x16 card.
pub fn config_space(ids: &GpuIds, vram_size: u64) -> Result<ConfigSpace, BuildError> {
    ConfigSpaceBuilder::new(ids.vendor_id, ids.device_id)
        .subsystem(ids.subsystem_vendor_id, ids.subsystem_id)
        .class_code(
            (CLASS_CODE >> 16) as u8,
            (CLASS_CODE >> 8) as u8,
            CLASS_CODE as u8,
        )
        .revision(1)
        .bar(usize::from(REGS_BAR), BarSpec::memory32(REGS_BAR_SIZE))
        .bar(
            usize::from(VRAM_BAR),
            BarSpec::memory64(vram_size).prefetchable(),
        )
        .bar(usize::from(MSIX_BAR), BarSpec::memory32(MSIX_BAR_SIZE))
        .power_management()
        .msix(MsixCapSpec {
            vectors: MSIX_VECTORS,
            table_bar: MSIX_BAR,
            table_offset: MSIX_TABLE_OFFSET,
            pba_bar: MSIX_BAR,
            pba_offset: MSIX_PBA_OFFSET,
        })
        .pcie(PcieCapSpec {
            link_speed: LinkSpeed::Gen4,
            link_width: 16,
            max_payload_size: 256,
        })
        .build()
}

/// Forwards engine interrupts to the function's interrupt controller, which
/// exists only once the [`PciFunction`] is built (after the model).
#[derive(Debug, Default)]
struct LateInterrupts(OnceLock<Arc<InterruptController>>);

impl InterruptSink for LateInterrupts {
    fn notify(&self, vector: u16) {
        match self.0.get().map(|irq| irq.notify(vector)) {
            Some(Delivery::Signalled) => tracing::trace!(vector, "MSI-X sent"),
            Some(Delivery::Pending) => tracing::debug!(vector, "interrupt pending (masked)"),
            Some(Delivery::Dropped) | None => {
                tracing::debug!(vector, "interrupt dropped: no MSI-X/INTx enabled and bound")
            }
        }
    }
}

/// The engine's path to guest memory in the server: the vfio-user DMA
/// address space (mmapped guest RAM, messages for peer BARs).
#[derive(Debug, Clone)]
pub struct DmaSpaceMemory(pub DmaSpace);

impl GuestMemory for DmaSpaceMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.0.read(gpa, buf).map_err(|e| DmaError {
            gpa,
            len: buf.len() as u64,
            reason: e.to_string(),
        })
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), DmaError> {
        self.0.write(gpa, buf).map_err(|e| DmaError {
            gpa,
            len: buf.len() as u64,
            reason: e.to_string(),
        })
    }
}

/// VRAM as a DMA local window: engine DMA whose host address lands in our
/// own BAR2 is served from the memfd instead of a round trip through QEMU.
impl LocalMemory for Vram {
    fn size(&self) -> u64 {
        Vram::size(self)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), p2plab_vfio_user::DmaError> {
        self.read(offset, buf)
            .map_err(|e| window_error(self, offset, buf.len(), &e))
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), p2plab_vfio_user::DmaError> {
        self.write(offset, data)
            .map_err(|e| window_error(self, offset, data.len(), &e))
    }
}

fn window_error(vram: &Vram, offset: u64, len: usize, e: &io::Error) -> p2plab_vfio_user::DmaError {
    if vram.contains(offset, len as u64) {
        p2plab_vfio_user::DmaError::Io(e.to_string())
    } else {
        p2plab_vfio_user::DmaError::OutOfBounds {
            offset,
            len: len as u64,
            size: vram.size(),
        }
    }
}

/// Keeps BAR2's local window in the DMA space where the guest put BAR2.
#[derive(Debug)]
struct VramWindow {
    dma: DmaSpace,
    id: Option<LocalWindowId>,
}

/// [`Gpu`] seen through p2plab-pci's [`PciModel`].
#[derive(Debug)]
pub struct GpuFunction {
    gpu: Gpu,
    /// Where the guest placed BAR2 (None while unprogrammed or decode off).
    vram_address: Option<u64>,
    window: Option<VramWindow>,
}

impl GpuFunction {
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Guest-physical address of VRAM, if the BAR is placed and decoding.
    pub fn vram_address(&self) -> Option<u64> {
        self.vram_address
    }

    /// From now on, keep VRAM mapped as a local window of `dma` at BAR2's
    /// guest address, so engine DMA to our own BAR stays in this process.
    pub fn serve_vram_locally(&mut self, dma: DmaSpace) {
        self.window = Some(VramWindow { dma, id: None });
        self.update_window();
    }

    fn update_window(&mut self) {
        let Some(window) = self.window.as_mut() else {
            return;
        };
        let size = self.gpu.vram().size();
        let result = match (window.id, self.vram_address) {
            (Some(id), Some(gpa)) => window.dma.move_local_window(id, gpa),
            (None, Some(gpa)) => window
                .dma
                .add_local_window(gpa, size, self.gpu.vram_handle(), 0)
                .map(|id| window.id = Some(id)),
            (Some(id), None) => {
                window.dma.remove_local_window(id);
                window.id = None;
                Ok(())
            }
            (None, None) => Ok(()),
        };
        if let Err(e) = result {
            // Engine DMA to our BAR then goes through the client instead.
            tracing::warn!(error = %e, "cannot place the VRAM DMA window");
        }
    }
}

/// Builds the whole PCI function around `vram`; the engine reaches guest
/// memory through `memory`.
pub fn gpu_function(
    ids: &GpuIds,
    vram: Vram,
    memory: Arc<dyn GuestMemory>,
) -> Result<PciFunction<GpuFunction>, GpuError> {
    let config = config_space(ids, vram.size()).map_err(|e| GpuError::Config(e.0))?;
    let irq = Arc::new(LateInterrupts::default());
    let gpu = Gpu::new(vram, memory, irq.clone()).map_err(GpuError::Thread)?;
    let function = PciFunction::new(config, |controller| {
        // The cell is fresh, so this cannot fail; ignore the impossible.
        let _ = irq.0.set(controller);
        GpuFunction {
            gpu,
            vram_address: None,
            window: None,
        }
    });
    Ok(function)
}

impl PciModel for GpuFunction {
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        match bar {
            REGS_BAR => {
                self.gpu.regs_read(offset, data);
                Ok(())
            }
            // QEMU maps VRAM; these only come from a client that did not.
            VRAM_BAR => self
                .gpu
                .vram()
                .read(offset, data)
                .map_err(|e| io_error("VRAM read failed", &e)),
            _ => Err(DeviceError::invalid("no such BAR")),
        }
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        match bar {
            REGS_BAR => {
                self.gpu.regs_write(offset, data);
                Ok(())
            }
            VRAM_BAR => self
                .gpu
                .vram()
                .write(offset, data)
                .map_err(|e| io_error("VRAM write failed", &e)),
            _ => Err(DeviceError::invalid("no such BAR")),
        }
    }

    fn reset(&mut self) {
        // Config space is already back to power-on: COMMAND is 0.
        self.gpu.set_bus_master(false);
        self.gpu.reset();
        self.vram_address = None;
        self.update_window();
    }

    fn config_changed(&mut self, change: &ConfigChange) {
        match change {
            ConfigChange::CommandChanged { new, .. } => self.gpu.set_bus_master(new.bus_master()),
            ConfigChange::BarMoved { index, new, .. } if *index == VRAM_BAR => {
                tracing::info!(address = ?new.map(|a| format!("{a:#x}")), "VRAM BAR placed");
                self.vram_address = *new;
                self.update_window();
            }
            _ => {}
        }
    }

    fn bar_backing(&self, bar: u8) -> Option<BarBacking> {
        (bar == VRAM_BAR).then(|| BarBacking {
            fd: self.gpu.vram().raw_fd(),
            fd_offset: 0,
            areas: Vec::new(),
        })
    }
}

fn io_error(what: &'static str, error: &io::Error) -> DeviceError {
    DeviceError::new(error.raw_os_error().unwrap_or(libc::EIO), what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DmaError;
    use p2plab_vfio_user::{Device, IrqAction, IrqData, IrqSet};
    use vfio_bindings::bindings::vfio::{
        VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
    };
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    struct NoMemory;
    impl GuestMemory for NoMemory {
        fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), DmaError> {
            Err(DmaError {
                gpa,
                len: buf.len() as u64,
                reason: "none".into(),
            })
        }
        fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), DmaError> {
            Err(DmaError {
                gpa,
                len: buf.len() as u64,
                reason: "none".into(),
            })
        }
    }

    fn function(vram_size: u64) -> PciFunction<GpuFunction> {
        gpu_function(
            &GpuIds::default(),
            Vram::new(vram_size).unwrap(),
            Arc::new(NoMemory),
        )
        .unwrap()
    }

    fn cfg_read32(f: &mut PciFunction<GpuFunction>, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        f.region_read(VFIO_PCI_CONFIG_REGION_INDEX, offset, &mut b)
            .unwrap();
        u32::from_le_bytes(b)
    }

    fn cfg_write(f: &mut PciFunction<GpuFunction>, offset: u64, data: &[u8]) {
        f.region_write(VFIO_PCI_CONFIG_REGION_INDEX, offset, data)
            .unwrap();
    }

    fn bar0_read32(f: &mut PciFunction<GpuFunction>, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        f.region_read(0, offset, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    #[test]
    fn identity_and_bars() {
        let mut f = function(1 << 30);
        assert_eq!(
            cfg_read32(&mut f, 0),
            u32::from(DEFAULT_DEVICE_ID) << 16 | u32::from(DEFAULT_VENDOR_ID)
        );
        assert_eq!(cfg_read32(&mut f, 8) >> 8, CLASS_CODE);
        // BAR2: 64-bit (type 0b10) prefetchable memory.
        assert_eq!(cfg_read32(&mut f, 0x18) & 0xf, 0b1100);
        // Size probe of the 64-bit BAR2.
        cfg_write(&mut f, 0x18, &[0xff; 4]);
        cfg_write(&mut f, 0x1c, &[0xff; 4]);
        let lo = u64::from(cfg_read32(&mut f, 0x18) & !0xf);
        let hi = u64::from(cfg_read32(&mut f, 0x1c));
        assert_eq!(!(hi << 32 | lo) + 1, 1 << 30);
        assert_eq!(f.config().bar_size(0), Some(REGS_BAR_SIZE));
        assert_eq!(f.config().bar_size(2), Some(1 << 30));
        assert_eq!(f.config().bar_size(4), Some(MSIX_BAR_SIZE));
        assert_eq!(f.config().msix().map(|m| m.vectors), Some(MSIX_VECTORS));
        assert!(f.config().capability_offset(0x10).is_some(), "PCIe cap");
    }

    #[test]
    fn custom_ids() {
        let ids = GpuIds {
            vendor_id: 0x1234,
            device_id: 0x5678,
            subsystem_vendor_id: 0x1af4,
            subsystem_id: 0x0001,
        };
        let config = config_space(&ids, 256 << 20).unwrap();
        assert_eq!((config.vendor_id(), config.device_id()), (0x1234, 0x5678));
        assert_eq!(config.read_u32(0x2c), Some(0x0001_1af4));
    }

    #[test]
    fn vram_region_is_mmappable_from_the_memfd() {
        let f = function(256 << 20);
        let info = f.region_info(2).unwrap();
        assert_eq!(info.size, 256 << 20);
        assert!(info.flags & VFIO_REGION_INFO_FLAG_MMAP != 0);
        assert_eq!(info.fd, Some(f.model().gpu().vram().raw_fd()));
        assert_eq!(info.fd_offset, 0);
        let regs = f.region_info(0).unwrap();
        assert_eq!(regs.size, REGS_BAR_SIZE);
        assert!(regs.fd.is_none(), "registers must trap");
    }

    #[test]
    fn registers_and_trapped_vram_through_the_function() {
        let mut f = function(256 << 20);
        assert_eq!(bar0_read32(&mut f, REG_ID), ID_MAGIC);
        f.region_write(0, REG_SCRATCH, &7u32.to_le_bytes()).unwrap();
        assert_eq!(bar0_read32(&mut f, REG_SCRATCH), 7);
        f.region_write(2, 4096, b"vram").unwrap();
        let mut back = [0u8; 4];
        f.region_read(2, 4096, &mut back).unwrap();
        assert_eq!(&back, b"vram");
        assert!(f.region_read(2, (256 << 20) - 2, &mut back).is_err());
    }

    #[test]
    fn bus_master_follows_the_command_register_and_reset() {
        let mut f = function(256 << 20);
        assert_eq!(bar0_read32(&mut f, REG_STATUS) & STATUS_BUS_MASTER, 0);
        cfg_write(&mut f, 4, &0x0006u16.to_le_bytes());
        assert_ne!(bar0_read32(&mut f, REG_STATUS) & STATUS_BUS_MASTER, 0);
        f.region_write(0, REG_SCRATCH, &7u32.to_le_bytes()).unwrap();
        Device::reset(&mut f).unwrap();
        assert_eq!(bar0_read32(&mut f, REG_STATUS) & STATUS_BUS_MASTER, 0);
        assert_eq!(bar0_read32(&mut f, REG_SCRATCH), 0);
    }

    #[test]
    fn vram_bar_placement_is_tracked() {
        let mut f = function(256 << 20);
        cfg_write(&mut f, 0x18, &0x8000_000cu32.to_le_bytes());
        cfg_write(&mut f, 0x1c, &0x0000_0001u32.to_le_bytes());
        cfg_write(&mut f, 4, &0x0002u16.to_le_bytes());
        assert_eq!(f.model().vram_address(), Some(0x1_8000_0000));
        cfg_write(&mut f, 4, &0x0000u16.to_le_bytes());
        assert_eq!(f.model().vram_address(), None);
    }

    #[test]
    fn vram_window_follows_the_bar() {
        use p2plab_vfio_user::DmaTarget;
        let mut f = function(256 << 20);
        let dma = DmaSpace::new();
        f.model_mut().serve_vram_locally(dma.clone());
        assert_eq!(dma.classify(0x1_8000_0000, 4096), DmaTarget::Unmapped);
        cfg_write(&mut f, 0x18, &0x8000_000cu32.to_le_bytes());
        cfg_write(&mut f, 0x1c, &0x0000_0001u32.to_le_bytes());
        cfg_write(&mut f, 4, &0x0002u16.to_le_bytes());
        assert!(matches!(
            dma.classify(0x1_8000_0000, 256 << 20),
            DmaTarget::Local(_)
        ));
        // DMA through the window lands in VRAM.
        dma.write(0x1_8000_1000, b"local").unwrap();
        let mut back = [0u8; 5];
        f.model().gpu().vram().read(0x1000, &mut back).unwrap();
        assert_eq!(&back, b"local");
        assert!(dma
            .read(0x1_8000_0000 + (256 << 20) - 2, &mut back)
            .is_err());
        // Moved by the guest.
        cfg_write(&mut f, 0x18, &0xc000_000cu32.to_le_bytes());
        assert!(matches!(
            dma.classify(0x1_c000_0000, 4096),
            DmaTarget::Local(_)
        ));
        assert_eq!(dma.classify(0x1_8000_0000, 4096), DmaTarget::Unmapped);
        // Gone on reset.
        Device::reset(&mut f).unwrap();
        assert_eq!(dma.classify(0x1_c000_0000, 4096), DmaTarget::Unmapped);
    }

    #[test]
    fn engine_interrupt_reaches_the_msix_eventfd() {
        let mut f = function(256 << 20);
        let eventfd = EventFd::new(EFD_NONBLOCK).unwrap();
        f.set_irqs(IrqSet {
            index: VFIO_PCI_MSIX_IRQ_INDEX,
            action: IrqAction::Trigger,
            start: 0,
            count: 1,
            data: IrqData::EventFds(vec![Some(eventfd.try_clone().unwrap())]),
        })
        .unwrap();
        // MSI-X enable in Message Control, memory decode + bus master.
        let cap = f.config().capability_offset(0x11).unwrap() as u64;
        cfg_write(&mut f, cap + 2, &0x8000u16.to_le_bytes());
        cfg_write(&mut f, 4, &0x0006u16.to_le_bytes());
        // Unmask table entry 0 (vector control at +12).
        f.region_write(4, 12, &0u32.to_le_bytes()).unwrap();
        // A halted ring raises INT_ERROR; unmask it and wait for the MSI-X.
        f.region_write(0, REG_INT_MASK, &0u32.to_le_bytes())
            .unwrap();
        f.region_write(0, REG_RING_SIZE, &3u32.to_le_bytes())
            .unwrap();
        f.region_write(0, REG_RING_CTRL, &RING_CTRL_ENABLE.to_le_bytes())
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if eventfd.read().is_ok() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no MSI-X");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(bar0_read32(&mut f, REG_ENGINE_ERROR), ERR_RING_BAD_SIZE);
    }
}
