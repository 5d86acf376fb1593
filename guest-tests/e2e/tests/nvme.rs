//! Issue 3 end to end: the unmodified Linux nvme driver and nvme-cli against
//! p2plab-nvme, with the data checked by reading it back, the CMB checked in
//! sysfs, dmesg and the server's own counters, and persistence across a
//! server restart under the running guest.
//!
//! What each test catches: `linux_nvme_driver_and_nvme_cli_against_p2plab_nvme`
//! fails on wrong Identify fields (sizes, formats, ONCS, unique NGUIDs), on
//! a data path that loses or invents data (read-back, Write Zeroes and DSM
//! neighbours, fio verify over both engines and many queues), on an error
//! log entry whose status, NSID, LBA or count is wrong for a read past the
//! end (SMART must agree), on an advertised feature that does not answer
//! or answers a wrong value (defaults, Set/Get round trip, the timestamp
//! the driver set), on Compare that cannot tell a mismatch, Verify that
//! accepts blocks past the end, Format that keeps data or the old block
//! size, a reset after which data is gone, registers nvme-cli decodes
//! differently from the device's own CMB/PMR configuration, and a CMB that
//! is not published or not used for SQs, and on SMART read/write counters
//! that miss or invent commands (blktrace and explicit flushes under
//! stress-ng), and on a PMR (topology `lab-pmr`, BAR4) that loses guest
//! stores across a server restart under the running guest (unplug, new
//! server, re-plug: the guest reads back through the sysfs resource mmap),
//! keeps them only in memory (the host reads the file of the stopped
//! server), writes them at the wrong offset (head and tail spans, the rest
//! of the file must stay zero) or serves reads from somewhere other than
//! the file (the guest's read-back goes through a fresh server; the head
//! checked against the tail's seed proves that comparison can fail), and on
//! a namespace whose writes do not reach its backing file or that a fresh
//! server does not return (4 MiB written before the same restart: the host
//! compares the stopped server's file, the guest reads back after the
//! re-plug). This replaced `data_survives_a_server_restart`, which needed
//! two cold boots for the same two checks.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{run_guest_with, test_state_dir, Boot, GuestRun};
use p2plab_guest_programs::pattern;
use p2plab_lab::control::unplug;
use p2plab_lab::kernel_log::Expected;
use p2plab_lab::{GuestScript, Lab};
use serde_json::Value;

/// Namespace 1 and the 4 MiB PMR come from the topology (`lab-pmr`: 1 GiB
/// file with 512-byte blocks, PMR file `@STATE@/nvme0-pmr.img`); namespace
/// 2 is added here (256 MiB in memory, 4096-byte blocks).
fn second_namespace() -> Vec<(String, Vec<String>)> {
    vec![(
        "nvme0".into(),
        vec!["--namespace".into(), "mem,size=256M,lba=4096".into()],
    )]
}

/// The PMR phase: the PMR's size, the span written at its head and its
/// tail, and their seeds (the pattern of `p2plab-pcimem fill`).
const PMR_BYTES: usize = 4 << 20;
const PMR_SPAN: usize = 64 << 10;
const PMR_TAIL: usize = PMR_BYTES - PMR_SPAN;
const PMR_HEAD_SEED: u64 = 0x504d_5248;
/// Where the restart phase writes its 4 MiB into namespace 1 (MiB).
const NS_MIB: usize = 100;
const NS_BLOB: usize = 4 << 20;
const PMR_TAIL_SEED: u64 = 0x504d_5254;
/// A guest that never ejects the device (QMP's DEVICE_DELETED never comes).
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(120);
/// The guest's phases before the PMR are long under TCG (fio, stress-ng,
/// blktrace): this bounds a hang, not a duration.
const PHASE_TIMEOUT: Duration = Duration::from_secs(900);

fn script() -> GuestScript {
    GuestScript::new("nvme.sh", include_str!("../guest/nvme.sh"))
        .var("PMR_SPAN", PMR_SPAN)
        .var("PMR_TAIL", PMR_TAIL)
        .var("PMR_HEAD_SEED", format!("{PMR_HEAD_SEED:#x}"))
        .var("PMR_TAIL_SEED", format!("{PMR_TAIL_SEED:#x}"))
        .var("NS_MIB", NS_MIB)
}

