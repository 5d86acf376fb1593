//! The GPU model's command ring and engine as a hostile guest drives them:
//! register writes (ring base, size, control, tail, doorbell, interrupt
//! bits) with any value, ring entries with any fields (operands optionally
//! steered into guest RAM or VRAM so they reach the copy, fill and
//! checksum paths), guest RAM and VRAM scribbled, Bus Master Enable
//! toggled, resets, in any order. The engine runs on the target's thread
//! (`Gpu::with_engine_on_caller`): after each step `Gpu::run_engine` runs
//! the engine's own fetch, execute and retire code (`Engine::step` in
//! devices/gpu/src/engine/mod.rs, the loop the engine thread runs) until
//! it has nothing to do, instead of a thread per input and a wait of up
//! to 5 ms per step for it to go idle (about 10 inputs/s). What only a
//! thread shows (a reset or ring disable overtaking a job mid-copy) is
//! left to the GPU's unit tests (tests/model/reset.rs) and the gpu_faults
//! e2e suite.
//!
//! Catches a panic or overflow anywhere in the model or the engine
//! (overflow checks are on), an engine that never goes idle
//! (`run_engine` not returning: libFuzzer's -timeout), a job that counts
//! as both completed and failed or neither, and a fence that goes
//! backwards between resets.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::GuestMemory;
use p2plab_gpu::command::{Command, COMMAND_SIZE};
use p2plab_gpu::regs::{Reg, RingCtrl, Status, Width, MIN_VRAM_SIZE};
use p2plab_gpu::{Gpu, Vram};
use p2plab_kit::testing::RecordingInterrupts;

const RAM: u64 = 0x1_0000_0000;
const RAM_SIZE: u64 = 256 << 10;
const RING: u64 = RAM;
const ENTRIES: u32 = 16;
/// Steered operands stay in the first part of VRAM and lengths small, so
/// an input costs little memory.
const VRAM_WINDOW: u64 = 1 << 20;
const MAX_STEERED_LEN: u64 = 64 << 10;
/// The engine works in steps of 1 MiB (`STEP_BYTES`). A valid length of
/// hundreds of MiB runs the same steps hundreds of times: an input with a
/// few of them took tens of milliseconds, and a grown corpus full of
/// them ran at 200 inputs/s. A length over two steps is cut to one step
/// plus its remainder within a step, so the job still runs a whole step
/// and then the same partial step; lengths past VRAM, which the engine
/// refuses before any step, keep their value.
const STEP: u64 = 1 << 20;
const MAX_UNSTEERED_LEN: u64 = 2 * STEP;

/// Bytes the engine may move for one input (copies, fills, checksums);
/// the operations after it are dropped. A grown corpus was full of inputs
/// whose jobs of one or two steps each, run again through the doorbell
/// and ring entries scribbled into RAM, moved tens of MiB through VRAM's
/// page cache: its campaign fell from 3,800 to about 700 inputs/s (a
/// profile: `Engine::copy_vram` in tmpfs reads and writes). A few jobs of
/// whole steps still fit.
const BYTE_BUDGET: u64 = 8 << 20;

fn shorten(len: u64) -> u64 {
    if len > MIN_VRAM_SIZE {
        len
    } else {
        STEP + len % STEP
    }
}

struct Guest {
    gpu: Gpu,
    ram: Arc<FakeGuestMemory>,
    tail: u32,
}

impl Guest {
    fn write(&self, reg: Reg, value: u64) {
        match reg.width() {
            Width::Bits32 => self
                .gpu
                .regs_write(reg.offset(), &(value as u32).to_le_bytes()),
            Width::Bits64 => self.gpu.regs_write(reg.offset(), &value.to_le_bytes()),
        }
    }

    fn read32(&self, reg: Reg) -> u32 {
        let mut b = [0u8; 4];
        self.gpu.regs_read(reg.offset(), &mut b);
        u32::from_le_bytes(b)
    }

    fn enable_ring(&mut self) {
        self.write(Reg::RingBase, RING);
        self.write(Reg::RingSize, u64::from(ENTRIES));
        self.write(Reg::RingCtrl, u64::from(RingCtrl::ENABLE.raw()));
        self.write(Reg::IntMask, 0);
        self.tail = 0;
    }

    /// Runs the engine until it has nothing to do; it then holds no job.
    fn wait_idle(&self) {
        self.gpu.run_engine();
        assert!(
            !Status::from_raw(self.read32(Reg::Status)).contains(Status::BUSY),
            "the engine went idle holding a job"
        );
    }

