//! Child processes of the lab: device servers and QEMU. Each one dies with
//! the launcher (PR_SET_PDEATHSIG) unless the lab is kept up on purpose, and
//! is stopped politely (SIGTERM) before it is killed.

use std::fs::File;
use std::os::unix::process::CommandExt;
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

/// A named child process that is stopped when dropped.
#[derive(Debug)]
pub struct LabProcess {
    pub name: String,
    child: Option<Child>,
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
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` once the process has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => child
                .try_wait()
                .with_context(|| format!("waiting for {}", self.name)),
            None => Ok(None),
        }
    }

    pub fn wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(Some(
                child
                    .wait()
                    .with_context(|| format!("waiting for {}", self.name))?,
            )),
            None => Ok(None),
        }
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns the exit status.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        signal_pid(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok()
    }

    /// Leaves the process running (for `--keep`): nothing stops it on drop.
    pub fn release(mut self) -> Option<u32> {
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
