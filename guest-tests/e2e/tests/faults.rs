//! Breaking nvme0 on purpose (issue 10), in one boot of the default lab:
//! the host arms each fault through nvme0's control socket at the moment
//! the guest asks for it (they meet through files in `/run/p2plab`), and
//! the guest reports how Linux's nvme driver reacted.
//!
//! 1. `timeout` on one read: Linux times the command out, sends an Abort,
//!    the controller aborts it with Command Abort Requested, Linux retries
//!    and dd gets the right data. Catches: an Abort that cannot abort
//!    (Linux then resets the controller: "reset controller" in dmesg), a
//!    held command that blocks its queue, a retry with wrong data.
//!    The same with `no-abort`: the Abort answers "not aborted", the
//!    second timeout makes Linux reset the controller, and the read is
//!    retried with the right data. Catches: held commands that survive a
//!    reset, or a controller that does not come back.
//! 2. `media-error` on LBAs 3000-3007: single-block direct reads fail with
//!    EIO on exactly those eight blocks and nowhere around them; `nvme
//!    error-log` names Unrecovered Read Error at a block of the range;
//!    SMART's media error count equals the server's count of failed reads;
//!    rewriting the blocks heals them. Catches: an off-by-one range, errors
//!    that do not persist or survive a rewrite, a log that does not show
//!    them.
//! 3. `cfs` on one read: Linux's timeout handler reads CSTS.CFS, resets the
//!    controller, and I/O resumes (fio verify). Catches: CFS that never
//!    shows in CSTS, or that survives the reset (the controller would stay
//!    dead).
//!    `internal-error` on another read: the queue worker panics as a
//!    device bug would, the worker boundary raises CSTS.CFS, and Linux
//!    recovers the same way. Catches: a handler panic that wedges the
//!    queue or kills the server instead of failing the controller.
//! 4. `drop-irq` on one read: the completion is posted without its MSI-X
//!    message; Linux's timeout handler polls the queue and finds it
//!    ("completion polled"). Catches: a dropped interrupt that also loses
//!    the completion, or one that is not dropped (no timeout at all).
//!
//! 5. The guest arms a fault itself with `p2plab-ctl nvme0 inject ...`
//!    through its virtio-serial port to nvme0's control socket, and reads
//!    `status` back the same way. Catches: a broken guest channel, a spec
//!    that fires more often than its count.
//!
//! 6. `nvme ocp set-error-injection --no-uuid` with a NAND corruption
//!    entry: reads fail with EIO until a disabled entry replaces it, and
//!    `get-error-injection` reads the entry back. Catches: the OCP feature
//!    not reaching the injector, or not being replaced.
//!
//! 7. The decoded trace is on (through the control socket) during the
//!    timeout phase: nvme0.trace.jsonl, parsed, holds the injected hang
//!    (marked injected, on the Read of LBA 2048), Linux's Abort, the held
//!    Read ended with Command Abort Requested, and the retried Read
//!    succeeding with its data pointer in guest RAM. Catches: a trace that
//!    cannot be switched on at run time, an unmarked injected fault,
//!    commands under the wrong name or without their fields.
//!
//! Every reaction is counted exactly in dmesg (no timeout, reset or WARN
//! that the test did not ask for) and in the server's counters (`status`
//! on the control socket).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{test_state_dir, BOOT_TIMEOUT};
use p2plab_lab::kernel_log::Expected;
use p2plab_lab::{GuestControl, GuestScript, Lab, LabOptions, Timeout};
use p2plab_server::control::{request, ControlRequest};
use serde_json::Value;

/// The guest's phases are seconds long (5 s I/O timeouts); this bounds a
/// hang, not a duration.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);

/// Guest block I/O timeout set for this test (ms): long enough for TCG,
/// short enough that three timeouts stay quick.
const IO_TIMEOUT_MS: u64 = 5000;

/// The server's counters and fault state, from its control socket.
fn status(ctl: &Path) -> Value {
    request(ctl, &ControlRequest::Status).unwrap_or_else(|e| panic!("status: {e:#}"))
}

