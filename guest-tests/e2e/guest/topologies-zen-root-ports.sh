#!/bin/bash
# The topologies suite's guest script for
# zen_host_bridge_allows_p2p_between_root_ports (tests/topologies.rs):
# `separate-root-ports-zen`, NVMe -> GPU and GPU -> NVMe.
# shellcheck source=SCRIPTDIR/lib/topologies.sh
. /run/p2plab/lib/topologies.sh
n2g
# GPU -> NVMe: the GPU's engine fills p2pmem, O_DIRECT writes it to the
# namespace at 64 MiB; normal I/O reads it back. `G2N_*` facts.
p2plab-p2pio --p2pmem $gpu_bdf write --dev $ns --offset 64M --len 16M --chunk 1M \
  --hook 'p2plab-gpu-tool fill32 $P2P_BAR_OFFSET $P2P_LEN 0x2e9c0de5 && p2plab-gpu-tool checksum $P2P_BAR_OFFSET $P2P_LEN > /run/p2plab/g2n.crc' \
  > /run/p2plab/g2n.out 2>&1; echo "G2N_STATUS=$?"
sed 's/^/G2N_/' /run/p2plab/g2n.out
echo 3 > /proc/sys/vm/drop_caches
dd if=$ns of=/tmp/back bs=1M skip=64 count=16 iflag=direct 2>/dev/null
echo "G2N_READBACK_CRC=$(p2plab-gpu-tool crc32c /tmp/back)"
echo "G2N_GPU_CRC=$(cat /run/p2plab/g2n.crc 2>/dev/null)"
ram_again
