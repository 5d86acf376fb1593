//! A device's stats JSON and its control verbs, for every device: the
//! model implements p2plab-kit's [`DeviceControl`]; this module adds the
//! transport's DMA-path counters to its stats (computed here once) and
//! answers the control socket with it.

use std::sync::Arc;

use p2plab_kit::{DeviceControl, StatsLayout};
use p2plab_peer::PeerRegistry;
use p2plab_vfio_user::DmaSpace;
use serde::Serialize;
use serde_json::Value;

use crate::control::{ControlHandler, ControlRequest};

/// Which path the device's DMA took, from the transport and the peer
/// registry: mmapped guest memory, DMA messages through the client, the
/// device's own BARs (a local window), or a peer's BAR directly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DmaPaths {
    /// Through guest memory the client shared with an fd.
    pub dma_mmap_read_bytes: u64,
    #[allow(missing_docs)]
    pub dma_mmap_write_bytes: u64,
    /// Through DMA_READ/DMA_WRITE messages (peer BARs QEMU serves).
    pub dma_message_read_bytes: u64,
    #[allow(missing_docs)]
    pub dma_message_write_bytes: u64,
    /// Served from the device's own BARs.
    pub dma_local_read_bytes: u64,
    #[allow(missing_docs)]
    pub dma_local_write_bytes: u64,
    /// Straight into another server's BAR (the zero-copy peer path).
    pub dma_peer_read_bytes: u64,
    #[allow(missing_docs)]
    pub dma_peer_write_bytes: u64,
    #[allow(missing_docs)]
    pub dma_peer_read_ops: u64,
    #[allow(missing_docs)]
    pub dma_peer_write_ops: u64,
    /// 1 when the peer registry runs (`--peer-path on`).
    pub peer_path: u64,
    /// Peers' traffic into the BAR the device shares, for device kinds
    /// that have one.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub inbound: Option<PeerInbound>,
    /// Peers' BARs mapped into the DMA space (nested layout only: the flat
    /// one holds numbers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_windows: Option<Vec<PeerWindow>>,
}

/// Peers' traffic into the device's shared BAR.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PeerInbound {
    /// Bytes peers wrote into it.
    pub peer_inbound_write_bytes: u64,
    /// Bytes peers read from it.
    pub peer_inbound_read_bytes: u64,
    /// How often the BAR moved (placements pushed to peers).
    pub peer_placement_changes: u64,
}

/// A peer BAR window in the DMA space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerWindow {
    /// Its guest-physical address.
    pub gpa: u64,
    /// Its length.
    pub len: u64,
}

/// A device's stats: its own counters plus the DMA paths.
pub struct DeviceStats {
    control: Arc<dyn DeviceControl>,
    dma: DmaSpace,
    peers: Option<Arc<PeerRegistry>>,
    peer_bar: Option<u8>,
}

impl std::fmt::Debug for DeviceStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStats")
            .field("peer_path", &self.peers.is_some())
            .field("peer_bar", &self.peer_bar)
            .finish_non_exhaustive()
    }
}

impl DeviceStats {
    /// Stats of the device behind `control`, whose DMA goes through `dma`
    /// and (with the peer path on) `peers`; `peer_bar` is the BAR peers
    /// reach directly, if the device kind has one.
    pub fn new(
        control: Arc<dyn DeviceControl>,
        dma: DmaSpace,
        peers: Option<Arc<PeerRegistry>>,
        peer_bar: Option<u8>,
    ) -> Self {
        Self {
            control,
            dma,
            peers,
            peer_bar,
        }
    }

    /// The device's control verbs.
    pub fn control(&self) -> &Arc<dyn DeviceControl> {
        &self.control
    }

