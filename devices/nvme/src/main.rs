//! `p2plab-nvme`: serves the NVMe controller over vfio-user.
//!
//! Wiring only: command line, logging, signals, the stats file. The
//! controller is `p2plab_nvme`, the PCI function `p2plab_nvme::server`, the
//! transport p2plab-vfio-user.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use p2plab_nvme::memory::{FileRegion, PmrSpec};
use p2plab_nvme::namespace::parse_size;
use p2plab_nvme::server::{nvme_function, PciIds};
use p2plab_nvme::RegionMemory;
use p2plab_nvme::{ControllerConfig, Namespace, NamespaceIds, NamespaceSpec, NvmeController};
use p2plab_vfio_user::{DmaSpace, Server, ServerConfig, ShutdownHandle};
use tracing::{error, info, info_span, warn};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-nvme",
    version,
    about = "NVMe controller with a Controller Memory Buffer, served over vfio-user \
             (attach with QEMU's vfio-user-pci)"
)]
struct Args {
    /// Unix socket to listen on (QEMU's vfio-user-pci connects here).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,

    /// A namespace; repeat for more (NSIDs 1, 2, ... in order).
    /// `file=PATH[,size=SIZE][,lba=512|4096]` uses a raw file or block
    /// device (a missing file is created sparse with SIZE);
    /// `mem,size=SIZE[,lba=512|4096]` uses memory. SIZE takes K/M/G/T
    /// suffixes; lba is the logical block size (default 512).
    #[arg(long = "namespace", value_name = "SPEC", required = true, value_parser = parse_namespace)]
    namespaces: Vec<NamespaceSpec>,

    /// Most I/O queue pairs the guest may create (1..=256); one MSI-X
    /// vector each, plus one for the admin queue.
    #[arg(long, value_name = "N", default_value_t = 64)]
    queues: u16,

    /// Largest queue in entries (CAP.MQES + 1), 2..=4096.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    queue_entries: u32,

    /// Maximum Data Transfer Size as a power of two of 4 KiB pages
    /// (7 = 512 KiB); 0 for no limit.
    #[arg(long, value_name = "N", default_value_t = 7)]
    mdts: u8,

    /// Controller Memory Buffer size (a multiple of 2M, e.g. 64M), or
    /// `off`. It is BAR2, which guests can map and use as P2P memory.
    #[arg(long, value_name = "SIZE|off", default_value = "64M", value_parser = parse_cmb_size)]
    cmb_size: u64,

    /// Persistent Memory Region backed by a file, as BAR4:
    /// `file=PATH[,size=SIZE]` (SIZE a power of two; a missing file is
    /// created sparse). Its contents survive restarts.
    #[arg(long, value_name = "SPEC")]
    pmr: Option<PmrSpec>,

    /// PCI vendor ID (hex).
    #[arg(long, value_name = "ID", default_value = "0x1b36", value_parser = parse_pci_id)]
    vendor_id: u16,

    /// PCI device ID (hex).
    #[arg(long, value_name = "ID", default_value = "0x00fe", value_parser = parse_pci_id)]
    device_id: u16,

    /// PCI subsystem vendor ID (hex); defaults to the vendor ID.
    #[arg(long, value_name = "ID", value_parser = parse_pci_id)]
    subsystem_vendor_id: Option<u16>,

    /// PCI subsystem ID (hex); defaults to the device ID.
    #[arg(long, value_name = "ID", value_parser = parse_pci_id)]
    subsystem_id: Option<u16>,

    /// Serial number (up to 20 ASCII characters). Namespace EUI64, NGUID
    /// and UUID derive from it. Default: derived from the socket file name
    /// and the namespace files, so it is stable across restarts and
    /// distinct between devices.
    #[arg(long, value_name = "TEXT")]
    serial: Option<String>,

    /// Model number (up to 40 ASCII characters).
    #[arg(long, value_name = "TEXT", default_value = "p2plab NVMe controller")]
    model: String,

    /// Firmware revision (up to 8 ASCII characters).
    #[arg(long, value_name = "TEXT", default_value = env!("CARGO_PKG_VERSION"))]
    firmware: String,

    /// Log filter (error, warn, info, debug, trace, or tracing directives).
    /// Without it RUST_LOG is used, else "info". Debug logs decoded
    /// register accesses and every command.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,

    /// Append the log to this file instead of stderr.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,

    /// Exit when the client disconnects instead of waiting for the next one.
    #[arg(long)]
    exit_on_disconnect: bool,

    /// Rewrite the controller's counters as JSON to this file every
    /// interval and at exit (SIGUSR1 also logs them).
    #[arg(long, value_name = "PATH")]
    stats_file: Option<PathBuf>,

    /// How often to rewrite the stats file, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    stats_interval_ms: u64,
}

fn parse_namespace(text: &str) -> Result<NamespaceSpec, String> {
    text.parse()
}

