#!/bin/bash
# The rdma suite's NVIDIA-API script for `rdma-separate` (PEER=nic0, on
# another root port than the GPU), run after the peer-memory part: pinning
# works, but nvidia_p2p_dma_map_pages must refuse the pair the kernel's
# P2PDMA refuses, with -ENOTSUPP and the kernel's reason in dmesg
# (tests/rdma.rs, "NVIDIA's API").
# shellcheck source=SCRIPTDIR/lib/peer-memory.sh
. /run/p2plab/lib/peer-memory.sh
modprobe nv_p2p_test; echo "MODPROBE_STATUS=$?"
before=$(dmesg | grep -c "$reason")
gpu=$(ls /sys/class/p2plab-gpu | head -n1)
nv-p2p-test-tool -d "/dev/$gpu" "$peer_bdf" 1M unpin RT; echo "RT_STATUS=$?"
echo "RT_DMESG=$(($(dmesg | grep -c "$reason") - before))"
rmmod nv_p2p_test; echo "RMMOD_STATUS=$?"
exit 0
