//! `p2plab-vm`: the lab launcher behind `scripts/run-vm`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use p2plab_lab::accel::{AccelRequest, Timeout};
use p2plab_lab::lab::{preview_accel, stop_kept, LAB_FAILURE};
use p2plab_lab::topology::{Placeholders, Topology};
use p2plab_lab::{Lab, LabOptions, LabPaths, Mode};

/// Boot the p2plab guest with the emulated NVMe (CMB) and GPU devices
/// attached through vfio-user, behind one PCIe switch.
#[derive(Parser, Debug)]
#[command(name = "run-vm", version, about, long_about = None)]
struct Cli {
    /// Topology: a name from qemu-configs/ (without .args) or a path to a
    /// topology file.
    #[arg(long, short = 'c', default_value = "lab", value_name = "NAME|FILE")]
    config: String,

    /// Run this shell command line in the guest (bash; multi-line scripts and
    /// quotes are fine), stream its output and exit with its status.
    #[arg(long, short = 'e', value_name = "CMD")]
    exec: Option<String>,

    /// Make a host folder visible in the guest at /mnt/host (9p).
    #[arg(long, value_name = "HOSTDIR")]
    share: Option<PathBuf>,

    /// Boot this kernel image instead of the guest environment's.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,

    /// Extra kernel command-line arguments (repeatable), e.g.
    /// --append dyndbg='module p2pdma +p'.
    #[arg(long, short = 'a', value_name = "ARGS")]
    append: Vec<String>,

    /// Leave the guest and servers up after booting (and after --exec), and
    /// print how to reach them; end them with --stop.
    #[arg(long)]
    keep: bool,

    /// Stop a lab left up with --keep (its run folder, or `latest`).
    #[arg(long, value_name = "RUNDIR", conflicts_with_all = ["exec", "keep"])]
    stop: Option<PathBuf>,

    /// Attach this terminal to the console of a lab left up with --keep
    /// (its run folder, or `latest`); Ctrl-] detaches.
    #[arg(long, value_name = "RUNDIR", conflicts_with_all = ["exec", "keep", "stop"])]
    attach: Option<PathBuf>,

    /// Give up on --exec after this many seconds (exit status 125).
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    timeout: Option<Duration>,

    /// Give up on --exec when the guest has not started the command this
    /// many seconds after QEMU did: it hung while booting (exit status
    /// 125; the vCPUs' registers go to the run folder). Default: 180 under
    /// TCG, 90 under KVM; raise it for a kernel that boots slowly.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    boot_timeout: Option<Duration>,

    /// Accelerator: `kvm` (an error where /dev/kvm cannot run a vCPU),
    /// `tcg`, or `auto` (KVM when a probe vCPU runs, else TCG with one line
    /// saying why). Default: $P2PLAB_ACCEL, else auto.
    #[arg(long, value_name = "auto|kvm|tcg")]
    accel: Option<AccelRequest>,

    /// Device server log level (error, warn, info, debug, trace); RUST_LOG
    /// also works for finer filters.
    #[arg(long, value_name = "LEVEL", value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: Option<String>,

    /// Zero-copy DMA between the device servers (`on`, `off`), passed to
    /// every server as `--peer-path`; default: what the topology's
    /// `#@server` lines say (on unless they say off).
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    peer_path: Option<String>,

    /// Give the guest its own control channel to these device servers
    /// (`all`, or ids like `nvme0,gpu0`): a virtio-serial port per device,
    /// through which the guest's `p2plab-ctl ID` asks for status, arms
    /// and clears injections and switches the trace (not reset). Off
    /// unless given.
    #[arg(long, value_name = "all|DEV[,DEV]")]
    guest_control: Option<p2plab_lab::GuestControl>,

    /// The wire of the topology's EFA (every p2plab-efa server), as its
    /// `--wire`: `tcp-listen:ADDR:PORT` in one lab and
    /// `tcp-connect:HOST:PORT` in another joins the two labs' EFAs (two
    /// hosts, or two network namespaces), e.g. with `--config efa-tcp`.
    #[arg(long, value_name = "WIRE")]
    efa_wire: Option<String>,

    /// The pre-shared key file of a TCP `--efa-wire`: the same file in both
    /// labs, mode 0600, owned by you (`openssl rand -hex 32 > FILE`).
    #[arg(long, value_name = "FILE", requires = "efa_wire")]
    efa_wire_key: Option<PathBuf>,

    /// The GID of the topology's EFA (two labs need two different ones).
    #[arg(long, value_name = "GID")]
    efa_gid: Option<String>,

    /// Folder for state kept across boots (disk images, `@STATE@`);
    /// default `.cache/state`. Two labs at once need two.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,

    /// Show boot messages and progress.
    #[arg(long, short = 'v')]
    verbose: bool,

    /// Build the guest environment and the overlay, then exit.
    #[arg(long)]
    setup_only: bool,

    /// Extra QEMU arguments, after `--`.
    #[arg(last = true, value_name = "QEMU-ARGS")]
    qemu_args: Vec<String>,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(secs) if secs > 0 => Ok(Duration::from_secs(secs)),
        _ => Err(format!(
            "expected a positive number of seconds, got {text:?}"
        )),
    }
}

