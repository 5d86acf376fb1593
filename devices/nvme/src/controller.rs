//! The NVMe controller: registers, doorbells, enable / reset / shutdown,
//! and the state its queue workers share.
//!
//! Threading. Register accesses arrive on the transport's socket thread and
//! must never wait for DMA: QEMU serves our DMA requests under the same
//! global lock its vCPU holds while waiting for a trapped access. So a
//! register access only updates [`Regs`] (short critical section), stores
//! doorbell values in atomics and wakes a worker. Each submission queue has
//! a worker thread that fetches entries, does the DMA and backing-store
//! I/O, posts completions and signals interrupts. The admin queue's worker
//! also creates and deletes the I/O queue workers. No lock the socket
//! thread takes is ever held across DMA or file I/O.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use tracing::{debug, error, info, trace, warn};

use crate::command::{Command, Completion};
use crate::config::{ConfigError, ControllerConfig};
use crate::features::Features;
use crate::identify::VERSION;
use crate::logs::{AsyncEvent, AsyncEvents, ErrorEntry, ErrorLog, SmartCounters};
use crate::memory::{DmaFault, DmaRouter, GuestMemory, RegionMemory};
use crate::namespace::{Namespace, NamespaceCounters};
use crate::queues::{CompletionQueue, QueueTable, SubmissionQueue};
use crate::spec::{aen, cc, cmb, csts, pmr, reg, Status, NSID_ALL};
use crate::stats::{
    CmbSnapshot, ControllerSnapshot, HostMemorySnapshot, NamespaceSnapshot, PmrSnapshot,
    QueueSnapshot, Stats, StatsSnapshot,
};
use crate::worker;

/// Delivers MSI-X vectors; must be callable from any thread.
pub trait Interrupts: Send + Sync {
    fn notify(&self, vector: u16);
}

/// CAP.MPSMAX: host memory pages of 4 KiB up to 64 KiB.
const MPS_MAX: u32 = 4;
/// CAP.TO in 500 ms units: how long the host waits for CSTS.RDY.
const READY_TIMEOUT: u64 = 0x0f;
/// PMRCAP.PMRTO in 500 ms units (PMRTU 0): how long PMRSTS.NRDY may take.
const PMR_READY_TIMEOUT: u32 = 4;
/// BAR holding the PMR (PMRCAP.BIR).
pub const PMR_BAR: u8 = 4;

/// Controller registers that are state, not computed.
#[derive(Debug, Default)]
pub(crate) struct Regs {
    pub cc: u32,
    /// The admin queue is up (CSTS.RDY while enabled).
    pub ready: bool,
    pub shst: u8,
    pub aqa: u32,
    pub asq: u64,
    pub acq: u64,
    pub intms: u32,
    pub cmbmsc: u64,
    pub cmbsts: u32,
    /// CBA latched by the last CMBMSC write with CRE and CMSE set.
    pub cba: Option<u64>,
    /// Where the guest placed the CMB BAR (config space).
    pub cmb_bar: Option<u64>,
    pub pmrctl: u32,
    pub pmrmsc: u64,
    pub pmrsts: u32,
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
}

pub(crate) struct Shared {
    pub cfg: ControllerConfig,
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
}

/// The controller. Cheap to share: every method takes `&self`.
pub struct NvmeController {
    shared: Arc<Shared>,
}

