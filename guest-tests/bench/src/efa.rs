//! The EFA workloads (`--efa-only`): one boot of `rdma-efa`, where the
//! unmodified efa driver runs efa0 and efa1, and `p2plab-efa-check bench`
//! moves the same bytes gpu0 → gpu1 (dma-buf MRs) and guest RAM → guest
//! RAM (ordinary MRs), interleaved, round after round: SRD SENDs, then RDMA
//! reads of the same bytes in work requests of each size asked. Every call
//! checks every byte (CRC32C) and the servers' counters around it must show
//! the path the memory implies: GPU payload to and from a peer BAR by the
//! zero-copy peer path, RAM payload in guest RAM, nothing through QEMU.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use p2plab_lab::{GuestScript, Lab, LabOptions};
use serde_json::{json, Value};

use crate::guest_output::after;
use crate::rows::Row;

const EFA: &str = include_str!("../guest/efa.sh");

/// The two memories, in the order of odd rounds (even rounds swap them, so
/// neither always runs first).
pub const MEMORIES: [&str; 2] = ["gpu", "ram"];

/// The servers whose counters the guest reads.
pub const SERVERS: [&str; 2] = ["efa0", "efa1"];

/// The counters kept per call, as deltas over it.
const COUNTERS: [&str; 16] = [
    "peer_bar_bytes",
    "dma_peer_read_bytes",
    "dma_peer_write_bytes",
    "dma_mmap_read_bytes",
    "dma_mmap_write_bytes",
    "dma_message_read_bytes",
    "dma_message_write_bytes",
    "send_bytes",
    "recv_bytes",
    "read_bytes",
    "read_resp_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "cpu_user_us",
    "cpu_system_us",
    "idle_poll_cpu_us",
];

/// What the EFA boot runs.
pub struct Plan {
    /// Rounds, all in the one boot.
    pub rounds: u32,
    /// Bytes per call (SENT, then read back), e.g. `8M`.
    pub len: String,
    pub len_bytes: u64,
    /// Bytes per SEND message.
    pub msg: String,
    /// RDMA read work-request sizes, e.g. `64K`, `1M`, `4M`.
    pub read_wrs: Vec<String>,
}

/// The label of one call.
fn label(round: u32, memory: &str, read_wr: &str) -> String {
    format!("r{round}-{memory}-{read_wr}")
}

/// The guest script: per round, per read size, both memories back to back
/// (GPU first in odd rounds, RAM first in even ones), each with its own seed.
pub fn script(plan: &Plan) -> GuestScript {
    let mut script = GuestScript::new("efa.sh", EFA)
        .var("EFA_LEN", &plan.len)
        .var("EFA_MSG", &plan.msg);
    let mut seed = 0u32;
    for round in 1..=plan.rounds {
        for wr in &plan.read_wrs {
            let mut order = MEMORIES;
            if round % 2 == 0 {
                order.reverse();
            }
            for memory in order {
                seed += 1;
                script = script.call([
                    "efa_run".to_owned(),
                    label(round, memory, wr),
                    memory.to_owned(),
                    wr.clone(),
                    seed.to_string(),
                ]);
            }
        }
    }
    script
}

/// One call's result: its throughputs and counter deltas per server.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub send_mib_s: f64,
    pub read_mib_s: f64,
    pub send_us: u64,
    /// server -> counter -> delta
    pub deltas: BTreeMap<String, BTreeMap<String, u64>>,
}

/// The value of `key=` among a line's words.
fn word<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn word_u64(line: &str, key: &str) -> Result<u64> {
    word(line, key)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {key} in {line:?}"))
}

/// A counter found by key anywhere in a server's status document.
fn counter(v: &Value, key: &str) -> Option<u64> {
    match v {
        Value::Object(map) => map
            .get(key)
            .and_then(Value::as_u64)
            .or_else(|| map.values().find_map(|child| counter(child, key))),
        _ => None,
    }
}

/// A server's status document printed at `when` around call `label`.
fn status(output: &str, label: &str, when: &str, server: &str) -> Result<Value> {
    let text = after(output, &format!("EFA_STATS {label} {when} {server} "))
        .with_context(|| format!("{label}: no {server} status {when} the call"))?;
    serde_json::from_str(text.trim())
        .with_context(|| format!("{label}: {server}'s status {when} is not JSON: {text:?}"))
}

