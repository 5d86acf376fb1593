//! The comparisons the bench reports: one [`Row`] per figure, the same
//! figure on two sides measured in the same rounds (p2plab-nvme against
//! the anchor, p2pmem against RAM, GPU memory against RAM).

use crate::fio::Sample;
use crate::guest_output::ServerCost;
use crate::jobs::{rdma_key, Job, Metric, COPY_BUFFERS, P2P, RDMA_SOURCES};
use crate::measure::Side;

/// One line of a comparison: a figure on both sides, one value per round.
pub struct Row {
    pub label: String,
    pub left: Vec<f64>,
    pub right: Vec<f64>,
    /// Lower is better (latencies, costs): the plot says so.
    pub lower_is_better: bool,
}

/// A figure of every round's sample of job `label`.
fn figures(side: &Side, label: &str, pick: impl Fn(&Sample) -> f64) -> Vec<f64> {
    side.samples
        .get(label)
        .into_iter()
        .flatten()
        .map(pick)
        .collect()
}

/// p2plab-nvme against the anchor: each job's own figure and its p99.
pub fn compared(jobs: &[&Job], ours: &Side, anchor: &Side) -> Vec<Row> {
    let mut rows = Vec::new();
    for job in jobs {
        let metric = |s: &Sample| s.figure(job.metric);
        rows.push(Row {
            label: format!("{} {}", job.name, job.metric.label()),
            left: figures(ours, job.name, metric),
            right: figures(anchor, job.name, metric),
            lower_is_better: job.metric == Metric::LatencyUs,
        });
        rows.push(Row {
            label: format!("{} p99 µs", job.name),
            left: figures(ours, job.name, |s| s.p99_us),
            right: figures(anchor, job.name, |s| s.p99_us),
            lower_is_better: true,
        });
    }
    rows
}

/// p2pmem against the RAM buffers of each P2P job (speed, the servers'
/// CPU, fio's CPU in the guest), then the copies through p2pmem and a CMB
/// against the copy through RAM.
pub fn p2p(ours: &Side, copies: &Side) -> Vec<Row> {
    let copy = |name: &str| copies.copies.get(name).cloned().unwrap_or_default();
    let copy_rows = COPY_BUFFERS
        .iter()
        .filter(|(name, _)| *name != "ram")
        .map(|(name, _)| Row {
            label: format!("nvme-to-nvme-copy via {name} MiB/s"),
            left: copy(name),
            right: copy("ram"),
            lower_is_better: false,
        });
    let cpu = |label: String, part: fn(&ServerCost) -> f64| -> Vec<f64> {
        ours.cpu_per_mib
            .get(&label)
            .map(|costs| costs.iter().map(part).collect())
            .unwrap_or_default()
    };
    // p2pmem against one of the RAM buffers (`ram`, `ram4k`) of a job.
    let sample_row = |job: &Job, what: &str, ram: &str, figure: &dyn Fn(&Sample) -> f64| Row {
        label: format!("{} {what}", job.name),
        left: figures(ours, &format!("p2p-{}", job.name), figure),
        right: figures(ours, &format!("{ram}-{}", job.name), figure),
        lower_is_better: false,
    };
    let cost_row = |job: &Job, what: &str, ram: &str, figure: &dyn Fn(&Sample) -> f64| Row {
        lower_is_better: true,
        ..sample_row(job, what, ram, figure)
    };
    let guest_cpu = |s: &Sample| s.guest_cpu_us_per_mib;
    P2P.iter()
        .flat_map(|job| {
            let metric = |s: &Sample| s.figure(job.metric);
            [
                sample_row(job, job.metric.label(), "ram", &metric),
                Row {
                    label: format!("{} server CPU µs/MiB", job.name),
                    left: cpu(format!("p2p-{}", job.name), |c| c.total),
                    right: cpu(format!("ram-{}", job.name), |c| c.total),
                    lower_is_better: true,
                },
                Row {
                    label: format!("{} server busy CPU µs/MiB", job.name),
                    left: cpu(format!("p2p-{}", job.name), |c| c.busy),
                    right: cpu(format!("ram-{}", job.name), |c| c.busy),
                    lower_is_better: true,
                },
                cost_row(job, "guest fio CPU µs/MiB", "ram", &guest_cpu),
                sample_row(
                    job,
                    &format!("{} vs 4k-page RAM", job.metric.label()),
                    "ram4k",
                    &metric,
                ),
                cost_row(
                    job,
                    "guest fio CPU µs/MiB vs 4k-page RAM",
                    "ram4k",
                    &guest_cpu,
                ),
            ]
        })
        .chain(copy_rows)
        .collect()
}

/// Each GPU memory against guest RAM at the same MTU.
pub fn rdma(rdma: &Side, mtus: &[u32]) -> Vec<Row> {
    let transfer = |key: String| rdma.transfers.get(&key).cloned().unwrap_or_default();
    mtus.iter()
        .flat_map(|&mtu| {
            RDMA_SOURCES
                .iter()
                .filter(|name| **name != "ram")
                .map(move |name| (name, mtu))
        })
        .map(|(name, mtu)| Row {
            label: format!("nic0-to-nic1 {name} mtu {mtu} MiB/s"),
            left: transfer(rdma_key(name, mtu)),
            right: transfer(rdma_key("ram", mtu)),
            lower_is_better: false,
        })
        .collect()
}

