//! `p2plab-bench`: guest I/O benchmarks of p2plab's NVMe server against the
//! anchor (QEMU's built-in nvme), side by side in one run, and of the P2P
//! path (NVMe ↔ GPU p2pmem) against the RAM path in the same boot.
//!
//! Fairness: both NVMe devices use the same caching on the host. `page`
//! runs p2plab-nvme through the page cache and the anchor with
//! `cache=writeback`; `direct` runs p2plab-nvme with O_DIRECT
//! (`--caching direct`) and the anchor with `cache=none`. Each round boots
//! the three topologies in turn (p2plab, the anchor, and two NVMe with a GPU
//! for NVMe → NVMe copies through RAM, GPU p2pmem and a CMB), then the
//! `rdma` topology, where two p2plab-nic devices move the same bytes over
//! their wire from and into guest RAM, GPU memory (the GPU driver's
//! peer-memory API) and GPU dma-bufs. The figures are true medians over the
//! rounds with their min–max spread. Everything measured goes to `results.json`
//! and `results.svg` in a bench folder under `runs/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use p2plab_lab::lab::format_utc;
use p2plab_lab::{Lab, LabOptions, LabPaths, Mode};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(
    name = "bench",
    about = "Benchmark p2plab-nvme against QEMU's built-in nvme, and P2P against RAM"
)]
struct Cli {
    /// Rounds; each boots both devices once (medians and min–max spread).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Seconds each fio job runs.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(2..=600))]
    runtime: u32,
    /// Host caching of both NVMe devices: `page` (p2plab-nvme through the
    /// page cache, anchor cache=writeback) or `direct` (p2plab-nvme
    /// O_DIRECT, anchor cache=none).
    #[arg(long, value_enum, default_value_t = Caching::Page)]
    caching: Caching,
    /// Skip the P2P workloads (NVMe ↔ GPU p2pmem against the RAM path).
    #[arg(long)]
    no_p2p: bool,
    /// Topology for p2plab's devices (needs nvme0, and gpu0 for P2P).
    #[arg(long, default_value = "lab")]
    ours: String,
    /// Topology for the NVMe → NVMe copies (needs nvme0 and nvme1 with
    /// serials P2PLAB-NVME0 and P2PLAB-NVME1, and gpu0).
    #[arg(long, default_value = "two-nvme")]
    copy_topology: String,
    /// Bytes each NVMe → NVMe copy moves.
    #[arg(long, default_value = "512M", value_parser = parse_copy_len)]
    copy_len: String,
    /// Topology for the anchor; its one `-drive` gets the cache mode.
    #[arg(long, default_value = "anchor-qemu-nvme")]
    anchor: String,
    /// Skip the RDMA workloads (nic0 → wire → nic1, GPU memory against RAM).
    #[arg(long)]
    no_rdma: bool,
    /// Run only the RDMA workloads: no NVMe boot at all.
    #[arg(long, conflicts_with = "no_rdma")]
    rdma_only: bool,
    /// Topology for the RDMA workloads (needs nic0 and nic1 wired to each
    /// other, and gpu0 under the same switch).
    #[arg(long, default_value = "rdma")]
    rdma_topology: String,
    /// Bytes each RDMA transfer moves (a whole number of MiB, 1M..1G).
    #[arg(long, default_value = "64M", value_parser = parse_copy_len)]
    rdma_len: String,
    /// Bytes per posted send/receive, the same for every memory so the
    /// ratio compares memories, not batching (4K..1M in 4 KiB steps: a RAM
    /// post is one frame per page and must fit the 256-entry ring).
    #[arg(long, default_value = "256K", value_parser = parse_rdma_post)]
    rdma_post: String,
    /// NIC MTUs to run the RDMA transfers at, one boot each per round
    /// (repeatable). A RAM region is cut into one frame per 4 KiB page
    /// whatever the MTU, GPU memory into MTU-sized frames: at 4096 both
    /// memories move in the same frames, at the default 65536 GPU memory
    /// also gains from bigger frames.
    #[arg(long, default_values_t = [65536u32, 4096], value_parser = clap::value_parser!(u32).range(4096..=1 << 20))]
    rdma_mtu: Vec<u32>,
    /// Run only these compared jobs (repeatable, e.g. `--only
    /// 4k-randread-qd32 --no-p2p` while profiling); default: all.
    #[arg(long, value_parser = parse_job_name)]
    only: Vec<String>,
}

fn parse_job_name(text: &str) -> Result<String, String> {
    if COMPARED.iter().any(|j| j.name == text) {
        Ok(text.to_owned())
    } else {
        let names: Vec<&str> = COMPARED.iter().map(|j| j.name).collect();
        Err(format!("{text:?}: one of {}", names.join(", ")))
    }
}

/// The compared jobs `only` selects (all when empty).
fn selected(only: &[String]) -> Vec<&'static Job> {
    COMPARED
        .iter()
        .filter(|j| only.is_empty() || only.iter().any(|o| o == j.name))
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Caching {
    Page,
    Direct,
}

impl Caching {
    fn server_flag(self) -> &'static str {
        match self {
            Caching::Page => "page",
            Caching::Direct => "direct",
        }
    }

    fn qemu_cache(self) -> &'static str {
        match self {
            Caching::Page => "writeback",
            Caching::Direct => "none",
        }
    }
}

/// Which figure a job is judged by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Metric {
    Iops,
    MibPerSec,
    /// Completion latency: p50 and p99 matter, lower is better.
    LatencyUs,
}

impl Metric {
    fn label(self) -> &'static str {
        match self {
            Metric::Iops => "IOPS",
            Metric::MibPerSec => "MiB/s",
            Metric::LatencyUs => "p50 µs",
        }
    }
}

/// A fio job: `name` keys the results.
struct Job {
    name: &'static str,
    fio: &'static str,
    metric: Metric,
}

/// Run on both p2plab-nvme and the anchor.
const COMPARED: &[Job] = &[
    Job {
        name: "4k-randread-qd32",
        fio: "--rw=randread --bs=4k --iodepth=32 --ioengine=libaio",
        metric: Metric::Iops,
    },
    Job {
        name: "128k-seqread-qd8",
        fio: "--rw=read --bs=128k --iodepth=8 --ioengine=libaio",
        metric: Metric::MibPerSec,
    },
    Job {
        name: "4k-randwrite-qd32",
        fio: "--rw=randwrite --bs=4k --iodepth=32 --ioengine=libaio",
        metric: Metric::Iops,
    },
    Job {
        name: "4k-randread-qd1",
        fio: "--rw=randread --bs=4k --iodepth=1 --ioengine=psync",
        metric: Metric::LatencyUs,
    },
];

