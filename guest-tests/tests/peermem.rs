//! Issue 14, GPU side: the p2plab_gpu driver's peer-memory API
//! (`p2plab_p2p.h`, shaped like nvidia_p2p_*) and its dma-buf exporter,
//! driven by a real importer, the in-tree test module p2plab_p2p_test.ko,
//! through `p2plab-gpu-tool p2p-scenario` (one line per fact).
//!
//! `peer_memory_and_dmabuf_in_the_lab` (one boot of `lab`, NVMe as the
//! named peer under the same switch) catches:
//! - get/map returning wrong addresses: the page table's physical pages and
//!   the peer's DMA addresses must both start at BAR2 (sysfs `resource`; on
//!   q35 the bus address equals it) plus the allocation's VRAM offset, be
//!   contiguous per 4 KiB page, and the map type must be BUS_ADDR;
//! - a put_pages that fails or runs the callback anyway (round trip);
//! - a driver that forgets an importer when the memory goes away: the free
//!   callback must run exactly once, in process context, on FREE, on the
//!   owner's process exit, on a function reset and on unbind, and the
//!   driver's `p2p_revocations` counter must count them;
//! - a dma-buf exporter that lets non-P2P importers attach, maps to wrong
//!   addresses, or keeps mapping after a revoke: the P2P attachment maps
//!   BAR2 + offset for the whole size, the plain one is refused with
//!   EOPNOTSUPP, FREE invalidates the mapping (invalidate_mappings, the
//!   former move_notify) and a new map fails with ENODEV;
//! - oopses and warnings: the clean-boot kernel-log check of every boot.
//!
//! `peer_memory_refused_on_separate_root_ports` catches an API that hands
//! out addresses the kernel's P2P distance check refuses: dma_map_pages
//! must fail with EINVAL, the dma-buf attach with EOPNOTSUPP, and dmesg
//! must carry the kernel's reason for each.

mod common;

use common::{run_guest, Boot, GuestRun};

const PRELUDE: &str = r#"
set -u
by_class() { for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "$1" ] && basename $d; done; }
gpu_bdf=$(by_class 0x030200 | head -n1)
nvme_bdf=$(by_class 0x010802 | head -n1)
[ -n "$gpu_bdf" ] && [ -n "$nvme_bdf" ] || { echo "no GPU or NVMe"; exit 1; }
modprobe p2plab_p2p_test; echo "MODPROBE_STATUS=$?"
sed -n 3p /sys/bus/pci/devices/$gpu_bdf/resource | { read start end flags; echo "BAR2_START=$start"; }
reason='cannot be used for peer-to-peer DMA as the client and provider .* do not share an upstream bridge or whitelisted host bridge'
"#;

const LAB_SCRIPT: &str = r#"
sys=/sys/class/p2plab-gpu/p2plab-gpu0
echo "BASE_P2P_REVOCATIONS=$(cat $sys/p2p_revocations)"
echo "BASE_DMABUF_REVOCATIONS=$(cat $sys/dmabuf_revocations)"
p2plab-gpu-tool p2p-scenario $nvme_bdf 16M unpin RT; echo "RT_STATUS=$?"
p2plab-gpu-tool p2p-scenario $nvme_bdf 1M free FREE; echo "FREE_STATUS=$?"
p2plab-gpu-tool p2p-scenario $nvme_bdf 1M exit EXIT; echo "EXIT_STATUS=$?"
p2plab-gpu-tool p2p-scenario $nvme_bdf 2M dmabuf DMABUF; echo "DMABUF_STATUS=$?"
p2plab-gpu-tool p2p-scenario $nvme_bdf 1M reset RESET; echo "RESET_STATUS=$?"
p2plab-gpu-tool nop >/dev/null; echo "RESET_NEXT_NOP=$?"
echo "P2P_REVOCATIONS=$(cat $sys/p2p_revocations)"
echo "DMABUF_REVOCATIONS=$(cat $sys/dmabuf_revocations)"
p2plab-gpu-tool p2p-scenario $nvme_bdf 1M unbind UNBIND; echo "UNBIND_STATUS=$?"
i=0; until [ -e /dev/p2plab-gpu0 ] || [ $i -ge 50 ]; do sleep 0.1; i=$((i+1)); done
p2plab-gpu-tool nop >/dev/null; echo "REBOUND_NOP=$?"
rmmod p2plab_p2p_test; echo "RMMOD_STATUS=$?"
echo "REFUSAL_DMESG=$(dmesg | grep -c "$reason")"
exit 0
"#;

const REFUSAL_SCRIPT: &str = r#"
dmesg -C
p2plab-gpu-tool p2p-scenario $nvme_bdf 1M unpin RT; echo "RT_STATUS=$?"
echo "RT_DMESG=$(dmesg | grep -c "$reason")"
p2plab-gpu-tool p2p-scenario $nvme_bdf 1M dmabuf DMABUF; echo "DMABUF_STATUS=$?"
echo "ALL_DMESG=$(dmesg | grep -c "$reason")"
dmesg | tail -n 10
exit 0
"#;

/// enum pci_p2pdma_map_type
const MAP_TYPE_BUS_ADDR: &str = "3";
const EINVAL: &str = "-22";
const ENODEV: &str = "-19";
const EOPNOTSUPP: &str = "-95";

/// The address a fact's allocation starts at in BAR2.
fn bar2_address(run: &GuestRun, prefix: &str) -> u64 {
    run.fact_u64("BAR2_START") + run.fact_u64(&format!("{prefix}_ALLOC_OFFSET"))
}

