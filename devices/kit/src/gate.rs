//! Bus Master Enable and reset quiesce for every device: one
//! [`GuestMemory`] wrapper, [`DmaGate`], through which a model does all
//! its DMA.
//!
//! - **BME.** The gate starts closed (COMMAND is 0 at power-on and after a
//!   reset) and follows COMMAND.BME ([`DmaGate::set_bus_master`]). A
//!   closed gate fails every access with
//!   [`DmaFaultKind::BusMasterDisabled`] without touching memory. An
//!   access already past the check when BME is cleared completes: PCI
//!   leaves in-flight requests to the device.
//! - **Reset quiesce.** The gate has an *epoch*. An engine reads
//!   [`DmaGate::epoch`] when it fetches work (under the lock it fetches
//!   under) and does that work's DMA through [`DmaGate::bound`], a view
//!   tied to that epoch. [`DmaGate::quiesce`], called by reset, bumps the
//!   epoch and waits until every access in flight has finished. After it
//!   returns, no access of work fetched before it can start (the view
//!   refuses with [`DmaFaultKind::Reset`]) or still be running. That is
//!   the transport's reset contract (`p2plab_vfio_user::Device::reset`):
//!   while reset runs the transport fences client DMA, so an access
//!   waiting for a DMA message fails at once and the wait cannot
//!   deadlock; it is bounded anyway, and a device that does not drain in
//!   time gets [`QuiesceTimeout`] (the reset fails with an error).
//!
//! Accesses through the gate itself (its own [`GuestMemory`] impl) are
//! tied to no epoch: BME gates them and quiesce waits for them, but a
//! model using them must stop its own workers on reset (NVMe joins its
//! queue workers).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use p2plab_dma::{Access, BusTarget, DmaFault, DmaFaultKind, GuestMemory, VolatileSlice};

