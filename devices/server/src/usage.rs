//! The server process's own resource use: CPU time and peak resident
//! memory. It goes into the stats file and every `status` reply, so that a
//! benchmark (or a curious user) can tell what a device costs per command
//! or per byte it moves, without attaching a profiler.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

/// CPU time this process's threads spent spinning while idle (watching a
/// doorbell or holding an interrupt for the host's next submission), in
/// nanoseconds. A device that polls burns CPU while it waits for a slow
/// host, so CPU per byte alone would charge the host's slowness to the
/// device; this is the part to subtract for the device's own cost.
static IDLE_POLL_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// This thread's CPU time so far, in nanoseconds (0 if the clock fails).
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given, which
    // lives across the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return 0;
    }
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}

/// Runs `spin` (a loop that waits for work by polling) and adds the CPU
/// time the calling thread spent in it to the process's idle-poll time,
/// reported as `idle_poll_cpu_us` by [`process_usage`].
pub fn idle_poll<R>(spin: impl FnOnce() -> R) -> R {
    let start = thread_cpu_ns();
    let result = spin();
    let spent = thread_cpu_ns().saturating_sub(start);
    IDLE_POLL_CPU_NS.fetch_add(spent, Ordering::Relaxed);
    result
}

/// `{"pid", "cpu_user_us", "cpu_system_us", "idle_poll_cpu_us",
/// "max_rss_kib"}` of this process so far: its pid (which tells two
/// replies of one server from replies across a restart),
/// `getrusage(RUSAGE_SELF)` (every thread, live and ended), and the part
/// of that CPU time spent in [`idle_poll`].
pub fn process_usage() -> Value {
    // SAFETY: `rusage` is plain data, for which all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given, which lives
    // across the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return json!({});
    }
    let micros = |t: libc::timeval| {
        u64::try_from(t.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000)
            .saturating_add(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    json!({
        "pid": std::process::id(),
        "cpu_user_us": micros(usage.ru_utime),
        "cpu_system_us": micros(usage.ru_stime),
        "idle_poll_cpu_us": IDLE_POLL_CPU_NS.load(Ordering::Relaxed) / 1000,
        "max_rss_kib": usage.ru_maxrss,
    })
}

/// `value` (a JSON object) with a `process` member from
/// [`process_usage`]; anything else is returned as it is.
pub fn with_process_usage(mut value: Value) -> Value {
    if let Some(object) = value.as_object_mut() {
        object.insert("process".into(), process_usage());
    }
    value
}

/// The stats file's JSON text with a `process` member; text that is not
/// a JSON object is returned unchanged.
pub fn stats_with_process_usage(json: &str) -> String {
    match serde_json::from_str::<Value>(json) {
        Ok(value @ Value::Object(_)) => with_process_usage(value).to_string(),
        _ => json.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a usage that does not grow with work done, idle polling
    /// that is not counted (or is counted beyond the CPU time), or a stats
    /// document that loses its own members when `process` is added.
    #[test]
    fn cpu_time_grows_and_stats_keep_their_members() {
        let cpu =
            |v: &Value| v["cpu_user_us"].as_u64().unwrap() + v["cpu_system_us"].as_u64().unwrap();
        let before = process_usage();
        // Spin for 25 ms of this thread's CPU time, not of wall time: on a
        // loaded host a wall-clock loop gets a fraction of a core.
        let start = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() < start + 25_000_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = process_usage();
        assert!(cpu(&after) >= cpu(&before) + 20_000, "{before} -> {after}");
        assert!(after["max_rss_kib"].as_u64().unwrap() > 0);
        // Spinning inside idle_poll is counted as idle polling, and is
        // part of the CPU time; work outside it (above) is not.
        let idle = |v: &Value| v["idle_poll_cpu_us"].as_u64().unwrap();
        let spun = idle_poll(|| {
            let start = thread_cpu_ns();
            let mut x = 1u64;
            while thread_cpu_ns() < start + 20_000_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            std::hint::black_box(x)
        });
        std::hint::black_box(spun);
        let polled = process_usage();
        let idle_growth = idle(&polled) - idle(&after);
        assert!(idle_growth >= 20_000, "{after} -> {polled}");
        assert!(idle(&polled) <= cpu(&polled), "{polled}");
        let text = stats_with_process_usage(r#"{"counters":{"io":3}}"#);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["counters"]["io"], 3);
        assert!(v["process"]["cpu_user_us"].is_u64());
        assert_eq!(stats_with_process_usage("[1]"), "[1]");
    }
}
