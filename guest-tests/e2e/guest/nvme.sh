#!/bin/bash
# The nvme suite's guest script (tests/nvme.rs), one boot of `lab-pmr`
# with a second namespace: nvme-cli, fio, stress-ng under blktrace, a
# reset, the CMB, then the PMR and namespace 1 across a restart of nvme0's
# server that the host does while the guest waits (pmr-written,
# pmr-replugged in /run/p2plab). Most answers go to JSON files in
# /run/p2plab, the rest are KEY=VALUE facts.
# The status of `echo ... > /sys/...` is the status of that sysfs write.
# shellcheck disable=SC2320
set -u
# The PMR phase: bytes written at the PMR's head and at its tail (which
# starts at PMR_TAIL), their pcimem seeds, and where namespace 1's 4 MiB
# blob goes (MiB).
: "${PMR_SPAN:?bytes}" "${PMR_TAIL:?offset}" "${PMR_HEAD_SEED:?seed}" "${PMR_TAIL_SEED:?seed}"
: "${NS_MIB:?offset in MiB}"
out=/run/p2plab
fail() { echo "FAILED: $*"; exit 1; }
# Namespaces by NSID: Linux names them in probe order, which varies.
ns1=$(p2plab-nvme-ns 1) || fail "no namespace 1"
ns2=$(p2plab-nvme-ns 2) || fail "no namespace 2"
[ -b $ns1 ] && [ -b $ns2 ] || fail "no block devices for $ns1 $ns2"
ctrl=/sys/class/nvme/nvme0
bdf=$(basename "$(readlink -f $ctrl/device)")

nvme list -o json > $out/list.json
nvme id-ctrl /dev/nvme0 -o json > $out/id-ctrl.json
nvme id-ns $ns1 -o json > $out/id-ns1.json
nvme id-ns $ns2 -o json > $out/id-ns2.json
nvme id-ctrl /dev/nvme0 -H > $out/id-ctrl-human.txt; echo "ID_CTRL_HUMAN_STATUS=$?"
nvme id-ns $ns1 -H > $out/id-ns1-human.txt; echo "ID_NS_HUMAN_STATUS=$?"
nvme ns-descs $ns1 -o json > $out/ns-descs1.json
nvme ns-descs $ns2 -o json > $out/ns-descs2.json
echo "BOGUS_IDS=$(dmesg | grep -c 'bogus')"

# Data-path commands, each checked by reading back.
dd if=/dev/urandom of=/tmp/rand bs=4096 count=16 2>/dev/null
dd if=/tmp/rand of=$ns1 bs=4096 count=16 oflag=direct 2>/dev/null
cmp <(dd if=$ns1 bs=4096 count=16 iflag=direct 2>/dev/null) /tmp/rand && echo "READBACK=ok" || echo "READBACK=bad"
nvme write-zeroes $ns1 --start-block=8 --block-count=7 >/dev/null && echo "WZ_CMD=ok"
zeros=$(dd if=$ns1 bs=512 skip=8 count=8 iflag=direct 2>/dev/null | tr -d '\0' | wc -c)
echo "WZ_NONZERO_BYTES=$zeros"
kept=$(cmp <(dd if=$ns1 bs=512 count=8 iflag=direct 2>/dev/null) <(dd if=/tmp/rand bs=512 count=8 2>/dev/null) && echo ok || echo bad)
echo "WZ_NEIGHBOURS=$kept"
nvme dsm $ns1 --ad --slbs=32 --blocks=32 >/dev/null && echo "DSM_CMD=ok"
echo "DSM_NONZERO_BYTES=$(dd if=$ns1 bs=512 skip=32 count=32 iflag=direct 2>/dev/null | tr -d '\0' | wc -c)"
nvme flush $ns1 >/dev/null && echo "FLUSH_CMD=ok"

# fio verify workloads: sizes, depths, engines, several jobs on several queues.
# 4 KiB runs write 8 MiB (2,048 commands, 64 times queue depth 32, so the
# submission queue wraps many times); 128 KiB runs 32 MiB (PRP lists).
for bs in 4k 128k; do for qd in 1 32; do for engine in libaio io_uring; do
  size=32M; [ $bs = 4k ] && size=8M
  fio --name=v --filename=$ns1 --direct=1 --rw=randwrite --bs=$bs --iodepth=$qd \
      --ioengine=$engine --size=$size --offset=64M --verify=crc32c --do_verify=1 \
      --verify_fatal=1 --output-format=terse >/dev/null 2>$out/fio.err \
    && echo "FIO_${bs}_QD${qd}_${engine}=ok" || { echo "FIO_${bs}_QD${qd}_${engine}=failed"; cat $out/fio.err; }
