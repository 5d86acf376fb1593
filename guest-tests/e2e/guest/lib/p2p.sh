#!/bin/bash
# Sourced first by the p2p suite's guest scripts (tests/p2p.rs): set -u,
# by_class CLASS (the PCI functions of a class), the GPU's address in
# gpu_bdf and namespace 1's block device in ns.
# shellcheck disable=SC2034 # gpu_bdf and ns are for the sourcing scripts
set -u
by_class() { for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "$1" ] && basename $d; done; }
gpu_bdf=$(by_class 0x030200 | head -n1)
ns=$(p2plab-nvme-ns 1)
