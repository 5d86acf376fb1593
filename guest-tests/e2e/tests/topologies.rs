//! Issue 12, the P2P topology matrix: the path between two devices decides
//! what the guest kernel's P2PDMA code does with a transfer between them.
//! One boot per topology, each checked three ways: the kernel's own words
//! (the guest's `/dev/kmsg` copy, parsed with `kernel_log`), the `p2pmem`
//! sysfs values, and the I/O result (bytes verified by the GPU's checksum
//! engine, or the exact errno the kernel gives).
//!
//! | test | topology | kernel decision |
//! |---|---|---|
//! | `acs_redirect_in_the_switch_refuses_p2p` | `same-switch-acs` | ACS redirect → through the host bridge → not whitelisted → refused (EINVAL) |
//! | `acs_redirect_with_a_zen_vcpu_goes_through_the_host_bridge` | `same-switch-acs` + `-cpu EPYC` | ACS redirect → through the host bridge → AMD family ≥ 0x17 → allowed |
//! | `zen_host_bridge_allows_p2p_between_root_ports` | `separate-root-ports-zen` | no common bridge → through the host bridge → AMD family ≥ 0x17 → allowed |
//! | `viommu_routes_p2p_by_switch_and_ram_through_iovas` | `viommu` | same switch, no ACS → bus address (a switch routes it past the IOMMU) |
//! | `viommu_with_acs_and_an_intel_vcpu_refuses_p2p` | `viommu-acs` | vIOMMU turns ACS redirect on → through the host bridge → not whitelisted → refused |
//! | `amd_iommu_with_acs_maps_p2p_through_the_iommu` | `viommu-amd` | vIOMMU turns ACS redirect on → through the host bridge → AMD Zen → IOVAs |
//!
//! Same switch without ACS (`lab`) and separate root ports under an Intel
//! vCPU (`separate-root-ports`) are checked by the `p2p` suite.
//!
//! Under each vIOMMU topology the P2P phases (fio verify NVMe <-> GPU
//! through p2pmem and NVMe <-> NVMe through a CMB, a CMB copy, a bounce
//! through guest RAM, a raw bus-address DMA) run between marks the host
//! takes with `p2plab-ctl RUN mark`, so each phase's counters are its own,
//! and `p2plab-ctl RUN provenance` judges the GPU's: real P2P passes, the
//! bounce fails.
//!
//! Each test's header names the broken device or kernel decision it
//! catches.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{counter, mark_phases, run_guest, run_guest_with, stats, Boot, GuestRun, Phase};
use p2plab_lab::kernel_log::{glob_match, parse_kmsg, KernelLine, KMSG_FILE};
use p2plab_lab::GuestScript;
use serde_json::Value;

/// A topologies guest script with the prelude and phases it sources
/// (`guest/lib/topologies.sh`: what every topology reports, `n2g`,
/// `ram_again`).
fn topologies_script(name: &str, text: &str) -> GuestScript {
    GuestScript::new(name, text).lib("topologies.sh", include_str!("../guest/lib/topologies.sh"))
}

/// `enum pci_p2pdma_map_type` of the 7.3 guest kernel
/// (include/linux/pci-p2pdma.h: UNKNOWN, NONE, NOT_SUPPORTED, BUS_ADDR,
/// THRU_HOST_BRIDGE), as `pci_p2pdma_map_type` returns it.
const MAP_NOT_SUPPORTED: &str = "2";
const MAP_BUS_ADDR: &str = "3";
const MAP_THRU_HOST_BRIDGE: &str = "4";

/// The kernel computed a map type for the P2P transfers, always `want`.
fn expect_map_type(run: &GuestRun, want: &str) {
    run.expect("KPROBE_STATUS", "0");
    run.expect("KPROBE_ENABLE_STATUS", "0");
    assert!(
        run.fact_u64("MAP_TYPE_CALLS") >= 1,
        "no P2P map type computed"
    );
    run.expect("MAP_TYPES", want);
}

/// The guest's kernel log of a finished run, parsed.
fn kernel_lines(run: &GuestRun) -> Vec<KernelLine> {
    let text = run.file(&format!("guest/{KMSG_FILE}"));
    let lines = parse_kmsg(&text);
    assert!(
        !lines.is_empty(),
        "no kernel log in {}",
        run.run_dir().display()
    );
    lines
}

/// How many kernel log lines match `pattern` (`*` globs).
fn count(lines: &[KernelLine], pattern: &str) -> usize {
    lines
        .iter()
        .filter(|l| glob_match(pattern, &l.text))
        .count()
}

/// P2PDMA refusals and redirect warnings the kernel prints for a pair.
const REFUSED: &str = "cannot be used for peer-to-peer DMA*";
const ACS_REDIRECT_LINE: &str = "ACS redirect is set between the client and provider*";
const NOT_WHITELISTED: &str = "Host bridge not in P2PDMA whitelist*";

