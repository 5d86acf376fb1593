//! The I/O loop: `size` bytes in `io_size` pieces, spread over threads
//! (piece i goes to thread i % threads), each piece at file offset
//! `file_offset + i * io_size` and buffer offset `gpu_offset + i * io_size`.
//! Every call's report is folded into a [`Summary`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use p2plab_gds::{Driver, FileHandle, GpuBuffer, IoReport, Path, Reason};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub write: bool,
    pub size: u64,
    pub io_size: u64,
    pub threads: u64,
    pub file_offset: u64,
    pub gpu_offset: u64,
}

/// What every call of a run added up to.
#[derive(Debug, Default)]
pub struct Summary {
    pub ios: u64,
    pub bytes: u64,
    pub p2p_bytes: u64,
    pub compat_bytes: u64,
    pub errors: u64,
    pub eof_ios: u64,
    /// Calls per compat reason.
    pub reasons: BTreeMap<&'static str, u64>,
    pub details: BTreeSet<String>,
    pub p2p_errno: i32,
    pub error_messages: Vec<String>,
    /// The report of the first call (by piece index), as JSON.
    pub first_report: Option<Value>,
    pub elapsed: Duration,
}

const MAX_MESSAGES: usize = 8;

impl Summary {
    fn add(&mut self, index: u64, report: &IoReport) {
        self.ios += 1;
        self.bytes += report.bytes();
        self.p2p_bytes += report.p2p_bytes;
        self.compat_bytes += report.compat_bytes;
        if report.eof {
            self.eof_ios += 1;
        }
        for reason in Reason::from_mask(report.reason_mask()) {
            *self.reasons.entry(reason.name()).or_default() += 1;
        }
        let detail = report.detail();
        if !detail.is_empty() && self.details.len() < MAX_MESSAGES {
            self.details.insert(detail);
        }
        if self.p2p_errno == 0 {
            self.p2p_errno = report.p2p_errno;
        }
        if index == 0 {
            self.first_report = Some(report.to_json());
        }
    }

    fn merge(&mut self, other: Summary) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.p2p_bytes += other.p2p_bytes;
        self.compat_bytes += other.compat_bytes;
        self.errors += other.errors;
        self.eof_ios += other.eof_ios;
        for (k, v) in other.reasons {
            *self.reasons.entry(k).or_default() += v;
        }
        for d in other.details {
            if self.details.len() < MAX_MESSAGES {
                self.details.insert(d);
            }
        }
        if self.p2p_errno == 0 {
            self.p2p_errno = other.p2p_errno;
        }
        for m in other.error_messages {
            if self.error_messages.len() < MAX_MESSAGES {
                self.error_messages.push(m);
            }
        }
        if other.first_report.is_some() {
            self.first_report = other.first_report;
        }
    }

    pub fn path(&self) -> Path {
        Path::from_bytes(self.p2p_bytes, self.compat_bytes)
    }

    pub fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / (1024.0 * 1024.0) / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "ios": self.ios,
            "bytes": self.bytes,
            "errors": self.errors,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "mib_per_s": self.mib_per_s(),
            "path": self.path().name(),
            "p2p_bytes": self.p2p_bytes,
            "compat_bytes": self.compat_bytes,
            "reasons": self.reasons,
            "details": self.details,
            "p2p_errno": self.p2p_errno,
            "eof": self.eof_ios > 0,
            "error_messages": self.error_messages,
            "first_report": self.first_report,
        })
    }
}

/// Runs the workload; errors of single calls are counted, not fatal.
pub fn run(driver: &Driver, file: &FileHandle, buf: &GpuBuffer, shape: Shape) -> Summary {
    let pieces = shape.size.div_ceil(shape.io_size);
    let threads = shape.threads.clamp(1, pieces.max(1));
    let total = Mutex::new(Summary::default());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let total = &total;
            scope.spawn(move || {
                let mut mine = Summary::default();
                let mut i = t;
                while i < pieces {
                    let at = i * shape.io_size;
                    let len = shape.io_size.min(shape.size - at);
                    let (file_off, buf_off) = (shape.file_offset + at, shape.gpu_offset + at);
                    let result = if shape.write {
                        driver.write(file, buf, len, file_off, buf_off)
                    } else {
                        driver.read(file, buf, len, file_off, buf_off)
                    };
                    match result {
                        Ok(report) => mine.add(i, &report),
                        Err(err) => {
                            mine.errors += 1;
                            if mine.error_messages.len() < MAX_MESSAGES {
                                mine.error_messages
                                    .push(format!("piece {i} at file offset {file_off}: {err}"));
                            }
                        }
                    }
                    i += threads;
                }
                let mut total = total.lock().unwrap_or_else(|p| p.into_inner());
                total.merge(mine);
            });
        }
    });
    let mut summary = total.into_inner().unwrap_or_else(|p| p.into_inner());
    summary.elapsed = started.elapsed();
    summary
}

/// Deterministic pseudo-random bytes for writes: byte `i` of the stream
/// of `seed`, 8 at a time.
pub fn pattern(seed: u64, start: u64, out: &mut [u8]) {
    for (k, chunk) in out.chunks_mut(8).enumerate() {
        let word = mix(seed, start / 8 + k as u64);
        let bytes = word.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn mix(seed: u64, index: u64) -> u64 {
    let mut x = seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_seeded() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        pattern(1, 0, &mut a);
        pattern(1, 0, &mut b);
        assert_eq!(a, b);
        pattern(2, 0, &mut b);
        assert_ne!(a, b);
        // Chunked generation equals one pass (chunks start on 8 bytes).
        let mut c = [0u8; 64];
        pattern(1, 0, &mut c[..32]);
        pattern(1, 32, &mut c[32..]);
        assert_eq!(a, c);
    }

    #[test]
    fn summary_merges_counts_and_keeps_the_first_report() {
        let mut a = Summary::default();
        let mut b = Summary::default();
        let report = IoReport {
            p2p_bytes: 4096,
            requested: 4096,
            ..IoReport::default()
        };
        a.add(0, &report);
        b.add(1, &report);
        b.errors = 1;
        a.merge(b);
        assert_eq!((a.ios, a.bytes, a.errors), (2, 8192, 1));
        assert_eq!(a.path(), Path::P2p);
        assert!(a.first_report.is_some());
    }
}
