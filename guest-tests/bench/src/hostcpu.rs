//! Server CPU per I/O, measured on the host the same way for every NVMe
//! server: the guest prints a `HOSTMARK LABEL begin|end` mark (with its
//! block-layer counters of nvme0n1) around each compared job and sleeps a
//! second; a thread here follows the console and, at each mark, reads the
//! server's CPU time. Total is the CPU the server's process (or threads)
//! used; busy leaves out the time it spent polling while idle, from the
//! server's own accounting:
//!
//! - p2plab-nvme: its stats file's `process` (user + system) less
//!   `idle_poll_cpu_us` (the bench sets `--stats-interval-ms 50`).
//! - QEMU's nvme: the QEMU process less its vCPU threads (`CPU n/TCG`,
//!   `CPU n/KVM`; named by `-name ...,debug-threads=on`), i.e. the main
//!   loop that runs the nvme model and the thread pool that runs its
//!   `aio=threads` I/O. It does not poll: busy is total.
//! - SPDK: `nvmf_tgt`'s process from /proc; busy is the reactors'
//!   `busy` ticks over `tick_rate` (`framework_get_reactors`).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use p2plab_lab::console::LogFollower;
use serde_json::{json, Value};

use crate::guest_output::after;

/// /proc's clock ticks per second (USER_HZ, 100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

/// CPU time of a server at one moment, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTime {
    pub total_us: f64,
    pub busy_us: f64,
}

/// How to read one kind of server's CPU time.
#[derive(Clone, Debug)]
pub enum Meter {
    /// p2plab-nvme: its stats file.
    P2plab { stats: PathBuf },
    /// QEMU's own device models: the process less its vCPU threads.
    Qemu { pid: u32 },
    /// SPDK's nvmf_tgt: /proc for total, the reactors for busy.
    Spdk { pid: u32, rpc: PathBuf },
}

impl Meter {
    pub fn sample(&self) -> Result<CpuTime> {
        match self {
            Meter::P2plab { stats } => {
                let text = std::fs::read_to_string(stats)
                    .with_context(|| format!("reading {}", stats.display()))?;
                let v: Value = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", stats.display()))?;
                p2plab_cpu(&v).with_context(|| format!("{}", stats.display()))
            }
            Meter::Qemu { pid } => {
                let total = proc_cpu_us(&format!("/proc/{pid}/stat"))?;
                let mut vcpus = 0.0;
                let tasks = format!("/proc/{pid}/task");
                for entry in
                    std::fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))?
                {
                    let dir = entry?.path();
                    let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
                    if is_vcpu_thread(&comm) {
                        // A thread may end between the listing and the read.
                        vcpus += proc_cpu_us(&dir.join("stat").to_string_lossy()).unwrap_or(0.0);
                    }
                }
                let own = (total - vcpus).max(0.0);
                Ok(CpuTime {
                    total_us: own,
                    busy_us: own,
                })
            }
            Meter::Spdk { pid, rpc } => {
                let total_us = proc_cpu_us(&format!("/proc/{pid}/stat"))?;
                let reactors = rpc_call(rpc, "framework_get_reactors", None)?;
                let busy_us = reactors_busy_us(&reactors)?;
                Ok(CpuTime { total_us, busy_us })
            }
        }
    }
}

/// A vCPU thread of QEMU by its name (`CPU 0/TCG`, `CPU 1/KVM`).
fn is_vcpu_thread(comm: &str) -> bool {
    let comm = comm.trim();
    comm.starts_with("CPU ") && (comm.ends_with("/TCG") || comm.ends_with("/KVM"))
}

/// p2plab's stats document: total and busy CPU, µs.
fn p2plab_cpu(v: &Value) -> Result<CpuTime> {
    let p = &v["process"];
    match (
        p["cpu_user_us"].as_u64(),
        p["cpu_system_us"].as_u64(),
        p["idle_poll_cpu_us"].as_u64(),
    ) {
        (Some(user), Some(system), Some(idle)) => {
            let total = (user + system) as f64;
            Ok(CpuTime {
                total_us: total,
                busy_us: (total - idle as f64).max(0.0),
            })
        }
        _ => bail!("no process CPU time (cpu_user_us, cpu_system_us, idle_poll_cpu_us)"),
    }
}

/// utime + stime of a /proc `stat` file, µs.
fn proc_cpu_us(path: &str) -> Result<f64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    parse_stat_cpu_us(&text).with_context(|| format!("{path}: {text:?}"))
}

fn parse_stat_cpu_us(text: &str) -> Option<f64> {
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'; utime and stime are fields 14 and 15 (state is 3).
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 1e6 / USER_HZ)
}

