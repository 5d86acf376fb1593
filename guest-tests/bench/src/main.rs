//! `p2plab-bench`: guest I/O benchmarks of p2plab's NVMe server against the
//! anchor (QEMU's built-in nvme), side by side in one run, and of the P2P
//! path (NVMe ↔ GPU p2pmem) against the RAM path in the same boot.
//!
//! Fairness: both NVMe devices use the same caching on the host. `page`
//! runs p2plab-nvme through the page cache and the anchor with
//! `cache=writeback`; `direct` runs p2plab-nvme with O_DIRECT
//! (`--caching direct`) and the anchor with `cache=none`. Each round boots
//! the three topologies in turn (p2plab, the anchor, and two NVMe with a GPU
//! for NVMe → NVMe copies through RAM, GPU p2pmem and a CMB), then the
//! `rdma` topology, where two p2plab-nic devices move the same bytes over
//! their wire from and into guest RAM, GPU memory (the GPU driver's
//! peer-memory API) and GPU dma-bufs. The figures are true medians over the
//! rounds with their min–max spread. Everything measured goes to `results.json`
//! and `results.svg` in a bench folder under `runs/`.
//!
//! Modules: `jobs` (what is measured), `guest` (the guest scripts of
//! `guest/`), `measure` (one boot of each kind, read into a `Side`), `fio`
//! and `guest_output` (what the guest printed), `stats` (medians and
//! ratios), `rows` (the comparisons), and the reports `table` (stdout),
//! `json` and `svg`.

mod anchor;
mod dgx;
mod disks;
mod efa;
mod fio;
mod guest;
mod guest_output;
mod hostcpu;
mod jobs;
mod json;
mod measure;
mod rows;
mod settings;
mod spdk;
mod stats;
mod svg;
mod table;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Parser;
use p2plab_lab::accel::{self, AccelRequest, Requested};
use p2plab_lab::lab::format_utc;
use p2plab_lab::topology::parse_size;
use p2plab_lab::{Accel, GuestControl, GuestScript, LabOptions, LabPaths, Timeout};

use crate::anchor::{parse_anchor, AnchorArg};
use crate::jobs::{p2p_labels, selected, Caching, Job, COMPARED, P2P};
use crate::measure::{Server, Side};
use crate::rows::Row;
use crate::settings::Settings;

