//! The device model: BAR0 registers and the copy/checksum engine.
//!
//! Register accesses arrive on the transport's socket thread and only
//! touch state under a short lock; they never wait for the engine or for
//! guest memory. The engine runs on its own worker thread, which is also
//! the only thread that sends MSI-X notifications, so an interrupt is never
//! raised from inside a register access (the PCI layer may hold its own
//! lock there).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::command::{Command, Completion};
use crate::crc32c::Crc32c;
use crate::regs::*;
use crate::stats::{Stats, StatsSnapshot};
use crate::vram::Vram;

/// Bytes the engine moves per step. Between steps it checks for a reset or
/// a ring disable, so a long job can be abandoned promptly. 1 MiB is also
/// the largest DMA message QEMU's client accepts.
const CHUNK: usize = 1 << 20;

/// A guest-memory access the engine could not complete.
#[derive(Debug, thiserror::Error)]
#[error("guest memory {gpa:#x}+{len:#x}: {reason}")]
pub struct DmaError {
    pub gpa: u64,
    pub len: u64,
    pub reason: String,
}

/// How the engine reaches guest-physical memory (guest RAM and peer BARs).
/// The server binary implements it with the vfio-user DMA address space;
/// tests use a plain buffer.
pub trait GuestMemory: Send + Sync + 'static {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), DmaError>;
}

/// How the engine signals an MSI-X vector. Called from the engine thread
/// only, never while the model's lock is held.
pub trait InterruptSink: Send + Sync + 'static {
    fn notify(&self, vector: u16);
}

/// Register file and engine bookkeeping, guarded by one mutex.
#[derive(Debug)]
struct State {
    scratch: u32,
    ring_base: u64,
    ring_size: u32,
    ring_ctrl: u32,
    head: u32,
    tail: u32,
    fence: u64,
    checksum: u32,
    int_status: u32,
    int_mask: u32,
    engine_error: u32,
    halted: bool,
    jobs_completed: u32,
    jobs_failed: u32,
    bus_master: bool,
    /// The worker holds a fetched command it has not retired yet.
    worker_active: bool,
    /// An unmasked cause was raised; the worker sends the MSI-X.
    pending_notify: bool,
    shutdown: bool,
}

impl State {
    fn new() -> Self {
        Self {
            scratch: 0,
            ring_base: 0,
            ring_size: 0,
            ring_ctrl: 0,
            head: 0,
            tail: 0,
            fence: 0,
            checksum: 0,
            int_status: 0,
            int_mask: INT_ALL,
            engine_error: 0,
            halted: false,
            jobs_completed: 0,
            jobs_failed: 0,
            bus_master: false,
            worker_active: false,
            pending_notify: false,
            shutdown: false,
        }
    }

    fn enabled(&self) -> bool {
        self.ring_ctrl & RING_CTRL_ENABLE != 0
    }

    fn runnable(&self) -> bool {
        self.enabled() && !self.halted && self.head != self.tail
    }

    fn status(&self) -> u32 {
        let mut status = STATUS_READY;
        if self.enabled() {
            status |= STATUS_RING_ENABLED;
        }
        if self.worker_active || self.runnable() {
            status |= STATUS_BUSY;
        }
        if self.halted {
            status |= STATUS_HALTED;
        }
        if self.bus_master {
            status |= STATUS_BUS_MASTER;
        }
        status
    }

    fn raise(&mut self, causes: u32) {
        self.int_status |= causes;
        if causes & !self.int_mask != 0 {
            self.pending_notify = true;
        }
    }

    fn halt(&mut self, code: u32, stats: &Stats) {
        tracing::warn!(code, reason = status_name(code), "engine halted");
        self.halted = true;
        self.engine_error = code;
        Stats::add(&stats.ring_errors, 1);
        self.raise(INT_ERROR);
    }

