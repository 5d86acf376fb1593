//! The emulated AWS EFA (issue 24) under the unmodified stack: efa.ko
//! built from Debian's kernel source, libibverbs with rdma-core's efa
//! provider, ibverbs-utils and perftest, in one boot of `rdma-efa` (nvme0,
//! gpu0, efa0, efa1 and gpu1 under one switch; efa0's wire connected to
//! efa1's through a unix socket in the run folder), and GPU memory through
//! that stack (issue 25): dma-buf MRs of p2plab-gpu's VRAM. A second boot,
//! `rdma-efa-separate`, checks the kernel's refusal.
//!
//! `unmodified_stack_on_two_efas`:
//! 1. `modprobe efa` binds both functions: efa_0 and efa_1 appear.
//!    Catches: a device the driver's probe refuses (readless reads, the
//!    reset handshake, the admin queue, a missing feature).
//! 2. `ibv_devinfo -v` of each device, parsed: vendor, part ID, hw_ver,
//!    node GUID, GID[0], max_qp, max_cq, max_qp_wr, max_sge, page size
//!    cap, max_mr_size, max_msg_sz, port state are the attributes its
//!    server was started with (the two servers are set up differently).
//!    Catches: feature data at the wrong offsets, attributes of the wrong
//!    device.
//! 3. p2plab-efa-check moves 4 MiB of guest RAM from efa_0 to efa_1 in
//!    SRD SENDs straight into the destination buffer, then efa_1 reads it
//!    all back by RDMA read; every byte is compared. The servers' counters
//!    (sends, receives, reads) moved by exactly that, and the guest's
//!    hw_counters (GET_STATS) equal the servers' at the same moment.
//!    Catches: data lost, duplicated, altered or misplaced; completions
//!    lost; counters that do not count what moved.
//!    - 3b: GPU memory (issue 25), `p2plab-efa-check gpu-xfer`, a plain
//!      libibverbs (+ efadv for the SRD QP) program: three VRAM allocations
//!      exported by p2plab_gpu as dma-bufs and registered with
//!      `ibv_reg_dmabuf_mr` (efa's pinned import); 4 MiB of a seeded pattern
//!      go from gpu0 (behind efa_0) to gpu1 (behind efa_1) in SRD SENDs, then
//!      efa_1 RDMA-reads gpu0's copy into a third buffer on gpu1. The GPUs'
//!      engines' CRC32C of source, destination and read-back equal the
//!      pattern's. The servers' counters: efa0 and efa1 each moved exactly
//!      2 × 4 MiB of payload to or from a peer BAR (`peer_bar_bytes`) and at
//!      least that by the zero-copy peer path (`dma_peer_*`), nothing by
//!      DMA messages through QEMU, and guest RAM only for descriptors and
//!      completions (under 1/16 of the payload); gpu0 served 2 × 4 MiB to
//!      peers and took none, gpu1 took 2 × 4 MiB and served none.
//!      Catches: an exporter the efa driver cannot pin or map, an EFA that
//!      cannot reach a GPU BAR's bus address, payload bounced through RAM or
//!      QEMU, data lost or misplaced on the way.
//!    - 3c: `gpu-pinned`: while efa_1's MR pins a dma-buf of gpu1 allocation A
//!      (its fd closed): FREE A returns 0 but the kernel's p2pmem/available
//!      does not get A's bytes back (a new allocation B lands elsewhere, and
//!      SENDs into A's MR leave B's contents alone), SENDs
//!      still land in A's VRAM (the engine's CRC); a function reset of gpu1
//!      keeps A's VRAM too (the same checks again); `ibv_dereg_mr` gives the
//!      bytes back and `dmabuf_pins` returns to its base. Then the exporter's
//!      dynamic importer (p2plab_p2p_test's dma-buf scenario, efa0 importing)
//!      still attaches, maps and is invalidated on FREE. No WARNING, BUG,
//!      lockdep or call trace in dmesg at any point (counted here, and the
//!      lab's clean-log check fails the boot on any).
//!      Catches: VRAM handed back to the pool (and to the next allocation)
//!      while an RDMA device still DMAs into it, an exporter without
//!      pin/unpin, a pin leak (VRAM never returned), a lock-order splat.
//! 4. perftest's ib_send_bw, ib_send_lat (SRD, `-x 0`) and ib_read_bw run
//!    between efa_0 and efa_1; both ends exit 0 and their result lines
//!    parse (bytes, iterations, a bandwidth or latency above zero; a run
//!    whose cycle-counter calibration failed under TCG is repeated by the
//!    guest script, at most 3 times, and refused here).
//!    Catches: an SRD data path perftest cannot run on (LLQ, doorbells,
//!    CQ phases, RNR handling, RDMA read).
//! 5. efa0's wire reorders 30 % and drops 5 % of its packets: the checked
//!    transfer still matches byte for byte, messages arrived out of order,
//!    and ib_send_bw completes. Catches: an SRD that loses or duplicates
//!    messages under loss, or a stack that cannot take out-of-order
//!    delivery.
//! 6. `cq-error=12` on efa0: the next send completes with
//!    IBV_WC_BAD_RESP_ERR, vendor_err 12. Catches: injected completion
//!    errors that do not reach the application.
//! 7. `admin-error=1,opcode=alloc-pd` on efa1: ibv_alloc_pd fails with ENOMEM
//!    (RESOURCE_ALLOCATION_FAILURE), the next run works. Catches: admin
//!    statuses the driver maps to another errno, a queue broken by an error.
//! 8. `link-down` on efa0: the driver logs the AENQ event ("Unknown event
//!    was received", once for down, once for up after `clear`), sends fail
//!    as unreachable (vendor_err 15), and work again once the link is up.
//!    Catches: AENQ events the driver never sees, a port state that does
//!    not reach the data path.
//! 9. The driver counted keep-alives; `rmmod efa` and `modprobe efa` work
//!    (the reset on remove, a second probe) and a transfer in the other
//!    direction matches. Catches: a reset that leaves state behind.
//!
//! The decoded trace of efa0 (recorded from the start) names admin
//! opcodes and fields as the driver's headers do.

