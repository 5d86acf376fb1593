#!/bin/bash
# The two_labs suite's guest script (tests/two_labs.rs has the steps), run
# in each of two labs whose EFAs share a wire over TCP:
#   two-labs.sh server|client MY_IP PEER_IP MAC ITERS GPU_SIZE
# /mnt/host (the lab's --share) receives the outputs under ROLE/; the init
# has loaded virtio_net for the lab's virtio-net NIC.
set -u
role=$1 me=$2 peer=$3 mac=$4 iters=$5 gpu_size=$6
out=/mnt/host/$role
mkdir -p "$out"
say() { echo "$1=$2"; }

# --- the guests' own IP path (perftest sets its QPs up over TCP) -----------
if [ -d /sys/module/virtio_net ]; then say VIRTIO_NET loaded; else say VIRTIO_NET missing; fi
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

# --- GPU memory to GPU memory across the labs --------------------------------
# p2plab-efa-check gpu-xfer, one end in each guest (dma-buf MRs of gpu0's
# VRAM on efa_0), its out-of-band exchange over the guests' IP link; lab A
# listens. A -> B (A's gpu0 is the source), then B -> A. The servers'
# counters around each say which path the bytes took.
servers() { # servers NAME: efa0's and gpu0's counters now
  local d
  for d in efa0 gpu0; do p2plab-ctl $d status > "$out/$1-$d.json" 2>/dev/null; done
}
gpu_xfer() { # gpu_xfer NAME ROLE SEED --listen|--connect WHERE
  local name=$1 xrole=$2 seed=$3; shift 3
  servers "before-$name"
  p2plab-efa-check gpu-xfer --role "$xrole" --dev efa_0 --gpu /dev/p2plab-gpu0 \
    --size "$gpu_size" --msg 8192 --seed "$seed" --timeout 600 "$@" > "$out/$name.txt" 2>&1
  say "${name^^}_EXIT" $?
  servers "after-$name"
}
if [ "$role" = server ]; then
  gpu_xfer gpu_ab src 11 --listen "$me:18720"
  gpu_xfer gpu_ba dst 12 --listen "$me:18721"
else
  gpu_xfer gpu_ab dst 11 --connect "$peer:18720"
  gpu_xfer gpu_ba src 12 --connect "$peer:18721"
fi

# --- a destination end fed by a hostile peer (lab A alone, over loopback) ----
# hostile NAME HOLD BYTES: a dst end listening on 127.0.0.1 gets BYTES
# (printf escapes) from bash, which then keeps the connection HOLD seconds.
hostile() {
  local name=$1 hold=$2 bytes=$3 pid
  p2plab-efa-check gpu-xfer --role dst --listen 127.0.0.1:18730 --dev efa_0 \
    --gpu /dev/p2plab-gpu0 --size 1M --msg 8192 --timeout 5 > "$out/$name.txt" 2>&1 &
  pid=$!
  (
    for i in $(seq 100); do exec 3<>/dev/tcp/127.0.0.1/18730 && break; sleep 0.2; done 2>/dev/null
    # Its hello first: closing with it unread would reset the connection.
    head -c 72 <&3 >/dev/null
    printf "%b" "$bytes" >&3
    sleep "$hold"
  )
  wait $pid
  say "${name^^}_EXIT" $?
}
if [ "$role" = server ]; then
  z4='\x00\x00\x00\x00'
  head="\x50\x32\x4c\x58\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01$z4$z4$z4$z4"
  # Six bytes of a hello, then EOF.
  hostile hostile_short 0 '\x50\x32\x4c\x58\x00\x00'
  # A whole hello whose source would send 1 GiB into 1 MiB buffers.
  hostile hostile_length 0 "$head\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x00\x00\x20\x00\x00\x00\x01\x00\x00\x00\x00\x00$z4$z4$z4$z4"
  # Connected, silent for longer than --timeout.
  hostile hostile_silent 10 ''
fi
say DONE 1
