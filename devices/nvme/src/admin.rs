//! Admin command set, run on the admin queue's worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};

use crate::command::{Command, Completion};
use crate::controller::Shared;
use crate::datapointer::{DataBuffer, Direction};
use crate::features::{self, FeatureContext, Select, SetEffect};
use crate::logs::{self, AsyncEvent};
use crate::queues::{CompletionQueue, Shadow, SubmissionQueue};
use crate::spec::{admin, aen, cc, feature, log, Status, CQES_LOG2, NSID_ALL, SQES_LOG2};
use crate::{identify, lock};

type Handled = Result<Completion, Status>;

/// The admin queue is never deleted, only reset (which stops its CQ).
static NEVER: AtomicBool = AtomicBool::new(false);

/// Runs one admin command. `None`: the command is parked (Asynchronous
/// Event Request) and completes later through [`deliver_events`].
pub(crate) fn execute(
    shared: &Arc<Shared>,
    admin_cq: &CompletionQueue,
    cmd: &Command,
    sq_head: u16,
) -> Option<Completion> {
    // Over PCIe, admin commands use PRPs only; fused operations are not
    // supported (FUSES = 0).
    if cmd.psdt() != 0 || cmd.fuse() != 0 {
        return Some(Completion::error(Status::INVALID_FIELD));
    }
    let result = match cmd.opcode() {
        admin::DELETE_SQ => delete_sq(shared, cmd),
        admin::CREATE_SQ => create_sq(shared, cmd),
        admin::GET_LOG_PAGE => get_log_page(shared, cmd),
        admin::DELETE_CQ => delete_cq(shared, cmd),
        admin::CREATE_CQ => create_cq(shared, cmd),
        admin::IDENTIFY => identify(shared, cmd),
        admin::ABORT => abort(shared, admin_cq, cmd, sq_head),
        admin::SET_FEATURES => set_features(shared, cmd),
        admin::GET_FEATURES => get_features(shared, cmd),
        admin::ASYNC_EVENT_REQUEST => {
            let limit = usize::from(shared.cfg.aerl) + 1;
            match lock(&shared.admin).events.park(cmd.cid(), limit) {
                Ok(()) => {
                    debug!(cid = cmd.cid(), "asynchronous event request parked");
                    return None;
                }
                Err(status) => Err(status),
            }
        }
        admin::DOORBELL_BUFFER_CONFIG => doorbell_buffer_config(shared, cmd),
        admin::FORMAT_NVM => format_nvm(shared, cmd),
        _ => Err(Status::INVALID_OPCODE),
    };
    Some(result.unwrap_or_else(Completion::error))
}

/// Completes parked Asynchronous Event Requests with queued events.
pub(crate) fn deliver_events(shared: &Shared, admin_cq: &CompletionQueue, sq_head: u16) {
    let deliverable = lock(&shared.admin).events.take_deliverable();
    if deliverable.is_empty() {
        return;
    }
    for (cid, event) in deliverable {
        info!(
            cid,
            kind = event.kind,
            info = event.info,
            log_page = event.log_page,
            "asynchronous event"
        );
        let c = Completion::with_result(event.dword0());
        if admin_cq
            .post(&shared.mem, &shared.stats, &c, sq_head, 0, cid, &NEVER)
            .is_err()
        {
            return;
        }
        shared.stats.async_events.fetch_add(1, Ordering::Relaxed);
    }
    shared.interrupt(admin_cq);
}

/// Sends `data` to the host buffer of `cmd`.
fn to_host(shared: &Shared, cmd: &Command, data: &[u8]) -> Result<(), Status> {
    let buf = DataBuffer::map(
        &shared.mem,
        cmd,
        data.len() as u64,
        Direction::ToHost,
        shared.page_size(),
        false,
    )?;
    buf.write_to_host(&shared.mem, data).map(|_| ())
}

fn from_host(shared: &Shared, cmd: &Command, len: usize) -> Result<Vec<u8>, Status> {
    let buf = DataBuffer::map(
        &shared.mem,
        cmd,
        len as u64,
        Direction::FromHost,
        shared.page_size(),
        false,
    )?;
    let mut data = vec![0u8; len];
    buf.read_from_host(&shared.mem, &mut data)?;
    Ok(data)
}

fn queue_size(cdw10: u32, shared: &Shared) -> Result<u32, Status> {
    // QSIZE is 0's based; one-entry queues cannot work.
    let entries = (cdw10 >> 16) + 1;
    if entries < 2 || entries > shared.cfg.max_queue_entries {
        return Err(Status::INVALID_QUEUE_SIZE);
    }
    Ok(entries)
}

