//! The EFA's admin queue as a hostile driver drives it: submission entries
//! of any bytes (any opcode, flags, command ID and payload: REG_MR page
//! lists inline, direct or chained through guest RAM the input also
//! scribbles), register writes of any value, readless reads, resets and
//! Bus Master Enable toggled, in any order. The device's engines run on
//! the target's thread (`Efa::with_engines_on_caller`): after each step
//! `Efa::run_engines` runs the management engine's own step (and the
//! data-path engines', idle here) until none has work, instead of five
//! threads per input and a poll with sleeps for each completion (about
//! 40 inputs/s). What only threads show (a reset racing a command) is
//! left to the EFA's unit tests and the efa e2e suite.
//!
//! Catches a panic or overflow in the entry and command parsers, the page
//! list walk, the feature and statistics encoders or the register path
//! (overflow checks are on), a management engine that never goes idle
//! (`run_engines` not returning: libFuzzer's -timeout), and a command
//! left unanswered or answered twice while the queue is in a sane state
//! (the driver stops its admin queue for good then).
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_efa::regs::reg;
use p2plab_efa::{DeviceAttrs, Efa, EfaOptions, NoLink};
use p2plab_kit::Interrupts;

const RAM: u64 = 0x1_0000_0000;
const RAM_SIZE: u64 = 256 << 10;
const SQ: u64 = RAM;
const ACQ: u64 = RAM + 0x1000;
const AENQ: u64 = RAM + 0x2000;
const RESP: u64 = RAM + 0x3000;
/// Where scribbles land: control buffers, page lists, host info.
const SCRATCH: u64 = RAM + 0x4000;
const DEPTH: u32 = 32;

struct NoIrq;

impl Interrupts for NoIrq {
    fn notify(&self, _vector: u16) {}
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn u32(&mut self) -> Option<u32> {
        let mut v = [0u8; 4];
        for b in &mut v {
            *b = self.u8()?;
        }
        Some(u32::from_le_bytes(v))
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

const REGS: &[u64] = &[
    reg::AQ_BASE_LO,
    reg::AQ_CAPS,
    reg::ACQ_CAPS,
    reg::AQ_PROD_DB,
    reg::AENQ_CAPS,
    reg::AENQ_CONS_DB,
    reg::INTR_MASK,
    reg::DEV_CTL,
    reg::MMIO_REG_READ,
    reg::MMIO_RESP_LO,
    reg::EQ_DB,
    0xffc,
];

fn write(efa: &Efa, offset: u64, value: u32) {
    efa.regs_write(offset, &value.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE as usize));
    let attrs = DeviceAttrs {
        max_qp: 4,
        max_mr: 8,
        max_mr_pages: 1 << 12,
        ..DeviceAttrs::default()
    };
    let llq: Arc<dyn RegionMemory> = Arc::new(HeapRegion::new(attrs.llq_bar_size() as usize));
    let options = EfaOptions {
        keep_alive: Some(Duration::from_millis(1)),
    };
    let Ok(efa) = Efa::with_engines_on_caller(
        attrs,
        options,
        ram.clone(),
        llq,
        Arc::new(NoLink::default()),
        Arc::new(NoIrq),
    ) else {
        return;
    };
    efa.set_bus_master(true);
    write(&efa, reg::MMIO_RESP_LO, RESP as u32);
    write(&efa, reg::MMIO_RESP_HI, (RESP >> 32) as u32);
    write(&efa, reg::AQ_BASE_LO, SQ as u32);
    write(&efa, reg::AQ_BASE_HI, (SQ >> 32) as u32);
    write(&efa, reg::AQ_CAPS, DEPTH | 64 << 16);
    write(&efa, reg::ACQ_BASE_LO, ACQ as u32);
    write(&efa, reg::ACQ_BASE_HI, (ACQ >> 32) as u32);
    write(&efa, reg::ACQ_CAPS, DEPTH | 64 << 16);
    write(&efa, reg::AENQ_BASE_LO, AENQ as u32);
    write(&efa, reg::AENQ_BASE_HI, (AENQ >> 32) as u32);
    write(&efa, reg::AENQ_CAPS, 16 | 64 << 16);

    let mut input = Bytes(data);
    // While nothing disturbed the queues, every command must get exactly
    // one completion, with its command ID.
    let mut sane = true;
    let mut pc: u32 = 0;
    let mut steps = 0;
    while let Some(op) = input.u8() {
        steps += 1;
        if steps > 48 {
            break;
        }
        match op % 8 {
            // An admin command with any bytes.
            0..=3 => {
                let mut entry = [0u8; 64];
                let bytes = input.take(64);
                entry[..bytes.len()].copy_from_slice(bytes);
                let slot = pc % DEPTH;
                let phase = (pc / DEPTH).is_multiple_of(2);
                if op & 0x80 == 0 {
                    entry[3] = (entry[3] & !1) | u8::from(phase);
                }
                let command_id = u16::from_le_bytes([entry[0], entry[1]]) & 0xfff;
                let _ = ram.write(SQ + u64::from(slot) * 64, &entry);
                pc = pc.wrapping_add(1);
                write(&efa, reg::AQ_PROD_DB, pc);
                efa.run_engines();
                if sane {
                    let at = ACQ + u64::from(slot) * 64;
                    let mut completion = [0u8; 64];
                    let _ = ram.read(at, &mut completion);
                    assert!(
                        (completion[3] & 1 == 1) == phase,
                        "admin command left unanswered"
                    );
                    assert_eq!(
                        u16::from_le_bytes([completion[0], completion[1]]) & 0xfff,
                        command_id,
                        "completion for another command"
                    );
                }
            }
            // Scribble the scratch area (page lists, control buffers).
            4 => {
                let Some(at) = input.u32() else { break };
                let bytes = input.take(64);
                let _ = ram.write(SCRATCH + u64::from(at) % (RAM_SIZE - 0x4000 - 64), bytes);
            }
            // A register write with any value (a readless read among them).
            5 => {
                let Some(which) = input.u8() else { break };
                let Some(value) = input.u32() else { break };
                let offset = REGS[usize::from(which) % REGS.len()];
                if offset != reg::MMIO_REG_READ
                    && offset != reg::EQ_DB
                    && offset != reg::AENQ_CONS_DB
                {
                    sane = false;
                }
                write(&efa, offset, value);
                let mut back = [0u8; 4];
                efa.regs_read(u64::from(which) * 4, &mut back);
            }
            6 => {
                efa.set_bus_master(op & 0x10 != 0);
                sane &= op & 0x10 != 0;
            }
            _ => {
                let _ = efa.reset();
                sane = false;
            }
        }
        efa.run_engines();
    }
    drop(efa);
});
