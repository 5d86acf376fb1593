//! Child processes of the lab: device servers and QEMU. Each one dies with
//! the launcher (PR_SET_PDEATHSIG) unless the lab is kept up on purpose, and
//! is stopped politely (SIGTERM) before it is killed.

use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// How a child is tied to the launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Killed by the kernel when the launcher exits, however it exits.
    TiedToLauncher,
    /// In its own session; survives the launcher (`--keep`).
    Detached,
}

/// A named child process that is stopped when dropped. It is reaped with
/// wait4(2) so its peak memory (ru_maxrss) is known after it exits.
#[derive(Debug)]
pub struct LabProcess {
    pub name: String,
    child: Option<Child>,
    /// Exit status and peak RSS in bytes, once reaped.
    exited: Option<(ExitStatus, u64)>,
    /// SIGTERM was sent ([`LabProcess::terminate`]): never send it twice,
    /// since a server's second SIGTERM cuts its orderly shutdown short.
    terminated: bool,
}

impl LabProcess {
    /// Spawns `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path, lifetime: Lifetime) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone().context("duplicating a log fd")?;
        command.stdout(out).stderr(err);
        if command.get_program().to_string_lossy().is_empty() {
            anyhow::bail!("{name}: empty program");
        }
        if lifetime == Lifetime::Detached || !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            command.stdin(Stdio::null());
        }
        Self::spawn_configured(name, command, lifetime)
    }

    /// Spawns `command` with the stdio it already has (the interactive
    /// console uses the launcher's terminal).
    pub fn spawn_configured(name: &str, mut command: Command, lifetime: Lifetime) -> Result<Self> {
        // SAFETY: the closure runs between fork and exec and only calls
        // async-signal-safe functions (prctl, setsid, getppid, kill) with
        // no allocation.
        unsafe {
            command.pre_exec(move || {
                match lifetime {
                    Lifetime::TiedToLauncher => {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        // The launcher may have died before prctl took effect.
                        if libc::getppid() == 1 {
                            libc::kill(libc::getpid(), libc::SIGKILL);
                        }
                    }
                    Lifetime::Detached => {
                        if libc::setsid() < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", command.get_program()))?;
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            exited: None,
            terminated: false,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` once the process has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Blocks until the process exits.
    pub fn wait(&mut self) -> Result<Option<ExitStatus>> {
        self.reap(0)
    }

    /// Peak resident memory in bytes: ru_maxrss once reaped, else VmHWM.
    pub fn peak_rss(&self) -> Option<u64> {
        match (self.exited, self.pid()) {
            (Some((_, rss)), _) => Some(rss),
            (None, Some(pid)) => peak_rss(pid),
            (None, None) => None,
        }
    }

    fn reap(&mut self, flags: i32) -> Result<Option<ExitStatus>> {
        if let Some((status, _)) = self.exited {
            return Ok(Some(status));
        }
        let Some(pid) = self.pid().and_then(|p| libc::pid_t::try_from(p).ok()) else {
            return Ok(None);
        };
        let mut raw_status = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child's pid with valid out-pointers.
        let reaped = unsafe { libc::wait4(pid, &mut raw_status, flags, &mut usage) };
        match reaped {
            0 => Ok(None),
            r if r < 0 => Err(std::io::Error::last_os_error())
                .with_context(|| format!("waiting for {}", self.name)),
            _ => {
                let status = ExitStatus::from_raw(raw_status);
                let max_rss = u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024;
                self.exited = Some((status, max_rss));
                Ok(Some(status))
            }
        }
    }

    /// Sends SIGTERM, once, unless the process has exited: several
    /// processes then shut down side by side, and [`LabProcess::stop`]
    /// waits for each.
    pub fn terminate(&mut self) {
        if self.terminated || !matches!(self.try_wait(), Ok(None)) {
            return;
        }
        if let Some(pid) = self.pid() {
            signal_pid(pid, libc::SIGTERM);
            self.terminated = true;
        }
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns the exit status.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.exited.is_none() {
            let pid = self.pid()?;
            if let Ok(Some(status)) = self.try_wait() {
                return Some(status);
            }
            self.terminate();
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(status)) = self.try_wait() {
                    return Some(status);
                }
                sleep(Duration::from_millis(20));
            }
            signal_pid(pid, libc::SIGKILL);
        }
        self.wait().ok().flatten()
    }

    /// SIGKILL at once, no SIGTERM first (nothing the process could do on
    /// its way out gets a chance), then reaps it. A process that had
    /// already exited gives its status.
    pub fn kill(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        let pid = self
            .pid()
            .with_context(|| format!("{} was never started", self.name))?;
        signal_pid(pid, libc::SIGKILL);
        self.wait()?
            .with_context(|| format!("{}: no exit status after SIGKILL", self.name))
    }

    /// Leaves the process running (for `--keep`): nothing stops it on drop.
    pub fn release(mut self) -> Option<u32> {
        self.exited = None;
        self.child.take().map(|c| c.id())
    }
}

impl Drop for LabProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// Sends `signal` to a pid; a pid that no longer exists is not an error.
pub fn signal_pid(pid: u32, signal: i32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with a pid we started (or read back from our own pid
    // file) and a valid signal number; no memory is passed.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Whether a pid is alive (signal 0 probe).
pub fn pid_alive(pid: u32) -> bool {
    signal_pid(pid, 0)
}

/// Peak resident set size (VmHWM) of a live process, in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
