//! The controller as a PCI function served over vfio-user: config space,
//! BAR dispatch, and the transport's pieces handed to the model: its DMA
//! space as guest memory (p2plab-dma adapts it) behind p2plab-kit's DMA
//! gate, its shared memory as the CMB, p2plab-pci's interrupt controller
//! as the kit's `Interrupts`. Also what the server binary serves: the
//! function as a `ServedDevice`, the controller's control verbs as a
//! `DeviceControl`.
//!
//! BAR0 holds the registers, doorbells and the MSI-X table and PBA (on their
//! own pages). BAR2, 64-bit prefetchable, is the CMB: a memfd QEMU maps, so
//! guest CPU accesses never trap. BAR4 is the PMR: trapped, every access
//! goes through to its file, which is never handed to the client.

use std::os::fd::AsFd;
use std::sync::Arc;

use crate::fault::FaultSpec;
use p2plab_dma::{DmaFault, GuestMemory, RegionMemory};
use p2plab_kit::{
    arm_spec, Armed, ClassCode, DeviceControl, DmaGate, Interrupts, PeerBar, PlacementHook,
    ServedDevice, StatsLayout,
};
use p2plab_pci::{
    BarBacking, BarSpec, ConfigChange, ConfigSpace, InterruptController, MsixCapSpec, PciFunction,
    PciModel, PcieCapSpec,
};
use p2plab_vfio_user::{DeviceError, DmaSpace, SharedMemory, SharedRegion};
use tracing::{debug, info};

use crate::config::ControllerConfig;
use crate::controller::NvmeController;
pub use crate::controller::{CMB_BAR, PMR_BAR};
use crate::memory::FileRegion;
use crate::namespace::Namespace;

pub use p2plab_kit::PciIds;

/// Red Hat's (QEMU's) vendor ID with a device ID of our own: Linux keys
/// quirks on 1b36:0010 (QEMU's nvme), which must not apply here. The nvme
/// driver binds by class code.
pub const DEFAULT_IDS: PciIds = PciIds::new(0x1b36, 0x00fe);

/// Mass storage, Non-Volatile Memory controller, NVM Express.
pub const CLASS_CODE: ClassCode = ClassCode::new(0x01, 0x08, 0x02);

/// The NVMe controller as a [`PciModel`].
pub struct NvmeFunction {
    controller: Arc<NvmeController>,
    /// Guest memory behind COMMAND.BME: closed until the guest sets it.
    /// The queue workers use it unbound to an epoch: a reset joins them
    /// first, then quiesces the gate.
    gate: Arc<DmaGate>,
    cmb: Option<Arc<SharedMemory>>,
    cmb_placement: Option<PlacementHook>,
}

impl NvmeFunction {
    pub fn controller(&self) -> &Arc<NvmeController> {
        &self.controller
    }

    /// The memory behind the CMB BAR (a sealed memfd), if there is a CMB.
    pub fn cmb_memory(&self) -> Option<&Arc<SharedMemory>> {
        self.cmb.as_ref()
    }

    fn cmb_placed(&self, addr: Option<u64>) {
        if let Some(hook) = &self.cmb_placement {
            hook.placed(addr);
        }
    }
}

fn dma_error(fault: DmaFault) -> DeviceError {
    debug!(%fault, "CMB access refused");
    DeviceError::invalid("access outside the CMB")
}

