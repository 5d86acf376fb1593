//! The skeleton of a device server's `main`: what happens in which order,
//! how errors are reported and which exit code results.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use p2plab_vfio_user::Server;
use tracing::{error, Span};

use crate::args::ServerArgs;
use crate::counters::CountersJson;
use crate::logging::init_logging;
use crate::signals::{SecondSignal, ShutdownSignals, Sigusr1};
use crate::stats_file::StatsFileWriter;

/// How one device server binary's process behaves, beyond its flags.
#[derive(Clone, Copy)]
pub struct ServerProcess {
    /// The binary's name; prefixes errors printed to stderr.
    pub name: &'static str,
    /// Helper threads are named `<thread_prefix>-signals` and
    /// `<thread_prefix>-stats`.
    pub thread_prefix: &'static str,
    /// SIGUSR1 logs the counters (without it SIGUSR1 is left alone).
    pub counters_on_sigusr1: bool,
    /// What a shutdown signal does while the first one's shutdown runs.
    pub second_signal: SecondSignal,
    /// The stats thread also logs the counters when they changed, at most
    /// this often.
    pub log_counters_every: Option<Duration>,
    /// Makes the span every log line of the device's run is in, e.g.
    /// `|args| info_span!("gpu", socket = %args.socket.display())`. Called
    /// once logging is set up (a span made before that would be disabled);
    /// a function because tracing span names must be static.
    pub span: fn(&ServerArgs) -> Span,
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess")
            .field("name", &self.name)
            .field("thread_prefix", &self.thread_prefix)
            .field("counters_on_sigusr1", &self.counters_on_sigusr1)
            .field("second_signal", &self.second_signal)
            .field("log_counters_every", &self.log_counters_every)
            .finish_non_exhaustive()
    }
}

