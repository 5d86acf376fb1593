//! A hostile guest: seeded random register accesses and random commands
//! (opcodes, namespaces, PRPs/SGLs into RAM, into the CMB and into nowhere,
//! queue ids and sizes) thrown at the controller. Whatever arrives, the
//! controller must not panic, hang or stop serving: after each storm a
//! controller reset and a well-formed Identify must still work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_nvme::testing::RecordingInterrupts;
use p2plab_nvme::{ControllerConfig, FileBackend, Namespace, NamespaceIds, NvmeController};

const RAM: u64 = 0x1000_0000;
const RAM_SIZE: usize = 8 << 20;
const CMB_BAR: u64 = 0xfe00_0000;
const CMB_SIZE: u64 = 2 << 20;
const ASQ: u64 = RAM;
const ACQ: u64 = RAM + 0x1_0000;
const ADMIN_ENTRIES: u32 = 64;

const CC: u64 = 0x14;
const CSTS: u64 = 0x1c;
const AQA: u64 = 0x24;
const ASQ_REG: u64 = 0x28;
const ACQ_REG: u64 = 0x30;
const DOORBELLS: u64 = 0x1000;

/// xorshift64*: deterministic, so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// An address that is sometimes valid RAM, sometimes in the CMB,
    /// sometimes unmapped, sometimes absurd.
    fn address(&mut self) -> u64 {
        match self.below(6) {
            0 => RAM + self.below(RAM_SIZE as u64),
            1 => RAM + self.below(RAM_SIZE as u64 / 4096) * 4096,
            2 => CMB_BAR + self.below(CMB_SIZE),
            3 => self.next(),
            4 => u64::MAX - self.below(8192),
            _ => 0,
        }
    }
}

struct Lab {
    ctrl: NvmeController,
    guest: Arc<FakeGuestMemory>,
}

impl Lab {
    fn new() -> Self {
        let guest = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
        let backend = Arc::new(FileBackend::memory("hostile-ns1", 4 << 20).expect("memfd"));
        let ns = Arc::new(Namespace::new(
            1,
            backend,
            512,
            NamespaceIds::derive("HOSTILE", 1, [2, 0x50, 0x4c]),
        ));
        let cmb: Arc<dyn RegionMemory> = Arc::new(HeapRegion::new(CMB_SIZE as usize));
        let config = ControllerConfig {
            serial: "HOSTILE".into(),
            max_io_queues: 4,
            cmb_size: CMB_SIZE,
            ..ControllerConfig::default()
        };
        let ctrl = NvmeController::new(
            config,
            vec![ns],
            guest.clone(),
            Some(cmb),
            RecordingInterrupts::new(),
        )
        .expect("controller");
        ctrl.set_cmb_bar_address(Some(CMB_BAR));
        Self { ctrl, guest }
    }

