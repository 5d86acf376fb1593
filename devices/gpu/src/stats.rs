//! Counters the host side reads to check what the engine really did.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters, updated by the engine and register paths.
        #[derive(Debug, Default)]
        pub struct Stats {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A copy of [`Stats`] at one moment, plus VRAM usage.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
            /// VRAM (BAR2) size in bytes.
            pub vram_size: u64,
            /// Host memory the VRAM memfd holds (touched pages), in bytes.
            pub vram_allocated_bytes: u64,
        }

        impl Stats {
            pub fn snapshot(&self, vram_size: u64, vram_allocated_bytes: u64) -> StatsSnapshot {
                StatsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    vram_size,
                    vram_allocated_bytes,
                }
            }
        }

        impl StatsSnapshot {
            /// One flat JSON object; every value is an unsigned integer.
            pub fn to_json(&self) -> String {
                self.to_json_with(&[])
            }

            /// Like [`Self::to_json`], with more counters appended (names
            /// must be plain identifiers).
            pub fn to_json_with(&self, extra: &[(&str, u64)]) -> String {
                let mut fields: Vec<String> = Vec::new();
                $(fields.push(format!("\"{}\":{}", stringify!($name), self.$name));)*
                fields.push(format!("\"vram_size\":{}", self.vram_size));
                fields.push(format!("\"vram_allocated_bytes\":{}", self.vram_allocated_bytes));
                for (name, value) in extra {
                    fields.push(format!("\"{name}\":{value}"));
                }
                format!("{{{}}}", fields.join(","))
            }
        }
    };
}

counters! {
    /// Bytes copied from guest memory (or a peer BAR) into VRAM.
    bytes_host_to_vram,
    /// Bytes copied from VRAM to guest memory (or a peer BAR).
    bytes_vram_to_host,
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

impl Stats {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_counter() {
        let stats = Stats::default();
        Stats::add(&stats.bytes_host_to_vram, 4096);
        Stats::add(&stats.jobs_failed, 2);
        let json = stats.snapshot(1 << 30, 8192).to_json();
        assert!(json.starts_with('{') && json.ends_with('}'));
        assert!(json.contains("\"bytes_host_to_vram\":4096"));
        assert!(json.contains("\"jobs_failed\":2"));
        assert!(json.contains("\"jobs_completed\":0"));
        assert!(json.contains("\"vram_size\":1073741824"));
        assert!(json.contains("\"vram_allocated_bytes\":8192"));
        assert_eq!(json.matches(':').count(), 18);
        let more = stats
            .snapshot(0, 0)
            .to_json_with(&[("dma_message_write_bytes", 7)]);
        assert!(more.ends_with(",\"dma_message_write_bytes\":7}"), "{more}");
    }
}
