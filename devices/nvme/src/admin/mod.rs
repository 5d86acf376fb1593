//! The admin command set: its command table and handlers, run on the admin
//! queue's worker.
//!
//! - [`queues`]: Create and Delete I/O Submission and Completion Queues,
//!   Doorbell Buffer Config.
//! - [`info`]: Identify, Get Log Page, Get and Set Features.
//! - here: the table, Abort, Asynchronous Event Request, Format NVM.

mod info;
mod ocp;
mod queues;

#[cfg(test)]
pub(crate) use ocp::MAX_ENTRIES as OCP_MAX_ENTRIES;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::{debug, info};

use crate::command::Completion;
use crate::context::{CommandContext, CommandResult, Outcome};
use crate::datapointer::{DataPointers, DataTransfer};
use crate::fields::{
    Abort, AsyncEventRequest, CommandFields, CreateIoCq, CreateIoSq, DeleteIoQueue,
    DoorbellBufferConfig, FormatNvm, GetFeatures, GetLogPage, Identify, SetFeatures,
};
use crate::lock;
use crate::queues::CompletionQueue;
use crate::spec::effects::{CSUPP, LBCC, NCC, NIC};
use crate::spec::{admin as op, Status, NSID_ALL};
use crate::state::ControllerState;
use crate::table::{CommandRow, CommandTable};

