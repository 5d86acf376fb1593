//! The device model driven the way a guest driver drives it: register
//! writes, ring entries in "guest memory", fences and interrupts. No socket,
//! no QEMU.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use p2plab_gpu::command::{Command, Completion};
use p2plab_gpu::crc32c::crc32c;
use p2plab_gpu::regs::*;
use p2plab_gpu::{DmaError, Gpu, GuestMemory, InterruptSink, Vram};

/// Guest RAM window used by the tests.
const RAM_BASE: u64 = 0x1_0000_0000;
const RAM_SIZE: usize = 16 << 20;
/// Where the tests put the ring and the completion records.
const RING_GPA: u64 = RAM_BASE;
const RECORDS_GPA: u64 = RAM_BASE + (1 << 20);
/// Free guest memory for data buffers.
const DATA_GPA: u64 = RAM_BASE + (4 << 20);

/// A flat guest RAM. Accesses outside it fail like unmapped DMA would.
/// With `gate` closed, reads of data buffers (at or above DATA_GPA, so not
/// ring fetches) block, to hold the engine in the middle of a job.
struct FakeRam {
    bytes: Mutex<Vec<u8>>,
    gate_open: Mutex<bool>,
    gate: Condvar,
    reads_waiting: AtomicU64,
}

impl FakeRam {
    fn new() -> Self {
        Self {
            bytes: Mutex::new(vec![0; RAM_SIZE]),
            gate_open: Mutex::new(true),
            gate: Condvar::new(),
            reads_waiting: AtomicU64::new(0),
        }
    }

    fn range(&self, gpa: u64, len: usize) -> Result<std::ops::Range<usize>, DmaError> {
        let err = || DmaError {
            gpa,
            len: len as u64,
            reason: "not mapped".into(),
        };
        let start = gpa.checked_sub(RAM_BASE).ok_or_else(err)? as usize;
        let end = start.checked_add(len).ok_or_else(err)?;
        if end > RAM_SIZE {
            return Err(err());
        }
        Ok(start..end)
    }

    fn poke(&self, gpa: u64, data: &[u8]) {
        let range = self.range(gpa, data.len()).unwrap();
        self.bytes.lock().unwrap()[range].copy_from_slice(data);
    }

    fn peek(&self, gpa: u64, len: usize) -> Vec<u8> {
        let range = self.range(gpa, len).unwrap();
        self.bytes.lock().unwrap()[range].to_vec()
    }

    fn close_gate(&self) {
        *self.gate_open.lock().unwrap() = false;
    }

    fn open_gate(&self) {
        *self.gate_open.lock().unwrap() = true;
        self.gate.notify_all();
    }
}

impl GuestMemory for FakeRam {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let mut open = self.gate_open.lock().unwrap();
        if !*open && gpa >= DATA_GPA {
            self.reads_waiting.fetch_add(1, Ordering::SeqCst);
            while !*open {
                open = self.gate.wait(open).unwrap();
            }
        }
        drop(open);
        let range = self.range(gpa, buf.len())?;
        buf.copy_from_slice(&self.bytes.lock().unwrap()[range]);
        Ok(())
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), DmaError> {
        let range = self.range(gpa, buf.len())?;
        self.bytes.lock().unwrap()[range].copy_from_slice(buf);
        Ok(())
    }
}

#[derive(Default)]
struct CountingIrq {
    count: AtomicU64,
    wrong_vector: AtomicBool,
}