/// `same-switch-acs` with P2P Request Redirect on both downstream ports
/// (`pci=config_acs=`), Intel vCPU. Catches: a kernel or topology that
/// lets P2P through despite ACS redirect (bytes would reach the GPU), ports
/// whose ACS capability or control bits are missing (the setpci values), a
/// provider that stops publishing p2pmem, an NVMe server that receives the
/// peer address at all (its DMA counters must stay at zero for the BAR),
/// and a RAM path broken by the refusal.
#[test]
fn acs_redirect_in_the_switch_refuses_p2p() {
    let script = topologies_script(
        "topologies-acs-redirect.sh",
        include_str!("../guest/topologies-acs-redirect.sh"),
    );
    let boot = Boot {
        append: vec!["pci=config_acs=1xx@0000:02:00.0;1xx@0000:02:01.0".to_owned()],
        ..Boot::default()
    };
    let run = run_guest("same-switch-acs", &script, boot);
    let gpu = run.fact("GPU_BDF").to_owned();
    expect_map_type(&run, MAP_NOT_SUPPORTED);

    // The ports the devices sit under are the ones the kernel parameter
    // named, and P2P Request Redirect (ACS Control bit 2) is on there only;
    // without an IOMMU nothing else turns ACS on.
    run.expect("GPU_PORT", "0000:02:01.0");
    run.expect("NVME_PORT", "0000:02:00.0");
    for port in ["ACS_CTRL_GPU_PORT", "ACS_CTRL_NVME_PORT"] {
        let ctrl = u16::from_str_radix(run.fact(port), 16)
            .unwrap_or_else(|_| panic!("{port}={} is not an ACS Control value", run.fact(port)));
        assert_eq!(ctrl, 0x0004, "{port}: only ReqRedir is set");
    }
    run.expect("ACS_CTRL_RP", "0000");

    // The provider still publishes its BAR: the refusal is per pair.
    run.expect("GPU_P2P_PUBLISHED", "1");
    assert_eq!(run.fact_u64("GPU_P2P_SIZE"), 1 << 30);
    run.expect("RAM_WRITE_STATUS", "0");
    run.expect("RAM_CMP", "0");

    // The kernel's decision, in its words: ACS redirect between the pair
    // (both ports listed), so the path goes through the host bridge, which
    // is not whitelisted (8086:29c0) for an Intel CPU: refused.
    let lines = kernel_lines(&run);
    assert_eq!(count(&lines, "*Configured ACS to 0x0004"), 2);
    assert!(count(&lines, &format!("{ACS_REDIRECT_LINE}({gpu})")) >= 1);
    assert!(
        count(&lines, "*pci=disable_acs_redir=0000:02:01.0;0000:02:00.0") >= 1,
        "the kernel names both redirecting ports"
    );
    assert!(count(&lines, &format!("{NOT_WHITELISTED}8086:29c0")) >= 1);
    assert!(
        count(
            &lines,
            &format!("{REFUSED}({gpu}) do not share an upstream bridge or whitelisted host bridge")
        ) >= 1
    );

    // The I/O: every 1 MiB chunk fails with EINVAL, nothing moves.
    assert_ne!(run.fact("N2G_STATUS"), "0");
    run.expect("N2G_ERRORS", "16");
    run.expect("N2G_BYTES", "0");
    run.expect("N2G_EINVAL_LINES", "16");
    run.expect("RAM_AFTER_CMP", "0");
    // The kernel refused before submitting: the NVMe server never saw the
    // peer address (no fault, no byte toward the GPU BAR).
    let nvme = stats(&run, "nvme0");
    assert_eq!(counter(&nvme, "dma_message_write_bytes"), 0, "{nvme}");
    assert_eq!(counter(&nvme, "dma_peer_write_bytes"), 0, "{nvme}");
    assert_eq!(counter(&nvme, "dma_faults"), 0, "{nvme}");
    assert_eq!(counter(&nvme, "failed_commands"), 0, "{nvme}");
}

