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
//!    wrong, completes them early or loses completions.
//! 2. The guest arms `corrupt,count=1` on nic0 through its control port:
//!    the next transfer reports exactly one failed receive with BAD_FCS
//!    (0x4), and nic1 counts one FCS error. Catches: corruption that goes
//!    unnoticed, or a NIC that stops after a bad frame.
//! 3. Closing both devices with posts outstanding (`--abandon`) quiesces
//!    the rings: a transfer right after succeeds, with no stale frame in
//!    it, and the kernel log stays clean. Catches: a release path that
//!    leaves the engines running on freed pages or the rings wedged.

mod common;

use common::{counter, run_guest, stats, Boot};

const SIZE: u64 = 8 << 20;
const POST: u64 = 256 << 10;
const PAGE: u64 = 4096;

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

say KERNEL_COMPLAINTS "$(dmesg | grep -c -E 'BUG:|WARNING:|Oops|Call Trace')"
dmesg | grep p2plab_nic | tail -n 10
exit 0
"#;

#[test]
fn ram_to_ram_over_the_wire() {
    let script = SCRIPT
        .replace("@SIZE@", &SIZE.to_string())
        .replace("@POST@", &POST.to_string());
    let run = run_guest("rdma", &script, Boot::default());
    run.expect("NIC_DEVICES", "2");
    run.expect("INFO0_LINK_UP", "1");
    run.expect("INFO1_LINK_UP", "1");

    // 1. RAM to RAM.
    run.expect("XFER_EXIT", "0");
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

    // The servers' side: nic0 sent, nic1 received, through guest RAM.
    // The abandoned transfer adds an unknown number of frames (those the
    // engines took before the driver stopped them), never more than it
    // posted, and what nic0 sent nic1 received or discarded on reset.
    let total_frames = frames + 2 * ((1u64 << 20) / PAGE);
    let total_bytes = SIZE + 2 * (1 << 20);
    let abandoned_max = (4u64 << 20) / PAGE;
    let nic0 = stats(&run, "nic0");
    let nic1 = stats(&run, "nic1");
    let sent = counter(&nic0, "tx_packets");
    assert!(
        (total_frames..=total_frames + abandoned_max).contains(&sent),
        "{nic0}"
    );
    assert!(counter(&nic0, "tx_bytes") >= total_bytes, "{nic0}");
    let received = counter(&nic1, "rx_packets");
    assert!(
        (total_frames..=sent).contains(&received),
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
    // the mmapped guest memory, none through DMA messages.
    assert!(
        counter(&nic0, "dma_mmap_read_bytes") >= total_bytes,
        "{nic0}"
    );
    assert!(
        counter(&nic1, "dma_mmap_write_bytes") >= total_bytes,
        "{nic1}"
    );
    assert_eq!(counter(&nic0, "dma_message_read_bytes"), 0, "{nic0}");
    assert_eq!(counter(&nic1, "dma_message_write_bytes"), 0, "{nic1}");
    assert_eq!(counter(&nic0, "tx_peer_bar_bytes"), 0, "{nic0}");
    assert_eq!(counter(&nic1, "rx_peer_bar_bytes"), 0, "{nic1}");
}
