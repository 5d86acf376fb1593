#!/bin/sh
# Builds p2plab_nic.ko and p2plab-nic-tool with the guest root's compiler
# against its kernel headers, without leaving anything mounted:
#   build-in-root.sh GUEST_ROOT KERNEL_VERSION OUT_DIR
# e.g. build-in-root.sh .cache/guest/root "$(cat .cache/guest/kernel-version)" .cache/nic-build
# Sources are copied to OUT_DIR/src and bind-mounted into the root inside a
# private mount namespace; results land in OUT_DIR. Needs root (chroot).
# KCFLAGS=-Werror keeps the module free of warnings.
set -eu
[ $# -eq 3 ] || { echo "usage: $0 GUEST_ROOT KERNEL_VERSION OUT_DIR" >&2; exit 2; }
root=$(realpath "$1")
kver=$2
mkdir -p "$3"
out=$(realpath "$3")
here=$(dirname "$(realpath "$0")")
kdir=/usr/src/linux-headers-$kver
[ -d "$root$kdir" ] || { echo "no kernel headers at $root$kdir" >&2; exit 1; }

rm -rf "$out/src"
mkdir -p "$out/src/tool"
cp "$here/Kbuild" "$here/Makefile" "$here"/*.c "$here"/*.h "$out/src/"
cp "$here/tool/Makefile" "$here/tool/p2plab-nic-tool.c" "$out/src/tool/"
# The GPU driver's peer-memory API header (its functions are found at run
# time with symbol_get, so no Module.symvers is needed).
cp "$here/../../gpu/guest-driver/p2plab_p2p.h" "$out/src/"
cp "$here/../../gpu/guest-driver/p2plab_gpu_uapi.h" "$out/src/tool/"

inner=/tmp/p2plab-nic-build.$$
mkdir -p "$root$inner"
trap 'rmdir "$root$inner" 2>/dev/null || true' EXIT
unshare --mount --propagation private sh -eu -c '
	mount --bind "$1" "$2$3"
	mount -t proc proc "$2/proc"	# objtool reads /proc
	chroot "$2" sh -eu -c "make -s -C $4 M=$3 KCFLAGS=-Werror modules && make -s -C $3/tool"
' build "$out/src" "$root" "$inner" "$kdir"
cp "$out/src/p2plab_nic.ko" "$out/src/tool/p2plab-nic-tool" "$out/"
echo "built $out/p2plab_nic.ko and $out/p2plab-nic-tool"
