//! Submission and completion queues shared between the socket thread
//! (doorbells) and the queue workers (fetching, posting).
//!
//! The socket thread only touches atomics and the wake-up notifiers here,
//! never a lock that is held across DMA: a DMA may wait on QEMU's main loop,
//! which may be waiting on the socket thread.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use p2plab_dma::DmaFault;

use crate::command::{Completion, CompletionEntry};
use crate::memory::DmaRouter;
use crate::spec::{CQE_SIZE, SQE_SIZE};
use crate::stats::Stats;

/// Which queue of a pair (doorbells and shadow slots come in pairs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueKind {
    Submission,
    Completion,
}

/// Where a queue's entries live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueMemory {
    /// Guest memory, reached through the transport.
    Host,
    /// The controller's own Controller Memory Buffer.
    Cmb,
}

/// Whether a completion queue signals its vector (Create I/O Completion
/// Queue IEN; the admin queue always does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CqInterrupts {
    Enabled,
    Disabled,
}

/// A one-shot wake-up flag with a condition variable.
///
/// `notify` runs on the socket thread for every doorbell write while the
/// vCPU waits for the reply, so it only takes the lock and makes the futex
/// wake-up system call when a waiter is actually asleep (or about to be);
/// a notification to a busy worker is a single atomic store.
#[derive(Default)]
pub(crate) struct Notifier {
    /// Set by `notify`, consumed by `wait`.
    pending: AtomicBool,
    /// Threads inside `wait`.
    waiters: AtomicU32,
    lock: Mutex<()>,
    cond: Condvar,
}

impl Notifier {
    pub fn notify(&self) {
        // SeqCst on both sides: either the waiter sees `pending`, or this
        // side sees the waiter and wakes it under the lock (which it holds
        // from its `pending` check until it sleeps).
        self.pending.store(true, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            drop(crate::lock(&self.lock));
            self.cond.notify_all();
        }
    }

    /// Returns when notified (consuming the notification) or after
    /// `timeout`.
    pub fn wait(&self, timeout: Duration) {
        if self.pending.swap(false, Ordering::AcqRel) {
            return;
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let guard = crate::lock(&self.lock);
        if !self.pending.load(Ordering::SeqCst) {
            let _guard = match self.cond.wait_timeout(guard, timeout) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        } else {
            drop(guard);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        self.pending.store(false, Ordering::Release);
    }
}

/// Addresses of one queue's slots in the shadow doorbell and EventIdx
/// buffers (Doorbell Buffer Config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shadow {
    pub doorbell: u64,
    pub event_idx: u64,
}

impl Shadow {
    /// Slots of queue `qid` of `kind`, with CAP.DSTRD = 0: the same layout
    /// as the MMIO doorbells.
    pub fn for_queue(buffers: (u64, u64), qid: u16, kind: QueueKind) -> Self {
        let cq = u64::from(kind == QueueKind::Completion);
        let offset = (2 * u64::from(qid) + cq) * 4;
        Self {
            doorbell: buffers.0.wrapping_add(offset),
            event_idx: buffers.1.wrapping_add(offset),
        }
    }
}

pub(crate) struct SubmissionQueue {
    pub id: u16,
    pub cqid: u16,
    pub base: u64,
    pub entries: u32,
    pub in_cmb: bool,
    /// Last tail written to the MMIO doorbell.
    pub tail: AtomicU32,
    /// The worker's head, for snapshots and SQHD.
    pub head: AtomicU32,
    pub fetched: AtomicU64,
    pub wake: Notifier,
    pub stop: AtomicBool,
    pub shadow: Mutex<Option<Shadow>>,
    pub worker: Mutex<Option<JoinHandle<()>>>,
}

impl SubmissionQueue {
    pub fn new(id: u16, cqid: u16, base: u64, entries: u32, memory: QueueMemory) -> Self {
        Self {
            id,
            cqid,
            base,
            entries,
            in_cmb: memory == QueueMemory::Cmb,
            tail: AtomicU32::new(0),
            head: AtomicU32::new(0),
            fetched: AtomicU64::new(0),
            wake: Notifier::default(),
            stop: AtomicBool::new(false),
            shadow: Mutex::new(None),
            worker: Mutex::new(None),
        }
    }

