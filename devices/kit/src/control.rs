//! The control verbs every device answers (`p2plab-ctl status`, `inject`,
//! `clear`, `reset`, `trace`): one trait a model implements, with no
//! knowledge of the control socket; p2plab-server serves it.

use std::fmt::Display;
use std::str::FromStr;

use serde::Serialize;
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

/// Parses `text` as a device's fault spec and arms it with `arm`; the
/// answer carries the spec as the device understood it (canonical form).
pub fn arm_spec<S>(text: &str, arm: impl FnOnce(S) -> Result<u64, String>) -> Result<Armed, String>
where
    S: FromStr + Display,
    S::Err: Display,
{
    let spec: S = text.parse().map_err(|e: S::Err| e.to_string())?;
    let canonical = spec.to_string();
    let id = arm(spec)?;
    Ok(Armed {
        id,
        spec: canonical,
    })
}

/// A counters snapshot as one flat JSON object, with `extra` values
/// (device state that is not a counter) beside them.
pub fn counters_with(snapshot: impl Serialize, extra: &[(&str, u64)]) -> Value {
    let mut value = serde_json::to_value(snapshot)
        .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }));
    if let Some(object) = value.as_object_mut() {
        for &(name, number) in extra {
            object.insert(name.into(), number.into());
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a spec armed in another form than the one reported, or a
    /// parse error swallowed.
    #[test]
    fn specs_are_parsed_armed_and_reported_canonically() {
        let armed = arm_spec(" 7 ", |n: u8| Ok(u64::from(n) * 2));
        assert_eq!(armed.unwrap_err(), "invalid digit found in string");
        let armed = arm_spec("7", |n: u8| Ok(u64::from(n) * 2)).unwrap();
        assert_eq!(
            armed,
            Armed {
                id: 14,
                spec: "7".into()
            }
        );
        let refused = arm_spec("7", |_: u8| Err("no".to_string()));
        assert_eq!(refused.unwrap_err(), "no");
    }

    /// Catches: extra values that replace the object or get lost.
    #[test]
    fn counters_with_extra_values_stay_flat() {
        let value = counters_with(serde_json::json!({"a": 1}), &[("b", 2)]);
        assert_eq!(value, serde_json::json!({"a": 1, "b": 2}));
    }
}
