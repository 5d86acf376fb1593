#!/bin/bash
# The efa suite's guest script for `rdma-efa-separate` (tests/efa.rs,
# `gpu_memory_refused_across_root_ports`): gpu0, efa0 and efa1 on separate
# root ports; registering gpu0's memory on an EFA is refused with the
# kernel's P2P distance reason, nothing moves, RAM still does.
set -u
say() { echo "$1=$2"; }
facts() { while IFS='=' read -r k v; do echo "$1_$(echo "$k" | tr a-z A-Z)=$v"; done; }
out=/run/p2plab
reason='cannot be used for peer-to-peer DMA as the client and provider'

modprobe ib_uverbs; say MODPROBE_UVERBS $?
modprobe efa; say MODPROBE_EFA $?
i=0
until [ -e /sys/class/infiniband/efa_0 ] && [ -e /sys/class/infiniband/efa_1 ]; do
  sleep 0.2; i=$((i+1)); [ $i -lt 300 ] || break
done
servers() { for d in efa0 efa1 gpu0; do p2plab-ctl $d status > "$out/$1-$d.json" 2>/dev/null; done; }

base=$(dmesg | grep -c "$reason")
servers before
p2plab-efa-check gpu-xfer --src efa_0 --dst efa_1 --src-gpu /dev/p2plab-gpu0 --dst-gpu /dev/p2plab-gpu0 \
  --size 1M --msg 8K > /tmp/r1 2>&1
say REFUSED_EXIT $?
facts REFUSED < /tmp/r1
servers after
say REFUSED_DMESG $(( $(dmesg | grep -c "$reason") - base ))
say REFUSED_PINS "$(cat /sys/class/p2plab-gpu/p2plab-gpu0/dmabuf_pins)"
# The EFAs themselves work: RAM to RAM.
p2plab-efa-check xfer --src efa_0 --dst efa_1 --size 1M --msg 8K --seed 3 > /tmp/r2 2>&1
say RAM_EXIT $?
facts RAM < /tmp/r2
dmesg | grep -e "$reason" -e efa | tail -n 10
exit 0