mod common;

use std::collections::BTreeMap;

use common::{run_guest, Boot, GuestRun};
use p2plab_lab::kernel_log::Expected;
use p2plab_lab::{GuestControl, GuestScript};

const XFER_SIZE: u64 = 4 << 20;
const XFER_MSG: u64 = 8192;
const ITERS: u64 = 200;
const GPU_SIZE: u64 = 4 << 20;
const PINNED_SIZE: u64 = 1 << 20;
const EOPNOTSUPP: &str = "95";
/// p2plab_p2p_test reports kernel return values: negative errnos.
const NEG_EOPNOTSUPP: &str = "-95";
const NEG_ENODEV: &str = "-19";

/// `key: value` lines of `ibv_devinfo -v` (the first of each key).
fn devinfo(text: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in text.lines() {
        let Some((key, value)) = line.trim().split_once(':') else {
            continue;
        };
        map.entry(key.trim().to_owned())
            .or_insert_with(|| value.trim().to_owned());
    }
    map
}

/// The result row of a perftest run: the line after the header that
/// starts with `#bytes`, as numbers. A run whose clock calibration failed
/// prints zeros for every figure: refused (the guest script repeats such
/// runs).
fn perftest_row(text: &str) -> Vec<f64> {
    assert!(
        !text.contains("Correlation coefficient"),
        "perftest could not calibrate its clock in 3 attempts (TCG on a loaded host); \
         its figures are all 0:\n{text}"
    );
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("#bytes") {
            let row = lines.next().unwrap_or_default();
            return row
                .split_whitespace()
                .map(|w| w.parse().unwrap_or(f64::NAN))
                .collect();
        }
    }
    panic!("no perftest result row in:\n{text}");
}

