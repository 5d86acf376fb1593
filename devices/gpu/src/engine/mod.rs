//! The copy/fill/checksum engine: a worker thread that fetches ring
//! entries, runs them through the opcode table and retires them.
//!
//! It is the only thread that sends MSI-X notifications, so an interrupt
//! is never raised from inside a register access (the PCI layer may hold
//! its own lock there).

mod handlers;
pub mod opcodes;

use std::sync::Arc;
use std::time::Instant;

use p2plab_dma::{DmaFault, DmaFaultKind, GuestMemory};
use p2plab_kit::{BoundMemory, Epoch};

use crate::command::{Command, CommandFlags, Completion, COMMAND_SIZE};
use crate::device::Device;
use crate::regs::{IntCauses, ENGINE_VECTOR};
use crate::stats::Stats;
use crate::status::StatusCode;

use opcodes::{CommandResult, OpcodeSpec, Operand};

/// What a command came to.
pub(crate) enum Outcome {
    /// It ran to the end, well or not.
    Done { status: StatusCode, result: u32 },
    /// A reset or ring disable overtook it; it must not retire.
    Abandoned,
}

impl Outcome {
    fn ok(result: u32) -> Self {
        Outcome::Done {
            status: StatusCode::Ok,
            result,
        }
    }

    fn failed(status: StatusCode) -> Self {
        Outcome::Done { status, result: 0 }
    }
}

/// Where the ring lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RingMemory {
    /// Guest memory, reached by DMA.
    Guest,
    /// Our own VRAM.
    Vram,
}

/// A ring entry the engine took, with the state it was taken in.
struct TakenEntry {
    generation: u64,
    addr: u64,
    ring: RingMemory,
    /// Bus Master Enable when it was taken.
    bus_master: bool,
    /// The DMA gate's epoch when it was taken: its DMA is refused once a
    /// reset has quiesced the gate since.
    epoch: Epoch,
}

/// Whether the completion record got written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecordWrite {
    /// The command did not ask for one (or had unknown flags).
    NotAsked,
    Written,
    Failed,
}

/// The status a command fails with when guest memory faults during its
/// data transfer. The device has one code for every kind today; a finer
/// split (a TIMEOUT or PEER code) would be a new status code in the ABI.
fn data_fault_status(fault: &DmaFault) -> StatusCode {
    match fault.kind {
        // Same code as when the engine itself sees Bus Master Enable clear.
        DmaFaultKind::BusMasterDisabled => StatusCode::NoBusMaster,
        _ => StatusCode::HostDma,
    }
}

/// The ring error a failed fetch from guest memory halts the engine with.
fn fetch_fault_status(fault: &DmaFault) -> StatusCode {
    match fault.kind {
        DmaFaultKind::BusMasterDisabled => StatusCode::NoBusMaster,
        _ => StatusCode::RingFetch,
    }
}

/// Bytes the engine moves per step. Between steps it checks for a reset or
/// a ring disable, so a long job can be abandoned promptly. 1 MiB is also
/// the largest DMA message QEMU's client accepts.
const STEP_BYTES: usize = 1 << 20;

/// What one [`Engine::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Sent an interrupt or ran a ring entry.
    Worked,
    /// Nothing to do now (only when not waiting).
    Idle,
    /// The device is shutting down.
    Stop,
}

/// The worker thread's side: fetch, execute, retire.
pub(crate) struct Engine {
    device: Arc<Device>,
    /// Bounce buffer for one step of a copy or checksum.
    step_buf: Vec<u8>,
    /// The last fill pattern repeated, as many bytes as a fill needed so
    /// far (at most one step): a fill reuses them when its pattern is the
    /// same, and writes only what it needs when not.
    pattern_buf: Vec<u8>,
    /// The pattern `pattern_buf` repeats.
    pattern: u32,
    /// Generation of the entry being processed.
    generation: u64,
    /// DMA gate epoch of the entry being processed.
    epoch: Epoch,
}

impl Engine {
    pub fn new(device: Arc<Device>) -> Self {
        Self {
            device: Arc::clone(&device),
            step_buf: vec![0; STEP_BYTES],
            pattern_buf: Vec::new(),
            pattern: 0,
            generation: 0,
            epoch: device.gate.epoch(),
        }
    }

