//! The control socket: a unix socket next to the vfio-user socket through
//! which `p2plab-ctl` (or a test) asks a running server for its state, arms
//! and clears fault injections, and resets the device.
//!
//! Protocol: JSON lines. Each request is one line, a [`ControlRequest`]
//! (`{"cmd":"inject","spec":"timeout,count=1"}`); each reply is one line,
//! `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`. The socket
//! file is mode 0600, and a peer of another uid is refused (SO_PEERCRED),
//! whatever the file's mode.
//!
//! A [`ControlHandler`] answers the requests; for a device it is
//! [`crate::DeviceHandler`] over the model's `p2plab_kit::DeviceControl`.
//! This module knows no device.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use p2plab_vfio_user::server::{current_uid, peer_uid};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// Longest request line accepted; a longer one closes the connection.
const MAX_LINE: u64 = 64 * 1024;
/// Connections served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 8;

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ControlRequest {
    /// Live state and counters, with armed injections.
    Status,
    /// Arms one injection spec.
    Inject {
        /// The spec text, as `--inject` takes it.
        spec: String,
    },
    /// Disarms every injection.
    Clear,
    /// Function-level reset of the device (what FLR does).
    Reset,
    /// Switches the decoded trace on (`true`) or off (`false`), or only
    /// reports it (no `on`). The reply is `{"on":..,"path":..,"events":..}`.
    Trace {
        /// The new state; absent to only ask.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        on: Option<bool>,
    },
}

/// What a device does with control requests. Errors are messages for the
/// user (the spec's bad field, say).
pub trait ControlHandler: Send + Sync + 'static {
    /// Answers one request. `trace` requests are answered from
    /// [`tracer`](Self::tracer) and never reach this.
    fn handle(&self, request: &ControlRequest) -> Result<serde_json::Value, String>;

    /// The device's trace recorder, if it has one.
    fn tracer(&self) -> Option<&p2plab_trace::Tracer> {
        None
    }
}

/// Answers `request`: `trace` from the handler's tracer, the rest by the
/// handler.
fn answer(
    handler: &dyn ControlHandler,
    request: &ControlRequest,
) -> Result<serde_json::Value, String> {
    let ControlRequest::Trace { on } = request else {
        let value = handler.handle(request)?;
        return Ok(match request {
            ControlRequest::Status => crate::usage::with_process_usage(value),
            _ => value,
        });
    };
    let tracer = handler
        .tracer()
        .ok_or_else(|| "this device has no trace".to_string())?;
    match on {
        Some(true) => tracer
            .enable()
            .map_err(|e| format!("switching the trace on: {e}"))?,
        Some(false) => tracer.disable(),
        None => {}
    }
    Ok(tracer.status().to_json())
}

/// A reply line.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    result: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    error: Option<String>,
}

/// The control socket of `socket` (the vfio-user socket) when none is
/// given: the same path with the extension `ctl` (`nvme0.sock` →
/// `nvme0.ctl`).
pub fn default_control_path(socket: &Path) -> PathBuf {
    socket.with_extension("ctl")
}

/// A listening control socket; the file is removed on drop.
pub struct ControlServer {
    path: PathBuf,
}

impl ControlServer {
    /// Binds `path` (replacing a stale socket file there) and serves it on
    /// a thread.
    pub fn start(path: &Path, handler: Arc<dyn ControlHandler>) -> io::Result<Self> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        // Only our uid; peers are checked with SO_PEERCRED too, so the
        // moment before this chmod opens nothing.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        info!(path = %path.display(), "control socket listening");
        let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    if let Err(e) = check_peer(&stream) {
                        warn!(%e, "control connection refused");
                        continue;
                    }
                    if live.load(std::sync::atomic::Ordering::Acquire) >= MAX_CONNECTIONS {
                        warn!("control connection refused: too many");
                        continue;
                    }
                    live.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    let handler = Arc::clone(&handler);
                    let live = Arc::clone(&live);
                    let spawned =
                        thread::Builder::new()
                            .name("control-conn".into())
                            .spawn(move || {
                                if let Err(e) = serve(stream, handler.as_ref()) {
                                    warn!(%e, "control connection ended");
                                }
                                live.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                            });
                    if spawned.is_err() {
                        warn!("control connection dropped: no thread");
                    }
                }
            })?;
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// Where the socket is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Refuses peers of another uid (the same rule as the vfio-user socket).
fn check_peer(stream: &UnixStream) -> io::Result<()> {
    let peer = peer_uid(stream)?;
    let ours = current_uid();
    if peer != ours {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("peer uid {peer} is not ours ({ours})"),
        ));
    }
    Ok(())
}

