//! The JSON report, `results.json` of a bench folder (and the files kept
//! in guest-tests/bench/): every sample, its median and min–max, and the
//! per-round ratios of each row, with the settings and the machine.

use serde_json::{json, Value};

use crate::disks::Allocation;
use crate::hostcpu::JobCost;
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

/// The NVMe servers' CPU per I/O and per MiB of each compared job, read
/// on the host the same way for each (`hostcpu`): job -> server ->
/// figure -> spread over the rounds.
fn host_cpu_json(sides: &[(&str, &Side)]) -> Value {
    let mut jobs = serde_json::Map::new();
    for (server, side) in sides {
        for (job, costs) in &side.host_cpu {
            let pick = |f: fn(&JobCost) -> f64| -> Vec<f64> { costs.iter().map(f).collect() };
            let entry = jobs
                .entry(job.clone())
                .or_insert_with(|| Value::Object(Default::default()));
            entry[*server] = json!({
                "busy_us_per_io": spread_json(&pick(|c| c.busy_us_per_io)),
                "total_us_per_io": spread_json(&pick(|c| c.total_us_per_io)),
                "busy_us_per_mib": spread_json(&pick(|c| c.busy_us_per_mib)),
                "total_us_per_mib": spread_json(&pick(|c| c.total_us_per_mib)),
            });
        }
    }
    jobs.into()
}

/// What each side measured, for the report.
pub struct Measured<'a> {
    pub ours: &'a Side,
    pub anchor: &'a Side,
    pub spdk: &'a Side,
    pub copies: &'a Side,
    pub rdma: &'a Side,
    pub disks: &'a [Allocation],
}

/// The whole document.
pub fn results(
    settings: &Settings,
    measured: &Measured,
    compared: &[Row],
    compared_spdk: &[Row],
    p2p: &[Row],
    rdma: &[Row],
) -> Value {
    let s = settings;
    let spdk = s.spdk.as_ref().map(|k| {
        json!({"dir": k.dir, "version": k.version, "topology": k.topology, "device": k.device,
               "disk": k.disk, "bdev": "aio (O_DIRECT)", "reactor_mask": "0x1",
               "run_dirs": measured.spdk.run_dirs})
    });
    let mut cpu_sides = vec![
        ("p2plab_nvme", measured.ours),
        ("qemu_nvme", measured.anchor),
    ];
    if spdk.is_some() {
        cpu_sides.push(("spdk", measured.spdk));
    }
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
        "spdk": spdk,
        "compared_spdk_ratio": "p2plab-nvme / SPDK nvmf_tgt (vfio-user), per round",
        "compared_spdk": rows_json(compared_spdk, "p2plab_nvme", "spdk"),
        "host_cpu_note": "server CPU between the guest's marks around each compared job, read on the host; per I/O and per MiB the guest's nvme0n1 completed between the same marks; busy leaves out idle polling (p2plab-nvme: idle_poll_cpu_us; SPDK: reactor idle ticks; QEMU: none, it does not poll); QEMU: its process less its vCPU threads",
        "host_cpu": host_cpu_json(&cpu_sides),
        "disks_note": "the compared NVMe sides' backing files, rewritten with their own bytes before each round wherever they had holes, so that every O_DIRECT read reaches allocated blocks (a hole reads as zeros without disk I/O); bytes allocated before the first round and after the last",
        "disks": measured.disks.iter().map(Allocation::to_json).collect::<Vec<_>>(),
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
            spdk: None,
            copy_topology: "two-nvme".into(),
            copy_len: "512M".into(),
            rdma_topology: "rdma".into(),
            rdma_len: "64M".into(),
            rdma_post: "256K".into(),
            rdma_mtus: vec![65536],
        };
        let (mut ours, anchor, copies, rdma, spdk) = Default::default();
        let ours: &mut Side = &mut ours;
        ours.rss.insert("qemu".into(), vec![1 << 20]);
        let cost = |busy| JobCost {
            total_us_per_io: 10.0,
            busy_us_per_io: busy,
            total_us_per_mib: 2560.0,
            busy_us_per_mib: busy * 256.0,
        };
        ours.host_cpu
            .insert("4k-randread-qd32".into(), vec![cost(1.0), cost(3.0)]);
        let row = Row {
            label: "4k-randread-qd32 IOPS".into(),
            left: vec![2.0, 4.0],
            right: vec![1.0, 1.0],
            lower_is_better: false,
        };
        let measured = Measured {
            ours,
            anchor: &anchor,
            spdk: &spdk,
            copies: &copies,
            rdma: &rdma,
            disks: &[],
        };
        let doc = results(&settings, &measured, &[row], &[], &[], &[]);
        let keys = |v: &Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        // The kept layout, plus what came after it (SPDK, host CPU).
        let added = [
            "compared_spdk",
            "compared_spdk_ratio",
            "disks",
            "disks_note",
            "host_cpu",
            "host_cpu_note",
            "spdk",
        ];
        let mut old: Vec<String> = keys(&doc)
            .into_iter()
            .filter(|k| !added.contains(&k.as_str()))
            .collect();
        old.sort();
        let mut kept_keys = keys(&kept);
        kept_keys.retain(|k| !added.contains(&k.as_str()));
        assert_eq!(old, kept_keys);
        assert_eq!(doc["spdk"], Value::Null);
        let cpu = &doc["host_cpu"]["4k-randread-qd32"];
        assert_eq!(cpu["p2plab_nvme"]["busy_us_per_io"]["median"], 2.0);
        assert_eq!(cpu["p2plab_nvme"]["busy_us_per_mib"]["max"], 768.0);
        assert!(
            cpu.get("spdk").is_none(),
            "no SPDK side without --anchor spdk"
        );
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
