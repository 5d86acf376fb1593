//! Hot unplug and re-plug through QEMU's QMP, in one boot of the default
//! lab (issue 10). The host drives QMP and the servers; the guest script
//! and the host meet through files in `/run/p2plab` (the run folder's
//! `guest/`).
//!
//! 1. nvme0 while the guest runs fio reads on it and P2P reads from it
//!    into gpu0's p2pmem (a `p2plab-p2pio` loop, which must end by itself
//!    too): `device_del` from its
//!    downstream port, the guest's ACPI hotplug (acpiphp: QEMU's q35 does
//!    not hand native PCIe hotplug to the OS) unbinds the driver and
//!    ejects the slot; fio ends with an error (EIO, or ENOENT when it
//!    reopens the vanished disk), no hang; QEMU stays up; the server sees
//!    its client go (`--exit-on-disconnect`: it exits 0) and counts the
//!    reset. A fresh
//!    server on the same namespace file, `device_add` with the topology's
//!    JSON: the namespace is back with the data written before the unplug,
//!    its CMB is p2pmem again.
//! 2. gpu0 while a guest process has 1 MiB of its p2pmem mapped (through
//!    sysfs `p2pmem/allocate`) and keeps reading a pattern from it: the
//!    removal finishes within the bound (p2pdma removes the `allocate`
//!    file, kernfs zaps its mappings, the pages' references drop), the
//!    process dies of SIGBUS on its next access (exit status 135); then
//!    the driver binds again with VRAM published and a working engine.
//! 3. NVMe → GPU P2P between the two re-plugged devices.
//!
//! What it catches: QEMU aborting in vfio-user's finalize (the 11.1 bug the
//! lab patches out, README "Hot unplug") — QEMU exits and every later step
//! fails; a server that keeps the old client's state or does not notice
//! the disconnect (no exit, no reset); a guest that hangs on removal (fio
//! does not end, or the GPU's removal waits forever on mapped p2pmem
//! pages: a driver that takes its own page references, or registers
//! p2pmem outside devres so the mappings outlive the device) or oopses;
//! a mapping that does not read back what was written through it (BAR
//! writes lost or misrouted); a re-plugged device without its 64-bit BAR
//! (no CMB / VRAM, the e820 clipping `pci=no_e820` avoids); a namespace
//! that loses data across a server restart.

mod common;

use std::time::Duration;

use common::{test_state_dir, BOOT_TIMEOUT};
use p2plab_lab::control::unplug;
use p2plab_lab::qmp::Qmp;
use p2plab_lab::{GuestScript, Lab, LabOptions, LabPaths, Timeout};
use p2plab_qemu_patch::{self as qemu_fix, UnplugFix};
use serde_json::Value;

/// Bytes written before the unplug and read back after the re-plug.
const PATTERN_BYTES: usize = 16 << 20;
/// The guest's ACPI eject takes well under a second here; the bound is for
/// a guest that never ejects (QMP's DEVICE_DELETED never comes).
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(120);
/// The guest's phases (boot, writes, fio start) are short; this bounds a
/// hang, not a duration.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);

