#!/bin/bash
# The dgx suite's guest script (tests/dgx.rs), one boot of the `dgx`
# topology: four NVMe controllers and four GPUs. It reports what sysfs says
# about every device (driver, path, p2pmem, I/O queues), then runs, each
# between two marks the host takes (`phase`, as lib/viommu.sh does):
#   pairs      fio verify through p2pmem for every NVMe -> GPU pair, the
#              kernel's map type per pair (the host decides which pairs
#              must pass and which must be refused, and why);
#   single     NVMe -> GPU reads on one same-switch pair;
#   aggregate  the same on the four same-switch pairs at once;
#   queues1    4 KiB random reads from one job on CPU 0 over all four
#              namespaces;
#   queuesN    the same with one job per vCPU, each on its own CPU.
# fio's JSON goes to /run/p2plab (the run folder's guest/), where the host
# parses it. `scripts/bench --dgx-only` runs the same script with
# DGX_MODE=bench: no pairs phase, no marks.
# The status of `echo ... > /sys/...` is the status of that sysfs write.
# shellcheck disable=SC2320
set -u
: "${DGX_MODE:?test (the dgx suite: every phase, host marks around each) or bench (scripts/bench --dgx-only: the timed phases, no marks)}"
: "${RUNTIME:?seconds each timed fio run lasts}"
out=/run/p2plab
echo "UPTIME_AT_START=$(cut -d' ' -f1 /proc/uptime)"
signal() { : > $out/.$1; mv $out/.$1 $out/$1; }
wait_host() { i=0; until [ -e $out/$1 ]; do sleep 0.2; i=$((i+1)); [ $i -lt 3000 ] || { echo "no $1 from the host"; exit 1; }; done; }
signal booted

tracing=/sys/kernel/tracing
mountpoint -q $tracing || mount -t tracefs nodev $tracing
echo 'r:p2p_map_type pci_p2pdma_map_type ret=$retval:u32' >> $tracing/kprobe_events; echo "KPROBE_STATUS=$?"
echo 1 > $tracing/events/kprobes/p2p_map_type/enable; echo "KPROBE_ENABLE_STATUS=$?"
map_types() { sed -n 's/.*p2p_map_type:.* ret=\([0-9]*\).*/\1/p' $tracing/trace | sort -u | paste -sd, -; }

# phase NAME CMD...: CMD between the host's marks NAME-start and NAME-end.
phase() {
  local name=$1 status
  shift
  [ "$DGX_MODE" = bench ] || { signal "ready-$name"; wait_host "marked-$name"; }
  "$@"; status=$?
  [ "$DGX_MODE" = bench ] || { signal "done-$name"; wait_host "measured-$name"; }
  echo "${name^^}_STATUS=$status"
}

# The devices. A device's PATH is its chain of bridges from the root
# port down, then itself (sysfs), so the host can find the switches.
vcpus=$(nproc)
echo "VCPUS=$vcpus"
path_of() { readlink -f "/sys/bus/pci/devices/$1" | sed 's,^/sys/devices/pci[0-9a-f:]*/,,'; }
driver_of() { basename "$(readlink -f "/sys/bus/pci/devices/$1/driver")"; }
nss=()
nvme_bdfs=()
for i in 0 1 2 3; do
  ctrl=$(p2plab-nvme-ns --ctrl-of P2PLAB-NVME$i) || { echo "no controller with serial P2PLAB-NVME$i"; exit 1; }
  bdf=$(basename "$(readlink -f "/sys/class/nvme/$ctrl/device")")
  ns=$(p2plab-nvme-ns --serial P2PLAB-NVME$i 1)
  nss+=("$ns")
  nvme_bdfs+=("$bdf")
  echo "NVME${i}_BDF=$bdf"
  echo "NVME${i}_DRIVER=$(driver_of "$bdf")"
  echo "NVME${i}_PATH=$(path_of "$bdf")"
  echo "NVME${i}_IO_QUEUES=$(ls -d "/sys/block/$(basename "$ns")/mq/"* | wc -l)"
