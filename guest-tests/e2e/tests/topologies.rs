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
//! | `viommu_maps_ram_through_iovas_and_p2p_by_bus_address` | `viommu` | same switch, no ACS → bus address (bypasses the IOMMU) |
//!
//! Same switch without ACS (`lab`) and separate root ports under an Intel
//! vCPU (`separate-root-ports`) are checked by the `p2p` suite.
//!
//! Each test's header names the broken device or kernel decision it
//! catches.

mod common;

use common::{counter, run_guest, stats, Boot, GuestRun};
use p2plab_lab::kernel_log::{glob_match, parse_kmsg, KernelLine, KMSG_FILE};
use p2plab_lab::GuestScript;

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
const ACS_REDIRECT: &str = "ACS redirect is set between the client and provider*";
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
    assert!(count(&lines, &format!("{ACS_REDIRECT}({gpu})")) >= 1);
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
    assert!(count(&lines, &format!("{ACS_REDIRECT}({gpu})")) >= 1);
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
    assert_eq!(count(&lines, ACS_REDIRECT), 0);
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

/// `viommu`: the `lab` switch behind intel-iommu (caching-mode=on), the
/// guest with `intel_iommu=on iommu.strict=1`. RAM DMA uses IOVAs that the
/// guest maps and unmaps around every I/O; the servers follow each
/// DMA_MAP/DMA_UNMAP. The pair shares a switch whose downstream ports have
/// no ACS, so the kernel maps P2P by bus address (it bypasses the IOMMU, as
/// a real switch routes the request straight to the peer). QEMU 11.1 has no
/// peer routing in its switch: a device's DMA goes through the IOMMU's
/// address space, where the GPU BAR's bus address is no IOVA, so the NVMe
/// server faults it (Data Transfer Error, EIO after Linux's retries).
/// Catches: a server that loses track of IOVA maps/unmaps (the RAM round
/// trips), a kernel that picks the IOMMU path for this pair (the device
/// would see IOVAs, not addresses inside BAR2), a server that writes to a
/// bus address nobody mapped, and a failure that is not reported as the
/// NVMe Data Transfer Error on every attempt.
#[test]
fn viommu_maps_ram_through_iovas_and_p2p_by_bus_address() {
    let script = topologies_script(
        "topologies-viommu.sh",
        include_str!("../guest/topologies-viommu.sh"),
    );
    let boot = Boot {
        append: vec!["intel_iommu=on".to_owned(), "iommu.strict=1".to_owned()],
        ..Boot::default()
    };
    let run = run_guest("viommu", &script, boot);
    expect_map_type(&run, MAP_BUS_ADDR);

    // Both devices are translated by the IOMMU (DMA domain, not identity).
    run.expect("IOMMU_GROUP_TYPE", "DMA");
    run.expect("GPU_IOMMU_GROUP_TYPE", "DMA");
    let lines = kernel_lines(&run);
    assert!(count(&lines, "DMAR: IOMMU enabled") >= 1);
    // Under an IOMMU the kernel turns ACS redirect on where it can: the
    // root port above the switch. xio3130 downstream ports have no ACS
    // capability, and the root port is above the pair's common bridge.
    let rp = u16::from_str_radix(run.fact("ACS_CTRL_RP"), 16)
        .unwrap_or_else(|_| panic!("ACS_CTRL_RP={}", run.fact("ACS_CTRL_RP")));
    assert_eq!(
        rp & 0x000c,
        0x000c,
        "ReqRedir and CmpltRedir on the root port"
    );
    run.expect("ACS_CTRL_GPU_PORT", "none");
    run.expect("ACS_CTRL_NVME_PORT", "none");
    run.expect("GPU_P2P_PUBLISHED", "1");
    run.expect("NVME_P2P_PUBLISHED", "1");

    // RAM through IOVAs: large and 4 KiB I/O round trips verify.
    run.expect("RAM_WRITE_STATUS", "0");
    run.expect("RAM_CMP", "0");
    run.expect("SMALL_CMP", "0");
    run.expect("RAM_AFTER_CMP", "0");
    // The server followed thousands of IOVA maps and unmaps: at least one
    // map per 4 KiB I/O above (strict mode unmaps each right after it).
    let log = run.file("nvme0.log");
    let maps = log.matches("dma_cmds: DMA_MAP ").count();
    let unmaps = log.matches("dma_cmds: DMA_UNMAP ").count();
    assert!(maps >= 4096, "{maps} DMA_MAPs");
    assert!(unmaps >= 4096, "{unmaps} DMA_UNMAPs");
    // None refused: the topology's --max-fd-dma-maps covers the pages in
    // flight (the default 256 does not: ENOSPC, then RAM DMA faults).
    let refused_maps = log
        .lines()
        .filter(|l| l.contains("refused") && l.contains("cmd=\"DMA_MAP\""))
        .count();
    assert_eq!(refused_maps, 0, "DMA_MAPs refused by the NVMe server");

    // The kernel allowed the pair (bus-address mapping): no refusal or
    // redirect message.
    assert_eq!(count(&lines, REFUSED), 0);
    assert_eq!(count(&lines, ACS_REDIRECT), 0);

    // The device was handed bus addresses inside the GPU's BAR2 (the
    // IOMMU path would hand it IOVAs), and faulted on every one of them.
    let bar_start = run.fact_u64("GPU_BAR2_START");
    let bar_end = run.fact_u64("GPU_BAR2_END");
    let faults: Vec<(u64, u64)> = log
        .lines()
        .filter_map(|line| {
            let at = line.find("DMA fault at 0x")? + "DMA fault at 0x".len();
            let (addr, rest) = line[at..].split_once("+0x")?;
            let len = rest.split_whitespace().next()?;
            Some((
                u64::from_str_radix(addr, 16).ok()?,
                u64::from_str_radix(len, 16).ok()?,
            ))
        })
        .collect();
    assert!(!faults.is_empty(), "the NVMe server saw no peer address");
    for &(addr, len) in &faults {
        assert!(
            addr >= bar_start && addr + len <= bar_end + 1,
            "fault at {addr:#x}+{len:#x} outside BAR2 {bar_start:#x}-{bar_end:#x}"
        );
    }

    // The I/O: 16 chunks, each fails with EIO; nothing reaches the GPU.
    assert_ne!(run.fact("N2G_STATUS"), "0");
    run.expect("N2G_ERRORS", "16");
    run.expect("N2G_BYTES", "0");
    run.expect("N2G_EIO_LINES", "16");
    let nvme = stats(&run, "nvme0");
    assert_eq!(counter(&nvme, "dma_message_write_bytes"), 0, "{nvme}");
    // Every command of the 16 MiB (split at max_sectors_kb) is tried
    // 1 + max_retries times (Data Transfer Error has no DNR), and each
    // attempt is one fault and one failed command.
    let commands = (16 << 10) / run.fact_u64("MAX_SECTORS_KB");
    let attempts = commands * (run.fact_u64("MAX_RETRIES") + 1);
    assert_eq!(counter(&nvme, "dma_faults"), attempts, "{nvme}");
    assert_eq!(counter(&nvme, "failed_commands"), attempts, "{nvme}");
    assert!(count(&lines, "*I/O Error (sct 0x0 / sc 0x4)*") >= 1);
}
