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
//! Shared by `guest-tests/tests/kill.rs` (a few rounds) and
//! `p2plab-kill-loop` (behind `scripts/kill-loop`, 100 rounds).

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
use p2plab_lab::{Lab, LabOptions, Mode};

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

/// Shell helpers every boot's script starts with.
const SCRIPT_HEAD: &str = r#"
set -u
SLOT_MIB=4
SLOTS_MIB=16
: > /tmp/facts
# fact KEY VALUE: printed, and kept for the next signal file.
fact() { echo "$1=$2"; echo "$1=$2" >> /tmp/facts; }
# signal NAME: hand the facts so far to the host (atomically: it polls).
signal() { cp /tmp/facts /run/p2plab/.$1; : > /tmp/facts; mv /run/p2plab/.$1 /run/p2plab/$1; }
wait_host() { i=0; until [ -e /run/p2plab/$1 ]; do sleep 0.2; i=$((i+1)); [ $i -lt 3000 ] || { echo "no $1 from the host"; exit 1; }; done; }
# The namespace of the controller at a PCI address (a re-plugged
# controller may get another name while the old one is still referenced).
ns_of() { c=$(ls -d /sys/bus/pci/devices/$1/nvme/nvme* 2>/dev/null | head -n1); [ -n "$c" ] && p2plab-nvme-ns --ctrl "$(basename $c)" 1 2>/dev/null; }
# fio_slot SEED SLOT NAME [fio options]: the one job that writes a slot and
# verifies it later. A single job per fio run on purpose: fio derives its
# random streams from the seed and the job's number, so the verify run must
# be the same job shape as the write run.
fio_slot() {
  seed=$1 slot=$2 name=$3; shift 3
  fio --name=slot$slot --filename=$ns --rw=randwrite --bs=4k --offset=$((SLOTS_MIB + slot * SLOT_MIB))M \
    --size=${SLOT_MIB}M --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c \
    --randrepeat=1 --randseed=$seed --verify_state_save=0 --output-format=json \
    --output=/run/p2plab/$name.json \
    "$@" >/dev/null 2>/run/p2plab/$name.err
}
# verify_slot SEED SLOT TAG: fio reads the slot back and checks every
# block's header (offset, seed) and crc32c.
verify_slot() { fio_slot $1 $2 verify-$3-slot$2 --verify_only=1; fact VERIFY_$3_SLOT$2 $?; }
complaints() { dmesg | grep -c -E 'BUG:|Oops|Call Trace|refcount_t|blocked for more than'; }
writes_done() { awk '{print $5}' /sys/block/${ns#/dev/}/stat; }
inflight_now() { awk '{print $1 + $2}' /sys/block/${ns#/dev/}/inflight; }

ns=$(p2plab-nvme-ns 1) || { echo "no NVMe namespace"; exit 1; }
bdf=$(basename "$(readlink -f /sys/block/${ns#/dev/}/device/device)")
fact NVME_BDF $bdf
mkdir -p /mnt/fs
"#;

/// Rounds that re-plug within the boot stop the scratch writer (one
/// process: fio runs its job as a thread) and let its requests drain
/// before the kill: QEMU 11.1 can abort when a server dies while the guest
/// drives the device ([`RoundEnd::QemuAborted`]). The unflushed writes
/// were still acknowledged and never flushed.
const QUIESCE: &str = "kill -STOP $inflight
i=0; while [ \"$(inflight_now)\" != 0 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
";

/// Checkpoint `tag`: fio verifies every slot in `slots`.
fn verify_lines(script: &mut String, slots: &BTreeMap<u32, SlotWrite>, tag: &str) {
    for w in slots.values() {
        script.push_str(&format!("verify_slot {} {} {tag}\n", w.seed, w.slot));
    }
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

fn fs_check_lines(script: &mut String, fs: &FsState) {
    if !fs.created {
        // The host wrote the partition table ([`write_partition_table`]).
        script.push_str(
            "fact FS_PARTITION $([ -b ${ns}p1 ] && echo 0 || echo 1)\n\
             mkfs.ext4 -q -F -E nodiscard ${ns}p1 >/run/p2plab/mkfs.out 2>&1\n\
             fact FS_MKFS $?\n",
        );
        return;
    }
    script.push_str(
        "mount -t ext4 ${ns}p1 /mnt/fs
fact FS_MOUNT $?
",
    );
    for r in &fs.files {
        script.push_str(&format!(
            "cmp -s /mnt/fs/round-{r}.bin /mnt/host/fs-round-{r}.bin
fact FS_FILE_{r} $?
"
        ));
    }
    script.push_str(
        "umount /mnt/fs
fact FS_UMOUNT $?
         e2fsck -fn ${ns}p1 >/run/p2plab/fsck.out 2>&1
fact FSCK $?
",
    );
}

/// The last round of a boot writes a file in the file system with fsync,
/// and keeps unflushed writes to another one going while QEMU is killed.
const FS_WRITE: &str = r#"mount -t ext4 ${ns}p1 /mnt/fs
fact FS_MOUNT $?
head -c 1048576 /dev/urandom > /mnt/host/fs-round-@R@.bin
dd if=/mnt/host/fs-round-@R@.bin of=/mnt/fs/round-@R@.bin bs=1M conv=fsync 2>/dev/null && sync -f /mnt/fs
fact FS_WRITE $?
dd if=/dev/urandom of=/mnt/fs/unflushed-@R@.bin bs=64k count=4096 2>/dev/null &
"#;

/// The guest script of one boot: verify what earlier boots left, then the
/// rounds; the last round waits for the host to kill QEMU. A boot with no
/// rounds only verifies and exits.
fn boot_script(before: &BTreeMap<u32, SlotWrite>, fs: &FsState, rounds: &[SlotWrite]) -> String {
    let mut script = String::from(SCRIPT_HEAD);
    verify_lines(&mut script, before, "boot");
    fs_check_lines(&mut script, fs);
    script.push_str("fact KERNEL_COMPLAINTS $(complaints)\nsignal ready\n");
    let mut slots = before.clone();
    for (i, w) in rounds.iter().enumerate() {
        let r = w.round;
        slots.insert(w.slot, *w);
        script.push_str(&format!(
            r#"
# --- round {r}: slot {slot}, seed {seed} ---
fio_slot {seed} {slot} write-{r} --do_verify=0 --end_fsync=1
fact WRITE_STATUS $?
dd if=$ns of=/mnt/host/slot-{slot}.bin bs=1M skip=$((SLOTS_MIB + {slot} * SLOT_MIB)) count=$SLOT_MIB iflag=direct 2>/dev/null
fact COPY_STATUS $?
{fs_write}w0=$(writes_done)
fio --name=inflight --filename=$ns --rw=randwrite --bs=64k --offset={SCRATCH_OFFSET_MIB}M \
  --size={SCRATCH_MIB}M --direct=1 --ioengine=libaio --iodepth=16 --time_based --runtime=3600 \
  --thread >/dev/null 2>&1 &
inflight=$!
i=0; while [ "$(writes_done)" -lt $((w0 + 100)) ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
fact INFLIGHT_WRITES $(( $(writes_done) - w0 ))
{quiesce}fact INFLIGHT_AT_KILL $(inflight_now)
signal flushed-{r}
"#,
            slot = w.slot,
            seed = w.seed,
            quiesce = if i + 1 == rounds.len() { "" } else { QUIESCE },
            fs_write = if i + 1 == rounds.len() {
                FS_WRITE.replace("@R@", &r.to_string())
            } else {
                String::new()
            },
        ));
        if i + 1 == rounds.len() {
            // The host kills the server, then QEMU, while this sleeps.
            script.push_str("sleep 3600\necho 'QEMU was not killed'\nexit 1\n");
            return script;
        }
        script.push_str(&format!(
            r#"wait_host replugged-{r}
kill -9 $inflight 2>/dev/null; kill -CONT $inflight 2>/dev/null; wait $inflight 2>/dev/null
i=0; ns=; until ns=$(ns_of $bdf) || [ $i -ge 300 ]; do sleep 0.2; i=$((i+1)); done
fact BACK $([ -b "$ns" ] && echo 1 || echo 0)
"#
        ));
        verify_lines(&mut script, &slots, &format!("r{r}"));
        script.push_str(&format!(
            "fact KERNEL_COMPLAINTS $(complaints)\nsignal checked-{r}\n"
        ));
    }
    script.push_str("exit 0\n");
    script
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
        let mut lab_options =
            LabOptions::new("lab", Mode::Exec(boot_script(before, &report.fs, rounds)));
        lab_options.state = Some(self.options.state.clone());
        lab_options.share = Some(self.copies.to_path_buf());
        lab_options.timeout = Some(PHASE_TIMEOUT);
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
        let ready = lab.wait_guest_file("ready", PHASE_TIMEOUT)?;
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
            let flushed = lab.wait_guest_file(&format!("flushed-{r}"), PHASE_TIMEOUT)?;
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
                match unplug(&mut qmp, DEVICE, UNPLUG_TIMEOUT) {
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
            let checked = lab.wait_guest_file(&format!("checked-{r}"), PHASE_TIMEOUT)?;
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

    #[test]
    fn a_boot_verifies_every_slot_after_each_replug_and_ends_waiting_for_the_kill() {
        let before: BTreeMap<u32, SlotWrite> = [(0, w(1))].into_iter().collect();
        let fs = FsState {
            created: true,
            files: vec![1],
        };
        let script = boot_script(&before, &fs, &[w(2), w(3)]);
        assert!(script.contains("cmp -s /mnt/fs/round-1.bin /mnt/host/fs-round-1.bin"));
        assert!(script.contains("e2fsck -fn"));
        // Only the boot's last round writes the file system.
        assert!(!script.contains("of=/mnt/fs/round-2.bin"));
        assert!(script.contains("of=/mnt/fs/round-3.bin bs=1M conv=fsync"));
        assert!(script.contains("verify_slot 1001 0 boot\n"));
        assert!(script.contains("fio_slot 1002 1 write-2 --do_verify=0 --end_fsync=1"));
        assert!(script.contains("wait_host replugged-2"));
        assert!(script.contains("verify_slot 1001 0 r2\nverify_slot 1002 1 r2\n"));
        // The boot's last round waits for QEMU's SIGKILL, no re-plug.
        assert!(!script.contains("wait_host replugged-3"));
        assert!(script.trim_end().ends_with("exit 1"));
        // A verify-only boot ends on its own.
        let verify = boot_script(&before, &fs, &[]);
        assert!(boot_script(&before, &FsState::default(), &[]).contains("mkfs.ext4"));
        assert!(verify.trim_end().ends_with("exit 0"));
        assert!(!verify.contains("fio_slot 1"));
    }
}