    pub fn shadow(&self) -> Option<Shadow> {
        *crate::lock(&self.shadow)
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify();
    }

    /// The tail to process up to: the shadow doorbell when configured (the
    /// host updates it before, and often instead of, the MMIO doorbell),
    /// else the MMIO value. An out-of-range shadow value is ignored.
    pub fn current_tail(&self, mem: &DmaRouter) -> u32 {
        if let Some(shadow) = self.shadow() {
            if let Ok(tail) = mem.read_u32(shadow.doorbell) {
                if tail < self.entries {
                    return tail;
                }
                tracing::debug!(sqid = self.id, tail, "shadow SQ tail out of range, ignored");
            }
        }
        self.tail.load(Ordering::Acquire)
    }

    pub fn entry_address(&self, index: u32) -> u64 {
        // Queue creation checks that the queue does not wrap the address
        // space; wrapping here only keeps a bug from becoming a panic.
        self.base.wrapping_add(u64::from(index) * SQE_SIZE as u64)
    }

    /// Tells the host (EventIdx) to ring the MMIO doorbell on its next
    /// submission, then reports whether the tail moved meanwhile. The fence
    /// pairs with the host's barrier between its shadow write and EventIdx
    /// read, so one side always sees the other's update.
    pub fn arm_event_idx(&self, mem: &DmaRouter, processed_up_to: u32) -> bool {
        let Some(shadow) = self.shadow() else {
            return false;
        };
        if mem.write_u32(shadow.event_idx, processed_up_to).is_err() {
            return false;
        }
        fence(Ordering::SeqCst);
        self.current_tail(mem) != processed_up_to
    }
}

pub(crate) struct PostState {
    pub phase: bool,
}

#[derive(Debug)]
pub(crate) enum PostError {
    /// The queue was deleted or the controller reset: drop the completion.
    Stopped,
    /// Writing the entry failed: a controller fatal status.
    Fault(DmaFault),
}

pub(crate) struct CompletionQueue {
    pub id: u16,
    pub base: u64,
    pub entries: u32,
    pub vector: u16,
    pub irq_enabled: bool,
    pub in_cmb: bool,
    /// Last head written to the MMIO doorbell.
    pub head: AtomicU32,
    /// Next slot to post into. Advanced before the entry is written, so a
    /// head doorbell can never legitimately name a slot beyond it.
    pub tail: AtomicU32,
    pub post: Mutex<PostState>,
    pub space: Notifier,
    pub stop: AtomicBool,
    pub shadow: Mutex<Option<Shadow>>,
    /// Whether `post` waits for the host to free a slot (a worker
    /// thread), or drops the completion at once as if the queue had
    /// stopped (queues run on the host's own thread, testing only).
    waits_when_full: bool,
}

impl CompletionQueue {
    pub fn new(
        id: u16,
        base: u64,
        entries: u32,
        vector: u16,
        interrupts: CqInterrupts,
        memory: QueueMemory,
    ) -> Self {
        Self {
            id,
            base,
            entries,
            vector,
            irq_enabled: interrupts == CqInterrupts::Enabled,
            in_cmb: memory == QueueMemory::Cmb,
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            post: Mutex::new(PostState { phase: true }),
            space: Notifier::default(),
            stop: AtomicBool::new(false),
            shadow: Mutex::new(None),
            waits_when_full: true,
        }
    }

    /// The queue for a controller whose queues run on the host's thread:
    /// a post to it when full is dropped instead of waiting for a host
    /// that cannot run.
    #[cfg(feature = "testing")]
    pub fn never_waiting(self) -> Self {
        Self {
            waits_when_full: false,
            ..self
        }
    }

    pub fn shadow(&self) -> Option<Shadow> {
        *crate::lock(&self.shadow)
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.space.notify();
    }

    /// Whether the host has left no free slot.
    #[cfg(feature = "testing")]
    pub fn is_full(&self, mem: &DmaRouter) -> bool {
        let next = (self.tail.load(Ordering::Acquire) + 1) % self.entries;
        next == self.current_head(mem)
    }

    /// Whether a head doorbell value is acceptable: inside the queue and not
    /// past entries the controller has posted.
    pub fn head_is_valid(&self, new_head: u32) -> bool {
        if new_head >= self.entries {
            return false;
        }
        let n = self.entries;
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        let consumed = (new_head + n - head) % n;
        let posted = (tail + n - head) % n;
        consumed <= posted
    }

