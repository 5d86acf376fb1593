//! One handler per row of the opcode table. Each runs a command whose
//! operands were already checked against its row, in steps of
//! [`STEP_BYTES`], and gives up between steps once the command is
//! abandoned.

use p2plab_dma::{BusTarget, GuestMemory};

use crate::command::Command;
use crate::stats::Stats;
use crate::status::StatusCode;

use super::{data_fault_status, Engine, Outcome, STEP_BYTES};

/// Splits `len` bytes into steps: (offset, size) pairs.
fn steps(len: u64) -> impl DoubleEndedIterator<Item = (u64, usize)> {
    let step = STEP_BYTES as u64;
    (0..len.div_ceil(step)).map(move |i| {
        let off = i * step;
        (off, (len - off).min(step) as usize)
    })
}

/// Whether a step's bus range is (or may be, in part) guest RAM: a step
/// that mixes RAM with a peer BAR counts as RAM, so the RAM counters never
/// miss a bounce.
fn in_ram(target: BusTarget) -> bool {
    matches!(target, BusTarget::Ram | BusTarget::Mixed)
}

impl Engine {
    pub(super) fn nop(&mut self, _cmd: &Command) -> Outcome {
        Outcome::ok(0)
    }

    pub(super) fn copy_to_vram(&mut self, cmd: &Command) -> Outcome {
        for (off, n) in steps(cmd.len) {
            if self.abandoned() {
                return Outcome::Abandoned;
            }
            let buf = &mut self.step_buf[..n];
            let memory = self.device.gate.bound(self.epoch);
            if let Err(fault) = memory.read(cmd.src + off, buf) {
                p2plab_ratelimit::log_limited!(warn, error = %fault, "COPY_TO_VRAM: guest read failed");
                return Outcome::failed(data_fault_status(&fault));
            }
            if let Err(e) = self.device.vram.write(cmd.dst + off, buf) {
                p2plab_ratelimit::log_limited!(warn, error = %e, "COPY_TO_VRAM: VRAM write failed");
                return Outcome::failed(StatusCode::VramIo);
            }
            Stats::add(&self.device.stats.bytes_host_to_vram, n as u64);
            if in_ram(memory.locate(cmd.src + off, n as u64)) {
                Stats::add(&self.device.stats.bytes_ram_to_vram, n as u64);
            }
        }
        Outcome::ok(0)
    }

    pub(super) fn copy_from_vram(&mut self, cmd: &Command) -> Outcome {
        for (off, n) in steps(cmd.len) {
            if self.abandoned() {
                return Outcome::Abandoned;
            }
            let buf = &mut self.step_buf[..n];
            if let Err(e) = self.device.vram.read(cmd.src + off, buf) {
                p2plab_ratelimit::log_limited!(warn, error = %e, "COPY_FROM_VRAM: VRAM read failed");
                return Outcome::failed(StatusCode::VramIo);
            }
            let memory = self.device.gate.bound(self.epoch);
            if let Err(fault) = memory.write(cmd.dst + off, buf) {
                p2plab_ratelimit::log_limited!(warn, error = %fault, "COPY_FROM_VRAM: guest write failed");
                return Outcome::failed(data_fault_status(&fault));
            }
            Stats::add(&self.device.stats.bytes_vram_to_host, n as u64);
            if in_ram(memory.locate(cmd.dst + off, n as u64)) {
                Stats::add(&self.device.stats.bytes_vram_to_ram, n as u64);
            }
        }
        Outcome::ok(0)
    }

    pub(super) fn copy_vram(&mut self, cmd: &Command) -> Outcome {
        // memmove: when the destination overlaps the tail of the source,
        // copy back to front so no byte is overwritten before it is read.
        let backwards = cmd.dst > cmd.src && cmd.dst < cmd.src + cmd.len;
        let order: Vec<(u64, usize)> = if backwards {
            steps(cmd.len).rev().collect()
        } else {
            steps(cmd.len).collect()
        };
        for (off, n) in order {
            if self.abandoned() {
                return Outcome::Abandoned;
            }
            let buf = &mut self.step_buf[..n];
            let vram = &self.device.vram;
            if let Err(e) = vram
                .read(cmd.src + off, buf)
                .and_then(|()| vram.write(cmd.dst + off, buf))
            {
                p2plab_ratelimit::log_limited!(warn, error = %e, "COPY_VRAM failed");
                return Outcome::failed(StatusCode::VramIo);
            }
            Stats::add(&self.device.stats.bytes_vram_to_vram, n as u64);
        }
        Outcome::ok(0)
    }

    pub(super) fn fill(&mut self, cmd: &Command) -> Outcome {
        if cmd.pattern == 0 {
            // Zero fill gives the pages back instead of writing zeros.
            if let Err(e) = self.device.vram.zero(cmd.dst, cmd.len) {
                p2plab_ratelimit::log_limited!(warn, error = %e, "FILL: hole punch failed");
                return Outcome::failed(StatusCode::VramIo);
            }
            Stats::add(&self.device.stats.bytes_filled, cmd.len);
            return Outcome::ok(0);
        }
        // STEP_BYTES is a multiple of 4, so every step starts at pattern
        // byte 0. A whole step of pattern is 1 MiB: build only as much as
        // this fill writes per step, and only when the pattern changed.
        let needed = usize::try_from(cmd.len)
            .unwrap_or(STEP_BYTES)
            .min(STEP_BYTES)
            .next_multiple_of(4);
        if self.pattern != cmd.pattern {
            self.pattern = cmd.pattern;
            self.pattern_buf.clear();
        }
        if self.pattern_buf.len() < needed {
            let pattern = cmd.pattern.to_le_bytes();
            let have = self.pattern_buf.len() / 4;
            self.pattern_buf
                .extend(std::iter::repeat_n(pattern, needed / 4 - have).flatten());
        }
        for (off, n) in steps(cmd.len) {
            if self.abandoned() {
                return Outcome::Abandoned;
            }
            if let Err(e) = self
                .device
                .vram
                .write(cmd.dst + off, &self.pattern_buf[..n])
            {
                p2plab_ratelimit::log_limited!(warn, error = %e, "FILL: VRAM write failed");
                return Outcome::failed(StatusCode::VramIo);
            }
            Stats::add(&self.device.stats.bytes_filled, n as u64);
        }
        Outcome::ok(0)
    }

    pub(super) fn checksum(&mut self, cmd: &Command) -> Outcome {
        // CRC-32C (Castagnoli), as the guest tool and ext4/iSCSI compute
        // it; appended step by step.
        let mut crc = 0u32;
        for (off, n) in steps(cmd.len) {
            if self.abandoned() {
                return Outcome::Abandoned;
            }
            let buf = &mut self.step_buf[..n];
            if let Err(e) = self.device.vram.read(cmd.src + off, buf) {
                p2plab_ratelimit::log_limited!(warn, error = %e, "CHECKSUM: VRAM read failed");
                return Outcome::failed(StatusCode::VramIo);
            }
            crc = crc32c::crc32c_append(crc, buf);
            Stats::add(&self.device.stats.bytes_checksummed, n as u64);
        }
        Outcome::ok(crc)
    }
}