impl Drop for NvmeController {
    fn drop(&mut self) {
        // Workers hold the shared state; ask them to go away.
        let mut regs = crate::lock(&self.shared.regs);
        self.shared.stop_queues(&mut regs);
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
        config.validate()?;
        match (&pmr, config.pmr_size) {
            (None, 0) => {}
            (Some(region), size) if size > 0 && region.size() >= size => {}
            _ => {
                return Err(ConfigError {
                    field: "pmr_size",
                    message: "the PMR memory does not match the configured size".into(),
                })
            }
        }
        match (&cmb, config.cmb_size) {
            (None, 0) => {}
            (Some(region), size) if size > 0 && region.size() >= size => {}
            _ => {
                return Err(ConfigError {
                    field: "cmb_size",
                    message: "the CMB memory does not match the configured size".into(),
                })
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
        let stats = Arc::new(Stats::default());
        let mut cap = u64::from(config.max_queue_entries - 1);
        cap |= 1 << 16; // CQR: queues must be physically contiguous
        cap |= READY_TIMEOUT << 24;
        cap |= 1 << 37; // CSS: NVM command set
        cap |= u64::from(MPS_MAX) << 52;
        if config.cmb_size > 0 {
            cap |= 1 << 57; // CMBS
        }
        if config.pmr_size > 0 {
            cap |= 1 << 56; // PMRS
        }
        let features = Features::new(
            namespaces.len() as u32,
            config.msix_vectors(),
            config.max_io_queues,
        );
        let shared = Shared {
            cap,
            regs: Mutex::new(Regs::default()),
            queues: Mutex::new(QueueTable::new(config.max_io_queues)),
            live_workers: AtomicUsize::new(0),
            fatal: AtomicBool::new(false),
            mem: DmaRouter::with_pmr(memory, cmb, pmr, Arc::clone(&stats)),
            irq,
            namespaces,
            admin: Mutex::new(AdminState {
                features,
                events: AsyncEvents::default(),
                error_log: ErrorLog::default(),
                doorbell_buffers: None,
                changed_namespaces: BTreeSet::new(),
                queues_created: false,
            }),
            stats,
            started: Instant::now(),
            page_size: AtomicU64::new(4096),
            power_cycles: AtomicU64::new(1),
            busy_nanos: AtomicU64::new(0),
            media_errors: AtomicU64::new(0),
            totals: NamespaceCounters::default(),
            cfg: config,
        };
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.shared.cfg
    }

    /// A trapped read of BAR0 (registers and doorbells; 1 to 8 bytes).
    pub fn read_bar0(&self, offset: u64, data: &mut [u8]) {
        self.shared
            .stats
            .register_reads
            .fetch_add(1, Ordering::Relaxed);
        let end = offset + data.len() as u64;
        if offset < reg::PMRSTS + 4 && end > reg::PMRSTS {
            // PMRCAP.PMRWBM bit 1: this read returns once earlier writes to
            // the PMR are persistent. It blocks the vCPU like the flush in
            // QEMU's PMR does, and never waits for DMA.
            self.shared.persist_pmr();
        }
        let regs = crate::lock(&self.shared.regs);
        for (i, byte) in data.iter_mut().enumerate() {
            let at = offset + i as u64;
            let dword = self.shared.register(&regs, at & !3);
            *byte = (dword >> ((at & 3) * 8)) as u8;
        }
        drop(regs);
        if offset < reg::DOORBELLS && offset != reg::CSTS {
            // CSTS is polled in loops; everything else is worth a line.
            debug!(
                register = reg::name(offset),
                offset = format_args!("{offset:#x}"),
                len = data.len(),
                value = format_args!("{:#x}", le_value(data)),
                "register read"
            );
        } else {
            trace!(
                register = reg::name(offset),
                value = format_args!("{:#x}", le_value(data)),
                "register read"
            );
        }
    }

    /// A trapped write of BAR0. Registers take aligned 4- or 8-byte
    /// writes; anything else is ignored, as on real controllers.
    pub fn write_bar0(&self, offset: u64, data: &[u8]) {
        self.shared
            .stats
            .register_writes
            .fetch_add(1, Ordering::Relaxed);
        if !offset.is_multiple_of(4) || (data.len() != 4 && data.len() != 8) {
            warn!(
                offset = format_args!("{offset:#x}"),
                len = data.len(),
                "ignoring a register write that is not an aligned dword or qword"
            );
            return;
        }
        // At most two dwords: no allocation on the doorbell path.
        let mut dwords = [(0u64, 0u32); 2];
        let count = data.len() / 4;
        for (i, c) in data.chunks_exact(4).enumerate().take(2) {
            dwords[i] = (
                offset + 4 * i as u64,
                u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            );
        }
        let dwords = &mut dwords[..count.min(2)];
        // A 64-bit CMBMSC write is applied high dword first, like Linux's
        // hi_lo_writeq, so CMSE latches the new base address.
        if offset == reg::CMBMSC && dwords.len() == 2 {
            dwords.reverse();
        }
        for &mut (at, value) in dwords {
            if at >= reg::DOORBELLS {
                self.shared.doorbell(at, value);
            } else {
                self.shared.write_register(at, value);
            }
        }
    }

    /// A trapped access to the CMB BAR (QEMU normally maps it directly).
    pub fn read_cmb(&self, offset: u64, data: &mut [u8]) -> Result<(), DmaFault> {
        bar_memory(self.shared.mem.cmb(), offset, data.len(), "no CMB")?.read(offset, data)
    }

    pub fn write_cmb(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        bar_memory(self.shared.mem.cmb(), offset, data.len(), "no CMB")?.write(offset, data)
    }

    /// A trapped access to the PMR BAR (QEMU normally maps it directly).
    pub fn read_pmr(&self, offset: u64, data: &mut [u8]) -> Result<(), DmaFault> {
        bar_memory(self.shared.mem.pmr(), offset, data.len(), "no PMR")?.read(offset, data)
    }

    pub fn write_pmr(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        bar_memory(self.shared.mem.pmr(), offset, data.len(), "no PMR")?.write(offset, data)
    }

    /// Where the guest placed the CMB BAR (None while memory decode is off).
    pub fn set_cmb_bar_address(&self, address: Option<u64>) {
        let mut regs = crate::lock(&self.shared.regs);
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
    pub fn reset(&self) {
        let mut regs = crate::lock(&self.shared.regs);
        info!("controller function reset");
        self.shared.stop_queues(&mut regs);
        // Config space is back to power-on state too: BARs unprogrammed.
        *regs = Regs::default();
        self.shared.mem.set_window(None);
        self.shared.mem.set_pmr_window(None);
        self.shared.fatal.store(false, Ordering::Release);
        self.shared.power_cycles.fetch_add(1, Ordering::Relaxed);
    }

    /// Flushes every namespace and the PMR (server shutdown).
    pub fn flush_all(&self) {
        self.shared.persist_pmr();
        for ns in &self.shared.namespaces {
            if let Err(e) = ns.backend().flush() {
                warn!(nsid = ns.nsid(), %e, "flush failed");
            }
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.snapshot()
    }

    /// CSTS as the host would read it.
    pub fn csts(&self) -> u32 {
        let regs = crate::lock(&self.shared.regs);
        self.shared.csts(&regs)
    }
}

fn le_value(data: &[u8]) -> u64 {
    data.iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

impl Shared {
    pub fn page_size(&self) -> u64 {
        self.page_size.load(Ordering::Acquire)
    }

    pub fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::Acquire)
    }

    /// CSTS.CFS: a fatal error that no completion can report.
    pub fn set_fatal(&self, why: &str) {
        error!("controller fatal status: {why}");
        self.fatal.store(true, Ordering::Release);
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

    pub fn csts(&self, regs: &Regs) -> u32 {
        let mut value = 0;
        if regs.ready || self.live_workers.load(Ordering::Acquire) > 0 {
            value |= csts::RDY;
        }
        if self.is_fatal() {
            value |= csts::CFS;
        }
        value | (u32::from(regs.shst) << csts::SHST_SHIFT)
    }

    fn cmb_regs(&self, regs: &Regs) -> (u32, u32) {
        if self.cfg.cmb_size == 0 || regs.cmbmsc & cmb::MSC_CRE == 0 {
            return (0, 0);
        }
        let cmbloc = 2 | cmb::LOC_CDPMLS | cmb::LOC_CDPCILS; // BIR 2, offset 0
        let units = (self.cfg.cmb_size / cmb::UNIT_1MIB) as u32;
        let cmbsz = cmb::SZ_SQS
            | cmb::SZ_CQS
            | cmb::SZ_LISTS
            | cmb::SZ_RDS
            | cmb::SZ_WDS
            | (cmb::SZU_1MIB << cmb::SZ_SZU_SHIFT)
            | (units << cmb::SZ_SZ_SHIFT);
        (cmbloc, cmbsz)
    }

    /// The value of the dword at `offset` (dword aligned).
    fn register(&self, regs: &Regs, offset: u64) -> u32 {
        let (cmbloc, cmbsz) = self.cmb_regs(regs);
        match offset {
            0x00 => self.cap as u32,
            0x04 => (self.cap >> 32) as u32,
            reg::VS => VERSION,
            reg::INTMS | reg::INTMC => regs.intms,
            reg::CC => regs.cc,
            reg::CSTS => self.csts(regs),
            reg::AQA => regs.aqa,
            reg::ASQ => regs.asq as u32,
            0x2c => (regs.asq >> 32) as u32,
            reg::ACQ => regs.acq as u32,
            0x34 => (regs.acq >> 32) as u32,
            reg::CMBLOC => cmbloc,
            reg::CMBSZ => cmbsz,
            reg::CMBMSC if self.cfg.cmb_size > 0 => regs.cmbmsc as u32,
            0x54 if self.cfg.cmb_size > 0 => (regs.cmbmsc >> 32) as u32,
            reg::CMBSTS => regs.cmbsts,
            reg::PMRCAP if self.cfg.pmr_size > 0 => {
                pmr::CAP_RDS
                    | pmr::CAP_WDS
                    | (u32::from(PMR_BAR) << pmr::CAP_BIR_SHIFT)
                    | pmr::CAP_WBM_STS_READ
                    | (PMR_READY_TIMEOUT << pmr::CAP_TO_SHIFT)
                    | pmr::CAP_CMSS
            }
            reg::PMRCTL if self.cfg.pmr_size > 0 => regs.pmrctl,
            reg::PMRSTS if self.cfg.pmr_size > 0 => {
                let nrdy = if regs.pmrctl & pmr::CTL_EN != 0 {
                    0
                } else {
                    pmr::STS_NRDY
                };
                regs.pmrsts | nrdy
            }
            reg::PMRMSCL if self.cfg.pmr_size > 0 => regs.pmrmsc as u32,
            reg::PMRMSCU if self.cfg.pmr_size > 0 => (regs.pmrmsc >> 32) as u32,
            _ => 0,
        }
    }

    fn write_register(self: &Arc<Self>, offset: u64, value: u32) {
        debug!(
            register = reg::name(offset),
            offset = format_args!("{offset:#x}"),
            value = format_args!("{value:#x}"),
            "register write"
        );
        let mut regs = crate::lock(&self.regs);
        match offset {
            reg::INTMS => regs.intms |= value,
            reg::INTMC => regs.intms &= !value,
            reg::CC => self.write_cc(&mut regs, value),
            reg::AQA => regs.aqa = value & 0x0fff_0fff,
            reg::ASQ => regs.asq = (regs.asq & !0xffff_ffff) | u64::from(value),
            0x2c => regs.asq = (regs.asq & 0xffff_ffff) | (u64::from(value) << 32),
            reg::ACQ => regs.acq = (regs.acq & !0xffff_ffff) | u64::from(value),
            0x34 => regs.acq = (regs.acq & 0xffff_ffff) | (u64::from(value) << 32),
            reg::CMBMSC if self.cfg.cmb_size > 0 => {
                regs.cmbmsc = (regs.cmbmsc & !0xffff_ffff) | u64::from(value);
                self.latch_cmb(&mut regs);
            }
            0x54 if self.cfg.cmb_size > 0 => {
                // The high half of CBA; latched by the next low-dword write.
                regs.cmbmsc = (regs.cmbmsc & 0xffff_ffff) | (u64::from(value) << 32);
            }
            reg::PMRCTL if self.cfg.pmr_size > 0 => {
                regs.pmrctl = value & pmr::CTL_EN;
                if regs.pmrctl == 0 {
                    // A disabled PMR decodes nothing.
                    regs.pmrmsc &= !u64::from(pmr::MSC_CMSE);
                    regs.pmr_cba = None;
                }
                let decoded = if regs.pmrctl != 0 { regs.pmr_cba } else { None };
                self.mem.set_pmr_window(decoded);
                info!(enabled = regs.pmrctl != 0, "PMR control written");
            }
            reg::PMRMSCL if self.cfg.pmr_size > 0 => {
                regs.pmrmsc = (regs.pmrmsc & !0xffff_ffff) | u64::from(value);
                self.latch_pmr(&mut regs);
            }
            reg::PMRMSCU if self.cfg.pmr_size > 0 => {
                regs.pmrmsc = (regs.pmrmsc & 0xffff_ffff) | (u64::from(value) << 32);
            }
            reg::NSSR => debug!("NVM subsystem reset is not supported; write ignored"),
            _ => debug!(
                offset = format_args!("{offset:#x}"),
                "write to a read-only or reserved register ignored"
            ),
        }
    }

    /// CMBMSC low dword written: CRE exposes CMBLOC/CMBSZ, CMSE latches CBA
    /// as the bus address the controller decodes as its CMB.
    fn latch_cmb(&self, regs: &mut Regs) {
        regs.cba = None;
        regs.cmbsts &= !cmb::STS_CBAI;
        if regs.cmbmsc & cmb::MSC_CRE != 0 && regs.cmbmsc & cmb::MSC_CMSE != 0 {
            let cba = regs.cmbmsc & cmb::MSC_CBA_MASK;
            if cba.checked_add(self.cfg.cmb_size).is_none() {
                warn!(cba = format_args!("{cba:#x}"), "CMB base address invalid");
                regs.cmbsts |= cmb::STS_CBAI;
            } else {
                regs.cba = Some(cba);
                if regs.cmb_bar.is_some_and(|bar| bar != cba) {
                    warn!(
                        cba = format_args!("{cba:#x}"),
                        bar = ?regs.cmb_bar,
                        "CMBMSC.CBA is not where the CMB BAR is"
                    );
                }
            }
        }
        self.mem.set_window(regs.cba);
        info!(
            cre = regs.cmbmsc & cmb::MSC_CRE != 0,
            cmse = regs.cba.is_some(),
            cba = ?regs.cba.map(|a| format!("{a:#x}")),
            "CMB controls written"
        );
    }

    /// PMRMSCL written: CMSE latches the PMR's controller base address.
    fn latch_pmr(&self, regs: &mut Regs) {
        regs.pmr_cba = None;
        regs.pmrsts &= !pmr::STS_CBAI;
        if regs.pmrmsc & u64::from(pmr::MSC_CMSE) != 0 {
            let cba = regs.pmrmsc & !0xfff;
            if cba.checked_add(self.cfg.pmr_size).is_none() {
                warn!(cba = format_args!("{cba:#x}"), "PMR base address invalid");
                regs.pmrsts |= pmr::STS_CBAI;
            } else {
                regs.pmr_cba = Some(cba);
            }
        }
        let decoded = if regs.pmrctl & pmr::CTL_EN != 0 {
            regs.pmr_cba
        } else {
            None
        };
        self.mem.set_pmr_window(decoded);
        info!(cba = ?regs.pmr_cba.map(|a| format!("{a:#x}")), "PMR controls written");
    }

    /// Makes PMR contents durable.
    pub fn persist_pmr(&self) {
        if let Some(pmr) = self.mem.pmr() {
            if let Err(e) = pmr.flush() {
                warn!(%e, "PMR flush failed");
            }
        }
    }

    fn write_cc(self: &Arc<Self>, regs: &mut Regs, value: u32) {
        let old = regs.cc;
        regs.cc = value;
        let (was_enabled, enable) = (old & cc::EN != 0, value & cc::EN != 0);
        if was_enabled && !enable {
            info!("controller disabled (CC.EN 1->0): reset");
            self.stop_queues(regs);
        } else if !was_enabled && enable {
            self.enable(regs);
        }
        let (old_shn, new_shn) = (cc::shn(old), cc::shn(value));
        if new_shn != 0 && old_shn == 0 {
            self.start_shutdown(regs);
        } else if new_shn == 0 && old_shn != 0 {
            regs.shst = csts::SHST_NORMAL;
        }
    }

    fn enable(self: &Arc<Self>, regs: &mut Regs) {
        let mps = cc::mps(regs.cc);
        let page_size = 4096u64 << mps.min(MPS_MAX);
        let problem = if cc::css(regs.cc) != 0 {
            Some("CC.CSS selects a command set this controller does not have")
        } else if mps > MPS_MAX {
            Some("CC.MPS is above CAP.MPSMAX")
        } else if regs.aqa & 0xfff == 0 || (regs.aqa >> 16) & 0xfff == 0 {
            Some("AQA asks for an admin queue of one entry")
        } else if regs.asq & (page_size - 1) != 0 || regs.acq & (page_size - 1) != 0 {
            Some("ASQ or ACQ is not page aligned")
        } else if regs.asq.checked_add(4096 * 64).is_none()
            || regs.acq.checked_add(4096 * 16).is_none()
        {
            Some("an admin queue wraps the address space")
        } else {
            None
        };
        if let Some(problem) = problem {
            self.set_fatal(&format!("cannot enable: {problem}"));
            return;
        }
        self.page_size.store(page_size, Ordering::Release);
        let sq_entries = (regs.aqa & 0xfff) + 1;
        let cq_entries = ((regs.aqa >> 16) & 0xfff) + 1;
        let cq = Arc::new(CompletionQueue::new(
            0,
            regs.acq,
            cq_entries,
            0,
            true,
            self.mem.cmb_offset(regs.acq).is_some(),
        ));
        let sq = Arc::new(SubmissionQueue::new(
            0,
            0,
            regs.asq,
            sq_entries,
            self.mem.cmb_offset(regs.asq).is_some(),
        ));
        {
            let mut table = crate::lock(&self.queues);
            table.cqs[0] = Some(Arc::clone(&cq));
            table.sqs[0] = Some(Arc::clone(&sq));
        }
        if let Err(e) = self.spawn_worker(Arc::clone(&sq), cq) {
            self.set_fatal(&format!("cannot start the admin queue worker: {e}"));
            return;
        }
        regs.ready = true;
        self.stats.enables.fetch_add(1, Ordering::Relaxed);
        info!(
            asq = format_args!("{:#x}", regs.asq),
            acq = format_args!("{:#x}", regs.acq),
            sq_entries,
            cq_entries,
            page_size,
            "controller enabled"
        );
    }

    /// Starts a worker thread for `sq`, completing into `cq`.
    pub fn spawn_worker(
        self: &Arc<Self>,
        sq: Arc<SubmissionQueue>,
        cq: Arc<CompletionQueue>,
    ) -> io::Result<()> {
        self.live_workers.fetch_add(1, Ordering::AcqRel);
        let shared = Arc::clone(self);
        let queue = Arc::clone(&sq);
        let spawned = thread::Builder::new()
            .name(format!("nvme-sq{}", sq.id))
            .spawn(move || worker::run(shared, queue, cq));
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
            if regs.shst != csts::SHST_COMPLETE {
                self.stats.unsafe_shutdowns.fetch_add(1, Ordering::Relaxed);
            }
        }
        regs.shst = csts::SHST_NORMAL;
        // The worker threads are detached: joining here could wait for a
        // DMA that needs this very thread to answer.
        drop(stopped);
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

    /// CC.SHN set: flush every namespace off the socket thread, then report
    /// shutdown complete.
    fn start_shutdown(self: &Arc<Self>, regs: &mut Regs) {
        regs.shst = csts::SHST_OCCURRING;
        info!("shutdown notification: flushing namespaces");
        let shared = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("nvme-shutdown".into())
            .spawn(move || {
                for ns in &shared.namespaces {
                    if let Err(e) = ns.backend().flush() {
                        warn!(nsid = ns.nsid(), %e, "flush at shutdown failed");
                    }
                }
                let mut regs = crate::lock(&shared.regs);
                if regs.shst == csts::SHST_OCCURRING {
                    regs.shst = csts::SHST_COMPLETE;
                    shared.stats.shutdowns.fetch_add(1, Ordering::Relaxed);
                    info!("shutdown complete");
                }
            });
        if let Err(e) = spawned {
            warn!(%e, "cannot start the shutdown thread; reporting complete without flushing");
            regs.shst = csts::SHST_COMPLETE;
        }
    }

    fn doorbell(&self, offset: u64, value: u32) {
        self.stats.doorbell_writes.fetch_add(1, Ordering::Relaxed);
        let index = (offset - reg::DOORBELLS) / 4;
        let is_cq = index % 2 == 1;
        let qid = index / 2;
        let table = crate::lock(&self.queues);
        let found = u16::try_from(qid).ok().and_then(|qid| {
            if is_cq {
                table.cq(qid).map(|_| qid)
            } else {
                table.sq(qid).map(|_| qid)
            }
        });
        let Some(qid) = found else {
            drop(table);
            self.invalid_doorbell(
                qid,
                is_cq,
                value,
                aen::ERROR_INVALID_DOORBELL_REGISTER,
                "no such queue",
            );
            return;
        };
        if is_cq {
            let Some(cq) = table.cq(qid) else { return };
            if value > 0xffff || !cq.head_is_valid(value) {
                drop(table);
                self.invalid_doorbell(
                    u64::from(qid),
                    true,
                    value,
                    aen::ERROR_INVALID_DOORBELL_VALUE,
                    "head beyond the queue or past posted entries",
                );
                return;
            }
            trace!(cqid = qid, head = value, "CQ head doorbell");
            cq.head.store(value, Ordering::Release);
            cq.space.notify();
        } else {
            let Some(sq) = table.sq(qid) else { return };
            if value >= sq.entries {
                drop(table);
                self.invalid_doorbell(
                    u64::from(qid),
                    false,
                    value,
                    aen::ERROR_INVALID_DOORBELL_VALUE,
                    "tail beyond the queue",
                );
                return;
            }
            trace!(sqid = qid, tail = value, "SQ tail doorbell");
            sq.tail.store(value, Ordering::Release);
            sq.wake.notify();
        }
    }

    /// A bad doorbell write is ignored and reported to the host as an
    /// Error asynchronous event (Invalid Doorbell Register / Write Value)
    /// with an Error Information log entry, delivered when an Asynchronous
    /// Event Request is (or becomes) outstanding.
    fn invalid_doorbell(&self, qid: u64, is_cq: bool, value: u32, info: u8, why: &str) {
        self.stats
            .invalid_doorbell_writes
            .fetch_add(1, Ordering::Relaxed);
        warn!(
            qid,
            kind = if is_cq { "CQ head" } else { "SQ tail" },
            value,
            "invalid doorbell write ignored: {why}"
        );
        if !crate::lock(&self.regs).ready {
            return;
        }
        {
            let mut admin = crate::lock(&self.admin);
            admin.error_log.record(ErrorEntry {
                sqid: u16::try_from(qid).unwrap_or(0xffff),
                cid: 0xffff,
                status: Status::INVALID_FIELD,
                nsid: 0,
                lba: 0,
            });
            admin.events.push(AsyncEvent::error(info));
        }
        if let Some(admin_sq) = crate::lock(&self.queues).sq(0) {
            admin_sq.wake.notify();
        }
    }

    /// Signals the completion queue's vector, if its interrupts are on.
    pub fn interrupt(&self, cq: &CompletionQueue) {
        if cq.irq_enabled {
            self.stats.interrupts.fetch_add(1, Ordering::Relaxed);
            self.irq.notify(cq.vector);
        }
    }

    /// Bookkeeping for a finished command: counters, error log, tracing.
    pub fn note_completion(&self, sqid: u16, cmd: &Command, c: &Completion, started: Instant) {
        let admin_queue = sqid == 0;
        if admin_queue {
            self.stats.admin_commands.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.io_commands.fetch_add(1, Ordering::Relaxed);
            self.busy_nanos
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        let name = if admin_queue {
            crate::spec::admin::name(cmd.opcode())
        } else {
            crate::spec::io::name(cmd.opcode())
        };
        if admin_queue {
            debug!(
                sqid,
                cid = cmd.cid(),
                opcode = format_args!("{:#04x}", cmd.opcode()),
                command = name,
                nsid = cmd.nsid(),
                cdw10 = format_args!("{:#x}", cmd.cdw10()),
                cdw11 = format_args!("{:#x}", cmd.cdw11()),
                status = %c.status,
                dw0 = format_args!("{:#x}", c.dw0),
                "admin command"
            );
        } else {
            debug!(
                sqid,
                cid = cmd.cid(),
                opcode = format_args!("{:#04x}", cmd.opcode()),
                command = name,
                nsid = cmd.nsid(),
                slba = cmd.slba(),
                nlb = cmd.nlb(),
                status = %c.status,
                "I/O command"
            );
        }
        if c.status.is_success() || c.status == Status::ABORT_REQUESTED {
            return;
        }
        self.stats.failed_commands.fetch_add(1, Ordering::Relaxed);
        if matches!(
            c.status,
            Status::WRITE_FAULT | Status::UNRECOVERED_READ_ERROR
        ) {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
        }
        let lba = if admin_queue { 0 } else { cmd.slba() };
        crate::lock(&self.admin).error_log.record(ErrorEntry {
            sqid,
            cid: cmd.cid(),
            status: c.status,
            nsid: cmd.nsid(),
            lba,
        });
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
            warning |= 1 << 1;
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

    fn snapshot(&self) -> StatsSnapshot {
        let (pmr_enabled, pmr_cba) = {
            let regs = crate::lock(&self.regs);
            (regs.pmrctl & pmr::CTL_EN != 0, regs.pmr_cba)
        };
        let (controller, cmb_bar, cba, cmse) = {
            let regs = crate::lock(&self.regs);
            (
                ControllerSnapshot {
                    serial: self.cfg.serial.clone(),
                    enabled: regs.cc & cc::EN != 0,
                    ready: self.csts(&regs) & csts::RDY != 0,
                    cc: regs.cc,
                    csts: self.csts(&regs),
                    shadow_doorbells: false,
                },
                regs.cmb_bar,
                regs.cba,
                regs.cba.is_some(),
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
        let c = self.stats.counters();
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

    /// Whether a namespace ID is acceptable for commands naming one
    /// namespace (not 0, not broadcast, attached).
    pub fn check_nsid(&self, nsid: u32) -> Result<&Arc<Namespace>, Status> {
        if nsid == NSID_ALL {
            return Err(Status::INVALID_NAMESPACE);
        }
        self.namespace(nsid).ok_or(Status::INVALID_NAMESPACE)
    }
}

/// The memory behind a BAR the device may not have (CMB or PMR switched off).
fn bar_memory<'a>(
    memory: Option<&'a Arc<dyn RegionMemory>>,
    offset: u64,
    len: usize,
    missing: &'static str,
) -> Result<&'a Arc<dyn RegionMemory>, DmaFault> {
    memory.ok_or_else(|| DmaFault::new(offset, len as u64, missing))
}
