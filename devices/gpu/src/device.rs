//! What the register side ([`crate::Gpu`]) and the engine thread share:
//! the register file behind one lock, VRAM, counters, and the two ports to
//! the outside world (guest memory and interrupts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use p2plab_dma::GuestMemory;
use p2plab_fault::GpuInjector;

use crate::register_file::RegisterFile;
use crate::stats::Stats;
use crate::vram::Vram;

/// How the engine signals an MSI-X vector. Called from the engine thread
/// only, never while the model's lock is held.
pub trait InterruptSink: Send + Sync + 'static {
    /// Signals `vector`.
    fn notify(&self, vector: u16);
}

/// Bus Master Enable in the PCI command register: whether the device may
/// reach guest memory at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusMaster {
    /// Set: engine DMA to guest memory is allowed.
    Enabled,
    /// Clear: commands that need guest memory fail with NO_BUS_MASTER.
    Disabled,
}

impl From<bool> for BusMaster {
    /// From the Bus Master Enable bit.
    fn from(enabled: bool) -> Self {
        if enabled {
            BusMaster::Enabled
        } else {
            BusMaster::Disabled
        }
    }
}

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
    pub memory: Arc<dyn GuestMemory>,
    pub irq: Arc<dyn InterruptSink>,
    /// Armed fault injections; its own lock, never taken while waiting
    /// on [`Self::wake`].
    faults: Mutex<GpuInjector>,
    /// The decoded trace (off unless switched on).
    pub trace: p2plab_trace::Tracer,
}

impl Device {
    pub fn new(vram: Vram, memory: Arc<dyn GuestMemory>, irq: Arc<dyn InterruptSink>) -> Self {
        Self {
            registers: Mutex::new(RegisterFile::new()),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            vram: Arc::new(vram),
            stats: Stats::default(),
            memory,
            irq,
            faults: Mutex::new(GpuInjector::default()),
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

    /// The armed fault injections.
    pub fn faults(&self) -> MutexGuard<'_, GpuInjector> {
        // Plain data, as for the register file.
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
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
