#!/bin/bash
# The p2p suite's guest script for `two-nvme` (nvme_to_nvme_through_a_cmb).
# shellcheck source=SCRIPTDIR/lib/p2p.sh
. /run/p2plab/lib/p2p.sh
# Controllers by serial (set in two-nvme.args): probe order names them.
src=$(p2plab-nvme-ns --serial P2PLAB-NVME0 1)
dst=$(p2plab-nvme-ns --serial P2PLAB-NVME1 1)
nvme1_bdf=$(basename "$(readlink -f "/sys/class/nvme/$(p2plab-nvme-ns --ctrl-of P2PLAB-NVME1)/device")")
echo "NVME1_P2P_PUBLISHED=$(cat /sys/bus/pci/devices/$nvme1_bdf/p2pmem/published)"
# 3. NVMe -> NVMe through nvme1's CMB: 64 MiB in 1 MiB chunks, two threads.
dd if=/dev/urandom of=/tmp/pattern bs=1M count=64 2>/dev/null
dd if=/tmp/pattern of=$src bs=1M oflag=direct 2>/dev/null
p2plab-p2pio --p2pmem $nvme1_bdf copy --src $src --dst $dst --len 64M --chunk 1M \
  --threads 2 --buffer 8M > /run/p2plab/cmb.out 2>&1; echo "CMB_STATUS=$?"
sed 's/^/CMB_/' /run/p2plab/cmb.out
echo 3 > /proc/sys/vm/drop_caches
echo "SRC_SUM=$(dd if=$src bs=1M count=64 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
echo "DST_SUM=$(dd if=$dst bs=1M count=64 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
echo "PATTERN_SUM=$(md5sum < /tmp/pattern | cut -d' ' -f1)"
exit 0
