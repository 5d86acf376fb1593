# SPDX-License-Identifier: GPL-2.0
#
# What every guest driver's Makefile includes: the out-of-tree build of the
# modules its Kbuild names, against a kernel's build tree.
#   make [KDIR=/usr/src/linux-headers-<version>]   (default: the running kernel's)
#   make clean
# scripts/build-in-guest-root does the same inside the guest environment.

KDIR ?= /lib/modules/$(shell uname -r)/build

all: modules

modules clean:
	$(MAKE) -C $(KDIR) M=$(CURDIR) $@

.PHONY: all modules clean