#[derive(Parser, Debug)]
#[command(
    name = "bench",
    about = "Benchmark p2plab-nvme against QEMU's built-in nvme, and P2P against RAM"
)]
struct Cli {
    /// Rounds; each boots both devices once (medians and min–max spread).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Seconds each fio job runs.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(2..=600))]
    runtime: u32,
    /// Host caching of both NVMe devices: `page` (p2plab-nvme through the
    /// page cache, anchor cache=writeback) or `direct` (p2plab-nvme
    /// O_DIRECT, anchor cache=none).
    #[arg(long, value_enum, default_value_t = Caching::Page)]
    caching: Caching,
    /// Skip the P2P workloads (NVMe ↔ GPU p2pmem against the RAM path).
    #[arg(long)]
    no_p2p: bool,
    /// Topology for p2plab's devices (needs nvme0, and gpu0 for P2P).
    #[arg(long, default_value = "lab")]
    ours: String,
    /// Topology for the NVMe → NVMe copies (needs nvme0 and nvme1 with
    /// serials P2PLAB-NVME0 and P2PLAB-NVME1, and gpu0).
    #[arg(long, default_value = "two-nvme")]
    copy_topology: String,
    /// Bytes each NVMe → NVMe copy moves.
    #[arg(long, default_value = "512M", value_parser = parse_copy_len)]
    copy_len: String,
    /// An anchor (repeatable): a topology for QEMU's nvme (`TOPOLOGY` or
    /// `qemu=TOPOLOGY`; its one `-drive` gets the cache mode; default
    /// anchor-qemu-nvme), and/or `spdk=DIR`: SPDK's nvmf_tgt from the SPDK
    /// build in DIR (configured --with-vfio-user), over a file of the same
    /// size, attached with vfio-user-pci, in the same rounds beside QEMU's
    /// nvme (needs --caching direct: SPDK's aio bdev is O_DIRECT).
    #[arg(long, value_parser = parse_anchor, value_name = "TOPOLOGY|spdk=DIR")]
    anchor: Vec<AnchorArg>,
    /// Skip the RDMA workloads (nic0 → wire → nic1, GPU memory against RAM).
    #[arg(long)]
    no_rdma: bool,
    /// Run only the RDMA workloads: no NVMe boot at all.
    #[arg(long, conflicts_with = "no_rdma")]
    rdma_only: bool,
    /// Run only the `dgx` figures: one boot of the `dgx` topology per
    /// round (boot time, peak RSS, P2P of one pair and of four at once,
    /// 4 KiB reads from one job and from one job per vCPU; `--runtime`
    /// seconds per fio run).
    #[arg(long, conflicts_with_all = ["rdma_only", "only"])]
    dgx_only: bool,
    /// Topology for the RDMA workloads (needs nic0 and nic1 wired to each
    /// other, and gpu0 under the same switch).
    #[arg(long, default_value = "rdma")]
    rdma_topology: String,
    /// Bytes each RDMA transfer moves (a whole number of MiB, 1M..1G).
    #[arg(long, default_value = "64M", value_parser = parse_copy_len)]
    rdma_len: String,
    /// Bytes per posted send/receive, the same for every memory so the
    /// ratio compares memories, not batching (4K..1M in 4 KiB steps: a RAM
    /// post is one frame per page and must fit the 256-entry ring).
    #[arg(long, default_value = "256K", value_parser = parse_rdma_post)]
    rdma_post: String,
    /// NIC MTUs to run the RDMA transfers at, one boot each per round
    /// (repeatable). A RAM region is cut into one frame per 4 KiB page
    /// whatever the MTU, GPU memory into MTU-sized frames: at 4096 both
    /// memories move in the same frames, at the default 65536 GPU memory
    /// also gains from bigger frames.
    #[arg(long, default_values_t = [65536u32, 4096], value_parser = clap::value_parser!(u32).range(4096..=1 << 20))]
    rdma_mtu: Vec<u32>,
    /// Accelerator of every boot: `kvm`, `tcg`, or `auto` (KVM when a probe
    /// vCPU runs, else TCG). Decided once for the whole run, so both sides
    /// of every ratio run under the same one. Default: $P2PLAB_ACCEL, else
    /// auto.
    #[arg(long, value_name = "auto|kvm|tcg")]
    accel: Option<AccelRequest>,
    /// Run only the EFA workloads: one boot of `--efa-topology`, GPU
    /// memory (dma-buf MRs) against guest RAM over efa0 → efa1, all
    /// rounds in that boot; results-efa.json's layout.
    #[arg(long, conflicts_with_all = ["rdma_only", "no_rdma", "only", "no_p2p", "dgx_only"])]
    efa_only: bool,
    /// Topology for the EFA workloads (efa0 with gpu0, efa1 with gpu1).
    #[arg(long, default_value = "rdma-efa")]
    efa_topology: String,
    /// Bytes each EFA call moves: SENT, then RDMA-read back (a whole
    /// number of MiB, 1M..1G).
    #[arg(long, default_value = "32M", value_parser = parse_copy_len)]
    efa_len: String,
    /// Bytes per SRD SEND message (the port's max_msg_sz is 8928 by default).
    #[arg(long, default_value = "8K", value_parser = parse_rdma_post)]
    efa_msg: String,
    /// RDMA read work-request sizes, both memories at each (repeatable).
    #[arg(long, default_values_t = ["64K".to_owned(), "1M".to_owned(), "4M".to_owned()], value_parser = parse_efa_wr)]
    efa_read_wr: Vec<String>,
    /// With --efa-only: boot nothing, re-read the finished EFA boot of this
    /// run folder (its guest/output.txt) with this bench's checks, e.g.
    /// after a host-side check changed; the date is the folder's.
    #[arg(long, requires = "efa_only", value_name = "RUN_DIR")]
    efa_reread: Option<PathBuf>,
    /// Run only these compared jobs (repeatable, e.g. `--only
    /// 4k-randread-qd32 --no-p2p` while profiling); default: all.
    #[arg(long, value_parser = parse_job_name)]
    only: Vec<String>,
}