/// Parses call `label` of `memory` that moved `len` bytes: the tool's
/// line must say it verified, moved every byte and took some time.
pub fn parse_call(output: &str, label: &str, len: u64) -> Result<Call> {
    let line =
        after(output, &format!("EFA {label} ")).with_context(|| format!("{label}: no result"))?;
    if word(line, "exit") != Some("0") || word(line, "verify") != Some("ok") {
        bail!("{label}: the transfer failed or did not verify: {line:?}");
    }
    if word_u64(line, "bytes")? != len || word_u64(line, "read_bytes")? != len {
        bail!("{label}: not every byte moved: {line:?}");
    }
    if word(line, "dst_crc") != word(line, "sent_crc")
        || word(line, "read_crc") != word(line, "expected_crc")
    {
        bail!("{label}: CRC mismatch: {line:?}");
    }
    let send_us = word_u64(line, "send_us")?;
    let read_us = word_u64(line, "read_us")?;
    if send_us == 0 || read_us == 0 {
        bail!("{label}: a phase took no time: {line:?}");
    }
    let mib = len as f64 / (1024.0 * 1024.0);
    let mut deltas = BTreeMap::new();
    for server in SERVERS {
        let before = status(output, label, "before", server)?;
        let after_ = status(output, label, "after", server)?;
        let mut per = BTreeMap::new();
        for name in COUNTERS {
            let (Some(b), Some(a)) = (counter(&before, name), counter(&after_, name)) else {
                bail!("{label}: {server}'s status has no {name}");
            };
            per.insert(name.to_owned(), a.saturating_sub(b));
        }
        deltas.insert(server.to_owned(), per);
    }
    Ok(Call {
        send_mib_s: mib / (send_us as f64 / 1e6),
        read_mib_s: mib / (read_us as f64 / 1e6),
        send_us,
        deltas,
    })
}

/// Checks that a call's bytes took the path its memory implies. GPU: all
/// the payload efa0 read (the SENDs and its read responses, a response
/// served again when a read request timed out under load) came from
/// gpu0's BAR and all efa1 wrote (received and read-back bytes) went to
/// gpu1's, by the peer path; RAM: nothing to or from a peer BAR, the
/// payload in guest RAM. Neither sends payload through QEMU (DMA
/// messages). Each call SENT, received and read back `len` bytes.
pub fn check_path(label: &str, memory: &str, len: u64, call: &Call) -> Result<()> {
    let d = |server: &str, name: &str| call.deltas[server][name];
    for server in SERVERS {
        for name in ["dma_message_read_bytes", "dma_message_write_bytes"] {
            if d(server, name) != 0 {
                bail!(
                    "{label}: {server} moved {} bytes as DMA messages through QEMU",
                    d(server, name)
                );
            }
        }
    }
    let served = d("efa0", "send_bytes") + d("efa0", "read_resp_bytes");
    let landed = d("efa1", "recv_bytes") + d("efa1", "read_bytes");
    if d("efa0", "send_bytes") != len
        || d("efa1", "recv_bytes") != len
        || d("efa1", "read_bytes") != len
        || d("efa0", "read_resp_bytes") < len
    {
        bail!(
            "{label}: the servers did not count {len} bytes each way: {:?}",
            call.deltas
        );
    }
    let (peer0, peer1) = (d("efa0", "peer_bar_bytes"), d("efa1", "peer_bar_bytes"));
    match memory {
        "gpu" => {
            if peer0 != served || peer1 != landed {
                bail!(
                    "{label}: {peer0} and {peer1} bytes to or from a peer BAR, not {served} and {landed}"
                );
            }
            if d("efa0", "dma_peer_read_bytes") < served
                || d("efa1", "dma_peer_write_bytes") < landed
            {
                bail!(
                    "{label}: the GPU payload did not go by the peer path: {:?}",
                    call.deltas
                );
            }
        }
        _ => {
            if peer0 != 0 || peer1 != 0 {
                bail!("{label}: a RAM transfer touched a peer BAR ({peer0}, {peer1})");
            }
            if d("efa0", "dma_mmap_read_bytes") < served
                || d("efa1", "dma_mmap_write_bytes") < landed
            {
                bail!(
                    "{label}: the RAM payload did not go through guest RAM: {:?}",
                    call.deltas
                );
            }
        }
    }
    Ok(())
}

/// Everything the EFA boot measured.
#[derive(Default)]
pub struct Measured {
    /// (memory, read_wr) -> read MiB/s per round
    pub read: BTreeMap<(String, String), Vec<f64>>,
    /// memory -> SEND MiB/s per round (all of the round's SENDs of it:
    /// bytes over time)
    pub send: BTreeMap<String, Vec<f64>>,
    /// memory -> both servers' CPU µs (less what they count as idle polling)
    /// per MiB of payload, per round (all of the round's calls of it,
    /// SENDs and reads, timed or not)
    pub server_cpu: BTreeMap<String, Vec<f64>>,
    /// per call: label, memory, read_wr, MiB/s and the counter deltas
    pub calls: Vec<Value>,
    pub run_dirs: Vec<PathBuf>,
}

