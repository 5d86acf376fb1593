//! Test doubles every model's tests share (feature `testing`). Guest
//! memory fakes are p2plab-dma's `testing` module.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::interrupts::Interrupts;

/// Records every vector signalled and lets a test wait for one.
#[derive(Debug, Default)]
pub struct RecordingInterrupts {
    fired: Mutex<Vec<u16>>,
    cond: Condvar,
}

impl RecordingInterrupts {
    /// An empty recorder, to share with the model under test.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn fired(&self) -> MutexGuard<'_, Vec<u16>> {
        self.fired.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every vector signalled so far, in order.
    pub fn vectors(&self) -> Vec<u16> {
        self.fired().clone()
    }

    /// How often `vector` was signalled.
    pub fn count(&self, vector: u16) -> usize {
        self.fired().iter().filter(|&&v| v == vector).count()
    }

    /// How many vectors were signalled, whichever.
    pub fn total(&self) -> usize {
        self.fired().len()
    }

    /// Waits until `vector` fired more than `seen` times; false on
    /// timeout.
    pub fn wait_for(&self, vector: u16, seen: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut fired = self.fired();
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
        self.fired().push(vector);
        self.cond.notify_all();
    }
}

/// Waits until `done` holds, polling every 2 ms; panics naming `what`
/// (the test fails) if it does not within `within`. For device tests that
/// wait on engine threads or on a server process.
pub fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
