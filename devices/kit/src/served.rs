//! A device model as its server binary serves it: what p2plab-server's
//! generic wiring (`serve_device`) needs beyond the PCI function.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use p2plab_pci::PciModel;

use crate::control::DeviceControl;
use crate::placement::{HoleHook, PlacementHook};

/// A BAR whose memory the device shares with peer servers (the zero-copy
/// peer path): they DMA straight into it.
#[derive(Debug)]
pub struct PeerBar {
    /// The BAR's index.
    pub bar: u8,
    /// The memory behind it (a memfd), for the peers to map.
    pub fd: OwnedFd,
    /// Its size in bytes.
    pub size: u64,
}

/// A PCI model with what the server wiring needs: its control verbs, the
/// BAR it shares with peers, and its shutdown step.
pub trait ServedDevice: PciModel + 'static {
    /// The BAR peers may reach directly, by index, if the device kind has
    /// one (the stats report peers' traffic into it, zero while absent).
    const PEER_BAR: Option<u8> = None;

    /// The control verbs, for the control socket and the stats file.
    fn control(&self) -> Arc<dyn DeviceControl>;

    /// The memory behind [`PEER_BAR`](Self::PEER_BAR) to share, if this
    /// instance has that BAR.
    fn peer_bar(&self) -> std::io::Result<Option<PeerBar>> {
        Ok(None)
    }

    /// Calls `hook` each time [`PEER_BAR`](Self::PEER_BAR) moves.
    fn on_peer_bar_placement(&mut self, hook: PlacementHook) {
        let _ = hook;
    }

    /// Calls `hook` right before and right after each punch of holes into
    /// [`PEER_BAR`](Self::PEER_BAR)'s memory (a device that never punches
    /// holes there ignores it).
    fn on_peer_bar_holes(&mut self, hook: HoleHook) {
        let _ = hook;
    }

    /// After the transport stopped serving, before the model is dropped
    /// (NVMe flushes its namespaces here).
    fn stopping(&self) {}
}
