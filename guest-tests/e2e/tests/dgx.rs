//! Issue 22 part 4 ("Scale"): the `dgx` topology, four NVMe controllers
//! and four GPUs as NVMe/GPU pairs, each pair under its own PCIe switch,
//! two of those switches below a shared switch (qemu-configs/dgx.args).
//! One boot under the lab's accelerator (TCG here) checks, in turn:
//!
//! - every device is bound to its driver and every GPU publishes p2pmem
//!   (sysfs), and the tree is the one the topology file draws;
//! - P2P for every NVMe -> GPU pair (fio writing from and verifying into
//!   the GPU's p2pmem): the pairs that share a switch (their own, or the
//!   shared one) pass, every byte by the servers' peer path; every other
//!   pair is refused, and the kernel's log says why for that pair (parsed:
//!   client, provider, reason);
//! - NVMe -> GPU reads on one own-switch pair, then on the four at once
//!   (the aggregate P2P throughput), each GPU receiving exactly what its
//!   own NVMe sent;
//! - fio with one job, then with one job per vCPU, over the four
//!   namespaces: the servers' per-queue counters (`queues[].fetched` in
//!   their status) show one I/O queue of each controller carrying the
//!   first and every I/O queue carrying the second (each queue has its
//!   own worker thread in p2plab-nvme).
//!
//! It also measures what the issue asks to report: boot time, each
//! server's peak host memory (VmHWM from /proc/PID/status, which the lab
//! reads before stopping it) and the aggregate P2P throughput; they go to
//! the run folder's `dgx-figures.txt` and to stderr.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use common::{counter, mark_phases, run_guest_with, stats, Boot, GuestRun, Phase};
use p2plab_lab::kernel_log::{glob_match, parse_kmsg, KernelLine, KMSG_FILE};
use p2plab_lab::{GuestScript, Lab};
use p2plab_server::provenance::Mark;
use serde_json::Value;

/// The guest's phases, in order (guest/dgx.sh).
const PHASES: [&str; 5] = ["pairs", "single", "aggregate", "queues1", "queuesn"];
/// How long the guest may take to boot, or one phase to run, under TCG.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);
/// fio's bytes each way per pair.
const PAIR_BYTES: u64 = 4 << 20;
const DEVICES: usize = 4;
/// Seconds of each timed fio run (the aggregate, the queue runs).
const FIO_SECONDS: u32 = 4;

/// `enum pci_p2pdma_map_type` of the 7.3 guest: NOT_SUPPORTED, BUS_ADDR.
const MAP_NOT_SUPPORTED: &str = "2";
const MAP_BUS_ADDR: &str = "3";
/// What the kernel says when it refuses a pair that meets only at a host
/// bridge it does not whitelist (drivers/pci/p2pdma.c).
const NO_COMMON_BRIDGE: &str = "do not share an upstream bridge or whitelisted host bridge";
const EINVAL: u64 = 22;

/// The host side: the boot time (lab start until the guest script
/// runs), then a mark before and after each guest phase.
fn host_side(lab: &mut Lab, started: Instant) -> Duration {
    let timeout = lab.budget(PHASE_TIMEOUT);
    lab.wait_guest_file("booted", timeout)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let boot = started.elapsed();
    mark_phases(lab, &PHASES, timeout);
    boot
}

/// Entries each I/O queue (sqid >= 1) of NVMe server `id` fetched
/// during the phase, by sqid; every queue live at the end is listed.
fn queue_fetches(phase: &Phase, id: &str) -> BTreeMap<u64, u64> {
    let fetched = |mark: &Mark| -> BTreeMap<u64, u64> {
        let queues = mark.servers[id]["queues"]
            .as_array()
            .unwrap_or_else(|| panic!("{id}: no queues in mark {}", mark.name));
        queues
            .iter()
            .map(|q| {
                let field = |k: &str| {
                    q[k].as_u64()
                        .unwrap_or_else(|| panic!("{id}: queue without {k}: {q}"))
                };
                (field("sqid"), field("fetched"))
            })
            .filter(|&(sqid, _)| sqid >= 1)
            .collect()
    };
    let before = fetched(&phase.start);
    fetched(&phase.end)
        .into_iter()
        .map(|(sqid, n)| (sqid, n - before.get(&sqid).copied().unwrap_or(0)))
        .collect()
}

