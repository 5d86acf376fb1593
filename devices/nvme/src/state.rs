//! The controller's state, shared by the register front-end
//! ([`NvmeController`](crate::NvmeController)), the queue workers and the
//! command handlers. Handlers depend on this module, never on the
//! controller.
//!
//! Locking. `regs` is taken by the socket thread on every register access:
//! never hold it across DMA or file I/O. `queues` and `admin` are held only
//! briefly, never across DMA either.

use std::collections::BTreeSet;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;
use std::time::Instant;

use p2plab_fault::{ArmError, Shared};
use serde::Serialize;
use tracing::{error, info, warn};

use crate::config::ControllerConfig;
use crate::fault::{ArmedReport, BadRangeReport, CommandInfo, Decision, FaultSpec, NvmeFaults};
use crate::features::Features;
use crate::logs::{AsyncEvents, ErrorLog, SmartCounters, CRITICAL_WARNING_TEMPERATURE};
use crate::memory::DmaRouter;
use crate::namespace::{Namespace, NamespaceCounters};
use crate::queues::{CompletionQueue, QueueTable, SubmissionQueue};
use crate::registers::{Aqa, Cc, CmbMsc, CmbSts, Csts, PmrCtl, PmrMsc, PmrSts, Shst};
use crate::spec::{Status, NSID_ALL};
use crate::stats::{
    CmbSnapshot, ControllerSnapshot, HostMemorySnapshot, NamespaceSnapshot, PmrSnapshot,
    QueueSnapshot, Stats, StatsSnapshot,
};
use p2plab_kit::Interrupts;

/// Controller registers that are state, not computed.
#[derive(Debug, Default)]
pub(crate) struct Regs {
    pub cc: Cc,
    /// The admin queue is up (CSTS.RDY while enabled).
    pub ready: bool,
    pub shst: Shst,
    pub aqa: Aqa,
    pub asq: u64,
    pub acq: u64,
    /// INTMS/INTMC: the interrupt mask (unused with MSI-X, kept for reads).
    pub intms: u32,
    pub cmbmsc: CmbMsc,
    pub cmbsts: CmbSts,
    /// CBA latched by the last CMBMSC write with CRE and CMSE set.
    pub cba: Option<u64>,
    /// Where the guest placed the CMB BAR (config space).
    pub cmb_bar: Option<u64>,
    pub pmrctl: PmrCtl,
    pub pmrmsc: PmrMsc,
    pub pmrsts: PmrSts,
    /// PMR base address latched by PMRMSCL.CMSE.
    pub pmr_cba: Option<u64>,
}

/// State the admin worker owns; others only touch it briefly (error log,
/// events) and never hold it across DMA.
pub(crate) struct AdminState {
    pub features: Features,
    pub events: AsyncEvents,
    pub error_log: ErrorLog,
    /// Shadow doorbell and EventIdx buffers (Doorbell Buffer Config).
    pub doorbell_buffers: Option<(u64, u64)>,
    pub changed_namespaces: BTreeSet<u32>,
    pub queues_created: bool,
    /// OCP Error Injection entries as the host set them, each with the ID
    /// of the injection it armed (none when disabled). They survive
    /// controller resets, like injections armed from the host.
    pub ocp_error_injection: Vec<([u8; 32], Option<u64>)>,
}

impl AdminState {
    fn new(cfg: &ControllerConfig, namespaces: u32) -> Self {
        Self {
            features: Features::new(namespaces, cfg.msix_vectors(), cfg.max_io_queues),
            events: AsyncEvents::default(),
            error_log: ErrorLog::default(),
            doorbell_buffers: None,
            changed_namespaces: BTreeSet::new(),
            queues_created: false,
            ocp_error_injection: Vec::new(),
        }
    }
}

/// The body of a queue worker thread: fetch, execute, complete. The
/// controller supplies it ([`worker::run`](crate::worker)) when it builds
/// the state, so that the state, and the handlers that create queues, do
/// not depend on the worker (which depends on them).
pub(crate) type QueueWorker = fn(Arc<ControllerState>, Arc<SubmissionQueue>, Arc<CompletionQueue>);

/// Who runs the queues: fetch, execute, complete.
#[derive(Debug, Clone, Copy)]
pub(crate) enum QueueRunner {
    /// A thread per submission queue, running this body.
    Threads(QueueWorker),
    /// The host's own thread, when it asks
    /// ([`NvmeController::run_queues`](crate::NvmeController::run_queues)):
    /// the same code with no threads (fuzzing, deterministic tests).
    #[cfg(feature = "testing")]
    Caller,
}

