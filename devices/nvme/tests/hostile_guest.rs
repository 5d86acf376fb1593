//! A hostile guest: seeded random register accesses and random commands
//! (opcodes, namespaces, PRPs/SGLs into RAM, into the CMB and into nowhere,
//! queue ids and sizes) thrown at the controller. Whatever arrives, the
//! controller must not panic, hang or stop serving: after each storm a
//! controller reset and a well-formed Identify must still work. A scripted
//! liar then creates I/O queues properly and lies (bad PRPs, queue ids and
//! sizes, doorbells past the queue end, a CQ overrun, an SQ in unmapped
//! memory), checking each status and that data still round-trips.

use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_kit::testing::RecordingInterrupts;
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
        self.ctrl.regs_read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn write32(&self, offset: u64, value: u32) {
        self.ctrl.regs_write(offset, &value.to_le_bytes());
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
        self.ctrl.regs_write(ASQ_REG, &ASQ.to_le_bytes());
        self.ctrl.regs_write(ACQ_REG, &ACQ.to_le_bytes());
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
                lab.ctrl.regs_read(offset, &mut buf[..width]);
            } else {
                lab.ctrl.regs_write(offset, &data[..width]);
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

/// A host driver that set up I/O queues the right way and then lies. It
/// reads completions for its own commands and tracks queue heads.
struct Liar {
    lab: Lab,
    admin_tail: u32,
    admin_head: u32,
    admin_phase: bool,
    next_cid: u16,
}

/// Status Code Type and Status Code of a completion (DNR, More dropped).
fn sct_sc(status: u16) -> (u16, u16) {
    ((status >> 9) & 0x7, (status >> 1) & 0xff)
}

const SUCCESS: (u16, u16) = (0, 0x00);
const DATA_TRANSFER_ERROR: (u16, u16) = (0, 0x04);
const PRP_OFFSET_INVALID: (u16, u16) = (0, 0x13);
const INVALID_COMPLETION_QUEUE: (u16, u16) = (1, 0x00);
const INVALID_QUEUE_IDENTIFIER: (u16, u16) = (1, 0x01);
const INVALID_QUEUE_SIZE: (u16, u16) = (1, 0x02);
const INVALID_QUEUE_DELETION: (u16, u16) = (1, 0x0c);

/// I/O queue pair 1: 16-entry SQ and CQ in RAM.
const IO_SQ: u64 = RAM + 0x20_0000;
const IO_CQ: u64 = RAM + 0x21_0000;
const IO_ENTRIES: u32 = 16;
const DATA: u64 = RAM + 0x30_0000;
/// Page aligned, and no memory there.
const UNMAPPED: u64 = 0xdead_0000_0000;

struct IoQueue {
    qid: u16,
    sq: u64,
    cq: u64,
    entries: u32,
    tail: u32,
    head: u32,
    phase: bool,
}

impl Liar {
    fn new() -> Self {
        let lab = Lab::new();
        lab.reset_and_enable();
        Self {
            lab,
            admin_tail: 0,
            admin_head: 0,
            admin_phase: true,
            next_cid: 1,
        }
    }

    fn command(
        &mut self,
        opcode: u8,
        nsid: u32,
        prp1: u64,
        prp2: u64,
        cdw: &[(usize, u32)],
    ) -> [u8; 64] {
        let mut sqe = [0u8; 64];
        sqe[0] = opcode;
        sqe[2..4].copy_from_slice(&self.next_cid.to_le_bytes());
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
        sqe[24..32].copy_from_slice(&prp1.to_le_bytes());
        sqe[32..40].copy_from_slice(&prp2.to_le_bytes());
        for &(i, v) in cdw {
            sqe[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        sqe
    }

    /// Waits for the completion at (cq, head) with `phase`; returns
    /// (cid, status without the phase bit).
    fn completion(&self, cq: u64, head: u32, phase: bool, within: Duration) -> Option<(u16, u16)> {
        let deadline = Instant::now() + within;
        loop {
            let mut cqe = [0u8; 16];
            self.lab
                .guest
                .read(cq + u64::from(head) * 16, &mut cqe)
                .expect("read CQ");
            let status = u16::from_le_bytes([cqe[14], cqe[15]]);
            if (status & 1 == 1) == phase {
                return Some((u16::from_le_bytes([cqe[12], cqe[13]]), status));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs an admin command; returns its (SCT, SC).
    fn admin(&mut self, sqe: [u8; 64]) -> (u16, u16) {
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        self.lab
            .guest
            .write(ASQ + u64::from(self.admin_tail) * 64, &sqe)
            .expect("place admin command");
        self.admin_tail = (self.admin_tail + 1) % ADMIN_ENTRIES;
        self.lab.write32(DOORBELLS, self.admin_tail);
        let (got, status) = self
            .completion(
                ACQ,
                self.admin_head,
                self.admin_phase,
                Duration::from_secs(10),
            )
            .expect("admin completion");
        assert_eq!(got, cid, "completion for another command");
        self.admin_head = (self.admin_head + 1) % ADMIN_ENTRIES;
        if self.admin_head == 0 {
            self.admin_phase = !self.admin_phase;
        }
        self.lab.write32(DOORBELLS + 4, self.admin_head);
        sct_sc(status)
    }

    fn create_cq(&mut self, qid: u16, base: u64, entries: u32) -> (u16, u16) {
        let sqe = self.command(
            0x05,
            0,
            base,
            0,
            &[
                (10, ((entries - 1) << 16) | u32::from(qid)),
                (11, (u32::from(qid) << 16) | 3),
            ],
        );
        self.admin(sqe)
    }

    fn create_sq(&mut self, qid: u16, base: u64, entries: u32, cqid: u16) -> (u16, u16) {
        let sqe = self.command(
            0x01,
            0,
            base,
            0,
            &[
                (10, ((entries - 1) << 16) | u32::from(qid)),
                (11, (u32::from(cqid) << 16) | 1),
            ],
        );
        self.admin(sqe)
    }

    fn delete(&mut self, opcode: u8, qid: u16) -> (u16, u16) {
        let sqe = self.command(opcode, 0, 0, 0, &[(10, u32::from(qid))]);
        self.admin(sqe)
    }

    fn io_pair(&mut self, qid: u16, sq: u64, cq: u64, entries: u32) -> IoQueue {
        self.lab
            .guest
            .write(cq, &vec![0u8; entries as usize * 16])
            .expect("clear CQ");
        assert_eq!(self.create_cq(qid, cq, entries), SUCCESS);
        assert_eq!(self.create_sq(qid, sq, entries, qid), SUCCESS);
        IoQueue {
            qid,
            sq,
            cq,
            entries,
            tail: 0,
            head: 0,
            phase: true,
        }
    }

    /// Places commands on `q` and rings its doorbell once.
    fn submit(&mut self, q: &mut IoQueue, commands: &[[u8; 64]]) {
        for sqe in commands {
            self.lab
                .guest
                .write(q.sq + u64::from(q.tail) * 64, sqe)
                .expect("place I/O command");
            q.tail = (q.tail + 1) % q.entries;
        }
        self.lab.write32(DOORBELLS + u64::from(q.qid) * 8, q.tail);
    }

    /// Reaps the next completion of `q` (waiting up to `within`).
    fn reap(&mut self, q: &mut IoQueue, within: Duration) -> Option<(u16, (u16, u16))> {
        let (cid, status) = self.completion(q.cq, q.head, q.phase, within)?;
        q.head = (q.head + 1) % q.entries;
        if q.head == 0 {
            q.phase = !q.phase;
        }
        self.lab
            .write32(DOORBELLS + u64::from(q.qid) * 8 + 4, q.head);
        Some((cid, sct_sc(status)))
    }

    /// One command on `q`; its (SCT, SC).
    fn io(&mut self, q: &mut IoQueue, sqe: [u8; 64]) -> (u16, u16) {
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        self.submit(q, &[sqe]);
        let (got, status) = self
            .reap(q, Duration::from_secs(10))
            .expect("I/O completion");
        assert_eq!(got, cid, "completion for another command");
        status
    }

    fn read(&mut self, slba: u32, blocks: u32, prp1: u64, prp2: u64) -> [u8; 64] {
        self.command(0x02, 1, prp1, prp2, &[(10, slba), (12, blocks - 1)])
    }

    fn write(&mut self, slba: u32, blocks: u32, prp1: u64, prp2: u64) -> [u8; 64] {
        self.command(0x01, 1, prp1, prp2, &[(10, slba), (12, blocks - 1)])
    }

    /// A Write then a Read of the same block returns the data: the
    /// device still serves.
    fn round_trip(&mut self, q: &mut IoQueue, seed: u8) {
        let data: Vec<u8> = (0..512u32)
            .map(|i| (i as u8).wrapping_mul(13) ^ seed)
            .collect();
        self.lab.guest.write(DATA, &data).expect("data");
        let w = self.write(7, 1, DATA, 0);
        assert_eq!(self.io(q, w), SUCCESS, "write after the lie");
        self.lab
            .guest
            .write(DATA + 0x1000, &[0u8; 512])
            .expect("clear");
        let r = self.read(7, 1, DATA + 0x1000, 0);
        assert_eq!(self.io(q, r), SUCCESS, "read after the lie");
        let mut back = vec![0u8; 512];
        self.lab
            .guest
            .read(DATA + 0x1000, &mut back)
            .expect("read back");
        assert_eq!(back, data, "read returned other data");
    }

    fn counters(&self) -> serde_json::Value {
        let json = self.lab.ctrl.stats().to_json();
        let stats: serde_json::Value = serde_json::from_str(&json).expect("stats JSON");
        stats["counters"].clone()
    }
}

/// Catches a device that, once I/O queues exist, mishandles a guest that
/// lies: bad PRPs answered with success or not at all, queue ids and
/// sizes it should refuse, a doorbell past the queue end taken as is, a
/// completion queue overrun (completions overwritten or lost), and an SQ
/// in unmapped memory that wedges instead of raising CSTS.CFS. After
/// every lie the device must keep serving correct data.
#[test]
fn a_guest_that_lies_after_creating_io_queues_gets_statuses_and_service() {
    let mut liar = Liar::new();
    let mut q = liar.io_pair(1, IO_SQ, IO_CQ, IO_ENTRIES);
    liar.round_trip(&mut q, 1);

    // Bad PRPs.
    let cmd = liar.read(0, 1, UNMAPPED, 0);
    assert_eq!(liar.io(&mut q, cmd), DATA_TRANSFER_ERROR, "PRP1 unmapped");
    let cmd = liar.read(0, 1, DATA + 2, 0);
    assert_eq!(
        liar.io(&mut q, cmd),
        PRP_OFFSET_INVALID,
        "PRP1 not dword aligned"
    );
    let cmd = liar.read(0, 16, DATA, DATA + 0x10);
    assert_eq!(
        liar.io(&mut q, cmd),
        PRP_OFFSET_INVALID,
        "PRP2 with an offset"
    );
    let list = DATA + 0x4000;
    liar.lab
        .guest
        .write(list, &(DATA + 0x1004).to_le_bytes())
        .expect("list");
    liar.lab
        .guest
        .write(list + 8, &UNMAPPED.to_le_bytes())
        .expect("list");
    let cmd = liar.read(0, 24, DATA, list);
    let status = liar.io(&mut q, cmd);
    assert!(
        status == PRP_OFFSET_INVALID || status == DATA_TRANSFER_ERROR,
        "PRP list with an offset entry: {status:?}"
    );
    let cmd = liar.read(0, 24, DATA, UNMAPPED);
    assert_eq!(
        liar.io(&mut q, cmd),
        DATA_TRANSFER_ERROR,
        "PRP list unmapped"
    );
    liar.round_trip(&mut q, 2);

    // Bad queue ids and sizes.
    assert_eq!(
        liar.create_cq(0, RAM + 0x22_0000, 16),
        INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        liar.create_cq(1, RAM + 0x22_0000, 16),
        INVALID_QUEUE_IDENTIFIER,
        "CQ 1 exists"
    );
    assert_eq!(
        liar.create_cq(200, RAM + 0x22_0000, 16),
        INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        liar.create_cq(2, RAM + 0x22_0000, 1),
        INVALID_QUEUE_SIZE,
        "one entry"
    );
    assert_eq!(
        liar.create_sq(2, RAM + 0x23_0000, 16, 3),
        INVALID_COMPLETION_QUEUE
    );
    assert_eq!(
        liar.create_sq(2, RAM + 0x23_0000, 16, 0),
        INVALID_COMPLETION_QUEUE,
        "admin CQ"
    );
    assert_eq!(
        liar.create_sq(1, RAM + 0x23_0000, 16, 1),
        INVALID_QUEUE_IDENTIFIER,
        "SQ 1 exists"
    );
    assert_eq!(
        liar.delete(0x04, 1),
        INVALID_QUEUE_DELETION,
        "CQ with an SQ on it"
    );
    assert_eq!(liar.delete(0x00, 3), INVALID_QUEUE_IDENTIFIER, "no SQ 3");
    assert_eq!(
        liar.delete(0x00, 0),
        INVALID_QUEUE_IDENTIFIER,
        "the admin SQ"
    );
    let bad_nsid = liar.command(0x02, 9, DATA, 0, &[]);
    assert_eq!(liar.io(&mut q, bad_nsid), (0, 0x0b), "Invalid Namespace");
    let bad_opcode = liar.command(0x7f, 1, DATA, 0, &[]);
    assert_eq!(liar.io(&mut q, bad_opcode), (0, 0x01), "Invalid Opcode");
    liar.round_trip(&mut q, 3);

    // A doorbell past the end of the queue: ignored and counted, the
    // queue goes on from the last good tail.
    let before = liar.counters()["invalid_doorbell_writes"]
        .as_u64()
        .expect("counter");
    liar.lab.write32(DOORBELLS + 8, IO_ENTRIES + 5);
    liar.lab.write32(DOORBELLS + 12, IO_ENTRIES + 9);
    let after = liar.counters()["invalid_doorbell_writes"]
        .as_u64()
        .expect("counter");
    assert_eq!(after, before + 2, "both bad doorbells counted");
    assert!(
        liar.reap(&mut q, Duration::from_millis(100)).is_none(),
        "a bad doorbell made the device run stale entries"
    );
    liar.round_trip(&mut q, 4);

    // CQ overrun: a 4-entry CQ under a 16-entry SQ, 10 commands at once,
    // the host slow to consume. The device must hold completions until
    // there is room (a CQ is full with one free slot), never overwrite.
    let mut small = liar.io_pair(2, RAM + 0x24_0000, RAM + 0x25_0000, 4);
    liar.lab
        .guest
        .write(RAM + 0x24_0000, &[0u8; 4 * 64])
        .expect("clear");
    // Its SQ has 4 entries too (queue pairs share a size here); use two
    // rounds of 3 so the SQ itself is never overfilled.
    let mut cids = Vec::new();
    for _ in 0..2 {
        let cmds: Vec<[u8; 64]> = (0..3).map(|_| liar.read(0, 1, DATA + 0x2000, 0)).collect();
        cids.extend(cmds.iter().map(|c| u16::from_le_bytes([c[2], c[3]])));
        liar.submit(&mut small, &cmds);
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..3 {
            let (cid, status) = liar
                .reap(&mut small, Duration::from_secs(10))
                .expect("completion");
            assert_eq!(status, SUCCESS);
            assert!(cids.contains(&cid), "unknown cid {cid}");
        }
    }
    // Now overrun for real: 3 commands fill the CQ (a full CQ keeps one
    // slot free), 3 more arrive while the host consumes nothing. The
    // device must wait for room: the posted entries stay, none is lost.
    let first: Vec<[u8; 64]> = (0..3).map(|_| liar.read(0, 1, DATA + 0x2000, 0)).collect();
    let second: Vec<[u8; 64]> = (0..3).map(|_| liar.read(0, 1, DATA + 0x2000, 0)).collect();
    let cid_of = |c: &[u8; 64]| u16::from_le_bytes([c[2], c[3]]);
    liar.submit(&mut small, &first);
    std::thread::sleep(Duration::from_millis(50));
    liar.submit(&mut small, &second);
    std::thread::sleep(Duration::from_millis(100));
    let slot_phase = |slot: u32| {
        let at = (small.head + slot) % 4;
        (
            at,
            if at < small.head {
                !small.phase
            } else {
                small.phase
            },
        )
    };
    for (slot, sqe) in first.iter().enumerate() {
        let (at, phase) = slot_phase(slot as u32);
        let posted = liar.completion(small.cq, at, phase, Duration::from_millis(1));
        assert_eq!(
            posted.map(|(cid, _)| cid),
            Some(cid_of(sqe)),
            "CQ slot {at}: the completion was lost or overwritten"
        );
    }
    let (at, phase) = slot_phase(3);
    assert!(
        liar.completion(small.cq, at, phase, Duration::from_millis(1))
            .is_none(),
        "the device filled the CQ's last free slot"
    );
    let mut expected: Vec<u16> = first.iter().chain(&second).map(cid_of).collect();
    for _ in 0..6 {
        let (cid, status) = liar
            .reap(&mut small, Duration::from_secs(10))
            .expect("completion");
        assert_eq!(status, SUCCESS);
        expected.retain(|c| *c != cid);
    }
    assert!(expected.is_empty(), "completions lost: {expected:?}");
    liar.round_trip(&mut q, 5);

    // An SQ in unmapped memory: created (the device does not read it
    // yet), then a doorbell makes it fetch. Like QEMU's nvme, a fetch that
    // cannot be done is a controller fatal status.
    let mut lost = liar.io_pair(3, UNMAPPED, RAM + 0x26_0000, 4);
    lost.tail = 1;
    liar.lab.write32(DOORBELLS + 3 * 8, lost.tail);
    let deadline = Instant::now() + Duration::from_secs(10);
    while liar.lab.read32(CSTS) & 2 == 0 {
        assert!(
            Instant::now() < deadline,
            "no CSTS.CFS after an unfetchable SQ"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Linux resets the controller; it works again.
    liar.lab.reset_and_enable();
    assert_eq!(liar.lab.read32(CSTS) & 2, 0, "CFS cleared by the reset");
    assert!(liar.lab.identify_works(), "identify after recovery");
}