/// The reactors' busy time, µs, from `framework_get_reactors`' result.
fn reactors_busy_us(result: &Value) -> Result<f64> {
    let tick_rate = result["tick_rate"]
        .as_u64()
        .filter(|&t| t > 0)
        .with_context(|| format!("no tick_rate in {result}"))?;
    let reactors = result["reactors"]
        .as_array()
        .filter(|r| !r.is_empty())
        .with_context(|| format!("no reactors in {result}"))?;
    let mut busy = 0u64;
    for r in reactors {
        busy += r["busy"]
            .as_u64()
            .with_context(|| format!("a reactor without busy ticks: {r}"))?;
    }
    Ok(busy as f64 * 1e6 / tick_rate as f64)
}

/// One JSON-RPC 2.0 call on SPDK's RPC socket; its `result`.
pub fn rpc_call(socket: &Path, method: &str, params: Option<Value>) -> Result<Value> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to SPDK's RPC socket {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut request = json!({"jsonrpc": "2.0", "method": method, "id": 1});
    if let Some(params) = params {
        request["params"] = params;
    }
    stream.write_all(request.to_string().as_bytes())?;
    let reply: Value = serde_json::Deserializer::from_reader(&mut stream)
        .into_iter::<Value>()
        .next()
        .with_context(|| format!("SPDK closed its RPC socket without answering {method}"))?
        .with_context(|| format!("SPDK's answer to {method} is not JSON"))?;
    if let Some(error) = reply.get("error") {
        bail!("SPDK's {method} failed: {error}");
    }
    reply
        .get("result")
        .cloned()
        .with_context(|| format!("SPDK's answer to {method} has no result: {reply}"))
}

/// A CPU reading at a guest mark: `(label, begin|end)` → time.
pub type Marks = BTreeMap<(String, String), CpuTime>;

/// The thread that follows a boot's console and reads the meter at each
/// mark.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Marks>>,
}

/// `(label, at)` of a console line with a `HOSTMARK` mark.
fn parse_mark(line: &str) -> Option<(String, String)> {
    let mut words = after(line, "HOSTMARK ")?.split_whitespace();
    let label = words.next()?;
    let at = words.next().filter(|a| *a == "begin" || *a == "end")?;
    Some((label.to_owned(), at.to_owned()))
}

impl Watcher {
    pub fn start(console: &Path, meter: Meter) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let console = console.to_path_buf();
        let thread = std::thread::spawn(move || {
            let mut follower = LogFollower::new(&console);
            let mut marks = Marks::new();
            loop {
                let last = stopped.load(Ordering::Relaxed);
                for line in follower.poll_lines() {
                    if let Some(key) = parse_mark(&line) {
                        let time = meter
                            .sample()
                            .with_context(|| format!("server CPU at {} {}", key.0, key.1))?;
                        marks.insert(key, time);
                    }
                }
                if last {
                    return Ok(marks);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Watcher { stop, thread }
    }

    /// Stops following (after a last look) and returns the readings.
    pub fn finish(self) -> Result<Marks> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(marks) => marks,
            Err(_) => bail!("the server CPU watcher panicked"),
        }
    }
}

/// Server CPU of one job: per I/O the guest completed on nvme0n1 and per
/// MiB it moved, between the job's marks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct JobCost {
    pub total_us_per_io: f64,
    pub busy_us_per_io: f64,
    pub total_us_per_mib: f64,
    pub busy_us_per_mib: f64,
}

/// The guest's nvme0n1 counters at a mark: (I/Os, bytes).
fn guest_counters(output: &str, label: &str, at: &str) -> Result<(f64, f64)> {
    let line = after(output, &format!("HOSTMARK {label} {at} "))
        .with_context(|| format!("no HOSTMARK mark {at} of {label} in the guest output"))?;
    let word = |key: &str| -> Result<f64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no {key} in {line:?}"))
    };
    let ios = word("reads")? + word("writes")?;
    let bytes = (word("read_sectors")? + word("write_sectors")?) * 512.0;
    Ok((ios, bytes))
}

