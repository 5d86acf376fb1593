//! The device model as its transport sees it: BAR0 accesses, bus master
//! changes and resets, with the engine running on its own thread.
//!
//! Register accesses arrive on the transport's socket thread and only
//! touch state under a short lock; they never wait for the engine or for
//! guest memory.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use p2plab_dma::GuestMemory;
use p2plab_kit::regs::{accepted_write_dwords, read_bytes, register_values};
use p2plab_kit::{arm_spec, counters_with, Armed, DeviceControl, Interrupts, QuiesceTimeout};

use crate::device::Device;
use crate::engine::{Engine, Step};
use crate::fault::{ArmedReport, GpuFaultSpec, GpuFaults};
use crate::register_file::{AfterWrite, RegisterFile};
use crate::regs::{Reg, REGS_BAR_SIZE};
use crate::stats::{Stats, StatsSnapshot};
use crate::vram::Vram;

/// A handle to the device's counters, fault injections, registers and
/// reset that another thread, the control socket's, can use while the
/// transport owns the device.
#[derive(Clone)]
pub struct GpuControl(Arc<Device>);

impl GpuControl {
    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.0.stats.snapshot()
    }

    /// Arms `spec`; returns its ID. Refused when the device keeps as many
    /// as it may ([`p2plab_fault::DEFAULT_MAX_ARMED`]).
    pub fn inject(&self, spec: GpuFaultSpec) -> Result<u64, String> {
        let id = self
            .0
            .faults
            .with(|faults| faults.arm(spec))
            .map_err(|e| e.to_string())?;
        tracing::info!(id, %spec, "fault armed");
        Ok(id)
    }

    /// The armed injections and how often each fired.
    pub fn report(&self) -> Vec<ArmedReport> {
        self.0.faults.with(|faults| faults.report())
    }
}

impl DeviceControl for GpuControl {
    /// The counters, VRAM's size and the host memory it holds, flat.
    fn counters(&self) -> serde_json::Value {
        let vram = &self.0.vram;
        let allocated = vram.allocated_bytes().unwrap_or(0);
        counters_with(
            self.stats(),
            &[
                ("vram_size", vram.size()),
                ("vram_allocated_bytes", allocated),
            ],
        )
    }

    fn inject(&self, spec: &str) -> Result<Armed, String> {
        arm_spec(spec, |spec| GpuControl::inject(self, spec))
    }

    /// Disarms every injection, VRAM error ranges included.
    fn clear(&self) {
        self.0.faults.with(GpuFaults::clear);
        tracing::info!("faults cleared");
    }

    /// What a function-level reset does (see [`Gpu::reset`]).
    fn reset(&self) -> Result<(), String> {
        self.0.trace.record(
            "reset",
            || serde_json::json!({"name": "control-socket reset", "injected": true}),
        );
        reset_device(&self.0).map_err(|e| e.to_string())
    }

    fn fault_report(&self) -> serde_json::Value {
        serde_json::to_value(self.report()).unwrap_or_default()
    }

    /// Every BAR0 register by name, as the guest would read it now (the
    /// write-only DOORBELL left out).
    fn registers(&self) -> Option<Vec<(&'static str, u64)>> {
        let vram_size = self.0.vram.size();
        let regs = self.0.lock();
        Some(register_values::<Reg>(|reg| regs.read(reg, vram_size)))
    }

    fn tracer(&self) -> &p2plab_trace::Tracer {
        &self.0.trace
    }
}

/// The GPU-like device: BAR0 registers, BAR2 VRAM and the engine thread.
pub struct Gpu {
    device: Arc<Device>,
    engine: Option<JoinHandle<()>>,
    /// The engine when it runs on the caller's thread
    /// ([`Gpu::with_engine_on_caller`]); `None` with an engine thread.
    caller_engine: Option<Mutex<Engine>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("vram_size", &self.device.vram.size())
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Builds the device around `vram` and starts its engine thread. The
    /// engine reaches guest memory through `memory` and signals through
    /// `irq`.
    pub fn new(
        vram: Vram,
        memory: Arc<dyn GuestMemory>,
        irq: Arc<dyn Interrupts>,
    ) -> io::Result<Self> {
        let device = Arc::new(Device::new(vram, memory, irq));
        let engine = Engine::new(Arc::clone(&device));
        // The engine logs inside the device's span (socket, ids).
        let span = tracing::Span::current();
        let engine = std::thread::Builder::new()
            .name("gpu-engine".into())
            .spawn(move || {
                let _span = span.enter();
                engine.run()
            })?;
        Ok(Self {
            device,
            engine: Some(engine),
            caller_engine: None,
        })
    }

    /// Builds the device with no engine thread: the engine runs on the
    /// caller's thread, one [`Gpu::run_engine`] at a time, through the
    /// same fetch, execute and retire code the thread runs. For a fuzz
    /// target that cannot afford a thread per input. An injected hang
    /// holds the job until a reset or ring disable that only another
    /// thread could do: do not arm one on such a device.
    pub fn with_engine_on_caller(
        vram: Vram,
        memory: Arc<dyn GuestMemory>,
        irq: Arc<dyn Interrupts>,
    ) -> Self {
        let device = Arc::new(Device::new(vram, memory, irq));
        let engine = Engine::new(Arc::clone(&device));
        Self {
            device,
            engine: None,
            caller_engine: Some(Mutex::new(engine)),
        }
    }

