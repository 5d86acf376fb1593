//! `p2plab-vm`: the lab launcher behind `scripts/run-vm`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use p2plab_lab::accel::{AccelRequest, Timeout};
use p2plab_lab::lab::{preview_accel, stop_kept, LAB_FAILURE};
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
    options.accel = cli.accel;
    options.log_level = cli.log_level;
    if let Some(mode) = &cli.peer_path {
        options.every_server_args = vec!["--peer-path".to_owned(), mode.clone()];
    }
    options.guest_control = cli.guest_control.unwrap_or_default();
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
