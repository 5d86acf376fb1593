//! Test support (feature `testing`): a device server binary run as a
//! child process, the way hostile-client suites drive one (with
//! rust-vmm's `vfio_user::Client` as the independent peer): started in a
//! fresh folder, asked for fresh counters through its control socket,
//! checked that it still runs, stopped with SIGTERM and its exit status
//! returned.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use p2plab_vfio_user::protocol::{cmd, flags, Header, HEADER_SIZE};

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
        // The socket file appears only once it listens (bind_with_mode
        // renames it into place); the transport's "listening" line also
        // says the server got that far (the control socket and the peer
        // registry log their own "listening" lines earlier, so the
        // transport's target is named).
        while !server.socket.exists()
            || !server.log().contains("p2plab_vfio_user::server: listening")
        {
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

/// A vfio-user client that sends any message and reads the raw reply
/// (rust-vmm's client cannot parse error replies): for the accesses a
/// server must refuse. Test code: it panics on a broken stream.
pub struct RawClient {
    stream: UnixStream,
    next_id: u16,
}

impl RawClient {
    /// Connects and negotiates VERSION.
    pub fn connect(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket).expect("raw connect");
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut raw = Self { stream, next_id: 1 };
        let mut version = Vec::new();
        version.extend_from_slice(&0u16.to_ne_bytes());
        version.extend_from_slice(&0u16.to_ne_bytes());
        version.extend_from_slice(br#"{"capabilities":{"max_msg_fds":16}}"#);
        version.push(0);
        let (reply, _) = raw.call(cmd::VERSION, &version);
        assert!(!reply.is_error(), "VERSION refused: {reply:?}");
        raw
    }

    /// Sends one command; the reply's header and payload.
    pub fn call(&mut self, command: u16, payload: &[u8]) -> (Header, Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = Header::command(id, command, payload.len())
            .encode()
            .to_vec();
        message.extend_from_slice(payload);
        self.stream.write_all(&message).unwrap();
        let mut head = [0u8; HEADER_SIZE];
        self.stream.read_exact(&mut head).expect("a reply");
        let reply = Header::decode(&head);
        assert_eq!(reply.msg_id, id, "reply to another message");
        assert_eq!(reply.flags & flags::TYPE_MASK, flags::TYPE_REPLY);
        let mut rest = vec![0u8; (reply.size as usize).saturating_sub(HEADER_SIZE)];
        self.stream.read_exact(&mut rest).unwrap();
        (reply, rest)
    }

    /// A REGION_READ/WRITE payload header.
    pub fn access(region: u32, offset: u64, count: u32) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&offset.to_ne_bytes());
        p.extend_from_slice(&region.to_ne_bytes());
        p.extend_from_slice(&count.to_ne_bytes());
        p
    }

    /// REGION_READ: the reply header and payload.
    pub fn region_read(&mut self, region: u32, offset: u64, count: u32) -> (Header, Vec<u8>) {
        self.call(cmd::REGION_READ, &Self::access(region, offset, count))
    }

    /// REGION_WRITE: the reply header.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Header {
        let mut p = Self::access(region, offset, data.len() as u32);
        p.extend_from_slice(data);
        self.call(cmd::REGION_WRITE, &p).0
    }

    /// The accesses every device server must refuse with an error reply,
    /// sent in turn, with what each is: past the end of `bar` (of
    /// `bar_size` bytes) and across it, at a wrapping offset, to a BAR the
    /// device does not have (`absent_bar`) and to region 42, of 2 MiB, a
    /// write whose count lies about its payload, a short payload, an
    /// unknown command.
    pub fn malformed_accesses(
        &mut self,
        bar: u32,
        bar_size: u64,
        absent_bar: u32,
    ) -> Vec<(&'static str, Header)> {
        let lying = {
            let mut p = Self::access(bar, 0, 8);
            p.extend_from_slice(&[0; 4]);
            p
        };
        vec![
            ("a read past the BAR", self.region_read(bar, bar_size, 4).0),
            (
                "a write across its end",
                self.region_write(bar, bar_size - 4, &[0; 8]),
            ),
            (
                "a read at a wrapping offset",
                self.region_read(bar, u64::MAX - 1, 4).0,
            ),
            (
                "a write to a BAR the device does not have",
                self.region_write(absent_bar, 0, &[0; 4]),
            ),
            ("a read of region 42", self.region_read(42, 0, 4).0),
            ("a read of 2 MiB", self.region_read(bar, 0, 2 << 20).0),
            ("a count that lies", self.call(cmd::REGION_WRITE, &lying).0),
            ("a short payload", self.call(cmd::REGION_READ, &[0; 8]).0),
            ("an unknown command", self.call(99, &[]).0),
        ]
    }
}
