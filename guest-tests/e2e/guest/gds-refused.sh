#!/bin/bash
# The gds suite's guest script for separate-root-ports (tests/gds.rs,
# separate_root_ports_run_in_compat_mode). The separate-root-ports topology: the kernel refuses P2P between nvme0
# and the GPU, so everything runs in compat mode and says why.
set -u
ns=$(p2plab-nvme-ns 1)
out=/run/p2plab/gds
mkdir -p $out /mnt/gds
m=/mnt/gds
FS=ext4
run() {
  local name=$1; shift
  p2plab-gdsio "$@" --json > $out/$FS-$name.json 2> $out/$FS-$name.err
  echo "${FS^^}_${name^^}_STATUS=$?"
}
mkfs.ext4 -q -F -E nodiscard $ns; echo "EXT4_MKFS=$?"
mount -t ext4 $ns $m; echo "EXT4_MOUNT=$?"
dd if=/dev/urandom of=$m/data bs=1M count=8 status=none
sync
dmesg -C
p2plab-gdsio info --file $m/data --json > $out/$FS-info.json; echo "EXT4_INFO_STATUS=$?"
run read read --file $m/data --size 8M --io-size 1M --verify
run write write --file $m/new --size 4M --io-size 1M --verify
p2plab-gds-read-verify $m/data 1048576 > $out/$FS-c.txt 2>&1
echo "EXT4_C_STATUS=$?"
sed "s/^C_/EXT4_C_/" $out/$FS-c.txt
# The same refusal through cuFile's API (libcufile.so).
cufile-gds-cases read $m/data 1048576 0 0 > $out/$FS-cf.txt 2> $out/$FS-cf.err
echo "EXT4_CF_STATUS=$?"
sed "s/^CF_/EXT4_CF_/" $out/$FS-cf.txt
echo "REFUSED_DMESG=$(dmesg | grep -c 'cannot be used for peer-to-peer DMA')"
umount $m
exit 0
