//! The `p2plab-nic` binary under attack, as `devices/nvme/tests/hostile_guest.rs`
//! and `devices/pci/tests/hostile_client.rs` attack theirs: malformed
//! register accesses, rings and buffers pointing at unmapped or wrapping
//! memory, huge lengths, doorbells past the ring, resets and Bus Master
//! Enable cleared mid-transfer, and a wire peer that sends garbage,
//! crowds in, or stops reading. The server must never crash or hang,
//! must answer with errors, and its counters must say what happened.
//!
//! rust-vmm's `vfio_user::Client` is the independent client (it maps
//! "guest RAM" as a memfd, as QEMU does). It cannot parse error replies,
//! so accesses the server must refuse go through a raw client built on
//! p2plab-vfio-user's message header. The server runs as a child process
//! (`p2plab_server::testing::SpawnedServer`).

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use p2plab_kit::testing::wait_until;
use p2plab_nic::descriptor::{encode, RingError, Status};
use p2plab_nic::regs::*;
use p2plab_server::testing::{RawClient, SpawnedServer};
use p2plab_vfio_user::SharedMemory;
use p2plab_wire::{Decoder, Frame, DEFAULT_MAX_PAYLOAD};

const BAR0: u32 = 0;
const CONFIG: u32 = 7;
const COMMAND: u64 = 4;
const MEM_AND_BME: u16 = 0x6;
const MEM_ONLY: u16 = 0x2;
const RAM: u64 = 0x1000_0000;
const RAM_SIZE: u64 = 8 << 20;
const TX_RING: u64 = RAM;
const RX_RING: u64 = RAM + 0x1_0000;
const TX_BUF: u64 = RAM + 0x10_0000;
const RX_BUF: u64 = RAM + 0x40_0000;
const ENTRIES: u32 = 16;
const BUF_LEN: u32 = 4096;
const UNMAPPED: u64 = 0x7000_0000;
const PATIENCE: Duration = Duration::from_secs(10);

fn nic(name: &str, wire: &str, extra: &[&str]) -> SpawnedServer {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let wire = wire.to_string();
    SpawnedServer::start(env!("CARGO_BIN_EXE_p2plab-nic"), name, move |dir| {
        let wire = match wire.as_str() {
            "listen" => format!("listen:{}", dir.join("wire.sock").display()),
            other => other.to_string(),
        };
        let mut args = vec!["--wire".to_string(), wire];
        args.extend(extra);
        args
    })
}