impl InterruptSink for CountingIrq {
    fn notify(&self, vector: u16) {
        if vector != ENGINE_VECTOR {
            self.wrong_vector.store(true, Ordering::SeqCst);
        }
        self.count.fetch_add(1, Ordering::SeqCst);
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Rig {
    gpu: Gpu,
    ram: Arc<FakeRam>,
    irq: Arc<CountingIrq>,
    entries: u32,
    tail: u32,
    next_fence: u64,
}

impl Rig {
    fn new(vram_size: u64) -> Self {
        let ram = Arc::new(FakeRam::new());
        let irq = Arc::new(CountingIrq::default());
        let gpu = Gpu::new(Vram::new(vram_size).unwrap(), ram.clone(), irq.clone()).unwrap();
        gpu.set_bus_master(true);
        Self {
            gpu,
            ram,
            irq,
            entries: 0,
            tail: 0,
            next_fence: 1,
        }
    }

    /// A 256 MiB device with an enabled 16-entry ring in guest memory and
    /// all interrupts unmasked.
    fn ready() -> Self {
        let mut rig = Self::new(256 << 20);
        rig.enable_ring(RING_GPA, 16, false);
        rig.write32(REG_INT_MASK, 0);
        rig
    }

    fn read32(&self, reg: u64) -> u32 {
        let mut b = [0u8; 4];
        self.gpu.regs_read(reg, &mut b);
        u32::from_le_bytes(b)
    }

    fn read64(&self, reg: u64) -> u64 {
        let mut b = [0u8; 8];
        self.gpu.regs_read(reg, &mut b);
        u64::from_le_bytes(b)
    }

    fn write32(&self, reg: u64, value: u32) {
        self.gpu.regs_write(reg, &value.to_le_bytes());
    }

    fn write64(&self, reg: u64, value: u64) {
        self.gpu.regs_write(reg, &value.to_le_bytes());
    }

    fn enable_ring(&mut self, base: u64, entries: u32, in_vram: bool) {
        self.write64(REG_RING_BASE_LO, base);
        self.write32(REG_RING_SIZE, entries);
        let ctrl = RING_CTRL_ENABLE | if in_vram { RING_CTRL_IN_VRAM } else { 0 };
        self.write32(REG_RING_CTRL, ctrl);
        self.entries = entries;
        self.tail = 0;
    }

    fn ring_in_vram(&self) -> bool {
        self.read32(REG_RING_CTRL) & RING_CTRL_IN_VRAM != 0
    }

    /// Puts `cmd` at the tail (fence, completion slot filled in unless
    /// already set), rings the doorbell and returns the fence.
    fn submit(&mut self, mut cmd: Command) -> u64 {
        if cmd.fence == 0 {
            cmd.fence = self.next_fence;
            self.next_fence += 1;
        }
        if cmd.flags & CMD_FLAG_COMPLETION != 0 && cmd.completion_addr == 0 {
            cmd.completion_addr = self.record_gpa(self.tail);
        }
        let base = self.read64(REG_RING_BASE_LO);
        let at = base + u64::from(self.tail) * COMMAND_SIZE;
        if self.ring_in_vram() {
            self.gpu.vram().write(at, &cmd.encode()).unwrap();
        } else {
            self.ram.poke(at, &cmd.encode());
        }
        self.tail = (self.tail + 1) % self.entries;
        self.write32(REG_DOORBELL, self.tail);
        cmd.fence
    }

    fn record_gpa(&self, slot: u32) -> u64 {
        RECORDS_GPA + u64::from(slot) * COMPLETION_SIZE as u64
    }

    fn wait_fence(&self, fence: u64) {
        wait_until(&format!("fence {fence}"), || {
            self.read64(REG_FENCE_LO) == fence
        });
    }

    fn wait_idle(&self) {
        wait_until("engine idle", || self.read32(REG_STATUS) & STATUS_BUSY == 0);
    }

    /// Submits, waits for the fence, returns the completion record.
    fn run(&mut self, mut cmd: Command) -> Completion {
        cmd.flags |= CMD_FLAG_COMPLETION | CMD_FLAG_IRQ;
        let slot = self.tail;
        self.ram
            .poke(self.record_gpa(slot), &[0xee; COMPLETION_SIZE]);
        let fence = self.submit(cmd);
        self.wait_fence(fence);
        let bytes: [u8; COMPLETION_SIZE] = self
            .ram
            .peek(self.record_gpa(slot), COMPLETION_SIZE)
            .try_into()
            .unwrap();
        let record = Completion::decode(&bytes);
        assert_eq!(record.fence, fence);
        record
    }

    fn irqs(&self) -> u64 {
        self.irq.count.load(Ordering::SeqCst)
    }

    fn wait_irqs(&self, n: u64) {
        wait_until(&format!("{n} interrupts"), || self.irqs() >= n);
    }
}

fn cmd(opcode: u8, src: u64, dst: u64, len: u64) -> Command {
    Command {
        opcode,
        src,
        dst,
        len,
        ..Command::default()
    }
}

fn fill_cmd(dst: u64, len: u64, pattern: u32) -> Command {
    Command {
        pattern,
        ..cmd(OP_FILL, 0, dst, len)
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn vram_bytes(rig: &Rig, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    rig.gpu.vram().read(off, &mut buf).unwrap();
    buf
}

// ---------------------------------------------------------------- registers

#[test]
fn identity_registers() {
    let rig = Rig::new(1 << 30);
    assert_eq!(rig.read32(REG_ID), ID_MAGIC);
    assert_eq!(rig.read32(REG_VERSION), VERSION);
    assert_eq!(rig.read64(REG_VRAM_SIZE_LO), 1 << 30);
    assert_eq!(rig.read32(REG_VRAM_SIZE_LO), 1 << 30);
    assert_eq!(rig.read32(REG_VRAM_SIZE_HI), 0);
    let status = rig.read32(REG_STATUS);
    assert_eq!(status, STATUS_READY | STATUS_BUS_MASTER);
    assert_eq!(
        rig.read32(REG_INT_MASK),
        INT_ALL,
        "all causes masked at power-on"
    );

    let big = Rig::new(64 << 30);
    assert_eq!(big.read32(REG_VRAM_SIZE_HI), 16);
    assert_eq!(big.read32(REG_VRAM_SIZE_LO), 0);
}

#[test]
fn odd_reads_are_assembled_and_out_of_bar_reads_are_ones() {
    let rig = Rig::new(256 << 20);
    let mut one = [0u8; 1];
    rig.gpu.regs_read(REG_ID + 1, &mut one);
    assert_eq!(one[0], (ID_MAGIC >> 8) as u8);
    let mut two = [0u8; 2];
    rig.gpu.regs_read(REG_ID + 3, &mut two);
    assert_eq!(two, [(ID_MAGIC >> 24) as u8, VERSION as u8]);
    let mut tail = [0u8; 4];
    rig.gpu.regs_read(REGS_BAR_SIZE - 2, &mut tail);
    assert_eq!(tail, [0, 0, 0xff, 0xff]);
    rig.gpu.regs_read(u64::MAX - 1, &mut tail);
    assert_eq!(tail, [0xff; 4]);
}

#[test]
fn scratch_round_trip_and_read_only_registers() {
    let rig = Rig::new(256 << 20);
    rig.write32(REG_SCRATCH, 0xcafe_f00d);
    assert_eq!(rig.read32(REG_SCRATCH), 0xcafe_f00d);
    rig.write32(REG_ID, 0);
    rig.write32(REG_VRAM_SIZE_LO, 0);
    rig.write32(REG_FENCE_LO, 77);
    rig.write32(REG_RING_HEAD, 3);
    assert_eq!(rig.read32(REG_ID), ID_MAGIC);
    assert_eq!(rig.read64(REG_VRAM_SIZE_LO), 256 << 20);
    assert_eq!(rig.read64(REG_FENCE_LO), 0);
    assert_eq!(rig.read32(REG_RING_HEAD), 0);
    assert_eq!(rig.read32(REG_DOORBELL), 0);
}

#[test]
fn unsupported_writes_are_ignored_and_counted() {
    let rig = Rig::new(256 << 20);
    rig.gpu.regs_write(REG_SCRATCH, &[1, 2]);
    rig.gpu.regs_write(REG_SCRATCH + 1, &[1, 2, 3, 4]);
    rig.gpu.regs_write(REG_SCRATCH - 4 + 4, &[]);
    rig.gpu.regs_write(REG_RING_BASE_LO + 4, &[0; 8]);
    rig.gpu.regs_write(u64::MAX - 3, &[1, 2, 3, 4]);
    assert_eq!(rig.read32(REG_SCRATCH), 0);
    // The last write hit no register but was well-formed: only 4 are bad.
    assert_eq!(rig.gpu.stats().bad_register_accesses, 4);
}

#[test]
fn ring_geometry_is_frozen_while_enabled() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(RING_GPA, 16, false);
    rig.write64(REG_RING_BASE_LO, RING_GPA + 4096);
    rig.write32(REG_RING_SIZE, 64);
    rig.write32(REG_RING_CTRL, RING_CTRL_ENABLE | RING_CTRL_IN_VRAM);
    assert_eq!(rig.read64(REG_RING_BASE_LO), RING_GPA);
    assert_eq!(rig.read32(REG_RING_SIZE), 16);
    assert_eq!(rig.read32(REG_RING_CTRL), RING_CTRL_ENABLE);
    rig.write32(REG_RING_CTRL, 0);
    rig.write32(REG_RING_SIZE, 64);
    assert_eq!(rig.read32(REG_RING_SIZE), 64);
}

// ------------------------------------------------------------- ring errors

fn assert_halted(rig: &Rig, code: u32) {
    let status = rig.read32(REG_STATUS);
    assert!(status & STATUS_HALTED != 0, "status {status:#x}");
    assert_eq!(rig.read32(REG_ENGINE_ERROR), code);
    assert!(rig.read32(REG_INT_STATUS) & INT_ERROR != 0);
}

#[test]
fn bad_ring_setups_halt_with_their_error() {
    let cases: [(u64, u32, bool, u32); 7] = [
        (RING_GPA + 32, 16, false, ERR_RING_MISALIGNED),
        (RING_GPA, 0, false, ERR_RING_BAD_SIZE),
        (RING_GPA, 1, false, ERR_RING_BAD_SIZE),
        (RING_GPA, 24, false, ERR_RING_BAD_SIZE),
        (RING_GPA, MAX_RING_ENTRIES * 2, false, ERR_RING_BAD_SIZE),
        ((256 << 20) - 64 * 8, 16, true, ERR_RING_RANGE),
        (u64::MAX - 63, 16, false, ERR_RING_RANGE),
    ];
    for (base, entries, in_vram, code) in cases {
        let mut rig = Rig::new(256 << 20);
        rig.write32(REG_INT_MASK, 0);
        rig.enable_ring(base, entries, in_vram);
        assert_halted(&rig, code);
        rig.wait_irqs(1);
        // A halted ring ignores doorbells, and disabling recovers it.
        rig.write32(REG_DOORBELL, 1);
        assert_eq!(rig.read32(REG_RING_TAIL), 0);
        rig.write32(REG_RING_CTRL, 0);
        assert_eq!(rig.read32(REG_STATUS) & STATUS_HALTED, 0);
        rig.enable_ring(RING_GPA, 16, false);
        assert_eq!(rig.read32(REG_ENGINE_ERROR), 0);
        let record = rig.run(fill_cmd(0, 4096, 0x0101_0101));
        assert_eq!(record.status, STATUS_OK);
    }
    // The largest legal ring in VRAM fits exactly at the end.
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(
        (256 << 20) - u64::from(MAX_RING_ENTRIES) * 64,
        MAX_RING_ENTRIES,
        true,
    );
    assert_eq!(rig.read32(REG_STATUS) & STATUS_HALTED, 0);
}

#[test]
fn tail_beyond_ring_size_halts() {
    let rig = Rig::ready();
    rig.write32(REG_DOORBELL, 16);
    assert_halted(&rig, ERR_BAD_TAIL);
    assert_eq!(rig.read32(REG_RING_TAIL), 0);
    assert_eq!(rig.gpu.stats().ring_errors, 1);
}

#[test]
fn ring_in_unmapped_memory_halts_with_fetch_error() {
    let mut rig = Rig::new(256 << 20);
    rig.write32(REG_INT_MASK, 0);
    rig.enable_ring(0x4000_0000, 16, false);
    rig.write32(REG_DOORBELL, 1);
    wait_until("halt", || rig.read32(REG_STATUS) & STATUS_HALTED != 0);
    assert_halted(&rig, ERR_RING_FETCH);
    assert_eq!(rig.read32(REG_RING_HEAD), 0);
    assert_eq!(rig.read64(REG_FENCE_LO), 0);
    rig.wait_irqs(1);
}

#[test]
fn no_bus_master_halts_a_host_ring() {
    let mut rig = Rig::ready();
    rig.gpu.set_bus_master(false);
    rig.submit(cmd(OP_NOP, 0, 0, 0));
    wait_until("halt", || rig.read32(REG_STATUS) & STATUS_HALTED != 0);
    assert_halted(&rig, ERR_NO_BUS_MASTER);
}

// ---------------------------------------------------------------- commands

#[test]
fn copy_host_to_vram_and_back() {
    let mut rig = Rig::ready();
    let data = pattern(3 * (1 << 20) + 123, 7);
    rig.ram.poke(DATA_GPA, &data);
    let vram_off = 5 * 4096 + 17;
    let r = rig.run(cmd(OP_COPY_TO_VRAM, DATA_GPA, vram_off, data.len() as u64));
    assert_eq!(r.status, STATUS_OK);
    assert_eq!(vram_bytes(&rig, vram_off, data.len()), data);

    let back_gpa = DATA_GPA + (5 << 20);
    let r = rig.run(cmd(
        OP_COPY_FROM_VRAM,
        vram_off,
        back_gpa,
        data.len() as u64,
    ));
    assert_eq!(r.status, STATUS_OK);
    assert_eq!(rig.ram.peek(back_gpa, data.len()), data);

    let stats = rig.gpu.stats();
    assert_eq!(stats.bytes_host_to_vram, data.len() as u64);
    assert_eq!(stats.bytes_vram_to_host, data.len() as u64);
    assert_eq!(stats.jobs_completed, 2);
    assert_eq!(stats.jobs_failed, 0);
    assert_eq!(rig.read32(REG_JOBS_COMPLETED), 2);
}

#[test]
fn copy_inside_vram_including_overlaps() {
    let mut rig = Rig::ready();
    let len = (2 << 20) + 999;
    let data = pattern(len, 11);
    rig.gpu.vram().write(0, &data).unwrap();

    // Disjoint.
    let r = rig.run(cmd(OP_COPY_VRAM, 0, 64 << 20, len as u64));
    assert_eq!(r.status, STATUS_OK);
    assert_eq!(vram_bytes(&rig, 64 << 20, len), data);

    // Overlapping, destination above the source (needs back-to-front).
    let r = rig.run(cmd(OP_COPY_VRAM, 64 << 20, (64 << 20) + 4097, len as u64));
    assert_eq!(r.status, STATUS_OK);
    assert_eq!(vram_bytes(&rig, (64 << 20) + 4097, len), data);

    // Overlapping, destination below the source.
    let r = rig.run(cmd(
        OP_COPY_VRAM,
        (64 << 20) + 4097,
        (64 << 20) + 1,
        len as u64,
    ));
    assert_eq!(r.status, STATUS_OK);
    assert_eq!(vram_bytes(&rig, (64 << 20) + 1, len), data);
    assert_eq!(rig.gpu.stats().bytes_vram_to_vram, 3 * len as u64);
}

#[test]
fn fill_repeats_the_pattern_from_dst() {
    let mut rig = Rig::ready();
    let (dst, len) = (4096 * 3 + 1, (1 << 20) + 4099);
    rig.gpu.vram().write(dst - 1, &[0xaa]).unwrap();
    rig.gpu.vram().write(dst + len, &[0xbb]).unwrap();
    let r = rig.run(fill_cmd(dst, len, 0x4433_2211));
    assert_eq!(r.status, STATUS_OK);
    let got = vram_bytes(&rig, dst - 1, len as usize + 2);
    assert_eq!(got[0], 0xaa, "byte before the range untouched");
    assert_eq!(
        got[len as usize + 1],
        0xbb,
        "byte after the range untouched"
    );
    for (i, b) in got[1..=len as usize].iter().enumerate() {
        assert_eq!(*b, [0x11, 0x22, 0x33, 0x44][i % 4], "byte {i}");
    }
    assert_eq!(rig.gpu.stats().bytes_filled, len);
}

#[test]
fn zero_fill_zeroes_and_frees_pages() {
    let mut rig = Rig::ready();
    let r = rig.run(fill_cmd(0, 8 << 20, 0xffff_ffff));
    assert_eq!(r.status, STATUS_OK);
    assert!(rig.gpu.stats().vram_allocated_bytes >= 8 << 20);
    let r = rig.run(fill_cmd(100, (8 << 20) - 200, 0));
    assert_eq!(r.status, STATUS_OK);
    assert!(rig.gpu.stats().vram_allocated_bytes <= 2 * 4096);
    let got = vram_bytes(&rig, 0, 8 << 20);
    assert!(got[..100].iter().all(|&b| b == 0xff));
    assert!(got[100..(8 << 20) - 100].iter().all(|&b| b == 0));
    assert!(got[(8 << 20) - 100..].iter().all(|&b| b == 0xff));
}

#[test]
fn checksum_matches_known_vectors() {
    let mut rig = Rig::ready();
    rig.gpu.vram().write(12345, b"123456789").unwrap();
    let r = rig.run(cmd(OP_CHECKSUM, 12345, 0, 9));
    assert_eq!(r.status, STATUS_OK);
    assert_eq!(r.result, 0xe306_9283);
    assert_eq!(rig.read32(REG_CHECKSUM), 0xe306_9283);

    // 32 bytes of zeros (RFC 3720 B.4) straight from an untouched hole.
    let r = rig.run(cmd(OP_CHECKSUM, 100 << 20, 0, 32));
    assert_eq!(r.result, 0x8a91_36aa);

    // A multi-chunk range with data written by a copy.
    let data = pattern((5 << 20) / 2 + 3, 5);
    rig.ram.poke(DATA_GPA, &data);
    rig.run(cmd(OP_COPY_TO_VRAM, DATA_GPA, 1 << 20, data.len() as u64));
    let r = rig.run(cmd(OP_CHECKSUM, 1 << 20, 0, data.len() as u64));
    assert_eq!(r.result, crc32c(&data));
    assert_eq!(
        rig.gpu.stats().bytes_checksummed,
        9 + 32 + data.len() as u64
    );

    // Empty range: CRC of nothing is 0.
    let r = rig.run(cmd(OP_CHECKSUM, 0, 0, 0));
    assert_eq!((r.status, r.result), (STATUS_OK, 0));
}

#[test]
fn malformed_commands_retire_with_an_error_and_change_nothing() {
    let mut rig = Rig::ready();
    let size = 256u64 << 20;
    let base_data = pattern(8192, 3);
    rig.gpu.vram().write(size - 8192, &base_data).unwrap();
    rig.ram.poke(DATA_GPA, &[0x77; 8192]);
    let with = |c: Command, f: &dyn Fn(&mut Command)| {
        let mut c = c;
        f(&mut c);
        c
    };
    let cases: Vec<(&str, Command, u32)> = vec![
        ("bad opcode", cmd(0x42, 0, 0, 16), ERR_BAD_OPCODE),
        ("opcode 0xff", cmd(0xff, 0, 0, 16), ERR_BAD_OPCODE),
        (
            "reserved0",
            with(cmd(OP_COPY_VRAM, 0, size - 4096, 16), &|c| c.reserved0 = 1),
            ERR_BAD_COMMAND,
        ),
        (
            "reserved1",
            with(cmd(OP_COPY_VRAM, 0, size - 4096, 16), &|c| {
                c.reserved1[1] = 1
            }),
            ERR_BAD_COMMAND,
        ),
        (
            "pattern on a copy",
            with(cmd(OP_COPY_VRAM, 0, size - 4096, 16), &|c| c.pattern = 9),
            ERR_BAD_COMMAND,
        ),
        (
            "copy-to-vram past the end",
            cmd(OP_COPY_TO_VRAM, DATA_GPA, size - 4096, 8192),
            ERR_VRAM_RANGE,
        ),
        (
            "copy-to-vram wraps",
            cmd(OP_COPY_TO_VRAM, DATA_GPA, u64::MAX - 10, 100),
            ERR_VRAM_RANGE,
        ),
        (
            "copy-from-vram past the end",
            cmd(OP_COPY_FROM_VRAM, size - 10, DATA_GPA, 11),
            ERR_VRAM_RANGE,
        ),
        (
            "copy-vram dst past the end",
            cmd(OP_COPY_VRAM, 0, size - 8, 16),
            ERR_VRAM_RANGE,
        ),
        (
            "copy-vram src past the end",
            cmd(OP_COPY_VRAM, size, size - 8192, 1),
            ERR_VRAM_RANGE,
        ),
        (
            "fill past the end",
            fill_cmd(size - 4096, 4097, 0x1234_5678),
            ERR_VRAM_RANGE,
        ),
        (
            "zero fill past the end",
            fill_cmd(size - 4096, 1 << 40, 0),
            ERR_VRAM_RANGE,
        ),
        (
            "checksum past the end",
            cmd(OP_CHECKSUM, size - 1, 0, 2),
            ERR_VRAM_RANGE,
        ),
        (
            "host source unmapped",
            cmd(OP_COPY_TO_VRAM, 0x1000, size - 8192, 4096),
            ERR_HOST_DMA,
        ),
        (
            "host source wraps",
            cmd(OP_COPY_TO_VRAM, u64::MAX - 10, size - 8192, 100),
            ERR_HOST_DMA,
        ),
        (
            "host destination runs off RAM",
            cmd(
                OP_COPY_FROM_VRAM,
                size - 8192,
                RAM_BASE + RAM_SIZE as u64 - 4096,
                8192,
            ),
            ERR_HOST_DMA,
        ),
    ];
    let irqs_before = rig.irqs();
    for (i, (what, c, code)) in cases.iter().enumerate() {
        rig.write32(REG_INT_STATUS, INT_ALL);
        let r = rig.run(*c);
        assert_eq!(r.status, *code, "{what}");
        assert_eq!(rig.read32(REG_ENGINE_ERROR), *code, "{what}");
        assert_eq!(rig.read32(REG_INT_STATUS) & INT_ERROR, INT_ERROR, "{what}");
        assert_eq!(
            rig.read32(REG_STATUS) & STATUS_HALTED,
            0,
            "{what}: engine keeps going"
        );
        assert_eq!(rig.read32(REG_JOBS_FAILED), i as u32 + 1);
    }
    assert!(rig.irqs() >= irqs_before + cases.len() as u64);
    assert_eq!(
        vram_bytes(&rig, size - 8192, 8192),
        base_data,
        "VRAM unchanged"
    );
    assert_eq!(
        rig.ram.peek(DATA_GPA, 8192),
        vec![0x77; 8192],
        "RAM unchanged"
    );
    // A failed host write stops at the first bad chunk; the RAM tail stays.
    let s = rig.gpu.stats();
    assert_eq!(s.jobs_failed, cases.len() as u64);
    assert_eq!(s.jobs_completed, 0);
    assert_eq!(
        s.bytes_host_to_vram + s.bytes_vram_to_vram + s.bytes_filled,
        0
    );
    // And the engine still works.
    assert_eq!(rig.run(cmd(OP_NOP, 0, 0, 0)).status, STATUS_OK);
}

#[test]
fn unknown_flags_are_rejected_without_writing_a_record() {
    let mut rig = Rig::ready();
    rig.ram.poke(rig.record_gpa(0), &[0xee; COMPLETION_SIZE]);
    let fence = rig.submit(Command {
        flags: 0x80 | CMD_FLAG_COMPLETION,
        ..cmd(OP_NOP, 0, 0, 0)
    });
    rig.wait_fence(fence);
    assert_eq!(rig.read32(REG_ENGINE_ERROR), ERR_BAD_COMMAND);
    // A command we do not understand must not make us write guest memory.
    assert_eq!(
        rig.ram.peek(rig.record_gpa(0), COMPLETION_SIZE),
        vec![0xee; COMPLETION_SIZE]
    );
}

#[test]
fn host_copies_without_bus_master_fail_but_vram_ring_keeps_working() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(128 << 20, 8, true);
    rig.gpu.set_bus_master(false);
    let f = rig.submit(cmd(OP_COPY_TO_VRAM, DATA_GPA, 0, 4096));
    rig.wait_fence(f);
    assert_eq!(rig.read32(REG_ENGINE_ERROR), ERR_NO_BUS_MASTER);
    let f = rig.submit(fill_cmd(0, 4096, 0x5a5a_5a5a));
    rig.wait_fence(f);
    assert_eq!(vram_bytes(&rig, 0, 4096), vec![0x5a; 4096]);
    // A completion record needs bus mastering too.
    let f = rig.submit(Command {
        flags: CMD_FLAG_COMPLETION,
        completion_addr: RECORDS_GPA,
        ..cmd(OP_NOP, 0, 0, 0)
    });
    rig.wait_fence(f);
    assert_eq!(rig.read32(REG_ENGINE_ERROR), ERR_COMPLETION_WRITE);
}

#[test]
fn completion_write_failure_is_reported() {
    let mut rig = Rig::ready();
    let f = rig.submit(Command {
        flags: CMD_FLAG_COMPLETION,
        completion_addr: 0x10,
        ..fill_cmd(0, 64, 0x0101_0101)
    });
    rig.wait_fence(f);
    assert_eq!(rig.read32(REG_ENGINE_ERROR), ERR_COMPLETION_WRITE);
    assert!(rig.read32(REG_INT_STATUS) & INT_ERROR != 0);
    // The work itself was done.
    assert_eq!(vram_bytes(&rig, 0, 64), vec![1; 64]);
}

// ------------------------------------------------------ fences, interrupts

#[test]
fn fence_and_interrupt_semantics() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(RING_GPA, 16, false);

    // Masked: the cause is latched, no MSI-X is sent.
    let f = rig.submit(Command {
        flags: CMD_FLAG_IRQ,
        fence: 1000,
        ..cmd(OP_NOP, 0, 0, 0)
    });
    rig.wait_fence(f);
    assert_eq!(f, 1000, "the fence is the command's own value");
    assert_eq!(rig.read32(REG_INT_STATUS), INT_FENCE);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.irqs(), 0);

