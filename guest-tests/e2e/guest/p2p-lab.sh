#!/bin/bash
# The p2p suite's guest script for `lab`
# (nvme_to_gpu_and_gpu_to_nvme_through_the_switch), booted with profile=2
# and devices/gpu/guest-driver/tests shared at /mnt/host.
# The status of `echo ... > /sys/...` is the status of that sysfs write.
# shellcheck disable=SC2320
# shellcheck source=SCRIPTDIR/lib/p2p.sh
. /run/p2plab/lib/p2p.sh
[ -n "$gpu_bdf" ] || { echo "no GPU"; lspci -nn; exit 1; }
gpu=/sys/bus/pci/devices/$gpu_bdf
echo "GPU_P2P_PUBLISHED=$(cat $gpu/p2pmem/published)"
echo "GPU_P2P_SIZE=$(cat $gpu/p2pmem/size)"
echo "GPU_P2P_AVAILABLE=$(cat $gpu/p2pmem/available)"
echo "GPU_P2P_ADDED=$(dmesg | grep -c "$gpu_bdf: added peer-to-peer DMA memory")"
sed -n 3p $gpu/resource | { read start end _; echo "GPU_BAR2_START=$start"; echo "GPU_BAR2_END=$end"; }

# 1. NVMe -> GPU: a known pattern on the namespace, read with O_DIRECT into
#    GPU p2pmem in 1 MiB chunks; the GPU's engine checksums the bytes in VRAM.
dd if=/dev/urandom of=/tmp/pattern bs=1M count=64 2>/dev/null
dd if=/tmp/pattern of=$ns bs=1M oflag=direct 2>/dev/null
echo "PATTERN_CRC=$(p2plab-gpu-tool crc32c /tmp/pattern)"
# Both devices trace this transfer, switched from inside the guest.
p2plab-ctl nvme0 trace on >/dev/null; echo "TRACE_ON_NVME0=$?"
p2plab-ctl gpu0 trace on >/dev/null; echo "TRACE_ON_GPU0=$?"
p2plab-p2pio --p2pmem $gpu_bdf read --dev $ns --len 64M --chunk 1M \
  --hook 'p2plab-gpu-tool checksum $P2P_BAR_OFFSET $P2P_LEN > /run/p2plab/n2g.crc' \
  > /run/p2plab/n2g.out 2>&1; echo "N2G_STATUS=$?"
p2plab-ctl nvme0 trace off >/dev/null; echo "TRACE_OFF_NVME0=$?"
p2plab-ctl gpu0 trace off >/dev/null; echo "TRACE_OFF_GPU0=$?"
sed 's/^/N2G_/' /run/p2plab/n2g.out
echo "N2G_GPU_CRC=$(cat /run/p2plab/n2g.crc)"

# The guest kernel's own profile (booted with profile=2) of 3 s of 1 MiB
# O_DIRECT reads into guest RAM: gigabytes, so the block layer and the
# page pinning get many ticks (RAM, so the peer counters stay exact).
p2plab-kprofile reset; echo "KPROFILE_RESET_STATUS=$?"
kprofile_start=$(date +%s%N)
fio --name=kprofile --filename=$ns --direct=1 --rw=read --bs=1M --iodepth=4 \
  --ioengine=libaio --size=64M --time_based --runtime=3 --output-format=terse \
  > /dev/null; echo "KPROFILE_FIO_STATUS=$?"
p2plab-kprofile top --count 100000 --json > /run/p2plab/kprofile.json; echo "KPROFILE_STATUS=$?"
echo "KPROFILE_MS=$((($(date +%s%N) - kprofile_start) / 1000000))"
echo "KPROFILE_CPUS=$(nproc)"
echo "KPROFILE_JSON=$(cat /run/p2plab/kprofile.json)"

