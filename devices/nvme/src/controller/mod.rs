//! The NVMe controller's register front-end: BAR0 registers and doorbells,
//! the CMB and PMR BARs, enable / reset / shutdown. The state it shares
//! with the queue workers is `state::ControllerState`.
//!
//! - `bar0`: register reads and writes (CC, AQA, CMB and PMR controls).
//! - `doorbells`: doorbell writes and the errors they raise.
//!
//! Threading. Register accesses arrive on the transport's socket thread and
//! must never wait for DMA: QEMU serves our DMA requests under the same
//! global lock its vCPU holds while waiting for a trapped access. So a
//! register access only updates the register state (short critical
//! section), stores doorbell values in atomics and wakes a worker. Each
//! submission queue has a worker thread that fetches entries, does the DMA
//! and backing-store I/O, posts completions and signals interrupts. The
//! admin queue's worker also creates and deletes the I/O queue workers. No
//! lock the socket thread takes is ever held across DMA or file I/O.

mod bar0;
mod doorbells;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::fault::{ArmError, FaultSpec};
use p2plab_dma::{DmaFault, GuestMemory, RegionMemory};
use tracing::{debug, info, warn};

use crate::config::{ConfigError, ControllerConfig};
use crate::memory::DmaRouter;
use crate::namespace::Namespace;
use crate::registers::{Cap, Csts};
use crate::state::{ControllerState, FaultReport, QueueRunner, Regs};
use crate::stats::{Stats, StatsSnapshot};
use crate::worker;
use p2plab_kit::Interrupts;

/// CAP.MPSMAX: host memory pages of 4 KiB up to 64 KiB.
const MPS_MAX: u32 = 4;
/// CAP.TO in 500 ms units: how long the host waits for CSTS.RDY.
const READY_TIMEOUT: u8 = 0x0f;
/// PMRCAP.PMRTO in 500 ms units (PMRTU 0): how long PMRSTS.NRDY may take.
const PMR_READY_TIMEOUT: u8 = 4;
/// BAR holding the PMR (PMRCAP.BIR).
pub const PMR_BAR: u8 = 4;
/// BAR holding the CMB (CMBLOC.BIR).
pub const CMB_BAR: u8 = 2;

/// The controller. Cheap to share: every method takes `&self`.
pub struct NvmeController {
    state: Arc<ControllerState>,
}

impl Drop for NvmeController {
    fn drop(&mut self) {
        // Workers hold the shared state; ask them to go away and wait.
        let mut regs = crate::lock(&self.state.regs);
        self.state.stop_queues(&mut regs);
        drop(regs);
        self.state.join_stopped_workers();
        self.state.join_shutdown_flushes();
    }
}

/// A configuration value that does not match the memory handed over.
fn mismatch(field: &'static str, message: &str) -> ConfigError {
    ConfigError {
        field,
        message: message.into(),
    }
}

impl NvmeController {
    /// A controller with `namespaces` (NSIDs 1..=N in order), reaching
    /// guest memory through `memory`, with its CMB in `cmb` (required iff
    /// `config.cmb_size` is not 0, and at least that large).
    pub fn new(
        config: ControllerConfig,
        namespaces: Vec<Arc<Namespace>>,
        memory: Arc<dyn GuestMemory>,
        cmb: Option<Arc<dyn RegionMemory>>,
        irq: Arc<dyn Interrupts>,
    ) -> Result<Self, ConfigError> {
        Self::with_pmr(config, namespaces, memory, cmb, None, irq)
    }

    /// Like [`new`](Self::new), with a Persistent Memory Region in `pmr`
    /// (required iff `config.pmr_size` is not 0).
    pub fn with_pmr(
        config: ControllerConfig,
        namespaces: Vec<Arc<Namespace>>,
        memory: Arc<dyn GuestMemory>,
        cmb: Option<Arc<dyn RegionMemory>>,
        pmr: Option<Arc<dyn RegionMemory>>,
        irq: Arc<dyn Interrupts>,
    ) -> Result<Self, ConfigError> {
        let runner = QueueRunner::Threads(worker::run);
        Self::build(config, namespaces, memory, cmb, pmr, irq, runner)
    }

