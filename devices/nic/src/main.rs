//! `p2plab-nic`: serves the NIC-like device over vfio-user.
//!
//! Thin wiring: the device's flags and how its counters read; the device
//! is `p2plab_nic::nic_function`, the transport p2plab-vfio-user, and the
//! process plumbing p2plab-server.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use p2plab_fault::NicFaultSpec;
use p2plab_nic::regs::{DEFAULT_MTU, MAX_MTU, MIN_MTU};
use p2plab_nic::{nic_function, NicControl, NicIds, Wire, WireConfig};
use p2plab_peer::PeerRegistry;
use p2plab_server::control::{status_reply, ControlHandler, ControlRequest, ControlServer};
use p2plab_server::{Launch, SecondSignal, ServerArgs, ServerProcess};
use p2plab_vfio_user::{DmaSpace, Server};
use tracing::{info, info_span};

const PROCESS: ServerProcess = ServerProcess {
    name: "p2plab-nic",
    thread_prefix: "nic",
    counters_on_sigusr1: false,
    second_signal: SecondSignal::ExitNow,
    log_counters_every: Some(Duration::from_secs(30)),
    span: |args| info_span!("nic", socket = %args.socket.display()),
};

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-nic",
    version,
    about = "NIC-like PCIe DMA device (TX/RX descriptor rings, a wire to another NIC) served over vfio-user"
)]
struct Args {
    #[command(flatten)]
    server: ServerArgs,
    /// Where the wire goes: `loopback` (frames come back), `listen:PATH`
    /// (a unix socket the peer NIC connects to) or `connect:PATH`.
    #[arg(long, value_name = "WIRE", default_value = "loopback")]
    wire: WireConfig,
    /// Largest frame in bytes, 256..=1048576.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MTU, value_parser = parse_mtu)]
    mtu: u32,
    /// PCI device ID (hex).
    #[arg(long, value_name = "ID", default_value = "0x4e49", value_parser = parse_pci_id)]
    device_id: u16,
    /// Arm a wire fault from the start (repeatable), as `p2plab-ctl
    /// inject` takes it: `drop,count=1`, `delay=5ms`, `corrupt,prob=0.1`,
    /// `drop-irq,count=1`.
    #[arg(long = "inject", value_name = "SPEC", value_parser = parse_fault)]
    injections: Vec<NicFaultSpec>,
}

fn parse_mtu(text: &str) -> Result<u32, String> {
    let mtu: u32 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of bytes"))?;
    if !(MIN_MTU..=MAX_MTU).contains(&mtu) {
        return Err(format!("{mtu} is outside {MIN_MTU}..={MAX_MTU}"));
    }
    Ok(mtu)
}

fn parse_pci_id(text: &str) -> Result<u16, String> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    u16::from_str_radix(digits, 16).map_err(|_| format!("{text:?} is not a 16-bit hex ID"))
}

fn parse_fault(text: &str) -> Result<NicFaultSpec, String> {
    text.parse()
        .map_err(|e: p2plab_fault::SpecError| e.to_string())
}

/// Answers the control socket for the device.
struct Control {
    nic: NicControl,
    dma: DmaSpace,
    peers: Option<Arc<PeerRegistry>>,
}

impl ControlHandler for Control {
    fn handle(&self, request: &ControlRequest) -> Result<serde_json::Value, String> {
        match request {
            ControlRequest::Status => status_reply(
                &stats_json(&self.nic, &self.dma, self.peers.as_deref()),
                self.nic.report(),
                Some(self.nic.registers()),
            ),
            ControlRequest::Inject { spec } => {
                let spec = parse_fault(spec)?;
                let id = self.nic.inject(spec);
                Ok(serde_json::json!({ "id": id, "spec": spec.to_string() }))
            }
            ControlRequest::Clear => {
                self.nic.clear();
                Ok(serde_json::json!({}))
            }
            ControlRequest::Reset => {
                self.nic.reset();
                Ok(serde_json::json!({}))
            }
            ControlRequest::Trace { .. } => Err("trace is not handled here".into()),
        }
    }

    fn tracer(&self) -> Option<&p2plab_trace::Tracer> {
        Some(self.nic.tracer())
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    p2plab_server::run_main(&PROCESS, &args.server, |launch| run(&args, launch))
}

fn run(args: &Args, launch: Launch<'_>) -> Result<()> {
    let ids = NicIds {
        device_id: args.device_id,
        ..NicIds::default()
    };
    let wire = Wire::open(&args.wire).with_context(|| format!("--wire {:?}", args.wire))?;
    let dma = DmaSpace::new();
    let mut function = nic_function(&ids, wire, args.mtu, Arc::new(dma.clone()))?;
    let nic = function.model().nic().control();
    args.server.configure_tracer(nic.tracer())?;
    for spec in &args.injections {
        nic.inject(*spec);
    }
    // The NIC has no memory BAR to share; it joins the peer registry to
    // DMA straight into other servers' BARs (GPU VRAM, an NVMe CMB).
    let peers = args.server.start_peers(&dma, Vec::new())?;
    let _control = ControlServer::start(
        &args.server.control_path(),
        Arc::new(Control {
            nic: nic.clone(),
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
    let counters = nic.clone();
    let stats_peers = peers.clone();
    let running = launch.start(
        &server,
        Arc::new(move || stats_json(&counters, &dma, stats_peers.as_deref())),
    )?;
    info!(wire = ?args.wire, mtu = args.mtu, "p2plab-nic starting");
    let result = server.run(&mut function);
    drop(function);
    if let Some(peers) = &peers {
        peers.close();
    }
    let json = running.finish();
    info!(stats = %json, "p2plab-nic exiting");
    result?;
    Ok(())
}

/// Device counters plus which path the engines' DMA took (mmapped guest
/// memory, a peer's BAR directly, or DMA messages through the client).
fn stats_json(nic: &NicControl, dma: &DmaSpace, peers: Option<&PeerRegistry>) -> String {
    let d = dma.stats();
    nic.stats().to_json_with(&[
        ("link_up", u64::from(nic.link_up())),
        ("peer_path", u64::from(peers.is_some())),
        ("dma_peer_read_bytes", d.peer.read_bytes),
        ("dma_peer_write_bytes", d.peer.write_bytes),
        ("dma_peer_read_ops", d.peer.read_ops),
        ("dma_peer_write_ops", d.peer.write_ops),
        ("dma_mmap_read_bytes", d.mmap.read_bytes),
        ("dma_mmap_write_bytes", d.mmap.write_bytes),
        ("dma_message_read_bytes", d.message.read_bytes),
        ("dma_message_write_bytes", d.message.write_bytes),
        ("dma_local_read_bytes", d.local.read_bytes),
        ("dma_local_write_bytes", d.local.write_bytes),
    ])
}
