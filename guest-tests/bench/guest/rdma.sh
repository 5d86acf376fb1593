#!/bin/bash
# The bench's guest script for its RDMA boots (src/guest.rs): nic0 -> wire
# -> nic1 with p2plab-nic-tool, which verifies the destination (bytes for
# RAM, the GPU engine's CRC for GPU memory). Once both NICs have a link it
# prints `RDMA_MTU mtu=A mtu=B`; the host appends one `xfer MEMORY SEED`
# call per memory, each printing an `RDMA MEMORY KEY=VALUE...` line.
set -e
# Bytes each transfer moves, and bytes per posted send/receive.
: "${RDMA_LEN:?bytes}" "${RDMA_POST:?bytes}"

# xfer MEMORY SEED: one transfer from and into MEMORY: `ram` (guest RAM),
# `gpu` (GPU memory through the GPU driver's peer-memory API) or `dmabuf`
# (a GPU allocation exported as a dma-buf).
xfer() {
  echo "RDMA $1 $(p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 \
    --src "$1" --dst "$1" --size "$RDMA_LEN" --post "$RDMA_POST" --seed "$2" 2>&1 | tr '\n' ' ')"
}

i=0
until p2plab-nic-tool info /dev/p2plab-nic0 | grep -qx link_up=1 &&
      p2plab-nic-tool info /dev/p2plab-nic1 | grep -qx link_up=1; do
  sleep 0.2; i=$((i+1)); [ $i -lt 150 ] || { echo 'the NICs have no link'; exit 1; }
done
echo "RDMA_MTU $(p2plab-nic-tool info /dev/p2plab-nic0 | grep '^mtu=') $(p2plab-nic-tool info /dev/p2plab-nic1 | grep '^mtu=')"
