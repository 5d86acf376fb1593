//! The management thread: admin commands, AENQ events and the reset
//! handshake's end.
//!
//! Commands run one at a time in submission order. Each is fetched from
//! the admin SQ (its phase checked), parsed, run, and answered with one
//! completion, whatever happened: the driver stops its admin queue for
//! good when a command goes unanswered. Malformed and unknown commands get
//! the statuses the driver maps to errnos (BAD_OPCODE, UNSUPPORTED_OPCODE,
//! MALFORMED_REQUEST, ILLEGAL_PARAMETER); nothing a driver writes makes the
//! device panic.

use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_dma::GuestMemory;
use p2plab_kit::Epoch;

use super::reliability::Pending;
use super::send::{cq_db_offset, sq_db_offset};
use super::state::{
    lock, AenqEvent, Cq, CqShared, Eq, EqShared, MgmtJob, Mr, Qp, ResetPhase, Ring, State,
};
use super::{Device, Progress};
use crate::admin::{
    acq_entry, aenq_entry, modify_mask, mr_access, AdminCommand, AdminEntry, CreateCq, CreateEq,
    CreateQp, ModifyQp, RegMr, Response, ACQ_ENTRY_SIZE, ACQ_FLAGS_AT, AENQ_ENTRY_SIZE,
    AENQ_FLAGS_AT, SQ_ENTRY_SIZE,
};
use crate::attrs::{FEATURE_DATA_LEN, RX_DESC_SIZE, TX_WQE_SIZE};
use crate::bytes::put_u64;
use crate::defs::{
    admin_opcode_name, AdminStatus, AenqGroup, FeatureId, IoOp, IoQueue, IoStatus, QpState, QpType,
    StatsType, AENQ_GROUPS_SUPPORTED,
};
use crate::io::Cqe;
use crate::pbl::{pages_spanned, PageList, PblError};
use crate::regs::{AQ_CAPS_ENTRY_SIZE_SHIFT, CQ_CAPS_ENTRY_SIZE_SHIFT, CQ_CAPS_VECTOR_SHIFT};
use crate::stats::Stats;

/// Longest the thread sleeps without a reason to wake.
const IDLE: Duration = Duration::from_millis(100);

/// What the thread does next.
enum Step {
    Stop,
    Drain,
    Job(MgmtJob),
    Command { at: u64, index: u16, epoch: Epoch },
    Aenq(AenqEvent),
    KeepAlive,
}

/// The management thread.
pub(crate) fn management_thread(device: &Device) {
    let mut management = Management::new(device);
    while management.step(device, true) != Progress::Stop {}
}

/// The management engine's state between steps.
pub(crate) struct Management {
    next_keep_alive: Option<Instant>,
}

impl Management {
    pub(crate) fn new(device: &Device) -> Self {
        Self {
            next_keep_alive: device
                .options
                .keep_alive
                .map(|every| Instant::now() + every),
        }
    }

