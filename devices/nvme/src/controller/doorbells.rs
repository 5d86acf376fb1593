//! Doorbell writes: a submission queue's new tail or a completion queue's
//! new head, stored and handed to the queue's worker. A bad one is ignored
//! and reported to the host as an asynchronous event.

use std::sync::atomic::Ordering;

use tracing::trace;

use super::NvmeController;
use crate::logs::{AsyncEvent, ErrorEntry};
use crate::queues::QueueKind;
use crate::registers::DOORBELLS;
use crate::spec::{aen, Status};

impl NvmeController {
    /// The doorbell dword at `offset` (at or past [`DOORBELLS`]):
    /// SQ y tail at `DOORBELLS + 8y`, CQ y head 4 bytes later
    /// (CAP.DSTRD = 0).
    pub(super) fn doorbell(&self, offset: u64, value: u32) {
        let state = &self.state;
        state.stats.doorbell_writes.fetch_add(1, Ordering::Relaxed);
        let index = (offset - DOORBELLS) / 4;
        let kind = if index % 2 == 1 {
            QueueKind::Completion
        } else {
            QueueKind::Submission
        };
        let qid = index / 2;
        let table = crate::lock(&state.queues);
        let found = u16::try_from(qid).ok().and_then(|qid| {
            let exists = match kind {
                QueueKind::Completion => table.cq(qid).is_some(),
                QueueKind::Submission => table.sq(qid).is_some(),
            };
            exists.then_some(qid)
        });
        let Some(qid) = found else {
            drop(table);
            self.invalid_doorbell(
                qid,
                kind,
                value,
                aen::ERROR_INVALID_DOORBELL_REGISTER,
                "no such queue",
            );
            return;
        };
        match kind {
            QueueKind::Completion => {
                let Some(cq) = table.cq(qid) else { return };
                if value > 0xffff || !cq.head_is_valid(value) {
                    drop(table);
                    self.invalid_doorbell(
                        u64::from(qid),
                        kind,
                        value,
                        aen::ERROR_INVALID_DOORBELL_VALUE,
                        "head beyond the queue or past posted entries",
                    );
                    return;
                }
                trace!(cqid = qid, head = value, "CQ head doorbell");
                state.trace.record(
                    "doorbell",
                    || serde_json::json!({"name": "CQ head", "cqid": qid, "value": value}),
                );
                cq.head.store(value, Ordering::Release);
                cq.space.notify();
            }
            QueueKind::Submission => {
                let Some(sq) = table.sq(qid) else { return };
                if value >= sq.entries {
                    drop(table);
                    self.invalid_doorbell(
                        u64::from(qid),
                        kind,
                        value,
                        aen::ERROR_INVALID_DOORBELL_VALUE,
                        "tail beyond the queue",
                    );
                    return;
                }
                trace!(sqid = qid, tail = value, "SQ tail doorbell");
                state.trace.record(
                    "doorbell",
                    || serde_json::json!({"name": "SQ tail", "sqid": qid, "value": value}),
                );
                sq.tail.store(value, Ordering::Release);
                sq.wake.notify();
            }
        }
    }

    /// A bad doorbell write is ignored and reported to the host as an
    /// Error asynchronous event (Invalid Doorbell Register / Write Value)
    /// with an Error Information log entry, delivered when an Asynchronous
    /// Event Request is (or becomes) outstanding.
    fn invalid_doorbell(&self, qid: u64, kind: QueueKind, value: u32, info: u8, why: &str) {
        let state = &self.state;
        state
            .stats
            .invalid_doorbell_writes
            .fetch_add(1, Ordering::Relaxed);
        p2plab_ratelimit::log_limited!(
            warn,
            qid,
            kind = match kind {
                QueueKind::Completion => "CQ head",
                QueueKind::Submission => "SQ tail",
            },
            value,
            "invalid doorbell write ignored: {why}"
        );
        if !crate::lock(&state.regs).ready {
            return;
        }
        {
            let mut admin = crate::lock(&state.admin);
            admin.error_log.record(ErrorEntry {
                sqid: u16::try_from(qid).unwrap_or(0xffff),
                cid: 0xffff,
                status: Status::INVALID_FIELD,
                nsid: 0,
                lba: 0,
            });
            admin.events.push(AsyncEvent::error(info));
        }
        if let Some(admin_sq) = crate::lock(&state.queues).sq(0) {
            admin_sq.wake.notify();
        }
    }
}
