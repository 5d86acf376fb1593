//! What the register side ([`crate::Gpu`]) and the engine thread share:
//! the register file behind one lock, VRAM, counters, and the two ports to
//! the outside world (guest memory behind the kit's DMA gate, and
//! interrupts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use p2plab_dma::GuestMemory;
use p2plab_fault::Shared;
use p2plab_kit::{DmaGate, Interrupts};

use crate::fault::GpuFaults;
use crate::register_file::RegisterFile;
use crate::stats::Stats;
use crate::vram::Vram;

/// The device state both threads share.
pub(crate) struct Device {
    registers: Mutex<RegisterFile>,
    /// Wakes the engine: new work, a pending interrupt, or shutdown.
    pub wake: Condvar,
    /// Bumped by reset and by disabling the ring; the engine drops a
    /// command whose generation is stale instead of retiring it.
    generation: AtomicU64,
    pub vram: Arc<Vram>,
    pub stats: Stats,
    /// Guest memory behind Bus Master Enable; the engine does a job's
    /// DMA bound to the epoch it fetched the job in.
    pub gate: DmaGate,
    /// Called from the engine thread only, never with the lock held.
    pub irq: Arc<dyn Interrupts>,
    /// Armed fault injections; its own lock, never taken while waiting
    /// on [`Self::wake`], and skipped while nothing is armed.
    pub faults: Shared<GpuFaults>,
    /// The decoded trace (off unless switched on).
    pub trace: p2plab_trace::Tracer,
}

impl Device {
    pub fn new(vram: Vram, memory: Arc<dyn GuestMemory>, irq: Arc<dyn Interrupts>) -> Self {
        Self {
            registers: Mutex::new(RegisterFile::new()),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            vram: Arc::new(vram),
            stats: Stats::default(),
            gate: DmaGate::new(memory),
            irq,
            faults: Shared::default(),
            trace: p2plab_trace::Tracer::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, RegisterFile> {
        // A poisoned lock only means another thread panicked mid-update;
        // the register file is still plain data, so keep serving it.
        self.registers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits on [`Self::wake`].
    pub fn wait<'a>(&self, guard: MutexGuard<'a, RegisterFile>) -> MutexGuard<'a, RegisterFile> {
        self.wake
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The generation a job fetched now belongs to.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Makes the command in flight (if any) stale: the engine stops it at
    /// its next step and never retires it. Call with the lock held, so the
    /// engine cannot fetch from the old ring state with the new generation.
    pub fn abandon_job_in_flight(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        // An engine holding an injected hang waits for this.
        self.wake.notify_all();
    }
}