fn counter(status: &serde_json::Value, name: &str) -> u64 {
    status[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {status}"))
}

fn wire_counter(status: &serde_json::Value, name: &str) -> u64 {
    status["wire"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no wire counter {name} in {status}"))
}

/// Stops the server and checks it exits cleanly: it never crashed.
fn stop_cleanly(server: SpawnedServer) {
    let log = server.log();
    let status = server.stop();
    assert!(status.success(), "the server exited with {status}:\n{log}");
    assert!(!log.contains("panicked"), "a thread panicked:\n{log}");
}

// ----- a driver on rust-vmm's client -----

struct Guest {
    client: vfio_user::Client,
    ram: SharedMemory,
    tx_tail: u32,
    rx_tail: u32,
}

impl Guest {
    /// Connects, shares guest RAM and sets Bus Master Enable.
    fn connect(server: &SpawnedServer) -> Guest {
        let mut client = vfio_user::Client::new(server.socket()).expect("client connects");
        let ram = SharedMemory::new("nic-guest-ram", RAM_SIZE).unwrap();
        client.dma_map(0, RAM, RAM_SIZE, ram.fd()).expect("dma_map");
        let mut guest = Guest {
            client,
            ram,
            tx_tail: 0,
            rx_tail: 0,
        };
        guest.command(MEM_AND_BME);
        guest
    }

    fn command(&mut self, value: u16) {
        self.client
            .region_write(CONFIG, COMMAND, &value.to_le_bytes())
            .unwrap();
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.client.region_write(BAR0, offset, data).unwrap();
    }

    fn write32(&mut self, reg: u64, value: u32) {
        self.write(reg, &value.to_le_bytes());
    }

    fn read(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len];
        self.client.region_read(BAR0, offset, &mut data).unwrap();
        data
    }

    fn read32(&mut self, reg: u64) -> u32 {
        let b = self.read(reg, 4);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    fn mem_write(&self, gpa: u64, data: &[u8]) {
        self.ram.write_at(gpa - RAM, data).unwrap();
    }

    fn mem_read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len];
        self.ram.read_at(gpa - RAM, &mut data).unwrap();
        data
    }

    /// Both rings at `tx`/`rx` (cleared), both engines on.
    fn rings_at(&mut self, tx: u64, rx: u64) {
        self.write32(reg::CTRL, 0);
        for base in [tx, rx] {
            if (RAM..RAM + RAM_SIZE).contains(&base) {
                self.mem_write(base, &vec![0u8; (u64::from(ENTRIES) * DESC_SIZE) as usize]);
            }
        }
        self.write(reg::TX_RING_BASE, &tx.to_le_bytes());
        self.write32(reg::TX_RING_SIZE, ENTRIES);
        self.write(reg::RX_RING_BASE, &rx.to_le_bytes());
        self.write32(reg::RX_RING_SIZE, ENTRIES);
        self.write32(reg::CTRL, Ctrl::TX_ENABLE.raw() | Ctrl::RX_ENABLE.raw());
        self.tx_tail = 0;
        self.rx_tail = 0;
    }

    fn rings(&mut self) {
        self.rings_at(TX_RING, RX_RING);
    }

    /// Writes a descriptor into the next slot and rings the doorbell.
    fn post(&mut self, tx: bool, addr: u64, len: u32, desc_flags: u16) -> u64 {
        let (ring, tail, doorbell) = if tx {
            (TX_RING, &mut self.tx_tail, reg::TX_DOORBELL)
        } else {
            (RX_RING, &mut self.rx_tail, reg::RX_DOORBELL)
        };
        let slot = ring + u64::from(*tail) * DESC_SIZE;
        *tail = (*tail + 1) % ENTRIES;
        let value = *tail;
        self.ram
            .write_at(slot - RAM, &encode(addr, len, desc_flags, slot))
            .unwrap();
        self.write32(doorbell, value);
        slot
    }

    fn status_of(&self, slot: u64) -> u16 {
        let b = self.mem_read(slot + DESC_STATUS, 2);
        u16::from_le_bytes([b[0], b[1]])
    }

    fn done_len(&self, slot: u64) -> u32 {
        let b = self.mem_read(slot + DESC_DONE_LEN, 4);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The descriptor's status once the device wrote it.
    fn wait(&self, slot: u64) -> u16 {
        wait_until(&format!("descriptor {slot:#x} completes"), PATIENCE, || {
            self.status_of(slot) != 0
        });
        self.status_of(slot)
    }

    fn halted_with(&mut self) -> Option<u32> {
        let status = DeviceStatus::from_raw(self.read32(reg::STATUS));
        status
            .contains(DeviceStatus::HALTED)
            .then(|| self.read32(reg::ERROR))
    }

    fn wait_halted(&mut self) -> u32 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(error) = self.halted_with() {
                return error;
            }
            assert!(Instant::now() < deadline, "the engine never halted");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// One frame TX to RX over the loopback wire, checked byte for byte.
    fn round_trip(&mut self, seed: u8) {
        let data: Vec<u8> = (0..BUF_LEN)
            .map(|i| (i as u8).wrapping_mul(7) ^ seed)
            .collect();
        self.mem_write(TX_BUF, &data);
        self.mem_write(RX_BUF, &vec![0u8; BUF_LEN as usize]);
        let rx = self.post(false, RX_BUF, BUF_LEN, 0);
        let tx = self.post(true, TX_BUF, BUF_LEN, 0);
        assert_eq!(self.wait(tx), Status::Ok.code());
        assert_eq!(self.wait(rx), Status::Ok.code());
        assert_eq!(self.mem_read(RX_BUF, BUF_LEN as usize), data);
    }
}

/// Catches: a server that crashes, hangs or loses the stream on accesses
/// outside BAR0, to BARs that do not exist, of absurd sizes or with lying
/// payloads (each must get an error reply), and a NIC that acts on
/// register writes of a size or alignment it does not support or on
/// writes to read-only registers, or does not count the refused ones.
#[test]
fn malformed_register_accesses_get_errors_or_are_dropped_and_counted() {
    let server = nic("nic-hostile-regs", "loopback", &[]);
    let mut raw = RawClient::connect(server.socket());
    let refused = raw.malformed_accesses(BAR0, 4096, 1);
    for (what, reply) in &refused {
        assert!(reply.is_error(), "{what}: answered without an error");
        assert_ne!(reply.error, 0, "{what}: error reply without an errno");
    }
    // The stream is still in sync: a good read after them works.
    let (reply, payload) = raw.region_read(BAR0, reg::ID, 4);
    assert!(!reply.is_error());
    assert_eq!(payload[16..20], ID_MAGIC.to_le_bytes());
    drop(raw);

    let mut g = Guest::connect(&server);
    g.write32(reg::SCRATCH, 0x1234_5678);
    let odd: [(u64, usize); 5] = [(0x18, 1), (0x18, 2), (0x19, 3), (0x1a, 4), (0x1c, 8)];
    for (offset, len) in odd {
        g.write(offset, &vec![0xee; len]);
    }
    assert_eq!(g.read32(reg::SCRATCH), 0x1234_5678, "an odd write landed");
    // Read-only registers and reserved offsets ignore writes.
    g.write32(reg::ID, 0);
    g.write32(reg::TX_HEAD, 5);
    g.write32(0x100, 0xffff_ffff);
    assert_eq!(g.read32(reg::ID), ID_MAGIC);
    assert_eq!(g.read32(reg::TX_HEAD), 0);
    assert_eq!(g.read32(0x100), 0);
    // Reads of any size and alignment are assembled from the registers.
    assert_eq!(g.read(reg::ID, 2), ID_MAGIC.to_le_bytes()[..2]);
    assert_eq!(g.read(reg::ID + 3, 1), [ID_MAGIC.to_le_bytes()[3]]);
    let qword = g.read(reg::ID, 8);
    assert_eq!(qword[..4], ID_MAGIC.to_le_bytes());
    assert_eq!(qword[4..], VERSION.to_le_bytes());
    assert_eq!(g.read(0xffd, 3), [0, 0, 0]);
    let status = server.status();
    assert_eq!(counter(&status, "bad_register_accesses"), odd.len() as u64);
    // And the device still moves frames.
    g.rings();
    g.round_trip(1);
    drop(g);
    stop_cleanly(server);
}

/// Catches: a NIC that crashes, hangs or writes somewhere on rings and
/// buffers that point at unmapped memory, wrap around the address space
/// or run off the end of RAM, on huge or zero lengths and unknown flags,
/// or on doorbells past the ring; each must end in the documented
/// status or ring error, counted, and the device must work on after.
#[test]
fn bad_rings_descriptors_and_doorbells_end_in_errors() {
    let server = nic("nic-hostile-rings", "loopback", &[]);
    let mut g = Guest::connect(&server);

    // Rings the device cannot use.
    g.rings_at(UNMAPPED, RX_RING);
    g.write32(reg::TX_DOORBELL, 1);
    assert_eq!(
        g.wait_halted(),
        RingError::RingDma.code(),
        "ring in unmapped memory"
    );
    let bad_rings: [(u64, u32, &str); 3] = [
        (TX_RING, 3, "a size that is no power of two"),
        (
            (u64::MAX - 0x100) & !(DESC_SIZE - 1),
            ENTRIES,
            "a ring that wraps",
        ),
        (TX_RING + 8, ENTRIES, "a misaligned base"),
    ];
    for (base, size, what) in bad_rings {
        g.write32(reg::CTRL, 0);
        g.write(reg::TX_RING_BASE, &base.to_le_bytes());
        g.write32(reg::TX_RING_SIZE, size);
        g.write32(reg::CTRL, Ctrl::TX_ENABLE.raw());
        assert_eq!(g.halted_with(), Some(RingError::BadRing.code()), "{what}");
    }
    // Doorbells past the ring.
    for value in [ENTRIES, u32::MAX] {
        g.rings();
        g.write32(reg::TX_DOORBELL, value);
        assert_eq!(
            g.halted_with(),
            Some(RingError::BadDoorbell.code()),
            "doorbell {value}"
        );
    }

    // Descriptors the device cannot use, one by one.
    g.rings();
    let cases: [(u64, u32, u16, Status, &str); 6] = [
        (UNMAPPED, BUF_LEN, 0, Status::DmaError, "an unmapped buffer"),
        (
            RAM + RAM_SIZE - 100,
            BUF_LEN,
            0,
            Status::DmaError,
            "a buffer off the end of RAM",
        ),
        (
            u64::MAX - 100,
            BUF_LEN,
            0,
            Status::BadDescriptor,
            "a buffer that wraps",
        ),
        (TX_BUF, u32::MAX, 0, Status::TooLong, "a huge length"),
        (TX_BUF, 0, 0, Status::BadDescriptor, "no length"),
        (TX_BUF, 64, 0x8000, Status::BadDescriptor, "an unknown flag"),
    ];
    for (addr, len, desc_flags, want, what) in cases {
        let slot = g.post(true, addr, len, desc_flags);
        assert_eq!(g.wait(slot), want.code(), "{what}");
        assert_eq!(g.done_len(slot), 0, "{what}: bytes counted as moved");
    }
    // RX into an unmapped buffer, then a huge one (only the frame lands).
    let rx_bad = g.post(false, UNMAPPED, BUF_LEN, 0);
    g.mem_write(TX_BUF, &[0x77; 512]);
    let tx = g.post(true, TX_BUF, 512, 0);
    assert_eq!(g.wait(tx), Status::Ok.code());
    assert_eq!(g.wait(rx_bad), Status::DmaError.code());
    g.mem_write(RX_BUF, &vec![0u8; 2 * BUF_LEN as usize]);
    let rx_huge = g.post(false, RX_BUF, u32::MAX, 0);
    let tx = g.post(true, TX_BUF, 512, 0);
    assert_eq!(g.wait(tx), Status::Ok.code());
    assert_eq!(g.wait(rx_huge), Status::Ok.code());
    assert_eq!(g.done_len(rx_huge), 512);
    assert_eq!(g.mem_read(RX_BUF, 513), [&[0x77; 512][..], &[0]].concat());
    assert_eq!(g.halted_with(), None, "a bad descriptor halted the ring");

    let status = server.status();
    assert_eq!(counter(&status, "ring_errors"), 6, "{status}");
    assert_eq!(counter(&status, "tx_errors"), 6, "{status}");
    assert_eq!(counter(&status, "rx_errors"), 1, "{status}");
    // The unmapped ring, the two unmapped buffers and the RX one.
    assert_eq!(counter(&status, "dma_errors"), 4, "{status}");
    assert_eq!(counter(&status, "rx_packets"), 1, "{status}");
    g.round_trip(2);
    drop(g);
    stop_cleanly(server);
}

/// Catches: a NIC that crashes or hangs when reset or when Bus Master
/// Enable is cleared while frames are in flight, that writes guest memory
/// after either (a completion or a frame landing once the guest took the
/// memory back), or that does not work again once set up anew.
#[test]
fn resets_and_bus_master_off_mid_transfer() {
    // Every frame is held 20 ms on the wire, so the rings are mid-transfer
    // for a good while.
    let server = nic("nic-hostile-reset", "loopback", &["--inject", "delay=20ms"]);
    let mut g = Guest::connect(&server);
    let frames = ENTRIES - 1;
    let load = |g: &mut Guest| {
        g.rings();
        g.mem_write(RX_BUF, &vec![0u8; (frames * BUF_LEN) as usize]);
        g.mem_write(TX_BUF, &vec![0x3c; (frames * BUF_LEN) as usize]);
        for i in 0..frames {
            g.post(false, RX_BUF + u64::from(i * BUF_LEN), BUF_LEN, 0);
        }
        for i in 0..frames {
            g.post(true, TX_BUF + u64::from(i * BUF_LEN), BUF_LEN, 0);
        }
        let start = counter(&server.status(), "rx_packets");
        wait_until("frames flow", PATIENCE, || {
            counter(&server.status(), "rx_packets") >= start + 2
        });
    };
    let guest_memory = |g: &Guest| {
        (
            g.mem_read(TX_RING, (u64::from(ENTRIES) * DESC_SIZE) as usize),
            g.mem_read(RX_RING, (u64::from(ENTRIES) * DESC_SIZE) as usize),
            g.mem_read(RX_BUF, (frames * BUF_LEN) as usize),
        )
    };

    // A function reset in the middle.
    load(&mut g);
    g.client.reset().expect("DEVICE_RESET answered");
    let after_reset = guest_memory(&g);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        guest_memory(&g) == after_reset,
        "guest memory written after the reset"
    );
    let status = server.status();
    assert_eq!(counter(&status, "resets"), 1);
    assert!(
        counter(&status, "rx_packets") < u64::from(frames),
        "{status}"
    );
    assert_eq!(g.read32(reg::CTRL), 0);

    // Bus Master Enable cleared in the middle (the reset cleared it too).
    g.command(MEM_AND_BME);
    load(&mut g);
    g.command(MEM_ONLY);
    let bme_off = guest_memory(&g);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        guest_memory(&g) == bme_off,
        "guest memory written with BME clear"
    );
    let status = DeviceStatus::from_raw(g.read32(reg::STATUS));
    assert!(!status.contains(DeviceStatus::BUS_MASTER), "{status:?}");

    // Set up anew, the device works; the wire's delay still applies.
    // Frames of the old rings still on the loopback wire are dropped
    // while RX is off, as on a real link.
    g.command(MEM_AND_BME);
    g.write32(reg::CTRL, 0);
    std::thread::sleep(Duration::from_millis(500));
    g.rings();
    g.round_trip(3);
    let status = server.status();
    assert!(counter(&status, "wire_delays") > 0, "{status}");
    drop(g);
    stop_cleanly(server);
}

