//! Fakes for the GPU's tests (feature `testing`): a guest memory whose
//! reads can be held mid-job. Plain guest RAM is
//! `p2plab_dma::testing::FakeGuestMemory`, the interrupt recorder
//! `p2plab_kit::testing::RecordingInterrupts`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use p2plab_dma::{DmaFault, GuestMemory};

/// Guest memory whose reads at or above an address block while its gate
/// is closed, to hold the engine in the middle of a job (a reset or ring
/// disable can then overtake it deterministically). Reads below that
/// address (the ring) and writes always go through.
pub struct GatedMemory<M> {
    inner: M,
    gated_from: u64,
    gate_open: Mutex<bool>,
    gate: Condvar,
    reads_held: AtomicU64,
}

impl<M: GuestMemory> GatedMemory<M> {
    /// Wraps `inner`, gating reads at or above `gated_from`; the gate
    /// starts open.
    pub fn new(inner: M, gated_from: u64) -> Self {
        Self {
            inner,
            gated_from,
            gate_open: Mutex::new(true),
            gate: Condvar::new(),
            reads_held: AtomicU64::new(0),
        }
    }

    /// The memory behind the gate, for the test's own accesses.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// Gated reads block from now on.
    pub fn close_gate(&self) {
        *self
            .gate_open
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = false;
    }

    /// Lets blocked and future reads through.
    pub fn open_gate(&self) {
        *self
            .gate_open
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.gate.notify_all();
    }

    /// How many reads have blocked at the closed gate so far.
    pub fn reads_held(&self) -> u64 {
        self.reads_held.load(Ordering::SeqCst)
    }
}

impl<M: GuestMemory> GuestMemory for GatedMemory<M> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let mut open = self
            .gate_open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !*open && addr >= self.gated_from {
            self.reads_held.fetch_add(1, Ordering::SeqCst);
            while !*open {
                open = self.gate.wait(open).unwrap_or_else(PoisonError::into_inner);
            }
        }
        drop(open);
        self.inner.read(addr, buf)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.inner.write(addr, data)
    }

    fn locate(&self, addr: u64, len: u64) -> p2plab_dma::BusTarget {
        self.inner.locate(addr, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2plab_dma::testing::FakeGuestMemory;
    use std::sync::Arc;

    #[test]
    fn closed_gate_holds_reads_above_the_line_only() {
        let memory = Arc::new(GatedMemory::new(
            FakeGuestMemory::new().with_region(0, 0x2000),
            0x1000,
        ));
        memory.close_gate();
        let mut buf = [0u8; 4];
        memory.read(0x10, &mut buf).unwrap();
        memory.write(0x1800, &[7; 4]).unwrap();
        let reader = {
            let memory = Arc::clone(&memory);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4];
                memory.read(0x1800, &mut buf).map(|()| buf)
            })
        };
        while memory.reads_held() == 0 {
            std::thread::yield_now();
        }
        memory.open_gate();
        assert_eq!(reader.join().unwrap().unwrap(), [7; 4]);
    }
}