    // Unmasking a latched cause sends one.
    rig.write32(REG_INT_MASK, INT_ERROR);
    rig.wait_irqs(1);
    // Write-1-to-clear.
    rig.write32(REG_INT_STATUS, INT_ERROR);
    assert_eq!(rig.read32(REG_INT_STATUS), INT_FENCE);
    rig.write32(REG_INT_STATUS, INT_FENCE);
    assert_eq!(rig.read32(REG_INT_STATUS), 0);

    // Without CMD_FLAG_IRQ, a successful command raises nothing.
    let f = rig.submit(cmd(OP_NOP, 0, 0, 0));
    rig.wait_fence(f);
    assert_eq!(rig.read32(REG_INT_STATUS), 0);

    // With it, one interrupt per command.
    for _ in 0..5 {
        let f = rig.submit(Command {
            flags: CMD_FLAG_IRQ,
            ..cmd(OP_NOP, 0, 0, 0)
        });
        rig.wait_fence(f);
    }
    rig.wait_irqs(6);
    // Errors raise INT_ERROR even without the flag; it is masked here.
    let f = rig.submit(cmd(0x99, 0, 0, 0));
    rig.wait_fence(f);
    assert_eq!(rig.read32(REG_INT_STATUS), INT_FENCE | INT_ERROR);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.irqs(), 6);
    assert_eq!(rig.gpu.stats().interrupts, 6);
    assert!(!rig.irq.wrong_vector.load(Ordering::SeqCst));
}

