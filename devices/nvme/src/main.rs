//! `p2plab-nvme`: serves the NVMe controller over vfio-user.
//!
//! Wiring only: the controller's flags and how its counters read. The
//! controller is `p2plab_nvme`, the PCI function `p2plab_nvme::server`, the
//! transport p2plab-vfio-user, and the process plumbing (common flags,
//! logging, signals, stats file) p2plab-server.

use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use p2plab_dma::RegionMemory;
use p2plab_nvme::fault::FaultSpec;
use p2plab_nvme::memory::{FileRegion, PmrSpec};
use p2plab_nvme::namespace::{parse_size, Caching};
use p2plab_nvme::server::{nvme_function, PciIds, CMB_BAR};
use p2plab_nvme::{ControllerConfig, Namespace, NamespaceIds, NamespaceSpec, NvmeController};
use p2plab_peer::{Export, PeerRegistry};
use p2plab_server::control::{ControlHandler, ControlRequest, ControlServer};
use p2plab_server::{Launch, SecondSignal, ServerArgs, ServerProcess};
use p2plab_vfio_user::{DmaSpace, Server};
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

    /// Arm a fault injection from the start (repeatable), as
    /// `p2plab-ctl inject` takes it: e.g. `status=0x281,dnr,count=3,opcode=read`,
    /// `media-error:lba=100-199`, `timeout,count=1,opcode=read`,
    /// `latency=5ms:opcode=write`, `cfs,opcode=write`, `drop-irq,count=1`,
    /// `corrupt:lba=8-15`, `ns-not-ready`, `peer-fail,count=1`. See README
    /// "Breaking things on purpose".
    #[arg(long = "inject", value_name = "SPEC", value_parser = parse_fault)]
    injections: Vec<FaultSpec>,
}

fn parse_fault(text: &str) -> Result<FaultSpec, String> {
    text.parse()
        .map_err(|e: p2plab_nvme::fault::SpecError| e.to_string())
}

/// Answers the control socket for the controller.
struct NvmeControl {
    controller: Arc<NvmeController>,
    dma: DmaSpace,
    peers: Option<Arc<PeerRegistry>>,
}

impl ControlHandler for NvmeControl {
    fn handle(&self, request: &ControlRequest) -> Result<serde_json::Value, String> {
        let c = &self.controller;
        match request {
            ControlRequest::Status => {
                let mut value = stats_value(c, &self.dma, self.peers.as_deref());
                if let Some(object) = value.as_object_mut() {
                    let faults =
                        serde_json::to_value(c.fault_report()).map_err(|e| e.to_string())?;
                    object.insert("faults".into(), faults);
                }
                Ok(value)
            }
            ControlRequest::Inject { spec } => {
                let spec: FaultSpec = spec
                    .parse()
                    .map_err(|e: p2plab_nvme::fault::SpecError| e.to_string())?;
                let id = c.inject(spec);
                Ok(serde_json::json!({ "id": id, "spec": spec.to_string() }))
            }
            ControlRequest::Clear => {
                c.clear_faults();
                Ok(serde_json::json!({}))
            }
            ControlRequest::Reset => {
                c.surprise_reset();
                Ok(serde_json::json!({}))
            }
            // Answered by the control server from `tracer`.
            ControlRequest::Trace { .. } => Err("trace is not handled here".into()),
        }
    }

    fn tracer(&self) -> Option<&p2plab_trace::Tracer> {
        Some(self.controller.tracer())
    }
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
    let mut function =
        nvme_function(config, &ids, namespaces, pmr, dma.clone()).map_err(|e| match e {
            p2plab_nvme::server::BuildError::Config(c) => {
                anyhow!("{}: {}", option_for(c.field), c.message)
            }
            other => anyhow!(other),
        })?;
    let controller = Arc::clone(function.model().controller());
    // Peers DMA into our CMB through its memfd, at the address the guest
    // gives the CMB BAR (pushed to them before the config write completes).
    let mut exports = Vec::new();
    if let Some(cmb) = function.model().cmb_memory() {
        exports.push(Export {
            bar: CMB_BAR,
            fd: cmb
                .as_fd()
                .try_clone_to_owned()
                .context("cannot share the CMB memfd")?,
            size: cmb.size(),
        });
    }
    let peers = args.server.start_peers(&dma, exports)?;
    if let Some(peers) = &peers {
        let peers = Arc::clone(peers);
        function
            .model_mut()
            .on_cmb_placement(move |addr| peers.set_placement(CMB_BAR, addr));
    }
    args.server.configure_tracer(controller.tracer())?;
    for spec in &args.injections {
        controller.inject(*spec);
    }
    let _control = ControlServer::start(
        &args.server.control_path(),
        Arc::new(NvmeControl {
            controller: Arc::clone(&controller),
            dma: dma.clone(),
            peers: peers.clone(),
        }),
    )
    .map_err(|e| {
        anyhow!(
            "--control-socket {}: {e}",
            args.server.control_path().display()
        )
    })?;

    let server = Server::new(args.server.server_config(), dma.clone())?;
    let counters = {
        let controller = Arc::clone(&controller);
        let peers = peers.clone();
        Arc::new(move || stats_json(&controller, &dma, peers.as_deref()))
    };
    let running = launch.start(&server, counters)?;

    let result = server.run(&mut function);
    controller.flush_all();
    drop(function);
    // Peers drop their windows on our CMB as the connections close.
    if let Some(peers) = &peers {
        peers.close();
    }
    running.finish();
    info!("p2plab-nvme exiting");
    result?;
    Ok(())
}

/// The controller's snapshot plus which path DMA took: mmapped guest
/// memory, messages through the client (peer BARs, fd-less ranges), or
/// served locally (the controller's own CMB).
fn stats_json(controller: &NvmeController, dma: &DmaSpace, peers: Option<&PeerRegistry>) -> String {
    serde_json::to_string_pretty(&stats_value(controller, dma, peers)).unwrap_or_default()
}

fn stats_value(
    controller: &NvmeController,
    dma: &DmaSpace,
    peers: Option<&PeerRegistry>,
) -> serde_json::Value {
    let inbound = peers.map(|p| p.inbound(CMB_BAR)).unwrap_or_default();
    let snapshot = controller.stats();
    let d = dma.stats();
    let local_read = snapshot.counters.cmb_read_bytes + d.local.read_bytes;
    let local_write = snapshot.counters.cmb_write_bytes + d.local.write_bytes;
    let mut value = match serde_json::to_value(snapshot) {
        Ok(v) => v,
        Err(e) => return serde_json::json!({ "error": e.to_string() }),
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
                "dma_peer_read_bytes": d.peer.read_bytes,
                "dma_peer_write_bytes": d.peer.write_bytes,
                "dma_peer_read_ops": d.peer.read_ops,
                "dma_peer_write_ops": d.peer.write_ops,
                "peer_inbound_write_bytes": inbound.written,
                "peer_inbound_read_bytes": inbound.read,
                "peer_path": u64::from(peers.is_some()),
                "peer_placement_changes": peers.map_or(0, |p| p.placement_changes()),
                "peer_windows": dma
                    .peer_windows()
                    .iter()
                    .map(|(gpa, len)| serde_json::json!({ "gpa": gpa, "len": len }))
                    .collect::<Vec<_>>(),
            }),
        );
    }
    value
}
