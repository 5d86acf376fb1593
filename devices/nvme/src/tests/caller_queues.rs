//! A controller whose queues run on the host's thread
//! (`NvmeController::with_queues_on_caller`, what the `nvme_commands` fuzz
//! target drives): no worker threads, the same fetch, command tables,
//! handlers and completion posting.

use std::sync::mpsc;
use std::time::Duration;

use super::harness::{Host, DATA, RAM};
use crate::command::{CommandBuilder, CompletionEntry};
use crate::registers::{reg, DOORBELLS};
use crate::spec::{admin, feature, io, Status};

/// Catches a caller-run controller that still starts a worker thread (a
/// completion appears before `run_queues`), and a `run_queues` that does
/// not reach the command tables and data paths: Identify's data, queue
/// creation, a Write then a Read through an I/O queue.
#[test]
fn commands_run_on_the_callers_thread_when_it_asks() {
    let mut host = Host::on_caller();
    host.enable();
    let identify = CommandBuilder::new(admin::IDENTIFY, 0)
        .prp1(DATA)
        .cdw(10, 1)
        .build();
    let cid = host.submit(0, identify);
    std::thread::sleep(Duration::from_millis(50));
    let mut raw = [0u8; 16];
    host.read_mem(RAM + 0x1000, &mut raw);
    assert!(
        !CompletionEntry::decode(&raw).phase,
        "a completion was posted before run_queues: a worker thread ran"
    );
    let c = host.reap(0);
    assert_eq!((c.cid, c.status), (cid, Status::SUCCESS));
    assert_eq!(&host.peek(DATA + 4, 10), b"TESTSERIAL");

    host.create_pair(1);
    let block: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
    host.poke(DATA, &block);
    let write = CommandBuilder::new(io::WRITE, 0)
        .nsid(1)
        .prp1(DATA)
        .cdw(10, 3)
        .build();
    assert_eq!(host.io(1, write).status, Status::SUCCESS);
    host.poke(DATA, &[0u8; 512]);
    let read = CommandBuilder::new(io::READ, 0)
        .nsid(1)
        .prp1(DATA + 0x1000)
        .cdw(10, 3)
        .build();
    assert_eq!(host.io(1, read).status, Status::SUCCESS);
    assert_eq!(host.peek(DATA + 0x1000, 512), block);
}

/// Catches a `run_queues` that waits forever for the host to free a
/// completion slot (the host is the caller: it can never do so), and one
/// that loses the entries it could not complete: three commands on an
/// admin CQ with one free slot complete one per run, in order, with the
/// phase flipping on the wrap.
#[test]
fn a_full_completion_queue_leaves_entries_for_the_next_run() {
    let host = Host::on_caller();
    let (asq, acq) = (RAM, RAM + 0x1000);
    host.write32(reg::AQA, (1 << 16) | 7);
    host.write64_lo_hi(reg::ASQ, asq);
    host.write64_lo_hi(reg::ACQ, acq);
    host.write32(reg::CC, (6 << 16) | (4 << 20) | 1);
    assert_eq!(host.read32(reg::CSTS) & 1, 1);
    for cid in 1..=3u16 {
        let get = CommandBuilder::new(admin::GET_FEATURES, cid)
            .cdw(10, u32::from(feature::NUMBER_OF_QUEUES))
            .build();
        host.write_mem(asq + 64 * u64::from(cid - 1), get.as_bytes());
    }
    host.write32(DOORBELLS, 3);
    let (done_tx, done_rx) = mpsc::channel();
    // Not scoped: a run_queues that hangs must fail the test, not hang it.
    std::thread::spawn(move || {
        let entry = |slot: u64| {
            let mut raw = [0u8; 16];
            host.read_mem(acq + 16 * slot, &mut raw);
            CompletionEntry::decode(&raw)
        };
        let runs = [(1u16, 0u64, true, 1u32), (2, 1, true, 0), (3, 0, false, 1)];
        let mut previous = 0u16;
        for (cid, slot, phase, head) in runs {
            host.ctrl.run_queues();
            host.ctrl.run_queues();
            let e = entry(slot);
            assert_eq!((e.cid, e.phase, e.status), (cid, phase, Status::SUCCESS));
            // The other slot still holds what the host has not consumed
            // yet or already has: nothing more was posted.
            assert_eq!(entry(1 - slot).cid, previous, "posted past a full CQ");
            previous = cid;
            host.write32(DOORBELLS + 4, head);
        }
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("run_queues waited for a completion slot, or a check failed");
}