# 5. Sizes: thousands of 4 KiB transfers, with two threads (6. load).
p2plab-p2pio --p2pmem $gpu_bdf read --dev $ns --len 16M --chunk 4K --threads 2 \
  --hook 'p2plab-gpu-tool checksum $P2P_BAR_OFFSET $P2P_LEN > /run/p2plab/small.crc' \
  > /run/p2plab/small.out 2>&1; echo "SMALL_STATUS=$?"
sed 's/^/SMALL_/' /run/p2plab/small.out
echo "SMALL_EXPECTED_CRC=$(p2plab-gpu-tool crc32c /tmp/pattern 0 16M)"
echo "SMALL_GPU_CRC=$(cat /run/p2plab/small.crc)"

# 2. GPU -> NVMe: the GPU's engine fills p2pmem in VRAM, O_DIRECT writes it
#    to the namespace at 128 MiB, four threads at once; normal I/O reads back.
p2plab-p2pio --p2pmem $gpu_bdf write --dev $ns --offset 128M --len 64M --chunk 1M --threads 4 \
  --hook 'p2plab-gpu-tool fill32 $P2P_BAR_OFFSET $P2P_LEN 0x5a17c0de && p2plab-gpu-tool checksum $P2P_BAR_OFFSET $P2P_LEN > /run/p2plab/g2n.crc' \
  > /run/p2plab/g2n.out 2>&1; echo "G2N_STATUS=$?"
sed 's/^/G2N_/' /run/p2plab/g2n.out
echo 3 > /proc/sys/vm/drop_caches
dd if=$ns of=/tmp/back bs=1M skip=128 count=64 2>/dev/null
echo "G2N_READBACK_CRC=$(p2plab-gpu-tool crc32c /tmp/back)"
echo "G2N_GPU_CRC=$(cat /run/p2plab/g2n.crc)"

# 7. A fault on the P2P path: every NVMe transfer into a peer BAR fails
#    (peer-fail) while RAM transfers go on. Data Transfer Error has no DNR,
#    so Linux retries max_retries times before the read fails with EIO.
p2plab-ctl nvme0 inject peer-fail >/dev/null; echo "PEERFAULT_ARM_STATUS=$?"
p2plab-p2pio --p2pmem $gpu_bdf read --dev $ns --len 4K --chunk 4K \
  > /run/p2plab/peerfault.out 2>&1; echo "PEERFAULT_P2P_STATUS=$?"
p2plab-ctl nvme0 status --json > /run/p2plab/peerfault-status.json; echo "PEERFAULT_CTL_STATUS=$?"
p2plab-ctl nvme0 clear >/dev/null; echo "PEERFAULT_CLEAR_STATUS=$?"
dd if=$ns of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; echo "PEERFAULT_RAM_STATUS=$?"
echo "PEERFAULT_MAX_RETRIES=$(cat /sys/module/nvme_core/parameters/max_retries)"
echo "PEERFAULT_DTE_LINES=$(dmesg | grep -c 'I/O Error (sct 0x0 / sc 0x4)')"
sed 's/^/PEERFAULT_/' /run/p2plab/peerfault.out

# The driver survives unbind/bind and unload/load with p2pmem in use before.
# Every step's exit status counts: a write to unbind/bind fails when the
# driver's remove/probe fails, rmmod when the module is still referenced.
lifecycle_failures=0
for _ in 1 2 3; do
  echo $gpu_bdf > /sys/bus/pci/drivers/p2plab_gpu/unbind || lifecycle_failures=$((lifecycle_failures + 1))
  [ ! -e /sys/bus/pci/drivers/p2plab_gpu/$gpu_bdf ] || lifecycle_failures=$((lifecycle_failures + 1))
  echo $gpu_bdf > /sys/bus/pci/drivers/p2plab_gpu/bind || lifecycle_failures=$((lifecycle_failures + 1))
  [ -e /sys/bus/pci/drivers/p2plab_gpu/$gpu_bdf ] || lifecycle_failures=$((lifecycle_failures + 1))
