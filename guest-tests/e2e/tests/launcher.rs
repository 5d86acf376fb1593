//! The launcher itself, in one boot: a multi-line `--exec` script with
//! quotes runs verbatim, its exit status comes back, a `--share` folder is
//! visible and writable in the guest, extra kernel arguments arrive, and
//! nothing is left behind (no process, no socket) when the run ends.
//!
//! What each test catches: a launcher that mangles scripts or loses the
//! exit status, a missing or read-only share, dropped kernel arguments,
//! leaked server or QEMU processes and sockets, a clean-boot check that
//! does not see the guest's kernel log (a declared `WARNING:` line the
//! script writes to /dev/kmsg must be counted exactly once)
//! a guest control channel that is there without being asked for
//! (`exec_share_append_status_and_clean_up`); bad options that start half
//! a lab, a `--guest-control` device the topology lacks
//! (`bad_options_are_refused_before_anything_starts`); a `--keep` lab
//! that dies early or that `--stop` cannot end, a guest channel that
//! reaches a device it was not asked for, or not the one it was
//! (`keep_leaves_the_lab_up_until_stop`); a guest that hangs while
//! booting and holds the run for its whole timeout
//! (`a_guest_that_never_boots_fails_within_the_boot_budget`). Device
//! faults are the device suites' job.

mod common;

use std::os::unix::fs::FileTypeExt;

use p2plab_lab::accel::{self, AccelRequest};
use p2plab_lab::kernel_log::Expected;
use p2plab_lab::{Accel, GuestControl, GuestScript, Lab, LabOptions, Mode, Timeout};

#[test]
fn exec_share_append_status_and_clean_up() {
    let share = std::env::temp_dir().join(format!("p2plab-share-{}", std::process::id()));
    std::fs::create_dir_all(&share).unwrap();
    std::fs::write(share.join("from-host.txt"), "SHARED=yes\n").unwrap();

    let script = GuestScript::new("launcher.sh", include_str!("../guest/launcher.sh"));
    let mut options = LabOptions::exec("lab", &script).expect("the guest script");
    options.share = Some(share.clone());
    options.append = vec!["p2plab.test=works".to_owned()];
    options.timeout = Some(Timeout::TcgBudget(common::BOOT_TIMEOUT));
    options.stream_output = false;
    options.state = Some(common::test_state_dir("launcher"));
    options.kernel_log.expected = vec![Expected::exactly("WARNING: p2plab launcher test", 1)];
    let outcome = Lab::run(&options).expect("the lab runs");
    let facts = common::parse_facts(&outcome.output);

    assert_eq!(outcome.status, Some(7), "the guest command's exit status");
    assert_eq!(
        facts.get("QUOTES").map(String::as_str),
        Some("it's \"quoted\" 42")
    );
    assert_eq!(facts.get("SHARED").map(String::as_str), Some("yes"));
    assert_eq!(
        facts.get("CMDLINE").map(String::as_str),
        Some("p2plab.test=works")
    );
    assert_eq!(
        std::fs::read_to_string(share.join("from-guest.txt")).unwrap(),
        "written in the guest\n"
    );
    // Not asked for: no control port in the guest, none on QEMU's command
    // line, no guest socket asked of a server.
    assert_eq!(facts.get("GUEST_PORTS").map(String::as_str), Some("0"));
    assert_eq!(facts.get("GUEST_CTL_STATUS").map(String::as_str), Some("1"));
    let qemu_cmdline = std::fs::read_to_string(outcome.run_dir.join("qemu.cmdline")).unwrap();
    assert!(!qemu_cmdline.contains("virtserialport"), "{qemu_cmdline}");
    for id in ["nvme0", "gpu0"] {
        let cmdline =
            std::fs::read_to_string(outcome.run_dir.join(format!("{id}.cmdline"))).unwrap();
        assert!(!cmdline.contains("--guest-control-socket"), "{cmdline}");
    }

    // The run folder keeps the logs, and no socket or process survives.
    let run = &outcome.run_dir;
    for file in [
        "guest/kmsg.txt",
        "console.log",
        "qemu.log",
        "qemu.cmdline",
        "nvme0.log",
        "gpu0.log",
    ] {
        assert!(run.join(file).is_file(), "{file} in the run folder");
    }
    // QEMU got exactly one accelerator, the one the outcome names, with
    // the vCPU that goes with it (`lab` has no vendor need).
    let qemu_words: Vec<String> = std::fs::read_to_string(run.join("qemu.cmdline"))
        .unwrap()
        .split_whitespace()
        .map(|w| w.trim_matches('\'').to_owned())
        .collect();
    let after = |flag: &str| -> Vec<&str> {
        qemu_words
            .windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    };
    // Under TCG, without the fast-string features (accel.rs).
    let tcg_vcpu = p2plab_lab::accel::tcg_vcpu("max");
    let want = match outcome.accel {
        Accel::Kvm => (vec!["kvm"], vec!["host"]),
        Accel::Tcg => (vec!["tcg,thread=multi"], vec![tcg_vcpu.as_str()]),
    };
    assert_eq!((after("-accel"), after("-cpu")), want, "{qemu_words:?}");
    let line = std::fs::read_to_string(run.join("accel.txt")).unwrap();
    assert_eq!(line.lines().count(), 1, "{line}");
    match outcome.accel {
        Accel::Kvm => assert!(line.starts_with("using KVM"), "{line}"),
        Accel::Tcg => assert!(line.starts_with("using TCG, not KVM: "), "{line}"),
    }
    assert_nothing_left_of(run);
    std::fs::remove_dir_all(&share).unwrap();
}