/// Run on p2plab only, three times in the same boot: into guest RAM with
/// transparent huge pages off (`ram4k-NAME`, 4 KiB pages like p2pmem's),
/// into guest RAM as fio allocates it (`ram-NAME`: Debian's kernel backs
/// it with 2 MiB pages), and into the GPU's p2pmem (`p2p-NAME`), so the
/// P2P path is judged against the RAM path under the same conditions.
const P2P: &[Job] = &[
    Job {
        name: "nvme-to-gpu-1m-qd4",
        fio: "--rw=read --bs=1M --iodepth=4 --ioengine=libaio",
        metric: Metric::MibPerSec,
    },
    Job {
        name: "gpu-to-nvme-1m-qd4",
        fio: "--rw=write --bs=1M --iodepth=4 --ioengine=libaio",
        metric: Metric::MibPerSec,
    },
];

fn parse_copy_len(text: &str) -> Result<String, String> {
    match p2plab_lab::topology::parse_size(text) {
        Some(n) if (1 << 20..=1 << 30).contains(&n) && n.is_multiple_of(1 << 20) => {
            Ok(text.to_owned())
        }
        _ => Err(format!("{text:?}: a whole number of MiB, 1M..1G")),
    }
}

fn parse_rdma_post(text: &str) -> Result<String, String> {
    match p2plab_lab::topology::parse_size(text) {
        Some(n) if (4096..=1 << 20).contains(&n) && n.is_multiple_of(4096) => Ok(text.to_owned()),
        _ => Err(format!("{text:?}: a multiple of 4K, 4K..1M")),
    }
}

/// Memories the RDMA transfers go from and into, in the same boot: guest
/// RAM (the reference, pinned user pages), GPU memory registered through
/// the GPU driver's peer-memory API, and a GPU allocation exported as a
/// dma-buf.
const RDMA_SOURCES: &[&str] = &["ram", "gpu", "dmabuf"];

/// Moves `len` bytes nic0 → wire → nic1 from and into each memory with
/// p2plab-nic-tool (which verifies the destination: bytes for RAM, the GPU
/// engine's CRC for GPU memory); one `RDMA SOURCE KEY=VALUE...` line each.
fn rdma_script(len: &str, post: &str) -> String {
    let mut script = String::from(
        r#"set -e
i=0
until p2plab-nic-tool info /dev/p2plab-nic0 | grep -qx link_up=1 &&
      p2plab-nic-tool info /dev/p2plab-nic1 | grep -qx link_up=1; do
  sleep 0.2; i=$((i+1)); [ $i -lt 150 ] || { echo 'the NICs have no link'; exit 1; }
done
echo RDMA_MTU $(p2plab-nic-tool info /dev/p2plab-nic0 | grep '^mtu=') $(p2plab-nic-tool info /dev/p2plab-nic1 | grep '^mtu=')
"#,
    );
    for (seed, source) in RDMA_SOURCES.iter().enumerate() {
        script.push_str(&format!(
            "echo RDMA {source} $(p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 \
             --src {source} --dst {source} --size {len} --post {post} --seed {} 2>&1 | tr '\\n' ' ')\n",
            seed + 1
        ));
    }
    script
}

/// MiB/s of one transfer line, which must have moved and verified `len`
/// bytes without a failed completion.
fn parse_rdma(line: &str, len: u64) -> Result<f64> {
    let value = |key: &str| -> Option<&str> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    };
    let number = |key: &str| -> Result<f64> {
        value(key)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no {key} in {line:?}"))
    };
    if value("verify") != Some("ok")
        || number("bytes")? != len as f64
        || number("tx_errors")? != 0.0
        || number("rx_errors")? != 0.0
    {
        bail!("the transfer failed, was short or did not verify: {line:?}");
    }
    number("mib_per_s")
}

/// Buffers the NVMe → NVMe copies go through, in the same boot: guest RAM
/// (the reference), the GPU's p2pmem and nvme1's CMB.
const COPY_BUFFERS: &[(&str, &str)] = &[
    ("ram", "ram"),
    ("gpu0-p2pmem", "$gpu_bdf"),
    ("nvme1-cmb", "$nvme1_bdf"),
];

/// Copies nvme0 → nvme1 through each buffer with p2plab-p2pio (1 MiB
/// chunks, 4 threads, an 8 MiB buffer), after one unmeasured warm-up copy;
/// one `COPY NAME KEY=VALUE...` line each.
fn copy_script(len: &str) -> String {
    let mut script = String::from(
        r#"set -e
src=$(p2plab-nvme-ns --serial P2PLAB-NVME0 1)
dst=$(p2plab-nvme-ns --serial P2PLAB-NVME1 1)
nvme1_bdf=$(basename "$(readlink -f /sys/class/nvme/$(p2plab-nvme-ns --ctrl-of P2PLAB-NVME1)/device)")
gpu_bdf=$(for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = 0x030200 ] && basename $d; done | head -n1)
for d in $gpu_bdf $nvme1_bdf; do
  [ "$(cat /sys/bus/pci/devices/$d/p2pmem/published)" = 1 ] || { echo "no published p2pmem on $d"; exit 1; }
done
"#,
    );
    // Unmeasured: the first copy of a boot runs cold (nvme1's file blocks
    // get allocated, nvme0's pages come into the host's page cache) at
    // about half the speed of the next ones, which would flatter whichever
    // buffer comes second.
    script.push_str(&format!(
        "warm=$(p2plab-p2pio --p2pmem ram copy --src $src --dst $dst --len {len} \
         --chunk 1M --threads 4 --buffer 8M 2>&1 | tr '\n' ' ')\n\
         case \"$warm\" in *ERRORS=0*) ;; *) echo \"warm-up copy failed: $warm\"; exit 1 ;; esac\n"
    ));
    for (name, bdf) in COPY_BUFFERS {
        script.push_str(&format!(
            "echo COPY {name} $(p2plab-p2pio --p2pmem {bdf} copy --src $src --dst $dst --len {len} \
             --chunk 1M --threads 4 --buffer 8M 2>&1 | tr '\\n' ' ')\n"
        ));
    }
    script
}

