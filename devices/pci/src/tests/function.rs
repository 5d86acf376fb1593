use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread;

use p2plab_vfio_user::{Device, DeviceError, IrqAction, IrqData, IrqSet, MmapArea};
use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};

use super::interrupt::{drain, eventfd};
use crate::regs::{self, cap_id};
use crate::{
    BarBacking, BarSpec, ConfigChange, ConfigSpaceBuilder, InterruptController, MsixCapSpec,
    MsixControl, PciFunction, PciModel, PcieCapSpec,
};

const CONFIG: u32 = VFIO_PCI_CONFIG_REGION_INDEX;

/// A model with a 16 KiB register file in BAR0 (MSI-X at 0x2000/0x3000)
/// and an fd-backed 2 MiB BAR2.
struct TestModel {
    regs: Vec<u8>,
    irq: Arc<InterruptController>,
    changes: Arc<Mutex<Vec<ConfigChange>>>,
    resets: usize,
    backing: RawFd,
    areas: Vec<MmapArea>,
    bar2_mmapped: bool,
}

impl PciModel for TestModel {
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        if bar != 0 {
            return Err(DeviceError::invalid("test model: only BAR0 traps"));
        }
        let at = offset as usize;
        data.copy_from_slice(&self.regs[at..at + data.len()]);
        Ok(())
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        if bar != 0 {
            return Err(DeviceError::invalid("test model: only BAR0 traps"));
        }
        let at = offset as usize;
        self.regs[at..at + data.len()].copy_from_slice(data);
        // Writing the "doorbell" at 0x1000 raises vector data[0] from a
        // worker thread, like a real device completing a command.
        if offset == 0x1000 {
            let irq = Arc::clone(&self.irq);
            let vector = u16::from(data[0]);
            thread::spawn(move || irq.notify(vector))
                .join()
                .map_err(|_| DeviceError::invalid("worker panicked"))?;
        }
        Ok(())
    }

    fn reset(&mut self) -> Result<(), DeviceError> {
        self.resets += 1;
        self.regs.fill(0);
        Ok(())
    }

    fn config_changed(&mut self, change: &ConfigChange) {
        self.changes.lock().expect("lock").push(change.clone());
    }

    fn bar_backing(&self, bar: u8) -> Option<BarBacking> {
        let mmapped = match bar {
            0 => !self.bar2_mmapped,
            2 => self.bar2_mmapped,
            _ => false,
        };
        mmapped.then(|| BarBacking {
            fd: self.backing,
            fd_offset: 0x1000,
            areas: self.areas.clone(),
        })
    }
}

struct Fixture {
    function: PciFunction<TestModel>,
    changes: Arc<Mutex<Vec<ConfigChange>>>,
    _backing: File,
}

fn fixture() -> Fixture {
    let config = ConfigSpaceBuilder::new(0x1b36, 0x0010)
        .class_code(0x01, 0x08, 0x02)
        .bar(0, BarSpec::memory64(16 * 1024))
        .bar(2, BarSpec::memory64(2 << 20).prefetchable())
        .power_management()
        .msix(MsixCapSpec {
            vectors: 4,
            table_bar: 0,
            table_offset: 0x2000,
            pba_bar: 0,
            pba_offset: 0x3000,
        })
        .pcie(PcieCapSpec::default())
        .build()
        .expect("config");
    let backing = File::open("/dev/zero").expect("/dev/zero");
    let changes = Arc::new(Mutex::new(Vec::new()));
    let fd = backing.as_raw_fd();
    let seen = Arc::clone(&changes);
    let function = PciFunction::new(config, move |irq| TestModel {
        regs: vec![0; 16 * 1024],
        irq,
        changes: seen,
        resets: 0,
        backing: fd,
        areas: Vec::new(),
        bar2_mmapped: true,
    });
    Fixture {
        function,
        changes,
        _backing: backing,
    }
}

fn cfg_read32(f: &mut PciFunction<TestModel>, offset: u64) -> u32 {
    let mut buf = [0u8; 4];
    f.region_read(CONFIG, offset, &mut buf)
        .expect("config read");
    u32::from_le_bytes(buf)
}

fn cfg_write16(f: &mut PciFunction<TestModel>, offset: u64, value: u16) {
    f.region_write(CONFIG, offset, &value.to_le_bytes())
        .expect("config write");
}

