#!/bin/bash
# The gds suite's guest script for the lab (tests/gds.rs,
# gds_on_ext4_and_xfs_in_the_lab). One function per file system; every p2plab-gdsio run
# leaves its JSON in /run/p2plab/gds/<fs>-<name>.json (the host reads
# it from the run folder) and its exit status as a fact.
set -u
by_class() { for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "$1" ] && basename $d; done; }
gpu_bdf=$(by_class 0x030200 | head -n1)
sed -n 3p /sys/bus/pci/devices/$gpu_bdf/resource | { read start end _; echo "GPU_BAR2_START=$start"; echo "GPU_BAR2_END=$end"; }
ns=$(p2plab-nvme-ns 1)
out=/run/p2plab/gds
mkdir -p $out /mnt/gds
m=/mnt/gds

# run NAME ARGS...: p2plab-gdsio ARGS --json, kept as $FS-NAME.json.
run() {
  local name=$1; shift
  p2plab-gdsio "$@" --json > $out/$FS-$name.json 2> $out/$FS-$name.err
  echo "${FS^^}_${name^^}_STATUS=$?"
}

# cf NAME ARGS...: one cufile-gds-cases run (a program written against
# cuFile's documentation), its facts as ${FS^^}_CF_NAME_*; CF_ENV may set
# the library's environment.
cf() {
  local name=$1; shift
  env ${CF_ENV:-} cufile-gds-cases "$@" > $out/$FS-cf-$name.txt 2> $out/$FS-cf-$name.err
  echo "${FS^^}_CF_${name^^}_STATUS=$?"
  sed "s/^CF_/${FS^^}_CF_${name^^}_/" $out/$FS-cf-$name.txt
}

phase() {
  FS=$1
  case $FS in
    ext4) mkfs.ext4 -q -F -E nodiscard $ns ;;
    xfs) mkfs.xfs -q -f -K $ns ;;
  esac
  echo "${FS^^}_MKFS=$?"
  mount -t $FS $ns $m; echo "${FS^^}_MOUNT=$?"
  dd if=/dev/urandom of=$m/data bs=1M count=32 status=none
  head -c 10000 /dev/urandom > $m/short
  # 16 MiB with data only in [4 MiB, 8 MiB).
  truncate -s 16M $m/sparse
  dd if=/dev/urandom of=$m/sparse bs=1M seek=4 count=4 conv=notrunc status=none
  head -c 10000 /dev/urandom > $m/log
  head -c 8192 /dev/urandom > $m/log2
  head -c 10000 /dev/urandom > $m/cf-log
  sync

  run aligned_read read --file $m/data --size 32M --io-size 1M --threads 2 --verify
  run nodirect_read read --file $m/data --size 8M --no-direct --verify
  run aligned_write write --file $m/new --size 16M --io-size 1M --threads 2 --seed 3 --verify
  run overwrite write --file $m/data --file-offset 8M --size 8M --seed 7 --verify
  run unaligned_file read --file $m/data --file-offset 1000 --size 1M --verify
  run unaligned_gpu read --file $m/data --gpu-offset 1 --size 1M --verify
  run unaligned_len read --file $m/data --size 1000000 --io-size 1000000 --verify
  run sparse read --file $m/sparse --size 16M --io-size 16M --verify
  run short read --file $m/short --size 1M --verify
  run append write --file $m/log --file-offset 10000 --size 5000 --io-size 5000 --verify
  run append_mode write --file $m/log2 --append --size 4096 --verify
  run devmap read --file $m/data --buffer devmap --size 1M --verify
  run forced read --file $m/data --size 1M --force-compat --verify
  p2plab-gds-read-verify $m/data 4194304 > $out/$FS-c.txt 2>&1
  echo "${FS^^}_C_STATUS=$?"
  sed "s/^C_/${FS^^}_C_/" $out/$FS-c.txt
  # The same cases through cuFile's API (libcufile.so): FILE SIZE
  # FILE_OFFSET DEVPTR_OFFSET [SEED].
  cf aligned_read read $m/data 4194304 1048576 65536
  cf aligned_write write $m/cf-new 4194304 0 0 5
  cf unaligned_file read $m/data 1048576 1000 0
  cf unaligned_gpu read $m/data 1048576 0 1
  cf sparse read $m/sparse 16777216 0 0
  cf short read $m/short 1048576 0 0
  cf append write $m/cf-log 5000 10000 0 9
  CF_ENV=P2PLAB_GDS_FORCE_COMPAT=1 cf forced read $m/data 1048576 0 0
  if [ $FS = ext4 ]; then
    # data=journal: O_DIRECT is accepted at open but statx says it would
    # go through the page cache.
    umount $m && mount -t ext4 -o data=journal $ns $m
    echo "EXT4_JOURNAL_MOUNT=$?"
    run journal read --file $m/data --size 2M --verify
    cf journal read $m/data 2097152 0 0
  fi
  umount $m; echo "${FS^^}_UMOUNT=$?"
}

cufile-gds-cases info > $out/cf-info.txt 2>&1; echo "CF_INFO_STATUS=$?"
sed "s/^CF_/CF_INFO_/" $out/cf-info.txt
phase ext4
phase xfs
# A file on tmpfs: no PCI device behind it.
FS=tmpfs
head -c 2097152 /dev/urandom > /tmp/gds-tmpfs
run read read --file /tmp/gds-tmpfs --verify
echo "KERNEL_COMPLAINTS=$(dmesg | grep -c -E 'BUG:|WARNING:|Oops|refcount_t')"
exit 0