#[test]
fn bad_options_are_refused_before_anything_starts() {
    let mut options = LabOptions::new("no-such-topology", Mode::Exec("true".into()));
    let err = Lab::run(&options).unwrap_err();
    assert!(
        format!("{err:#}").contains("--config \"no-such-topology\""),
        "{err:#}"
    );

    options.topology = "lab".into();
    options.share = Some("/nonexistent/folder".into());
    let err = Lab::run(&options).unwrap_err();
    assert!(
        format!("{err:#}").contains("--share /nonexistent/folder"),
        "{err:#}"
    );

    options.share = None;
    options.kernel = Some("/nonexistent/bzImage".into());
    let err = Lab::run(&options).unwrap_err();
    assert!(
        format!("{err:#}").contains("--kernel /nonexistent/bzImage"),
        "{err:#}"
    );

    options.kernel = None;
    options.server_args = vec![("nvme9".into(), vec![])];
    let err = Lab::run(&options).unwrap_err();
    assert!(format!("{err:#}").contains("nvme9"), "{err:#}");

    options.server_args.clear();
    options.guest_control = GuestControl::Devices(vec!["gpu7".into()]);
    let err = Lab::run(&options).unwrap_err();
    assert!(
        format!("{err:#}").contains("--guest-control gpu7"),
        "{err:#}"
    );

    // The accelerator is --accel's business, not an extra QEMU argument's.
    options.guest_control = GuestControl::default();
    options.qemu_args = vec!["-accel".into(), "kvm".into()];
    let err = Lab::run(&options).unwrap_err();
    assert!(format!("{err:#}").contains("--accel kvm|tcg"), "{err:#}");

    // A forced KVM where the probe says it cannot run is an error naming
    // the flag (on a host whose KVM runs, the run would boot: not here).
    options.qemu_args.clear();
    options.accel = Some(AccelRequest::Kvm);
    if let Err(why) = accel::kvm_usable() {
        let err = format!("{:#}", Lab::run(&options).unwrap_err());
        assert!(err.contains("--accel kvm: KVM is not usable here"), "{err}");
        assert!(err.contains(&why), "{err}");
    }
}

