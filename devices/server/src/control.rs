//! The control sockets: unix sockets through which `p2plab-ctl` (or a
//! test) asks a running server for its state, arms and clears fault
//! injections, resets the device and switches its trace.
//!
//! Protocol: JSON lines. Each request is one line, a [`ControlRequest`]
//! (`{"cmd":"inject","spec":"timeout,count=1"}`); each reply is one line,
//! `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`.
//!
//! Two [`Channel`]s, each its own socket file (mode 0600 from bind; a peer
//! of another uid is refused with SO_PEERCRED, whatever the file's mode):
//!
//! - the host's (`NAME.ctl` next to the vfio-user socket): every verb;
//! - the guest's (`--guest-control-socket`, off unless given): the socket
//!   QEMU connects a guest's virtio-serial port to. The guest may ask for
//!   `status`, `inject` and `trace`, and `clear`; it may not `reset` (it
//!   resets the function itself, with FLR), nor undo what the host did:
//!   its `clear` is refused while injections armed from the host may be
//!   in place, its `trace off` while the host switched the trace on
//!   ([`Dispatcher`]).
//!
//! [`listener`] serves the sockets (connection caps, timeouts). A
//! [`ControlHandler`] answers the requests; for a device it is
//! [`crate::DeviceHandler`] over the model's `p2plab_kit::DeviceControl`.
//! This module knows no device.

mod listener;

pub use listener::{ControlServer, ControlSockets, IDLE_TIMEOUT, MAX_HOST_CONNECTIONS, MAX_LINE};

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    /// reports it (no `on`). The reply is `{"on":..,"path":..,"events":..,
    /// "bytes":..,"max_bytes":..,"stopped_at_cap":..}`.
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

/// Which socket a request came through, and so what it may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The host's control socket: every verb.
    Host,
    /// The guest's, through QEMU's virtio-serial port: see the module
    /// documentation.
    Guest,
}

impl Channel {
    /// The channel's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Channel::Host => "host",
            Channel::Guest => "guest",
        }
    }
}

/// Answers requests from either channel, holding the guest to its rules.
/// One per device, shared by its sockets; `--inject` flags go through it
/// too (as the host's).
pub struct Dispatcher {
    handler: Arc<dyn ControlHandler>,
    /// The host armed an injection since it last cleared.
    host_armed: AtomicBool,
    /// Who switched the trace on last (`None`: the `--trace` flag, or
    /// nobody through a socket).
    trace_switched_on_by: Mutex<Option<Channel>>,
}

impl Dispatcher {
    /// Answers for `handler`.
    pub fn new(handler: Arc<dyn ControlHandler>) -> Self {
        Self {
            handler,
            host_armed: AtomicBool::new(false),
            trace_switched_on_by: Mutex::new(None),
        }
    }

    /// Answers `request` from `channel`: `trace` from the handler's
    /// tracer, the rest by the handler, unless the channel may not ask it.
    pub fn answer(
        &self,
        channel: Channel,
        request: &ControlRequest,
    ) -> Result<serde_json::Value, String> {
        if channel == Channel::Guest {
            self.guest_may(request)?;
        }
        let ControlRequest::Trace { on } = request else {
            let value = self.handler.handle(request)?;
            match (channel, request) {
                (Channel::Host, ControlRequest::Inject { .. }) => {
                    self.host_armed.store(true, Ordering::Relaxed)
                }
                (Channel::Host, ControlRequest::Clear) => {
                    self.host_armed.store(false, Ordering::Relaxed)
                }
                _ => {}
            }
            return Ok(match request {
                ControlRequest::Status => crate::usage::with_process_usage(value),
                _ => value,
            });
        };
        let tracer = self
            .handler
            .tracer()
            .ok_or_else(|| "this device has no trace".to_string())?;
        let mut switched_on_by = self
            .trace_switched_on_by
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match on {
            Some(true) if !tracer.on() => {
                tracer
                    .enable()
                    .map_err(|e| format!("switching the trace on: {e}"))?;
                *switched_on_by = Some(channel);
            }
            Some(false) => tracer.disable(),
            _ => {}
        }
        Ok(tracer.status().to_json())
    }

    /// Refuses what the guest's channel may not do.
    fn guest_may(&self, request: &ControlRequest) -> Result<(), String> {
        match request {
            ControlRequest::Status | ControlRequest::Inject { .. } => Ok(()),
            ControlRequest::Reset => Err(
                "reset is not offered on the guest channel: reset the function from the guest \
                 (echo 1 > /sys/bus/pci/devices/BDF/reset), or from the host's control socket"
                    .into(),
            ),
            ControlRequest::Clear if self.host_armed.load(Ordering::Relaxed) => Err(
                "injections armed from the host may be in place, and clear would disarm them too: \
                 clear from the host's control socket"
                    .into(),
            ),
            ControlRequest::Clear => Ok(()),
            ControlRequest::Trace { on: Some(false) } => {
                let by = *self
                    .trace_switched_on_by
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let on = self.handler.tracer().is_some_and(|t| t.on());
                if on && by != Some(Channel::Guest) {
                    return Err(
                        "the trace was switched on from the host: switch it off there".into(),
                    );
                }
                Ok(())
            }
            ControlRequest::Trace { .. } => Ok(()),
        }
    }