impl QueueRunner {
    /// A worker thread's body; none when the host's thread runs the queues.
    fn thread_body(self) -> Option<QueueWorker> {
        match self {
            QueueRunner::Threads(body) => Some(body),
            #[cfg(feature = "testing")]
            QueueRunner::Caller => None,
        }
    }
}

/// A command held without a completion by an injected `timeout`, until an
/// Abort names it or the controller resets.
pub(crate) struct HeldCommand {
    pub sq: Arc<SubmissionQueue>,
    pub cq: Arc<CompletionQueue>,
    pub cid: u16,
    pub opcode: u8,
    /// Whether an Abort may abort it (`timeout,no-abort`: no).
    pub abortable: bool,
}

/// A held command as the control socket's `status` shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HeldReport {
    pub sqid: u16,
    pub cid: u16,
    pub opcode: u8,
    pub abortable: bool,
}

/// Injected faults as the control socket's `status` shows them.
#[derive(Debug, Clone, Serialize)]
pub struct FaultReport {
    pub armed: Vec<ArmedReport>,
    pub bad_blocks: Vec<BadRangeReport>,
    pub held_commands: Vec<HeldReport>,
}

pub(crate) struct ControllerState {
    pub cfg: ControllerConfig,
    /// CAP, fixed for the controller's lifetime.
    pub cap: u64,
    pub regs: Mutex<Regs>,
    pub queues: Mutex<QueueTable>,
    /// Queue worker threads alive; CSTS.RDY stays 1 after CC.EN is cleared
    /// until they have all finished their command and exited.
    pub live_workers: AtomicUsize,
    /// CSTS.CFS.
    pub fatal: AtomicBool,
    pub mem: DmaRouter,
    pub irq: Arc<dyn Interrupts>,
    pub namespaces: Vec<Arc<Namespace>>,
    pub admin: Mutex<AdminState>,
    pub stats: Arc<Stats>,
    pub started: Instant,
    pub page_size: AtomicU64,
    pub power_cycles: AtomicU64,
    pub busy_nanos: AtomicU64,
    pub media_errors: AtomicU64,
    /// Totals of namespaces' counters that survive nothing but are summed
    /// into the controller-wide SMART log.
    pub totals: NamespaceCounters,
    /// Armed fault injections and bad blocks; the hot path skips the lock
    /// while nothing is armed. Shared with the DMA router, which applies
    /// `peer-fail`/`peer-stall`.
    faults: Arc<Shared<NvmeFaults>>,
    /// Commands held by an injected `timeout`.
    pub held: Mutex<Vec<HeldCommand>>,
    runner: QueueRunner,
    /// Workers of queues a reset removed, until someone joins them
    /// ([`join_stopped_workers`](Self::join_stopped_workers)).
    stopped_workers: Mutex<Vec<JoinHandle<()>>>,
    /// Threads flushing the namespaces for a shutdown notification, until
    /// a function reset or the controller's end joins them
    /// ([`join_shutdown_flushes`](Self::join_shutdown_flushes)): no flush
    /// outlives its controller.
    shutdown_flushes: Mutex<Vec<JoinHandle<()>>>,
    /// The decoded trace (off unless switched on).
    /// Shared with the DMA router, which records `peer-fail`/`peer-stall`.
    pub trace: Arc<p2plab_trace::Tracer>,
}

/// How long a function reset waits for a worker that is not in the
/// stopped list (one spawned while the reset ran) to exit.
const STRAY_WORKER_WAIT: Duration = Duration::from_secs(5);

