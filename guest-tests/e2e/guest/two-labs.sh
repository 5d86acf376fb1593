#!/bin/bash
# The two_labs suite's guest script (tests/two_labs.rs has the steps), run
# in each of two labs whose EFAs share a wire over TCP:
#   two-labs.sh server|client MY_IP PEER_IP MAC ITERS
# /mnt/host (the lab's --share) holds the virtio-net modules (the base
# initramfs has none) and receives the outputs under ROLE/.
set -u
role=$1 me=$2 peer=$3 mac=$4 iters=$5
out=/mnt/host/$role
mkdir -p "$out"
say() { echo "$1=$2"; }

# --- the guests' own IP path (perftest sets its QPs up over TCP) -----------
for m in failover net_failover virtio_net; do
  insmod "/mnt/host/$m.ko" || say "INSMOD_${m^^}" failed
done
dev=
for i in $(seq 50); do
  for n in /sys/class/net/*; do
    [ "$(cat "$n/address" 2>/dev/null)" = "$mac" ] && dev=${n##*/}
  done
  [ -n "$dev" ] && break
  sleep 0.2
done
say NET_DEV "$dev"
ip link set "$dev" up
ip addr add "$me/24" dev "$dev"
ok=0
for i in $(seq 120); do ping -c 1 -W 1 "$peer" >/dev/null 2>&1 && { ok=1; break; }; done
say PEER_PING "$ok"

# --- the EFA (the driver reports the port ACTIVE whether or not the wire
# has a peer: the host checks the wire's own counters) ----------------------
modprobe ib_uverbs; modprobe efa
i=0
until [ -e /sys/class/infiniband/efa_0 ]; do sleep 0.2; i=$((i+1)); [ $i -lt 300 ] || break; done
state=$(cat /sys/class/infiniband/efa_0/ports/1/state 2>/dev/null)
say PORT_STATE "${state#* }"
say GID "$(cat /sys/class/infiniband/efa_0/ports/1/gids/0 2>/dev/null)"

# --- perftest between the two guests ----------------------------------------
# run NAME PORT ARGS...: the server waits for the client; the client dials
# until the server listens (the two guests boot at their own pace).
run() {
  local name=$1 port=$2; shift 2
  local rc try
  if [ "$role" = server ]; then
    timeout 900 "$@" -d efa_0 -p "$port" > "$out/$name.txt" 2>&1
    rc=$?
  else
    for try in $(seq 90); do
      timeout 900 "$@" -d efa_0 -p "$port" "$peer" > "$out/$name.txt" 2>&1
      rc=$?
      grep -q "Couldn't connect\|Unable to open\|Failed to" "$out/$name.txt" || break
      sleep 2
    done
    say "${name^^}_TRIES" "$try"
  fi
  say "${name^^}_EXIT" "$rc"
}
run send_bw 18515 ib_send_bw -x 0 -c SRD -F -n "$iters" -s 4096
run read_bw 18516 ib_read_bw -x 0 -c SRD -F -n "$iters" -s 65536
# GPU memory to GPU memory (dma-buf MRs on the EFA, branch dmabuf) goes
# here: the same two runs with perftest's --use_cuda-like dma-buf option
# once the EFA registers p2plab GPU memory.
say DONE 1
