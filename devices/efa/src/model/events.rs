//! What the device writes back: completion entries (with the phase byte
//! written last), event-queue entries for armed CQs, and interrupts.
//!
//! A CQ's writer lock is held across the DMA of its entry, so completions
//! of one CQ land in order; the register path never takes it (it reads
//! the produced count, an atomic, and the small signal lock). An event
//! goes out when a completion lands in an armed CQ, or when a CQ is armed
//! while completions the consumer has not seen are there, whichever comes
//! second; both sides decide under the CQ's signal lock, so neither a
//! lost wake-up nor a double event can happen.

use std::sync::atomic::Ordering;

use p2plab_kit::Epoch;

use super::state::{lock, MgmtJob, Ring};
use super::Device;
use crate::defs::{IoQueue, IoStatus};
use crate::io::{encode_eqe, Cqe, CQE_FLAGS_AT, EQE_SIZE};
use crate::regs::{EQ_DB_ARM, EQ_DB_EQN_MASK};
use crate::stats::Stats;

impl Device {
    /// Sends `vector`, unless a `drop-irq` fault swallows it.
    pub(crate) fn interrupt(&self, vector: u16) {
        let dropped = {
            let mut faults = self.faults();
            !faults.is_idle() && faults.drop_interrupt()
        };
        if dropped {
            Stats::add(&self.stats.dropped_interrupts, 1);
            self.trace.record("irq", || {
                serde_json::json!({"name": "interrupt dropped", "vector": vector, "injected": true})
            });
            return;
        }
        Stats::add(&self.stats.interrupts, 1);
        self.irq.notify(vector);
    }

    /// Writes a completion to CQ `cq` for work of `epoch`; whether it
    /// landed. A `cq-error` fault replaces its status.
    pub(crate) fn post_cqe(&self, cq_idx: u16, epoch: Epoch, mut cqe: Cqe) -> bool {
        let mut injected = false;
        {
            let mut faults = self.faults();
            if !faults.is_idle() {
                if let Some(status) = faults.cq_error().and_then(IoStatus::from_code) {
                    cqe.status = status;
                    injected = true;
                }
            }
        }
        let Some(cq) = self.lock().objects.cqs.get(usize::from(cq_idx)).cloned() else {
            p2plab_ratelimit::log_limited!(debug, cq_idx, "completion for a CQ that is gone");
            return false;
        };
        let memory = self.gate.bound(epoch);
        {
            let mut writer = lock(&cq.shared.writer);
            let ring = Ring {
                base: cq.ring,
                depth: cq.depth,
            };
            let count = writer.count;
            let addr = ring.entry(count, cq.entry_size as u64);
            let entry = cqe.encode(ring.phase(count), cq.entry_size);
            let entry = &entry[..cq.entry_size];
            let flags = CQE_FLAGS_AT as u64;
            // Everything but the flags byte, then the flags byte with the
            // phase: the consumer reads the phase first.
            let written = p2plab_dma::GuestMemory::write(&memory, addr, &entry[..CQE_FLAGS_AT])
                .and_then(|()| {
                    p2plab_dma::GuestMemory::write(
                        &memory,
                        addr + flags + 1,
                        &entry[CQE_FLAGS_AT + 1..],
                    )
                })
                .and_then(|()| {
                    std::sync::atomic::fence(Ordering::Release);
                    p2plab_dma::GuestMemory::write(
                        &memory,
                        addr + flags,
                        &entry[CQE_FLAGS_AT..=CQE_FLAGS_AT],
                    )
                });
            if let Err(fault) = written {
                self.dma_failed("completion write", &fault);
                return false;
            }
            writer.count = count.wrapping_add(1);
            cq.shared.produced.store(writer.count, Ordering::SeqCst);
        }
        Stats::add(&self.stats.cqes, 1);
        if cqe.status != IoStatus::Ok {
            Stats::add(&self.stats.cqe_errors, 1);
        }
        if injected {
            Stats::add(&self.stats.injected_cq_errors, 1);
        }
        self.trace.record("cqe", || {
            serde_json::json!({
                "name": format!("{} {}", queue_name(cqe.queue), cqe.status.name()),
                "cq_idx": cq_idx,
                "qp_num": cqe.qp_num,
                "req_id": cqe.req_id,
                "q_type": cqe.queue.name(),
                "op_type": cqe.op.name(),
                "status": cqe.status.name(),
                "length": cqe.length,
                "injected": injected,
            })
        });
        if let Some(eqn) = cq.eq {
            let fire = std::mem::take(&mut lock(&cq.shared.signal).armed);
            if fire {
                self.post_eqe(eqn, cq_idx, epoch);
            }
        }
        true
    }

