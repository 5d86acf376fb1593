//! A function reset must quiesce the NIC's engines: once the reset
//! returns, nothing the device fetched before it may touch guest memory.
//! Driven through the PCI function (config space, BME, DEVICE_RESET) over
//! fake guest memory: no socket, no QEMU.

use std::sync::Arc;
use std::time::Duration;

use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::GuestMemory;
use p2plab_kit::testing::wait_until;
use p2plab_nic::descriptor::encode;
use p2plab_nic::regs::*;
use p2plab_nic::{nic_function, NicFunction, Wire, DEFAULT_IDS};
use p2plab_pci::PciFunction;
use p2plab_vfio_user::Device;
use p2plab_wire::Frame;

const RAM: u64 = 0x10_0000;
const RX_RING: u64 = RAM;
const BUFFERS: u64 = RAM + 0x1_0000;
const BUFFER_LEN: u32 = 4096;
const ENTRIES: u32 = 8;
/// vfio-pci's config space region.
const CONFIG: u32 = 7;
/// COMMAND: memory decode and Bus Master Enable.
const MEM_AND_BME: u16 = 0x0006;
/// What the buffers hold before the device may write them.
const POISON: u8 = 0xee;

fn write32(f: &mut PciFunction<NicFunction>, reg: u64, value: u32) {
    f.region_write(u32::from(REGS_BAR), reg, &value.to_le_bytes())
        .unwrap();
}

fn read32(f: &mut PciFunction<NicFunction>, reg: u64) -> u32 {
    let mut b = [0u8; 4];
    f.region_read(u32::from(REGS_BAR), reg, &mut b).unwrap();
    u32::from_le_bytes(b)
}

/// What the guest driver does at probe: BME on, RX ring of poisoned
/// buffers posted, RX enabled.
fn post_rx_buffers(f: &mut PciFunction<NicFunction>, ram: &FakeGuestMemory) {
    f.region_write(CONFIG, 4, &MEM_AND_BME.to_le_bytes())
        .unwrap();
    let mut ring = Vec::new();
    for i in 0..ENTRIES - 1 {
        let addr = BUFFERS + u64::from(i * BUFFER_LEN);
        ring.extend_from_slice(&encode(addr, BUFFER_LEN, DescFlags::IRQ.raw(), i.into()));
    }
    ram.write(RX_RING, &ring).unwrap();
    ram.write(BUFFERS, &vec![POISON; (BUFFER_LEN * ENTRIES) as usize])
        .unwrap();
    write32(f, reg::RX_RING_BASE, RX_RING as u32);
    write32(f, reg::RX_RING_BASE + 4, 0);
    write32(f, reg::RX_RING_SIZE, ENTRIES);
    write32(f, reg::CTRL, Ctrl::RX_ENABLE.raw());
    write32(f, reg::RX_DOORBELL, ENTRIES - 1);
}

/// Catches: a NIC whose RX engine, holding a descriptor it took before a
/// function reset, writes a frame that arrives after the reset returned
/// into that descriptor's buffer (memory the guest driver may have freed
/// and reused by then). The frame must land nowhere in guest memory and
/// be counted as discarded. Several rounds, since the engine must be
/// caught holding its descriptor (it nearly always is: it waits for a
/// frame with it).
#[test]
fn a_frame_after_reset_lands_nowhere() {
    let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, 1 << 20));
    let (ours, theirs) = Wire::pair();
    let mut f = nic_function(
        &DEFAULT_IDS,
        ours,
        DEFAULT_MTU,
        ram.clone() as Arc<dyn GuestMemory>,
    )
    .unwrap();
    let control = f.model().nic().control();
    for round in 0..5u64 {
        post_rx_buffers(&mut f, &ram);
        wait_until(
            "the RX engine takes a descriptor",
            Duration::from_secs(5),
            || read32(&mut f, reg::STATUS) & DeviceStatus::RX_BUSY.raw() != 0,
        );
        let before = control.stats();
        f.reset().unwrap();
        theirs.send(Frame::new(vec![0x5a; 512]), &|| false).unwrap();
        wait_until("the frame is discarded", Duration::from_secs(5), || {
            control.stats().rx_discarded == before.rx_discarded + 1
        });
        let after = control.stats();
        assert_eq!(after.rx_packets, before.rx_packets, "round {round}");
        assert_eq!(after.rx_bytes, before.rx_bytes, "round {round}");
        assert_eq!(after.dma_errors, before.dma_errors, "round {round}");
        let mut buffers = vec![0u8; (BUFFER_LEN * ENTRIES) as usize];
        ram.read(BUFFERS, &mut buffers).unwrap();
        assert!(
            buffers.iter().all(|&b| b == POISON),
            "round {round}: the frame landed in a buffer after the reset"
        );
        let mut ring = vec![0u8; (DESC_SIZE * u64::from(ENTRIES)) as usize];
        ram.read(RX_RING, &mut ring).unwrap();
        for (i, desc) in ring.chunks(DESC_SIZE as usize).enumerate() {
            let status = u16::from_le_bytes([desc[14], desc[15]]);
            assert_eq!(status, 0, "round {round}: descriptor {i} completed");
        }
    }
}
