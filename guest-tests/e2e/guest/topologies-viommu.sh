#!/bin/bash
# The topologies suite's guest script for
# viommu_routes_p2p_by_switch_and_ram_through_iovas (tests/topologies.rs):
# `viommu`, booted with intel_iommu=on iommu.strict=1. The P2P phases run
# between marks the host takes (lib/viommu.sh).
# shellcheck source=SCRIPTDIR/lib/topologies.sh
. /run/p2plab/lib/topologies.sh
# shellcheck source=SCRIPTDIR/lib/viommu.sh
. /run/p2plab/lib/viommu.sh
echo "IOMMU_GROUP_TYPE=$(cat $nvme/iommu_group/type)"
echo "GPU_IOMMU_GROUP_TYPE=$(cat $gpu/iommu_group/type)"
echo "NVME1_IOMMU_GROUP_TYPE=$(cat $nvme1/iommu_group/type)"
echo "ACS_CTRL_RP=$(acs_ctrl 00:10.0)"
echo "ACS_CTRL_UP=$(acs_ctrl "$(parent_of "$(parent_of $gpu_bdf)")")"
echo "ACS_CTRL_GPU_PORT=$(acs_ctrl "$(parent_of $gpu_bdf)")"
echo "ACS_CTRL_NVME_PORT=$(acs_ctrl "$(parent_of $nvme_bdf)")"
echo "ACS_CTRL_NVME1_PORT=$(acs_ctrl "$(parent_of $nvme1_bdf)")"
# Many small maps: 4 KiB O_DIRECT writes then reads, 2 threads of dd.
for i in 0 1; do
  dd if=/tmp/pattern of=$ns bs=4k count=1024 skip=$((i * 1024)) seek=$((8192 + i * 1024)) oflag=direct 2>/dev/null &
done; wait
echo 3 > /proc/sys/vm/drop_caches
dd if=$ns bs=4k count=2048 skip=8192 iflag=direct 2>/dev/null | cmp -s - <(head -c 8M /tmp/pattern); echo "SMALL_CMP=$?"
p2p_phases
ram_again
