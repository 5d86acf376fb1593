#!/bin/bash
# Sourced by the topologies suite's vIOMMU scripts after lib/topologies.sh
# (which sets ns, nvme_bdf, gpu_bdf, tracing). Defines nvme1 (the second
# controller, by serial), the P2P phases the tests run under each vIOMMU
# topology, and `phase`, which runs one between two marks the host takes
# (tests/topologies.rs, mark_phases): the host keeps every server's
# counters before and after, and judges them with `p2plab-ctl provenance`.
# shellcheck disable=SC2154 # ns, nvme_bdf, gpu_bdf, tracing: lib/topologies.sh
ns1=$(p2plab-nvme-ns --serial P2PLAB-NVME1 1)
nvme1_bdf=$(basename "$(readlink -f "/sys/class/nvme/$(p2plab-nvme-ns --ctrl-of P2PLAB-NVME1)/device")")
nvme1=/sys/bus/pci/devices/$nvme1_bdf
echo "NVME1_BDF=$nvme1_bdf"
echo "NVME1_PORT=$(parent_of "$nvme1_bdf")"
echo "NVME1_P2P_PUBLISHED=$(cat $nvme1/p2pmem/published)"
sed -n 3p $nvme1/resource | { read -r start end _; echo "NVME1_BAR2_START=$start"; echo "NVME1_BAR2_END=$end"; }

signal() { : > /run/p2plab/.$1; mv /run/p2plab/.$1 /run/p2plab/$1; }
wait_host() { i=0; until [ -e /run/p2plab/$1 ]; do sleep 0.2; i=$((i+1)); [ $i -lt 3000 ] || { echo "no $1 from the host"; exit 1; }; done; }
map_types() { sed -n 's/.*p2p_map_type:.* ret=\([0-9]*\).*/\1/p' $tracing/trace | sort -u | paste -sd, -; }

# phase NAME CMD...: CMD between the host's marks NAME-start and NAME-end;
# reports NAME_STATUS (CMD's exit status) and NAME_MAP_TYPES (the P2P map
# types the kernel computed meanwhile, distinct, in order).
phase() {
  local name=$1 status
  shift
  : > $tracing/trace
  signal "ready-$name"; wait_host "marked-$name"
  "$@"; status=$?
  signal "done-$name"; wait_host "measured-$name"
  echo "${name^^}_STATUS=$status"
  echo "${name^^}_MAP_TYPES=$(map_types)"
}

# fio_p2p NAME P2PMEM_BDF OFFSET: fio writes 16 MiB to nvme0's namespace at
# OFFSET from buffers in P2PMEM_BDF's p2pmem (the device reads the peer's
# BAR), then verifies it by reading it back into them (the device writes
# the peer's BAR); crc32c in every 4 KiB, checked by the CPU through the
# BAR mapping. Reports NAME_READ_BYTES, NAME_WRITE_BYTES, NAME_ERROR.
fio_p2p() {
  local name=$1 bdf=$2 offset=$3 status
  fio --name="$name" --filename="$ns" --direct=1 --rw=write --bs=1M --size=16M \
    --offset="$offset" --ioengine=libaio --iodepth=2 \
    --mem=mmapshared:/sys/bus/pci/devices/$bdf/p2pmem/allocate \
    --verify=crc32c --verify_interval=4096 --do_verify=1 --verify_fatal=1 \
    --output-format=json > /run/p2plab/$name.json 2> /run/p2plab/$name.err
  status=$?
  # fio's JSON lists "read" then "write", each with its io_bytes.
  grep -o '"io_bytes" : [0-9]*' /run/p2plab/$name.json | sed -n '1s/.* /'"${name^^}"'_READ_BYTES=/p; 2s/.* /'"${name^^}"'_WRITE_BYTES=/p'
  echo "${name^^}_ERROR=$(grep -o '"error" : [0-9]*' /run/p2plab/$name.json | head -n1 | sed 's/.* //')"
  sed 's/^/'"${name^^}"'_STDERR=/' /run/p2plab/$name.err | head -n 5
  return $status
}

# NVMe -> NVMe: the first 16 MiB of nvme0's namespace copied to nvme1's
# through nvme1's CMB (nvme0 writes into nvme1's BAR, nvme1 writes out of
# its own).
cmb_copy() {
  p2plab-p2pio --p2pmem "$nvme1_bdf" copy --src "$ns" --dst "$ns1" \
    --len 16M --chunk 1M > /run/p2plab/cmb_copy.out 2>&1
  local status=$?
  sed 's/^/CMB_COPY_/' /run/p2plab/cmb_copy.out
  echo 3 > /proc/sys/vm/drop_caches
  echo "CMB_COPY_SRC_SUM=$(dd if="$ns" bs=1M count=16 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
  echo "CMB_COPY_DST_SUM=$(dd if="$ns1" bs=1M count=16 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
  return $status
}

# A bounce through guest RAM, as GDS compat mode does it: the NVMe reads
# into RAM, then the GPU's engine copies RAM into VRAM at 512 MiB.
bounce() {
  dd if="$ns" of=/tmp/bounce bs=1M count=16 iflag=direct 2>/dev/null || return 1
  p2plab-gpu-tool copy-to-vram /tmp/bounce 512M || return 1
  echo "BOUNCE_FILE_CRC=$(p2plab-gpu-tool crc32c /tmp/bounce)"
  echo "BOUNCE_GPU_CRC=$(p2plab-gpu-tool checksum 512M 16M)"
}

# The GPU's engine writes 4 KiB of VRAM to the bus address of the last
# 4 KiB of nvme1's CMB (a raw BUS_ADDR job): a switch routes it to nvme1,
# an IOMMU faults it (the address is no IOVA). Reports BUS_ROUTE_OUT.
bus_route() {
  local start end
  read -r start end _ < <(sed -n 3p $nvme1/resource)
  p2plab-gpu-tool -B raw 2 0 $((end + 1 - 4096)) 4096 > /run/p2plab/bus_route.out 2>&1
  local status=$?
  echo "BUS_ROUTE_OUT=$(tr '\n' ' ' < /run/p2plab/bus_route.out)"
  return $status
}

# Every P2P phase, in the order the tests mark them.
p2p_phases() {
  phase n2g_fio fio_p2p n2g_fio "$gpu_bdf" 256M
  phase cmb_fio fio_p2p cmb_fio "$nvme1_bdf" 384M
  phase cmb_copy cmb_copy
  phase bounce bounce
  phase bus_route bus_route
}
