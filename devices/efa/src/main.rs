//! `p2plab-efa`: serves the emulated EFA over vfio-user (wiring comes in
//! the next step).

fn main() {}
