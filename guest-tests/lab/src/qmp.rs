//! A small QMP client (QEMU's JSON monitor on `qmp.sock`): run commands,
//! collect asynchronous events, wait for one. Used to hot-unplug and re-plug
//! devices of a running lab.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// How long a command may take to answer. QMP answers `device_del` and
/// `device_add` at once; the guest's part is reported by events.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Granularity of the read loop.
const POLL: Duration = Duration::from_millis(200);

/// An error QEMU returned for a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QmpError {
    pub command: String,
    pub class: String,
    pub desc: String,
}

impl std::fmt::Display for QmpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QMP {}: {} ({})", self.command, self.desc, self.class)
    }
}

impl std::error::Error for QmpError {}

/// One QMP connection in command mode.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// Events read while waiting for something else, oldest first.
    events: VecDeque<Value>,
    /// Bytes of a line not yet complete when a read timed out.
    partial: String,
    greeting: Value,
}

impl Qmp {
    /// Connects to a QMP socket, reads the greeting and leaves capability
    /// negotiation.
    pub fn connect(socket: &Path) -> Result<Self> {
        let stream = UnixStream::connect(socket)
            .with_context(|| format!("connecting to QMP at {}", socket.display()))?;
        stream.set_read_timeout(Some(POLL))?;
        let writer = stream.try_clone()?;
        let mut qmp = Self {
            reader: BufReader::new(stream),
            writer,
            events: VecDeque::new(),
            partial: String::new(),
            greeting: Value::Null,
        };
        let deadline = Instant::now() + REPLY_TIMEOUT;
        qmp.greeting = match qmp.read_message(deadline)? {
            Some(message) if message.get("QMP").is_some() => message,
            Some(other) => bail!("QMP: expected a greeting, got {other}"),
            None => bail!("QMP: no greeting from {}", socket.display()),
        };
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// QEMU's version as `major.minor.micro`, from the greeting.
    pub fn qemu_version(&self) -> String {
        let v = &self.greeting["QMP"]["version"]["qemu"];
        format!("{}.{}.{}", v["major"], v["minor"], v["micro"])
    }

    /// Runs a command and returns its `return` value. A QMP error comes
    /// back as a [`QmpError`] inside the anyhow error.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let mut request = json!({ "execute": command });
        if let Some(arguments) = arguments {
            request["arguments"] = arguments;
        }
        let mut line = request.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .with_context(|| format!("QMP: sending {command}"))?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let Some(message) = self.read_message(deadline)? else {
                bail!("QMP: no answer to {command} within {REPLY_TIMEOUT:?}");
            };
            if message.get("event").is_some() {
                self.events.push_back(message);
            } else if let Some(value) = message.get("return") {
                return Ok(value.clone());
            } else if let Some(error) = message.get("error") {
                return Err(QmpError {
                    command: command.to_owned(),
                    class: error["class"].as_str().unwrap_or_default().to_owned(),
                    desc: error["desc"].as_str().unwrap_or_default().to_owned(),
                }
                .into());
            } else {
                bail!("QMP: unexpected message {message}");
            }
        }
    }

    /// Waits for an event named `name` whose `data` satisfies `matches`,
    /// looking first at events already received. Other events stay queued.
    pub fn wait_event(
        &mut self,
        name: &str,
        matches: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Result<Value> {
        let wanted = |event: &Value| event["event"] == name && matches(&event["data"]);
        if let Some(pos) = self.events.iter().position(wanted) {
            return Ok(self.events.remove(pos).unwrap_or_default());
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.read_message(deadline)? {
                Some(message) if wanted(&message) => return Ok(message),
                Some(message) if message.get("event").is_some() => self.events.push_back(message),
                Some(message) => bail!("QMP: unexpected message {message}"),
                None => bail!(
                    "QMP: no {name} event within {timeout:?} (other events: {:?})",
                    self.events
                ),
            }
        }
    }

    /// Events received so far and not consumed by [`Self::wait_event`].
    pub fn take_events(&mut self) -> Vec<Value> {
        self.events.drain(..).collect()
    }

    /// The next JSON line, or None when `deadline` passed first. QEMU
    /// closing the socket is an error.
    fn read_message(&mut self, deadline: Instant) -> Result<Option<Value>> {
        loop {
            match self.reader.read_line(&mut self.partial) {
                Ok(0) => bail!("QMP: QEMU closed the connection (did it exit?)"),
                Ok(_) if self.partial.ends_with('\n') => {
                    let line = std::mem::take(&mut self.partial);
                    let value: Value = serde_json::from_str(line.trim())
                        .with_context(|| format!("QMP: bad JSON {line:?}"))?;
                    return Ok(Some(value));
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("QMP: reading"),
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    /// A fake QEMU: greets, then answers each request with `replies` in order.
    fn fake_qemu(dir: &Path, replies: Vec<&'static str>) -> std::thread::JoinHandle<Vec<String>> {
        let socket = dir.join("qmp.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream
                .write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 3, \"minor\": 1, \"major\": 11}}, \"capabilities\": []}}\n")
                .unwrap();
            let mut requests = Vec::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            for reply in replies {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                requests.push(line.trim().to_owned());
                stream.write_all(reply.as_bytes()).unwrap();
            }
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
            requests
        })
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("p2plab-qmp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn runs_commands_and_keeps_events_for_later() {
        let dir = temp_dir("events");
        let server = fake_qemu(
            &dir,
            vec![
                "{\"return\": {}}\n",
                // An event arrives before the answer, split across writes.
                "{\"timestamp\": {}, \"event\": \"DEVICE_DELETED\", \"data\": {\"device\": \"nvme0\"}}\n{\"return\": {}}\n",
                "{\"error\": {\"class\": \"DeviceNotFound\", \"desc\": \"Device 'x' not found\"}}\n",
            ],
        );
        let mut qmp = Qmp::connect(&dir.join("qmp.sock")).unwrap();
        assert_eq!(qmp.qemu_version(), "11.1.3");
        qmp.execute("device_del", Some(json!({"id": "nvme0"})))
            .unwrap();
        let event = qmp
            .wait_event(
                "DEVICE_DELETED",
                |d| d["device"] == "nvme0",
                Duration::from_millis(10),
            )
            .unwrap();
        assert_eq!(event["data"]["device"], "nvme0");
        let err = qmp
            .execute("device_del", Some(json!({"id": "x"})))
            .unwrap_err();
        let qmp_err = err.downcast_ref::<QmpError>().unwrap();
        assert_eq!(qmp_err.class, "DeviceNotFound");
        assert!(qmp
            .wait_event("DEVICE_DELETED", |_| true, Duration::from_millis(300))
            .is_err());
        drop(qmp);
        let requests = server.join().unwrap();
        let parsed: Vec<Value> = requests
            .iter()
            .map(|r| serde_json::from_str(r).unwrap())
            .collect();
        assert_eq!(parsed[0], json!({"execute": "qmp_capabilities"}));
        assert_eq!(
            parsed[1],
            json!({"execute": "device_del", "arguments": {"id": "nvme0"}})
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
