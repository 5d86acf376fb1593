#!/bin/bash
# The topologies suite's guest script for acs_redirect_in_the_switch_refuses_p2p
# (tests/topologies.rs): `same-switch-acs` with P2P Request Redirect on
# both downstream ports, an Intel vCPU.
# shellcheck source=SCRIPTDIR/lib/topologies.sh
. /run/p2plab/lib/topologies.sh
echo "ACS_CTRL_RP=$(acs_ctrl 00:10.0)"
echo "ACS_CTRL_GPU_PORT=$(acs_ctrl "$(parent_of $gpu_bdf)")"
echo "ACS_CTRL_NVME_PORT=$(acs_ctrl "$(parent_of $nvme_bdf)")"
n2g
ram_again
