//! NVMe-only fakes for tests (the guest-memory fakes are p2plab-dma's
//! `testing` module): an interrupt sink that records vectors.
//!
//! Built for this crate's unit tests and, with the `testing` feature, for
//! integration tests and other crates' tests.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::interrupts::Interrupts;

/// Records every interrupt and lets a test wait for one.
#[derive(Default)]
pub struct RecordingInterrupts {
    fired: Mutex<Vec<u16>>,
    cond: Condvar,
}

impl RecordingInterrupts {
    /// An empty recorder, shared with the controller under test.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Every vector signalled so far, in order.
    pub fn vectors(&self) -> Vec<u16> {
        crate::lock(&self.fired).clone()
    }

    /// How often `vector` was signalled.
    pub fn count(&self, vector: u16) -> usize {
        crate::lock(&self.fired)
            .iter()
            .filter(|&&v| v == vector)
            .count()
    }

    /// Waits until `vector` fired more than `seen` times.
    pub fn wait_for(&self, vector: u16, seen: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut fired = crate::lock(&self.fired);
        loop {
            if fired.iter().filter(|&&v| v == vector).count() > seen {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            fired = match self.cond.wait_timeout(fired, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

impl Interrupts for RecordingInterrupts {
    fn notify(&self, vector: u16) {
        crate::lock(&self.fired).push(vector);
        self.cond.notify_all();
    }
}
