//! Injected faults, seen from the host driver: statuses, media errors,
//! held commands and Abort, CSTS.CFS, dropped interrupts, latency,
//! corruption.

use std::time::{Duration, Instant};

use super::harness::*;
use crate::command::CommandBuilder;
use crate::fault::FaultSpec;
use crate::registers::reg;
use crate::spec::{admin, io as op, log, Status};

fn spec(text: &str) -> FaultSpec {
    text.parse().unwrap()
}

fn rw(opcode: u8, slba: u64, blocks: u32) -> CommandBuilder {
    CommandBuilder::new(opcode, 0)
        .nsid(1)
        .slba(slba)
        .cdw(12, blocks - 1)
        .prp1(DATA)
        .prp2(DATA + 0x1000)
}

fn ready_host() -> Host {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1);
    h
}

/// Fills blocks 0..64 (512 B each) with a pattern that names each block.
fn fill(h: &mut Host) -> Vec<u8> {
    let data: Vec<u8> = (0..64 * 512).map(|i| (i / 512) as u8 ^ (i as u8)).collect();
    for chunk in 0..8u64 {
        let part = &data[chunk as usize * 4096..(chunk as usize + 1) * 4096];
        h.poke(DATA, part);
        assert_eq!(
            h.io(1, rw(op::WRITE, chunk * 8, 8).build()).status,
            Status::SUCCESS
        );
    }
    data
}

fn read_status(h: &mut Host, slba: u64, blocks: u32) -> Status {
    h.io(1, rw(op::READ, slba, blocks).build()).status
}

fn get_log(lid: u8, nsid: u32, bytes: u32) -> crate::Command {
    CommandBuilder::new(admin::GET_LOG_PAGE, 0)
        .nsid(nsid)
        .prp1(DATA)
        .prp2(DATA + 0x1000)
        .cdw(10, u32::from(lid) | ((bytes / 4 - 1) << 16))
        .build()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Catches an injected status that is not reported as given (SCT, SC,
/// DNR), a count that is not honoured, or one that leaks to other opcodes.
#[test]
fn injected_status_hits_the_next_n_matching_commands() {
    let mut h = ready_host();
    fill(&mut h);
    h.ctrl
        .inject(spec("status=0x281,dnr,count=2,opcode=read"))
        .unwrap();
    let injected = Status::UNRECOVERED_READ_ERROR.with_dnr();
    assert_eq!(read_status(&mut h, 0, 1), injected);
    assert_eq!(
        h.io(1, rw(op::WRITE, 0, 1).build()).status,
        Status::SUCCESS,
        "writes do not match opcode=read"
    );
    assert_eq!(read_status(&mut h, 0, 1), injected);
    assert_eq!(read_status(&mut h, 0, 1), Status::SUCCESS, "count spent");
    let report = h.ctrl.fault_report();
    assert_eq!(report.armed[0].fired, 2);
    assert_eq!(report.armed[0].remaining, Some(0));
    assert_eq!(h.ctrl.stats().counters.injected_faults, 2);
    // Namespace Not Ready: generic 82h, retryable.
    h.ctrl.inject(spec("ns-not-ready,count=1")).unwrap();
    let c = read_status(&mut h, 0, 1);
    assert_eq!((c.sct(), c.sc(), c.dnr()), (0, 0x82, false));
    // More: bit 13 of the status field.
    h.ctrl.inject(spec("status=0x4,more,count=1")).unwrap();
    assert_eq!(read_status(&mut h, 0, 1).raw(), 0x2004);
    // The admin queue is out of reach of a spec without queue=0.
    h.ctrl.inject(spec("status=0x6")).unwrap();
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, 0, 512)),
        Status::SUCCESS
    );
    h.ctrl.clear_faults();
    assert_eq!(read_status(&mut h, 0, 1), Status::SUCCESS);
    assert!(h.ctrl.fault_report().armed.is_empty());
}

