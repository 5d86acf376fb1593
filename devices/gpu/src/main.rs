//! `p2plab-gpu`: serves the GPU-like device over vfio-user.
//!
//! Thin wiring: the device's flags and how its PCI function is built; the
//! device is `p2plab_gpu::gpu_function`, the rest (peers, control socket,
//! stats, shutdown order) p2plab-server's `serve_device`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use p2plab_gpu::cli::parse_vram_size;
use p2plab_gpu::{gpu_function, GpuFaultSpec, Vram, DEFAULT_IDS};
use p2plab_server::{Launch, PciIdArgs, SecondSignal, ServerArgs, ServerProcess};
use p2plab_vfio_user::DmaSpace;
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
    /// PCI identity (default 5032:4750).
    #[command(flatten)]
    ids: PciIdArgs,
    /// Arm a fault injection from the start (repeatable), as
    /// `p2plab-ctl inject` takes it: `job-error=0x06,count=1[,opcode=fill]`,
    /// `hang,count=1`, `drop-irq,count=1`, `vram-error=0x100000-0x1fffff`;
    /// at most 64 armed at once. See docs/user-guide/faults.md.
    #[arg(long = "inject", value_name = "SPEC", value_parser = parse_fault)]
    injections: Vec<GpuFaultSpec>,
}

fn parse_fault(text: &str) -> Result<GpuFaultSpec, String> {
    text.parse()
        .map_err(|e: p2plab_gpu::SpecError| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    p2plab_server::run_main(&PROCESS, &args.server, |launch| run(&args, launch))
}

fn run(args: &Args, launch: Launch<'_>) -> Result<()> {
    let ids = args.ids.ids(DEFAULT_IDS);
    let vram = Vram::new(args.vram_size).context("cannot create the VRAM memfd")?;
    // The engine reaches guest memory through the transport's DMA space
    // (mmapped guest RAM, messages for peer BARs, our own VRAM window).
    let dma = DmaSpace::new();
    let mut function = gpu_function(&ids, vram, Arc::new(dma.clone()))?;
    function.model_mut().serve_vram_locally(dma.clone());
    info!(
        vendor_id = format_args!("{:#06x}", ids.vendor_id),
        device_id = format_args!("{:#06x}", ids.device_id),
        vram_mib = args.vram_size >> 20,
        "p2plab-gpu starting"
    );
    let injections: Vec<String> = args.injections.iter().map(|s| s.to_string()).collect();
    p2plab_server::serve_device(&args.server, launch, dma, function, &injections)
}