    /// Serves the ring until the device shuts down (the engine thread).
    pub fn run(mut self) {
        while self.step(true) != Step::Stop {}
    }

    /// One round: sends a pending interrupt and runs the next ring
    /// entry, if any. With `wait` it waits until there is one of the two
    /// (the engine thread); without, it returns [`Step::Idle`] instead
    /// (the engine on the caller's thread, [`crate::Gpu::run_engine`]).
    pub fn step(&mut self, wait: bool) -> Step {
        let (notify, taken) = {
            let mut regs = self.device.lock();
            while !regs.shutdown && !regs.interrupt_pending && !regs.runnable() {
                if !wait {
                    return Step::Idle;
                }
                regs = self.device.wait(regs);
            }
            if regs.shutdown {
                return Step::Stop;
            }
            let notify = std::mem::take(&mut regs.interrupt_pending);
            let taken = if regs.runnable() {
                regs.engine_holds_job = true;
                Some(TakenEntry {
                    generation: self.device.generation(),
                    addr: regs.ring_base + u64::from(regs.head) * COMMAND_SIZE,
                    ring: if regs.ring_ctrl.in_vram() {
                        RingMemory::Vram
                    } else {
                        RingMemory::Guest
                    },
                    bus_master: regs.bus_master_enabled,
                    epoch: self.device.gate.epoch(),
                })
            } else {
                None
            };
            (notify, taken)
        };
        if notify {
            Stats::add(&self.device.stats.interrupts, 1);
            self.device
                .trace
                .record("irq", || serde_json::json!({"vector": ENGINE_VECTOR}));
            self.device.irq.notify(ENGINE_VECTOR);
        }
        if let Some(taken) = taken {
            self.process(taken);
        }
        Step::Worked
    }