fn parse_job_name(text: &str) -> Result<String, String> {
    if COMPARED.iter().any(|j| j.name == text) {
        Ok(text.to_owned())
    } else {
        let names: Vec<&str> = COMPARED.iter().map(|j| j.name).collect();
        Err(format!("{text:?}: one of {}", names.join(", ")))
    }
}

fn parse_copy_len(text: &str) -> Result<String, String> {
    match parse_size(text) {
        Some(n) if (1 << 20..=1 << 30).contains(&n) && n.is_multiple_of(1 << 20) => {
            Ok(text.to_owned())
        }
        _ => Err(format!("{text:?}: a whole number of MiB, 1M..1G")),
    }
}

fn parse_rdma_post(text: &str) -> Result<String, String> {
    match parse_size(text) {
        Some(n) if (4096..=1 << 20).contains(&n) && n.is_multiple_of(4096) => Ok(text.to_owned()),
        _ => Err(format!("{text:?}: a multiple of 4K, 4K..1M")),
    }
}

fn parse_efa_wr(text: &str) -> Result<String, String> {
    match parse_size(text) {
        Some(n) if (4096..=1 << 30).contains(&n) && n.is_multiple_of(4096) => Ok(text.to_owned()),
        _ => Err(format!("{text:?}: a multiple of 4K, 4K..1G")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("p2plab-bench: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The boots of a round, set up once: what each runs and what the host
/// reads back from it.
struct Boots {
    /// p2plab-nvme's jobs (and the P2P jobs), and their labels.
    ours: LabOptions,
    ours_labels: Vec<String>,
    /// The anchor's jobs, and their labels.
    anchor: LabOptions,
    anchor_labels: Vec<String>,
    /// The SPDK anchor's boot, with `--anchor spdk=DIR`.
    spdk: Option<SpdkBoot>,
    /// The compared NVMe sides' backing files, preconditioned before
    /// every round ([`disks`]).
    disks: Vec<disks::Disk>,
    /// The NVMe → NVMe copies, `copy_len` bytes each.
    copies: LabOptions,
    copy_len: u64,
    /// One RDMA boot per MTU, `rdma_len` bytes per transfer.
    rdma: Vec<(u32, LabOptions)>,
    rdma_len: u64,
}

/// The SPDK anchor: the build, where its target runs, and its boot.
struct SpdkBoot {
    build: spdk::SpdkBuild,
    /// Its sockets and log, made anew each round.
    folder: PathBuf,
    disk: PathBuf,
    disk_size: u64,
    options: LabOptions,
    labels: Vec<String>,
}

impl SpdkBoot {
    /// One round: nvmf_tgt started, the jobs run against it, nvmf_tgt
    /// stopped; one that died is named as the cause.
    fn run(&self, side: &mut Side) -> Result<()> {
        if self.folder.exists() {
            std::fs::remove_dir_all(&self.folder)
                .with_context(|| format!("removing {}", self.folder.display()))?;
        }
        let mut target = spdk::Target::start(&spdk::TargetSpec {
            build: &self.build,
            folder: &self.folder,
            disk: &self.disk,
            disk_size: self.disk_size,
            core_mask: "0x1",
        })?;
        let ran = side.run_jobs(&self.options, &self.labels, &Server::Spdk(&target));
        target
            .check_alive()
            .context("the SPDK anchor's nvmf_tgt died during the boot")?;
        ran?;
        target.stop()
    }
}

/// What every kind of boot measured over the rounds.
#[derive(Default)]
struct Sides {
    ours: Side,
    anchor: Side,
    spdk: Side,
    copies: Side,
    rdma: Side,
    /// The backing files' allocation before the first round and after
    /// the last preconditioning.
    disks: Vec<disks::Allocation>,
}

fn run(cli: &Cli) -> Result<()> {
    let paths = LabPaths::discover()?;
    let started = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let folder = bench_folder(&paths, started)?;
    if cli.efa_only {
        return run_efa(cli, &folder, started);
    }
    if cli.dgx_only {
        return run_dgx(cli, &paths, &folder, started);
    }
    let (settings, boots) = plan(cli, &paths, &folder, started)?;
    let sides = run_rounds(cli, &boots)?;
    report(cli, &settings, &sides, &folder)
}

/// `--dgx-only`: the rounds of `dgx` boots, their `results.json` in
/// `folder`, and their table.
fn run_dgx(cli: &Cli, paths: &LabPaths, folder: &Path, started: u64) -> Result<()> {
    let options = boot_options(cli, "dgx", &dgx::script(cli.runtime))?;
    // The guest environment and overlay first, so that no round's boot
    // time includes building them.
    p2plab_lab::setup::ensure_guest_env(paths)?;
    p2plab_lab::setup::ensure_overlay(paths)?;
    let mut rounds = Vec::new();
    for round in 1..=cli.rounds {
        eprintln!("p2plab-bench: dgx round {round}/{}", cli.rounds);
        rounds.push(dgx::run_round(&options)?);
    }
    let accel = match run_accel(cli)? {
        AccelRequest::Kvm => Accel::Kvm,
        _ => Accel::Tcg,
    };
    let date = format_utc(started);
    let document = dgx::results(&date, &accel.to_string(), cli.runtime, &rounds);
    let json_path = folder.join("results.json");
    let text = serde_json::to_string_pretty(&document).context("encoding results")?;
    std::fs::write(&json_path, text + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    println!(
        "dgx, {date} UTC, {accel}, {} rounds, {} s per fio run:\n\n{}",
        cli.rounds,
        cli.runtime,
        dgx::table(&rounds)
    );
    println!("results: {}", json_path.display());
    Ok(())
}

/// A fresh folder for the run's results and the anchor topology it runs.
fn bench_folder(paths: &LabPaths, started: u64) -> Result<PathBuf> {
    let folder = paths.runs.join(format!(
        "bench-{}-{}",
        format_utc(started),
        std::process::id()
    ));
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    eprintln!("p2plab-bench: results go to {}", folder.display());
    Ok(folder)
}

/// Options of a bench boot: `script` in the guest of `topology`, output
/// not echoed, a timeout from the job runtime, and complaints in the
/// guest's kernel log only warned about (the suites check those).
fn boot_options(cli: &Cli, topology: &str, script: &GuestScript) -> Result<LabOptions> {
    let mut options = LabOptions::exec(topology, script)?;
    options.stream_output = false;
    options.accel = Some(run_accel(cli)?);
    options.timeout = Some(Timeout::TcgBudget(Duration::from_secs(
        u64::from(cli.runtime) * 20 + 600,
    )));
    options.kernel_log.enforce = false;
    Ok(options)
}

/// The one accelerator of the run: `--accel`/`P2PLAB_ACCEL` if forced;
/// else KVM when its probe passes, forced on every boot (a topology whose
/// vCPU vendor KVM cannot give fails clearly rather than being measured
/// under TCG beside KVM ones); else auto, which falls back to TCG on every
/// boot with its reason (the probe's answer holds for the whole process).
fn run_accel(cli: &Cli) -> Result<AccelRequest> {
    let requested = Requested::resolve(cli.accel)?;
    Ok(match requested.request {
        AccelRequest::Auto if accel::kvm_usable().is_ok() => AccelRequest::Kvm,
        other => other,
    })
}

/// The same extra arguments for each server in `ids`.
fn server_args(ids: &[&str], args: &[String]) -> Vec<(String, Vec<String>)> {
    ids.iter()
        .map(|id| ((*id).to_owned(), args.to_vec()))
        .collect()
}

/// The NVMe boots: p2plab-nvme (with `nvme_args`) and the anchor run the
/// selected jobs; ours also the P2P jobs unless `--no-p2p`. Each with the
/// labels of its results.
fn nvme_boots(
    cli: &Cli,
    nvme_args: &[String],
    anchor_topology: &Path,
) -> Result<[(LabOptions, Vec<String>); 2]> {
    let jobs: Vec<&Job> = selected(&cli.only);
    let p2p = !cli.no_p2p;
    let mut ours = boot_options(cli, &cli.ours, &guest::nvme_jobs(&jobs, cli.runtime, p2p))?;
    // The host reads p2plab-nvme's busy CPU from its stats file at each
    // job's marks: fresh to 50 ms.
    let mut ours_args = nvme_args.to_vec();
    ours_args.extend(["--stats-interval-ms".to_owned(), "50".to_owned()]);
    ours.server_args = server_args(&["nvme0"], &ours_args);
    if p2p {
        // The CPU marks around the P2P jobs ask the servers from the guest.
        let servers = jobs::CPU_SERVERS.iter().map(|s| (*s).to_owned()).collect();
        ours.guest_control = GuestControl::Devices(servers);
    }
    let anchor = boot_options(
        cli,
        &anchor_topology.to_string_lossy(),
        &guest::nvme_jobs(&jobs, cli.runtime, false),
    )?;
    let anchor_labels: Vec<String> = jobs.iter().map(|j| j.name.to_owned()).collect();
    let mut ours_labels = anchor_labels.clone();
    if p2p {
        ours_labels.extend(P2P.iter().flat_map(p2p_labels));
    }
    Ok([(ours, ours_labels), (anchor, anchor_labels)])
}

/// The RDMA boots, one per `--rdma-mtu`, after checking that a transfer
/// is a whole number of posts. Returns them and the bytes per transfer.
fn rdma_boots(cli: &Cli) -> Result<(Vec<(u32, LabOptions)>, u64)> {
    let len = parse_size(&cli.rdma_len).context("--rdma-len")?;
    let post = parse_size(&cli.rdma_post).context("--rdma-post")?;
    if !len.is_multiple_of(post) {
        bail!(
            "--rdma-len {} is not a multiple of --rdma-post {}",
            cli.rdma_len,
            cli.rdma_post
        );
    }
    let script = guest::rdma(&cli.rdma_len, &cli.rdma_post);
    let boots = cli
        .rdma_mtu
        .iter()
        .map(|&mtu| {
            let mut options = boot_options(cli, &cli.rdma_topology, &script)?;
            let mtu_args = ["--mtu".to_owned(), mtu.to_string()];
            options.server_args = server_args(&["nic0", "nic1"], &mtu_args);
            Ok((mtu, options))
        })
        .collect::<Result<_>>()?;
    Ok((boots, len))
}

/// The SPDK anchor's boot: the build in `dir` checked, QEMU's anchor
/// topology without its nvme (written into `folder`), nvmf_tgt's
/// controller attached in its place, a backing file of the same size.
fn spdk_boot(
    cli: &Cli,
    paths: &LabPaths,
    dir: &Path,
    qemu_anchor: &str,
    folder: &Path,
) -> Result<SpdkBoot> {
    if cli.caching != Caching::Direct {
        bail!(
            "--anchor spdk=DIR needs --caching direct: SPDK's aio bdev opens its file \
             with O_DIRECT, so only p2plab-nvme's O_DIRECT and QEMU's cache=none compare with it"
        );
    }
    if cli.rdma_only {
        bail!("--anchor spdk=DIR with --rdma-only: no NVMe boot would run");
    }
    let build = spdk::check_build(dir)?;
    let (topology, bus, disk_size) =
        anchor::write_spdk_topology(&paths.topology(qemu_anchor)?, folder)?;
    let spdk_folder = folder.join("spdk");
    let jobs: Vec<&Job> = selected(&cli.only);
    let mut options = boot_options(
        cli,
        &topology.to_string_lossy(),
        &guest::nvme_jobs(&jobs, cli.runtime, false),
    )?;
    options.qemu_args = vec![
        "-device".to_owned(),
        spdk::device_arg(&spdk_folder.join("nvme0/cntrl"), &bus),
    ];
    Ok(SpdkBoot {
        build,
        folder: spdk_folder,
        disk: paths.state.join("spdk-nvme0n1.img"),
        disk_size,
        options,
        labels: jobs.iter().map(|j| j.name.to_owned()).collect(),
    })
}

/// The settings of the run and the boots of a round, from the command
/// line: the anchor topology with the run's cache mode (written into
/// `folder`), each boot's guest script, server arguments and timeout.
fn plan(cli: &Cli, paths: &LabPaths, folder: &Path, started: u64) -> Result<(Settings, Boots)> {
    let (qemu_anchor, spdk_dir) = anchor::anchors(&cli.anchor, "anchor-qemu-nvme")?;
    let (anchor_topology, anchor_drive) = anchor::write_topology(
        &paths.topology(&qemu_anchor)?,
        cli.caching.qemu_cache(),
        folder,
    )?;
    let spdk = match &spdk_dir {
        Some(dir) => Some(spdk_boot(cli, paths, dir, &qemu_anchor, folder)?),
        None => None,
    };
    let nvme_args = vec!["--caching".to_owned(), cli.caching.server_flag().to_owned()];
    let [(ours, ours_labels), (anchor, anchor_labels)] =
        nvme_boots(cli, &nvme_args, &anchor_topology)?;
    let mut copies = boot_options(cli, &cli.copy_topology, &guest::copies(&cli.copy_len))?;
    copies.server_args = server_args(&["nvme0", "nvme1"], &nvme_args);
    let copy_len = parse_size(&cli.copy_len).context("--copy-len")?;
    let (rdma, rdma_len) = rdma_boots(cli)?;
    let disks = compared_disks(cli, paths, &anchor_topology, spdk.as_ref(), folder)?;

    let settings = Settings {
        date_utc: format_utc(started),
        accel: match run_accel(cli)? {
            AccelRequest::Kvm => Accel::Kvm,
            _ => Accel::Tcg,
        },
        rounds: cli.rounds,
        runtime_s: cli.runtime,
        caching: cli.caching.server_flag(),
        ours_topology: cli.ours.clone(),
        nvme_extra_args: nvme_args,
        anchor_topology,
        anchor_drive,
        spdk: spdk.as_ref().map(|s| settings::SpdkSettings {
            dir: s.build.dir.clone(),
            version: s.build.version.clone(),
            topology: PathBuf::from(&s.options.topology),
            device: s.options.qemu_args.get(1).cloned().unwrap_or_default(),
            disk: s.disk.clone(),
        }),
        copy_topology: cli.copy_topology.clone(),
        copy_len: cli.copy_len.clone(),
        rdma_topology: cli.rdma_topology.clone(),
        rdma_len: cli.rdma_len.clone(),
        rdma_post: cli.rdma_post.clone(),
        rdma_mtus: cli.rdma_mtu.clone(),
    };
    let boots = Boots {
        ours,
        ours_labels,
        anchor,
        anchor_labels,
        spdk,
        disks,
        copies,
        copy_len,
        rdma,
        rdma_len,
    };
    Ok((settings, boots))
}

/// The backing files of the compared NVMe boots: nvme0's namespace in
/// `--ours`, the anchor topology's disk, and SPDK's.
fn compared_disks(
    cli: &Cli,
    paths: &LabPaths,
    anchor_topology: &Path,
    spdk: Option<&SpdkBoot>,
    folder: &Path,
) -> Result<Vec<disks::Disk>> {
    let ours = disks::load_topology(&paths.topology(&cli.ours)?, &paths.state, folder)?;
    let (path, size) = disks::server_namespace(&ours, "nvme0")?;
    let mut all = vec![disks::Disk {
        side: "p2plab-nvme",
        path,
        size,
    }];
    let anchor = disks::load_topology(anchor_topology, &paths.state, folder)?;
    let [disk] = anchor.disks.as_slice() else {
        bail!(
            "anchor topology {} has {} disks; the bench needs one",
            anchor_topology.display(),
            anchor.disks.len()
        );
    };
    all.push(disks::Disk {
        side: "qemu nvme",
        path: disk.path.clone(),
        size: disk.size,
    });
    if let Some(s) = spdk {
        all.push(disks::Disk {
            side: "spdk nvmf_tgt",
            path: s.disk.clone(),
            size: s.disk_size,
        });
    }
    Ok(all)
}

/// The rounds: each boots ours, the anchor and the copies (unless
/// `--rdma-only`; the copies unless `--no-p2p`), then the RDMA topology
/// once per MTU (unless `--no-rdma`).
fn run_rounds(cli: &Cli, boots: &Boots) -> Result<Sides> {
    let mut sides = Sides::default();
    for round in 1..=cli.rounds {
        eprintln!("p2plab-bench: round {round}/{}", cli.rounds);
        if !cli.rdma_only {
            disks::precondition_all(&boots.disks, &mut sides.disks)?;
            sides
                .ours
                .run_jobs(&boots.ours, &boots.ours_labels, &Server::P2plab)?;
            sides
                .anchor
                .run_jobs(&boots.anchor, &boots.anchor_labels, &Server::Qemu)?;
            if let Some(spdk) = &boots.spdk {
                spdk.run(&mut sides.spdk)?;
            }
            if !cli.no_p2p {
                sides.copies.run_copies(&boots.copies, boots.copy_len)?;
            }
        }
        if !cli.no_rdma {
            for (mtu, options) in &boots.rdma {
                sides.rdma.run_rdma(options, *mtu, boots.rdma_len)?;
            }
        }
    }
    Ok(sides)
}

/// The rows of each section, for what ran: none for a section the
/// command line left out.
fn sections(cli: &Cli, sides: &Sides, spdk: bool) -> [Vec<Row>; 4] {
    let compared = if cli.rdma_only {
        Vec::new()
    } else {
        rows::compared(&selected(&cli.only), &sides.ours, &sides.anchor)
    };
    let compared_spdk = if spdk {
        rows::compared(&selected(&cli.only), &sides.ours, &sides.spdk)
    } else {
        Vec::new()
    };
    let p2p = if cli.no_p2p || cli.rdma_only {
        Vec::new()
    } else {
        rows::p2p(&sides.ours, &sides.copies)
    };
    let rdma = if cli.no_rdma {
        Vec::new()
    } else {
        rows::rdma(&sides.rdma, &cli.rdma_mtu)
    };
    [compared, compared_spdk, p2p, rdma]
}

/// The comparisons of what ran, written to `results.json` and
/// `results.svg` in `folder` and printed as a table.
fn report(cli: &Cli, settings: &Settings, sides: &Sides, folder: &Path) -> Result<()> {
    let [compared, compared_spdk, p2p, rdma] = sections(cli, sides, settings.spdk.is_some());

    let measured = json::Measured {
        ours: &sides.ours,
        anchor: &sides.anchor,
        spdk: &sides.spdk,
        copies: &sides.copies,
        rdma: &sides.rdma,
        disks: &sides.disks,
    };
    let json_path = folder.join("results.json");
    let document = json::results(settings, &measured, &compared, &compared_spdk, &p2p, &rdma);
    let text = serde_json::to_string_pretty(&document).context("encoding results")?;
    std::fs::write(&json_path, text + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;

    let title = format!(
        "p2plab bench {} UTC, {}, caching={}, {} rounds (bars: median ratio, whiskers: min–max)",
        settings.date_utc, settings.accel, settings.caching, settings.rounds
    );
    let svg_path = folder.join("results.svg");
    let plotted: [(&str, &[Row]); 4] = [
        ("vs QEMU nvme", &compared),
        ("vs SPDK nvmf_tgt", &compared_spdk),
        ("P2P vs RAM", &p2p),
        ("RDMA vs RAM", &rdma),
    ];
    std::fs::write(&svg_path, svg::render(&title, &plotted))
        .with_context(|| format!("writing {}", svg_path.display()))?;

    table::print(
        settings,
        &compared,
        &compared_spdk,
        &p2p,
        &rdma,
        &sides.rdma.nic_paths,
        &rows::peak_rss(&sides.ours, &sides.anchor),
    );
    let mut cpu_sides = vec![("p2plab-nvme", &sides.ours), ("qemu nvme", &sides.anchor)];
    if settings.spdk.is_some() {
        cpu_sides.push(("spdk nvmf_tgt", &sides.spdk));
    }
    table::print_host_cpu(&cpu_sides);
    println!(
        "results: {} and {}",
        json_path.display(),
        svg_path.display()
    );
    Ok(())
}

/// `--efa-only`: one boot, every round in it; results.json (the layout
/// of guest-tests/bench/results-efa.json), results.svg and the table.
fn run_efa(cli: &Cli, folder: &Path, started: u64) -> Result<()> {
    let len_bytes = parse_size(&cli.efa_len).context("--efa-len")?;
    let msg = parse_size(&cli.efa_msg).context("--efa-msg")?;
    for wr in &cli.efa_read_wr {
        let n = parse_size(wr).context("--efa-read-wr")?;
        if !len_bytes.is_multiple_of(n) {
            bail!(
                "--efa-len {} is not a multiple of --efa-read-wr {wr}",
                cli.efa_len
            );
        }
    }
    if !len_bytes.is_multiple_of(msg) {
        bail!(
            "--efa-len {} is not a multiple of --efa-msg {}",
            cli.efa_len,
            cli.efa_msg
        );
    }
    let plan = efa::Plan {
        rounds: cli.rounds,
        len: cli.efa_len.clone(),
        len_bytes,
        msg: cli.efa_msg.clone(),
        read_wrs: cli.efa_read_wr.clone(),
    };
    let mut options = boot_options(cli, &cli.efa_topology, &efa::script(&plan))?;
    options.guest_control =
        GuestControl::Devices(efa::SERVERS.iter().map(|s| (*s).to_owned()).collect());
    let accel = match run_accel(cli)? {
        AccelRequest::Kvm => Accel::Kvm,
        _ => Accel::Tcg,
    };
    eprintln!(
        "p2plab-bench: {} rounds in one boot of {}",
        cli.rounds, cli.efa_topology
    );
    let (measured, date_utc) = match &cli.efa_reread {
        Some(run_dir) => (efa::reread(run_dir, &plan)?, efa::run_date(run_dir)?),
        None => (efa::run(&options, &plan)?, format_utc(started)),
    };
    let rows = efa::rows(&measured, &plan);

    let document = json::efa_results(&date_utc, accel, &cli.efa_topology, &plan, &measured, &rows);
    let json_path = folder.join("results.json");
    let text = serde_json::to_string_pretty(&document).context("encoding results")?;
    std::fs::write(&json_path, text + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let title = format!(
        "p2plab bench {} UTC, {accel}, EFA, {} rounds (bars: median ratio, whiskers: min–max)",
        date_utc, cli.rounds
    );
    let svg_path = folder.join("results.svg");
    let plotted: [(&str, &[Row]); 1] = [("EFA GPU vs RAM", &rows)];
    std::fs::write(&svg_path, svg::render(&title, &plotted))
        .with_context(|| format!("writing {}", svg_path.display()))?;
    table::print_efa(&rows);
    println!(
        "results: {} and {}",
        json_path.display(),
        svg_path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: sizes the guest tools cannot take accepted on the command
    /// line (a RAM post must fit the NIC's ring), and `--only` with a job
    /// the bench does not have.
    #[test]
    fn command_line_values_are_checked() {
        assert_eq!(parse_copy_len("512M"), Ok("512M".to_owned()));
        assert!(parse_copy_len("1000").is_err());
        assert_eq!(parse_rdma_post("256K"), Ok("256K".to_owned()));
        assert!(
            parse_rdma_post("2M").is_err(),
            "a RAM post would not fit the ring"
        );
        assert!(parse_rdma_post("6000").is_err());
        assert!(parse_job_name("4k-randread-qd32").is_ok());
        assert!(parse_job_name("4k-randread").is_err());
    }
}