/// Catches media errors that fail the wrong blocks, do not persist, are
/// not cleared by a rewrite or deallocation, or are missing from the Error
/// Information log and the SMART media error count.
#[test]
fn media_errors_persist_until_rewritten_and_are_logged() {
    let mut h = ready_host();
    fill(&mut h);
    h.ctrl.inject(spec("media-error:lba=10-19")).unwrap();
    for _ in 0..2 {
        assert_eq!(read_status(&mut h, 0, 10), Status::SUCCESS);
        assert_eq!(read_status(&mut h, 20, 8), Status::SUCCESS);
        assert_eq!(read_status(&mut h, 9, 2), Status::UNRECOVERED_READ_ERROR);
        assert_eq!(read_status(&mut h, 19, 1), Status::UNRECOVERED_READ_ERROR);
    }
    assert_eq!(
        h.io(1, rw(op::VERIFY, 12, 1).build()).status,
        Status::UNRECOVERED_READ_ERROR
    );
    // The error log names the first bad block of the last failure.
    assert_eq!(
        h.admin_status(get_log(log::ERROR_INFORMATION, 0, 64)),
        Status::SUCCESS
    );
    let e = h.peek(DATA, 64);
    assert_eq!(u64_at(&e, 0), 5, "five failed reads");
    assert_eq!(
        u16::from_le_bytes([e[12], e[13]]) >> 1,
        Status::UNRECOVERED_READ_ERROR.raw()
    );
    assert_eq!(u64_at(&e, 16), 12, "LBA of the Verify's bad block");
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, 0xffff_ffff, 512)),
        Status::SUCCESS
    );
    let smart = h.peek(DATA, 512);
    assert_eq!(u64_at(&smart, 160), 5, "Media and Data Integrity Errors");
    assert_eq!(h.ctrl.stats().counters.injected_media_errors, 5);
    assert_eq!(h.ctrl.fault_report().armed[0].fired, 5);

    // Rewrite 10..=14: readable; 15..=19 still bad.
    assert_eq!(
        h.io(1, rw(op::WRITE, 10, 5).build()).status,
        Status::SUCCESS
    );
    assert_eq!(read_status(&mut h, 10, 5), Status::SUCCESS);
    assert_eq!(read_status(&mut h, 15, 1), Status::UNRECOVERED_READ_ERROR);
    // Deallocate 15..=19 with Write Zeroes + DEAC.
    let wz = CommandBuilder::new(op::WRITE_ZEROES, 0)
        .nsid(1)
        .slba(15)
        .cdw(12, 4 | (1 << 25))
        .build();
    assert_eq!(h.io(1, wz).status, Status::SUCCESS);
    for slba in (0..64).step_by(8) {
        assert_eq!(read_status(&mut h, slba, 8), Status::SUCCESS, "LBA {slba}");
    }
    assert!(h.ctrl.fault_report().bad_blocks.is_empty());
}

/// Catches an Abort that cannot abort a held command, a held command that
/// blocks its queue, and `no-abort` being ignored.
#[test]
fn held_command_is_aborted_with_command_abort_requested() {
    let mut h = ready_host();
    h.ctrl.inject(spec("timeout,count=1,opcode=read")).unwrap();
    let held = h.submit(1, rw(op::READ, 0, 1).build());
    assert!(h.try_reap(1, Duration::from_millis(200)).is_none(), "held");
    // The queue keeps going behind it.
    assert_eq!(h.io(1, rw(op::WRITE, 0, 1).build()).status, Status::SUCCESS);
    assert_eq!(h.ctrl.fault_report().held_commands.len(), 1);
    let abort = CommandBuilder::new(admin::ABORT, 0)
        .cdw(10, 1 | (u32::from(held) << 16))
        .build();
    let done = h.admin(abort);
    assert_eq!((done.status, done.dw0 & 1), (Status::SUCCESS, 0), "aborted");
    let aborted = h.reap(1);
    assert_eq!(
        (aborted.cid, aborted.status),
        (held, Status::ABORT_REQUESTED)
    );
    assert!(h.ctrl.fault_report().held_commands.is_empty());
    let c = h.ctrl.stats().counters;
    assert_eq!((c.commands_held, c.commands_aborted), (1, 1));

    // no-abort: the Abort says "not aborted"; a reset drops the command.
    h.ctrl
        .inject(spec("timeout,no-abort,count=1,opcode=read"))
        .unwrap();
    let stuck = h.submit(1, rw(op::READ, 0, 1).build());
    assert!(h.try_reap(1, Duration::from_millis(100)).is_none());
    let abort = CommandBuilder::new(admin::ABORT, 0)
        .cdw(10, 1 | (u32::from(stuck) << 16))
        .build();
    assert_eq!(h.admin(abort).dw0 & 1, 1, "not aborted");
    assert_eq!(h.ctrl.fault_report().held_commands.len(), 1);
    h.write32(reg::CC, 0);
    h.wait_csts(1, 0);
    assert!(h.ctrl.fault_report().held_commands.is_empty());
}

