//! `--dgx-only`: the figures issue 22 asks of the `dgx` topology (four
//! NVMe/GPU pairs, see docs/user-guide/topologies.md), one boot per
//! round: boot time, each process's peak RSS, P2P NVMe -> GPU throughput
//! of one pair and of the four own-switch pairs at once, and 4 KiB random
//! reads over the four namespaces from one job and from one job per vCPU.
//! The guest side is the `dgx` suite's script with `DGX_MODE=bench` (the
//! timed phases only; the suite checks the pairs and the queues).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use p2plab_lab::{GuestScript, Lab, LabOptions};
use serde_json::{json, Value};

use crate::stats::{spread, Spread};

const SCRIPT: &str = include_str!("../../e2e/guest/dgx.sh");
/// How long the guest may take to boot under TCG.
const BOOT_BUDGET: Duration = Duration::from_secs(600);

/// The guest script of a `dgx` bench boot, `runtime` seconds per fio run.
pub fn script(runtime: u32) -> GuestScript {
    GuestScript::new("dgx.sh", SCRIPT)
        .var("DGX_MODE", "bench")
        .var("RUNTIME", runtime)
}

/// What one boot measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// Lab start (servers, QEMU) until the guest script runs, seconds.
    pub boot_s: f64,
    /// The guest's uptime when its script started, seconds.
    pub guest_uptime_s: f64,
    pub single_mib_s: f64,
    pub aggregate_mib_s: f64,
    pub iops_one_job: f64,
    pub iops_per_vcpu: f64,
    pub vcpus: u64,
    /// process -> peak RSS (VmHWM), bytes
    pub rss: BTreeMap<String, u64>,
    pub run_dir: PathBuf,
}

/// One `dgx` boot with `options` (its script from [`script`]).
pub fn run_round(options: &LabOptions) -> Result<Round> {
    let started = Instant::now();
    let mut lab = Lab::start(options)?;
    let budget = lab.budget(BOOT_BUDGET);
    lab.wait_guest_file("booted", budget)?;
    let boot = started.elapsed();
    let outcome = lab.finish(options)?;
    if outcome.status != Some(0) {
        bail!("dgx: the guest script failed:\n{}", outcome.output);
    }
    let facts = p2plab_lab::facts::parse(&outcome.output);
    let fact = |key: &str| -> Result<&String> {
        facts
            .get(key)
            .with_context(|| format!("dgx: the guest did not report {key}"))
    };
    let number = |key: &str| -> Result<f64> {
        fact(key)?
            .parse::<f64>()
            .with_context(|| format!("dgx: {key} is not a number"))
    };
    for phase in ["SINGLE", "AGGREGATE", "QUEUES1", "QUEUESN"] {
        let status = fact(&format!("{phase}_STATUS"))?;
        if status != "0" {
            bail!(
                "dgx: fio of {phase} failed ({status}), run folder {}",
                outcome.run_dir.display()
            );
        }
    }
    let guest = outcome.run_dir.join("guest");
    let read = |name: &str| fio_read(&guest, name);
    let round = Round {
        boot_s: boot.as_secs_f64(),
        guest_uptime_s: number("UPTIME_AT_START")?,
        single_mib_s: read("single")?.mib_s,
        aggregate_mib_s: read("aggregate")?.mib_s,
        iops_one_job: read("queues1")?.iops,
        iops_per_vcpu: read("queuesn")?.iops,
        vcpus: number("VCPUS")? as u64,
        rss: outcome.peak_rss.iter().cloned().collect(),
        run_dir: outcome.run_dir.clone(),
    };
    eprintln!(
        "p2plab-bench: dgx done (run folder {})",
        outcome.run_dir.display()
    );
    Ok(round)
}

/// The reads of fio's first (group-reported) job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FioRead {
    pub mib_s: f64,
    pub iops: f64,
}