/// MiB/s of one copy line, which must have moved `len` bytes without errors.
fn parse_copy(line: &str, len: u64) -> Result<f64> {
    let value = |key: &str| -> Option<&str> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    };
    let number = |key: &str| -> Result<f64> {
        value(key)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no {key} in {line:?}"))
    };
    if number("ERRORS")? != 0.0 || number("BYTES")? != len as f64 {
        bail!("the copy failed or was short: {line:?}");
    }
    number("MIB_PER_SEC")
}

fn fio_line(label: &str, fio: &str, mem: &str, runtime: u32) -> String {
    format!(
        "echo BENCH {label} $(fio --name={label} --filename=/dev/nvme0n1 --direct=1 {fio}{mem} \
         --size=512M --time_based --runtime={runtime} --ramp_time=2 --output-format=json \
         | tr -d '\\n')\n"
    )
}

/// The servers that take part in a P2P job, whose CPU time it costs: the
/// NVMe server moves the bytes; the GPU server would take part if they
/// went through QEMU and it.
const CPU_SERVERS: &[&str] = &["nvme0", "gpu0"];

/// One `CPU LABEL begin|end SERVER {status}` line per server, from the
/// guest's control channel (`p2plab-ctl SERVER status --json`): the
/// process's CPU time and the NVMe data counters at that moment.
fn cpu_mark(label: &str, at: &str) -> String {
    CPU_SERVERS
        .iter()
        .map(|server| {
            format!(
                "echo CPU {label} {at} {server} $(p2plab-ctl {server} status --json | tr -d '\n')\n"
            )
        })
        .collect()
}

/// Server CPU time per MiB the NVMe moved during one job.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ServerCost {
    /// All the CPU time of the servers.
    total: f64,
    /// Without the time their workers spun while idle, waiting for the
    /// guest's next command (`idle_poll_cpu_us`): what moving the bytes
    /// cost. A job the guest runs slower leaves the servers idle longer,
    /// so only this part compares the two paths' cost per byte.
    busy: f64,
}

/// Server CPU time per MiB the NVMe moved during one job: the CPU of every
/// [`CPU_SERVERS`] process between the job's marks, over nvme0's data
/// bytes (both directions) in the same window. Ramp time included on both
/// sides, so the ratio of two jobs is fair.
fn cpu_us_per_mib(output: &str, label: &str) -> Result<ServerCost> {
    let status = |at: &str, server: &str| -> Result<Value> {
        let prefix = format!("CPU {label} {at} {server} ");
        let line = output
            .lines()
            .find_map(|l| l.find(&prefix).map(|i| &l[i + prefix.len()..]))
            .with_context(|| format!("no CPU mark {at} of {label} for {server}"))?;
        serde_json::from_str(line)
            .with_context(|| format!("the status of {server} at the {at} of {label}: {line:?}"))
    };
    let cpu = |v: &Value| -> Result<(f64, f64)> {
        let p = &v["process"];
        match (
            p["cpu_user_us"].as_u64(),
            p["cpu_system_us"].as_u64(),
            p["idle_poll_cpu_us"].as_u64(),
        ) {
            (Some(user), Some(system), Some(idle)) => Ok(((user + system) as f64, idle as f64)),
            _ => bail!("no process CPU time in {v}"),
        }
    };
    let bytes = |v: &Value| -> Result<f64> {
        let c = &v["counters"];
        match (c["bytes_read"].as_u64(), c["bytes_written"].as_u64()) {
            (Some(r), Some(w)) => Ok((r + w) as f64),
            _ => bail!("no NVMe byte counters in {v}"),
        }
    };
    let (mut cpu_us, mut idle_us) = (0.0, 0.0);
    for server in CPU_SERVERS {
        let (end, end_idle) = cpu(&status("end", server)?)?;
        let (begin, begin_idle) = cpu(&status("begin", server)?)?;
        cpu_us += end - begin;
        idle_us += end_idle - begin_idle;
    }
    let moved = bytes(&status("end", "nvme0")?)? - bytes(&status("begin", "nvme0")?)?;
    if moved <= 0.0 {
        bail!("{label}: nvme0 moved no data between the CPU marks");
    }
    let mib = moved / (1024.0 * 1024.0);
    Ok(ServerCost {
        total: cpu_us / mib,
        busy: (cpu_us - idle_us).max(0.0) / mib,
    })
}

fn guest_script(jobs: &[&Job], runtime: u32, p2p: bool) -> String {
    let mut script =
        String::from("set -e\n[ -b /dev/nvme0n1 ] || { echo 'no /dev/nvme0n1'; exit 1; }\n");
    for job in jobs {
        script.push_str(&fio_line(job.name, job.fio, "", runtime));
    }
    if p2p {
        script.push_str(
            "gpu=$(for d in /sys/bus/pci/devices/*; do \
             [ \"$(cat $d/class)\" = 0x030200 ] && echo $d; done | head -n1)\n\
             [ -n \"$gpu\" ] && [ \"$(cat $gpu/p2pmem/published)\" = 1 ] \
             || { echo 'no GPU with published p2pmem'; exit 1; }\n",
        );
        for job in P2P {
            // First, so that it gets the least fragmented memory of the
            // three: physically contiguous pages need fewer DMA segments.
            script.push_str(&format!(
                "thp=/sys/kernel/mm/transparent_hugepage/enabled\n\
                 thp_was=$(sed 's/.*\\[\\(.*\\)\\].*/\\1/' $thp)\n\
                 echo never > $thp\n\
                 {}\
                 echo $thp_was > $thp\n",
                fio_line(&format!("ram4k-{}", job.name), job.fio, "", runtime)
            ));
            for (label, mem) in [
                (format!("ram-{}", job.name), ""),
                (
                    format!("p2p-{}", job.name),
                    " --mem=mmapshared:$gpu/p2pmem/allocate",
                ),
            ] {
                script.push_str(&cpu_mark(&label, "begin"));
                script.push_str(&fio_line(&label, job.fio, mem, runtime));
                script.push_str(&cpu_mark(&label, "end"));
            }
        }
    }
    script
}

/// One fio result for the job's busy direction.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    iops: f64,
    bytes_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// fio's own CPU time in the guest (user + system, its thread only)
    /// per MiB it moved: under TCG the guest's vCPU is often what limits
    /// a job, and this tells how much of it each byte took.
    guest_cpu_us_per_mib: f64,
}