impl PciModel for NvmeFunction {
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        match bar {
            0 => {
                self.controller.regs_read(offset, data);
                Ok(())
            }
            CMB_BAR => match &self.cmb {
                // The whole BAR is backed, the part past the CMB too.
                Some(memory) => memory
                    .read_at(offset, data)
                    .map_err(|_| DeviceError::invalid("access outside BAR2")),
                None => self.controller.read_cmb(offset, data).map_err(dma_error),
            },
            PMR_BAR => self.controller.read_pmr(offset, data).map_err(dma_error),
            _ => Err(DeviceError::invalid("no such BAR")),
        }
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        match bar {
            0 => {
                self.controller.regs_write(offset, data);
                Ok(())
            }
            CMB_BAR => match &self.cmb {
                Some(memory) => memory
                    .write_at(offset, data)
                    .map_err(|_| DeviceError::invalid("access outside BAR2")),
                None => self.controller.write_cmb(offset, data).map_err(dma_error),
            },
            PMR_BAR => self.controller.write_pmr(offset, data).map_err(dma_error),
            _ => Err(DeviceError::invalid("no such BAR")),
        }
    }

    fn reset(&mut self) -> Result<(), DeviceError> {
        // COMMAND is 0 again: no bus mastering until the guest says so.
        self.gate.set_bus_master(false);
        // Joins every queue worker: none of their DMA runs afterwards.
        self.controller.reset();
        // Config space is back to power-on: the CMB BAR decodes nowhere.
        self.cmb_placed(None);
        // Nothing is in flight any more; this only makes it certain.
        self.gate
            .quiesce()
            .map_err(|_| DeviceError::new(libc::ETIMEDOUT, "controller DMA did not quiesce"))
    }

    fn config_changed(&mut self, change: &ConfigChange) {
        match change {
            ConfigChange::BarMoved {
                index: CMB_BAR,
                new,
                ..
            } => {
                self.controller.set_cmb_bar_address(*new);
                self.cmb_placed(*new);
            }
            ConfigChange::CommandChanged { new, .. } => {
                self.gate.set_bus_master(new.bus_master());
                debug!(
                    memory = new.memory_enabled(),
                    bus_master = new.bus_master(),
                    "PCI command"
                );
            }
            _ => {}
        }
    }

    fn bar_backing(&self, bar: u8) -> Option<BarBacking> {
        match bar {
            CMB_BAR => self.cmb.as_ref().map(|memory| BarBacking {
                fd: memory.fd(),
                fd_offset: 0,
                areas: Vec::new(),
            }),
            // The PMR is never handed out: an fd of its file would let the
            // client truncate or rewrite it behind the device's back (and
            // the server could no longer restart). Guest accesses to BAR4
            // trap and write through to the file.
            PMR_BAR => None,
            _ => None,
        }
    }
}

impl ServedDevice for NvmeFunction {
    const PEER_BAR: Option<u8> = Some(CMB_BAR);

    fn control(&self) -> Arc<dyn DeviceControl> {
        Arc::new(NvmeControl(Arc::clone(&self.controller)))
    }

    /// Peers DMA into the CMB through its memfd.
    fn peer_bar(&self) -> std::io::Result<Option<PeerBar>> {
        let Some(cmb) = &self.cmb else {
            return Ok(None);
        };
        Ok(Some(PeerBar {
            bar: CMB_BAR,
            fd: cmb.as_fd().try_clone_to_owned()?,
            size: cmb.size(),
        }))
    }

    /// Calls `hook` with the CMB BAR's address each time it changes
    /// (None: not decoding, reset).
    fn on_peer_bar_placement(&mut self, hook: PlacementHook) {
        self.cmb_placement = Some(hook);
    }

    /// Flushes every namespace and the PMR.
    fn stopping(&self) {
        self.controller.flush_all();
    }
}

/// The controller's control verbs: its nested stats (the DMA paths go
/// under `dma`), fault injections, and a reset the host did not ask for.
pub struct NvmeControl(pub Arc<NvmeController>);

impl DeviceControl for NvmeControl {
    fn counters(&self) -> serde_json::Value {
        serde_json::to_value(self.0.stats())
            .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }

    fn stats_layout(&self) -> StatsLayout {
        StatsLayout::Nested("dma")
    }

    /// Data pointers the controller served from its own CMB.
    fn own_bar_dma_bytes(&self) -> (u64, u64) {
        let counters = self.0.stats().counters;
        (counters.cmb_read_bytes, counters.cmb_write_bytes)
    }

    fn inject(&self, spec: &str) -> Result<Armed, String> {
        arm_spec(spec, |spec: FaultSpec| {
            self.0.inject(spec).map_err(|e| e.to_string())
        })
    }

    fn clear(&self) {
        self.0.clear_faults();
    }

    fn reset(&self) -> Result<(), String> {
        self.0.surprise_reset();
        Ok(())
    }

    fn fault_report(&self) -> serde_json::Value {
        serde_json::to_value(self.0.fault_report()).unwrap_or_default()
    }

