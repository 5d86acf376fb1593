//! A PCI function as a guest (through QEMU) and a client drive it: config
//! space accesses at any offset, length and value; BAR accesses, including
//! the MSI-X table and PBA; SET_IRQS with any index, action, range and
//! data (eventfds, some of them full); interrupts raised by the device;
//! resets; in any order. Catches a panic on an odd access or request, a
//! write that changes a read-only identity field, a BAR whose programmable
//! bits disagree with its size, an interrupt that blocks (libFuzzer's
//! -timeout), and a reset that leaves decode, bus mastering or MSI-X on.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use p2plab_pci::{
    BarSpec, ConfigSpaceBuilder, InterruptController, MsixCapSpec, PciFunction, PciModel,
    PcieCapSpec,
};
use p2plab_vfio_user::{Device, DeviceError, EventFd, IrqAction, IrqData, IrqSet};

const CONFIG: u32 = 7;

/// Registers only: what matters here is the function around it.
struct Regs {
    bar0: Vec<u8>,
    irq: Arc<InterruptController>,
}

impl PciModel for Regs {
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        let at = usize::try_from(offset).map_err(|_| DeviceError::invalid("offset"))?;
        let src = match bar {
            0 => self.bar0.get(at..at + data.len()),
            _ => None,
        };
        data.copy_from_slice(src.ok_or(DeviceError::invalid("outside the registers"))?);
        Ok(())
    }
    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let at = usize::try_from(offset).map_err(|_| DeviceError::invalid("offset"))?;
        let dst = match bar {
            0 => self.bar0.get_mut(at..at + data.len()),
            _ => None,
        };
        dst.ok_or(DeviceError::invalid("outside the registers"))?
            .copy_from_slice(data);
        Ok(())
    }
    fn reset(&mut self) {
        self.bar0.fill(0);
    }
}

fn function() -> PciFunction<Regs> {
    let config = ConfigSpaceBuilder::new(0x1b36, 0x00fe)
        .subsystem(0x1b36, 0x00fe)
        .class_code(0x01, 0x08, 0x02)
        .interrupt_pin(1)
        .bar(0, BarSpec::memory64(0x4000))
        .bar(2, BarSpec::memory64(64 << 20).prefetchable())
        .bar(4, BarSpec::memory32(0x1000))
        .bar(5, BarSpec::io(0x20))
        .power_management()
        .msix(MsixCapSpec {
            vectors: 8,
            table_bar: 0,
            table_offset: 0x2000,
            pba_bar: 0,
            pba_offset: 0x3000,
        })
        .pcie(PcieCapSpec::default())
        .resizable_bar(2, &[64 << 20, 128 << 20])
        .device_serial_number(0x0123_4567_89ab_cdef)
        .build()
        .expect("the fuzzed device's layout is valid");
    PciFunction::new(config, |irq| Regs {
        bar0: vec![0; 0x4000],
        irq,
    })
}

/// An eventfd, full (a blocking write would hang) when `full`.
fn eventfd(full: bool) -> Option<EventFd> {
    let fd = EventFd::new(0).ok()?;
    if full {
        fd.write(u64::MAX - 1).ok()?;
    }
    Some(fd)
}

fn check(f: &PciFunction<Regs>) {
    let config = f.config();
    assert_eq!(config.vendor_id(), 0x1b36, "vendor ID is read-only");
    assert_eq!(config.device_id(), 0x00fe, "device ID is read-only");
    for bar in [0usize, 2, 4, 5] {
        if let (Some(size), Some(address)) =
            (config.bar_size(bar), config.bar_programmed_address(bar))
        {
            assert_eq!(
                address & (size - 1),
                0,
                "BAR {bar} address is aligned to its size"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut f = function();
    // Each step: [op, a, b, c, value bytes...] in chunks of 12.
    for step in data.chunks(12) {
        let [op, a, b, c, value @ ..] = step else {
            break;
        };
        let offset = u64::from(u16::from_le_bytes([*a, *b]));
        let len = [1usize, 2, 4, 8][usize::from(c & 3)].min(value.len().max(1));
        let mut buf = [0u8; 8];
        match op % 8 {
            // Config space.
            0 => {
                let _ = f.region_read(CONFIG, offset, &mut buf[..len]);
            }
            1 => {
                if value.len() >= len {
                    let _ = f.region_write(CONFIG, offset, &value[..len]);
                }
            }
            // BAR0: registers, the MSI-X table (0x2000) and PBA (0x3000).
            2 => {
                let _ = f.region_read(u32::from(c >> 4) % 6, offset, &mut buf[..len]);
            }
            3 => {
                if value.len() >= len {
                    let _ = f.region_write(u32::from(c >> 4) % 6, offset, &value[..len]);
                }
            }
            // SET_IRQS as the transport hands it over.
            4 => {
                let index = u32::from(*a % 6);
                let action = match b % 3 {
                    0 => IrqAction::Mask,
                    1 => IrqAction::Unmask,
                    _ => IrqAction::Trigger,
                };
                let start = u32::from(c % 10);
                let count = u32::from(value.first().copied().unwrap_or(0) % 10);
                let data = match b / 3 % 3 {
                    0 => IrqData::None,
                    1 => IrqData::Bool(
                        (0..count)
                            .map(|i| value.get(1 + i as usize).is_some_and(|v| v & 1 != 0))
                            .collect(),
                    ),
                    _ => IrqData::EventFds(
                        (0..count)
                            .map(|i| match value.get(1 + i as usize).map_or(0, |v| v % 3) {
                                0 => None,
                                1 => eventfd(false),
                                _ => eventfd(true),
                            })
                            .collect(),
                    ),
                };
                let _ = f.set_irqs(IrqSet {
                    index,
                    action,
                    start,
                    count,
                    data,
                });
            }
            // The device raises a vector from a worker.
            5 => {
                f.model().irq.notify(u16::from(*a));
            }
            6 => {
                let _ = f.irq_info(u32::from(*a));
                let _ = f.region_info(u32::from(*a));
            }
            _ => {
                let _ = f.reset();
                assert!(!f.config().memory_decode_enabled());
                assert!(!f.config().bus_master_enabled());
                assert!(!f.irq().msix_enabled());
            }
        }
        check(&f);
    }
    // A reset brings everything back to power-on values.
    let _ = f.reset();
    assert!(!f.config().memory_decode_enabled());
    assert!(!f.config().bus_master_enabled());
    assert!(!f.irq().msix_enabled());
});
