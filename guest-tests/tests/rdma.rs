//! GPUDirect-RDMA-style transfers through two p2plab-nic devices (issue
//! 14), in the `rdma` topology: nvme0, gpu0, nic0 and nic1 under one
//! switch, nic0's wire connected to nic1's through a unix socket in the
//! run folder.
//!
//! One boot:
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

mod common;

use common::{counter, run_guest, stats, Boot};

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

const SCRIPT: &str = r#"
set -u
say() { echo "$1=$2"; }
# facts PREFIX: the tool's key=value lines as PREFIX_KEY=value facts.
facts() { while IFS== read -r k v; do echo "$1_$(echo "$k" | tr a-z A-Z)=$v"; done; }

say NIC_DEVICES "$(ls /dev | grep -c '^p2plab-nic[0-9]')"
i=0
until p2plab-nic-tool info /dev/p2plab-nic0 | grep -qx link_up=1 &&
      p2plab-nic-tool info /dev/p2plab-nic1 | grep -qx link_up=1; do
  sleep 0.2; i=$((i+1)); [ $i -lt 150 ] || break
done
p2plab-nic-tool info /dev/p2plab-nic0 | facts INFO0
p2plab-nic-tool info /dev/p2plab-nic1 | facts INFO1

# --- 1. RAM to RAM over the wire ---------------------------------------------
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size @SIZE@ --post @POST@ --seed 7 > /tmp/x1
say XFER_EXIT $?
facts XFER < /tmp/x1

# A post of more frames than the ring has descriptors (1024 RAM pages,
# 256 descriptors) can never fit: E2BIG at once, not a retry forever.
timeout 60 p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size 4M --post 4M > /tmp/xbig 2>/dev/null
say BIG_EXIT $?
facts BIG < /tmp/xbig

# --- 2. one corrupted frame ----------------------------------------------------
p2plab-ctl nic0 inject corrupt,count=1 >/dev/null; say INJECT_EXIT $?
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size 1M --post 256K --seed 9 > /tmp/x2
say CORRUPT_EXIT $?
facts CORRUPT < /tmp/x2

# --- 3. close with posts outstanding, then a clean transfer --------------------
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size 4M --post 256K --abandon > /tmp/x3a
say ABANDON_EXIT $?
facts ABANDON < /tmp/x3a
# Frames of the abandoned transfer still on the wire reach a closed nic1,
# whose receiver is off: it drops them (polling every 20 ms).
sleep 1
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size 1M --post 256K --seed 11 > /tmp/x3
say AFTER_EXIT $?
facts AFTER < /tmp/x3

# --- 4. GPU memory -> nic0 -> wire -> nic1 -> GPU memory ----------------------
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size @GPU_SIZE@ --post @GPU_POST@ --seed 13 > /tmp/g1
say GPU_EXIT $?
facts GPU < /tmp/g1

# --- 5. revocation: the destination VRAM is freed with receives outstanding --
# quiesced N: "DMA quiesced" lines of p2plab-nicN so far.
quiesced() {
  bdf=$(basename "$(readlink -f /sys/class/p2plab-nic/p2plab-nic$1/device)")
  dmesg | grep "$bdf" | grep -c 'revoked by the GPU driver; DMA quiesced'
}
base0=$(quiesced 0); base1=$(quiesced 1)
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size @REVOKE_SIZE@ --post @GPU_POST@ --free-dst-after 2 --seed 17 > /tmp/r1
say REVOKE_EXIT $?
facts REVOKE < /tmp/r1
say REVOKE_LINES_NIC0 $(( $(quiesced 0) - base0 ))
say REVOKE_LINES_NIC1 $(( $(quiesced 1) - base1 ))
sleep 1
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size @AFTER_SIZE@ --post @GPU_POST@ --seed 19 > /tmp/g2
say GPU_AFTER_EXIT $?
facts GPU_AFTER < /tmp/g2

# --- 6. the same through dma-buf: exported by the GPU driver, imported by fd --
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src dmabuf --dst dmabuf \
  --size @DMABUF_SIZE@ --post @GPU_POST@ --seed 23 > /tmp/b1
say DMABUF_EXIT $?
facts DMABUF < /tmp/b1
invalidated() {
  bdf=$(basename "$(readlink -f /sys/class/p2plab-nic/p2plab-nic$1/device)")
  dmesg | grep "$bdf" | grep -c 'invalidated by its exporter; DMA quiesced'
}
base0=$(invalidated 0); base1=$(invalidated 1)
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src dmabuf --dst dmabuf \
  --size @REVOKE_SIZE@ --post @GPU_POST@ --free-dst-after 2 --seed 29 > /tmp/b2
