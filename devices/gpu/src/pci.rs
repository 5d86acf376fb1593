//! The GPU as a PCI function: config space (identity, BARs, capabilities)
//! and the glue between [`Gpu`] and p2plab-pci's [`PciFunction`].

use std::io;
use std::sync::Arc;

use p2plab_dma::GuestMemory;
use p2plab_kit::pci::pcie_endpoint;
use p2plab_kit::{
    DeviceControl, HoleHook, LateInterrupts, PciIds, PeerBar, PlacementHook, ServedDevice,
};
use p2plab_pci::{
    BarBacking, BarSpec, BuildError, ConfigChange, ConfigSpace, LinkSpeed, PciFunction, PciModel,
};
use p2plab_vfio_user::{DeviceError, DmaSpace, LocalMemory, LocalWindowId};

use crate::model::Gpu;
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

/// Config space: class 0x0302, BAR0 registers, BAR2 VRAM (64-bit
/// prefetchable), BAR4 MSI-X, Power Management, MSI-X and a PCIe endpoint
/// capability that looks like a Gen4 x16 card.
pub fn config_space(ids: &PciIds, vram_size: u64) -> Result<ConfigSpace, BuildError> {
    let vram = BarSpec::memory64(vram_size).prefetchable();
    MSIX.add_to(ids.config_space(CLASS_CODE))
        .bar(usize::from(REGS_BAR), BarSpec::memory32(REGS_BAR_SIZE))
        .bar(usize::from(VRAM_BAR), vram)
        .power_management()
        .pcie(pcie_endpoint(LinkSpeed::Gen4, 16))
        .build()
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
    placement: Option<PlacementHook>,
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
        if let Some(hook) = &self.placement {
            hook.placed(self.vram_address);
        }
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
    ids: &PciIds,
    vram: Vram,
    memory: Arc<dyn GuestMemory>,
) -> Result<PciFunction<GpuFunction>, GpuError> {
    let config = config_space(ids, vram.size()).map_err(|e| GpuError::Config(e.0))?;
    let irq = LateInterrupts::new();
    let gpu = Gpu::new(vram, memory, irq.clone()).map_err(GpuError::Thread)?;
    let function = PciFunction::new(config, |controller| {
        irq.bind(controller);
        GpuFunction {
            gpu,
            vram_address: None,
            window: None,
            placement: None,
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

    fn reset(&mut self) -> Result<(), DeviceError> {
        // Config space is already back to power-on: COMMAND is 0.
        self.gpu.set_bus_master(false);
        let quiesced = self.gpu.reset();
        self.vram_address = None;
        self.update_window();
        quiesced.map_err(|_| DeviceError::new(libc::ETIMEDOUT, "engine DMA did not quiesce"))
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

impl ServedDevice for GpuFunction {
    const PEER_BAR: Option<u8> = Some(VRAM_BAR);

    fn control(&self) -> Arc<dyn DeviceControl> {
        Arc::new(self.gpu.control())
    }

    /// Peers write into VRAM through its memfd, at the address the guest
    /// gives BAR2.
    fn peer_bar(&self) -> io::Result<Option<PeerBar>> {
        let vram = self.gpu.vram();
        Ok(Some(PeerBar {
            bar: VRAM_BAR,
            fd: vram.fd().try_clone_to_owned()?,
            size: vram.size(),
        }))
    }

    /// Calls `hook` with VRAM's address each time it changes (None: not
    /// decoding), and once now.
    fn on_peer_bar_placement(&mut self, hook: PlacementHook) {
        hook.placed(self.vram_address);
        self.placement = Some(hook);
    }

    /// A zero fill punches holes into VRAM: `hook` runs right before and
    /// right after each punch.
    fn on_peer_bar_holes(&mut self, hook: HoleHook) {
        self.gpu.vram().on_holes(hook);
    }
}

fn io_error(what: &'static str, error: &io::Error) -> DeviceError {
    DeviceError::new(error.raw_os_error().unwrap_or(libc::EIO), what)
}

#[cfg(test)]
mod tests;
