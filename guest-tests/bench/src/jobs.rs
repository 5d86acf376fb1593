//! What the bench measures: the fio jobs it compares on p2plab-nvme and
//! the anchor, the P2P jobs it runs three ways, the buffers of the NVMe →
//! NVMe copies, the memories of the RDMA transfers, and the host caching
//! both NVMe devices use.

use clap::ValueEnum;

/// Host caching of both NVMe devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Caching {
    Page,
    Direct,
}

impl Caching {
    /// p2plab-nvme's `--caching`.
    pub fn server_flag(self) -> &'static str {
        match self {
            Caching::Page => "page",
            Caching::Direct => "direct",
        }
    }

    /// The anchor's `-drive ...,cache=`.
    pub fn qemu_cache(self) -> &'static str {
        match self {
            Caching::Page => "writeback",
            Caching::Direct => "none",
        }
    }
}

/// Which figure a job is judged by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    Iops,
    MibPerSec,
    /// Completion latency: p50 and p99 matter, lower is better.
    LatencyUs,
}

impl Metric {
    pub fn label(self) -> &'static str {
        match self {
            Metric::Iops => "IOPS",
            Metric::MibPerSec => "MiB/s",
            Metric::LatencyUs => "p50 µs",
        }
    }
}

/// A fio job: `name` keys the results.
pub struct Job {
    pub name: &'static str,
    /// fio's options, separated by spaces.
    pub fio: &'static str,
    pub metric: Metric,
}

/// Run on both p2plab-nvme and the anchor.
pub const COMPARED: &[Job] = &[
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
pub const P2P: &[Job] = &[
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

/// The labels of a P2P job's three runs: 4 KiB-page RAM, RAM, p2pmem.
pub fn p2p_labels(job: &Job) -> [String; 3] {
    [
        format!("ram4k-{}", job.name),
        format!("ram-{}", job.name),
        format!("p2p-{}", job.name),
    ]
}

/// The compared jobs `only` selects (all when empty).
pub fn selected(only: &[String]) -> Vec<&'static Job> {
    COMPARED
        .iter()
        .filter(|j| only.is_empty() || only.iter().any(|o| o == j.name))
        .collect()
}

/// The servers that take part in a P2P job, whose CPU time it costs: the
/// NVMe server moves the bytes; the GPU server would take part if they
/// went through QEMU and it.
pub const CPU_SERVERS: &[&str] = &["nvme0", "gpu0"];

/// Buffers the NVMe → NVMe copies go through, in the same boot: guest RAM
/// (the reference), the GPU's p2pmem and nvme1's CMB. Each is (the name
/// its figures go under, the buffer as `copy_via` of `guest/copy.sh`
/// names it).
pub const COPY_BUFFERS: &[(&str, &str)] = &[
    ("ram", "ram"),
    ("gpu0-p2pmem", "gpu"),
    ("nvme1-cmb", "nvme1"),
];

/// Memories the RDMA transfers go from and into, in the same boot: guest
/// RAM (the reference, pinned user pages), GPU memory registered through
/// the GPU driver's peer-memory API, and a GPU allocation exported as a
/// dma-buf.
pub const RDMA_SOURCES: &[&str] = &["ram", "gpu", "dmabuf"];

/// The key of a transfer's figures: the memory and the MTU it ran at.
pub fn rdma_key(source: &str, mtu: u32) -> String {
    format!("{source} mtu {mtu}")
}
