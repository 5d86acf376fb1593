//! Counters the host side reads to check what the NIC really did.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters, updated by the engines and the register path.
        #[derive(Debug, Default)]
        pub struct Stats {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A copy of [`Stats`] at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Stats {
            /// The counters now.
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }

        impl StatsSnapshot {
            /// One flat JSON object of unsigned integers, with `extra`
            /// counters appended (plain identifiers).
            pub fn to_json_with(&self, extra: &[(&str, u64)]) -> String {
                let mut fields: Vec<String> = Vec::new();
                $(fields.push(format!("\"{}\":{}", stringify!($name), self.$name));)*
                for (name, value) in extra {
                    fields.push(format!("\"{name}\":{value}"));
                }
                format!("{{{}}}", fields.join(","))
            }
        }
    };
}

counters! {
    /// Frames the TX engine put on the wire (or dropped by injection).
    tx_packets,
    /// Payload bytes of those frames.
    tx_bytes,
    /// TX descriptors completed with an error status.
    tx_errors,
    /// TX payload bytes read from a peer device's BAR (not RAM).
    tx_peer_bar_bytes,
    /// Frames the RX engine delivered into a buffer.
    rx_packets,
    /// Bytes delivered into RX buffers.
    rx_bytes,
    /// RX descriptors completed with an error status (BAD_FCS and
    /// TRUNCATED included).
    rx_errors,
    /// RX bytes written into a peer device's BAR (not RAM).
    rx_peer_bar_bytes,
    /// Frames received with a bad frame check sequence.
    rx_fcs_errors,
    /// Frames longer than the RX buffer they landed in.
    rx_truncated,
    /// Frames dropped because the receiver was disabled (or was reset
    /// before a buffer took them).
    rx_discarded,
    /// Frames the wire dropped by injection (`drop`).
    wire_drops,
    /// Frames the wire corrupted by injection (`corrupt`).
    wire_corrupts,
    /// Frames the wire delayed by injection (`delay=`).
    wire_delays,
    /// Interrupts not sent by injection (`drop-irq`).
    dropped_interrupts,
    /// Descriptors or buffers the device could not reach.
    dma_errors,
    /// Ring-level errors that halted an engine.
    ring_errors,
    /// TX and RX doorbell writes.
    doorbells,
    /// MSI-X notifications sent.
    interrupts,
    /// Device resets.
    resets,
    /// Trapped register accesses of a size or alignment the device does
    /// not support.
    bad_register_accesses,
}

impl Stats {
    /// Adds `value` to `counter`.
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}
