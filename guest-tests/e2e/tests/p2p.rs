//! Issue 4 end to end: the unmodified guest kernel moves data NVMe → GPU
//! BAR, GPU BAR → NVMe and NVMe → NVMe through a CMB with user-space P2PDMA
//! (O_DIRECT on a p2pmem mapping). Every transfer is checked on both sides:
//! what the guest reads back or the GPU's checksum engine computes, and what
//! the device servers counted.
//!
//! What each test catches: `nvme_to_gpu_and_gpu_to_nvme_through_the_switch`
//! fails on an NVMe device that DMAs the wrong bytes or to the wrong
//! addresses (GPU engine CRC, backing file, the server's per-address DMA
//! log inside BAR2), a GPU whose BAR is not published as p2pmem or whose
//! engine miscomputes, a GPU driver or device that breaks on unbind/bind,
//! rmmod/modprobe or a function reset (every step's status is checked, and
//! `guest-smoke.sh` runs all its checks: device-reported errors, timeouts,
//! a file open across unbind, parallel submitters), and kernel warnings;
//! The N2G step is traced on both devices (switched from the guest with
//! `p2plab-ctl ID trace on`): the test fails on NVMe Reads whose data
//! pointer is not placed in the peer BAR, GPU jobs missing from the
//! trace, or a Chrome timeline whose clocks do not line up (the checksum
//! before the last Read that filled its bytes).
//! The lab boot runs with the guest kernel's tick profiler (`profile=2`):
//! it fails when `p2plab-kprofile` misreads `/proc/profile` (the transfer's
//! block-layer and page-pinning functions must show up), loses ticks, or
//! does not reset.
//! The lab test also fails when P2P bytes do not take the zero-copy peer
//! path (the NVMe server's `dma_peer_*` counters and its debug log must
//! show exactly the bytes moved, inside GPU BAR2, the GPU server's
//! `peer_inbound_*` the same, and the message path none), and when the
//! peer path does not follow the GPU's BAR through a remove + rescan
//! (the placement must go off and on again, and the data moved after it
//! must verify).
//! `nvme_to_nvme_through_a_cmb` fails on a CMB that is not published or
//! that corrupts data in flight, on a server that does not serve its
//! own CMB locally, and on a `--peer-path off` server whose bytes do not
//! fall back to the message path. The refusal across separate root ports
//! (`p2p-refused.sh`: the kernel must not let P2P through a
//! non-whitelisted host bridge, and no byte may reach the GPU BAR) runs in
//! the gds suite's `separate-root-ports` boot
//! (`gds::separate_root_ports_run_in_compat_mode`), one boot for both.

mod common;

use common::{
    counter, message_dma_bytes_in, peer_dma_bytes_in, run_guest, stats, test_state_dir, Boot,
};
use p2plab_lab::kernel_log::Expected;
use p2plab_lab::{GuestControl, GuestScript};
use serde_json::Value;

/// A p2p guest script with the helpers it sources (`guest/lib/p2p.sh`).
fn p2p_script(name: &str, text: &str) -> GuestScript {
    GuestScript::new(name, text).lib("p2p.sh", include_str!("../guest/lib/p2p.sh"))
}

