#!/bin/bash
# The launcher suite's guest script (tests/launcher.rs): quotes that must
# arrive verbatim, the --share folder both ways, an extra kernel argument,
# no control channel unless asked, a declared kernel-log complaint, and
# exit status 7.
set -u
echo "QUOTES=it's \"quoted\" $((6 * 7))"
cat /mnt/host/from-host.txt
echo "written in the guest" > /mnt/host/from-guest.txt
grep -o 'p2plab.test=[a-z]*' /proc/cmdline | sed 's/^/CMDLINE=/'
# No --guest-control: the guest reaches no server's control socket.
echo "GUEST_PORTS=$(cat /sys/class/virtio-ports/*/name 2>/dev/null | grep -c '^p2plab\.ctl\.')"
p2plab-ctl nvme0 status >/dev/null 2>&1; echo "GUEST_CTL_STATUS=$?"
# A complaint in the kernel log, declared below: the clean-boot check must
# find it exactly once (it fails on a missing log copy or a miscount).
echo '<4>WARNING: p2plab launcher test' > /dev/kmsg
exit 7
