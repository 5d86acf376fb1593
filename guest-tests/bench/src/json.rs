//! The JSON report, `results.json` of a bench folder (and the files kept
//! in guest-tests/bench/): every sample, its median and min–max, and the
//! per-round ratios of each row, with the settings and the machine.

use serde_json::{json, Value};

use crate::measure::Side;
use crate::rows::Row;
use crate::settings::Settings;
use crate::stats::{ratios, spread};

/// `{"samples", "median", "min", "max"}`, or null without samples.
fn spread_json(values: &[f64]) -> Value {
    match spread(values) {
        Some(s) => json!({"samples": values, "median": s.median, "min": s.min, "max": s.max}),
        None => Value::Null,
    }
}

/// A row, its sides under the names `left_name` and `right_name`.
fn row_json(row: &Row, left_name: &str, right_name: &str) -> Value {
    json!({
        "figure": row.label,
        left_name: spread_json(&row.left),
        right_name: spread_json(&row.right),
        "ratio": spread_json(&ratios(&row.left, &row.right)),
        "lower_is_better": row.lower_is_better,
    })
}

fn rows_json(rows: &[Row], left_name: &str, right_name: &str) -> Vec<Value> {
    rows.iter()
        .map(|r| row_json(r, left_name, right_name))
        .collect()
}

/// The peak RSS of each process of a side, in MiB.
fn rss_mib(side: &Side) -> Value {
    side.rss
        .iter()
        .map(|(name, v)| {
            let mib: Vec<f64> = v.iter().map(|&b| b as f64 / (1024.0 * 1024.0)).collect();
            (name.clone(), spread_json(&mib))
        })
        .collect::<serde_json::Map<String, Value>>()
        .into()
}

/// The host the bench ran on.
fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_owned());
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    json!({
        "cpu_model": model,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "host_kernel": read("/proc/sys/kernel/osrelease"),
        "load_average_at_end": read("/proc/loadavg"),
    })
}

/// The document of an `--efa-only` run: the layout of the others (empty
/// NVMe, P2P and NIC sections) plus `efa`, `efa_ratio` and `efa_rows`.
pub fn efa_results(
    date_utc: &str,
    accel: p2plab_lab::Accel,
    topology: &str,
    plan: &crate::efa::Plan,
    measured: &crate::efa::Measured,
    rows: &[Row],
) -> Value {
    json!({
        "date_utc": date_utc,
        "machine": machine(),
        "rounds": plan.rounds,
        "accel": accel.name(),
        "compared": [],
        "p2p": [],
        "rdma_rows": [],
        "efa": {"topology": topology, "len": plan.len, "msg": plan.msg,
                "read_wrs": plan.read_wrs, "run_dirs": measured.run_dirs,
                "calls": measured.calls},
        "efa_ratio": "efa0 -> efa1 from gpu0's into gpu1's VRAM (dma-buf MRs) / from and into guest RAM (ordinary MRs), same boot, interleaved, per round",
        "efa_rows": rows_json(rows, "gpu", "ram"),
    })
}

/// What each side measured, for the report.
pub struct Measured<'a> {
    pub ours: &'a Side,
    pub anchor: &'a Side,
    pub copies: &'a Side,
    pub rdma: &'a Side,
}

/// The whole document.
pub fn results(
    settings: &Settings,
    measured: &Measured,
    compared: &[Row],
    p2p: &[Row],
    rdma: &[Row],
) -> Value {
    let s = settings;
    json!({
        "date_utc": s.date_utc,
        "machine": machine(),
        "rounds": s.rounds,
        "runtime_s": s.runtime_s,
        "caching": s.caching,
        "accel": s.accel.name(),
        "ours": {"topology": s.ours_topology, "nvme0_extra_args": s.nvme_extra_args, "run_dirs": measured.ours.run_dirs},
        "anchor": {"topology": s.anchor_topology, "drive": s.anchor_drive, "run_dirs": measured.anchor.run_dirs},
        "copies": {"topology": s.copy_topology, "len": s.copy_len, "nvme_extra_args": s.nvme_extra_args, "run_dirs": measured.copies.run_dirs},
        "compared_ratio": "p2plab-nvme / qemu nvme, per round",
        "compared": rows_json(compared, "p2plab_nvme", "qemu_nvme"),
        "p2p_ratio": "P2P buffer (GPU p2pmem, nvme1 CMB) / guest RAM buffer, same boot, per round",
        "p2p": rows_json(p2p, "p2p", "ram"),
        "rdma": {"topology": s.rdma_topology, "len": s.rdma_len, "post": s.rdma_post, "mtus": s.rdma_mtus, "run_dirs": measured.rdma.run_dirs, "nic_dma_paths": measured.rdma.nic_paths},
        "rdma_ratio": "nic0 -> wire -> nic1 from and into GPU memory (peer-memory API) or a GPU dma-buf / from and into guest RAM, same boot, per round",
        "rdma_rows": rows_json(rdma, "gpu", "ram"),
        "peak_rss_mib": {"ours": rss_mib(measured.ours), "anchor": rss_mib(measured.anchor)},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a document whose keys or layout drift from the results
    /// kept in guest-tests/bench/ (the docs' tables are generated from
    /// them), or a row that loses its samples or ratios.
    #[test]
    fn the_document_keeps_the_layout_of_the_kept_results() {
        let kept: Value =
            serde_json::from_str(include_str!("../results-direct.json")).expect("kept results");
        let settings = Settings {
            date_utc: "20260101-000000".into(),
            rounds: 1,
            runtime_s: 2,
            accel: p2plab_lab::Accel::Tcg,
            caching: "direct",
            ours_topology: "lab".into(),
            nvme_extra_args: vec!["--caching".into(), "direct".into()],
            anchor_topology: "/x/anchor-qemu-nvme.args".into(),
            anchor_drive: "-drive file=x,cache=none".into(),
            copy_topology: "two-nvme".into(),
            copy_len: "512M".into(),
            rdma_topology: "rdma".into(),
            rdma_len: "64M".into(),
            rdma_post: "256K".into(),
            rdma_mtus: vec![65536],
        };
        let (mut ours, anchor, copies, rdma) = Default::default();
        let ours: &mut Side = &mut ours;
        ours.rss.insert("qemu".into(), vec![1 << 20]);
        let row = Row {
            label: "4k-randread-qd32 IOPS".into(),
            left: vec![2.0, 4.0],
            right: vec![1.0, 1.0],
            lower_is_better: false,
        };
        let measured = Measured {
            ours,
            anchor: &anchor,
            copies: &copies,
            rdma: &rdma,
        };
        let doc = results(&settings, &measured, &[row], &[], &[]);
        let keys = |v: &Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&doc), keys(&kept));
        for section in ["ours", "anchor", "copies", "rdma", "peak_rss_mib"] {
            assert_eq!(keys(&doc[section]), keys(&kept[section]), "{section}");
        }
        assert_eq!(keys(&doc["compared"][0]), keys(&kept["compared"][0]));
        assert_eq!(doc["accel"], "tcg");
        assert_eq!(doc["compared"][0]["ratio"]["samples"], json!([2.0, 4.0]));
        assert_eq!(doc["compared"][0]["p2plab_nvme"]["median"], 3.0);
        assert_eq!(doc["peak_rss_mib"]["ours"]["qemu"]["median"], 1.0);
    }
}