impl Sample {
    fn figure(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Iops => self.iops,
            Metric::MibPerSec => self.bytes_per_sec / (1024.0 * 1024.0),
            Metric::LatencyUs => self.p50_us,
        }
    }
}

fn parse_fio(json: &str) -> Result<Sample> {
    let value: Value = serde_json::from_str(json).context("fio output is not JSON")?;
    let job = value
        .get("jobs")
        .and_then(|j| j.get(0))
        .context("fio JSON has no jobs")?;
    for dir in ["read", "write"] {
        let Some(stats) = job.get(dir) else { continue };
        let iops = stats.get("iops").and_then(Value::as_f64).unwrap_or(0.0);
        if iops > 0.0 {
            let number = |pointer: &str| -> Result<f64> {
                stats
                    .pointer(pointer)
                    .and_then(Value::as_f64)
                    .with_context(|| format!("fio JSON has no {dir}{pointer}"))
            };
            let job_number = |key: &str| -> Result<f64> {
                job.get(key)
                    .and_then(Value::as_f64)
                    .with_context(|| format!("fio JSON has no {key}"))
            };
            let cpu_share = (job_number("usr_cpu")? + job_number("sys_cpu")?) / 100.0;
            let runtime_us = job_number("job_runtime")? * 1000.0;
            let mib = number("/io_bytes")? / (1024.0 * 1024.0);
            if mib <= 0.0 {
                bail!("fio moved no bytes");
            }
            return Ok(Sample {
                iops,
                bytes_per_sec: number("/bw_bytes")?,
                p50_us: number("/clat_ns/percentile/50.000000")? / 1000.0,
                p99_us: number("/clat_ns/percentile/99.000000")? / 1000.0,
                guest_cpu_us_per_mib: cpu_share * runtime_us / mib,
            });
        }
    }
    bail!("fio reported no I/O")
}

/// Everything one side (ours or the anchor) measured, round by round.
#[derive(Default)]
struct Side {
    /// job label -> one sample per round
    samples: BTreeMap<String, Vec<Sample>>,
    /// copy buffer -> MiB/s per round
    copies: BTreeMap<String, Vec<f64>>,
    /// RDMA memory -> MiB/s per round
    transfers: BTreeMap<String, Vec<f64>>,
    /// Which DMA path the NICs took, per round: nic0's reads and nic1's
    /// writes of the whole boot, from their stats.json.
    nic_paths: Vec<Value>,
    /// P2P job label -> server CPU µs per MiB moved, per round
    cpu_per_mib: BTreeMap<String, Vec<ServerCost>>,
    /// process -> peak RSS per round, bytes
    rss: BTreeMap<String, Vec<u64>>,
    run_dirs: Vec<PathBuf>,
}

fn run_copies(options: &LabOptions, len: u64, side: &mut Side) -> Result<()> {
    let outcome = Lab::run(options)?;
    let topology = &options.topology;
    if outcome.status != Some(0) {
        bail!("{topology}: guest copies failed:\n{}", outcome.output);
    }
    for (name, _) in COPY_BUFFERS {
        let prefix = format!("COPY {name} ");
        let line = outcome
            .output
            .lines()
            .find_map(|l| l.find(&prefix).map(|at| &l[at + prefix.len()..]))
            .with_context(|| format!("{topology}: no result for the copy via {name}"))?;
        let mib = parse_copy(line, len).with_context(|| format!("{topology}: copy via {name}"))?;
        side.copies.entry((*name).to_owned()).or_default().push(mib);
    }
    eprintln!(
        "p2plab-bench: {topology} done (run folder {})",
        outcome.run_dir.display()
    );
    side.run_dirs.push(outcome.run_dir);
    Ok(())
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

/// The key of a transfer's figures: the memory and the MTU it ran at.
fn rdma_key(source: &str, mtu: u32) -> String {
    format!("{source} mtu {mtu}")
}

fn run_rdma(options: &LabOptions, mtu: u32, len: u64, side: &mut Side) -> Result<()> {
    let outcome = Lab::run(options)?;
    let topology = &options.topology;
    if outcome.status != Some(0) {
        bail!("{topology}: guest transfers failed:\n{}", outcome.output);
    }
    // The guest driver reads the MTU from the device: both NICs must run
    // at the one asked, or the figures are filed under the wrong MTU.
    let seen = outcome
        .output
        .lines()
        .find_map(|l| l.find("RDMA_MTU ").map(|at| &l[at + "RDMA_MTU ".len()..]))
        .with_context(|| format!("{topology}: the guest did not report the NICs' MTU"))?;
    let want = format!("mtu={mtu} mtu={mtu}");
    if seen.trim() != want {
        bail!("{topology}: the NICs run at {seen:?}, not MTU {mtu}");
    }
    for source in RDMA_SOURCES {
        let prefix = format!("RDMA {source} ");
        let line = outcome
            .output
            .lines()
            .find_map(|l| l.find(&prefix).map(|at| &l[at + prefix.len()..]))
            .with_context(|| format!("{topology}: no result for the transfer from {source}"))?;
        let mib =
            parse_rdma(line, len).with_context(|| format!("{topology}: transfer from {source}"))?;
        side.transfers
            .entry(rdma_key(source, mtu))
            .or_default()
            .push(mib);
    }
    side.nic_paths
        .push(json!({"mtu": mtu, "bytes": nic_paths(&outcome.run_dir)?}));
    eprintln!(
        "p2plab-bench: {topology} done (run folder {})",
        outcome.run_dir.display()
    );
    side.run_dirs.push(outcome.run_dir);
    Ok(())
}

fn run_one(options: &LabOptions, labels: &[String], side: &mut Side) -> Result<()> {
    let outcome = Lab::run(options)?;
    let topology = &options.topology;
    if outcome.status != Some(0) {
        bail!("{topology}: guest benchmark failed:\n{}", outcome.output);
    }
    for label in labels {
        let prefix = format!("BENCH {label} ");
        let line = outcome
            .output
            .lines()
            .find_map(|l| l.find(&prefix).map(|at| &l[at + prefix.len()..]))
            .with_context(|| format!("{topology}: no result for {label}"))?;
        let sample = parse_fio(line).with_context(|| format!("{topology}: {label}"))?;
        side.samples.entry(label.clone()).or_default().push(sample);
        if outcome.output.contains(&format!("CPU {label} begin ")) {
            let cost = cpu_us_per_mib(&outcome.output, label)
                .with_context(|| format!("{topology}: server CPU of {label}"))?;
            side.cpu_per_mib
                .entry(label.clone())
                .or_default()
                .push(cost);
        }
    }
    for (name, bytes) in outcome.peak_rss {
        side.rss.entry(name).or_default().push(bytes);
    }
    eprintln!(
        "p2plab-bench: {topology} done (run folder {})",
        outcome.run_dir.display()
    );
    side.run_dirs.push(outcome.run_dir);
    Ok(())
}

/// Median (the mean of the middle two for an even count), min and max.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(values: &[f64]) -> Option<Spread> {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let (first, last) = (*v.first()?, *v.last()?);
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: first,
        max: last,
    })
}