fn counter(stats: &Value, section: &str, key: &str) -> u64 {
    stats[section][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {section}.{key} in {stats}"))
}

/// QEMU creates its QMP socket while it starts: retry until it answers.
fn connect_qmp(lab: &mut Lab) -> Qmp {
    for _ in 0..600 {
        if let Ok(qmp) = lab.qmp() {
            return qmp;
        }
        if let Ok(Some(status)) = lab.qemu_exited() {
            panic!("QEMU exited ({status}) before QMP answered");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("QMP did not answer within 60 s");
}

/// Unplugs `id`, checks QEMU and the server's view, waits until the guest
/// has seen the device go (`gone`), then starts a fresh server and plugs
/// the device again. Returns the server's counters at its exit.
fn unplug_and_replug(lab: &mut Lab, qmp: &mut Qmp, id: &str, gone: &str) -> Value {
    let took = unplug(qmp, id, lab.budget(UNPLUG_TIMEOUT))
        .unwrap_or_else(|e| panic!("{e:#} (run folder {})", lab.run_dir.display()));
    eprintln!("{id}: DEVICE_DELETED after {took:?}");
    // The server saw QEMU close the connection and exited by itself.
    let status = lab
        .wait_server_exit(id, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(status.success(), "{id} server exit status {status}");
    let final_stats = lab.server_stats(id).expect("server stats");
    // QEMU is still there and still running the guest.
    assert_eq!(lab.qemu_exited().expect("QEMU status"), None, "QEMU died");
    let state = qmp.execute("query-status", None).expect("query-status");
    assert_eq!(state["status"], "running", "{state}");
    let pci = qmp.execute("query-pci", None).expect("query-pci");
    assert!(
        !pci.to_string().contains(&format!("\"qdev_id\":\"{id}\"")),
        "{id} still in query-pci"
    );
    // The same BDF comes back: re-plugging before the guest looked would
    // hide the removal from it.
    lab.wait_guest_file(gone, lab.budget(PHASE_TIMEOUT))
        .unwrap_or_else(|e| panic!("{e:#}"));
    lab.start_server(id)
        .unwrap_or_else(|e| panic!("restarting {id}: {e:#}"));
    lab.plug(qmp, id)
        .unwrap_or_else(|e| panic!("re-plugging {id}: {e:#}"));
    final_stats
}

#[test]
fn unplug_and_replug_nvme_under_io_and_gpu() {
    let state = test_state_dir("hotplug");
    let script = GuestScript::new("hotplug.sh", include_str!("../guest/hotplug.sh"));
    let mut options = LabOptions::exec("lab", &script).expect("the guest script");
    options.timeout = Some(Timeout::TcgBudget(BOOT_TIMEOUT));
    options.state = Some(state.clone());
    options.stream_output = std::env::var_os("P2PLAB_STREAM").is_some();
    let exit_on_disconnect = vec!["--exit-on-disconnect".to_owned()];
    options.server_args = vec![
        ("nvme0".to_owned(), exit_on_disconnect.clone()),
        ("gpu0".to_owned(), exit_on_disconnect),
    ];
    let mut lab = Lab::start(&options).unwrap_or_else(|e| panic!("the lab failed: {e:#}"));
    let paths = LabPaths::discover().expect("paths");
    assert_eq!(
        qemu_fix::status(&paths.qemu_executable()).expect("QEMU binary"),
        UnplugFix::Applied,
        "the guest environment's QEMU must carry the vfio-user unplug fix"
    );
    let mut qmp = connect_qmp(&mut lab);

    // 1. nvme0, with fio reading.
    lab.wait_guest_file("nvme-busy", lab.budget(PHASE_TIMEOUT))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let busy = lab.server_stats("nvme0").expect("nvme0 stats");
    let nvme_exit = unplug_and_replug(&mut lab, &mut qmp, "nvme0", "nvme-gone");
    assert!(
        counter(&nvme_exit, "counters", "read_commands")
            > counter(&busy, "counters", "read_commands"),
        "reads went on until the unplug: {busy} / {nvme_exit}"
    );
    assert_eq!(
        counter(&nvme_exit, "counters", "resets"),
        counter(&busy, "counters", "resets") + 1,
        "the disconnect resets the controller once"
    );
    let fresh = lab.server_stats("nvme0").expect("fresh nvme0 stats");
    assert!(
        counter(&fresh, "counters", "read_commands") < counter(&busy, "counters", "read_commands"),
        "a fresh server counts from zero: {fresh}"
    );
    lab.write_guest_file("nvme-replugged", "")
        .expect("signalling the guest");

    // 2. gpu0, with a guest process touching its mapped p2pmem.
    lab.wait_guest_file("gpu-mapped", lab.budget(PHASE_TIMEOUT))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let gpu_busy = lab.server_stats("gpu0").expect("gpu0 stats");
    let gpu_exit = unplug_and_replug(&mut lab, &mut qmp, "gpu0", "gpu-gone");
    assert_eq!(
        gpu_exit["resets"].as_u64(),
        gpu_busy["resets"].as_u64().map(|r| r + 1),
        "the disconnect resets the GPU once: {gpu_busy} / {gpu_exit}"
    );
    lab.write_guest_file("gpu-replugged", "")
        .expect("signalling the guest");

    let run = common::finish_lab(lab, &options);
    let run_dir = run.run_dir().to_path_buf();
    let fact = |key: &str| run.fact(key);
    let number = |key: &str| -> u64 {
        fact(key)
            .parse()
            .unwrap_or_else(|_| panic!("{key}={:?} is not a number", fact(key)))
    };

    // nvme0 went away cleanly under fio.
    assert_eq!(fact("NVME_P2P_BEFORE"), "1");
    assert_eq!(fact("PATTERN_WRITE_STATUS"), "0");
    assert!(number("FIO_READS_BEFORE_UNPLUG") >= 1000);
    assert_eq!(fact("FIO_ENDED"), "1", "fio hung on the removed disk");
    assert_ne!(fact("FIO_STATUS"), "0", "fio must fail");
    assert!(
        number("P2P_PASSES_BEFORE_UNPLUG") >= 1,
        "P2P reads into gpu0 were flowing at the unplug"
    );
    assert_eq!(
        fact("P2P_ENDED"),
        "1",
        "the P2P reader hung on the removed disk"
    );
    let fio_json =
        std::fs::read_to_string(run_dir.join("guest/fio-unplug.json")).expect("fio's JSON report");
    // fio may print a warning line before the JSON document.
    let start = fio_json.find('{').expect("a JSON object in fio's report");
    let fio: Value = serde_json::from_str(&fio_json[start..])
        .unwrap_or_else(|e| panic!("fio report ({e}): {fio_json}"));
    let job = &fio["jobs"][0];
    let errno = job["error"].as_i64().expect("fio job error");
    // EIO when a request was still in flight as the controller went down;
    // otherwise the reads after the removal return EOF (the dead disk has
    // capacity 0) and reopening for the next loop fails: ENOENT (the node
    // is gone), ENXIO or ENODEV.
    assert!(
        [libc::EIO, libc::ENOENT, libc::ENXIO, libc::ENODEV].contains(&(errno as i32)),
        "fio's error is an I/O error, got errno {errno}: {job}"
    );
    assert!(
        job["read"]["total_ios"].as_u64().unwrap_or(0) >= 1000,
        "{job}"
    );
    assert_eq!(fact("NVME_PCI_GONE"), "1");
    assert_eq!(fact("NVME_DISK_GONE"), "1");

    // ... and came back with its data, its CMB and working I/O.
    assert_eq!(fact("NVME_DISK_BACK"), "1");
    assert_eq!(fact("NVME_STATE"), "live");
    assert_eq!(fact("READBACK_MD5"), fact("PATTERN_MD5"));
    let pattern = std::fs::read(run_dir.join("guest/pattern.bin")).expect("pattern");
    let image = std::fs::read(state.join("nvme0n1.img")).expect("nvme0 backing file");
    assert_eq!(pattern.len(), PATTERN_BYTES);
    assert!(
        image[..PATTERN_BYTES] == pattern[..],
        "the backing file holds the pattern"
    );
    assert_eq!(fact("NVME_P2P_AFTER"), "1", "the re-plugged CMB is p2pmem");
    assert_eq!(fact("FIO_AFTER_STATUS"), "0");

    // gpu0 went and came back, engine working.
    assert_eq!(fact("GPU_P2P_BEFORE"), "1");
    assert_eq!(
        fact("P2PMEM_MAPPED"),
        "1",
        "the pattern reads back through the mapping"
    );
    assert_eq!(
        fact("GPU_PCI_GONE"),
        "1",
        "the removal hung on the mapped p2pmem"
    );
    assert_eq!(
        fact("P2PMEM_USER_ENDED"),
        "1",
        "the mapping's user never faulted"
    );
    assert_eq!(
        fact("P2PMEM_USER_STATUS"),
        (128 + libc::SIGBUS).to_string(),
        "the mapping's user dies of SIGBUS on its next access"
    );
    assert_eq!(fact("GPU_REMOVED"), "1", "the driver's remove ran once");
    assert_eq!(fact("GPU_DRIVER_BACK"), "1");
    assert_eq!(fact("GPU_P2P_AFTER"), "1");
    assert_eq!(fact("GPU_FILL_STATUS"), "0");
    assert_eq!(fact("GPU_FILL_CRC"), fact("GPU_FILL_EXPECTED_CRC"));

    // P2P between the two new devices.
    assert_eq!(fact("N2G_STATUS"), "0");
    assert_eq!(fact("N2G_ERRORS"), "0");
    assert_eq!(number("N2G_BYTES"), PATTERN_BYTES as u64);
    assert_eq!(fact("N2G_GPU_CRC"), fact("PATTERN_CRC"));

    // Nothing oopsed, warned or timed out in the guest.
    assert_eq!(fact("KERNEL_COMPLAINTS"), "0", "{}", run.output());
    assert_eq!(fact("NVME_TIMEOUTS"), "0", "{}", run.output());
}
