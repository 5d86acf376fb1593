//! `p2plab-nvme`: serves the NVMe controller over vfio-user.
//!
//! Wiring only: the controller's flags and how its PCI function is
//! built. The controller is `p2plab_nvme`, the PCI function
//! `p2plab_nvme::server`, and the rest (peers, control socket, stats,
//! shutdown order) p2plab-server's `serve_device`.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use clap::Parser;
use p2plab_dma::RegionMemory;
use p2plab_nvme::fault::FaultSpec;
use p2plab_nvme::memory::{FileRegion, PmrSpec};
use p2plab_nvme::namespace::{parse_size, Caching};
use p2plab_nvme::server::{nvme_function, DEFAULT_IDS};
use p2plab_nvme::{ControllerConfig, Namespace, NamespaceIds, NamespaceSpec};
use p2plab_server::{Launch, PciIdArgs, SecondSignal, ServerArgs, ServerProcess};
use p2plab_vfio_user::DmaSpace;
use tracing::{info, info_span};

const PROCESS: ServerProcess = ServerProcess {
    name: "p2plab-nvme",
    thread_prefix: "nvme",
    counters_on_sigusr1: true,
    // The shutdown flushes the namespaces; let it finish.
    second_signal: SecondSignal::Ignore,
    log_counters_every: None,
    span: |args| info_span!("nvme", socket = %args.socket.display()),
};

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-nvme",
    version,
    about = "NVMe controller with a Controller Memory Buffer, served over vfio-user \
             (attach with QEMU's vfio-user-pci)",
    mut_arg("log_level", |arg| arg.help(
        "Log filter (error, warn, info, debug, trace, or tracing directives). \
         Without it RUST_LOG is used, else \"info\". Debug logs decoded \
         register accesses and every command"
    )),
    mut_arg("stats_file", |arg| arg.help(
        "Rewrite the controller's counters as JSON to this file every \
         interval and at exit (SIGUSR1 also logs them)"
    ))
)]
struct Args {
    #[command(flatten)]
    server: ServerArgs,

    /// A namespace; repeat for more (NSIDs 1, 2, ... in order).
    /// `file=PATH[,size=SIZE][,lba=512|4096]` uses a raw file or block
    /// device (a missing file is created sparse with SIZE);
    /// `mem,size=SIZE[,lba=512|4096]` uses memory. SIZE takes K/M/G/T
    /// suffixes; lba is the logical block size (default 512).
    #[arg(long = "namespace", value_name = "SPEC", required = true, value_parser = parse_namespace)]
    namespaces: Vec<NamespaceSpec>,

    /// How file namespaces reach their blocks: `page` through the host's
    /// page cache (like QEMU's cache=writeback), `direct` with O_DIRECT
    /// (like cache=none). Benchmarks against QEMU's nvme must use the same
    /// on both sides.
    #[arg(long, value_name = "page|direct", default_value = "page")]
    caching: Caching,

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

    /// PCI identity (default 1b36:00fe); Identify's VID and SSVID follow
    /// the vendor IDs.
    #[command(flatten)]
    ids: PciIdArgs,

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

    /// Arm a fault injection from the start (repeatable), as
    /// `p2plab-ctl inject` takes it: e.g. `status=0x281,dnr,count=3,opcode=read`,
    /// `media-error:lba=100-199`, `timeout,count=1,opcode=read`,
    /// `latency=5ms:opcode=write`, `cfs,opcode=write`, `drop-irq,count=1`,
    /// `corrupt:lba=8-15`, `ns-not-ready`, `peer-fail,count=1`; at most
    /// 128 armed at once. See docs/user-guide/faults.md.
    #[arg(long = "inject", value_name = "SPEC", value_parser = parse_fault)]
    injections: Vec<FaultSpec>,
}

fn parse_fault(text: &str) -> Result<FaultSpec, String> {
    text.parse()
        .map_err(|e: p2plab_nvme::fault::SpecError| e.to_string())
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
    if let Some(name) = args.server.socket.file_name() {
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
    p2plab_server::run_main(&PROCESS, &args.server, |launch| run(&args, launch))
}

fn run(args: &Args, launch: Launch<'_>) -> Result<()> {
    let pmr = match &args.pmr {
        Some(spec) => {
            let region =
                FileRegion::open(&spec.path, spec.size).map_err(|e| anyhow!("--pmr: {e}"))?;
            info!(file = %region.describe(), bytes = region.size(), "persistent memory region");
            Some(Arc::new(region))
        }
        None => None,
    };
    let ids = args.ids.ids(DEFAULT_IDS);
    let config = ControllerConfig {
        serial: args.serial.clone().unwrap_or_else(|| default_serial(args)),
        model: args.model.clone(),
        firmware: args.firmware.clone(),
        pci_vendor_id: ids.vendor_id,
        pci_subsystem_vendor_id: ids.subsystem_vendor_id,
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
    let mut namespaces = Vec::new();
    for (i, spec) in args.namespaces.iter().enumerate() {
        let nsid = i as u32 + 1;
        let backend = spec
            .open(nsid, args.caching)
            .map_err(|e| anyhow!("--namespace: {e}"))?;
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
    let function =
        nvme_function(config, &ids, namespaces, pmr, dma.clone()).map_err(|e| match e {
            p2plab_nvme::server::BuildError::Config(c) => {
                anyhow!("{}: {}", option_for(c.field), c.message)
            }
            other => anyhow!(other),
        })?;
    let injections: Vec<String> = args.injections.iter().map(|s| s.to_string()).collect();
    p2plab_server::serve_device(&args.server, launch, dma, function, &injections)
}