impl ControllerState {
    /// Power-on state: no queues, registers at their reset values.
    pub fn new(
        cfg: ControllerConfig,
        cap: u64,
        namespaces: Vec<Arc<Namespace>>,
        mut mem: DmaRouter,
        irq: Arc<dyn Interrupts>,
        stats: Arc<Stats>,
        runner: QueueRunner,
    ) -> Self {
        let faults = Arc::new(Shared::new(NvmeFaults::default()));
        let trace = Arc::new(p2plab_trace::Tracer::new());
        mem.attach_peer_faults(crate::memory::PeerFaults {
            faults: Arc::clone(&faults),
            trace: Arc::clone(&trace),
        });
        Self {
            cap,
            regs: Mutex::new(Regs::default()),
            queues: Mutex::new(QueueTable::new(cfg.max_io_queues)),
            live_workers: AtomicUsize::new(0),
            fatal: AtomicBool::new(false),
            mem,
            irq,
            admin: Mutex::new(AdminState::new(&cfg, namespaces.len() as u32)),
            namespaces,
            stats,
            started: Instant::now(),
            page_size: AtomicU64::new(4096),
            power_cycles: AtomicU64::new(1),
            busy_nanos: AtomicU64::new(0),
            media_errors: AtomicU64::new(0),
            totals: NamespaceCounters::default(),
            faults,
            held: Mutex::new(Vec::new()),
            cfg,
            runner,
            stopped_workers: Mutex::new(Vec::new()),
            shutdown_flushes: Mutex::new(Vec::new()),
            trace,
        }
    }

    pub fn page_size(&self) -> u64 {
        self.page_size.load(Ordering::Acquire)
    }

