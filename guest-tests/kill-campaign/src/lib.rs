//! Kill tests (issue 9): acknowledged, flushed writes must survive a
//! SIGKILL of the NVMe server, then of QEMU, and read back through a
//! restarted server and a second QEMU on the same namespace file.
//!
//! One round:
//! 1. the guest writes a slot of the namespace with fio's verify pattern
//!    (`--verify=crc32c`, a seed per round, O_DIRECT), ends with fsync
//!    (an NVMe Flush), and copies what the device then returns to the
//!    shared folder: that copy is what the controller acknowledged;
//! 2. it starts unflushed writes elsewhere (scratch region) and tells the
//!    host; rounds that re-plug stop them and let the queues drain first
//!    (QEMU 11.1 tends to abort when its server dies under I/O, see
//!    [`RoundEnd::QemuAborted`]), the last round of a boot kills with
//!    them running;
//! 3. the host checks the Flush reached the controller (its stats), then
//!    SIGKILLs `p2plab-nvme` and compares every slot written so far with
//!    the namespace file, byte for byte;
//! 4. within a boot: `device_del` of the dead device, a fresh server on
//!    the same file, `device_add`, and the guest verifies every slot with
//!    fio (`--verify_only`, the seed of the slot's last round);
//!    the last round of a boot SIGKILLs QEMU after the server instead,
//!    and the next boot (a second QEMU, a restarted server) verifies
//!    every slot before it goes on;
//! 5. the namespace's ext4 partition: the last round of a boot fsyncs a
//!    file there, QEMU dies with it mounted, the next boot mounts it
//!    (journal replay), compares every such file and runs `e2fsck -fn`.
//!
//! QEMU 11.1 does not reconnect a `vfio-user-pci` device to a restarted
//! server, hence the unplug and re-plug inside a boot.
//!
//! Shared by the e2e suite `guest-tests/e2e/tests/kill.rs` (a few rounds) and
//! `p2plab-kill-loop` (behind `scripts/kill-loop`, 100 rounds). A crate of
//! its own for that reason: the scenario, its guest side (`guest/kill.sh`)
//! and its long-run CLI are one job with two front ends; the lab it runs on
//! knows no scenario, and the e2e crate holds suites, not binaries.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use p2plab_lab::control::unplug;
use p2plab_lab::facts::parse as parse_facts;
use p2plab_lab::qmp::Qmp;
use p2plab_lab::{GuestScript, Lab, LabOptions, Timeout};

/// The device the rounds kill (the lab topology's NVMe controller).
pub const DEVICE: &str = "nvme0";
/// Bytes of one slot: fio writes it with 4 KiB blocks.
pub const SLOT_BYTES: u64 = 4 << 20;
/// The slots start here, after the partition table in sector 0.
const SLOTS_OFFSET: u64 = 16 << 20;
/// Slots rotate: round r writes slot (r - 1) % SLOTS with a new seed, so
/// a lost rewrite shows as the old seed in fio's block headers.
pub const SLOTS: u32 = 8;
/// Where the unflushed in-flight writes go (away from the slots).
const SCRATCH_OFFSET_MIB: u64 = 512;
const SCRATCH_MIB: u64 = 256;
/// A guest phase (fio on a few MiB, a boot) takes seconds; this bounds a
/// hang, not a duration.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);
/// The guest's ACPI eject takes well under a second here.
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(120);
/// The server rewrites its stats file every second.
const STATS_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct KillOptions {
    /// Server kills in all.
    pub rounds: u32,
    /// Server kills per QEMU; the last one of each boot kills QEMU too.
    pub rounds_per_boot: u32,
    /// Namespace file and the guest's copies of the slots live here; it
    /// is emptied first.
    pub state: PathBuf,
    /// Echo the guest's output while it runs.
    pub stream_output: bool,
}

/// A slot's expected content: fio's pattern for `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotWrite {
    pub slot: u32,
    pub seed: u32,
    pub round: u32,
}

