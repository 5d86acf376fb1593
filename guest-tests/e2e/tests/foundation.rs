//! Issue 2's proof of the path, in one boot of the default lab: the NVMe
//! device served over vfio-user enumerates behind the PCIe switch with its
//! IDs and BAR sizes, a register round-trips through a trapped BAR and data
//! through an mmapped BAR, and MSI-X interrupts reach the guest.
//!
//! What it catches (a deliberately broken device it fails on): wrong class
//! or IDs in config space; a device not behind the switch; a BAR of the
//! wrong size, or a CMB BAR that is not 64-bit prefetchable; a trapped
//! register that does not round-trip, or a read-only one that takes
//! writes; an mmapped BAR that loses data (the wrong-seed check proves the
//! comparison can fail); MSI-X that is not enabled or whose admin or I/O
//! vectors never fire.

mod common;

use common::{run_guest, Boot};

/// The guest starts without the nvme driver (`p2plab.nonvme`) so the raw
/// BAR checks own the device; then the script loads the driver itself.
const SCRIPT: &str = r#"
set -u
bdf=""
for d in /sys/bus/pci/devices/*; do
  if [ "$(cat "$d/class")" = 0x010802 ]; then bdf=$(basename "$d"); break; fi
done
[ -n "$bdf" ] || { echo "no NVMe function found"; lspci -nn; exit 1; }
dev=/sys/bus/pci/devices/$bdf
echo "NVME_VENDOR=$(cat $dev/vendor)"
echo "NVME_DEVICE=$(cat $dev/device)"
echo "NVME_SUBSYS_VENDOR=$(cat $dev/subsystem_vendor)"
echo "NVME_CLASS=$(cat $dev/class)"

# Who sits above it: downstream port, upstream port, root port.
real=$(readlink -f "$dev")
down=$(dirname "$real"); up=$(dirname "$down"); root=$(dirname "$up")
echo "PARENT=$(cat $down/vendor):$(cat $down/device)"
echo "GRANDPARENT=$(cat $up/vendor):$(cat $up/device)"
echo "ROOT_PORT=$(cat $root/vendor):$(cat $root/device)"
lspci -nn -t

# BAR sizes from the resource table (start end flags per line).
n=0
while read -r start end flags; do
  if [ "$start" != 0x0000000000000000 ]; then
    echo "BAR${n}_SIZE=$(( end - start + 1 ))"
    echo "BAR${n}_FLAGS=$flags"
  fi
  n=$((n + 1))
  [ $n -ge 6 ] && break
done < "$dev/resource"

setpci -s "$bdf" COMMAND=0x0006
# Trapped BAR0: NVMe registers. VS is read-only; AQA is read-write.
echo "REG_VS=$(p2plab-pcimem $dev/resource0 read32 0x8)"
p2plab-pcimem $dev/resource0 write32 0x24 0x001f003f
echo "REG_AQA=$(p2plab-pcimem $dev/resource0 read32 0x24)"
p2plab-pcimem $dev/resource0 write32 0x24 0
echo "REG_AQA_CLEARED=$(p2plab-pcimem $dev/resource0 read32 0x24)"

# mmapped BAR2: the CMB, memory QEMU maps from the server's memfd.
if p2plab-pcimem $dev/resource2 fill 0x100000 0x100000 0x5eed && \
   p2plab-pcimem $dev/resource2 check 0x100000 0x100000 0x5eed; then
  echo "CMB_ROUNDTRIP=ok"
else
  echo "CMB_ROUNDTRIP=failed"
fi
if p2plab-pcimem $dev/resource2 check 0x100000 0x100000 0x5eee 2>/dev/null; then
  echo "CMB_WRONG_SEED=accepted"
else
  echo "CMB_WRONG_SEED=rejected"
fi

# Now the real driver: MSI-X vectors must fire for admin and I/O queues.
for m in nvme-auth nvme-keyring nvme-core nvme; do modprobe $m 2>/dev/null; done
for i in $(seq 1 200); do [ -b /dev/nvme0n1 ] && break; sleep 0.1; done
[ -b /dev/nvme0n1 ] && echo "BLOCK_DEVICE=present" || echo "BLOCK_DEVICE=missing"
dd if=/dev/nvme0n1 of=/dev/null bs=4096 count=256 iflag=direct 2>/dev/null
echo "MSIX_CAP=$(lspci -vv -s $bdf | grep -c 'MSI-X: Enable+')"
awk '/nvme0q/ { s = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; else break;
                 if (s > 0) fired++; total++ }
     END { print "NVME_VECTORS=" total; print "NVME_VECTORS_FIRED=" fired + 0 }' /proc/interrupts
grep -m1 nvme0q0 /proc/interrupts | grep -q PCI-MSIX && echo "ADMIN_IRQ_KIND=msix" || echo "ADMIN_IRQ_KIND=other"
dmesg | grep -i -E 'nvme|vfio' | tail -n 20
exit 0
"#;

#[test]
fn nvme_enumerates_behind_the_switch_and_its_bars_and_msix_work() {
    let run = run_guest(
        "lab",
        SCRIPT,
        Boot {
            append: vec!["p2plab.nonvme".into()],
            ..Boot::default()
        },
    );

    // Identity: an NVMe function (class 01:08:02).
    run.expect("NVME_CLASS", "0x010802");
    assert!(run.fact("NVME_VENDOR").starts_with("0x"), "vendor id");

    // Behind the switch: xio3130 downstream (104c:8233), x3130 upstream
    // (104c:8232), QEMU's pcie-root-port (1b36:000c).
    run.expect("PARENT", "0x104c:0x8233");
    run.expect("GRANDPARENT", "0x104c:0x8232");
    run.expect("ROOT_PORT", "0x1b36:0x000c");

    // BARs: registers (at least 16 KiB) and a 64 MiB 64-bit prefetchable CMB.
    assert!(run.fact_u64("BAR0_SIZE") >= 16 * 1024);
    assert_eq!(run.fact_u64("BAR2_SIZE"), 64 << 20);
    let cmb_flags = run.fact_u64("BAR2_FLAGS");
    assert_ne!(
        cmb_flags & 0x2000,
        0,
        "BAR2 must be prefetchable (flags {cmb_flags:#x})"
    );
    assert_ne!(
        cmb_flags & 0x0010_0000,
        0,
        "BAR2 must be 64-bit (flags {cmb_flags:#x})"
    );

    // Trapped BAR0 round trip.
    let vs = run.fact_u64("REG_VS");
    assert!(vs >= 0x0001_0400, "NVMe version {vs:#x} below 1.4");
    run.expect("REG_AQA", "0x1f003f");
    run.expect("REG_AQA_CLEARED", "0x0");

    // mmapped BAR2 round trip, and the check really compares.
    run.expect("CMB_ROUNDTRIP", "ok");
    run.expect("CMB_WRONG_SEED", "rejected");

    // MSI-X: the driver uses it and the vectors fire.
    run.expect("BLOCK_DEVICE", "present");
    run.expect("MSIX_CAP", "1");
    run.expect("ADMIN_IRQ_KIND", "msix");
    assert!(
        run.fact_u64("NVME_VECTORS") >= 2,
        "admin + at least one I/O queue vector"
    );
    assert!(
        run.fact_u64("NVME_VECTORS_FIRED") >= 2,
        "admin and I/O vectors both fired"
    );

    // The server's log decodes what happened.
    let log = run.file("nvme0.log");
    assert!(!log.is_empty(), "nvme0.log is empty");
}