/// A PCI device as the guest reported it: its address and its sysfs path
/// from the root port down (bridges, then itself).
struct PciDevice {
    bdf: String,
    path: Vec<String>,
}

impl PciDevice {
    fn of(run: &GuestRun, prefix: &str) -> PciDevice {
        let bdf = run.fact(&format!("{prefix}_BDF")).to_owned();
        let path: Vec<String> = run
            .fact(&format!("{prefix}_PATH"))
            .split('/')
            .map(str::to_owned)
            .collect();
        assert_eq!(path.last(), Some(&bdf), "{prefix}: path {path:?}");
        assert!(path.len() >= 4, "{prefix} is below no switch: {path:?}");
        PciDevice { bdf, path }
    }

    /// The upstream port of the switch the device sits right below.
    fn switch(&self) -> &str {
        &self.path[self.path.len() - 3]
    }

    /// The bridges two devices share: the kernel allows a pair by bus
    /// address when there is one (no ACS here), else it needs the host
    /// bridge.
    fn share_a_bridge(&self, other: &PciDevice) -> bool {
        self.path[0] == other.path[0]
    }
}

/// One P2P refusal the kernel logged: `<client>: cannot be used for
/// peer-to-peer DMA as the client and provider (<provider>) <reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    client: String,
    provider: String,
    reason: String,
}

/// The refusals in a kernel log ("nvme 0000:03:00.0: cannot be used ...").
fn refusals(lines: &[KernelLine]) -> Vec<Refusal> {
    const MIDDLE: &str = ": cannot be used for peer-to-peer DMA as the client and provider (";
    lines
        .iter()
        .filter_map(|line| {
            let (head, tail) = line.text.split_once(MIDDLE)?;
            let client = head.rsplit(' ').next()?.to_owned();
            let (provider, reason) = tail.split_once(") ")?;
            Some(Refusal {
                client,
                provider: provider.to_owned(),
                reason: reason.trim().to_owned(),
            })
        })
        .collect()
}

/// A fio JSON result the guest left in its `/run/p2plab`.
fn fio_json(run: &GuestRun, name: &str) -> Value {
    let text = run.file(&format!("guest/{name}.json"));
    // fio may print a line or two before the JSON (its notes on stdout).
    let at = text.find('{').unwrap_or_else(|| {
        panic!(
            "{name}.json holds no JSON: {text}\n{}",
            run.file(&format!("guest/{name}.err"))
        )
    });
    serde_json::from_str(&text[at..]).unwrap_or_else(|e| panic!("{name}.json: {e}: {text}"))
}

/// fio's first job: its error and its bytes read and written.
fn fio_job(doc: &Value, name: &str) -> (u64, u64, u64) {
    let job = &doc["jobs"][0];
    let n = |v: &Value, what: &str| {
        v.as_u64()
            .unwrap_or_else(|| panic!("{name}: no {what} in {job}"))
    };
    (
        n(&job["error"], "error"),
        n(&job["read"]["io_bytes"], "read.io_bytes"),
        n(&job["write"]["io_bytes"], "write.io_bytes"),
    )
}

/// MiB/s of fio's first job in one direction (bytes over its runtime).
fn fio_mib_s(doc: &Value, dir: &str) -> f64 {
    let job = &doc["jobs"][0][dir];
    let bytes = job["io_bytes"].as_u64().unwrap_or(0) as f64;
    let ms = job["runtime"].as_u64().unwrap_or(0).max(1) as f64;
    bytes / (1 << 20) as f64 / (ms / 1000.0)
}

