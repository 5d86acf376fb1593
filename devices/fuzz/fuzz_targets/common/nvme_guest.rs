//! A hostile NVMe host over fake guest memory, shared by the NVMe targets:
//! the controller with its queues run either on the target's own thread
//! (`NvmeController::with_queues_on_caller`: no thread per input, the same
//! fetch, command tables, handlers and completion code) or by its real
//! worker threads.
//!
//! Input: a byte stream of operations (see [`drive`]).

// Each target uses its part of this module.
#![allow(dead_code)]

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_kit::Interrupts;
use p2plab_nvme::registers::{reg, Csts};
use p2plab_nvme::{
    Command, CommandBuilder, CompletionEntry, ControllerConfig, FileBackend, Namespace,
    NamespaceIds, NvmeController,
};

pub const RAM: u64 = 0x10_0000;
pub const RAM_SIZE: u64 = 256 << 10;
pub const ASQ: u64 = RAM;
pub const ACQ: u64 = RAM + 0x1000;
const IO_SQ: u64 = RAM + 0x2000;
const IO_CQ: u64 = RAM + 0x3000;
pub const ENTRIES: u32 = 16;
pub const CMB_BAR: u64 = 0x8000_0000;
/// The smallest CMB a controller takes (2 MiB granules).
pub const CMB_SIZE: u64 = 2 << 20;
/// How long a threaded command may take before the target moves on
/// (Asynchronous Event Requests never complete on their own).
const WAIT: Duration = Duration::from_millis(5);

/// Who runs the controller's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// The target's thread, after each submission or doorbell write.
    Caller,
    /// The controller's worker threads.
    Threads,
}

/// The interrupts the controller sends, counted, so that a host waiting
/// for a worker's completion sleeps until one comes. A host that spun
/// with `yield_now` gave its core away to every other runnable process
/// (a campaign beside it) at each look.
#[derive(Default)]
struct CountedInterrupts {
    sent: Mutex<u64>,
    rang: Condvar,
}