    /// Bytes the engine moved so far, all kinds together.
    fn bytes_moved(&self) -> u64 {
        let s = self.gpu.stats();
        [
            s.bytes_host_to_vram,
            s.bytes_vram_to_host,
            s.bytes_vram_to_vram,
            s.bytes_filled,
            s.bytes_checksummed,
        ]
        .iter()
        .fold(0, |sum, n| sum.saturating_add(*n))
    }

    /// Invariants that hold whenever the engine is idle.
    fn check(&self, jobs_before: u32) {
        let done = self.read32(Reg::JobsCompleted);
        let failed = self.read32(Reg::JobsFailed);
        assert!(
            done.wrapping_add(failed) >= jobs_before,
            "job counters went backwards"
        );
    }
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, v) in bytes.iter().skip(at).take(8).enumerate() {
        b[i] = *v;
    }
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    let Ok(vram) = Vram::new(MIN_VRAM_SIZE) else {
        return;
    };
    let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE as usize));
    let irq = RecordingInterrupts::new();
    let gpu = Gpu::with_engine_on_caller(vram, ram.clone() as Arc<dyn GuestMemory>, irq);
    gpu.set_bus_master(true);
    let mut guest = Guest { gpu, ram, tail: 0 };
    guest.enable_ring();
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        let jobs_before = guest
            .read32(Reg::JobsCompleted)
            .wrapping_add(guest.read32(Reg::JobsFailed));
        match op & 0x7 {
            // A ring entry at the tail, then the doorbell.
            0 => {
                let Some(bytes) = rest.get(..64) else { break };
                rest = &rest[64..];
                let mut raw = [0u8; 64];
                raw.copy_from_slice(bytes);
                let mut cmd = Command::decode(&raw);
                if op & 0x80 != 0 {
                    let steer = |v: u64, to_vram: bool| {
                        if to_vram {
                            v % VRAM_WINDOW
                        } else {
                            RAM + v % RAM_SIZE
                        }
                    };
                    cmd.src = steer(cmd.src, op & 0x40 != 0);
                    cmd.dst = steer(cmd.dst, op & 0x20 != 0);
                    cmd.len %= MAX_STEERED_LEN;
                    cmd.completion_addr = RAM + (cmd.completion_addr % RAM_SIZE & !15);
                } else if cmd.len > MAX_UNSTEERED_LEN {
                    cmd.len = shorten(cmd.len);
                }
                let at = RING + u64::from(guest.tail % ENTRIES) * COMMAND_SIZE;
                let _ = guest.ram.write(at, &cmd.encode());
                guest.tail = (guest.tail + 1) % ENTRIES;
                guest.write(Reg::Doorbell, u64::from(guest.tail));
                guest.wait_idle();
            }
            // A write of a named register with any value.
            1 => {
                let Some(bytes) = rest.get(..9) else { break };
                rest = &rest[9..];
                let reg = Reg::ALL[usize::from(bytes[0]) % Reg::ALL.len()];
                guest.write(reg, u64_at(bytes, 1));
                guest.wait_idle();
            }
            // Any BAR0 access: offset, size.
            2 => {
                let Some(bytes) = rest.get(..11) else { break };
                rest = &rest[11..];
                let offset = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) % 0x1000;
                let len = [1usize, 2, 4, 8][usize::from(bytes[2] & 3)];
                if bytes[2] & 4 == 0 {
                    guest.gpu.regs_write(offset, &bytes[3..3 + len]);
                } else {
                    let mut buf = [0u8; 8];
                    guest.gpu.regs_read(offset, &mut buf[..len]);
                }
                guest.wait_idle();
            }
            // Scribble guest RAM (the ring itself included).
            3 => {
                let Some(bytes) = rest.get(..18) else { break };
                rest = &rest[18..];
                let at = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) * 4 % (RAM_SIZE - 16);
                let _ = guest.ram.write(RAM + at, &bytes[2..]);
            }
            // Scribble VRAM (a ring placed there with RING_CTRL.IN_VRAM).
            4 => {
                let Some(bytes) = rest.get(..18) else { break };
                rest = &rest[18..];
                let at = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) * 16;
                let _ = guest.gpu.vram().write(at, &bytes[2..]);
            }
            // The guest toggles Bus Master Enable.
            5 => {
                guest.gpu.set_bus_master(op & 0x80 != 0);
                guest.wait_idle();
            }
            // A device reset, then the driver's setup again.
            6 => {
                // No DMA can stay in flight against FakeGuestMemory.
                let _ = guest.gpu.reset();
                guest.enable_ring();
                guest.wait_idle();
                continue;
            }
            _ => {
                guest.enable_ring();
                guest.wait_idle();
            }
        }
        guest.check(jobs_before);
        if guest.bytes_moved() > BYTE_BUDGET {
            break;
        }
    }
});