#[test]
fn ring_wraps_around_many_times() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(RING_GPA, 4, false);
    for i in 0..37u32 {
        let f = rig.submit(fill_cmd(u64::from(i) * 4, 4, 0x0101_0101 * (i % 250 + 1)));
        rig.wait_fence(f);
        assert_eq!(rig.read32(REG_RING_HEAD), (i + 1) % 4);
    }
    let got = vram_bytes(&rig, 0, 37 * 4);
    for i in 0..37usize {
        assert_eq!(got[i * 4], (i % 250 + 1) as u8);
    }
}

#[test]
fn a_batch_retires_in_order_with_the_last_fence() {
    let rig = Rig::ready();
    // Fill the ring (15 of 16 entries) before one doorbell.
    let base = rig.read64(REG_RING_BASE_LO);
    for i in 0..15u64 {
        let c = fill_cmd(i * 4096, 4096, 0x0101_0101 * (i as u32 + 1));
        let c = Command {
            fence: 100 + i,
            ..c
        };
        rig.ram.poke(base + i * COMMAND_SIZE, &c.encode());
    }
    rig.write32(REG_DOORBELL, 15);
    rig.wait_fence(114);
    rig.wait_idle();
    assert_eq!(rig.read32(REG_RING_HEAD), 15);
    for i in 0..15u64 {
        assert_eq!(vram_bytes(&rig, i * 4096, 1)[0], i as u8 + 1);
    }
}