/// `same-switch-acs` again, with `-cpu EPYC` after the topology's own
/// `-cpu` (QEMU takes the last): the same ACS redirect, but now the kernel
/// accepts the host bridge of an AMD family >= 0x17 CPU, so it maps the
/// pair "through the host bridge", where the redirected requests would go
/// on real hardware. Catches: a kernel that refuses a redirected pair on a
/// whitelisted CPU, a kernel that stops reporting the redirect (the
/// warning lines must still be there, without a refusal), and an NVMe
/// device that DMAs wrong bytes into the GPU BAR (GPU CRC; the peer path's
/// counters on both servers).
#[test]
fn acs_redirect_with_a_zen_vcpu_goes_through_the_host_bridge() {
    let script = topologies_script(
        "topologies-acs-zen.sh",
        include_str!("../guest/topologies-acs-zen.sh"),
    );
    let boot = Boot {
        append: vec!["pci=config_acs=1xx@0000:02:00.0;1xx@0000:02:01.0".to_owned()],
        qemu_args: vec!["-cpu".to_owned(), "EPYC".to_owned()],
        ..Boot::default()
    };
    let run = run_guest("same-switch-acs", &script, boot);
    let gpu = run.fact("GPU_BDF").to_owned();
    expect_map_type(&run, MAP_THRU_HOST_BRIDGE);
    run.expect("CPU_VENDOR", "AuthenticAMD");
    assert!(run.fact_u64("CPU_FAMILY") >= 0x17);
    run.expect("ACS_CTRL_GPU_PORT", "0004");
    run.expect("ACS_CTRL_NVME_PORT", "0004");
    run.expect("GPU_P2P_PUBLISHED", "1");

    // The kernel reports the redirect, and does not refuse the pair.
    let lines = kernel_lines(&run);
    assert!(count(&lines, &format!("{ACS_REDIRECT_LINE}({gpu})")) >= 1);
    assert_eq!(count(&lines, REFUSED), 0);
    assert_eq!(count(&lines, NOT_WHITELISTED), 0);

    // Every byte verified in VRAM; exactly 16 MiB written into BAR2.
    run.expect("N2G_STATUS", "0");
    run.expect("N2G_ERRORS", "0");
    assert_eq!(run.fact_u64("N2G_BYTES"), 16 << 20);
    run.expect("N2G_GPU_CRC", run.fact("PATTERN_CRC"));
    run.expect("RAM_AFTER_CMP", "0");
    assert_peer_path_bytes(&run, 16 << 20, 0);
}

/// `separate-root-ports-zen`: each device on its own root port of the q35
/// host bridge, `-cpu EPYC` (AuthenticAMD family 0x17 under TCG; under KVM
/// only on an AMD Zen host, with `-cpu host`, see `p2plab_lab::accel`). The
/// kernel finds no common upstream bridge, so the path is through the host
/// bridge, and `cpu_supports_p2pdma()` accepts AMD family >= 0x17 whatever
/// the host bridge. Catches: a vCPU model that no longer shows AMD Zen
/// (the cpuinfo facts), a kernel that refuses the pair, an NVMe device that
/// DMAs wrong bytes or to the wrong place (GPU CRC; the peer path's
/// counters on both servers), and a GPU that does not publish.
#[test]
fn zen_host_bridge_allows_p2p_between_root_ports() {
    let script = topologies_script(
        "topologies-zen-root-ports.sh",
        include_str!("../guest/topologies-zen-root-ports.sh"),
    );
    let run = run_guest("separate-root-ports-zen", &script, Boot::default());
    expect_map_type(&run, MAP_THRU_HOST_BRIDGE);

    // An AMD Zen CPU: TCG's EPYC (family 23 = 0x17), or under KVM an
    // AMD Zen host's own (on any other host the lab runs this under TCG).
    run.expect("CPU_VENDOR", "AuthenticAMD");
    assert!(run.fact_u64("CPU_FAMILY") >= 0x17);
    // Separate root ports on bus 0: no common upstream bridge.
    assert!(run.fact("GPU_PORT").starts_with("0000:00:"));
    assert!(run.fact("NVME_PORT").starts_with("0000:00:"));
    assert_ne!(run.fact("GPU_PORT"), run.fact("NVME_PORT"));
    run.expect("GPU_P2P_PUBLISHED", "1");
    assert_eq!(run.fact_u64("GPU_P2P_SIZE"), 1 << 30);
    run.expect("NVME_P2P_PUBLISHED", "1");
    run.expect("RAM_CMP", "0");

    // The kernel allows the pair without a word: no refusal, no ACS or
    // whitelist message (those come only from a refused or redirected pair).
    let lines = kernel_lines(&run);
    assert_eq!(count(&lines, REFUSED), 0);
    assert_eq!(count(&lines, ACS_REDIRECT_LINE), 0);
    assert_eq!(count(&lines, NOT_WHITELISTED), 0);

    // NVMe → GPU: every byte verified in VRAM by the GPU's engine.
    run.expect("N2G_STATUS", "0");
    run.expect("N2G_ERRORS", "0");
    assert_eq!(run.fact_u64("N2G_BYTES"), 16 << 20);
    run.expect("N2G_GPU_CRC", run.fact("PATTERN_CRC"));
    // GPU → NVMe: what the engine wrote in VRAM is what the namespace holds.
    run.expect("G2N_STATUS", "0");
    run.expect("G2N_ERRORS", "0");
    assert_eq!(run.fact_u64("G2N_BYTES"), 16 << 20);
    run.expect("G2N_READBACK_CRC", run.fact("G2N_GPU_CRC"));
    run.expect("RAM_AFTER_CMP", "0");

    // The NVMe server wrote exactly the 16 MiB into BAR2 and read the
    // 16 MiB of G2N from it, straight through gpu0's VRAM (peer path).
    assert_peer_path_bytes(&run, 16 << 20, 16 << 20);
}