done
gpu_bdfs=()
for d in /sys/bus/pci/devices/*; do
  [ "$(cat "$d/class")" = 0x030200 ] && gpu_bdfs+=("$(basename "$d")")
done
echo "GPU_COUNT=${#gpu_bdfs[@]}"
for k in "${!gpu_bdfs[@]}"; do
  bdf=${gpu_bdfs[$k]}
  echo "GPUK${k}_BDF=$bdf"
  echo "GPUK${k}_DRIVER=$(driver_of "$bdf")"
  echo "GPUK${k}_PATH=$(path_of "$bdf")"
  echo "GPUK${k}_P2P_PUBLISHED=$(cat "/sys/bus/pci/devices/$bdf/p2pmem/published")"
  echo "GPUK${k}_P2P_SIZE=$(cat "/sys/bus/pci/devices/$bdf/p2pmem/size")"
done

# pairs: for NVMe i and GPU k (BDF order), fio writes 4 MiB to the
# namespace from buffers in the GPU's p2pmem (the NVMe reads the GPU's
# BAR), then reads them back into p2pmem and verifies them (crc32c in
# every 4 KiB): P2P_N<i>_G<k>.json, and the map types the kernel computed.
pairs() {
  local i k
  for i in 0 1 2 3; do
    for k in "${!gpu_bdfs[@]}"; do
      : > $tracing/trace
      fio --name="n${i}g${k}" --filename="${nss[$i]}" --direct=1 --rw=write --bs=1M \
        --size=4M --offset=$((k * 4))M --ioengine=libaio --iodepth=2 \
        --mem="mmapshared:/sys/bus/pci/devices/${gpu_bdfs[$k]}/p2pmem/allocate" \
        --verify=crc32c --verify_interval=4096 --do_verify=1 --verify_fatal=1 \
        --output-format=json --output="$out/p2p-n${i}-g${k}.json" 2> "$out/p2p-n${i}-g${k}.err"
      echo "P2P_N${i}_G${k}_STATUS=$?"
      echo "P2P_N${i}_G${k}_MAP_TYPES=$(map_types)"
    done
  done
  return 0
}

# aggregate PAIRS NAME: NVMe i reads into the p2pmem of the GPU below its
# own switch (found here by the sysfs path: the same parent of its port),
# for the first PAIRS pairs at once, 1 MiB at queue depth 4, for RUNTIME s.
# `single` is nvme0 -> gpu0 alone, `aggregate` all four.
same_switch_gpu() {
  local nvme_switch k
  nvme_switch=$(dirname "$(dirname "$(path_of "$1")")")
  for k in "${!gpu_bdfs[@]}"; do
    [ "$(dirname "$(dirname "$(path_of "${gpu_bdfs[$k]}")")")" = "$nvme_switch" ] && echo "${gpu_bdfs[$k]}"
  done
}
aggregate() {
  local i pairs=$1 name=$2 gpus=()
  for i in $(seq 0 $((pairs - 1))); do
    gpus+=("$(same_switch_gpu "${nvme_bdfs[$i]}")")
    echo "${name^^}_N${i}_GPU=${gpus[$i]}"
  done
  {
    printf '[global]\ndirect=1\nrw=read\nbs=1M\niodepth=4\nioengine=libaio\nsize=128M\n'
    printf 'time_based=1\nruntime=%s\ngroup_reporting=1\n' "$RUNTIME"
    for i in $(seq 0 $((pairs - 1))); do
      printf '[n%sg]\nfilename=%s\niomem=mmapshared:/sys/bus/pci/devices/%s/p2pmem/allocate\n' \
        "$i" "${nss[$i]}" "${gpus[$i]}"
    done
  } > "$out/$name.fio"
  fio --output-format=json --output="$out/$name.json" "$out/$name.fio" 2> "$out/$name.err"
}

# queues1/queuesN: 4 KiB random reads at queue depth 16 over the four
# namespaces (round robin), from JOBS jobs, job n pinned to CPU n: each
# CPU submits on its own I/O queue of every controller.
queues() {
  local jobs=$1 name=$2 files
  files=$(printf '%s:' "${nss[@]}")
  fio --name="$name" --filename="${files%:}" --file_service_type=roundrobin --direct=1 \
    --rw=randread --bs=4k --iodepth=16 --ioengine=libaio --size=64M --time_based=1 \
    --runtime="$RUNTIME" --numjobs="$jobs" --cpus_allowed="0-$((jobs - 1))" --cpus_allowed_policy=split \
    --group_reporting=1 --output-format=json --output="$out/$name.json" 2> "$out/$name.err"
}

[ "$DGX_MODE" = bench ] || phase pairs pairs
phase single aggregate 1 single
phase aggregate aggregate 4 aggregate
phase queues1 queues 1 queues1
phase queuesn queues "$vcpus" queuesn
exit 0
