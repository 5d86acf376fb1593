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
mkdir -p /tmp/conformance-bin
export PATH=/tmp/conformance-bin:$PATH
real=$(uname -r)
shown=${real//+/-}
if [ "$shown" != "$real" ]; then
  cat > /tmp/conformance-bin/uname <<UNAME
#!/bin/sh
if [ "\$*" = "-r" ]; then echo "$shown"; else exec /usr/bin/uname "\$@"; fi
UNAME
  chmod +x /tmp/conformance-bin/uname
  ln -sfn "$real" "/lib/modules/$shown"
  ln -sfn "config-$real" "/boot/config-$shown"
fi

# /dev/char/MAJ:MIN and /dev/block/MAJ:MIN, which udev makes on a real
# system: the passthru tests (nvme/033-037) hand nvmet
# /dev/char/<nvme0's dev> as the controller to export. The guest runs no
# udevd, so the links are made here from sysfs.
mkdir -p /dev/char /dev/block
for link in /sys/dev/char/* /sys/dev/block/*; do
  kind=${link#/sys/dev/}
  kind=${kind%%/*}
  name=$(sed -n 's/^DEVNAME=//p' "$link/uevent" 2>/dev/null)
  if [ -n "$name" ] && [ -e "/dev/$name" ] && [ ! -e "/dev/$kind/${link##*/}" ]; then
    ln -s "../$name" "/dev/$kind/${link##*/}"
  fi
done

# NORMAL_USER (blktests' config) for the unprivileged passthrough test
# (nvme/046): an account with a shell; the guest's root is a tmpfs. The
# guest has no PAM, so util-linux's su aborts ("Critical error"): blktests
# runs `su USER -c CMD`, which the shim does with setpriv instead.
if ! id blktests >/dev/null 2>&1; then
  echo 'blktests:x:1000:1000:blktests:/tmp:/bin/bash' >> /etc/passwd
  echo 'blktests:x:1000:' >> /etc/group
fi
# zgrep is a #!/bin/sh script, and the guest's /bin/sh is busybox ash,
# which runs busybox's own gzip applet (it cannot pass plain text through
# with -f: "gzip: invalid magic"), so blktests' kernel-config checks
# (`zgrep -q CONFIG_X= /boot/config-...`) would all say "not enabled".
cat > /tmp/conformance-bin/zgrep <<'ZGREP'
#!/bin/bash
exec bash /usr/bin/zgrep "$@"
ZGREP
chmod +x /tmp/conformance-bin/zgrep
cat > /tmp/conformance-bin/su <<'SU'
#!/bin/bash
# su USER -c CMD, without PAM.
if [ $# -eq 3 ] && [ "$2" = -c ] && uid=$(id -u "$1") && gid=$(id -g "$1"); then
  exec setpriv --reuid="$uid" --regid="$gid" --init-groups bash -c "$3"
fi
exec /usr/bin/su "$@"
SU
chmod +x /tmp/conformance-bin/su
# TIMEOUT bounds blktests' fio runs (its documented knob): block/005 reads
# the whole 1 GiB namespace otherwise, about 6 minutes under TCG.
printf 'TEST_DEVS=(/dev/nvme0n1)\nTIMEOUT=%s\nNORMAL_USER=blktests\n' "$(cat "$host/timeout")" > config
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
  # results/<device or nodev, plus e.g. _tr_loop>/<test>
  for f in "$work"/results/*/"$t"; do
    if [ -f "$f" ]; then
      status=$(awk -F'\t' '$1 == "status" { print $2 }' "$f")
      cp "$f" "$out/${t//\//-}.result"
      for extra in "$f".*; do [ -f "$extra" ] && cp "$extra" "$out/${t%/*}-${extra##*/}"; done
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
