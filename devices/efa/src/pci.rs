//! The EFA as a PCI function: config space and the glue between [`Efa`]
//! and p2plab-pci's [`PciFunction`].

use std::io;
use std::sync::Arc;

use p2plab_dma::{GuestMemory, RegionMemory};
use p2plab_kit::pci::pcie_endpoint;
use p2plab_kit::{DeviceControl, LateInterrupts, MsixBar, PciIds, ServedDevice};
use p2plab_pci::{
    BarBacking, BarSpec, BuildError, ConfigChange, ConfigSpace, LinkSpeed, PciFunction, PciModel,
};
use p2plab_vfio_user::{DeviceError, SharedMemory, SharedRegion};

use crate::attrs::DeviceAttrs;
use crate::link::Link;
use crate::model::{Efa, EfaOptions};
use crate::regs::*;

/// The BAR with the MSI-X table and PBA.
pub const MSIX_BAR: u8 = 1;

/// Config space: class 0x0200, BAR0 registers, BAR1 MSI-X, BAR2 LLQ
/// memory (64-bit prefetchable), BAR4 doorbells, Power Management, MSI-X
/// (one vector for management, one per event queue) and a PCIe endpoint
/// capability (Gen4 x8).
pub fn config_space(ids: &PciIds, attrs: &DeviceAttrs) -> Result<ConfigSpace, BuildError> {
    let msix = MsixBar {
        bar: MSIX_BAR,
        vectors: attrs.msix_vectors(),
    };
    msix.add_to(ids.config_space(CLASS_CODE))
        .bar(usize::from(REGS_BAR), BarSpec::memory32(REGS_BAR_SIZE))
        .bar(
            usize::from(LLQ_BAR),
            BarSpec::memory64(attrs.llq_bar_size()).prefetchable(),
        )
        .bar(usize::from(DB_BAR), BarSpec::memory32(attrs.db_bar_size()))
        .power_management()
        .pcie(pcie_endpoint(LinkSpeed::Gen4, 8))
        .build()
}

/// Why the PCI function could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EfaError {
    #[error("bad PCI configuration: {0}")]
    Config(String),
    #[error("cannot create the LLQ memory: {0}")]
    Llq(#[source] io::Error),
    #[error("cannot start the device: {0}")]
    Start(#[source] io::Error),
}

/// [`Efa`] seen through p2plab-pci's [`PciModel`].
pub struct EfaFunction {
    efa: Efa,
    llq: Arc<SharedRegion>,
}

impl std::fmt::Debug for EfaFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EfaFunction")
            .field("efa", &self.efa)
            .finish_non_exhaustive()
    }
}

impl EfaFunction {
    /// The device model.
    pub fn efa(&self) -> &Efa {
        &self.efa
    }
}

/// Builds the whole PCI function: BAR2 is a memfd QEMU maps, so user
/// space's descriptor stores land in it without a trap.
pub fn efa_function(
    ids: &PciIds,
    attrs: DeviceAttrs,
    options: EfaOptions,
    memory: Arc<dyn GuestMemory>,
    link: Arc<dyn Link>,
) -> Result<PciFunction<EfaFunction>, EfaError> {
    attrs
        .validate()
        .map_err(|e| EfaError::Config(e.to_string()))?;
    let config = config_space(ids, &attrs).map_err(|e| EfaError::Config(e.0))?;
    let shared =
        SharedMemory::new("p2plab-efa-llq", attrs.llq_bar_size()).map_err(EfaError::Llq)?;
    let llq = Arc::new(SharedRegion::new(Arc::new(shared), attrs.llq_bar_size()));
    let irq = LateInterrupts::new();
    let region: Arc<dyn RegionMemory> = llq.clone();
    let efa =
        Efa::new(attrs, options, memory, region, link, irq.clone()).map_err(EfaError::Start)?;
    Ok(PciFunction::new(config, |controller| {
        irq.bind(controller);
        EfaFunction { efa, llq }
    }))
}

impl PciModel for EfaFunction {
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        match bar {
            REGS_BAR => self.efa.regs_read(offset, data),
            DB_BAR => self.efa.db_read(offset, data),
            // Only when the client did not map BAR2.
            LLQ_BAR => self
                .llq
                .read(offset, data)
                .map_err(|_| DeviceError::invalid("LLQ access outside BAR2"))?,
            _ => return Err(DeviceError::invalid("no such BAR")),
        }
        Ok(())
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        match bar {
            REGS_BAR => self.efa.regs_write(offset, data),
            DB_BAR => self.efa.db_write(offset, data),
            LLQ_BAR => self
                .llq
                .write(offset, data)
                .map_err(|_| DeviceError::invalid("LLQ access outside BAR2"))?,
            _ => return Err(DeviceError::invalid("no such BAR")),
        }
        Ok(())
    }

    fn reset(&mut self) -> Result<(), DeviceError> {
        // Config space is already back to power-on: COMMAND is 0.
        self.efa.set_bus_master(false);
        self.efa
            .reset()
            .map_err(|_| DeviceError::new(libc::ETIMEDOUT, "device DMA did not quiesce"))
    }

    fn config_changed(&mut self, change: &ConfigChange) {
        if let ConfigChange::CommandChanged { new, .. } = change {
            self.efa.set_bus_master(new.bus_master());
        }
    }

    fn bar_backing(&self, bar: u8) -> Option<BarBacking> {
        (bar == LLQ_BAR).then(|| BarBacking {
            fd: self.llq.shared_memory().fd(),
            fd_offset: 0,
            areas: Vec::new(),
        })
    }
}

/// The EFA shares no BAR with peers (its LLQ is for its own user space);
/// it DMAs into theirs through dma-buf MRs.
impl ServedDevice for EfaFunction {
    fn control(&self) -> Arc<dyn DeviceControl> {
        Arc::new(self.efa.control())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a config space the driver cannot probe: BAR0 and BAR2 must
    /// be memory BARs, BAR2 64-bit prefetchable and big enough for every
    /// QP's LLQ, the doorbell BAR where DEVICE_ATTR says, MSI-X with a
    /// vector per event queue plus management.
    #[test]
    fn config_space_has_what_the_driver_requests() {
        let attrs = DeviceAttrs::default();
        let config = config_space(&DEFAULT_IDS, &attrs).unwrap();
        assert_eq!(config.vendor_id(), 0x1d0f);
        assert_eq!(config.device_id(), 0xefa1);
        assert_eq!(config.read_u32(8).unwrap() >> 8, 0x020000);
        assert_eq!(config.bar_size(0), Some(4096));
        assert_eq!(config.bar_size(2), Some(4 << 20));
        assert_eq!(config.bar_size(4), Some(256 << 10));
        let bar2 = config.read_u32(0x18).unwrap();
        assert_eq!(bar2 & 0xf, 0b1100, "64-bit prefetchable memory");
        let msix = config.msix().unwrap();
        assert_eq!((msix.vectors, msix.table_bar), (5, 1));
    }
}