/// How long [`DmaGate::quiesce`] waits for accesses in flight by default.
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which reset era work was fetched in (see [`DmaGate::epoch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(u64);

impl Epoch {
    /// The number, for traces and logs.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Accesses still ran when the quiesce gave up waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DMA quiesce: {in_flight} device accesses still running after {waited:?}")]
pub struct QuiesceTimeout {
    /// Accesses in flight at the end of the wait.
    pub in_flight: u64,
    /// How long it waited.
    pub waited: Duration,
}

/// Guest memory behind Bus Master Enable and the reset epoch.
pub struct DmaGate {
    inner: Arc<dyn GuestMemory>,
    enabled: AtomicBool,
    epoch: AtomicU64,
    in_flight: AtomicU64,
    /// Threads inside `quiesce`: an access that ends the last in flight
    /// wakes them only then (the hot path takes no lock otherwise).
    waiters: AtomicU64,
    drained_lock: Mutex<()>,
    drained: Condvar,
    timeout: Duration,
}

impl std::fmt::Debug for DmaGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaGate")
            .field("bus_master", &self.bus_master())
            .field("epoch", &self.epoch())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

/// One access in flight; dropping it ends the access.
struct InFlight<'a>(&'a DmaGate);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let gate = self.0;
        if gate.in_flight.fetch_sub(1, Ordering::SeqCst) == 1
            && gate.waiters.load(Ordering::SeqCst) > 0
        {
            let _lock = gate
                .drained_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            gate.drained.notify_all();
        }
    }
}

impl DmaGate {
    /// `inner` behind a closed gate, quiesce waiting up to
    /// [`QUIESCE_TIMEOUT`].
    pub fn new(inner: Arc<dyn GuestMemory>) -> Self {
        Self::with_timeout(inner, QUIESCE_TIMEOUT)
    }

    /// Like [`new`](Self::new), with quiesce waiting up to `timeout`.
    pub fn with_timeout(inner: Arc<dyn GuestMemory>, timeout: Duration) -> Self {
        Self {
            inner,
            enabled: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            waiters: AtomicU64::new(0),
            drained_lock: Mutex::new(()),
            drained: Condvar::new(),
            timeout,
        }
    }

    /// Follows COMMAND.BME.
    pub fn set_bus_master(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::SeqCst);
    }

    /// Whether the device may master the bus now.
    pub fn bus_master(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// The epoch work fetched now belongs to. Read it under the same lock
    /// the work is fetched under, so that a reset (which changes the
    /// device's state under that lock, then quiesces) either comes before
    /// the fetch or makes the work stale.
    pub fn epoch(&self) -> Epoch {
        Epoch(self.epoch.load(Ordering::SeqCst))
    }

    /// Whether `epoch` is still current (no quiesce since).
    pub fn is_current(&self, epoch: Epoch) -> bool {
        self.epoch() == epoch
    }

    /// Accesses running now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Guest memory for work fetched in `epoch`: refused once a quiesce
    /// has begun since.
    pub fn bound(&self, epoch: Epoch) -> BoundMemory<'_> {
        BoundMemory { gate: self, epoch }
    }

    /// Makes every epoch so far stale, without waiting: no access of work
    /// fetched before it can start any more (accesses already running
    /// go on). For a reset the guest starts with a register write and
    /// polls for the end of: the register handler (which must not wait
    /// for DMA) invalidates at once, and a device thread later calls
    /// [`quiesce`](Self::quiesce) to wait for what still runs before the
    /// device reports the reset done.
    pub fn invalidate(&self) -> Epoch {
        Epoch(self.epoch.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Makes every epoch so far stale and waits until no access is in
    /// flight, up to the gate's timeout. Call it from reset, after the
    /// device state is back to power-on (so engines find no new work),
    /// and with BME already clear for a PCI reset.
    pub fn quiesce(&self) -> Result<(), QuiesceTimeout> {
        self.invalidate();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let started = Instant::now();
        let deadline = started + self.timeout;
        let mut lock = self
            .drained_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let result = loop {
            let in_flight = self.in_flight();
            if in_flight == 0 {
                break Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(QuiesceTimeout {
                    in_flight,
                    waited: now - started,
                });
            }
            lock = match self.drained.wait_timeout(lock, deadline - now) {
                Ok((lock, _)) => lock,
                Err(poisoned) => poisoned.into_inner().0,
            };
        };
        drop(lock);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        if let Err(e) = &result {
            tracing::error!(error = %e, "device did not quiesce its DMA");
        }
        result
    }

    /// Starts an access of `len` bytes at `addr`, for work of `epoch`
    /// (`None`: no epoch check).
    fn enter(&self, epoch: Option<Epoch>, addr: u64, len: usize) -> Result<InFlight<'_>, DmaFault> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let access = InFlight(self);
        // Stale work first: a reset also clears BME, and the work's owner
        // must learn that the work is gone, not that the bus is off.
        if epoch.is_some_and(|e| !self.is_current(e)) {
            return Err(DmaFault::new(
                DmaFaultKind::Reset,
                addr,
                len as u64,
                "the device was reset after this work was fetched",
            ));
        }
        if !self.bus_master() {
            return Err(DmaFault::new(
                DmaFaultKind::BusMasterDisabled,
                addr,
                len as u64,
                "PCI Command.BME is clear",
            ));
        }
        Ok(access)
    }

    fn read_in(&self, epoch: Option<Epoch>, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let _access = self.enter(epoch, addr, buf.len())?;
        self.inner.read(addr, buf)
    }

    fn write_in(&self, epoch: Option<Epoch>, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        let _access = self.enter(epoch, addr, data.len())?;
        self.inner.write(addr, data)
    }

    fn with_direct_in(
        &self,
        epoch: Option<Epoch>,
        segments: &[(u64, usize)],
        access: Access,
        f: &mut dyn FnMut(&[VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        let (addr, len) = segments.first().copied().unwrap_or_default();
        let _access = self.enter(epoch, addr, len)?;
        self.inner.with_direct(segments, access, f)
    }

    fn prefault_in(&self, epoch: Option<Epoch>, addr: u64, len: u64) -> Result<(), DmaFault> {
        let _access = self.enter(epoch, addr, usize::try_from(len).unwrap_or(usize::MAX))?;
        self.inner.prefault(addr, len)
    }
}

impl GuestMemory for DmaGate {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.read_in(None, addr, buf)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.write_in(None, addr, data)
    }

    fn locate(&self, addr: u64, len: u64) -> BusTarget {
        self.inner.locate(addr, len)
    }

    fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: Access,
        f: &mut dyn FnMut(&[VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        self.with_direct_in(None, segments, access, f)
    }

    fn prefault(&self, addr: u64, len: u64) -> Result<(), DmaFault> {
        self.prefault_in(None, addr, len)
    }
}

/// The gate's memory for work of one epoch (see [`DmaGate::bound`]).
#[derive(Debug, Clone, Copy)]
pub struct BoundMemory<'a> {
    gate: &'a DmaGate,
    epoch: Epoch,
}

impl BoundMemory<'_> {
    /// The epoch its work was fetched in.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
}

impl GuestMemory for BoundMemory<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.gate.read_in(Some(self.epoch), addr, buf)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.gate.write_in(Some(self.epoch), addr, data)
    }

    fn locate(&self, addr: u64, len: u64) -> BusTarget {
        self.gate.inner.locate(addr, len)
    }

    fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: Access,
        f: &mut dyn FnMut(&[VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        self.gate
            .with_direct_in(Some(self.epoch), segments, access, f)
    }

    fn prefault(&self, addr: u64, len: u64) -> Result<(), DmaFault> {
        self.gate.prefault_in(Some(self.epoch), addr, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2plab_dma::testing::FakeGuestMemory;
    use std::sync::mpsc;

    fn ram() -> Arc<FakeGuestMemory> {
        Arc::new(FakeGuestMemory::new().with_region(0x1000, 0x1000))
    }

    /// Catches: a gate that lets DMA through with BME clear, or touches
    /// memory while refusing.
    #[test]
    fn a_closed_gate_refuses_and_leaves_memory_alone() {
        let ram = ram();
        let gate = DmaGate::new(ram.clone());
        assert!(!gate.bus_master(), "closed at power-on");
        let fault = gate.write_u32(0x1000, 0xdead_beef).unwrap_err();
        assert_eq!(fault.kind, DmaFaultKind::BusMasterDisabled);
        assert_eq!(ram.read_u32(0x1000).unwrap(), 0, "nothing was written");
        let bound = gate.bound(gate.epoch());
        assert_eq!(
            bound.read_u32(0x1000).unwrap_err().kind,
            DmaFaultKind::BusMasterDisabled
        );
        gate.set_bus_master(true);
        gate.write_u32(0x1000, 7).unwrap();
        assert_eq!(bound.read_u32(0x1000).unwrap(), 7);
        gate.set_bus_master(false);
        assert!(gate.read_u32(0x1000).is_err());
        assert_eq!(gate.in_flight(), 0, "refused accesses are not left counted");
    }

    /// Catches: work fetched before a reset that still reaches memory
    /// after it, or a quiesce that also blocks new work.
    #[test]
    fn quiesce_makes_older_work_stale() {
        let ram = ram();
        let gate = DmaGate::new(ram.clone());
        gate.set_bus_master(true);
        let old = gate.epoch();
        gate.quiesce().unwrap();
        let fault = gate.bound(old).write_u32(0x1000, 1).unwrap_err();
        assert_eq!(fault.kind, DmaFaultKind::Reset);
        gate.set_bus_master(false);
        let fault = gate.bound(old).write_u32(0x1000, 1).unwrap_err();
        assert_eq!(fault.kind, DmaFaultKind::Reset, "stale, whatever BME says");
        gate.set_bus_master(true);
        assert_eq!(ram.read_u32(0x1000).unwrap(), 0);
        gate.bound(gate.epoch()).write_u32(0x1000, 2).unwrap();
        gate.write_u32(0x1004, 3).unwrap();
        assert_eq!(ram.read_u32(0x1000).unwrap(), 2);
        assert_eq!(ram.read_u32(0x1004).unwrap(), 3);
    }

    /// Catches: an invalidate that leaves older work able to start an
    /// access, or that makes new work stale too.
    #[test]
    fn invalidate_makes_older_work_stale_without_waiting() {
        let ram = ram();
        let gate = DmaGate::new(ram.clone());
        gate.set_bus_master(true);
        let old = gate.epoch();
        let new = gate.invalidate();
        assert_eq!(new, gate.epoch());
        assert_ne!(new, old);
        let fault = gate.bound(old).write_u32(0x1000, 1).unwrap_err();
        assert_eq!(fault.kind, DmaFaultKind::Reset);
        gate.bound(new).write_u32(0x1000, 2).unwrap();
        assert_eq!(ram.read_u32(0x1000).unwrap(), 2);
    }

    /// Catches: a quiesce that returns while an access is still running
    /// (a DMA landing after the reset replied), or one that never returns
    /// once it ends.
    #[test]
    fn quiesce_waits_for_the_access_in_flight() {
        let gate = Arc::new(DmaGate::new(ram()));
        gate.set_bus_master(true);
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let worker = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                let epoch = gate.epoch();
                let mut f = |_: &[VolatileSlice<'_>]| {
                    entered_tx.send(()).ok();
                    release_rx.recv().ok();
                    Ok(())
                };
                // FakeGuestMemory serves with_direct for RAM.
                gate.bound(epoch)
                    .with_direct(&[(0x1000, 16)], Access::Write, &mut f)
                    .map(|r| r.is_some())
            })
        };
        entered.recv().unwrap();
        assert_eq!(gate.in_flight(), 1);
        let (done_tx, done) = mpsc::channel();
        let quiescer = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || done_tx.send(gate.quiesce()).ok())
        };
        assert!(
            done.recv_timeout(Duration::from_millis(100)).is_err(),
            "quiesce returned with an access in flight"
        );
        release.send(()).unwrap();
        let result = done.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(result, Ok(()));
        assert_eq!(worker.join().unwrap(), Ok(true));
        quiescer.join().unwrap();
    }

    /// Catches: a quiesce that hangs forever on a device that never
    /// drains; it must give up with an error naming what is stuck.
    #[test]
    fn quiesce_gives_up_with_an_error() {
        let gate = Arc::new(DmaGate::with_timeout(ram(), Duration::from_millis(50)));
        gate.set_bus_master(true);
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let worker = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                let mut f = |_: &[VolatileSlice<'_>]| {
                    entered_tx.send(()).ok();
                    release_rx.recv().ok();
                    Ok(())
                };
                gate.with_direct(&[(0x1000, 16)], Access::Read, &mut f)
                    .map(|r| r.is_some())
            })
        };
        entered.recv().unwrap();
        let error = gate.quiesce().unwrap_err();
        assert_eq!(error.in_flight, 1);
        assert!(error.waited >= Duration::from_millis(50));
        release.send(()).unwrap();
        assert_eq!(worker.join().unwrap(), Ok(true));
        assert_eq!(gate.in_flight(), 0);
    }
}
