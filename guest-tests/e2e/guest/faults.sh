#!/bin/bash
# The faults suite's guest script (tests/faults.rs), one boot of `lab`:
# before each phase it signals ready-PHASE in /run/p2plab, waits for the
# host to arm nvme0's fault (armed-PHASE), reads, reports how Linux's
# nvme driver reacted, and signals done-PHASE; then the faults it arms
# itself through its control port and OCP Error Injection.
set -u
# The block I/O timeout the test sets for the namespace (ms).
: "${IO_TIMEOUT_MS:?milliseconds}"
say() { echo "$1=$2"; }
signal() { : > /run/p2plab/.$1; mv /run/p2plab/.$1 /run/p2plab/$1; }
wait_host() { i=0; until [ -e /run/p2plab/$1 ]; do sleep 0.2; i=$((i+1)); [ $i -lt 3000 ] || { echo "no $1 from the host"; exit 1; }; done; }
# blk_md5 BLOCK4K: md5 of one 4 KiB block read with O_DIRECT ("error" if it fails).
blk_md5() { dd if=$ns bs=4096 skip=$1 count=1 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1; }
pat_md5() { dd if=/run/p2plab/pattern.bin bs=4096 skip=$1 count=1 2>/dev/null | md5sum | cut -d' ' -f1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

ns=$(p2plab-nvme-ns 1)
disk=/sys/block/${ns#/dev/}
echo "$IO_TIMEOUT_MS" > $disk/queue/io_timeout
say IO_TIMEOUT_MS "$(cat $disk/queue/io_timeout)"
# 4 MiB of pattern over LBAs 0-8191.
dd if=/dev/urandom of=/run/p2plab/pattern.bin bs=1M count=4 2>/dev/null
dd if=/run/p2plab/pattern.bin of=$ns bs=1M oflag=direct 2>/dev/null; say PATTERN_WRITE_STATUS $?
say BASE_TIMEOUT_LINES "$(dmesg | grep -c -E 'nvme.*timeout')"

# --- 1. timeout on the read of LBA 2048 (4 KiB block 256) --------------------------
signal ready-timeout; wait_host armed-timeout
t0=$(now_ms)
got=$(blk_md5 256)
say TIMEOUT_READ_MS $(( $(now_ms) - t0 ))
say TIMEOUT_READ_OK "$([ "$got" = "$(pat_md5 256)" ] && echo 1 || echo 0)"
say TIMEOUT_ABORTING "$(dmesg | grep -c 'timeout, aborting')"
say TIMEOUT_ABORT_STATUS_0 "$(dmesg | grep -c 'Abort status: 0x0')"
say TIMEOUT_RESETS "$(dmesg | grep -c -E 'reset controller|will reset')"
say TIMEOUT_VERIFY "$(cmp -s <(dd if=$ns bs=1M count=4 iflag=direct 2>/dev/null) /run/p2plab/pattern.bin && echo 1 || echo 0)"
signal done-timeout

# --- 1b. timeout that the Abort cannot abort, on LBA 2560 (4 KiB block 320) ------
signal ready-noabort; wait_host armed-noabort
t0=$(now_ms)
got=$(blk_md5 320)
say NOABORT_READ_MS $(( $(now_ms) - t0 ))
say NOABORT_READ_OK "$([ "$got" = "$(pat_md5 320)" ] && echo 1 || echo 0)"
say NOABORT_RESET_LOGGED "$(dmesg | grep -c 'timeout, reset controller')"
i=0; until [ "$(cat /sys/class/nvme/nvme0/state)" = live ] || [ $i -ge 300 ]; do sleep 0.2; i=$((i+1)); done
say NOABORT_STATE_AFTER "$(cat /sys/class/nvme/nvme0/state)"
signal done-noabort

# --- 2. media errors on LBAs 3000-3007 ---------------------------------------------
signal ready-media; wait_host armed-media
bad=
for lba in $(seq 2990 3017); do
  dd if=$ns of=/dev/null bs=512 skip=$lba count=1 iflag=direct 2>/dev/null || bad="$bad$lba,"
done
say MEDIA_BAD_LBAS "${bad%,}"
say MEDIA_DMESG "$(dmesg | grep -c 'critical medium error')"
nvme error-log /dev/nvme0 -e 4 -o json > /run/p2plab/error-log.json; say ERROR_LOG_STATUS $?
nvme smart-log /dev/nvme0 -o json > /run/p2plab/smart.json; say SMART_STATUS $?
# Rewrite the range from the pattern: it reads again, with the right data.
dd if=/run/p2plab/pattern.bin of=$ns bs=512 skip=3000 seek=3000 count=8 oflag=direct conv=notrunc 2>/dev/null
say MEDIA_REWRITE_STATUS $?
say MEDIA_HEALED "$(cmp -s <(dd if=$ns bs=512 skip=2990 count=28 iflag=direct 2>/dev/null) <(dd if=/run/p2plab/pattern.bin bs=512 skip=2990 count=28 2>/dev/null) && echo 1 || echo 0)"
signal done-media

# --- 3. CSTS.CFS on the read of LBA 4096 (4 KiB block 512) -------------------------
signal ready-cfs; wait_host armed-cfs
got=$(blk_md5 512); say CFS_READ_STATUS $?
say CFS_READ_OK "$([ "$got" = "$(pat_md5 512)" ] && echo 1 || echo 0)"
say CFS_RESET_LOGGED "$(dmesg | grep -c 'controller is down; will reset')"
i=0; until [ "$(cat /sys/class/nvme/nvme0/state)" = live ] || [ $i -ge 300 ]; do sleep 0.2; i=$((i+1)); done
say CFS_STATE_AFTER "$(cat /sys/class/nvme/nvme0/state)"
fio --name=after-cfs --filename=$ns --rw=randrw --bs=4k --iodepth=8 --ioengine=libaio --direct=1 \
  --offset=64M --size=8M --verify=crc32c --do_verify=1 --verify_fatal=1 >/run/p2plab/fio-cfs.out 2>&1
say CFS_FIO_STATUS $?
signal done-cfs

# --- 3b. an internal error (the queue worker panics) on the read of LBA 6144 (4 KiB block 768)
signal ready-bug; wait_host armed-bug
got=$(blk_md5 768)
say BUG_READ_OK "$([ "$got" = "$(pat_md5 768)" ] && echo 1 || echo 0)"
say BUG_RESET_LOGGED "$(dmesg | grep -c 'controller is down; will reset')"
i=0; until [ "$(cat /sys/class/nvme/nvme0/state)" = live ] || [ $i -ge 300 ]; do sleep 0.2; i=$((i+1)); done
say BUG_STATE_AFTER "$(cat /sys/class/nvme/nvme0/state)"
signal done-bug

# --- 4. dropped interrupt on the read of LBA 5000 (4 KiB block 625) ----------------
signal ready-irq; wait_host armed-irq
t0=$(now_ms)
got=$(blk_md5 625)
say IRQ_READ_MS $(( $(now_ms) - t0 ))
say IRQ_READ_OK "$([ "$got" = "$(pat_md5 625)" ] && echo 1 || echo 0)"
say IRQ_POLLED "$(dmesg | grep -c 'timeout, completion polled')"
signal done-irq
# The host clears its injections after each phase; arming ours before that
# clear would lose them.
wait_host cleared-irq

# --- 5. the guest arms a fault itself, through its virtio-serial port -------------
p2plab-ctl nvme0 inject 'status=0x281,dnr,count=1,opcode=read,lba=6000-6007' > /run/p2plab/guest-inject.out 2>&1
say GUEST_INJECT_STATUS $?
dd if=$ns of=/dev/null bs=512 skip=6000 count=1 iflag=direct 2>/dev/null; say GUEST_FAULT_READ_STATUS $?
dd if=$ns of=/dev/null bs=512 skip=6000 count=1 iflag=direct 2>/dev/null; say GUEST_NEXT_READ_STATUS $?
p2plab-ctl nvme0 status --json > /run/p2plab/guest-status.json 2>/run/p2plab/guest-status.err
say GUEST_STATUS_STATUS $?
p2plab-ctl nvme0 inject 'status=0x281,cnt=1' > /run/p2plab/guest-bad.out 2>&1; say GUEST_BAD_SPEC_STATUS $?
p2plab-ctl nvme0 clear >/dev/null; say GUEST_CLEAR_STATUS $?
# The guest channel offers no reset (the guest has FLR), and reports the
# trace file's size against its cap.
p2plab-ctl nvme0 reset > /run/p2plab/guest-reset.out 2>&1; say GUEST_RESET_STATUS $?
p2plab-ctl nvme0 trace --json > /run/p2plab/guest-trace.json 2>&1; say GUEST_TRACE_STATUS $?

# --- 6. in band: OCP Error Injection (type 7, NAND corruption) through nvme-cli -----
# Entries: flags (bit 0 enable, bit 1 single), reserved, type (LE16), NRTDP, zeros.
{ printf '\001\000\007\000'; head -c 28 /dev/zero; } > /tmp/erri-on.bin
{ printf '\000\000\007\000'; head -c 28 /dev/zero; } > /tmp/erri-off.bin
nvme ocp set-error-injection /dev/nvme0 --no-uuid --number=1 --data=/tmp/erri-on.bin > /run/p2plab/ocp-set.out 2>&1
say OCP_SET_STATUS $?
nvme ocp get-error-injection /dev/nvme0 --no-uuid > /run/p2plab/ocp-get.out 2>&1; say OCP_GET_STATUS $?
# nvme-cli 2.13's get-error-injection passes no data buffer (it prints
# zeros): it shows the count; the generic get-feature reads the entries.
say OCP_GET_NUME "$(sed -n 's/.*(Current: \([0-9]*\)).*/\1/p' /run/p2plab/ocp-get.out)"
nvme get-feature /dev/nvme0 --feature-id=0xc0 --data-len=4064 --raw-binary > /run/p2plab/ocp-get.bin 2>/dev/null
say OCP_GET_RAW_STATUS $?
dd if=$ns of=/dev/null bs=512 skip=7000 count=1 iflag=direct 2>/dev/null; say OCP_READ_STATUS $?
nvme ocp set-error-injection /dev/nvme0 --no-uuid --number=1 --data=/tmp/erri-off.bin > /run/p2plab/ocp-clear.out 2>&1
say OCP_CLEAR_STATUS $?
dd if=$ns of=/dev/null bs=512 skip=7000 count=1 iflag=direct 2>/dev/null; say OCP_AFTER_STATUS $?

# --- the guest's view ------------------------------------------------------------
say KERNEL_COMPLAINTS "$(dmesg | grep -c -E 'BUG:|WARNING:|Oops|Call Trace|blocked for more than')"
say TIMEOUT_LINES "$(dmesg | grep -c -E 'nvme.*timeout')"
say RESET_LINES "$(dmesg | grep -c -E 'reset controller|will reset')"
dmesg | grep -E 'nvme|I/O error|medium' | tail -n 40
exit 0