    /// Checks the ring registers when the driver enables the ring.
    fn validate_ring(&self, vram_size: u64) -> Result<(), u32> {
        if !self.ring_base.is_multiple_of(COMMAND_SIZE) {
            return Err(ERR_RING_MISALIGNED);
        }
        let size = self.ring_size;
        if !size.is_power_of_two() || !(MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&size) {
            return Err(ERR_RING_BAD_SIZE);
        }
        let end = self
            .ring_base
            .checked_add(u64::from(size) * COMMAND_SIZE)
            .ok_or(ERR_RING_RANGE)?;
        if self.ring_ctrl & RING_CTRL_IN_VRAM != 0 && end > vram_size {
            return Err(ERR_RING_RANGE);
        }
        Ok(())
    }

    fn read_reg(&self, offset: u64, vram_size: u64) -> u32 {
        match offset {
            REG_ID => ID_MAGIC,
            REG_VERSION => VERSION,
            REG_VRAM_SIZE_LO => vram_size as u32,
            REG_VRAM_SIZE_HI => (vram_size >> 32) as u32,
            REG_STATUS => self.status(),
            REG_ENGINE_ERROR => self.engine_error,
            REG_SCRATCH => self.scratch,
            REG_RING_BASE_LO => self.ring_base as u32,
            REG_RING_BASE_HI => (self.ring_base >> 32) as u32,
            REG_RING_SIZE => self.ring_size,
            REG_RING_CTRL => self.ring_ctrl,
            REG_RING_HEAD => self.head,
            REG_RING_TAIL => self.tail,
            REG_FENCE_LO => self.fence as u32,
            REG_FENCE_HI => (self.fence >> 32) as u32,
            REG_CHECKSUM => self.checksum,
            REG_INT_STATUS => self.int_status,
            REG_INT_MASK => self.int_mask,
            REG_JOBS_COMPLETED => self.jobs_completed,
            REG_JOBS_FAILED => self.jobs_failed,
            _ => 0,
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the worker: new work, a pending interrupt, or shutdown.
    wake: Condvar,
    /// Bumped by reset and by disabling the ring; the worker drops a
    /// command whose generation is stale instead of retiring it.
    generation: AtomicU64,
    vram: Arc<Vram>,
    stats: Stats,
    memory: Arc<dyn GuestMemory>,
    irq: Arc<dyn InterruptSink>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked mid-update;
        // the register file is still plain data, so keep serving it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads the device's counters from any thread.
#[derive(Clone)]
pub struct StatsReader(Arc<Shared>);

impl std::fmt::Debug for StatsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsReader").finish_non_exhaustive()
    }
}

impl StatsReader {
    pub fn snapshot(&self) -> StatsSnapshot {
        let vram = &self.0.vram;
        let allocated = vram.allocated_bytes().unwrap_or(0);
        self.0.stats.snapshot(vram.size(), allocated)
    }
}

/// The GPU-like device: BAR0 registers, BAR2 VRAM and the engine thread.
pub struct Gpu {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("vram_size", &self.shared.vram.size())
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Builds the device around `vram` and starts its engine thread.
    pub fn new(
        vram: Vram,
        memory: Arc<dyn GuestMemory>,
        irq: Arc<dyn InterruptSink>,
    ) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new()),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            vram: Arc::new(vram),
            stats: Stats::default(),
            memory,
            irq,
        });
        let worker_shared = Arc::clone(&shared);
        // The engine logs inside the device's span (socket, ids).
        let span = tracing::Span::current();
        let worker = std::thread::Builder::new()
            .name("gpu-engine".into())
            .spawn(move || {
                let _span = span.enter();
                Engine::new(worker_shared).run()
            })?;
        Ok(Self {
            shared,
            worker: Some(worker),
        })
    }

    pub fn vram(&self) -> &Vram {
        &self.shared.vram
    }

    /// A shared handle to VRAM (e.g. to serve it as a DMA local window).
    pub fn vram_handle(&self) -> Arc<Vram> {
        Arc::clone(&self.shared.vram)
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats_reader().snapshot()
    }

    /// A handle another thread can use to read the counters while the
    /// transport owns the device.
    pub fn stats_reader(&self) -> StatsReader {
        StatsReader(Arc::clone(&self.shared))
    }

    /// A trapped BAR0 read of any size; reads have no side effects, so a
    /// read of odd size or alignment is assembled from the dwords it covers.
    pub fn regs_read(&self, offset: u64, data: &mut [u8]) {
        let vram_size = self.shared.vram.size();
        let st = self.shared.lock();
        for (i, byte) in data.iter_mut().enumerate() {
            let at = offset.saturating_add(i as u64);
            *byte = if at < REGS_BAR_SIZE {
                let dword = st.read_reg(at & !3, vram_size);
                (dword >> ((at & 3) * 8)) as u8
            } else {
                0xff
            };
        }
    }

    /// A trapped BAR0 write. 4-byte aligned dword writes and 8-byte aligned
    /// qword writes (low dword first) are supported; anything else is
    /// ignored and counted, as a real device would drop it.
    pub fn regs_write(&self, offset: u64, data: &[u8]) {
        let dwords: Vec<(u64, u32)> = match data.len() {
            4 if offset.is_multiple_of(4) => vec![(offset, u32_le(data, 0))],
            8 if offset.is_multiple_of(8) => {
                vec![(offset, u32_le(data, 0)), (offset + 4, u32_le(data, 4))]
            }
            _ => {
                // Guest-triggered, so debug: a guest must not flood the log.
                tracing::debug!(
                    offset,
                    len = data.len(),
                    "unsupported register write ignored"
                );
                Stats::add(&self.shared.stats.bad_register_accesses, 1);
                return;
            }
        };
        let mut st = self.shared.lock();
        for (at, value) in dwords {
            self.write_reg(&mut st, at, value);
        }
        if st.pending_notify || st.runnable() {
            self.shared.wake.notify_all();
        }
    }

    fn write_reg(&self, st: &mut State, offset: u64, value: u32) {
        let shared = &self.shared;
        tracing::debug!(reg = reg_name(offset), offset, value, "register write");
        match offset {
            REG_SCRATCH => st.scratch = value,
            REG_RING_BASE_LO | REG_RING_BASE_HI | REG_RING_SIZE if st.enabled() => {
                tracing::debug!(
                    reg = reg_name(offset),
                    "ring geometry write ignored while enabled"
                );
            }
            REG_RING_BASE_LO => st.ring_base = (st.ring_base & !0xffff_ffff) | u64::from(value),
            REG_RING_BASE_HI => {
                st.ring_base = (st.ring_base & 0xffff_ffff) | (u64::from(value) << 32)
            }
            REG_RING_SIZE => st.ring_size = value,
            REG_RING_CTRL => self.write_ring_ctrl(st, value & RING_CTRL_WRITABLE),
            REG_RING_TAIL => self.write_tail(st, value),
            REG_DOORBELL => {
                Stats::add(&shared.stats.doorbells, 1);
                self.write_tail(st, value);
            }
            REG_INT_STATUS => st.int_status &= !value,
            REG_INT_MASK => {
                let newly_unmasked = st.int_mask & !value;
                st.int_mask = value & INT_ALL;
                if st.int_status & newly_unmasked != 0 {
                    st.pending_notify = true;
                }
            }
            _ => tracing::debug!(
                offset,
                value,
                "write to read-only or reserved register ignored"
            ),
        }
    }

    fn write_ring_ctrl(&self, st: &mut State, value: u32) {
        let was_enabled = st.enabled();
        let enable = value & RING_CTRL_ENABLE != 0;
        match (was_enabled, enable) {
            (false, true) => {
                st.ring_ctrl = value;
                st.head = 0;
                st.tail = 0;
                st.halted = false;
                st.engine_error = 0;
                if let Err(code) = st.validate_ring(self.shared.vram.size()) {
                    st.halt(code, &self.shared.stats);
                } else {
                    tracing::info!(
                        base = st.ring_base,
                        entries = st.ring_size,
                        in_vram = value & RING_CTRL_IN_VRAM != 0,
                        "ring enabled"
                    );
                }
            }
            (true, false) => {
                // Abandon whatever the worker is doing; it will not retire it.
                self.shared.generation.fetch_add(1, Ordering::SeqCst);
                st.ring_ctrl = value;
                st.halted = false;
                tracing::info!("ring disabled");
            }
            // The location cannot change under a live ring.
            (true, true) => {}
            (false, false) => st.ring_ctrl = value,
        }
    }

    fn write_tail(&self, st: &mut State, value: u32) {
        if !st.enabled() || st.halted {
            tracing::debug!(value, "tail write ignored: ring disabled or halted");
            return;
        }
        if value >= st.ring_size {
            st.halt(ERR_BAD_TAIL, &self.shared.stats);
            return;
        }
        st.tail = value;
    }

    /// The PCI command register's Bus Master Enable changed.
    pub fn set_bus_master(&self, enabled: bool) {
        let mut st = self.shared.lock();
        st.bus_master = enabled;
        if st.runnable() {
            self.shared.wake.notify_all();
        }
    }

    /// Device reset (FLR, vfio-user DEVICE_RESET, client disconnect):
    /// registers return to their power-on values and any in-flight job is
    /// abandoned. VRAM keeps its contents, as on real boards. Bus mastering
    /// is config space, so the PCI layer reports it via `set_bus_master`.
    pub fn reset(&self) {
        let mut st = self.shared.lock();
        // Bumped under the lock, so the worker cannot take a command from
        // the old ring state with the new generation.
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        let fresh = State {
            bus_master: st.bus_master,
            worker_active: st.worker_active,
            shutdown: st.shutdown,
            ..State::new()
        };
        *st = fresh;
        Stats::add(&self.shared.stats.resets, 1);
        tracing::info!("device reset");
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
        }
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        self.shared.wake.notify_all();
        if let Some(worker) = self.worker.take() {
            if worker.join().is_err() {
                tracing::error!("engine thread panicked");
            }
        }
    }
}

