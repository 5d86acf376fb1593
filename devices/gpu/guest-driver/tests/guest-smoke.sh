#!/bin/bash
# Guest-side smoke test of p2plab_gpu.ko and p2plab-gpu-tool, run inside the
# VM (bash, busybox, the tool on PATH or in /opt/p2plab/bin):
#   guest-smoke.sh [MODULE.ko]
# With MODULE.ko it (re)loads that file, else it uses modprobe p2plab_gpu.
# Prints "N passed, M failed" and exits non-zero on any failure; the last
# lines, SMOKE_PASSED=N SMOKE_FAILED=M SMOKE_SKIPPED=K, are for the e2e suite.
set -u
PATH="$PATH:/opt/p2plab/bin"
T=p2plab-gpu-tool
KO="${1:-}"
pass=0
fail=0
skipped=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
check() { # check DESCRIPTION COMMAND...: passes when COMMAND succeeds
  local what="$1"; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
expect_rc() { # expect_rc RC DESCRIPTION COMMAND...
  local want="$1" what="$2" rc; shift 2
  "$@" >/tmp/smoke.out 2>&1; rc=$?
  if [ "$rc" = "$want" ]; then ok "$what (exit $rc)"; else bad "$what: exit $rc, wanted $want: $(cat /tmp/smoke.out)"; fi
}
load() {
  if [ -n "$KO" ]; then insmod "$KO"; else modprobe p2plab_gpu; fi
}
wait_dev() { # the char device appears shortly after probe
  for _ in $(seq 50); do [ -e /dev/p2plab-gpu0 ] && return 0; sleep 0.1; done
  return 1
}

# Only kernel messages from here on are judged: boot noise under TCG
# ("MP-BIOS bug: 8254 timer ...") is not the driver's.
marker="p2plab guest-smoke.sh start $$"
echo "$marker" > /dev/kmsg
lsmod | grep -q '^p2plab_gpu' || load
check "device node" wait_dev
pci=$($T info | sed -n 's/^pci: //p')
check "info names the PCI function" test -n "$pci"
check "p2pmem published" test "$(cat /sys/bus/pci/devices/$pci/p2pmem/published 2>/dev/null)" = 1
vram=$($T info | sed -n 's/^vram_size: //p')
check "p2pmem size is the whole BAR" test "$(cat /sys/bus/pci/devices/$pci/p2pmem/size)" = "$vram"
check "MSI-X in use" sh -c "$T info | grep -q 'interrupts: msix'"

# Engine fill vs. CPU-computed CRC of the same bytes.
$T fill 0x10000 1M 0x5a
head -c 1048576 /dev/zero | tr '\0' '\132' > /tmp/5a
check "fill + checksum match a local CRC32C" test "$($T checksum 0x10000 1M)" = "$($T crc32c /tmp/5a)"
check "CPU through mmap sees the fill" test "$($T mmap-checksum 0x10000 1M)" = "$($T crc32c /tmp/5a)"

# Copies through bounce buffers, larger than one bounce (1 MiB).
head -c 5000000 /dev/urandom > /tmp/rand
$T copy-to-vram /tmp/rand 0x200000 2>/dev/null
check "copy-to-vram then engine checksum" test "$($T checksum 0x200000 5000000)" = "$($T crc32c /tmp/rand)"
$T copy-from-vram 0x200000 5000000 /tmp/back
check "copy-from-vram round trip" cmp -s /tmp/rand /tmp/back
$T copy-vram 0x200000 0x1000001 5000000
check "copy-vram (unaligned destination)" test "$($T checksum 0x1000001 5000000)" = "$($T crc32c /tmp/rand)"
$T copy-vram 0x1000001 0x1000101 5000000
check "copy-vram overlapping (memmove)" test "$($T checksum 0x1000101 5000000)" = "$($T crc32c /tmp/rand)"

# The CPU writes through mmap, the engine reads it.
$T mmap-fill 0x3000000 65536 0xc3
head -c 65536 /dev/zero | tr '\0' '\303' > /tmp/c3
check "mmap-fill seen by the engine" test "$($T checksum 0x3000000 65536)" = "$($T crc32c /tmp/c3)"

# Errors: checked by the driver, and (unchecked) by the device.
expect_rc 3 "range past VRAM refused by the driver" $T checksum "$vram" 1
expect_rc 3 "mmap past VRAM refused" $T mmap-checksum "$vram" 4096
expect_rc 1 "bad opcode reported by the device" $T -U raw 0x42 0 0 16
check "  ... with status 0x1" grep -q 'status 0x1 ' /tmp/smoke.out
expect_rc 1 "out-of-range fill reported by the device" $T -U raw 4 0 "$vram" 4096 0x01010101
check "  ... with status 0x3" grep -q 'status 0x3 ' /tmp/smoke.out
expect_rc 2 "usage error" $T fill 0 1 300
check "engine still healthy after errors" sh -c "$T nop >/dev/null && $T info | grep -q 'broken: no'"

# The engine writes to a bus address: here its own BAR2 (served by the
# server's local window), as it would write to a peer's BAR.
bus=$($T info | sed -n 's/^vram_bus_addr: //p')
$T -B raw 2 0x200000 $((bus + 0x6000000)) 1048576 >/dev/null
check "engine copy to a bus address (own BAR2)" test "$($T checksum 0x6000000 1M)" = "$($T crc32c /tmp/rand 0 1M)"
expect_rc 3 "bus-address jobs only for copies" $T -B raw 4 0 0 16

# A job that times out leaves the engine usable (its memory is kept until
# the device retires it).
expect_rc 4 "timeout reported" $T -t 1 checksum 0 512M
check "engine usable after a timeout" sh -c "$T nop >/dev/null && $T checksum 0x200000 5000000 >/dev/null"

# Several processes at once, each verifying its own region.
par() {
  local i=$1 off=$((0x8000000 + $1 * 0x1000000)) n
  head -c 3000000 /dev/urandom > /tmp/par$i
  for n in 1 2 3; do
    $T copy-to-vram /tmp/par$i $off 2>/dev/null || return 1
    $T fill $((off + 0x800000)) 1M $((i * 16 + n)) || return 1
    test "$($T checksum $off 3000000)" = "$($T crc32c /tmp/par$i)" || return 1
    $T copy-from-vram $off 3000000 /tmp/parback$i && cmp -s /tmp/par$i /tmp/parback$i || return 1
  done
}
pids=""
for i in 0 1 2 3; do par $i & pids="$pids $!"; done
pfail=0
for p in $pids; do wait $p || pfail=$((pfail + 1)); done
check "4 parallel submitters, all verified" test $pfail = 0

# A function reset while bound: the driver sets the engine up again.
if [ -e "/sys/bus/pci/devices/$pci/reset" ]; then
  echo 1 > "/sys/bus/pci/devices/$pci/reset" || bad "reset write"
  check "engine usable after a function reset" sh -c "$T fill 0 4096 7 && test \$($T checksum 0 4096) = \$(head -c 4096 /dev/zero | tr '\\0' '\\7' | $T crc32c /dev/stdin)"
  check "VRAM kept across the reset" test "$($T checksum 0x200000 5000000)" = "$($T crc32c /tmp/rand)"
else
  skipped=$((skipped + 1))
  echo "skip function reset (no reset method)"
fi

# Unbind/bind and unload/load cycles, one with a file open across unbind.
for i in 1 2 3; do
  echo "$pci" > /sys/bus/pci/drivers/p2plab_gpu/unbind || bad "unbind $i"
  echo "$pci" > /sys/bus/pci/drivers/p2plab_gpu/bind || bad "bind $i"
  wait_dev && $T nop >/dev/null || bad "usable after rebind $i"
done
ok "3 unbind/bind cycles"
exec 7</dev/p2plab-gpu0
echo "$pci" > /sys/bus/pci/drivers/p2plab_gpu/unbind
expect_rc 3 "ioctl on a file left open across unbind fails cleanly" $T -F 7 info
check "  ... with ENODEV" grep -q "No such device" /tmp/smoke.out
exec 7<&-
echo "$pci" > /sys/bus/pci/drivers/p2plab_gpu/bind
for i in 1 2 3; do
  rmmod p2plab_gpu || bad "rmmod $i"
  load || bad "load $i"
  wait_dev && $T nop >/dev/null || bad "usable after reload $i"
done
ok "3 unload/load cycles"
check "p2pmem published again" test "$(cat /sys/bus/pci/devices/$pci/p2pmem/published 2>/dev/null)" = 1

if ! dmesg | grep -qF "$marker"; then
  bad "kernel log: the start marker is gone (log wrapped?)"
elif dmesg | awk -v m="$marker" 'seen { print } index($0, m) { seen = 1 }' |
   grep -E 'BUG:|WARNING:|Oops|general protection|leak|refcount_t|list_add corruption|list_del corruption' >/tmp/dmesg.bad; then
  bad "kernel log clean: $(head -5 /tmp/dmesg.bad)"
else
  ok "kernel log clean"
fi

echo "$pass passed, $fail failed"
echo "SMOKE_PASSED=$pass"
echo "SMOKE_FAILED=$fail"
echo "SMOKE_SKIPPED=$skipped"
[ "$fail" = 0 ]
