#!/bin/sh
# Builds p2plab-gds-read-verify with the guest root's gcc against the
# library and header, so it links exactly as C test code in the guest
# does (-lp2plab_gds, rpath /opt/p2plab/lib):
#   build-in-root.sh GUEST_ROOT LIB_DIR OUT_DIR
# LIB_DIR holds libp2plab_gds.so (e.g. target/release). Sources, header and
# library are copied to OUT_DIR/src and bind-mounted into the root inside a
# private mount namespace; the program lands in OUT_DIR. Needs root.
set -eu
[ $# -eq 3 ] || { echo "usage: $0 GUEST_ROOT LIB_DIR OUT_DIR" >&2; exit 2; }
root=$(realpath "$1")
lib=$(realpath "$2")
mkdir -p "$3"
out=$(realpath "$3")
here=$(dirname "$(realpath "$0")")
[ -f "$lib/libp2plab_gds.so" ] || { echo "no $lib/libp2plab_gds.so (cargo build --release -p p2plab-gds)" >&2; exit 1; }

rm -rf "$out/src"
mkdir -p "$out/src"
cp "$here/p2plab-gds-read-verify.c" "$here/../include/p2plab_gds.h" "$lib/libp2plab_gds.so" "$out/src/"

inner=/tmp/p2plab-gds-build.$$
mkdir -p "$root$inner"
trap 'rmdir "$root$inner" 2>/dev/null || true' EXIT
unshare --mount --propagation private sh -eu -c '
	mount --bind "$1" "$2$3"
	chroot "$2" sh -eu -c "cd $3 && gcc -std=c11 -O2 -Wall -Wextra -Werror -I. \
		-o p2plab-gds-read-verify p2plab-gds-read-verify.c \
		-L. -lp2plab_gds -Wl,-rpath,/opt/p2plab/lib"
' build "$out/src" "$root" "$inner"
cp "$out/src/p2plab-gds-read-verify" "$out/"
echo "built $out/p2plab-gds-read-verify"
