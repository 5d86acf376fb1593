//! The NIC as a PCI function: config space and the glue between [`Nic`]
//! and p2plab-pci's [`PciFunction`].

use std::io;
use std::sync::Arc;

use p2plab_dma::GuestMemory;
use p2plab_kit::pci::pcie_endpoint;
use p2plab_kit::{DeviceControl, LateInterrupts, PciIds, ServedDevice};
use p2plab_pci::{
    BarSpec, BuildError, ConfigChange, ConfigSpace, LinkSpeed, PciFunction, PciModel,
};
use p2plab_vfio_user::DeviceError;
use p2plab_wire::Wire;

use crate::model::Nic;
use crate::regs::*;

/// Config space: class 0x0200, BAR0 registers, BAR4 MSI-X, Power
/// Management, MSI-X and a PCIe endpoint capability (Gen4 x8).
pub fn config_space(ids: &PciIds) -> Result<ConfigSpace, BuildError> {
    let builder = ids
        .config_space(CLASS_CODE)
        .bar(usize::from(REGS_BAR), BarSpec::memory32(REGS_BAR_SIZE))
        .power_management()
        .pcie(pcie_endpoint(LinkSpeed::Gen4, 8));
    MSIX.add_to(builder).build()
}

/// [`Nic`] seen through p2plab-pci's [`PciModel`].
#[derive(Debug)]
pub struct NicFunction {
    nic: Nic,
}

impl NicFunction {
    /// The device model.
    pub fn nic(&self) -> &Nic {
        &self.nic
    }
}

/// Builds the whole PCI function; the engines reach guest memory through
/// `memory` and frames go out on `wire`.
pub fn nic_function(
    ids: &PciIds,
    wire: Wire,
    mtu: u32,
    memory: Arc<dyn GuestMemory>,
) -> Result<PciFunction<NicFunction>, NicError> {
    let config = config_space(ids).map_err(|e| NicError::Config(e.0))?;
    let irq = LateInterrupts::new();
    let nic = Nic::new(wire, mtu, memory, irq.clone()).map_err(NicError::Thread)?;
    Ok(PciFunction::new(config, |controller| {
        irq.bind(controller);
        NicFunction { nic }
    }))
}

/// Why the PCI function could not be built.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    #[error("bad PCI configuration: {0}")]
    Config(String),
    #[error("cannot start the engine threads: {0}")]
    Thread(#[source] io::Error),
}

impl PciModel for NicFunction {
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        match bar {
            REGS_BAR => {
                self.nic.regs_read(offset, data);
                Ok(())
            }
            _ => Err(DeviceError::invalid("no such BAR")),
        }
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        match bar {
            REGS_BAR => {
                self.nic.regs_write(offset, data);
                Ok(())
            }
            _ => Err(DeviceError::invalid("no such BAR")),
        }
    }

    fn reset(&mut self) -> Result<(), DeviceError> {
        // Config space is already back to power-on: COMMAND is 0.
        self.nic.set_bus_master(false);
        self.nic
            .reset()
            .map_err(|_| DeviceError::new(libc::ETIMEDOUT, "engine DMA did not quiesce"))
    }

    fn config_changed(&mut self, change: &ConfigChange) {
        if let ConfigChange::CommandChanged { new, .. } = change {
            self.nic.set_bus_master(new.bus_master());
        }
    }
}

/// The NIC shares no BAR with peers: it only DMAs into theirs.
impl ServedDevice for NicFunction {
    fn control(&self) -> Arc<dyn DeviceControl> {
        Arc::new(self.nic.control())
    }
}
