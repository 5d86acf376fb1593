//! The wire's counters: live atomics and a serde snapshot, one flat JSON
//! object keyed by name (a device puts it in its stats as `wire`).

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! wire_counters {
    ($( $(#[doc = $doc:literal])+ $name:ident, )+) => {
        /// Live counters.
        #[derive(Debug, Default)]
        pub struct WireStats {
            $( $(#[doc = $doc])+ pub $name: AtomicU64, )+
        }

        /// The counters at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
        pub struct WireStatsSnapshot {
            $( $(#[doc = $doc])+ pub $name: u64, )+
        }

        impl WireStats {
            /// The counters now.
            pub fn snapshot(&self) -> WireStatsSnapshot {
                WireStatsSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )+ }
            }
        }

        impl WireStatsSnapshot {
            /// Every counter's name, as the JSON spells it.
            pub const NAMES: &'static [&'static str] = &[$( stringify!($name) ),+];
        }
    };
}

wire_counters! {
    /// Frames that went out whole (a reordered frame when it finally goes).
    frames_sent,
    /// Payload bytes of those frames.
    bytes_sent,
    /// Frames the device took off the wire.
    frames_received,
    /// Payload bytes of those frames.
    bytes_received,
    /// Received frames whose payload does not match their FCS (delivered,
    /// flagged).
    fcs_errors,
    /// Received frames that arrived after a frame sent later than them.
    out_of_order,
    /// Frames dropped by injection.
    drops,
    /// Frames delayed by injection.
    delays,
    /// Frames corrupted by injection.
    corrupts,
    /// Frames held back by injection to go out after later ones.
    reorders,
    /// Sends that waited longer than the send timeout for the peer to
    /// read (a socket link is closed then).
    send_timeouts,
    /// Sends the device gave up (reset, ring disabled, shutdown) before
    /// the frame went out.
    sends_abandoned,
    /// Connections closed because the peer sent bytes that are not a
    /// frame (bad magic, version, flags or length).
    protocol_errors,
    /// Connections refused: a uid not allowed, or a second peer while one
    /// is connected.
    peers_refused,
    /// Times a peer connected (the link came up).
    connections,
}

impl WireStats {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a counter missing from the JSON, renamed, or out of step
    /// with NAMES (the docs page is checked against NAMES).
    #[test]
    fn json_has_every_counter_by_name() {
        let stats = WireStats::default();
        WireStats::add(&stats.peers_refused, 2);
        let json = serde_json::to_value(stats.snapshot()).unwrap();
        let object = json.as_object().unwrap();
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        let mut names = WireStatsSnapshot::NAMES.to_vec();
        names.sort_unstable();
        assert_eq!(keys, names);
        assert_eq!(object["peers_refused"], 2);
    }
}
