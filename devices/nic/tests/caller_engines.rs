//! The NIC with its engines on the caller's thread
//! (`Nic::with_engines_on_caller`, `Nic::run_engines`), as the
//! `nic_rings` fuzz target runs it: the same descriptor, DMA, wire and
//! completion code as the engine threads, stepped until idle.

use std::sync::Arc;
use std::time::Duration;

use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::GuestMemory;
use p2plab_kit::testing::RecordingInterrupts;
use p2plab_nic::descriptor::{encode, Status};
use p2plab_nic::regs::*;
use p2plab_nic::{Nic, Wire};
use p2plab_wire::WireOptions;

const RAM: u64 = 0x10_0000;
const RAM_SIZE: usize = 1 << 20;
const TX_RING: u64 = RAM;
const RX_RING: u64 = RAM + 0x1000;
const BUFFERS: u64 = RAM + 0x8_0000;
const ENTRIES: u32 = 8;

struct Rig {
    nic: Nic,
    memory: Arc<FakeGuestMemory>,
    irq: Arc<RecordingInterrupts>,
}

impl Rig {
    fn new() -> Self {
        let memory = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
        let irq = RecordingInterrupts::new();
        let wire = Wire::loopback_with(WireOptions {
            send_timeout: Duration::ZERO,
            ..WireOptions::default()
        });
        let nic = Nic::with_engines_on_caller(wire, DEFAULT_MTU, memory.clone(), irq.clone());
        nic.set_bus_master(true);
        nic.regs_write(reg::TX_RING_BASE, &TX_RING.to_le_bytes());
        nic.regs_write(reg::TX_RING_SIZE, &ENTRIES.to_le_bytes());
        nic.regs_write(reg::RX_RING_BASE, &RX_RING.to_le_bytes());
        nic.regs_write(reg::RX_RING_SIZE, &ENTRIES.to_le_bytes());
        nic.regs_write(reg::INT_MASK, &0u32.to_le_bytes());
        nic.regs_write(
            reg::CTRL,
            &(Ctrl::TX_ENABLE.raw() | Ctrl::RX_ENABLE.raw()).to_le_bytes(),
        );
        Rig { nic, memory, irq }
    }

    /// Writes descriptor `slot` of a ring and rings its doorbell.
    fn post(&self, tx: bool, slot: u32, addr: u64, len: u32, cookie: u64) -> u64 {
        let (ring, doorbell) = if tx {
            (TX_RING, reg::TX_DOORBELL)
        } else {
            (RX_RING, reg::RX_DOORBELL)
        };
        let at = ring + u64::from(slot) * DESC_SIZE;
        self.memory
            .write(at, &encode(addr, len, DescFlags::IRQ.raw(), cookie))
            .unwrap();
        self.nic
            .regs_write(doorbell, &((slot + 1) % ENTRIES).to_le_bytes());
        at
    }

    /// (status, done_len) of the descriptor at `at`.
    fn result(&self, at: u64) -> (u16, u32) {
        let mut raw = [0u8; DESC_SIZE as usize];
        self.memory.read(at, &mut raw).unwrap();
        (
            u16::from_le_bytes([raw[14], raw[15]]),
            u32::from_le_bytes(raw[24..28].try_into().unwrap()),
        )
    }
}

/// Catches: engines that run nowhere (nothing moves before
/// `run_engines`), a `run_engines` that does not move a frame from a TX
/// buffer to an RX buffer with its length, status and interrupt, or one
/// that does not return once both rings are done.
#[test]
fn run_engines_moves_a_frame_and_returns_when_idle() {
    let rig = Rig::new();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    rig.memory.write(BUFFERS, &data).unwrap();
    let rx = rig.post(false, 0, BUFFERS + 0x1_0000, 4096, 1);
    let tx = rig.post(true, 0, BUFFERS, 4096, 2);
    assert_eq!(rig.result(tx), (0, 0), "no engine thread may have run");
    let steps = rig.nic.run_engines();
    assert!(steps >= 2, "one TX and one RX step at least, got {steps}");
    assert_eq!(rig.result(tx), (Status::Ok.code(), 4096));
    assert_eq!(rig.result(rx), (Status::Ok.code(), 4096));
    let mut got = vec![0u8; 4096];
    rig.memory.read(BUFFERS + 0x1_0000, &mut got).unwrap();
    assert_eq!(got, data);
    let stats = rig.nic.control().stats();
    assert_eq!((stats.tx_packets, stats.rx_packets), (1, 1));
    assert!(rig.irq.count(NIC_VECTOR) >= 1);
    assert_eq!(rig.nic.run_engines(), 0, "nothing left to do");
}

/// Catches: a caller-thread RX engine that loses the frame it took off
/// the wire while it had no buffer (the pending frame must wait for the
/// next descriptor), or one that fills a buffer twice.
#[test]
fn a_frame_waits_for_a_buffer_posted_later() {
    let rig = Rig::new();
    rig.memory.write(BUFFERS, &[0x5a; 512]).unwrap();
    let tx = rig.post(true, 0, BUFFERS, 512, 1);
    rig.nic.run_engines();
    assert_eq!(rig.result(tx), (Status::Ok.code(), 512));
    assert_eq!(rig.nic.control().stats().rx_packets, 0);
    let rx = rig.post(false, 0, BUFFERS + 0x1_0000, 4096, 2);
    assert!(rig.nic.run_engines() >= 1);
    assert_eq!(rig.result(rx), (Status::Ok.code(), 512));
    let stats = rig.nic.control().stats();
    assert_eq!((stats.rx_packets, stats.rx_discarded), (1, 0));
}

/// Catches: a caller-thread TX engine that waits forever on a full
/// wire (the receiver, enabled with no buffer, takes nothing: past the
/// wire's queue a send must fail with the wire's timeout and complete as
/// LinkDown), or one that skips or drops descriptors.
#[test]
fn a_full_wire_fails_sends_instead_of_hanging() {
    let rig = Rig::new();
    rig.memory.write(BUFFERS, &[1; 64]).unwrap();
    let mut slots = Vec::new();
    for n in 0..10 {
        slots.push(rig.post(true, n % ENTRIES, BUFFERS, 64, u64::from(n)));
        if n == ENTRIES - 2 {
            // The ring holds 7 at a time.
            rig.nic.run_engines();
        }
    }
    rig.nic.run_engines();
    let statuses: Vec<u16> = slots[7..].iter().map(|&at| rig.result(at).0).collect();
    // The wire queues 8 frames: the 8th goes, the 9th and 10th find it full.
    assert_eq!(
        statuses,
        [
            Status::Ok.code(),
            Status::LinkDown.code(),
            Status::LinkDown.code()
        ]
    );
    let stats = rig.nic.control().stats();
    assert_eq!((stats.tx_packets, stats.rx_packets), (8, 0));
}

/// Catches: `run_engines` stepping a NIC whose engines have threads (two
/// engines on one ring).
#[test]
fn run_engines_does_nothing_with_engine_threads() {
    let memory = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
    let nic = Nic::new(
        Wire::loopback(),
        DEFAULT_MTU,
        memory,
        RecordingInterrupts::new(),
    )
    .unwrap();
    assert_eq!(nic.run_engines(), 0);
}
