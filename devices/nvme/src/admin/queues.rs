//! Queue management: Create and Delete I/O Submission and Completion
//! Queues, and Doorbell Buffer Config (shadow doorbells).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::{info, warn};

use crate::context::{CommandContext, CommandResult, Outcome};
use crate::fields::{CreateIoCq, CreateIoSq, DeleteIoQueue, DoorbellBufferConfig};
use crate::lock;
use crate::queues::{
    CompletionQueue, CqInterrupts, QueueKind, QueueMemory, Shadow, SubmissionQueue,
};
use crate::spec::{Status, CQES_LOG2, SQES_LOG2};
use crate::state::ControllerState;

/// The entries of a queue of QSIZE + 1 entries, if acceptable: one-entry
/// queues cannot work, and CAP.MQES bounds the rest.
fn queue_entries(state: &ControllerState, entries: u32) -> Result<u32, Status> {
    if entries < 2 || entries > state.cfg.max_queue_entries {
        return Err(Status::INVALID_QUEUE_SIZE);
    }
    Ok(entries)
}

/// CC.IOSQES and CC.IOCQES name the only entry sizes this controller has.
fn io_entry_sizes_ok(state: &ControllerState) -> bool {
    let cc = lock(&state.regs).cc;
    cc.iosqes() == SQES_LOG2 && cc.iocqes() == CQES_LOG2
}

fn queue_memory(state: &ControllerState, base: u64) -> QueueMemory {
    if state.mem.cmb_offset(base).is_some() {
        QueueMemory::Cmb
    } else {
        QueueMemory::Host
    }
}

/// Shadow doorbells configured so far (queues created later use them too).
fn note_queue_created(state: &ControllerState) -> Option<(u64, u64)> {
    let mut admin = lock(&state.admin);
    admin.queues_created = true;
    admin.doorbell_buffers
}