/// `p2plab-kprofile` around 3 s of O_DIRECT reads: the guest kernel's
/// ticks, named. Catches a profile read with the wrong layout (the names
/// are then scattered across unrelated kernel text, and neither the
/// O_DIRECT pinning nor the block layer shows up), ticks lost, or a reset
/// that does not reset (boot-time ticks would dwarf the transfer's).
fn check_kernel_profile(run: &common::GuestRun) {
    run.expect("KPROFILE_RESET_STATUS", "0");
    run.expect("KPROFILE_FIO_STATUS", "0");
    run.expect("KPROFILE_STATUS", "0");
    let profile: Value = serde_json::from_str(run.fact("KPROFILE_JSON"))
        .unwrap_or_else(|e| panic!("p2plab-kprofile --json: {e}"));
    let total = profile["ticks"].as_u64().expect("ticks");
    let functions = profile["functions"].as_array().expect("functions");
    let listed: u64 = functions.iter().filter_map(|f| f["ticks"].as_u64()).sum();
    assert_eq!(listed, total, "every tick belongs to one function");
    // The guest kernel ticks at 250 Hz (CONFIG_HZ) at most on each vCPU
    // (an idle one may stop its tick, a busy one in user space is not
    // profiled): the window bounds the total from above (the boot's
    // ticks, left by a reset that does not zero, exceed it). From below,
    // only loosely: a host under load delivers fewer ticks per second.
    let window_ms = run.fact_u64("KPROFILE_MS");
    let cpus = run.fact_u64("KPROFILE_CPUS");
    let most = 250 * cpus * window_ms / 1000 + 25 * cpus;
    assert!(
        total <= most,
        "{total} ticks in {window_ms} ms on {cpus} vCPUs: reset did not zero"
    );
    assert!(total >= 100, "{total} ticks in {window_ms} ms");
    let ticks_in = |pred: &dyn Fn(&str) -> bool| -> u64 {
        functions
            .iter()
            .filter(|f| f["symbol"].as_str().is_some_and(pred))
            .filter_map(|f| f["ticks"].as_u64())
            .sum()
    };
    let block = ticks_in(&|s| s.starts_with("bio_") || s.starts_with("blk_"));
    let pinning = ticks_in(&|s| s.starts_with("gup_") || s.contains("pin_user_pages"));
    assert!(
        block > 0 && pinning > 0,
        "block {block}, pinning {pinning}: {functions:?}"
    );
}

/// Catches a log parser that counts bytes outside the window, of the
/// other direction, or of the other path (messages vs peer windows).
#[test]
fn log_parser_sums_only_the_window() {
    let log = "x DEBUG dma write via DMA_WRITE messages gpa=4096 len=512\n\
               x DEBUG dma write via DMA_WRITE messages gpa=100 len=512\n\
               x DEBUG dma read via DMA_READ messages gpa=4096 len=8\n\
               x DEBUG dma write to peer window gpa=4096 len=64 window=1\n\
               x DEBUG dma read from peer window gpa=4096 len=32 window=1\n";
    assert_eq!(message_dma_bytes_in(log, "write", 4096, 8191), 512);
    assert_eq!(message_dma_bytes_in(log, "read", 4096, 8191), 8);
    assert_eq!(message_dma_bytes_in(log, "write", 0, 4095), 512);
    assert_eq!(message_dma_bytes_in(log, "write", 8192, 9000), 0);
    assert_eq!(peer_dma_bytes_in(log, "write", 4096, 8191), 64);
    assert_eq!(peer_dma_bytes_in(log, "read", 4096, 8191), 32);
    assert_eq!(peer_dma_bytes_in(log, "write", 0, 4095), 0);
}

/// Checks guest-smoke.sh has when everything runs (its `check`,
/// `expect_rc` and summary `ok` lines).
const SMOKE_CHECKS: u64 = 33;

/// The folder holding guest-smoke.sh, shared with the guest at /mnt/host.
fn smoke_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../devices/gpu/guest-driver/tests")
}