#[test]
fn ring_in_vram_works() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(200 << 20, 8, true);
    rig.gpu.vram().write(0, b"123456789").unwrap();
    let f = rig.submit(cmd(OP_CHECKSUM, 0, 0, 9));
    rig.wait_fence(f);
    assert_eq!(rig.read32(REG_CHECKSUM), 0xe306_9283);
}

// -------------------------------------------------------------- reset, abort

/// Holds a 3 MiB host→VRAM copy inside its first guest read, then runs
/// `interrupt`, then lets the read finish.
fn abandon_copy_midway(interrupt: impl FnOnce(&mut Rig)) -> Rig {
    let mut rig = Rig::ready();
    rig.ram.poke(DATA_GPA, &vec![0x3c; 3 << 20]);
    rig.ram.poke(rig.record_gpa(0), &[0xee; COMPLETION_SIZE]);
    rig.ram.close_gate();
    rig.submit(Command {
        flags: CMD_FLAG_COMPLETION | CMD_FLAG_IRQ,
        ..cmd(OP_COPY_TO_VRAM, DATA_GPA, 0, 3 << 20)
    });
    wait_until("engine inside the guest read", || {
        rig.ram.reads_waiting.load(Ordering::SeqCst) > 0
    });
    assert!(rig.read32(REG_STATUS) & STATUS_BUSY != 0);
    interrupt(&mut rig);
    rig.ram.open_gate();
    rig.wait_idle();
    rig
}