/// What the host saw while it restarted nvme0 under the guest.
struct PmrRestart {
    /// nvme0's counters just before the unplug (the CMB checks use them:
    /// the fresh server counts from zero).
    stats_before: Value,
    /// The PMR file as the stopped server left it.
    file_after_stop: Vec<u8>,
    /// Namespace 1's backing file where the guest wrote its blob, as the
    /// stopped server left it.
    ns_after_stop: Vec<u8>,
}

/// The host side of the PMR phase: once the guest has written the PMR,
/// unplug nvme0, stop its server, read the PMR file, start a fresh server
/// and plug nvme0 again.
fn restart_nvme0_under_the_guest(lab: &mut Lab, pmr_file: &Path, ns_file: &Path) -> PmrRestart {
    lab.wait_guest_file("pmr-written", lab.budget(PHASE_TIMEOUT))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let stats_before = lab.server_stats("nvme0").expect("nvme0 stats");
    let mut qmp = lab.qmp().expect("QMP");
    unplug(&mut qmp, "nvme0", lab.budget(UNPLUG_TIMEOUT))
        .unwrap_or_else(|e| panic!("{e:#} (run folder {})", lab.run_dir.display()));
    let status = lab.stop_server("nvme0").expect("stopping nvme0");
    assert!(status.success(), "nvme0 server exit status {status}");
    let file_after_stop = std::fs::read(pmr_file).expect("the PMR file");
    let ns_image = std::fs::read(ns_file).expect("namespace 1's backing file");
    let ns_after_stop = ns_image
        .get(NS_MIB << 20..(NS_MIB << 20) + NS_BLOB)
        .expect("the backing file reaches the blob")
        .to_vec();
    lab.start_server("nvme0")
        .unwrap_or_else(|e| panic!("restarting nvme0: {e:#}"));
    lab.plug(&mut qmp, "nvme0")
        .unwrap_or_else(|e| panic!("re-plugging nvme0: {e:#}"));
    lab.write_guest_file("pmr-replugged", "")
        .expect("signalling the guest");
    PmrRestart {
        stats_before,
        file_after_stop,
        ns_after_stop,
    }
}

fn json(run: &GuestRun, name: &str) -> Value {
    let text = std::fs::read_to_string(run.run_dir().join("guest").join(name))
        .unwrap_or_else(|e| panic!("guest did not write {name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {text}"))
}

fn num(v: &Value, key: &str) -> u64 {
    match &v[key] {
        Value::Number(n) => n.as_u64().unwrap_or_else(|| panic!("{key}: {n}")),
        Value::String(s) => s.trim().parse().unwrap_or_else(|_| panic!("{key}: {s}")),
        other => panic!("{key} missing or odd: {other}"),
    }
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} missing: {v}"))
        .trim()
}

