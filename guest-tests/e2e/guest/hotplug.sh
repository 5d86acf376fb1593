#!/bin/bash
# The hotplug suite's guest script (tests/hotplug.rs), one boot of `lab`:
# it keeps nvme0 and gpu0 busy while the host unplugs and re-plugs them
# through QMP, and reports what the guest saw. The two sides meet through
# files in /run/p2plab.
set -u
say() { echo "$1=$2"; }
# signal NAME: tell the host (atomically: it polls for the name).
signal() { : > /run/p2plab/.$1; mv /run/p2plab/.$1 /run/p2plab/$1; }
# wait_host NAME: wait for the host's file (bounded; the host fails first).
wait_host() { i=0; until [ -e /run/p2plab/$1 ]; do sleep 0.2; i=$((i+1)); [ $i -lt 3000 ] || { echo "no $1 from the host"; exit 1; }; done; }
# gone_within SECONDS PATH: 1 once PATH disappears, 0 on timeout.
gone_within() { i=0; while [ -e "$2" ]; do sleep 0.2; i=$((i+1)); [ $i -lt $(($1*5)) ] || { echo 0; return; }; done; echo 1; }
back_within() { i=0; until [ -e "$2" ]; do sleep 0.2; i=$((i+1)); [ $i -lt $(($1*5)) ] || { echo 0; return; }; done; echo 1; }
by_class() { for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "$1" ] && basename $d; done; }

