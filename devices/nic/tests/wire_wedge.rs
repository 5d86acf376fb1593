//! The NIC's TX engine against a wire peer that stops reading: a send
//! is bounded by the wire's timeout, and a device reset takes the engine
//! back at once whatever the peer does. Over a real unix socket whose
//! other end is a raw socket that never reads; guest memory is fake.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::GuestMemory;
use p2plab_kit::testing::RecordingInterrupts;
use p2plab_kit::DeviceControl;
use p2plab_nic::descriptor::{encode, Status};
use p2plab_nic::regs::*;
use p2plab_nic::{Nic, Wire, WireConfig, WireOptions};

const RAM: u64 = 0x10_0000;
const RAM_SIZE: usize = 4 << 20;
const TX_RING: u64 = RAM;
const BUFFER: u64 = RAM + 0x10_0000;
/// A frame size that is no multiple of anything the socket buffers are.
const FRAME: u32 = 60_001;
const ENTRIES: u32 = 64;
const UNMAPPED: u64 = 0x7000_0000;

struct Rig {
    nic: Nic,
    memory: Arc<FakeGuestMemory>,
    tail: u32,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Rig {
    /// A NIC whose wire listens on a socket, and a raw peer connected to
    /// it that never reads.
    fn with_deaf_peer(name: &str, send_timeout: Duration) -> (Rig, UnixStream, PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("p2plab-nic-wedge-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("wire.sock");
        let options = WireOptions {
            send_timeout,
            ..WireOptions::default()
        };
        let wire = Wire::open(&WireConfig::Listen(path.clone()), options).unwrap();
        let memory = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
        let nic = Nic::new(wire, MAX_MTU, memory.clone(), RecordingInterrupts::new()).unwrap();
        nic.set_bus_master(true);
        let peer = UnixStream::connect(&path).unwrap();
        let mut rig = Rig {
            nic,
            memory,
            tail: 0,
            _dir: TempDir(dir),
        };
        rig.wait("the link comes up", 5, |rig| {
            rig.read32(reg::STATUS) & DeviceStatus::LINK_UP.raw() != 0
        });
        rig.enable_tx();
        (rig, peer, path)
    }

    /// TX disabled, its ring cleared, enabled again (restarting at 0).
    fn enable_tx(&mut self) {
        self.write32(reg::CTRL, 0);
        self.tail = 0;
        self.memory
            .write(TX_RING, &vec![0u8; (ENTRIES as u64 * DESC_SIZE) as usize])
            .unwrap();
        self.write32(reg::TX_RING_BASE, TX_RING as u32);
        self.write32(reg::TX_RING_BASE + 4, 0);
        self.write32(reg::TX_RING_SIZE, ENTRIES);
        self.write32(reg::CTRL, Ctrl::TX_ENABLE.raw());
    }

    fn write32(&self, reg: u64, value: u32) {
        self.nic.regs_write(reg, &value.to_le_bytes());
    }

    fn read32(&self, reg: u64) -> u32 {
        let mut b = [0u8; 4];
        self.nic.regs_read(reg, &mut b);
        u32::from_le_bytes(b)
    }

    fn post(&mut self, addr: u64, len: u32) -> u64 {
        let slot = TX_RING + u64::from(self.tail) * DESC_SIZE;
        self.memory.write(slot, &encode(addr, len, 0, 0)).unwrap();
        self.tail = (self.tail + 1) % ENTRIES;
        self.write32(reg::TX_DOORBELL, self.tail);
        slot
    }

    fn status(&self, slot: u64) -> u16 {
        let mut status = [0u8; 2];
        self.memory.read(slot + DESC_STATUS, &mut status).unwrap();
        u16::from_le_bytes(status)
    }

    fn wire(&self) -> serde_json::Value {
        self.nic.control().counters()["wire"].clone()
    }

    fn wait(&self, what: &str, secs: u64, mut done: impl FnMut(&Rig) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !done(self) {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Posts frames until the TX engine is stuck in a send (the peer's
    /// socket is full); returns the descriptor it is stuck on. A send
    /// timeout as short as this wait can end the stuck send before a
    /// loaded test thread looks again: a descriptor that completed with
    /// an error status is the stuck one too.
    fn fill_until_stuck(&mut self) -> u64 {
        self.memory
            .write(BUFFER, &vec![0x5a; FRAME as usize])
            .unwrap();
        for _ in 0..ENTRIES - 1 {
            let slot = self.post(BUFFER, FRAME);
            let deadline = Instant::now() + Duration::from_millis(300);
            loop {
                match self.status(slot) {
                    0 if Instant::now() > deadline => return slot,
                    0 => std::thread::sleep(Duration::from_millis(2)),
                    done if done == Status::Ok.code() => break,
                    _ => return slot,
                }
            }
        }
        panic!("{} frames went into a peer that never reads", ENTRIES - 1);
    }
}

/// Catches: a NIC whose TX engine stays stuck in a wire send across a
/// device reset (the peer stopped reading: the first wire's blocking
/// write_all). After the reset the engine must take new work at once: a
/// descriptor with an unmapped buffer completes with DMA_ERROR, which
/// needs no wire at all, while the peer still reads nothing.
#[test]
fn a_reset_takes_tx_back_from_a_peer_that_never_reads() {
    let (mut rig, _peer, _) = Rig::with_deaf_peer("reset", Duration::from_secs(600));
    let stuck = rig.fill_until_stuck();
    let before = rig.nic.control().stats();
    let reset_at = Instant::now();
    rig.nic.reset().unwrap();
    rig.wait("the wire send is given up", 2, |rig| {
        rig.wire()["sends_abandoned"].as_u64() == Some(1)
    });
    assert!(
        reset_at.elapsed() < Duration::from_secs(1),
        "{:?}",
        reset_at.elapsed()
    );
    assert_eq!(
        rig.status(stuck),
        0,
        "the abandoned descriptor completed after the reset"
    );
    rig.enable_tx();
    let fresh = rig.post(UNMAPPED, 4096);
    rig.wait("the TX engine takes new work", 2, |rig| {
        rig.status(fresh) != 0
    });
    assert_eq!(rig.status(fresh), Status::DmaError.code());
    let after = rig.nic.control().stats();
    assert_eq!(
        after.tx_packets, before.tx_packets,
        "the abandoned frame counted as sent"
    );
    assert_eq!(after.resets, 1);
    assert_eq!(rig.wire()["send_timeouts"].as_u64(), Some(0));
}

/// Catches: a NIC whose TX waits forever for a peer that stopped reading
/// (no send timeout), or that hides it: the frame must complete with
/// LINK_DOWN after the timeout, the link go down (STATUS.LINK_UP clear)
/// and the counters say it; a peer that connects after that is served.
#[test]
fn tx_to_a_peer_that_stopped_reading_fails_after_the_timeout() {
    let timeout = Duration::from_millis(300);
    let (mut rig, peer, path) = Rig::with_deaf_peer("timeout", timeout);
    let stuck = rig.fill_until_stuck();
    rig.wait("the stuck frame completes", 5, |rig| rig.status(stuck) != 0);
    assert_eq!(rig.status(stuck), Status::LinkDown.code());
    assert_eq!(rig.read32(reg::STATUS) & DeviceStatus::LINK_UP.raw(), 0);
    assert_eq!(rig.wire()["send_timeouts"].as_u64(), Some(1));
    let stats = rig.nic.control().stats();
    assert!(stats.tx_errors >= 1, "{stats:?}");
    drop(peer);
    // A new peer (one that reads) gets the link, and frames flow again.
    let wire = Wire::open(&WireConfig::Connect(path), WireOptions::default()).unwrap();
    rig.wait("the link comes back", 5, |rig| {
        rig.read32(reg::STATUS) & DeviceStatus::LINK_UP.raw() != 0
    });
    rig.enable_tx();
    let slot = rig.post(BUFFER, 1000);
    let frame = wire.recv_timeout(Duration::from_secs(5)).expect("a frame");
    assert_eq!(frame.payload, vec![0x5a; 1000]);
    assert!(frame.fcs_ok());
    rig.wait("the frame completes", 5, |rig| rig.status(slot) != 0);
    assert_eq!(rig.status(slot), Status::Ok.code());
}