#[test]
fn reset_abandons_the_job_in_flight_and_restores_defaults() {
    let rig = abandon_copy_midway(|rig| {
        rig.write32(REG_SCRATCH, 5);
        rig.gpu.reset();
    });
    assert_eq!(rig.read64(REG_FENCE_LO), 0);
    assert_eq!(rig.read32(REG_SCRATCH), 0);
    assert_eq!(rig.read32(REG_RING_CTRL), 0);
    assert_eq!(rig.read64(REG_RING_BASE_LO), 0);
    assert_eq!(rig.read32(REG_INT_MASK), INT_ALL);
    assert_eq!(rig.read32(REG_INT_STATUS), 0);
    assert_eq!(rig.read32(REG_STATUS), STATUS_READY | STATUS_BUS_MASTER);
    // No record, no fence, no interrupt, and at most the chunk that was
    // already in flight reached VRAM.
    assert_eq!(
        rig.ram.peek(rig.record_gpa(0), COMPLETION_SIZE),
        vec![0xee; COMPLETION_SIZE]
    );
    assert_eq!(rig.irqs(), 0);
    assert!(vram_bytes(&rig, 1 << 20, 2 << 20).iter().all(|&b| b == 0));
    let s = rig.gpu.stats();
    assert_eq!((s.jobs_completed, s.jobs_failed, s.resets), (0, 0, 1));
}

