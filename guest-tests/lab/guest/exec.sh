#!/bin/bash
# The guest's /run/p2plab/exec.sh, written by the p2plab launcher
# (lab.rs); the guest init runs it once the guest is up. The command is
# script.sh. Its output goes to the console and, whole lines with no
# kernel message inside, to output.txt, which the host reads. Then a copy
# of the kernel log for the clean-boot check: /dev/kmsg read with
# O_NONBLOCK returns one record per read and EAGAIN at the end; a fresh
# reader starts at the oldest record even after `dmesg -C`.
bash /run/p2plab/script.sh 2>&1 | tee /run/p2plab/output.txt
rc=${PIPESTATUS[0]}
dd if=/dev/kmsg of=/run/p2plab/kmsg.txt bs=65536 iflag=nonblock 2>/dev/null
exit "$rc"
