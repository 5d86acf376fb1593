#!/bin/bash
# The rdma suite's guest script for `rdma`, the NIC part of
# rdma_and_peer_memory_under_one_switch (tests/rdma.rs has the steps):
# RAM and GPU memory over nic0 -> wire -> nic1, a corrupted frame,
# abandoned posts, revocations by FREE, dma-buf and unbind.
# The status of `echo ... > /sys/...` is the status of that sysfs write.
# shellcheck disable=SC2320
set -u
# Bytes and bytes per post: the RAM transfer, the GPU transfers, the ones
# revoked midway, the ones after a revocation, the dma-buf transfer.
: "${SIZE:?bytes}" "${POST:?bytes}" "${GPU_SIZE:?bytes}" "${GPU_POST:?bytes}"
: "${REVOKE_SIZE:?bytes}" "${AFTER_SIZE:?bytes}" "${DMABUF_SIZE:?bytes}"
say() { echo "$1=$2"; }
# facts PREFIX: the tool's key=value lines as PREFIX_KEY=value facts.
facts() { while IFS='=' read -r k v; do echo "$1_$(echo "$k" | tr a-z A-Z)=$v"; done; }

# shellcheck disable=SC2010 # device names are plain
say NIC_DEVICES "$(ls /dev | grep -c '^p2plab-nic[0-9]')"
i=0
until p2plab-nic-tool info /dev/p2plab-nic0 | grep -qx link_up=1 &&
      p2plab-nic-tool info /dev/p2plab-nic1 | grep -qx link_up=1; do
  sleep 0.2; i=$((i+1)); [ $i -lt 150 ] || break
done
p2plab-nic-tool info /dev/p2plab-nic0 | facts INFO0
p2plab-nic-tool info /dev/p2plab-nic1 | facts INFO1

# --- 1. RAM to RAM over the wire ---------------------------------------------
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size $SIZE --post $POST --seed 7 > /tmp/x1
say XFER_EXIT $?
facts XFER < /tmp/x1

# A post of more frames than the ring has descriptors (1024 RAM pages,
# 256 descriptors) can never fit: E2BIG at once, not a retry forever.
timeout 60 p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size 4M --post 4M > /tmp/xbig 2>/dev/null
say BIG_EXIT $?
facts BIG < /tmp/xbig

# --- 2. one corrupted frame ----------------------------------------------------
p2plab-ctl nic0 inject corrupt,count=1 >/dev/null; say INJECT_EXIT $?
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size 1M --post 256K --seed 9 > /tmp/x2
say CORRUPT_EXIT $?
facts CORRUPT < /tmp/x2

# --- 3. close with posts outstanding, then a clean transfer --------------------
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size 4M --post 256K --abandon > /tmp/x3a
say ABANDON_EXIT $?
facts ABANDON < /tmp/x3a
# Frames of the abandoned transfer still on the wire reach a closed nic1,
# whose receiver is off: it drops them (polling every 20 ms).
sleep 1
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --size 1M --post 256K --seed 11 > /tmp/x3
say AFTER_EXIT $?
facts AFTER < /tmp/x3

# --- 4. GPU memory -> nic0 -> wire -> nic1 -> GPU memory ----------------------
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size $GPU_SIZE --post $GPU_POST --seed 13 > /tmp/g1
say GPU_EXIT $?
facts GPU < /tmp/g1

# --- 5. revocation: the destination VRAM is freed with receives outstanding --
# quiesced N: "DMA quiesced" lines of p2plab-nicN so far.
quiesced() {
  bdf=$(basename "$(readlink -f /sys/class/p2plab-nic/p2plab-nic$1/device)")
  dmesg | grep "$bdf" | grep -c 'revoked by the GPU driver; DMA quiesced'
}
base0=$(quiesced 0); base1=$(quiesced 1)
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size $REVOKE_SIZE --post $GPU_POST --free-dst-after 2 --seed 17 > /tmp/r1
say REVOKE_EXIT $?
facts REVOKE < /tmp/r1
say REVOKE_LINES_NIC0 $(( $(quiesced 0) - base0 ))
say REVOKE_LINES_NIC1 $(( $(quiesced 1) - base1 ))
sleep 1
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size $AFTER_SIZE --post $GPU_POST --seed 19 > /tmp/g2
say GPU_AFTER_EXIT $?
facts GPU_AFTER < /tmp/g2

# --- 6. the same through dma-buf: exported by the GPU driver, imported by fd --
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src dmabuf --dst dmabuf \
  --size $DMABUF_SIZE --post $GPU_POST --seed 23 > /tmp/b1
say DMABUF_EXIT $?
facts DMABUF < /tmp/b1
invalidated() {
  bdf=$(basename "$(readlink -f /sys/class/p2plab-nic/p2plab-nic$1/device)")
  dmesg | grep "$bdf" | grep -c 'invalidated by its exporter; DMA quiesced'
}
base0=$(invalidated 0); base1=$(invalidated 1)
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src dmabuf --dst dmabuf \
  --size $REVOKE_SIZE --post $GPU_POST --free-dst-after 2 --seed 29 > /tmp/b2
say DMABUF_REVOKE_EXIT $?
facts DMABUF_REVOKE < /tmp/b2
say DMABUF_REVOKE_LINES_NIC0 $(( $(invalidated 0) - base0 ))
say DMABUF_REVOKE_LINES_NIC1 $(( $(invalidated 1) - base1 ))
sleep 1
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src dmabuf --dst dmabuf \
  --size $AFTER_SIZE --post $GPU_POST --seed 31 > /tmp/b3
say DMABUF_AFTER_EXIT $?
facts DMABUF_AFTER < /tmp/b3

# --- 7. revocation by unbinding the GPU driver mid-transfer, then rebinding ---
gpubdf=$(basename "$(readlink -f /sys/class/p2plab-gpu/p2plab-gpu0/device)")
base0=$(quiesced 0); base1=$(quiesced 1)
rm -f /tmp/go
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size $GPU_SIZE --post $GPU_POST --signal-after 2 /tmp/go --seed 37 > /tmp/u1 &
pid=$!
i=0; until [ -e /tmp/go ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1200 ] || break; done
echo "$gpubdf" > /sys/bus/pci/drivers/p2plab_gpu/unbind; say UNBIND_STATUS $?
wait $pid; say UNBIND_EXIT $?
facts UNBIND < /tmp/u1
say UNBIND_LINES_NIC0 $(( $(quiesced 0) - base0 ))
say UNBIND_LINES_NIC1 $(( $(quiesced 1) - base1 ))
echo "$gpubdf" > /sys/bus/pci/drivers/p2plab_gpu/bind; say REBIND_STATUS $?
sleep 1
p2plab-nic-tool xfer --tx /dev/p2plab-nic0 --rx /dev/p2plab-nic1 --src gpu --dst gpu \
  --size $AFTER_SIZE --post $GPU_POST --seed 41 > /tmp/u2
say REBIND_XFER_EXIT $?
facts REBIND_XFER < /tmp/u2

say KERNEL_COMPLAINTS "$(dmesg | grep -c -E 'BUG:|WARNING:|Oops|Call Trace')"
dmesg | grep p2plab_nic | tail -n 10
exit 0
