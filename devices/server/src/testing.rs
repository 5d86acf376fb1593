//! Test support (feature `testing`): a device server binary run as a
//! child process, the way hostile-client suites drive one (with
//! rust-vmm's `vfio_user::Client` as the independent peer): started in a
//! fresh folder, asked for fresh counters through its control socket,
//! checked that it still runs, stopped with SIGTERM and its exit status
//! returned.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::control::{default_control_path, request, ControlRequest};

/// How long the server gets to listen, and to exit after SIGTERM.
const PATIENCE: Duration = Duration::from_secs(10);

/// A server binary running as a child of the test.
pub struct SpawnedServer {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl SpawnedServer {
    /// Starts `binary --socket DIR/dev.sock --log-file DIR/dev.log
    /// --log-level debug ARGS...` in a fresh folder DIR named after `name`
    /// and this process (`args` gets DIR, for paths of its own there), and
    /// waits until it listens. Panics (the test fails) if it does not
    /// within 10 s.
    pub fn start<S: AsRef<OsStr>>(
        binary: impl AsRef<Path>,
        name: &str,
        args: impl FnOnce(&Path) -> Vec<S>,
    ) -> Self {
        let dir = std::env::temp_dir().join(format!("p2plab-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the server's folder");
        let args = args(&dir);
        let socket = dir.join("dev.sock");
        let log = dir.join("dev.log");
        let child = Command::new(binary.as_ref())
            .arg("--socket")
            .arg(&socket)
            .arg("--log-file")
            .arg(&log)
            .args(["--log-level", "debug"])
            .args(&args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.as_ref().display()));
        let mut server = Self {
            child,
            dir,
            socket,
            log,
        };
        let deadline = Instant::now() + PATIENCE;
        // The socket file appears at bind, before listen: a connect in
        // between is refused. The server logs "listening" after both.
        while !server.socket.exists() || !server.log().contains("listening") {
            assert!(
                server.is_running(),
                "the server exited before it listened:\n{}",
                server.log()
            );
            assert!(Instant::now() < deadline, "the server never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    /// The server's folder (its socket, log, and anything the test puts
    /// there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The vfio-user socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The `status` reply (counters, registers, faults) now, through the
    /// control socket. Panics if the server does not answer.
    pub fn status(&self) -> serde_json::Value {
        let control = default_control_path(&self.socket);
        request(&control, &ControlRequest::Status)
            .unwrap_or_else(|e| panic!("status from {}: {e:#}", control.display()))
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then the exit status. Panics if it does not exit within
    /// 10 s (a server that hangs on shutdown).
    pub fn stop(mut self) -> ExitStatus {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill only sends a signal to our own child process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within 10 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
