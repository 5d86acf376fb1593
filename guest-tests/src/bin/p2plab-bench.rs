//! `p2plab-bench`: guest I/O benchmarks of p2plab's NVMe server against the
//! anchor (QEMU's built-in nvme), side by side in one run. Each round boots
//! both topologies in turn and runs the same fio jobs in the guest; the
//! figures printed are medians over the rounds.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use p2plab_guest_tests::{Lab, LabOptions, Mode};

#[derive(Parser, Debug)]
#[command(
    name = "bench",
    about = "Benchmark p2plab-nvme against QEMU's built-in nvme"
)]
struct Cli {
    /// Rounds; each boots both devices once (medians are printed).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Seconds each fio job runs.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(2..=600))]
    runtime: u32,
    /// Topology for p2plab's device.
    #[arg(long, default_value = "lab")]
    ours: String,
    /// Topology for the anchor.
    #[arg(long, default_value = "anchor-qemu-nvme")]
    anchor: String,
}

/// A fio workload; `name` keys the results.
struct Workload {
    name: &'static str,
    fio: &'static str,
    /// Which figure to print: IOPS or MiB/s.
    unit: Unit,
}

#[derive(Clone, Copy)]
enum Unit {
    Iops,
    MibPerSec,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "4k-randread-qd32",
        fio: "--rw=randread --bs=4k --iodepth=32 --ioengine=libaio",
        unit: Unit::Iops,
    },
    Workload {
        name: "128k-seqread-qd8",
        fio: "--rw=read --bs=128k --iodepth=8 --ioengine=libaio",
        unit: Unit::MibPerSec,
    },
    Workload {
        name: "4k-randwrite-qd32",
        fio: "--rw=randwrite --bs=4k --iodepth=32 --ioengine=libaio",
        unit: Unit::Iops,
    },
];

fn guest_script(runtime: u32) -> String {
    let mut script =
        String::from("set -e\n[ -b /dev/nvme0n1 ] || { echo 'no /dev/nvme0n1'; exit 1; }\n");
    for w in WORKLOADS {
        script.push_str(&format!(
            "echo BENCH {name} $(fio --name={name} --filename=/dev/nvme0n1 --direct=1 {fio} \
             --size=512M --time_based --runtime={runtime} --ramp_time=2 --output-format=json \
             | tr -d '\\n')\n",
            name = w.name,
            fio = w.fio,
        ));
    }
    script
}

/// (IOPS, bytes/s, p99 completion latency in µs) for the job's main direction.
fn parse_fio(json: &str) -> Result<(f64, f64, f64)> {
    let value: serde_json::Value = serde_json::from_str(json).context("fio output is not JSON")?;
    let job = value
        .get("jobs")
        .and_then(|j| j.get(0))
        .context("fio JSON has no jobs")?;
    for dir in ["read", "write"] {
        let Some(stats) = job.get(dir) else { continue };
        let iops = stats.get("iops").and_then(|v| v.as_f64()).unwrap_or(0.0);
        if iops > 0.0 {
            let bw = stats
                .get("bw_bytes")
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0);
            let p99 = stats
                .pointer("/clat_ns/percentile/99.000000")
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0)
                / 1000.0;
            return Ok((iops, bw, p99));
        }
    }
    bail!("fio reported no I/O")
}

#[derive(Default)]
struct Figures {
    /// workload -> samples of (iops, bytes/s, p99 µs)
    samples: BTreeMap<&'static str, Vec<(f64, f64, f64)>>,
    rss: BTreeMap<String, Vec<u64>>,
}