fn io_entry_sizes_ok(shared: &Shared) -> bool {
    let cc_value = lock(&shared.regs).cc;
    cc::iosqes(cc_value) == SQES_LOG2 && cc::iocqes(cc_value) == CQES_LOG2
}

fn create_cq(shared: &Arc<Shared>, cmd: &Command) -> Handled {
    let qid = (cmd.cdw10() & 0xffff) as u16;
    let flags = cmd.cdw11() & 0xffff;
    let contiguous = flags & 0x1 != 0;
    let irq_enabled = flags & 0x2 != 0;
    let vector = (cmd.cdw11() >> 16) as u16;
    let base = cmd.prp1();
    if !io_entry_sizes_ok(shared) {
        return Err(Status::INVALID_QUEUE_SIZE);
    }
    let table = lock(&shared.queues);
    if qid == 0 || qid > shared.cfg.max_io_queues || table.cq(qid).is_some() {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    drop(table);
    let entries = queue_size(cmd.cdw10(), shared)?;
    if base & (shared.page_size() - 1) != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    if irq_enabled && vector >= shared.cfg.msix_vectors() {
        return Err(Status::INVALID_INTERRUPT_VECTOR);
    }
    if !contiguous {
        return Err(Status::INVALID_FIELD);
    }
    if base.checked_add(u64::from(entries) << CQES_LOG2).is_none() {
        return Err(Status::INVALID_FIELD);
    }
    let in_cmb = shared.mem.cmb_offset(base).is_some();
    let cq = Arc::new(CompletionQueue::new(
        qid,
        base,
        entries,
        vector,
        irq_enabled,
        in_cmb,
    ));
    let buffers = {
        let mut admin_state = lock(&shared.admin);
        admin_state.queues_created = true;
        admin_state.doorbell_buffers
    };
    if let Some(buffers) = buffers {
        *lock(&cq.shadow) = Some(Shadow::for_queue(buffers, qid, true));
    }
    let mut table = lock(&shared.queues);
    if table.cq(qid).is_some() {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    table.cqs[usize::from(qid)] = Some(cq);
    drop(table);
    let counter = if in_cmb {
        &shared.stats.io_cqs_created_in_cmb
    } else {
        &shared.stats.io_cqs_created_in_host
    };
    counter.fetch_add(1, Ordering::Relaxed);
    info!(
        qid,
        entries,
        vector,
        irq_enabled,
        base = format_args!("{base:#x}"),
        in_cmb,
        "I/O completion queue created"
    );
    Ok(Completion::success())
}

fn create_sq(shared: &Arc<Shared>, cmd: &Command) -> Handled {
    let qid = (cmd.cdw10() & 0xffff) as u16;
    let flags = cmd.cdw11() & 0xffff;
    let contiguous = flags & 0x1 != 0;
    let cqid = (cmd.cdw11() >> 16) as u16;
    let base = cmd.prp1();
    let cq = {
        let table = lock(&shared.queues);
        let cq = match table.cq(cqid) {
            Some(cq) if cqid != 0 => Arc::clone(cq),
            _ => return Err(Status::INVALID_COMPLETION_QUEUE),
        };
        if qid == 0 || qid > shared.cfg.max_io_queues || table.sq(qid).is_some() {
            return Err(Status::INVALID_QUEUE_IDENTIFIER);
        }
        cq
    };
    let entries = queue_size(cmd.cdw10(), shared)?;
    if !io_entry_sizes_ok(shared) {
        return Err(Status::INVALID_QUEUE_SIZE);
    }
    if base & (shared.page_size() - 1) != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    if !contiguous {
        return Err(Status::INVALID_FIELD);
    }
    if base.checked_add(u64::from(entries) << SQES_LOG2).is_none() {
        return Err(Status::INVALID_FIELD);
    }
    let in_cmb = shared.mem.cmb_offset(base).is_some();
    let sq = Arc::new(SubmissionQueue::new(qid, cqid, base, entries, in_cmb));
    let buffers = {
        let mut admin_state = lock(&shared.admin);
        admin_state.queues_created = true;
        admin_state.doorbell_buffers
    };
    if let Some(buffers) = buffers {
        *lock(&sq.shadow) = Some(Shadow::for_queue(buffers, qid, false));
    }
    {
        let mut table = lock(&shared.queues);
        if table.sq(qid).is_some() || table.cq(cqid).is_none() {
            return Err(Status::INVALID_QUEUE_IDENTIFIER);
        }
        table.sqs[usize::from(qid)] = Some(Arc::clone(&sq));
    }
    if let Err(e) = shared.spawn_worker(Arc::clone(&sq), cq) {
        warn!(qid, %e, "cannot start a queue worker");
        lock(&shared.queues).sqs[usize::from(qid)] = None;
        return Err(Status::INTERNAL_ERROR);
    }
    let counter = if in_cmb {
        &shared.stats.io_sqs_created_in_cmb
    } else {
        &shared.stats.io_sqs_created_in_host
    };
    counter.fetch_add(1, Ordering::Relaxed);
    info!(
        qid,
        cqid,
        entries,
        base = format_args!("{base:#x}"),
        in_cmb,
        "I/O submission queue created"
    );
    Ok(Completion::success())
}

fn delete_sq(shared: &Shared, cmd: &Command) -> Handled {
    let qid = (cmd.cdw10() & 0xffff) as u16;
    if qid == 0 {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    let sq = lock(&shared.queues)
        .sqs
        .get_mut(usize::from(qid))
        .and_then(Option::take)
        .ok_or(Status::INVALID_QUEUE_IDENTIFIER)?;
    sq.request_stop();
    // Wake a worker waiting for completion queue space so it notices.
    if let Some(cq) = lock(&shared.queues).cq(sq.cqid) {
        cq.space.notify();
    }
    // The command being executed finishes and completes; entries not yet
    // fetched are dropped. Waiting here is safe: this is not the socket
    // thread.
    let handle = lock(&sq.worker).take();
    if let Some(handle) = handle {
        let _ = handle.join();
    }
    info!(qid, "I/O submission queue deleted");
    Ok(Completion::success())
}

fn delete_cq(shared: &Shared, cmd: &Command) -> Handled {
    let qid = (cmd.cdw10() & 0xffff) as u16;
    if qid == 0 {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    let mut table = lock(&shared.queues);
    if table.cq(qid).is_none() {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    if table.sqs.iter().flatten().any(|sq| sq.cqid == qid) {
        return Err(Status::INVALID_QUEUE_DELETION);
    }
    if let Some(cq) = table.cqs.get_mut(usize::from(qid)).and_then(Option::take) {
        cq.request_stop();
    }
    info!(qid, "I/O completion queue deleted");
    Ok(Completion::success())
}

fn identify(shared: &Shared, cmd: &Command) -> Handled {
    let cns = (cmd.cdw10() & 0xff) as u8;
    let csi = (cmd.cdw11() >> 24) as u8;
    let nsid = cmd.nsid();
    let count = shared.namespace_count();
    let data = match cns {
        0x00 => shared.check_nsid(nsid)?.identify(),
        0x01 => identify::controller(&shared.cfg, count),
        0x02 => {
            if nsid >= NSID_ALL - 1 {
                return Err(Status::INVALID_NAMESPACE);
            }
            identify::active_namespaces(count, nsid)
        }
        0x03 => shared.check_nsid(nsid)?.identification_descriptors(),
        0x05 => {
            shared.check_nsid(nsid)?;
            if csi != 0 {
                return Err(Status::INVALID_FIELD);
            }
            // The NVM command set adds nothing without metadata or PI.
            vec![0u8; 4096]
        }
        0x06 => {
            if csi != 0 {
                return Err(Status::INVALID_FIELD);
            }
            identify::controller_nvm()
        }
        0x07 => {
            if nsid >= NSID_ALL - 1 {
                return Err(Status::INVALID_NAMESPACE);
            }
            if csi != 0 {
                return Err(Status::INVALID_FIELD);
            }
            identify::active_namespaces(count, nsid)
        }
        0x08 => {
            shared.check_nsid(nsid)?;
            identify::namespace_independent()
        }
        _ => return Err(Status::INVALID_FIELD),
    };
    to_host(shared, cmd, &data)?;
    Ok(Completion::success())
}

fn get_log_page(shared: &Shared, cmd: &Command) -> Handled {
    let lid = (cmd.cdw10() & 0xff) as u8;
    let retain = cmd.cdw10() & (1 << 15) != 0;
    let dwords = (u64::from(cmd.cdw11() & 0xffff) << 16) | u64::from(cmd.cdw10() >> 16);
    let len = (dwords + 1) * 4;
    let offset = u64::from(cmd.cdw12()) | (u64::from(cmd.cdw13()) << 32);
    let csi = (cmd.cdw14() >> 24) as u8;
    if offset % 4 != 0 {
        return Err(Status::INVALID_FIELD);
    }
    if shared.cfg.max_transfer().is_some_and(|max| len > max) {
        return Err(Status::INVALID_FIELD);
    }
    let nsid = cmd.nsid();
    let page = match lid {
        log::ERROR_INFORMATION => {
            let mut admin_state = lock(&shared.admin);
            if !retain {
                admin_state.events.clear(aen::TYPE_ERROR);
            }
            admin_state.error_log.page()
        }
        log::SMART_HEALTH => {
            let scope = match nsid {
                0 | NSID_ALL => None,
                n => Some(shared.check_nsid(n)?.nsid()),
            };
            let counters = shared.smart_counters(scope);
            if !retain {
                lock(&shared.admin).events.clear(aen::TYPE_SMART);
            }
            logs::smart_page(&counters)
        }
        log::FIRMWARE_SLOT => logs::firmware_slot_page(&shared.cfg.firmware),
        log::CHANGED_NAMESPACES => {
            let mut admin_state = lock(&shared.admin);
            let page = logs::changed_namespaces_page(&admin_state.changed_namespaces);
            admin_state.changed_namespaces.clear();
            if !retain {
                admin_state.events.clear(aen::TYPE_NOTICE);
            }
            page
        }
        log::COMMANDS_EFFECTS => {
            if csi != 0 {
                return Err(Status::INVALID_FIELD);
            }
            logs::commands_effects_page()
        }
        _ => return Err(Status::INVALID_LOG_PAGE),
    };
    let size = page.len() as u64;
    if offset >= size {
        return Err(Status::INVALID_FIELD);
    }
    let end = size.min(offset + len);
    let part = page
        .get(offset as usize..end as usize)
        .ok_or(Status::INVALID_FIELD)?;
    debug!(log = logs::log_name(lid), offset, len, "log page");
    to_host(shared, cmd, part)?;
    Ok(Completion::success())
}

fn feature_context(shared: &Shared, queues_created: bool) -> FeatureContext {
    FeatureContext {
        namespaces: shared.namespace_count(),
        vectors: shared.cfg.msix_vectors(),
        max_io_queues: shared.cfg.max_io_queues,
        queues_created,
    }
}

fn get_features(shared: &Shared, cmd: &Command) -> Handled {
    let fid = (cmd.cdw10() & 0xff) as u8;
    let select = Select::from_cdw10(cmd.cdw10())?;
    if fid == feature::TIMESTAMP && select != Select::Capabilities {
        let bytes = if select == Select::Current {
            lock(&shared.admin).features.timestamp_bytes()
        } else {
            [0u8; 8]
        };
        to_host(shared, cmd, &bytes)?;
        return Ok(Completion::success());
    }
    let admin_state = lock(&shared.admin);
    let ctx = feature_context(shared, admin_state.queues_created);
    let value = admin_state
        .features
        .get(fid, select, cmd.nsid(), cmd.cdw11(), &ctx)?;
    debug!(
        feature = features::name(fid),
        ?select,
        value = format_args!("{value:#x}"),
        "get features"
    );
    Ok(Completion::with_result(value))
}

fn set_features(shared: &Shared, cmd: &Command) -> Handled {
    let fid = (cmd.cdw10() & 0xff) as u8;
    if fid == feature::TIMESTAMP {
        if cmd.cdw10() & (1 << 31) != 0 {
            return Err(Status::FEATURE_NOT_SAVEABLE);
        }
        let data = from_host(shared, cmd, 8)?;
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&data);
        let ms = u64::from_le_bytes(raw) & 0xffff_ffff_ffff;
        lock(&shared.admin).features.timestamp = Some((ms, Instant::now()));
        return Ok(Completion::success());
    }
    let (result, effect, aec) = {
        let mut admin_state = lock(&shared.admin);
        let ctx = feature_context(shared, admin_state.queues_created);
        let (result, effect) =
            admin_state
                .features
                .set(fid, cmd.nsid(), cmd.cdw10(), cmd.cdw11(), &ctx)?;
        (result, effect, admin_state.features.async_event_config)
    };
    debug!(
        feature = features::name(fid),
        value = format_args!("{:#x}", cmd.cdw11()),
        "set features"
    );
    match effect {
        SetEffect::None => {}
        SetEffect::FlushCaches => {
            for ns in &shared.namespaces {
                if let Err(e) = ns.backend().flush() {
                    warn!(nsid = ns.nsid(), %e, "flush on write cache disable failed");
                    return Err(Status::INTERNAL_ERROR);
                }
            }
        }
        SetEffect::TemperatureEvent => {
            // SMART critical warning: temperature (AEC bit 1).
            if aec & (1 << 1) != 0 {
                lock(&shared.admin).events.push(AsyncEvent {
                    kind: aen::TYPE_SMART,
                    info: aen::SMART_TEMPERATURE,
                    log_page: log::SMART_HEALTH,
                });
            }
        }
    }
    Ok(Completion::with_result(result))
}

fn abort(shared: &Shared, admin_cq: &CompletionQueue, cmd: &Command, sq_head: u16) -> Handled {
    let sqid = (cmd.cdw10() & 0xffff) as u16;
    let cid = (cmd.cdw10() >> 16) as u16;
    if lock(&shared.queues).sq(sqid).is_none() {
        return Err(Status::INVALID_FIELD);
    }
    // Only parked Asynchronous Event Requests can be caught; every other
    // command runs to completion once fetched. Dword 0 bit 0 set means
    // "not aborted".
    if sqid == 0 && lock(&shared.admin).events.unpark(cid) {
        let aborted = Completion::error(Status::ABORT_REQUESTED);
        let _ = admin_cq.post(
            &shared.mem,
            &shared.stats,
            &aborted,
            sq_head,
            0,
            cid,
            &NEVER,
        );
        info!(cid, "asynchronous event request aborted");
        return Ok(Completion::with_result(0));
    }
    Ok(Completion::with_result(1))
}

fn doorbell_buffer_config(shared: &Shared, cmd: &Command) -> Handled {
    let (doorbells, event_idx) = (cmd.prp1(), cmd.prp2());
    let mask = shared.page_size() - 1;
    if doorbells & mask != 0 || event_idx & mask != 0 {
        return Err(Status::INVALID_FIELD);
    }
    let buffers = (doorbells, event_idx);
    lock(&shared.admin).doorbell_buffers = Some(buffers);
    let (sqs, cqs): (Vec<Arc<SubmissionQueue>>, Vec<Arc<CompletionQueue>>) = {
        let table = lock(&shared.queues);
        (
            table.sqs.iter().flatten().cloned().collect(),
            table.cqs.iter().flatten().cloned().collect(),
        )
    };
    // The admin queue keeps using its MMIO doorbells: hosts (Linux among
    // them) never update its shadow slots.
    for sq in sqs.iter().filter(|q| q.id != 0) {
        let shadow = Shadow::for_queue(buffers, sq.id, false);
        let _ = shared
            .mem
            .write_u32(shadow.doorbell, sq.tail.load(Ordering::Acquire));
        *lock(&sq.shadow) = Some(shadow);
        sq.wake.notify();
    }
    for cq in cqs.iter().filter(|q| q.id != 0) {
        let shadow = Shadow::for_queue(buffers, cq.id, true);
        let _ = shared
            .mem
            .write_u32(shadow.doorbell, cq.head.load(Ordering::Acquire));
        *lock(&cq.shadow) = Some(shadow);
    }
    info!(
        doorbells = format_args!("{doorbells:#x}"),
        event_idx = format_args!("{event_idx:#x}"),
        "shadow doorbells configured"
    );
    Ok(Completion::success())
}

fn format_nvm(shared: &Shared, cmd: &Command) -> Handled {
    let cdw10 = cmd.cdw10();
    let lbaf = ((cdw10 & 0xf) | (((cdw10 >> 12) & 0x3) << 4)) as u8;
    let pi = (cdw10 >> 5) & 0x7;
    let ses = (cdw10 >> 9) & 0x7;
    let targets: Vec<_> = match cmd.nsid() {
        NSID_ALL => shared.namespaces.clone(),
        nsid => vec![Arc::clone(shared.check_nsid(nsid)?)],
    };
    if pi != 0 {
        // No metadata, so no protection information.
        return Err(Status::INVALID_FORMAT);
    }
    if ses > 1 {
        // No cryptographic erase; user data erase is what format does.
        return Err(Status::INVALID_FIELD);
    }
    if targets.iter().any(|ns| lbaf >= ns.format_count()) {
        return Err(Status::INVALID_FORMAT);
    }
    for ns in targets {
        ns.format(lbaf)?;
        info!(
            nsid = ns.nsid(),
            block_size = ns.block_size(),
            "namespace formatted"
        );
    }
    Ok(Completion::success())
}