fn expect_pinned(run: &GuestRun, prefix: &str) {
    run.expect(&format!("{prefix}_GET_RET"), "0");
    run.expect(&format!("{prefix}_MAP_RET"), "0");
    run.expect(&format!("{prefix}_PAGE_SIZE"), "4096");
    let size = run.fact_u64(&format!("{prefix}_ALLOC_SIZE"));
    assert_eq!(
        run.fact_u64(&format!("{prefix}_ENTRIES")),
        size / 4096,
        "{prefix}: one entry per page"
    );
    assert_eq!(
        run.fact_u64(&format!("{prefix}_PT_VRAM_OFFSET")),
        run.fact_u64(&format!("{prefix}_ALLOC_OFFSET")),
        "{prefix}: the table starts at the allocation"
    );
    let want = bar2_address(run, prefix);
    assert_eq!(
        run.fact_u64(&format!("{prefix}_PHYS0")),
        want,
        "{prefix} phys"
    );
    assert_eq!(
        run.fact_u64(&format!("{prefix}_DMA0")),
        want,
        "{prefix} dma"
    );
    run.expect(&format!("{prefix}_PHYS_CONTIGUOUS"), "1");
    run.expect(&format!("{prefix}_DMA_CONTIGUOUS"), "1");
    run.expect(&format!("{prefix}_MAP_TYPE"), MAP_TYPE_BUS_ADDR);
}

/// The free callback ran once, in process context, and freed the table.
fn expect_revoked(run: &GuestRun, prefix: &str) {
    run.expect(&format!("{prefix}_STATUS"), "0");
    expect_pinned(run, prefix);
    run.expect(&format!("{prefix}_AFTER_CALLBACKS"), "1");
    run.expect(&format!("{prefix}_AFTER_REVOKED"), "1");
    run.expect(&format!("{prefix}_AFTER_CALLBACK_IN_TASK"), "1");
    run.expect(&format!("{prefix}_FORGET_CALLBACKS"), "1");
    run.expect(&format!("{prefix}_FORGET_PUT_RET"), "0");
}

#[test]
fn peer_memory_and_dmabuf_in_the_lab() {
    let script = format!("{PRELUDE}{LAB_SCRIPT}");
    let run = run_guest("lab", &script, Boot::default());
    run.expect("MODPROBE_STATUS", "0");

    // Round trip: get, map, unmap, put; no callback.
    run.expect("RT_STATUS", "0");
    expect_pinned(&run, "RT");
    run.expect("RT_ALLOC_SIZE", &(16u64 << 20).to_string());
    run.expect("RT_UNPIN_PUT_RET", "0");
    run.expect("RT_UNPIN_CALLBACKS", "0");

    // Revocation on free, process exit, reset, unbind.
    for prefix in ["FREE", "EXIT", "RESET", "UNBIND"] {
        expect_revoked(&run, prefix);
    }
    run.expect("RESET_NEXT_NOP", "0");
    run.expect("REBOUND_NOP", "0");
    // FREE, EXIT and RESET before the counters were read (UNBIND after).
    assert_eq!(
        run.fact_u64("P2P_REVOCATIONS") - run.fact_u64("BASE_P2P_REVOCATIONS"),
        3,
        "p2p_revocations counts the free callbacks"
    );

    // dma-buf: P2P attachment mapped at BAR2 + offset, plain refused, revoke.
    run.expect("DMABUF_STATUS", "0");
    run.expect("DMABUF_P2P_ATTACH_RET", "0");
    run.expect("DMABUF_P2P_MAP_RET", "0");
    assert_eq!(
        run.fact_u64("DMABUF_P2P_DMA0"),
        bar2_address(&run, "DMABUF"),
        "dma-buf DMA address"
    );
    assert_eq!(
        run.fact_u64("DMABUF_P2P_DMA_LEN"),
        run.fact_u64("DMABUF_ALLOC_SIZE"),
        "the mapping covers the allocation"
    );
    run.expect("DMABUF_PLAIN_ATTACH_RET", EOPNOTSUPP);
    run.expect("DMABUF_REVOKED_INVALIDATIONS", "1");
    run.expect("DMABUF_REVOKED_STILL_MAPPED", "0");
    run.expect("DMABUF_REVOKED_REMAP_RET", ENODEV);
    assert_eq!(
        run.fact_u64("DMABUF_REVOCATIONS") - run.fact_u64("BASE_DMABUF_REVOCATIONS"),
        1,
        "dmabuf_revocations counts the invalidated dma-buf"
    );

    run.expect("RMMOD_STATUS", "0");
    run.expect("REFUSAL_DMESG", "0");
}

#[test]
fn peer_memory_refused_on_separate_root_ports() {
    let script = format!("{PRELUDE}{REFUSAL_SCRIPT}");
    let run = run_guest("separate-root-ports", &script, Boot::default());
    run.expect("MODPROBE_STATUS", "0");
    run.expect("RT_STATUS", "0");
    run.expect("RT_GET_RET", "0");
    run.expect("RT_MAP_RET", EINVAL);
    run.expect("RT_UNPIN_PUT_RET", "0");
    run.expect("RT_UNPIN_CALLBACKS", "0");
    assert!(
        run.fact_u64("RT_DMESG") >= 1,
        "dmesg gives the kernel's reason"
    );
    run.expect("DMABUF_STATUS", "0");
    run.expect("DMABUF_P2P_ATTACH_RET", EOPNOTSUPP);
    assert!(
        run.fact_u64("ALL_DMESG") > run.fact_u64("RT_DMESG"),
        "the dma-buf refusal also gives the kernel's reason"
    );
}