/// Whether the other end closed `stream` (a read sees the end, or a
/// reset when it closed with our bytes unread), as opposed to a read
/// that merely timed out.
fn closed_by_other_end(stream: &mut UnixStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    match stream.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

/// A raw wire peer of the NIC.
fn wire_peer(socket: &Path) -> UnixStream {
    let stream = UnixStream::connect(socket).expect("wire connect");
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// Catches: a NIC whose wire socket any local user can reach, that takes
/// garbage from its wire peer as frames or dies on it, lets a second peer
/// take the link, delivers a bad-FCS or oversized frame as good, cannot
/// take a peer again after one went away, or waits forever on a peer
/// that stops reading; the counters must say each of these.
#[test]
fn a_hostile_wire_peer_is_cut_off_refused_and_timed_out() {
    let server = nic(
        "nic-hostile-wire",
        "listen",
        &["--wire-send-timeout-ms", "1000"],
    );
    let wire = server.dir().join("wire.sock");
    let mode = std::fs::metadata(&wire).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let mut g = Guest::connect(&server);
    g.rings();
    let link_up = |server: &SpawnedServer| counter(&server.status(), "link_up") == 1;

    // Garbage, then a frame too long to be one, then another version.
    let mut too_long = Frame::new(vec![]).header().to_vec();
    too_long[8..12].copy_from_slice(&(DEFAULT_MAX_PAYLOAD + 1).to_le_bytes());
    let mut version = Frame::new(vec![1; 16]).encode();
    version[4] = 2;
    for (n, bytes) in [
        b"\x00\x01garbage from a hostile peer".to_vec(),
        too_long,
        version,
    ]
    .iter()
    .enumerate()
    {
        let mut peer = wire_peer(&wire);
        wait_until("the peer is taken", PATIENCE, || link_up(&server));
        peer.write_all(bytes).unwrap();
        assert!(closed_by_other_end(&mut peer), "not cut off");
        wait_until("the protocol error is counted", PATIENCE, || {
            wire_counter(&server.status(), "protocol_errors") == n as u64 + 1
        });
        wait_until("link down", PATIENCE, || !link_up(&server));
    }

    // A good peer; an intruder meanwhile is refused.
    let mut peer = wire_peer(&wire);
    wait_until("the good peer is taken", PATIENCE, || link_up(&server));
    let mut intruder = wire_peer(&wire);
    let _ = intruder.write_all(&Frame::new(vec![0xdd; 64]).encode());
    assert!(closed_by_other_end(&mut intruder), "intruder kept");
    wait_until("the refusal is counted", PATIENCE, || {
        wire_counter(&server.status(), "peers_refused") == 1
    });
    assert!(link_up(&server), "the intruder took the link");
    assert!(
        server.log().contains("refused a second peer"),
        "{}",
        server.log()
    );

    // Its frames: good, a bad FCS, one longer than the buffer.
    let mut bad_fcs = Frame::new(vec![0x22; 300]);
    bad_fcs.fcs ^= 1;
    let sent = [
        (Frame::new(vec![0x11; 100]), Status::Ok, 100),
        (bad_fcs, Status::BadFcs, 300),
        (Frame::new(vec![0x33; 8000]), Status::Truncated, BUF_LEN),
    ];
    for (i, (frame, want, len)) in sent.iter().enumerate() {
        let buffer = RX_BUF + (i as u64) * u64::from(BUF_LEN);
        let slot = g.post(false, buffer, BUF_LEN, 0);
        peer.write_all(&frame.encode()).unwrap();
        assert_eq!(g.wait(slot), want.code(), "frame {i}");
        assert_eq!(g.done_len(slot), *len, "frame {i}");
        assert_eq!(
            g.mem_read(buffer, *len as usize),
            frame.payload[..*len as usize],
            "frame {i}"
        );
    }
    // The NIC's frames reach the peer whole.
    g.mem_write(TX_BUF, &[0x44; 1500]);
    let tx = g.post(true, TX_BUF, 1500, 0);
    assert_eq!(g.wait(tx), Status::Ok.code());
    let frame = Decoder::new(DEFAULT_MAX_PAYLOAD)
        .read_frame(&mut peer)
        .expect("the NIC answers with a frame");
    assert_eq!(frame.payload, vec![0x44; 1500]);
    assert!(frame.fcs_ok());

    // The peer stops reading: TX fails with LINK_DOWN after the timeout
    // and the NIC drops the connection.
    g.mem_write(TX_BUF, &vec![0x55; 60_000]);
    let mut last = 0;
    for _ in 0..ENTRIES - 2 {
        last = g.post(true, TX_BUF, 60_000, 0);
        let deadline = Instant::now() + Duration::from_millis(300);
        while g.status_of(last) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if g.status_of(last) == 0 {
            break;
        }
    }
    assert_eq!(g.wait(last), Status::LinkDown.code());
    wait_until("link down after the timeout", PATIENCE, || {
        !link_up(&server)
    });
    let status = server.status();
    assert_eq!(wire_counter(&status, "send_timeouts"), 1, "{status}");
    drop(peer);

    // A peer that connects after that is taken.
    let mut peer = wire_peer(&wire);
    wait_until("a new peer is taken", PATIENCE, || link_up(&server));
    let slot = g.post(false, RX_BUF, BUF_LEN, 0);
    peer.write_all(&Frame::new(vec![0x66; 10]).encode())
        .unwrap();
    assert_eq!(g.wait(slot), Status::Ok.code());

    let status = server.status();
    assert_eq!(counter(&status, "rx_fcs_errors"), 1, "{status}");
    assert_eq!(counter(&status, "rx_truncated"), 1, "{status}");
    assert_eq!(wire_counter(&status, "fcs_errors"), 1, "{status}");
    assert_eq!(wire_counter(&status, "protocol_errors"), 3, "{status}");
    assert_eq!(wire_counter(&status, "connections"), 5, "{status}");
    drop((g, peer));
    stop_cleanly(server);
    assert!(!wire.exists(), "the wire socket outlived the server");
}
