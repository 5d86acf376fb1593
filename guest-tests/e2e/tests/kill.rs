//! Kill tests (issue 9), in two QEMU boots of the default lab; the scenario
//! is `p2plab_kill_campaign` (its header has the steps), shared with
//! `scripts/kill-loop`, which runs it for 100 rounds.
//!
//! Three rounds: fio writes a slot of nvme0's namespace with its verify
//! pattern and fsyncs (an NVMe Flush), the guest keeps unflushed writes in
//! flight elsewhere, and the host SIGKILLs `p2plab-nvme`. Rounds 1 and 2:
//! the namespace file holds every flushed slot byte for byte, the dead
//! device is unplugged, a fresh server on the same file is plugged in, and
//! fio verifies every slot through it. Round 3: a file is fsynced on the
//! namespace's ext4 partition, QEMU is SIGKILLed after the server with it
//! mounted, and a second QEMU with a restarted server verifies all slots,
//! mounts the file system (journal replay), compares the file and runs
//! `e2fsck -fn`.
//!
//! What it catches: a server that completes a Write before the data has
//! reached the namespace file (a write-back cache in the process, a
//! completion posted before pwrite, writes queued in a worker), or a Flush
//! completed while writes are still queued: the SIGKILL loses them and the
//! file differs from what the guest read back after its flush; a server
//! that keeps data only in memory (a namespace that is not the file, a
//! restart that truncates or recreates the file): the re-plugged device or
//! the second QEMU reads other data and fio's crc32c/seed check fails; a
//! rewrite lost on restart (the slot's blocks carry the older round's
//! seed); an fsynced ext4 journal commit that did not reach the file
//! (missing file, e2fsck errors); a controller whose volatile write cache
//! the guest does not see (no VWC: fsync sends no Flush, `flush_commands`
//! stays 0); QEMU dying with its device server; a guest that hangs or
//! oopses when its controller's server dies under I/O. Checked once by
//! hand: a server with an in-process write cache that Flush ignores fails
//! round 1 ("slot 0 ... differs from what the device acknowledged").
//!
//! What it cannot catch: a Flush acknowledged before fdatasync. SIGKILL
//! ends the process, not the host, so the page cache keeps every write that
//! reached pwrite; only a host crash would lose it. The NVMe unit tests
//! check that Flush, FUA and turning the cache off reach the backend's
//! flush (`FileBackend::flush` is fdatasync).

use std::time::Instant;

use p2plab_kill_campaign::{self as kill, KillOptions, RoundEnd, SLOTS};
use p2plab_lab::LabPaths;

/// Three server kills: two re-plugged within the first QEMU, the third with
/// QEMU killed after it; then a second QEMU verifies.
const ROUNDS: u32 = 3;

#[test]
fn flushed_writes_survive_sigkill_of_the_server_and_of_qemu() {
    let paths = LabPaths::discover().expect("paths");
    let state = paths
        .repo
        .join("target/e2e-state")
        .join(format!("kill-{}", std::process::id()));
    let options = KillOptions {
        rounds: ROUNDS,
        rounds_per_boot: ROUNDS,
        state: state.clone(),
        stream_output: std::env::var_os("P2PLAB_STREAM").is_some(),
    };
    let started = Instant::now();
    let report = kill::run(&options, |r| eprintln!("kill: {r:?}"))
        .unwrap_or_else(|e| panic!("kill test failed: {e:#}"));
    eprintln!("kill: {ROUNDS} rounds in {:?}", started.elapsed());

    assert_eq!(report.rounds.len(), ROUNDS as usize);
    for (i, r) in report.rounds.iter().enumerate() {
        let round = i as u32 + 1;
        assert_eq!(r.round, round);
        // Every slot written so far was compared with the file after the
        // kill, and verified by fio afterwards.
        let written = (round as usize).min(SLOTS as usize);
        assert_eq!(r.slots_compared, written, "{r:?}");
        assert_eq!(r.slots_verified, written, "{r:?}");
        assert!(r.flushes >= 1, "{r:?}");
        // Unflushed writes ran up to the kill (the guest waited for 100 to
        // complete before it signalled).
        assert!(r.inflight_writes >= 100, "{r:?}");
        let last = round == ROUNDS;
        match r.end {
            // Re-plugged rounds kill with the guest's queues drained.
            RoundEnd::Replugged { .. } => {
                assert!(!last, "{r:?}");
                assert_eq!(r.inflight_at_kill, 0, "{r:?}");
            }
            RoundEnd::QemuKilled => assert!(last, "{r:?}"),
            // A QEMU 11.1 abort when its server dies ends the boot early;
            // the next boot goes on with the remaining rounds.
            RoundEnd::QemuAborted => {}
        }
    }
    // Each QEMU but the verifying one ended with a round: killed on
    // purpose, or aborted by itself.
    let qemu_ends = report
        .rounds
        .iter()
        .filter(|r| r.end == RoundEnd::QemuKilled || r.end == RoundEnd::QemuAborted)
        .count() as u32;
    assert_eq!(report.boots, qemu_ends + 1, "{report:?}");
    assert!(
        report.qemu_aborts < ROUNDS,
        "QEMU aborted in every round: nothing was re-plugged or killed on purpose"
    );
    assert_eq!(report.final_slots_verified, ROUNDS as usize);
    // The file system: every boot after the first mounted it (journal
    // replay), found each fsynced file intact and e2fsck clean.
    assert_eq!(report.clean_fscks, report.boots - 1, "{report:?}");
    assert!(!report.fs.files.is_empty(), "{report:?}");
    assert_eq!(
        report.fs_files_verified,
        report.fs.files.len(),
        "{report:?}"
    );
    let _ = std::fs::remove_dir_all(&state);
}