#[test]
fn nvme_to_gpu_and_gpu_to_nvme_through_the_switch() {
    let state = test_state_dir("p2p-lab");
    let run = run_guest(
        "lab",
        &p2p_script("p2p-lab.sh", include_str!("../guest/p2p-lab.sh")),
        Boot {
            state: Some(state.clone()),
            share: Some(smoke_dir()),
            // guest-smoke.sh's "timeout reported" check: a 1 ms timeout on
            // a 512 MiB checksum, which the driver ends with one engine
            // reset.
            kernel_log: vec![Expected::exactly("p2plab_gpu*resetting the engine", 1)],
            append: vec!["profile=2".into()],
            // The guest switches both traces and arms peer-fail itself.
            guest_control: GuestControl::Devices(vec!["nvme0".into(), "gpu0".into()]),
            ..Boot::default()
        },
    );
    check_kernel_profile(&run);
    run.expect("GPU_P2P_PUBLISHED", "1");
    run.expect("GPU_P2P_ADDED", "1");
    assert_eq!(run.fact_u64("GPU_P2P_SIZE"), 1 << 30);

    // NVMe -> GPU: the bytes are in VRAM (engine checksum), no I/O errors.
    run.expect("N2G_STATUS", "0");
    run.expect("N2G_P2P_BAR", "2");
    run.expect("N2G_ERRORS", "0");
    assert_eq!(run.fact_u64("N2G_BYTES"), 64 << 20);
    run.expect("N2G_GPU_CRC", run.fact("PATTERN_CRC"));

    // The decoded traces of that transfer, switched on from the guest:
    // NVMe Reads whose data pointer lies in the GPU's BAR2 (a peer BAR),
    // GPU checksum jobs on VRAM, and one Chrome timeline with both devices
    // where the checksum follows the last Read that filled its bytes.
    for fact in [
        "TRACE_ON_NVME0",
        "TRACE_ON_GPU0",
        "TRACE_OFF_NVME0",
        "TRACE_OFF_GPU0",
    ] {
        run.expect(fact, "0");
    }
    let (bar2_start, bar2_end) = (run.fact_u64("GPU_BAR2_START"), run.fact_u64("GPU_BAR2_END"));
    let traces: Vec<(String, Vec<Value>)> = ["nvme0", "gpu0"]
        .iter()
        .map(|id| {
            let path = run.run_dir().join(format!("{id}.trace.jsonl"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let events = p2plab_trace::parse_lines(&text).unwrap_or_else(|e| panic!("{id}: {e}"));
            (id.to_string(), events)
        })
        .collect();
    let hex = |v: &Value| {
        v.as_str()
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    let peer_reads: Vec<&Value> = traces[0]
        .1
        .iter()
        .filter(|e| {
            e["kind"] == "cmd"
                && e["name"] == "Read"
                && e["data"]["prp1"]["at"] == "peer-direct"
                && hex(&e["data"]["prp1"]["addr"])
                    .is_some_and(|a| (bar2_start..=bar2_end).contains(&a))
        })
        .collect();
    let peer_bytes: u64 = peer_reads
        .iter()
        .map(|e| e["nlb"].as_u64().unwrap_or(0) * 512)
        .sum();
    assert!(
        peer_bytes >= 64 << 20,
        "traced Reads into GPU BAR2 cover {peer_bytes} bytes of 64 MiB"
    );
    assert!(peer_reads
        .iter()
        .all(|e| e["status"] == "Successful Completion"));
    let checksums: Vec<&Value> = traces[1]
        .1
        .iter()
        .filter(|e| e["kind"] == "job" && e["name"] == "CHECKSUM")
        .collect();
    // The hook checksums the whole 64 MiB once the reads are done.
    let checksummed: u64 = checksums.iter().filter_map(|j| j["len"].as_u64()).sum();
    assert!(
        checksummed >= 64 << 20,
        "checksum jobs traced over {checksummed} bytes"
    );
    assert!(checksums
        .iter()
        .all(|j| j["src"]["at"] == "own-vram" && j["status"] == "STATUS_OK"));
    let timeline = p2plab_trace::chrome::convert(&traces).unwrap_or_else(|e| panic!("{e}"));
    let events = timeline["traceEvents"].as_array().expect("traceEvents");
    let process = |name: &str| {
        events
            .iter()
            .find(|e| e["name"] == "process_name" && e["args"]["name"] == name)
            .map(|e| e["pid"].clone())
            .unwrap_or_else(|| panic!("no {name} process in the timeline"))
    };
    let (nvme_pid, gpu_pid) = (process("nvme0"), process("gpu0"));
    let last_read_end = events
        .iter()
        .filter(|e| e["pid"] == nvme_pid && e["ph"] == "X" && e["name"] == "Read")
        .filter_map(|e| Some(e["ts"].as_f64()? + e["dur"].as_f64()?))
        .fold(f64::NEG_INFINITY, f64::max);
    let first_checksum = events
        .iter()
        .filter(|e| e["pid"] == gpu_pid && e["ph"] == "X" && e["name"] == "CHECKSUM")
        .filter_map(|e| e["ts"].as_f64())
        .fold(f64::INFINITY, f64::min);
    assert!(
        last_read_end.is_finite() && first_checksum >= last_read_end,
        "the checksum ({first_checksum} us) follows the last Read ({last_read_end} us)"
    );

    // Thousands of 4 KiB transfers, two threads.
    run.expect("SMALL_STATUS", "0");
    assert_eq!(run.fact_u64("SMALL_IOS"), 4096);
    run.expect("SMALL_GPU_CRC", run.fact("SMALL_EXPECTED_CRC"));

    // GPU -> NVMe: read back through normal I/O, and on the host.
    run.expect("G2N_STATUS", "0");
    run.expect("G2N_ERRORS", "0");
    run.expect("G2N_READBACK_CRC", run.fact("G2N_GPU_CRC"));
    let image = std::fs::read(state.join("nvme0n1.img")).expect("nvme0 backing file");
    let written = &image[128 << 20..192 << 20];
    assert!(
        written
            .chunks(4)
            .all(|w| w == 0x5a17_c0de_u32.to_le_bytes()),
        "the backing file holds the GPU's fill pattern"
    );

    // The NVMe server moved those bytes straight into and out of the GPU's
    // VRAM memfd (the zero-copy peer path), none through QEMU: NVMe -> GPU
    // 64 MiB + 16 MiB + 8 MiB after the move, GPU -> NVMe 64 MiB (the
    // injected peer-fail moves nothing).
    let to_gpu: u64 = (64 + 16 + 8) << 20;
    let from_gpu: u64 = 64 << 20;
    let nvme = stats(&run, "nvme0");
    assert_eq!(counter(&nvme, "dma_peer_write_bytes"), to_gpu, "{nvme}");
    assert_eq!(counter(&nvme, "dma_peer_read_bytes"), from_gpu, "{nvme}");
    assert_eq!(counter(&nvme, "dma_message_write_bytes"), 0, "{nvme}");
    assert_eq!(counter(&nvme, "dma_message_read_bytes"), 0, "{nvme}");
    // The debug log names the addresses: those bytes landed inside BAR2
    // (as placed before the move; the 8 MiB after it at the new place).
    let log = run.file("nvme0.log");
    let (new_start, new_end) = (
        run.fact_u64("MOVE_NEW_BAR2"),
        run.fact_u64("MOVE_NEW_BAR2") + (1 << 30) - 1,
    );
    let in_bar2 = |direction| {
        let old = peer_dma_bytes_in(&log, direction, bar2_start, bar2_end);
        if new_start == bar2_start {
            old
        } else {
            old + peer_dma_bytes_in(&log, direction, new_start, new_end)
        }
    };
    assert_eq!(in_bar2("write"), to_gpu, "NVMe peer writes into GPU BAR2");
    assert_eq!(in_bar2("read"), from_gpu, "NVMe peer reads from GPU BAR2");
    // The GPU server counted the same bytes arriving in its VRAM, and sent
    // nothing through QEMU either.
    let gpu = stats(&run, "gpu0");
    assert_eq!(counter(&gpu, "peer_inbound_write_bytes"), to_gpu, "{gpu}");
    assert_eq!(counter(&gpu, "peer_inbound_read_bytes"), from_gpu, "{gpu}");
    assert_eq!(counter(&gpu, "dma_message_write_bytes"), 0, "{gpu}");
    assert_eq!(counter(&gpu, "dma_message_read_bytes"), 0, "{gpu}");

    // The BAR move: the placement went off (remove) and on (rescan) on top
    // of the first placement, and the data after it verifies.
    for fact in ["MOVE_REMOVE_STATUS", "MOVE_RESCAN_STATUS", "MOVE_STATUS"] {
        run.expect(fact, "0");
    }
    run.expect("MOVE_PUBLISHED", "1");
    // Right after setpci moved BAR2, nvme0's only peer window was the GPU's
    // VRAM at the new address (the move reached it before the config
    // write completed).
    for fact in [
        "MOVE_UNBIND_STATUS",
        "MOVE_SETPCI_STATUS",
        "MOVE_CTL_STATUS",
    ] {
        run.expect(fact, "0");
    }
    let moved_text = run.file("guest/moved-status.json");
    let moved: Value =
        serde_json::from_str(&moved_text).unwrap_or_else(|e| panic!("{e}: {moved_text}"));
    let windows = &moved["dma"]["peer_windows"];
    assert_eq!(
        windows,
        &serde_json::json!([{ "gpa": run.fact_u64("MOVE_SETPCI_BAR2"), "len": 1u64 << 30 }]),
        "{moved}"
    );
    assert_ne!(run.fact_u64("MOVE_SETPCI_BAR2"), bar2_start);
    run.expect("MOVE_ERRORS", "0");
    assert_eq!(run.fact_u64("MOVE_BYTES"), 8 << 20);
    run.expect("MOVE_GPU_CRC", run.fact("MOVE_EXPECTED_CRC"));
    assert!(
        counter(&gpu, "peer_placement_changes") >= 5,
        "placed, off and moved by setpci, off and on by the rescan: {gpu}"
    );
    let gpu = stats(&run, "gpu0");
    assert!(
        counter(&gpu, "bytes_checksummed") >= (64 + 64 + 16) << 20,
        "{gpu}"
    );
    assert!(counter(&gpu, "bytes_filled") >= 64 << 20, "{gpu}");

    // P2P path fault (catches a peer-fail that does not fire, fires on RAM
    // transfers, or ends in anything but Data Transfer Error): the p2p read
    // failed after Linux's retries, each attempt one injected fault; the
    // RAM read right after succeeded.
    for fact in [
        "PEERFAULT_ARM_STATUS",
        "PEERFAULT_CTL_STATUS",
        "PEERFAULT_CLEAR_STATUS",
        "PEERFAULT_RAM_STATUS",
    ] {
        run.expect(fact, "0");
    }
    assert_ne!(run.fact("PEERFAULT_P2P_STATUS"), "0");
    run.expect("PEERFAULT_ERRORS", "1");
    run.expect("PEERFAULT_BYTES", "0");
    run.expect("PEERFAULT_DTE_LINES", "1");
    let attempts = run.fact_u64("PEERFAULT_MAX_RETRIES") + 1;
    let status_text = run.file("guest/peerfault-status.json");
    let status: Value =
        serde_json::from_str(&status_text).unwrap_or_else(|e| panic!("{e}: {status_text}"));
    let armed = &status["faults"]["armed"];
    assert_eq!(armed[0]["spec"], "peer-fail", "{status}");
    assert_eq!(armed[0]["fired"].as_u64(), Some(attempts), "{status}");
    assert_eq!(counter(&nvme, "injected_faults"), attempts, "{nvme}");

    // Driver lifecycle: every unbind, bind, rmmod and modprobe succeeded
    // and left the device bound and published.
    run.expect("LIFECYCLE_FAILURES", "0");
    run.expect("REBOUND_DRIVER", "p2plab_gpu");
    run.expect("REBOUND_PUBLISHED", "1");

    // The GPU smoke suite: all its checks ran and passed.
    run.expect("SMOKE_STATUS", "0");
    run.expect("SMOKE_FAILED", "0");
    run.expect("SMOKE_SKIPPED", "0");
    assert!(
        run.fact_u64("SMOKE_PASSED") >= SMOKE_CHECKS,
        "guest-smoke.sh passed {} checks, it has {SMOKE_CHECKS}",
        run.fact("SMOKE_PASSED")
    );
    run.expect("KERNEL_COMPLAINTS", "0");
}

#[test]
fn nvme_to_nvme_through_a_cmb() {
    let script = p2p_script("p2p-cmb.sh", include_str!("../guest/p2p-cmb.sh"));
    // nvme0 runs with the peer path off: its DMA into nvme1's CMB must
    // fall back to DMA_WRITE messages through QEMU.
    let boot = Boot {
        server_args: vec![("nvme0".into(), vec!["--peer-path".into(), "off".into()])],
        ..Boot::default()
    };
    let run = run_guest("two-nvme", &script, boot);
    run.expect("NVME1_P2P_PUBLISHED", "1");
    run.expect("CMB_STATUS", "0");
    run.expect("CMB_ERRORS", "0");
    assert_eq!(run.fact_u64("CMB_BYTES"), 64 << 20);
    run.expect("SRC_SUM", run.fact("PATTERN_SUM"));
    run.expect("DST_SUM", run.fact("PATTERN_SUM"));
    // nvme0 (peer path off) wrote into nvme1's CMB through QEMU; nvme1
    // served its own CMB locally when it fetched the write data.
    let nvme0 = stats(&run, "nvme0");
    let nvme1 = stats(&run, "nvme1");
    assert_eq!(counter(&nvme0, "peer_path"), 0, "{nvme0}");
    assert_eq!(counter(&nvme1, "peer_path"), 1, "{nvme1}");
    assert!(
        counter(&nvme0, "dma_message_write_bytes") >= 64 << 20,
        "{nvme0}"
    );
    assert_eq!(counter(&nvme0, "dma_peer_write_bytes"), 0, "{nvme0}");
    assert_eq!(counter(&nvme0, "dma_peer_read_bytes"), 0, "{nvme0}");
    assert_eq!(counter(&nvme1, "peer_inbound_write_bytes"), 0, "{nvme1}");
    assert!(
        counter(&nvme1, "dma_local_read_bytes") >= 64 << 20,
        "{nvme1}"
    );
}
