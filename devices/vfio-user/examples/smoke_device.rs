//! A minimal PCI device on the vfio-user server, for smoke-testing the
//! transport against a real QEMU:
//!
//! ```text
//! cargo run -p p2plab-vfio-user --example smoke_device -- /tmp/smoke.sock
//! qemu-system-x86_64 -machine q35,memory-backend=mem -accel tcg -nographic \
//!   -object memory-backend-memfd,id=mem,size=512M,share=on \
//!   -device '{"driver":"vfio-user-pci","socket":{"type":"unix","path":"/tmp/smoke.sock"}}'
//! ```
//!
//! BAR0 is 4 KiB of trapped registers, BAR2 1 MiB of memfd that QEMU mmaps.
//! A worker thread reads the top of the BIOS ROM (a range QEMU maps without
//! an fd, so DMA_READ messages) and the first bytes of guest RAM (fd-backed)
//! once they are mapped, and logs what it found.

use std::sync::Arc;
use std::time::Duration;

use p2plab_vfio_user::vfio_abi::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};
use p2plab_vfio_user::{
    Device, DeviceError, DeviceInfo, DmaSpace, DmaTarget, IrqInfo, IrqSet, MmapArea, RegionInfo,
    Server, ServerConfig, SharedMemory,
};

const BAR0_SIZE: u64 = 4096;
const BAR2_SIZE: u64 = 1 << 20;

struct SmokeDevice {
    config: [u8; 256],
    /// Which config bits the guest may change.
    writable: [u8; 256],
    regs: Vec<u8>,
    bar2: Arc<SharedMemory>,
}

impl SmokeDevice {
    fn new() -> std::io::Result<Self> {
        let mut config = [0u8; 256];
        let mut writable = [0u8; 256];
        config[0..4].copy_from_slice(&[0x34, 0x12, 0xef, 0xbe]); // 1234:beef
        config[0x0b] = 0xff; // class: unassigned
        writable[0x04] = 0x06; // command: memory space, bus master
                               // BAR0: 32-bit memory, 4 KiB.
        writable[0x10..0x14].copy_from_slice(&(!(BAR0_SIZE as u32 - 1)).to_le_bytes());
        // BAR2/3: 64-bit prefetchable memory, 1 MiB.
        config[0x18] = 0x0c;
        writable[0x18..0x1c].copy_from_slice(&(!(BAR2_SIZE as u32 - 1)).to_le_bytes());
        writable[0x1c..0x20].copy_from_slice(&u32::MAX.to_le_bytes());
        Ok(SmokeDevice {
            config,
            writable,
            regs: vec![0; BAR0_SIZE as usize],
            bar2: Arc::new(SharedMemory::new("smoke-bar2", BAR2_SIZE)?),
        })
    }
}

fn rw() -> u32 {
    VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE
}

impl Device for SmokeDevice {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
            num_regions: VFIO_PCI_NUM_REGIONS,
            num_irqs: VFIO_PCI_NUM_IRQS,
        }
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo, DeviceError> {
        let plain = |flags, size| RegionInfo {
            flags,
            size,
            fd: None,
            fd_offset: 0,
            mmap_areas: vec![],
        };
        Ok(match index {
            0 => plain(rw(), BAR0_SIZE),
            2 => RegionInfo {
                flags: rw(),
                size: BAR2_SIZE,
                fd: Some(self.bar2.fd()),
                fd_offset: 0,
                mmap_areas: vec![MmapArea {
                    offset: 0,
                    size: BAR2_SIZE,
                }],
            },
            VFIO_PCI_CONFIG_REGION_INDEX => plain(rw(), 256),
            i if i < VFIO_PCI_NUM_REGIONS => plain(0, 0),
            _ => return Err(DeviceError::invalid("no such region")),
        })
    }

    fn irq_info(&self, index: u32) -> Result<IrqInfo, DeviceError> {
        if index < VFIO_PCI_NUM_IRQS {
            Ok(IrqInfo { flags: 0, count: 0 })
        } else {
            Err(DeviceError::invalid("no such irq index"))
        }
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        let src: &[u8] = match index {
            0 => &self.regs,
            VFIO_PCI_CONFIG_REGION_INDEX => &self.config,
            2 => {
                return self
                    .bar2
                    .read_at(offset, data)
                    .map_err(|_| DeviceError::invalid("bar2"))
            }
            _ => return Err(DeviceError::invalid("region not readable")),
        };
        let start = offset as usize;
        let bytes = src
            .get(start..start + data.len())
            .ok_or(DeviceError::invalid("out of range"))?;
        data.copy_from_slice(bytes);
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let start = offset as usize;
        match index {
            0 => self
                .regs
                .get_mut(start..start + data.len())
                .ok_or(DeviceError::invalid("out of range"))?
                .copy_from_slice(data),
            VFIO_PCI_CONFIG_REGION_INDEX => {
                for (i, &byte) in data.iter().enumerate() {
                    let at = start + i;
                    let (Some(cur), Some(&mask)) = (self.config.get(at), self.writable.get(at))
                    else {
                        return Err(DeviceError::invalid("out of range"));
                    };
                    self.config[at] = (cur & !mask) | (byte & mask);
                }
            }
            2 => self
                .bar2
                .write_at(offset, data)
                .map_err(|_| DeviceError::invalid("bar2"))?,
            _ => return Err(DeviceError::invalid("region not writable")),
        }
        Ok(())
    }

    fn set_irqs(&mut self, _request: IrqSet) -> Result<(), DeviceError> {
        Ok(())
    }

    fn reset(&mut self) -> Result<(), DeviceError> {
        self.regs.iter_mut().for_each(|b| *b = 0);
        Ok(())
    }
}

/// Reads the BIOS reset vector (message-only) and guest RAM (fd-backed)
/// once the client has mapped them.
fn probe_dma(dma: DmaSpace) {
    let targets = [("bios reset vector", 0xffff_fff0u64), ("guest RAM", 0x0)];
    for (what, gpa) in targets {
        let mut waited = 0;
        while dma.classify(gpa, 16) == DmaTarget::Unmapped && waited < 300 {
            std::thread::sleep(Duration::from_millis(100));
            waited += 1;
        }
        let mut buf = [0u8; 16];
        let result = dma.read(gpa, &mut buf);
        tracing::info!(
            what,
            gpa = format_args!("{gpa:#x}"),
            target = ?dma.classify(gpa, 16),
            ?result,
            bytes = format_args!("{buf:02x?}"),
            "DMA probe"
        );
    }
    tracing::info!(stats = ?dma.stats(), "DMA probe done");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "debug".into()),
        )
        .init();
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp/p2plab-smoke.sock".into());
    let dma = DmaSpace::new();
    let mut device = SmokeDevice::new()?;
    let mut config = ServerConfig::new(path);
    config.exit_on_disconnect = true;
    let server = Server::new(config, dma.clone())?;
    std::thread::spawn(move || probe_dma(dma));
    server.run(&mut device)?;
    Ok(())
}