    /// The host's head: its shadow doorbell when it has one (the host
    /// writes the shadow before, and far more often than, the MMIO
    /// doorbell). The shadow value becomes the head that MMIO head
    /// doorbells are checked against: with shadow doorbells Linux rings
    /// the MMIO doorbell about once per lap, when its head passes
    /// EventIdx, and a head that stale made a valid doorbell look like it
    /// passed the posted entries (tail one lap further, on blktests'
    /// nvme/035 under load: "invalid doorbell write ignored").
    fn current_head(&self, mem: &DmaRouter) -> u32 {
        if let Some(shadow) = self.shadow() {
            if let Ok(head) = mem.read_u32(shadow.doorbell) {
                if head < self.entries {
                    self.head.store(head, Ordering::Release);
                    return head;
                }
            }
        }
        self.head.load(Ordering::Acquire)
    }

    /// Posts one completion, waiting while the queue is full. The phase
    /// tag flips each time the tail wraps. `cancel` (the submission queue's
    /// stop flag) abandons the wait too: a deleted queue's last completion
    /// is dropped rather than blocking the deletion forever. The admin
    /// queue passes `None`: it is never deleted, only reset, and a reset
    /// stops the completion queue itself.
    #[allow(clippy::too_many_arguments)]
    pub fn post(
        &self,
        mem: &DmaRouter,
        stats: &Stats,
        completion: &Completion,
        sq_head: u16,
        sqid: u16,
        cid: u16,
        cancel: Option<&AtomicBool>,
    ) -> Result<(), PostError> {
        let mut state = crate::lock(&self.post);
        loop {
            if self.stopped() || cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
                return Err(PostError::Stopped);
            }
            let tail = self.tail.load(Ordering::Acquire);
            let next = (tail + 1) % self.entries;
            if next != self.current_head(mem) {
                break;
            }
            // Full. With shadow doorbells the host only rings the MMIO
            // doorbell once its head passes EventIdx: ask for that now.
            if let Some(shadow) = self.shadow() {
                let head = self.current_head(mem);
                let _ = mem.write_u32(shadow.event_idx, head);
                fence(Ordering::SeqCst);
                if next != self.current_head(mem) {
                    continue;
                }
            }
            if !self.waits_when_full {
                return Err(PostError::Stopped);
            }
            tracing::trace!(cqid = self.id, "completion queue full, waiting");
            self.space.wait(Duration::from_millis(20));
        }
        let tail = self.tail.load(Ordering::Acquire);
        let phase = state.phase;
        let next = (tail + 1) % self.entries;
        if next == 0 {
            state.phase = !state.phase;
        }
        self.tail.store(next, Ordering::Release);
        let entry = CompletionEntry {
            dw0: completion.dw0,
            dw1: completion.dw1,
            sq_head,
            sqid,
            cid,
            phase,
            status: completion.status,
        }
        .encode();
        let addr = self.base.wrapping_add(u64::from(tail) * CQE_SIZE as u64);
        let placement = mem.write(addr, &entry).map_err(PostError::Fault)?;
        let counter = if placement.cmb > 0 {
            &stats.cq_entries_to_cmb
        } else {
            &stats.cq_entries_to_host
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Every queue by id; index 0 is the admin queue pair.
pub(crate) struct QueueTable {
    pub sqs: Vec<Option<Arc<SubmissionQueue>>>,
    pub cqs: Vec<Option<Arc<CompletionQueue>>>,
}

impl QueueTable {
    pub fn new(max_qid: u16) -> Self {
        let n = usize::from(max_qid) + 1;
        Self {
            sqs: vec![None; n],
            cqs: vec![None; n],
        }
    }

    pub fn sq(&self, qid: u16) -> Option<&Arc<SubmissionQueue>> {
        self.sqs.get(usize::from(qid)).and_then(Option::as_ref)
    }

    pub fn cq(&self, qid: u16) -> Option<&Arc<CompletionQueue>> {
        self.cqs.get(usize::from(qid)).and_then(Option::as_ref)
    }

    /// Whether `admin_cq` is still this table's admin completion queue:
    /// false once a reset removed it. A queue-creating admin command checks
    /// it under the table's lock, so no queue is added after the reset that
    /// stopped its worker (its worker would run unstopped).
    pub fn admin_is(&self, admin_cq: &CompletionQueue) -> bool {
        self.cq(0)
            .is_some_and(|cq| std::ptr::eq(Arc::as_ptr(cq), admin_cq))
    }

    /// Removes every queue and asks their workers to stop.
    pub fn stop_all(&mut self) -> Vec<Arc<SubmissionQueue>> {
        let sqs: Vec<_> = self.sqs.iter_mut().filter_map(Option::take).collect();
        for sq in &sqs {
            sq.request_stop();
        }
        for cq in self.cqs.iter_mut().filter_map(Option::take) {
            cq.request_stop();
        }
        sqs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::CompletionEntry;
    use crate::spec::Status;
    use p2plab_dma::testing::FakeGuestMemory;
    use p2plab_dma::GuestMemory;

    fn router(guest: Arc<FakeGuestMemory>) -> DmaRouter {
        DmaRouter::new(guest, None, Arc::new(Stats::default()))
    }

    fn read_cqe(g: &FakeGuestMemory, base: u64, i: u64) -> CompletionEntry {
        let mut e = [0u8; 16];
        g.read(base + i * 16, &mut e).unwrap();
        CompletionEntry::decode(&e)
    }

    #[test]
    fn phase_flips_on_wrap_and_full_queue_waits_for_the_head() {
        let g = Arc::new(FakeGuestMemory::new().with_region(0x1000, 0x1000));
        let mem = router(g.clone());
        let stats = Stats::default();
        let cq = Arc::new(CompletionQueue::new(
            1,
            0x1000,
            3,
            1,
            CqInterrupts::Enabled,
            QueueMemory::Host,
        ));
        let ok = Completion::success();
        cq.post(&mem, &stats, &ok, 1, 1, 10, None).unwrap();
        cq.post(&mem, &stats, &ok, 2, 1, 11, None).unwrap();
        assert!(read_cqe(&g, 0x1000, 0).phase && read_cqe(&g, 0x1000, 1).phase);
        assert_eq!(read_cqe(&g, 0x1000, 1).cid, 11);
        // Three entries, two posted, head 0: full (one slot stays empty).
        assert!(cq.head_is_valid(2));
        assert!(!cq.head_is_valid(3), "beyond the queue");
        let poster = {
            let cq = cq.clone();
            let mem = router(g.clone());
            std::thread::spawn(move || {
                let stats = Stats::default();
                cq.post(
                    &mem,
                    &stats,
                    &Completion::error(Status::INVALID_FIELD),
                    3,
                    1,
                    12,
                    None,
                )
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !poster.is_finished(),
            "posting waits while the queue is full"
        );
        cq.head.store(1, Ordering::Release);
        cq.space.notify();
        poster.join().unwrap().unwrap();
        let third = read_cqe(&g, 0x1000, 2);
        assert_eq!((third.cid, third.phase), (12, true));
        assert_eq!(third.status, Status::INVALID_FIELD);
        cq.head.store(3 % 3, Ordering::Release);
        cq.post(&mem, &stats, &ok, 4, 1, 13, None).unwrap();
        let wrapped = read_cqe(&g, 0x1000, 0);
        assert_eq!(
            (wrapped.cid, wrapped.phase),
            (13, false),
            "phase inverted after wrap"
        );
    }

    #[test]
    fn head_doorbell_cannot_pass_posted_entries() {
        let cq = CompletionQueue::new(1, 0, 8, 0, CqInterrupts::Enabled, QueueMemory::Host);
        cq.tail.store(3, Ordering::Release);
        assert!(cq.head_is_valid(3));
        assert!(cq.head_is_valid(0));
        assert!(!cq.head_is_valid(4));
        cq.head.store(6, Ordering::Release);
        cq.tail.store(1, Ordering::Release);
        assert!(cq.head_is_valid(0), "wrapped");
        assert!(!cq.head_is_valid(2));
        assert!(!cq.head_is_valid(5), "going backwards");
    }

    #[test]
    fn a_head_doorbell_a_lap_after_the_last_one_is_valid_with_shadow_doorbells() {
        let g = Arc::new(FakeGuestMemory::new().with_region(0x1000, 0x1000));
        let mem = router(g.clone());
        let stats = Stats::default();
        let cq = CompletionQueue::new(1, 0x1000, 8, 1, CqInterrupts::Enabled, QueueMemory::Host);
        let (doorbell, event_idx) = (0x1800, 0x1900);
        *crate::lock(&cq.shadow) = Some(Shadow {
            doorbell,
            event_idx,
        });
        let ok = Completion::success();
        for cid in 0..7 {
            cq.post(&mem, &stats, &ok, 0, 1, cid, None).unwrap();
        }
        // The host consumes all seven through its shadow doorbell only (no
        // MMIO write: it rings MMIO when it passes EventIdx), then one more
        // completion wraps the tail to 0.
        g.write(doorbell, &7u32.to_le_bytes()).unwrap();
        cq.post(&mem, &stats, &ok, 0, 1, 7, None).unwrap();
        assert_eq!(cq.tail.load(Ordering::Acquire), 0);
        // Its MMIO doorbell now says 7: nothing past the posted entries.
        assert!(cq.head_is_valid(7));
        assert!(cq.head_is_valid(0), "after consuming the eighth");
        assert!(!cq.head_is_valid(1), "past the tail");
    }

    #[test]
    fn a_deleted_submission_queue_abandons_a_full_completion_queue() {
        let g = Arc::new(FakeGuestMemory::new().with_region(0x1000, 0x1000));
        let mem = router(g);
        let cq = Arc::new(CompletionQueue::new(
            1,
            0x1000,
            2,
            1,
            CqInterrupts::Enabled,
            QueueMemory::Host,
        ));
        let stats = Stats::default();
        cq.post(&mem, &stats, &Completion::success(), 0, 1, 1, None)
            .unwrap();
        let cancel = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (cq, cancel) = (cq.clone(), cancel.clone());
            std::thread::spawn(move || {
                let stats = Stats::default();
                cq.post(
                    &mem,
                    &stats,
                    &Completion::success(),
                    0,
                    1,
                    2,
                    Some(&*cancel),
                )
            })
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!waiter.is_finished());
        cancel.store(true, Ordering::Release);
        cq.space.notify();
        assert!(matches!(waiter.join().unwrap(), Err(PostError::Stopped)));
        assert!(!cq.stopped(), "the completion queue itself lives on");
    }

    #[test]
    fn a_stopped_queue_drops_completions_even_when_full() {
        let g = Arc::new(FakeGuestMemory::new().with_region(0x1000, 0x1000));
        let mem = router(g);
        let cq = Arc::new(CompletionQueue::new(
            1,
            0x1000,
            2,
            1,
            CqInterrupts::Enabled,
            QueueMemory::Host,
        ));
        let stats = Stats::default();
        cq.post(&mem, &stats, &Completion::success(), 0, 1, 1, None)
            .unwrap();
        let waiter = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                let stats = Stats::default();
                cq.post(&mem, &stats, &Completion::success(), 0, 1, 2, None)
            })
        };
        std::thread::sleep(Duration::from_millis(30));
        cq.request_stop();
        assert!(matches!(waiter.join().unwrap(), Err(PostError::Stopped)));
    }

    #[test]
    fn notifier_wakes_a_sleeper_and_keeps_an_early_notification() {
        let n = Arc::new(Notifier::default());
        // Notified before waiting: returns at once, consuming it.
        n.notify();
        let t = std::time::Instant::now();
        n.wait(Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        // Nothing pending: times out.
        let t = std::time::Instant::now();
        n.wait(Duration::from_millis(20));
        assert!(t.elapsed() >= Duration::from_millis(20));
        // A sleeper is woken by a notification from another thread.
        for _ in 0..200 {
            let sleeper = {
                let n = n.clone();
                std::thread::spawn(move || {
                    let t = std::time::Instant::now();
                    n.wait(Duration::from_secs(10));
                    t.elapsed()
                })
            };
            n.notify();
            assert!(sleeper.join().unwrap() < Duration::from_secs(5));
        }
    }

    #[test]
    fn shadow_slots_follow_the_doorbell_layout() {
        let s = Shadow::for_queue((0x10000, 0x20000), 3, QueueKind::Completion);
        assert_eq!(s.doorbell, 0x10000 + 28);
        assert_eq!(s.event_idx, 0x20000 + 28);
    }
}
