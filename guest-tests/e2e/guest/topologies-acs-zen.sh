#!/bin/bash
# The topologies suite's guest script for
# acs_redirect_with_a_zen_vcpu_goes_through_the_host_bridge
# (tests/topologies.rs): `same-switch-acs` again, with `-cpu EPYC`.
# shellcheck source=SCRIPTDIR/lib/topologies.sh
. /run/p2plab/lib/topologies.sh
echo "ACS_CTRL_GPU_PORT=$(acs_ctrl "$(parent_of $gpu_bdf)")"
echo "ACS_CTRL_NVME_PORT=$(acs_ctrl "$(parent_of $nvme_bdf)")"
n2g
ram_again