fn u32_le(data: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    if let Some(src) = data.get(at..at + 4) {
        word.copy_from_slice(src);
    }
    u32::from_le_bytes(word)
}

fn reg_name(offset: u64) -> &'static str {
    match offset {
        REG_ID => "ID",
        REG_VERSION => "VERSION",
        REG_VRAM_SIZE_LO => "VRAM_SIZE_LO",
        REG_VRAM_SIZE_HI => "VRAM_SIZE_HI",
        REG_STATUS => "STATUS",
        REG_ENGINE_ERROR => "ENGINE_ERROR",
        REG_SCRATCH => "SCRATCH",
        REG_RING_BASE_LO => "RING_BASE_LO",
        REG_RING_BASE_HI => "RING_BASE_HI",
        REG_RING_SIZE => "RING_SIZE",
        REG_RING_CTRL => "RING_CTRL",
        REG_RING_HEAD => "RING_HEAD",
        REG_RING_TAIL => "RING_TAIL",
        REG_DOORBELL => "DOORBELL",
        REG_FENCE_LO => "FENCE_LO",
        REG_FENCE_HI => "FENCE_HI",
        REG_CHECKSUM => "CHECKSUM",
        REG_INT_STATUS => "INT_STATUS",
        REG_INT_MASK => "INT_MASK",
        REG_JOBS_COMPLETED => "JOBS_COMPLETED",
        REG_JOBS_FAILED => "JOBS_FAILED",
        _ => "reserved",
    }
}