/// nvme0 moved exactly `written` bytes into and `read` bytes out of gpu0's
/// BAR2 by the zero-copy peer path (gpu0 is its only peer), none by DMA
/// message through QEMU, and gpu0 counted the same bytes arriving and
/// leaving its VRAM.
fn assert_peer_path_bytes(run: &GuestRun, written: u64, read: u64) {
    let nvme = stats(run, "nvme0");
    let gpu = stats(run, "gpu0");
    assert_eq!(counter(&nvme, "dma_peer_write_bytes"), written, "{nvme}");
    assert_eq!(counter(&nvme, "dma_peer_read_bytes"), read, "{nvme}");
    for key in ["dma_message_write_bytes", "dma_message_read_bytes"] {
        assert_eq!(counter(&nvme, key), 0, "{key}: {nvme}");
    }
    assert_eq!(counter(&gpu, "peer_inbound_write_bytes"), written, "{gpu}");
    assert_eq!(counter(&gpu, "peer_inbound_read_bytes"), read, "{gpu}");
}

/// A vIOMMU guest script: the topologies prelude plus the P2P phases
/// (`guest/lib/viommu.sh`).
fn viommu_script(name: &str, text: &str) -> GuestScript {
    topologies_script(name, text).lib("viommu.sh", include_str!("../guest/lib/viommu.sh"))
}

/// The P2P phases of `p2p_phases` (guest/lib/viommu.sh), in order.
const PHASES: [&str; 5] = ["n2g_fio", "cmb_fio", "cmb_copy", "bounce", "bus_route"];
/// How long one phase may take under TCG.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);
const MIB16: u64 = 16 << 20;

/// `p2plab-ctl RUN provenance --json` over one phase's marks: the exit
/// status and the answer.
fn provenance(run: &GuestRun, name: &str) -> (i32, Value) {
    let ctl = p2plab_lab::LabPaths::discover()
        .and_then(|p| p.server_binary("p2plab-ctl"))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let out = Command::new(ctl)
        .arg(run.run_dir())
        .args(["--json", "provenance", "--since"])
        .arg(format!("{name}-start"))
        .arg("--until")
        .arg(format!("{name}-end"))
        .output()
        .expect("running p2plab-ctl");
    let text = String::from_utf8_lossy(&out.stdout);
    let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "provenance of {name}: {e}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), answer)
}

/// How the P2P phases' bytes must have travelled on a topology.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path2p {
    /// A switch routes them: the servers' peer windows (zero-copy).
    Switch,
    /// Through the root complex and the IOMMU: messages through QEMU.
    Iommu,
}

