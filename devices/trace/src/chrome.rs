//! Chrome trace-event JSON from device trace files, for ui.perfetto.dev
//! or chrome://tracing.
//!
//! Each device process becomes one trace process (named after the device
//! in its `trace-start` header). Events with a duration (commands, jobs)
//! become complete (`X`) events; the rest are instant (`i`) events.
//! Commands of one queue overlap (queue depth > 1) and complete events on
//! one thread must nest, so overlapping ones go to parallel lanes: threads
//! named `sq1 #0`, `sq1 #1`, ... Timestamps come from each file's wall
//! clock at its `t_ns` zero, so files of several devices share one time
//! axis, starting at the earliest event.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// One event placed on the common clock.
struct Placed {
    pid: u64,
    device: String,
    wall_ns: u64,
    event: Value,
}

/// The lane group of an event: commands by queue, the rest by kind.
fn group(event: &Value) -> String {
    match event["sqid"].as_u64() {
        Some(sqid) => format!("sq{sqid}"),
        None => event["kind"].as_str().unwrap_or("events").to_string(),
    }
}

/// Converts trace files (each as its parsed lines, in file order) into a
/// trace-event document. Events before a file's first `trace-start`
/// header have no clock and are an error.
pub fn convert(files: &[(String, Vec<Value>)]) -> Result<Value, String> {
    let mut placed = Vec::new();
    for (name, lines) in files {
        let mut clock: Option<(u64, String, u64)> = None;
        for (i, event) in lines.iter().enumerate() {
            if event["kind"] == "trace-start" {
                let wall = event["wall_ns_at_t0"].as_u64().ok_or_else(|| {
                    format!("{name}: line {}: header without wall_ns_at_t0", i + 1)
                })?;
                let pid = event["pid"].as_u64().unwrap_or(0);
                let device = event["device"].as_str().unwrap_or(name).to_string();
                clock = Some((pid, device, wall));
                continue;
            }
            if event["kind"] == "trace-stop" {
                continue;
            }
            let Some((pid, device, wall)) = &clock else {
                return Err(format!(
                    "{name}: line {}: event before any trace-start header",
                    i + 1
                ));
            };
            let t = event["t_ns"]
                .as_u64()
                .ok_or_else(|| format!("{name}: line {}: no t_ns", i + 1))?;
            placed.push(Placed {
                pid: *pid,
                device: device.clone(),
                wall_ns: wall.saturating_add(t),
                event: event.clone(),
            });
        }
    }
    placed.sort_by_key(|p| p.wall_ns);
    let origin = placed.first().map_or(0, |p| p.wall_ns);
    let us = |ns: u64| (ns - origin) as f64 / 1e3;

    let mut out = Vec::new();
    let mut processes: BTreeMap<u64, String> = BTreeMap::new();
    // (pid, group) -> end time of each lane; (pid, group, lane) -> tid.
    let mut lanes: BTreeMap<(u64, String), Vec<u64>> = BTreeMap::new();
    let mut tids: BTreeMap<(u64, String, usize), u64> = BTreeMap::new();
    for p in &placed {
        processes.entry(p.pid).or_insert_with(|| p.device.clone());
        let kind = p.event["kind"].as_str().unwrap_or("event");
        let name = p.event["name"].as_str().unwrap_or(kind);
        let group = group(&p.event);
        let dur = p.event["dur_ns"].as_u64();
        let end = p.wall_ns.saturating_add(dur.unwrap_or(0));
        let ends = lanes.entry((p.pid, group.clone())).or_default();
        let lane = match ends.iter().position(|&e| e <= p.wall_ns) {
            Some(lane) => lane,
            None => {
                ends.push(0);
                ends.len() - 1
            }
        };
        if dur.is_some() {
            ends[lane] = end;
        }
        let next = tids.len() as u64 + 1;
        let tid = *tids.entry((p.pid, group.clone(), lane)).or_insert(next);
        let mut e = json!({
            "name": name,
            "cat": kind,
            "pid": p.pid,
            "tid": tid,
            "ts": us(p.wall_ns),
            "args": p.event,
        });
        match dur {
            Some(d) => {
                e["ph"] = "X".into();
                e["dur"] = (d as f64 / 1e3).into();
            }
            None => {
                e["ph"] = "i".into();
                e["s"] = "t".into();
            }
        }
        out.push(e);
    }
    for (pid, device) in &processes {
        out.push(
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                        "args": {"name": device}}),
        );
    }
    for ((pid, group, lane), tid) in &tids {
        out.push(
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": format!("{group} #{lane}")}}),
        );
    }
    Ok(json!({"traceEvents": out, "displayTimeUnit": "ns"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(device: &str, pid: u64, wall: u64) -> Value {
        json!({"kind": "trace-start", "t_ns": 0, "device": device, "pid": pid, "wall_ns_at_t0": wall})
    }

    /// Catches lost events, a per-file (not shared) time axis, overlapping
    /// commands put on one thread, and missing process names.
    #[test]
    fn two_devices_share_one_clock_and_overlaps_get_lanes() {
        let nvme = vec![
            header("nvme0", 10, 1_000_000),
            json!({"kind": "cmd", "name": "Read", "sqid": 1, "cid": 1, "t_ns": 0, "dur_ns": 5000}),
            json!({"kind": "cmd", "name": "Read", "sqid": 1, "cid": 2, "t_ns": 1000, "dur_ns": 2000}),
            json!({"kind": "cmd", "name": "Write", "sqid": 1, "cid": 3, "t_ns": 6000, "dur_ns": 1000}),
            json!({"kind": "irq", "vector": 1, "t_ns": 7000}),
        ];
        let gpu = vec![
            header("gpu0", 20, 1_002_000),
            json!({"kind": "job", "name": "COPY", "t_ns": 500, "dur_ns": 100}),
            json!({"kind": "trace-stop", "t_ns": 900}),
        ];
        let doc = convert(&[("a".into(), nvme), ("b".into(), gpu)]).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        let by_cid = |cid: u64| events.iter().find(|e| e["args"]["cid"] == cid).unwrap();
        assert_eq!(by_cid(1)["ph"], "X");
        assert_eq!(by_cid(1)["ts"], 0.0);
        assert_eq!(by_cid(1)["dur"], 5.0);
        assert_eq!(by_cid(2)["ts"], 1.0);
        assert_ne!(by_cid(1)["tid"], by_cid(2)["tid"], "overlap: another lane");
        assert_eq!(by_cid(3)["tid"], by_cid(1)["tid"], "lane free again");
        let job = events.iter().find(|e| e["name"] == "COPY").unwrap();
        assert_eq!(job["pid"], 20);
        assert_eq!(job["ts"], 2.5, "gpu wall clock is 2 us later, +0.5 us");
        let irq = events.iter().find(|e| e["cat"] == "irq").unwrap();
        assert_eq!(irq["ph"], "i");
        let names: Vec<_> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| {
                (
                    e["pid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(names, vec![(10, "nvme0"), (20, "gpu0")]);
        assert_eq!(events.iter().filter(|e| e["ph"] != "M").count(), 5);
    }

    #[test]
    fn events_without_a_header_are_refused() {
        let err = convert(&[("x".into(), vec![json!({"kind": "cmd", "t_ns": 1})])]).unwrap_err();
        assert!(err.contains("before any trace-start"), "{err}");
    }
}
