//! GPUDirect-RDMA-style transfers through two p2plab-nic devices (issue
//! 14), in the `rdma` topology: nvme0, gpu0, nic0 and nic1 under one
//! switch, nic0's wire connected to nic1's through a unix socket in the
//! run folder.
//!
//! Two boots, each shared with the GPU peer-memory checks that were the
//! `peermem` suite (after the NIC checks, in their own bash, facts
//! prefixed `PM_`; see "Peer memory" below) and then with the checks of
//! NVIDIA's peer-memory API (facts prefixed `NV_`; see "NVIDIA's API").
//!
//! `rdma_and_peer_memory_under_one_switch`, one boot of `rdma`:
//! 1. RAM -> nic0 -> wire -> nic1 -> RAM, 8 MiB in 256 KiB posts, with the
//!    p2plab_nic driver and p2plab-nic-tool: every post completes OK, the
//!    destination matches byte for byte, and the servers' counters agree
//!    with the frames the driver posted (one frame per 4 KiB page of a RAM
//!    region), moved through mmapped guest RAM (no DMA messages).
//!    Catches: a NIC that drops, reorders or truncates frames, a wire that
//!    loses data between two server processes, a driver that cuts posts
//!    wrong, completes them early or loses completions. A post of more
//!    frames than the ring holds fails with E2BIG (catches a driver that
//!    answers ENOSPC, which callers retry forever).
//! 2. The guest arms `corrupt,count=1` on nic0 through its control port:
//!    the next transfer reports exactly one failed receive with BAD_FCS
//!    (0x4), and nic1 counts one FCS error. Catches: corruption that goes
//!    unnoticed, or a NIC that stops after a bad frame.
//! 3. Closing both devices with posts outstanding (`--abandon`) quiesces
//!    the rings: a transfer right after succeeds, with no stale frame in
//!    it, and the kernel log stays clean. Catches: a release path that
//!    leaves the engines running on freed pages or the rings wedged.
//! 4. GPU memory -> nic0 -> wire -> nic1 -> GPU memory, 256 MiB: regions
//!    registered through the GPU driver's peer-memory API (mapped as bus
//!    addresses under the switch), the source filled and both sides
//!    checksummed by the GPU's engine; the CRCs match and the servers'
//!    counters show the payload went to and from gpu0's BAR, not RAM, by
//!    the zero-copy peer path (no DMA message through QEMU).
//!    Catches: a NIC or driver that bounces through RAM, a peer mapping
//!    with wrong addresses, frames cut differently on both sides, a NIC
//!    server that does not join the peer registry.
//! 5. Revocation: the destination allocation is freed on the GPU while
//!    receives are outstanding. The NIC driver's free callback quiesces
//!    nic1 (one "DMA quiesced" line; nic0's source is revoked the same way
//!    when the tool exits), outstanding receives complete as
//!    revoked, the next post on the region fails with ENOLINK, the kernel
//!    log stays clean, and a new GPU transfer works. Catches: a callback
//!    that does not stop DMA, a region still usable after revocation, a
//!    driver wedged by it.
//! 6. The same through dma-buf (64 MiB, then a revocation by FREE and a
//!    transfer after it): the GPU driver exports each allocation, the NIC
//!    driver imports it by fd with allow_peer2peer, and the exporter's
//!    invalidate_mappings revokes it. Catches: an importer that ignores
//!    invalidation or maps a non-P2P attachment.
//! 7. Unbinding the GPU driver mid-transfer (256 MiB, GPU memory both
//!    sides): both regions are revoked (one quiesce per NIC), the next post
//!    fails with ENOLINK, and after a rebind a GPU transfer works. Catches:
//!    a NIC driver that keeps DMAing into a GPU whose driver went away.
//!
//! `gpu_memory_refused_on_separate_root_ports`, one boot of
//! `rdma-separate`: see the test.
//!
//! Peer memory: the p2plab_gpu driver's peer-memory API
//! (`p2plab_p2p.h`, shaped like nvidia_p2p_*) and its dma-buf exporter,
//! driven by a real importer, the in-tree test module p2plab_p2p_test.ko,
//! through `p2plab-gpu-tool p2p-scenario` (one line per fact). It runs
//! after the NIC checks of each boot; the GPU they used is rebound and
//! idle by then, and every counter it reads is a delta from its own start.
//!
//! In the `rdma` boot (NVMe as the named peer under the same switch) it
//! catches:
//! - get/map returning wrong addresses: the tool pins all but the first
//!   page of an allocation that a spacer put past VRAM offset 0; the page
//!   table's physical pages and the peer's DMA addresses must both start at
//!   BAR2 (sysfs `resource`; on q35 the bus address equals it) plus the
//!   allocation's VRAM offset plus one page, be contiguous per 4 KiB page,
//!   and the map type must be BUS_ADDR;
//! - a put_pages that fails or runs the callback anyway (round trip), and
//!   an API that lets misuse through: put_pages while a DMA mapping exists
//!   must fail with EBUSY, free_page_table outside a callback with EINVAL;
//! - a driver that forgets an importer when the memory goes away: the free
//!   callback must run exactly once, in process context, on FREE, on the
//!   owner's process exit, on a function reset and on unbind, and the
//!   driver's `p2p_revocations` counter must count them;
//! - a dma-buf exporter that lets non-P2P importers attach, maps to wrong
//!   addresses, or keeps mapping after a revoke: the P2P attachment maps
//!   BAR2 + offset for the whole size, the plain one is refused with
//!   EOPNOTSUPP, FREE, a function reset and unbind each invalidate the
//!   mapping (invalidate_mappings, the former move_notify) and a new map
//!   fails with ENODEV;
//! - oopses and warnings: the clean-boot kernel-log check of every boot.
//!
//! In the `rdma-separate` boot (nic0 as the named peer, on its own root
//! port) it catches an API that hands out addresses the kernel's P2P
//! distance check refuses: dma_map_pages must fail with EINVAL, the
//! dma-buf attach with EOPNOTSUPP, and dmesg must carry the kernel's
//! reason for each.
//!
//! NVIDIA's API: the `nvidia_p2p_*` calls p2plab_gpu exports with
//! nv-p2p.h's names, signatures, structures and version numbers, driven by
//! nv_p2p_test.ko, a module written as a third-party driver for NVIDIA
//! GPUs is (it includes our nv-p2p.h and links against p2plab_gpu's
//! Module.symvers), through `nv-p2p-test-tool PEER SIZE ACTION PREFIX`.
//! It runs last in each boot, on the GPU the peer-memory part rebound.
//!
//! In the `rdma` boot (NVMe as the named peer under the switch) it catches:
//! - a table or mapping a third-party driver would misread: page table
//!   version 0x00020000 and DMA mapping version 0x00020003 (both
//!   `*_VERSION_COMPATIBLE`), page size `NVIDIA_P2P_PAGE_SIZE_64KB` in both,
//!   one entry per 64 KiB of the pinned range (all but the first GPU page
//!   of an allocation a spacer put past VRAM offset 0, at a 64 KiB-aligned
//!   user address), physical and DMA addresses at BAR2 + the allocation's
//!   offset + 64 KiB and contiguous per 64 KiB page, the mapping's
//!   `pci_dev` the peer, `gpu_uuid` the board's (sysfs `uuid`), flags 0,
//!   and the GPU's count of bus-address mappings (map type BUS_ADDR) up
//!   by one per mapping;
//! - bad arguments let through: a misaligned address or length, length 0,
//!   no callback, no callback data, a p2p token, RAM, unknown persistent
//!   flags, a NULL peer all give EINVAL; unmapping for another peer, putting at another
//!   address or with the other put all give EINVAL and free nothing;
//!   FORCE_BAR1_MAPPING tables refuse DMA mapping with ENOTSUPP (-524);
//!   a second unmap and a put of NULL give 0; put_pages releases a mapping
//!   left behind (the GPU's live pin and mapping counts come back to where
//!   they were);
//! - a driver that forgets an importer when the memory goes away, or gets
//!   NVIDIA's ownership wrong: on FREE, the owner's exit, a function reset
//!   and unbind the free callback runs exactly once, in process context,
//!   with the table still whole; free_dma_mapping and free_page_table
//!   there return 0; afterwards put_pages with the old pointer returns 0;
//!   `p2p_revocations` counts the callbacks;
//! - persistent pins that are revoked or leak: after FREE the table is
//!   intact, no callback ran and the next allocation does not get its VRAM;
//!   put_pages_persistent returns 0 and the allocation after it does; a
//!   function reset tears a persistent pin down with one warning in dmesg,
//!   and unmapping and putting it afterwards still return 0.
//!
//! In the `rdma-separate` boot (nic0 on its own root port) pinning works
//! but nvidia_p2p_dma_map_pages refuses with ENOTSUPP and the kernel's
//! reason in dmesg.