/// Catches CFS that is not raised on the matching command, or that
/// survives the controller reset a host does about it.
#[test]
fn cfs_is_raised_and_cleared_by_a_reset() {
    let mut h = ready_host();
    h.ctrl.inject(spec("cfs,opcode=write")).unwrap();
    assert_eq!(read_status(&mut h, 0, 1), Status::SUCCESS);
    assert_eq!(h.read32(reg::CSTS) & 2, 0);
    h.submit(1, rw(op::WRITE, 0, 1).build());
    h.wait_csts(2, 2);
    assert!(
        h.try_reap(1, Duration::from_millis(100)).is_none(),
        "no completion"
    );
    // What Linux does on seeing CFS: reset and bring the controller back.
    h.enable();
    assert_eq!(h.read32(reg::CSTS) & 2, 0, "CFS cleared by the reset");
    h.create_pair(1);
    assert_eq!(h.io(1, rw(op::WRITE, 0, 1).build()).status, Status::SUCCESS);
}

/// Catches an internal error (a handler that panics) that wedges the
/// queue instead of raising CSTS.CFS, is not counted, or leaves the
/// controller dead after the host's reset.
#[test]
fn an_injected_internal_error_raises_cfs_and_a_reset_recovers() {
    let mut h = ready_host();
    h.ctrl.inject(spec("internal-error,opcode=write")).unwrap();
    assert_eq!(read_status(&mut h, 0, 1), Status::SUCCESS);
    h.submit(1, rw(op::WRITE, 0, 1).build());
    h.wait_csts(2, 2);
    assert!(
        h.try_reap(1, Duration::from_millis(100)).is_none(),
        "no completion from a failed handler"
    );
    assert_eq!(h.ctrl.stats().counters.internal_errors, 1);
    h.enable();
    assert_eq!(h.read32(reg::CSTS) & 2, 0, "CFS cleared by the reset");
    h.create_pair(1);
    assert_eq!(h.io(1, rw(op::WRITE, 0, 1).build()).status, Status::SUCCESS);
    assert_eq!(h.ctrl.stats().counters.internal_errors, 1, "fired once");
}

/// Catches a dropped interrupt that is still sent, or a completion that is
/// lost along with it.
#[test]
fn dropped_interrupt_leaves_the_completion_in_the_queue() {
    let mut h = ready_host();
    h.ctrl.inject(spec("drop-irq,count=1")).unwrap();
    let before = h.irq.count(1);
    let cid = h.submit(1, rw(op::READ, 0, 1).build());
    let c = h.reap(1);
    assert_eq!((c.cid, c.status), (cid, Status::SUCCESS));
    assert!(!h.irq.wait_for(1, before, Duration::from_millis(100)));
    assert_eq!(h.ctrl.stats().counters.interrupts_dropped, 1);
    assert_eq!(read_status(&mut h, 0, 1), Status::SUCCESS);
    assert!(h.irq.wait_for(1, before, TIMEOUT), "the next one is sent");
}

