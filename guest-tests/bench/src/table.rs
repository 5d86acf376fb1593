//! The text report on stdout: one line per row, the median and min–max
//! of both sides and of their ratio.

use serde_json::Value;

use crate::hostcpu::JobCost;
use crate::measure::Side;
use crate::rows::Row;
use crate::settings::Settings;
use crate::stats::{ratios, spread};

/// One line of the results table: a label and three right-aligned cells.
fn print_line(label: &str, left: &str, right: &str, ratio: &str) {
    println!("{label:<58} {left:>22} {right:>22} {ratio:>18}");
}

/// `median (min–max)` of both sides (no decimals) and of the ratio.
fn print_row(row: &Row) {
    let cell = |v: &[f64]| match spread(v) {
        Some(s) => format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max),
        None => "-".into(),
    };
    let ratio = match spread(&ratios(&row.left, &row.right)) {
        Some(s) => format!("{:.2} ({:.2}–{:.2})", s.median, s.min, s.max),
        None => "-".into(),
    };
    print_line(&row.label, &cell(&row.left), &cell(&row.right), &ratio);
}

/// A section: its heading line (the sides' names), then its rows; nothing
/// when it has no rows.
fn print_section(heading: [&str; 3], rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    print_line(heading[0], heading[1], heading[2], "ratio");
    for row in rows {
        print_row(row);
    }
}

/// `median (min–max)` with `decimals`, or `-`.
fn cell(values: &[f64], decimals: usize) -> String {
    match spread(values) {
        Some(s) => format!(
            "{:.d$} ({:.d$}–{:.d$})",
            s.median,
            s.min,
            s.max,
            d = decimals
        ),
        None => "-".into(),
    }
}

/// A host CPU figure: its name, how to pick it, its decimals.
type Figure = (&'static str, fn(&JobCost) -> f64, usize);

/// The NVMe servers' host CPU per I/O and per MiB of each compared job,
/// busy and total, one column per server.
pub fn print_host_cpu(sides: &[(&str, &Side)]) {
    let Some((_, first)) = sides.first() else {
        return;
    };
    if first.host_cpu.is_empty() {
        return;
    }
    let mut heading = format!("{:<42}", "server CPU (host), median (min–max)");
    for (name, _) in sides {
        heading.push_str(&format!(" {name:>24}"));
    }
    println!("{heading}");
    let figures: [Figure; 4] = [
        ("busy µs/IO", |c| c.busy_us_per_io, 1),
        ("total µs/IO", |c| c.total_us_per_io, 1),
        ("busy µs/MiB", |c| c.busy_us_per_mib, 0),
        ("total µs/MiB", |c| c.total_us_per_mib, 0),
    ];
    for job in first.host_cpu.keys() {
        for (what, pick, decimals) in figures {
            let mut line = format!("{:<42}", format!("{job} {what}"));
            for (_, side) in sides {
                let values: Vec<f64> = side
                    .host_cpu
                    .get(job)
                    .into_iter()
                    .flatten()
                    .map(pick)
                    .collect();
                line.push_str(&format!(" {:>24}", cell(&values, decimals)));
            }
            println!("{line}");
        }
    }
}

/// The whole table: the settings, p2plab-nvme against the anchor, P2P
/// against RAM, RDMA against RAM (with the NICs' DMA paths of each boot),
/// and the peak RSS of each process.
pub fn print(
    settings: &Settings,
    compared: &[Row],
    compared_spdk: &[Row],
    p2p: &[Row],
    rdma: &[Row],
    nic_paths: &[Value],
    peak_rss: &[Row],
) {
    println!(
        "accel={}, caching={} (anchor {}), {} rounds of {} s; median (min–max)",
        settings.accel,
        settings.caching,
        settings.anchor_drive,
        settings.rounds,
        settings.runtime_s
    );
    print_section(["workload", "p2plab-nvme", "qemu nvme"], compared);
    if let Some(spdk) = &settings.spdk {
        println!(
            "SPDK {} nvmf_tgt (vfio-user, aio bdev O_DIRECT, one reactor) from {}",
            spdk.version,
            spdk.dir.display()
        );
    }
    print_section(["workload", "p2plab-nvme", "spdk nvmf_tgt"], compared_spdk);
    print_section(
        [
            "P2P workload (p2plab, same boot)",
            "GPU p2pmem",
            "guest RAM",
        ],
        p2p,
    );
    print_section(
        ["RDMA workload (same boot)", "GPU memory", "guest RAM"],
        rdma,
    );
    if !rdma.is_empty() {
        for paths in nic_paths {
            println!("RDMA NIC DMA paths of one boot: {paths}");
        }
    }
    for row in peak_rss {
        print_row(row);
    }
}

/// The table of an `--efa-only` run.
pub fn print_efa(rows: &[Row]) {
    print_section(
        ["EFA workload (same boot)", "GPU memory", "guest RAM"],
        rows,
    );
}
