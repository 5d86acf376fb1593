#!/bin/bash
# The rdma suite's NVIDIA-API script for `rdma` (PEER=nvme, under the
# GPU's switch), run after the peer-memory part in the same boot: NVIDIA's
# kernel peer-memory API (nv-p2p.h, exported by p2plab_gpu) through the
# third-party-style importer nv_p2p_test and `nv-p2p-test-tool`
# (tests/rdma.rs, "NVIDIA's API").
# shellcheck source=SCRIPTDIR/lib/peer-memory.sh
. /run/p2plab/lib/peer-memory.sh
modprobe nv_p2p_test; echo "MODPROBE_STATUS=$?"
# The peer-memory part rebound the GPU: it is the only one in the class.
echo "DEVICES=$(ls /sys/class/p2plab-gpu | wc -l)"
gpu=$(ls /sys/class/p2plab-gpu | head -n1)
sys=/sys/class/p2plab-gpu/$gpu
echo "SYSFS_UUID=$(cat "$sys/uuid")"
counters() {
  for c in p2p_revocations p2p_pins p2p_maps p2p_bus_addr_maps; do
    echo "$1${c^^}=$(cat "$sys/$c")"
  done
}
counters BASE_
torn='persistent peer-memory pin(s): no callback to tell their importer'
echo "BASE_TORN_LINES=$(dmesg | grep -c "$torn")"
nv() { nv-p2p-test-tool -d "/dev/$gpu" "$peer_bdf" "$@"; }
nv 2M unpin RT; echo "RT_STATUS=$?"
nv 256K args ARGS; echo "ARGS_STATUS=$?"
counters ARGS_
nv 1M free FREE; echo "FREE_STATUS=$?"
nv 1M exit EXIT; echo "EXIT_STATUS=$?"
nv 1M persistent-free PFREE; echo "PFREE_STATUS=$?"
nv 1M persistent-reset PRESET; echo "PRESET_STATUS=$?"
echo "PRESET_TORN_LINES=$(dmesg | grep -c "$torn")"
p2plab-gpu-tool -d "/dev/$gpu" nop >/dev/null; echo "PRESET_NEXT_NOP=$?"
nv 1M reset RESET; echo "RESET_STATUS=$?"
p2plab-gpu-tool -d "/dev/$gpu" nop >/dev/null; echo "RESET_NEXT_NOP=$?"
counters END_
nv 1M unbind UNBIND; echo "UNBIND_STATUS=$?"
echo "REBOUND_DRIVER=$(basename "$(readlink -f "/sys/bus/pci/devices/$gpu_bdf/driver")")"
rebound=$(ls /sys/class/p2plab-gpu | head -n1)
echo "REBOUND_DEVICES=$(ls /sys/class/p2plab-gpu | wc -l)"
p2plab-gpu-tool -d "/dev/$rebound" nop >/dev/null; echo "REBOUND_NOP=$?"
rmmod nv_p2p_test; echo "RMMOD_STATUS=$?"
exit 0