/// What one round saw.
#[derive(Debug, Clone)]
pub struct RoundReport {
    pub round: u32,
    /// 1-based QEMU boot the round ran in.
    pub boot: u32,
    pub write: SlotWrite,
    /// Flush commands the server had completed when it was killed.
    pub flushes: u64,
    /// Writes the guest saw complete in the scratch region before it
    /// signalled; more were in flight at the kill.
    pub inflight_writes: u64,
    /// Requests the guest still had in flight on the controller when it
    /// told the host to kill (only the last round of a boot keeps I/O
    /// running: see [`RoundEnd::QemuAborted`]).
    pub inflight_at_kill: u64,
    pub end: RoundEnd,
    /// Slots compared with the namespace file after the kill.
    pub slots_compared: usize,
    /// Slots fio verified after the kill: through the re-plugged device,
    /// or, when QEMU was killed too, in the next boot.
    pub slots_verified: usize,
}

/// How a round ended after the server's SIGKILL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundEnd {
    /// The dead device was unplugged (device_del took this long) and a
    /// fresh server plugged in; the guest verified through it.
    Replugged { unplug: Duration },
    /// The boot's last round: QEMU was SIGKILLed after the server.
    QemuKilled,
    /// QEMU aborted by itself when the server died. QEMU 11.1's vfio-user
    /// client can hit `error_setv: Assertion '*errp == NULL'` when its
    /// server vanishes while the guest drives the device (README "Kill
    /// tests"); the round's checks still ran, the next boot verifies.
    QemuAborted,
}

#[derive(Debug, Clone, Default)]
pub struct KillReport {
    pub rounds: Vec<RoundReport>,
    pub boots: u32,
    /// Slots the final boot verified.
    pub final_slots_verified: usize,
    /// Rounds in which QEMU aborted on its own ([`RoundEnd::QemuAborted`]).
    pub qemu_aborts: u32,
    /// The ext4 file system as the next boot will find it.
    pub fs: FsState,
    /// Boots whose e2fsck -fn found the file system clean (after the
    /// journal replay of a mount), and the fsynced files the last one
    /// found intact.
    pub clean_fscks: u32,
    pub fs_files_verified: usize,
    pub run_dirs: Vec<PathBuf>,
}

fn fact<'a>(facts: &'a BTreeMap<String, String>, key: &str, what: &str) -> Result<&'a str> {
    facts
        .get(key)
        .map(String::as_str)
        .with_context(|| format!("the guest did not report {key} at {what}: {facts:?}"))
}

fn fact_u64(facts: &BTreeMap<String, String>, key: &str, what: &str) -> Result<u64> {
    let text = fact(facts, key, what)?;
    text.parse()
        .with_context(|| format!("{key}={text:?} at {what} is not a number"))
}

/// The guest side of a boot: the steps of a round as shell functions; a
/// boot's script is this file plus its plan as calls ([`boot_script`]).
const GUEST_SCRIPT: &str = include_str!("../guest/kill.sh");

/// Checkpoint `tag`: fio verifies every slot in `slots`.
fn verify_calls(
    mut script: GuestScript,
    slots: &BTreeMap<u32, SlotWrite>,
    tag: &str,
) -> GuestScript {
    for w in slots.values() {
        script = script.call(["verify_slot", &w.seed.to_string(), &w.slot.to_string(), tag]);
    }
    script
}

/// The ext4 file system in partition 1 of the namespace, after the
/// scratch region: created by the first boot, written and fsynced by the
/// last round of each boot (QEMU dies with it mounted), and checked by the
/// next boot: journal replay on mount, every fsynced file, e2fsck.
const FS_START_SECTOR: u64 = 768 << 11;
const FS_SECTORS: u64 = 256 << 11;

/// The namespace's size in the lab topology (`size=1G`).
const NAMESPACE_BYTES: u64 = 1 << 30;

/// Creates the namespace file with an MBR partition table whose one
/// partition (type 83, Linux) is the file system's range; the guest image
/// has no sfdisk.
fn write_partition_table(image: &Path) -> Result<()> {
    let mut mbr = [0u8; 512];
    let entry = &mut mbr[446..462];
    // Not bootable; CHS fields at their "use LBA" maximum.
    entry[1..4].copy_from_slice(&[0xfe, 0xff, 0xff]);
    entry[4] = 0x83;
    entry[5..8].copy_from_slice(&[0xfe, 0xff, 0xff]);
    entry[8..12].copy_from_slice(&u32::try_from(FS_START_SECTOR)?.to_le_bytes());
    entry[12..16].copy_from_slice(&u32::try_from(FS_SECTORS)?.to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    let file = File::create(image).with_context(|| format!("creating {}", image.display()))?;
    file.set_len(NAMESPACE_BYTES)?;
    std::os::unix::fs::FileExt::write_all_at(&file, &mbr, 0)
        .with_context(|| format!("writing the partition table of {}", image.display()))?;
    Ok(())
}

/// What the file system holds when a boot starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsState {
    /// The first boot created it.
    pub created: bool,
    /// Rounds whose file (`round-R.bin`, fsynced) it must hold.
    pub files: Vec<u32>,
}