impl CountedInterrupts {
    fn sent(&self) -> u64 {
        *self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sleeps until an interrupt after the `seen`-th, or for `time`.
    fn wait_after(&self, seen: u64, time: Duration) {
        let sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .rang
            .wait_timeout_while(sent, time, |sent| *sent == seen)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

impl Interrupts for CountedInterrupts {
    fn notify(&self, _vector: u16) {
        *self.sent.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.rang.notify_all();
    }
}

/// Resets one input may do. Each starts and stops the controller's queue
/// workers (threads, with `Runner::Threads`), and a one-byte operation is
/// the cheapest thing for a mutator to repeat: in a grown `nvme_workers`
/// corpus a third of the inputs held from 9 to 236 resets, 98% of all,
/// and the target ran 38 worker threads per input on average. The first
/// few resets of an input reach every state a reset can meet.
const MAX_RESETS: u32 = 8;

/// How long a host waiting for a completion sleeps between looks at its
/// CQ when no interrupt comes (a CQ without interrupts, a held one).
const LOOK: Duration = Duration::from_micros(100);

struct Queue {
    sq: u64,
    cq: u64,
    tail: u32,
    head: u32,
    phase: bool,
}

pub struct Guest {
    pub ctrl: NvmeController,
    pub ram: Arc<FakeGuestMemory>,
    irq: Arc<CountedInterrupts>,
    runner: Runner,
    queues: [Queue; 2],
}

impl Guest {
    pub fn new(runner: Runner) -> Option<Self> {
        let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE as usize));
        let backend = Arc::new(FileBackend::memory("fuzz", 64 << 10).ok()?);
        let ns = Arc::new(Namespace::new(
            1,
            backend,
            512,
            NamespaceIds::derive("FUZZ", 1, [2, 0x50, 0x4c]),
        ));
        let cfg = ControllerConfig {
            serial: "FUZZ".into(),
            max_io_queues: 2,
            cmb_size: CMB_SIZE,
            ..ControllerConfig::default()
        };
        let cmb: Arc<dyn RegionMemory> = Arc::new(HeapRegion::new(CMB_SIZE as usize));
        let memory = ram.clone() as Arc<dyn GuestMemory>;
        let irq = Arc::new(CountedInterrupts::default());
        let controller_irq = Arc::clone(&irq) as Arc<dyn Interrupts>;
        // A configuration the target got wrong must not pass silently.
        let ctrl = match runner {
            Runner::Caller => NvmeController::with_queues_on_caller(
                cfg,
                vec![ns],
                memory,
                Some(cmb),
                controller_irq,
            ),
            Runner::Threads => {
                NvmeController::new(cfg, vec![ns], memory, Some(cmb), controller_irq)
            }
        }
        .expect("the fuzzed controller's configuration is valid");
        ctrl.set_cmb_bar_address(Some(CMB_BAR));
        let queue = |sq, cq| Queue {
            sq,
            cq,
            tail: 0,
            head: 0,
            phase: true,
        };
        Some(Self {
            ctrl,
            ram,
            irq,
            runner,
            queues: [queue(ASQ, ACQ), queue(IO_SQ, IO_CQ)],
        })
    }

    pub fn write32(&self, offset: u64, value: u32) {
        self.ctrl.regs_write(offset, &value.to_le_bytes());
    }

    pub fn csts(&self) -> u32 {
        let mut b = [0u8; 4];
        self.ctrl.regs_read(reg::CSTS, &mut b);
        u32::from_le_bytes(b)
    }

    /// What the controller's worker threads would have done by now.
    pub fn settle(&self) {
        self.ctrl.run_queues();
    }

    /// Linux's enable sequence, then one I/O queue pair.
    pub fn enable(&mut self) {
        self.write32(reg::CC, 0);
        self.write32(reg::AQA, ((ENTRIES - 1) << 16) | (ENTRIES - 1));
        self.write32(reg::ASQ, ASQ as u32);
        self.write32(reg::ASQ + 4, 0);
        self.write32(reg::ACQ, ACQ as u32);
        self.write32(reg::ACQ + 4, 0);
        self.write32(reg::CC, (6 << 16) | (4 << 20) | 1);
        let qsize = (ENTRIES - 1) << 16;
        let cq = CommandBuilder::new(0x05, 0)
            .prp1(IO_CQ)
            .cdw(10, qsize | 1)
            .cdw(11, (1 << 16) | 3)
            .build();
        self.run(0, cq);
        let sq = CommandBuilder::new(0x01, 0)
            .prp1(IO_SQ)
            .cdw(10, qsize | 1)
            .cdw(11, (1 << 16) | 1)
            .build();
        self.run(0, sq);
    }

    /// Submits on queue `q` and takes its completion, if it comes (at
    /// once on the caller's thread, within [`WAIT`] from a worker).
    pub fn run(&mut self, q: usize, cmd: Command) -> Option<CompletionEntry> {
        let queue = &mut self.queues[q];
        let slot = queue.sq + u64::from(queue.tail) * 64;
        self.ram.write(slot, cmd.as_bytes()).ok()?;
        queue.tail = (queue.tail + 1) % ENTRIES;
        let sq_doorbell = 0x1000 + 8 * q as u64;
        self.ctrl.regs_write(sq_doorbell, &queue.tail.to_le_bytes());
        self.settle();
        let deadline = Instant::now() + WAIT;
        loop {
            // Counted before the look: an interrupt after it ends the sleep.
            let seen = self.irq.sent();
            let queue = &mut self.queues[q];
            let mut e = [0u8; 16];
            self.ram
                .read(queue.cq + u64::from(queue.head) * 16, &mut e)
                .ok()?;
            let entry = CompletionEntry::decode(&e);
            if entry.phase == queue.phase {
                queue.head = (queue.head + 1) % ENTRIES;
                if queue.head == 0 {
                    queue.phase = !queue.phase;
                }
                let head = queue.head;
                self.ctrl.regs_write(sq_doorbell + 4, &head.to_le_bytes());
                return Some(entry);
            }
            let csts = self.csts();
            if self.runner == Runner::Caller
                || csts & Csts::CFS.raw() != 0
                || csts & Csts::RDY.raw() == 0
                || Instant::now() >= deadline
            {
                return None;
            }
            self.irq.wait_after(seen, LOOK);
        }
    }

    /// Linux's recovery after CFS: reset and enable again.
    pub fn reenable(&mut self) {
        self.queues.iter_mut().for_each(|q| {
            q.tail = 0;
            q.head = 0;
            q.phase = true;
        });
        let _ = self.ram.write(ACQ, &[0u8; 16 * ENTRIES as usize]);
        let _ = self.ram.write(IO_CQ, &[0u8; 16 * ENTRIES as usize]);
        self.enable();
    }

    /// A function reset (DEVICE_RESET or disconnect): every worker has
    /// stopped when it returns.
    pub fn function_reset(&self) {
        self.ctrl.reset();
        assert_eq!(
            self.csts() & Csts::RDY.raw(),
            0,
            "a worker outlived the reset"
        );
        self.ctrl.set_cmb_bar_address(Some(CMB_BAR));
    }

    /// The end of an input: no internal error, and a reset stops every
    /// worker.
    pub fn finish(&self) {
        assert_eq!(
            self.ctrl.stats().counters.internal_errors,
            0,
            "an internal error reached the worker boundary"
        );
        self.ctrl.reset();
        assert_eq!(
            self.csts() & Csts::RDY.raw(),
            0,
            "a worker outlived the reset"
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

/// Points PRP1/PRP2 (or the SGL address) into guest RAM or the CMB.
pub fn steer(raw: &mut [u8; 64], into_cmb: bool) {
    let (base, size) = if into_cmb {
        (CMB_BAR, CMB_SIZE)
    } else {
        (RAM, RAM_SIZE)
    };
    for at in [24usize, 32] {
        let v = base + (u64_at(raw, at) % size & !3);
        raw[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Runs the operations in `data`, one byte of opcode each plus its
/// operands, after Linux's enable sequence:
///
/// - 0, 1: an admin or I/O command (64 bytes; opcode bit 7 steers its
///   data pointers, into the CMB with bit 6);
/// - 2: 16 bytes of guest RAM scribbled (2 bytes of offset first);
/// - 3: a register or doorbell write (2 bytes of offset, a dword, or a
///   qword with bit 3);
/// - 4: a register read (2 bytes of offset);
/// - 5: reset and enable again (Linux's recovery after CFS);
/// - 6: a trapped CMB write (2 bytes of offset, a dword);
/// - 7: a function reset.
///
/// Resets (5 and 7) past the [`MAX_RESETS`]th of an input do nothing.
pub fn drive(guest: &mut Guest, data: &[u8]) {
    guest.enable();
    let mut rest = data;
    let mut resets = 0;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        if matches!(op & 0x7, 5 | 7) {
            resets += 1;
            if resets > MAX_RESETS {
                continue;
            }
        }
        match op & 0x7 {
            0 | 1 => {
                let Some(bytes) = rest.get(..64) else { break };
                rest = &rest[64..];
                let mut raw = [0u8; 64];
                raw.copy_from_slice(bytes);
                if op & 0x80 != 0 {
                    steer(&mut raw, op & 0x40 != 0);
                }
                guest.run(usize::from(op & 1), Command::from_bytes(raw));
            }
            // A PRP list, an SGL segment, a queue entry the host did not
            // mean to write.
            2 => {
                let Some(bytes) = rest.get(..18) else { break };
                rest = &rest[18..];
                let at = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) * 4 % RAM_SIZE;
                let _ = guest.ram.write(RAM + at.min(RAM_SIZE - 16), &bytes[2..]);
            }
            3 => {
                let Some(bytes) = rest.get(..10) else { break };
                rest = &rest[10..];
                let offset = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) % 0x1100;
                let len = if op & 0x8 != 0 { 8 } else { 4 };
                guest.ctrl.regs_write(offset, &bytes[2..2 + len]);
                guest.settle();
            }
            4 => {
                let Some(bytes) = rest.get(..2) else { break };
                rest = &rest[2..];
                let offset = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) % 0x1100;
                let mut b = [0u8; 8];
                guest.ctrl.regs_read(offset, &mut b[..4]);
            }
            5 => guest.reenable(),
            6 => {
                let Some(bytes) = rest.get(..6) else { break };
                rest = &rest[6..];
                let offset = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) << 4;
                let _ = guest.ctrl.write_cmb(offset, &bytes[2..6]);
            }
            _ => guest.function_reset(),
        }
    }
    guest.finish();
}
