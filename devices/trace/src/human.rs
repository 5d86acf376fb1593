//! The human-readable line of an event (`p2plab-ctl trace --follow`).

use std::fmt::Write;

use serde_json::Value;

/// Fields every event has, printed in fixed places rather than as
/// `key=value`.
const FIXED: [&str; 5] = ["kind", "t_ns", "dur_ns", "name", "injected"];

/// One line for `event`: time in seconds, kind, name, the other fields as
/// `key=value` (sorted), the duration, and `INJECTED` for injected faults.
///
/// ```text
/// 12.345678 cmd Read opcode=0x2 sqid=1 cid=5 nsid=1 slba=0 nlb=8 status="Successful Completion" (41.2us)
/// ```
pub fn human(event: &Value) -> String {
    let t = event["t_ns"].as_u64().unwrap_or(0);
    let mut line = format!(
        "{}.{:06} {}",
        t / 1_000_000_000,
        (t % 1_000_000_000) / 1_000,
        event["kind"].as_str().unwrap_or("?")
    );
    if let Some(name) = event["name"].as_str() {
        let _ = write!(line, " {name}");
    }
    if let Value::Object(map) = event {
        for (key, value) in map {
            if FIXED.contains(&key.as_str()) {
                continue;
            }
            let _ = write!(line, " {key}=");
            match value {
                Value::String(s) if !s.contains(' ') && !s.is_empty() => line.push_str(s),
                other => line.push_str(&other.to_string()),
            }
        }
    }
    if let Some(ns) = event["dur_ns"].as_u64() {
        let _ = write!(line, " ({})", duration(ns));
    }
    if event["injected"].as_bool() == Some(true) {
        line.push_str(" INJECTED");
    }
    line
}

fn duration(ns: u64) -> String {
    match ns {
        0..=9_999 => format!("{ns}ns"),
        10_000..=9_999_999 => format!("{:.1}us", ns as f64 / 1e3),
        _ => format!("{:.1}ms", ns as f64 / 1e6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_command_reads_as_one_line() {
        let event = json!({
            "kind": "cmd", "t_ns": 12_345_678_901u64, "dur_ns": 41_234,
            "name": "Read", "sqid": 1, "cid": 5, "status": "Successful Completion",
            "prp1": {"addr": "0x1000", "at": "ram"}, "injected": true,
        });
        assert_eq!(
            human(&event),
            "12.345678 cmd Read cid=5 prp1={\"addr\":\"0x1000\",\"at\":\"ram\"} sqid=1 \
             status=\"Successful Completion\" (41.2us) INJECTED"
        );
        assert_eq!(
            human(&json!({"kind": "irq", "t_ns": 5, "vector": 2})),
            "0.000000 irq vector=2"
        );
    }
}