    fn read32(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.ctrl.read_bar0(offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn write32(&self, offset: u64, value: u32) {
        self.ctrl.write_bar0(offset, &value.to_le_bytes());
    }

    fn wait_ready(&self, want: Ready) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if (self.read32(CSTS) & 1 == 1) == (want == Ready::Set) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// CC.EN=0, then a fresh admin queue pair and CC.EN=1.
    fn reset_and_enable(&self) {
        self.write32(CC, 0);
        assert!(
            self.wait_ready(Ready::Clear),
            "CSTS.RDY did not clear after CC.EN=0"
        );
        let zeros = vec![0u8; 0x2_0000];
        self.guest.write(ASQ, &zeros).expect("clear admin queues");
        self.write32(AQA, ((ADMIN_ENTRIES - 1) << 16) | (ADMIN_ENTRIES - 1));
        self.ctrl.write_bar0(ASQ_REG, &ASQ.to_le_bytes());
        self.ctrl.write_bar0(ACQ_REG, &ACQ.to_le_bytes());
        // IOSQES=6, IOCQES=4, EN.
        self.write32(CC, (4 << 20) | (6 << 16) | 1);
        assert!(
            self.wait_ready(Ready::Set),
            "controller did not become ready"
        );
    }

    /// Identify Controller into RAM; true when it completes with success.
    fn identify_works(&self) -> bool {
        let mut sqe = [0u8; 64];
        sqe[0] = 0x06;
        sqe[2..4].copy_from_slice(&0x7777u16.to_le_bytes());
        sqe[24..32].copy_from_slice(&(RAM + 0x40_0000).to_le_bytes());
        sqe[40..44].copy_from_slice(&1u32.to_le_bytes());
        self.guest.write(ASQ, &sqe).expect("place identify");
        self.write32(DOORBELLS, 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let mut cqe = [0u8; 16];
            self.guest.read(ACQ, &mut cqe).expect("read CQ");
            let cid = u16::from_le_bytes([cqe[12], cqe[13]]);
            let status = u16::from_le_bytes([cqe[14], cqe[15]]);
            if cid == 0x7777 && status & 1 == 1 {
                return status >> 1 == 0;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
}

/// CSTS.RDY as awaited.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ready {
    Set,
    Clear,
}

/// Which command set a random command is drawn from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CommandSet {
    Admin,
    Io,
}

/// A random but structurally plausible command in a submission slot.
fn random_command(rng: &mut Rng, set: CommandSet) -> [u8; 64] {
    let mut sqe = [0u8; 64];
    for chunk in sqe.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next().to_le_bytes());
    }
    let opcodes: &[u8] = if set == CommandSet::Admin {
        &[
            0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0a, 0x0c, 0x80, 0x7c, 0xff,
        ]
    } else {
        &[0x00, 0x01, 0x02, 0x04, 0x05, 0x08, 0x09, 0x0c, 0x7f, 0xff]
    };
    sqe[0] = opcodes[rng.below(opcodes.len() as u64) as usize];
    // Mostly PRPs, sometimes SGLs (PSDT in CDW0 bits 15:14).
    sqe[1] &= if rng.below(4) == 0 { 0x40 } else { 0x00 };
    let nsid: u32 = match rng.below(4) {
        0 => 1,
        1 => 0,
        2 => 0xffff_ffff,
        _ => rng.next() as u32,
    };
    sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
    let prp1 = rng.address();
    let prp2 = rng.address();
    sqe[24..32].copy_from_slice(&prp1.to_le_bytes());
    sqe[32..40].copy_from_slice(&prp2.to_le_bytes());
    // Small lengths most of the time so commands actually run.
    if rng.below(2) == 0 {
        sqe[48..52].copy_from_slice(&(rng.below(64) as u32).to_le_bytes());
    }
    sqe
}

#[test]
fn random_register_storms_never_stop_the_controller() {
    for seed in 1..=8u64 {
        let lab = Lab::new();
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        lab.reset_and_enable();
        for _ in 0..3000 {
            let offset = match rng.below(4) {
                0 => rng.below(0x40),
                1 => DOORBELLS + rng.below(0x100),
                2 => rng.below(0x4000),
                _ => rng.next(),
            };
            let width = [1usize, 2, 4, 8, 3][rng.below(5) as usize];
            let data = rng.next().to_le_bytes();
            if rng.below(3) == 0 {
                let mut buf = [0u8; 8];
                lab.ctrl.read_bar0(offset, &mut buf[..width]);
            } else {
                lab.ctrl.write_bar0(offset, &data[..width]);
            }
        }
        lab.reset_and_enable();
        assert!(
            lab.identify_works(),
            "seed {seed}: identify after a register storm"
        );
    }
}

#[test]
fn random_commands_never_stop_the_controller() {
    for seed in 1..=8u64 {
        let lab = Lab::new();
        let mut rng = Rng(seed.wrapping_mul(0xd134_2543_de82_ef95) | 1);
        lab.reset_and_enable();
        // Random admin commands, ringing the doorbell after each batch. Some
        // create I/O queues (with random sizes/addresses/ids), so random I/O
        // doorbells below may find live queues.
        let mut tail = 0u32;
        for round in 0..40 {
            for _ in 0..rng.below(8) + 1 {
                let sqe = random_command(&mut rng, CommandSet::Admin);
                lab.guest
                    .write(ASQ + u64::from(tail) * 64, &sqe)
                    .expect("place admin command");
                tail = (tail + 1) % ADMIN_ENTRIES;
            }
            lab.write32(DOORBELLS, tail);
            // Random I/O traffic on whatever queues exist (or not).
            for _ in 0..4 {
                let qid = rng.below(6);
                let slot = RAM + 0x20_0000 + qid * 0x1_0000 + rng.below(32) * 64;
                lab.guest
                    .write(slot, &random_command(&mut rng, CommandSet::Io))
                    .expect("place I/O command");
                lab.write32(DOORBELLS + qid * 8, rng.below(40) as u32);
                lab.write32(DOORBELLS + qid * 8 + 4, rng.below(40) as u32);
            }
            if round % 10 == 9 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        lab.reset_and_enable();
        assert!(
            lab.identify_works(),
            "seed {seed}: identify after a command storm"
        );
    }
}