/// What every vIOMMU topology that allows P2P must show for the phases:
/// the data verified, the kernel's map type, each phase's bytes on
/// `path` and nowhere else, the bounce seen as a bounce, and the raw
/// bus-address DMA routed (switch) or faulted (IOMMU).
fn check_p2p_phases(run: &GuestRun, path: Path2p) {
    let (peer, message) = match path {
        Path2p::Switch => ("dma_peer", "dma_message"),
        Path2p::Iommu => ("dma_message", "dma_peer"),
    };
    let to_peer = match path {
        Path2p::Switch => MAP_BUS_ADDR,
        Path2p::Iommu => MAP_THRU_HOST_BRIDGE,
    };

    // NVMe <-> GPU through p2pmem: fio wrote 16 MiB from VRAM and read it
    // back into VRAM, crc32c checked in every 4 KiB.
    run.expect("N2G_FIO_STATUS", "0");
    run.expect("N2G_FIO_ERROR", "0");
    assert_eq!(run.fact_u64("N2G_FIO_WRITE_BYTES"), MIB16);
    assert_eq!(run.fact_u64("N2G_FIO_READ_BYTES"), MIB16);
    run.expect("N2G_FIO_MAP_TYPES", to_peer);
    let p = Phase::of(run, "n2g_fio");
    assert_eq!(p.delta("nvme0", &format!("{peer}_read_bytes")), MIB16);
    assert_eq!(p.delta("nvme0", &format!("{peer}_write_bytes")), MIB16);
    assert_eq!(p.delta("nvme0", &format!("{message}_read_bytes")), 0);
    assert_eq!(p.delta("nvme0", &format!("{message}_write_bytes")), 0);
    let inbound = if path == Path2p::Switch { MIB16 } else { 0 };
    assert_eq!(p.delta("gpu0", "peer_inbound_write_bytes"), inbound);
    assert_eq!(p.delta("gpu0", "peer_inbound_read_bytes"), inbound);
    assert_eq!(p.delta("gpu0", "bytes_ram_to_vram"), 0);
    let (code, answer) = provenance(run, "n2g_fio");
    assert_eq!(code, 0, "real P2P passes: {answer}");
    assert_eq!(answer["pass"], true, "{answer}");
    assert_eq!(answer["bounced_bytes"], 0, "{answer}");
    assert!(
        answer["p2p_bytes"].as_u64().unwrap_or(0) >= 2 * MIB16,
        "{answer}"
    );

    // NVMe <-> NVMe through nvme1's CMB.
    run.expect("CMB_FIO_STATUS", "0");
    run.expect("CMB_FIO_ERROR", "0");
    assert_eq!(run.fact_u64("CMB_FIO_WRITE_BYTES"), MIB16);
    assert_eq!(run.fact_u64("CMB_FIO_READ_BYTES"), MIB16);
    run.expect("CMB_FIO_MAP_TYPES", to_peer);
    let p = Phase::of(run, "cmb_fio");
    assert_eq!(p.delta("nvme0", &format!("{peer}_read_bytes")), MIB16);
    assert_eq!(p.delta("nvme0", &format!("{peer}_write_bytes")), MIB16);
    assert_eq!(p.delta("nvme0", &format!("{message}_write_bytes")), 0);
    assert_eq!(p.delta("nvme1", "peer_inbound_write_bytes"), inbound);
    assert_eq!(p.delta("nvme1", "peer_inbound_read_bytes"), inbound);
    assert_eq!(p.delta("gpu0", "peer_inbound_write_bytes"), 0);

    // NVMe -> NVMe copy: nvme0 into nvme1's CMB, nvme1 out of its own
    // CMB (a device's own BAR is a bus address, map type 3, on any path).
    run.expect("CMB_COPY_STATUS", "0");
    run.expect("CMB_COPY_ERRORS", "0");
    run.expect("CMB_COPY_DST_SUM", run.fact("CMB_COPY_SRC_SUM"));
    let want = match path {
        Path2p::Switch => MAP_BUS_ADDR.to_owned(),
        Path2p::Iommu => format!("{MAP_BUS_ADDR},{MAP_THRU_HOST_BRIDGE}"),
    };
    run.expect("CMB_COPY_MAP_TYPES", &want);
    let p = Phase::of(run, "cmb_copy");
    assert_eq!(p.delta("nvme0", &format!("{peer}_write_bytes")), MIB16);
    assert_eq!(p.delta("nvme0", &format!("{message}_write_bytes")), 0);
    assert_eq!(p.delta("nvme1", "peer_inbound_write_bytes"), inbound);
    let local = p.delta("nvme1", "dma_local_read_bytes");
    assert!(
        (MIB16..MIB16 + (1 << 20)).contains(&local),
        "nvme1 read its own CMB: {local}"
    );

    // A bounce: the NVMe into guest RAM, the GPU engine from RAM to VRAM.
    run.expect("BOUNCE_STATUS", "0");
    run.expect("BOUNCE_GPU_CRC", run.fact("BOUNCE_FILE_CRC"));
    run.expect("BOUNCE_MAP_TYPES", "");
    let p = Phase::of(run, "bounce");
    assert_eq!(p.delta("gpu0", "bytes_ram_to_vram"), MIB16);
    assert!(p.delta("nvme0", "dma_mmap_write_bytes") >= MIB16);
    assert_eq!(p.delta("nvme0", &format!("{peer}_write_bytes")), 0);
    let (code, answer) = provenance(run, "bounce");
    assert_eq!(code, 1, "a bounce fails: {answer}");
    assert_eq!(answer["pass"], false, "{answer}");
    assert_eq!(answer["bounced_bytes"], MIB16, "{answer}");
    assert_eq!(answer["devices"][0]["ram_to_device"], MIB16, "{answer}");
    assert!(
        answer["other_ram_dma"]["nvme0"].as_u64().unwrap_or(0) >= MIB16,
        "{answer}"
    );

    // The GPU engine's raw DMA to nvme1's CMB bus address: a switch
    // routes it to nvme1, an IOMMU faults it (HOST_DMA, 0x04).
    run.expect("BUS_ROUTE_MAP_TYPES", "");
    let p = Phase::of(run, "bus_route");
    match path {
        Path2p::Switch => {
            run.expect("BUS_ROUTE_STATUS", "0");
            assert_eq!(p.delta("gpu0", "dma_peer_write_bytes"), 4096);
            assert_eq!(p.delta("nvme1", "peer_inbound_write_bytes"), 4096);
        }
        Path2p::Iommu => {
            run.expect("BUS_ROUTE_STATUS", "1");
            assert_eq!(bus_route_job_status(run), JOB_STATUS_HOST_DMA);
            assert_eq!(p.delta("gpu0", "dma_peer_write_bytes"), 0);
            assert_eq!(p.delta("gpu0", "dma_message_write_bytes"), 0);
            assert_eq!(p.delta("gpu0", "jobs_failed"), 1);
            assert_eq!(p.delta("nvme1", "peer_inbound_write_bytes"), 0);
        }
    }
    assert_eq!(p.delta("gpu0", "bytes_vram_to_ram"), 0);
    for id in ["nvme0", "nvme1"] {
        let s = stats(run, id);
        assert_eq!(counter(&s, "dma_faults"), 0, "{id}: {s}");
        assert_eq!(counter(&s, "failed_commands"), 0, "{id}: {s}");
    }
}

