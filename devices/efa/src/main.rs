//! `p2plab-efa`: serves the emulated AWS EFA over vfio-user.
//!
//! Thin wiring: the device's flags (its attributes, its wire, faults) and
//! how its PCI function is built; the device is `p2plab_efa::efa_function`,
//! the rest (control socket, stats, shutdown order) p2plab-server's
//! `serve_device`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use anyhow::Result;
use clap::Parser;
use p2plab_efa::attrs::{format_gid, parse_gid, DeviceAttrs};
use p2plab_efa::fault::EfaFaultSpec;
use p2plab_efa::{
    efa_function, EfaOptions, Link, NoLink, Wire, WireConfig, WireLink, WireOptions, DEFAULT_IDS,
};
use p2plab_server::{Launch, PciIdArgs, SecondSignal, ServerArgs, ServerProcess};
use p2plab_vfio_user::DmaSpace;
use tracing::{info, info_span};

const PROCESS: ServerProcess = ServerProcess {
    name: "p2plab-efa",
    thread_prefix: "efa",
    counters_on_sigusr1: false,
    second_signal: SecondSignal::ExitNow,
    log_counters_every: Some(Duration::from_secs(30)),
    span: |args| info_span!("efa", socket = %args.socket.display()),
};

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-efa",
    version,
    about = "An emulated AWS Elastic Fabric Adapter (1d0f:efa1) for the unmodified efa driver, rdma-core and perftest, served over vfio-user"
)]
struct Args {
    #[command(flatten)]
    server: ServerArgs,
    /// The port's GID (an IPv6 address), the device's fabric address.
    /// Default: fd00:7032:efa0:: plus a hash of the --socket file name, so
    /// the devices of one lab differ.
    #[arg(long, value_name = "GID", value_parser = parse_gid)]
    gid: Option<[u8; 16]>,
    /// Node GUID (decimal or 0x hex). Default: the GID's low 64 bits.
    #[arg(long, value_name = "N", value_parser = parse_u64)]
    guid: Option<u64>,
    /// Largest SEND / UD message in bytes (the port's max_msg_sz).
    #[arg(long, value_name = "BYTES", default_value_t = DeviceAttrs::default().mtu)]
    mtu: u32,
    /// Queue pairs (a power of two up to 256).
    #[arg(long, value_name = "N", default_value_t = DeviceAttrs::default().max_qp)]
    max_qp: u32,
    /// Completion queues (up to 512).
    #[arg(long, value_name = "N", default_value_t = DeviceAttrs::default().max_cq)]
    max_cq: u32,
    /// Memory regions.
    #[arg(long, value_name = "N", default_value_t = DeviceAttrs::default().max_mr)]
    max_mr: u32,
    /// Protection domains.
    #[arg(long, value_name = "N", default_value_t = DeviceAttrs::default().max_pd)]
    max_pd: u32,
    /// Address handles.
    #[arg(long, value_name = "N", default_value_t = DeviceAttrs::default().max_ah)]
    max_ah: u32,
    /// Event queues (0: no completion events, one MSI-X vector).
    #[arg(long, value_name = "N", default_value_t = DeviceAttrs::default().max_eq)]
    max_eq: u32,
    /// Firmware version reported to the driver (decimal or 0x hex).
    #[arg(long, value_name = "N", value_parser = parse_u32, default_value = "0x10000")]
    fw_version: u32,
    /// Largest RDMA read or write of one WQE, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DeviceAttrs::default().max_rdma_size)]
    max_rdma_size: u32,
    /// Milliseconds between AENQ keep-alive events (0: none).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    keep_alive_ms: u64,
    /// The fabric port's wire (p2plab-wire): `loopback`, `listen:PATH` or
    /// `connect:PATH` (a unix socket; the other EFA takes the other end),
    /// or `tcp-listen:ADDR:PORT` / `tcp-connect:HOST:PORT` (another lab,
    /// on this host or another; needs --wire-key). Without it the port
    /// has no peer: the link stays down.
    #[arg(long, value_name = "WIRE")]
    wire: Option<WireConfig>,
    /// The pre-shared key file of a TCP wire: the same file on both ends,
    /// mode 0600 and owned by the server's uid (`openssl rand -hex 32`).
    /// The peer proves it holds the key before it gets the link.
    #[arg(long, value_name = "FILE")]
    wire_key: Option<std::path::PathBuf>,
    /// PCI identity (default 1d0f:efa1).
    #[command(flatten)]
    ids: PciIdArgs,
    /// Arm a fault from the start (repeatable), as `p2plab-ctl inject`
    /// takes it: `drop,prob=0.1`, `reorder`, `corrupt,count=1`,
    /// `delay=5ms`, `admin-error=5,opcode=9`, `cq-error=12`, `link-down`,
    /// `drop-irq,count=1`.
    #[arg(long = "inject", value_name = "SPEC", value_parser = parse_fault)]
    injections: Vec<EfaFaultSpec>,
}

