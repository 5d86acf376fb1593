//! The NIC model against fake guest memory and in-process wires: no
//! socket, no QEMU. Each test names the broken device it would catch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::GuestMemory;
use p2plab_kit::testing::RecordingInterrupts;
use p2plab_nic::descriptor::{encode, RingError, Status};
use p2plab_nic::regs::*;
use p2plab_nic::{Nic, Wire};

const RAM: u64 = 0x10_0000;
const RAM_SIZE: usize = 4 << 20;
const PEER_BAR: u64 = 0x8000_0000;
const PEER_SIZE: usize = 1 << 20;
const TX_RING: u64 = RAM;
const RX_RING: u64 = RAM + 0x1000;
const BUFFERS: u64 = RAM + 0x10_0000;
const ENTRIES: u32 = 8;

struct Rig {
    nic: Nic,
    memory: Arc<FakeGuestMemory>,
    irq: Arc<RecordingInterrupts>,
    tx_tail: u32,
    rx_tail: u32,
}

fn memory() -> Arc<FakeGuestMemory> {
    Arc::new(
        FakeGuestMemory::new()
            .with_region(RAM, RAM_SIZE)
            .with_peer_region(PEER_BAR, PEER_SIZE),
    )
}

impl Rig {
    fn new(wire: Wire) -> Self {
        let memory = memory();
        let irq = RecordingInterrupts::new();
        let nic = Nic::new(wire, DEFAULT_MTU, memory.clone(), irq.clone()).unwrap();
        nic.set_bus_master(true);
        let mut rig = Rig {
            nic,
            memory,
            irq,
            tx_tail: 0,
            rx_tail: 0,
        };
        rig.configure();
        rig
    }

    /// Rings at their places, interrupts unmasked, both engines on.
    fn configure(&mut self) {
        let rig = self;
        rig.tx_tail = 0;
        rig.rx_tail = 0;
        rig.write64(reg::TX_RING_BASE, TX_RING);
        rig.write32(reg::TX_RING_SIZE, ENTRIES);
        rig.write64(reg::RX_RING_BASE, RX_RING);
        rig.write32(reg::RX_RING_SIZE, ENTRIES);
        rig.write32(reg::INT_MASK, 0);
        rig.write32(reg::CTRL, Ctrl::TX_ENABLE.raw() | Ctrl::RX_ENABLE.raw());
    }

    fn write32(&self, reg: u64, value: u32) {
        self.nic.regs_write(reg, &value.to_le_bytes());
    }

    fn write64(&self, reg: u64, value: u64) {
        self.nic.regs_write(reg, &value.to_le_bytes());
    }

    fn read32(&self, reg: u64) -> u32 {
        let mut b = [0u8; 4];
        self.nic.regs_read(reg, &mut b);
        u32::from_le_bytes(b)
    }

    fn post(&mut self, tx: bool, addr: u64, len: u32, cookie: u64) -> u64 {
        let (ring, tail, doorbell) = if tx {
            (TX_RING, &mut self.tx_tail, reg::TX_DOORBELL)
        } else {
            (RX_RING, &mut self.rx_tail, reg::RX_DOORBELL)
        };
        let slot = ring + u64::from(*tail) * DESC_SIZE;
        self.memory
            .write(slot, &encode(addr, len, DescFlags::IRQ.raw(), cookie))
            .unwrap();
        *tail = (*tail + 1) % ENTRIES;
        let value = *tail;
        self.write32(doorbell, value);
        slot
    }