    /// Guest memory for the current entry's DMA.
    pub(super) fn memory(&self) -> BoundMemory<'_> {
        self.device.gate.bound(self.epoch)
    }

    /// Whether a reset or ring disable overtook the current entry.
    fn abandoned(&self) -> bool {
        self.device.generation() != self.generation
    }

    fn process(&mut self, taken: TakenEntry) {
        let started = Instant::now();
        self.generation = taken.generation;
        self.epoch = taken.epoch;
        let raw = match self.fetch(&taken) {
            Ok(raw) => raw,
            Err(error) => {
                let mut regs = self.device.lock();
                regs.engine_holds_job = false;
                if !self.abandoned() {
                    regs.halt(error, &self.device.stats);
                }
                return;
            }
        };
        let cmd = Command::decode(&raw);
        let spec = opcodes::lookup(cmd.opcode);
        let decision = self
            .device
            .faults
            .when_armed(|faults| faults.decide(cmd.opcode))
            .unwrap_or_default();
        if decision.fired > 0 {
            self.device.trace.record("fault", || {
                serde_json::json!({
                    "name": opcodes::name_of(cmd.opcode),
                    "opcode": p2plab_trace::hex(cmd.opcode.into()),
                    "fence": cmd.fence,
                    "error": decision.error.map(StatusCode::code),
                    "hang": decision.hang,
                    "drop_interrupt": decision.drop_interrupt,
                    "fired": decision.fired,
                    "injected": true,
                })
            });
        }
        let injected = decision.fired > 0;
        let outcome = if decision.hang {
            self.hang(&cmd)
        } else if let Some(status) = decision.error {
            Stats::add(&self.device.stats.injected_job_errors, 1);
            tracing::warn!(
                op = opcodes::name_of(cmd.opcode),
                fence = cmd.fence,
                status = status.code(),
                "injected job error"
            );
            Outcome::failed(status)
        } else {
            self.execute(&cmd, spec, taken.bus_master)
        };
        let (status, result) = match outcome {
            Outcome::Done { status, result } => (status, result),
            Outcome::Abandoned => {
                let op = opcodes::name_of(cmd.opcode);
                tracing::info!(op, fence = cmd.fence, "job abandoned");
                self.device.trace.record_span("job", started, || {
                    self.job_event(&cmd, spec, "abandoned", injected)
                });
                self.device.lock().engine_holds_job = false;
                return;
            }
        };
        let record = self.write_record(&cmd, status, result, taken.bus_master);
        self.device.trace.record_span("job", started, || {
            self.job_event(&cmd, spec, status.name(), injected)
        });
        self.retire(&cmd, spec, status, result, record, decision.drop_interrupt);
    }

    /// A `job` event: the command by opcode name, its operands with where
    /// each lives, and how it ended.
    fn job_event(
        &self,
        cmd: &Command,
        spec: Option<&OpcodeSpec>,
        status: &str,
        injected: bool,
    ) -> serde_json::Value {
        let operand = |kind: Option<Operand>, value: u64| match kind {
            Some(Operand::VramOffset) => {
                serde_json::json!({"vram_offset": p2plab_trace::hex(value), "at": "own-vram"})
            }
            Some(Operand::BusAddress) => serde_json::json!({
                "addr": p2plab_trace::hex(value),
                "at": self.device.gate.locate(value, cmd.len).name(),
            }),
            _ => serde_json::Value::Null,
        };
        let mut event = serde_json::json!({
            "name": opcodes::name_of(cmd.opcode),
            "opcode": p2plab_trace::hex(cmd.opcode.into()),
            "fence": cmd.fence,
            "len": cmd.len,
            "src": operand(spec.map(|s| s.src), cmd.src),
            "dst": operand(spec.map(|s| s.dst), cmd.dst),
            "status": status,
        });
        if injected {
            event["injected"] = true.into();
        }
        event
    }

    /// An injected hang: holds the job (STATUS.BUSY stays set) until a
    /// ring disable or reset abandons it, as a wedged engine would.
    fn hang(&self, cmd: &Command) -> Outcome {
        Stats::add(&self.device.stats.injected_hangs, 1);
        tracing::warn!(
            op = opcodes::name_of(cmd.opcode),
            fence = cmd.fence,
            "injected hang: job held until the ring is disabled or the device reset"
        );
        let mut regs = self.device.lock();
        while !self.abandoned() && !regs.shutdown {
            regs = self.device.wait(regs);
        }
        Outcome::Abandoned
    }

    /// A read of VRAM that an injected error range covers: latches the
    /// address in the VRAM error registers.
    fn vram_read_error(&self, cmd: &Command, spec: &OpcodeSpec) -> Option<StatusCode> {
        if spec.src != Operand::VramOffset {
            return None;
        }
        let bad = self
            .device
            .faults
            .when_armed(|faults| faults.vram_error(cmd.src, cmd.len))??;
        Stats::add(&self.device.stats.vram_errors, 1);
        let mut regs = self.device.lock();
        regs.vram_err_count = regs.vram_err_count.wrapping_add(1);
        regs.vram_err_addr = bad;
        tracing::warn!(
            op = spec.name,
            fence = cmd.fence,
            vram_offset = bad,
            "injected VRAM error"
        );
        Some(StatusCode::VramIo)
    }

    fn fetch(&self, taken: &TakenEntry) -> Result<[u8; Command::SIZE], StatusCode> {
        let mut raw = [0u8; Command::SIZE];
        match (taken.ring, taken.bus_master) {
            (RingMemory::Vram, _) => self.device.vram.read(taken.addr, &mut raw).map_err(|e| {
                p2plab_ratelimit::log_limited!(warn, addr = taken.addr, error = %e, "ring fetch from VRAM failed");
                StatusCode::RingFetch
            })?,
            (RingMemory::Guest, false) => return Err(StatusCode::NoBusMaster),
            (RingMemory::Guest, true) => self
                .memory()
                .read(taken.addr, &mut raw)
                .map_err(|fault| {
                    p2plab_ratelimit::log_limited!(warn, error = %fault, "ring fetch from guest memory failed");
                    fetch_fault_status(&fault)
                })?,
        }
        Ok(raw)
    }

    /// Checks `cmd` against its table row and runs the row's handler.
    fn execute(
        &mut self,
        cmd: &Command,
        spec: Option<&'static OpcodeSpec>,
        bus_master: bool,
    ) -> Outcome {
        if cmd.reserved0 != 0 || cmd.reserved1 != [0, 0] || cmd.flags.has_unknown() {
            return Outcome::failed(StatusCode::BadCommand);
        }
        // A pattern where the opcode takes none is a malformed command,
        // checked before the opcode itself (an unknown opcode takes none).
        let pattern_ok =
            cmd.pattern == 0 || spec.is_some_and(|spec| spec.allows_pattern(cmd.pattern));
        if !pattern_ok {
            return Outcome::failed(StatusCode::BadCommand);
        }
        let Some(spec) = spec else {
            return Outcome::failed(StatusCode::BadOpcode);
        };
        if let Err(status) = spec.check_operands(cmd, &self.device.vram, bus_master) {
            return Outcome::failed(status);
        }
        if let Some(status) = self.vram_read_error(cmd, spec) {
            return Outcome::failed(status);
        }
        (spec.handler)(self, cmd)
    }

    fn write_record(
        &self,
        cmd: &Command,
        status: StatusCode,
        result: u32,
        bus_master: bool,
    ) -> RecordWrite {
        // A command with flags we do not understand must not make us write
        // guest memory.
        if !cmd.flags.contains(CommandFlags::COMPLETION) || cmd.flags.has_unknown() {
            return RecordWrite::NotAsked;
        }
        if !bus_master {
            return RecordWrite::Failed;
        }
        let record = Completion {
            fence: cmd.fence,
            status: status.code(),
            result,
        }
        .encode();
        match self.memory().write(cmd.completion_addr, &record) {
            Ok(()) => RecordWrite::Written,
            Err(fault) => {
                p2plab_ratelimit::log_limited!(warn, error = %fault, "completion record write failed");
                RecordWrite::Failed
            }
        }
    }

    fn retire(
        &self,
        cmd: &Command,
        spec: Option<&OpcodeSpec>,
        status: StatusCode,
        result: u32,
        record: RecordWrite,
        drop_interrupt: bool,
    ) {
        let stats = &self.device.stats;
        let mut regs = self.device.lock();
        regs.engine_holds_job = false;
        if self.abandoned() {
            return;
        }
        let op = opcodes::name_of(cmd.opcode);
        // The ring size was validated as a power of two when enabled.
        regs.head = (regs.head + 1) & regs.ring_size.wrapping_sub(1);
        regs.fence = cmd.fence;
        let mut causes = IntCauses::empty();
        if status == StatusCode::Ok {
            regs.jobs_completed = regs.jobs_completed.wrapping_add(1);
            Stats::add(&stats.jobs_completed, 1);
            if spec.is_some_and(|spec| spec.result == CommandResult::Checksum) {
                regs.checksum = result;
            }
            tracing::debug!(op, fence = cmd.fence, len = cmd.len, result, "job done");
        } else {
            regs.jobs_failed = regs.jobs_failed.wrapping_add(1);
            Stats::add(&stats.jobs_failed, 1);
            regs.engine_error = status;
            causes |= IntCauses::ERROR;
            p2plab_ratelimit::log_limited!(
                warn,
                op,
                opcode = cmd.opcode,
                fence = cmd.fence,
                src = cmd.src,
                dst = cmd.dst,
                len = cmd.len,
                status = status.code(),
                reason = status.meaning(),
                "job failed"
            );
        }
        if record == RecordWrite::Failed {
            regs.engine_error = StatusCode::CompletionWrite;
            causes |= IntCauses::ERROR;
        }
        if cmd.flags.contains(CommandFlags::IRQ) {
            causes |= IntCauses::FENCE;
        }
        if drop_interrupt {
            Stats::add(&stats.dropped_interrupts, 1);
            tracing::warn!(op, fence = cmd.fence, "injected lost interrupt");
            self.device.trace.record("irq-dropped", || {
                serde_json::json!({"vector": ENGINE_VECTOR, "fence": cmd.fence, "injected": true})
            });
            regs.latch_without_interrupt(causes);
        } else {
            regs.raise_interrupt(causes);
        }
    }
}
