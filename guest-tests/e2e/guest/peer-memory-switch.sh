#!/bin/bash
# The rdma suite's peer-memory script for `rdma` (PEER=nvme, under the
# GPU's switch), run after the NIC checks in the same boot: the GPU
# driver's peer-memory API and dma-buf exporter through
# `p2plab-gpu-tool p2p-scenario` (tests/rdma.rs, "Peer memory").
# shellcheck source=SCRIPTDIR/lib/peer-memory.sh
. /run/p2plab/lib/peer-memory.sh
modprobe p2plab_p2p_test; echo "MODPROBE_STATUS=$?"
# The NIC checks rebound the GPU after their tool exited: it is gpu0 again.
[ -e /sys/class/p2plab-gpu/p2plab-gpu0 ] || { echo "no p2plab-gpu0: $(ls /sys/class/p2plab-gpu)"; exit 1; }
sys=/sys/class/p2plab-gpu/p2plab-gpu0
echo "BASE_P2P_REVOCATIONS=$(cat $sys/p2p_revocations)"
echo "BASE_DMABUF_REVOCATIONS=$(cat $sys/dmabuf_revocations)"
p2plab-gpu-tool p2p-scenario $peer_bdf 16M unpin RT; echo "RT_STATUS=$?"
p2plab-gpu-tool p2p-scenario $peer_bdf 1M free FREE; echo "FREE_STATUS=$?"
p2plab-gpu-tool p2p-scenario $peer_bdf 1M exit EXIT; echo "EXIT_STATUS=$?"
p2plab-gpu-tool p2p-scenario $peer_bdf 2M dmabuf DMABUF; echo "DMABUF_STATUS=$?"
p2plab-gpu-tool p2p-scenario $peer_bdf 1M reset RESET; echo "RESET_STATUS=$?"
p2plab-gpu-tool nop >/dev/null; echo "RESET_NEXT_NOP=$?"
p2plab-gpu-tool p2p-scenario $peer_bdf 1M dmabuf-reset DBRESET; echo "DBRESET_STATUS=$?"
echo "P2P_REVOCATIONS=$(cat $sys/p2p_revocations)"
echo "DMABUF_REVOCATIONS=$(cat $sys/dmabuf_revocations)"
p2plab-gpu-tool p2p-scenario $peer_bdf 1M unbind UNBIND; echo "UNBIND_STATUS=$?"
echo "REBOUND_DRIVER=$(basename "$(readlink -f /sys/bus/pci/devices/$gpu_bdf/driver)")"
# The old p2plab-gpu0 is gone with the scenario's process; the rebound GPU
# is the one left in the class.
rebound=$(ls /sys/class/p2plab-gpu | head -n1)
echo "REBOUND_DEVICES=$(ls /sys/class/p2plab-gpu | wc -l)"
p2plab-gpu-tool -d /dev/$rebound nop >/dev/null; echo "REBOUND_NOP=$?"
p2plab-gpu-tool -d /dev/$rebound p2p-scenario $peer_bdf 1M dmabuf-unbind DBUNBIND; echo "DBUNBIND_STATUS=$?"
rebound=$(ls /sys/class/p2plab-gpu | head -n1)
p2plab-gpu-tool -d /dev/$rebound nop >/dev/null; echo "DBUNBIND_REBOUND_NOP=$?"
rmmod p2plab_p2p_test; echo "RMMOD_STATUS=$?"
echo "REFUSAL_DMESG=$(dmesg | grep -c "$reason")"
exit 0