#[test]
fn linux_nvme_driver_and_nvme_cli_against_p2plab_nvme() {
    let state = test_state_dir("nvme-cli");
    let pmr_file = state.join("nvme0-pmr.img");
    let ns_file = state.join("nvme0n1.img");
    let (run, pmr) = run_guest_with(
        "lab-pmr",
        &script(),
        Boot {
            server_args: second_namespace(),
            // Debian's kernel has IO_STRICT_DEVMEM: without this, nvme-cli
            // cannot mmap BAR0 of a bound controller for show-regs.
            append: vec!["iomem=relaxed".into()],
            state: Some(state),
            // `nvme reset`, asked for once (the re-plug is a new probe,
            // not a reset).
            kernel_log: vec![Expected::exactly("nvme*resetting controller", 1)],
            ..Boot::default()
        },
        |lab| restart_nvme0_under_the_guest(lab, &pmr_file, &ns_file),
    );

    // Identify controller.
    let ctrl = json(&run, "id-ctrl.json");
    assert_eq!(num(&ctrl, "sqes"), 0x66, "SQ entry size 64");
    assert_eq!(num(&ctrl, "cqes"), 0x44, "CQ entry size 16");
    assert_eq!(num(&ctrl, "nn"), 2);
    assert!(num(&ctrl, "mdts") > 0, "MDTS is enforced, so advertised");
    assert!(!text(&ctrl, "sn").is_empty() && !text(&ctrl, "mn").is_empty());
    assert!(!text(&ctrl, "fr").is_empty());
    assert_ne!(num(&ctrl, "sgls") & 0x3, 0, "SGLs advertised");
    let oncs = num(&ctrl, "oncs");
    for (bit, what) in [
        (0, "Compare"),
        (2, "DSM"),
        (3, "Write Zeroes"),
        (7, "Verify"),
    ] {
        assert_ne!(oncs & (1 << bit), 0, "ONCS advertises {what}");
    }
    assert!(num(&ctrl, "ver") >= 0x10400);

    // Namespaces: sizes and LBA formats.
    let ns1 = json(&run, "id-ns1.json");
    let ns2 = json(&run, "id-ns2.json");
    assert_eq!(num(&ns1, "nsze"), (1u64 << 30) / 512);
    assert_eq!(num(&ns2, "nsze"), (256u64 << 20) / 4096);
    let lbads = |ns: &Value| {
        let index = (num(ns, "flbas") & 0xf) as usize;
        num(&ns["lbafs"][index], "ds")
    };
    assert_eq!(lbads(&ns1), 9);
    assert_eq!(lbads(&ns2), 12);
    assert_ne!(text(&ns1, "nguid"), text(&ns2, "nguid"), "unique NGUIDs");
    run.expect("BOGUS_IDS", "0");
    let list = json(&run, "list.json");
    let devices = list["Devices"].to_string();
    assert!(
        devices.contains("nvme0n1") && devices.contains("nvme0n2"),
        "{devices}"
    );

    // Data path.
    run.expect("READBACK", "ok");
    run.expect("WZ_CMD", "ok");
    run.expect("WZ_NONZERO_BYTES", "0");
    run.expect("WZ_NEIGHBOURS", "ok");
    run.expect("DSM_CMD", "ok");
    run.expect("DSM_NONZERO_BYTES", "0");
    run.expect("FLUSH_CMD", "ok");
    for bs in ["4k", "128k"] {
        for qd in [1, 32] {
            for engine in ["libaio", "io_uring"] {
                run.expect(&format!("FIO_{bs}_QD{qd}_{engine}"), "ok");
            }
        }
    }
    run.expect("FIO_PARALLEL", "ok");
    assert!(run.fact_u64("IO_QUEUES") >= 2, "one I/O queue per vCPU");

    // Logs and features.
    let smart = json(&run, "smart.json");
    assert!(num(&smart, "data_units_written") > 0);
    assert!(num(&smart, "data_units_read") > 0);
    assert!(num(&smart, "host_write_commands") > 100);
    assert!(num(&smart, "host_read_commands") > 100);
    let temperature = num(&smart, "temperature");
    assert!(
        (273..373).contains(&temperature),
        "temperature {temperature} K"
    );
    let fw = json(&run, "fw-log.json");
    assert!(
        fw.to_string().contains(text(&ctrl, "fr")),
        "fw-log shows the running firmware: {fw}"
    );
    // Error log: the read past the end is entry 0, every field as predicted,
    // and SMART counts the same number of error entries.
    run.expect("READ_PAST_END_STATUS", "1");
    let errors = json(&run, "error-log.json");
    let entries = errors["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("error-log has no errors array: {errors}"));
    assert_eq!(entries.len(), 8, "error-log -e 8 returns 8 entries");
    let newest = &entries[0];
    let count = num(newest, "error_count");
    assert!(count >= 1, "{newest}");
    assert_eq!(
        num(newest, "status_field"),
        0x4080,
        "DNR | LBA Out of Range: {newest}"
    );
    assert_eq!(num(newest, "nsid"), 1, "{newest}");
    let ns1_blocks = run.fact_u64("NS1_SECTORS");
    assert_eq!(
        num(newest, "lba"),
        ns1_blocks,
        "the LBA past the end: {newest}"
    );
    assert!(num(newest, "sqid") >= 1, "an I/O queue: {newest}");
    for older in &entries[1..] {
        assert!(
            num(older, "error_count") < count,
            "entry 0 is the newest: {errors}"
        );
    }
    assert_eq!(
        num(&smart, "num_err_log_entries"),
        count,
        "SMART and error log agree"
    );

    // Features: every one the controller advertises answers, with the
    // values this controller and Linux's driver set.
    let mut advertised = vec![1u64, 2, 4, 7, 8, 9, 10, 11];
    if num(&ctrl, "vwc") & 1 != 0 {
        advertised.push(6);
    }
    if num(&ctrl, "apsta") & 1 != 0 {
        advertised.push(0xc);
    }
    if num(&ctrl, "hmpre") > 0 {
        advertised.push(0xd);
    }
    if oncs & (1 << 6) != 0 {
        advertised.push(0xe);
    }
    if num(&ctrl, "kas") > 0 {
        advertised.push(0xf);
    }
    advertised.push(5);
    let feature = |id: u64| -> Value {
        run.expect(&format!("FEATURE_STATUS_{id}"), "0");
        let doc = json(&run, &format!("feature-{id}.json"));
        let key = format!("feature: {id:#04x}");
        doc[&key][0].clone()
    };
    let current = |id: u64| -> u64 {
        let f = feature(id);
        let text = text(&f, "Current");
        u64::from_str_radix(text.trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("feature {id:#x} Current {text:?}"))
    };
    for &id in &advertised {
        let _ = current(id);
    }
    assert_eq!(current(2) & 0x1f, 0, "power state 0 (the only one)");
    assert_eq!(current(4), 343, "default temperature threshold 343 K");
    assert_eq!(current(5), 0, "no error recovery limit, DULBE off");
    if advertised.contains(&6) {
        assert_eq!(current(6), 1, "volatile write cache enabled");
    }
    let queues = current(7);
    assert_eq!(queues & 0xffff, queues >> 16, "NSQA == NCQA");
    assert!(
        (queues & 0xffff) + 1 >= run.fact_u64("IO_QUEUES"),
        "the driver uses no more I/O queues than allocated"
    );
    assert_eq!(current(8), 0, "no interrupt coalescing");
    assert_eq!(current(9) & 0xffff, 0, "vector 0 asked, vector 0 answered");
    let oaes = num(&ctrl, "oaes");
    assert_eq!(
        current(11) & 0x100,
        oaes & 0x100,
        "AEC: namespace notices as advertised"
    );
    if advertised.contains(&0xe) {
        let decoded = json(&run, "feature-14.json");
        let stamp = num(&decoded["Feature: 0x0e"][0], "timestamp");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("host clock after 1970")
            .as_millis() as u64;
        assert!(
            now.abs_diff(stamp) < 30 * 60 * 1000,
            "timestamp {stamp} ms is the host's time ({now} ms)"
        );
    }
    run.expect("SET_FEATURE_4_STATUS", "0");
    let after_set = json(&run, "feature-4-after-set.json");
    assert_eq!(
        text(&after_set["feature: 0x04"][0], "Current"),
        "0x00000150",
        "temperature threshold set+get"
    );

    // Compare and Verify.
    run.expect("COMPARE_BLOCK0", "data");
    run.expect("COMPARE_SAME_STATUS", "0");
    assert_ne!(
        run.fact("COMPARE_DIFFERENT_STATUS"),
        "0",
        "a mismatch fails"
    );
    run.expect("VERIFY_STATUS", "0");
    assert_ne!(
        run.fact("VERIFY_PAST_END_STATUS"),
        "0",
        "verify past the end fails"
    );

    // Format NVM: 512-byte blocks afterwards, the data erased.
    run.expect("FORMAT_STATUS", "0");
    run.expect("FORMAT_SECTOR_SIZE", "512");
    run.expect("FORMAT_NONZERO_BYTES", "0");
    let formatted = json(&run, "id-ns2-formatted.json");
    assert_eq!(lbads(&formatted), 9, "{formatted}");
    assert_eq!(num(&formatted, "nsze"), (256u64 << 20) / 512);

    // stress-ng under blktrace: the guest's requests are the device's
    // commands, one for one; the file system is clean afterwards.
    for step in [
        "STRESS_WRITE_THROUGH_STATUS",
        "STRESS_MKFS_STATUS",
        "STRESS_MOUNT_STATUS",
        "STRESS_STATUS",
        "STRESS_UMOUNT_STATUS",
        "BLKTRACE_STATUS",
        "BLKPARSE_STATUS",
        "E2FSCK_STATUS",
    ] {
        run.expect(step, "0");
    }
    run.expect("STRESS_FLUSHES", "4");
    let (before, after) = (
        json(&run, "smart-ns2-before.json"),
        json(&run, "smart-ns2-after.json"),
    );
    let delta = |key: &str| num(&after, key) - num(&before, key);
    let (reads, writes) = (run.fact_u64("TRACE_READS"), run.fact_u64("TRACE_WRITES"));
    // Two workers write 8 MiB each with O_DIRECT, in commands of at most
    // MDTS (512 KiB): at least 32 write commands.
    assert!(
        writes >= 32,
        "stress-ng's direct writes reached the device: {writes}"
    );
    assert_eq!(
        delta("host_read_commands"),
        reads,
        "reads: device vs blktrace"
    );
    assert_eq!(
        delta("host_write_commands"),
        writes,
        "writes: device vs blktrace"
    );

    // The guest has what foreign suites (blktests and the like) look for.
    run.expect("KERNEL_CONFIG_STATUS", "0");
    run.expect("DEBUGFS_STATUS", "0");
    run.expect("UDEVADM_STATUS", "0");
    assert!(
        !run.facts.contains_key("MISSING_TOOL"),
        "guest lacks {}",
        run.fact("MISSING_TOOL")
    );

    // python3-libnvme finds the controller with Identify's strings.
    run.expect("LIBNVME_STATUS", "0");
    let tree = json(&run, "libnvme.json");
    let found = tree["controllers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == "nvme0"))
        .unwrap_or_else(|| panic!("libnvme does not list nvme0: {tree}"));
    assert_eq!(text(found, "transport"), "pcie", "{found}");
    assert_eq!(text(found, "serial"), text(&ctrl, "sn"), "{found}");
    assert_eq!(text(found, "model"), text(&ctrl, "mn"), "{found}");
    assert_eq!(text(found, "firmware"), text(&ctrl, "fr"), "{found}");

    // Human-readable identify decodes without error.
    run.expect("ID_CTRL_HUMAN_STATUS", "0");
    run.expect("ID_NS_HUMAN_STATUS", "0");

    // Reset.
    run.expect("RESET_STATUS", "0");
    run.expect("RESET_STATE", "live");
    run.expect("RESET_READBACK", "ok");

    // Registers, decoded by nvme-cli.
    // Registers as nvme-cli reads them from BAR0, decoded here against the
    // server's configuration (1024-entry queues, 64 MiB CMB in BAR2, 4 MiB
    // PMR in BAR4, no NVM Subsystem Reset) and what Linux programmed.
    run.expect("SHOW_REGS_STATUS", "0");
    let regs = json(&run, "regs.json");
    let reg = |name: &str| num(&regs, name);
    let bits = |value: u64, low: u32, width: u32| (value >> low) & ((1 << width) - 1);
    let cap = reg("cap");
    assert_eq!(bits(cap, 0, 16) + 1, 1024, "CAP.MQES: {cap:#x}");
    assert_eq!(bits(cap, 32, 4), 0, "CAP.DSTRD: {cap:#x}");
    assert_eq!(bits(cap, 57, 1), 1, "CAP.CMBS: {cap:#x}");
    assert_eq!(bits(cap, 56, 1), 1, "CAP.PMRS: {cap:#x}");
    let nssrs = bits(cap, 36, 1);
    assert_eq!(reg("vs"), num(&ctrl, "ver"), "VS matches Identify");
    let cc = reg("cc");
    assert_eq!(
        (bits(cc, 0, 1), bits(cc, 16, 4), bits(cc, 20, 4)),
        (1, 6, 4),
        "CC: EN, IOSQES 64 B, IOCQES 16 B: {cc:#x}"
    );
    assert_eq!(bits(reg("csts"), 0, 1), 1, "CSTS.RDY");
    let cmbsz = reg("cmbsz");
    let unit = 4096u64 << (4 * bits(cmbsz, 8, 4));
    assert_eq!(
        bits(cmbsz, 12, 20) * unit,
        64 << 20,
        "CMBSZ size: {cmbsz:#x}"
    );
    assert_eq!(bits(cmbsz, 0, 1), 1, "CMBSZ.SQS: {cmbsz:#x}");
    assert_eq!(bits(cmbsz, 3, 2), 3, "CMBSZ.RDS and WDS: {cmbsz:#x}");
    let cmbloc = reg("cmbloc");
    assert_eq!(bits(cmbloc, 0, 3), 2, "CMBLOC.BIR: BAR2");
    assert_eq!(bits(cmbloc, 12, 20), 0, "CMBLOC.OFST");
    let cmbmsc = reg("cmbmsc");
    assert_eq!(
        bits(cmbmsc, 0, 2),
        3,
        "CMBMSC: CRE and CMSE set by Linux: {cmbmsc:#x}"
    );
    assert_eq!(
        cmbmsc & !0xfff,
        run.fact_u64("BAR2_START"),
        "CMBMSC.CBA is where the guest put BAR2"
    );
    let pmrcap = reg("pmrcap");
    assert_eq!(bits(pmrcap, 5, 3), 4, "PMRCAP.BIR: BAR4: {pmrcap:#x}");
    assert_eq!(bits(pmrcap, 3, 2), 3, "PMRCAP.RDS and WDS: {pmrcap:#x}");
    assert_eq!(run.fact_u64("BAR4_SIZE"), 4 << 20, "PMR BAR size");
    assert_eq!(
        bits(reg("pmrctl"), 0, 1),
        0,
        "Linux leaves the PMR disabled"
    );
    assert_eq!(bits(reg("pmrsts"), 8, 1), 1, "PMRSTS.NRDY while disabled");
    // NVM Subsystem Reset only when CAP.NSSRS advertises it: nvme-cli
    // refuses otherwise, and a device that claims it must perform it.
    if nssrs == 0 {
        assert_ne!(
            run.fact("SUBSYSTEM_RESET_STATUS"),
            "0",
            "refused: CAP.NSSRS is 0"
        );
    } else {
        run.expect("SUBSYSTEM_RESET_STATUS", "0");
    }

    // CMB.
    assert_ne!(run.fact_u64("CMBSZ"), 0);
    run.expect("P2P_ADDED", "1");
    run.expect("P2P_PUBLISHED", "1");
    assert_eq!(run.fact_u64("P2P_SIZE"), 64 << 20);
    let stats = &pmr.stats_before;
    let cmb_sqes = stats
        .pointer("/cmb/sq_entries_fetched")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    assert!(
        cmb_sqes > 0,
        "I/O submission queues live in the CMB: {stats}"
    );

    // PMR: written by the guest, kept by the file across a server restart.
    check_pmr(&run, &pmr);
}

/// The PMR phase's results, checked after the rest of the boot's.
fn check_pmr(run: &GuestRun, pmr: &PmrRestart) {
    assert_eq!(run.fact_u64("PMR_RESOURCE_BYTES"), PMR_BYTES as u64);
    run.expect("PMR_FILL_HEAD_STATUS", "0");
    run.expect("PMR_FILL_TAIL_STATUS", "0");
    run.expect("PMR_CHECK_BEFORE_STATUS", "0");
    assert_eq!(
        pmr.stats_before
            .pointer("/pmr/size")
            .and_then(Value::as_u64),
        Some(PMR_BYTES as u64),
        "the server serves a 4 MiB PMR: {}",
        pmr.stats_before
    );
    // The host's view: the stopped server's file holds both spans.
    let file = &pmr.file_after_stop;
    assert_eq!(file.len(), PMR_BYTES, "PMR file size");
    assert!(
        file[..PMR_SPAN] == pattern::bytes(PMR_HEAD_SEED, PMR_SPAN)[..],
        "the PMR file holds the head pattern the guest stored"
    );
    assert!(
        file[PMR_TAIL..] == pattern::bytes(PMR_TAIL_SEED, PMR_SPAN)[..],
        "the PMR file holds the tail pattern the guest stored"
    );
    assert!(
        file[PMR_SPAN..PMR_TAIL].iter().all(|&b| b == 0),
        "nothing else was written into the PMR file"
    );
    // The guest's view through the fresh server.
    run.expect("PMR_REPLUG_STATE", "live");
    run.expect("PMR_CHECK_HEAD_AFTER_STATUS", "0");
    run.expect("PMR_CHECK_TAIL_AFTER_STATUS", "0");
    run.expect("PMR_CHECK_WRONG_SEED_STATUS", "1");

    // Namespace 1 across the same restart: the stopped server's backing
    // file holds the blob, and the fresh server returns it to the guest.
    run.expect("NS_WRITE_STATUS", "0");
    let blob = std::fs::read(run.run_dir().join("guest/blob")).expect("blob on the host");
    assert_eq!(blob.len(), NS_BLOB, "the guest's blob");
    assert!(
        pmr.ns_after_stop == blob,
        "namespace 1's backing file holds the blob the guest wrote before the restart"
    );
    let before = run.fact("NS_SUM_BEFORE");
    assert_eq!(before.len(), 32, "an md5 sum: {before}");
    assert_eq!(
        run.fact("NS_SUM_AFTER"),
        before,
        "the fresh server reads back what the guest wrote before the restart"
    );
}
