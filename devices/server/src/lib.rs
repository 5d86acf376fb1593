//! What every p2plab device server process needs, so each server binary
//! only wires its device model to the transport:
//!
//! - the flags every server takes ([`ServerArgs`], flattened into each
//!   binary's own clap `Args`),
//! - logging set up from `--log-level`/`--log-file`/`RUST_LOG`,
//! - shutdown signals taken by one thread that stops the server,
//! - the stats file, rewritten atomically on a thread and once more at exit,
//! - the open-file limit raised to its hard maximum (each DMA range and
//!   interrupt keeps a client fd open),
//! - [`log_limited!`] for log lines a guest or client can trigger at will,
//! - the control sockets ([`control`]) that `p2plab-ctl` talks to: the
//!   host's, and the guest's when asked for,
//! - marks of a run's counters and the provenance verdict built on them
//!   ([`provenance`]: did a GPU's data bounce through guest RAM?),
//! - the `main` skeleton: order of setup, error reporting and exit codes,
//! - the PCI identity flags ([`PciIdArgs`]),
//! - serving a device built from p2plab-kit ([`serve_device`]): the peer
//!   registry, tracer, `--inject` flags, control socket, stats and the
//!   shutdown order, written once for every device, with the control verbs
//!   ([`DeviceHandler`]) and the stats JSON, DMA paths included
//!   ([`DeviceStats`]), computed here.
//!
//! The transport (p2plab-vfio-user) stays free of these process concerns.
//!
//! A binary's `main.rs` is its flags and how it builds its PCI function:
//!
//! ```ignore
//! fn main() -> ExitCode {
//!     let args = Args::parse();
//!     p2plab_server::run_main(&PROCESS, &args.server, |launch| run(&args, launch))
//! }
//!
//! fn run(args: &Args, launch: Launch<'_>) -> anyhow::Result<()> {
//!     let dma = DmaSpace::new();
//!     let function = my_device_function(&args.ids.ids(DEFAULT_IDS), Arc::new(dma.clone()))?;
//!     p2plab_server::serve_device(&args.server, launch, dma, function, &args.injections)
//! }
//! ```
//!
//! ## Layering
//!
//! Modules import each other in one direction only (checked by
//! `docs/check/tests/layering.rs`); each line lists what a module uses:
//!
//! ```text
//! serve       -> args, control, device, process                  (serve_device)
//! provenance  -> control                                        (marks, the verdict)
//! process     -> args, counters, logging, signals, stats_file, usage
//! device      -> control                                        (a device's stats and verbs)
//! signals     -> counters                                       (signal thread)
//! stats_file  -> counters                                       (stats file thread)
//! logging     -> args
//! args        -> control                                        (its default path)
//! control     -> usage                                          (control sockets)
//! testing     -> control                                        (feature `testing`)
//! counters, pci_ids, usage                                      (leaves)
//! ```

#![deny(missing_docs)]

mod args;
pub mod control;
mod counters;
pub mod device;
mod logging;
mod pci_ids;
mod process;
pub mod provenance;
mod serve;
mod signals;
mod stats_file;
#[cfg(feature = "testing")]
pub mod testing;
pub mod usage;

pub use args::ServerArgs;
pub use counters::CountersJson;
pub use device::{DeviceHandler, DeviceStats, DmaPaths};
pub use logging::init_logging;
/// Rate-limited logging for anything a client or guest can trigger at will
/// (see [`p2plab_ratelimit`]).
pub use p2plab_ratelimit::log_limited;
pub use pci_ids::{parse_pci_id, PciIdArgs};
pub use process::{raise_fd_limit, run_main, Launch, Running, ServerProcess};
pub use serve::serve_device;
pub use signals::{SecondSignal, ShutdownSignals, Sigusr1};
pub use stats_file::{write_stats_file, StatsFileWriter};