/// Answers request lines until the peer closes.
fn serve(stream: UnixStream, handler: &dyn ControlHandler) -> io::Result<()> {
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        let n = (&mut reader).take(MAX_LINE).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        if !line.ends_with('\n') && n as u64 >= MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request line too long",
            ));
        }
        let text = reply_line(handler, &line).map_err(io::Error::other)?;
        writer.write_all(text.as_bytes())?;
    }
}

/// The reply line (JSON, ending in a newline) to one request line: what
/// the control socket sends back for it. Public for the `control_request`
/// fuzz target, which feeds it any text.
pub fn reply_line(handler: &dyn ControlHandler, line: &str) -> serde_json::Result<String> {
    let reply = match serde_json::from_str::<ControlRequest>(line.trim()) {
        Ok(request) => match answer(handler, &request) {
            Ok(result) => Reply {
                ok: true,
                result: Some(result),
                error: None,
            },
            Err(error) => Reply {
                ok: false,
                result: None,
                error: Some(error),
            },
        },
        Err(e) => Reply {
            ok: false,
            result: None,
            error: Some(format!("bad request: {e}")),
        },
    };
    let mut text = serde_json::to_string(&reply)?;
    text.push('\n');
    Ok(text)
}

/// How long a client waits for a reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends one request to the control socket at `path` and returns the
/// result, or the server's error message.
pub fn request(path: &Path, request: &ControlRequest) -> anyhow::Result<serde_json::Value> {
    let stream = UnixStream::connect(path)
        .map_err(|e| anyhow::anyhow!("connecting to {}: {e}", path.display()))?;
    stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut text = serde_json::to_string(request)?;
    text.push('\n');
    writer.write_all(text.as_bytes())?;
    let mut line = String::new();
    BufReader::new(stream).take(16 << 20).read_line(&mut line)?;
    parse_reply(&line, path)
}

/// Sends one request through a character device that QEMU connects to a
/// control socket (a virtio-serial port in the guest, `/dev/vportNpM`).
pub fn request_over_port(
    port: &Path,
    request: &ControlRequest,
) -> anyhow::Result<serde_json::Value> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(port)
        .map_err(|e| anyhow::anyhow!("opening {}: {e}", port.display()))?;
    let mut text = serde_json::to_string(request)?;
    text.push('\n');
    file.write_all(text.as_bytes())?;
    let deadline = std::time::Instant::now() + REPLY_TIMEOUT;
    let mut reply = Vec::new();
    while !reply.contains(&b'\n') {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || reply.len() > 16 << 20 {
            anyhow::bail!(
                "no reply through {} within {REPLY_TIMEOUT:?} (is the server's control socket connected?)",
                port.display()
            );
        }
        let mut pfd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e.into());
        }
        if n == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match file.read(&mut buf)? {
            // The host side is not connected: wait for it.
            0 => std::thread::sleep(Duration::from_millis(50)),
            got => reply.extend_from_slice(&buf[..got]),
        }
    }
    let end = reply
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(reply.len());
    parse_reply(&String::from_utf8_lossy(&reply[..end]), port)
}