    /// Which path DMA took so far.
    pub fn dma_paths(&self, with_windows: bool) -> DmaPaths {
        let d = self.dma.stats();
        let peers = self.peers.as_deref();
        let (own_read, own_write) = self.control.own_bar_dma_bytes();
        DmaPaths {
            dma_mmap_read_bytes: d.mmap.read_bytes,
            dma_mmap_write_bytes: d.mmap.write_bytes,
            dma_message_read_bytes: d.message.read_bytes,
            dma_message_write_bytes: d.message.write_bytes,
            dma_local_read_bytes: d.local.read_bytes + own_read,
            dma_local_write_bytes: d.local.write_bytes + own_write,
            dma_peer_read_bytes: d.peer.read_bytes,
            dma_peer_write_bytes: d.peer.write_bytes,
            dma_peer_read_ops: d.peer.read_ops,
            dma_peer_write_ops: d.peer.write_ops,
            peer_path: u64::from(peers.is_some()),
            inbound: self.peer_bar.map(|bar| {
                let inbound = peers.map(|p| p.inbound(bar)).unwrap_or_default();
                PeerInbound {
                    peer_inbound_write_bytes: inbound.written,
                    peer_inbound_read_bytes: inbound.read,
                    peer_placement_changes: peers.map_or(0, |p| p.placement_changes()),
                }
            }),
            peer_windows: with_windows.then(|| {
                self.dma
                    .peer_windows()
                    .iter()
                    .map(|&(gpa, len)| PeerWindow { gpa, len })
                    .collect()
            }),
        }
    }

    /// The stats as stats.json and `status` hold them: the device's
    /// counters with the DMA paths beside them or under their own key.
    pub fn value(&self) -> Value {
        let mut value = self.control.counters();
        let layout = self.control.stats_layout();
        let paths = self.dma_paths(matches!(layout, StatsLayout::Nested(_)));
        let paths = serde_json::to_value(paths).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            match (layout, paths) {
                (StatsLayout::Flat, Value::Object(paths)) => object.extend(paths),
                (StatsLayout::Nested(key), paths) => {
                    object.insert(key.into(), paths);
                }
                _ => {}
            }
        }
        value
    }

    /// [`value`](Self::value) as text: pretty when nested (NVMe's stats
    /// file is read by people too), one line when flat.
    pub fn json(&self) -> String {
        let value = self.value();
        let text = match self.control.stats_layout() {
            StatsLayout::Flat => serde_json::to_string(&value),
            StatsLayout::Nested(_) => serde_json::to_string_pretty(&value),
        };
        text.unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }).to_string())
    }
}

/// Answers the control socket for any device: `status` is its stats with
/// its fault report (`faults`) and registers (`registers`, when it lists
/// them); `inject`, `clear` and `reset` go to the device.
pub struct DeviceHandler(pub Arc<DeviceStats>);

impl ControlHandler for DeviceHandler {
    fn handle(&self, request: &ControlRequest) -> Result<Value, String> {
        let control = self.0.control();
        match request {
            ControlRequest::Status => {
                let mut value = self.0.value();
                if let Some(object) = value.as_object_mut() {
                    object.insert("faults".into(), control.fault_report());
                    if let Some(registers) = control.registers() {
                        let registers: serde_json::Map<String, Value> = registers
                            .into_iter()
                            .map(|(name, value)| (name.to_owned(), value.into()))
                            .collect();
                        object.insert("registers".into(), registers.into());
                    }
                }
                Ok(value)
            }
            ControlRequest::Inject { spec } => {
                let armed = control.inject(spec)?;
                Ok(serde_json::json!({ "id": armed.id, "spec": armed.spec }))
            }
            ControlRequest::Clear => {
                control.clear();
                Ok(serde_json::json!({}))
            }
            ControlRequest::Reset => {
                control.reset()?;
                Ok(serde_json::json!({}))
            }
            // Answered by the control server from `tracer`.
            ControlRequest::Trace { .. } => Err("trace is not handled here".into()),
        }
    }