/// A boot's start: the first creates the file system, the others check
/// it and every file an earlier boot's last round fsynced there.
fn fs_calls(script: GuestScript, fs: &FsState) -> GuestScript {
    if !fs.created {
        // The host wrote the partition table ([`write_partition_table`]).
        return script.call(["fs_create"]);
    }
    let rounds = fs.files.iter().map(u32::to_string);
    script.call(std::iter::once("fs_check".to_owned()).chain(rounds))
}

/// The guest script of one boot: verify what earlier boots left, then the
/// rounds; the last round waits for the host to kill QEMU. A boot with no
/// rounds only verifies and exits. The steps are `guest/kill.sh`'s
/// functions; this is the plan that calls them.
fn boot_script(
    before: &BTreeMap<u32, SlotWrite>,
    fs: &FsState,
    rounds: &[SlotWrite],
) -> GuestScript {
    let mut script = GuestScript::new("kill.sh", GUEST_SCRIPT)
        .var("SLOTS_MIB", SLOTS_OFFSET >> 20)
        .var("SLOT_MIB", SLOT_BYTES >> 20)
        .var("SCRATCH_OFFSET_MIB", SCRATCH_OFFSET_MIB)
        .var("SCRATCH_MIB", SCRATCH_MIB);
    script = verify_calls(script, before, "boot");
    script = fs_calls(script, fs).call(["checkpoint", "ready"]);
    let mut slots = before.clone();
    for (i, w) in rounds.iter().enumerate() {
        let r = w.round.to_string();
        let last = i + 1 == rounds.len();
        slots.insert(w.slot, *w);
        script = script.call(["round_write", &r, &w.slot.to_string(), &w.seed.to_string()]);
        if last {
            script = script.call(["fs_write", &r]);
        }
        script = script.call(["start_inflight"]);
        if !last {
            script = script.call(["quiesce"]);
        }
        script = script.call(["flushed", &r]);
        if last {
            // The host kills the server, then QEMU, while this sleeps.
            return script.call(["await_qemu_kill"]);
        }
        script = script.call(["after_replug", &r]);
        script = verify_calls(script, &slots, &format!("r{r}"));
        script = script.call(["checkpoint", &format!("checked-{r}")]);
    }
    script.call(["boot_done"])
}

/// The checks on fio's JSON of a verify-only run of a slot.
fn check_verify(
    run_dir: &Path,
    facts: &BTreeMap<String, String>,
    tag: &str,
    w: &SlotWrite,
) -> Result<()> {
    let name = format!("verify-{tag}-slot{}", w.slot);
    let status = fact(facts, &format!("VERIFY_{tag}_SLOT{}", w.slot), tag)?;
    let err =
        std::fs::read_to_string(run_dir.join(format!("guest/{name}.err"))).unwrap_or_default();
    let job = fio_job(&run_dir.join(format!("guest/{name}.json")))?;
    let error = job["error"]
        .as_i64()
        .context("fio job without error field")?;
    let read = job["read"]["io_bytes"].as_u64().unwrap_or(0);
    ensure!(
        status == "0" && error == 0 && read == SLOT_BYTES,
        "slot {} (written in round {} with seed {}) does not verify at {tag}: fio exit {status}, \
         error {error}, {read} of {SLOT_BYTES} bytes read back; fio said:\n{err}",
        w.slot,
        w.round,
        w.seed
    );
    Ok(())
}

/// The first job of a fio JSON report (fio may print a line before it).
fn fio_job(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let start = text
        .find('{')
        .with_context(|| format!("{}: no JSON object: {text}", path.display()))?;
    let report: Value = serde_json::from_str(&text[start..])
        .with_context(|| format!("{}: not JSON", path.display()))?;
    Ok(report["jobs"][0].clone())
}