    fn tracer(&self) -> &p2plab_trace::Tracer {
        self.0.tracer()
    }
}

/// Config space: NVMe class code, BAR0 (64-bit), the CMB BAR (64-bit
/// prefetchable), PM, MSI-X with one vector per queue pair, PCIe endpoint.
pub fn config_space(cfg: &ControllerConfig, ids: &PciIds) -> Result<ConfigSpace, String> {
    let layout = cfg.bar0_layout();
    let mut builder = ids
        .config_space(CLASS_CODE)
        .bar(0, BarSpec::memory64(layout.size))
        .power_management()
        .msix(MsixCapSpec {
            vectors: cfg.msix_vectors(),
            table_bar: 0,
            table_offset: layout.msix_table_offset as u32,
            pba_bar: 0,
            pba_offset: layout.msix_pba_offset as u32,
        })
        .pcie(PcieCapSpec::default());
    if let Some(size) = cfg.cmb_bar_size() {
        builder = builder.bar(usize::from(CMB_BAR), BarSpec::memory64(size).prefetchable());
    }
    if cfg.pmr_size > 0 {
        builder = builder.bar(
            usize::from(PMR_BAR),
            BarSpec::memory64(cfg.pmr_size).prefetchable(),
        );
    }
    builder.build().map_err(|e| e.0)
}

/// Why a device could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("PCI config space: {0}")]
    Pci(String),
    #[error("CMB memory: {0}")]
    Memory(#[from] std::io::Error),
}

/// Builds the PCI function for a controller whose DMA goes through `dma`,
/// with a PMR in `pmr` when `cfg.pmr_size` is not 0.
pub fn nvme_function(
    cfg: ControllerConfig,
    ids: &PciIds,
    namespaces: Vec<Arc<Namespace>>,
    pmr: Option<Arc<FileRegion>>,
    dma: DmaSpace,
) -> Result<PciFunction<NvmeFunction>, BuildError> {
    nvme_function_on(cfg, ids, namespaces, pmr, Arc::new(dma))
}

