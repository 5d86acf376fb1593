//! Acting on a running lab from the host: its device servers one by one,
//! QEMU through QMP (hot-unplug and re-plug), and the guest through files
//! in the run folder's `guest/` (the guest's `/run/p2plab`).
//!
//! The functions that only need a run folder work on a lab another process
//! started (`run-vm --keep`); the `Lab` methods need the lab object.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::lab::{tail, Lab};
use crate::qmp::Qmp;

/// How often the wait loops look again.
const POLL: Duration = Duration::from_millis(50);
/// SIGTERM grace before SIGKILL when a server is stopped.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// QEMU's QMP socket in a run folder.
pub fn qmp_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("qmp.sock")
}

/// A server's counters as its stats file holds them now.
pub fn read_stats(run_dir: &Path, id: &str) -> Result<Value> {
    let path = run_dir.join(format!("{id}.stats.json"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
}

/// Asks QEMU to unplug device `id` and waits until it is gone: the guest
/// has released the slot and QEMU sent DEVICE_DELETED. Returns how long
/// that took. On q35 QEMU offers the slots through ACPI hotplug, so the
/// guest's acpiphp unbinds the driver and ejects the slot, within a second
/// here (with native PCIe hotplug, pciehp would first wait 5 s for a
/// cancel).
pub fn unplug(qmp: &mut Qmp, id: &str, timeout: Duration) -> Result<Duration> {
    let started = Instant::now();
    qmp.execute("device_del", Some(json!({ "id": id })))?;
    qmp.wait_event("DEVICE_DELETED", |data| data["device"] == id, timeout)
        .with_context(|| format!("unplugging {id}"))?;
    Ok(started.elapsed())
}

/// Plugs a device with its `-device` JSON (a vfio-user-pci device connects
/// to its server's socket during the command).
pub fn plug(qmp: &mut Qmp, device: &Value) -> Result<()> {
    qmp.execute("device_add", Some(device.clone()))
        .with_context(|| format!("device_add {device}"))?;
    Ok(())
}

impl Lab {
    /// The host side of the guest's `/run/p2plab`.
    pub fn guest_dir(&self) -> PathBuf {
        self.run_dir.join("guest")
    }

    /// A new QMP connection to this lab's QEMU.
    pub fn qmp(&self) -> Result<Qmp> {
        Qmp::connect(&qmp_socket(&self.run_dir))
    }

    /// `device_add` of device `id` as the topology declares it.
    pub fn plug(&self, qmp: &mut Qmp, id: &str) -> Result<()> {
        plug(qmp, &self.topology.device_json(id)?)
    }

    pub fn server_stats(&self, id: &str) -> Result<Value> {
        read_stats(&self.run_dir, id)
    }

    pub fn server_pid(&self, id: &str) -> Option<u32> {
        self.servers.iter().find(|s| s.name == id)?.pid()
    }

    /// QEMU's exit status once it has exited.
    pub fn qemu_exited(&mut self) -> Result<Option<ExitStatus>> {
        match self.qemu.as_mut() {
            Some(qemu) => qemu.try_wait(),
            None => Ok(None),
        }
    }

    fn server_index(&self, id: &str) -> Result<usize> {
        self.servers
            .iter()
            .position(|s| s.name == id)
            .with_context(|| format!("no server {id:?} in this lab"))
    }

    /// Stops server `id` (SIGTERM, SIGKILL after 5 s) and returns how it
    /// ended; a server that had already exited gives its status.
    pub fn stop_server(&mut self, id: &str) -> Result<ExitStatus> {
        let index = self.server_index(id)?;
        self.servers[index]
            .stop(STOP_GRACE)
            .with_context(|| format!("stopping {id}: no exit status"))
    }

    /// SIGKILLs server `id` (a crash, as far as its state goes: no signal
    /// handler, no clean-up, no final stats) and returns its exit status.
    pub fn kill_server(&mut self, id: &str) -> Result<ExitStatus> {
        let index = self.server_index(id)?;
        self.servers[index]
            .kill()
            .with_context(|| format!("killing {id}"))
    }

    /// SIGKILLs QEMU (the guest dies with it, nothing is flushed on its
    /// way out) and returns its exit status.
    pub fn kill_qemu(&mut self) -> Result<ExitStatus> {
        match self.qemu.as_mut() {
            Some(qemu) => qemu.kill().context("killing QEMU"),
            None => bail!("this lab has no QEMU"),
        }
    }

    /// Waits for server `id` to exit on its own (`--exit-on-disconnect`
    /// after QEMU let go of the device).
    pub fn wait_server_exit(&mut self, id: &str, timeout: Duration) -> Result<ExitStatus> {
        let index = self.server_index(id)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.servers[index].try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "{id} is still running after {timeout:?}; its log ends with:\n{}",
                    tail(&self.run_dir.join(format!("{id}.log")), 10)
                );
            }
            sleep(POLL);
        }
    }

    /// Starts a fresh server for device `id`, as the topology says, in
    /// place of the one that ran before (which must have exited or been
    /// stopped). Returns once it listens.
    pub fn start_server(&mut self, id: &str) -> Result<()> {
        let index = self.server_index(id)?;
        if self.servers[index].try_wait()?.is_none() {
            bail!("{id} is still running; stop it first");
        }
        let server = self.spawn_server(id)?;
        self.servers[index] = server;
        Ok(())
    }

    /// Waits until the guest has written `name` in `/run/p2plab` and
    /// returns its content. Fails early if QEMU exits or the guest command
    /// ends (`exit-status` appears) first.
    pub fn wait_guest_file(&mut self, name: &str, timeout: Duration) -> Result<String> {
        let path = self.guest_dir().join(name);
        let finished = self.guest_dir().join("exit-status");
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(text) = std::fs::read_to_string(&path) {
                return Ok(text);
            }
            if let Some(status) = self.qemu_exited()? {
                bail!(
                    "QEMU exited ({status}) while waiting for the guest's {name}; QEMU log:\n{}",
                    tail(&self.run_dir.join("qemu.log"), 10)
                );
            }
            if finished.exists() {
                bail!(
                    "the guest command ended before writing {name}; console:\n{}",
                    tail(&self.run_dir.join("console.log"), 30)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the guest did not write {name} within {timeout:?}; console:\n{}",
                    tail(&self.run_dir.join("console.log"), 30)
                );
            }
            sleep(POLL);
        }
    }

    /// Writes `name` in the guest's `/run/p2plab` (atomically, so a guest
    /// polling for it never reads half of it).
    pub fn write_guest_file(&self, name: &str, text: &str) -> Result<()> {
        let path = self.guest_dir().join(name);
        let tmp = self.guest_dir().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }
}