/// Reads every call of a finished boot's output into [`Measured`].
pub fn read_output(plan: &Plan, output: &str) -> Result<Measured> {
    let mut m = Measured::default();
    for round in 1..=plan.rounds {
        for memory in MEMORIES {
            let mut send_us = 0u64;
            let mut cpu_us = 0u64;
            for wr in &plan.read_wrs {
                let label = label(round, memory, wr);
                let call = parse_call(output, &label, plan.len_bytes)?;
                check_path(&label, memory, plan.len_bytes, &call)?;
                send_us += call.send_us;
                cpu_us += SERVERS
                    .iter()
                    .map(|s| {
                        let d = &call.deltas[*s];
                        (d["cpu_user_us"] + d["cpu_system_us"])
                            .saturating_sub(d["idle_poll_cpu_us"])
                    })
                    .sum::<u64>();
                m.read
                    .entry((memory.to_owned(), wr.clone()))
                    .or_default()
                    .push(call.read_mib_s);
                m.calls.push(json!({
                    "label": label, "memory": memory, "read_wr": wr,
                    "send_mib_s": call.send_mib_s, "read_mib_s": call.read_mib_s,
                    "counter_deltas": call.deltas,
                }));
            }
            let bytes = plan.len_bytes * plan.read_wrs.len() as u64;
            let mib_s = bytes as f64 / (1024.0 * 1024.0) / (send_us as f64 / 1e6);
            m.send.entry(memory.to_owned()).or_default().push(mib_s);
            // Each call moves its bytes twice: SENT, then read back.
            let moved_mib = 2.0 * bytes as f64 / (1024.0 * 1024.0);
            m.server_cpu
                .entry(memory.to_owned())
                .or_default()
                .push(cpu_us as f64 / moved_mib);
        }
    }
    Ok(m)
}

/// Boots once and measures every round.
pub fn run(options: &LabOptions, plan: &Plan) -> Result<Measured> {
    let outcome = Lab::run(options)?;
    if outcome.status != Some(0) {
        bail!(
            "{}: guest EFA transfers failed:\n{}",
            options.topology,
            outcome.output
        );
    }
    let mut m = read_output(plan, &outcome.output).with_context(|| {
        format!(
            "{}: run folder {}",
            options.topology,
            outcome.run_dir.display()
        )
    })?;
    eprintln!(
        "p2plab-bench: {} done (run folder {})",
        options.topology,
        outcome.run_dir.display()
    );
    m.run_dirs.push(outcome.run_dir);
    Ok(m)
}

/// Re-reads a finished EFA boot from its run folder.
pub fn reread(run_dir: &Path, plan: &Plan) -> Result<Measured> {
    let path = run_dir.join("guest/output.txt");
    let output =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut m =
        read_output(plan, &output).with_context(|| format!("run folder {}", run_dir.display()))?;
    m.run_dirs.push(run_dir.to_owned());
    Ok(m)
}

/// `YYYYmmdd-HHMMSS` of a run folder named `YYYYmmdd-HHMMSS-PID`.
pub fn run_date(run_dir: &Path) -> Result<String> {
    let name = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let date = name.get(..15).unwrap_or_default();
    let ok = date.len() == 15
        && date
            .char_indices()
            .all(|(i, c)| if i == 8 { c == '-' } else { c.is_ascii_digit() });
    if !ok {
        bail!(
            "{}: not a run folder named YYYYmmdd-HHMMSS-PID",
            run_dir.display()
        );
    }
    Ok(date.to_owned())
}

