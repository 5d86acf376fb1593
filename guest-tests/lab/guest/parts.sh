#!/bin/bash
# Runs the parts of a shared boot (GuestScript::in_parts in guest_script.rs)
# in turn: the host writes part N to /run/p2plab/parts/N.sh and appends one
# `run_part N PREFIX` line per part. Each part runs in its own bash (its
# exit, set -u and functions stay its own); its output lines get its
# prefix, so two parts that report the same key never mask each other.
# The first part that fails ends the script with its status.
set -u

# run_part N PREFIX
run_part() {
  bash "/run/p2plab/parts/$1.sh" 2>&1 | sed "s/^/$2/"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "part $1 ($2) exited $rc"; exit "$rc"; }
}
