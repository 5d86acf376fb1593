//! The fake guest every model test drives the device through: RAM, an
//! interrupt counter, and a driver's view of the ring.

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use p2plab_dma::testing::FakeGuestMemory;
pub use p2plab_dma::GuestMemory;
pub use p2plab_gpu::command::{Command, CommandFlags, Completion, COMMAND_SIZE, COMPLETION_SIZE};
pub use p2plab_gpu::engine::opcodes::op;
pub use p2plab_gpu::regs::*;
pub use p2plab_gpu::status::StatusCode;
use p2plab_gpu::testing::GatedMemory;
pub use p2plab_gpu::{Gpu, Vram};
use p2plab_kit::testing::RecordingInterrupts;

/// Guest RAM window used by the tests.
pub const RAM_BASE: u64 = 0x1_0000_0000;
pub const RAM_SIZE: usize = 16 << 20;
/// Where the tests put the ring and the completion records.
pub const RING_GPA: u64 = RAM_BASE;
pub const RECORDS_GPA: u64 = RAM_BASE + (1 << 20);
/// Free guest memory for data buffers.
pub const DATA_GPA: u64 = RAM_BASE + (4 << 20);

/// A flat guest RAM; accesses outside it fail like unmapped DMA would.
/// With the gate closed, reads of data buffers (at or above DATA_GPA, so
/// not ring fetches) block, to hold the engine in the middle of a job.
pub type Ram = GatedMemory<FakeGuestMemory>;

/// Where a test puts the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingIn {
    GuestMemory,
    Vram,
}

pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub struct Rig {
    pub gpu: Gpu,
    pub ram: Arc<Ram>,
    pub irq: Arc<RecordingInterrupts>,
    pub entries: u32,
    pub tail: u32,
    pub next_fence: u64,
}

impl Rig {
    pub fn new(vram_size: u64) -> Self {
        Self::with_memory(
            vram_size,
            FakeGuestMemory::new().with_region(RAM_BASE, RAM_SIZE),
        )
    }

    /// A device whose bus is `memory` (which must hold the RAM window).
    pub fn with_memory(vram_size: u64, memory: FakeGuestMemory) -> Self {
        Self::build(vram_size, memory, false)
    }

    /// A device with its engine on the test's thread
    /// (`Gpu::with_engine_on_caller`): nothing runs until
    /// `gpu.run_engine()`.
    pub fn on_caller(vram_size: u64) -> Self {
        let memory = FakeGuestMemory::new().with_region(RAM_BASE, RAM_SIZE);
        Self::build(vram_size, memory, true)
    }