    /// Runs the engine on this thread until it has nothing to do (no
    /// interrupt to send, no ring entry it may run); returns how many
    /// steps it took. Does nothing (and returns 0) on a device with an
    /// engine thread. A ring the engine goes round without end would not
    /// return: that is the hang a caller's timeout should catch.
    pub fn run_engine(&self) -> u64 {
        let Some(engine) = &self.caller_engine else {
            return 0;
        };
        let mut engine = engine.lock().unwrap_or_else(PoisonError::into_inner);
        let mut steps = 0;
        while engine.step(false) == Step::Worked {
            steps += 1;
        }
        steps
    }

    /// VRAM (BAR2).
    pub fn vram(&self) -> &Vram {
        &self.device.vram
    }

    /// A shared handle to VRAM (e.g. to serve it as a DMA local window).
    pub fn vram_handle(&self) -> Arc<Vram> {
        Arc::clone(&self.device.vram)
    }

    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.device.stats.snapshot()
    }

    /// The device's trace recorder (off until switched on).
    pub fn tracer(&self) -> &p2plab_trace::Tracer {
        &self.device.trace
    }

    /// A handle for the control socket: counters, fault injections,
    /// registers, reset.
    pub fn control(&self) -> GpuControl {
        GpuControl(Arc::clone(&self.device))
    }

    /// Arms a fault injection (see [`GpuControl::inject`]).
    pub fn inject(&self, spec: GpuFaultSpec) -> Result<u64, String> {
        GpuControl::inject(&self.control(), spec)
    }

    /// A trapped BAR0 read of any size; reads have no side effects, so a
    /// read of odd size or alignment is assembled from the dwords it
    /// covers. Reserved offsets read 0, bytes past the BAR 0xff.
    pub fn regs_read(&self, offset: u64, data: &mut [u8]) {
        let vram_size = self.device.vram.size();
        let regs = self.device.lock();
        read_bytes(offset, data, REGS_BAR_SIZE, |at| {
            read_dword(&regs, at, vram_size)
        });
    }

    /// A trapped BAR0 write. 4-byte aligned dword writes and 8-byte aligned
    /// qword writes (low dword first) are supported; anything else is
    /// ignored and counted, as a real device would drop it.
    pub fn regs_write(&self, offset: u64, data: &[u8]) {
        let refused = &self.device.stats.bad_register_accesses;
        let Some((dwords, count)) = accepted_write_dwords(offset, data, 8, refused) else {
            return;
        };
        let vram_size = self.device.vram.size();
        let mut regs = self.device.lock();
        for &(at, value) in &dwords[..count] {
            let Some((reg, half)) = Reg::at(at) else {
                tracing::debug!(offset = at, value, "write to reserved offset ignored");
                continue;
            };
            match regs.write(reg, half, value, vram_size, &self.device.stats) {
                AfterWrite::Nothing => {}
                // Under the lock, so the engine cannot fetch from the old
                // ring with the new generation.
                AfterWrite::AbandonJobInFlight => self.device.abandon_job_in_flight(),
            }
        }
        if regs.interrupt_pending || regs.runnable() {
            self.device.wake.notify_all();
        }
    }

    /// The PCI command register's Bus Master Enable changed.
    pub fn set_bus_master(&self, enabled: bool) {
        self.device.gate.set_bus_master(enabled);
        let mut regs = self.device.lock();
        regs.bus_master_enabled = enabled;
        if regs.runnable() {
            self.device.wake.notify_all();
        }
    }

    /// Device reset (FLR, vfio-user DEVICE_RESET, client disconnect):
    /// registers return to their power-on values and any in-flight job is
    /// abandoned. VRAM keeps its contents, as on real boards. Bus mastering
    /// is config space, so the PCI layer reports it via `set_bus_master`.
    /// Returns once the DMA gate is quiesced: no DMA of a job fetched
    /// before the reset runs any more, or ever will.
    pub fn reset(&self) -> Result<(), QuiesceTimeout> {
        reset_device(&self.device)
    }
}

fn reset_device(device: &Device) -> Result<(), QuiesceTimeout> {
    let mut regs = device.lock();
    device.abandon_job_in_flight();
    let fresh = RegisterFile {
        bus_master_enabled: regs.bus_master_enabled,
        engine_holds_job: regs.engine_holds_job,
        shutdown: regs.shutdown,
        ..RegisterFile::new()
    };
    *regs = fresh;
    Stats::add(&device.stats.resets, 1);
    tracing::info!("device reset");
    device
        .trace
        .record("reset", || serde_json::json!({"name": "device reset"}));
    drop(regs);
    // The engine wakes from the new generation and finds no ring; a job
    // it holds gets no DMA of its old epoch any more.
    device.wake.notify_all();
    device.gate.quiesce()
}

/// The dword at a dword-aligned BAR0 offset (0 if reserved).
fn read_dword(regs: &RegisterFile, offset: u64, vram_size: u64) -> u32 {
    Reg::at(offset).map_or(0, |(reg, half)| half.of(regs.read(reg, vram_size)))
}

impl Drop for Gpu {
    fn drop(&mut self) {
        {
            let mut regs = self.device.lock();
            regs.shutdown = true;
            self.device.abandon_job_in_flight();
        }
        self.device.wake.notify_all();
        if let Some(engine) = self.engine.take() {
            if engine.join().is_err() {
                tracing::error!("engine thread panicked");
            }
        }
    }
}
