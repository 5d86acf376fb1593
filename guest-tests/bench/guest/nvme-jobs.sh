#!/bin/bash
# The bench's guest script for its NVMe boots (p2plab-nvme and the anchor,
# src/guest.rs): fio jobs on /dev/nvme0n1, one `BENCH LABEL {fio JSON}`
# line each. The host appends the jobs as calls of the functions below:
#
#   host_mark LABEL begin; fio_job LABEL ram FIO_OPTION...; host_mark LABEL end
#                                          each compared job
#   find_gpu                               then, with the P2P jobs, each:
#   with_4k_pages fio_job ram4k-NAME ram FIO_OPTION...
#   cpu_mark ram-NAME begin SERVER...; fio_job ram-NAME ram ...; cpu_mark ram-NAME end SERVER...
#   cpu_mark p2p-NAME begin SERVER...; fio_job p2p-NAME p2pmem ...; cpu_mark p2p-NAME end SERVER...
set -e
[ -b /dev/nvme0n1 ] || { echo 'no /dev/nvme0n1'; exit 1; }
# Seconds each fio job runs (after 2 s of ramp).
: "${RUNTIME:?seconds}"

# fio_job LABEL MEMORY FIO_OPTION...: one job over 512 MiB of the
# namespace with O_DIRECT, its buffers in MEMORY: `ram` (guest RAM as fio
# allocates it) or `p2pmem` (the GPU's, found by find_gpu); fio's JSON on
# one line.
fio_job() {
  local label=$1 memory=$2 mem=()
  shift 2
  case $memory in
    ram) ;;
    p2pmem) mem=(--mem=mmapshared:"$gpu"/p2pmem/allocate) ;;
    *) echo "fio_job: memory $memory is not ram or p2pmem"; exit 1 ;;
  esac
  echo "BENCH $label $(fio --name="$label" --filename=/dev/nvme0n1 --direct=1 "$@" "${mem[@]}" \
    --size=512M --time_based --runtime="$RUNTIME" --ramp_time=2 --output-format=json | tr -d '\n')"
}

# find_gpu: the GPU whose p2pmem the P2P jobs use, in gpu; it must have
# published its p2pmem.
find_gpu() {
  gpu=$(for d in /sys/bus/pci/devices/*; do [ "$(cat "$d"/class)" = 0x030200 ] && echo "$d"; done | head -n1)
  [ -n "$gpu" ] && [ "$(cat "$gpu"/p2pmem/published)" = 1 ] || { echo 'no GPU with published p2pmem'; exit 1; }
}

# with_4k_pages COMMAND...: runs COMMAND with transparent huge pages off
# (guest RAM in 4 KiB pages, like p2pmem's), then sets them back. The
# host runs this job first of the three, so that it gets the least
# fragmented memory: physically contiguous pages need fewer DMA segments.
with_4k_pages() {
  local thp=/sys/kernel/mm/transparent_hugepage/enabled thp_was
  thp_was=$(sed 's/.*\[\(.*\)\].*/\1/' $thp)
  echo never > $thp
  "$@"
  echo "$thp_was" > $thp
}

# host_mark LABEL begin|end: a `HOSTMARK LABEL AT` line with nvme0n1's
# block-layer counters (I/Os and sectors done, each direction), then a
# second's pause in which the host, following the console, reads the
# server's CPU time at that line (src/hostcpu.rs): the same for every
# server, whatever it is.
host_mark() {
  local s
  read -r -a s < /sys/block/nvme0n1/stat
  echo "HOSTMARK $1 $2 reads=${s[0]} read_sectors=${s[2]} writes=${s[4]} write_sectors=${s[6]}"
  sleep 1
}

# cpu_mark LABEL begin|end SERVER...: one `CPU LABEL AT SERVER {status}`
# line per server, from the guest's control channel: the process's CPU
# time and the NVMe data counters at that moment.
cpu_mark() {
  local label=$1 at=$2 server
  shift 2
  for server in "$@"; do
    echo "CPU $label $at $server $(p2plab-ctl "$server" status --json | tr -d '\n')"
  done
}
