//! One boot of each kind, run and read into a [`Side`]: the fio jobs of an
//! NVMe boot (with the servers' CPU cost of the P2P ones), the copies
//! through each buffer, the RDMA transfers from and into each memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use p2plab_lab::{Lab, LabOptions, Outcome};
use serde_json::{json, Value};

use crate::fio::{self, Sample};
use crate::guest_output::{self, after, ServerCost};
use crate::hostcpu::{self, JobCost, Marks, Meter, Watcher};
use crate::jobs::{rdma_key, COPY_BUFFERS, RDMA_SOURCES};

/// Everything one side (ours, the anchor, the copies, the RDMA boots)
/// measured, round by round.
#[derive(Default)]
pub struct Side {
    /// job label -> one sample per round
    pub samples: BTreeMap<String, Vec<Sample>>,
    /// copy buffer -> MiB/s per round
    pub copies: BTreeMap<String, Vec<f64>>,
    /// RDMA memory -> MiB/s per round
    pub transfers: BTreeMap<String, Vec<f64>>,
    /// Which DMA path the NICs took, per round: nic0's reads and nic1's
    /// writes of the whole boot, from their stats.json.
    pub nic_paths: Vec<Value>,
    /// P2P job label -> server CPU µs per MiB moved, per round
    pub cpu_per_mib: BTreeMap<String, Vec<ServerCost>>,
    /// compared job -> the NVMe server's CPU per I/O and per MiB, read
    /// on the host (`hostcpu`), per round
    pub host_cpu: BTreeMap<String, Vec<JobCost>>,
    /// process -> peak RSS per round, bytes
    pub rss: BTreeMap<String, Vec<u64>>,
    pub run_dirs: Vec<PathBuf>,
}

/// Boots as `options` says and returns what the guest printed; a guest
/// script that fails fails the bench (`what` says which part).
fn boot(options: &LabOptions, what: &str) -> Result<Outcome> {
    let outcome = Lab::run(options)?;
    if outcome.status != Some(0) {
        bail!(
            "{}: guest {what} failed:\n{}",
            options.topology,
            outcome.output
        );
    }
    Ok(outcome)
}

/// Which server of a boot the host CPU marks read (see `hostcpu`).
pub enum Server<'a> {
    /// p2plab-nvme as device `nvme0` of the topology.
    P2plab,
    /// QEMU's own nvme model.
    Qemu,
    /// SPDK's nvmf_tgt, started by the bench.
    Spdk(&'a crate::spdk::Target),
}

impl Server<'_> {
    fn meter(&self, lab: &Lab) -> Result<Meter> {
        let pid = |name: &str| {
            lab.pids()
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, pid)| pid)
                .with_context(|| format!("no {name} process in the lab"))
        };
        Ok(match self {
            Server::P2plab => {
                pid("nvme0")?;
                Meter::P2plab {
                    stats: lab.run_dir().join("nvme0.stats.json"),
                }
            }
            Server::Qemu => Meter::Qemu { pid: pid("qemu")? },
            Server::Spdk(target) => Meter::Spdk {
                pid: target.pid,
                rpc: target.rpc.clone(),
            },
        })
    }
}

/// Like [`boot`], with the host following the console and reading
/// `server`'s CPU time at each `HOSTMARK` mark.
fn boot_measured(options: &LabOptions, server: &Server) -> Result<(Outcome, Marks)> {
    let lab = Lab::start(options)?;
    let meter = server.meter(&lab)?;
    let watcher = Watcher::start(&lab.run_dir().join("console.log"), meter);
    let finished = lab.finish(options);
    let marks = watcher.finish();
    let outcome = finished?;
    if outcome.status != Some(0) {
        bail!(
            "{}: guest benchmark failed:\n{}",
            options.topology,
            outcome.output
        );
    }
    Ok((outcome, marks?))
}

impl Side {
    /// Keeps the run folder of a finished boot.
    fn done(&mut self, topology: &str, outcome: Outcome) {
        eprintln!(
            "p2plab-bench: {topology} done (run folder {})",
            outcome.run_dir.display()
        );
        self.run_dirs.push(outcome.run_dir);
    }

