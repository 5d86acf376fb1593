#!/bin/bash
# The topologies suite's guest script for
# amd_iommu_with_acs_maps_p2p_through_the_iommu (tests/topologies.rs):
# `viommu-amd`, booted with iommu.strict=1. The P2P phases run between
# marks the host takes (lib/viommu.sh).
# shellcheck source=SCRIPTDIR/lib/topologies.sh
. /run/p2plab/lib/topologies.sh
# shellcheck source=SCRIPTDIR/lib/viommu.sh
. /run/p2plab/lib/viommu.sh
echo "IOMMU_GROUP_TYPE=$(cat $nvme/iommu_group/type)"
echo "GPU_IOMMU_GROUP_TYPE=$(cat $gpu/iommu_group/type)"
echo "NVME1_IOMMU_GROUP_TYPE=$(cat $nvme1/iommu_group/type)"
echo "ACS_CTRL_UP=$(acs_ctrl "$(parent_of "$(parent_of $gpu_bdf)")")"
echo "ACS_CTRL_GPU_PORT=$(acs_ctrl "$(parent_of $gpu_bdf)")"
echo "ACS_CTRL_NVME_PORT=$(acs_ctrl "$(parent_of $nvme_bdf)")"
echo "ACS_CTRL_NVME1_PORT=$(acs_ctrl "$(parent_of $nvme1_bdf)")"
p2p_phases
ram_again
