//! SIGTERM, SIGINT and SIGHUP stop the server. They are blocked in every
//! thread and taken synchronously by one waiter thread, so no
//! async-signal-safety rules apply to what a signal does.

use anyhow::{Context, Result};
use p2plab_vfio_user::ShutdownHandle;
use tracing::{info, warn};

use crate::counters::CountersJson;

/// What a second SIGTERM/SIGINT/SIGHUP does while the first one's shutdown
/// is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecondSignal {
    /// Exit at once with status 1 (for a user whose Ctrl-C seems stuck).
    ExitNow,
    /// Nothing: the shutdown always runs to the end (e.g. to flush data).
    Ignore,
}

/// What SIGUSR1 does to a server process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sigusr1 {
    /// Logs the counters: SIGUSR1 is blocked with the shutdown signals and
    /// taken by the signal thread.
    LogsCounters,
    /// Left alone: its default action (terminating the process) applies.
    Default,
}

/// The signals a server process handles, blocked in the calling thread and
/// so in every thread it starts afterwards. Make it before any thread
/// exists ([`crate::run_main`] does), then hand it to
/// [`ShutdownSignals::spawn_waiter`].
pub struct ShutdownSignals {
    set: libc::sigset_t,
    sigusr1: Sigusr1,
}

impl std::fmt::Debug for ShutdownSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownSignals").finish_non_exhaustive()
    }
}

impl ShutdownSignals {
    /// Blocks SIGTERM, SIGINT, SIGHUP and, with [`Sigusr1::LogsCounters`],
    /// SIGUSR1 (which then logs the counters instead of killing us).
    pub fn block(sigusr1: Sigusr1) -> std::io::Result<Self> {
        let mut signals = vec![libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
        if sigusr1 == Sigusr1::LogsCounters {
            signals.push(libc::SIGUSR1);
        }
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set before anything reads it;
        // sigaddset and pthread_sigmask only use that initialised set, and
        // a null old-mask pointer is allowed.
        unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            let mut set = set.assume_init();
            for signal in signals {
                libc::sigaddset(&mut set, signal);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(Self { set, sigusr1 })
        }
    }

    /// Starts thread `thread_name`, which waits for our signals: a shutdown
    /// signal calls `shutdown`, SIGUSR1 (if blocked) logs `counters()`.
    pub fn spawn_waiter(
        self,
        thread_name: String,
        shutdown: ShutdownHandle,
        counters: CountersJson,
        second_signal: SecondSignal,
    ) -> Result<()> {
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let _span = span.enter();
                let mut requested = false;
                loop {
                    let mut signal: libc::c_int = 0;
                    // SAFETY: `self.set` is an initialised signal set and
                    // `signal` a live c_int for sigwait to write.
                    let rc = unsafe { libc::sigwait(&self.set, &mut signal) };
                    if rc != 0 {
                        // Only EINVAL (a bad set) is possible, and it would
                        // fail the same way every time: do not spin.
                        warn!(errno = rc, "sigwait failed; signals ignored from now on");
                        return;
                    }
                    if self.sigusr1 == Sigusr1::LogsCounters && signal == libc::SIGUSR1 {
                        info!(stats = %counters(), "counters (SIGUSR1)");
                        continue;
                    }
                    if requested {
                        // Only reached with SecondSignal::ExitNow: the
                        // shutdown is taking too long for the user.
                        warn!(signal, "second signal, exiting now");
                        std::process::exit(1);
                    }
                    info!(signal, "signal received, shutting down");
                    requested = true;
                    shutdown.shutdown();
                    if second_signal == SecondSignal::Ignore {
                        // Later signals stay blocked and pending, so they
                        // do nothing while the shutdown runs its course.
                        return;
                    }
                }
            })
            .context("cannot start the signal thread")?;
        Ok(())
    }
}