done
for _ in 1 2; do
  rmmod p2plab_gpu || lifecycle_failures=$((lifecycle_failures + 1))
  [ ! -e /sys/module/p2plab_gpu ] || lifecycle_failures=$((lifecycle_failures + 1))
  modprobe p2plab_gpu || lifecycle_failures=$((lifecycle_failures + 1))
done
echo "LIFECYCLE_STEPS=16"
echo "LIFECYCLE_FAILURES=$lifecycle_failures"
sleep 0.5
echo "REBOUND_PUBLISHED=$(cat $gpu/p2pmem/published 2>/dev/null)"
echo "REBOUND_DRIVER=$(basename "$(readlink -f $gpu/driver)")"

# The GPU driver's own smoke test (devices/gpu/guest-driver/tests, shared
# at /mnt/host): engine jobs, device-reported errors, a function reset,
# a file open across unbind, parallel submitters.
bash /mnt/host/guest-smoke.sh > /run/p2plab/smoke.out 2>&1; echo "SMOKE_STATUS=$?"
sed -n 's/^SMOKE_/SMOKE_/p' /run/p2plab/smoke.out
grep '^FAIL' /run/p2plab/smoke.out

# 8. The GPU's BAR moves: driver unbound, memory decode off, BAR2
#    reprogrammed 1 GiB higher, decode on (nvme0's peer window must be
#    there when setpci returns); then remove + rescan puts the device back
#    where the kernel wants it. 8 MiB moved afterwards land in VRAM.
old_bar2=$(sed -n 3p $gpu/resource | cut -d' ' -f1)
echo "MOVE_OLD_BAR2=$old_bar2"
moved=$((old_bar2 + 0x40000000))
echo "MOVE_SETPCI_BAR2=$moved"
echo $gpu_bdf > /sys/bus/pci/drivers/p2plab_gpu/unbind; echo "MOVE_UNBIND_STATUS=$?"
setpci -s $gpu_bdf COMMAND=0:2 \
  && setpci -s $gpu_bdf BASE_ADDRESS_2="$(printf '%08x' $((moved & 0xffffffff)))" \
  && setpci -s $gpu_bdf BASE_ADDRESS_3="$(printf '%08x' $((moved >> 32)))" \
  && setpci -s $gpu_bdf COMMAND=2:2; echo "MOVE_SETPCI_STATUS=$?"
p2plab-ctl nvme0 status --json > /run/p2plab/moved-status.json; echo "MOVE_CTL_STATUS=$?"
echo 1 > $gpu/remove; echo "MOVE_REMOVE_STATUS=$?"
echo 1 > /sys/bus/pci/rescan; echo "MOVE_RESCAN_STATUS=$?"
sleep 1
gpu_bdf=$(by_class 0x030200 | head -n1)
gpu=/sys/bus/pci/devices/$gpu_bdf
echo "MOVE_NEW_BAR2=$(sed -n 3p $gpu/resource | cut -d' ' -f1)"
echo "MOVE_PUBLISHED=$(cat $gpu/p2pmem/published 2>/dev/null)"
p2plab-p2pio --p2pmem $gpu_bdf read --dev $ns --len 8M --chunk 1M \
  --hook 'p2plab-gpu-tool checksum $P2P_BAR_OFFSET $P2P_LEN > /run/p2plab/move.crc' \
  > /run/p2plab/move.out 2>&1; echo "MOVE_STATUS=$?"
sed 's/^/MOVE_/' /run/p2plab/move.out
echo "MOVE_EXPECTED_CRC=$(p2plab-gpu-tool crc32c /tmp/pattern 0 8M)"
echo "MOVE_GPU_CRC=$(cat /run/p2plab/move.crc)"
echo "KERNEL_COMPLAINTS=$(dmesg | grep -c -E 'BUG:|WARNING:|Oops|leak|refcount_t')"
exit 0