    fn tracer(&self) -> Option<&p2plab_trace::Tracer> {
        Some(self.0.control().tracer())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2plab_kit::Armed;
    use std::sync::Mutex;

    /// A device with one counter and one register, in either layout.
    struct Device {
        layout: StatsLayout,
        armed: Mutex<Vec<String>>,
        trace: p2plab_trace::Tracer,
    }

    impl DeviceControl for Device {
        fn counters(&self) -> Value {
            serde_json::json!({ "jobs": 3 })
        }
        fn stats_layout(&self) -> StatsLayout {
            self.layout
        }
        fn own_bar_dma_bytes(&self) -> (u64, u64) {
            (5, 7)
        }
        fn inject(&self, spec: &str) -> Result<Armed, String> {
            if spec == "bad" {
                return Err("bad: unknown fault".into());
            }
            let mut armed = self.armed.lock().unwrap();
            armed.push(spec.into());
            Ok(Armed {
                id: armed.len() as u64,
                spec: format!("{spec},count=1"),
            })
        }
        fn clear(&self) {
            self.armed.lock().unwrap().clear();
        }
        fn reset(&self) -> Result<(), String> {
            Err("did not quiesce".into())
        }
        fn fault_report(&self) -> Value {
            serde_json::to_value(&*self.armed.lock().unwrap()).unwrap()
        }
        fn registers(&self) -> Option<Vec<(&'static str, u64)>> {
            (self.layout == StatsLayout::Flat).then(|| vec![("STATUS", 1)])
        }
        fn tracer(&self) -> &p2plab_trace::Tracer {
            &self.trace
        }
    }

    fn handler(layout: StatsLayout, peer_bar: Option<u8>) -> DeviceHandler {
        let device = Device {
            layout,
            armed: Mutex::default(),
            trace: p2plab_trace::Tracer::new(),
        };
        DeviceHandler(Arc::new(DeviceStats::new(
            Arc::new(device),
            DmaSpace::new(),
            None,
            peer_bar,
        )))
    }

    /// Catches: a flat stats object that loses a DMA-path key the e2e
    /// suites read, holds a non-number, or leaves out the faults and
    /// registers of `status`.
    #[test]
    fn flat_status_has_counters_dma_paths_faults_and_registers() {
        let h = handler(StatsLayout::Flat, Some(2));
        let armed = h
            .handle(&ControlRequest::Inject {
                spec: "drop".into(),
            })
            .unwrap();
        assert_eq!(armed, serde_json::json!({"id": 1, "spec": "drop,count=1"}));
        let status = h.handle(&ControlRequest::Status).unwrap();
        for key in [
            "jobs",
            "dma_mmap_read_bytes",
            "dma_message_write_bytes",
            "dma_peer_read_ops",
            "peer_path",
            "peer_inbound_write_bytes",
            "peer_placement_changes",
        ] {
            assert!(status[key].is_u64(), "{key} in {status}");
        }
        assert_eq!(
            status["dma_local_read_bytes"], 5,
            "own-BAR DMA counts as local"
        );
        assert_eq!(status["dma_local_write_bytes"], 7);
        assert!(status.get("peer_windows").is_none());
        assert_eq!(status["faults"], serde_json::json!(["drop"]));
        assert_eq!(status["registers"]["STATUS"], 1);
        let stats: Value = serde_json::from_str(&h.0.json()).unwrap();
        assert!(stats.as_object().unwrap().values().all(Value::is_u64));
    }

    /// Catches: NVMe's nested shape broken (the DMA paths must stay under
    /// `dma`, with the peer windows), a device without a shared BAR that
    /// reports inbound traffic, or a failed reset answered as a success.
    #[test]
    fn nested_layout_and_errors() {
        let h = handler(StatsLayout::Nested("dma"), None);
        let status = h.handle(&ControlRequest::Status).unwrap();
        assert_eq!(status["jobs"], 3);
        assert_eq!(status["dma"]["peer_path"], 0);
        assert_eq!(status["dma"]["peer_windows"], serde_json::json!([]));
        assert!(status["dma"].get("peer_inbound_read_bytes").is_none());
        assert!(status.get("registers").is_none());
        let err = h.handle(&ControlRequest::Reset).unwrap_err();
        assert_eq!(err, "did not quiesce");
        let err = h
            .handle(&ControlRequest::Inject { spec: "bad".into() })
            .unwrap_err();
        assert_eq!(err, "bad: unknown fault");
        assert_eq!(
            h.handle(&ControlRequest::Clear).unwrap(),
            serde_json::json!({})
        );
    }
}
