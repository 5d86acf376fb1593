#!/bin/bash
# The topologies suite's guest script for
# viommu_with_acs_and_an_intel_vcpu_refuses_p2p (tests/topologies.rs):
# `viommu-acs`, booted with intel_iommu=on iommu.strict=1.
# shellcheck source=SCRIPTDIR/lib/topologies.sh
. /run/p2plab/lib/topologies.sh
# shellcheck source=SCRIPTDIR/lib/viommu.sh
. /run/p2plab/lib/viommu.sh
echo "IOMMU_GROUP_TYPE=$(cat $nvme/iommu_group/type)"
echo "ACS_CTRL_GPU_PORT=$(acs_ctrl "$(parent_of $gpu_bdf)")"
echo "ACS_CTRL_NVME_PORT=$(acs_ctrl "$(parent_of $nvme_bdf)")"
echo "ACS_CTRL_NVME1_PORT=$(acs_ctrl "$(parent_of $nvme1_bdf)")"
n2g
fio_p2p cmb_fio "$nvme1_bdf" 384M; echo "CMB_FIO_STATUS=$?"
bus_route; echo "BUS_ROUTE_STATUS=$?"
ram_again
