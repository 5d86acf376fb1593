//! Decoded device traces.
//!
//! A device model owns a [`Tracer`]. Each hook is
//! `tracer.record("kind", || json!({...}))`: while tracing is off that is
//! one relaxed atomic load and a branch, and the closure that decodes the
//! event never runs. While on, each event is one JSON line appended to the
//! device's trace file (`<run folder>/<id>.trace.jsonl` by default).
//!
//! Line format (one object per line):
//!
//! - the first line after each switch-on is a `trace-start` header:
//!   `{"kind":"trace-start","t_ns":0,"device":"nvme0","pid":123,"wall_ns_at_t0":...}`.
//!   `t_ns` of every event counts nanoseconds of the monotonic clock since
//!   the tracer was created; `wall_ns_at_t0` is the wall clock (Unix ns) at
//!   that moment, so files of several devices line up.
//! - every event has `kind` and `t_ns`; an event that lasts (a command, a
//!   job) has `dur_ns` and `t_ns` is its start; an injected fault carries
//!   `"injected":true`.
//!
//! - a trace file never grows past its cap ([`Tracer::set_max_bytes`],
//!   [`DEFAULT_MAX_BYTES`] unless set; what the file held before counts
//!   too): the event that would cross it is dropped, a last `trace-stop`
//!   line with `"reason":"max-bytes"` is written, and recording stops
//!   ([`TraceStatus::stopped_at_cap`]). It stays off until switched on
//!   again, which works once the file was moved away or truncated. Stop,
//!   not rotate: one file per device keeps its `trace-start` header (the
//!   clock base every later line needs) and the start of the story, the
//!   tools read it as it is, and the disk use is exactly the cap.
//!
//! [`human`] turns an event into the line `p2plab-ctl trace --follow`
//! prints; [`chrome`] turns trace files into Chrome trace-event JSON that
//! ui.perfetto.dev and chrome://tracing open.

#![deny(missing_docs)]

pub mod chrome;
mod human;

pub use human::human;

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// The file a trace goes to when none is given: the device's socket path
/// with the extension `trace.jsonl` (`runs/x/nvme0.sock` →
/// `runs/x/nvme0.trace.jsonl`).
pub fn default_trace_path(socket: &Path) -> PathBuf {
    socket.with_extension("trace.jsonl")
}

/// The device name a socket path stands for (`nvme0.sock` → `nvme0`).
pub fn device_name(socket: &Path) -> String {
    socket
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "device".into())
}

/// The cap on a trace file when none is set: 256 MiB, about a million
/// NVMe command events.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// The smallest cap [`Tracer::set_max_bytes`] takes: room for the
/// `trace-start` header, a few events and the closing `trace-stop` line.
pub const MIN_MAX_BYTES: u64 = 1024;

/// Room kept below the cap for the `trace-stop` line that closes a full
/// file (the line is under 120 bytes).
const STOP_LINE_ROOM: u64 = 160;

/// Where and as what a tracer writes.
struct Sink {
    path: PathBuf,
    device: String,
    file: Option<File>,
    /// Bytes in the file: what it held when opened plus what we wrote.
    bytes: u64,
    /// Recording stopped because the next event would have crossed the
    /// cap.
    stopped_at_cap: bool,
}

/// A device's trace recorder. Off until [`enable`](Self::enable)d; a
/// tracer without a [`configure`](Self::configure)d file cannot be
/// switched on.
pub struct Tracer {
    on: AtomicBool,
    base: Instant,
    wall_ns_at_base: u64,
    events: AtomicU64,
    max_bytes: AtomicU64,
    sink: Mutex<Option<Sink>>,
}

impl Default for Tracer {
    fn default() -> Self {
        Self::new()
    }
}

/// What the control socket reports about a tracer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceStatus {
    /// Whether events are being recorded.
    pub on: bool,
    /// The trace file, once configured.
    pub path: Option<PathBuf>,
    /// Events written since the process started.
    pub events: u64,
    /// Bytes in the trace file (0 until it was first opened).
    pub bytes: u64,
    /// The cap on the file's size.
    pub max_bytes: u64,
    /// Recording stopped by itself because the file reached its cap.
    pub stopped_at_cap: bool,
}

impl TraceStatus {
    /// As JSON for the control socket: `{"on":..,"path":..,"events":..,
    /// "bytes":..,"max_bytes":..,"stopped_at_cap":..}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "on": self.on,
            "path": self.path.as_ref().map(|p| p.display().to_string()),
            "events": self.events,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "stopped_at_cap": self.stopped_at_cap,
        })
    }
}