/// `<guest>/<name>.json`, fio's JSON output (maybe after a line of notes).
fn fio_read(guest: &Path, name: &str) -> Result<FioRead> {
    let path = guest.join(format!("{name}.json"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_fio_read(&text).with_context(|| format!("in {}", path.display()))
}

/// Bytes read over the read runtime, and read IOPS, of the first job;
/// an error when fio reports one or read nothing.
pub fn parse_fio_read(text: &str) -> Result<FioRead> {
    let at = text.find('{').context("no JSON")?;
    let doc: Value = serde_json::from_str(&text[at..]).context("fio JSON")?;
    let job = &doc["jobs"][0];
    let error = job["error"].as_u64().context("no jobs[0].error")?;
    if error != 0 {
        bail!("fio error {error}");
    }
    let read = &job["read"];
    let bytes = read["io_bytes"].as_u64().context("no read.io_bytes")?;
    let ms = read["runtime"].as_u64().context("no read.runtime")?;
    if bytes == 0 || ms == 0 {
        bail!("fio read nothing ({bytes} bytes in {ms} ms)");
    }
    Ok(FioRead {
        mib_s: bytes as f64 / f64::from(1u32 << 20) / (ms as f64 / 1000.0),
        iops: read["iops"].as_f64().context("no read.iops")?,
    })
}

/// The figures over the rounds: name -> (unit, spread).
fn figures(rounds: &[Round]) -> Vec<(String, &'static str, Spread)> {
    let mut out = Vec::new();
    let mut push = |name: String, unit: &'static str, values: Vec<f64>| {
        if let Some(s) = spread(&values) {
            out.push((name, unit, s));
        }
    };
    let each = |f: fn(&Round) -> f64| rounds.iter().map(f).collect::<Vec<f64>>();
    push(
        "boot: lab start to guest script".into(),
        "s",
        each(|r| r.boot_s),
    );
    push(
        "guest uptime at its script".into(),
        "s",
        each(|r| r.guest_uptime_s),
    );
    push(
        "P2P NVMe -> GPU, one pair".into(),
        "MiB/s",
        each(|r| r.single_mib_s),
    );
    push(
        "P2P NVMe -> GPU, four pairs at once (aggregate)".into(),
        "MiB/s",
        each(|r| r.aggregate_mib_s),
    );
    push(
        "4 KiB randread, one job".into(),
        "IOPS",
        each(|r| r.iops_one_job),
    );
    push(
        "4 KiB randread, one job per vCPU".into(),
        "IOPS",
        each(|r| r.iops_per_vcpu),
    );
    push(
        "one job per vCPU / one job".into(),
        "×",
        crate::stats::ratios(&each(|r| r.iops_per_vcpu), &each(|r| r.iops_one_job)),
    );
    let names: std::collections::BTreeSet<&String> =
        rounds.iter().flat_map(|r| r.rss.keys()).collect();
    for name in names {
        let mib: Vec<f64> = rounds
            .iter()
            .filter_map(|r| r.rss.get(name))
            .map(|&b| b as f64 / f64::from(1u32 << 20))
            .collect();
        push(format!("peak RSS {name}"), "MiB", mib);
    }
    out
}

/// The figures as a Markdown table: median (min–max) over the rounds.
pub fn table(rounds: &[Round]) -> String {
    let mut text = String::from("| dgx figure | median (min–max) |\n|---|--:|\n");
    for (name, unit, s) in figures(rounds) {
        let digits = if s.median < 10.0 { 2 } else { 0 };
        text.push_str(&format!(
            "| {name} {unit} | {:.d$} ({:.d$}–{:.d$}) |\n",
            s.median,
            s.min,
            s.max,
            d = digits
        ));
    }
    text
}

/// `results.json` of a `--dgx-only` run.
pub fn results(date_utc: &str, accel: &str, runtime: u32, rounds: &[Round]) -> Value {
    let figures: Vec<Value> = figures(rounds)
        .into_iter()
        .map(|(name, unit, s)| {
            json!({"name": name, "unit": unit, "median": s.median, "min": s.min, "max": s.max})
        })
        .collect();
    let samples: Vec<Value> = rounds
        .iter()
        .map(|r| {
            json!({
                "boot_s": r.boot_s, "guest_uptime_s": r.guest_uptime_s,
                "single_mib_s": r.single_mib_s, "aggregate_mib_s": r.aggregate_mib_s,
                "iops_one_job": r.iops_one_job, "iops_per_vcpu": r.iops_per_vcpu,
                "vcpus": r.vcpus, "peak_rss_bytes": r.rss, "run_dir": r.run_dir,
            })
        })
        .collect();
    json!({
        "topology": "dgx", "date_utc": date_utc, "accel": accel, "runtime_s": runtime,
        "rounds": rounds.len(), "figures": figures, "samples": samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fio(error: u64, bytes: u64, ms: u64, iops: f64) -> String {
        format!(
            "note: both iodepth >= 1 and synchronous I/O engine\n{{\"jobs\":[{{\"error\":{error},\
             \"read\":{{\"io_bytes\":{bytes},\"runtime\":{ms},\"iops\":{iops}}}}}]}}"
        )
    }

    /// Catches: MiB/s computed from the wrong fields or units, a failed
    /// or empty fio run taken as a figure, and fio's leading notes
    /// breaking the parse.
    #[test]
    fn fio_reads_are_parsed_and_failures_refused() {
        let r = parse_fio_read(&fio(0, 300 << 20, 2000, 1234.5)).unwrap();
        assert_eq!(r.mib_s, 150.0);
        assert_eq!(r.iops, 1234.5);
        assert!(parse_fio_read(&fio(22, 0, 10, 0.0)).is_err());
        assert!(parse_fio_read(&fio(0, 0, 4000, 0.0)).is_err());
        assert!(parse_fio_read("fio: no JSON").is_err());
    }

    fn round(boot: f64, one: f64, per_vcpu: f64, rss: u64) -> Round {
        Round {
            boot_s: boot,
            guest_uptime_s: 30.0,
            single_mib_s: 300.0,
            aggregate_mib_s: 280.0,
            iops_one_job: one,
            iops_per_vcpu: per_vcpu,
            vcpus: 4,
            rss: [("nvme0".to_owned(), rss << 20)].into(),
            run_dir: PathBuf::from("/r"),
        }
    }

    /// Catches: medians, spreads or the queue-scaling ratio taken over the
    /// wrong rounds, and RSS rows in bytes instead of MiB.
    #[test]
    fn table_holds_medians_spreads_and_the_ratio() {
        let rounds = [
            round(40.0, 1000.0, 1500.0, 10),
            round(50.0, 1000.0, 2000.0, 12),
            round(60.0, 2000.0, 2000.0, 11),
        ];
        let text = table(&rounds);
        assert!(
            text.contains("| boot: lab start to guest script s | 50 (40–60) |"),
            "{text}"
        );
        assert!(
            text.contains("| one job per vCPU / one job × | 1.50 (1.00–2.00) |"),
            "{text}"
        );
        assert!(
            text.contains("| peak RSS nvme0 MiB | 11 (10–12) |"),
            "{text}"
        );
        let doc = results("20261126-210000", "tcg", 4, &rounds);
        assert_eq!(doc["rounds"], 3);
        assert_eq!(doc["samples"][1]["iops_per_vcpu"], 2000.0);
    }
}