/// GPU memory against guest RAM: SENDs, then reads per work-request size.
pub fn rows(m: &Measured, plan: &Plan) -> Vec<Row> {
    let get = |map: Option<&Vec<f64>>| map.cloned().unwrap_or_default();
    let mut rows = vec![Row {
        label: format!("efa0-to-efa1 srd-send {} msgs MiB/s", plan.msg),
        left: get(m.send.get("gpu")),
        right: get(m.send.get("ram")),
        lower_is_better: false,
    }];
    rows.push(Row {
        label: "efa0+efa1 server CPU µs/MiB".to_owned(),
        left: get(m.server_cpu.get("gpu")),
        right: get(m.server_cpu.get("ram")),
        lower_is_better: true,
    });
    for wr in &plan.read_wrs {
        rows.push(Row {
            label: format!("efa1-reads-efa0 rdma-read {wr} WRs MiB/s"),
            left: get(m.read.get(&("gpu".to_owned(), wr.clone()))),
            right: get(m.read.get(&("ram".to_owned(), wr.clone()))),
            lower_is_better: false,
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    type Counters = Vec<(&'static str, u64)>;

    fn plan() -> Plan {
        Plan {
            rounds: 2,
            len: "1M".into(),
            len_bytes: 1 << 20,
            msg: "8K".into(),
            read_wrs: vec!["64K".into(), "1M".into()],
        }
    }

    /// Catches: a memory or size measured in one round but not the other,
    /// the same memory always first (it would get the warmer caches), seeds
    /// reused, the sizes not reaching the guest.
    #[test]
    fn every_round_runs_both_memories_at_every_size_interleaved() {
        let text = script(&plan()).render().expect("renders");
        let calls: Vec<&str> = text.lines().filter(|l| l.starts_with("efa_run ")).collect();
        assert_eq!(
            calls,
            [
                "efa_run r1-gpu-64K gpu 64K 1",
                "efa_run r1-ram-64K ram 64K 2",
                "efa_run r1-gpu-1M gpu 1M 3",
                "efa_run r1-ram-1M ram 1M 4",
                "efa_run r2-ram-64K ram 64K 5",
                "efa_run r2-gpu-64K gpu 64K 6",
                "efa_run r2-ram-1M ram 1M 7",
                "efa_run r2-gpu-1M gpu 1M 8",
            ]
        );
        assert!(text.contains("export EFA_LEN=1M\nexport EFA_MSG=8K\n"));
    }

    fn status_line(label: &str, when: &str, server: &str, v: &[(&str, u64)]) -> String {
        let mut doc = serde_json::Map::new();
        for name in COUNTERS {
            doc.insert(name.into(), 0.into());
        }
        for (k, n) in v {
            doc.insert((*k).into(), (*n).into());
        }
        format!(
            "EFA_STATS {label} {when} {server} {}\n",
            json!({"stats": doc})
        )
    }

    fn output(label: &str, efa0: &[(&str, u64)], efa1: &[(&str, u64)], result: &str) -> String {
        let mut out = String::new();
        for s in SERVERS {
            out += &status_line(label, "before", s, &[]);
        }
        out += &format!("EFA {label} {result}\n");
        out += &status_line(label, "after", "efa0", efa0);
        out += &status_line(label, "after", "efa1", efa1);
        out
    }

    const MIB: u64 = 1 << 20;
    const S0: (&str, u64) = ("send_bytes", MIB);
    const R0: (&str, u64) = ("read_resp_bytes", MIB);
    const S1: (&str, u64) = ("recv_bytes", MIB);
    const R1: (&str, u64) = ("read_bytes", MIB);
    const CPU: (&str, u64) = ("cpu_user_us", 100);

    const OK: &str = "exit=0 mem=gpu bytes=1048576 read_bytes=1048576 send_us=500000 read_us=250000 expected_crc=0x1 sent_crc=0x2 dst_crc=0x2 read_crc=0x1 verify=ok";

    /// Catches: a failed, short or mismatched transfer measured as a
    /// figure, throughput computed from the wrong phase, and GPU bytes that
    /// went through guest RAM or QEMU (or RAM bytes through a BAR) taken as
    /// the path asked for.
    #[test]
    fn a_call_counts_only_when_verified_and_on_its_path() {
        let len = 1u64 << 20;
        let gpu0 = [
            ("peer_bar_bytes", 2 * len),
            ("dma_peer_read_bytes", 2 * len),
            S0,
            R0,
        ];
        let gpu1 = [
            ("peer_bar_bytes", 2 * len),
            ("dma_peer_write_bytes", 2 * len),
            S1,
            R1,
        ];
        let out = output("r1-gpu-1M", &gpu0, &gpu1, OK);
        let call = parse_call(&out, "r1-gpu-1M", len).unwrap();
        assert_eq!(call.send_mib_s, 2.0);
        assert_eq!(call.read_mib_s, 4.0);
        check_path("r1-gpu-1M", "gpu", len, &call).unwrap();
        assert!(check_path("r1-gpu-1M", "ram", len, &call).is_err());

        let ram0 = [("dma_mmap_read_bytes", 2 * len), S0, R0];
        let ram1 = [("dma_mmap_write_bytes", 2 * len), S1, R1];
        let call = parse_call(&output("x", &ram0, &ram1, OK), "x", len).unwrap();
        check_path("x", "ram", len, &call).unwrap();
        assert!(check_path("x", "gpu", len, &call).is_err());

        let msg1 = [
            ("dma_mmap_write_bytes", 2 * len),
            ("dma_message_write_bytes", 4096),
            S1,
            R1,
        ];
        let call = parse_call(&output("x", &ram0, &msg1, OK), "x", len).unwrap();
        assert!(check_path("x", "ram", len, &call).is_err());

        // A read response served twice (its request timed out): counted
        // on both sides, still the peer path.
        let again0 = [
            ("peer_bar_bytes", 3 * len),
            ("dma_peer_read_bytes", 3 * len),
            S0,
            ("read_resp_bytes", 2 * len),
        ];
        let call = parse_call(&output("x", &again0, &gpu1, OK), "x", len).unwrap();
        check_path("x", "gpu", len, &call).unwrap();
        // ... but not one that went anywhere else.
        let elsewhere0 = [
            ("peer_bar_bytes", 2 * len),
            ("dma_peer_read_bytes", 3 * len),
            S0,
            ("read_resp_bytes", 2 * len),
        ];
        let call = parse_call(&output("x", &elsewhere0, &gpu1, OK), "x", len).unwrap();
        assert!(check_path("x", "gpu", len, &call).is_err());
        // Nothing received.
        let none1 = [
            ("peer_bar_bytes", len),
            ("dma_peer_write_bytes", 2 * len),
            R1,
        ];
        let call = parse_call(&output("x", &gpu0, &none1, OK), "x", len).unwrap();
        assert!(check_path("x", "gpu", len, &call).is_err());

        for bad in [
            OK.replace("verify=ok", "verify=bad"),
            OK.replace("exit=0", "exit=1"),
            OK.replace("read_bytes=1048576", "read_bytes=65536"),
            OK.replace("dst_crc=0x2", "dst_crc=0x3"),
            OK.replace("read_us=250000", "read_us=0"),
        ] {
            assert!(
                parse_call(&output("x", &ram0, &ram1, &bad), "x", len).is_err(),
                "{bad}"
            );
        }
        assert!(parse_call(&output("x", &ram0, &ram1, OK), "y", len).is_err());
    }

    /// Catches: SEND figures not bytes over time of the round's SENDs, a
    /// read figure filed under another size or memory, and rows whose sides
    /// come from different memories.
    #[test]
    fn rows_pair_gpu_with_ram_per_size() {
        let p = plan();
        let len = p.len_bytes;
        let mut out = String::new();
        for round in 1..=2 {
            for memory in MEMORIES {
                for wr in &p.read_wrs {
                    let l = label(round, memory, wr);
                    let (a, b): (Counters, Counters) = if memory == "gpu" {
                        (
                            vec![
                                ("peer_bar_bytes", 2 * len),
                                ("dma_peer_read_bytes", 2 * len),
                                S0,
                                R0,
                                CPU,
                            ],
                            vec![
                                ("peer_bar_bytes", 2 * len),
                                ("dma_peer_write_bytes", 2 * len),
                                S1,
                                R1,
                                CPU,
                            ],
                        )
                    } else {
                        (
                            vec![("dma_mmap_read_bytes", 2 * len), S0, R0, CPU],
                            vec![("dma_mmap_write_bytes", 2 * len), S1, R1, CPU],
                        )
                    };
                    let read_us = if memory == "gpu" { 100_000 } else { 200_000 };
                    let send_us = if wr == "1M" { 1_000_000 } else { 500_000 };
                    let r = OK
                        .replace("read_us=250000", &format!("read_us={read_us}"))
                        .replace("send_us=500000", &format!("send_us={send_us}"));
                    out += &output(&l, &a, &b, &r);
                }
            }
        }
        let m = read_output(&p, &out).unwrap();
        let rows = rows(&m, &p);
        assert_eq!(rows.len(), 4);
        // 2 MiB in 1.5 s.
        assert_eq!(rows[0].left, vec![2.0 / 1.5; 2]);
        // 2 calls × 2 servers × 100 µs over 2 × 2 MiB moved.
        assert_eq!(rows[1].left, vec![100.0; 2]);
        assert!(rows[1].lower_is_better);
        assert_eq!(rows[2].label, "efa1-reads-efa0 rdma-read 64K WRs MiB/s");
        assert_eq!(rows[2].left, vec![10.0; 2]);
        assert_eq!(rows[2].right, vec![5.0; 2]);
        assert_eq!(m.calls.len(), 8);
    }
}