# The namespace of the controller at a PCI address (names depend on probe
# order, and a controller still referenced keeps its name after removal).
ns_of() { c=$(ls -d /sys/bus/pci/devices/$1/nvme/nvme* 2>/dev/null | head -n1); [ -n "$c" ] && p2plab-nvme-ns --ctrl "$(basename $c)" 1 2>/dev/null; }
ns=$(p2plab-nvme-ns 1)
nvme_bdf=$(basename "$(readlink -f /sys/block/${ns#/dev/}/device/device)")
disk=/sys/block/${ns#/dev/}
gpu_bdf=$(by_class 0x030200 | head -n1)
say NVME_BDF "$nvme_bdf"
say GPU_BDF "$gpu_bdf"
say NVME_P2P_BEFORE "$(cat /sys/bus/pci/devices/$nvme_bdf/p2pmem/published)"

# --- 1. nvme0 under fio ------------------------------------------------------
dd if=/dev/urandom of=/run/p2plab/pattern.bin bs=1M count=16 2>/dev/null
dd if=/run/p2plab/pattern.bin of=$ns bs=1M oflag=direct 2>/dev/null; say PATTERN_WRITE_STATUS $?
say PATTERN_MD5 "$(md5sum < /run/p2plab/pattern.bin | cut -d' ' -f1)"
# Loops, not --time_based: after the removal the dead disk has capacity 0,
# so reads on the still-open fd return 0 bytes (EOF), and a time-based
# fio spins on those until its runtime ends. A loop ends at once and the
# next open fails.
fio --name=unplug --filename=$ns --rw=randread --bs=4k --iodepth=16 --ioengine=libaio \
  --direct=1 --loops=1000000 --size=64M \
  --output-format=json --output=/run/p2plab/fio-unplug.json >/dev/null 2>/run/p2plab/fio-unplug.err &
fio_pid=$!
# Beside fio, P2P reads from nvme0 straight into gpu0's p2pmem, in a loop
# that counts the passes it completed: the removal lands on P2P DMA too.
( n=0
  while p2plab-p2pio --p2pmem $gpu_bdf read --dev $ns --len 16M --chunk 1M > /run/p2plab/p2p-unplug.out 2>&1; do
    # Renamed into place: a reader never sees the file truncated by
    # the next pass's write (it did once, and read an empty count).
    n=$((n+1)); echo $n > /run/p2plab/p2p-passes.tmp && mv /run/p2plab/p2p-passes.tmp /run/p2plab/p2p-passes
  done ) &
p2p_pid=$!
# Unplug only once reads are flowing: the disk's read count grows, and at
# least one P2P pass has completed.
r0=$(awk '{print $1}' $disk/stat)
i=0; while [ "$(awk '{print $1}' $disk/stat)" -lt $((r0 + 1000)) ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
i=0; until [ -s /run/p2plab/p2p-passes ] || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done
say FIO_READS_BEFORE_UNPLUG $(( $(awk '{print $1}' $disk/stat) - r0 ))
say P2P_PASSES_BEFORE_UNPLUG "$(cat /run/p2plab/p2p-passes 2>/dev/null || echo 0)"
signal nvme-busy
# fio must end by itself (an I/O error), within a bound after the unplug.
i=0; while kill -0 $fio_pid 2>/dev/null && [ $i -lt 900 ]; do sleep 0.2; i=$((i+1)); done
if kill -0 $fio_pid 2>/dev/null; then say FIO_ENDED 0; kill -9 $fio_pid; else say FIO_ENDED 1; fi
wait $fio_pid; say FIO_STATUS $?
# So must the P2P loop: its pass in flight fails (EIO, or the vanished
# disk at the next open) and the loop stops.
i=0; while kill -0 $p2p_pid 2>/dev/null && [ $i -lt 900 ]; do sleep 0.2; i=$((i+1)); done
if kill -0 $p2p_pid 2>/dev/null; then say P2P_ENDED 0; kill -9 $p2p_pid; else say P2P_ENDED 1; fi
wait $p2p_pid
say NVME_PCI_GONE "$(gone_within 60 /sys/bus/pci/devices/$nvme_bdf)"
say NVME_DISK_GONE "$(gone_within 60 $disk)"
signal nvme-gone
wait_host nvme-replugged
# The fresh controller: live, with its namespace.
i=0; ns=; until ns=$(ns_of $nvme_bdf) || [ $i -ge 300 ]; do sleep 0.2; i=$((i+1)); done
say NVME_DISK_BACK "$([ -b "$ns" ] && echo 1 || echo 0)"
ctrl=$(basename "$(ls -d /sys/bus/pci/devices/$nvme_bdf/nvme/nvme* | head -n1)")
say NVME_STATE "$(cat /sys/class/nvme/$ctrl/state 2>/dev/null)"
say READBACK_MD5 "$(dd if=$ns bs=1M count=16 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
say NVME_P2P_AFTER "$(cat /sys/bus/pci/devices/$nvme_bdf/p2pmem/published 2>/dev/null)"
fio --name=after --filename=$ns --rw=randrw --bs=4k --iodepth=8 --ioengine=libaio --direct=1 \
  --offset=512M --size=8M --verify=crc32c --do_verify=1 >/run/p2plab/fio-after.out 2>&1
say FIO_AFTER_STATUS $?

# --- 2. gpu0, p2pmem mapped by a live process ----------------------------------
gpu=/sys/bus/pci/devices/$gpu_bdf
say GPU_P2P_BEFORE "$(cat $gpu/p2pmem/published)"
# A process maps 1 MiB of the GPU's p2pmem through sysfs, writes a pattern
# and keeps reading it back. On removal the kernel must zap that mapping
# (p2pdma removes the allocate file; kernfs unmaps its mmaps) so the
# pages' references drop and the removal can finish; the next access then
# faults with SIGBUS (exit status 128 + 7).
cat > /tmp/p2pmem-user.py <<'PY'
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
pattern = bytes(range(256)) * 4096
m[:] = pattern
ok = m[:] == pattern
print(f"MAPPED={int(ok)}", flush=True)
if not ok:
    sys.exit(3)
while True:
    if m[:] != pattern:
        print("MISMATCH=1", flush=True)
        sys.exit(4)
    time.sleep(0.02)
PY
python3 /tmp/p2pmem-user.py $gpu/p2pmem/allocate > /run/p2plab/p2pmem-user.out 2>&1 &
user_pid=$!
i=0; until grep -q '^MAPPED=' /run/p2plab/p2pmem-user.out || ! kill -0 $user_pid 2>/dev/null || [ $i -ge 300 ]; do sleep 0.1; i=$((i+1)); done
say P2PMEM_MAPPED "$(sed -n 's/^MAPPED=//p' /run/p2plab/p2pmem-user.out)"
signal gpu-mapped
say GPU_PCI_GONE "$(gone_within 120 $gpu)"
# The mapping's user must end by itself (SIGBUS), within a bound.
i=0; while kill -0 $user_pid 2>/dev/null && [ $i -lt 300 ]; do sleep 0.2; i=$((i+1)); done
if kill -0 $user_pid 2>/dev/null; then say P2PMEM_USER_ENDED 0; kill -9 $user_pid; else say P2PMEM_USER_ENDED 1; fi
wait $user_pid; say P2PMEM_USER_STATUS $?
say GPU_REMOVED "$(dmesg | grep -c "$gpu_bdf: p2plab-gpu0 removed")"
signal gpu-gone
wait_host gpu-replugged
say GPU_DRIVER_BACK "$(back_within 60 /sys/bus/pci/drivers/p2plab_gpu/$gpu_bdf)"
# The p2pmem folder appears when the driver adds the resource and reads 0
# until it publishes it a moment later: wait for the 1 (bounded).
i=0; until [ "$(cat $gpu/p2pmem/published 2>/dev/null)" = 1 ] || [ $i -ge 100 ]; do sleep 0.2; i=$((i+1)); done
say GPU_P2P_AFTER "$(cat $gpu/p2pmem/published 2>/dev/null)"
p2plab-gpu-tool fill32 0 1M 0x5a17c0de >/dev/null; say GPU_FILL_STATUS $?
say GPU_FILL_CRC "$(p2plab-gpu-tool checksum 0 1M)"
printf '\xde\xc0\x17\x5a' > /tmp/fill.bin
for i in $(seq 18); do cat /tmp/fill.bin /tmp/fill.bin > /tmp/fill2.bin; mv /tmp/fill2.bin /tmp/fill.bin; done
say GPU_FILL_EXPECTED_CRC "$(p2plab-gpu-tool crc32c /tmp/fill.bin)"

# --- 3. P2P between the re-plugged devices -------------------------------------
say PATTERN_CRC "$(p2plab-gpu-tool crc32c /run/p2plab/pattern.bin)"
p2plab-p2pio --p2pmem $gpu_bdf read --dev $ns --len 16M --chunk 1M \
  --hook 'p2plab-gpu-tool checksum $P2P_BAR_OFFSET $P2P_LEN > /run/p2plab/n2g.crc' \
  > /run/p2plab/n2g.out 2>&1; say N2G_STATUS $?
sed 's/^/N2G_/' /run/p2plab/n2g.out
say N2G_GPU_CRC "$(cat /run/p2plab/n2g.crc 2>/dev/null)"

# --- the guest's view -----------------------------------------------------------
say KERNEL_COMPLAINTS "$(dmesg | grep -c -E 'BUG:|WARNING:|Oops|Call Trace|blocked for more than|refcount_t')"
say NVME_TIMEOUTS "$(dmesg | grep -c -E 'nvme.*(timeout|I/O tag .* QID)')"
dmesg | grep -E 'nvme|p2plab_gpu|I/O error|03:00|04:00' | tail -n 40
exit 0