fn spread_json(values: &[f64]) -> Value {
    match spread(values) {
        Some(s) => json!({"samples": values, "median": s.median, "min": s.min, "max": s.max}),
        None => Value::Null,
    }
}

/// Per-round ratios a[i]/b[i]: both were measured in the same round, so
/// their spread is the honest spread of the ratio.
fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(_, &b)| b > 0.0)
        .map(|(a, b)| a / b)
        .collect()
}

fn figures(side: &Side, label: &str, pick: impl Fn(&Sample) -> f64) -> Vec<f64> {
    side.samples
        .get(label)
        .into_iter()
        .flatten()
        .map(pick)
        .collect()
}

/// One line of the comparison: a figure on both sides and their ratio.
struct Row {
    label: String,
    left: Vec<f64>,
    right: Vec<f64>,
    /// Lower is better (latencies): the plot says so.
    lower_is_better: bool,
}

impl Row {
    fn json(&self, left_name: &str, right_name: &str) -> Value {
        json!({
            "figure": self.label,
            left_name: spread_json(&self.left),
            right_name: spread_json(&self.right),
            "ratio": spread_json(&ratios(&self.left, &self.right)),
            "lower_is_better": self.lower_is_better,
        })
    }

    fn print(&self) {
        let cell = |v: &[f64]| match spread(v) {
            Some(s) => format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max),
            None => "-".into(),
        };
        let ratio = match spread(&ratios(&self.left, &self.right)) {
            Some(s) => format!("{:.2} ({:.2}–{:.2})", s.median, s.min, s.max),
            None => "-".into(),
        };
        print_line(&self.label, &cell(&self.left), &cell(&self.right), &ratio);
    }
}

/// One line of the results table: a label and three right-aligned cells.
fn print_line(label: &str, left: &str, right: &str, ratio: &str) {
    println!("{label:<58} {left:>22} {right:>22} {ratio:>18}");
}