fn parse_cmb_size(text: &str) -> Result<u64, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" => Ok(0),
        _ => {
            let size = parse_size(text)?;
            if size % (2 << 20) != 0 {
                return Err(format!(
                    "{text} is not a multiple of 2M (Linux ignores such a CMB)"
                ));
            }
            Ok(size)
        }
    }
}

fn parse_pci_id(text: &str) -> Result<u16, String> {
    let t = text.trim();
    let hex = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u16::from_str_radix(hex, 16).map_err(|_| format!("{text:?} is not a 16-bit hex ID"))
}

/// The option a configuration field comes from.
fn option_for(field: &str) -> &'static str {
    match field {
        "serial" => "--serial",
        "model" => "--model",
        "firmware" => "--firmware",
        "max_io_queues" => "--queues",
        "max_queue_entries" => "--queue-entries",
        "mdts" => "--mdts",
        "cmb_size" => "--cmb-size",
        "pmr_size" => "--pmr",
        _ => "--namespace",
    }
}

fn default_serial(args: &Args) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
    };
    if let Some(name) = args.socket.file_name() {
        eat(name.as_encoded_bytes());
    }
    for spec in &args.namespaces {
        if let p2plab_nvme::namespace::Backing::File(path) = &spec.backing {
            eat(path.as_os_str().as_encoded_bytes());
        }
    }
    format!("P2PLAB{h:08X}")
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Before any thread exists, so every thread inherits the mask and only
    // the signal thread receives them.
    let signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("p2plab-nvme: cannot block signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = init_logging(&args) {
        eprintln!("p2plab-nvme: {e:#}");
        return ExitCode::FAILURE;
    }
    match run(&args, signals) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            if args.log_file.is_some() {
                eprintln!("p2plab-nvme: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn init_logging(args: &Args) -> Result<()> {
    let filter = match &args.log_level {
        Some(level) => EnvFilter::try_new(level)
            .with_context(|| format!("--log-level: invalid filter {level:?}"))?,
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

fn run(args: &Args, signals: Signals) -> Result<()> {
    let span = info_span!("nvme", socket = %args.socket.display());
    let _span = span.enter();
    let pmr = match &args.pmr {
        Some(spec) => {
            let region =
                FileRegion::open(&spec.path, spec.size).map_err(|e| anyhow!("--pmr: {e}"))?;
            info!(file = %region.describe(), bytes = region.size(), "persistent memory region");
            Some(Arc::new(region))
        }
        None => None,
    };
    let config = ControllerConfig {
        serial: args.serial.clone().unwrap_or_else(|| default_serial(args)),
        model: args.model.clone(),
        firmware: args.firmware.clone(),
        pci_vendor_id: args.vendor_id,
        pci_subsystem_vendor_id: args.subsystem_vendor_id.unwrap_or(args.vendor_id),
        max_io_queues: args.queues,
        max_queue_entries: args.queue_entries,
        mdts: args.mdts,
        cmb_size: args.cmb_size,
        pmr_size: pmr.as_ref().map_or(0, |p| p.size()),
        ..ControllerConfig::default()
    };
    config
        .validate()
        .map_err(|e| anyhow!("{}: {}", option_for(e.field), e.message))?;
    let ids = PciIds {
        vendor_id: args.vendor_id,
        device_id: args.device_id,
        subsystem_vendor_id: args.subsystem_vendor_id.unwrap_or(args.vendor_id),
        subsystem_id: args.subsystem_id.unwrap_or(args.device_id),
        ..PciIds::default()
    };
    let mut namespaces = Vec::new();
    for (i, spec) in args.namespaces.iter().enumerate() {
        let nsid = i as u32 + 1;
        let backend = spec.open(nsid).map_err(|e| anyhow!("--namespace: {e}"))?;
        info!(
            nsid,
            backing = %backend.describe(),
            bytes = backend.size(),
            block_size = spec.block_size,
            "namespace"
        );
        namespaces.push(Arc::new(Namespace::new(
            nsid,
            backend,
            spec.block_size,
            NamespaceIds::derive(&config.serial, nsid, config.ieee_oui),
        )));
    }

    let dma = DmaSpace::new();
    info!(
        serial = %config.serial,
        vendor_id = format_args!("{:#06x}", ids.vendor_id),
        device_id = format_args!("{:#06x}", ids.device_id),
        queues = config.max_io_queues,
        mdts = config.mdts,
        cmb_mib = config.cmb_size >> 20,
        "p2plab-nvme starting"
    );
    let mut function =
        nvme_function(config, &ids, namespaces, pmr, dma.clone()).map_err(|e| match e {
            p2plab_nvme::server::BuildError::Config(c) => {
                anyhow!("{}: {}", option_for(c.field), c.message)
            }
            other => anyhow!(other),
        })?;
    let controller = Arc::clone(function.model().controller());

    let mut server_config = ServerConfig::new(&args.socket);
    server_config.exit_on_disconnect = args.exit_on_disconnect;
    let server = Server::new(server_config, dma.clone())?;
    signals.spawn_waiter(
        server.shutdown_handle(),
        Arc::clone(&controller),
        dma.clone(),
    )?;
    let reporter = args
        .stats_file
        .as_ref()
        .map(|path| {
            StatsReporter::start(
                path.clone(),
                Duration::from_millis(args.stats_interval_ms.max(10)),
                Arc::clone(&controller),
                dma.clone(),
            )
        })
        .transpose()?;

    let result = server.run(&mut function);
    controller.flush_all();
    drop(function);
    let json = stats_json(&controller, &dma);
    if let Some(reporter) = reporter {
        reporter.stop(&json);
    }
    info!("p2plab-nvme exiting");
    result?;
    Ok(())
}

/// The controller's snapshot plus which path DMA took: mmapped guest
/// memory, messages through the client (peer BARs, fd-less ranges), or
/// served locally (the controller's own CMB).
fn stats_json(controller: &NvmeController, dma: &DmaSpace) -> String {
    let snapshot = controller.stats();
    let d = dma.stats();
    let local_read = snapshot.counters.cmb_read_bytes + d.local.read_bytes;
    let local_write = snapshot.counters.cmb_write_bytes + d.local.write_bytes;
    let mut value = match serde_json::to_value(snapshot) {
        Ok(v) => v,
        Err(e) => return format!("{{\"error\":\"{e}\"}}"),
    };
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "dma".into(),
            serde_json::json!({
                "dma_mmap_read_bytes": d.mmap.read_bytes,
                "dma_mmap_write_bytes": d.mmap.write_bytes,
                "dma_message_read_bytes": d.message.read_bytes,
                "dma_message_write_bytes": d.message.write_bytes,
                "dma_local_read_bytes": local_read,
                "dma_local_write_bytes": local_write,
            }),
        );
    }
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

/// Writes `json` to `path` atomically (temporary file, then rename), so a
/// reader never sees half a file.
fn write_stats_file(path: &Path, json: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp)?;
        f.write_all(json.as_bytes())?;
        f.write_all(b"\n")?;
    }
    std::fs::rename(&tmp, path)
}