/// The GPU's job status for a DMA that faulted at the host (HOST_DMA,
/// devices/gpu/src/status.rs).
const JOB_STATUS_HOST_DMA: u32 = 0x04;

/// The job status `p2plab-gpu-tool raw` printed in the bus_route phase
/// (`status 0x4 result ... fence N`).
fn bus_route_job_status(run: &GuestRun) -> u32 {
    let out = run.fact("BUS_ROUTE_OUT");
    out.split_once("status 0x")
        .and_then(|(_, rest)| {
            let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
            u32::from_str_radix(&hex, 16).ok()
        })
        .unwrap_or_else(|| panic!("no job status in BUS_ROUTE_OUT: {out}"))
}

/// The routing table the lab gave each server (its command line).
fn direct_peers(run: &GuestRun, id: &str) -> String {
    let cmdline = run.file(&format!("{id}.cmdline"));
    let at = cmdline
        .find("--direct-peers ")
        .unwrap_or_else(|| panic!("{id} got no --direct-peers: {cmdline}"));
    cmdline[at + "--direct-peers ".len()..]
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The ACS Control value a guest fact reports (`none`: no capability).
fn acs(run: &GuestRun, key: &str) -> Option<u16> {
    let text = run.fact(key);
    (text != "none")
        .then(|| u16::from_str_radix(text, 16).unwrap_or_else(|_| panic!("{key}={text}")))
}

/// ReqRedir and CmpltRedir in ACS Control.
const ACS_REDIRECT: u16 = 0x000c;

/// `viommu`: nvme0, nvme1 and gpu0 under one switch without ACS behind
/// intel-iommu (caching-mode=on), the guest with `intel_iommu=on
/// iommu.strict=1`. RAM DMA uses IOVAs the guest maps and unmaps around
/// every I/O; the servers follow each DMA_MAP/DMA_UNMAP. P2P between the
/// devices is by bus address (the kernel's map type 3), which a real
/// switch routes to the peer past the IOMMU; QEMU's switch cannot, so the
/// servers do, through their peer windows, as the lab's routing table
/// (`--direct-peers`) says. Catches: a server that loses track of IOVA
/// maps/unmaps (the RAM round trips), a lab that does not route this
/// switch's peers directly (every P2P command would fault), P2P bytes that
/// take any path but the peer windows (the counters of each phase), data
/// corrupted on the way (fio's crc32c, the copy's md5), a provenance
/// verdict that fails real P2P or passes a bounce, and a switch-routed
/// raw bus-address DMA that does not reach the peer.
#[test]
fn viommu_routes_p2p_by_switch_and_ram_through_iovas() {
    let script = viommu_script(
        "topologies-viommu.sh",
        include_str!("../guest/topologies-viommu.sh"),
    );
    let boot = Boot {
        append: vec!["intel_iommu=on".to_owned(), "iommu.strict=1".to_owned()],
        ..Boot::default()
    };
    let (run, ()) = run_guest_with("viommu", &script, boot, |lab| {
        let timeout = lab.budget(PHASE_TIMEOUT);
        mark_phases(lab, &PHASES, timeout)
    });

    // Translated IOMMU groups; the routing the lab derived.
    for key in [
        "IOMMU_GROUP_TYPE",
        "GPU_IOMMU_GROUP_TYPE",
        "NVME1_IOMMU_GROUP_TYPE",
    ] {
        run.expect(key, "DMA");
    }
    let lines = kernel_lines(&run);
    assert!(count(&lines, "DMAR: IOMMU enabled") >= 1);
    assert_eq!(direct_peers(&run, "nvme0"), "gpu0,nvme1");
    assert_eq!(direct_peers(&run, "nvme1"), "gpu0,nvme0");
    assert_eq!(direct_peers(&run, "gpu0"), "nvme0,nvme1");
    // What the guest sees agrees: the kernel turned redirect on where it
    // could (the root port, above the switch); the switch's ports have no
    // ACS capability.
    assert_eq!(
        acs(&run, "ACS_CTRL_RP").unwrap_or(0) & ACS_REDIRECT,
        ACS_REDIRECT
    );
    for port in [
        "ACS_CTRL_UP",
        "ACS_CTRL_GPU_PORT",
        "ACS_CTRL_NVME_PORT",
        "ACS_CTRL_NVME1_PORT",
    ] {
        assert_eq!(acs(&run, port), None, "{port}");
    }
    run.expect("GPU_P2P_PUBLISHED", "1");
    run.expect("NVME1_P2P_PUBLISHED", "1");
    assert_eq!(count(&lines, REFUSED), 0);
    assert_eq!(count(&lines, ACS_REDIRECT_LINE), 0);

    // RAM through IOVAs: large and 4 KiB I/O round trips verify.
    run.expect("RAM_WRITE_STATUS", "0");
    run.expect("RAM_CMP", "0");
    run.expect("SMALL_CMP", "0");
    run.expect("RAM_AFTER_CMP", "0");
    // The server followed thousands of IOVA maps and unmaps: at least one
    // map per 4 KiB I/O above (strict mode unmaps each right after it),
    // none refused (the topology's --max-fd-dma-maps covers the pages in
    // flight; the default 256 does not: ENOSPC, then RAM DMA faults).
    let log = run.file("nvme0.log");
    let maps = log.matches("dma_cmds: DMA_MAP ").count();
    let unmaps = log.matches("dma_cmds: DMA_UNMAP ").count();
    assert!(maps >= 4096, "{maps} DMA_MAPs");
    assert!(unmaps >= 4096, "{unmaps} DMA_UNMAPs");
    let refused_maps = log
        .lines()
        .filter(|l| l.contains("refused") && l.contains("cmd=\"DMA_MAP\""))
        .count();
    assert_eq!(refused_maps, 0, "DMA_MAPs refused by the NVMe server");

    // The kernel's map type is checked per phase (each clears the trace).
    check_p2p_phases(&run, Path2p::Switch);
}

/// `viommu-acs`: the three devices under a switch whose ports have ACS,
/// behind intel-iommu, with an Intel vCPU. Under the IOMMU the kernel turns
/// ACS redirect on at every port with the capability, so the pairs go
/// through the host bridge, which q35's (8086:29c0) is not whitelisted
/// for: refused. Catches: a kernel or topology that lets P2P through (the
/// I/O must fail with EINVAL), ports whose redirect the kernel did not
/// turn on, a lab that routes these peers directly (the table must be
/// `none`), and a server that serves a bus address across ACS redirect
/// (the GPU's raw DMA must fault as at the IOMMU).
#[test]
fn viommu_with_acs_and_an_intel_vcpu_refuses_p2p() {
    let script = viommu_script(
        "topologies-viommu-acs.sh",
        include_str!("../guest/topologies-viommu-acs.sh"),
    );
    let boot = Boot {
        append: vec!["intel_iommu=on".to_owned(), "iommu.strict=1".to_owned()],
        ..Boot::default()
    };
    let run = run_guest("viommu-acs", &script, boot);
    let gpu = run.fact("GPU_BDF").to_owned();
    run.expect("IOMMU_GROUP_TYPE", "DMA");
    for id in ["nvme0", "nvme1", "gpu0"] {
        assert_eq!(direct_peers(&run, id), "none", "{id}");
    }
    for port in [
        "ACS_CTRL_GPU_PORT",
        "ACS_CTRL_NVME_PORT",
        "ACS_CTRL_NVME1_PORT",
    ] {
        let ctrl = acs(&run, port).unwrap_or_else(|| panic!("{port}: no ACS"));
        assert_eq!(ctrl & ACS_REDIRECT, ACS_REDIRECT, "{port}={ctrl:#x}");
    }
    expect_map_type(&run, MAP_NOT_SUPPORTED);
    let lines = kernel_lines(&run);
    assert!(count(&lines, &format!("{ACS_REDIRECT_LINE}({gpu})")) >= 1);
    assert!(count(&lines, &format!("{NOT_WHITELISTED}8086:29c0")) >= 1);
    assert!(count(&lines, &format!("{REFUSED}({gpu})*")) >= 1);

    // Every P2P transfer refused: p2pio's 16 chunks with EINVAL, fio
    // through nvme1's CMB fails, nothing moves between the devices.
    run.expect("N2G_ERRORS", "16");
    run.expect("N2G_BYTES", "0");
    run.expect("N2G_EINVAL_LINES", "16");
    assert_ne!(run.fact("CMB_FIO_STATUS"), "0");
    run.expect("RAM_AFTER_CMP", "0");
    // The GPU's raw DMA to nvme1's CMB bus address faults (HOST_DMA).
    run.expect("BUS_ROUTE_STATUS", "1");
    assert_eq!(bus_route_job_status(&run), JOB_STATUS_HOST_DMA);
    let nvme = stats(&run, "nvme0");
    let gpu0 = stats(&run, "gpu0");
    let nvme1 = stats(&run, "nvme1");
    for key in [
        "dma_peer_write_bytes",
        "dma_peer_read_bytes",
        "dma_message_write_bytes",
        "dma_message_read_bytes",
    ] {
        assert_eq!(counter(&nvme, key), 0, "{key}: {nvme}");
        assert_eq!(counter(&gpu0, key), 0, "{key}: {gpu0}");
    }
    assert_eq!(counter(&nvme1, "peer_inbound_write_bytes"), 0, "{nvme1}");
    assert_eq!(counter(&nvme, "dma_faults"), 0, "{nvme}");
    assert!(counter(&gpu0, "jobs_failed") >= 1, "{gpu0}");
}

/// `viommu-amd`: the three devices under a switch with ACS behind QEMU's
/// AMD IOMMU (amd-iommu, dma-remap=on), with an AMD Zen vCPU: ACS redirect
/// on at every port, so the kernel maps P2P through the host bridge, which
/// it allows on AMD family >= 0x17, with an IOVA for each peer BAR page.
/// QEMU sends those IOVAs without an fd, so the servers move P2P bytes by
/// message, which QEMU translates through its AMD-Vi model into the BAR.
/// Catches: QEMU's amd-iommu no longer forwarding maps to vfio-user
/// devices (RAM I/O would fault), a lab that routes peers across ACS
/// directly (the table must be `none`), P2P bytes that take another path
/// than messages (each phase's counters), data corrupted on the way,
/// provenance verdicts that fail P2P through the IOMMU or pass a bounce,
/// and a server that serves a bus address the IOMMU would fault.
#[test]
fn amd_iommu_with_acs_maps_p2p_through_the_iommu() {
    let script = viommu_script(
        "topologies-viommu-amd.sh",
        include_str!("../guest/topologies-viommu-amd.sh"),
    );
    let boot = Boot {
        append: vec!["iommu.strict=1".to_owned()],
        ..Boot::default()
    };
    let (run, ()) = run_guest_with("viommu-amd", &script, boot, |lab| {
        let timeout = lab.budget(PHASE_TIMEOUT);
        mark_phases(lab, &PHASES, timeout)
    });
    run.expect("CPU_VENDOR", "AuthenticAMD");
    for key in [
        "IOMMU_GROUP_TYPE",
        "GPU_IOMMU_GROUP_TYPE",
        "NVME1_IOMMU_GROUP_TYPE",
    ] {
        run.expect(key, "DMA");
    }
    let lines = kernel_lines(&run);
    assert!(count(&lines, "AMD-Vi: Extended features*") >= 1);
    for id in ["nvme0", "nvme1", "gpu0"] {
        assert_eq!(direct_peers(&run, id), "none", "{id}");
    }
    let marks = Phase::of(&run, "n2g_fio");
    assert_eq!(
        marks.end.servers["nvme0"]["dma"]["peer_windows"],
        serde_json::json!([]),
        "no peer window under ACS redirect"
    );
    for port in [
        "ACS_CTRL_GPU_PORT",
        "ACS_CTRL_NVME_PORT",
        "ACS_CTRL_NVME1_PORT",
    ] {
        let ctrl = acs(&run, port).unwrap_or_else(|| panic!("{port}: no ACS"));
        assert_eq!(ctrl & ACS_REDIRECT, ACS_REDIRECT, "{port}={ctrl:#x}");
    }
    assert_eq!(acs(&run, "ACS_CTRL_UP"), None);
    run.expect("GPU_P2P_PUBLISHED", "1");
    run.expect("RAM_CMP", "0");
    run.expect("RAM_AFTER_CMP", "0");
    // The kernel reports the redirect and allows the pairs.
    assert!(count(&lines, ACS_REDIRECT_LINE) >= 1);
    assert_eq!(count(&lines, REFUSED), 0);
    assert_eq!(count(&lines, NOT_WHITELISTED), 0);
    // The peer BARs' IOVAs came as DMA_MAPs without an fd.
    let log = run.file("nvme0.log");
    let bar_iovas = log
        .lines()
        .filter(|l| {
            l.contains("DMA range added")
                && l.contains("backing=\"messages\"")
                && l.contains("write=true")
        })
        .count();
    assert!(bar_iovas >= 1, "no fd-less IOVA map for a peer BAR");
    check_p2p_phases(&run, Path2p::Iommu);
}
