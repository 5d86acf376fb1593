#!/bin/bash
# The rdma suite's guest script for `rdma-separate`, the NIC part of
# gpu_memory_refused_on_separate_root_ports (tests/rdma.rs): GPU memory
# refused for nic0 on another root port, RAM still moving.
set -u
say() { echo "$1=$2"; }
facts() { while IFS='=' read -r k v; do echo "$1_$(echo "$k" | tr a-z A-Z)=$v"; done; }
base=$(dmesg | grep -c 'cannot be used for peer-to-peer DMA')
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --src gpu --dst gpu --size 1M --post 1M > /tmp/d
say REFUSE_EXIT $?
facts REFUSE < /tmp/d
say REFUSE_DMESG $(( $(dmesg | grep -c 'cannot be used for peer-to-peer DMA') - base ))
say REFUSE_NIC_LINES "$(dmesg | grep -c 'p2plab_nic.*GPU memory refused for peer DMA')"
# The NIC itself works (RAM, over its loopback wire).
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --size 1M --post 256K > /tmp/r
say RAM_EXIT $?
facts RAM < /tmp/r
exit 0
