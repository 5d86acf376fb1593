//! `p2plab-nic`: serves the NIC-like device over vfio-user.
//!
//! Thin wiring: the device's flags and how its PCI function is built; the
//! device is `p2plab_nic::nic_function`, the rest (peers, control socket,
//! stats, shutdown order) p2plab-server's `serve_device`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use p2plab_nic::regs::{DEFAULT_MTU, MAX_MTU, MIN_MTU};
use p2plab_nic::{nic_function, NicFaultSpec, Wire, WireConfig, WireOptions, DEFAULT_IDS};
use p2plab_server::{Launch, PciIdArgs, SecondSignal, ServerArgs, ServerProcess};
use p2plab_vfio_user::DmaSpace;
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
    /// (a unix socket the peer NIC connects to, mode 0600, one peer of our
    /// uid or an --allow-uid), `connect:PATH`, or `tcp-listen:ADDR:PORT` /
    /// `tcp-connect:HOST:PORT` (a NIC in another lab, on this host or
    /// another; needs --wire-key).
    #[arg(long, value_name = "WIRE", default_value = "loopback")]
    wire: WireConfig,
    /// The pre-shared key file of a TCP wire: the same file on both ends,
    /// mode 0600 and owned by the server's uid (`openssl rand -hex 32`).
    /// The peer proves it holds the key before it gets the link.
    #[arg(long, value_name = "FILE")]
    wire_key: Option<std::path::PathBuf>,
    /// Longest a frame waits for the peer to read it, in milliseconds;
    /// then its descriptor completes with LINK_DOWN and a socket link is
    /// closed (the peer reconnects).
    #[arg(long, value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    wire_send_timeout_ms: u64,
    /// Largest frame in bytes, 256..=1048576.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MTU, value_parser = parse_mtu)]
    mtu: u32,
    /// PCI identity (default 5032:4e49).
    #[command(flatten)]
    ids: PciIdArgs,
    /// Arm a wire fault from the start (repeatable), as `p2plab-ctl
    /// inject` takes it: `drop,count=1`, `delay=5ms`, `corrupt,prob=0.1`,
    /// `drop-irq,count=1`; at most 64 armed at once.
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

fn parse_fault(text: &str) -> Result<NicFaultSpec, String> {
    text.parse()
        .map_err(|e: p2plab_fault::SpecError| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    p2plab_server::run_main(&PROCESS, &args.server, |launch| run(&args, launch))
}

fn run(args: &Args, launch: Launch<'_>) -> Result<()> {
    let ids = args.ids.ids(DEFAULT_IDS);
    let options = WireOptions {
        send_timeout: Duration::from_millis(args.wire_send_timeout_ms),
        max_payload: MAX_MTU,
        allowed_uids: args.server.allow_uid.clone(),
        thread_name: "nic-wire".into(),
        key_file: args.wire_key.clone(),
        ..WireOptions::default()
    };
    let wire = Wire::open(&args.wire, options).with_context(|| format!("--wire {}", args.wire))?;
    // The NIC has no memory BAR to share; with the peer path on it DMAs
    // straight into other servers' BARs (GPU VRAM, an NVMe CMB).
    let dma = DmaSpace::new();
    let function = nic_function(&ids, wire, args.mtu, Arc::new(dma.clone()))?;
    info!(wire = %args.wire, mtu = args.mtu, "p2plab-nic starting");
    let injections: Vec<String> = args.injections.iter().map(|s| s.to_string()).collect();
    p2plab_server::serve_device(&args.server, launch, dma, function, &injections)
}