/// Runs a device server process:
///
/// 1. blocks the shutdown signals before any thread exists, so every thread
///    inherits the mask and only the signal thread receives them;
/// 2. sets up logging;
/// 3. calls `run`, which builds the device and serves it (see
///    [`Launch::start`]), inside the process's span.
///
/// Errors before logging exists go to stderr. An error from `run` is
/// logged, and also printed to stderr when the log goes to a file, so
/// whoever started the process sees why it stopped. Exit status: 0 when
/// `run` succeeds, 1 otherwise (clap exits with 2 on bad flags before this).
pub fn run_main(
    process: &ServerProcess,
    args: &ServerArgs,
    run: impl FnOnce(Launch<'_>) -> Result<()>,
) -> ExitCode {
    let name = process.name;
    let sigusr1 = if process.counters_on_sigusr1 {
        Sigusr1::LogsCounters
    } else {
        Sigusr1::Default
    };
    let signals = match ShutdownSignals::block(sigusr1) {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("{name}: cannot block signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = init_logging(args) {
        eprintln!("{name}: {e:#}");
        return ExitCode::FAILURE;
    }
    match raise_fd_limit() {
        Ok(limit) => {
            tracing::debug!(limit, "open file limit");
            if let Err(e) = check_fd_budget(args.max_fd_dma_maps, limit) {
                error!("{e}");
                if args.log_file.is_some() {
                    eprintln!("{name}: {e}");
                }
                return ExitCode::FAILURE;
            }
        }
        Err(e) => tracing::warn!("cannot raise the open file limit: {e}"),
    }
    let launch = Launch {
        process,
        args,
        signals,
    };
    let result = {
        let span = (process.span)(args);
        let _entered = span.enter();
        run(launch)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            if args.log_file.is_some() {
                eprintln!("{name}: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Files a server keeps open besides fd-backed DMA ranges: sockets, log,
/// stats, backing files, interrupt eventfds.
const FD_RESERVE: u64 = 128;

/// Every fd-backed DMA range keeps a file open: `--max-fd-dma-maps` must
/// fit the open file limit, or the server would fail with EMFILE in the
/// middle of guest I/O instead of at startup.
fn check_fd_budget(max_fd_dma_maps: u32, limit: u64) -> Result<(), String> {
    let needed = u64::from(max_fd_dma_maps) + FD_RESERVE;
    if needed > limit {
        return Err(format!(
            "--max-fd-dma-maps {max_fd_dma_maps} needs about {needed} open files, \
             but the open file limit (RLIMIT_NOFILE) is {limit}: lower the flag or raise \
             the limit (ulimit -n)"
        ));
    }
    Ok(())
}

/// Raises this process's soft limit of open files to its hard limit, and
/// returns it. A client keeps an fd open here for every fd-backed DMA
/// range and every bound interrupt; the default soft limit of 1024 would
/// be reached before the transport's own limits are.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    // SAFETY: `rlimit` is plain data, for which all-zero is valid.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes into a valid rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads a valid rlimit struct; raising the soft
        // limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

/// Handed to the binary's `run` once signals are blocked and logging works.
#[derive(Debug)]
pub struct Launch<'a> {
    process: &'a ServerProcess,
    args: &'a ServerArgs,
    signals: ShutdownSignals,
}

impl Launch<'_> {
    /// The process's name (`p2plab-nvme`...), for log lines.
    pub fn process_name(&self) -> &'static str {
        self.process.name
    }

    /// Starts what runs beside `server`: the signal thread, which shuts the
    /// server down, and the `--stats-file` writer, if asked for. Call it
    /// just before `server.run(..)`; the helper threads log in the
    /// process's span too.
    pub fn start(self, server: &Server, counters: CountersJson) -> Result<Running> {
        let prefix = self.process.thread_prefix;
        // Every device's stats also say what the process itself costs.
        let device_counters = counters;
        let counters: CountersJson =
            Arc::new(move || crate::usage::stats_with_process_usage(&device_counters()));
        self.signals.spawn_waiter(
            format!("{prefix}-signals"),
            server.shutdown_handle(),
            Arc::clone(&counters),
            self.process.second_signal,
        )?;
        let stats_file = self
            .args
            .stats_file
            .as_ref()
            .map(|path| {
                StatsFileWriter::start(
                    path.clone(),
                    self.args.stats_interval(),
                    format!("{prefix}-stats"),
                    Arc::clone(&counters),
                    self.process.log_counters_every,
                )
            })
            .transpose()?;
        Ok(Running {
            counters,
            stats_file,
        })
    }
}

/// The helpers [`Launch::start`] started, until [`Running::finish`].
pub struct Running {
    counters: CountersJson,
    stats_file: Option<StatsFileWriter>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("stats_file", &self.stats_file.is_some())
            .finish_non_exhaustive()
    }
}

impl Running {
    /// After the server returned and the device is quiet (dropped,
    /// flushed): takes the final counters, writes them as the stats file's
    /// last contents, and returns them for the exit log line.
    pub fn finish(self) -> String {
        let json = (self.counters)();
        if let Some(stats_file) = self.stats_file {
            stats_file.stop(&json);
        }
        json
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a --max-fd-dma-maps accepted beyond the open file limit
    /// (the server would hit EMFILE during guest I/O).
    #[test]
    fn fd_backed_dma_maps_must_fit_the_open_file_limit() {
        assert!(check_fd_budget(256, 1024).is_ok());
        assert!(check_fd_budget(4096, 4096 + FD_RESERVE).is_ok());
        let err = check_fd_budget(4096, 1024).unwrap_err();
        assert!(err.contains("--max-fd-dma-maps 4096"), "{err}");
        assert!(err.contains("1024"), "{err}");
    }

    /// Catches a server left at the default soft limit of open files,
    /// below what the transport's fd limits allow a client to hold.
    #[test]
    fn the_fd_limit_is_raised_to_the_hard_limit() {
        let raised = raise_fd_limit().unwrap();
        // SAFETY: `rlimit` is plain data, for which all-zero is valid.
        let mut now: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: getrlimit writes into a valid rlimit struct.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!(now.rlim_cur, now.rlim_max);
        assert_eq!(raised, now.rlim_cur);
    }
}
