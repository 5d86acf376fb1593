//! How the controller reaches memory: guest memory through the transport,
//! its own Controller Memory Buffer locally, and the router that decides
//! which one an address belongs to.
//!
//! The model only sees the two small traits here, so unit tests run against
//! in-memory fakes ([`testing`]) and the server binary adapts the transport's
//! DMA space and shared memory to them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::stats::Stats;

/// A DMA that could not be done: unmapped, out of range, or the transport
/// failed. Device models turn it into a Data Transfer Error, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DMA fault at {addr:#x}+{len:#x}: {reason}")]
pub struct DmaFault {
    pub addr: u64,
    pub len: u64,
    pub reason: String,
}

impl DmaFault {
    pub fn new(addr: u64, len: u64, reason: impl Into<String>) -> Self {
        Self {
            addr,
            len,
            reason: reason.into(),
        }
    }
}

/// Guest-physical memory as the device (a bus master) sees it.
pub trait GuestMemory: Send + Sync {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault>;
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault>;
}

/// Memory behind one of the device's own BARs (the CMB), addressed by
/// offset. The guest may map the same memory directly, so reads and writes
/// race with guest CPU accesses exactly as on hardware.
pub trait RegionMemory: Send + Sync {
    fn size(&self) -> u64;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaFault>;
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault>;
}

/// Where an access was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    /// Bytes served from the controller's own CMB.
    pub cmb: u64,
    /// Bytes that went to guest memory through the transport.
    pub host: u64,
}

impl Placement {
    pub fn add(&mut self, other: Placement) {
        self.cmb += other.cmb;
        self.host += other.host;
    }
}

/// No CMB window is decoded.
const NO_WINDOW: u64 = u64::MAX;

/// The controller's view of the bus: addresses inside its enabled CMB are
/// served from local memory, everything else from guest memory. Accesses
/// that straddle the CMB boundary are split.
pub struct DmaRouter {
    guest: Arc<dyn GuestMemory>,
    cmb: Option<Arc<dyn RegionMemory>>,
    /// Bus address of CMB offset 0 while the CMB is enabled for controller
    /// accesses (CMBMSC.CMSE), else `NO_WINDOW`.
    window: AtomicU64,
    stats: Arc<Stats>,
}