done; done; done
fio --name=par --filename=$ns2 --direct=1 --rw=randrw --bs=16k --iodepth=16 \
    --ioengine=io_uring --numjobs=4 --size=16M --offset_increment=32M --verify=md5 \
    --verify_fatal=1 --group_reporting --output-format=terse >/dev/null 2>$out/fio.err \
  && echo "FIO_PARALLEL=ok" || { echo "FIO_PARALLEL=failed"; cat $out/fio.err; }
echo "IO_QUEUES=$(ls -d /sys/block/${ns1#/dev/}/mq/* | wc -l)"

# What foreign suites look for in a guest.
[ -f "/boot/config-$(uname -r)" ] && grep -q '^CONFIG_PCI_P2PDMA=y' "/boot/config-$(uname -r)"
echo "KERNEL_CONFIG_STATUS=$?"
mountpoint -q /sys/kernel/debug; echo "DEBUGFS_STATUS=$?"
for tool in udevadm xfs_io xfs_repair e2fsck mkfs.xfs losetup lsblk findmnt wipefs sfdisk \
            blkdiscard blkzone stress-ng blktrace blkparse fio nvme python3; do
  command -v $tool >/dev/null || echo "MISSING_TOOL=$tool"
done
udevadm --version >/dev/null; echo "UDEVADM_STATUS=$?"

# python3-libnvme sees the same controller: its tree of hosts,
# subsystems and controllers, as JSON.
python3 - > $out/libnvme.json 2>$out/libnvme.err <<'PY'
import json
from libnvme import nvme
root = nvme.root()
found = []
for host in root.hosts():
    for subsystem in host.subsystems():
        for ctrl in subsystem.controllers():
            found.append({"name": ctrl.name, "serial": ctrl.serial,
                          "model": ctrl.model, "firmware": ctrl.firmware,
                          "transport": ctrl.transport})
print(json.dumps({"controllers": found}))
PY
echo "LIBNVME_STATUS=$?"

# A known error first, so the error log has an entry whose every field
# the host can predict: a read one block past the end of namespace 1.
nsze1=$(blockdev --getsz $ns1)
echo "NS1_SECTORS=$nsze1"
nvme read $ns1 --start-block=$nsze1 --block-count=0 --data-size=512 --data=/dev/null >/dev/null 2>&1
echo "READ_PAST_END_STATUS=$?"
nvme smart-log /dev/nvme0 -o json > $out/smart.json
nvme error-log /dev/nvme0 -e 8 -o json > $out/error-log.json
nvme fw-log /dev/nvme0 -o json > $out/fw-log.json
# Every feature identifier 1..31, each answer kept as JSON with the
# nvme-cli exit status (0 = answered); the host decides which must answer.
# Error Recovery (5) is namespace specific: ask namespace 1 for it.
for f in $(seq 1 31); do
  nsid=0; [ $f = 5 ] && nsid=1
  nvme get-feature /dev/nvme0 -f $f -n $nsid -o json > $out/feature-$f.json 2>/dev/null
  echo "FEATURE_STATUS_$f=$?"
done
nvme set-feature /dev/nvme0 -f 4 --value=336 >/dev/null 2>&1
echo "SET_FEATURE_4_STATUS=$?"
nvme get-feature /dev/nvme0 -f 4 -o json > $out/feature-4-after-set.json 2>/dev/null

# Compare and Verify: a match succeeds, a mismatch fails with Compare
# Failure; Verify reads the blocks back inside the device.
dd if=$ns1 of=/tmp/block0 bs=512 count=1 iflag=direct 2>/dev/null
nvme compare $ns1 --start-block=0 --block-count=0 --data-size=512 --data=/tmp/block0 >/dev/null 2>&1
echo "COMPARE_SAME_STATUS=$?"
head -c 512 /dev/zero > /tmp/zero512
cmp -s /tmp/block0 /tmp/zero512 && echo "COMPARE_BLOCK0=zero" || echo "COMPARE_BLOCK0=data"
nvme compare $ns1 --start-block=0 --block-count=0 --data-size=512 --data=/tmp/zero512 >/dev/null 2>&1
echo "COMPARE_DIFFERENT_STATUS=$?"
nvme verify $ns1 --start-block=0 --block-count=15 >/dev/null 2>&1
echo "VERIFY_STATUS=$?"
nvme verify $ns1 --start-block=$((nsze1 - 4)) --block-count=15 >/dev/null 2>&1
echo "VERIFY_PAST_END_STATUS=$?"