/// A counter from a `p2plab-ctl status` JSON file the guest saved.
fn status_counter(run: &GuestRun, file: &str, name: &str) -> u64 {
    let text = run.file(&format!("guest/{file}"));
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}: {text}"));
    json[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{file} has no counter {name}: {json}"))
}

/// The guest's hw_counters of one device, as saved.
fn hw_counters(run: &GuestRun, file: &str) -> BTreeMap<String, u64> {
    run.file(&format!("guest/{file}"))
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn unmodified_stack_on_two_efas() {
    let script = GuestScript::new("efa.sh", include_str!("../guest/efa.sh"))
        .var("XFER_SIZE", XFER_SIZE)
        .var("XFER_MSG", XFER_MSG)
        .var("ITERS", ITERS)
        .var("GPU_SIZE", GPU_SIZE)
        .var("PINNED_SIZE", PINNED_SIZE);
    let boot = Boot {
        server_args: vec![("efa0".into(), vec!["--trace".into()])],
        kernel_log: vec![Expected::exactly(
            "efa*Unknown event was received or event with unimplemented handler",
            2,
        )],
        // The guest script reads both servers' counters and arms faults
        // itself, through its own control channel to each.
        guest_control: GuestControl::Devices(vec![
            "efa0".into(),
            "efa1".into(),
            "gpu0".into(),
            "gpu1".into(),
        ]),
        ..Boot::default()
    };
    let run = run_guest("rdma-efa", &script, boot);

    // 1. The probe.
    run.expect("EFA_FUNCTIONS", "2");
    run.expect("MODPROBE_UVERBS", "0");
    run.expect("MODPROBE_EFA", "0");
    assert!(run.fact("IB_DEVICES").contains("efa_0"));
    assert!(run.fact("IB_DEVICES").contains("efa_1"));

    // 2. ibv_devinfo -v against what each server was given.
    let guids = ["7032:efa0:0000:0001", "7032:efa0:0000:0002"];
    let mut by_guid = BTreeMap::new();
    for dev in ["efa_0", "efa_1"] {
        run.expect(&format!("DEVINFO_{}_EXIT", dev.to_uppercase()), "0");
        let info = devinfo(&run.file(&format!("guest/devinfo-{dev}.txt")));
        by_guid.insert(info["node_guid"].clone(), info);
    }
    for (n, guid) in guids.iter().enumerate() {
        let info = by_guid
            .get(*guid)
            .unwrap_or_else(|| panic!("no device with node_guid {guid}: {by_guid:?}"));
        assert_eq!(info["vendor_id"], "0x1d0f");
        assert_eq!(info["vendor_part_id"], "61345", "0xefa1");
        assert_eq!(info["hw_ver"], "0xEFA1");
        assert_eq!(info["phys_port_cnt"], "1");
        assert_eq!(info["max_qp"], ["64", "32"][n]);
        assert_eq!(info["max_cq"], ["64", "48"][n]);
        assert_eq!(info["max_qp_wr"], "1024");
        assert_eq!(info["max_sge"], "2");
        assert_eq!(info["max_sge_rd"], "1");
        assert_eq!(info["max_mr"], "1024");
        assert_eq!(info["max_pd"], "64");
        assert_eq!(info["max_ah"], "256");
        assert_eq!(info["max_cqe"], "8192");
        assert_eq!(info["page_size_cap"], "0x7ffff000");
        assert_eq!(info["max_mr_size"], "0x400000000", "16 GiB of 4 KiB pages");
        assert_eq!(info["max_msg_sz"], "0x22e0", "8928");
        assert!(
            info["state"].starts_with("PORT_ACTIVE"),
            "{}",
            info["state"]
        );
        assert_eq!(
            info["GID[  0]"],
            [
                "fd00:7032:efa0:0000:0000:0000:0000:0001",
                "fd00:7032:efa0:0000:0000:0000:0000:0002"
            ][n]
        );
    }

    // 3. RAM to RAM, byte for byte, and the counters that moved.
    let xfer = run.part("XFER_");
    xfer.expect("EXIT", "0");
    xfer.expect("VERIFY", "ok");
    xfer.expect("MISMATCHED_BYTES", "0");
    xfer.expect("READ_MISMATCHED_BYTES", "0");
    xfer.expect("MISSING", "0");
    xfer.expect("DUPLICATES", "0");
    let messages = XFER_SIZE / XFER_MSG;
    assert_eq!(xfer.fact_u64("SEND_OK"), messages);
    assert_eq!(xfer.fact_u64("READ_BYTES"), XFER_SIZE);
    let delta = |device: &str, name: &str| {
        status_counter(&run, &format!("after-xfer-{device}.json"), name)
            - status_counter(&run, &format!("before-xfer-{device}.json"), name)
    };
    assert_eq!(delta("efa0", "send_wrs"), messages);
    assert_eq!(delta("efa0", "send_bytes"), XFER_SIZE);
    assert_eq!(delta("efa1", "recv_wrs"), messages);
    assert_eq!(delta("efa1", "recv_bytes"), XFER_SIZE);
    assert_eq!(delta("efa1", "read_bytes"), XFER_SIZE);
    assert_eq!(delta("efa0", "read_resp_bytes"), XFER_SIZE);
    for (device, ib) in [("efa0", "efa_0"), ("efa1", "efa_1")] {
        let hw = hw_counters(&run, &format!("after-xfer-hw-{ib}.txt"));
        for (hw_name, name) in [
            ("send_wrs", "send_wrs"),
            ("send_bytes", "send_bytes"),
            ("recv_wrs", "recv_wrs"),
            ("recv_bytes", "recv_bytes"),
            ("rdma_read_wrs", "read_wrs"),
            ("rdma_read_bytes", "read_bytes"),
            ("rdma_read_resp_bytes", "read_resp_bytes"),
        ] {
            assert_eq!(
                hw.get(hw_name).copied(),
                Some(status_counter(
                    &run,
                    &format!("after-xfer-{device}.json"),
                    name
                )),
                "{ib} hw_counters/{hw_name} against the server's {name}"
            );
        }
    }

    // 3b-3c. GPU memory through dma-buf MRs.
    check_gpu_memory(&run);

    // 4. perftest.
    for name in ["SEND_BW", "SEND_LAT", "READ_BW"] {
        run.expect(&format!("{name}_CLIENT_EXIT"), "0");
        run.expect(&format!("{name}_SERVER_EXIT"), "0");
    }
    let bw = perftest_row(&run.file("guest/send_bw-client.txt"));
    assert_eq!(bw[0], 4096.0, "bytes");
    assert_eq!(bw[1], ITERS as f64, "iterations");
    assert!(bw[3] > 0.0, "average bandwidth {bw:?}");
    let lat = perftest_row(&run.file("guest/send_lat-client.txt"));
    assert_eq!((lat[0], lat[1]), (32.0, ITERS as f64));
    assert!(lat[2] > 0.0 && lat[5] >= lat[2], "t_min and t_avg {lat:?}");
    let read = perftest_row(&run.file("guest/read_bw-client.txt"));
    assert_eq!((read[0], read[1]), (65536.0, ITERS as f64));
    assert!(read[3] > 0.0);

    // 5. Reordering and loss.
    run.expect("INJECT_REORDER_EXIT", "0");
    let faulty = run.part("FAULTY_");
    faulty.expect("EXIT", "0");
    faulty.expect("VERIFY", "ok");
    faulty.expect("MISMATCHED_BYTES", "0");
    assert!(
        faulty.fact_u64("OUT_OF_ORDER") > 0,
        "SRD delivered in order"
    );
    run.expect("FAULTY_BW_CLIENT_EXIT", "0");
    run.expect("FAULTY_BW_SERVER_EXIT", "0");

    // 6. A completion error.
    run.expect("CQ_ERROR_EXIT", "0");
    run.expect("CQ_ERROR_VENDOR_ERR", "12");
    run.expect("CQ_ERROR_STATUS_NAME", "bad response error");

    // 7. An admin error.
    run.expect("ADMIN_ERROR_EXIT", "2");
    assert!(
        run.fact("ADMIN_ERROR_MESSAGE")
            .contains("Cannot allocate memory"),
        "{}",
        run.fact("ADMIN_ERROR_MESSAGE")
    );
    run.expect("AFTER_ADMIN_STATUS", "0");

    // 8. Link down and up.
    run.expect("LINK_DOWN_EVENTS", "1");
    run.expect("LINK_DOWN_VENDOR_ERR", "15");
    run.expect("LINK_EVENTS", "2");
    run.expect("LINK_UP_STATUS", "0");

    // 9. Keep-alives, unload, reload.
    assert!(run.fact_u64("KEEP_ALIVE_RCVD") > 0);
    run.expect("RMMOD_EXIT", "0");
    run.expect("RELOAD_EXIT", "0");
    run.expect("RELOADED_EXIT", "0");
    run.expect("RELOADED_VERIFY", "ok");

    // The decoded trace names what the driver sent as its headers do.
    let trace = run.file("efa0.trace.jsonl");
    let events = p2plab_trace::parse_lines(&trace).expect("efa0's trace parses");
    let admin = |name: &str| {
        events
            .iter()
            .find(|e| e["kind"] == "admin" && e["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in efa0's trace"))
    };
    assert_eq!(admin("CREATE_QP")["qp_type"], "SRD");
    assert_eq!(admin("GET_FEATURE")["feature_id"], "DEVICE_ATTR");
    assert_eq!(admin("REG_MR")["status"], "SUCCESS");
    assert!(events
        .iter()
        .any(|e| e["kind"] == "admin" && e["name"] == "ALLOC_PD" && e["status"] == "SUCCESS"));
}

/// A counter's change between two `p2plab-ctl status` files the guest saved.
fn status_delta(run: &GuestRun, before: &str, after: &str, device: &str, name: &str) -> u64 {
    let (b, a) = (
        status_counter(run, &format!("{before}-{device}.json"), name),
        status_counter(run, &format!("{after}-{device}.json"), name),
    );
    a.checked_sub(b)
        .unwrap_or_else(|| panic!("{device} {name} went back from {b} to {a}"))
}

/// Steps 3b and 3c of `unmodified_stack_on_two_efas`.
fn check_gpu_memory(run: &GuestRun) {
    // Which /dev node is which server: gpu1 was given 256 MiB.
    run.expect("GPU0_VRAM_SIZE", &(1u64 << 30).to_string());
    run.expect("GPU1_VRAM_SIZE", &(256u64 << 20).to_string());

    // 3b. gpu0 -> gpu1, SENDs and an RDMA read, checked by the GPUs' CRC.
    let gpu = run.part("GPU_");
    gpu.expect("EXIT", "0");
    gpu.expect("VERIFY", "ok");
    gpu.expect("MISSING", "0");
    gpu.expect("DUPLICATES", "0");
    gpu.expect("DEREG", "ok");
    assert_eq!(gpu.fact_u64("SEND_OK"), GPU_SIZE / XFER_MSG);
    assert_eq!(gpu.fact_u64("RECV_OK"), GPU_SIZE / XFER_MSG);
    assert_eq!(gpu.fact_u64("READ_BYTES"), GPU_SIZE);
    let expected = gpu.fact("EXPECTED_CRC");
    for which in ["SRC_CRC", "DST_CRC", "READ_CRC"] {
        assert_eq!(
            gpu.fact(which),
            expected,
            "{which}: the GPU engine's CRC32C"
        );
    }
    assert_ne!(expected, "0x00000000");

    let delta =
        |device: &str, name: &str| status_delta(run, "before-gpu", "after-gpu", device, name);
    let payload = 2 * GPU_SIZE;
    for efa in ["efa0", "efa1"] {
        assert_eq!(
            delta(efa, "peer_bar_bytes"),
            payload,
            "{efa}: payload to or from a peer BAR"
        );
        let peer = delta(efa, "dma_peer_read_bytes") + delta(efa, "dma_peer_write_bytes");
        assert!(peer >= payload, "{efa} moved {peer} bytes by the peer path");
        for name in ["dma_message_read_bytes", "dma_message_write_bytes"] {
            assert_eq!(delta(efa, name), 0, "{efa} {name}: nothing through QEMU");
        }
        let ram = delta(efa, "dma_mmap_read_bytes") + delta(efa, "dma_mmap_write_bytes");
        assert!(
            ram < GPU_SIZE / 16,
            "{efa} moved {ram} bytes of guest RAM: more than descriptors and completions"
        );
    }
    // efa0 reads gpu0 (SENDs, RDMA read responses); efa1 writes gpu1.
    assert!(delta("efa0", "dma_peer_read_bytes") >= payload);
    assert!(delta("efa1", "dma_peer_write_bytes") >= payload);
    assert_eq!(delta("gpu0", "peer_inbound_read_bytes"), payload);
    assert_eq!(delta("gpu0", "peer_inbound_write_bytes"), 0);
    assert_eq!(delta("gpu1", "peer_inbound_write_bytes"), payload);
    assert_eq!(delta("gpu1", "peer_inbound_read_bytes"), 0);
    assert_eq!(delta("efa0", "send_bytes"), GPU_SIZE);
    assert_eq!(delta("efa1", "recv_bytes"), GPU_SIZE);
    assert_eq!(delta("efa1", "read_bytes"), GPU_SIZE);
    assert_eq!(delta("efa0", "read_resp_bytes"), GPU_SIZE);

    // 3c. FREE and reset under a pinned EFA MR.
    let pinned = run.part("PINNED_");
    pinned.expect("EXIT", "0");
    pinned.expect("FREE_RET", "0");
    pinned.expect("RESET_RET", "0");
    let avail = |step: &str| pinned.fact_u64(&format!("AVAIL_{step}"));
    assert_eq!(
        avail("START") - avail("ALLOC"),
        PINNED_SIZE,
        "A came from p2pmem"
    );
    assert_eq!(
        avail("FREED"),
        avail("ALLOC"),
        "after FREE A's VRAM stays out of the pool"
    );
    assert_eq!(
        avail("RESET"),
        avail("ALLOC"),
        "after the reset only A's VRAM is held (B's came back)"
    );
    assert_eq!(avail("DEREG"), avail("START"), "dereg gave A's VRAM back");
    let (a, b) = (pinned.fact_u64("A_OFFSET"), pinned.fact_u64("B_OFFSET"));
    assert!(
        b + PINNED_SIZE <= a || a + PINNED_SIZE <= b,
        "B at {b:#x} overlaps the pinned A at {a:#x}"
    );
    pinned.expect("B_INTACT", "1");
    let base = run.fact_u64("PINNED_PINS_BASE");
    assert_eq!(
        pinned.fact_u64("PINS_REG"),
        base + 1,
        "the MR pinned the dma-buf"
    );
    assert_eq!(pinned.fact_u64("PINS_FREED"), base + 1);
    assert_eq!(pinned.fact_u64("PINS_RESET"), base + 1);
    assert_eq!(pinned.fact_u64("PINS_DEREG"), base, "dereg unpinned it");
    for when in ["AFTER_FREE", "AFTER_RESET"] {
        assert_eq!(
            pinned.fact_u64(&format!("{when}_RECV_OK")),
            PINNED_SIZE / XFER_MSG
        );
        pinned.expect(&format!("{when}_CRC_OK"), "1");
    }
    pinned.expect("FIRST_ERROR_STATUS", "-1");

    // The dynamic importer (invalidate_mappings) on the same exporter.
    run.expect("P2P_TEST_MODPROBE", "0");
    let dynamic = run.part("DYN_");
    dynamic.expect("STATUS", "0");
    dynamic.expect("P2P_ATTACH_RET", "0");
    dynamic.expect("P2P_MAP_RET", "0");
    dynamic.expect("PLAIN_ATTACH_RET", NEG_EOPNOTSUPP);
    dynamic.expect("REVOKED_INVALIDATIONS", "1");
    dynamic.expect("REVOKED_STILL_MAPPED", "0");
    dynamic.expect("REVOKED_REMAP_RET", NEG_ENODEV);

    // No kernel complaint on the way.
    assert_eq!(
        run.fact_u64("GPU_WARNINGS_AFTER"),
        run.fact_u64("GPU_WARNINGS_BEFORE"),
        "WARNING/BUG/lockdep/call trace lines in dmesg"
    );
}

/// `rdma-efa-separate`: gpu0, efa0 and efa1 each on its own root port of
/// the q35 host bridge, with an Intel-vendor vCPU (the kernel whitelists no
/// such pair).
/// 1. `p2plab-efa-check gpu-xfer` on gpu0's memory: the first
///    `ibv_reg_dmabuf_mr` fails with EOPNOTSUPP (the exporter's attach
///    refuses the efa device after the kernel's verbose distance check)
///    and dmesg gains the kernel's reason ("cannot be used for
///    peer-to-peer DMA as the client and provider ... do not share an
///    upstream bridge or whitelisted host bridge"), once.
///    Catches: an exporter that hands out BAR bus addresses the kernel
///    refuses to route (the importer would DMA to nowhere), an errno that
///    does not reach the application, a refusal without a reason.
/// 2. Nothing moved: efa0's and efa1's payload, peer-path and message
///    counters, and gpu0's peer-inbound counters, did not change across
///    it; no MR is left behind and nothing stays pinned.
///    Catches: a refusal that still registered or moved something.
/// 3. RAM to RAM through the same two EFAs works and matches.
///    Catches: a refusal that broke the devices (so 1 proves nothing).
#[test]
fn gpu_memory_refused_across_root_ports() {
    let script = GuestScript::new("efa-refused.sh", include_str!("../guest/efa-refused.sh"));
    let boot = Boot {
        guest_control: GuestControl::Devices(vec!["efa0".into(), "efa1".into(), "gpu0".into()]),
        ..Boot::default()
    };
    let run = run_guest("rdma-efa-separate", &script, boot);
    run.expect("MODPROBE_UVERBS", "0");
    run.expect("MODPROBE_EFA", "0");

    // 1. The refusal, its errno and its reason.
    let refused = run.part("REFUSED_");
    refused.expect("EXIT", "3");
    refused.expect("REG_ERRNO", EOPNOTSUPP);
    refused.expect("DMESG", "1");
    refused.expect("PINS", "0");

    // 2. Nothing moved.
    let delta = |device: &str, name: &str| status_delta(&run, "before", "after", device, name);
    for efa in ["efa0", "efa1"] {
        for name in [
            "peer_bar_bytes",
            "dma_peer_read_bytes",
            "dma_peer_write_bytes",
            "dma_message_read_bytes",
            "dma_message_write_bytes",
            "send_bytes",
            "recv_bytes",
            "read_bytes",
            "tx_bytes",
        ] {
            assert_eq!(delta(efa, name), 0, "{efa} {name}");
        }
        assert_eq!(status_counter(&run, &format!("after-{efa}.json"), "mrs"), 0);
    }
    for name in ["peer_inbound_read_bytes", "peer_inbound_write_bytes"] {
        assert_eq!(delta("gpu0", name), 0, "gpu0 {name}");
    }

    // 3. The EFAs still move RAM.
    let ram = run.part("RAM_");
    ram.expect("EXIT", "0");
    ram.expect("VERIFY", "ok");
}