fn counter(status: &Value, key: &str) -> u64 {
    status["counters"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no counters.{key} in {status}"))
}

fn inject(ctl: &Path, spec: &str) {
    let reply = request(
        ctl,
        &ControlRequest::Inject {
            spec: spec.to_owned(),
        },
    )
    .unwrap_or_else(|e| panic!("inject {spec}: {e:#}"));
    assert!(reply["id"].as_u64().is_some(), "{reply}");
}

fn clear(ctl: &Path) {
    request(ctl, &ControlRequest::Clear).unwrap_or_else(|e| panic!("clear: {e:#}"));
}

#[test]
fn linux_recovers_from_injected_nvme_faults() {
    let script = GuestScript::new("faults.sh", include_str!("../guest/faults.sh"))
        .var("IO_TIMEOUT_MS", IO_TIMEOUT_MS);
    let mut options = LabOptions::exec("lab", &script).expect("the guest script");
    options.timeout = Some(Timeout::TcgBudget(BOOT_TIMEOUT));
    options.state = Some(test_state_dir("faults"));
    options.stream_output = std::env::var_os("P2PLAB_STREAM").is_some();
    // Phase 5 drives nvme0 from the guest.
    options.guest_control = GuestControl::Devices(vec!["nvme0".to_owned()]);
    // The clean-boot check: exactly the complaints the phases provoke.
    options.kernel_log.expected = vec![
        // The held read and the first timeout of the unabortable one.
        Expected::exactly("nvme*timeout, aborting", 2),
        // The unabortable read's second timeout.
        Expected::exactly("nvme*timeout, reset controller", 1),
        // The dropped interrupt.
        Expected::exactly("nvme*timeout, completion polled", 1),
        // CFS and the internal error.
        Expected::exactly("nvme*controller is down; will reset", 2),
    ];
    let mut lab = Lab::start(&options).unwrap_or_else(|e| panic!("the lab failed: {e:#}"));
    let ctl = lab.run_dir.join("nvme0.ctl");
    let phase = |lab: &mut Lab, name: &str, specs: &[&str]| -> (Value, Value) {
        lab.wait_guest_file(&format!("ready-{name}"), lab.budget(PHASE_TIMEOUT))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let before = status(&ctl);
        let traced = name == "timeout";
        if traced {
            let reply = request(&ctl, &ControlRequest::Trace { on: Some(true) })
                .unwrap_or_else(|e| panic!("trace on: {e:#}"));
            assert_eq!(reply["on"], true, "{reply}");
        }
        for spec in specs {
            inject(&ctl, spec);
        }
        lab.write_guest_file(&format!("armed-{name}"), "")
            .expect("signalling the guest");
        lab.wait_guest_file(&format!("done-{name}"), lab.budget(PHASE_TIMEOUT))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let after = status(&ctl);
        if traced {
            let reply = request(&ctl, &ControlRequest::Trace { on: Some(false) })
                .unwrap_or_else(|e| panic!("trace off: {e:#}"));
            assert_eq!(reply["on"], false, "{reply}");
        }
        clear(&ctl);
        // The guest arms faults itself after the last phase: it must not
        // race this clear (which would disarm its fault before its read).
        lab.write_guest_file(&format!("cleared-{name}"), "")
            .expect("signalling the guest");
        (before, after)
    };

    let (t0, t1) = phase(
        &mut lab,
        "timeout",
        &["timeout,count=1,opcode=read,lba=2048-2055"],
    );
    let (n0, n1) = phase(
        &mut lab,
        "noabort",
        &["timeout,no-abort,count=1,opcode=read,lba=2560-2567"],
    );
    let (m0, m1) = phase(&mut lab, "media", &["media-error:lba=3000-3007"]);
    let (c0, c1) = phase(&mut lab, "cfs", &["cfs,opcode=read,lba=4096-4103"]);
    let (b0, b1) = phase(
        &mut lab,
        "bug",
        &["internal-error,opcode=read,lba=6144-6151"],
    );
    let (i0, i1) = phase(
        &mut lab,
        "irq",
        &["drop-irq,count=1,opcode=read,lba=5000-5007"],
    );

    let run = common::finish_lab(lab, &options);
    let run_dir = run.run_dir().to_path_buf();
    let fact = |key: &str| run.fact(key);
    let number = |key: &str| run.fact_u64(key);
    let guest = |msg: &str| format!("{msg}; guest output:\n{}", run.output());
    assert_eq!(number("IO_TIMEOUT_MS"), IO_TIMEOUT_MS);
    assert_eq!(fact("PATTERN_WRITE_STATUS"), "0");
    assert_eq!(
        fact("BASE_TIMEOUT_LINES"),
        "0",
        "{}",
        guest("a timeout before any fault")
    );

    // 1. Timeout → Abort → Command Abort Requested → retry with the data.
    assert_eq!(
        counter(&t1, "commands_held") - counter(&t0, "commands_held"),
        1
    );
    assert_eq!(
        counter(&t1, "commands_aborted") - counter(&t0, "commands_aborted"),
        1,
        "{}",
        guest("the Abort did not abort the held command")
    );
    assert_eq!(t1["faults"]["held_commands"], Value::Array(vec![]));
    assert!(
        number("TIMEOUT_READ_MS") >= IO_TIMEOUT_MS,
        "{}",
        guest("the held read completed before Linux's timeout")
    );
    assert_eq!(
        fact("TIMEOUT_READ_OK"),
        "1",
        "{}",
        guest("retried read data")
    );
    assert_eq!(
        fact("TIMEOUT_ABORTING"),
        "1",
        "{}",
        guest("timeout + abort")
    );
    assert_eq!(
        fact("TIMEOUT_ABORT_STATUS_0"),
        "1",
        "{}",
        guest("abort status")
    );
    assert_eq!(fact("TIMEOUT_RESETS"), "0", "{}", guest("the abort failed"));
    assert_eq!(fact("TIMEOUT_VERIFY"), "1");

    // 7. The trace of the timeout phase, decoded.
    let trace_path = run_dir.join("nvme0.trace.jsonl");
    let trace_text = std::fs::read_to_string(&trace_path)
        .unwrap_or_else(|e| panic!("{}: {e}", trace_path.display()));
    let events = p2plab_trace::parse_lines(&trace_text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(events[0]["kind"], "trace-start");
    assert_eq!(events[0]["device"], "nvme0");
    let held: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "fault" && e["injected"] == true)
        .collect();
    assert_eq!(held.len(), 1, "one injected fault in the phase: {held:?}");
    assert_eq!(held[0]["name"], "Read");
    assert_eq!(held[0]["effects"][0], "hang");
    let held_slba = held[0]["slba"].as_u64().expect("slba");
    let held_end = held_slba + held[0]["nlb"].as_u64().expect("nlb");
    assert!(
        held_slba <= 2048 && held_end > 2048,
        "the held read covers LBA 2048: {}",
        held[0]
    );
    let cmds: Vec<&Value> = events.iter().filter(|e| e["kind"] == "cmd").collect();
    assert!(
        cmds.iter().any(|c| c["name"] == "Abort"
            && c["sqid"] == 0
            && c["status"] == "Successful Completion"),
        "Linux's Abort is traced"
    );
    assert!(
        cmds.iter().any(|c| c["name"] == "Read"
            && c["cid"] == held[0]["cid"]
            && c["sqid"] == held[0]["sqid"]
            && c["status"] == "Command Abort Requested"
            && c["injected"] == true),
        "the held read ends aborted"
    );
    let retried = cmds
        .iter()
        .find(|c| {
            c["name"] == "Read"
                && c["status"] == "Successful Completion"
                && c["slba"].as_u64() == Some(held_slba)
        })
        .unwrap_or_else(|| panic!("no successful retry of LBA {held_slba} in the trace"));
    assert_eq!(retried["data"]["prp1"]["at"], "ram", "{retried}");
    assert!(retried["dur_ns"].as_u64().is_some(), "{retried}");
    assert_eq!(
        events.last().map(|e| &e["kind"]),
        Some(&Value::from("trace-stop"))
    );

    // 1b. A failed Abort → second timeout → controller reset → retry.
    assert_eq!(
        counter(&n1, "commands_held") - counter(&n0, "commands_held"),
        1
    );
    assert_eq!(
        counter(&n1, "commands_aborted"),
        counter(&n0, "commands_aborted"),
        "no-abort was aborted"
    );
    assert!(
        counter(&n1, "resets") > counter(&n0, "resets"),
        "{n0} / {n1}"
    );
    assert_eq!(n1["faults"]["held_commands"], Value::Array(vec![]), "{n1}");
    assert!(
        number("NOABORT_READ_MS") >= 2 * IO_TIMEOUT_MS,
        "{}",
        guest("two timeouts before the reset")
    );
    assert_eq!(
        fact("NOABORT_READ_OK"),
        "1",
        "{}",
        guest("read across the reset")
    );
    assert_eq!(
        fact("NOABORT_RESET_LOGGED"),
        "1",
        "{}",
        guest("failed abort → reset")
    );
    assert_eq!(fact("NOABORT_STATE_AFTER"), "live");

    // 2. Media errors on exactly LBAs 3000-3007, logged, healed by a rewrite.
    let want_bad: Vec<String> = (3000..=3007).map(|l: u64| l.to_string()).collect();
    assert_eq!(
        fact("MEDIA_BAD_LBAS"),
        want_bad.join(","),
        "{}",
        guest("EIO LBAs")
    );
    assert!(
        number("MEDIA_DMESG") >= 1,
        "{}",
        guest("no medium error in dmesg")
    );
    assert_eq!(fact("ERROR_LOG_STATUS"), "0");
    let log_text =
        std::fs::read_to_string(run_dir.join("guest/error-log.json")).expect("error-log.json");
    let log: Value = serde_json::from_str(&log_text).unwrap_or_else(|e| panic!("{e}: {log_text}"));
    let newest = &log["errors"][0];
    // nvme-cli prints the status field without the phase tag: SCT 2h,
    // SC 81h, no More, no DNR.
    assert_eq!(newest["status_field"].as_u64(), Some(0x281), "{newest}");
    let lba = newest["lba"].as_u64().expect("lba");
    assert!(
        (3000..=3007).contains(&lba),
        "error log LBA {lba}: {newest}"
    );
    assert_eq!(newest["nsid"].as_u64(), Some(1), "{newest}");
    let failed_reads =
        counter(&m1, "injected_media_errors") - counter(&m0, "injected_media_errors");
    // Linux retries a media error (no DNR) up to nvme_core.max_retries (5)
    // times: every failed dd is 1..=6 commands.
    assert!(
        (8..=48).contains(&failed_reads),
        "{failed_reads} failed reads for 8 bad blocks"
    );
    let smart_text = std::fs::read_to_string(run_dir.join("guest/smart.json")).expect("smart");
    let smart: Value = serde_json::from_str(&smart_text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        smart["media_errors"].as_u64(),
        Some(failed_reads),
        "SMART media errors = the server's failed reads: {smart}"
    );
    assert_eq!(
        newest["error_count"].as_u64(),
        Some(failed_reads),
        "every failed read is in the error log: {newest}"
    );
    // The guest rewrote the range before the phase ended: no bad block is
    // left, and the spec counted every failed read.
    assert_eq!(m1["faults"]["bad_blocks"], Value::Array(vec![]), "{m1}");
    assert_eq!(
        m1["faults"]["armed"][0]["fired"].as_u64(),
        Some(failed_reads),
        "{m1}"
    );
    assert_eq!(fact("MEDIA_REWRITE_STATUS"), "0");
    assert_eq!(fact("MEDIA_HEALED"), "1", "{}", guest("rewrite heals"));

    // 3. CFS → controller reset → I/O resumes.
    assert!(
        counter(&c1, "resets") > counter(&c0, "resets"),
        "{c0} / {c1}"
    );
    assert_eq!(
        c1["controller"]["csts"].as_u64().map(|c| c & 2),
        Some(0),
        "CFS cleared: {c1}"
    );
    assert_eq!(fact("CFS_RESET_LOGGED"), "1", "{}", guest("CFS reset"));
    assert_eq!(
        fact("CFS_READ_STATUS"),
        "0",
        "{}",
        guest("the read across the reset")
    );
    assert_eq!(
        fact("CFS_READ_OK"),
        "1",
        "{}",
        guest("the read across the reset")
    );
    assert_eq!(fact("CFS_STATE_AFTER"), "live");
    assert_eq!(
        fact("CFS_FIO_STATUS"),
        "0",
        "{}",
        guest("fio after the reset")
    );

    // 3b. An internal error (a panicking handler) → CFS → the same reset.
    assert_eq!(
        counter(&b1, "internal_errors") - counter(&b0, "internal_errors"),
        1,
        "{b0} / {b1}"
    );
    assert!(
        counter(&b1, "resets") > counter(&b0, "resets"),
        "{b0} / {b1}"
    );
    assert_eq!(
        b1["controller"]["csts"].as_u64().map(|c| c & 2),
        Some(0),
        "CFS cleared: {b1}"
    );
    assert_eq!(
        fact("BUG_RESET_LOGGED"),
        "2",
        "{}",
        guest("the second \"controller is down\", after the CFS one")
    );
    assert_eq!(
        fact("BUG_READ_OK"),
        "1",
        "{}",
        guest("the read across the internal error")
    );
    assert_eq!(fact("BUG_STATE_AFTER"), "live");

    // 4. Dropped interrupt → timeout handler polls the completion.
    assert_eq!(
        counter(&i1, "interrupts_dropped") - counter(&i0, "interrupts_dropped"),
        1
    );
    assert!(
        number("IRQ_READ_MS") >= IO_TIMEOUT_MS,
        "{}",
        guest("no timeout")
    );
    assert_eq!(fact("IRQ_READ_OK"), "1");
    assert_eq!(fact("IRQ_POLLED"), "1", "{}", guest("completion polled"));

    // 5. The guest armed a fault itself, at the moment it chose.
    assert_eq!(
        fact("GUEST_INJECT_STATUS"),
        "0",
        "{}",
        std::fs::read_to_string(run_dir.join("guest/guest-inject.out")).unwrap_or_default()
    );
    assert_ne!(
        fact("GUEST_FAULT_READ_STATUS"),
        "0",
        "{}",
        guest("the armed read")
    );
    assert_eq!(fact("GUEST_NEXT_READ_STATUS"), "0", "{}", guest("count=1"));
    assert_eq!(fact("GUEST_STATUS_STATUS"), "0");
    let status_text =
        std::fs::read_to_string(run_dir.join("guest/guest-status.json")).expect("guest status");
    let guest_status: Value =
        serde_json::from_str(&status_text).unwrap_or_else(|e| panic!("{e}: {status_text}"));
    let armed = &guest_status["faults"]["armed"];
    assert_eq!(
        armed[0]["spec"], "status=0x281,dnr,count=1,opcode=read,lba=6000-6007",
        "{guest_status}"
    );
    assert_eq!(armed[0]["fired"], 1, "{armed}");
    assert_eq!(armed[0]["remaining"], 0, "{armed}");
    assert_eq!(
        fact("GUEST_BAD_SPEC_STATUS"),
        "1",
        "a bad spec fails p2plab-ctl"
    );
    let bad = std::fs::read_to_string(run_dir.join("guest/guest-bad.out")).unwrap_or_default();
    assert!(bad.contains("cnt=1"), "the error names the bad item: {bad}");
    assert_eq!(fact("GUEST_CLEAR_STATUS"), "0");
    // ... but it may not reset the device, and sees the trace's cap.
    assert_eq!(fact("GUEST_RESET_STATUS"), "1");
    let refused =
        std::fs::read_to_string(run_dir.join("guest/guest-reset.out")).unwrap_or_default();
    assert!(
        refused.contains("not offered on the guest channel"),
        "{refused}"
    );
    assert_eq!(fact("GUEST_TRACE_STATUS"), "0");
    let trace_text = std::fs::read_to_string(run_dir.join("guest/guest-trace.json"))
        .expect("the guest's trace status");
    let trace: Value =
        serde_json::from_str(&trace_text).unwrap_or_else(|e| panic!("{e}: {trace_text}"));
    assert_eq!(trace["on"], false, "{trace}");
    assert_eq!(trace["max_bytes"], 256u64 << 20, "the default cap: {trace}");
    assert_eq!(trace["stopped_at_cap"], false, "{trace}");
    let trace_len = std::fs::metadata(run_dir.join("nvme0.trace.jsonl"))
        .expect("nvme0's trace file")
        .len();
    assert_eq!(trace["bytes"], trace_len, "{trace}");

    // 6. In band: nvme-cli's OCP set-error-injection arms NAND corruption.
    let ocp_out =
        |name: &str| std::fs::read_to_string(run_dir.join("guest").join(name)).unwrap_or_default();
    assert_eq!(fact("OCP_SET_STATUS"), "0", "{}", ocp_out("ocp-set.out"));
    assert_eq!(fact("OCP_GET_STATUS"), "0", "{}", ocp_out("ocp-get.out"));
    assert_eq!(fact("OCP_GET_NUME"), "1", "{}", ocp_out("ocp-get.out"));
    assert_eq!(fact("OCP_GET_RAW_STATUS"), "0");
    let raw = std::fs::read(run_dir.join("guest/ocp-get.bin")).expect("ocp-get.bin");
    assert_eq!(raw.len(), 4064, "127 entries of 32 bytes");
    assert_eq!(raw[..4], [1, 0, 7, 0], "the entry as set: enabled, type 7");
    assert!(raw[32..].iter().all(|&b| b == 0), "one entry only");
    assert_ne!(
        fact("OCP_READ_STATUS"),
        "0",
        "{}",
        guest("NAND corruption read")
    );
    assert_eq!(
        fact("OCP_CLEAR_STATUS"),
        "0",
        "{}",
        ocp_out("ocp-clear.out")
    );
    assert_eq!(fact("OCP_AFTER_STATUS"), "0", "{}", guest("disabled entry"));

    // Nothing else: exactly the timeouts and the one reset asked for.
    assert_eq!(
        fact("KERNEL_COMPLAINTS"),
        "0",
        "{}",
        guest("kernel complaints")
    );
    assert_eq!(
        fact("TIMEOUT_LINES"),
        "4",
        "{}",
        guest(
            "the held read (aborting), the unabortable one (aborting, reset \
             controller) and the lost interrupt; CFS is logged as \"controller is down\""
        )
    );
    assert_eq!(
        fact("RESET_LINES"),
        "3",
        "{}",
        guest("only the failed abort, CFS and internal-error resets")
    );
}