    /// Waits for the device to write the descriptor's status; returns
    /// (status, done_len, cookie).
    fn wait_done(&self, slot: u64) -> (u16, u32, u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut raw = [0u8; DESC_SIZE as usize];
            self.memory.read(slot, &mut raw).unwrap();
            let status = u16::from_le_bytes([raw[14], raw[15]]);
            if status != 0 {
                let done = u32::from_le_bytes(raw[24..28].try_into().unwrap());
                let cookie = u64::from_le_bytes(raw[16..24].try_into().unwrap());
                return (status, done, cookie);
            }
            assert!(
                Instant::now() < deadline,
                "descriptor at {slot:#x} never completed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn assert_pending(&self, slot: u64, for_ms: u64) {
        std::thread::sleep(Duration::from_millis(for_ms));
        let mut status = [0u8; 2];
        self.memory.read(slot + DESC_STATUS, &mut status).unwrap();
        assert_eq!(u16::from_le_bytes(status), 0, "descriptor completed early");
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Would catch a NIC that does not move frame bytes, writes the wrong
/// length or status, touches the cookie, or skips the interrupt.
#[test]
fn loopback_moves_a_frame_from_ram_to_ram() {
    let mut rig = Rig::new(Wire::loopback());
    assert_eq!(rig.read32(reg::ID), ID_MAGIC);
    assert_eq!(rig.read32(reg::MTU), DEFAULT_MTU);
    let status = rig.read32(reg::STATUS);
    assert_eq!(
        status
            & (DeviceStatus::LINK_UP.raw()
                | DeviceStatus::TX_ENABLED.raw()
                | DeviceStatus::RX_ENABLED.raw()
                | DeviceStatus::BUS_MASTER.raw()
                | DeviceStatus::HALTED.raw()),
        DeviceStatus::LINK_UP.raw()
            | DeviceStatus::TX_ENABLED.raw()
            | DeviceStatus::RX_ENABLED.raw()
            | DeviceStatus::BUS_MASTER.raw()
    );
    let data = pattern(65536, 7);
    rig.memory.write(BUFFERS, &data).unwrap();
    let rx = rig.post(false, BUFFERS + 0x10_0000, 65536, 0xbeef);
    let tx = rig.post(true, BUFFERS, 65536, 0xcafe);
    assert_eq!(rig.wait_done(tx), (Status::Ok.code(), 65536, 0xcafe));
    assert_eq!(rig.wait_done(rx), (Status::Ok.code(), 65536, 0xbeef));
    let mut got = vec![0u8; 65536];
    rig.memory.read(BUFFERS + 0x10_0000, &mut got).unwrap();
    assert_eq!(got, data);
    let stats = rig.nic.control().stats();
    assert_eq!((stats.tx_packets, stats.tx_bytes), (1, 65536));
    assert_eq!((stats.rx_packets, stats.rx_bytes), (1, 65536));
    assert_eq!((stats.tx_peer_bar_bytes, stats.rx_peer_bar_bytes), (0, 0));
    assert_eq!(rig.read32(reg::TX_HEAD), 1);
    assert_eq!(rig.read32(reg::RX_HEAD), 1);
    assert_eq!(
        rig.read32(reg::INT_STATUS),
        IntCauses::TX.raw() | IntCauses::RX.raw()
    );
    assert!(rig.irq.count(NIC_VECTOR) >= 1);
    assert_eq!(
        rig.irq.count(NIC_VECTOR),
        rig.irq.total(),
        "only the NIC's vector"
    );
    rig.write32(reg::INT_STATUS, IntCauses::TX.raw() | IntCauses::RX.raw());
    assert_eq!(rig.read32(reg::INT_STATUS), 0);
}

/// Would catch a wire that loses, reorders or mixes frames between two
/// NICs, a receiver that does not hold frames until a buffer is posted
/// (flow control), or peer-BAR traffic not counted as such.
#[test]
fn two_nics_move_many_frames_peer_bar_to_peer_bar() {
    let (a, b) = Wire::pair();
    let mut nic0 = Rig::new(a);
    let mut nic1 = Rig::new(b);
    let frame = 32 << 10;
    let frames = PEER_SIZE / frame;
    let data = pattern(PEER_SIZE, 3);
    nic0.memory.write(PEER_BAR, &data).unwrap();
    // Send everything before any buffer is posted: the wire must hold
    // the frames (and the TX engine wait), not drop them.
    let mut tx_slots = Vec::new();
    let mut sent = 0;
    let mut received = 0;
    let mut rx_slots = std::collections::VecDeque::new();
    while received < frames {
        while sent < frames && tx_slots.len() < (ENTRIES - 1) as usize {
            let addr = PEER_BAR + (sent * frame) as u64;
            tx_slots.push(nic0.post(true, addr, frame as u32, sent as u64));
            sent += 1;
        }
        if received == 0 && rx_slots.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        while rx_slots.len() < (ENTRIES - 1) as usize && received + rx_slots.len() < frames {
            let n = received + rx_slots.len();
            let addr = PEER_BAR + (n * frame) as u64;
            rx_slots.push_back((nic1.post(false, addr, frame as u32, n as u64), n));
        }
        let (slot, n) = rx_slots.pop_front().unwrap();
        assert_eq!(
            nic1.wait_done(slot),
            (Status::Ok.code(), frame as u32, n as u64)
        );
        received += 1;
        // Reuse TX slots that completed.
        tx_slots.retain(|&slot| {
            let mut s = [0u8; 2];
            nic0.memory.read(slot + DESC_STATUS, &mut s).unwrap();
            u16::from_le_bytes(s) == 0
        });
    }
    let mut got = vec![0u8; PEER_SIZE];
    nic1.memory.read(PEER_BAR, &mut got).unwrap();
    assert!(got == data, "payload differs after the wire");
    let s0 = nic0.nic.control().stats();
    let s1 = nic1.nic.control().stats();
    assert_eq!(s0.tx_packets, frames as u64);
    assert_eq!(s0.tx_peer_bar_bytes, PEER_SIZE as u64);
    assert_eq!(s1.rx_packets, frames as u64);
    assert_eq!(s1.rx_peer_bar_bytes, PEER_SIZE as u64);
    assert_eq!((s0.rx_packets, s1.tx_packets), (0, 0));
}

/// Would catch injected drops that still deliver, corruption that goes
/// unnoticed by the receiver, or counters that miss them.
#[test]
fn wire_faults_drop_and_corrupt_frames() {
    let mut rig = Rig::new(Wire::loopback());
    let control = rig.nic.control();
    control.inject("drop,count=1".parse().unwrap()).unwrap();
    rig.memory.write(BUFFERS, &pattern(4096, 1)).unwrap();
    let rx = rig.post(false, BUFFERS + 0x8000, 4096, 1);
    let dropped = rig.post(true, BUFFERS, 4096, 2);
    assert_eq!(
        rig.wait_done(dropped).0,
        Status::Ok.code(),
        "the sender cannot tell"
    );
    rig.assert_pending(rx, 100);
    control.inject("corrupt,count=1".parse().unwrap()).unwrap();
    let corrupted = rig.post(true, BUFFERS, 4096, 3);
    assert_eq!(rig.wait_done(corrupted).0, Status::Ok.code());
    assert_eq!(rig.wait_done(rx), (Status::BadFcs.code(), 4096, 1));
    let rx2 = rig.post(false, BUFFERS + 0x8000, 4096, 4);
    let clean = rig.post(true, BUFFERS, 4096, 5);
    rig.wait_done(clean);
    assert_eq!(rig.wait_done(rx2).0, Status::Ok.code());
    let stats = control.stats();
    assert_eq!((stats.wire_drops, stats.wire_corrupts), (1, 1));
    assert_eq!((stats.rx_fcs_errors, stats.rx_errors), (1, 1));
    assert_eq!(stats.rx_packets, 2);
    let report = control.report();
    assert!(report.iter().all(|r| r.fired == 1), "{report:?}");
}

/// Would catch a delay that does not hold the frame.
#[test]
fn wire_delay_holds_the_frame() {
    let mut rig = Rig::new(Wire::loopback());
    rig.nic
        .control()
        .inject("delay=300ms,count=1".parse().unwrap())
        .unwrap();
    let rx = rig.post(false, BUFFERS + 0x8000, 4096, 1);
    let start = Instant::now();
    rig.post(true, BUFFERS, 512, 2);
    rig.wait_done(rx);
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(rig.nic.control().stats().wire_delays, 1);
}

/// Would catch frames over the MTU sent, an RX buffer overrun, zero
/// lengths or unknown flags accepted, or a DMA fault turned into a panic
/// or a silent success.
#[test]
fn bad_descriptors_and_buffers_complete_with_errors() {
    let mut rig = Rig::new(Wire::loopback());
    let too_long = rig.post(true, BUFFERS, DEFAULT_MTU + 1, 1);
    assert_eq!(rig.wait_done(too_long), (Status::TooLong.code(), 0, 1));
    let empty = rig.post(true, BUFFERS, 0, 2);
    assert_eq!(rig.wait_done(empty).0, Status::BadDescriptor.code());
    let unmapped = rig.post(true, 0x7000_0000, 4096, 3);
    assert_eq!(rig.wait_done(unmapped).0, Status::DmaError.code());
    // A frame longer than the buffer: the buffer gets its start only.
    rig.memory.write(BUFFERS + 0x9000, &[0xaa; 64]).unwrap();
    let small = rig.post(false, BUFFERS + 0x8000, 4096, 4);
    rig.memory.write(BUFFERS, &pattern(8192, 9)).unwrap();
    let big = rig.post(true, BUFFERS, 8192, 5);
    assert_eq!(rig.wait_done(big).0, Status::Ok.code());
    assert_eq!(rig.wait_done(small), (Status::Truncated.code(), 4096, 4));
    let mut after = [0u8; 64];
    rig.memory.read(BUFFERS + 0x9000, &mut after).unwrap();
    assert_eq!(after, [0xaa; 64], "RX wrote past its buffer");
    // Unknown flags.
    let slot = TX_RING + u64::from(rig.tx_tail) * DESC_SIZE;
    rig.memory
        .write(slot, &encode(BUFFERS, 64, 0x80, 6))
        .unwrap();
    rig.tx_tail += 1;
    rig.write32(reg::TX_DOORBELL, rig.tx_tail);
    assert_eq!(rig.wait_done(slot).0, Status::BadDescriptor.code());
    let stats = rig.nic.control().stats();
    assert_eq!(stats.tx_errors, 4);
    assert_eq!((stats.rx_truncated, stats.rx_errors), (1, 1));
    assert_eq!(rig.read32(reg::STATUS) & DeviceStatus::HALTED.raw(), 0);
}

/// Would catch an engine that runs without Bus Master Enable, accepts a
/// bad ring or doorbell, or keeps running after reset.
#[test]
fn bus_master_ring_errors_and_reset() {
    let mut rig = Rig::new(Wire::loopback());
    rig.nic.set_bus_master(false);
    let rx = rig.post(false, BUFFERS + 0x8000, 4096, 1);
    let tx = rig.post(true, BUFFERS, 64, 2);
    rig.assert_pending(tx, 100);
    rig.nic.set_bus_master(true);
    rig.wait_done(tx);
    rig.wait_done(rx);

    rig.write32(reg::TX_DOORBELL, ENTRIES);
    assert_ne!(rig.read32(reg::STATUS) & DeviceStatus::HALTED.raw(), 0);
    assert_eq!(rig.read32(reg::ERROR), RingError::BadDoorbell.code());
    assert_ne!(rig.read32(reg::INT_STATUS) & IntCauses::ERROR.raw(), 0);
    rig.write32(reg::CTRL, Ctrl::RX_ENABLE.raw());
    rig.write32(reg::TX_RING_SIZE, 3);
    rig.write32(reg::CTRL, Ctrl::RX_ENABLE.raw() | Ctrl::TX_ENABLE.raw());
    assert_eq!(rig.read32(reg::ERROR), RingError::BadRing.code());
    rig.write32(reg::CTRL, Ctrl::RX_ENABLE.raw());
    rig.write32(reg::TX_RING_SIZE, ENTRIES);
    rig.write32(reg::CTRL, Ctrl::RX_ENABLE.raw() | Ctrl::TX_ENABLE.raw());
    assert_eq!(rig.read32(reg::STATUS) & DeviceStatus::HALTED.raw(), 0);
    assert_eq!(rig.read32(reg::ERROR), 0);
    assert_eq!(rig.read32(reg::TX_HEAD), 0, "enable restarts the ring");

    rig.write32(reg::SCRATCH, 0x1234);
    rig.nic.regs_write(reg::SCRATCH, &[1, 2]);
    assert_eq!(
        rig.read32(reg::SCRATCH),
        0x1234,
        "a 2-byte write is ignored"
    );
    rig.nic.reset().unwrap();
    assert_eq!(rig.read32(reg::SCRATCH), 0);
    assert_eq!(rig.read32(reg::CTRL), 0);
    assert_eq!(rig.read32(reg::INT_MASK), IntCauses::ALL.raw());
    let stats = rig.nic.control().stats();
    assert_eq!((stats.resets, stats.bad_register_accesses), (1, 1));
    assert_eq!(stats.ring_errors, 2);
}

/// Would catch a reset that wedges the engines, or a disabled receiver
/// that keeps frames for later: a frame arriving while RX is off is
/// dropped and counted, and both engines work on once set up again.
#[test]
fn engines_run_on_after_reset() {
    let mut rig = Rig::new(Wire::loopback());
    rig.memory.write(BUFFERS, &pattern(64, 5)).unwrap();
    let tx = rig.post(true, BUFFERS, 64, 3);
    rig.wait_done(tx);
    rig.nic.reset().unwrap();
    assert_eq!(
        rig.read32(reg::STATUS) & (DeviceStatus::RX_ENABLED.raw() | DeviceStatus::TX_ENABLED.raw()),
        0
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while rig.nic.control().stats().rx_discarded != 1 {
        assert!(Instant::now() < deadline, "the stale frame was not dropped");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The engines let go of their descriptors.
    while rig.read32(reg::STATUS) & (DeviceStatus::RX_BUSY.raw() | DeviceStatus::TX_BUSY.raw()) != 0
    {
        assert!(Instant::now() < deadline, "engines stay busy after reset");
        std::thread::sleep(Duration::from_millis(1));
    }
    rig.memory
        .write(TX_RING, &[0u8; 2 * DESC_SIZE as usize])
        .unwrap();
    rig.configure();
    rig.memory.write(BUFFERS, &pattern(32, 6)).unwrap();
    let rx = rig.post(false, BUFFERS + 0x8000, 4096, 1);
    let tx = rig.post(true, BUFFERS, 32, 4);
    assert_eq!(rig.wait_done(tx), (Status::Ok.code(), 32, 4));
    assert_eq!(rig.wait_done(rx), (Status::Ok.code(), 32, 1));
    let mut got = [0u8; 32];
    rig.memory.read(BUFFERS + 0x8000, &mut got).unwrap();
    assert_eq!(got.to_vec(), pattern(32, 6), "a stale frame was delivered");
    assert_eq!(rig.nic.control().stats().rx_packets, 1);
}

/// Would catch a TX engine that reports itself busy (so a quiescing
/// driver times out) while it only waits for the wire, or one that cannot
/// be stopped while the peer does not read: the buffer is read before the
/// engine waits, TX_BUSY is clear while it waits, and disabling TX makes
/// it give up the frame without completing it.
#[test]
fn a_stalled_wire_holds_no_buffer() {
    // The other end exists but nobody reads it: its queue (8 frames) fills.
    let (ours, _theirs) = Wire::pair();
    let mut rig = Rig::new(ours);
    for round in 0..2u64 {
        let slots: Vec<u64> = (0..u64::from(ENTRIES - 1))
            .map(|i| rig.post(true, BUFFERS, 1024, round * 100 + i))
            .collect();
        if round == 0 {
            for slot in slots {
                assert_eq!(rig.wait_done(slot).0, Status::Ok.code());
            }
            continue;
        }
        // One more frame fits in the queue; the next one waits.
        let deadline = Instant::now() + Duration::from_secs(10);
        while rig.nic.control().stats().tx_packets < 8 {
            assert!(Instant::now() < deadline, "the queue did not fill");
            std::thread::sleep(Duration::from_millis(1));
        }
        let waiting = slots[1];
        rig.assert_pending(waiting, 100);
        assert_eq!(rig.nic.control().stats().tx_packets, 8);
        assert_eq!(
            rig.read32(reg::STATUS) & DeviceStatus::TX_BUSY.raw(),
            0,
            "TX_BUSY while only waiting for the wire"
        );
        rig.write32(reg::CTRL, Ctrl::RX_ENABLE.raw());
        rig.assert_pending(waiting, 100);
        assert_eq!(rig.nic.control().stats().tx_packets, 8);
        assert_eq!(rig.read32(reg::STATUS) & DeviceStatus::TX_ENABLED.raw(), 0);
    }
}