# Registers as nvme-cli decodes them (BAR0 mmap: needs iomem=relaxed).
nvme show-regs /dev/nvme0 -o json > $out/regs.json 2>$out/regs.err
echo "SHOW_REGS_STATUS=$?"
sed -n 3p $ctrl/device/resource | { read start _ _; echo "BAR2_START=$start"; }
sed -n 5p $ctrl/device/resource | { read start end _; echo "BAR4_SIZE=$((end - start + 1))"; }

# Format namespace 2 from 4096- to 512-byte blocks: user data erased,
# the block layer sees the new size.
dd if=/dev/urandom of=$ns2 bs=1M count=1 oflag=direct 2>/dev/null
nvme format $ns2 --block-size=512 --ses=1 --force >/dev/null 2>$out/format.err
echo "FORMAT_STATUS=$?"
for i in $(seq 1 50); do [ "$(blockdev --getss $ns2 2>/dev/null)" = 512 ] && break; sleep 0.1; done
echo "FORMAT_SECTOR_SIZE=$(blockdev --getss $ns2)"
echo "FORMAT_NONZERO_BYTES=$(dd if=$ns2 bs=1M count=1 iflag=direct 2>/dev/null | tr -d '\0' | wc -c)"
nvme id-ns $ns2 -o json > $out/id-ns2-formatted.json