/// `dgx`, one boot. Catches: a topology file whose switches or bindings
/// differ from its drawing (sysfs paths, drivers, p2pmem); a kernel or
/// topology that refuses a same-switch pair or allows a cross-switch one
/// (fio's result and the map type per pair), a refusal whose logged reason
/// or pair is not the host bridge's (the parsed kernel lines); NVMe or
/// GPU servers that corrupt P2P data (fio's crc32c) or move it any way but
/// the peer path, or to the wrong peer (each phase's counters, per
/// device); a controller that does not give each vCPU its own I/O queue
/// or a server that leaves queues unserved under parallel jobs (the
/// per-queue fetch counts).
#[test]
fn dgx_pairs_p2p_and_queues_in_one_boot() {
    let script = GuestScript::new("dgx.sh", include_str!("../guest/dgx.sh"))
        .var("DGX_MODE", "test")
        .var("RUNTIME", FIO_SECONDS);
    let started = Instant::now();
    let (run, boot_time) = run_guest_with("dgx", &script, Boot::default(), |lab| {
        host_side(lab, started)
    });
    let mut report = check_one_boot(&run);

    // The figures: boot time and each server's peak RSS.
    let guest_boot = run.fact("UPTIME_AT_START");
    writeln!(
        report,
        "boot: {:.1} s from the lab's start (servers, QEMU) to the guest script; guest uptime then {guest_boot} s",
        boot_time.as_secs_f64()
    )
    .unwrap();
    let mut servers = 0;
    for (name, bytes) in &run.outcome.peak_rss {
        writeln!(
            report,
            "peak RSS (VmHWM) {name}: {:.1} MiB",
            *bytes as f64 / 1048576.0
        )
        .unwrap();
        servers += usize::from(name != "qemu");
    }
    assert_eq!(servers, 2 * DEVICES, "a peak RSS for every server");
    writeln!(report, "accelerator: {:?}", run.outcome.accel).unwrap();
    std::fs::write(run.run_dir().join("dgx-figures.txt"), &report).expect("writing the figures");
    eprintln!("{report}(run folder {})", run.run_dir().display());
}

