//! `p2plab-gpu`: serves the GPU-like device over vfio-user.
//!
//! Thin wiring: the device's flags and how its counters read; the device
//! is `p2plab_gpu::gpu_function`, the transport p2plab-vfio-user, and the
//! process plumbing (common flags, logging, signals, stats file)
//! p2plab-server.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use p2plab_gpu::cli::{parse_pci_id, parse_vram_size};
use p2plab_gpu::regs::VRAM_BAR;
use p2plab_gpu::{check_spec, gpu_function, FaultControl, GpuFaultSpec, GpuIds, StatsReader, Vram};
use p2plab_peer::{Export, PeerRegistry};
use p2plab_server::control::{status_reply, ControlHandler, ControlRequest, ControlServer};
use p2plab_server::{Launch, SecondSignal, ServerArgs, ServerProcess};
use p2plab_vfio_user::{DmaSpace, Server};
use tracing::{info, info_span};

const PROCESS: ServerProcess = ServerProcess {
    name: "p2plab-gpu",
    thread_prefix: "gpu",
    counters_on_sigusr1: false,
    second_signal: SecondSignal::ExitNow,
    log_counters_every: Some(Duration::from_secs(30)),
    span: |args| info_span!("gpu", socket = %args.socket.display()),
};

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-gpu",
    version,
    about = "GPU-like PCIe device (sparse VRAM BAR, copy/fill/checksum engine) served over vfio-user"
)]
struct Args {
    #[command(flatten)]
    server: ServerArgs,
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
    /// Arm a fault injection from the start (repeatable), as
    /// `p2plab-ctl inject` takes it: `job-error=0x06,count=1[,opcode=fill]`,
    /// `hang,count=1`, `drop-irq,count=1`, `vram-error=0x100000-0x1fffff`.
    /// See README "Breaking things on purpose".
    #[arg(long = "inject", value_name = "SPEC", value_parser = parse_fault)]
    injections: Vec<GpuFaultSpec>,
}

fn parse_fault(text: &str) -> Result<GpuFaultSpec, String> {
    let spec: GpuFaultSpec = text
        .parse()
        .map_err(|e: p2plab_gpu::SpecError| e.to_string())?;
    check_spec(&spec)?;
    Ok(spec)
}

/// Answers the control socket for the device.
struct GpuControl {
    faults: FaultControl,
    stats: StatsReader,
    dma: DmaSpace,
    peers: Option<Arc<PeerRegistry>>,
}

impl ControlHandler for GpuControl {
    fn handle(&self, request: &ControlRequest) -> Result<serde_json::Value, String> {
        match request {
            ControlRequest::Status => status_reply(
                &stats_json(&self.stats, &self.dma, self.peers.as_deref()),
                self.faults.report(),
                Some(self.faults.registers()),
            ),
            ControlRequest::Inject { spec } => {
                let spec = parse_fault(spec)?;
                let id = self.faults.inject(spec)?;
                Ok(serde_json::json!({ "id": id, "spec": spec.to_string() }))
            }
            ControlRequest::Clear => {
                self.faults.clear();
                Ok(serde_json::json!({}))
            }
            ControlRequest::Reset => {
                self.faults.reset();
                Ok(serde_json::json!({}))
            }
            // Answered by the control server from `tracer`.
            ControlRequest::Trace { .. } => Err("trace is not handled here".into()),
        }
    }

    fn tracer(&self) -> Option<&p2plab_trace::Tracer> {
        Some(self.faults.tracer())
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    p2plab_server::run_main(&PROCESS, &args.server, |launch| run(&args, launch))
}

fn run(args: &Args, launch: Launch<'_>) -> Result<()> {
    let ids = GpuIds {
        vendor_id: args.vendor_id,
        device_id: args.device_id,
        subsystem_vendor_id: args.subsystem_vendor_id.unwrap_or(args.vendor_id),
        subsystem_id: args.subsystem_id.unwrap_or(args.device_id),
    };
    let vram = Vram::new(args.vram_size).context("cannot create the VRAM memfd")?;
    let dma = DmaSpace::new();
    // The engine reaches guest memory through the transport's DMA space
    // (mmapped guest RAM, messages for peer BARs, our own VRAM window).
    let vram_fd = vram
        .fd()
        .try_clone_to_owned()
        .context("cannot share the VRAM memfd")?;
    let mut function = gpu_function(&ids, vram, Arc::new(dma.clone()))?;
    function.model_mut().serve_vram_locally(dma.clone());
    // Peers write into VRAM through its memfd, at the address the guest
    // gives BAR2 (pushed to them before the config write completes).
    let peers = args.server.start_peers(
        &dma,
        vec![Export {
            bar: VRAM_BAR,
            fd: vram_fd,
            size: args.vram_size,
        }],
    )?;
    if let Some(peers) = &peers {
        let peers = Arc::clone(peers);
        function
            .model_mut()
            .on_vram_placement(move |addr| peers.set_placement(VRAM_BAR, addr));
    }
    let stats = function.model().gpu().stats_reader();
    let faults = function.model().gpu().fault_control();
    args.server.configure_tracer(faults.tracer())?;
    for spec in &args.injections {
        faults.inject(*spec).map_err(|e| anyhow!("--inject: {e}"))?;
    }
    let _control = ControlServer::start(
        &args.server.control_path(),
        Arc::new(GpuControl {
            faults,
            stats: stats.clone(),
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
    let running = {
        let peers = peers.clone();
        launch.start(
            &server,
            Arc::new(move || stats_json(&stats, &dma, peers.as_deref())),
        )?
    };

    info!(
        vendor_id = format_args!("{:#06x}", ids.vendor_id),
        device_id = format_args!("{:#06x}", ids.device_id),
        vram_mib = args.vram_size >> 20,
        "p2plab-gpu starting"
    );
    let result = server.run(&mut function);
    drop(function);
    // Peers drop their windows on our VRAM as the connections close.
    if let Some(peers) = &peers {
        peers.close();
    }

    let json = running.finish();
    info!(stats = %json, "p2plab-gpu exiting");
    result?;
    Ok(())
}

/// Device counters plus which path the engine's DMA took (mmapped guest
/// memory, DMA messages through the client, our own VRAM window, or a
/// peer's BAR directly), and the bytes peers moved into and out of VRAM
/// directly (`peer_inbound_*`).
fn stats_json(stats: &StatsReader, dma: &DmaSpace, peers: Option<&PeerRegistry>) -> String {
    let d = dma.stats();
    let inbound = peers.map(|p| p.inbound(VRAM_BAR)).unwrap_or_default();
    stats.snapshot().to_json_with(&[
        ("dma_peer_read_bytes", d.peer.read_bytes),
        ("dma_peer_write_bytes", d.peer.write_bytes),
        ("dma_peer_read_ops", d.peer.read_ops),
        ("dma_peer_write_ops", d.peer.write_ops),
        ("peer_inbound_write_bytes", inbound.written),
        ("peer_inbound_read_bytes", inbound.read),
        ("peer_path", u64::from(peers.is_some())),
        (
            "peer_placement_changes",
            peers.map_or(0, |p| p.placement_changes()),
        ),
        ("dma_mmap_read_bytes", d.mmap.read_bytes),
        ("dma_mmap_write_bytes", d.mmap.write_bytes),
        ("dma_message_read_bytes", d.message.read_bytes),
        ("dma_message_write_bytes", d.message.write_bytes),
        ("dma_local_read_bytes", d.local.read_bytes),
        ("dma_local_write_bytes", d.local.write_bytes),
    ])
}