mod common;

use common::{counter, run_guest, shared_boot_script, stats, Boot, GuestRun};
use p2plab_lab::{GuestControl, GuestScript};

const SIZE: u64 = 8 << 20;
const POST: u64 = 256 << 10;
const PAGE: u64 = 4096;
/// GPU to GPU: 256 MiB in 4 MiB posts of 64 KiB frames (the default MTU).
const GPU_SIZE: u64 = 256 << 20;
const GPU_POST: u64 = 4 << 20;
const MTU: u64 = 64 << 10;
const REVOKE_SIZE: u64 = 64 << 20;
const AFTER_SIZE: u64 = 16 << 20;
const DMABUF_SIZE: u64 = 64 << 20;
/// enum pci_p2pdma_map_type in the 7.3 guest kernel.
const MAP_TYPE_BUS_ADDR: &str = "3";
/// ENOLINK.
const ENOLINK: &str = "67";
/// E2BIG.
const E2BIG: &str = "7";
/// The named peers of the peer-memory checks (`PEER` of
/// `guest/lib/peer-memory.sh`): the NVMe controller, and nic0 found
/// through its driver (QEMU's default e1000e is a NIC too).
const NVME_PEER: &str = "nvme";
const NIC0_PEER: &str = "nic0";

const EINVAL: &str = "-22";
const EBUSY: &str = "-16";
const ENODEV: &str = "-19";
const EOPNOTSUPP: &str = "-95";
/// The kernel's ENOTSUPP, which NVIDIA's driver returns for unsupported
/// requests.
const ENOTSUPP: &str = "-524";
/// NVIDIA's GPU page.
const GPU_PAGE: u64 = 64 << 10;
/// nv-p2p.h's versions and `NVIDIA_P2P_PAGE_SIZE_64KB`.
const NV_PAGE_TABLE_VERSION: &str = "0x00020000";
const NV_DMA_MAPPING_VERSION: &str = "0x00020003";
const NV_PAGE_SIZE_64KB: &str = "1";