/// Catches a delayed interrupt that is sent on time, never, or with the
/// completion held back too.
#[test]
fn delayed_interrupt_comes_late_after_the_completion() {
    let mut h = ready_host();
    h.ctrl.inject(spec("delay-irq=400ms,count=1")).unwrap();
    let before = h.irq.count(1);
    let t = Instant::now();
    let cid = h.submit(1, rw(op::READ, 0, 1).build());
    let c = h.reap(1);
    assert_eq!((c.cid, c.status), (cid, Status::SUCCESS));
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "completion held back"
    );
    assert_eq!(h.irq.count(1), before, "interrupt sent early");
    assert!(h.irq.wait_for(1, before, TIMEOUT));
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(h.ctrl.stats().counters.interrupts_delayed, 1);
}

/// Catches latency ranges that are not applied.
#[test]
fn latency_range_delays_within_bounds() {
    let mut h = ready_host();
    h.ctrl
        .inject(spec("latency=100ms-200ms,opcode=read"))
        .unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        assert_eq!(read_status(&mut h, 0, 1), Status::SUCCESS);
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(100), "{took:?}");
    }
}

/// Catches corruption outside the range, or none inside it.
#[test]
fn corrupt_flips_one_bit_per_block_of_the_range() {
    let mut h = ready_host();
    let data = fill(&mut h);
    h.ctrl.inject(spec("corrupt:lba=2-3")).unwrap();
    assert_eq!(read_status(&mut h, 0, 8), Status::SUCCESS);
    let got = h.peek(DATA, 4096);
    let mut want = data[..4096].to_vec();
    want[2 * 512] ^= 1;
    want[3 * 512] ^= 1;
    assert_eq!(got, want);
    h.ctrl.clear_faults();
    assert_eq!(read_status(&mut h, 0, 8), Status::SUCCESS);
    assert_eq!(
        h.peek(DATA, 4096),
        data[..4096],
        "the media was never touched"
    );
}

/// Catches latency that is not applied, or applied to other opcodes.
#[test]
fn latency_delays_matching_commands() {
    let mut h = ready_host();
    h.ctrl.inject(spec("latency=300ms,opcode=read")).unwrap();
    let t = Instant::now();
    assert_eq!(read_status(&mut h, 0, 1), Status::SUCCESS);
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    assert_eq!(h.io(1, rw(op::WRITE, 0, 1).build()).status, Status::SUCCESS);
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
}

/// Catches a control-socket reset that leaves queues running, or one that
/// forgets where the guest placed the CMB (config space did not change).
#[test]
fn surprise_reset_drops_the_queues_and_keeps_the_cmb_placement() {
    let mut h = ready_host();
    h.ctrl
        .inject(spec("timeout,no-abort,count=1,opcode=read"))
        .unwrap();
    h.submit(1, rw(op::READ, 0, 1).build());
    assert!(h.try_reap(1, Duration::from_millis(100)).is_none());
    h.ctrl.surprise_reset();
    h.wait_csts(1, 0);
    assert_eq!(h.read32(reg::CC) & 1, 0, "CC.EN reads 0");
    let s = h.ctrl.stats();
    assert!(s.queues.is_empty(), "{:?}", s.queues);
    assert_eq!(s.cmb.bar_address, Some(CMB_BAR));
    assert!(h.ctrl.fault_report().held_commands.is_empty());
    h.enable();
    h.create_pair(1);
    assert_eq!(read_status(&mut h, 0, 1), Status::SUCCESS);
}

fn ocp_entry(flags: u8, kind: u16, nrtdp: u16) -> [u8; 32] {
    let mut e = [0u8; 32];
    e[0] = flags;
    e[2..4].copy_from_slice(&kind.to_le_bytes());
    e[4..6].copy_from_slice(&nrtdp.to_le_bytes());
    e
}

fn set_ocp(h: &mut Host, entries: &[[u8; 32]]) -> Status {
    let data: Vec<u8> = entries.iter().flatten().copied().collect();
    if !data.is_empty() {
        h.poke(DATA, &data);
    }
    let cmd = CommandBuilder::new(admin::SET_FEATURES, 0)
        .prp1(DATA)
        .cdw(10, 0xc0)
        .cdw(11, entries.len() as u32)
        .build();
    h.admin_status(cmd)
}

