#!/bin/sh
# Copies the upstream efa driver of the guest kernel's own source package,
# unmodified, into this build folder (run by scripts/build-in-guest-root
# inside the guest root, with KERNEL_VERSION set). The upstream Makefile
# comes along: Kbuild builds efa.ko from it.
set -eu
src=/usr/src/p2plab-upstream/$KERNEL_VERSION/drivers/infiniband/hw/efa
if [ ! -f "$src/efa_main.c" ] || [ ! -f "$src/Makefile" ]; then
  echo "prepare-efa: no efa driver source for $KERNEL_VERSION in the guest root" \
       "(scripts/setup-guest-env unpacks it into $src)" >&2
  exit 1
fi
for f in "$src"/*.c "$src"/*.h "$src/Makefile"; do
  cp "$f" .
done
echo "prepare-efa: $(cat "/usr/src/p2plab-upstream/$KERNEL_VERSION/.p2plab-source" 2>/dev/null), $(ls "$src"/*.c | wc -l) C files"