#[test]
fn disabling_the_ring_abandons_the_job_and_reenable_starts_clean() {
    let mut rig = abandon_copy_midway(|rig| rig.write32(REG_RING_CTRL, 0));
    assert_eq!(rig.read64(REG_FENCE_LO), 0);
    assert_eq!(
        rig.ram.peek(rig.record_gpa(0), COMPLETION_SIZE),
        vec![0xee; COMPLETION_SIZE]
    );
    rig.enable_ring(RING_GPA, 16, false);
    assert_eq!(
        (rig.read32(REG_RING_HEAD), rig.read32(REG_RING_TAIL)),
        (0, 0)
    );
    let r = rig.run(cmd(OP_COPY_TO_VRAM, DATA_GPA, 0, 3 << 20));
    assert_eq!(r.status, STATUS_OK);
    assert!(vram_bytes(&rig, 0, 3 << 20).iter().all(|&b| b == 0x3c));
}

// ---------------------------------------------------------- robustness

#[test]
fn random_ring_entries_never_break_the_engine() {
    let mut rig = Rig::ready();
    let size = 256u64 << 20;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..400u64 {
        let mut raw = [0u8; 64];
        for chunk in raw.chunks_exact_mut(8) {
            chunk.copy_from_slice(&next().to_le_bytes());
        }
        let mut c = Command::decode(&raw);
        // Keep a sensible share of entries close to valid, so the range
        // checks, not only the opcode check, get exercised.
        if i % 2 == 0 {
            c.opcode %= 8;
            c.reserved0 = 0;
            c.reserved1 = [0, 0];
            c.flags &= CMD_FLAG_IRQ;
            if c.opcode != OP_FILL {
                c.pattern = 0;
            }
            c.len %= 1 << (next() % 22);
            c.src = if next() % 2 == 0 {
                c.src % size
            } else {
                DATA_GPA + c.src % (8 << 20)
            };
            c.dst = if next() % 2 == 0 {
                c.dst % size
            } else {
                DATA_GPA + c.dst % (8 << 20)
            };
        }
        c.flags &= !CMD_FLAG_COMPLETION;
        c.fence = 1_000_000 + i;
        rig.submit(c);
        rig.wait_fence(c.fence);
    }
    let s = rig.gpu.stats();
    assert_eq!(s.jobs_completed + s.jobs_failed, 400);
    assert!(s.jobs_completed > 50 && s.jobs_failed > 200, "{s:?}");
    assert!(
        s.bytes_host_to_vram > 0 && s.bytes_vram_to_host > 0 && s.bytes_filled > 0,
        "{s:?}"
    );
    assert_eq!(rig.read32(REG_STATUS) & STATUS_HALTED, 0);
}