    /// Writes a completion event for CQ `cqn` to EQ `eqn` and raises its
    /// vector if the EQ is armed.
    pub(crate) fn post_eqe(&self, eqn: u16, cqn: u16, epoch: Epoch) {
        let Some(eq) = self.lock().objects.eqs.get(usize::from(eqn)).cloned() else {
            return;
        };
        let memory = self.gate.bound(epoch);
        {
            let mut writer = lock(&eq.shared.writer);
            let ring = Ring {
                base: eq.ring,
                depth: eq.depth,
            };
            let count = writer.count;
            let addr = ring.entry(count, EQE_SIZE as u64);
            let entry = encode_eqe(cqn, ring.phase(count));
            // Word 0 holds the phase: the rest first.
            let written =
                p2plab_dma::GuestMemory::write(&memory, addr + 4, &entry[4..]).and_then(|()| {
                    std::sync::atomic::fence(Ordering::Release);
                    p2plab_dma::GuestMemory::write(&memory, addr, &entry[..4])
                });
            if let Err(fault) = written {
                self.dma_failed("event queue write", &fault);
                return;
            }
            writer.count = count.wrapping_add(1);
        }
        Stats::add(&self.stats.eqes, 1);
        self.trace.record(
            "eqe",
            || serde_json::json!({"name": "completion event", "eqn": eqn, "cqn": cqn}),
        );
        let fire = {
            let mut signal = lock(&eq.shared.signal);
            signal.pending = true;
            if signal.armed {
                signal.armed = false;
                signal.pending = false;
                true
            } else {
                false
            }
        };
        if fire {
            self.interrupt(eq.vector);
        }
    }
}

fn queue_name(queue: IoQueue) -> &'static str {
    match queue {
        IoQueue::SendQueue => "send",
        IoQueue::RecvQueue => "recv",
    }
}

/// EQ_DB: arms an event queue; raises its vector at once if events came
/// while it was not armed.
pub(crate) fn arm_eq(device: &Device, value: u32) {
    if value & EQ_DB_ARM == 0 {
        return;
    }
    let eqn = (value & EQ_DB_EQN_MASK) as u16;
    let Some(eq) = device.lock().objects.eqs.get(usize::from(eqn)).cloned() else {
        p2plab_ratelimit::log_limited!(debug, eqn, "EQ_DB for an EQ that does not exist");
        return;
    };
    let fire = {
        let mut signal = lock(&eq.shared.signal);
        signal.armed = true;
        if signal.pending {
            signal.armed = false;
            signal.pending = false;
            true
        } else {
            false
        }
    };
    if fire {
        device.interrupt(eq.vector);
    }
}

/// A CQ doorbell with the arm bit: arms the CQ, or, when completions the
/// consumer has not seen (`consumed` is its count) are already there,
/// has the management thread post the event now.
pub(crate) fn arm_cq(device: &Device, cq_idx: u16, consumed: u16) {
    let cq = {
        let state = device.lock();
        match state.objects.cqs.get(usize::from(cq_idx)) {
            Some(cq) if cq.eq.is_some() => cq.clone(),
            _ => return,
        }
    };
    let event_now = {
        let mut signal = lock(&cq.shared.signal);
        if cq.shared.produced() as u16 != consumed {
            signal.armed = false;
            true
        } else {
            signal.armed = true;
            false
        }
    };
    if event_now {
        device.lock().mgmt_jobs.push_back(MgmtJob::CqEvent {
            cq: cq_idx,
            generation: cq.generation,
        });
        device.mgmt_wake.notify_all();
    }
}
