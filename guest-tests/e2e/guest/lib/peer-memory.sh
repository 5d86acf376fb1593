#!/bin/bash
# Sourced first by the rdma suite's peer-memory scripts (tests/rdma.rs,
# "Peer memory" and "NVIDIA's API"): the GPU in gpu_bdf, the named peer
# the GPU memory is mapped for in peer_bdf, BAR2's start, and in reason the
# kernel's words when it refuses a P2P pair. Each script loads its own
# test importer.
# shellcheck disable=SC2034 # peer_bdf and reason are for the sourcing scripts
set -u
# The named peer: the NVMe controller (under the GPU's switch in `rdma`)
# or nic0 (on its own root port in `rdma-separate`).
: "${PEER:?nvme or nic0}"
by_class() { for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "$1" ] && basename $d; done; }
gpu_bdf=$(by_class 0x030200 | head -n1)
case $PEER in
  nvme) peer_bdf=$(by_class 0x010802 | head -n1) ;;
  nic0) peer_bdf=$(basename "$(readlink -f /sys/class/p2plab-nic/p2plab-nic0/device)") ;;
  *) echo "PEER=$PEER: not nvme or nic0"; exit 1 ;;
esac
[ -n "$gpu_bdf" ] && [ -n "$peer_bdf" ] || { echo "no GPU or no named peer"; exit 1; }
sed -n 3p /sys/bus/pci/devices/$gpu_bdf/resource | { read start _ _; echo "BAR2_START=$start"; }
reason='cannot be used for peer-to-peer DMA as the client and provider .* do not share an upstream bridge or whitelisted host bridge'