#[test]
fn random_register_writes_never_break_the_device() {
    let rig = Rig::ready();
    let mut x: u64 = 12345;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let offset = next() % (REGS_BAR_SIZE + 64);
        let len = [1usize, 2, 4, 8][(next() % 4) as usize];
        let value = next().to_le_bytes();
        rig.gpu.regs_write(offset & !3, &value[..len]);
        let mut back = [0u8; 8];
        rig.gpu
            .regs_read(next() % (REGS_BAR_SIZE + 64), &mut back[..len]);
    }
    assert_eq!(rig.read32(REG_ID), ID_MAGIC);
    // After a reset the device is fully usable again.
    rig.gpu.reset();
    let mut rig = rig;
    rig.wait_idle();
    rig.enable_ring(RING_GPA, 16, false);
    rig.write32(REG_INT_MASK, 0);
    assert_eq!(rig.run(fill_cmd(0, 16, 0x0707_0707)).status, STATUS_OK);
}

// ------------------------------------------------------------------ sparse

#[test]
fn large_vram_stays_sparse() {
    let mut rig = Rig::new(4 << 30);
    rig.enable_ring(RING_GPA, 16, false);
    for i in 0..4u64 {
        rig.run(fill_cmd(i << 30, 4096, 0xabcd_ef01));
    }
    let r = rig.run(cmd(OP_CHECKSUM, (1 << 30) + 4096, 0, 16 << 20));
    assert_eq!(r.status, STATUS_OK);
    let s = rig.gpu.stats();
    assert_eq!(s.vram_size, 4 << 30);
    assert!(
        (4 * 4096..=16 * 4096).contains(&s.vram_allocated_bytes),
        "{} bytes allocated",
        s.vram_allocated_bytes
    );
}
