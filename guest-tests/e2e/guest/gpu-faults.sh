#!/bin/bash
# The gpu_faults suite's guest script (tests/gpu_faults.rs), one boot of
# `lab`: before each phase it signals ready-PHASE in /run/p2plab, waits
# for the host to arm gpu0's fault (armed-PHASE), runs a job, reports what
# the p2plab_gpu driver returned and counted, and signals done-PHASE; then
# a fault it arms itself through its control port.
set -u
# Job timeouts (ms): the hung job's, and the one whose interrupt is
# dropped (the driver's fence poll must find it long before).
: "${HANG_TIMEOUT_MS:?milliseconds}" "${IRQ_TIMEOUT_MS:?milliseconds}"
say() { echo "$1=$2"; }
signal() { : > /run/p2plab/.$1; mv /run/p2plab/.$1 /run/p2plab/$1; }
wait_host() { i=0; until [ -e /run/p2plab/$1 ]; do sleep 0.2; i=$((i+1)); [ $i -lt 3000 ] || { echo "no $1 from the host"; exit 1; }; done; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# raw_status OUT: the status field of the tool's "status 0x.. result .. fence .." line.
raw_status() { set -- $1; echo "${2:-none}"; }

sys=/sys/class/p2plab-gpu/p2plab-gpu0
[ -d $sys ] || { echo "no $sys"; exit 1; }
say BASE_RESETS "$(cat $sys/engine_resets)"
say BASE_IRQ_RECOVERIES "$(cat $sys/irq_recoveries)"
say BASE_RESET_LINES "$(dmesg | grep -c 'resetting the engine')"
head -c 1048576 /dev/zero | tr '\0' '\132' > /tmp/z.bin
say EXPECTED_CRC "$(p2plab-gpu-tool crc32c /tmp/z.bin)"

# --- 1. an injected job error on a FILL -----------------------------------------
signal ready-error; wait_host armed-error
out=$(p2plab-gpu-tool -U raw 4 0 0 1M 0x5a5a5a5a); say ERROR_RAW_EXIT $?
say ERROR_STATUS "$(raw_status "$out")"
p2plab-gpu-tool fill 0 1M 0x5a; say ERROR_NEXT_FILL_EXIT $?
say ERROR_NEXT_CRC "$(p2plab-gpu-tool checksum 0 1M)"
signal done-error; wait_host cleared-error

# --- 2. a hung CHECKSUM: timeout, engine reset, next job -------------------------
signal ready-hang; wait_host armed-hang
p2plab-gpu-tool -t "$HANG_TIMEOUT_MS" checksum 0 1M >/dev/null 2>&1; say HANG_EXIT $?
say HANG_RESETS "$(cat $sys/engine_resets)"
say HANG_RESET_LINES "$(dmesg | grep -c 'resetting the engine')"
say HANG_NEXT_CRC "$(p2plab-gpu-tool -t 20000 checksum 0 1M)"
say HANG_BROKEN "$(p2plab-gpu-tool info | sed -n 's/^broken: //p')"
signal done-hang; wait_host cleared-hang

# --- 3. a NOP whose interrupt is dropped -----------------------------------------
signal ready-irq; wait_host armed-irq
t0=$(now_ms)
p2plab-gpu-tool -t "$IRQ_TIMEOUT_MS" nop >/dev/null; say IRQ_EXIT $?
say IRQ_MS $(( $(now_ms) - t0 ))
say IRQ_RECOVERIES "$(cat $sys/irq_recoveries)"
signal done-irq; wait_host cleared-irq

# --- 4. a VRAM error range -------------------------------------------------------
signal ready-vram; wait_host armed-vram
out=$(p2plab-gpu-tool -U raw 5 0x1f0000 0 0x20000); say VRAM_RAW_EXIT $?
say VRAM_STATUS "$(raw_status "$out")"
p2plab-gpu-tool checksum 0x100000 0x100000 >/dev/null; say VRAM_BELOW_EXIT $?
p2plab-gpu-tool checksum 0x210000 0x10000 >/dev/null; say VRAM_ABOVE_EXIT $?
say VRAM_ERRORS "$(cat $sys/vram_errors)"
say VRAM_ERROR_ADDR "$(cat $sys/vram_error_addr)"
say VRAM_ERROR_LINES "$(dmesg | grep -c 'VRAM error at offset')"
signal done-vram; wait_host cleared-vram

# --- 5. the guest arms a fault itself ---------------------------------------------
p2plab-ctl gpu0 inject 'job-error=0x03,count=1,opcode=nop' >/dev/null; say GUEST_INJECT_EXIT $?
out=$(p2plab-gpu-tool -U raw 0 0 0 0); say GUEST_RAW_EXIT $?
say GUEST_STATUS "$(raw_status "$out")"
p2plab-gpu-tool nop >/dev/null; say GUEST_NEXT_EXIT $?
p2plab-ctl gpu0 inject 'job-error=0x07' >/dev/null 2>&1; say GUEST_BAD_SPEC_EXIT $?
p2plab-ctl gpu0 clear >/dev/null; say GUEST_CLEAR_EXIT $?

say KERNEL_COMPLAINTS "$(dmesg | grep -c -E 'BUG:|WARNING:|Oops|Call Trace|blocked for more than')"
dmesg | grep -E 'p2plab_gpu' | tail -n 20
exit 0
