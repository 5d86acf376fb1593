//! Counters the host reads to check what the EFA really did. The fabric
//! and message counters are the same numbers GET_STATS reports to the
//! driver (and `rdma statistic` / `hw_counters` show in the guest), so the
//! guest's view and the server's can be compared.

p2plab_kit::counters! {
    /// Live counters, updated by the engines and the register path.
    pub struct Stats => StatsSnapshot {
        /// Admin commands completed (any status).
        admin_commands,
        /// Admin commands completed with a status other than SUCCESS.
        admin_errors,
        /// Admin commands with an opcode the interface does not define.
        admin_bad_opcodes,
        /// Admin commands the device answered UNSUPPORTED_OPCODE.
        admin_unsupported,
        /// Readless register reads answered.
        readless_reads,
        /// Readless reads that could not be answered (no response
        /// address, not in direct guest RAM, bus mastering off).
        readless_failures,
        /// AENQ entries posted.
        aenq_events,
        /// Keep-alive events among them.
        keep_alives,
        /// AENQ events dropped because the AENQ was full or not set up.
        aenq_dropped,
        /// MSI-X notifications sent.
        interrupts,
        /// Interrupts not sent by injection (`drop-irq`).
        dropped_interrupts,
        /// SQ doorbell writes.
        sq_doorbells,
        /// RQ doorbell writes.
        rq_doorbells,
        /// CQ doorbell writes.
        cq_doorbells,
        /// Doorbell writes to no queue, or with a value that cannot be.
        bad_doorbells,
        /// TX WQEs completed with an error before anything was sent.
        bad_wqes,
        /// Completion entries written.
        cqes,
        /// Completions with a status other than OK.
        cqe_errors,
        /// Completions given an error status by injection (`cq-error`).
        injected_cq_errors,
        /// Event queue entries written.
        eqes,
        /// Packets sent (GET_STATS basic tx_pkts).
        tx_pkts,
        /// Bytes of those packets.
        tx_bytes,
        /// Packets received.
        rx_pkts,
        /// Bytes of those packets.
        rx_bytes,
        /// Received packets dropped: no QP, wrong state, no receive posted
        /// for UD, a bad checksum.
        rx_drops,
        /// Received packets dropped for a qkey mismatch.
        qkey_viol,
        /// SEND WQEs completed OK.
        send_wrs,
        /// Bytes of those SENDs.
        send_bytes,
        /// Receive WQEs completed OK.
        recv_wrs,
        /// Bytes received into them.
        recv_bytes,
        /// RDMA reads completed OK.
        read_wrs,
        /// Bytes they read.
        read_bytes,
        /// RDMA reads completed with an error.
        read_wr_err,
        /// Bytes this device served to remote readers.
        read_resp_bytes,
        /// RDMA writes completed OK.
        write_wrs,
        /// Bytes they wrote.
        write_bytes,
        /// RDMA writes completed with an error.
        write_wr_err,
        /// Bytes remote writers wrote into this device's MRs.
        write_recv_bytes,
        /// Bytes sent again.
        retrans_bytes,
        /// Packets sent again (timeouts and RNR retries).
        retrans_pkts,
        /// Retransmission timeouts.
        retrans_timeout_events,
        /// Messages given up on: the remote stopped answering.
        unresponsive_remote_events,
        /// Retransmissions after the remote had answered before.
        impaired_remote_conn_events,
        /// RNR negative acknowledgements sent (no receive posted).
        rnr_naks,
        /// Duplicate packets recognised and acknowledged again.
        duplicates,
        /// Packets dropped by injection (`drop`).
        wire_drops,
        /// Packets corrupted by injection (`corrupt`).
        wire_corrupts,
        /// Packets delayed by injection (`delay=`).
        wire_delays,
        /// Packets held back by injection (`reorder`).
        wire_reorders,
        /// Received bytes that were not a valid packet (checksum, format).
        bad_packets,
        /// Packets dropped because the outgoing queue was full.
        tx_queue_drops,
        /// Payload bytes read from or written to a peer device's BAR
        /// (dma-buf MRs of P2P memory), not RAM.
        peer_bar_bytes,
        /// DMA the device could not do (a guest address nothing answers).
        dma_errors,
        /// Device resets (DEV_CTL and PCI).
        resets,
        /// Trapped register accesses of an unsupported size or alignment.
        bad_register_accesses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a counter missing from stats.json or renamed (the e2e
    /// suites read them by name and compare them with GET_STATS).
    #[test]
    fn json_has_every_counter_by_name() {
        let stats = Stats::default();
        Stats::add(&stats.send_wrs, 3);
        let json = serde_json::to_value(stats.snapshot()).unwrap();
        let object = json.as_object().unwrap();
        assert_eq!(object["send_wrs"], 3);
        for name in [
            "tx_pkts",
            "rx_bytes",
            "read_resp_bytes",
            "retrans_pkts",
            "admin_commands",
        ] {
            assert_eq!(object[name], 0, "{name}");
        }
        assert_eq!(object.len(), StatsSnapshot::NAMES.len());
        assert!(object.values().all(serde_json::Value::is_u64));
    }
}