impl Tracer {
    /// An off tracer with no file.
    pub fn new() -> Self {
        let wall_ns_at_base = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            on: AtomicBool::new(false),
            base: Instant::now(),
            wall_ns_at_base,
            events: AtomicU64::new(0),
            max_bytes: AtomicU64::new(DEFAULT_MAX_BYTES),
            sink: Mutex::new(None),
        }
    }

    /// Caps the trace file at `max_bytes` (at least [`MIN_MAX_BYTES`]);
    /// a smaller value is refused with a message naming the floor.
    pub fn set_max_bytes(&self, max_bytes: u64) -> Result<(), String> {
        if max_bytes < MIN_MAX_BYTES {
            return Err(format!(
                "{max_bytes} bytes is below the smallest trace cap, {MIN_MAX_BYTES}"
            ));
        }
        let _sink = self.sink();
        self.max_bytes.store(max_bytes, Ordering::Relaxed);
        Ok(())
    }

    fn sink(&self) -> MutexGuard<'_, Option<Sink>> {
        // A panic while writing a line leaves nothing half-updated that
        // matters: keep tracing.
        self.sink.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the file events go to and the device name in its header. The
    /// file is opened (for appending) when tracing is switched on.
    pub fn configure(&self, path: &Path, device: &str) {
        let mut sink = self.sink();
        self.on.store(false, Ordering::Relaxed);
        *sink = Some(Sink {
            path: path.to_path_buf(),
            device: device.to_string(),
            file: None,
            bytes: 0,
            stopped_at_cap: false,
        });
    }

    /// Whether events are being recorded: one relaxed load, the whole
    /// cost of a hook while tracing is off.
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Switches recording on, opening the file (for appending) and writing
    /// a `trace-start` header. Fails without a configured file, or when
    /// the file holds too much to take the header under the cap (then it
    /// must be moved away or truncated first).
    pub fn enable(&self) -> io::Result<()> {
        let mut guard = self.sink();
        let Some(sink) = guard.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no trace file configured",
            ));
        };
        if self.on() {
            return Ok(());
        }
        // Opened afresh at each switch-on, so a file moved away or
        // truncated meanwhile starts a new count.
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&sink.path)?;
        sink.bytes = file.metadata()?.len();
        sink.file = Some(file);
        let header = serde_json::json!({
            "kind": "trace-start",
            "t_ns": self.now_ns(),
            "device": sink.device,
            "pid": std::process::id(),
            "wall_ns_at_t0": self.wall_ns_at_base,
        });
        let line = json_line(&header)?;
        let max = self.max_bytes.load(Ordering::Relaxed);
        if !fits(sink.bytes, line.len(), max) {
            sink.stopped_at_cap = true;
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "{} holds {} bytes, at its cap of {max} (--trace-max-bytes): \
                     move it away or truncate it, then switch the trace on again",
                    sink.path.display(),
                    sink.bytes
                ),
            ));
        }
        sink.append(&line)?;
        sink.stopped_at_cap = false;
        self.on.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Switches recording off (a `trace-stop` line marks where).
    pub fn disable(&self) {
        let mut guard = self.sink();
        if !self.on() {
            return;
        }
        self.on.store(false, Ordering::Relaxed);
        if let Some(sink) = guard.as_mut() {
            let stop = serde_json::json!({"kind": "trace-stop", "t_ns": self.now_ns()});
            // The room below the cap was kept for this line.
            if let Ok(line) = json_line(&stop) {
                let _ = sink.append(&line);
            }
        }
    }

    /// Where the tracer stands.
    pub fn status(&self) -> TraceStatus {
        let guard = self.sink();
        TraceStatus {
            on: self.on(),
            path: guard.as_ref().map(|s| s.path.clone()),
            events: self.events.load(Ordering::Relaxed),
            bytes: guard.as_ref().map_or(0, |s| s.bytes),
            max_bytes: self.max_bytes.load(Ordering::Relaxed),
            stopped_at_cap: guard.as_ref().is_some_and(|s| s.stopped_at_cap),
        }
    }

    /// Nanoseconds since the tracer was created (the `t_ns` clock).
    pub fn now_ns(&self) -> u64 {
        self.ns_at(Instant::now())
    }

    /// `t_ns` of an instant (0 for instants before the tracer).
    pub fn ns_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records an event of `kind` at this moment, if tracing is on.
    /// `fields` (a JSON object) runs only then.
    #[inline(always)]
    pub fn record(&self, kind: &str, fields: impl FnOnce() -> Value) {
        if self.on() {
            self.write(kind, None, fields());
        }
    }

    /// Records an event that began at `start` and ends now (a command, a
    /// job): `t_ns` is its start and `dur_ns` its length.
    #[inline(always)]
    pub fn record_span(&self, kind: &str, start: Instant, fields: impl FnOnce() -> Value) {
        if self.on() {
            self.write(kind, Some(start), fields());
        }
    }

    #[cold]
    fn write(&self, kind: &str, start: Option<Instant>, fields: Value) {
        let now = Instant::now();
        let mut event = Map::new();
        event.insert("kind".into(), kind.into());
        match start {
            Some(start) => {
                event.insert("t_ns".into(), self.ns_at(start).into());
                let dur = now.saturating_duration_since(start).as_nanos();
                event.insert(
                    "dur_ns".into(),
                    u64::try_from(dur).unwrap_or(u64::MAX).into(),
                );
            }
            None => {
                event.insert("t_ns".into(), self.ns_at(now).into());
            }
        }
        if let Value::Object(fields) = fields {
            for (k, v) in fields {
                event.entry(k).or_insert(v);
            }
        }
        let Ok(line) = json_line(&Value::Object(event)) else {
            return;
        };
        let mut guard = self.sink();
        // Switched off (or reconfigured) while this event was decoded.
        if !self.on() {
            return;
        }
        let Some(sink) = guard.as_mut() else {
            return;
        };
        let max = self.max_bytes.load(Ordering::Relaxed);
        if !fits(sink.bytes, line.len(), max) {
            self.on.store(false, Ordering::Relaxed);
            sink.stopped_at_cap = true;
            let stop = serde_json::json!({
                "kind": "trace-stop",
                "t_ns": self.ns_at(now),
                "reason": "max-bytes",
                "max_bytes": max,
            });
            if let Ok(line) = json_line(&stop) {
                let _ = sink.append(&line);
            }
            return;
        }
        if sink.append(&line).is_ok() {
            self.events.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Sink {
    /// Appends one line in one write, so a reader never sees half an
    /// event, and counts it.
    fn append(&mut self, line: &str) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "trace file not open",
            ));
        };
        file.write_all(line.as_bytes())?;
        self.bytes = self.bytes.saturating_add(line.len() as u64);
        Ok(())
    }
}