# stress-ng's I/O stressor on ext4 on namespace 2, traced by blktrace: the
# guest's count of read and write requests must equal what the device
# counted in namespace 2's SMART log over the same window; e2fsck -n finds
# the file system clean afterwards. mkfs initialises inode tables and the
# journal itself: ext4's lazy init would issue Write Zeroes in the window,
# which the device counts as writes and this blktrace does not report.
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 $ns2 >/dev/null 2>&1; echo "STRESS_MKFS_STATUS=$?"
mkdir -p /mnt/stress
# The queue runs write-through in the window: with a volatile write cache,
# PREFLUSH writes go through the block layer's flush sequence, whose
# blktrace events did not match the device's commands one for one (one
# write short in two of three runs, the trace naming sector 0).
q=/sys/block/${ns2#/dev/}/queue
echo "write through" > $q/write_cache; echo "STRESS_WRITE_THROUGH_STATUS=$?"
blktrace -d $ns2 -D /tmp -o stress > $out/blktrace.out 2>&1 &
tracer=$!
# The trace runs once a probe read (of the last sector, which the workload
# never touches) reaches the trace files; only then the window opens.
last=$(( $(blockdev --getsz $ns2) - 1 ))
for i in $(seq 1 100); do
  dd if=$ns2 of=/dev/null bs=512 skip=$last count=1 iflag=direct 2>/dev/null
  sleep 0.1
  [ "$(cat /tmp/stress.blktrace.* 2>/dev/null | wc -c)" -gt 0 ] && break
done
nvme smart-log /dev/nvme0 -n 2 -o json > $out/smart-ns2-before.json
mount -t ext4 $ns2 /mnt/stress; echo "STRESS_MOUNT_STATUS=$?"
stress-ng --hdd 2 --hdd-ops 400 --hdd-bytes 8M --hdd-opts direct,wr-rnd,rd-rnd \
  --temp-path /mnt/stress --metrics-brief > $out/stress-ng.out 2>&1
echo "STRESS_STATUS=$?"
umount /mnt/stress; echo "STRESS_UMOUNT_STATUS=$?"
sync
# Flush commands straight to the device (write-through keeps the block
# layer from sending any): they are neither reads nor writes in SMART.
flushes=0
for i in 1 2 3 4; do nvme flush $ns2 >/dev/null 2>&1 && flushes=$((flushes + 1)); done
echo "STRESS_FLUSHES=$flushes"
kill -INT $tracer; wait $tracer; echo "BLKTRACE_STATUS=$?"
echo "write back" > $q/write_cache
nvme smart-log /dev/nvme0 -n 2 -o json > $out/smart-ns2-after.json
# Completed requests by direction: RWBS holds R or W for data requests
# (flushes are F, discards D, neither counted by SMART as reads/writes).
blkparse -i /tmp/stress -D /tmp -f '%a %d %S\n' -q > $out/blkparse.txt 2>$out/blkparse.err
echo "BLKPARSE_STATUS=$?"
count() { awk -v rw=$1 -v probe=$last '$1 == "C" && $2 ~ rw && $3 != probe { n++ } END { print n + 0 }' $out/blkparse.txt; }
echo "TRACE_READS=$(count R)"
echo "TRACE_WRITES=$(count W)"
e2fsck -f -n $ns2 > $out/e2fsck.out 2>&1; echo "E2FSCK_STATUS=$?"

# A controller reset: the namespace works again afterwards.
before_reset=$(dd if=$ns1 bs=1M count=4 iflag=direct 2>/dev/null | md5sum)
nvme reset /dev/nvme0 >/dev/null 2>&1
echo "RESET_STATUS=$?"
for i in $(seq 1 100); do [ "$(cat $ctrl/state)" = live ] && break; sleep 0.1; done
echo "RESET_STATE=$(cat $ctrl/state)"
[ "$(dd if=$ns1 bs=1M count=4 iflag=direct 2>/dev/null | md5sum)" = "$before_reset" ] && echo "RESET_READBACK=ok" || echo "RESET_READBACK=bad"
# NVM Subsystem Reset: nvme-cli refuses unless CAP.NSSRS advertises it.
nvme subsystem-reset /dev/nvme0 >/dev/null 2>&1
echo "SUBSYSTEM_RESET_STATUS=$?"

# The CMB: registered and published as p2pmem, I/O SQs placed in it.
echo "CMBSZ=$(cat $ctrl/cmbsz)"
echo "CMBLOC=$(cat $ctrl/cmbloc)"
echo "P2P_ADDED=$(dmesg | grep -c "$bdf: added peer-to-peer DMA memory")"
echo "P2P_PUBLISHED=$(cat /sys/bus/pci/devices/$bdf/p2pmem/published)"
echo "P2P_SIZE=$(cat /sys/bus/pci/devices/$bdf/p2pmem/size)"

# The PMR (BAR4, trapped, written through to its file): a seeded pattern at
# its head and its tail through the sysfs resource mmap, then the host
# unplugs nvme0, restarts its server and plugs it again (QEMU 11.1 does not
# reconnect to a restarted server), and the guest reads the PMR back.
# Trapped accesses are one vfio-user round trip per 8 bytes: 64 KiB each.
pmr=/sys/bus/pci/devices/$bdf/resource4
echo "PMR_RESOURCE_BYTES=$(stat -c %s $pmr)"
p2plab-pcimem $pmr fill 0 $PMR_SPAN $PMR_HEAD_SEED; echo "PMR_FILL_HEAD_STATUS=$?"
p2plab-pcimem $pmr fill $PMR_TAIL $PMR_SPAN $PMR_TAIL_SEED; echo "PMR_FILL_TAIL_STATUS=$?"
p2plab-pcimem $pmr check 0 $PMR_SPAN $PMR_HEAD_SEED; echo "PMR_CHECK_BEFORE_STATUS=$?"
# Namespace data across the same restart: 4 MiB written through to
# namespace 1 now, read back through the fresh server after the re-plug
# (the host compares the stopped server's backing file with the blob).
dd if=/dev/urandom of=$out/blob bs=1M count=4 2>/dev/null
dd if=$out/blob of=$ns1 bs=1M seek=$NS_MIB oflag=direct conv=fsync 2>/dev/null; echo "NS_WRITE_STATUS=$?"
echo "NS_SUM_BEFORE=$(md5sum < $out/blob | cut -d' ' -f1)"
: > $out/.pmr-written; mv $out/.pmr-written $out/pmr-written
i=0; until [ -e $out/pmr-replugged ]; do sleep 0.2; i=$((i+1)); [ $i -lt 3000 ] || fail "no pmr-replugged from the host"; done
# The re-plugged controller at the same address, bound and live again.
i=0; until [ "$(cat /sys/bus/pci/devices/$bdf/nvme/nvme*/state 2>/dev/null)" = live ]; do
  sleep 0.2; i=$((i+1)); [ $i -lt 600 ] || break
done
echo "PMR_REPLUG_STATE=$(cat /sys/bus/pci/devices/$bdf/nvme/nvme*/state 2>/dev/null)"
ns1=$(p2plab-nvme-ns 1) || fail "no namespace 1 after the re-plug"
echo "NS_SUM_AFTER=$(dd if=$ns1 bs=1M skip=$NS_MIB count=4 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
p2plab-pcimem $pmr check 0 $PMR_SPAN $PMR_HEAD_SEED; echo "PMR_CHECK_HEAD_AFTER_STATUS=$?"
p2plab-pcimem $pmr check $PMR_TAIL $PMR_SPAN $PMR_TAIL_SEED; echo "PMR_CHECK_TAIL_AFTER_STATUS=$?"
# The comparison can fail: the head against the tail's seed.
p2plab-pcimem $pmr check 0 $PMR_SPAN $PMR_TAIL_SEED 2>/dev/null; echo "PMR_CHECK_WRONG_SEED_STATUS=$?"
dmesg | grep -iE 'nvme|p2p' | tail -n 20
exit 0
