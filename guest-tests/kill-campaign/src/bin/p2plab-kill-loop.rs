//! `p2plab-kill-loop`: the kill test's scenario (`p2plab_kill_campaign`)
//! for many rounds, behind `scripts/kill-loop`. Each round SIGKILLs the NVMe
//! server after acknowledged, flushed writes, checks the namespace file,
//! and re-attaches a fresh server; every `--rounds-per-boot` rounds QEMU is
//! SIGKILLed too and a new one verifies everything. Prints one line per
//! round and a summary; exits 1 on the first lost or corrupted block.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use p2plab_kill_campaign::{self as kill, KillOptions, RoundEnd, RoundReport};
use p2plab_lab::LabPaths;

#[derive(Parser, Debug)]
#[command(
    name = "kill-loop",
    about = "SIGKILL the NVMe server (and QEMU) after flushed writes, N times, and check every flushed block"
)]
struct Cli {
    /// Server kills in all.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rounds: u32,
    /// Server kills per QEMU boot; the last of each boot kills QEMU too.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds_per_boot: u32,
    /// Folder for the namespace file and the slot copies (emptied first).
    /// Default: .cache/state/kill-loop.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Echo the guest's output.
    #[arg(long)]
    verbose: bool,
}

fn seconds(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

fn print_round(r: &RoundReport, started: Instant) {
    let end = match r.end {
        RoundEnd::Replugged { unplug } => format!(
            "re-plugged (unplug {}), {} slots verified",
            seconds(unplug),
            r.slots_verified
        ),
        RoundEnd::QemuKilled => "QEMU killed too".to_owned(),
        RoundEnd::QemuAborted => "QEMU aborted by itself (QEMU 11.1 bug)".to_owned(),
    };
    println!(
        "round {:>4}  boot {:>3}  slot {} seed {}  flushes {:>2}  scratch writes {:>5} \
         ({:>2} in flight at the kill)  slots compared {}  {end}  [{}]",
        r.round,
        r.boot,
        r.write.slot,
        r.write.seed,
        r.flushes,
        r.inflight_writes,
        r.inflight_at_kill,
        r.slots_compared,
        seconds(started.elapsed()),
    );
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let state = match cli.state {
        Some(dir) => dir,
        None => match LabPaths::discover() {
            Ok(paths) => paths.state.join("kill-loop"),
            Err(e) => {
                eprintln!("kill-loop: {e:#}");
                return ExitCode::from(2);
            }
        },
    };
    let options = KillOptions {
        rounds: cli.rounds,
        rounds_per_boot: cli.rounds_per_boot,
        state,
        stream_output: cli.verbose,
    };
    let started = Instant::now();
    let mut done = 0u32;
    let result = kill::run(&options, |r| {
        done += 1;
        print_round(r, started);
    });
    println!();
    match result {
        Ok(report) => {
            let compared: usize = report.rounds.iter().map(|r| r.slots_compared).sum();
            let unplugs: Vec<Duration> = report
                .rounds
                .iter()
                .filter_map(|r| match r.end {
                    RoundEnd::Replugged { unplug } => Some(unplug),
                    _ => None,
                })
                .collect();
            let slowest = unplugs.iter().max().copied().unwrap_or_default();
            println!(
                "kill-loop: PASS  {} rounds, {} QEMU boots ({} QEMU kills, {} QEMU aborts), {} \
                 re-plugs, {} slot comparisons against the namespace file, {} slots verified by \
                 the last boot; slowest unplug of a dead device {}; {} in all",
                report.rounds.len(),
                report.boots,
                report
                    .rounds
                    .iter()
                    .filter(|r| r.end == RoundEnd::QemuKilled)
                    .count(),
                report.qemu_aborts,
                unplugs.len(),
                compared,
                report.final_slots_verified,
                seconds(slowest),
                seconds(started.elapsed()),
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!(
                "kill-loop: FAIL after {done} of {} rounds ({}):\n{e:#}",
                cli.rounds,
                seconds(started.elapsed())
            );
            ExitCode::FAILURE
        }
    }
}