/// Whether a line of `len` bytes fits in a file holding `bytes` under
/// `max`, with room left for the closing `trace-stop` line.
fn fits(bytes: u64, len: usize, max: u64) -> bool {
    bytes
        .saturating_add(len as u64)
        .saturating_add(STOP_LINE_ROOM)
        <= max
}

/// `value` as one line of JSON, newline included.
fn json_line(value: &Value) -> io::Result<String> {
    let mut text = serde_json::to_string(value).map_err(io::Error::other)?;
    text.push('\n');
    Ok(text)
}

/// `value` as `0x…` for addresses and raw register values in events.
pub fn hex(value: u64) -> String {
    format!("{value:#x}")
}

/// Parses a trace file's lines; a line that is not a JSON object (a
/// write torn by a crash) is an error naming its line number.
pub fn parse_lines(text: &str) -> Result<Vec<Value>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| match serde_json::from_str::<Value>(line) {
            Ok(v @ Value::Object(_)) => Ok(v),
            Ok(_) => Err(format!("line {}: not a JSON object", i + 1)),
            Err(e) => Err(format!("line {}: {e}", i + 1)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::AtomicUsize;

    fn temp(name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("p2plab-trace-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        path
    }

    /// Catches a recorder that decodes events while off (the cost the
    /// hot path must not pay) or writes them.
    #[test]
    fn off_runs_no_decoder_and_writes_nothing() {
        let path = temp("off.jsonl");
        let tracer = Tracer::new();
        tracer.configure(&path, "nvme0");
        let decoded = AtomicUsize::new(0);
        for _ in 0..100 {
            tracer.record("cmd", || {
                decoded.fetch_add(1, Ordering::Relaxed);
                json!({})
            });
        }
        assert_eq!(decoded.load(Ordering::Relaxed), 0);
        assert!(!path.exists(), "nothing opened while off");
        assert_eq!(tracer.status().events, 0);
    }

    /// Catches lines that are not JSON, a missing header, spans without
    /// their start/duration, and events written after switch-off.
    #[test]
    fn on_writes_header_events_and_spans_then_off_stops() {
        let path = temp("on.jsonl");
        let tracer = Tracer::new();
        assert!(tracer.enable().is_err(), "no file configured");
        tracer.configure(&path, "gpu0");
        tracer.enable().unwrap();
        let start = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        tracer.record_span("job", start, || json!({"name": "COPY", "kind": "ignored"}));
        tracer.record("irq", || json!({"vector": 3}));
        tracer.disable();
        tracer.record("irq", || json!({"vector": 4}));
        let lines = parse_lines(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[0]["kind"], "trace-start");
        assert_eq!(lines[0]["device"], "gpu0");
        assert_eq!(lines[0]["pid"], std::process::id());
        assert!(lines[0]["wall_ns_at_t0"].as_u64().unwrap() > 1_600_000_000_000_000_000);
        assert_eq!(lines[1]["kind"], "job", "a field cannot override the kind");
        assert_eq!(lines[1]["name"], "COPY");
        let dur = lines[1]["dur_ns"].as_u64().unwrap();
        assert!(dur >= 2_000_000, "{dur}");
        assert_eq!(lines[1]["t_ns"].as_u64().unwrap(), tracer.ns_at(start));
        assert_eq!(lines[2]["vector"], 3);
        assert!(lines[2]["t_ns"].as_u64() >= lines[1]["t_ns"].as_u64());
        assert_eq!(lines[3]["kind"], "trace-stop");
        assert_eq!(tracer.status().events, 2);
        assert!(!tracer.status().on);
        std::fs::remove_file(&path).unwrap();
    }

    /// Catches a trace file that grows past its cap, a tracer that keeps
    /// recording (or says it does) once full, a full file that is not
    /// marked as such, a status that miscounts the bytes, and a full file
    /// that can be switched on again without being emptied first.
    #[test]
    fn a_full_trace_file_stops_at_its_cap() {
        let path = temp("cap.jsonl");
        let tracer = Tracer::new();
        assert_eq!(tracer.status().max_bytes, DEFAULT_MAX_BYTES);
        assert!(tracer.set_max_bytes(MIN_MAX_BYTES - 1).is_err());
        let cap = 2048;
        tracer.set_max_bytes(cap).unwrap();
        tracer.configure(&path, "nvme0");
        tracer.enable().unwrap();
        for i in 0..1000 {
            tracer.record(
                "cmd",
                || json!({"name": "Read", "slba": i, "pad": "x".repeat(40)}),
            );
        }
        let status = tracer.status();
        assert!(!status.on, "recording stops at the cap");
        assert!(status.stopped_at_cap);
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len <= cap, "{len} bytes past the cap of {cap}");
        assert!(len > cap / 2, "{len}: stopped far below the cap");
        assert_eq!(status.bytes, len);
        let lines = parse_lines(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let last = lines.last().unwrap();
        assert_eq!(last["kind"], "trace-stop");
        assert_eq!(last["reason"], "max-bytes");
        assert_eq!(last["max_bytes"], cap);
        assert_eq!(
            status.events as usize,
            lines.len() - 2,
            "header and stop aside"
        );
        assert_eq!(status.to_json()["stopped_at_cap"], true);
        assert_eq!(status.to_json()["max_bytes"], cap);

        // Still full: switching on is refused, naming the cap.
        let err = tracer.enable().unwrap_err().to_string();
        assert!(err.contains("2048") && err.contains("truncate"), "{err}");
        assert!(!tracer.on());
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            len,
            "nothing added"
        );
        // Emptied, it records again, counting from the new size.
        std::fs::write(&path, b"").unwrap();
        tracer.enable().unwrap();
        assert!(tracer.on());
        let status = tracer.status();
        assert!(!status.stopped_at_cap);
        assert_eq!(status.bytes, std::fs::metadata(&path).unwrap().len());
        tracer.disable();
        std::fs::remove_file(&path).unwrap();
    }

    /// Catches a cap that forgets what the file held before this process
    /// (a restarted server appends to the same file).
    #[test]
    fn the_cap_counts_what_the_file_already_held() {
        let path = temp("held.jsonl");
        std::fs::write(&path, vec![b'\n'; 1900]).unwrap();
        let tracer = Tracer::new();
        tracer.set_max_bytes(2048).unwrap();
        tracer.configure(&path, "gpu0");
        assert!(
            tracer.enable().is_err(),
            "no room for the header and its stop line"
        );
        assert!(tracer.status().stopped_at_cap);
        tracer.set_max_bytes(4096).unwrap();
        tracer.enable().unwrap();
        assert!(tracer.status().bytes > 1900);
        tracer.disable();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn default_paths_sit_next_to_the_socket() {
        assert_eq!(
            default_trace_path(Path::new("/r/nvme0.sock")),
            PathBuf::from("/r/nvme0.trace.jsonl")
        );
        assert_eq!(device_name(Path::new("/r/gpu0.sock")), "gpu0");
    }

    #[test]
    fn torn_lines_are_named() {
        let err = parse_lines("{\"kind\":\"a\",\"t_ns\":1}\n{\"kind\":").unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
    }
}
