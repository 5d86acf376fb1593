#!/bin/bash
# The foundation suite's guest script (tests/foundation.rs), one boot of
# `lab`; the facts it reports are KEY=VALUE lines.
#
# The guest starts without the nvme driver (`p2plab.nonvme`) so the raw
# BAR checks own the device; then the script loads the driver itself.
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
for _ in $(seq 1 200); do [ -b /dev/nvme0n1 ] && break; sleep 0.1; done
[ -b /dev/nvme0n1 ] && echo "BLOCK_DEVICE=present" || echo "BLOCK_DEVICE=missing"
dd if=/dev/nvme0n1 of=/dev/null bs=4096 count=256 iflag=direct 2>/dev/null
echo "MSIX_CAP=$(lspci -vv -s $bdf | grep -c 'MSI-X: Enable+')"
awk '/nvme0q/ { s = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; else break;
                 if (s > 0) fired++; total++ }
     END { print "NVME_VECTORS=" total; print "NVME_VECTORS_FIRED=" fired + 0 }' /proc/interrupts
grep -m1 nvme0q0 /proc/interrupts | grep -q PCI-MSIX && echo "ADMIN_IRQ_KIND=msix" || echo "ADMIN_IRQ_KIND=other"
dmesg | grep -i -E 'nvme|vfio' | tail -n 20
exit 0