/// The peer-memory part of a boot, the script `name` with `text`; `peer`
/// names the peer device.
fn peer_memory_script(name: &str, text: &str, peer: &str) -> GuestScript {
    GuestScript::new(name, text)
        .lib(
            "peer-memory.sh",
            include_str!("../guest/lib/peer-memory.sh"),
        )
        .var("PEER", peer)
}

/// The NVIDIA-API part of a boot, the script `name` with `text`; `peer`
/// names the peer device.
fn nv_p2p_script(name: &str, text: &str, peer: &str) -> GuestScript {
    peer_memory_script(name, text, peer)
}

/// The address a fact's allocation starts at in BAR2.
fn bar2_address(run: &GuestRun, prefix: &str) -> u64 {
    run.fact_u64("BAR2_START") + run.fact_u64(&format!("{prefix}_ALLOC_OFFSET"))
}

/// The tool pins all but the first page of an allocation made after a
/// 1 MiB spacer: offsets inside VRAM and inside the allocation both count.
fn expect_pinned(run: &GuestRun, prefix: &str) {
    run.expect(&format!("{prefix}_GET_RET"), "0");
    run.expect(&format!("{prefix}_MAP_RET"), "0");
    run.expect(&format!("{prefix}_PAGE_SIZE"), "4096");
    assert_ne!(
        run.fact_u64(&format!("{prefix}_ALLOC_OFFSET")),
        0,
        "{prefix}: the spacer puts the allocation past VRAM offset 0"
    );
    let size = run.fact_u64(&format!("{prefix}_ALLOC_SIZE"));
    assert_eq!(
        run.fact_u64(&format!("{prefix}_ENTRIES")),
        size / 4096 - 1,
        "{prefix}: one entry per pinned page"
    );
    assert_eq!(
        run.fact_u64(&format!("{prefix}_PT_VRAM_OFFSET")),
        run.fact_u64(&format!("{prefix}_ALLOC_OFFSET")) + 4096,
        "{prefix}: the table starts at the pinned address"
    );
    let want = bar2_address(run, prefix) + 4096;
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
fn rdma_and_peer_memory_under_one_switch() {
    let rdma = GuestScript::new("rdma.sh", include_str!("../guest/rdma.sh"))
        .var("SIZE", SIZE)
        .var("POST", POST)
        .var("GPU_SIZE", GPU_SIZE)
        .var("GPU_POST", GPU_POST)
        .var("REVOKE_SIZE", REVOKE_SIZE)
        .var("AFTER_SIZE", AFTER_SIZE)
        .var("DMABUF_SIZE", DMABUF_SIZE);
    let peer_memory = peer_memory_script(
        "peer-memory-switch.sh",
        include_str!("../guest/peer-memory-switch.sh"),
        NVME_PEER,
    );
    let nv = nv_p2p_script(
        "nv-p2p-switch.sh",
        include_str!("../guest/nv-p2p-switch.sh"),
        NVME_PEER,
    );
    let script = shared_boot_script(&[("", &rdma), ("PM_", &peer_memory), ("NV_", &nv)]);
    // The guest arms the corrupted frame on nic0 itself.
    let boot = Boot {
        guest_control: GuestControl::Devices(vec!["nic0".into()]),
        ..Boot::default()
    };
    let run = run_guest("rdma", &script, boot);
    run.expect("NIC_DEVICES", "2");
    run.expect("INFO0_LINK_UP", "1");
    run.expect("INFO1_LINK_UP", "1");

    // 1. RAM to RAM.
    run.expect("XFER_EXIT", "0");
    run.expect("BIG_EXIT", "1");
    run.expect("BIG_POST_ERRNO", E2BIG);
    run.expect("XFER_VERIFY", "ok");
    run.expect("XFER_MISMATCHED_BYTES", "0");
    let posts = SIZE / POST;
    let frames = SIZE / PAGE;
    assert_eq!(run.fact_u64("XFER_TX_DONE"), posts);
    assert_eq!(run.fact_u64("XFER_RX_DONE"), posts);
    assert_eq!(run.fact_u64("XFER_TX_BYTES"), SIZE);
    assert_eq!(run.fact_u64("XFER_RX_BYTES"), SIZE);
    assert_eq!(run.fact_u64("XFER_TX_FRAMES"), frames);
    assert_eq!(run.fact_u64("XFER_RX_FRAMES"), frames);
    assert_eq!(run.fact_u64("XFER_TX_ERRORS"), 0);
    assert_eq!(run.fact_u64("XFER_RX_ERRORS"), 0);

    // 2. One corrupted frame: one failed receive, BAD_FCS.
    run.expect("INJECT_EXIT", "0");
    run.expect("CORRUPT_EXIT", "1");
    run.expect("CORRUPT_TX_ERRORS", "0");
    run.expect("CORRUPT_RX_ERRORS", "1");
    run.expect("CORRUPT_FIRST_ERROR", "0x4");
    run.expect("CORRUPT_RX_DONE", &((1u64 << 20) / POST).to_string());

    // 3. Posts abandoned at close, then a clean transfer.
    run.expect("ABANDON_EXIT", "0");
    assert!(run.fact_u64("ABANDON_ABANDONED_POSTS") > 0);
    run.expect("AFTER_EXIT", "0");
    run.expect("AFTER_VERIFY", "ok");
    run.expect("KERNEL_COMPLAINTS", "0");

    // 4. GPU to GPU through the peer-memory API, checked by the GPU's CRC.
    run.expect("GPU_EXIT", "0");
    run.expect("GPU_MAP_TYPE", MAP_TYPE_BUS_ADDR);
    run.expect("GPU_VERIFY", "ok");
    assert_eq!(run.fact("GPU_SRC_CRC"), run.fact("GPU_DST_CRC"));
    assert_eq!(run.fact_u64("GPU_RX_BYTES"), GPU_SIZE);
    assert_eq!(run.fact_u64("GPU_TX_FRAMES"), GPU_SIZE / MTU);
    assert_eq!(run.fact_u64("GPU_RX_FRAMES"), GPU_SIZE / MTU);

    // 5. Revocation: the free callback quiesced nic1 once, the next
    // receive post failed with ENOLINK, outstanding receives completed
    // as revoked, and both NICs work afterwards.
    run.expect("REVOKE_EXIT", "1");
    run.expect("REVOKE_POST_ERRNO", ENOLINK);
    assert!(run.fact_u64("REVOKE_FREED_AFTER_RX") >= 2);
    assert!(run.fact_u64("REVOKE_REVOKED_WCS") >= 1);
    run.expect("REVOKE_VERIFY", "skipped");
    // nic1's destination by the FREE; nic0's source at the tool's exit:
    // the exiting process's GPU file is released before its NIC files
    // (task work runs last-in first-out), which frees the allocation and
    // revokes the pin too.
    run.expect("REVOKE_LINES_NIC1", "1");
    run.expect("REVOKE_LINES_NIC0", "1");
    run.expect("GPU_AFTER_EXIT", "0");
    run.expect("GPU_AFTER_VERIFY", "ok");

    // 6. dma-buf: the same transfer and revocation, through the
    // exporter's invalidate_mappings instead of the free callback.
    run.expect("DMABUF_EXIT", "0");
    run.expect("DMABUF_VERIFY", "ok");
    assert_eq!(run.fact("DMABUF_SRC_CRC"), run.fact("DMABUF_DST_CRC"));
    assert_eq!(run.fact_u64("DMABUF_RX_FRAMES"), DMABUF_SIZE / MTU);
    run.expect("DMABUF_REVOKE_EXIT", "1");
    run.expect("DMABUF_REVOKE_POST_ERRNO", ENOLINK);
    assert!(run.fact_u64("DMABUF_REVOKE_REVOKED_WCS") >= 1);
    run.expect("DMABUF_REVOKE_LINES_NIC1", "1");
    run.expect("DMABUF_REVOKE_LINES_NIC0", "1");
    run.expect("DMABUF_AFTER_EXIT", "0");
    run.expect("DMABUF_AFTER_VERIFY", "ok");

    // 7. Unbinding the GPU driver mid-transfer revokes both regions (one
    // quiesce on each NIC), the next post fails with ENOLINK, and after a
    // rebind GPU transfers work again.
    run.expect("UNBIND_STATUS", "0");
    run.expect("UNBIND_EXIT", "1");
    run.expect("UNBIND_POST_ERRNO", ENOLINK);
    assert!(run.fact_u64("UNBIND_SIGNALLED_AFTER_RX") >= 2);
    run.expect("UNBIND_LINES_NIC0", "1");
    run.expect("UNBIND_LINES_NIC1", "1");
    run.expect("REBIND_STATUS", "0");
    run.expect("REBIND_XFER_EXIT", "0");
    run.expect("REBIND_XFER_VERIFY", "ok");

    // The servers' side: nic0 sent, nic1 received. The abandoned RAM
    // transfer and the revoked GPU one add frames in a known range (those
    // the engines took before the drivers stopped them), and what nic0
    // sent nic1 received or dropped while closed.
    let ram_frames = frames + 2 * ((1u64 << 20) / PAGE);
    let total_bytes = SIZE + 2 * (1 << 20);
    let abandoned_max = (4u64 << 20) / PAGE;
    let gpu_frames = (GPU_SIZE + 3 * AFTER_SIZE + DMABUF_SIZE) / MTU;
    let revoked_max = (2 * REVOKE_SIZE + GPU_SIZE) / MTU;
    let least = ram_frames + gpu_frames;
    let nic0 = stats(&run, "nic0");
    let nic1 = stats(&run, "nic1");
    let sent = counter(&nic0, "tx_packets");
    assert!(
        (least..=least + abandoned_max + revoked_max).contains(&sent),
        "{nic0}"
    );
    assert!(
        counter(&nic0, "tx_bytes") >= total_bytes + GPU_SIZE + 3 * AFTER_SIZE + DMABUF_SIZE,
        "{nic0}"
    );
    let received = counter(&nic1, "rx_packets");
    assert!(
        (least..=sent).contains(&received),
        "nic1 received {received} of {sent}: {nic1}"
    );
    assert_eq!(counter(&nic0, "wire_corrupts"), 1, "{nic0}");
    assert_eq!(counter(&nic1, "rx_fcs_errors"), 1, "{nic1}");
    assert_eq!(counter(&nic0, "rx_packets"), 0, "{nic0}");
    assert_eq!(counter(&nic1, "tx_packets"), 0, "{nic1}");
    assert_eq!(counter(&nic0, "tx_errors") + counter(&nic1, "rx_errors"), 1);
    assert_eq!(
        counter(&nic0, "ring_errors") + counter(&nic1, "ring_errors"),
        0
    );
    // Buffers in RAM: payload read by nic0 and written by nic1 through
    // the mmapped guest memory.
    assert!(
        counter(&nic0, "dma_mmap_read_bytes") >= total_bytes,
        "{nic0}"
    );
    assert!(
        counter(&nic1, "dma_mmap_write_bytes") >= total_bytes,
        "{nic1}"
    );

    // GPU memory: what the NICs moved for the GPU phases went to and from
    // gpu0's BAR, not RAM. RAM
    // saw only the RAM phases, the abandoned posts and descriptors.
    let gpu_min = GPU_SIZE + 3 * AFTER_SIZE + DMABUF_SIZE;
    let gpu_max = gpu_min + 2 * REVOKE_SIZE + GPU_SIZE;
    let in_range = |v: u64| (gpu_min..=gpu_max).contains(&v);
    assert!(in_range(counter(&nic0, "tx_peer_bar_bytes")), "{nic0}");
    assert!(in_range(counter(&nic1, "rx_peer_bar_bytes")), "{nic1}");
    // And they took the zero-copy peer path: straight into gpu0's VRAM
    // memfd, not a DMA message through QEMU.
    assert_eq!(counter(&nic0, "peer_path"), 1, "{nic0}");
    assert!(in_range(counter(&nic0, "dma_peer_read_bytes")), "{nic0}");
    assert!(in_range(counter(&nic1, "dma_peer_write_bytes")), "{nic1}");
    for (name, nic) in [("nic0", &nic0), ("nic1", &nic1)] {
        for dir in ["read", "write"] {
            let key = format!("dma_message_{dir}_bytes");
            assert_eq!(counter(nic, &key), 0, "{name} {key}: {nic}");
        }
    }
    let ram_slack = (4 << 20) + (1 << 20);
    assert!(
        counter(&nic0, "dma_mmap_read_bytes") <= total_bytes + ram_slack,
        "GPU payload read from RAM: {nic0}"
    );
    assert!(
        counter(&nic1, "dma_mmap_write_bytes") <= total_bytes + ram_slack,
        "GPU payload written to RAM: {nic1}"
    );

    check_peer_memory_in_the_switch(&run.part("PM_"));
    check_nv_api_in_the_switch(&run.part("NV_"));
}

/// (d) Refusal: nic0 and gpu0 on separate root ports (`rdma-separate`).
/// Registering GPU memory with the NIC fails with EINVAL because the
/// kernel's P2P distance check refuses the pair, dmesg gives the kernel's
/// reason, and the NIC still moves RAM. Catches: a peer-memory API or NIC
/// driver that hands out addresses the kernel would refuse.
#[test]
fn gpu_memory_refused_on_separate_root_ports() {
    let refusal = GuestScript::new("rdma-refused.sh", include_str!("../guest/rdma-refused.sh"));
    let peer_memory = peer_memory_script(
        "peer-memory-refused.sh",
        include_str!("../guest/peer-memory-refused.sh"),
        NIC0_PEER,
    );
    let nv = nv_p2p_script(
        "nv-p2p-refused.sh",
        include_str!("../guest/nv-p2p-refused.sh"),
        NIC0_PEER,
    );
    let script = shared_boot_script(&[("", &refusal), ("PM_", &peer_memory), ("NV_", &nv)]);
    let run = run_guest("rdma-separate", &script, Boot::default());
    run.expect("REFUSE_EXIT", "3");
    run.expect("REFUSE_REG_ERRNO", "22");
    assert!(
        run.fact_u64("REFUSE_DMESG") >= 1,
        "dmesg gives the kernel's reason"
    );
    run.expect("REFUSE_NIC_LINES", "1");
    run.expect("RAM_EXIT", "0");
    run.expect("RAM_VERIFY", "ok");
    let nic0 = stats(&run, "nic0");
    assert_eq!(counter(&nic0, "tx_peer_bar_bytes"), 0, "{nic0}");
    assert_eq!(counter(&nic0, "rx_packets"), (1 << 20) / PAGE, "{nic0}");

    check_peer_memory_refused(&run.part("PM_"));
    check_nv_api_refused(&run.part("NV_"));
}

/// The peer-memory checks of the `rdma` boot (see the header), NVMe as
/// the named peer under the same switch.
fn check_peer_memory_in_the_switch(run: &GuestRun) {
    run.expect("MODPROBE_STATUS", "0");

    // Round trip: get, map, unmap, put; no callback.
    run.expect("RT_STATUS", "0");
    expect_pinned(run, "RT");
    run.expect("RT_ALLOC_SIZE", &(16u64 << 20).to_string());
    run.expect("RT_UNPIN_PUT_RET", "0");
    run.expect("RT_UNPIN_CALLBACKS", "0");
    // Misuse refused, nothing freed: put_pages while mapped, and
    // free_page_table outside a free callback.
    run.expect("RT_UNPIN_PUT_MAPPED_RET", EBUSY);
    run.expect("RT_UNPIN_FREE_LIVE_RET", EINVAL);

    // Revocation on free, process exit, reset, unbind.
    for prefix in ["FREE", "EXIT", "RESET", "UNBIND"] {
        expect_revoked(run, prefix);
    }
    run.expect("RESET_NEXT_NOP", "0");
    run.expect("REBOUND_DRIVER", "p2plab_gpu");
    run.expect("REBOUND_DEVICES", "1");
    run.expect("REBOUND_NOP", "0");
    // FREE, EXIT and RESET before the counters were read (UNBIND after).
    assert_eq!(
        run.fact_u64("P2P_REVOCATIONS") - run.fact_u64("BASE_P2P_REVOCATIONS"),
        3,
        "p2p_revocations counts the free callbacks"
    );

    // dma-buf: P2P attachment mapped at BAR2 + offset, plain refused,
    // revoked on free; the same on a function reset and on unbind.
    for prefix in ["DMABUF", "DBRESET", "DBUNBIND"] {
        run.expect(&format!("{prefix}_STATUS"), "0");
        run.expect(&format!("{prefix}_P2P_MAP_RET"), "0");
        run.expect(&format!("{prefix}_REVOKED_INVALIDATIONS"), "1");
        run.expect(&format!("{prefix}_REVOKED_STILL_MAPPED"), "0");
        run.expect(&format!("{prefix}_REVOKED_REMAP_RET"), ENODEV);
    }
    run.expect("DMABUF_P2P_ATTACH_RET", "0");
    assert_ne!(run.fact_u64("DMABUF_ALLOC_OFFSET"), 0, "spacer");
    assert_eq!(
        run.fact_u64("DMABUF_P2P_DMA0"),
        bar2_address(run, "DMABUF"),
        "dma-buf DMA address"
    );
    assert_eq!(
        run.fact_u64("DMABUF_P2P_DMA_LEN"),
        run.fact_u64("DMABUF_ALLOC_SIZE"),
        "the mapping covers the allocation"
    );
    run.expect("DMABUF_PLAIN_ATTACH_RET", EOPNOTSUPP);
    run.expect("DBUNBIND_REBOUND_NOP", "0");
    // DMABUF and DBRESET before the counter was read (DBUNBIND after).
    assert_eq!(
        run.fact_u64("DMABUF_REVOCATIONS") - run.fact_u64("BASE_DMABUF_REVOCATIONS"),
        2,
        "dmabuf_revocations counts the invalidated dma-bufs"
    );

    run.expect("RMMOD_STATUS", "0");
    run.expect("REFUSAL_DMESG", "0");
}

/// The peer-memory refusal checks of the `rdma-separate` boot: nic0 as
/// the named peer, on another root port than gpu0.
fn check_peer_memory_refused(run: &GuestRun) {
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

/// A pin through NVIDIA's API: the page table and the DMA mapping as a
/// third-party driver reads them (see the header).
fn expect_nv_pinned(run: &GuestRun, prefix: &str) {
    let fact = |key: &str| format!("{prefix}_{key}");
    run.expect(&fact("GET_RET"), "0");
    run.expect(&fact("MAP_RET"), "0");
    run.expect(&fact("VA_ALIGNED"), "1");
    run.expect(&fact("VERSION"), NV_PAGE_TABLE_VERSION);
    run.expect(&fact("PT_COMPATIBLE"), "1");
    run.expect(&fact("PAGE_SIZE"), NV_PAGE_SIZE_64KB);
    run.expect(&fact("PT_FLAGS"), "0");
    let offset = run.fact_u64(&fact("ALLOC_OFFSET"));
    assert_ne!(offset, 0, "{prefix}: the spacer puts the allocation past 0");
    assert_eq!(offset % GPU_PAGE, 0, "{prefix}: VRAM in 64 KiB pages");
    let size = run.fact_u64(&fact("ALLOC_SIZE"));
    assert_eq!(
        run.fact_u64(&fact("ENTRIES")),
        size / GPU_PAGE - 1,
        "{prefix}: one entry per pinned 64 KiB page"
    );
    let sysfs_uuid = run.fact("SYSFS_UUID");
    assert_eq!(
        Some(run.fact(&fact("UUID"))),
        sysfs_uuid.strip_prefix("GPU-"),
        "{prefix}: the table names the board"
    );
    assert!(
        sysfs_uuid.starts_with("GPU-7032706c-6162-8"),
        "{sysfs_uuid}: \"p2plab\", version 8"
    );
    let want = run.fact_u64("BAR2_START") + offset + GPU_PAGE;
    assert_eq!(run.fact_u64(&fact("PHYS0")), want, "{prefix} phys");
    run.expect(&fact("PHYS_CONTIGUOUS"), "1");
    run.expect(&fact("DMA_VERSION"), NV_DMA_MAPPING_VERSION);
    run.expect(&fact("DMA_COMPATIBLE"), "1");
    run.expect(&fact("DMA_PAGE_SIZE"), NV_PAGE_SIZE_64KB);
    assert_eq!(
        run.fact_u64(&fact("DMA_ENTRIES")),
        run.fact_u64(&fact("ENTRIES")),
        "{prefix}: one address per page"
    );
    run.expect(&fact("DMA_PCI_DEV_OK"), "1");
    // Behind the switch: the BAR's PCI bus address, which on q35 is the
    // CPU's; the BUS_ADDR count (END_ below) tells the map type.
    assert_eq!(run.fact_u64(&fact("DMA0")), want, "{prefix} dma");
    run.expect(&fact("DMA_CONTIGUOUS"), "1");
}

/// NVIDIA's revocation: the callback ran once, in process context, with
/// the table whole, its free_* calls returned 0, and a put_pages of the
/// old pointer afterwards returns 0.
fn expect_nv_revoked(run: &GuestRun, prefix: &str) {
    let fact = |key: &str| format!("{prefix}_{key}");
    run.expect(&fact("STATUS"), "0");
    expect_nv_pinned(run, prefix);
    run.expect(&fact("AFTER_CALLBACKS"), "1");
    run.expect(&fact("AFTER_REVOKED"), "1");
    run.expect(&fact("AFTER_CALLBACK_IN_TASK"), "1");
    run.expect(&fact("AFTER_TABLE_OK_IN_CALLBACK"), "1");
    run.expect(&fact("AFTER_FREE_MAP_RET"), "0");
    run.expect(&fact("AFTER_FREE_TABLE_RET"), "0");
    run.expect(&fact("AFTER_TABLE_VALID"), "0");
    run.expect(&fact("FORGET_CALLBACKS"), "1");
    run.expect(&fact("FORGET_UNMAP_RET"), "0");
    run.expect(&fact("FORGET_PUT_RET"), "0");
}

/// The NVIDIA-API checks of the `rdma` boot (see the header), NVMe as the
/// named peer under the same switch.
fn check_nv_api_in_the_switch(run: &GuestRun) {
    run.expect("MODPROBE_STATUS", "0");
    run.expect("DEVICES", "1");

    // Round trip: get, map, unmap, put; no callback.
    run.expect("RT_STATUS", "0");
    expect_nv_pinned(run, "RT");
    run.expect("RT_ALLOC_SIZE", &(2u64 << 20).to_string());
    run.expect("RT_UNPIN_CALLBACKS", "0");
    run.expect("RT_UNPIN_TABLE_VALID", "1");
    run.expect("RT_UNPIN_UNMAP_RET", "0");
    run.expect("RT_UNPIN_PUT_RET", "0");

    // Bad arguments and misuse.
    run.expect("ARGS_STATUS", "0");
    run.expect("ARGS_VA_ALIGNED", "1");
    for key in [
        "GET_MISALIGNED_VA",
        "GET_MISALIGNED_LEN",
        "GET_ZERO_LEN",
        "GET_NO_CALLBACK",
        "GET_NO_DATA",
        "GET_TOKEN",
        "GET_RAM",
        "PERSISTENT_MISALIGNED",
        "PERSISTENT_BAD_FLAGS",
        "MAP_NULL_PEER",
        "UNMAP_OTHER_PEER",
        "PUT_WRONG_VA",
        "PUT_PERSISTENT_OF_PLAIN",
        "PUT_PLAIN_OF_PERSISTENT",
        "PUT_PERSISTENT_FLAGS",
        "FREE_TABLE_NULL",
        "FREE_MAP_NULL",
    ] {
        run.expect(&format!("ARGS_{key}"), EINVAL);
    }
    for key in [
        "GET_TWICE",
        "PERSISTENT_OK",
        "FORCE_BAR1_GET",
        "FORCE_BAR1_PUT",
        "MAP_OK",
        "UNMAP_OK",
        "UNMAP_AGAIN",
        "MAP_LEFT",
        "PUT_NULL",
        "PUT_WITH_MAP",
        "PUT_TWICE_RET",
        "PUT_PERSISTENT_OK",
    ] {
        run.expect(&format!("ARGS_{key}"), "0");
    }
    run.expect("ARGS_FORCE_BAR1_MAP", ENOTSUPP);
    // Nothing stays pinned or mapped: put_pages released the mapping left.
    for counter in ["P2P_PINS", "P2P_MAPS"] {
        assert_eq!(
            run.fact_u64(&format!("ARGS_{counter}")),
            run.fact_u64(&format!("BASE_{counter}")),
            "{counter} after ARGS"
        );
    }

    // Revocation on free, process exit, reset, unbind.
    for prefix in ["FREE", "EXIT", "RESET", "UNBIND"] {
        expect_nv_revoked(run, prefix);
    }
    run.expect("RESET_NEXT_NOP", "0");
    run.expect("REBOUND_DRIVER", "p2plab_gpu");
    run.expect("REBOUND_DEVICES", "1");
    run.expect("REBOUND_NOP", "0");

    // Persistent pins: FREE leaves them (and their VRAM) alone.
    run.expect("PFREE_STATUS", "0");
    expect_nv_pinned(run, "PFREE");
    run.expect("PFREE_AFTER_CALLBACKS", "0");
    run.expect("PFREE_AFTER_REVOKED", "0");
    run.expect("PFREE_AFTER_TABLE_VALID", "1");
    assert_ne!(
        run.fact_u64("PFREE_RETAINED_NEXT_OFFSET"),
        run.fact_u64("PFREE_ALLOC_OFFSET"),
        "VRAM of a freed allocation with a persistent pin handed out again"
    );
    run.expect("PFREE_FORGET_CALLBACKS", "0");
    run.expect("PFREE_FORGET_UNMAP_RET", "0");
    run.expect("PFREE_FORGET_PUT_RET", "0");
    assert_eq!(
        run.fact_u64("PFREE_RELEASED_NEXT_OFFSET"),
        run.fact_u64("PFREE_ALLOC_OFFSET"),
        "put_pages_persistent gives the VRAM back"
    );
    // A function reset takes it anyway, with one warning.
    run.expect("PRESET_STATUS", "0");
    expect_nv_pinned(run, "PRESET");
    run.expect("PRESET_AFTER_CALLBACKS", "0");
    run.expect("PRESET_AFTER_TABLE_VALID", "1");
    run.expect("PRESET_FORGET_UNMAP_RET", "0");
    run.expect("PRESET_FORGET_PUT_RET", "0");
    assert_eq!(
        run.fact_u64("PRESET_TORN_LINES") - run.fact_u64("BASE_TORN_LINES"),
        1,
        "one warning for the torn-down persistent pin"
    );
    run.expect("PRESET_NEXT_NOP", "0");

    // The GPU's counters before UNBIND: callbacks of FREE, EXIT, RESET;
    // every mapping (RT, two in ARGS, FREE, EXIT, PFREE, PRESET, RESET)
    // with PCI bus addresses; nothing left pinned or mapped.
    let delta = |counter: &str| {
        let read = |when: &str| run.fact_u64(&format!("{when}_{counter}")) as i64;
        read("END") - read("BASE")
    };
    assert_eq!(delta("P2P_REVOCATIONS"), 3, "p2p_revocations");
    assert_eq!(delta("P2P_BUS_ADDR_MAPS"), 8, "map type BUS_ADDR");
    assert_eq!(delta("P2P_PINS"), 0, "pins leaked");
    assert_eq!(delta("P2P_MAPS"), 0, "mappings leaked");

    run.expect("RMMOD_STATUS", "0");
}

/// The NVIDIA-API refusal of the `rdma-separate` boot: nic0 as the named
/// peer, on another root port than gpu0.
fn check_nv_api_refused(run: &GuestRun) {
    run.expect("MODPROBE_STATUS", "0");
    run.expect("RT_STATUS", "0");
    run.expect("RT_GET_RET", "0");
    run.expect("RT_MAP_RET", ENOTSUPP);
    run.expect("RT_UNPIN_CALLBACKS", "0");
    run.expect("RT_UNPIN_PUT_RET", "0");
    assert!(
        run.fact_u64("RT_DMESG") >= 1,
        "dmesg gives the kernel's reason"
    );
    run.expect("RMMOD_STATUS", "0");
}