#[test]
fn device_and_region_info() {
    let fx = fixture();
    let f = &fx.function;
    let info = f.device_info();
    assert_eq!(info.flags, VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET);
    assert_eq!((info.num_regions, info.num_irqs), (9, 5));

    let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
    let bar0 = f.region_info(0).expect("bar0");
    assert_eq!((bar0.size, bar0.flags & !rw, bar0.fd), (16 * 1024, 0, None));
    let bar2 = f.region_info(2).expect("bar2");
    assert_eq!(bar2.size, 2 << 20);
    assert_ne!(bar2.flags & VFIO_REGION_INFO_FLAG_MMAP, 0);
    assert_eq!(bar2.fd, Some(fx._backing.as_raw_fd()));
    assert_eq!(bar2.fd_offset, 0x1000);
    assert_eq!(
        bar2.mmap_areas,
        vec![MmapArea {
            offset: 0,
            size: 2 << 20
        }]
    );
    for empty in [1, 3, 4, 5, 6, 8] {
        let region = f.region_info(empty).expect("empty region");
        assert_eq!((region.size, region.flags), (0, 0), "region {empty}");
    }
    let config = f.region_info(CONFIG).expect("config");
    assert_eq!((config.size, config.flags), (4096, rw));
    assert!(f.region_info(9).is_err());
    assert!(f.region_info(u32::MAX).is_err());
}

#[test]
fn mmap_areas_never_cover_the_msix_pages() {
    let mut fx = fixture();
    fx.function.model_mut().bar2_mmapped = false; // back BAR0 instead
    let bar0 = fx.function.region_info(0).expect("bar0");
    assert_eq!(
        bar0.mmap_areas,
        vec![
            MmapArea {
                offset: 0,
                size: 0x2000
            },
            // 0x2000..0x3000 table, 0x3000..0x4000 PBA: nothing left.
        ]
    );
    fx.function.model_mut().areas = vec![
        MmapArea {
            offset: 0x1000,
            size: 0x2000,
        },
        MmapArea {
            offset: 0x3800,
            size: u64::MAX,
        },
    ];
    let bar0 = fx.function.region_info(0).expect("bar0");
    assert_eq!(
        bar0.mmap_areas,
        vec![MmapArea {
            offset: 0x1000,
            size: 0x1000
        }]
    );
}

#[test]
fn config_region_reads_and_forwards_changes() {
    let mut fx = fixture();
    let f = &mut fx.function;
    assert_eq!(cfg_read32(f, 0), 0x0010_1b36);
    let mut whole = vec![0u8; 4096];
    f.region_read(CONFIG, 0, &mut whole)
        .expect("whole config space");
    assert_eq!(&whole[0..2], &[0x36, 0x1b]);

    f.region_write(CONFIG, 0x10, &0xfebf_0000u32.to_le_bytes())
        .expect("bar0");
    cfg_write16(f, regs::COMMAND as u64, 0x6);
    assert_eq!(f.config().bar_address(0), Some(0xfebf_0000));
    let changes = fx.changes.lock().expect("lock").clone();
    assert!(matches!(
        changes.first(),
        Some(ConfigChange::CommandChanged { new, .. }) if new.bus_master() && new.memory_enabled()
    ));
    assert!(changes.contains(&ConfigChange::BarMoved {
        index: 0,
        old: None,
        new: Some(0xfebf_0000)
    }));
}

#[test]
fn bar_accesses_reach_the_model_and_msix_structures() {
    let mut fx = fixture();
    let f = &mut fx.function;
    f.region_write(0, 0x14, &0x0046_0001u32.to_le_bytes())
        .expect("model write");
    let mut buf = [0u8; 4];
    f.region_read(0, 0x14, &mut buf).expect("model read");
    assert_eq!(u32::from_le_bytes(buf), 0x0046_0001);

    // MSI-X table at 0x2000: entry 1 vector control reads masked.
    f.region_read(0, 0x2000 + 16 + 12, &mut buf)
        .expect("table read");
    assert_eq!(u32::from_le_bytes(buf), 1);
    f.region_write(0, 0x2000 + 16 + 8, &0xabcdu32.to_le_bytes())
        .expect("table write");
    f.region_read(0, 0x2000 + 16 + 8, &mut buf)
        .expect("table read");
    assert_eq!(u32::from_le_bytes(buf), 0xabcd);
    assert_eq!(
        &f.model().regs[0x2018..0x201c],
        &[0, 0, 0, 0],
        "not the model's"
    );

    let mut pba = [0u8; 8];
    f.region_read(0, 0x3000, &mut pba).expect("pba read");
    assert_eq!(pba, [0; 8]);
}

#[test]
fn msix_enable_in_config_and_worker_notify_reach_the_eventfd() {
    let mut fx = fixture();
    let f = &mut fx.function;
    let fd = eventfd();
    f.set_irqs(IrqSet {
        index: VFIO_PCI_MSIX_IRQ_INDEX,
        action: IrqAction::Trigger,
        start: 2,
        count: 1,
        data: IrqData::EventFds(vec![Some(fd.try_clone().expect("clone"))]),
    })
    .expect("bind vector 2");
    let msix = f.config().capability_offset(cap_id::MSIX).expect("msix") as u64;

    // Doorbell before MSI-X is enabled: no MSI-X, no INTx eventfd: dropped.
    f.region_write(0, 0x1000, &[2, 0, 0, 0]).expect("doorbell");
    assert_eq!(drain(&fd), 0);

    cfg_write16(f, msix + 2, 0xc000); // enabled + function masked
    assert!(f.irq().msix_enabled());
    f.region_write(0, 0x1000, &[2, 0, 0, 0]).expect("doorbell");
    assert_eq!(drain(&fd), 0, "function masked");
    let mut pba = [0u8; 8];
    f.region_read(0, 0x3000, &mut pba).expect("pba");
    assert_eq!(
        u64::from_le_bytes(pba),
        1 << 2,
        "pending bit visible in the BAR"
    );

    cfg_write16(f, msix + 2, 0x8000); // unmask the function
    assert_eq!(drain(&fd), 1, "pending vector delivered on unmask");
    f.region_write(0, 0x1000, &[2, 0, 0, 0]).expect("doorbell");
    assert_eq!(drain(&fd), 1);
    assert!(fx
        .changes
        .lock()
        .expect("lock")
        .contains(&ConfigChange::MsixControlChanged(MsixControl::ENABLED)));
}