/// Compares slot `w` of the namespace file with the guest's copy of what
/// the device returned after the flush.
fn compare_slot(image: &Path, copies: &Path, w: &SlotWrite) -> Result<()> {
    let copy_path = copies.join(format!("slot-{}.bin", w.slot));
    let copy =
        std::fs::read(&copy_path).with_context(|| format!("reading {}", copy_path.display()))?;
    ensure!(
        copy.len() as u64 == SLOT_BYTES,
        "{}: {} bytes, not {SLOT_BYTES}",
        copy_path.display(),
        copy.len()
    );
    let mut file = File::open(image).with_context(|| format!("opening {}", image.display()))?;
    let mut on_disk = vec![0u8; copy.len()];
    std::io::Seek::seek(
        &mut file,
        std::io::SeekFrom::Start(SLOTS_OFFSET + u64::from(w.slot) * SLOT_BYTES),
    )?;
    file.read_exact(&mut on_disk)
        .with_context(|| format!("reading slot {} of {}", w.slot, image.display()))?;
    if on_disk != copy {
        let first = on_disk
            .iter()
            .zip(&copy)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        bail!(
            "slot {} (round {}, seed {}) of {} differs from what the device acknowledged \
             after the flush, first at byte {first} of the slot (block {})",
            w.slot,
            w.round,
            w.seed,
            image.display(),
            first / 4096
        );
    }
    Ok(())
}

/// Waits until the server's stats show at least `at_least` Flush commands.
fn wait_flushes(lab: &Lab, at_least: u64) -> Result<u64> {
    let deadline = Instant::now() + STATS_TIMEOUT;
    loop {
        let flushes = lab
            .server_stats(DEVICE)
            .ok()
            .and_then(|s| s["counters"]["flush_commands"].as_u64());
        match flushes {
            Some(n) if n >= at_least => return Ok(n),
            _ if Instant::now() > deadline => bail!(
                "the guest's fsync reached {DEVICE} as no Flush command within \
                 {STATS_TIMEOUT:?} (flush_commands {flushes:?}, wanted >= {at_least})"
            ),
            _ => sleep(Duration::from_millis(100)),
        }
    }
}

/// QEMU creates its QMP socket while it starts: retry until it answers.
fn connect_qmp(lab: &mut Lab) -> Result<Qmp> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(qmp) = lab.qmp() {
            return Ok(qmp);
        }
        if let Some(status) = lab.qemu_exited()? {
            bail!("QEMU exited ({status}) before QMP answered");
        }
        if Instant::now() > deadline {
            bail!("QMP did not answer within 60 s");
        }
        sleep(Duration::from_millis(100));
    }
}

fn killed_by_sigkill(status: std::process::ExitStatus) -> bool {
    status.signal() == Some(libc::SIGKILL)
}

/// Runs the kill rounds and returns what they saw; the first durability
/// failure is an error naming the slot, the round and the run folder.
pub fn run(options: &KillOptions, mut on_round: impl FnMut(&RoundReport)) -> Result<KillReport> {
    ensure!(options.rounds >= 1, "at least one round");
    ensure!(options.rounds_per_boot >= 1, "at least one round per boot");
    let _ = std::fs::remove_dir_all(&options.state);
    let copies = options.state.join("slots");
    std::fs::create_dir_all(&copies).with_context(|| format!("creating {}", copies.display()))?;
    let image = options.state.join("nvme0n1.img");
    write_partition_table(&image)?;

    let mut report = KillReport::default();
    let mut slots: BTreeMap<u32, SlotWrite> = BTreeMap::new();
    let mut next_round = 1;
    loop {
        let count = options
            .rounds_per_boot
            .min((options.rounds + 1).saturating_sub(next_round));
        let rounds: Vec<SlotWrite> = (next_round..next_round + count)
            .map(|round| SlotWrite {
                slot: (round - 1) % SLOTS,
                seed: 1000 + round,
                round,
            })
            .collect();
        report.boots += 1;
        let boot = Boot {
            number: report.boots,
            copies: &copies,
            image: &image,
            options,
        };
        let done = boot.run(&slots, &rounds, &mut report, &mut on_round)?;
        if rounds.is_empty() {
            report.final_slots_verified = slots.len();
            return Ok(report);
        }
        for w in &rounds[..done] {
            slots.insert(w.slot, *w);
        }
        next_round += done as u32;
    }
}

/// One QEMU boot of a kill run.
struct Boot<'a> {
    number: u32,
    copies: &'a Path,
    image: &'a Path,
    options: &'a KillOptions,
}

