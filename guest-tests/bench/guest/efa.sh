#!/bin/bash
# The bench's guest script for its EFA boot (src/efa.rs): the unmodified efa
# driver on efa0 and efa1 of `rdma-efa`, then the host appends one
# `efa_run LABEL MEMORY READ_WR SEED` call per measurement, GPU memory and
# guest RAM interleaved. Each prints the servers' counters before and after
# (`EFA_STATS LABEL before|after DEVICE {json}`) and the tool's result
# (`EFA LABEL key=value...`); the host checks and measures both.
set -e
# Bytes each call moves (SENDs, then RDMA reads of the same bytes); bytes
# per SEND message.
: "${EFA_LEN:?bytes}" "${EFA_MSG:?bytes}"

modprobe ib_uverbs
modprobe efa
i=0
until [ -e /sys/class/infiniband/efa_0 ] && [ -e /sys/class/infiniband/efa_1 ]; do
  sleep 0.2; i=$((i+1)); [ $i -lt 300 ] || { echo 'efa_0 and efa_1 never appeared'; exit 1; }
done

# stats LABEL WHEN: both EFA servers' counters, one JSON line each.
stats() {
  for d in efa0 efa1; do
    echo "EFA_STATS $1 $2 $d $(p2plab-ctl $d status | tr -d '\n')"
  done
}

# efa_run LABEL MEMORY READ_WR SEED: MEMORY is `gpu` (gpu0 -> gpu1, dma-buf
# MRs) or `ram` (guest RAM, ordinary MRs). A failed or unverified transfer
# still prints its result (the host reports it), then fails the script.
efa_run() {
  stats "$1" before
  rc=0
  out=$(p2plab-efa-check bench --mem "$2" --size "$EFA_LEN" --msg "$EFA_MSG" \
    --read-wr "$3" --seed "$4" 2>&1) || rc=$?
  echo "EFA $1 exit=$rc $(echo "$out" | tr '\n' ' ')"
  stats "$1" after
  [ $rc -eq 0 ]
}