#[test]
fn malformed_region_accesses_are_errors_not_panics() {
    let mut fx = fixture();
    let f = &mut fx.function;
    let mut buf = [0u8; 8];
    // Config space.
    assert!(f.region_read(CONFIG, 4093, &mut buf[..4]).is_err());
    assert!(f.region_read(CONFIG, u64::MAX, &mut buf[..1]).is_err());
    assert!(f.region_write(CONFIG, 4096, &buf[..1]).is_err());
    assert!(f.region_read(CONFIG, 0, &mut []).is_err());
    // BARs: beyond the end, overflow, empty, unimplemented, bad index.
    assert!(f.region_read(0, 16 * 1024 - 2, &mut buf[..4]).is_err());
    assert!(f.region_write(0, u64::MAX - 1, &buf[..4]).is_err());
    assert!(f.region_read(0, 0, &mut []).is_err());
    assert!(
        f.region_read(1, 0, &mut buf[..4]).is_err(),
        "upper half of BAR0"
    );
    assert!(f.region_write(5, 0, &buf[..4]).is_err());
    assert!(f.region_read(6, 0, &mut buf[..4]).is_err(), "no ROM");
    assert!(f.region_read(8, 0, &mut buf[..4]).is_err(), "no VGA");
    assert!(f.region_read(9, 0, &mut buf[..4]).is_err());
    assert!(f.region_read(u32::MAX, 0, &mut buf[..4]).is_err());
    // MSI-X: bad sizes, unaligned, straddling the table's edges.
    assert!(f.region_read(0, 0x2000, &mut buf[..2]).is_err());
    assert!(f.region_write(0, 0x2002, &buf[..4]).is_err());
    assert!(f.region_read(0, 0x1ffc, &mut buf[..8]).is_err());
    assert!(f
        .region_read(0, 0x2000 + 4 * 16 - 4, &mut buf[..8])
        .is_err());
    assert!(f.region_read(0, 0x3000, &mut buf[..3]).is_err());
    // Between the table's end and the PBA the model answers.
    assert!(f.region_read(0, 0x2000 + 4 * 16, &mut buf[..4]).is_ok());
    // SET_IRQS nonsense.
    assert!(f
        .set_irqs(IrqSet {
            index: VFIO_PCI_MSIX_IRQ_INDEX,
            action: IrqAction::Trigger,
            start: 3,
            count: 2,
            data: IrqData::None,
        })
        .is_err());
    assert!(f
        .set_irqs(IrqSet {
            index: 42,
            action: IrqAction::Mask,
            start: 0,
            count: 1,
            data: IrqData::None,
        })
        .is_err());
}

#[test]
fn reset_restores_config_interrupts_and_model() {
    let mut fx = fixture();
    let f = &mut fx.function;
    let msix = f.config().capability_offset(cap_id::MSIX).expect("msix") as u64;
    cfg_write16(f, regs::COMMAND as u64, 0x6);
    cfg_write16(f, msix + 2, 0x8000);
    f.region_write(0, 0x14, &[1, 2, 3, 4]).expect("model write");
    f.reset().expect("reset");
    assert_eq!(f.config().command().0, 0);
    assert_eq!(f.config().msix_control(), Some(MsixControl::DISABLED));
    assert!(!f.irq().msix_enabled());
    assert_eq!(f.model().resets, 1);
    assert_eq!(&f.model().regs[0x14..0x18], &[0, 0, 0, 0]);
}

#[test]
fn from_parts_checks_the_controller_matches() {
    let fx = fixture();
    let config = fx.function.config().clone();
    let model = |irq: Arc<InterruptController>| TestModel {
        regs: vec![0; 16 * 1024],
        irq,
        changes: Arc::new(Mutex::new(Vec::new())),
        resets: 0,
        backing: -1,
        areas: Vec::new(),
        bar2_mmapped: false,
    };
    let irq = InterruptController::for_config(&config);
    assert_eq!(irq.msix_vectors(), 4);
    assert!(PciFunction::from_parts(config.clone(), Arc::clone(&irq), model(irq)).is_ok());
    let wrong = InterruptController::new(8, 1);
    assert!(PciFunction::from_parts(config, Arc::clone(&wrong), model(wrong)).is_err());
}
