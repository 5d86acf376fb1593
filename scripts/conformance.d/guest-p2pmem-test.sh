#!/usr/bin/env bash
# In the guest (scripts/conformance --p2pmem-test, topology two-nvme): copies
# nvme0n1 -> nvme1n1 with p2pmem-test --check through system memory, the
# GPU's p2pmem and nvme1's CMB, and writes /mnt/host/results/summary.tsv:
# CASE<TAB>pass|fail|skip<TAB>detail.
set -uo pipefail
host=/mnt/host
out=$host/results
tool=$host/tree/p2pmem-test
: > "$out/summary.tsv"
result() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$out/summary.tsv"; echo "=== $1: $2 ($3)"; }

# The controllers by serial (two-nvme's P2PLAB-NVME0/1), not by probe order.
ctrl_by_serial() {
  local c
  for c in /sys/class/nvme/nvme*; do
    [ "$(tr -d ' ' < "$c/serial")" = "$1" ] && { basename "$c"; return 0; }
  done
  return 1
}
src_ctrl=$(ctrl_by_serial P2PLAB-NVME0) || { result setup fail "no controller with serial P2PLAB-NVME0"; exit 1; }
dst_ctrl=$(ctrl_by_serial P2PLAB-NVME1) || { result setup fail "no controller with serial P2PLAB-NVME1"; exit 1; }
src=/dev/${src_ctrl}n1 dst=/dev/${dst_ctrl}n1
[ -b "$src" ] && [ -b "$dst" ] || { result setup fail "no namespace block devices $src $dst"; exit 1; }
dst_pci=$(basename "$(readlink -f "/sys/class/nvme/$dst_ctrl/device")")
gpu_pci=""
for d in /sys/bus/pci/devices/*; do
  [ "$(basename "$(readlink -f "$d/driver" 2>/dev/null)")" = p2plab_gpu ] && gpu_pci=$(basename "$d")
done

# 8 MiB in 64 KiB chunks: 128 commands each way, enough to cross every
# queue slot, small enough for a peer BAR's slow path under TCG.
args=(-c 128 -s 64k --check)

# copy CASE SEED [P2PMEM_DEVICE]: each case its own seed, so a copy that
# moved nothing cannot pass on the data the case before it left behind.
copy() {
  local name="$1" mem="${3:-}" log="$out/$1.txt" rc=0
  args+=(--seed "$2")
  echo "=== $name: p2pmem-test $src $dst ${mem:+/sys/bus/pci/devices/$mem/p2pmem/allocate} ${args[*]} ($(date +%T))"
  if [ -n "$mem" ]; then
    if [ "$(cat "/sys/bus/pci/devices/$mem/p2pmem/published" 2>/dev/null)" != 1 ]; then
      result "$name" skip "$mem publishes no p2pmem (/sys/bus/pci/devices/$mem/p2pmem/published)"
      return
    fi
    "$tool" "$src" "$dst" "/sys/bus/pci/devices/$mem/p2pmem/allocate" "${args[@]}" > "$log" 2>&1 || rc=$?
  else
    "$tool" "$src" "$dst" "${args[@]}" > "$log" 2>&1 || rc=$?
  fi
  cat "$log"
  # p2pmem-test exits 0 on a mismatch too: its parity line decides.
  local line
  line=$(grep -E '^(MIS)?MATCH on data check, 0x[0-9a-f]+ (=|!=) 0x[0-9a-f]+\.$' "$log")
  if [ "$rc" != 0 ]; then
    result "$name" fail "exit status $rc"
  elif [ -z "$line" ]; then
    result "$name" fail "no data-check line in its output"
  else
    # shellcheck disable=SC2086
    set -- $line
    if [ "$1" = MATCH ] && [ "${5%,}" = "${7%.}" ]; then
      result "$name" pass "parity ${5%,} = ${7%.}"
    else
      result "$name" fail "parity ${5%,} != ${7%.}"
    fi
  fi
}

copy system-memory 1001
if [ -n "$gpu_pci" ]; then copy gpu-p2pmem 1002 "$gpu_pci"; else result gpu-p2pmem skip "no device bound to p2plab_gpu"; fi
copy nvme1-cmb 1003 "$dst_pci"
dmesg > "$out/dmesg.txt"
sync
