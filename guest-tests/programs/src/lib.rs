//! What the guest programs (`src/bin/`) share with the host side of the
//! tests: the seeded data pattern of `p2plab-pcimem fill`/`check`, so a
//! test can check a BAR's backing file on the host. Nothing here depends
//! on the lab: these programs run in the guest.

pub mod pattern;
