#!/usr/bin/env bash
# In the guest (scripts/conformance --blktests): runs each blktests test of
# /mnt/host/tests.txt against /dev/nvme0n1, one `check` per test so that
# every test's skip reasons are its own, and writes
# /mnt/host/results/summary.tsv: TEST<TAB>pass|fail|not run<TAB>reasons.
set -uo pipefail
host=/mnt/host
out=$host/results
work=/tmp/blktests
cp -a "$host/tree" "$work" || exit 1
cd "$work" || exit 1

# blktests reads the kernel version as `uname -r | sed 's/-.*//;s/[^.0-9]//'`,
# which turns Debian's 7.3.4+deb13-amd64 into 7.3.4deb13 and breaks its
# version comparisons. Its commands see a uname whose -r says
# 7.3.4-deb13-amd64 instead, and that name leads to the same modules and
# config (symlinks). The kernel itself (modprobe) still uses the real name.
real=$(uname -r)
shown=${real//+/-}
if [ "$shown" != "$real" ]; then
  mkdir -p /tmp/conformance-bin
  cat > /tmp/conformance-bin/uname <<UNAME
#!/bin/sh
if [ "\$*" = "-r" ]; then echo "$shown"; else exec /usr/bin/uname "\$@"; fi
UNAME
  chmod +x /tmp/conformance-bin/uname
  export PATH=/tmp/conformance-bin:$PATH
  ln -sfn "$real" "/lib/modules/$shown"
  ln -sfn "config-$real" "/boot/config-$shown"
fi

# TIMEOUT bounds blktests' fio runs (its documented knob): block/005 reads
# the whole 1 GiB namespace otherwise, about 6 minutes under TCG.
printf 'TEST_DEVS=(/dev/nvme0n1)\nTIMEOUT=%s\n' "$(cat "$host/timeout")" > config
: > "$out/summary.tsv"
read -r -a tests < "$host/tests.txt"
n=0
for t in "${tests[@]}"; do
  n=$((n + 1))
  echo "=== [$n/${#tests[@]}] $t ($(date +%T))"
  ./check -o "$work/results" "$t" > "$work/check.out" 2>&1
  cat "$work/check.out"
  cp "$work/check.out" "$out/${t//\//-}.out"
  status=""
  for f in "$work/results/nvme0n1/$t" "$work/results/nodev/$t"; do
    if [ -f "$f" ]; then
      status=$(awk -F'\t' '$1 == "status" { print $2 }' "$f")
      cp "$f" "$out/${t//\//-}.result"
      for extra in "$f".*; do [ -f "$extra" ] && cp "$extra" "$out/"; done
    fi
  done
  # Skip reasons: the indented lines after a "[not run]" line.
  reasons=$(awk '/\[not run\]/ { on = 1; next } on && /^    / { sub(/^ +/, ""); printf "%s%s", sep, $0; sep = "; "; next } { on = 0 }' "$work/check.out")
  if [ -z "$status" ]; then
    if [ -n "$reasons" ]; then status="not run"; else status=fail; reasons="no result (see ${t//\//-}.out)"; fi
  fi
  printf '%s\t%s\t%s\n' "$t" "$status" "$reasons" >> "$out/summary.tsv"
done
dmesg > "$out/dmesg.txt"
sync
