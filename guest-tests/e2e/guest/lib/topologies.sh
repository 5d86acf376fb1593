#!/bin/bash
# Sourced first by the topologies suite's guest scripts (tests/topologies.rs).
# When sourced it runs what every topology reports: the devices by class,
# their upstream ports, the p2pmem sysfs values, the CPU, a RAM round trip,
# and a kprobe on the kernel's P2PDMA map type. Then it defines the
# helpers parent_of BDF and acs_ctrl PORT (the ACS Control register of a
# port, `none` when it has no ACS capability), and the phases n2g and
# ram_again that the scripts run.
# The status of `echo ... > /sys/...` is the status of that sysfs write.
# shellcheck disable=SC2320
set -u
by_class() { for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "$1" ] && basename $d; done; }
gpu_bdf=$(by_class 0x030200 | head -n1)
# nvme0 by its serial where the topology sets one (probe order names two
# controllers either way), else the only controller.
ctrl=$(p2plab-nvme-ns --ctrl-of P2PLAB-NVME0 2>/dev/null) || ctrl=$(basename "$(ls -d /sys/class/nvme/nvme* | head -n1)")
nvme_bdf=$(basename "$(readlink -f /sys/class/nvme/$ctrl/device)")
[ -n "$gpu_bdf" ] && [ -n "$nvme_bdf" ] || { echo "devices missing"; lspci -nn; exit 1; }
ns=$(p2plab-nvme-ns --ctrl $ctrl 1)
gpu=/sys/bus/pci/devices/$gpu_bdf
nvme=/sys/bus/pci/devices/$nvme_bdf
parent_of() { basename "$(dirname "$(readlink -f /sys/bus/pci/devices/$1)")"; }
acs_ctrl() { setpci -s "$1" ECAP0d+6.w 2>/dev/null || echo none; }
echo "GPU_BDF=$gpu_bdf"
echo "NVME_BDF=$nvme_bdf"
echo "GPU_PORT=$(parent_of $gpu_bdf)"
echo "NVME_PORT=$(parent_of $nvme_bdf)"
echo "GPU_P2P_PUBLISHED=$(cat $gpu/p2pmem/published)"
echo "GPU_P2P_SIZE=$(cat $gpu/p2pmem/size)"
echo "GPU_P2P_AVAILABLE=$(cat $gpu/p2pmem/available)"
echo "NVME_P2P_PUBLISHED=$(cat $nvme/p2pmem/published)"
echo "NVME_P2P_SIZE=$(cat $nvme/p2pmem/size)"
sed -n 3p $gpu/resource | { read start end _; echo "GPU_BAR2_START=$start"; echo "GPU_BAR2_END=$end"; }
echo "CPU_VENDOR=$(sed -n 's/^vendor_id[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
echo "CPU_FAMILY=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
# A RAM round trip first: 16 MiB through the namespace with O_DIRECT.
dd if=/dev/urandom of=/tmp/pattern bs=1M count=16 2>/dev/null
dd if=/tmp/pattern of=$ns bs=1M oflag=direct 2>/dev/null; echo "RAM_WRITE_STATUS=$?"
echo 3 > /proc/sys/vm/drop_caches
dd if=$ns bs=1M count=16 iflag=direct 2>/dev/null | cmp -s - /tmp/pattern; echo "RAM_CMP=$?"
echo "PATTERN_CRC=$(p2plab-gpu-tool crc32c /tmp/pattern)"
echo "MAX_SECTORS_KB=$(cat "/sys/block/$(basename $ns)/queue/max_sectors_kb")"
echo "MAX_RETRIES=$(cat /sys/module/nvme_core/parameters/max_retries)"
# The kernel's P2PDMA map type for every transfer: a return probe on
# pci_p2pdma_map_type (an exported function; kprobe events are in Debian's
# config), read back at the end as MAP_TYPES.
tracing=/sys/kernel/tracing
mountpoint -q $tracing || mount -t tracefs nodev $tracing
echo 'r:p2p_map_type pci_p2pdma_map_type ret=$retval:u32' >> $tracing/kprobe_events; echo "KPROBE_STATUS=$?"
echo 1 > $tracing/events/kprobes/p2p_map_type/enable; echo "KPROBE_ENABLE_STATUS=$?"

# n2g: NVMe → GPU p2pmem, the 16 MiB pattern read with O_DIRECT in 1 MiB
# chunks; the GPU checksums what landed in VRAM. `N2G_*` facts.
n2g() {
  p2plab-p2pio --p2pmem $gpu_bdf read --dev $ns --len 16M --chunk 1M \
    --hook 'p2plab-gpu-tool checksum $P2P_BAR_OFFSET $P2P_LEN > /run/p2plab/n2g.crc' \
    > /run/p2plab/n2g.out 2>&1; echo "N2G_STATUS=$?"
  sed 's/^/N2G_/' /run/p2plab/n2g.out
  echo "N2G_EINVAL_LINES=$(grep -c 'Invalid argument (os error 22)' /run/p2plab/n2g.out)"
  echo "N2G_EIO_LINES=$(grep -c 'Input/output error (os error 5)' /run/p2plab/n2g.out)"
  echo "N2G_GPU_CRC=$(cat /run/p2plab/n2g.crc 2>/dev/null)"
}

# ram_again: after a refused or failed P2P transfer, RAM I/O must still
# work. Then the map types the kernel computed, distinct values in order;
# the script ends here.
ram_again() {
  echo 3 > /proc/sys/vm/drop_caches
  dd if=$ns bs=1M count=16 iflag=direct 2>/dev/null | cmp -s - /tmp/pattern; echo "RAM_AFTER_CMP=$?"
  echo "MAP_TYPE_CALLS=$(grep -c 'p2p_map_type:' $tracing/trace)"
  echo "MAP_TYPES=$(sed -n 's/.*p2p_map_type:.* ret=\([0-9]*\).*/\1/p' $tracing/trace | sort -u | paste -sd, -)"
  exit 0
}