say DMABUF_REVOKE_EXIT $?
facts DMABUF_REVOKE < /tmp/b2
say DMABUF_REVOKE_LINES_NIC0 $(( $(invalidated 0) - base0 ))
say DMABUF_REVOKE_LINES_NIC1 $(( $(invalidated 1) - base1 ))
sleep 1
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src dmabuf --dst dmabuf \
  --size @AFTER_SIZE@ --post @GPU_POST@ --seed 31 > /tmp/b3
say DMABUF_AFTER_EXIT $?
facts DMABUF_AFTER < /tmp/b3

# --- 7. revocation by unbinding the GPU driver mid-transfer, then rebinding ---
gpubdf=$(basename "$(readlink -f /sys/class/p2plab-gpu/p2plab-gpu0/device)")
base0=$(quiesced 0); base1=$(quiesced 1)
rm -f /tmp/go
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size @GPU_SIZE@ --post @GPU_POST@ --signal-after 2 /tmp/go --seed 37 > /tmp/u1 &
pid=$!
i=0; until [ -e /tmp/go ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1200 ] || break; done
echo "$gpubdf" > /sys/bus/pci/drivers/p2plab_gpu/unbind; say UNBIND_STATUS $?
wait $pid; say UNBIND_EXIT $?
facts UNBIND < /tmp/u1
say UNBIND_LINES_NIC0 $(( $(quiesced 0) - base0 ))
say UNBIND_LINES_NIC1 $(( $(quiesced 1) - base1 ))
echo "$gpubdf" > /sys/bus/pci/drivers/p2plab_gpu/bind; say REBIND_STATUS $?
sleep 1
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size @AFTER_SIZE@ --post @GPU_POST@ --seed 41 > /tmp/u2
say REBIND_XFER_EXIT $?
facts REBIND_XFER < /tmp/u2

say KERNEL_COMPLAINTS "$(dmesg | grep -c -E 'BUG:|WARNING:|Oops|Call Trace')"
dmesg | grep p2plab_nic | tail -n 10
exit 0
"#;

#[test]
fn ram_to_ram_over_the_wire() {
    let script = SCRIPT
        .replace("@SIZE@", &SIZE.to_string())
        .replace("@POST@", &POST.to_string())
        .replace("@GPU_SIZE@", &GPU_SIZE.to_string())
        .replace("@GPU_POST@", &GPU_POST.to_string())
        .replace("@REVOKE_SIZE@", &REVOKE_SIZE.to_string())
        .replace("@AFTER_SIZE@", &AFTER_SIZE.to_string())
        .replace("@DMABUF_SIZE@", &DMABUF_SIZE.to_string());
    let run = run_guest("rdma", &script, Boot::default());
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
}

const REFUSAL_SCRIPT: &str = r#"
set -u
say() { echo "$1=$2"; }
facts() { while IFS== read -r k v; do echo "$1_$(echo "$k" | tr a-z A-Z)=$v"; done; }
base=$(dmesg | grep -c 'cannot be used for peer-to-peer DMA')
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --src gpu --dst gpu --size 1M --post 1M > /tmp/d
say REFUSE_EXIT $?
facts REFUSE < /tmp/d
say REFUSE_DMESG $(( $(dmesg | grep -c 'cannot be used for peer-to-peer DMA') - base ))
say REFUSE_NIC_LINES "$(dmesg | grep -c 'p2plab_nic.*GPU memory refused for peer DMA')"
# The NIC itself works (RAM, over its loopback wire).
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --size 1M --post 256K > /tmp/r
say RAM_EXIT $?
facts RAM < /tmp/r
exit 0
"#;

/// (d) Refusal: nic0 and gpu0 on separate root ports (`rdma-separate`).
/// Registering GPU memory with the NIC fails with EINVAL because the
/// kernel's P2P distance check refuses the pair, dmesg gives the kernel's
/// reason, and the NIC still moves RAM. Catches: a peer-memory API or NIC
/// driver that hands out addresses the kernel would refuse.
#[test]
fn gpu_memory_refused_on_separate_root_ports() {
    let run = run_guest("rdma-separate", REFUSAL_SCRIPT, Boot::default());
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
}
