//! The per-submission-queue worker: fetch, execute through the queue's
//! command table, complete, interrupt, and the bookkeeping of every
//! finished command (counters, error log, trace).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info};

use crate::admin::{self, ADMIN_COMMANDS};
use crate::command::{Command, Completion};
use crate::context::{BounceBuffers, CommandContext, Outcome};
use crate::fault::{CommandInfo, Decision};
use crate::fields::{CommandFields, ReadWrite};
use crate::io::{self, IO_COMMANDS};
use crate::logs::ErrorEntry;
use crate::queues::{CompletionQueue, PostError, SubmissionQueue};
use crate::spec::{io as io_op, Status, SQE_SIZE};
use crate::state::{ControllerState, HeldCommand};

/// Completions posted before the interrupt is signalled even though more
/// commands are waiting (interrupt batching).
const MAX_UNSIGNALLED: u32 = 4;
/// How long an idle worker sleeps before looking again without a doorbell:
/// short with shadow doorbells (the host may skip the MMIO write), long
/// otherwise (only a safety net).
const IDLE_SHADOW: Duration = Duration::from_millis(5);
const IDLE: Duration = Duration::from_millis(200);
/// How long an idle worker keeps watching the shadow tail before it arms
/// EventIdx and sleeps. While EventIdx is not armed the host skips the
/// trapped doorbell write, a synchronous vfio-user round trip with the vCPU
/// stalled, plus a futex wake-up of this thread. The host usually submits
/// its next batch within this window (it just got our interrupt); the
/// poll yields the CPU to any runnable thread (the TCG vCPUs) on each turn.
/// Measured 4k randread QD32 (guest fio): no poll 7.1k IOPS, 50 µs 16.4k,
/// 200 µs 19.4k, 500 µs 17.0k.
pub(crate) const POLL: Duration = Duration::from_micros(200);
/// A poll pays when the host's next submission comes within this long:
/// a streaming host (QD32) submits again within tens of µs, while one that
/// waits for each completion (QD1 under TCG: its vCPU takes the interrupt,
/// runs fio and submits 100 µs or more later) makes nearly every poll burn
/// most of [`POLL`] for one saved doorbell trap. Scored like the interrupt
/// hold: each poll that pays adds [`POLL_HIT`] (capped at
/// [`POLL_SCORE_MAX`]), each that does not takes 1 off; at 0 the worker
/// arms EventIdx at once for [`POLL_BACKOFF`] drained batches, then one
/// poll probes again. With the poll always on, the bench of 2026-11-27
/// measured 4k randread QD1 (O_DIRECT) at 294 µs of server CPU per I/O,
/// of which 113 µs busy: the rest was polling.
const POLL_PAYS: Duration = Duration::from_micros(100);
const POLL_HIT: u32 = 3;
const POLL_SCORE_MAX: u32 = 32;
const POLL_BACKOFF: u32 = 64;

/// How long a worker that has just drained its SQ holds the interrupt of
/// the completions it posted, watching for the host's next submission.
/// A host that streams commands (fio at QD32) keeps submitting while
/// earlier completions are outstanding: one interrupt then covers
/// several of them, and under TCG every interrupt the guest takes costs
/// its vCPU far more than the 20 µs. Measured 4k randread QD32 in `lab`
/// (2 rounds each, QEMU's nvme 20.1k IOPS alongside): no hold 27.1k, a
/// hold of 20 µs 43.7k.
const HOLD: Duration = Duration::from_micros(20);
/// Holds pay off when the host streams: each hold that sees a new
/// submission adds [`HOLD_HIT`] to a score (capped at [`HOLD_SCORE_MAX`]),
/// each that sees none takes 1 off. At 0, this many drained batches are
/// signalled at once before one hold probes again, so a host that waits
/// for each completion (QD1) almost never pays for a hold: its p50 and p99
/// latencies stay those of an immediate interrupt.
const HOLD_BACKOFF: u32 = 256;
const HOLD_HIT: u32 = 3;
const HOLD_SCORE_MAX: u32 = 32;

/// What the interrupt hold watches: a drained SQ's tail doorbell.
trait HeldQueue {
    /// The admin queue (never held: its commands come one at a time).
    fn is_admin(&self) -> bool;
    /// Whether the host queued entries past the last tail the worker saw.
    fn tail_moved(&self) -> bool;
    /// Whether the queue is being stopped (reset, deletion).
    fn stopped(&self) -> bool;
}