    pub fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::Acquire)
    }

    /// CSTS.CFS: a fatal error that no completion can report.
    pub fn set_fatal(&self, why: &str) {
        error!("controller fatal status: {why}");
        self.trace.record(
            "cfs",
            || serde_json::json!({"name": "CSTS.CFS", "why": why}),
        );
        self.fatal.store(true, Ordering::Release);
    }

    /// Arms an injection; returns its ID. Refused when the controller
    /// keeps as many as it may ([`crate::fault::MAX_ARMED`]).
    pub fn inject(&self, spec: FaultSpec) -> Result<u64, ArmError> {
        let id = self.faults.with(|faults| faults.arm(spec))?;
        info!(id, spec = %spec, "fault injection armed");
        Ok(id)
    }

    /// Disarms every injection and forgets every bad block. Held commands
    /// stay held (an Abort or a reset releases them).
    pub fn clear_faults(&self) {
        self.faults.with(NvmeFaults::clear);
        info!("fault injections cleared");
    }

    /// Disarms the injections `old` and arms `new` in their place, all or
    /// nothing (OCP Error Injection entries replaced).
    pub fn replace_faults(&self, old: &[u64], new: &[FaultSpec]) -> Result<Vec<u64>, ArmError> {
        let ids = self.faults.with(|faults| faults.replace(old, new))?;
        info!(?old, new = ?ids, "fault injections replaced");
        Ok(ids)
    }

    /// What the armed injections do to this command.
    pub fn decide_faults(&self, cmd: &CommandInfo) -> Decision {
        self.faults
            .when_armed(|faults| faults.decide(cmd))
            .unwrap_or_default()
    }

    /// The first block of the range that an injected media error makes
    /// unreadable; counts the failed read on its spec.
    pub fn first_bad_block(&self, nsid: u32, slba: u64, blocks: u64) -> Option<u64> {
        let lba = self.faults.when_armed(|faults| {
            let lba = faults.bad_blocks().first_bad(nsid, slba, blocks)?;
            faults.note_media_error(nsid, lba);
            Some(lba)
        })??;
        self.trace.record("fault", || {
            serde_json::json!({
                "name": "media-error",
                "nsid": nsid,
                "slba": slba,
                "nlb": blocks,
                "bad_lba": lba,
                "injected": true,
            })
        });
        Some(lba)
    }

    /// Like [`first_bad_block`](Self::first_bad_block), without counting
    /// (the error log's LBA); `slba` when no block is bad.
    pub fn bad_block_for_log(&self, nsid: u32, slba: u64, blocks: u64) -> u64 {
        self.faults
            .with(|faults| faults.bad_blocks().first_bad(nsid, slba, blocks))
            .unwrap_or(slba)
    }

    /// The blocks were rewritten or deallocated: injected media errors on
    /// them are gone.
    pub fn repair_blocks(&self, nsid: u32, slba: u64, blocks: u64) {
        self.faults
            .when_armed(|faults| faults.bad_blocks_mut().repair(nsid, slba, blocks));
    }

    /// The namespace was formatted: no bad blocks remain on it.
    pub fn forget_bad_blocks(&self, nsid: u32) {
        self.faults
            .with(|faults| faults.bad_blocks_mut().forget_namespace(nsid));
    }

    /// Takes the held command `cid` of queue `sqid` if an Abort may abort
    /// it.
    pub fn take_held(&self, sqid: u16, cid: u16) -> Option<HeldCommand> {
        let mut held = crate::lock(&self.held);
        let at = held
            .iter()
            .position(|h| h.sq.id == sqid && h.cid == cid && h.abortable)?;
        Some(held.remove(at))
    }

    pub fn fault_report(&self) -> FaultReport {
        let (armed, bad_blocks) = self
            .faults
            .with(|faults| (faults.report(), faults.bad_blocks().report()));
        FaultReport {
            armed,
            bad_blocks,
            held_commands: crate::lock(&self.held)
                .iter()
                .map(|h| HeldReport {
                    sqid: h.sq.id,
                    cid: h.cid,
                    opcode: h.opcode,
                    abortable: h.abortable,
                })
                .collect(),
        }
    }

    pub fn namespace(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        if nsid == 0 {
            return None;
        }
        self.namespaces.get(nsid as usize - 1)
    }

    pub fn namespace_count(&self) -> u32 {
        self.namespaces.len() as u32
    }

    /// Whether a namespace ID is acceptable for commands naming one
    /// namespace (not 0, not broadcast, attached).
    pub fn check_nsid(&self, nsid: u32) -> Result<&Arc<Namespace>, Status> {
        if nsid == NSID_ALL {
            return Err(Status::INVALID_NAMESPACE);
        }
        self.namespace(nsid).ok_or(Status::INVALID_NAMESPACE)
    }

    /// CSTS as the host reads it.
    pub fn csts(&self, regs: &Regs) -> Csts {
        let mut csts = Csts::with_shst(regs.shst);
        if regs.ready || self.live_workers.load(Ordering::Acquire) > 0 {
            csts.set(Csts::RDY);
        }
        if self.is_fatal() {
            csts.set(Csts::CFS);
        }
        csts
    }

    /// Makes PMR contents durable.
    pub fn persist_pmr(&self) {
        if let Some(pmr) = self.mem.pmr() {
            if let Err(e) = pmr.flush() {
                warn!(%e, "PMR flush failed");
            }
        }
    }

    /// Starts a worker thread for `sq`, completing into `cq`.
    pub fn spawn_worker(
        self: &Arc<Self>,
        sq: Arc<SubmissionQueue>,
        cq: Arc<CompletionQueue>,
    ) -> io::Result<()> {
        let Some(body) = self.runner.thread_body() else {
            return Ok(());
        };
        self.live_workers.fetch_add(1, Ordering::AcqRel);
        let state = Arc::clone(self);
        let queue = Arc::clone(&sq);
        let spawned = thread::Builder::new()
            .name(format!("nvme-sq{}", sq.id))
            .spawn(move || {
                let sqid = queue.id;
                let shared = Arc::clone(&state);
                shared.at_worker_boundary(sqid, move || body(state, queue, cq));
            });
        match spawned {
            Ok(handle) => {
                *crate::lock(&sq.worker) = Some(handle);
                Ok(())
            }
            Err(e) => {
                self.live_workers.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Whether the host's thread runs the queues (no worker threads).
    #[cfg(feature = "testing")]
    pub fn queues_on_caller(&self) -> bool {
        matches!(self.runner, QueueRunner::Caller)
    }

    /// A new completion queue, as this controller's queues post to it.
    pub fn completion_queue(&self, cq: CompletionQueue) -> Arc<CompletionQueue> {
        #[cfg(feature = "testing")]
        if self.queues_on_caller() {
            return Arc::new(cq.never_waiting());
        }
        Arc::new(cq)
    }

    /// Runs a queue's work at the worker boundary: a bug in a handler (or
    /// anything it calls) must not wedge the device. Like a controller
    /// firmware fault, it sets CSTS.CFS and the device waits for the host
    /// to reset it (CC.EN 1->0), which Linux does when it sees CFS. Locks
    /// a panicking worker held are poisoned; `crate::lock` takes them
    /// anyway, and the reset reinitialises what they guard.
    pub fn at_worker_boundary(&self, sqid: u16, work: impl FnOnce()) {
        let ran = panic::catch_unwind(AssertUnwindSafe(work));
        if let Err(panic) = ran {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            self.set_fatal(&format!("internal error in the SQ {sqid} worker: {what}"));
            self.stats.internal_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Controller reset: every queue goes away and its worker is told to
    /// stop (they exit after their current command; CSTS.RDY drops when
    /// the last one has). Outstanding Asynchronous Event Requests are
    /// dropped without completions; features return to their defaults.
    pub fn stop_queues(&self, regs: &mut Regs) {
        let was_ready = regs.ready;
        regs.ready = false;
        let stopped = crate::lock(&self.queues).stop_all();
        if was_ready {
            self.stats.resets.fetch_add(1, Ordering::Relaxed);
            if regs.shst != Shst::Complete {
                self.stats.unsafe_shutdowns.fetch_add(1, Ordering::Relaxed);
            }
        }
        regs.shst = Shst::Normal;
        // Not joined here: on CC.EN 1->0 this is the socket thread, and a
        // worker may be waiting for a DMA reply only this thread can read.
        // CSTS.RDY stays 1 until they have exited; a function reset joins
        // them (`join_stopped_workers`) once the transport fenced DMA.
        {
            let mut parked = crate::lock(&self.stopped_workers);
            parked.retain(|handle| !handle.is_finished());
            parked.extend(
                stopped
                    .iter()
                    .filter_map(|sq| crate::lock(&sq.worker).take()),
            );
        }
        drop(stopped);
        // Held commands die with their queues, without completions.
        crate::lock(&self.held).clear();
        // A failed flush is reported until the controller is reset.
        for ns in &self.namespaces {
            ns.clear_flush_failure();
        }
        // The error log and its count survive resets (SMART reports the
        // lifetime count); everything else starts over.
        let mut admin = crate::lock(&self.admin);
        admin.events.reset();
        admin.features = Features::new(
            self.namespace_count(),
            self.cfg.msix_vectors(),
            self.cfg.max_io_queues,
        );
        admin.doorbell_buffers = None;
        admin.queues_created = false;
        admin.changed_namespaces.clear();
        drop(admin);
        self.fatal.store(false, Ordering::Release);
    }

    /// Waits for every worker a reset stopped: when this returns, none of
    /// them does DMA any more. Never call it on the thread that must answer
    /// the workers' DMA (the socket thread outside a transport reset),
    /// and never with `regs` held.
    pub fn join_stopped_workers(&self) {
        let handles = std::mem::take(&mut *crate::lock(&self.stopped_workers));
        let me = thread::current().id();
        for handle in handles {
            if handle.thread().id() != me {
                // A worker's panic was already turned into CSTS.CFS.
                let _ = handle.join();
            }
        }
        // A worker spawned while the reset ran (its handle was stored after
        // the reset took the others) sees its stop flag and exits at once.
        let deadline = std::time::Instant::now() + STRAY_WORKER_WAIT;
        while self.live_workers.load(Ordering::Acquire) > 0 {
            if std::time::Instant::now() >= deadline {
                warn!("a queue worker did not stop after a reset");
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Keeps the thread of a shutdown flush until it is joined; joins
    /// the ones that already ended.
    pub fn track_shutdown_flush(&self, handle: JoinHandle<()>) {
        let mut flushes = crate::lock(&self.shutdown_flushes);
        let (ended, running) = std::mem::take(&mut *flushes)
            .into_iter()
            .partition::<Vec<_>, _>(|h| h.is_finished());
        *flushes = running;
        flushes.push(handle);
        drop(flushes);
        for handle in ended {
            let _ = handle.join();
        }
    }

    /// Waits for every shutdown flush still running. Never with `regs`
    /// held: a flush takes it to report completion.
    pub fn join_shutdown_flushes(&self) {
        let handles = std::mem::take(&mut *crate::lock(&self.shutdown_flushes));
        for handle in handles {
            // A panic in a flush has nothing left to report.
            let _ = handle.join();
        }
    }

    /// Signals the completion queue's vector, if its interrupts are on.
    pub fn interrupt(&self, cq: &CompletionQueue) {
        if cq.irq_enabled {
            self.stats.interrupts.fetch_add(1, Ordering::Relaxed);
            self.trace.record(
                "irq",
                || serde_json::json!({"cqid": cq.id, "vector": cq.vector}),
            );
            self.irq.notify(cq.vector);
        }
    }

    /// SMART counters for one namespace, or the controller (`None`).
    pub fn smart_counters(&self, nsid: Option<u32>) -> SmartCounters {
        let counters = match nsid.and_then(|n| self.namespace(n)) {
            Some(ns) => &ns.counters,
            None => &self.totals,
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let admin = crate::lock(&self.admin);
        let mut warning = 0u8;
        if admin.features.temperature_alarm() {
            warning |= CRITICAL_WARNING_TEMPERATURE;
        }
        SmartCounters {
            bytes_read: load(&counters.bytes_read),
            bytes_written: load(&counters.bytes_written),
            read_commands: load(&counters.read_commands),
            write_commands: load(&counters.write_commands),
            busy_minutes: load(&self.busy_nanos) / 60_000_000_000,
            power_cycles: load(&self.power_cycles),
            power_on_hours: self.started.elapsed().as_secs() / 3600,
            unsafe_shutdowns: self.stats.unsafe_shutdowns.load(Ordering::Relaxed),
            media_errors: load(&self.media_errors),
            error_log_entries: admin.error_log.count(),
            temperature: crate::features::COMPOSITE_TEMPERATURE,
            critical_warning: warning,
        }
    }

    /// Counters and state for the stats file.
    pub fn snapshot(&self) -> StatsSnapshot {
        let (controller, cmb_bar, cba, cmse, pmr_enabled, pmr_cba) = {
            let regs = crate::lock(&self.regs);
            let csts = self.csts(&regs);
            (
                ControllerSnapshot {
                    serial: self.cfg.serial.clone(),
                    enabled: regs.cc.en(),
                    ready: csts.rdy(),
                    cc: regs.cc.0,
                    csts: csts.raw(),
                    shadow_doorbells: false,
                },
                regs.cmb_bar,
                regs.cba,
                regs.cba.is_some(),
                regs.pmrctl.en(),
                regs.pmr_cba,
            )
        };
        let shadow = crate::lock(&self.admin).doorbell_buffers.is_some();
        let queues: Vec<QueueSnapshot> = {
            let table = crate::lock(&self.queues);
            table
                .sqs
                .iter()
                .flatten()
                .map(|sq| QueueSnapshot {
                    sqid: sq.id,
                    cqid: sq.cqid,
                    entries: sq.entries,
                    base: sq.base,
                    in_cmb: sq.in_cmb,
                    cq_in_cmb: table.cq(sq.cqid).is_some_and(|cq| cq.in_cmb),
                    fetched: sq.fetched.load(Ordering::Relaxed),
                })
                .collect()
        };
        let c = self.stats.snapshot();
        StatsSnapshot {
            uptime_ms: self.started.elapsed().as_millis() as u64,
            controller: ControllerSnapshot {
                shadow_doorbells: shadow,
                ..controller
            },
            pmr: PmrSnapshot {
                size: self.cfg.pmr_size,
                enabled: pmr_enabled,
                cba: pmr_cba,
                dma_read_bytes: c.pmr_read_bytes,
                dma_write_bytes: c.pmr_write_bytes,
            },
            cmb: CmbSnapshot {
                size: self.cfg.cmb_size,
                bar_address: cmb_bar,
                cmse,
                cba,
                sq_entries_fetched: c.sq_entries_from_cmb,
                cq_entries_posted: c.cq_entries_to_cmb,
                io_sqs_created: c.io_sqs_created_in_cmb,
                io_cqs_created: c.io_cqs_created_in_cmb,
                data_bytes_to: c.data_to_cmb_bytes,
                data_bytes_from: c.data_from_cmb_bytes,
                dma_read_bytes: c.cmb_read_bytes,
                dma_write_bytes: c.cmb_write_bytes,
            },
            host: HostMemorySnapshot {
                sq_entries_fetched: c.sq_entries_from_host,
                cq_entries_posted: c.cq_entries_to_host,
                io_sqs_created: c.io_sqs_created_in_host,
                io_cqs_created: c.io_cqs_created_in_host,
                data_bytes_to: c.data_to_host_bytes,
                data_bytes_from: c.data_from_host_bytes,
                dma_read_bytes: c.host_read_bytes,
                dma_write_bytes: c.host_write_bytes,
                dma_faults: c.dma_faults,
            },
            queues,
            namespaces: self
                .namespaces
                .iter()
                .map(|ns| NamespaceSnapshot {
                    nsid: ns.nsid(),
                    block_size: ns.block_size(),
                    blocks: ns.blocks(),
                    backing: ns.backend().describe(),
                    read_commands: ns.counters.read_commands.load(Ordering::Relaxed),
                    write_commands: ns.counters.write_commands.load(Ordering::Relaxed),
                    bytes_read: ns.counters.bytes_read.load(Ordering::Relaxed),
                    bytes_written: ns.counters.bytes_written.load(Ordering::Relaxed),
                })
                .collect(),
            counters: c,
        }
    }
}