    fn build(vram_size: u64, memory: FakeGuestMemory, on_caller: bool) -> Self {
        let ram = Arc::new(GatedMemory::new(memory, DATA_GPA));
        let irq = RecordingInterrupts::new();
        let vram = Vram::new(vram_size).unwrap();
        let gpu = if on_caller {
            Gpu::with_engine_on_caller(vram, ram.clone(), irq.clone())
        } else {
            Gpu::new(vram, ram.clone(), irq.clone()).unwrap()
        };
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
    pub fn ready() -> Self {
        let mut rig = Self::new(256 << 20);
        rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
        rig.write32(Reg::IntMask, 0);
        rig
    }

    pub fn read32(&self, reg: Reg) -> u32 {
        self.read_dword(reg, Half::Low)
    }

    pub fn read_dword(&self, reg: Reg, half: Half) -> u32 {
        let mut b = [0u8; 4];
        self.gpu.regs_read(reg.dword_offset(half), &mut b);
        u32::from_le_bytes(b)
    }

    pub fn read64(&self, reg: Reg) -> u64 {
        let mut b = [0u8; 8];
        self.gpu.regs_read(reg.offset(), &mut b);
        u64::from_le_bytes(b)
    }

    pub fn write32(&self, reg: Reg, value: u32) {
        self.gpu.regs_write(reg.offset(), &value.to_le_bytes());
    }

    pub fn write64(&self, reg: Reg, value: u64) {
        self.gpu.regs_write(reg.offset(), &value.to_le_bytes());
    }

    pub fn status(&self) -> Status {
        Status::from_raw(self.read32(Reg::Status))
    }

    pub fn enable_ring(&mut self, base: u64, entries: u32, place: RingIn) {
        self.write64(Reg::RingBase, base);
        self.write32(Reg::RingSize, entries);
        let ctrl = match place {
            RingIn::GuestMemory => RingCtrl::ENABLE,
            RingIn::Vram => RingCtrl::ENABLE | RingCtrl::IN_VRAM,
        };
        self.write32(Reg::RingCtrl, ctrl.raw());
        self.entries = entries;
        self.tail = 0;
    }

    pub fn ring_in_vram(&self) -> bool {
        RingCtrl::from_raw(self.read32(Reg::RingCtrl)).in_vram()
    }

    /// Writes guest RAM directly (not through the gate).
    pub fn poke(&self, gpa: u64, data: &[u8]) {
        self.ram.inner().write(gpa, data).unwrap();
    }

    /// Reads guest RAM directly (not through the gate).
    pub fn peek(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        self.ram.inner().read(gpa, &mut buf).unwrap();
        buf
    }

    /// Puts `cmd` at the tail (fence, completion slot filled in unless
    /// already set), rings the doorbell and returns the fence.
    pub fn submit(&mut self, mut cmd: Command) -> u64 {
        if cmd.fence == 0 {
            cmd.fence = self.next_fence;
            self.next_fence += 1;
        }
        if cmd.flags.contains(CommandFlags::COMPLETION) && cmd.completion_addr == 0 {
            cmd.completion_addr = self.record_gpa(self.tail);
        }
        let base = self.read64(Reg::RingBase);
        let at = base + u64::from(self.tail) * COMMAND_SIZE;
        if self.ring_in_vram() {
            self.gpu.vram().write(at, &cmd.encode()).unwrap();
        } else {
            self.poke(at, &cmd.encode());
        }
        self.tail = (self.tail + 1) % self.entries;
        self.write32(Reg::Doorbell, self.tail);
        cmd.fence
    }

    pub fn record_gpa(&self, slot: u32) -> u64 {
        RECORDS_GPA + u64::from(slot) * COMPLETION_SIZE as u64
    }

    pub fn wait_fence(&self, fence: u64) {
        wait_until(&format!("fence {fence}"), || {
            self.read64(Reg::Fence) == fence
        });
    }

    pub fn wait_idle(&self) {
        wait_until("engine idle", || !self.status().contains(Status::BUSY));
    }

    /// Submits, waits for the fence, returns the completion record.
    pub fn run(&mut self, mut cmd: Command) -> Completion {
        cmd.flags |= CommandFlags::COMPLETION | CommandFlags::IRQ;
        let slot = self.tail;
        self.poke(self.record_gpa(slot), &[0xee; COMPLETION_SIZE]);
        let fence = self.submit(cmd);
        self.wait_fence(fence);
        let bytes: [u8; COMPLETION_SIZE] = self
            .peek(self.record_gpa(slot), COMPLETION_SIZE)
            .try_into()
            .unwrap();
        let record = Completion::decode(&bytes);
        assert_eq!(record.fence, fence);
        record
    }

    pub fn irqs(&self) -> u64 {
        self.irq.total() as u64
    }

    pub fn wait_irqs(&self, n: u64) {
        wait_until(&format!("{n} interrupts"), || self.irqs() >= n);
    }
}

pub fn cmd(opcode: u8, src: u64, dst: u64, len: u64) -> Command {
    Command {
        opcode,
        src,
        dst,
        len,
        ..Command::default()
    }
}

pub fn fill_cmd(dst: u64, len: u64, pattern: u32) -> Command {
    Command {
        pattern,
        ..cmd(op::FILL, 0, dst, len)
    }
}

pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
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

pub fn vram_bytes(rig: &Rig, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    rig.gpu.vram().read(off, &mut buf).unwrap();
    buf
}