/// Peak resident memory (MiB) of each process of our boots against the
/// anchor's. QEMU's includes the guest RAM it touched (shared with the
/// servers, so not counted twice); the servers add their own.
pub fn peak_rss(ours: &Side, anchor: &Side) -> Vec<Row> {
    let mib = |side: &Side, name: &str| -> Vec<f64> {
        side.rss
            .get(name)
            .into_iter()
            .flatten()
            .map(|&b| b as f64 / (1024.0 * 1024.0))
            .collect()
    };
    ours.rss
        .keys()
        .map(|name| Row {
            label: format!("peak RSS MiB: {name}"),
            left: mib(ours, name),
            right: mib(anchor, name),
            lower_is_better: true,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::ratios;

    /// Catches: a GPU memory compared with RAM at another MTU, or RAM
    /// compared with itself.
    #[test]
    fn rdma_rows_pair_each_memory_with_ram_at_the_same_mtu() {
        let mut side = Side::default();
        for (key, v) in [
            ("ram mtu 4096", 10.0),
            ("gpu mtu 4096", 9.0),
            ("dmabuf mtu 4096", 11.0),
            ("ram mtu 65536", 20.0),
            ("gpu mtu 65536", 100.0),
        ] {
            side.transfers.insert(key.to_owned(), vec![v]);
        }
        let rows = rdma(&side, &[4096, 65536]);
        let summary: Vec<(String, Vec<f64>)> = rows
            .iter()
            .map(|r| (r.label.clone(), ratios(&r.left, &r.right)))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("nic0-to-nic1 gpu mtu 4096 MiB/s".to_owned(), vec![0.9]),
                ("nic0-to-nic1 dmabuf mtu 4096 MiB/s".to_owned(), vec![1.1]),
                ("nic0-to-nic1 gpu mtu 65536 MiB/s".to_owned(), vec![5.0]),
                ("nic0-to-nic1 dmabuf mtu 65536 MiB/s".to_owned(), vec![]),
            ]
        );
    }

    /// Catches P2P rows that compare p2pmem with the wrong RAM buffer
    /// (THP against 4 KiB pages), the wrong figure, or a cost row that
    /// claims higher is better.
    #[test]
    fn p2p_rows_compare_p2pmem_with_each_ram_buffer() {
        let sample = |mib_s: f64, cpu: f64| Sample {
            iops: 1.0,
            bytes_per_sec: mib_s * 1048576.0,
            p50_us: 1.0,
            p99_us: 1.0,
            guest_cpu_us_per_mib: cpu,
        };
        let mut ours = Side::default();
        for job in P2P {
            for (buffer, mib_s, cpu) in [
                ("p2p", 500.0, 20.0),
                ("ram", 700.0, 10.0),
                ("ram4k", 400.0, 30.0),
            ] {
                ours.samples
                    .insert(format!("{buffer}-{}", job.name), vec![sample(mib_s, cpu)]);
            }
            for (buffer, busy) in [("p2p", 3.0), ("ram", 4.0)] {
                ours.cpu_per_mib.insert(
                    format!("{buffer}-{}", job.name),
                    vec![ServerCost { total: 9.0, busy }],
                );
            }
        }
        let rows = p2p(&ours, &Side::default());
        let row = |label: &str| {
            rows.iter()
                .find(|r| r.label == label)
                .unwrap_or_else(|| panic!("no row {label}"))
        };
        let name = P2P[0].name;
        let check = |label: String, left: f64, right: f64, lower: bool| {
            let r = row(&label);
            assert_eq!(
                (r.left.as_slice(), r.right.as_slice()),
                (&[left][..], &[right][..]),
                "{label}"
            );
            assert_eq!(r.lower_is_better, lower, "{label}");
        };
        check(format!("{name} MiB/s"), 500.0, 700.0, false);
        check(format!("{name} MiB/s vs 4k-page RAM"), 500.0, 400.0, false);
        check(format!("{name} guest fio CPU µs/MiB"), 20.0, 10.0, true);
        check(
            format!("{name} guest fio CPU µs/MiB vs 4k-page RAM"),
            20.0,
            30.0,
            true,
        );
        check(format!("{name} server CPU µs/MiB"), 9.0, 9.0, true);
        check(format!("{name} server busy CPU µs/MiB"), 3.0, 4.0, true);
    }

    /// Catches: peak RSS converted with the wrong unit, or a process of
    /// ours paired with another process of the anchor.
    #[test]
    fn peak_rss_pairs_each_process_in_mib() {
        let mut ours = Side::default();
        let mut anchor = Side::default();
        ours.rss.insert("qemu".into(), vec![2 << 20, 4 << 20]);
        ours.rss.insert("nvme0".into(), vec![1 << 20]);
        anchor.rss.insert("qemu".into(), vec![1 << 20, 2 << 20]);
        let rows = peak_rss(&ours, &anchor);
        let summary: Vec<(&str, &[f64], &[f64])> = rows
            .iter()
            .map(|r| (r.label.as_str(), r.left.as_slice(), r.right.as_slice()))
            .collect();
        assert_eq!(
            summary,
            [
                ("peak RSS MiB: nvme0", &[1.0][..], &[][..]),
                ("peak RSS MiB: qemu", &[2.0, 4.0][..], &[1.0, 2.0][..]),
            ]
        );
    }
}