/// Catches: a lab that waits out the whole run's timeout (15 minutes in
/// these suites) for a guest that hangs before its command starts, and a
/// hang report without the vCPUs' state or that leaves QEMU or a server
/// running. QEMU started with `-S` never runs its vCPUs: the boot budget
/// (10 s here) must end the run, with both vCPUs at the reset vector.
#[test]
fn a_guest_that_never_boots_fails_within_the_boot_budget() {
    let mut options = LabOptions::new("lab", Mode::Exec("true".into()));
    options.qemu_args = vec!["-S".into()];
    options.boot_timeout = Some(Timeout::Exactly(std::time::Duration::from_secs(10)));
    options.timeout = Some(Timeout::TcgBudget(common::BOOT_TIMEOUT));
    options.stream_output = false;
    options.state = Some(common::test_state_dir("launcher-hang"));
    let started = std::time::Instant::now();
    let err = format!("{:#}", Lab::run(&options).unwrap_err());
    let took = started.elapsed();
    // The budget plus the lab's start and stop (seconds), far below the
    // run's timeout.
    assert!(
        took < std::time::Duration::from_secs(120),
        "{took:?}: {err}"
    );
    assert!(
        err.contains("did not start its command within 10s"),
        "{err}"
    );
    assert!(
        err.contains("#0 RIP=0000fff0 (CPL 0, interrupts off)") && err.contains("#1 RIP=0000fff0"),
        "{err}"
    );
    let dump = err
        .split("(all registers in ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no dump path in: {err}"));
    let dump = std::path::Path::new(dump);
    let text = std::fs::read_to_string(dump).unwrap();
    assert_eq!(text.matches("CPU#").count(), 2, "{text}");
    assert!(text.contains("VM status: paused"), "{text}");
    assert_nothing_left_of(dump.parent().unwrap());
}

/// No socket left in the run folder `run`, and no process whose command
/// line names it (a server or QEMU that outlived the run).
fn assert_nothing_left_of(run: &std::path::Path) {
    for entry in std::fs::read_dir(run).unwrap().flatten() {
        assert!(
            !entry.file_type().unwrap().is_socket(),
            "socket left behind: {}",
            entry.path().display()
        );
    }
    let run_text = run.to_string_lossy().into_owned();
    for proc_entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(proc_entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(
            !cmdline.contains(&*run_text),
            "process left behind: {}",
            cmdline.replace('\0', " ")
        );
    }
}

#[test]
fn keep_leaves_the_lab_up_until_stop() {
    // The guest's channel to gpu0 only: it reaches gpu0's server and not
    // nvme0's.
    let command = "echo KEPT=yes\n\
                   p2plab-ctl gpu0 status --json >/dev/null; echo GPU0_CTL=$?\n\
                   p2plab-ctl nvme0 status >/dev/null 2>&1; echo NVME0_CTL=$?";
    let mut options = LabOptions::new("lab", Mode::Keep(Some(command.to_owned())));
    options.guest_control = GuestControl::Devices(vec!["gpu0".into()]);
    options.timeout = Some(Timeout::TcgBudget(common::BOOT_TIMEOUT));
    options.stream_output = false;
    options.state = Some(common::test_state_dir("keep"));
    let outcome = Lab::run(&options).expect("the lab comes up");
    assert_eq!(outcome.status, Some(0));
    assert_eq!(
        common::parse_facts(&outcome.output)
            .get("KEPT")
            .map(String::as_str),
        Some("yes")
    );

    let facts = common::parse_facts(&outcome.output);
    assert_eq!(facts.get("GPU0_CTL").map(String::as_str), Some("0"));
    assert_eq!(facts.get("NVME0_CTL").map(String::as_str), Some("1"));

    let run = &outcome.run_dir;
    let is_socket = |name: &str| {
        std::fs::symlink_metadata(run.join(name)).is_ok_and(|m| m.file_type().is_socket())
    };
    assert!(is_socket("gpu0.guest.ctl"));
    assert!(!is_socket("nvme0.guest.ctl"));
    let qemu_cmdline = std::fs::read_to_string(run.join("qemu.cmdline")).unwrap();
    assert_eq!(
        qemu_cmdline.matches("virtserialport").count(),
        1,
        "{qemu_cmdline}"
    );
    let pids: Vec<u32> = std::fs::read_to_string(run.join("pids"))
        .expect("pids file")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    assert_eq!(pids.len(), 3, "qemu, nvme0 and gpu0 stay up");
    assert!(pids.iter().all(|&p| p2plab_lab::process::pid_alive(p)));
    assert!(
        run.join("console.sock").exists(),
        "the console can be attached"
    );

    p2plab_lab::lab::stop_kept(run).expect("stop");
    std::thread::sleep(std::time::Duration::from_millis(200));
    for pid in pids {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie of a parent that is not us (reaped by init).
        assert!(
            state.is_empty() || state.contains(") Z "),
            "pid {pid} still runs: {state}"
        );
    }
    assert!(!run.join("console.sock").exists(), "sockets removed");
}
