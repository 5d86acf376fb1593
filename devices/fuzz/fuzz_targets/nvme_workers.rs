//! The NVMe controller as a hostile guest drives it, with no socket: BAR0
//! register and doorbell writes, guest memory scribbled anywhere, admin
//! and I/O commands with any dwords (data pointers optionally steered into
//! guest RAM so they reach the handlers' data paths), in any order. The
//! controller runs with its real queue workers.
//!
//! Catches a panic anywhere in the model (libFuzzer aborts on a panic in
//! any thread, workers included), an internal error counted at the worker
//! boundary, a hang (libFuzzer's -timeout), and a function reset that
//! leaves a worker running.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_kit::Interrupts;
use p2plab_nvme::registers::{reg, Csts};
use p2plab_nvme::{
    Command, CommandBuilder, CompletionEntry, ControllerConfig, FileBackend, Namespace,
    NamespaceIds, NvmeController,
};

const RAM: u64 = 0x10_0000;
const RAM_SIZE: u64 = 256 << 10;
const ASQ: u64 = RAM;
const ACQ: u64 = RAM + 0x1000;
const IO_SQ: u64 = RAM + 0x2000;
const IO_CQ: u64 = RAM + 0x3000;
const ENTRIES: u32 = 16;
const CMB_BAR: u64 = 0x8000_0000;
/// The smallest CMB a controller takes (2 MiB granules).
const CMB_SIZE: u64 = 2 << 20;
/// How long a command may take before the target moves on (Asynchronous
/// Event Requests never complete on their own).
const WAIT: Duration = Duration::from_millis(5);

struct NoInterrupts;

impl Interrupts for NoInterrupts {
    fn notify(&self, _vector: u16) {}
}

struct Queue {
    sq: u64,
    cq: u64,
    tail: u32,
    head: u32,
    phase: bool,
}

struct Guest {
    ctrl: NvmeController,
    ram: Arc<FakeGuestMemory>,
    queues: [Queue; 2],
}

impl Guest {
    fn new() -> Option<Self> {
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
        // A configuration the target got wrong must not pass silently.
        let ctrl = NvmeController::new(
            cfg,
            vec![ns],
            ram.clone() as Arc<dyn GuestMemory>,
            Some(cmb),
            Arc::new(NoInterrupts),
        )
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
            queues: [queue(ASQ, ACQ), queue(IO_SQ, IO_CQ)],
        })
    }

    fn write32(&self, offset: u64, value: u32) {
        self.ctrl.regs_write(offset, &value.to_le_bytes());
    }

    fn csts(&self) -> u32 {
        let mut b = [0u8; 4];
        self.ctrl.regs_read(reg::CSTS, &mut b);
        u32::from_le_bytes(b)
    }

    /// Linux's enable sequence, then one I/O queue pair.
    fn enable(&mut self) {
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

    /// Submits on queue `q` and waits (bounded) for its completion.
    fn run(&mut self, q: usize, cmd: Command) {
        let queue = &mut self.queues[q];
        let slot = queue.sq + u64::from(queue.tail) * 64;
        if self.ram.write(slot, cmd.as_bytes()).is_err() {
            return;
        }
        queue.tail = (queue.tail + 1) % ENTRIES;
        let sq_doorbell = 0x1000 + 8 * q as u64;
        self.ctrl.regs_write(sq_doorbell, &queue.tail.to_le_bytes());
        let deadline = Instant::now() + WAIT;
        loop {
            let queue = &mut self.queues[q];
            let mut e = [0u8; 16];
            if self
                .ram
                .read(queue.cq + u64::from(queue.head) * 16, &mut e)
                .is_err()
            {
                return;
            }
            if CompletionEntry::decode(&e).phase == queue.phase {
                queue.head = (queue.head + 1) % ENTRIES;
                if queue.head == 0 {
                    queue.phase = !queue.phase;
                }
                let head = queue.head;
                self.ctrl.regs_write(sq_doorbell + 4, &head.to_le_bytes());
                return;
            }
            let csts = self.csts();
            if csts & Csts::CFS.raw() != 0
                || csts & Csts::RDY.raw() == 0
                || Instant::now() >= deadline
            {
                return;
            }
            std::thread::yield_now();
        }
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
fn steer(raw: &mut [u8; 64], into_cmb: bool) {
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

fuzz_target!(|data: &[u8]| {
    let Some(mut guest) = Guest::new() else {
        return;
    };
    guest.enable();
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        match op & 0x7 {
            // An admin (0) or I/O (1) command.
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
            // Scribble 16 bytes of guest RAM (a PRP list, an SGL segment,
            // a queue entry the host did not mean to write).
            2 => {
                let Some(bytes) = rest.get(..18) else { break };
                rest = &rest[18..];
                let at = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) * 4 % RAM_SIZE;
                let _ = guest.ram.write(RAM + at.min(RAM_SIZE - 16), &bytes[2..]);
            }
            // A register or doorbell write (dword or qword, any offset).
            3 => {
                let Some(bytes) = rest.get(..10) else { break };
                rest = &rest[10..];
                let offset = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) % 0x1100;
                let len = if op & 0x8 != 0 { 8 } else { 4 };
                guest.ctrl.regs_write(offset, &bytes[2..2 + len]);
            }
            // A register read.
            4 => {
                let Some(bytes) = rest.get(..2) else { break };
                rest = &rest[2..];
                let offset = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) % 0x1100;
                let mut b = [0u8; 8];
                guest.ctrl.regs_read(offset, &mut b[..4]);
            }
            // Linux's recovery after CFS: reset and enable again.
            5 => {
                guest.queues.iter_mut().for_each(|q| {
                    q.tail = 0;
                    q.head = 0;
                    q.phase = true;
                });
                let _ = guest.ram.write(ACQ, &[0u8; 16 * ENTRIES as usize]);
                let _ = guest.ram.write(IO_CQ, &[0u8; 16 * ENTRIES as usize]);
                guest.enable();
            }
            // A trapped CMB access.
            6 => {
                let Some(bytes) = rest.get(..6) else { break };
                rest = &rest[6..];
                let offset = u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) << 4;
                let _ = guest.ctrl.write_cmb(offset, &bytes[2..6]);
            }
            // A function reset (DEVICE_RESET or disconnect): every worker
            // has stopped when it returns.
            _ => {
                guest.ctrl.reset();
                assert_eq!(
                    guest.csts() & Csts::RDY.raw(),
                    0,
                    "a worker outlived the reset"
                );
                guest.ctrl.set_cmb_bar_address(Some(CMB_BAR));
            }
        }
    }
    assert_eq!(
        guest.ctrl.stats().counters.internal_errors,
        0,
        "an internal error reached the worker boundary"
    );
    guest.ctrl.reset();
    assert_eq!(
        guest.csts() & Csts::RDY.raw(),
        0,
        "a worker outlived the reset"
    );
});