/// Catches the OCP Error Injection feature (what `nvme ocp
/// set-error-injection --no-uuid` sends) not arming its fault, ignoring
/// NRTDP or Single Instance, not reading back, or accepting a type it
/// cannot do.
#[test]
fn ocp_error_injection_arms_faults_in_band() {
    let mut h = ready_host();
    // NAND corruption, enabled, single instance, after 2 reads.
    let entry = ocp_entry(0b11, 7, 2);
    assert_eq!(set_ocp(&mut h, &[entry]), Status::SUCCESS);
    let statuses: Vec<Status> = (0..4).map(|_| read_status(&mut h, 0, 1)).collect();
    assert_eq!(
        statuses,
        vec![
            Status::SUCCESS,
            Status::SUCCESS,
            Status::UNRECOVERED_READ_ERROR,
            Status::SUCCESS
        ]
    );
    let get = CommandBuilder::new(admin::GET_FEATURES, 0)
        .prp1(DATA + 0x2000)
        .prp2(DATA + 0x3000)
        .cdw(10, 0xc0)
        .build();
    h.poke(DATA + 0x2000, &[0xff; 64]);
    let c = h.admin(get);
    assert_eq!((c.status, c.dw0 & 0x7f), (Status::SUCCESS, 1));
    assert_eq!(h.peek(DATA + 0x2000, 32), entry.to_vec());
    assert_eq!(h.peek(DATA + 0x2020, 32), vec![0; 32]);
    // A new set replaces the old entries: a disabled one arms nothing.
    assert_eq!(set_ocp(&mut h, &[ocp_entry(0, 4, 0)]), Status::SUCCESS);
    assert!(h.ctrl.fault_report().armed.is_empty());
    // PLP defect: not something this controller can fake.
    assert_eq!(
        set_ocp(&mut h, &[ocp_entry(1, 3, 0)]),
        Status::INVALID_FIELD
    );
    // Firmware error: CSTS.CFS on the next I/O command.
    assert_eq!(set_ocp(&mut h, &[ocp_entry(1, 4, 0)]), Status::SUCCESS);
    h.submit(1, rw(op::READ, 0, 1).build());
    h.wait_csts(2, 2);
}

/// Catches: a controller that arms without end (the control socket is
/// reachable from every lab guest), a cap that refuses a full OCP set, or
/// an OCP set that half-arms when it does not fit beside the host's
/// specs.
#[test]
fn armed_specs_are_capped_and_a_full_ocp_set_fits() {
    let mut h = ready_host();
    let nand = ocp_entry(1, 7, 0);
    let full = vec![nand; 127];
    assert_eq!(set_ocp(&mut h, &full), Status::SUCCESS);
    assert_eq!(h.ctrl.fault_report().armed.len(), 127);
    h.ctrl.inject(spec("status=0x4,count=1")).unwrap();
    let refused = h.ctrl.inject(spec("status=0x4")).unwrap_err();
    assert!(refused.to_string().contains("128"), "{refused}");
    // The host's spec spent, its room is free again.
    assert_eq!(read_status(&mut h, 0, 1), Status::UNRECOVERED_READ_ERROR);
    h.ctrl.inject(spec("status=0x4")).unwrap();
    assert_eq!(h.ctrl.fault_report().armed.len(), 128);
    h.ctrl.clear_faults();
    for _ in 0..10 {
        h.ctrl.inject(spec("latency=1us")).unwrap();
    }
    // 127 entries do not fit beside 10 host specs: refused, and the
    // previous (empty) set stays as it was.
    assert_eq!(set_ocp(&mut h, &full), Status::INVALID_FIELD);
    assert_eq!(h.ctrl.fault_report().armed.len(), 10);
    assert_eq!(set_ocp(&mut h, &full[..118]), Status::SUCCESS);
    assert_eq!(h.ctrl.fault_report().armed.len(), 128);
    // Replacing the set frees its own room first.
    assert_eq!(set_ocp(&mut h, &full[..118]), Status::SUCCESS);
    assert_eq!(h.ctrl.fault_report().armed.len(), 128);
}