impl DmaRouter {
    pub fn new(
        guest: Arc<dyn GuestMemory>,
        cmb: Option<Arc<dyn RegionMemory>>,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            guest,
            cmb,
            window: AtomicU64::new(NO_WINDOW),
            stats,
        }
    }

    pub fn cmb(&self) -> Option<&Arc<dyn RegionMemory>> {
        self.cmb.as_ref()
    }

    /// Starts (`Some(base)`) or stops decoding the CMB at a bus address.
    pub fn set_window(&self, base: Option<u64>) {
        let value = match (&self.cmb, base) {
            (Some(_), Some(base)) => base,
            _ => NO_WINDOW,
        };
        self.window.store(value, Ordering::Release);
    }

    pub fn window(&self) -> Option<u64> {
        match self.window.load(Ordering::Acquire) {
            NO_WINDOW => None,
            base => Some(base),
        }
    }

    /// The CMB offset of `addr` when it lies inside the decoded CMB.
    pub fn cmb_offset(&self, addr: u64) -> Option<u64> {
        let base = self.window()?;
        let size = self.cmb.as_ref()?.size();
        let offset = addr.checked_sub(base)?;
        (offset < size).then_some(offset)
    }

    /// Splits `[addr, addr+len)` into pieces that are wholly inside or
    /// wholly outside the CMB window: `(addr, len, cmb_offset)`.
    fn pieces(&self, addr: u64, len: u64) -> Result<Vec<(u64, u64, Option<u64>)>, DmaFault> {
        if addr.checked_add(len).is_none() {
            return Err(DmaFault::new(addr, len, "address range wraps around"));
        }
        let (base, size) = match (self.window(), &self.cmb) {
            (Some(base), Some(cmb)) => (base, cmb.size()),
            _ => return Ok(vec![(addr, len, None)]),
        };
        let end = addr + len;
        let cmb_end = base.saturating_add(size);
        let mut out = Vec::with_capacity(1);
        let mut at = addr;
        while at < end {
            if at < base {
                let stop = end.min(base);
                out.push((at, stop - at, None));
                at = stop;
            } else if at < cmb_end {
                let stop = end.min(cmb_end);
                out.push((at, stop - at, Some(at - base)));
                at = stop;
            } else {
                out.push((at, end - at, None));
                at = end;
            }
        }
        Ok(out)
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<Placement, DmaFault> {
        let mut placement = Placement::default();
        let mut done = 0usize;
        for (at, len, cmb_offset) in self.pieces(addr, buf.len() as u64)? {
            let len = len as usize;
            let part = &mut buf[done..done + len];
            match (cmb_offset, &self.cmb) {
                (Some(offset), Some(cmb)) => {
                    cmb.read(offset, part)?;
                    placement.cmb += len as u64;
                }
                _ => {
                    self.guest.read(at, part).inspect_err(|_| {
                        self.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                    })?;
                    placement.host += len as u64;
                }
            }
            done += len;
        }
        self.stats
            .cmb_read_bytes
            .fetch_add(placement.cmb, Ordering::Relaxed);
        self.stats
            .host_read_bytes
            .fetch_add(placement.host, Ordering::Relaxed);
        Ok(placement)
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Result<Placement, DmaFault> {
        let mut placement = Placement::default();
        let mut done = 0usize;
        for (at, len, cmb_offset) in self.pieces(addr, data.len() as u64)? {
            let len = len as usize;
            let part = &data[done..done + len];
            match (cmb_offset, &self.cmb) {
                (Some(offset), Some(cmb)) => {
                    cmb.write(offset, part)?;
                    placement.cmb += len as u64;
                }
                _ => {
                    self.guest.write(at, part).inspect_err(|_| {
                        self.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                    })?;
                    placement.host += len as u64;
                }
            }
            done += len;
        }
        self.stats
            .cmb_write_bytes
            .fetch_add(placement.cmb, Ordering::Relaxed);
        self.stats
            .host_write_bytes
            .fetch_add(placement.host, Ordering::Relaxed);
        Ok(placement)
    }

    pub fn read_u32(&self, addr: u64) -> Result<u32, DmaFault> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub fn write_u32(&self, addr: u64, value: u32) -> Result<(), DmaFault> {
        self.write(addr, &value.to_le_bytes()).map(|_| ())
    }
}

/// A region of plain process memory, used for the CMB when no shared
/// memory is needed (unit tests) and as a building block of the fakes.
pub struct HeapRegion {
    bytes: Mutex<Vec<u8>>,
    size: u64,
}

impl HeapRegion {
    pub fn new(size: usize) -> Self {
        Self {
            bytes: Mutex::new(vec![0; size]),
            size: size as u64,
        }
    }

    fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>, DmaFault> {
        let end = offset
            .checked_add(len as u64)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| DmaFault::new(offset, len as u64, "outside the region"))?;
        Ok(offset as usize..end as usize)
    }
}

impl RegionMemory for HeapRegion {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let range = self.range(offset, buf.len())?;
        let bytes = crate::lock(&self.bytes);
        buf.copy_from_slice(&bytes[range]);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        let range = self.range(offset, data.len())?;
        let mut bytes = crate::lock(&self.bytes);
        bytes[range].copy_from_slice(data);
        Ok(())
    }
}

/// Fakes for tests: guest memory as a few heap-backed ranges, and an
/// interrupt sink that records vectors.
pub mod testing {
    use super::*;
    use crate::controller::Interrupts;
    use std::sync::Condvar;
    use std::time::{Duration, Instant};