fn run_one(topology: &str, runtime: u32, figures: &mut Figures) -> Result<()> {
    let mut options = LabOptions::new(topology, Mode::Exec(guest_script(runtime)));
    options.stream_output = false;
    options.timeout = Some(Duration::from_secs(u64::from(runtime) * 10 + 600));
    let outcome = Lab::run(&options)?;
    if outcome.status != Some(0) {
        bail!("{topology}: guest benchmark failed:\n{}", outcome.output);
    }
    for w in WORKLOADS {
        let prefix = format!("BENCH {} ", w.name);
        let line = outcome
            .output
            .lines()
            .find_map(|l| l.find(&prefix).map(|at| &l[at + prefix.len()..]))
            .with_context(|| format!("{topology}: no result for {}", w.name))?;
        figures
            .samples
            .entry(w.name)
            .or_default()
            .push(parse_fio(line)?);
    }
    for (name, bytes) in outcome.peak_rss {
        figures.rss.entry(name).or_default().push(bytes);
    }
    eprintln!(
        "p2plab-bench: {topology} done (run folder {})",
        outcome.run_dir.display()
    );
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("p2plab-bench: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    let mut ours = Figures::default();
    let mut anchor = Figures::default();
    for round in 1..=cli.rounds {
        eprintln!("p2plab-bench: round {round}/{}", cli.rounds);
        run_one(&cli.ours, cli.runtime, &mut ours)?;
        run_one(&cli.anchor, cli.runtime, &mut anchor)?;
    }
    println!(
        "{:<22} {:>16} {:>16} {:>8}",
        "workload (median)", "p2plab-nvme", "qemu nvme", "ratio"
    );
    for w in WORKLOADS {
        let pick = |f: &Figures, i: usize| -> f64 {
            let mut v: Vec<f64> = f
                .samples
                .get(w.name)
                .into_iter()
                .flatten()
                .map(|s| match i {
                    0 => s.0,
                    1 => s.1 / (1024.0 * 1024.0),
                    _ => s.2,
                })
                .collect();
            median(&mut v)
        };
        let (i, label) = match w.unit {
            Unit::Iops => (0, "IOPS"),
            Unit::MibPerSec => (1, "MiB/s"),
        };
        let (a, b) = (pick(&ours, i), pick(&anchor, i));
        println!(
            "{:<22} {:>16} {:>16} {:>8.2}",
            format!("{} {label}", w.name),
            format!("{a:.0}"),
            format!("{b:.0}"),
            if b > 0.0 { a / b } else { 0.0 }
        );
        let (a, b) = (pick(&ours, 2), pick(&anchor, 2));
        println!(
            "{:<22} {:>16} {:>16} {:>8.2}",
            format!("{} p99 µs", w.name),
            format!("{a:.0}"),
            format!("{b:.0}"),
            if b > 0.0 { a / b } else { 0.0 }
        );
    }
    // Memory: QEMU's peak RSS includes the guest RAM it touched (shared
    // with the servers, so not counted twice); the servers add their own.
    let rss = |f: &Figures, name: &str| -> f64 {
        let mut v: Vec<f64> = f
            .rss
            .get(name)
            .into_iter()
            .flatten()
            .map(|&b| b as f64 / (1024.0 * 1024.0))
            .collect();
        median(&mut v)
    };
    println!(
        "{:<22} {:>16} {:>16} {:>8.2}",
        "peak RSS MiB: QEMU",
        format!("{:.0}", rss(&ours, "qemu")),
        format!("{:.0}", rss(&anchor, "qemu")),
        rss(&ours, "qemu") / rss(&anchor, "qemu").max(1.0)
    );
    for name in ours.rss.keys().filter(|n| *n != "qemu") {
        println!(
            "{:<22} {:>16} {:>16}",
            format!("peak RSS MiB: {name}"),
            format!("{:.0}", rss(&ours, name)),
            "-"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json_for_the_busy_direction() {
        let json = r#"{"jobs":[{"read":{"iops":0,"bw_bytes":0},"write":{"iops":2000.5,"bw_bytes":8194048,
            "clat_ns":{"percentile":{"99.000000":123000}}}}]}"#;
        let (iops, bw, p99) = parse_fio(json).unwrap();
        assert_eq!((iops, bw, p99), (2000.5, 8194048.0, 123.0));
        assert!(parse_fio(r#"{"jobs":[{"read":{"iops":0}}]}"#).is_err());
        assert!(parse_fio("fio: error").is_err());
    }
}
