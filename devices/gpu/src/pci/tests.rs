//! The PCI function driven the way QEMU drives it: config space, regions,
//! IRQ eventfds.

use super::*;
use crate::status::StatusCode;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_vfio_user::{Device, DmaTarget, IrqAction, IrqData, IrqSet};
use vfio_bindings::bindings::vfio::{
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

// Config-space layout as a guest sees it, spelled out here so these tests
// check p2plab-pci's layout instead of reusing it.
const VENDOR_DEVICE_ID: u64 = 0x00;
const COMMAND: u64 = 0x04;
const REVISION_CLASS: u64 = 0x08;
const BAR2_LOW: u64 = 0x18;
const BAR2_HIGH: u64 = 0x1c;
const SUBSYSTEM_IDS: u64 = 0x2c;
const COMMAND_MEMORY: u16 = 1 << 1;
const COMMAND_BUS_MASTER: u16 = 1 << 2;
const BAR_FLAGS: u32 = 0xf;
const BAR_MEM64_PREFETCHABLE: u32 = 0b1100;
const CAP_ID_PCIE: u8 = 0x10;
const CAP_ID_MSIX: u8 = 0x11;
const MSIX_CONTROL: u64 = 2;
const MSIX_CONTROL_ENABLE: u16 = 1 << 15;
const MSIX_ENTRY_VECTOR_CONTROL: u64 = 12;

fn function(vram_size: u64) -> PciFunction<GpuFunction> {
    gpu_function(
        &DEFAULT_IDS,
        Vram::new(vram_size).unwrap(),
        // No guest memory: every DMA faults.
        Arc::new(FakeGuestMemory::new()),
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

fn set_command(f: &mut PciFunction<GpuFunction>, command: u16) {
    cfg_write(f, COMMAND, &command.to_le_bytes());
}

/// Places BAR2 at `address` (64-bit BAR: low dword then high dword).
fn place_vram_bar(f: &mut PciFunction<GpuFunction>, address: u64) {
    cfg_write(
        f,
        BAR2_LOW,
        &((address as u32) | BAR_MEM64_PREFETCHABLE).to_le_bytes(),
    );
    cfg_write(f, BAR2_HIGH, &((address >> 32) as u32).to_le_bytes());
}

fn bar0_read32(f: &mut PciFunction<GpuFunction>, reg: Reg) -> u32 {
    let mut b = [0u8; 4];
    f.region_read(u32::from(REGS_BAR), reg.offset(), &mut b)
        .unwrap();
    u32::from_le_bytes(b)
}

fn bar0_write32(f: &mut PciFunction<GpuFunction>, reg: Reg, value: u32) {
    f.region_write(u32::from(REGS_BAR), reg.offset(), &value.to_le_bytes())
        .unwrap();
}

fn status(f: &mut PciFunction<GpuFunction>) -> Status {
    Status::from_raw(bar0_read32(f, Reg::Status))
}

#[test]
fn identity_and_bars() {
    let mut f = function(1 << 30);
    assert_eq!(
        cfg_read32(&mut f, VENDOR_DEVICE_ID),
        u32::from(DEFAULT_IDS.device_id) << 16 | u32::from(DEFAULT_IDS.vendor_id)
    );
    assert_eq!(cfg_read32(&mut f, REVISION_CLASS) >> 8, CLASS_CODE.as_u24());
    assert_eq!(cfg_read32(&mut f, REVISION_CLASS) as u8, 1);
    // BAR2: 64-bit (type 0b10) prefetchable memory.
    assert_eq!(
        cfg_read32(&mut f, BAR2_LOW) & BAR_FLAGS,
        BAR_MEM64_PREFETCHABLE
    );
    // Size probe of the 64-bit BAR2.
    cfg_write(&mut f, BAR2_LOW, &[0xff; 4]);
    cfg_write(&mut f, BAR2_HIGH, &[0xff; 4]);
    let lo = u64::from(cfg_read32(&mut f, BAR2_LOW) & !BAR_FLAGS);
    let hi = u64::from(cfg_read32(&mut f, BAR2_HIGH));
    assert_eq!(!(hi << 32 | lo) + 1, 1 << 30);
    assert_eq!(f.config().bar_size(REGS_BAR.into()), Some(REGS_BAR_SIZE));
    assert_eq!(f.config().bar_size(VRAM_BAR.into()), Some(1 << 30));
    assert_eq!(
        f.config().bar_size(MSIX.bar.into()),
        Some(p2plab_kit::MsixBar::SIZE)
    );
    assert_eq!(f.config().msix().map(|m| m.vectors), Some(MSIX.vectors));
    assert!(
        f.config().capability_offset(CAP_ID_PCIE).is_some(),
        "PCIe cap"
    );
}

#[test]
fn custom_ids() {
    let ids = PciIds {
        vendor_id: 0x1234,
        device_id: 0x5678,
        subsystem_vendor_id: 0x1af4,
        subsystem_id: 0x0001,
        revision: 1,
    };
    let config = config_space(&ids, 256 << 20).unwrap();
    assert_eq!((config.vendor_id(), config.device_id()), (0x1234, 0x5678));
    assert_eq!(config.read_u32(SUBSYSTEM_IDS), Some(0x0001_1af4));
}

#[test]
fn vram_region_is_mmappable_from_the_memfd() {
    let f = function(256 << 20);
    let info = f.region_info(VRAM_BAR.into()).unwrap();
    assert_eq!(info.size, 256 << 20);
    assert!(info.flags & VFIO_REGION_INFO_FLAG_MMAP != 0);
    assert_eq!(info.fd, Some(f.model().gpu().vram().raw_fd()));
    assert_eq!(info.fd_offset, 0);
    let regs = f.region_info(REGS_BAR.into()).unwrap();
    assert_eq!(regs.size, REGS_BAR_SIZE);
    assert!(regs.fd.is_none(), "registers must trap");
}

#[test]
fn registers_and_trapped_vram_through_the_function() {
    let mut f = function(256 << 20);
    let vram = u32::from(VRAM_BAR);
    assert_eq!(bar0_read32(&mut f, Reg::Id), ID_MAGIC);
    bar0_write32(&mut f, Reg::Scratch, 7);
    assert_eq!(bar0_read32(&mut f, Reg::Scratch), 7);
    f.region_write(vram, 4096, b"vram").unwrap();
    let mut back = [0u8; 4];
    f.region_read(vram, 4096, &mut back).unwrap();
    assert_eq!(&back, b"vram");
    assert!(f.region_read(vram, (256 << 20) - 2, &mut back).is_err());
}

#[test]
fn bus_master_follows_the_command_register_and_reset() {
    let mut f = function(256 << 20);
    assert!(!status(&mut f).contains(Status::BUS_MASTER));
    set_command(&mut f, COMMAND_MEMORY | COMMAND_BUS_MASTER);
    assert!(status(&mut f).contains(Status::BUS_MASTER));
    bar0_write32(&mut f, Reg::Scratch, 7);
    Device::reset(&mut f).unwrap();
    assert!(!status(&mut f).contains(Status::BUS_MASTER));
    assert_eq!(bar0_read32(&mut f, Reg::Scratch), 0);
}

#[test]
fn vram_bar_placement_is_tracked() {
    let mut f = function(256 << 20);
    place_vram_bar(&mut f, 0x1_8000_0000);
    set_command(&mut f, COMMAND_MEMORY);
    assert_eq!(f.model().vram_address(), Some(0x1_8000_0000));
    set_command(&mut f, 0);
    assert_eq!(f.model().vram_address(), None);
}

#[test]
fn vram_window_follows_the_bar() {
    let mut f = function(256 << 20);
    let dma = DmaSpace::new();
    f.model_mut().serve_vram_locally(dma.clone());
    assert_eq!(dma.classify(0x1_8000_0000, 4096), DmaTarget::Unmapped);
    place_vram_bar(&mut f, 0x1_8000_0000);
    set_command(&mut f, COMMAND_MEMORY);
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
    // Moved by the guest (low dword only).
    cfg_write(
        &mut f,
        BAR2_LOW,
        &(0xc000_0000u32 | BAR_MEM64_PREFETCHABLE).to_le_bytes(),
    );
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
    let cap = f.config().capability_offset(CAP_ID_MSIX).unwrap() as u64;
    cfg_write(
        &mut f,
        cap + MSIX_CONTROL,
        &MSIX_CONTROL_ENABLE.to_le_bytes(),
    );
    set_command(&mut f, COMMAND_MEMORY | COMMAND_BUS_MASTER);
    // Unmask table entry 0.
    f.region_write(
        u32::from(MSIX.bar),
        MSIX_ENTRY_VECTOR_CONTROL,
        &0u32.to_le_bytes(),
    )
    .unwrap();
    // A halted ring raises INT_ERROR; unmask it and wait for the MSI-X.
    bar0_write32(&mut f, Reg::IntMask, 0);
    bar0_write32(&mut f, Reg::RingSize, 3);
    bar0_write32(&mut f, Reg::RingCtrl, RingCtrl::ENABLE.raw());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if eventfd.read().is_ok() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no MSI-X");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        bar0_read32(&mut f, Reg::EngineError),
        StatusCode::RingBadSize.code()
    );
}