    /// Guest memory made of heap regions at fixed guest-physical bases;
    /// everything else faults, like an unmapped range.
    #[derive(Default)]
    pub struct FakeGuestMemory {
        regions: Vec<(u64, HeapRegion)>,
    }

    impl FakeGuestMemory {
        pub fn new() -> Self {
            Self::default()
        }

        /// Adds `size` bytes of RAM at `base`.
        pub fn with_region(mut self, base: u64, size: usize) -> Self {
            self.regions.push((base, HeapRegion::new(size)));
            self
        }

        fn find(&self, addr: u64, len: usize) -> Result<(&HeapRegion, u64), DmaFault> {
            for (base, region) in &self.regions {
                if let Some(offset) = addr.checked_sub(*base) {
                    let end = offset.checked_add(len as u64);
                    if end.is_some_and(|end| end <= region.size()) {
                        return Ok((region, offset));
                    }
                }
            }
            Err(DmaFault::new(addr, len as u64, "not mapped"))
        }
    }

    impl GuestMemory for FakeGuestMemory {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
            let (region, offset) = self.find(addr, buf.len())?;
            region.read(offset, buf)
        }

        fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
            let (region, offset) = self.find(addr, data.len())?;
            region.write(offset, data)
        }
    }

    /// Records every interrupt and lets a test wait for one.
    #[derive(Default)]
    pub struct RecordingInterrupts {
        fired: Mutex<Vec<u16>>,
        cond: Condvar,
    }

    impl RecordingInterrupts {
        pub fn new() -> Arc<Self> {
            Arc::new(Self::default())
        }

        pub fn vectors(&self) -> Vec<u16> {
            crate::lock(&self.fired).clone()
        }

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
}

#[cfg(test)]
mod tests {
    use super::testing::FakeGuestMemory;
    use super::*;

    fn router() -> DmaRouter {
        let guest = FakeGuestMemory::new().with_region(0x10000, 0x10000);
        DmaRouter::new(
            Arc::new(guest),
            Some(Arc::new(HeapRegion::new(0x2000))),
            Arc::new(Stats::default()),
        )
    }

    #[test]
    fn without_window_everything_goes_to_guest_memory() {
        let r = router();
        let p = r.write(0x10000, &[1, 2, 3]).unwrap();
        assert_eq!(p, Placement { cmb: 0, host: 3 });
        let mut b = [0; 3];
        r.read(0x10000, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3]);
        assert!(
            r.read(0x0, &mut b).is_err(),
            "unmapped guest address faults"
        );
    }

    #[test]
    fn cmb_window_is_served_locally_and_split_at_its_edges() {
        let r = router();
        // CMB decoded at 0x1f000..0x21000, overlapping the end of guest RAM.
        r.set_window(Some(0x1f000));
        assert_eq!(r.cmb_offset(0x1f000), Some(0));
        assert_eq!(r.cmb_offset(0x20fff), Some(0x1fff));
        assert_eq!(r.cmb_offset(0x21000), None);
        let data: Vec<u8> = (0..32).collect();
        let p = r.write(0x1eff0, &data).unwrap();
        assert_eq!(p, Placement { cmb: 16, host: 16 });
        let mut local = [0u8; 16];
        r.cmb().unwrap().read(0, &mut local).unwrap();
        assert_eq!(&local[..], &data[16..]);
        let mut back = [0u8; 32];
        assert_eq!(r.read(0x1eff0, &mut back).unwrap().cmb, 16);
        assert_eq!(back.to_vec(), data);
        // Past the CMB end there is no guest memory at 0x21000: fault.
        assert!(r.write(0x20ff0, &[0; 32]).is_err());
        r.set_window(None);
        assert_eq!(r.cmb_offset(0x1f000), None);
    }

    #[test]
    fn wrapping_ranges_fault() {
        let r = router();
        let mut b = [0u8; 8];
        assert!(r.read(u64::MAX - 3, &mut b).is_err());
    }
}