pub(super) fn create_io_cq(cx: &mut CommandContext<'_>, f: CreateIoCq) -> CommandResult {
    let state = cx.state;
    let (qid, base) = (f.qid, f.prp1);
    if !io_entry_sizes_ok(state) {
        return Err(Status::INVALID_QUEUE_SIZE);
    }
    let table = lock(&state.queues);
    if qid == 0 || qid > state.cfg.max_io_queues || table.cq(qid).is_some() {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    drop(table);
    let entries = queue_entries(state, f.entries())?;
    if base & (state.page_size() - 1) != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    if f.ien && f.iv >= state.cfg.msix_vectors() {
        return Err(Status::INVALID_INTERRUPT_VECTOR);
    }
    if !f.pc {
        return Err(Status::INVALID_FIELD);
    }
    if base.checked_add(u64::from(entries) << CQES_LOG2).is_none() {
        return Err(Status::INVALID_FIELD);
    }
    let memory = queue_memory(state, base);
    let interrupts = if f.ien {
        CqInterrupts::Enabled
    } else {
        CqInterrupts::Disabled
    };
    let cq = state.completion_queue(CompletionQueue::new(
        qid, base, entries, f.iv, interrupts, memory,
    ));
    if let Some(buffers) = note_queue_created(state) {
        *lock(&cq.shadow) = Some(Shadow::for_queue(buffers, qid, QueueKind::Completion));
    }
    let mut table = lock(&state.queues);
    if !table.admin_is(cx.cq) {
        // A reset overtook this command; it completes nowhere.
        return Err(Status::ABORTED_SQ_DELETION);
    }
    if table.cq(qid).is_some() {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    table.cqs[usize::from(qid)] = Some(cq);
    drop(table);
    let counter = match memory {
        QueueMemory::Cmb => &state.stats.io_cqs_created_in_cmb,
        QueueMemory::Host => &state.stats.io_cqs_created_in_host,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    info!(
        qid,
        entries,
        vector = f.iv,
        irq_enabled = f.ien,
        base = format_args!("{base:#x}"),
        in_cmb = memory == QueueMemory::Cmb,
        "I/O completion queue created"
    );
    Ok(Outcome::success())
}

pub(super) fn create_io_sq(cx: &mut CommandContext<'_>, f: CreateIoSq) -> CommandResult {
    let state = cx.state;
    let (qid, cqid, base) = (f.qid, f.cqid, f.prp1);
    let cq = {
        let table = lock(&state.queues);
        let cq = match table.cq(cqid) {
            Some(cq) if cqid != 0 => Arc::clone(cq),
            _ => return Err(Status::INVALID_COMPLETION_QUEUE),
        };
        if qid == 0 || qid > state.cfg.max_io_queues || table.sq(qid).is_some() {
            return Err(Status::INVALID_QUEUE_IDENTIFIER);
        }
        cq
    };
    let entries = queue_entries(state, f.entries())?;
    if !io_entry_sizes_ok(state) {
        return Err(Status::INVALID_QUEUE_SIZE);
    }
    if base & (state.page_size() - 1) != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    if !f.pc {
        return Err(Status::INVALID_FIELD);
    }
    if base.checked_add(u64::from(entries) << SQES_LOG2).is_none() {
        return Err(Status::INVALID_FIELD);
    }
    let memory = queue_memory(state, base);
    let sq = Arc::new(SubmissionQueue::new(qid, cqid, base, entries, memory));
    if let Some(buffers) = note_queue_created(state) {
        *lock(&sq.shadow) = Some(Shadow::for_queue(buffers, qid, QueueKind::Submission));
    }
    {
        let mut table = lock(&state.queues);
        if !table.admin_is(cx.cq) {
            return Err(Status::ABORTED_SQ_DELETION);
        }
        if table.sq(qid).is_some() || table.cq(cqid).is_none() {
            return Err(Status::INVALID_QUEUE_IDENTIFIER);
        }
        table.sqs[usize::from(qid)] = Some(Arc::clone(&sq));
    }
    if let Err(e) = state.spawn_worker(Arc::clone(&sq), cq) {
        warn!(qid, %e, "cannot start a queue worker");
        lock(&state.queues).sqs[usize::from(qid)] = None;
        return Err(Status::INTERNAL_ERROR);
    }
    let counter = match memory {
        QueueMemory::Cmb => &state.stats.io_sqs_created_in_cmb,
        QueueMemory::Host => &state.stats.io_sqs_created_in_host,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    info!(
        qid,
        cqid,
        entries,
        base = format_args!("{base:#x}"),
        in_cmb = memory == QueueMemory::Cmb,
        "I/O submission queue created"
    );
    Ok(Outcome::success())
}

pub(super) fn delete_io_sq(cx: &mut CommandContext<'_>, f: DeleteIoQueue) -> CommandResult {
    let state = cx.state;
    if f.qid == 0 {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    let sq = lock(&state.queues)
        .sqs
        .get_mut(usize::from(f.qid))
        .and_then(Option::take)
        .ok_or(Status::INVALID_QUEUE_IDENTIFIER)?;
    sq.request_stop();
    // Wake a worker waiting for completion queue space so it notices.
    if let Some(cq) = lock(&state.queues).cq(sq.cqid) {
        cq.space.notify();
    }
    // The command being executed finishes and completes; entries not yet
    // fetched are dropped. Waiting here is safe: this is not the socket
    // thread.
    let handle = lock(&sq.worker).take();
    if let Some(handle) = handle {
        let _ = handle.join();
    }
    // Commands held by an injected `timeout` go with their queue.
    lock(&state.held).retain(|h| h.sq.id != f.qid);
    info!(qid = f.qid, "I/O submission queue deleted");
    Ok(Outcome::success())
}

pub(super) fn delete_io_cq(cx: &mut CommandContext<'_>, f: DeleteIoQueue) -> CommandResult {
    let qid = f.qid;
    if qid == 0 {
        return Err(Status::INVALID_QUEUE_IDENTIFIER);
    }
    let mut table = lock(&cx.state.queues);
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
    Ok(Outcome::success())
}

pub(super) fn doorbell_buffer_config(
    cx: &mut CommandContext<'_>,
    f: DoorbellBufferConfig,
) -> CommandResult {
    let state = cx.state;
    let (doorbells, event_idx) = (f.shadow_doorbell_buffer, f.eventidx_buffer);
    let mask = state.page_size() - 1;
    if doorbells & mask != 0 || event_idx & mask != 0 {
        return Err(Status::INVALID_FIELD);
    }
    let buffers = (doorbells, event_idx);
    lock(&state.admin).doorbell_buffers = Some(buffers);
    let (sqs, cqs): (Vec<Arc<SubmissionQueue>>, Vec<Arc<CompletionQueue>>) = {
        let table = lock(&state.queues);
        (
            table.sqs.iter().flatten().cloned().collect(),
            table.cqs.iter().flatten().cloned().collect(),
        )
    };
    // The admin queue keeps using its MMIO doorbells: hosts (Linux among
    // them) never update its shadow slots.
    for sq in sqs.iter().filter(|q| q.id != 0) {
        let shadow = Shadow::for_queue(buffers, sq.id, QueueKind::Submission);
        let _ = state
            .mem
            .write_u32(shadow.doorbell, sq.tail.load(Ordering::Acquire));
        *lock(&sq.shadow) = Some(shadow);
        sq.wake.notify();
    }
    for cq in cqs.iter().filter(|q| q.id != 0) {
        let shadow = Shadow::for_queue(buffers, cq.id, QueueKind::Completion);
        let _ = state
            .mem
            .write_u32(shadow.doorbell, cq.head.load(Ordering::Acquire));
        *lock(&cq.shadow) = Some(shadow);
    }
    info!(
        doorbells = format_args!("{doorbells:#x}"),
        event_idx = format_args!("{event_idx:#x}"),
        "shadow doorbells configured"
    );
    Ok(Outcome::success())
}
