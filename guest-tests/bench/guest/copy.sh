#!/bin/bash
# The bench's guest script for its NVMe -> NVMe copies (src/guest.rs):
# nvme0 -> nvme1 with p2plab-p2pio (1 MiB chunks, 4 threads, an 8 MiB
# buffer), after one unmeasured warm-up copy through RAM. The host appends
# one `copy_via NAME BUFFER` call per buffer, each printing a
# `COPY NAME KEY=VALUE...` line.
set -e
# Bytes each copy moves (p2plab-p2pio's --len).
: "${COPY_LEN:?bytes}"

# copy_via NAME BUFFER: one copy through BUFFER: `ram` (guest RAM), `gpu`
# (the GPU's p2pmem) or `nvme1` (nvme1's CMB).
copy_via() {
  local name=$1 p2pmem
  case $2 in
    ram) p2pmem=ram ;;
    gpu) p2pmem=$gpu_bdf ;;
    nvme1) p2pmem=$nvme1_bdf ;;
    *) echo "copy_via: buffer $2 is not ram, gpu or nvme1"; exit 1 ;;
  esac
  echo "COPY $name $(p2plab-p2pio --p2pmem "$p2pmem" copy --src "$src" --dst "$dst" --len "$COPY_LEN" \
    --chunk 1M --threads 4 --buffer 8M 2>&1 | tr '\n' ' ')"
}

src=$(p2plab-nvme-ns --serial P2PLAB-NVME0 1)
dst=$(p2plab-nvme-ns --serial P2PLAB-NVME1 1)
nvme1_bdf=$(basename "$(readlink -f "/sys/class/nvme/$(p2plab-nvme-ns --ctrl-of P2PLAB-NVME1)/device")")
gpu_bdf=$(for d in /sys/bus/pci/devices/*; do [ "$(cat "$d"/class)" = 0x030200 ] && basename "$d"; done | head -n1)
for d in $gpu_bdf $nvme1_bdf; do
  [ "$(cat /sys/bus/pci/devices/"$d"/p2pmem/published)" = 1 ] || { echo "no published p2pmem on $d"; exit 1; }
done
# Unmeasured: the first copy of a boot runs cold (nvme1's file blocks get
# allocated, nvme0's pages come into the host's page cache) at about half
# the speed of the next ones, which would flatter whichever buffer comes
# second.
warm=$(p2plab-p2pio --p2pmem ram copy --src "$src" --dst "$dst" --len "$COPY_LEN" \
  --chunk 1M --threads 4 --buffer 8M 2>&1 | tr '\n' ' ')
case "$warm" in *ERRORS=0*) ;; *) echo "warm-up copy failed: $warm"; exit 1 ;; esac