/// `--efa-wire`, `--efa-wire-key` and `--efa-gid` as arguments of the
/// topology's p2plab-efa servers; refused before anything starts when the
/// topology has no EFA, already gives it a wire, or has two for one GID.
fn efa_server_args(cli: &Cli) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    if cli.efa_wire.is_none() && cli.efa_gid.is_none() {
        return Ok(Vec::new());
    }
    let paths = LabPaths::discover()?;
    let vars = Placeholders {
        run: PathBuf::from("@RUN@"),
        state: PathBuf::from("@STATE@"),
    };
    let topology = Topology::load(&paths.topology(&cli.config)?, &vars)?;
    let efas: Vec<_> = topology
        .servers
        .iter()
        .filter(|s| s.binary == "p2plab-efa")
        .collect();
    if efas.is_empty() {
        anyhow::bail!(
            "--efa-wire/--efa-gid: topology {} has no p2plab-efa server (try --config efa-tcp)",
            topology.name
        );
    }
    if cli.efa_gid.is_some() && efas.len() > 1 {
        anyhow::bail!(
            "--efa-gid: topology {} has {} EFAs; one GID cannot name them all",
            topology.name,
            efas.len()
        );
    }
    let mut args = Vec::new();
    if let Some(wire) = &cli.efa_wire {
        args.push(format!("--wire={wire}"));
    }
    if let Some(key) = &cli.efa_wire_key {
        // The servers do not run in our folder: an absolute path, and a
        // missing file said here.
        let key = key
            .canonicalize()
            .map_err(|e| anyhow::anyhow!("--efa-wire-key {}: {e}", key.display()))?;
        args.push(format!("--wire-key={}", key.display()));
    }
    if let Some(gid) = &cli.efa_gid {
        args.push(format!("--gid={gid}"));
    }
    let mut per_server = Vec::new();
    for efa in efas {
        let has = |flag: &str| {
            efa.args
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        };
        if cli.efa_wire.is_some() && has("--wire") {
            anyhow::bail!(
                "--efa-wire: {}'s wire is set by topology {} already",
                efa.id,
                topology.name
            );
        }
        if cli.efa_gid.is_some() && has("--gid") {
            anyhow::bail!(
                "--efa-gid: {}'s GID is set by topology {} already",
                efa.id,
                topology.name
            );
        }
        per_server.push((efa.id.clone(), args.clone()));
    }
    Ok(per_server)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("P2PLAB_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) if err.is::<p2plab_lab::lab::Interrupted>() => {
            eprintln!("p2plab: {err:#}");
            ExitCode::from(130)
        }
        Err(err) => {
            eprintln!("p2plab: error: {err:#}");
            ExitCode::from(LAB_FAILURE as u8)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let run_folder = |dir: PathBuf| -> anyhow::Result<PathBuf> {
        Ok(if dir.as_os_str() == "latest" {
            LabPaths::discover()?.runs.join("latest")
        } else {
            dir
        })
    };
    if let Some(dir) = cli.stop {
        stop_kept(&run_folder(dir)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(dir) = cli.attach {
        p2plab_lab::attach::attach(&run_folder(dir)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if cli.setup_only {
        let paths = LabPaths::discover()?;
        p2plab_lab::setup::ensure_guest_env(&paths)?;
        p2plab_lab::setup::ensure_overlay(&paths)?;
        // What a run of this topology would get (a forced KVM that cannot
        // run fails here, before any suite boots).
        let mut options = LabOptions::new(&cli.config, Mode::Interactive);
        options.accel = cli.accel;
        let accel = preview_accel(&paths, &options)?;
        eprintln!("p2plab: {}", accel.line);
        return Ok(ExitCode::SUCCESS);
    }
    let efa_args = efa_server_args(&cli)?;
    let mode = match (cli.keep, cli.exec) {
        (true, command) => Mode::Keep(command),
        (false, Some(command)) => Mode::Exec(command),
        (false, None) => Mode::Interactive,
    };
    let mut options = LabOptions::new(&cli.config, mode.clone());
    options.share = cli.share;
    options.kernel = cli.kernel;
    options.append = cli.append;
    options.timeout = cli.timeout.map(Timeout::Exactly);
    options.boot_timeout = cli.boot_timeout.map(Timeout::Exactly);
    options.accel = cli.accel;
    options.log_level = cli.log_level;
    if let Some(mode) = &cli.peer_path {
        options.every_server_args = vec!["--peer-path".to_owned(), mode.clone()];
    }
    options.guest_control = cli.guest_control.unwrap_or_default();
    options.server_args = efa_args;
    options.state = cli.state;
    options.verbose = cli.verbose;
    // The CLI reports complaints in the guest's kernel log but keeps the
    // command's exit status.
    options.kernel_log.enforce = false;
    options.qemu_args = cli.qemu_args;
    let outcome = Lab::run(&options)?;
    let run = outcome.run_dir.display();
    match mode {
        Mode::Interactive => {
            eprintln!("p2plab: logs in {run}");
            Ok(ExitCode::SUCCESS)
        }
        Mode::Exec(_) => {
            let status = outcome.status.unwrap_or(LAB_FAILURE);
            if cli.verbose || status != 0 {
                eprintln!("p2plab: guest command exited {status}; logs in {run}");
            }
            Ok(ExitCode::from(
                u8::try_from(status).unwrap_or(LAB_FAILURE as u8),
            ))
        }
        Mode::Keep(_) => {
            eprintln!("p2plab: the lab stays up; run folder {run}");
            eprintln!("  console:  scripts/run-vm --attach {run}  (Ctrl-] detaches)");
            eprintln!("  monitor:  socat - UNIX-CONNECT:{run}/monitor.sock");
            eprintln!("  stop:     scripts/run-vm --stop {run}");
            Ok(ExitCode::from(
                u8::try_from(outcome.status.unwrap_or(0)).unwrap_or(LAB_FAILURE as u8),
            ))
        }
    }
}