fn parse_reply(line: &str, from: &Path) -> anyhow::Result<serde_json::Value> {
    let reply: Reply = serde_json::from_str(line.trim())
        .map_err(|e| anyhow::anyhow!("bad reply from {}: {e}: {line:?}", from.display()))?;
    match (reply.ok, reply.result, reply.error) {
        (true, result, _) => Ok(result.unwrap_or(serde_json::Value::Null)),
        (false, _, error) => Err(anyhow::anyhow!(
            "{}",
            error.unwrap_or_else(|| "request failed".into())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records requests; refuses specs containing "bad".
    #[derive(Default)]
    struct Recorder(Mutex<Vec<ControlRequest>>);

    impl ControlHandler for Recorder {
        fn handle(&self, request: &ControlRequest) -> Result<serde_json::Value, String> {
            self.0.lock().unwrap().push(request.clone());
            match request {
                ControlRequest::Inject { spec } if spec.contains("bad") => {
                    Err(format!("{spec}: refused"))
                }
                _ => Ok(serde_json::json!({"seen": self.0.lock().unwrap().len()})),
            }
        }
    }

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("p2plab-ctl-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn requests_round_trip_and_errors_come_back() {
        let path = temp_path("a.ctl");
        let handler = Arc::new(Recorder::default());
        let server = ControlServer::start(&path, handler.clone()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let result = request(&path, &ControlRequest::Status).unwrap();
        assert_eq!(result["seen"], 1);
        let inject = ControlRequest::Inject {
            spec: "timeout".into(),
        };
        assert_eq!(request(&path, &inject).unwrap()["seen"], 2);
        let err = request(&path, &ControlRequest::Inject { spec: "bad".into() }).unwrap_err();
        assert_eq!(err.to_string(), "bad: refused");
        assert_eq!(
            handler.0.lock().unwrap().as_slice(),
            &[
                ControlRequest::Status,
                inject,
                ControlRequest::Inject { spec: "bad".into() }
            ]
        );
        // A malformed line gets an error reply and the connection stays up.
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"{\"cmd\":\"explode\"}\n{\"cmd\":\"clear\"}\n")
            .unwrap();
        let mut lines = BufReader::new(s).lines();
        let first: Reply = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert!(!first.ok);
        assert!(first.error.unwrap().contains("bad request"));
        let second: Reply = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert!(second.ok);
        drop(server);
        assert!(!path.exists(), "removed on drop");
    }

    #[test]
    fn request_wire_format_is_tagged() {
        let text = serde_json::to_string(&ControlRequest::Inject { spec: "cfs".into() }).unwrap();
        assert_eq!(text, r#"{"cmd":"inject","spec":"cfs"}"#);
        assert_eq!(
            serde_json::from_str::<ControlRequest>(r#"{"cmd":"reset"}"#).unwrap(),
            ControlRequest::Reset
        );
        assert_eq!(
            default_control_path(Path::new("/run/x/nvme0.sock")),
            PathBuf::from("/run/x/nvme0.ctl")
        );
    }

    /// A device with a trace.
    struct Traced(p2plab_trace::Tracer);

    impl ControlHandler for Traced {
        fn handle(&self, _: &ControlRequest) -> Result<serde_json::Value, String> {
            Err("only trace here".into())
        }

        fn tracer(&self) -> Option<&p2plab_trace::Tracer> {
            Some(&self.0)
        }
    }

    /// Catches a `trace` request that does not reach the device's tracer,
    /// or a device without one that answers as if it had.
    #[test]
    fn trace_requests_switch_the_tracer() {
        let path = temp_path("t.ctl");
        let file = temp_path("t.trace.jsonl");
        let _ = std::fs::remove_file(&file);
        let handler = Arc::new(Traced(p2plab_trace::Tracer::new()));
        let server = ControlServer::start(&path, handler.clone()).unwrap();
        let on = |on| request(&path, &ControlRequest::Trace { on });
        let err = on(Some(true)).unwrap_err().to_string();
        assert!(err.contains("no trace file configured"), "{err}");
        handler.0.configure(&file, "dev0");
        let reply = on(Some(true)).unwrap();
        assert_eq!(reply["on"], true);
        assert_eq!(reply["path"], file.display().to_string());
        assert!(handler.0.on());
        assert_eq!(on(None).unwrap()["on"], true, "asking changes nothing");
        assert_eq!(on(Some(false)).unwrap()["on"], false);
        assert!(!handler.0.on());
        assert_eq!(
            serde_json::to_string(&ControlRequest::Trace { on: None }).unwrap(),
            r#"{"cmd":"trace"}"#
        );
        drop(server);
        let plain = temp_path("p.ctl");
        let server = ControlServer::start(&plain, Arc::new(Recorder::default())).unwrap();
        let err = request(&plain, &ControlRequest::Trace { on: Some(true) }).unwrap_err();
        assert_eq!(err.to_string(), "this device has no trace");
        drop(server);
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn refuses_to_replace_a_regular_file() {
        let path = temp_path("plain");
        std::fs::write(&path, b"keep").unwrap();
        let err = ControlServer::start(&path, Arc::new(Recorder::default())).err();
        assert!(err.is_some());
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
        std::fs::remove_file(&path).unwrap();
    }
}