    /// One NVMe boot: a fio sample per label, the servers' CPU cost of the
    /// jobs with CPU marks (guest-side for the P2P jobs, host-side of
    /// `server` for the compared ones), and the processes' peak RSS.
    pub fn run_jobs(
        &mut self,
        options: &LabOptions,
        labels: &[String],
        server: &Server,
    ) -> Result<()> {
        let (outcome, marks) = boot_measured(options, server)?;
        let topology = &options.topology;
        for label in labels {
            let line = after(&outcome.output, &format!("BENCH {label} "))
                .with_context(|| format!("{topology}: no result for {label}"))?;
            let sample = fio::parse(line).with_context(|| format!("{topology}: {label}"))?;
            self.samples.entry(label.clone()).or_default().push(sample);
            if outcome.output.contains(&format!("HOSTMARK {label} begin ")) {
                let cost = hostcpu::job_cost(&outcome.output, &marks, label)
                    .with_context(|| format!("{topology}: host CPU of {label}"))?;
                self.host_cpu.entry(label.clone()).or_default().push(cost);
            }
            if outcome.output.contains(&format!("CPU {label} begin ")) {
                let cost = guest_output::cpu_us_per_mib(&outcome.output, label)
                    .with_context(|| format!("{topology}: server CPU of {label}"))?;
                self.cpu_per_mib
                    .entry(label.clone())
                    .or_default()
                    .push(cost);
            }
        }
        for (name, bytes) in &outcome.peak_rss {
            self.rss.entry(name.clone()).or_default().push(*bytes);
        }
        self.done(topology, outcome);
        Ok(())
    }

    /// One boot of NVMe → NVMe copies of `len` bytes through each buffer.
    pub fn run_copies(&mut self, options: &LabOptions, len: u64) -> Result<()> {
        let outcome = boot(options, "copies")?;
        let topology = &options.topology;
        for (name, _) in COPY_BUFFERS {
            let line = after(&outcome.output, &format!("COPY {name} "))
                .with_context(|| format!("{topology}: no result for the copy via {name}"))?;
            let mib = guest_output::copy_mib_per_sec(line, len)
                .with_context(|| format!("{topology}: copy via {name}"))?;
            self.copies.entry((*name).to_owned()).or_default().push(mib);
        }
        self.done(topology, outcome);
        Ok(())
    }

    /// One RDMA boot at `mtu`: transfers of `len` bytes from and into each
    /// memory, and the DMA paths the NICs took.
    pub fn run_rdma(&mut self, options: &LabOptions, mtu: u32, len: u64) -> Result<()> {
        let outcome = boot(options, "transfers")?;
        let topology = &options.topology;
        // The guest driver reads the MTU from the device: both NICs must run
        // at the one asked, or the figures are filed under the wrong MTU.
        let seen = after(&outcome.output, "RDMA_MTU ")
            .with_context(|| format!("{topology}: the guest did not report the NICs' MTU"))?;
        let want = format!("mtu={mtu} mtu={mtu}");
        if seen.trim() != want {
            bail!("{topology}: the NICs run at {seen:?}, not MTU {mtu}");
        }
        for source in RDMA_SOURCES {
            let line = after(&outcome.output, &format!("RDMA {source} "))
                .with_context(|| format!("{topology}: no result for the transfer from {source}"))?;
            let mib = guest_output::rdma_mib_per_sec(line, len)
                .with_context(|| format!("{topology}: transfer from {source}"))?;
            self.transfers
                .entry(rdma_key(source, mtu))
                .or_default()
                .push(mib);
        }
        self.nic_paths
            .push(json!({"mtu": mtu, "bytes": nic_paths(&outcome.run_dir)?}));
        self.done(topology, outcome);
        Ok(())
    }
}

/// A counter found by key anywhere in a server's stats document.
fn stats_counter(v: &Value, key: &str) -> Option<u64> {
    match v {
        Value::Object(map) => map
            .get(key)
            .and_then(Value::as_u64)
            .or_else(|| map.values().find_map(|child| stats_counter(child, key))),
        _ => None,
    }
}

/// The bytes nic0 read and nic1 wrote, per DMA path, from their
/// stats.json in a finished run folder.
fn nic_paths(run_dir: &Path) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (id, dir) in [("nic0", "read"), ("nic1", "write")] {
        let path = run_dir.join(format!("{id}.stats.json"));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let stats: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        for kind in ["peer", "mmap", "message"] {
            let key = format!("dma_{kind}_{dir}_bytes");
            let n = stats_counter(&stats, &key)
                .with_context(|| format!("{} has no {key}", path.display()))?;
            out.insert(format!("{id}_{key}"), n.into());
        }
    }
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: DMA paths read from one NIC only, or a missing stats file
    /// taken for zero bytes.
    #[test]
    fn nic_paths_reads_both_stats_files() {
        let dir = std::env::temp_dir().join(format!("p2plab-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("nic0.stats.json"),
            r#"{"dma_peer_read_bytes":10,"dma_mmap_read_bytes":20,"dma_message_read_bytes":0}"#,
        )
        .unwrap();
        assert!(nic_paths(&dir).is_err(), "nic1 missing");
        std::fs::write(
            dir.join("nic1.stats.json"),
            r#"{"dma":{"dma_peer_write_bytes":11,"dma_mmap_write_bytes":21,"dma_message_write_bytes":1}}"#,
        )
        .unwrap();
        let paths = nic_paths(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(paths["nic0_dma_peer_read_bytes"], 10);
        assert_eq!(paths["nic1_dma_peer_write_bytes"], 11);
        assert_eq!(paths["nic1_dma_message_write_bytes"], 1);
    }
}
