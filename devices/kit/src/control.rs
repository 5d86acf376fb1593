//! The control verbs every device answers (`p2plab-ctl status`, `inject`,
//! `clear`, `reset`, `trace`): one trait a model implements, with no
//! knowledge of the control socket; p2plab-server serves it.

use serde_json::Value;

/// Where a server puts the transport's DMA-path counters (`dma_mmap_*`,
/// `dma_peer_*`, `peer_path`...) in the device's stats JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsLayout {
    /// Next to the device's counters, in one flat object.
    Flat,
    /// In an object of their own under this key.
    Nested(&'static str),
}

/// A fault injection the device armed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Armed {
    /// Its ID in the fault report.
    pub id: u64,
    /// The spec as the device understood it (canonical form).
    pub spec: String,
}

/// What the control socket (and the stats file) may ask of a device.
/// Called from the control socket's and the stats thread, while the
/// transport serves the device: implementations take `&self` and keep
/// their locks short. Errors are messages for the user.
pub trait DeviceControl: Send + Sync + 'static {
    /// The device's counters and state as a JSON object: its part of
    /// stats.json and of the `status` reply.
    fn counters(&self) -> Value;

    /// Where the DMA-path counters go in the stats JSON.
    fn stats_layout(&self) -> StatsLayout {
        StatsLayout::Flat
    }

    /// DMA the device served from its own BARs without the transport
    /// (read, write bytes), added to `dma_local_*`.
    fn own_bar_dma_bytes(&self) -> (u64, u64) {
        (0, 0)
    }

    /// Arms a fault injection from its spec text (as `--inject` takes it).
    fn inject(&self, spec: &str) -> Result<Armed, String>;

    /// Disarms every injection.
    fn clear(&self);

    /// A reset the host did not ask for (`p2plab-ctl reset`).
    fn reset(&self) -> Result<(), String>;

    /// The armed injections and how often each fired (`status.faults`).
    fn fault_report(&self) -> Value;

    /// The readable registers by name (`status.registers`), or `None` to
    /// leave them out.
    fn registers(&self) -> Option<Vec<(&'static str, u64)>> {
        None
    }

    /// The device's decoded trace recorder.
    fn tracer(&self) -> &p2plab_trace::Tracer;
}