/// A live SQ as the hold sees it: `head` is the last tail the worker saw.
struct DrainedQueue<'a> {
    state: &'a ControllerState,
    sq: &'a SubmissionQueue,
    head: u32,
}

impl HeldQueue for DrainedQueue<'_> {
    fn is_admin(&self) -> bool {
        self.sq.id == 0
    }
    fn tail_moved(&self) -> bool {
        self.sq.current_tail(&self.state.mem) != self.head
    }
    fn stopped(&self) -> bool {
        self.sq.stopped()
    }
}

/// Whether the interrupt of a drained SQ is held (see [`HOLD`]).
#[derive(Default)]
struct InterruptHold {
    /// How well holds have paid off lately; none are tried at 0.
    score: u32,
    /// Drained batches still to signal at once before the next probe.
    backoff: u32,
}

impl InterruptHold {
    /// Called with the SQ drained: `true` when the host queued more
    /// meanwhile or does within `hold`, so the worker goes on without
    /// signalling; `false` to signal now.
    fn more_coming(&mut self, queue: &impl HeldQueue, hold: Duration) -> bool {
        if queue.tail_moved() {
            return true;
        }
        if queue.is_admin() {
            return false;
        }
        if self.score == 0 {
            if self.backoff > 0 {
                self.backoff -= 1;
                return false;
            }
            // Probe: one hold decides whether holding pays again.
            self.score = 1;
        }
        match watch(queue, hold) {
            Watched::Moved => {
                self.score = (self.score + HOLD_HIT).min(HOLD_SCORE_MAX);
                true
            }
            Watched::Stopped => false,
            Watched::Quiet => {
                self.score -= 1;
                if self.score == 0 {
                    self.backoff = HOLD_BACKOFF;
                }
                false
            }
        }
    }
}

/// What watching a drained SQ saw.
enum Watched {
    /// The host queued more entries.
    Moved,
    /// The queue is being stopped.
    Stopped,
    /// Neither, for the whole time.
    Quiet,
}

/// Watches a drained SQ for up to `time`, yielding the CPU to any runnable
/// thread (the TCG vCPUs) between looks. It looks at least once, even
/// when its thread was preempted for all of `time`. Its CPU time counts
/// as idle polling in the process's usage.
fn watch(queue: &impl HeldQueue, time: Duration) -> Watched {
    p2plab_server::usage::idle_poll(|| {
        let start = Instant::now();
        loop {
            if queue.stopped() {
                return Watched::Stopped;
            }
            if queue.tail_moved() {
                return Watched::Moved;
            }
            if start.elapsed() >= time {
                return Watched::Quiet;
            }
            std::thread::yield_now();
        }
    })
}

/// Whether a worker with a drained SQ polls its shadow tail before it
/// arms EventIdx (see [`POLL_PAYS`]).
#[derive(Default)]
struct SubmissionPoll {
    /// How well polls have paid off lately; none are tried at 0.
    score: u32,
    /// Drained batches still to go without a poll before the next probe.
    backoff: u32,
}

impl SubmissionPoll {
    /// Called with the SQ drained: polls the tail for up to `time` unless
    /// polls have not been paying; `true` when there is something to do
    /// (new entries, or a stop), `false` to arm EventIdx and wait.
    fn more_coming(&mut self, queue: &impl HeldQueue, time: Duration, pays: Duration) -> bool {
        if self.score == 0 {
            if self.backoff > 0 {
                self.backoff -= 1;
                return false;
            }
            // Probe: one poll decides whether polling pays again.
            self.score = 1;
        }
        let start = Instant::now();
        match watch(queue, time) {
            Watched::Moved => {
                if start.elapsed() <= pays {
                    self.score = (self.score + POLL_HIT).min(POLL_SCORE_MAX);
                } else {
                    self.missed();
                }
                true
            }
            Watched::Stopped => true,
            Watched::Quiet => {
                self.missed();
                false
            }
        }
    }

    fn missed(&mut self) {
        self.score = self.score.saturating_sub(1);
        if self.score == 0 {
            self.backoff = POLL_BACKOFF;
        }
    }
}

/// Decrements the live-worker count when the thread ends, panics included,
/// so CSTS.RDY can never stick at 1.
struct LiveWorker<'a>(&'a AtomicUsize);

