//! Counters the host side reads to check what the engine really did.

p2plab_kit::counters! {
    /// Live counters, updated by the engine and register paths.
    pub struct Stats => StatsSnapshot {
        /// Bytes copied from guest memory (or a peer BAR) into VRAM.
        bytes_host_to_vram,
        /// Bytes copied from VRAM to guest memory (or a peer BAR).
        bytes_vram_to_host,
        /// The part of `bytes_host_to_vram` that came from guest RAM (a
        /// bounce through system memory, not peer-to-peer): what
        /// `p2plab-ctl RUN provenance` looks for.
        bytes_ram_to_vram,
        /// The part of `bytes_vram_to_host` that went to guest RAM.
        bytes_vram_to_ram,
        /// Bytes copied inside VRAM.
        bytes_vram_to_vram,
        /// Bytes written by fill commands.
        bytes_filled,
        /// Bytes read by checksum commands.
        bytes_checksummed,
        /// Commands retired with status OK.
        jobs_completed,
        /// Commands retired with an error status.
        jobs_failed,
        /// Ring-level errors that halted the engine.
        ring_errors,
        /// Doorbell writes.
        doorbells,
        /// MSI-X notifications sent.
        interrupts,
        /// Device resets (FLR, vfio-user reset, disconnect).
        resets,
        /// Trapped register accesses with a size or alignment the device does not support.
        bad_register_accesses,
        /// Jobs retired with an injected error status (`job-error`).
        injected_job_errors,
        /// Jobs the engine held without retiring (`hang`).
        injected_hangs,
        /// Interrupts not sent (`drop-irq`).
        dropped_interrupts,
        /// Jobs failed by an injected VRAM error range (`vram-error`).
        vram_errors,
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a counter missing from stats.json or renamed (the e2e
    /// suites and `p2plab-ctl status` read them by name).
    #[test]
    fn json_has_every_counter_by_name() {
        let stats = Stats::default();
        Stats::add(&stats.bytes_host_to_vram, 4096);
        Stats::add(&stats.jobs_failed, 2);
        let json = serde_json::to_value(stats.snapshot()).unwrap();
        let object = json.as_object().unwrap();
        assert_eq!(object["bytes_host_to_vram"], 4096);
        assert_eq!(object["jobs_failed"], 2);
        assert_eq!(object["jobs_completed"], 0);
        assert_eq!(object.len(), 18);
        assert!(object.values().all(serde_json::Value::is_u64));
    }
}