/// Every admin command this controller supports.
pub(crate) static ADMIN_COMMANDS: CommandTable = CommandTable::new(
    "unsupported admin opcode",
    // Over PCIe, admin commands use PRPs only.
    DataPointers::PrpOnly,
    &[
        CommandRow {
            opcode: op::DELETE_SQ,
            name: "Delete I/O Submission Queue",
            fault_name: "delete-sq",
            run: |cx, cmd| queues::delete_io_sq(cx, DeleteIoQueue::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::None,
        },
        CommandRow {
            opcode: op::CREATE_SQ,
            name: "Create I/O Submission Queue",
            fault_name: "create-sq",
            run: |cx, cmd| queues::create_io_sq(cx, CreateIoSq::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::HostToController,
        },
        CommandRow {
            opcode: op::GET_LOG_PAGE,
            name: "Get Log Page",
            fault_name: "get-log-page",
            run: |cx, cmd| info::get_log_page(cx, GetLogPage::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::ControllerToHost,
        },
        CommandRow {
            opcode: op::DELETE_CQ,
            name: "Delete I/O Completion Queue",
            fault_name: "delete-cq",
            run: |cx, cmd| queues::delete_io_cq(cx, DeleteIoQueue::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::None,
        },
        CommandRow {
            opcode: op::CREATE_CQ,
            name: "Create I/O Completion Queue",
            fault_name: "create-cq",
            run: |cx, cmd| queues::create_io_cq(cx, CreateIoCq::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::HostToController,
        },
        CommandRow {
            opcode: op::IDENTIFY,
            name: "Identify",
            fault_name: "identify",
            run: |cx, cmd| info::identify(cx, Identify::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::ControllerToHost,
        },
        CommandRow {
            opcode: op::ABORT,
            name: "Abort",
            fault_name: "abort",
            run: |cx, cmd| abort(cx, Abort::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::None,
        },
        CommandRow {
            opcode: op::SET_FEATURES,
            name: "Set Features",
            fault_name: "set-features",
            run: |cx, cmd| info::set_features(cx, SetFeatures::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::HostToController,
        },
        CommandRow {
            opcode: op::GET_FEATURES,
            name: "Get Features",
            fault_name: "get-features",
            run: |cx, cmd| info::get_features(cx, GetFeatures::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::ControllerToHost,
        },
        CommandRow {
            opcode: op::ASYNC_EVENT_REQUEST,
            name: "Asynchronous Event Request",
            fault_name: "async-event-request",
            run: |cx, cmd| async_event_request(cx, AsyncEventRequest::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::None,
        },
        CommandRow {
            opcode: op::DOORBELL_BUFFER_CONFIG,
            name: "Doorbell Buffer Config",
            fault_name: "doorbell-buffer-config",
            run: |cx, cmd| queues::doorbell_buffer_config(cx, DoorbellBufferConfig::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::None,
        },
        CommandRow {
            opcode: op::FORMAT_NVM,
            name: "Format NVM",
            fault_name: "format-nvm",
            run: |cx, cmd| format_nvm(cx, FormatNvm::parse(cmd)?),
            effects: CSUPP | LBCC | NCC | NIC,
            data: DataTransfer::None,
        },
    ],
);

/// Runs one admin command. [`Outcome::Deferred`]: the command is parked
/// (Asynchronous Event Request) and completes later through
/// [`deliver_events`].
pub(crate) fn execute(cx: &mut CommandContext<'_>) -> Outcome {
    // PRPs only over PCIe, and no fused operations (FUSES = 0), whatever
    // the opcode.
    let result = if cx.cmd.psdt() != 0 || cx.cmd.fuse() != 0 {
        Err(Status::INVALID_FIELD)
    } else {
        ADMIN_COMMANDS
            .find(cx.cmd.opcode())
            .and_then(|row| ADMIN_COMMANDS.run(row, cx))
    };
    Outcome::of(result)
}

/// Completes parked Asynchronous Event Requests with queued events.
pub(crate) fn deliver_events(state: &ControllerState, admin_cq: &CompletionQueue, sq_head: u16) {
    let deliverable = lock(&state.admin).events.take_deliverable();
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
        // The admin queue is never deleted (only reset): nothing cancels.
        if admin_cq
            .post(&state.mem, &state.stats, &c, sq_head, 0, cid, None)
            .is_err()
        {
            return;
        }
        state.stats.async_events.fetch_add(1, Ordering::Relaxed);
    }
    state.interrupt(admin_cq);
}

fn async_event_request(cx: &mut CommandContext<'_>, f: AsyncEventRequest) -> CommandResult {
    let limit = usize::from(cx.state.cfg.aerl) + 1;
    lock(&cx.state.admin).events.park(f.cid, limit)?;
    debug!(cid = f.cid, "asynchronous event request parked");
    Ok(Outcome::Deferred)
}

fn abort(cx: &mut CommandContext<'_>, f: Abort) -> CommandResult {
    let state = cx.state;
    if lock(&state.queues).sq(f.sqid).is_none() {
        return Err(Status::INVALID_FIELD);
    }
    // Parked Asynchronous Event Requests and commands held by an injected
    // `timeout` can be caught; every other command runs to completion once
    // fetched. Dword 0 bit 0 set means "not aborted".
    if let Some(held) = state.take_held(f.sqid, f.cid) {
        let aborted = Completion::error(Status::ABORT_REQUESTED);
        let sq_head = held.sq.head.load(Ordering::Acquire) as u16;
        let cancel = (f.sqid != 0).then_some(&held.sq.stop);
        let posted = held.cq.post(
            &state.mem,
            &state.stats,
            &aborted,
            sq_head,
            f.sqid,
            f.cid,
            cancel,
        );
        if posted.is_ok() {
            state.interrupt(&held.cq);
            state.stats.commands_aborted.fetch_add(1, Ordering::Relaxed);
            info!(sqid = f.sqid, cid = f.cid, "held command aborted");
            // The held command's end, for the trace (it never ran, so it
            // has no latency).
            state.trace.record("cmd", || {
                let table = if f.sqid == 0 {
                    &ADMIN_COMMANDS
                } else {
                    &crate::io::IO_COMMANDS
                };
                serde_json::json!({
                    "name": table.name(held.opcode),
                    "opcode": p2plab_trace::hex(u64::from(held.opcode)),
                    "sqid": f.sqid,
                    "cid": f.cid,
                    "status": Status::ABORT_REQUESTED.name(),
                    "injected": true,
                })
            });
            return Ok(Outcome::with_result(0));
        }
        return Ok(Outcome::with_result(1));
    }
    if f.sqid == 0 && lock(&state.admin).events.unpark(f.cid) {
        let aborted = Completion::error(Status::ABORT_REQUESTED);
        let _ = cx.cq.post(
            &state.mem,
            &state.stats,
            &aborted,
            cx.sq_head,
            0,
            f.cid,
            None,
        );
        info!(cid = f.cid, "asynchronous event request aborted");
        return Ok(Outcome::with_result(0));
    }
    Ok(Outcome::with_result(1))
}

fn format_nvm(cx: &mut CommandContext<'_>, f: FormatNvm) -> CommandResult {
    let state = cx.state;
    let targets: Vec<_> = match f.nsid {
        NSID_ALL => state.namespaces.clone(),
        nsid => vec![Arc::clone(state.check_nsid(nsid)?)],
    };
    if f.pi != 0 {
        // No metadata, so no protection information.
        return Err(Status::INVALID_FORMAT);
    }
    if f.ses > 1 {
        // No cryptographic erase; user data erase is what format does.
        return Err(Status::INVALID_FIELD);
    }
    if targets.iter().any(|ns| f.lbaf >= ns.format_count()) {
        return Err(Status::INVALID_FORMAT);
    }
    for ns in targets {
        ns.format(f.lbaf)?;
        state.forget_bad_blocks(ns.nsid());
        info!(
            nsid = ns.nsid(),
            block_size = ns.block_size(),
            "namespace formatted"
        );
    }
    Ok(Outcome::success())
}