/// Rewrites the stats file on a thread until stopped.
struct StatsReporter {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
    path: PathBuf,
}

impl StatsReporter {
    fn start(
        path: PathBuf,
        interval: Duration,
        controller: Arc<NvmeController>,
        dma: DmaSpace,
    ) -> Result<Self> {
        write_stats_file(&path, &stats_json(&controller, &dma))
            .with_context(|| format!("--stats-file {}", path.display()))?;
        let (stop, stopped) = mpsc::channel::<()>();
        let file = path.clone();
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("nvme-stats".into())
            .spawn(move || {
                let _span = span.enter();
                loop {
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    if let Err(e) = write_stats_file(&file, &stats_json(&controller, &dma)) {
                        warn!(error = %e, file = %file.display(), "cannot write stats");
                    }
                }
            })
            .context("cannot start the stats thread")?;
        Ok(Self { stop, thread, path })
    }

    fn stop(self, final_json: &str) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
        if let Err(e) = write_stats_file(&self.path, final_json) {
            warn!(error = %e, file = %self.path.display(), "cannot write final stats");
        }
    }
}

/// SIGTERM, SIGINT, SIGHUP (shut down) and SIGUSR1 (log the counters),
/// blocked in every thread and taken by one waiter thread.
struct Signals {
    set: libc::sigset_t,
}

impl Signals {
    fn block() -> std::io::Result<Self> {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set before anything reads it;
        // sigaddset and pthread_sigmask only use that initialised set.
        unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            let mut set = set.assume_init();
            for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
                libc::sigaddset(&mut set, signal);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(Self { set })
        }
    }

    fn spawn_waiter(
        self,
        shutdown: ShutdownHandle,
        controller: Arc<NvmeController>,
        dma: DmaSpace,
    ) -> Result<()> {
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name("nvme-signals".into())
            .spawn(move || {
                let _span = span.enter();
                loop {
                    let mut signal: libc::c_int = 0;
                    // SAFETY: `self.set` is an initialised signal set and
                    // `signal` a valid out-pointer for the call.
                    let rc = unsafe { libc::sigwait(&self.set, &mut signal) };
                    if rc != 0 {
                        warn!(errno = rc, "sigwait failed; signals ignored from now on");
                        return;
                    }
                    if signal == libc::SIGUSR1 {
                        info!(stats = %stats_json(&controller, &dma), "counters (SIGUSR1)");
                        continue;
                    }
                    info!(signal, "shutting down on signal");
                    shutdown.shutdown();
                    return;
                }
            })
            .context("cannot start the signal thread")?;
        Ok(())
    }
}
