//! `p2plab-gpu`: serves the GPU-like device over vfio-user.
//!
//! Thin wiring: command line, logging, signals and the stats file; the
//! device is `p2plab_gpu::gpu_function`, the transport p2plab-vfio-user.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use p2plab_gpu::cli::{parse_pci_id, parse_vram_size};
use p2plab_gpu::stats::write_stats_file;
use p2plab_gpu::{gpu_function, DmaSpaceMemory, GpuIds, StatsReader, Vram};
use p2plab_vfio_user::{DmaSpace, Server, ServerConfig, ShutdownHandle};
use tracing::{error, info, info_span, warn};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-gpu",
    version,
    about = "GPU-like PCIe device (sparse VRAM BAR, copy/fill/checksum engine) served over vfio-user"
)]
struct Args {
    /// Unix socket to listen on (QEMU's vfio-user-pci connects here).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// VRAM (BAR2) size: a power of two from 256M to 1T, e.g. 256M, 1G, 64G.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_vram_size)]
    vram_size: u64,
    /// PCI vendor ID (hex).
    #[arg(long, value_name = "ID", default_value = "0x5032", value_parser = parse_pci_id)]
    vendor_id: u16,
    /// PCI device ID (hex).
    #[arg(long, value_name = "ID", default_value = "0x4750", value_parser = parse_pci_id)]
    device_id: u16,
    /// PCI subsystem vendor ID (hex); defaults to the vendor ID.
    #[arg(long, value_name = "ID", value_parser = parse_pci_id)]
    subsystem_vendor_id: Option<u16>,
    /// PCI subsystem ID (hex); defaults to the device ID.
    #[arg(long, value_name = "ID", value_parser = parse_pci_id)]
    subsystem_id: Option<u16>,
    /// Log filter (error, warn, info, debug, trace, or tracing directives).
    /// Without it RUST_LOG is used, else "info".
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Append the log to this file instead of stderr.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    /// Exit when the client disconnects instead of waiting for the next one.
    #[arg(long)]
    exit_on_disconnect: bool,
    /// Rewrite device counters as JSON to this file periodically and at exit.
    #[arg(long, value_name = "PATH")]
    stats_file: Option<PathBuf>,
    /// How often to rewrite the stats file, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    stats_interval_ms: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Before any thread exists, so every thread inherits the mask and only
    // the signal thread sees SIGTERM/SIGINT/SIGHUP.
    let signals = match ShutdownSignals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("p2plab-gpu: cannot block signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = init_logging(&args) {
        eprintln!("p2plab-gpu: {e:#}");
        return ExitCode::FAILURE;
    }
    match run(&args, signals) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            if args.log_file.is_some() {
                eprintln!("p2plab-gpu: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn init_logging(args: &Args) -> Result<()> {
    let filter = match &args.log_level {
        Some(level) => EnvFilter::try_new(level)
            .with_context(|| format!("--log-level: invalid filter '{level}'"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_thread_names(true);
    match &args.log_file {
        Some(path) => {
            let file = File::options()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("--log-file {}", path.display()))?;
            builder
                .with_writer(Mutex::new(file))
                .with_ansi(false)
                .init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

fn run(args: &Args, signals: ShutdownSignals) -> Result<()> {
    let span = info_span!("gpu", socket = %args.socket.display());
    let _span = span.enter();
    let ids = GpuIds {
        vendor_id: args.vendor_id,
        device_id: args.device_id,
        subsystem_vendor_id: args.subsystem_vendor_id.unwrap_or(args.vendor_id),
        subsystem_id: args.subsystem_id.unwrap_or(args.device_id),
    };
    let vram = Vram::new(args.vram_size).context("cannot create the VRAM memfd")?;
    let dma = DmaSpace::new();
    let mut function = gpu_function(&ids, vram, Arc::new(DmaSpaceMemory(dma.clone())))?;
    function.model_mut().serve_vram_locally(dma.clone());
    let stats = function.model().gpu().stats_reader();

    let mut config = ServerConfig::new(&args.socket);
    config.exit_on_disconnect = args.exit_on_disconnect;
    let server = Server::new(config, dma.clone())?;
    signals.spawn_waiter(server.shutdown_handle())?;
    let reporter = args
        .stats_file
        .as_ref()
        .map(|path| {
            StatsReporter::start(
                path.clone(),
                Duration::from_millis(args.stats_interval_ms.max(10)),
                stats.clone(),
                dma.clone(),
            )
        })
        .transpose()?;

    info!(
        vendor_id = format_args!("{:#06x}", ids.vendor_id),
        device_id = format_args!("{:#06x}", ids.device_id),
        vram_mib = args.vram_size >> 20,
        "p2plab-gpu starting"
    );
    let result = server.run(&mut function);
    drop(function);

    let json = stats_json(&stats, &dma);
    if let Some(reporter) = reporter {
        reporter.stop(&json);
    }
    info!(stats = %json, "p2plab-gpu exiting");
    result?;
    Ok(())
}

/// Device counters plus which path the engine's DMA took (mmapped guest
/// memory, DMA messages through the client, or our own VRAM window).
fn stats_json(stats: &StatsReader, dma: &DmaSpace) -> String {
    let d = dma.stats();
    stats.snapshot().to_json_with(&[
        ("dma_mmap_read_bytes", d.mmap.read_bytes),
        ("dma_mmap_write_bytes", d.mmap.write_bytes),
        ("dma_message_read_bytes", d.message.read_bytes),
        ("dma_message_write_bytes", d.message.write_bytes),
        ("dma_local_read_bytes", d.local.read_bytes),
        ("dma_local_write_bytes", d.local.write_bytes),
    ])
}

/// Rewrites the stats file on a thread until stopped.
struct StatsReporter {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
    path: PathBuf,
}

impl StatsReporter {
    fn start(path: PathBuf, interval: Duration, stats: StatsReader, dma: DmaSpace) -> Result<Self> {
        write_stats_file(&path, &stats_json(&stats, &dma))
            .with_context(|| format!("--stats-file {}", path.display()))?;
        let (stop, stopped) = mpsc::channel::<()>();
        let file = path.clone();
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("gpu-stats".into())
            .spawn(move || {
                let _span = span.enter();
                let mut last_logged = String::new();
                let mut last_log = Instant::now();
                loop {
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let json = stats_json(&stats, &dma);
                    if let Err(e) = write_stats_file(&file, &json) {
                        warn!(error = %e, file = %file.display(), "cannot write stats");
                    }
                    if json != last_logged && last_log.elapsed() >= Duration::from_secs(30) {
                        info!(stats = %json, "counters");
                        last_logged = json;
                        last_log = Instant::now();
                    }
                }
            })
            .context("cannot start the stats thread")?;
        Ok(Self { stop, thread, path })
    }

    fn stop(self, final_json: &str) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
        write_final(&self.path, final_json);
    }
}

fn write_final(path: &Path, json: &str) {
    if let Err(e) = write_stats_file(path, json) {
        warn!(error = %e, file = %path.display(), "cannot write final stats");
    }
}

/// SIGTERM, SIGINT and SIGHUP, blocked in every thread and taken by one
/// waiter thread that asks the server to shut down.
struct ShutdownSignals {
    set: libc::sigset_t,
}

impl ShutdownSignals {
    fn block() -> std::io::Result<Self> {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set; sigaddset and
        // pthread_sigmask only read/write that initialised set.
        unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            let mut set = set.assume_init();
            for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, signal);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(Self { set })
        }
    }

    fn spawn_waiter(self, shutdown: ShutdownHandle) -> Result<()> {
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name("gpu-signals".into())
            .spawn(move || {
                let _span = span.enter();
                let mut requested = false;
                loop {
                    let mut signal: libc::c_int = 0;
                    // SAFETY: sigwait reads our initialised set and writes
                    // the signal number into a live c_int.
                    let rc = unsafe { libc::sigwait(&self.set, &mut signal) };
                    if rc != 0 {
                        continue;
                    }
                    if requested {
                        // A second signal: the user really wants us gone.
                        warn!(signal, "second signal, exiting now");
                        std::process::exit(1);
                    }
                    info!(signal, "signal received, shutting down");
                    requested = true;
                    shutdown.shutdown();
                }
            })
            .context("cannot start the signal thread")?;
        Ok(())
    }
}
