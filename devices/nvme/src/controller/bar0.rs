//! BAR0 registers: what a read returns and what a write does (CC enable
//! and shutdown, the admin queue, the CMB and PMR controls).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use tracing::{debug, info, trace, warn};

use super::{NvmeController, CMB_BAR, MPS_MAX, PMR_BAR, PMR_READY_TIMEOUT};
use crate::identify::VERSION;
use crate::queues::{CompletionQueue, CqInterrupts, QueueMemory, SubmissionQueue};
use crate::registers::{
    reg, register_name, Aqa, Cc, CmbLoc, CmbMsc, CmbSts, CmbSz, Half, PmrCap, PmrCtl, PmrMsc,
    PmrSts, Reg, Shst, DOORBELLS,
};
use crate::state::{ControllerState, Regs};
use p2plab_kit::regs::{read_bytes, write_dwords};

/// Bytes of the admin queues at their largest (4096 entries), which must
/// not wrap the address space.
const ADMIN_SQ_SPAN: u64 = 4096 * 64;
const ADMIN_CQ_SPAN: u64 = 4096 * 16;

fn le_value(data: &[u8]) -> u64 {
    data.iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

impl NvmeController {
    /// A trapped read of BAR0 (registers and doorbells; 1 to 8 bytes).
    pub fn regs_read(&self, offset: u64, data: &mut [u8]) {
        let state = &self.state;
        state.stats.register_reads.fetch_add(1, Ordering::Relaxed);
        let end = offset.saturating_add(data.len() as u64);
        if offset < reg::PMRSTS + 4 && end > reg::PMRSTS {
            // PMRCAP.PMRWBM bit 1: this read returns once earlier writes to
            // the PMR are persistent. It blocks the vCPU like the flush in
            // QEMU's PMR does, and never waits for DMA.
            state.persist_pmr();
        }
        let regs = crate::lock(&state.regs);
        // The transport keeps accesses inside the BAR; no 0xff tail.
        read_bytes(offset, data, u64::MAX, |at| register(state, &regs, at));
        drop(regs);
        if offset < DOORBELLS && offset != reg::CSTS {
            // CSTS is polled in loops; everything else is worth a line.
            debug!(
                register = %register_name(offset),
                offset = format_args!("{offset:#x}"),
                len = data.len(),
                value = format_args!("{:#x}", le_value(data)),
                "register read"
            );
        } else {
            trace!(
                register = %register_name(offset),
                value = format_args!("{:#x}", le_value(data)),
                "register read"
            );
        }
    }

    /// A trapped write of BAR0. Registers take aligned 4- or 8-byte
    /// writes; anything else is ignored, as on real controllers.
    pub fn regs_write(&self, offset: u64, data: &[u8]) {
        self.state
            .stats
            .register_writes
            .fetch_add(1, Ordering::Relaxed);
        // Dword-aligned qwords are allowed (NVMe base 2.0, 3.1.4).
        let Some((mut dwords, count)) = write_dwords(offset, data, 4) else {
            p2plab_ratelimit::log_limited!(
                warn,
                offset = format_args!("{offset:#x}"),
                len = data.len(),
                "ignoring a register write that is not an aligned dword or qword"
            );
            return;
        };
        let dwords = &mut dwords[..count];
        // A 64-bit CMBMSC write is applied high dword first, like Linux's
        // hi_lo_writeq, so CMSE latches the new base address.
        if offset == reg::CMBMSC && dwords.len() == 2 {
            dwords.reverse();
        }
        for &mut (at, value) in dwords {
            if at >= DOORBELLS {
                self.doorbell(at, value);
            } else {
                self.write_register(at, value);
            }
        }
    }

    fn write_register(&self, offset: u64, value: u32) {
        debug!(
            register = %register_name(offset),
            offset = format_args!("{offset:#x}"),
            value = format_args!("{value:#x}"),
            "register write"
        );
        let state = &self.state;
        state.trace.record("reg-write", || {
            serde_json::json!({
                "name": register_name(offset),
                "offset": p2plab_trace::hex(offset),
                "value": p2plab_trace::hex(u64::from(value)),
            })
        });
        let has_cmb = state.cfg.cmb_size > 0;
        let has_pmr = state.cfg.pmr_size > 0;
        let mut regs = crate::lock(&state.regs);
        let Some((register, half)) = Reg::at(offset) else {
            debug!(
                offset = format_args!("{offset:#x}"),
                "write to a reserved offset ignored"
            );
            return;
        };
        match register {
            Reg::Intms => regs.intms |= value,
            Reg::Intmc => regs.intms &= !value,
            Reg::Cc => write_cc(state, &mut regs, Cc(value)),
            Reg::Aqa => regs.aqa = Aqa(value & Aqa::WRITABLE),
            Reg::Asq => regs.asq = half.replace(regs.asq, value),
            Reg::Acq => regs.acq = half.replace(regs.acq, value),
            Reg::Cmbmsc if has_cmb => {
                regs.cmbmsc = CmbMsc(half.replace(regs.cmbmsc.0, value));
                // The high half of CBA is latched by the next low-dword
                // write.
                if half == Half::Low {
                    latch_cmb(state, &mut regs);
                }
            }
            Reg::Pmrctl if has_pmr => {
                regs.pmrctl = PmrCtl::from_raw(value).known();
                if !regs.pmrctl.en() {
                    // A disabled PMR decodes nothing.
                    regs.pmrmsc = PmrMsc(regs.pmrmsc.0 & !PmrMsc::CMSE);
                    regs.pmr_cba = None;
                }
                let decoded = if regs.pmrctl.en() { regs.pmr_cba } else { None };
                state.mem.set_pmr_window(decoded);
                info!(enabled = regs.pmrctl.en(), "PMR control written");
            }
            Reg::Pmrmscl if has_pmr => {
                regs.pmrmsc = PmrMsc(Half::Low.replace(regs.pmrmsc.0, value));
                latch_pmr(state, &mut regs);
            }
            Reg::Pmrmscu if has_pmr => {
                regs.pmrmsc = PmrMsc(Half::High.replace(regs.pmrmsc.0, value));
            }
            Reg::Nssr => debug!("NVM subsystem reset is not supported; write ignored"),
            _ => debug!(
                register = register.name(),
                "write to a read-only or absent register ignored"
            ),
        }
    }
}

/// CMBLOC and CMBSZ: zero until the host sets CMBMSC.CRE.
fn cmb_regs(state: &ControllerState, regs: &Regs) -> (u32, u32) {
    if state.cfg.cmb_size == 0 || !regs.cmbmsc.cre() {
        return (0, 0);
    }
    let cmbloc = CmbLoc {
        bir: CMB_BAR,
        cdpmls: true,
        cdpcils: true,
        ofst: 0,
    };
    let cmbsz = CmbSz {
        sqs: true,
        cqs: true,
        lists: true,
        rds: true,
        wds: true,
        szu: CmbSz::SZU_1MIB,
        sz: (state.cfg.cmb_size / CmbSz::UNIT_1MIB) as u32,
    };
    (cmbloc.value(), cmbsz.value())
}

/// The value of the dword at `offset` (dword aligned); reserved offsets,
/// doorbells and absent registers read 0.
fn register(state: &ControllerState, regs: &Regs, offset: u64) -> u32 {
    let has_cmb = state.cfg.cmb_size > 0;
    let has_pmr = state.cfg.pmr_size > 0;
    let Some((register, half)) = Reg::at(offset) else {
        return 0;
    };
    let value: u64 = match register {
        Reg::Cap => state.cap,
        Reg::Vs => VERSION.into(),
        Reg::Intms | Reg::Intmc => regs.intms.into(),
        Reg::Cc => regs.cc.0.into(),
        Reg::Csts => state.csts(regs).raw().into(),
        Reg::Aqa => regs.aqa.0.into(),
        Reg::Asq => regs.asq,
        Reg::Acq => regs.acq,
        Reg::Cmbloc => cmb_regs(state, regs).0.into(),
        Reg::Cmbsz => cmb_regs(state, regs).1.into(),
        Reg::Cmbmsc if has_cmb => regs.cmbmsc.0,
        Reg::Cmbsts => regs.cmbsts.raw().into(),
        Reg::Pmrcap if has_pmr => PmrCap {
            rds: true,
            wds: true,
            bir: PMR_BAR,
            pmrwbm: PmrCap::PMRWBM_PMRSTS_READ,
            pmrto: PMR_READY_TIMEOUT,
            cmss: true,
        }
        .value()
        .into(),
        Reg::Pmrctl if has_pmr => regs.pmrctl.raw().into(),
        Reg::Pmrsts if has_pmr => regs
            .pmrsts
            .with(PmrSts::NRDY, !regs.pmrctl.en())
            .raw()
            .into(),
        Reg::Pmrmscl if has_pmr => Half::Low.of(regs.pmrmsc.0).into(),
        Reg::Pmrmscu if has_pmr => Half::High.of(regs.pmrmsc.0).into(),
        _ => 0,
    };
    half.of(value)
}

/// CMBMSC low dword written: CRE exposes CMBLOC/CMBSZ, CMSE latches CBA
/// as the bus address the controller decodes as its CMB.
fn latch_cmb(state: &ControllerState, regs: &mut Regs) {
    regs.cba = None;
    regs.cmbsts = regs.cmbsts.without(CmbSts::CBAI);
    if regs.cmbmsc.cre() && regs.cmbmsc.cmse() {
        let cba = regs.cmbmsc.cba();
        if cba.checked_add(state.cfg.cmb_size).is_none() {
            p2plab_ratelimit::log_limited!(
                warn,
                cba = format_args!("{cba:#x}"),
                "CMB base address invalid"
            );
            regs.cmbsts |= CmbSts::CBAI;
        } else {
            regs.cba = Some(cba);
            if regs.cmb_bar.is_some_and(|bar| bar != cba) {
                p2plab_ratelimit::log_limited!(warn,
                    cba = format_args!("{cba:#x}"),
                    bar = ?regs.cmb_bar,
                    "CMBMSC.CBA is not where the CMB BAR is"
                );
            }
        }
    }
    state.mem.set_window(regs.cba);
    info!(
        cre = regs.cmbmsc.cre(),
        cmse = regs.cba.is_some(),
        cba = ?regs.cba.map(|a| format!("{a:#x}")),
        "CMB controls written"
    );
}

/// PMRMSCL written: CMSE latches the PMR's controller base address.
fn latch_pmr(state: &ControllerState, regs: &mut Regs) {
    regs.pmr_cba = None;
    regs.pmrsts = regs.pmrsts.without(PmrSts::CBAI);
    if regs.pmrmsc.cmse() {
        let cba = regs.pmrmsc.cba();
        if cba.checked_add(state.cfg.pmr_size).is_none() {
            p2plab_ratelimit::log_limited!(
                warn,
                cba = format_args!("{cba:#x}"),
                "PMR base address invalid"
            );
            regs.pmrsts |= PmrSts::CBAI;
        } else {
            regs.pmr_cba = Some(cba);
        }
    }
    let decoded = if regs.pmrctl.en() { regs.pmr_cba } else { None };
    state.mem.set_pmr_window(decoded);
    info!(cba = ?regs.pmr_cba.map(|a| format!("{a:#x}")), "PMR controls written");
}

fn write_cc(state: &Arc<ControllerState>, regs: &mut Regs, value: Cc) {
    let old = regs.cc;
    regs.cc = value;
    if old.en() && !value.en() {
        info!("controller disabled (CC.EN 1->0): reset");
        state.stop_queues(regs);
    } else if !old.en() && value.en() {
        enable(state, regs);
    }
    if value.shn() != 0 && old.shn() == 0 {
        start_shutdown(state, regs);
    } else if value.shn() == 0 && old.shn() != 0 {
        regs.shst = Shst::Normal;
    }
}

/// CC.EN 0->1: check what the host programmed, then start the admin
/// queue's worker; CSTS.CFS if anything is wrong.
fn enable(state: &Arc<ControllerState>, regs: &mut Regs) {
    let mps = regs.cc.mps();
    let page_size = 4096u64 << mps.min(MPS_MAX);
    let problem = if regs.cc.css() != 0 {
        Some("CC.CSS selects a command set this controller does not have")
    } else if mps > MPS_MAX {
        Some("CC.MPS is above CAP.MPSMAX")
    } else if regs.aqa.asqs() == 0 || regs.aqa.acqs() == 0 {
        Some("AQA asks for an admin queue of one entry")
    } else if regs.asq & (page_size - 1) != 0 || regs.acq & (page_size - 1) != 0 {
        Some("ASQ or ACQ is not page aligned")
    } else if regs.asq.checked_add(ADMIN_SQ_SPAN).is_none()
        || regs.acq.checked_add(ADMIN_CQ_SPAN).is_none()
    {
        Some("an admin queue wraps the address space")
    } else {
        None
    };
    if let Some(problem) = problem {
        state.set_fatal(&format!("cannot enable: {problem}"));
        return;
    }
    state.page_size.store(page_size, Ordering::Release);
    let sq_entries = regs.aqa.asqs() + 1;
    let cq_entries = regs.aqa.acqs() + 1;
    let memory = |base: u64| {
        if state.mem.cmb_offset(base).is_some() {
            QueueMemory::Cmb
        } else {
            QueueMemory::Host
        }
    };
    let cq = state.completion_queue(CompletionQueue::new(
        0,
        regs.acq,
        cq_entries,
        0,
        CqInterrupts::Enabled,
        memory(regs.acq),
    ));
    let sq = Arc::new(SubmissionQueue::new(
        0,
        0,
        regs.asq,
        sq_entries,
        memory(regs.asq),
    ));
    {
        let mut table = crate::lock(&state.queues);
        table.cqs[0] = Some(Arc::clone(&cq));
        table.sqs[0] = Some(Arc::clone(&sq));
    }
    if let Err(e) = state.spawn_worker(Arc::clone(&sq), cq) {
        state.set_fatal(&format!("cannot start the admin queue worker: {e}"));
        return;
    }
    regs.ready = true;
    state.stats.enables.fetch_add(1, Ordering::Relaxed);
    info!(
        asq = format_args!("{:#x}", regs.asq),
        acq = format_args!("{:#x}", regs.acq),
        sq_entries,
        cq_entries,
        page_size,
        "controller enabled"
    );
}

/// CC.SHN set: flush every namespace off the socket thread, then report
/// shutdown complete.
fn start_shutdown(state: &Arc<ControllerState>, regs: &mut Regs) {
    regs.shst = Shst::Occurring;
    info!("shutdown notification: flushing namespaces");
    let flushing = Arc::clone(state);
    let spawned = thread::Builder::new()
        .name("nvme-shutdown".into())
        .spawn(move || {
            for ns in &flushing.namespaces {
                if let Err(e) = ns.flush() {
                    warn!(nsid = ns.nsid(), ?e, "flush at shutdown failed");
                }
            }
            let mut regs = crate::lock(&flushing.regs);
            if regs.shst == Shst::Occurring {
                regs.shst = Shst::Complete;
                flushing.stats.shutdowns.fetch_add(1, Ordering::Relaxed);
                info!("shutdown complete");
            }
        });
    match spawned {
        Ok(handle) => state.track_shutdown_flush(handle),
        Err(e) => {
            warn!(%e, "cannot start the shutdown thread; reporting complete without flushing");
            regs.shst = Shst::Complete;
        }
    }
}