    fn build(
        config: ControllerConfig,
        namespaces: Vec<Arc<Namespace>>,
        memory: Arc<dyn GuestMemory>,
        cmb: Option<Arc<dyn RegionMemory>>,
        pmr: Option<Arc<dyn RegionMemory>>,
        irq: Arc<dyn Interrupts>,
        runner: QueueRunner,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        match (&pmr, config.pmr_size) {
            (None, 0) => {}
            (Some(region), size) if size > 0 && region.size() >= size => {}
            _ => {
                return Err(mismatch(
                    "pmr_size",
                    "the PMR memory does not match the configured size",
                ))
            }
        }
        match (&cmb, config.cmb_size) {
            (None, 0) => {}
            (Some(region), size) if size > 0 && region.size() >= size => {}
            _ => {
                return Err(mismatch(
                    "cmb_size",
                    "the CMB memory does not match the configured size",
                ))
            }
        }
        for (i, ns) in namespaces.iter().enumerate() {
            if ns.nsid() as usize != i + 1 {
                return Err(ConfigError {
                    field: "namespaces",
                    message: format!("namespace {} is listed at position {}", ns.nsid(), i + 1),
                });
            }
        }
        let cap = Cap {
            // Validated to 2..=4096 entries.
            mqes: (config.max_queue_entries - 1) as u16,
            cqr: true,
            to: READY_TIMEOUT,
            css: Cap::CSS_NVM,
            mpsmin: 0,
            mpsmax: MPS_MAX as u8,
            pmrs: config.pmr_size > 0,
            cmbs: config.cmb_size > 0,
        };
        let stats = Arc::new(Stats::default());
        let mem = DmaRouter::with_pmr(memory, cmb, pmr, Arc::clone(&stats));
        let state = ControllerState::new(config, cap.value(), namespaces, mem, irq, stats, runner);
        Ok(Self {
            state: Arc::new(state),
        })
    }

    /// Like [`new`](Self::new), with no queue worker threads: the queues
    /// run on the caller's thread when it calls
    /// [`run_queues`](Self::run_queues), through the same fetch, command
    /// tables, handlers and completion code. A completion queue the host
    /// left full is not waited for: its SQ's next entries stay unfetched
    /// (a completion a handler adds, such as Abort's, is dropped). For
    /// fuzzing and deterministic tests.
    #[cfg(feature = "testing")]
    pub fn with_queues_on_caller(
        config: ControllerConfig,
        namespaces: Vec<Arc<Namespace>>,
        memory: Arc<dyn GuestMemory>,
        cmb: Option<Arc<dyn RegionMemory>>,
        irq: Arc<dyn Interrupts>,
    ) -> Result<Self, ConfigError> {
        Self::build(
            config,
            namespaces,
            memory,
            cmb,
            None,
            irq,
            QueueRunner::Caller,
        )
    }

    /// Runs every queue's pending entries on this thread (a controller
    /// made by [`with_queues_on_caller`](Self::with_queues_on_caller);
    /// elsewhere the worker threads run them and this does nothing).
    #[cfg(feature = "testing")]
    pub fn run_queues(&self) {
        if self.state.queues_on_caller() {
            worker::run_queues_on_caller(&self.state);
        }
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.state.cfg
    }

    /// A trapped access to the CMB BAR (QEMU normally maps it directly).
    pub fn read_cmb(&self, offset: u64, data: &mut [u8]) -> Result<(), DmaFault> {
        bar_memory(self.state.mem.cmb(), offset, data.len(), "no CMB")?.read(offset, data)
    }

    pub fn write_cmb(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        bar_memory(self.state.mem.cmb(), offset, data.len(), "no CMB")?.write(offset, data)
    }

    /// A trapped access to the PMR BAR (QEMU normally maps it directly).
    pub fn read_pmr(&self, offset: u64, data: &mut [u8]) -> Result<(), DmaFault> {
        bar_memory(self.state.mem.pmr(), offset, data.len(), "no PMR")?.read(offset, data)
    }

    pub fn write_pmr(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        bar_memory(self.state.mem.pmr(), offset, data.len(), "no PMR")?.write(offset, data)
    }