fn parse_u64(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("{text:?} is not a number"))
}

fn parse_u32(text: &str) -> Result<u32, String> {
    let n = parse_u64(text)?;
    u32::try_from(n).map_err(|_| format!("{text} is over 32 bits"))
}

fn parse_fault(text: &str) -> Result<EfaFaultSpec, String> {
    text.parse()
        .map_err(|e: p2plab_fault::SpecError| e.to_string())
}

/// FNV-1a of `bytes`: a stable hash for default addresses.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Args {
    /// The attributes the flags ask for (checked by the model).
    fn attrs(&self) -> DeviceAttrs {
        let name = self
            .server
            .socket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let hash = fnv1a(name.as_bytes());
        let gid = self.gid.unwrap_or_else(|| {
            let mut gid = [
                0xfd, 0x00, 0x70, 0x32, 0xef, 0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ];
            gid[8..].copy_from_slice(&hash.to_be_bytes());
            gid
        });
        let mut low = [0u8; 8];
        low.copy_from_slice(&gid[8..]);
        DeviceAttrs {
            gid,
            guid: self.guid.unwrap_or(u64::from_be_bytes(low)),
            mtu: self.mtu,
            max_qp: self.max_qp,
            max_cq: self.max_cq,
            max_mr: self.max_mr,
            max_pd: self.max_pd,
            max_ah: self.max_ah,
            max_eq: self.max_eq,
            fw_version: self.fw_version,
            max_rdma_size: self.max_rdma_size,
            ..DeviceAttrs::default()
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = args.attrs().validate() {
        eprintln!("p2plab-efa: {e}");
        return ExitCode::from(2);
    }
    p2plab_server::run_main(&PROCESS, &args.server, |launch| run(&args, launch))
}

fn run(args: &Args, launch: Launch<'_>) -> Result<()> {
    let ids = args.ids.ids(DEFAULT_IDS);
    let attrs = args.attrs();
    let options = EfaOptions {
        keep_alive: (args.keep_alive_ms > 0).then(|| Duration::from_millis(args.keep_alive_ms)),
    };
    let link: Arc<dyn Link> = match &args.wire {
        None => Arc::new(NoLink::default()),
        Some(config) => {
            let options = WireOptions {
                allowed_uids: args.server.allow_uid.clone(),
                thread_name: "efa-wire".into(),
                key_file: args.wire_key.clone(),
                ..WireOptions::default()
            };
            let wire = Wire::open(config, options).with_context(|| format!("--wire {config}"))?;
            Arc::new(WireLink::new(wire))
        }
    };
    let dma = DmaSpace::new();
    info!(gid = %format_gid(&attrs.gid), guid = format_args!("{:#x}", attrs.guid), "p2plab-efa starting");
    let function = efa_function(&ids, attrs, options, Arc::new(dma.clone()), link)?;
    let injections: Vec<String> = args.injections.iter().map(|s| s.to_string()).collect();
    p2plab_server::serve_device(&args.server, launch, dma, function, &injections)
}
