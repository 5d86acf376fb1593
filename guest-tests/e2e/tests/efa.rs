//! The emulated AWS EFA (issue 24) under the unmodified stack: efa.ko
//! built from Debian's kernel source, libibverbs with rdma-core's efa
//! provider, ibverbs-utils and perftest, in one boot of `rdma-efa` (nvme0,
//! gpu0, efa0 and efa1 under one switch; efa0's wire connected to efa1's
//! through a unix socket in the run folder).
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
        .var("ITERS", ITERS);
    let boot = Boot {
        server_args: vec![("efa0".into(), vec!["--trace".into()])],
        kernel_log: vec![Expected::exactly(
            "efa*Unknown event was received or event with unimplemented handler",
            2,
        )],
        // The guest script reads both servers' counters and arms faults
        // itself, through its own control channel to each.
        guest_control: GuestControl::Devices(vec!["efa0".into(), "efa1".into()]),
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