    /// Where the guest placed the CMB BAR (None while memory decode is off).
    pub fn set_cmb_bar_address(&self, address: Option<u64>) {
        let mut regs = crate::lock(&self.state.regs);
        regs.cmb_bar = address;
        if let (Some(cba), Some(bar)) = (regs.cba, address) {
            if cba != bar {
                warn!(
                    cba = format_args!("{cba:#x}"),
                    bar = format_args!("{bar:#x}"),
                    "CMBMSC.CBA differs from the CMB BAR address"
                );
            }
        }
        debug!(address = ?address.map(|a| format!("{a:#x}")), "CMB BAR placed");
    }

    /// Function-level reset (FLR, DEVICE_RESET, client disconnect): like
    /// clearing CC.EN, and the CMB controls go back to their reset values.
    /// The CMB BAR is unprogrammed until config space says otherwise.
    ///
    /// Returns once every queue worker has exited, so no DMA of this
    /// controller runs afterwards (the transport's quiesce contract). The
    /// transport fences DMA while it calls this, so a worker waiting for a
    /// DMA reply fails at once instead of waiting for this thread.
    pub fn reset(&self) {
        let state = &self.state;
        {
            let mut regs = crate::lock(&state.regs);
            info!("controller function reset");
            state
                .trace
                .record("reset", || serde_json::json!({"name": "function reset"}));
            state.stop_queues(&mut regs);
            // Config space is back to power-on state too: BARs unprogrammed.
            *regs = Regs::default();
            state.mem.set_window(None);
            state.mem.set_pmr_window(None);
        }
        state.join_stopped_workers();
        state.join_shutdown_flushes();
        state.fatal.store(false, Ordering::Release);
        state.power_cycles.fetch_add(1, Ordering::Relaxed);
    }

    /// A controller reset the host did not ask for (`p2plab-ctl reset`):
    /// every queue goes away as if CC.EN went 1 -> 0, CC.EN reads 0, and
    /// the BAR and CMB placement stay (config space did not change). The
    /// host's driver finds out through its timeouts.
    pub fn surprise_reset(&self) {
        let mut regs = crate::lock(&self.state.regs);
        info!("controller reset from the control socket");
        self.state.trace.record(
            "reset",
            || serde_json::json!({"name": "control-socket reset", "injected": true}),
        );
        regs.cc = Default::default();
        self.state.stop_queues(&mut regs);
    }

    /// Flushes every namespace and the PMR (server shutdown).
    pub fn flush_all(&self) {
        self.state.persist_pmr();
        for ns in &self.state.namespaces {
            if let Err(e) = ns.flush() {
                warn!(nsid = ns.nsid(), ?e, "flush failed");
            }
        }
    }

    /// Arms a fault injection (specs: [`crate::fault`]); returns its ID, or
    /// refuses it when the controller keeps as many as it may
    /// ([`crate::fault::MAX_ARMED`]).
    pub fn inject(&self, spec: FaultSpec) -> Result<u64, ArmError> {
        self.state.inject(spec)
    }

    /// Disarms every injection and forgets injected bad blocks.
    pub fn clear_faults(&self) {
        self.state.clear_faults();
    }

    /// Armed injections, bad blocks and held commands.
    pub fn fault_report(&self) -> FaultReport {
        self.state.fault_report()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.state.snapshot()
    }

    /// The controller's trace recorder (off until switched on).
    pub fn tracer(&self) -> &p2plab_trace::Tracer {
        &self.state.trace
    }

    /// CSTS as the host would read it.
    pub fn csts(&self) -> u32 {
        let regs = crate::lock(&self.state.regs);
        let csts: Csts = self.state.csts(&regs);
        csts.raw()
    }
}

/// The memory behind a BAR the device may not have (CMB or PMR switched off).
fn bar_memory<'a>(
    memory: Option<&'a Arc<dyn RegionMemory>>,
    offset: u64,
    len: usize,
    missing: &'static str,
) -> Result<&'a Arc<dyn RegionMemory>, DmaFault> {
    memory.ok_or_else(|| DmaFault::unmapped(offset, len as u64, missing))
}
