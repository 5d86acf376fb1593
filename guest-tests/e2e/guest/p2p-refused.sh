#!/bin/bash
# The p2p suite's guest script for `separate-root-ports`: the kernel must
# refuse the transfer. It runs first in the gds suite's boot of that
# topology (tests/gds.rs, separate_root_ports_run_in_compat_mode).
# shellcheck source=SCRIPTDIR/lib/p2p.sh
. /run/p2plab/lib/p2p.sh
dmesg -C
p2plab-p2pio --p2pmem $gpu_bdf read --dev $ns --len 1M --chunk 1M > /run/p2plab/refused.out 2>&1
echo "REFUSED_STATUS=$?"
sed 's/^/REFUSED_/' /run/p2plab/refused.out
echo "REFUSED_DMESG=$(dmesg | grep -c 'cannot be used for peer-to-peer DMA as the client and provider .* do not share an upstream bridge or whitelisted host bridge')"
dmesg | tail -n 20
exit 0