/// What a command came to.
enum Outcome {
    Done {
        status: u32,
        result: u32,
    },
    /// A reset or ring disable overtook it; it must not retire.
    Abandoned,
}

impl Outcome {
    fn ok(result: u32) -> Self {
        Outcome::Done {
            status: STATUS_OK,
            result,
        }
    }
    fn err(status: u32) -> Self {
        Outcome::Done { status, result: 0 }
    }
}

/// A ring entry taken by the worker, with the ring state it came from.
struct Fetched {
    generation: u64,
    addr: u64,
    in_vram: bool,
    bus_master: bool,
}

/// The worker thread's side: fetch, execute, retire.
struct Engine {
    shared: Arc<Shared>,
    buf: Vec<u8>,
    aux: Vec<u8>,
}

impl Engine {
    fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            buf: vec![0; CHUNK],
            aux: Vec::new(),
        }
    }

    fn run(mut self) {
        loop {
            let (notify, fetched) = {
                let mut st = self.shared.lock();
                while !st.shutdown && !st.pending_notify && !st.runnable() {
                    st = self
                        .shared
                        .wake
                        .wait(st)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if st.shutdown {
                    return;
                }
                let notify = std::mem::take(&mut st.pending_notify);
                let fetched = if st.runnable() {
                    st.worker_active = true;
                    Some(Fetched {
                        generation: self.shared.generation.load(Ordering::SeqCst),
                        addr: st.ring_base + u64::from(st.head) * COMMAND_SIZE,
                        in_vram: st.ring_ctrl & RING_CTRL_IN_VRAM != 0,
                        bus_master: st.bus_master,
                    })
                } else {
                    None
                };
                (notify, fetched)
            };
            if notify {
                Stats::add(&self.shared.stats.interrupts, 1);
                self.shared.irq.notify(ENGINE_VECTOR);
            }
            if let Some(fetched) = fetched {
                self.process(fetched);
            }
        }
    }

    fn stale(&self, generation: u64) -> bool {
        self.shared.generation.load(Ordering::SeqCst) != generation
    }

    fn process(&mut self, fetched: Fetched) {
        let mut raw = [0u8; Command::SIZE];
        let fetch = if fetched.in_vram {
            self.shared.vram.read(fetched.addr, &mut raw).map_err(|e| {
                tracing::warn!(addr = fetched.addr, error = %e, "ring fetch from VRAM failed");
                ERR_RING_FETCH
            })
        } else if !fetched.bus_master {
            Err(ERR_NO_BUS_MASTER)
        } else {
            self.shared
                .memory
                .read(fetched.addr, &mut raw)
                .map_err(|e| {
                    tracing::warn!(error = %e, "ring fetch from guest memory failed");
                    ERR_RING_FETCH
                })
        };
        if let Err(code) = fetch {
            let mut st = self.shared.lock();
            st.worker_active = false;
            if !self.stale(fetched.generation) {
                st.halt(code, &self.shared.stats);
            }
            return;
        }
        let cmd = Command::decode(&raw);
        let outcome = self.execute(&cmd, fetched.generation, fetched.bus_master);
        let (status, result) = match outcome {
            Outcome::Done { status, result } => (status, result),
            Outcome::Abandoned => {
                tracing::info!(op = cmd.opcode_name(), fence = cmd.fence, "job abandoned");
                self.shared.lock().worker_active = false;
                return;
            }
        };
        let mut record_failed = false;
        if cmd.flags & CMD_FLAG_COMPLETION != 0 && cmd.flags & !CMD_FLAGS_KNOWN == 0 {
            let record = Completion {
                fence: cmd.fence,
                status,
                result,
            }
            .encode();
            record_failed = if !fetched.bus_master {
                true
            } else if let Err(e) = self.shared.memory.write(cmd.completion_addr, &record) {
                tracing::warn!(error = %e, "completion record write failed");
                true
            } else {
                false
            };
        }
        self.retire(&cmd, fetched.generation, status, result, record_failed);
    }

    fn retire(
        &self,
        cmd: &Command,
        generation: u64,
        status: u32,
        result: u32,
        record_failed: bool,
    ) {
        let stats = &self.shared.stats;
        let mut st = self.shared.lock();
        st.worker_active = false;
        if self.stale(generation) {
            return;
        }
        // The ring size was validated as a power of two when enabled.
        st.head = (st.head + 1) & st.ring_size.wrapping_sub(1);
        st.fence = cmd.fence;
        let mut causes = 0;
        if status == STATUS_OK {
            st.jobs_completed = st.jobs_completed.wrapping_add(1);
            Stats::add(&stats.jobs_completed, 1);
            if cmd.opcode == OP_CHECKSUM {
                st.checksum = result;
            }
            tracing::debug!(
                op = cmd.opcode_name(),
                fence = cmd.fence,
                len = cmd.len,
                result,
                "job done"
            );
        } else {
            st.jobs_failed = st.jobs_failed.wrapping_add(1);
            Stats::add(&stats.jobs_failed, 1);
            st.engine_error = status;
            causes |= INT_ERROR;
            tracing::warn!(
                op = cmd.opcode_name(),
                opcode = cmd.opcode,
                fence = cmd.fence,
                src = cmd.src,
                dst = cmd.dst,
                len = cmd.len,
                status,
                reason = status_name(status),
                "job failed"
            );
        }
        if record_failed {
            st.engine_error = ERR_COMPLETION_WRITE;
            causes |= INT_ERROR;
        }
        if cmd.flags & CMD_FLAG_IRQ != 0 {
            causes |= INT_FENCE;
        }
        st.raise(causes);
    }

    fn execute(&mut self, cmd: &Command, generation: u64, bus_master: bool) -> Outcome {
        if cmd.reserved0 != 0 || cmd.reserved1 != [0, 0] || cmd.flags & !CMD_FLAGS_KNOWN != 0 {
            return Outcome::err(ERR_BAD_COMMAND);
        }
        if cmd.opcode != OP_FILL && cmd.pattern != 0 {
            return Outcome::err(ERR_BAD_COMMAND);
        }
        let vram = &self.shared.vram;
        let needs_host = matches!(cmd.opcode, OP_COPY_TO_VRAM | OP_COPY_FROM_VRAM);
        let ranges_ok = match cmd.opcode {
            OP_NOP => return Outcome::ok(0),
            OP_COPY_TO_VRAM => vram.contains(cmd.dst, cmd.len),
            OP_COPY_FROM_VRAM | OP_CHECKSUM => vram.contains(cmd.src, cmd.len),
            OP_COPY_VRAM => vram.contains(cmd.src, cmd.len) && vram.contains(cmd.dst, cmd.len),
            OP_FILL => vram.contains(cmd.dst, cmd.len),
            _ => return Outcome::err(ERR_BAD_OPCODE),
        };
        if !ranges_ok {
            return Outcome::err(ERR_VRAM_RANGE);
        }
        if needs_host {
            let host = if cmd.opcode == OP_COPY_TO_VRAM {
                cmd.src
            } else {
                cmd.dst
            };
            if host.checked_add(cmd.len).is_none() {
                return Outcome::err(ERR_HOST_DMA);
            }
            if !bus_master {
                return Outcome::err(ERR_NO_BUS_MASTER);
            }
        }
        match cmd.opcode {
            OP_COPY_TO_VRAM => self.copy_to_vram(cmd, generation),
            OP_COPY_FROM_VRAM => self.copy_from_vram(cmd, generation),
            OP_COPY_VRAM => self.copy_vram(cmd, generation),
            OP_FILL => self.fill(cmd, generation),
            _ => self.checksum(cmd, generation),
        }
    }

    /// Splits `len` bytes into chunk-sized steps: (offset, size) pairs.
    fn steps(len: u64) -> impl DoubleEndedIterator<Item = (u64, usize)> {
        let chunk = CHUNK as u64;
        (0..len.div_ceil(chunk)).map(move |i| {
            let off = i * chunk;
            (off, (len - off).min(chunk) as usize)
        })
    }

    fn copy_to_vram(&mut self, cmd: &Command, generation: u64) -> Outcome {
        for (off, n) in Self::steps(cmd.len) {
            if self.stale(generation) {
                return Outcome::Abandoned;
            }
            let buf = &mut self.buf[..n];
            if let Err(e) = self.shared.memory.read(cmd.src + off, buf) {
                tracing::warn!(error = %e, "copy-to-vram: guest read failed");
                return Outcome::err(ERR_HOST_DMA);
            }
            if let Err(e) = self.shared.vram.write(cmd.dst + off, buf) {
                tracing::warn!(error = %e, "copy-to-vram: VRAM write failed");
                return Outcome::err(ERR_VRAM_IO);
            }
            Stats::add(&self.shared.stats.bytes_host_to_vram, n as u64);
        }
        Outcome::ok(0)
    }

    fn copy_from_vram(&mut self, cmd: &Command, generation: u64) -> Outcome {
        for (off, n) in Self::steps(cmd.len) {
            if self.stale(generation) {
                return Outcome::Abandoned;
            }
            let buf = &mut self.buf[..n];
            if let Err(e) = self.shared.vram.read(cmd.src + off, buf) {
                tracing::warn!(error = %e, "copy-from-vram: VRAM read failed");
                return Outcome::err(ERR_VRAM_IO);
            }
            if let Err(e) = self.shared.memory.write(cmd.dst + off, buf) {
                tracing::warn!(error = %e, "copy-from-vram: guest write failed");
                return Outcome::err(ERR_HOST_DMA);
            }
            Stats::add(&self.shared.stats.bytes_vram_to_host, n as u64);
        }
        Outcome::ok(0)
    }

    fn copy_vram(&mut self, cmd: &Command, generation: u64) -> Outcome {
        // memmove: when the destination overlaps the tail of the source,
        // copy back to front so no byte is overwritten before it is read.
        let backwards = cmd.dst > cmd.src && cmd.dst < cmd.src + cmd.len;
        let steps: Vec<(u64, usize)> = if backwards {
            Self::steps(cmd.len).rev().collect()
        } else {
            Self::steps(cmd.len).collect()
        };
        for (off, n) in steps {
            if self.stale(generation) {
                return Outcome::Abandoned;
            }
            let buf = &mut self.buf[..n];
            let vram = &self.shared.vram;
            if let Err(e) = vram
                .read(cmd.src + off, buf)
                .and_then(|()| vram.write(cmd.dst + off, buf))
            {
                tracing::warn!(error = %e, "copy-vram failed");
                return Outcome::err(ERR_VRAM_IO);
            }
            Stats::add(&self.shared.stats.bytes_vram_to_vram, n as u64);
        }
        Outcome::ok(0)
    }

    fn fill(&mut self, cmd: &Command, generation: u64) -> Outcome {
        if cmd.pattern == 0 {
            // Zero fill gives the pages back instead of writing zeros.
            if let Err(e) = self.shared.vram.zero(cmd.dst, cmd.len) {
                tracing::warn!(error = %e, "fill: hole punch failed");
                return Outcome::err(ERR_VRAM_IO);
            }
            Stats::add(&self.shared.stats.bytes_filled, cmd.len);
            return Outcome::ok(0);
        }
        // CHUNK is a multiple of 4, so every step starts at pattern byte 0.
        let pattern = cmd.pattern.to_le_bytes();
        if self.aux.len() != CHUNK {
            self.aux = vec![0; CHUNK];
        }
        for (i, byte) in self.aux.iter_mut().enumerate() {
            *byte = pattern[i % 4];
        }
        for (off, n) in Self::steps(cmd.len) {
            if self.stale(generation) {
                return Outcome::Abandoned;
            }
            if let Err(e) = self.shared.vram.write(cmd.dst + off, &self.aux[..n]) {
                tracing::warn!(error = %e, "fill: VRAM write failed");
                return Outcome::err(ERR_VRAM_IO);
            }
            Stats::add(&self.shared.stats.bytes_filled, n as u64);
        }
        Outcome::ok(0)
    }

    fn checksum(&mut self, cmd: &Command, generation: u64) -> Outcome {
        let mut crc = Crc32c::new();
        for (off, n) in Self::steps(cmd.len) {
            if self.stale(generation) {
                return Outcome::Abandoned;
            }
            let buf = &mut self.buf[..n];
            if let Err(e) = self.shared.vram.read(cmd.src + off, buf) {
                tracing::warn!(error = %e, "checksum: VRAM read failed");
                return Outcome::err(ERR_VRAM_IO);
            }
            crc.update(buf);
            Stats::add(&self.shared.stats.bytes_checksummed, n as u64);
        }
        Outcome::ok(crc.finish())
    }
}
