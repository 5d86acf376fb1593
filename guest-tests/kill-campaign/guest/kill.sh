#!/bin/bash
# The guest side of one boot of the kill campaign (src/lib.rs has the
# steps). The host appends the boot's plan as calls of the functions
# below: the slots to verify, the file system check, then per round the
# write, the in-flight writes and the end of the round, in this shape:
#
#   verify_slot SEED SLOT boot ...   every slot earlier boots wrote
#   fs_create | fs_check R...        the ext4 partition
#   checkpoint ready
#   round_write R SLOT SEED          each round of the boot ...
#   fs_write R                       ... the boot's last round only
#   start_inflight
#   quiesce                          ... all rounds but the last
#   flushed R
#   after_replug R; verify_slot SEED SLOT rR ...; checkpoint checked-R
#                                    ... or, last: await_qemu_kill
#   boot_done                        a boot without rounds
#
# Every fact goes to the console and, with the next signal, to the host.
set -u
# Where the slots are (MiB: the first slot's offset and a slot's size),
# and the scratch region the in-flight writes go to (MiB).
: "${SLOTS_MIB:?offset}" "${SLOT_MIB:?size}"
: "${SCRATCH_OFFSET_MIB:?offset}" "${SCRATCH_MIB:?size}"
: > /tmp/facts
# fact KEY VALUE: printed, and kept for the next signal file.
fact() { echo "$1=$2"; echo "$1=$2" >> /tmp/facts; }
# signal NAME: hand the facts so far to the host (atomically: it polls).
signal() { cp /tmp/facts /run/p2plab/."$1"; : > /tmp/facts; mv /run/p2plab/."$1" /run/p2plab/"$1"; }
wait_host() { i=0; until [ -e /run/p2plab/"$1" ]; do sleep 0.2; i=$((i+1)); [ $i -lt 3000 ] || { echo "no $1 from the host"; exit 1; }; done; }
# The namespace of the controller at a PCI address (a re-plugged
# controller may get another name while the old one is still referenced).
ns_of() {
  c=$(ls -d /sys/bus/pci/devices/"$1"/nvme/nvme* 2>/dev/null | head -n1)
  [ -n "$c" ] && p2plab-nvme-ns --ctrl "$(basename "$c")" 1 2>/dev/null
}
# fio_slot SEED SLOT NAME [fio options]: the one job that writes a slot and
# verifies it later. A single job per fio run on purpose: fio derives its
# random streams from the seed and the job's number, so the verify run must
# be the same job shape as the write run.
fio_slot() {
  seed=$1 slot=$2 name=$3; shift 3
  fio --name=slot$slot --filename=$ns --rw=randwrite --bs=4k --offset=$((SLOTS_MIB + slot * SLOT_MIB))M \
    --size=${SLOT_MIB}M --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c \
    --randrepeat=1 --randseed=$seed --verify_state_save=0 --output-format=json \
    --output=/run/p2plab/$name.json \
    "$@" >/dev/null 2>/run/p2plab/$name.err
}
# verify_slot SEED SLOT TAG: fio reads the slot back and checks every
# block's header (offset, seed) and crc32c.
verify_slot() { fio_slot "$1" "$2" "verify-$3-slot$2" --verify_only=1; fact "VERIFY_$3_SLOT$2" $?; }
complaints() { dmesg | grep -c -E 'BUG:|Oops|Call Trace|refcount_t|blocked for more than'; }
writes_done() { awk '{print $5}' /sys/block/${ns#/dev/}/stat; }
inflight_now() { awk '{print $1 + $2}' /sys/block/${ns#/dev/}/inflight; }

# checkpoint NAME: the kernel's complaints so far, then the facts to the
# host as NAME.
checkpoint() {
  fact KERNEL_COMPLAINTS "$(complaints)"
  signal "$1"
}

# fs_create: the first boot makes the ext4 file system in partition 1,
# whose table the host wrote.
fs_create() {
  fact FS_PARTITION "$([ -b "${ns}p1" ] && echo 0 || echo 1)"
  mkfs.ext4 -q -F -E nodiscard ${ns}p1 >/run/p2plab/mkfs.out 2>&1
  fact FS_MKFS $?
}

# fs_check R...: a later boot mounts the file system the killed QEMU left
# (journal replay), compares the file each round R fsynced there, and runs
# e2fsck -fn.
fs_check() {
  mount -t ext4 ${ns}p1 /mnt/fs
  fact FS_MOUNT $?
  for r in "$@"; do
    cmp -s /mnt/fs/round-"$r".bin /mnt/host/fs-round-"$r".bin
    fact "FS_FILE_$r" $?
  done
  umount /mnt/fs
  fact FS_UMOUNT $?
  e2fsck -fn ${ns}p1 >/run/p2plab/fsck.out 2>&1
  fact FSCK $?
}

# round_write R SLOT SEED: round R writes SLOT with fio's verify pattern
# for SEED and fsyncs (an NVMe Flush), then copies what the device returns
# to the shared folder: what the controller acknowledged.
round_write() {
  local r=$1 slot=$2 seed=$3
  fio_slot "$seed" "$slot" "write-$r" --do_verify=0 --end_fsync=1
  fact WRITE_STATUS $?
  dd if=$ns of=/mnt/host/slot-"$slot".bin bs=1M skip=$((SLOTS_MIB + slot * SLOT_MIB)) count=$SLOT_MIB iflag=direct 2>/dev/null
  fact COPY_STATUS $?
}

# fs_write R: the boot's last round writes a file in the file system with
# fsync, and keeps unflushed writes to another one going while QEMU is
# killed.
fs_write() {
  mount -t ext4 ${ns}p1 /mnt/fs
  fact FS_MOUNT $?
  head -c 1048576 /dev/urandom > /mnt/host/fs-round-"$1".bin
  dd if=/mnt/host/fs-round-"$1".bin of=/mnt/fs/round-"$1".bin bs=1M conv=fsync 2>/dev/null && sync -f /mnt/fs
  fact FS_WRITE $?
  dd if=/dev/urandom of=/mnt/fs/unflushed-"$1".bin bs=64k count=4096 2>/dev/null &
}

# start_inflight: unflushed writes to the scratch region, in flight until
# the kill (one process: fio runs its job as a thread); waits until 100 of
# them have completed.
start_inflight() {
  w0=$(writes_done)
  fio --name=inflight --filename=$ns --rw=randwrite --bs=64k --offset=${SCRATCH_OFFSET_MIB}M \
    --size=${SCRATCH_MIB}M --direct=1 --ioengine=libaio --iodepth=16 --time_based --runtime=3600 \
    --thread >/dev/null 2>&1 &
  inflight=$!
  i=0; while [ "$(writes_done)" -lt $((w0 + 100)) ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
  fact INFLIGHT_WRITES $(( $(writes_done) - w0 ))
}

# quiesce: rounds that re-plug within the boot stop the scratch writer and
# let its requests drain before the kill: QEMU 11.1 can abort when a
# server dies while the guest drives the device. The unflushed writes were
# still acknowledged and never flushed.
quiesce() {
  kill -STOP $inflight
  i=0; while [ "$(inflight_now)" != 0 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
}

# flushed R: the requests still in flight, then tell the host to kill.
flushed() {
  fact INFLIGHT_AT_KILL "$(inflight_now)"
  signal "flushed-$1"
}

# await_qemu_kill: the boot's last round; the host kills the server, then
# QEMU, while this sleeps.
await_qemu_kill() {
  sleep 3600
  echo 'QEMU was not killed'
  exit 1
}

# after_replug R: once the host has plugged a fresh server in, stop the
# scratch writer and find the namespace again.
after_replug() {
  wait_host "replugged-$1"
  kill -9 $inflight 2>/dev/null; kill -CONT $inflight 2>/dev/null; wait $inflight 2>/dev/null
  i=0; ns=; until ns=$(ns_of $bdf) || [ $i -ge 300 ]; do sleep 0.2; i=$((i+1)); done
  fact BACK "$([ -b "$ns" ] && echo 1 || echo 0)"
}

# boot_done: a boot without rounds ends once it has verified.
boot_done() {
  exit 0
}

ns=$(p2plab-nvme-ns 1) || { echo "no NVMe namespace"; exit 1; }
bdf=$(basename "$(readlink -f /sys/block/${ns#/dev/}/device/device)")
fact NVME_BDF $bdf
mkdir -p /mnt/fs
