#!/bin/bash
# The rdma suite's peer-memory script for `rdma-separate` (PEER=nic0, on
# another root port than the GPU), run after the NIC checks: the kernel's
# P2P distance check must refuse the mapping and the dma-buf attach.
# shellcheck source=SCRIPTDIR/lib/peer-memory.sh
. /run/p2plab/lib/peer-memory.sh
modprobe p2plab_p2p_test; echo "MODPROBE_STATUS=$?"
dmesg -C
p2plab-gpu-tool p2p-scenario $peer_bdf 1M unpin RT; echo "RT_STATUS=$?"
echo "RT_DMESG=$(dmesg | grep -c "$reason")"
p2plab-gpu-tool p2p-scenario $peer_bdf 1M dmabuf DMABUF; echo "DMABUF_STATUS=$?"
echo "ALL_DMESG=$(dmesg | grep -c "$reason")"
dmesg | tail -n 10
exit 0