fn compared_rows(jobs: &[&Job], ours: &Side, anchor: &Side) -> Vec<Row> {
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

fn p2p_rows(ours: &Side, copies: &Side) -> Vec<Row> {
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

fn rdma_rows(rdma: &Side, mtus: &[u32]) -> Vec<Row> {
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

/// Writes a copy of the anchor topology whose one `-drive` uses `cache`,
/// so the anchor caches like p2plab-nvme. Returns the copy and the drive
/// line as run.
fn anchor_topology(source: &Path, cache: &str, folder: &Path) -> Result<(PathBuf, String)> {
    let text =
        std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    let (out, drive) = set_drive_cache(&text, cache)
        .with_context(|| format!("anchor topology {}", source.display()))?;
    let name = source.file_name().context("anchor topology has no name")?;
    let path = folder.join(name);
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    Ok((path, drive))
}

fn set_drive_cache(text: &str, cache: &str) -> Result<(String, String)> {
    let mut out = String::with_capacity(text.len() + 16);
    let mut drives = Vec::new();
    for line in text.lines() {
        if let Some(value) = line.trim().strip_prefix("-drive ") {
            let options: Vec<String> = value
                .trim()
                .split(',')
                .filter(|o| !o.starts_with("cache="))
                .map(str::to_owned)
                .chain(std::iter::once(format!("cache={cache}")))
                .collect();
            let drive = format!("-drive {}", options.join(","));
            out.push_str(&drive);
            drives.push(drive);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    match <[String; 1]>::try_from(drives) {
        Ok([drive]) => Ok((out, drive)),
        Err(drives) => bail!(
            "has {} -drive lines; the bench needs exactly one",
            drives.len()
        ),
    }
}

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

/// Bars of the ratios (median) with min–max whiskers, one per row, and a
/// line at 1.0.
fn svg(title: &str, sections: &[(&str, &[Row])]) -> String {
    let rows: Vec<(&str, &Row)> = sections
        .iter()
        .flat_map(|(name, rows)| rows.iter().map(move |r| (*name, r)))
        .collect();
    let spreads: Vec<Option<Spread>> = rows
        .iter()
        .map(|(_, r)| spread(&ratios(&r.left, &r.right)))
        .collect();
    let top = spreads
        .iter()
        .flatten()
        .map(|s| s.max)
        .fold(1.5f64, f64::max)
        .ceil();
    let (left, width, bar_h, gap) = (600.0, 420.0, 16.0, 8.0);
    let height = 60.0 + rows.len() as f64 * (bar_h + gap) + 30.0;
    let x = |v: f64| left + v / top * width;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="12">"#,
        w = left + width + 60.0
    );
    let _ = writeln!(s, r#"<text x="10" y="20" font-size="14">{title}</text>"#);
    let y0 = 40.0;
    for (i, ((section, row), spread)) in rows.iter().zip(&spreads).enumerate() {
        let y = y0 + i as f64 * (bar_h + gap);
        let better = if row.lower_is_better {
            " (lower is better)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<text x="10" y="{ty}">{section}: {label}{better}</text>"#,
            ty = y + 12.0,
            label = row.label
        );
        if let Some(sp) = spread {
            let _ = writeln!(
                s,
                "<rect x=\"{left}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{bar_h}\" fill=\"#4a7ebb\"/>",
                bw = x(sp.median) - left
            );
            let mid = y + bar_h / 2.0;
            let _ = writeln!(
                s,
                r#"<line x1="{a:.1}" y1="{mid}" x2="{b:.1}" y2="{mid}" stroke="black"/><line x1="{a:.1}" y1="{t}" x2="{a:.1}" y2="{u}" stroke="black"/><line x1="{b:.1}" y1="{t}" x2="{b:.1}" y2="{u}" stroke="black"/>"#,
                a = x(sp.min),
                b = x(sp.max),
                t = y + 3.0,
                u = y + bar_h - 3.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{tx:.1}" y="{ty}">{m:.2}</text>"#,
                tx = x(sp.max) + 4.0,
                ty = y + 12.0,
                m = sp.median
            );
        }
    }
    let bottom = y0 + rows.len() as f64 * (bar_h + gap);
    let _ = writeln!(
        s,
        "<line x1=\"{one:.1}\" y1=\"{y0}\" x2=\"{one:.1}\" y2=\"{bottom}\" stroke=\"#c33\" stroke-dasharray=\"4 3\"/>",
        one = x(1.0)
    );
    let _ = writeln!(
        s,
        r#"<text x="{l}" y="{ty}">0</text><text x="{one:.1}" y="{ty}">1.0</text><text x="{r:.1}" y="{ty}">{top:.1}</text>"#,
        l = left,
        one = x(1.0) - 8.0,
        r = left + width - 10.0,
        ty = bottom + 16.0
    );
    s.push_str("</svg>\n");
    s
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
    let paths = LabPaths::discover()?;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let folder = paths
        .runs
        .join(format!("bench-{}-{}", format_utc(now), std::process::id()));
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    eprintln!("p2plab-bench: results go to {}", folder.display());

    let (anchor_path, anchor_drive) = anchor_topology(
        &paths.topology(&cli.anchor)?,
        cli.caching.qemu_cache(),
        &folder,
    )?;
    let timeout = Some(Duration::from_secs(u64::from(cli.runtime) * 20 + 600));
    let server_args = vec!["--caching".to_owned(), cli.caching.server_flag().to_owned()];
    let jobs = selected(&cli.only);
    let mut ours_options = LabOptions::new(
        &cli.ours,
        Mode::Exec(guest_script(&jobs, cli.runtime, !cli.no_p2p)),
    );
    ours_options.stream_output = false;
    ours_options.timeout = timeout;
    ours_options.kernel_log.enforce = false;
    ours_options.server_args = vec![("nvme0".to_owned(), server_args.clone())];
    let mut anchor_options = LabOptions::new(
        &anchor_path.to_string_lossy(),
        Mode::Exec(guest_script(&jobs, cli.runtime, false)),
    );
    anchor_options.stream_output = false;
    anchor_options.timeout = timeout;
    anchor_options.kernel_log.enforce = false;

    let mut ours_labels: Vec<String> = jobs.iter().map(|j| j.name.to_owned()).collect();
    let anchor_labels = ours_labels.clone();
    if !cli.no_p2p {
        for job in P2P {
            ours_labels.push(format!("ram4k-{}", job.name));
            ours_labels.push(format!("ram-{}", job.name));
            ours_labels.push(format!("p2p-{}", job.name));
        }
    }

    let mut copy_options =
        LabOptions::new(&cli.copy_topology, Mode::Exec(copy_script(&cli.copy_len)));
    copy_options.stream_output = false;
    copy_options.timeout = timeout;
    copy_options.kernel_log.enforce = false;
    copy_options.server_args = ["nvme0", "nvme1"]
        .iter()
        .map(|id| ((*id).to_owned(), server_args.clone()))
        .collect();
    let copy_len = p2plab_lab::topology::parse_size(&cli.copy_len).context("--copy-len")?;

    let rdma_len = p2plab_lab::topology::parse_size(&cli.rdma_len).context("--rdma-len")?;
    let rdma_post = p2plab_lab::topology::parse_size(&cli.rdma_post).context("--rdma-post")?;
    if !rdma_len.is_multiple_of(rdma_post) {
        bail!(
            "--rdma-len {} is not a multiple of --rdma-post {}",
            cli.rdma_len,
            cli.rdma_post
        );
    }
    let rdma_options = |mtu: u32| {
        let mut options = LabOptions::new(
            &cli.rdma_topology,
            Mode::Exec(rdma_script(&cli.rdma_len, &cli.rdma_post)),
        );
        options.stream_output = false;
        options.timeout = timeout;
        options.kernel_log.enforce = false;
        options.server_args = ["nic0", "nic1"]
            .iter()
            .map(|id| ((*id).to_owned(), vec!["--mtu".to_owned(), mtu.to_string()]))
            .collect();
        options
    };

    let mut ours = Side::default();
    let mut anchor = Side::default();
    let mut copies = Side::default();
    let mut rdma = Side::default();
    for round in 1..=cli.rounds {
        eprintln!("p2plab-bench: round {round}/{}", cli.rounds);
        if !cli.rdma_only {
            run_one(&ours_options, &ours_labels, &mut ours)?;
            run_one(&anchor_options, &anchor_labels, &mut anchor)?;
            if !cli.no_p2p {
                run_copies(&copy_options, copy_len, &mut copies)?;
            }
        }
        if !cli.no_rdma {
            for &mtu in &cli.rdma_mtu {
                run_rdma(&rdma_options(mtu), mtu, rdma_len, &mut rdma)?;
            }
        }
    }

    let compared = if cli.rdma_only {
        Vec::new()
    } else {
        compared_rows(&jobs, &ours, &anchor)
    };
    let rdma_rows = if cli.no_rdma {
        Vec::new()
    } else {
        rdma_rows(&rdma, &cli.rdma_mtu)
    };
    let p2p = if cli.no_p2p || cli.rdma_only {
        Vec::new()
    } else {
        p2p_rows(&ours, &copies)
    };
    let rss_mib = |side: &Side| -> Value {
        side.rss
            .iter()
            .map(|(name, v)| {
                let mib: Vec<f64> = v.iter().map(|&b| b as f64 / (1024.0 * 1024.0)).collect();
                (name.clone(), spread_json(&mib))
            })
            .collect::<serde_json::Map<String, Value>>()
            .into()
    };
    let results = json!({
        "date_utc": format_utc(now),
        "machine": machine(),
        "rounds": cli.rounds,
        "runtime_s": cli.runtime,
        "caching": cli.caching.server_flag(),
        "ours": {"topology": cli.ours, "nvme0_extra_args": server_args, "run_dirs": ours.run_dirs},
        "anchor": {"topology": anchor_path, "drive": anchor_drive, "run_dirs": anchor.run_dirs},
        "copies": {"topology": cli.copy_topology, "len": cli.copy_len, "nvme_extra_args": server_args, "run_dirs": copies.run_dirs},
        "compared_ratio": "p2plab-nvme / qemu nvme, per round",
        "compared": compared.iter().map(|r| r.json("p2plab_nvme", "qemu_nvme")).collect::<Vec<_>>(),
        "p2p_ratio": "P2P buffer (GPU p2pmem, nvme1 CMB) / guest RAM buffer, same boot, per round",
        "p2p": p2p.iter().map(|r| r.json("p2p", "ram")).collect::<Vec<_>>(),
        "rdma": {"topology": cli.rdma_topology, "len": cli.rdma_len, "post": cli.rdma_post, "mtus": cli.rdma_mtu, "run_dirs": rdma.run_dirs, "nic_dma_paths": rdma.nic_paths},
        "rdma_ratio": "nic0 -> wire -> nic1 from and into GPU memory (peer-memory API) or a GPU dma-buf / from and into guest RAM, same boot, per round",
        "rdma_rows": rdma_rows.iter().map(|r| r.json("gpu", "ram")).collect::<Vec<_>>(),
        "peak_rss_mib": {"ours": rss_mib(&ours), "anchor": rss_mib(&anchor)},
    });
    let json_path = folder.join("results.json");
    let text = serde_json::to_string_pretty(&results).context("encoding results")?;
    std::fs::write(&json_path, text + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let title = format!(
        "p2plab bench {} UTC, caching={}, {} rounds (bars: median ratio, whiskers: min–max)",
        format_utc(now),
        cli.caching.server_flag(),
        cli.rounds
    );
    let svg_path = folder.join("results.svg");
    std::fs::write(
        &svg_path,
        svg(
            &title,
            &[
                ("vs QEMU nvme", compared.as_slice()),
                ("P2P vs RAM", p2p.as_slice()),
                ("RDMA vs RAM", rdma_rows.as_slice()),
            ],
        ),
    )
    .with_context(|| format!("writing {}", svg_path.display()))?;

    println!(
        "caching={} (anchor {}), {} rounds of {} s; median (min–max)",
        cli.caching.server_flag(),
        anchor_drive,
        cli.rounds,
        cli.runtime
    );
    if !compared.is_empty() {
        print_line("workload", "p2plab-nvme", "qemu nvme", "ratio");
    }
    for row in &compared {
        row.print();
    }
    if !p2p.is_empty() {
        print_line(
            "P2P workload (p2plab, same boot)",
            "GPU p2pmem",
            "guest RAM",
            "ratio",
        );
        for row in &p2p {
            row.print();
        }
    }
    if !rdma_rows.is_empty() {
        print_line(
            "RDMA workload (same boot)",
            "GPU memory",
            "guest RAM",
            "ratio",
        );
        for row in &rdma_rows {
            row.print();
        }
        for paths in &rdma.nic_paths {
            println!("RDMA NIC DMA paths of one boot: {paths}");
        }
    }
    // QEMU's peak RSS includes the guest RAM it touched (shared with the
    // servers, so not counted twice); the servers add their own.
    for (name, v) in &ours.rss {
        let ours_mib: Vec<f64> = v.iter().map(|&b| b as f64 / (1024.0 * 1024.0)).collect();
        let anchor_mib: Vec<f64> = anchor
            .rss
            .get(name)
            .into_iter()
            .flatten()
            .map(|&b| b as f64 / (1024.0 * 1024.0))
            .collect();
        Row {
            label: format!("peak RSS MiB: {name}"),
            left: ours_mib,
            right: anchor_mib,
            lower_is_better: true,
        }
        .print();
    }
    println!(
        "results: {} and {}",
        json_path.display(),
        svg_path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json_for_the_busy_direction() {
        let json = r#"{"jobs":[{"job_runtime":2000,"usr_cpu":10.0,"sys_cpu":40.0,
            "read":{"iops":0,"bw_bytes":0},"write":{"iops":2000.5,"bw_bytes":8194048,
            "io_bytes":16388096,"clat_ns":{"percentile":{"50.000000":45000,"99.000000":123000}}}}]}"#;
        let s = parse_fio(json).unwrap();
        assert_eq!(
            s,
            Sample {
                iops: 2000.5,
                bytes_per_sec: 8194048.0,
                p50_us: 45.0,
                p99_us: 123.0,
                // Half of 2 s of CPU over 15.63 MiB.
                guest_cpu_us_per_mib: 0.5 * 2_000_000.0 / (16388096.0 / 1048576.0),
            }
        );
        let no_cpu = json.replace(r#""usr_cpu":10.0,"#, "");
        assert!(parse_fio(&no_cpu).is_err(), "missing CPU time is an error");
        assert!(parse_fio(r#"{"jobs":[{"read":{"iops":0}}]}"#).is_err());
        assert!(
            parse_fio(r#"{"jobs":[{"read":{"iops":5,"bw_bytes":1}}]}"#).is_err(),
            "missing percentiles are an error, not zero"
        );
        assert!(parse_fio("fio: error").is_err());
    }

    #[test]
    fn true_median_and_spread() {
        assert_eq!(spread(&[]), None);
        let s = spread(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = spread(&[4.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 10.0));
        assert_eq!(ratios(&[2.0, 3.0], &[1.0, 0.0]), vec![2.0]);
    }

    #[test]
    fn anchor_drive_gets_the_cache_mode() {
        let text = "# c\n-drive file=/s/a.img,if=none,id=a0,format=raw,cache=none,aio=threads\n-device nvme,drive=a0\n";
        let (out, drive) = set_drive_cache(text, "writeback").unwrap();
        assert_eq!(
            drive,
            "-drive file=/s/a.img,if=none,id=a0,format=raw,aio=threads,cache=writeback"
        );
        assert_eq!(out.matches("cache=").count(), 1);
        assert!(out.contains("-device nvme,drive=a0\n"));
        let (_, drive) = set_drive_cache("-drive file=x,if=none\n", "none").unwrap();
        assert_eq!(drive, "-drive file=x,if=none,cache=none");
        assert!(set_drive_cache("-device nvme\n", "none").is_err());
        assert!(set_drive_cache("-drive file=x\n-drive file=y\n", "none").is_err());
    }

    /// Catches a CPU-per-byte figure taken from the wrong marks or the
    /// wrong server, one computed when nothing moved, or a busy figure that
    /// does not take the idle polling out.
    #[test]
    fn cpu_cost_is_the_servers_cpu_over_the_bytes_moved_between_marks() {
        let status = |cpu: u64, idle: u64, read: u64| {
            format!(
                r#"{{"counters":{{"bytes_read":{read},"bytes_written":0}},"process":{{"cpu_user_us":{cpu},"cpu_system_us":5,"idle_poll_cpu_us":{idle}}}}}"#
            )
        };
        let output = [
            format!("CPU ram-x begin nvme0 {}", status(1_000, 100, 0)),
            format!("CPU ram-x begin gpu0 {}", status(70, 0, 0)),
            "BENCH ram-x {}".to_owned(),
            format!("CPU ram-x end nvme0 {}", status(3_000, 900, 4 << 20)),
            format!("CPU ram-x end gpu0 {}", status(270, 0, 0)),
            format!("CPU p2p-x begin nvme0 {}", status(3_000, 900, 4 << 20)),
            format!("CPU p2p-x begin gpu0 {}", status(270, 0, 0)),
            format!("CPU p2p-x end nvme0 {}", status(3_000, 900, 4 << 20)),
            format!("CPU p2p-x end gpu0 {}", status(270, 0, 0)),
        ]
        .join("\n");
        // (2000 + 200) µs over 4 MiB, 800 µs of it idle polling.
        assert_eq!(
            cpu_us_per_mib(&output, "ram-x").unwrap(),
            ServerCost {
                total: 550.0,
                busy: 350.0
            }
        );
        let old_server = output.replace(r#","idle_poll_cpu_us":900"#, "");
        assert!(
            cpu_us_per_mib(&old_server, "ram-x").is_err(),
            "a server that does not report idle polling has no busy figure"
        );
        assert!(cpu_us_per_mib(&output, "p2p-x").is_err(), "nothing moved");
        assert!(cpu_us_per_mib(&output, "other").is_err(), "no marks");
        let script = guest_script(&[], 5, true);
        for job in P2P {
            for at in ["begin", "end"] {
                for server in CPU_SERVERS {
                    let mark = format!("echo CPU p2p-{} {at} {server} ", job.name);
                    assert_eq!(script.matches(&mark).count(), 1, "{mark}");
                }
            }
        }
    }

    #[test]
    fn copy_lines_must_move_everything() {
        let ok =
            "P2P_BAR=ram P2P_BUFFER_LEN=8388608 BYTES=1048576 IOS=1 ERRORS=0 MIB_PER_SEC=123.5 ";
        assert_eq!(parse_copy(ok, 1 << 20).unwrap(), 123.5);
        assert!(parse_copy(ok, 2 << 20).is_err(), "short copy");
        let failed = "BYTES=1048576 IOS=1 ERRORS=1 MIB_PER_SEC=1.0";
        assert!(parse_copy(failed, 1 << 20).is_err());
        assert!(parse_copy("p2plab-p2pio: opening ...", 1 << 20).is_err());
        let script = copy_script("64M");
        for (name, _) in COPY_BUFFERS {
            assert_eq!(script.matches(&format!("echo COPY {name} ")).count(), 1);
        }
        assert_eq!(parse_copy_len("512M"), Ok("512M".to_owned()));
        assert!(parse_copy_len("1000").is_err());
    }

    #[test]
    fn rdma_lines_must_move_and_verify_everything() {
        let ok = "map_type=3 src_crc=0x1 dst_crc=0x1 post_errno=0 revoked_wcs=0 bytes=1048576 posts=4 \
                  tx_done=4 tx_bytes=1048576 tx_frames=16 tx_errors=0 rx_done=4 rx_bytes=1048576 \
                  rx_frames=16 rx_errors=0 first_error=0x0 mismatched_bytes=0 verify=ok ms=20 mib_per_s=50.5 ";
        assert_eq!(parse_rdma(ok, 1 << 20).unwrap(), 50.5);
        assert!(parse_rdma(ok, 2 << 20).is_err(), "short transfer");
        let mismatch = ok.replace("verify=ok", "verify=mismatch");
        assert!(parse_rdma(&mismatch, 1 << 20).is_err());
        let failed_rx = ok.replace("rx_errors=0", "rx_errors=1");
        assert!(parse_rdma(&failed_rx, 1 << 20).is_err());
        assert!(parse_rdma("p2plab-nic-tool: /dev/p2plab-nic0: No such file", 1 << 20).is_err());
        let script = rdma_script("64M", "256K");
        for source in RDMA_SOURCES {
            assert_eq!(
                script
                    .matches(&format!(
                        "--src {source} --dst {source} --size 64M --post 256K "
                    ))
                    .count(),
                1
            );
            assert_eq!(script.matches(&format!("echo RDMA {source} ")).count(), 1);
        }
        assert_eq!(parse_rdma_post("256K"), Ok("256K".to_owned()));
        assert!(
            parse_rdma_post("2M").is_err(),
            "a RAM post would not fit the ring"
        );
        assert!(parse_rdma_post("6000").is_err());
    }

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
        let rows = rdma_rows(&side, &[4096, 65536]);
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
        let rows = p2p_rows(&ours, &Side::default());
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

    #[test]
    fn the_guest_script_runs_every_job_once() {
        let script = guest_script(&selected(&[]), 5, true);
        for job in COMPARED {
            assert_eq!(script.matches(&format!("--name={} ", job.name)).count(), 1);
        }
        for job in P2P {
            assert_eq!(
                script.matches(&format!("--name=ram-{} ", job.name)).count(),
                1
            );
            assert_eq!(
                script.matches(&format!("--name=p2p-{} ", job.name)).count(),
                1
            );
            // The 4 KiB-page RAM job runs with THP off, and THP is set
            // back before the next job.
            let ram4k = format!("--name=ram4k-{} ", job.name);
            assert_eq!(script.matches(&ram4k).count(), 1);
            let lines: Vec<&str> = script.lines().collect();
            let at = lines.iter().position(|l| l.contains(&ram4k)).unwrap();
            assert_eq!(lines[at - 1], "echo never > $thp");
            assert_eq!(lines[at + 1], "echo $thp_was > $thp");
        }
        assert_eq!(script.matches("p2pmem/allocate").count(), P2P.len());
        assert!(!guest_script(&selected(&[]), 5, false).contains("p2pmem"));
        let one = guest_script(&selected(&["4k-randread-qd32".to_owned()]), 5, false);
        assert_eq!(one.matches("--name=").count(), 1);
        assert!(parse_job_name("4k-randread-qd32").is_ok());
        assert!(parse_job_name("4k-randread").is_err());
    }
}