    /// The reply line (newline included) to a request line.
    pub fn reply_line(&self, channel: Channel, line: &[u8]) -> String {
        let reply = match serde_json::from_slice::<ControlRequest>(line.trim_ascii()) {
            Ok(request) => match self.answer(channel, &request) {
                Ok(result) => Reply::ok(result),
                Err(error) => Reply::error(error),
            },
            Err(e) => Reply::error(format!("bad request: {e}")),
        };
        reply.line()
    }
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

impl Reply {
    fn ok(result: serde_json::Value) -> Self {
        Self {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    fn error(error: impl Into<String>) -> Self {
        Self {
            ok: false,
            result: None,
            error: Some(error.into()),
        }
    }

    /// As one line, newline included.
    fn line(&self) -> String {
        let mut text = serde_json::to_string(self)
            .unwrap_or_else(|e| format!(r#"{{"ok":false,"error":"reply not encodable: {e}"}}"#));
        text.push('\n');
        text
    }
}

/// The control socket of `socket` (the vfio-user socket) when none is
/// given: the same path with the extension `ctl` (`nvme0.sock` →
/// `nvme0.ctl`).
pub fn default_control_path(socket: &Path) -> PathBuf {
    socket.with_extension("ctl")
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
    if line.is_empty() {
        anyhow::bail!("{} closed the connection without a reply", path.display());
    }
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
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;

    /// Records requests; refuses specs containing "bad".
    #[derive(Default)]
    pub(super) struct Recorder(pub(super) Mutex<Vec<ControlRequest>>);

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

    pub(super) fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("p2plab-ctl-test-{}-{name}", std::process::id()))
    }

    /// The host socket alone at `path`, answering for `handler`.
    pub(super) fn host_only(path: &Path, handler: Arc<dyn ControlHandler>) -> ControlServer {
        let sockets = ControlSockets {
            host: path.to_path_buf(),
            guest: None,
        };
        ControlServer::start(&sockets, Arc::new(Dispatcher::new(handler))).unwrap()
    }

    #[test]
    fn requests_round_trip_and_errors_come_back() {
        let path = temp_path("a.ctl");
        let handler = Arc::new(Recorder::default());
        let server = host_only(&path, handler.clone());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let result = request(&path, &ControlRequest::Status).unwrap();
        assert_eq!(result["seen"], 1);
        assert!(result["process"]["cpu_user_us"].is_u64(), "{result}");
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

    /// A device with a trace; records what else it is asked.
    #[derive(Default)]
    struct Traced(p2plab_trace::Tracer, Recorder);

    impl ControlHandler for Traced {
        fn handle(&self, request: &ControlRequest) -> Result<serde_json::Value, String> {
            self.1.handle(request)
        }

        fn tracer(&self) -> Option<&p2plab_trace::Tracer> {
            Some(&self.0)
        }
    }

    /// Catches a `trace` request that does not reach the device's tracer,
    /// a device without one that answers as if it had, or a reply without
    /// the file's size and cap.
    #[test]
    fn trace_requests_switch_the_tracer() {
        let path = temp_path("t.ctl");
        let file = temp_path("t.trace.jsonl");
        let _ = std::fs::remove_file(&file);
        let handler = Arc::new(Traced::default());
        let server = host_only(&path, handler.clone());
        let on = |on| request(&path, &ControlRequest::Trace { on });
        let err = on(Some(true)).unwrap_err().to_string();
        assert!(err.contains("no trace file configured"), "{err}");
        handler.0.configure(&file, "dev0");
        handler.0.set_max_bytes(1 << 20).unwrap();
        let reply = on(Some(true)).unwrap();
        assert_eq!(reply["on"], true);
        assert_eq!(reply["path"], file.display().to_string());
        assert_eq!(reply["max_bytes"], 1 << 20);
        assert_eq!(reply["stopped_at_cap"], false);
        let header = std::fs::metadata(&file).unwrap().len();
        assert!(header > 0);
        assert_eq!(reply["bytes"], header, "the header counts");
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
        let server = host_only(&plain, Arc::new(Recorder::default()));
        let err = request(&plain, &ControlRequest::Trace { on: Some(true) }).unwrap_err();
        assert_eq!(err.to_string(), "this device has no trace");
        drop(server);
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn refuses_to_replace_a_regular_file() {
        let path = temp_path("plain");
        std::fs::write(&path, b"keep").unwrap();
        let sockets = ControlSockets {
            host: temp_path("plain-host.ctl"),
            guest: Some(path.clone()),
        };
        let dispatcher = Arc::new(Dispatcher::new(Arc::new(Recorder::default())));
        assert!(ControlServer::start(&sockets, Arc::clone(&dispatcher)).is_err());
        let host = ControlSockets {
            host: path.clone(),
            guest: None,
        };
        assert!(ControlServer::start(&host, dispatcher).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
        std::fs::remove_file(&path).unwrap();
    }

    /// Catches a guest channel that may reset the device, disarm what the
    /// host armed, or switch off a trace the host switched on; and one
    /// that refuses what the guest may do (status, inject, its own clear
    /// and trace), or a host channel held to the guest's rules.
    #[test]
    fn the_guest_channel_cannot_undo_the_host() {
        let file = temp_path("g.trace.jsonl");
        let _ = std::fs::remove_file(&file);
        let handler = Arc::new(Traced::default());
        handler.0.configure(&file, "dev0");
        let d = Dispatcher::new(handler.clone());
        let (host, guest) = (Channel::Host, Channel::Guest);
        let inject = |spec: &str| ControlRequest::Inject { spec: spec.into() };
        let trace = |on| ControlRequest::Trace { on };

        assert!(d.answer(guest, &ControlRequest::Status).is_ok());
        let err = d.answer(guest, &ControlRequest::Reset).unwrap_err();
        assert!(err.contains("not offered on the guest channel"), "{err}");
        assert!(d.answer(guest, &inject("timeout")).is_ok());
        assert!(d.answer(guest, &ControlRequest::Clear).is_ok(), "its own");

        d.answer(host, &inject("cfs")).unwrap();
        let err = d.answer(guest, &ControlRequest::Clear).unwrap_err();
        assert!(err.contains("armed from the host"), "{err}");
        assert!(d.answer(guest, &inject("timeout")).is_ok());
        d.answer(host, &ControlRequest::Clear).unwrap();
        assert!(d.answer(guest, &ControlRequest::Clear).is_ok());
        // A refused host inject arms nothing.
        assert!(d.answer(host, &inject("bad")).is_err());
        assert!(d.answer(guest, &ControlRequest::Clear).is_ok());

        d.answer(host, &trace(Some(true))).unwrap();
        assert_eq!(d.answer(guest, &trace(Some(true))).unwrap()["on"], true);
        let err = d.answer(guest, &trace(Some(false))).unwrap_err();
        assert!(err.contains("switched on from the host"), "{err}");
        assert!(handler.0.on());
        d.answer(host, &trace(Some(false))).unwrap();
        d.answer(guest, &trace(Some(true))).unwrap();
        assert_eq!(d.answer(guest, &trace(Some(false))).unwrap()["on"], false);
        assert!(!handler.0.on());

        assert!(d.answer(host, &ControlRequest::Reset).is_ok());
        let seen = handler.1 .0.lock().unwrap();
        assert_eq!(
            seen.iter()
                .filter(|r| matches!(r, ControlRequest::Reset | ControlRequest::Clear))
                .count(),
            5,
            "the refused ones never reached the device: {seen:?}"
        );
        drop(seen);
        std::fs::remove_file(&file).unwrap();
    }

    /// Catches a guest socket that is not 0600, that the guest's rules do
    /// not reach, or that serves a second connection beside QEMU's.
    #[test]
    fn the_guest_socket_has_its_own_rules_and_one_connection() {
        let sockets = ControlSockets {
            host: temp_path("h2.ctl"),
            guest: Some(temp_path("h2.guest.ctl")),
        };
        let guest = sockets.guest.clone().unwrap();
        let server = ControlServer::start(
            &sockets,
            Arc::new(Dispatcher::new(Arc::new(Recorder::default()))),
        )
        .unwrap();
        let mode = std::fs::metadata(&guest).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(request(&sockets.host, &ControlRequest::Reset).is_ok());
        let err = request(&guest, &ControlRequest::Reset).unwrap_err();
        assert!(err.to_string().contains("guest channel"), "{err}");
        assert!(request(&guest, &ControlRequest::Status).is_ok());

        let qemu = UnixStream::connect(&guest).unwrap();
        // Served: it gets its reply.
        let mut w = qemu.try_clone().unwrap();
        w.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
        let mut reader = BufReader::new(qemu);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("{\"ok\":true"), "{line}");
        let err = request(&guest, &ControlRequest::Status).unwrap_err();
        assert!(err.to_string().contains("too many connections"), "{err}");
        // The first one is still served.
        w.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
        line.clear();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("{\"ok\":true"), "{line}");
        drop(server);
        assert!(!guest.exists());
    }
}