/// Everything the guest and the servers' marks say about the boot; the
/// figures measured on the way.
fn check_one_boot(run: &GuestRun) -> String {
    let mut report = String::new();

    // Every device bound, every GPU publishing, one I/O queue per vCPU.
    let vcpus = run.fact_u64("VCPUS");
    assert_eq!(vcpus, 4, "the topology's -smp");
    assert_eq!(run.fact_u64("GPU_COUNT"), DEVICES as u64);
    let nvmes: Vec<PciDevice> = (0..DEVICES)
        .map(|i| {
            run.expect(&format!("NVME{i}_DRIVER"), "nvme");
            assert_eq!(run.fact_u64(&format!("NVME{i}_IO_QUEUES")), vcpus);
            PciDevice::of(run, &format!("NVME{i}"))
        })
        .collect();
    let gpus_by_bdf: Vec<PciDevice> = (0..DEVICES)
        .map(|k| {
            run.expect(&format!("GPUK{k}_DRIVER"), "p2plab_gpu");
            run.expect(&format!("GPUK{k}_P2P_PUBLISHED"), "1");
            assert_eq!(run.fact_u64(&format!("GPUK{k}_P2P_SIZE")), 256 << 20);
            PciDevice::of(run, &format!("GPUK{k}"))
        })
        .collect();

    // The tree: each NVMe's switch holds exactly one GPU, which takes its
    // number (gpuN sits with nvmeN in dgx.args); its index among the
    // guest's GPUs is what the guest's facts use.
    let gpu_index: Vec<usize> = nvmes
        .iter()
        .map(|n| {
            let below: Vec<usize> = (0..DEVICES)
                .filter(|&k| gpus_by_bdf[k].switch() == n.switch())
                .collect();
            assert_eq!(below.len(), 1, "GPUs below {}'s switch: {below:?}", n.bdf);
            below[0]
        })
        .collect();
    let gpu = |j: usize| &gpus_by_bdf[gpu_index[j]];
    // Two switches under their own root ports, two below a shared switch.
    for (i, n) in nvmes.iter().enumerate() {
        let depth = if i < 2 { 4 } else { 6 };
        assert_eq!(n.path.len(), depth, "nvme{i}: {:?}", n.path);
    }
    assert_eq!(nvmes[2].path[..2], nvmes[3].path[..2], "the shared switch");
    assert_ne!(nvmes[2].switch(), nvmes[3].switch());
    let distinct: std::collections::BTreeSet<&str> = nvmes.iter().map(|n| n.switch()).collect();
    assert_eq!(distinct.len(), DEVICES, "four pair switches");

    // Which pairs the kernel must allow: the topology's promise (routing's
    // unit test checks the file), and the guest's own tree agrees.
    let allowed = |i: usize, j: usize| i == j || matches!((i, j), (2, 3) | (3, 2));
    for (i, nvme) in nvmes.iter().enumerate() {
        for j in 0..DEVICES {
            assert_eq!(
                nvme.share_a_bridge(gpu(j)),
                allowed(i, j),
                "nvme{i} -> gpu{j} in the guest's tree"
            );
        }
    }

    // pairs: allowed ones verified and by the peer path, refused ones
    // EINVAL with the kernel's reason for exactly that pair.
    run.expect("KPROBE_STATUS", "0");
    run.expect("KPROBE_ENABLE_STATUS", "0");
    run.expect("PAIRS_STATUS", "0");
    let lines = parse_kmsg(&run.file(&format!("guest/{KMSG_FILE}")));
    assert!(!lines.is_empty(), "no kernel log");
    let refused = refusals(&lines);
    let mut n_allowed = 0;
    for (i, nvme) in nvmes.iter().enumerate() {
        for (j, &k) in gpu_index.iter().enumerate() {
            let key = format!("P2P_N{i}_G{k}");
            let doc = fio_json(run, &format!("p2p-n{i}-g{k}"));
            let (error, read, written) = fio_job(&doc, &key);
            let said: Vec<&Refusal> = refused
                .iter()
                .filter(|r| r.client == nvme.bdf && r.provider == gpu(j).bdf)
                .collect();
            if allowed(i, j) {
                n_allowed += 1;
                run.expect(&format!("{key}_STATUS"), "0");
                assert_eq!((error, read, written), (0, PAIR_BYTES, PAIR_BYTES), "{key}");
                run.expect(&format!("{key}_MAP_TYPES"), MAP_BUS_ADDR);
                assert!(said.is_empty(), "nvme{i} -> gpu{j} refused: {said:?}");
            } else {
                assert_ne!(run.fact(&format!("{key}_STATUS")), "0", "{key}");
                assert_eq!((error, read, written), (EINVAL, 0, 0), "{key}");
                run.expect(&format!("{key}_MAP_TYPES"), MAP_NOT_SUPPORTED);
                // Once per pair: the kernel keeps its decision per client.
                assert_eq!(said.len(), 1, "refusals logged for nvme{i} -> gpu{j}");
                for r in said {
                    assert_eq!(r.reason, NO_COMMON_BRIDGE, "nvme{i} -> gpu{j}");
                }
            }
        }
    }
    assert_eq!(n_allowed, 6);
    // Only these pairs were refused, and the host bridge said why.
    for r in &refused {
        let i = nvmes.iter().position(|n| n.bdf == r.client);
        let j = (0..DEVICES).find(|&j| gpu(j).bdf == r.provider);
        let (Some(i), Some(j)) = (i, j) else {
            panic!("a refusal of no NVMe -> GPU pair: {r:?}");
        };
        assert!(!allowed(i, j), "{r:?}");
    }
    // The whitelist line comes only with ACS redirect on the path
    // (host_bridge_whitelist warns then); here there is none.
    assert!(
        !lines
            .iter()
            .any(|l| glob_match("*Host bridge not in P2PDMA whitelist*", &l.text)),
        "no ACS redirect on any path"
    );
    // Each device's P2P bytes: 4 MiB each way per allowed pair, all by
    // the peer path, into and out of the right GPU.
    let p = Phase::of(run, "pairs");
    for i in 0..DEVICES {
        let id = format!("nvme{i}");
        let pairs = (0..DEVICES).filter(|&j| allowed(i, j)).count() as u64;
        assert_eq!(
            p.delta(&id, "dma_peer_read_bytes"),
            pairs * PAIR_BYTES,
            "{id}"
        );
        assert_eq!(
            p.delta(&id, "dma_peer_write_bytes"),
            pairs * PAIR_BYTES,
            "{id}"
        );
        assert_eq!(p.delta(&id, "dma_message_read_bytes"), 0, "{id}");
        assert_eq!(p.delta(&id, "dma_message_write_bytes"), 0, "{id}");
        let gid = format!("gpu{i}");
        let pairs = (0..DEVICES).filter(|&n| allowed(n, i)).count() as u64;
        for key in ["peer_inbound_write_bytes", "peer_inbound_read_bytes"] {
            assert_eq!(p.delta(&gid, key), pairs * PAIR_BYTES, "{gid} {key}");
        }
        assert_eq!(p.delta(&gid, "bytes_ram_to_vram"), 0, "{gid}");
    }

    // aggregate: the four own-switch pairs at once; each GPU received
    // exactly what its own NVMe wrote by the peer path.
    run.expect("AGGREGATE_STATUS", "0");
    for i in 0..DEVICES {
        run.expect(&format!("AGGREGATE_N{i}_GPU"), &gpu(i).bdf);
    }
    let agg = fio_json(run, "aggregate");
    let (error, agg_read, _) = fio_job(&agg, "aggregate");
    assert_eq!(error, 0, "aggregate fio");
    assert!(agg_read > 0, "aggregate fio read nothing");
    let p = Phase::of(run, "aggregate");
    let mut inbound = 0;
    let mut per_pair = Vec::new();
    for i in 0..DEVICES {
        let into = p.delta(&format!("gpu{i}"), "peer_inbound_write_bytes");
        let from = p.delta(&format!("nvme{i}"), "dma_peer_write_bytes");
        assert_eq!(into, from, "gpu{i} got what nvme{i} sent");
        assert!(into > 0, "nvme{i} -> gpu{i} moved nothing");
        assert_eq!(p.delta(&format!("nvme{i}"), "dma_message_write_bytes"), 0);
        inbound += into;
        per_pair.push(into);
    }
    assert!(
        inbound >= agg_read,
        "{inbound} bytes reached the GPUs, fio read {agg_read}"
    );
    let agg_mib_s = fio_mib_s(&agg, "read");
    // single: nvme0 -> gpu0 alone, the baseline of the aggregate.
    run.expect("SINGLE_STATUS", "0");
    run.expect("SINGLE_N0_GPU", &gpu(0).bdf);
    let single = fio_json(run, "single");
    let (error, single_read, _) = fio_job(&single, "single");
    assert_eq!(error, 0, "single fio");
    let p = Phase::of(run, "single");
    let into = p.delta("gpu0", "peer_inbound_write_bytes");
    assert!(
        into >= single_read && single_read > 0,
        "gpu0 got {into}, fio read {single_read}"
    );
    for i in 1..DEVICES {
        assert_eq!(p.delta(&format!("gpu{i}"), "peer_inbound_write_bytes"), 0);
    }
    let single_mib_s = fio_mib_s(&single, "read");

    // queues: one job on CPU 0 -> one I/O queue per controller; one job
    // per vCPU -> every I/O queue of every controller.
    let mut iops = Vec::new();
    for (name, jobs) in [("queues1", 1), ("queuesn", vcpus)] {
        run.expect(&format!("{}_STATUS", name.to_uppercase()), "0");
        let doc = fio_json(run, name);
        let (error, read, _) = fio_job(&doc, name);
        assert_eq!(error, 0, "{name}");
        assert!(read > 0, "{name} read nothing");
        iops.push(doc["jobs"][0]["read"]["iops"].as_f64().unwrap_or(0.0));
        let p = Phase::of(run, name);
        for i in 0..DEVICES {
            let id = format!("nvme{i}");
            let fetches = queue_fetches(&p, &id);
            assert_eq!(
                fetches.len() as u64,
                vcpus,
                "{id}'s I/O queues: {fetches:?}"
            );
            let busy = fetches.values().filter(|&&n| n > 0).count() as u64;
            assert_eq!(
                busy, jobs,
                "{name}: {id}'s queues that carried I/O: {fetches:?}"
            );
            writeln!(
                report,
                "{name} {id} entries fetched per I/O queue: {fetches:?}"
            )
            .unwrap();
        }
    }
    writeln!(
        report,
        "P2P NVMe -> GPU reads, 1 MiB QD4, {FIO_SECONDS} s: one pair (nvme0 -> gpu0) {single_mib_s:.0} MiB/s; \
         4 own-switch pairs at once {agg_mib_s:.0} MiB/s ({agg_read} bytes; per GPU {per_pair:?})"
    )
    .unwrap();
    writeln!(
        report,
        "4 KiB randread QD16 over the 4 namespaces: 1 job {:.0} IOPS, {vcpus} jobs {:.0} IOPS",
        iops[0], iops[1]
    )
    .unwrap();

    // Host memory of each GPU's VRAM beyond its server's RSS: the pages
    // of the sparse VRAM memfd really in use (shared with the peers that
    // map it, not in anyone's VmHWM until they touch it).
    for i in 0..DEVICES {
        let id = format!("gpu{i}");
        let used = counter(&stats(run, &id), "vram_allocated_bytes");
        assert!(used > 0 && used <= 256 << 20, "{id}: {used}");
        writeln!(
            report,
            "{id} VRAM memfd in use: {:.1} MiB",
            used as f64 / 1048576.0
        )
        .unwrap();
    }
    report
}
