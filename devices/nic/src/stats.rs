//! Counters the host side reads to check what the NIC really did.

p2plab_kit::counters! {
    /// Live counters, updated by the engines and the register path.
    pub struct Stats => StatsSnapshot {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a counter missing from stats.json or renamed (the rdma
    /// e2e suite reads them by name).
    #[test]
    fn json_has_every_counter_by_name() {
        let stats = Stats::default();
        Stats::add(&stats.rx_discarded, 3);
        let json = serde_json::to_value(stats.snapshot()).unwrap();
        let object = json.as_object().unwrap();
        assert_eq!(object["rx_discarded"], 3);
        assert_eq!(object["tx_packets"], 0);
        assert_eq!(object.len(), 21);
        assert!(object.values().all(serde_json::Value::is_u64));
    }
}