impl Drop for LiveWorker<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a queue's loop does once its SQ is drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WhenDrained {
    /// Wait for the host (the worker thread).
    Wait,
    /// Return to the caller, which runs the queue on its own thread
    /// ([`run_queues_on_caller`]); also after `budget` entries, and before
    /// fetching an entry its full CQ could not take.
    #[cfg(feature = "testing")]
    Return { budget: u32 },
}

/// The worker thread's body (the state's [`QueueWorker`](crate::state::QueueWorker)).
pub(crate) fn run(state: Arc<ControllerState>, sq: Arc<SubmissionQueue>, cq: Arc<CompletionQueue>) {
    let _live = LiveWorker(&state.live_workers);
    tracing::debug!(
        sqid = sq.id,
        cqid = cq.id,
        entries = sq.entries,
        base = format_args!("{:#x}", sq.base),
        in_cmb = sq.in_cmb,
        "queue worker started"
    );
    serve(&state, &sq, &cq, WhenDrained::Wait);
    tracing::debug!(sqid = sq.id, "queue worker stopped");
}

/// Fetch, execute, complete and interrupt, from the SQ head the queue
/// reached so far (0 for a new queue), until the queue stops or, with
/// [`WhenDrained::Return`], it is drained.
fn serve(
    state: &Arc<ControllerState>,
    sq: &Arc<SubmissionQueue>,
    cq: &Arc<CompletionQueue>,
    when_drained: WhenDrained,
) {
    let span = tracing::debug_span!("sq", id = sq.id);
    let _span = span.enter();
    let mut head = sq.head.load(Ordering::Acquire);
    let mut unsignalled = 0u32;
    let mut hold = InterruptHold::default();
    let mut poll = SubmissionPoll::default();
    let hold_time = match when_drained {
        WhenDrained::Wait => HOLD,
        // Nobody submits while the caller's thread runs the queue.
        #[cfg(feature = "testing")]
        WhenDrained::Return { .. } => Duration::ZERO,
    };
    #[cfg(feature = "testing")]
    let mut fetched = 0u32;
    let mut buffers = BounceBuffers::default();
    let execute = if sq.id == 0 {
        admin::execute
    } else {
        io::execute
    };
    loop {
        if sq.stopped() || state.is_fatal() {
            break;
        }
        if sq.id == 0 {
            admin::deliver_events(state, cq, head as u16);
        }
        let tail = sq.current_tail(&state.mem);
        if head == tail {
            if unsignalled > 0 {
                state.interrupt(cq);
                unsignalled = 0;
            }
            if when_drained == WhenDrained::Wait
                && sq.shadow().is_some()
                && poll.more_coming(&DrainedQueue { state, sq, head }, POLL, POLL_PAYS)
            {
                continue;
            }
            if sq.arm_event_idx(&state.mem, head) {
                continue;
            }
            match when_drained {
                WhenDrained::Wait => sq.wake.wait(if sq.shadow().is_some() {
                    IDLE_SHADOW
                } else {
                    IDLE
                }),
                #[cfg(feature = "testing")]
                WhenDrained::Return { .. } => break,
            }
            continue;
        }
        #[cfg(feature = "testing")]
        if let WhenDrained::Return { budget } = when_drained {
            // A worker thread would wait in `post` for the host to free a
            // slot; the caller's thread is the host, so leave the entry
            // for the next run instead.
            if fetched >= budget || cq.is_full(&state.mem) {
                if unsignalled > 0 {
                    state.interrupt(cq);
                }
                break;
            }
            fetched += 1;
        }
        let mut raw = [0u8; SQE_SIZE];
        match state.mem.read(sq.entry_address(head), &mut raw) {
            Ok(placement) => {
                let counter = if placement.cmb > 0 {
                    &state.stats.sq_entries_from_cmb
                } else {
                    &state.stats.sq_entries_from_host
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                state.set_fatal(&format!("fetching SQ {} entry {head}: {e}", sq.id));
                break;
            }
        }
        head = (head + 1) % sq.entries;
        sq.head.store(head, Ordering::Release);
        sq.fetched.fetch_add(1, Ordering::Relaxed);
        let cmd = Command::from_bytes(raw);
        let started = Instant::now();
        let fault = state.decide_faults(&command_info(sq.id, &cmd));
        if !fault.is_none() {
            match apply_fault(state, sq, cq, &cmd, &fault) {
                FaultStep::Run => {}
                FaultStep::Held => continue,
                FaultStep::Stop => break,
            }
        }
        let completion = match fault.status {
            Some((sct_sc, dnr, more)) => Completion::error(injected_status(sct_sc, dnr, more)),
            None => {
                let mut cx = CommandContext::new(state, &cmd, cq, head as u16, &mut buffers);
                cx.corrupt = fault.corrupt;
                match execute(&mut cx) {
                    Outcome::Complete(c) => c,
                    // Parked (Asynchronous Event Request): completes later.
                    Outcome::Deferred => continue,
                }
            }
        };
        note_completion(state, sq.id, &cmd, &completion, started);
        state.trace.record_span("cmd", started, || {
            crate::trace::command(state, sq.id, &cmd, &completion, fault.status.is_some())
        });
        match cq.post(
            &state.mem,
            &state.stats,
            &completion,
            head as u16,
            sq.id,
            cmd.cid(),
            Some(&sq.stop),
        ) {
            Ok(()) if fault.drop_interrupt => {
                // The completion is in the queue; only its MSI-X message
                // is lost. Later completions' interrupts still cover it.
                state
                    .stats
                    .interrupts_dropped
                    .fetch_add(1, Ordering::Relaxed);
                info!(cid = cmd.cid(), "injected: interrupt dropped");
                state.trace.record("irq-dropped", || {
                    serde_json::json!({"cqid": cq.id, "vector": cq.vector, "cid": cmd.cid(), "injected": true})
                });
                continue;
            }
            Ok(()) if !fault.interrupt_delay.is_zero() => {
                // The completion is visible now; its interrupt (and this
                // queue's next commands) wait.
                state
                    .stats
                    .interrupts_delayed
                    .fetch_add(1, Ordering::Relaxed);
                sleep_unless_stopped(sq, fault.interrupt_delay);
                state.interrupt(cq);
                unsignalled = 0;
                continue;
            }
            Ok(()) => unsignalled += 1,
            Err(PostError::Stopped) => break,
            Err(PostError::Fault(e)) => {
                state.set_fatal(&format!("posting to CQ {}: {e}", cq.id));
                break;
            }
        }
        // Signal now unless more commands are waiting (they were already
        // there, the host queued some meanwhile, or does so within the
        // hold): one interrupt then covers several completions.
        if unsignalled >= MAX_UNSIGNALLED
            || (head == tail && !hold.more_coming(&DrainedQueue { state, sq, head }, hold_time))
        {
            state.interrupt(cq);
            unsignalled = 0;
        }
    }
}

/// Entries a queue runs per turn of [`run_queues_on_caller`], so that a
/// queue whose host-side tail moves as its own commands run (a shadow
/// doorbell their data lands on) cannot hold the caller forever.
#[cfg(feature = "testing")]
const CALLER_BUDGET: u32 = 64;
/// Turns over every queue per [`run_queues_on_caller`]: an admin command
/// can give another queue work (creating it over a shadow doorbell).
#[cfg(feature = "testing")]
const CALLER_TURNS: usize = 4;

/// Runs every queue's pending entries on the caller's thread, through the
/// same code and the same boundary as a worker thread, until no queue
/// has work (or each had [`CALLER_TURNS`] turns).
#[cfg(feature = "testing")]
pub(crate) fn run_queues_on_caller(state: &Arc<ControllerState>) {
    for _ in 0..CALLER_TURNS {
        let queues: Vec<(Arc<SubmissionQueue>, Arc<CompletionQueue>)> = {
            let table = crate::lock(&state.queues);
            table
                .sqs
                .iter()
                .flatten()
                .filter_map(|sq| Some((Arc::clone(sq), Arc::clone(table.cq(sq.cqid)?))))
                .collect()
        };
        let fetched = |queues: &[(Arc<SubmissionQueue>, Arc<CompletionQueue>)]| -> u64 {
            queues
                .iter()
                .map(|(sq, _)| sq.fetched.load(Ordering::Relaxed))
                .sum()
        };
        let before = fetched(&queues);
        for (sq, cq) in &queues {
            state.at_worker_boundary(sq.id, || {
                serve(
                    state,
                    sq,
                    cq,
                    WhenDrained::Return {
                        budget: CALLER_BUDGET,
                    },
                )
            });
        }
        let count = crate::lock(&state.queues).sqs.iter().flatten().count();
        if fetched(&queues) == before && count == queues.len() {
            break;
        }
    }
}

/// The fields of a command that injection specs match on.
fn command_info(sqid: u16, cmd: &Command) -> CommandInfo {
    let addresses_blocks = sqid != 0
        && matches!(
            cmd.opcode(),
            io_op::READ | io_op::WRITE | io_op::COMPARE | io_op::WRITE_ZEROES | io_op::VERIFY
        );
    let lba = if addresses_blocks {
        ReadWrite::parse(cmd).ok().map(|f| (f.slba, f.blocks()))
    } else {
        None
    };
    CommandInfo {
        queue: sqid,
        opcode: cmd.opcode(),
        nsid: cmd.nsid(),
        lba,
    }
}

/// An injected status as a completion status: SCT/SC, More (bit 13), DNR
/// (bit 14).
fn injected_status(sct_sc: u16, dnr: bool, more: bool) -> Status {
    Status::from_raw(sct_sc | (u16::from(more) << 13) | (u16::from(dnr) << 14))
}

/// Sleeps for `time`, in slices so that a reset or queue deletion is not
/// held up.
fn sleep_unless_stopped(sq: &SubmissionQueue, time: Duration) {
    let until = Instant::now() + time;
    while !sq.stopped() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// What the worker does after applying a fault.
enum FaultStep {
    /// Go on (with the decision's status or corruption, if any).
    Run,
    /// The command is held; fetch the next one.
    Held,
    /// The controller is fatal; the worker ends.
    Stop,
}

/// Applies the parts of a fault that come before a command runs: delay,
/// CSTS.CFS, holding the command.
fn apply_fault(
    state: &Arc<ControllerState>,
    sq: &Arc<SubmissionQueue>,
    cq: &Arc<CompletionQueue>,
    cmd: &Command,
    fault: &Decision,
) -> FaultStep {
    state
        .stats
        .injected_faults
        .fetch_add(u64::from(fault.fired), Ordering::Relaxed);
    info!(
        sqid = sq.id,
        cid = cmd.cid(),
        opcode = format_args!("{:#04x}", cmd.opcode()),
        nsid = cmd.nsid(),
        ?fault,
        "injected fault fires"
    );
    state
        .trace
        .record("fault", || crate::trace::fault(sq.id, cmd, fault));
    sleep_unless_stopped(sq, fault.latency);
    if fault.internal_error {
        // On purpose: the same unwind a handler bug takes, so the worker
        // boundary (catch_unwind in `ControllerState`) is what recovers.
        panic!(
            "injected internal error on SQ {} command {}",
            sq.id,
            cmd.cid()
        );
    }
    if fault.fatal {
        state.set_fatal(&format!(
            "injected cfs on SQ {} command {}",
            sq.id,
            cmd.cid()
        ));
        return FaultStep::Stop;
    }
    if let Some(abortable) = fault.hang {
        state.stats.commands_held.fetch_add(1, Ordering::Relaxed);
        crate::lock(&state.held).push(HeldCommand {
            sq: Arc::clone(sq),
            cq: Arc::clone(cq),
            cid: cmd.cid(),
            opcode: cmd.opcode(),
            abortable,
        });
        return FaultStep::Held;
    }
    FaultStep::Run
}

/// Bookkeeping for a finished command: counters, error log, tracing.
fn note_completion(
    state: &ControllerState,
    sqid: u16,
    cmd: &Command,
    c: &Completion,
    started: Instant,
) {
    let admin_queue = sqid == 0;
    if admin_queue {
        state.stats.admin_commands.fetch_add(1, Ordering::Relaxed);
    } else {
        state.stats.io_commands.fetch_add(1, Ordering::Relaxed);
        state
            .busy_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
    // CDW11:10 is the SLBA of the NVM commands that have one; the trace
    // and the error log report it for every I/O command.
    let (slba, blocks) = ReadWrite::parse(cmd).map_or((0, 0), |f| (f.slba, f.blocks()));
    if admin_queue {
        debug!(
            sqid,
            cid = cmd.cid(),
            opcode = format_args!("{:#04x}", cmd.opcode()),
            command = ADMIN_COMMANDS.name(cmd.opcode()),
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
            command = IO_COMMANDS.name(cmd.opcode()),
            nsid = cmd.nsid(),
            slba,
            nlb = blocks,
            status = %c.status,
            "I/O command"
        );
    }
    if c.status.is_success() || c.status == Status::ABORT_REQUESTED {
        return;
    }
    state.stats.failed_commands.fetch_add(1, Ordering::Relaxed);
    if matches!(
        c.status,
        Status::WRITE_FAULT | Status::UNRECOVERED_READ_ERROR
    ) {
        state.media_errors.fetch_add(1, Ordering::Relaxed);
    }
    // A media error reports the first unreadable block, as a drive does.
    let lba = if admin_queue {
        0
    } else if c.status == Status::UNRECOVERED_READ_ERROR {
        state.bad_block_for_log(cmd.nsid(), slba, blocks)
    } else {
        slba
    };
    crate::lock(&state.admin).error_log.record(ErrorEntry {
        sqid,
        cid: cmd.cid(),
        status: c.status,
        nsid: cmd.nsid(),
        lba,
    });
}

#[cfg(test)]
mod hold_tests {
    use std::cell::Cell;

    use super::*;

    /// A drained SQ whose host queues more on the `moves_on`-th look at
    /// its tail (never if `None`).
    struct FakeQueue {
        admin: bool,
        moves_on: Option<u32>,
        stopped: bool,
        looks: Cell<u32>,
    }

    impl FakeQueue {
        fn io(moves_on: Option<u32>) -> Self {
            FakeQueue {
                admin: false,
                moves_on,
                stopped: false,
                looks: Cell::new(0),
            }
        }
        /// Looks at the tail since the last call.
        fn take_looks(&self) -> u32 {
            self.looks.replace(0)
        }
    }

    impl HeldQueue for FakeQueue {
        fn is_admin(&self) -> bool {
            self.admin
        }
        fn tail_moved(&self) -> bool {
            self.looks.set(self.looks.get() + 1);
            self.moves_on.is_some_and(|n| self.looks.get() >= n)
        }
        fn stopped(&self) -> bool {
            self.stopped
        }
    }

    const SHORT: Duration = Duration::from_micros(300);
    const LONG: Duration = Duration::from_secs(30);
    /// A watch that must look more than once: long enough that a thread
    /// on a loaded host (the unit tests run beside a build) is not
    /// preempted for all of it.
    const WATCHED: Duration = Duration::from_millis(20);

    /// Catches a hold that does nothing: a host that submits again while
    /// the worker watches must find its interrupt still held, batch after
    /// batch, so one interrupt covers several completions.
    #[test]
    fn a_streaming_host_keeps_the_interrupt_held() {
        let mut hold = InterruptHold::default();
        for batch in 0..(4 * HOLD_BACKOFF) {
            let queue = FakeQueue::io(Some(3));
            assert!(hold.more_coming(&queue, LONG), "batch {batch}");
            assert_eq!(
                queue.take_looks(),
                3,
                "batch {batch} stopped watching early"
            );
        }
        assert_eq!(hold.score, HOLD_SCORE_MAX);
        // Entries already queued when the SQ is looked at need no hold,
        // on any queue.
        let queued = FakeQueue {
            admin: true,
            ..FakeQueue::io(Some(1))
        };
        assert!(hold.more_coming(&queued, LONG));
    }

    /// Catches a hold that never backs off (a host that waits for each
    /// completion, QD1, would pay the hold on every command) and one that
    /// never tries again once the host starts streaming.
    #[test]
    fn a_host_that_waits_turns_the_hold_off_then_it_is_probed_again() {
        let mut hold = InterruptHold::default();
        // The first drained batch probes: it waits the whole hold.
        let idle = FakeQueue::io(None);
        let start = Instant::now();
        assert!(!hold.more_coming(&idle, WATCHED));
        assert!(start.elapsed() >= WATCHED);
        assert!(idle.take_looks() > 1);
        // The probe missed: the next HOLD_BACKOFF batches are signalled
        // at once, after one look.
        for batch in 0..HOLD_BACKOFF {
            assert!(!hold.more_coming(&idle, LONG), "batch {batch}");
            assert_eq!(idle.take_looks(), 1, "batch {batch} was held");
        }
        // Then one probe again, which a streaming host wins back.
        let streaming = FakeQueue::io(Some(2));
        assert!(hold.more_coming(&streaming, LONG));
        assert_eq!(streaming.take_looks(), 2);
        // A won hold survives as many misses as it scored.
        let score = hold.score;
        assert_eq!(score, 1 + HOLD_HIT);
        for miss in 0..score {
            assert!(!hold.more_coming(&idle, WATCHED), "miss {miss}");
            assert!(idle.take_looks() > 1, "miss {miss} was not held");
        }
        assert!(!hold.more_coming(&idle, LONG));
        assert_eq!(idle.take_looks(), 1, "back off after the misses");
    }

    /// A drained SQ whose host queues more once `at` has passed.
    struct TimedQueue {
        at: Instant,
    }

    impl HeldQueue for TimedQueue {
        fn is_admin(&self) -> bool {
            false
        }
        fn tail_moved(&self) -> bool {
            Instant::now() >= self.at
        }
        fn stopped(&self) -> bool {
            false
        }
    }

    const PAYS: Duration = Duration::from_millis(50);

    /// Catches a poll that stops for a streaming host (its submissions
    /// would wait for a trapped doorbell write and a wake-up) or that
    /// gives up watching before the host submits.
    #[test]
    fn a_streaming_host_keeps_the_poll_on() {
        let mut poll = SubmissionPoll::default();
        for batch in 0..(4 * POLL_BACKOFF) {
            let queue = FakeQueue::io(Some(3));
            assert!(poll.more_coming(&queue, LONG, PAYS), "batch {batch}");
            assert_eq!(queue.take_looks(), 3, "batch {batch}");
        }
        assert_eq!(poll.score, POLL_SCORE_MAX);
    }

    /// Catches a poll that never backs off from a host that submits
    /// later than a poll pays for (QD1: nearly every poll would burn its
    /// whole time), or from one that does not submit at all, and one
    /// that never probes again.
    #[test]
    fn a_slow_host_turns_the_poll_off_then_it_is_probed_again() {
        let mut poll = SubmissionPoll::default();
        // The first poll probes; the host submits, but later than pays.
        let slow = TimedQueue {
            at: Instant::now() + 2 * SHORT,
        };
        assert!(poll.more_coming(&slow, LONG, SHORT), "it did submit");
        assert_eq!(poll.score, 0, "a late submission does not pay");
        // The next POLL_BACKOFF drained batches arm EventIdx at once.
        let idle = FakeQueue::io(None);
        for batch in 0..POLL_BACKOFF {
            assert!(!poll.more_coming(&idle, LONG, PAYS), "batch {batch}");
            assert_eq!(idle.take_looks(), 0, "batch {batch} polled");
        }
        // Then one probe, which a host that does not submit loses.
        let start = Instant::now();
        assert!(!poll.more_coming(&idle, WATCHED, PAYS));
        assert!(start.elapsed() >= WATCHED && idle.take_looks() > 1);
        assert!(!poll.more_coming(&idle, LONG, PAYS));
        assert_eq!(idle.take_looks(), 0, "back off after the probe");
        // A won probe keeps polling through as many misses as it scored.
        poll.backoff = 0;
        assert!(poll.more_coming(&FakeQueue::io(Some(1)), LONG, PAYS));
        assert_eq!(poll.score, 1 + POLL_HIT);
        for miss in 0..(1 + POLL_HIT) {
            assert!(!poll.more_coming(&idle, WATCHED, PAYS), "miss {miss}");
            assert!(idle.take_looks() > 1, "miss {miss} did not poll");
        }
        assert!(!poll.more_coming(&idle, LONG, PAYS));
        assert_eq!(idle.take_looks(), 0);
    }

    /// Catches a poll that a queue deletion or reset has to wait out.
    #[test]
    fn a_stopping_queue_ends_the_poll() {
        let mut poll = SubmissionPoll::default();
        let stopping = FakeQueue {
            stopped: true,
            ..FakeQueue::io(None)
        };
        let start = Instant::now();
        assert!(poll.more_coming(&stopping, LONG, PAYS));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    /// Catches a held admin queue (each admin command would wait out the
    /// hold) and a hold that a queue deletion or reset has to wait out.
    #[test]
    fn admin_queues_and_stopping_queues_are_not_held() {
        let mut hold = InterruptHold::default();
        let admin = FakeQueue {
            admin: true,
            ..FakeQueue::io(None)
        };
        let start = Instant::now();
        assert!(!hold.more_coming(&admin, LONG));
        assert_eq!(admin.take_looks(), 1);
        let stopping = FakeQueue {
            stopped: true,
            ..FakeQueue::io(None)
        };
        assert!(!hold.more_coming(&stopping, LONG));
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