/// Like [`nvme_function`], over any guest memory (tests use fakes).
pub fn nvme_function_on(
    cfg: ControllerConfig,
    ids: &PciIds,
    namespaces: Vec<Arc<Namespace>>,
    pmr: Option<Arc<FileRegion>>,
    memory: Arc<dyn GuestMemory>,
) -> Result<PciFunction<NvmeFunction>, BuildError> {
    cfg.validate()?;
    let gate = Arc::new(DmaGate::new(memory));
    let config = config_space(&cfg, ids).map_err(BuildError::Pci)?;
    let irq = InterruptController::for_config(&config);
    let shared = match cfg.cmb_bar_size() {
        Some(bar_size) => Some(Arc::new(SharedMemory::new("p2plab-nvme-cmb", bar_size)?)),
        None => None,
    };
    let cmb: Option<Arc<dyn RegionMemory>> = shared
        .as_ref()
        .map(|m| Arc::new(SharedRegion::new(Arc::clone(m), cfg.cmb_size)) as Arc<dyn RegionMemory>);
    info!(
        cmb_mib = cfg.cmb_size >> 20,
        bar0 = cfg.bar0_layout().size,
        vectors = cfg.msix_vectors(),
        namespaces = namespaces.len(),
        "building NVMe function"
    );
    let pmr_memory: Option<Arc<dyn RegionMemory>> =
        pmr.as_ref().map(|p| Arc::clone(p) as Arc<dyn RegionMemory>);
    let controller = NvmeController::with_pmr(
        cfg,
        namespaces,
        Arc::clone(&gate) as Arc<dyn GuestMemory>,
        cmb,
        pmr_memory,
        Arc::clone(&irq) as Arc<dyn Interrupts>,
    )?;
    let model = NvmeFunction {
        controller: Arc::new(controller),
        gate,
        cmb: shared,
        cmb_placement: None,
    };
    PciFunction::from_parts(config, irq, model).map_err(|e| BuildError::Pci(e.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registers::Csts;
    use p2plab_dma::testing::FakeGuestMemory;
    use p2plab_vfio_user::Device;

    #[test]
    fn config_space_describes_an_nvme_function_with_a_cmb() {
        let cfg = ControllerConfig::default();
        let f = nvme_function(cfg, &DEFAULT_IDS, Vec::new(), None, DmaSpace::new()).unwrap();
        let c = f.config();
        assert_eq!(c.read_u32(0x08).unwrap() >> 8, 0x01_08_02, "class code");
        assert_eq!(c.bar_size(0), Some(16 << 10));
        assert_eq!(c.bar_size(2), Some(64 << 20));
        assert_eq!(
            c.read_u32(0x18).unwrap() & 0xf,
            0xc,
            "BAR2: 64-bit prefetchable"
        );
        let msix = c.msix().unwrap();
        assert_eq!(
            (msix.vectors, msix.table_offset, msix.pba_offset),
            (65, 0x2000, 0x3000)
        );
        let info = f.region_info(2).unwrap();
        assert!(info.fd.is_some(), "CMB BAR is mmappable");
        assert!(f.region_info(0).unwrap().fd.is_none(), "registers trap");
    }

    #[test]
    fn a_pmr_is_bar4_trapped_through_to_its_file() {
        let path = std::env::temp_dir().join(format!("p2plab-nvme-bar4-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let region = Arc::new(FileRegion::open(&path, Some(1 << 20)).unwrap());
        let cfg = ControllerConfig {
            pmr_size: 1 << 20,
            ..ControllerConfig::default()
        };
        let mut f =
            nvme_function(cfg, &DEFAULT_IDS, Vec::new(), Some(region), DmaSpace::new()).unwrap();
        assert_eq!(f.config().bar_size(4), Some(1 << 20));
        // Catches a PMR handed to the client as a writable fd of its file.
        assert!(
            f.region_info(4).unwrap().fd.is_none(),
            "the PMR file is not handed out"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the PMR file is created 0600");
        f.region_write(4, 0x100, b"pmr!").unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[0x100..0x104], b"pmr!");
        // A restarted server finds the contents.
        drop(f);
        let region = Arc::new(FileRegion::open(&path, Some(1 << 20)).unwrap());
        let cfg = ControllerConfig {
            pmr_size: 1 << 20,
            ..ControllerConfig::default()
        };
        let mut f =
            nvme_function(cfg, &DEFAULT_IDS, Vec::new(), Some(region), DmaSpace::new()).unwrap();
        let mut back = [0u8; 4];
        f.region_read(4, 0x100, &mut back).unwrap();
        assert_eq!(&back, b"pmr!");
        let _ = std::fs::remove_file(&path);
    }

    /// The config region (VFIO_PCI_CONFIG_REGION_INDEX).
    const CONFIG: u32 = 7;
    const RAM: u64 = 0x10_0000;
    const ASQ: u64 = RAM;
    const ACQ: u64 = RAM + 0x1000;
    const IDENTIFY_DATA: u64 = RAM + 0x2000;

    fn bar0_write32(f: &mut PciFunction<NvmeFunction>, offset: u64, value: u32) {
        f.region_write(0, offset, &value.to_le_bytes()).unwrap();
    }

    fn csts(f: &mut PciFunction<NvmeFunction>) -> u32 {
        let mut b = [0u8; 4];
        f.region_read(0, crate::registers::reg::CSTS, &mut b)
            .unwrap();
        u32::from_le_bytes(b)
    }

    fn wait_csts(f: &mut PciFunction<NvmeFunction>, mask: u32, want: u32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while csts(f) & mask != want {
            assert!(std::time::Instant::now() < deadline, "CSTS {:#x}", csts(f));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Enables the controller with a 2-entry admin queue pair in RAM and
    /// submits Identify Controller into IDENTIFY_DATA.
    fn enable_and_identify(f: &mut PciFunction<NvmeFunction>, ram: &FakeGuestMemory) {
        use crate::registers::reg;
        ram.write(ACQ, &[0u8; 32]).unwrap();
        let cmd = crate::command::CommandBuilder::new(crate::spec::admin::IDENTIFY, 7)
            .prp1(IDENTIFY_DATA)
            .cdw(10, 1)
            .build();
        ram.write(ASQ, cmd.as_bytes()).unwrap();
        bar0_write32(f, reg::CC, 0);
        wait_csts(f, Csts::RDY.raw(), 0);
        bar0_write32(f, reg::AQA, (1 << 16) | 1);
        bar0_write32(f, reg::ASQ, ASQ as u32);
        bar0_write32(f, reg::ASQ + 4, 0);
        bar0_write32(f, reg::ACQ, ACQ as u32);
        bar0_write32(f, reg::ACQ + 4, 0);
        bar0_write32(f, reg::CC, (6 << 16) | (4 << 20) | 1);
        wait_csts(f, Csts::RDY.raw(), Csts::RDY.raw());
        // SQ 0 tail doorbell.
        bar0_write32(f, 0x1000, 1);
    }

    fn admin_completion(ram: &FakeGuestMemory) -> crate::command::CompletionEntry {
        let mut e = [0u8; 16];
        ram.read(ACQ, &mut e).unwrap();
        crate::command::CompletionEntry::decode(&e)
    }

    /// Catches a controller that DMAs while the guest has Bus Master
    /// Enable clear (before probe, after the driver released the device,
    /// after a reset): nothing may be fetched from or written to guest
    /// memory; like QEMU's nvme, an SQ fetch that cannot be done is a
    /// controller fatal status. Setting BME and resetting the controller
    /// makes it work.
    #[test]
    fn no_dma_without_bus_master_enable() {
        let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, 0x10_0000));
        let cfg = ControllerConfig {
            cmb_size: 0,
            ..ControllerConfig::default()
        };
        let mut f = nvme_function_on(
            cfg,
            &DEFAULT_IDS,
            Vec::new(),
            None,
            ram.clone() as Arc<dyn GuestMemory>,
        )
        .unwrap();
        // Memory decode on, bus mastering off.
        f.region_write(CONFIG, 4, &0x0002u16.to_le_bytes()).unwrap();
        enable_and_identify(&mut f, &ram);
        wait_csts(&mut f, Csts::CFS.raw(), Csts::CFS.raw());
        assert!(!admin_completion(&ram).phase, "a completion was posted");
        let mut data = [0u8; 8];
        ram.read(IDENTIFY_DATA, &mut data).unwrap();
        assert_eq!(data, [0; 8], "Identify data was written");
        // The driver sets BME and resets the controller.
        f.region_write(CONFIG, 4, &0x0006u16.to_le_bytes()).unwrap();
        enable_and_identify(&mut f, &ram);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !admin_completion(&ram).phase {
            assert!(std::time::Instant::now() < deadline, "no completion");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let c = admin_completion(&ram);
        assert_eq!((c.cid, c.status), (7, crate::spec::Status::SUCCESS));
        assert_eq!(csts(&mut f) & Csts::CFS.raw(), 0);
        ram.read(IDENTIFY_DATA, &mut data).unwrap();
        assert_eq!(
            u16::from_le_bytes([data[0], data[1]]),
            ControllerConfig::default().pci_vendor_id,
            "Identify Controller VID"
        );
        // A device reset clears COMMAND, so BME is off again.
        f.reset().unwrap();
        assert!(!f.model().gate.bus_master());
    }

    #[test]
    fn bar_accesses_reach_the_controller_and_the_cmb() {
        let cfg = ControllerConfig {
            cmb_size: 6 << 20,
            ..ControllerConfig::default()
        };
        let mut f = nvme_function(cfg, &DEFAULT_IDS, Vec::new(), None, DmaSpace::new()).unwrap();
        let mut vs = [0u8; 4];
        f.region_read(0, 0x08, &mut vs).unwrap();
        assert_eq!(u32::from_le_bytes(vs), 0x0001_0400);
        // Trapped CMB accesses land in the shared memory, past the CMB too
        // (BAR2 is 8 MiB for a 6 MiB CMB).
        f.region_write(2, 7 << 20, &[1, 2, 3, 4]).unwrap();
        let mut back = [0u8; 4];
        f.region_read(2, 7 << 20, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3, 4]);
        assert!(f.region_read(3, 0, &mut back).is_err());
    }
}
