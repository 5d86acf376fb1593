//! What every p2plab device server process needs, so each server binary
//! only wires its device model to the transport:
//!
//! - the flags every server takes ([`ServerArgs`], flattened into each
//!   binary's own clap `Args`),
//! - logging set up from `--log-level`/`--log-file`/`RUST_LOG`,
//! - shutdown signals taken by one thread that stops the server,
//! - the stats file, rewritten atomically on a thread and once more at exit,
//! - the `main` skeleton: order of setup, error reporting and exit codes.
//!
//! The transport (p2plab-vfio-user) stays free of these process concerns.
//!
//! A binary's `main` looks like:
//!
//! ```ignore
//! fn main() -> ExitCode {
//!     let args = Args::parse();
//!     p2plab_server::run_main(&PROCESS, &args.server, |launch| run(&args, launch))
//! }
//!
//! fn run(args: &Args, launch: Launch<'_>) -> anyhow::Result<()> {
//!     let (mut device, dma, counters) = build_device(args)?;
//!     let server = Server::new(args.server.server_config(), dma)?;
//!     let running = launch.start(&server, counters)?;
//!     let result = server.run(&mut device);
//!     drop(device);
//!     let final_counters = running.finish();
//!     result?;
//!     Ok(())
//! }
//! ```

mod args;
mod logging;
mod process;
mod signals;
mod stats_file;

pub use args::ServerArgs;
pub use logging::init_logging;
pub use process::{run_main, CountersJson, Launch, Running, SecondSignal, ServerProcess};
pub use signals::ShutdownSignals;
pub use stats_file::{write_stats_file, StatsFileWriter};