/// The cost of job `label`: the CPU readings at its marks over the I/Os
/// and bytes the guest counted between the same marks.
pub fn job_cost(output: &str, marks: &Marks, label: &str) -> Result<JobCost> {
    let reading = |at: &str| {
        marks
            .get(&(label.to_owned(), at.to_owned()))
            .copied()
            .with_context(|| format!("no server CPU reading at the {at} of {label}"))
    };
    let (begin, end) = (reading("begin")?, reading("end")?);
    let (ios0, bytes0) = guest_counters(output, label, "begin")?;
    let (ios1, bytes1) = guest_counters(output, label, "end")?;
    let (ios, bytes) = (ios1 - ios0, bytes1 - bytes0);
    if ios <= 0.0 || bytes <= 0.0 {
        bail!("{label}: the guest completed no I/O between the marks");
    }
    let total = end.total_us - begin.total_us;
    let busy = end.busy_us - begin.busy_us;
    let mib = bytes / (1024.0 * 1024.0);
    Ok(JobCost {
        total_us_per_io: total / ios,
        busy_us_per_io: busy / ios,
        total_us_per_mib: total / mib,
        busy_us_per_mib: busy / mib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: utime/stime taken from the wrong fields (a command name
    /// with spaces and parentheses shifts them), or ticks not turned into µs.
    #[test]
    fn proc_stat_cpu_is_utime_plus_stime() {
        let stat = "4242 (qemu (x) 1) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 9 0";
        assert_eq!(parse_stat_cpu_us(stat), Some(2_000_000.0));
        assert_eq!(parse_stat_cpu_us("4242 (x) S 1"), None);
    }

    /// Catches: vCPU threads counted as device emulation, or device
    /// threads (the main loop, `worker`) left out.
    #[test]
    fn vcpu_threads_are_told_by_name() {
        assert!(is_vcpu_thread("CPU 0/TCG\n"));
        assert!(is_vcpu_thread("CPU 11/KVM"));
        assert!(!is_vcpu_thread("qemu-system-x86"));
        assert!(!is_vcpu_thread("worker"));
        assert!(!is_vcpu_thread("CPU 0/OTHER"));
    }

    /// Catches: SPDK's busy time not summed over the reactors, not turned
    /// from ticks into µs, or a reply without reactors read as zero.
    #[test]
    fn spdk_busy_is_the_reactors_busy_ticks() {
        let reply = json!({"tick_rate": 2_000_000_000u64, "reactors": [
            {"lcore": 0, "busy": 4_000_000_000u64, "idle": 10},
            {"lcore": 1, "busy": 2_000_000_000u64, "idle": 10}]});
        assert_eq!(reactors_busy_us(&reply).unwrap(), 3_000_000.0);
        assert!(reactors_busy_us(&json!({"tick_rate": 1, "reactors": []})).is_err());
        assert!(reactors_busy_us(&json!({"reactors": [{"busy": 1}]})).is_err());
        assert!(reactors_busy_us(&json!({"tick_rate": 1, "reactors": [{"idle": 1}]})).is_err());
    }

    /// Catches: p2plab's busy time with the idle polling left in.
    #[test]
    fn p2plab_busy_leaves_out_idle_polling() {
        let v =
            json!({"process": {"cpu_user_us": 700, "cpu_system_us": 300, "idle_poll_cpu_us": 400}});
        assert_eq!(
            p2plab_cpu(&v).unwrap(),
            CpuTime {
                total_us: 1000.0,
                busy_us: 600.0
            }
        );
        assert!(p2plab_cpu(&json!({"process": {}})).is_err());
    }

    /// Catches: a cost from the wrong job's marks, I/Os or bytes of one
    /// direction only, busy and total swapped, and a job with no I/O.
    #[test]
    fn job_cost_is_cpu_over_the_guests_ios_and_bytes() {
        let output = "\
HOSTMARK a begin reads=100 read_sectors=800 writes=0 write_sectors=0
HOSTMARK a end reads=1100 read_sectors=8800 writes=1000 write_sectors=8000
HOSTMARK b begin reads=5 read_sectors=5 writes=5 write_sectors=5
[  1.0] noise HOSTMARK b end reads=5 read_sectors=5 writes=5 write_sectors=5
";
        let mut marks = Marks::new();
        let t = |total_us, busy_us| CpuTime { total_us, busy_us };
        marks.insert(("a".into(), "begin".into()), t(1000.0, 500.0));
        marks.insert(("a".into(), "end".into()), t(9000.0, 4500.0));
        marks.insert(("b".into(), "begin".into()), t(0.0, 0.0));
        marks.insert(("b".into(), "end".into()), t(1.0, 1.0));
        let cost = job_cost(output, &marks, "a").unwrap();
        // 2000 I/Os, 16000 sectors = 7.8125 MiB.
        assert_eq!(cost.total_us_per_io, 4.0);
        assert_eq!(cost.busy_us_per_io, 2.0);
        assert_eq!(cost.total_us_per_mib, 8000.0 / 7.8125);
        assert_eq!(cost.busy_us_per_mib, 4000.0 / 7.8125);
        assert!(job_cost(output, &marks, "b").is_err(), "no I/O");
        assert!(job_cost(output, &marks, "c").is_err(), "no marks");
        assert_eq!(
            parse_mark("x HOSTMARK a end reads=1"),
            Some(("a".into(), "end".into()))
        );
        assert_eq!(parse_mark("HOSTMARK a middle"), None);
        // The guest-side P2P marks look for `CPU LABEL begin `: a host
        // mark must not read as one.
        let line = "HOSTMARK a begin reads=1";
        assert!(!line.contains("CPU a begin "));
    }
}