/// QEMU's exit, if it aborted by itself (SIGABRT); any other exit of
/// QEMU is an error.
fn qemu_aborted(lab: &mut Lab) -> Result<bool> {
    match lab.qemu_exited()? {
        None => Ok(false),
        Some(status) if status.signal() == Some(libc::SIGABRT) => Ok(true),
        Some(status) => bail!(
            "QEMU exited ({status}) when {DEVICE}'s server died; QEMU log:\n{}",
            p2plab_lab::lab::tail(&lab.run_dir.join("qemu.log"), 10)
        ),
    }
}

impl Boot<'_> {
    /// The file system facts of a boot's start: created, or mounted (the
    /// journal replayed), every fsynced file intact, and e2fsck clean.
    fn check_fs(
        &self,
        lab: &Lab,
        facts: &BTreeMap<String, String>,
        report: &mut KillReport,
    ) -> Result<()> {
        let guest = lab.guest_dir();
        let out = |name: &str| std::fs::read_to_string(guest.join(name)).unwrap_or_default();
        if !report.fs.created {
            ensure!(
                fact(facts, "FS_PARTITION", "boot")? == "0",
                "the guest sees no partition 1 on the namespace"
            );
            ensure!(
                fact(facts, "FS_MKFS", "boot")? == "0",
                "mkfs.ext4 failed: {}",
                out("mkfs.out")
            );
            report.fs.created = true;
            return Ok(());
        }
        ensure!(
            fact(facts, "FS_MOUNT", "boot")? == "0",
            "the ext4 file system left by the killed QEMU does not mount"
        );
        for r in &report.fs.files {
            let status = fact(facts, &format!("FS_FILE_{r}"), "boot")?;
            ensure!(
                status == "0",
                "round-{r}.bin, fsynced in round {r} before QEMU was killed, differs from what \
                 was written (cmp status {status})"
            );
        }
        ensure!(fact(facts, "FS_UMOUNT", "boot")? == "0", "umount failed");
        let fsck = fact(facts, "FSCK", "boot")?;
        ensure!(
            fsck == "0",
            "e2fsck -fn found the file system damaged (status {fsck}):\n{}",
            out("fsck.out")
        );
        report.clean_fscks += 1;
        report.fs_files_verified = report.fs.files.len();
        Ok(())
    }

    /// Verifies `before`, then runs `rounds` (none: verify only). Returns
    /// how many of the rounds ran: fewer when QEMU aborted.
    fn run(
        &self,
        before: &BTreeMap<u32, SlotWrite>,
        rounds: &[SlotWrite],
        report: &mut KillReport,
        on_round: &mut impl FnMut(&RoundReport),
    ) -> Result<usize> {
        let script = boot_script(before, &report.fs, rounds);
        let mut lab_options = LabOptions::exec("lab", &script)?;
        lab_options.state = Some(self.options.state.clone());
        lab_options.share = Some(self.copies.to_path_buf());
        lab_options.timeout = Some(Timeout::TcgBudget(PHASE_TIMEOUT));
        lab_options.stream_output = self.options.stream_output;
        let mut lab = Lab::start(&lab_options).context("starting the lab")?;
        let run_dir = lab.run_dir.clone();
        report.run_dirs.push(run_dir.clone());
        let boot = self.number;
        let in_run = || format!("boot {boot}, run folder {}", run_dir.display());
        let done = self
            .rounds(&mut lab, before, rounds, report, on_round)
            .with_context(in_run)?;
        if rounds.is_empty() {
            let outcome = lab.finish(&lab_options).with_context(in_run)?;
            ensure!(
                outcome.status == Some(0),
                "the verifying boot's script failed ({:?}); output:\n{}\n{}",
                outcome.status,
                outcome.output,
                in_run()
            );
        }
        Ok(done)
    }

    fn rounds(
        &self,
        lab: &mut Lab,
        before: &BTreeMap<u32, SlotWrite>,
        rounds: &[SlotWrite],
        report: &mut KillReport,
        on_round: &mut impl FnMut(&RoundReport),
    ) -> Result<usize> {
        let run_dir = lab.run_dir.clone();
        let ready = lab.wait_guest_file("ready", lab.budget(PHASE_TIMEOUT))?;
        let facts = parse_facts(&ready);
        for w in before.values() {
            check_verify(&run_dir, &facts, "boot", w)?;
        }
        // The round that ended the previous QEMU is checked by this boot.
        if let Some(previous) = report.rounds.last_mut() {
            previous.slots_verified = before.len();
        }
        self.check_fs(lab, &facts, report)?;
        ensure!(
            fact(&facts, "KERNEL_COMPLAINTS", "boot")? == "0",
            "the guest kernel complained at boot"
        );
        if rounds.is_empty() {
            return Ok(0);
        }

        let mut qmp = connect_qmp(lab)?;
        let mut slots = before.clone();
        for (i, w) in rounds.iter().enumerate() {
            let r = w.round;
            let what = format!("round {r}");
            slots.insert(w.slot, *w);
            let flushed =
                lab.wait_guest_file(&format!("flushed-{r}"), lab.budget(PHASE_TIMEOUT))?;
            let facts = parse_facts(&flushed);
            let write = fio_job(&run_dir.join(format!("guest/write-{r}.json")))?;
            ensure!(
                fact(&facts, "WRITE_STATUS", &what)? == "0"
                    && write["error"].as_i64() == Some(0)
                    && write["write"]["io_bytes"].as_u64() == Some(SLOT_BYTES),
                "{what}: fio's verify write failed: {write}"
            );
            ensure!(
                fact(&facts, "COPY_STATUS", &what)? == "0",
                "{what}: the guest could not read the slot back"
            );
            // Every round's fsync is a Flush on a server started at most
            // one round ago.
            let flushes = wait_flushes(lab, 1)?;

            let status = lab.kill_server(DEVICE)?;
            ensure!(
                killed_by_sigkill(status),
                "{what}: {DEVICE} ended with {status} before the SIGKILL"
            );
            for slot in slots.values() {
                compare_slot(self.image, self.copies, slot)
                    .with_context(|| format!("{what}: after the SIGKILL of {DEVICE}"))?;
            }
            let mut round = RoundReport {
                round: r,
                boot: self.number,
                write: *w,
                flushes,
                inflight_writes: fact_u64(&facts, "INFLIGHT_WRITES", &what)?,
                inflight_at_kill: fact_u64(&facts, "INFLIGHT_AT_KILL", &what)?,
                end: RoundEnd::QemuKilled,
                slots_compared: slots.len(),
                slots_verified: 0,
            };
            // QEMU notices the dead server at once, if it is to abort.
            sleep(Duration::from_millis(500));
            let last = i + 1 == rounds.len();
            let mut aborted = qemu_aborted(lab)?;
            if last {
                ensure!(
                    fact(&facts, "FS_MOUNT", &what)? == "0"
                        && fact(&facts, "FS_WRITE", &what)? == "0",
                    "{what}: writing the file system failed"
                );
                report.fs.files.push(r);
            }
            if last && !aborted {
                let status = lab.kill_qemu()?;
                ensure!(
                    killed_by_sigkill(status),
                    "{what}: QEMU ended with {status} before the SIGKILL"
                );
            }
            let unplugged = if last || aborted {
                None
            } else {
                // QEMU does not reconnect to a restarted server: take the
                // dead device out and plug a fresh one on the same file.
                match unplug(&mut qmp, DEVICE, lab.budget(UNPLUG_TIMEOUT)) {
                    Ok(took) => Some(took),
                    Err(e) => {
                        aborted = qemu_aborted(lab)?;
                        if !aborted {
                            return Err(e.context(format!("{what}: unplugging the dead {DEVICE}")));
                        }
                        None
                    }
                }
            };
            if let Some(took) = unplugged {
                round.end = RoundEnd::Replugged { unplug: took };
            } else {
                if aborted {
                    round.end = RoundEnd::QemuAborted;
                    report.qemu_aborts += 1;
                }
                // Nothing may have changed the file after the server died.
                for slot in slots.values() {
                    compare_slot(self.image, self.copies, slot)
                        .with_context(|| format!("{what}: after QEMU ended"))?;
                }
                on_round(&round);
                report.rounds.push(round);
                return Ok(i + 1);
            }
            lab.start_server(DEVICE)?;
            lab.plug(&mut qmp, DEVICE)?;
            lab.write_guest_file(&format!("replugged-{r}"), "")?;
            let checked =
                lab.wait_guest_file(&format!("checked-{r}"), lab.budget(PHASE_TIMEOUT))?;
            let facts = parse_facts(&checked);
            ensure!(
                fact(&facts, "BACK", &what)? == "1",
                "{what}: the re-plugged {DEVICE} has no namespace"
            );
            for slot in slots.values() {
                check_verify(&run_dir, &facts, &format!("r{r}"), slot)?;
            }
            ensure!(
                fact(&facts, "KERNEL_COMPLAINTS", &what)? == "0",
                "{what}: the guest kernel complained"
            );
            round.slots_verified = slots.len();
            on_round(&round);
            report.rounds.push(round);
        }
        Ok(rounds.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(round: u32) -> SlotWrite {
        SlotWrite {
            slot: (round - 1) % SLOTS,
            seed: 1000 + round,
            round,
        }
    }

    #[test]
    fn the_partition_table_is_one_linux_partition_after_the_scratch_region() {
        let dir = std::env::temp_dir().join(format!("p2plab-kill-mbr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("ns.img");
        write_partition_table(&image).unwrap();
        let bytes = std::fs::read(&image).unwrap();
        assert_eq!(bytes.len() as u64, NAMESPACE_BYTES);
        assert_eq!(&bytes[510..512], &[0x55, 0xaa]);
        assert_eq!(bytes[446 + 4], 0x83);
        let start = u32::from_le_bytes(bytes[454..458].try_into().unwrap());
        let sectors = u32::from_le_bytes(bytes[458..462].try_into().unwrap());
        assert_eq!(
            u64::from(start) * 512,
            (SCRATCH_OFFSET_MIB + SCRATCH_MIB) << 20
        );
        assert_eq!(u64::from(start + sectors) * 512, NAMESPACE_BYTES);
        assert!(SLOTS_OFFSET + u64::from(SLOTS) * SLOT_BYTES <= SCRATCH_OFFSET_MIB << 20);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The calls a boot's script makes after `guest/kill.sh`'s own text.
    fn plan(script: &GuestScript) -> String {
        let text = script.render().expect("the boot's script renders");
        let body = GUEST_SCRIPT.split_once('\n').expect("a shebang line").1;
        text.split_once(body).expect("kill.sh's text").1.to_owned()
    }

    /// Catches: a plan that forgets to verify a slot (at boot or after a
    /// re-plug), writes the file system in a round other than the boot's
    /// last, re-plugs after the last round instead of waiting for QEMU's
    /// SIGKILL, quiesces the last round's in-flight writes, or calls a
    /// step `guest/kill.sh` does not define (render fails).
    #[test]
    fn a_boot_verifies_every_slot_after_each_replug_and_ends_waiting_for_the_kill() {
        let before: BTreeMap<u32, SlotWrite> = [(0, w(1))].into_iter().collect();
        let fs = FsState {
            created: true,
            files: vec![1],
        };
        assert_eq!(
            plan(&boot_script(&before, &fs, &[w(2), w(3)])),
            "verify_slot 1001 0 boot\n\
             fs_check 1\n\
             checkpoint ready\n\
             round_write 2 1 1002\n\
             start_inflight\n\
             quiesce\n\
             flushed 2\n\
             after_replug 2\n\
             verify_slot 1001 0 r2\n\
             verify_slot 1002 1 r2\n\
             checkpoint checked-2\n\
             round_write 3 2 1003\n\
             fs_write 3\n\
             start_inflight\n\
             flushed 3\n\
             await_qemu_kill\n"
        );
        // A verify-only boot ends on its own; the first boot creates the
        // file system.
        assert_eq!(
            plan(&boot_script(&before, &fs, &[])),
            "verify_slot 1001 0 boot\nfs_check 1\ncheckpoint ready\nboot_done\n"
        );
        assert_eq!(
            plan(&boot_script(&BTreeMap::new(), &FsState::default(), &[w(1)])),
            "fs_create\ncheckpoint ready\nround_write 1 0 1001\nfs_write 1\n\
             start_inflight\nflushed 1\nawait_qemu_kill\n"
        );
    }

    /// Catches: slot geometry in the guest script that differs from the
    /// host's (the host would compare other bytes of the namespace file
    /// than fio wrote).
    #[test]
    fn the_guest_gets_the_hosts_slot_geometry() {
        let text = boot_script(&BTreeMap::new(), &FsState::default(), &[])
            .render()
            .unwrap();
        assert!(
            text.contains("export SLOTS_MIB=16\nexport SLOT_MIB=4\n"),
            "{text}"
        );
        assert!(text.contains("export SCRATCH_OFFSET_MIB=512\nexport SCRATCH_MIB=256\n"));
    }
}