    /// One step: a reset to finish, a job, an admin command, an AENQ
    /// event or a keep-alive. With `wait` it waits for one (the thread);
    /// without, it returns [`Progress::Idle`] instead (the engines on the
    /// caller's thread).
    pub(crate) fn step(&mut self, device: &Device, wait: bool) -> Progress {
        let step = {
            let mut state = device.lock();
            loop {
                if state.shutdown {
                    break Step::Stop;
                }
                if state.regs.reset == ResetPhase::Draining {
                    break Step::Drain;
                }
                if let Some(job) = state.mgmt_jobs.pop_front() {
                    break Step::Job(job);
                }
                if let Some(step) = next_command(device, &mut state) {
                    break step;
                }
                if let Some(event) = state.aenq_pending.front().copied() {
                    if aenq_room(&state) {
                        state.aenq_pending.pop_front();
                        break Step::Aenq(event);
                    }
                }
                let now = Instant::now();
                if let (Some(due), Some(every)) = (self.next_keep_alive, device.options.keep_alive)
                {
                    if now >= due {
                        self.next_keep_alive = Some(now + every);
                        break Step::KeepAlive;
                    }
                }
                if !wait {
                    return Progress::Idle;
                }
                let wait = self
                    .next_keep_alive
                    .map_or(IDLE, |due| due.saturating_duration_since(now).min(IDLE));
                state = device
                    .mgmt_wake
                    .wait_timeout(state, wait.max(Duration::from_millis(1)))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        match step {
            Step::Stop => return Progress::Stop,
            Step::Drain => finish_reset(device),
            Step::Job(job) => run_job(device, job),
            Step::Command { at, index, epoch } => run_command(device, at, index, epoch),
            Step::Aenq(event) => {
                post_aenq(device, event);
            }
            Step::KeepAlive => {
                let ready = {
                    let state = device.lock();
                    aenq_ring(&state).is_some()
                        && state.admin.aenq_enabled & 1 << AenqGroup::KeepAlive.code() != 0
                };
                if ready {
                    let event = AenqEvent {
                        group: AenqGroup::KeepAlive.code(),
                        syndrome: 0,
                    };
                    if post_aenq(device, event) {
                        Stats::add(&device.stats.keep_alives, 1);
                    }
                }
            }
        }
        Progress::Worked
    }
}

/// Ends a reset the driver finished: waits until no DMA of work from
/// before it runs, then reports the reset done.
fn finish_reset(device: &Device) {
    if let Err(e) = device.gate.quiesce() {
        tracing::error!(error = %e, "reset: DMA did not drain; reporting the reset done anyway");
    }
    let mut state = device.lock();
    if state.regs.reset == ResetPhase::Draining {
        state.regs.reset = ResetPhase::Idle;
        state.regs.reset_finished = true;
    }
    tracing::info!("device reset done");
}

/// The admin SQ entry to run next, if the queue is set up and has one.
fn next_command(device: &Device, state: &mut State) -> Option<Step> {
    if state.admin.sq_head == state.admin.sq_tail || !state.bus_master {
        return None;
    }
    let ring = Ring::from_caps(
        state.regs.aq_base,
        state.regs.aq_caps,
        AQ_CAPS_ENTRY_SIZE_SHIFT,
        0xffff,
        SQ_ENTRY_SIZE as u32,
    )?;
    let posted = state.admin.sq_tail.wrapping_sub(state.admin.sq_head);
    if u32::from(posted) > ring.depth {
        // A producer count no driver writes: drop back to what fits.
        p2plab_ratelimit::log_limited!(debug, posted, "admin doorbell beyond the queue depth");
        state.admin.sq_head = state.admin.sq_tail.wrapping_sub(ring.depth as u16);
    }
    let index = state.admin.sq_head;
    state.admin.sq_head = index.wrapping_add(1);
    Some(Step::Command {
        at: ring.entry(u32::from(index), SQ_ENTRY_SIZE as u64),
        index,
        epoch: device.gate.epoch(),
    })
}

fn acq_ring(state: &State) -> Option<Ring> {
    Ring::from_caps(
        state.regs.acq_base,
        state.regs.acq_caps,
        CQ_CAPS_ENTRY_SIZE_SHIFT,
        0xff,
        ACQ_ENTRY_SIZE as u32,
    )
}

fn aenq_ring(state: &State) -> Option<Ring> {
    Ring::from_caps(
        state.regs.aenq_base,
        state.regs.aenq_caps,
        CQ_CAPS_ENTRY_SIZE_SHIFT,
        0xff,
        AENQ_ENTRY_SIZE as u32,
    )
}

fn aenq_room(state: &State) -> bool {
    aenq_ring(state)
        .is_some_and(|ring| state.admin.aenq_count.wrapping_sub(state.regs.aenq_cons) < ring.depth)
}

/// Whether management interrupts are unmasked, and their vector.
fn mgmt_vector(caps: u32, state: &State) -> Option<u16> {
    (state.regs.intr_mask & crate::regs::IntrMask::EN.raw() == 0)
        .then_some((caps >> CQ_CAPS_VECTOR_SHIFT) as u16)
}

fn run_job(device: &Device, job: MgmtJob) {
    match job {
        MgmtJob::CqEvent { cq, generation } => {
            let target = {
                let state = device.lock();
                state
                    .objects
                    .cqs
                    .get(usize::from(cq))
                    .filter(|c| c.generation == generation)
                    .and_then(|c| c.eq)
            };
            if let Some(eqn) = target {
                device.post_eqe(eqn, cq, device.gate.epoch());
            }
        }
        MgmtJob::Readless {
            addr,
            response,
            epoch,
        } => {
            let memory = device.gate.bound(epoch);
            let written = memory
                .write(addr + 2, &response[2..])
                .and_then(|()| memory.write(addr, &response[..2]));
            if let Err(fault) = written {
                device.dma_failed("late readless response", &fault);
            }
        }
    }
}

/// Posts an AENQ event (entry first, phase byte last, then the vector);
/// whether it was posted.
fn post_aenq(device: &Device, event: AenqEvent) -> bool {
    let (ring, count, epoch, vector) = {
        let mut state = device.lock();
        let Some(ring) = aenq_ring(&state) else {
            Stats::add(&device.stats.aenq_dropped, 1);
            return false;
        };
        if state.admin.aenq_enabled & 1 << event.group == 0 || !aenq_room(&state) {
            Stats::add(&device.stats.aenq_dropped, 1);
            return false;
        }
        let count = state.admin.aenq_count;
        state.admin.aenq_count = count.wrapping_add(1);
        (
            ring,
            count,
            device.gate.epoch(),
            mgmt_vector(state.regs.aenq_caps, &state),
        )
    };
    let timestamp = device.started.elapsed().as_nanos() as u64;
    let entry = aenq_entry(
        event.group,
        event.syndrome,
        ring.phase(count),
        timestamp,
        &[],
    );
    let addr = ring.entry(count, AENQ_ENTRY_SIZE as u64);
    let memory = device.gate.bound(epoch);
    let written = memory
        .write(addr, &entry[..AENQ_FLAGS_AT])
        .and_then(|()| memory.write(addr + AENQ_FLAGS_AT as u64 + 1, &entry[AENQ_FLAGS_AT + 1..]))
        .and_then(|()| {
            memory.write(
                addr + AENQ_FLAGS_AT as u64,
                &entry[AENQ_FLAGS_AT..=AENQ_FLAGS_AT],
            )
        });
    if let Err(fault) = written {
        device.dma_failed("AENQ write", &fault);
        return false;
    }
    Stats::add(&device.stats.aenq_events, 1);
    device.trace.record("aenq", || {
        serde_json::json!({
            "name": AenqGroup::from_code(event.group).map_or("UNKNOWN", |g| g.name()),
            "group": event.group,
            "syndrome": event.syndrome,
        })
    });
    if let Some(vector) = vector {
        device.interrupt(vector);
    }
    true
}

/// Queues an AENQ event for the management thread.
pub(crate) fn queue_aenq(device: &Device, group: AenqGroup, syndrome: u16) {
    device.lock().aenq_pending.push_back(AenqEvent {
        group: group.code(),
        syndrome,
    });
    device.mgmt_wake.notify_all();
}

/// Fetches, runs and completes admin SQ entry `index`.
fn run_command(device: &Device, at: u64, index: u16, epoch: Epoch) {
    let started = Instant::now();
    let memory = device.gate.bound(epoch);
    let mut raw = [0u8; SQ_ENTRY_SIZE];
    if let Err(fault) = memory.read(at, &mut raw) {
        // Without the entry there is no command ID to answer.
        device.dma_failed("admin SQ read", &fault);
        return;
    }
    let entry = AdminEntry::parse(&raw);
    let depth = {
        let state = device.lock();
        Ring::from_caps(
            state.regs.aq_base,
            state.regs.aq_caps,
            AQ_CAPS_ENTRY_SIZE_SHIFT,
            0xffff,
            SQ_ENTRY_SIZE as u32,
        )
        .map_or(1, |r| r.depth)
    };
    let expected_phase = (u32::from(index) / depth).is_multiple_of(2);
    let injected = {
        let mut faults = device.faults();
        if faults.is_idle() {
            None
        } else {
            faults
                .admin_error(entry.opcode)
                .and_then(AdminStatus::from_code)
        }
    };
    let (status, response, fields) = if let Some(status) = injected {
        (status, Response::default(), serde_json::json!({}))
    } else if entry.phase() != expected_phase {
        (
            AdminStatus::MalformedRequest,
            Response::default(),
            serde_json::json!({"why": "phase"}),
        )
    } else {
        match AdminCommand::parse(&entry) {
            Ok(command) => {
                let fields = trace_fields(&command);
                let (status, response) = execute(device, &command, epoch);
                (status, response, fields)
            }
            Err(status) => (status, Response::default(), serde_json::json!({})),
        }
    };
    let stats = &device.stats;
    Stats::add(&stats.admin_commands, 1);
    if status != AdminStatus::Success {
        Stats::add(&stats.admin_errors, 1);
    }
    match status {
        AdminStatus::BadOpcode => Stats::add(&stats.admin_bad_opcodes, 1),
        AdminStatus::UnsupportedOpcode => Stats::add(&stats.admin_unsupported, 1),
        _ => {}
    }
    device.trace.record_span("admin", started, || {
        let mut event = serde_json::json!({
            "name": admin_opcode_name(entry.opcode),
            "opcode": entry.opcode,
            "command_id": entry.command_id,
            "status": status.name(),
            "injected": injected.is_some(),
        });
        if let (Some(event), Some(fields)) = (event.as_object_mut(), fields.as_object()) {
            event.extend(fields.clone());
        }
        event
    });
    if status != AdminStatus::Success {
        p2plab_ratelimit::log_limited!(
            debug,
            opcode = %admin_opcode_name(entry.opcode),
            status = status.name(),
            "admin command failed"
        );
    }
    complete(device, entry.command_id, status, &response, epoch);
}

/// Writes a command's completion (phase byte last) and raises the
/// management vector.
fn complete(
    device: &Device,
    command_id: u16,
    status: AdminStatus,
    response: &Response,
    epoch: Epoch,
) {
    let (ring, count, vector) = {
        let mut state = device.lock();
        let Some(ring) = acq_ring(&state) else {
            p2plab_ratelimit::log_limited!(debug, "admin completion without a completion queue");
            return;
        };
        if !device.gate.is_current(epoch) {
            return;
        }
        let count = state.admin.cq_count;
        state.admin.cq_count = count.wrapping_add(1);
        (ring, count, mgmt_vector(state.regs.acq_caps, &state))
    };
    let entry = acq_entry(command_id, status, ring.phase(count), response);
    let addr = ring.entry(count, ACQ_ENTRY_SIZE as u64);
    let memory = device.gate.bound(epoch);
    let flags = ACQ_FLAGS_AT as u64;
    let written = memory
        .write(addr, &entry[..ACQ_FLAGS_AT])
        .and_then(|()| memory.write(addr + flags + 1, &entry[ACQ_FLAGS_AT + 1..]))
        .and_then(|()| {
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            memory.write(addr + flags, &entry[ACQ_FLAGS_AT..=ACQ_FLAGS_AT])
        });
    if let Err(fault) = written {
        device.dma_failed("admin completion write", &fault);
        return;
    }
    if let Some(vector) = vector {
        device.interrupt(vector);
    }
}

/// The fields of a command for the trace, named as the driver's structs
/// name them.
fn trace_fields(command: &AdminCommand) -> serde_json::Value {
    use serde_json::json;
    let hex = p2plab_trace::hex;
    match command {
        AdminCommand::CreateQp(c) => json!({
            "pd": c.pd, "qp_type": QpType::from_code(c.qp_type).map_or("?", |t| t.name()),
            "rq_base_addr": hex(c.rq_base_addr), "send_cq_idx": c.send_cq_idx, "recv_cq_idx": c.recv_cq_idx,
            "send_queue_ring_size": c.sq_ring_size, "send_queue_depth": c.sq_depth,
            "recv_queue_ring_size": c.rq_ring_size, "recv_queue_depth": c.rq_depth, "uar": c.uar,
        }),
        AdminCommand::ModifyQp(m) => json!({
            "qp_handle": m.handle, "modify_mask": hex(u64::from(m.mask)),
            "qp_state": QpState::from_code(m.state).map_or("?", |s| s.name()),
            "qkey": hex(u64::from(m.qkey)), "sq_psn": m.sq_psn, "rnr_retry": m.rnr_retry,
        }),
        AdminCommand::QueryQp { handle } | AdminCommand::DestroyQp { handle } => {
            json!({"qp_handle": handle})
        }
        AdminCommand::CreateAh { gid, pd } => {
            json!({"dest_addr": crate::attrs::format_gid(gid), "pd": pd})
        }
        AdminCommand::DestroyAh { ah, pd } => json!({"ah": ah, "pd": pd}),
        AdminCommand::RegMr(r) => json!({
            "pd": r.pd, "mr_length": r.mr_length, "phys_page_size_shift": r.page_shift,
            "permissions": r.permissions, "page_num": r.page_num, "iova": hex(r.iova),
            "pbl": match r.pbl {
                crate::admin::PblSource::Inline(_) => "inline",
                crate::admin::PblSource::Direct(_) => "direct",
                crate::admin::PblSource::Chained(_) => "indirect",
            },
        }),
        AdminCommand::DeregMr { lkey } => json!({"l_key": lkey}),
        AdminCommand::CreateCq(c) => json!({
            "sub_cq_depth": c.sub_cq_depth, "cq_entry_size_words": c.entry_words, "num_sub_cqs": c.num_sub_cqs,
            "interrupt_mode_enabled": c.interrupt_mode, "eqn": c.eqn, "set_src_addr": c.set_src_addr,
            "cq_ba": hex(c.cq_ba), "uar": c.uar,
        }),
        AdminCommand::DestroyCq { cq_idx } => json!({"cq_idx": cq_idx}),
        AdminCommand::GetFeature { feature } => {
            json!({"feature_id": FeatureId::from_code(*feature).map_or("?", |f| f.name())})
        }
        AdminCommand::SetAenqConfig { enabled_groups } => {
            json!({"feature_id": "AENQ_CONFIG", "enabled_groups": hex(u64::from(*enabled_groups))})
        }
        AdminCommand::SetHostInfo { buffer } => {
            json!({"feature_id": "HOST_INFO", "length": buffer.length})
        }
        AdminCommand::GetStats {
            stats_type, scope, ..
        } => {
            json!({"type": StatsType::from_code(*stats_type).map_or("?", |t| t.name()), "scope": scope})
        }
        AdminCommand::DeallocPd { pd } => json!({"pd": pd}),
        AdminCommand::DeallocUar { uar } => json!({"uar": uar}),
        AdminCommand::CreateEq(e) => json!({
            "depth": e.depth, "msix_vec": e.msix_vec, "entry_size_words": e.entry_words,
            "ba": hex(e.ba), "event_bitmask": e.event_bitmask,
        }),
        AdminCommand::DestroyEq { eqn } => json!({"eqn": eqn}),
        AdminCommand::AllocPd | AdminCommand::AllocUar => json!({}),
    }
}

type Outcome = (AdminStatus, Response);

fn ok(response: Response) -> Outcome {
    (AdminStatus::Success, response)
}

fn fail(status: AdminStatus) -> Outcome {
    (status, Response::default())
}

/// Runs one parsed command.
fn execute(device: &Device, command: &AdminCommand, epoch: Epoch) -> Outcome {
    match command {
        AdminCommand::GetFeature { feature } => get_feature(device, *feature),
        AdminCommand::SetAenqConfig { enabled_groups } => {
            device.lock().admin.aenq_enabled = enabled_groups & AENQ_GROUPS_SUPPORTED;
            device.mgmt_wake.notify_all();
            ok(Response::default())
        }
        AdminCommand::SetHostInfo { buffer } => {
            set_host_info(device, buffer.addr, buffer.length, epoch)
        }
        AdminCommand::AllocUar => alloc(&mut device.lock().objects.uars, super::state::Uar)
            .map_or_else(
                fail,
                |(slot, _)| ok(Response::default().u16(8, slot as u16)),
            ),
        AdminCommand::DeallocUar { uar } => dealloc_uar(device, *uar),
        AdminCommand::AllocPd => alloc(&mut device.lock().objects.pds, super::state::Pd)
            .map_or_else(fail, |(slot, _)| {
                ok(Response::default().u16(8, slot as u16 + 1))
            }),
        AdminCommand::DeallocPd { pd } => dealloc_pd(device, *pd),
        AdminCommand::CreateAh { gid, pd } => {
            let mut state = device.lock();
            if !state.objects.pd_exists(*pd) || *gid == [0; 16] {
                return fail(AdminStatus::IllegalParameter);
            }
            alloc(
                &mut state.objects.ahs,
                super::state::Ah { pd: *pd, gid: *gid },
            )
            .map_or_else(
                fail,
                |(slot, _)| ok(Response::default().u16(8, slot as u16)),
            )
        }
        AdminCommand::DestroyAh { ah, pd } => {
            let _datapath = device.datapath.write();
            let mut state = device.lock();
            match state.objects.ahs.get(usize::from(*ah)) {
                Some(a) if a.pd == *pd => {
                    state.objects.ahs.take(usize::from(*ah));
                    ok(Response::default())
                }
                _ => fail(AdminStatus::IllegalParameter),
            }
        }
        AdminCommand::RegMr(r) => reg_mr(device, r, epoch),
        AdminCommand::DeregMr { lkey } => {
            let _datapath = device.datapath.write();
            let mut state = device.lock();
            let slot = match state.objects.mr_by_key(*lkey, device.key_bits) {
                Some(mr) => (mr.key & ((1 << device.key_bits) - 1)) as usize - 1,
                None => return fail(AdminStatus::IllegalParameter),
            };
            state.objects.mrs.take(slot);
            ok(Response::default())
        }
        AdminCommand::CreateCq(c) => create_cq(device, c),
        AdminCommand::DestroyCq { cq_idx } => destroy_cq(device, *cq_idx),
        AdminCommand::CreateQp(c) => create_qp(device, c),
        AdminCommand::ModifyQp(m) => modify_qp(device, m),
        AdminCommand::QueryQp { handle } => {
            let state = device.lock();
            match qp_by_handle(device, &state, *handle) {
                Some((_, qp)) => ok(Response::default()
                    .u32(8, qp.state.code())
                    .u32(12, qp.qkey)
                    .u32(16, qp.sq_psn)
                    .u8(20, 0)
                    .u8(21, qp.rnr_retry)),
                None => fail(AdminStatus::IllegalParameter),
            }
        }
        AdminCommand::DestroyQp { handle } => destroy_qp(device, *handle),
        AdminCommand::CreateEq(e) => create_eq(device, e),
        AdminCommand::DestroyEq { eqn } => {
            let mut state = device.lock();
            if state.objects.eqs.get(usize::from(*eqn)).is_none() {
                return fail(AdminStatus::IllegalParameter);
            }
            if state.objects.cqs.iter().any(|(_, cq)| cq.eq == Some(*eqn)) {
                return fail(AdminStatus::ResourceBusy);
            }
            state.objects.eqs.take(usize::from(*eqn));
            ok(Response::default())
        }
        AdminCommand::GetStats {
            stats_type, scope, ..
        } => get_stats(device, *stats_type, *scope),
    }
}

/// Allocates a slot of `slots` for `item`.
fn alloc<T>(slots: &mut super::state::Slots<T>, item: T) -> Result<(usize, u16), AdminStatus> {
    let (slot, generation) = slots
        .free_slot()
        .ok_or(AdminStatus::ResourceAllocationFailure)?;
    slots.fill(slot, generation, item);
    Ok((slot, generation))
}

fn get_feature(device: &Device, feature: u8) -> Outcome {
    let Some(feature) = FeatureId::from_code(feature) else {
        return fail(AdminStatus::UnsupportedOpcode);
    };
    let enabled = device.lock().admin.aenq_enabled;
    match device.attrs.feature_data(feature, enabled) {
        Some(data) => ok(Response::default().bytes(8, &data[..FEATURE_DATA_LEN])),
        None => fail(AdminStatus::UnsupportedOpcode),
    }
}

/// Bytes of `struct efa_admin_host_info`.
const HOST_INFO_SIZE: usize = 180;

fn set_host_info(device: &Device, addr: u64, length: u32, epoch: Epoch) -> Outcome {
    if (length as usize) < HOST_INFO_SIZE {
        return fail(AdminStatus::MalformedRequest);
    }
    let mut info = [0u8; HOST_INFO_SIZE];
    if let Err(fault) = device.gate.bound(epoch).read(addr, &mut info) {
        device.dma_failed("host info read", &fault);
        return fail(AdminStatus::MalformedRequest);
    }
    let text = |bytes: &[u8]| {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    let kernel = text(&info[132..164]);
    let os = text(&info[..128]);
    tracing::info!(kernel = %kernel, os = %os, "host info from the driver");
    device.lock().host_kernel = Some(kernel);
    ok(Response::default())
}

fn dealloc_uar(device: &Device, uar: u16) -> Outcome {
    let mut state = device.lock();
    let slot = usize::from(uar);
    if state.objects.uars.get(slot).is_none() {
        return fail(AdminStatus::IllegalParameter);
    }
    let used = state.objects.qps.iter().any(|(_, qp)| qp.uar == uar)
        || state.objects.cqs.iter().any(|(_, cq)| cq.uar == uar);
    if used {
        return fail(AdminStatus::ResourceBusy);
    }
    state.objects.uars.take(slot);
    ok(Response::default())
}

fn dealloc_pd(device: &Device, pd: u16) -> Outcome {
    let mut state = device.lock();
    if !state.objects.pd_exists(pd) {
        return fail(AdminStatus::IllegalParameter);
    }
    let used = state.objects.qps.iter().any(|(_, qp)| qp.pd == pd)
        || state.objects.mrs.iter().any(|(_, mr)| mr.pd == pd)
        || state.objects.ahs.iter().any(|(_, ah)| ah.pd == pd);
    if used {
        return fail(AdminStatus::ResourceBusy);
    }
    state.objects.pds.take(usize::from(pd) - 1);
    ok(Response::default())
}

fn reg_mr(device: &Device, r: &RegMr, epoch: Epoch) -> Outcome {
    let attrs = &device.attrs;
    if !device.lock().objects.pd_exists(r.pd) {
        return fail(AdminStatus::IllegalParameter);
    }
    let page_size_ok = r.page_shift >= 12
        && r.page_shift < 64
        && attrs.page_size_cap & (1u64 << r.page_shift) != 0;
    // The driver leaves page_num 0 (efa_admin_cmds_defs.h: "redundant,
    // could be calculated"): the pages the IOVA range spans are the
    // count. A page_num that is set must agree with them.
    let spanned = pages_spanned(r.iova, r.mr_length, r.page_shift);
    let Some(page_num) = spanned.and_then(|n| u32::try_from(n).ok()) else {
        return fail(AdminStatus::IllegalParameter);
    };
    if r.phys_mode
        || r.permissions & !mr_access::ALL != 0
        || !page_size_ok
        || (r.page_num != 0 && r.page_num != page_num)
        || page_num > attrs.max_mr_pages
    {
        return fail(AdminStatus::IllegalParameter);
    }
    let r = &RegMr { page_num, ..*r };
    let list = match PageList::read(&device.gate.bound(epoch), r) {
        Ok(list) => list,
        Err(PblError::Mismatch(_) | PblError::Unaligned { .. }) => {
            return fail(AdminStatus::IllegalParameter)
        }
        Err(e @ (PblError::Malformed(_) | PblError::Dma(_))) => {
            p2plab_ratelimit::log_limited!(debug, error = %e, "REG_MR page list refused");
            return fail(AdminStatus::MalformedRequest);
        }
    };
    if r.permissions & (mr_access::LOCAL_WRITE | mr_access::REMOTE_WRITE) != 0 {
        prefault(&device.gate.bound(epoch), &list);
    }
    let mut state = device.lock();
    let Some((slot, generation)) = state.objects.mrs.free_slot() else {
        return fail(AdminStatus::ResourceAllocationFailure);
    };
    let key = key_of(device.key_bits, slot, generation);
    let mr = Mr {
        pd: r.pd,
        key,
        access: r.permissions,
        list,
    };
    state.objects.mrs.fill(slot, generation, Arc::new(mr));
    ok(Response::default().u32(8, key).u32(12, key))
}

/// Bytes of a writable MR faulted in when it is registered, at most: the
/// first this many of it (a larger MR's rest is faulted in when written).
pub(crate) const PREFAULT_MAX: u64 = 256 << 20;
/// Bytes faulted in per entry into the DMA gate (a reset waits for one
/// piece at most).
const PREFAULT_PIECE: u64 = 2 << 20;

/// Faults the first [`PREFAULT_MAX`] bytes of a writable MR's pages in,
/// as registration pins them on real hardware (`ib_umem_get` for guest
/// RAM, `ib_umem_dmabuf_get_pinned` for a GPU's dma-buf): the packets
/// written into the MR later are plain copies into pages already there,
/// where they would otherwise take a page fault per page (or, in a peer's
/// VRAM that a zero fill just punched, allocate each page). Moves no
/// data. Best effort: memory the transport cannot prepare so, or a
/// refusal, leaves the rest to be faulted in when written.
fn prefault(memory: &dyn GuestMemory, list: &PageList) {
    let mut segments = Vec::new();
    if !list.segments(list.iova, list.length.min(PREFAULT_MAX), &mut segments) {
        return;
    }
    for (addr, len) in segments {
        let end = addr.saturating_add(len as u64);
        let mut at = addr;
        while at < end {
            let piece = (end - at).min(PREFAULT_PIECE);
            if let Err(e) = memory.prefault(at, piece) {
                p2plab_ratelimit::log_limited!(debug, error = %e, "REG_MR prefault stopped");
                return;
            }
            at += piece;
        }
    }
}

/// A 24-bit key: slot + 1 in the low bits, the generation above.
pub(crate) fn key_of(key_bits: u32, slot: usize, generation: u16) -> u32 {
    let generations = 1u32 << (24 - key_bits);
    let generation = u32::from(generation) % generations;
    (generation << key_bits | (slot as u32 + 1)) & crate::io::KEY_MASK
}

fn create_cq(device: &Device, c: &CreateCq) -> Outcome {
    let attrs = &device.attrs;
    let mut state = device.lock();
    let entry_size = usize::from(c.entry_words) * 4;
    let valid = state.objects.uars.get(usize::from(c.uar)).is_some()
        && (entry_size == 16 || entry_size == 32)
        && (!c.set_src_addr || entry_size == 32)
        && !c.virt
        && !c.sq_comp_64_bit_req_id
        && c.num_sub_cqs == 1
        && c.sub_cq_depth > 0
        && u32::from(c.sub_cq_depth) <= attrs.max_cq_depth
        && c.cq_ba != 0
        && c.cq_ba.is_multiple_of(8)
        && (!c.interrupt_mode || state.objects.eqs.get(usize::from(c.eqn)).is_some());
    if !valid {
        return fail(AdminStatus::IllegalParameter);
    }
    let Some((slot, generation)) = state.objects.cqs.free_slot() else {
        return fail(AdminStatus::ResourceAllocationFailure);
    };
    let cq = Cq {
        generation,
        uar: c.uar,
        ring: c.cq_ba,
        depth: u32::from(c.sub_cq_depth),
        entry_size,
        eq: c.interrupt_mode.then_some(c.eqn),
        set_src_addr: c.set_src_addr,
        shared: Arc::new(CqShared::default()),
    };
    state.objects.cqs.fill(slot, generation, cq);
    let db_offset = cq_db_offset(c.uar, slot) as u32;
    ok(Response::default()
        .u16(8, slot as u16)
        .u16(10, c.sub_cq_depth)
        .u32(12, db_offset)
        .u32(16, 1)) // db_valid
}

fn destroy_cq(device: &Device, cq_idx: u16) -> Outcome {
    let _datapath = device.datapath.write();
    let mut state = device.lock();
    if state.objects.cqs.get(usize::from(cq_idx)).is_none() {
        return fail(AdminStatus::IllegalParameter);
    }
    if state
        .objects
        .qps
        .iter()
        .any(|(_, qp)| qp.send_cq == cq_idx || qp.recv_cq == cq_idx)
    {
        return fail(AdminStatus::ResourceBusy);
    }
    state.objects.cqs.take(usize::from(cq_idx));
    ok(Response::default())
}

fn create_qp(device: &Device, c: &CreateQp) -> Outcome {
    let attrs = &device.attrs;
    let mut state = device.lock();
    let objects = &state.objects;
    let Some(ty) = QpType::from_code(c.qp_type) else {
        return fail(AdminStatus::IllegalParameter);
    };
    let cq_of_uar = |idx: u32| {
        u16::try_from(idx).ok().filter(|&i| {
            objects
                .cqs
                .get(usize::from(i))
                .is_some_and(|cq| cq.uar == c.uar)
        })
    };
    let ring_ok = |size: u32, unit: u32, max_entries: u32| {
        size == 0
            || (size.is_multiple_of(unit)
                && (size / unit).is_power_of_two()
                && size / unit <= max_entries)
    };
    let sq_entries = c.sq_ring_size / TX_WQE_SIZE;
    let rq_entries = c.rq_ring_size / RX_DESC_SIZE;
    let (Some(send_cq), Some(recv_cq)) = (cq_of_uar(c.send_cq_idx), cq_of_uar(c.recv_cq_idx))
    else {
        return fail(AdminStatus::IllegalParameter);
    };
    let valid = objects.pd_exists(c.pd)
        && objects.uars.get(usize::from(c.uar)).is_some()
        && c.flags == 0
        && c.sq_base_addr == 0
        && ring_ok(
            c.sq_ring_size,
            TX_WQE_SIZE,
            attrs.max_llq_size / TX_WQE_SIZE,
        )
        && c.sq_ring_size <= attrs.max_llq_size
        && c.sq_depth <= attrs.max_sq_depth
        && ring_ok(c.rq_ring_size, RX_DESC_SIZE, attrs.max_rq_depth)
        && c.rq_depth <= attrs.max_rq_depth
        && (c.rq_ring_size == 0) == (c.rq_base_addr == 0)
        && c.rq_base_addr.is_multiple_of(8);
    if !valid {
        return fail(AdminStatus::IllegalParameter);
    }
    let Some((slot, generation)) = state.objects.qps.free_slot() else {
        return fail(AdminStatus::ResourceAllocationFailure);
    };
    let num = qp_num(attrs.max_qp, slot, generation);
    let llq_offset = slot as u64 * u64::from(attrs.max_llq_size);
    // A new QP's ring starts clean: nothing of a previous owner's WQEs.
    let zeros = vec![0u8; attrs.max_llq_size as usize];
    if let Err(fault) = device.llq.write(llq_offset, &zeros) {
        tracing::error!(error = %fault, "LLQ slice outside BAR2");
        return fail(AdminStatus::UnknownError);
    }
    let qp = Qp {
        num,
        pd: c.pd,
        ty,
        uar: c.uar,
        send_cq,
        recv_cq,
        sq_entries,
        llq_offset,
        rq_ring: c.rq_base_addr,
        rq_entries,
        state: QpState::Reset,
        qkey: 0,
        sq_psn: 0,
        rnr_retry: super::reliability::RNR_FOREVER,
        sq_head: 0,
        sq_tail: 0,
        rq_head: 0,
        rq_tail: 0,
    };
    state.objects.qps.fill(slot, generation, qp);
    let sq_db = sq_db_offset(c.uar, slot) as u32;
    ok(Response::default()
        .u32(8, u32::from(num))
        .u16(12, num)
        .u16(16, 0)
        .u16(18, 0)
        .u32(20, sq_db)
        .u32(24, sq_db + 4)
        .u32(28, llq_offset as u32))
}

/// A QP number: its slot in the low bits (distinct modulo `max_qp`, as
/// the provider's QP table needs), a generation above, never 0 or 1.
pub(crate) fn qp_num(max_qp: u32, slot: usize, generation: u16) -> u16 {
    let bits = max_qp.trailing_zeros();
    let generations = (1u32 << (16 - bits)) - 1;
    let generation = (u32::from(generation).wrapping_sub(1) % generations) + 1;
    (generation << bits | slot as u32) as u16
}

fn qp_by_handle<'a>(device: &Device, state: &'a State, handle: u32) -> Option<(usize, &'a Qp)> {
    let num = u16::try_from(handle).ok()?;
    state.objects.qp_by_num(num, device.attrs.max_qp)
}

fn modify_qp(device: &Device, m: &ModifyQp) -> Outcome {
    if m.mask & !modify_mask::ALL != 0 {
        return fail(AdminStatus::IllegalParameter);
    }
    let new_state = if m.mask & modify_mask::QP_STATE != 0 {
        match QpState::from_code(m.state) {
            Some(s) => Some(s),
            None => return fail(AdminStatus::IllegalParameter),
        }
    } else {
        None
    };
    if m.mask & modify_mask::RNR_RETRY != 0 && m.rnr_retry > super::reliability::RNR_FOREVER {
        return fail(AdminStatus::IllegalParameter);
    }
    let resetting = matches!(new_state, Some(QpState::Reset | QpState::Err));
    // Leaving the queues (reset, error) changes what the engines use.
    let _datapath = resetting.then(|| device.datapath.write());
    let (flush, forgotten) = {
        let mut state = device.lock();
        let Some((slot, _)) = qp_by_handle(device, &state, m.handle) else {
            return fail(AdminStatus::IllegalParameter);
        };
        let Some(qp) = state.objects.qps.get_mut(slot) else {
            return fail(AdminStatus::IllegalParameter);
        };
        if m.mask & modify_mask::QKEY != 0 {
            qp.qkey = m.qkey;
        }
        if m.mask & modify_mask::SQ_PSN != 0 {
            qp.sq_psn = m.sq_psn;
        }
        if m.mask & modify_mask::RNR_RETRY != 0 {
            qp.rnr_retry = m.rnr_retry;
        }
        let mut flush = None;
        if let Some(new) = new_state {
            let old = qp.state;
            qp.state = new;
            match new {
                QpState::Reset => {
                    qp.sq_head = 0;
                    qp.sq_tail = 0;
                    qp.rq_head = 0;
                    qp.rq_tail = 0;
                }
                QpState::Err if old != QpState::Err => flush = Some((slot, qp.clone())),
                _ => {}
            }
        }
        let forgotten = if resetting {
            lock(&device.reliability).forget_qp(qp.num)
        } else {
            Vec::new()
        };
        (flush, forgotten)
    };
    device.send_wake.notify_all();
    if let Some((slot, qp)) = flush {
        flush_qp(device, slot, &qp, forgotten);
    }
    ok(Response::default())
}

/// Completes everything a QP entering the error state still holds with
/// FLUSHED: messages in flight, WQEs posted and not taken, receives posted.
fn flush_qp(device: &Device, slot: usize, qp: &Qp, in_flight: Vec<Pending>) {
    let epoch = device.gate.epoch();
    let mut flushed = 0u32;
    for p in in_flight {
        post_flush(
            device,
            qp.send_cq,
            epoch,
            Cqe::send(p.req_id, IoStatus::Flushed, p.op, qp.num),
        );
        flushed += 1;
    }
    // Send WQEs posted but not taken: their request IDs are in the LLQ.
    let mut index = qp.sq_head;
    while index != qp.sq_tail && qp.sq_entries > 0 {
        let at = qp.llq_offset + u64::from(u32::from(index) % qp.sq_entries) * TX_WQE_SIZE as u64;
        let mut raw = [0u8; 2];
        if device.llq.read(at, &mut raw).is_ok() {
            let req_id = u16::from_le_bytes(raw);
            post_flush(
                device,
                qp.send_cq,
                epoch,
                Cqe::send(req_id, IoStatus::Flushed, IoOp::Send, qp.num),
            );
            flushed += 1;
        }
        index = index.wrapping_add(1);
    }
    // Receives posted: each WQE's first descriptor carries its ID.
    let memory = device.gate.bound(epoch);
    let mut index = qp.rq_head;
    while index != qp.rq_tail && qp.rq_entries > 0 {
        let at = qp.rq_ring + u64::from(u32::from(index) % qp.rq_entries) * RX_DESC_SIZE as u64;
        let mut raw = [0u8; 16];
        if memory.read(at, &mut raw).is_err() {
            break;
        }
        let desc = crate::io::parse_rx_desc(&raw);
        if desc.first {
            let cqe = Cqe {
                queue: IoQueue::RecvQueue,
                ah: 0xffff,
                ..Cqe::send(desc.req_id, IoStatus::Flushed, IoOp::Send, qp.num)
            };
            post_flush(device, qp.recv_cq, epoch, cqe);
            flushed += 1;
        }
        index = index.wrapping_add(1);
    }
    let mut state = device.lock();
    if let Some(current) = state.objects.qps.get_mut(slot).filter(|q| q.num == qp.num) {
        current.sq_head = current.sq_tail;
        current.rq_head = current.rq_tail;
    }
    tracing::debug!(qp = qp.num, flushed, "QP flushed");
}

fn post_flush(device: &Device, cq: u16, epoch: Epoch, cqe: Cqe) {
    device.post_cqe(cq, epoch, cqe);
}

fn destroy_qp(device: &Device, handle: u32) -> Outcome {
    let _datapath = device.datapath.write();
    let mut state = device.lock();
    let Some((slot, qp)) = qp_by_handle(device, &state, handle) else {
        return fail(AdminStatus::IllegalParameter);
    };
    let num = qp.num;
    state.objects.qps.take(slot);
    drop(state);
    lock(&device.reliability).forget_qp(num);
    ok(Response::default())
}

fn create_eq(device: &Device, e: &CreateEq) -> Outcome {
    let attrs = &device.attrs;
    let mut state = device.lock();
    let valid = attrs.max_eq > 0
        && u32::from(e.depth).is_power_of_two()
        && u32::from(e.depth) <= attrs.max_eq_depth
        && u16::from(e.msix_vec) < attrs.msix_vectors()
        && e.entry_words == 4
        && e.event_bitmask & 1 != 0
        && e.ba != 0
        && e.ba.is_multiple_of(8);
    if !valid {
        return fail(AdminStatus::IllegalParameter);
    }
    let eq = Eq {
        ring: e.ba,
        depth: u32::from(e.depth),
        vector: u16::from(e.msix_vec),
        shared: Arc::new(EqShared::default()),
    };
    alloc(&mut state.objects.eqs, eq).map_or_else(fail, |(slot, _)| {
        ok(Response::default().u16(8, slot as u16))
    })
}

fn get_stats(device: &Device, stats_type: u8, scope: u8) -> Outcome {
    let Some(stats_type) = StatsType::from_code(stats_type) else {
        return fail(AdminStatus::IllegalParameter);
    };
    if scope > 1 {
        return fail(AdminStatus::IllegalParameter);
    }
    if stats_type == StatsType::RdmaWrite
        && device.attrs.device_caps & crate::defs::device_caps::RDMA_WRITE == 0
    {
        return fail(AdminStatus::UnsupportedOpcode);
    }
    let s = device.stats.snapshot();
    let values: Vec<u64> = match stats_type {
        StatsType::Basic => vec![
            s.tx_bytes,
            s.tx_pkts,
            s.rx_bytes,
            s.rx_pkts,
            s.rx_drops,
            s.qkey_viol,
        ],
        StatsType::Messages => vec![s.send_bytes, s.send_wrs, s.recv_bytes, s.recv_wrs],
        StatsType::RdmaRead => vec![s.read_wrs, s.read_bytes, s.read_wr_err, s.read_resp_bytes],
        StatsType::RdmaWrite => vec![
            s.write_wrs,
            s.write_bytes,
            s.write_wr_err,
            s.write_recv_bytes,
        ],
        StatsType::Network => vec![
            s.retrans_bytes,
            s.retrans_pkts,
            s.retrans_timeout_events,
            s.unresponsive_remote_events,
            s.impaired_remote_conn_events,
        ],
    };
    let mut response = Response::default();
    for (i, value) in values.into_iter().enumerate() {
        put_u64(&mut response.0, 8 + i * 8, value);
    }
    ok(response)
}

/// Takes the port down or up and tells the driver through the AENQ.
pub(crate) fn set_port(device: &Device, up: bool) {
    let changed = {
        let mut state = device.lock();
        std::mem::replace(&mut state.port_up, up) != up
    };
    if changed {
        let syndrome = if up {
            crate::defs::LinkSyndrome::LinkUp
        } else {
            crate::defs::LinkSyndrome::LinkDown
        };
        tracing::info!(up, "fabric port state changed");
        device.trace.record(
            "port",
            || serde_json::json!({"name": syndrome.name(), "injected": !up}),
        );
        queue_aenq(device, AenqGroup::Notification, syndrome.code());
    }
}
