//! Fakes for the models' tests: guest memory made of heap ranges at fixed
//! bus addresses. No socket, no QEMU.

use crate::{DmaFault, GuestMemory, HeapRegion, RegionMemory};

/// Guest memory made of heap regions at fixed guest-physical bases;
/// everything else faults as unmapped.
#[derive(Default)]
pub struct FakeGuestMemory {
    regions: Vec<(u64, HeapRegion)>,
    /// Bases of the regions that stand for a peer device's BAR.
    peer_bases: Vec<u64>,
    /// Refuse zero-copy access, so models take their copying path.
    copy_only: bool,
    /// Bytes handed out by `with_direct`.
    direct_bytes: std::sync::atomic::AtomicU64,
    /// The `(addr, len)` of every `prefault`, in order.
    prefaults: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl FakeGuestMemory {
    /// No memory at all: every access faults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `size` bytes of zeroed RAM at `base`.
    pub fn with_region(mut self, base: u64, size: usize) -> Self {
        self.regions.push((base, HeapRegion::new(size)));
        self
    }

    /// Adds `size` bytes of zeroed memory at `base` that [`locate`]
    /// reports as a peer device's BAR (data moves as for RAM).
    ///
    /// [`locate`]: GuestMemory::locate
    pub fn with_peer_region(mut self, base: u64, size: usize) -> Self {
        self.peer_bases.push(base);
        self.with_region(base, size)
    }

    /// Refuses [`with_direct`](GuestMemory::with_direct), as memory
    /// reached only by messages does: the model copies.
    pub fn copy_only(mut self) -> Self {
        self.copy_only = true;
        self
    }

    /// Bytes that went through [`with_direct`](GuestMemory::with_direct)
    /// so far: tells a test which path a model took.
    pub fn direct_bytes(&self) -> u64 {
        self.direct_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The `(addr, len)` of every [`prefault`](GuestMemory::prefault) so
    /// far, in order (each checked against the regions like a write).
    pub fn prefaults(&self) -> Vec<(u64, u64)> {
        self.prefaults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn find(&self, addr: u64, len: usize) -> Result<(&HeapRegion, u64), DmaFault> {
        self.find_with_base(addr, len)
            .map(|(_, region, offset)| (region, offset))
    }

    fn find_with_base(&self, addr: u64, len: usize) -> Result<(u64, &HeapRegion, u64), DmaFault> {
        for (base, region) in &self.regions {
            if let Some(offset) = addr.checked_sub(*base) {
                let end = offset.checked_add(len as u64);
                if end.is_some_and(|end| end <= region.size()) {
                    return Ok((*base, region, offset));
                }
            }
        }
        Err(DmaFault::unmapped(addr, len as u64, "not mapped"))
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

    /// Zero-copy as the transport offers it: everything but peer reads
    /// (and nothing with [`copy_only`](FakeGuestMemory::copy_only)). The
    /// slices are copies of the regions' bytes, written back after `f`
    /// succeeds for a write, so the caller's path runs without aliasing
    /// the regions' heap memory.
    fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: crate::Access,
        f: &mut dyn FnMut(&[crate::VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        if self.copy_only {
            return Ok(None);
        }
        let mut copies = Vec::with_capacity(segments.len());
        for &(addr, len) in segments {
            let (base, region, offset) = self.find_with_base(addr, len)?;
            let peer = self.peer_bases.contains(&base);
            if peer && !matches!(access, crate::Access::Write) {
                return Ok(None);
            }
            let mut bytes = vec![0u8; len];
            region.read(offset, &mut bytes)?;
            copies.push(bytes);
        }
        let handed_out: usize = copies.iter().map(Vec::len).sum();
        self.direct_bytes
            .fetch_add(handed_out as u64, std::sync::atomic::Ordering::Relaxed);
        let result = {
            let slices: Vec<crate::VolatileSlice<'_>> = copies
                .iter_mut()
                .map(|b| crate::VolatileSlice::from(b.as_mut_slice()))
                .collect();
            f(&slices)
        };
        if result.is_ok() && !matches!(access, crate::Access::Read) {
            for (&(addr, _), bytes) in segments.iter().zip(&copies) {
                self.write(addr, bytes)?;
            }
        }
        Ok(Some(result))
    }

    /// Records the range after checking it lies in one region.
    fn prefault(&self, addr: u64, len: u64) -> Result<(), DmaFault> {
        let size =
            usize::try_from(len).map_err(|_| DmaFault::unmapped(addr, len, "prefault too long"))?;
        self.find(addr, size)?;
        self.prefaults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((addr, len));
        Ok(())
    }

    /// Its regions stand for guest RAM, except those added with
    /// [`with_peer_region`](FakeGuestMemory::with_peer_region).
    fn locate(&self, addr: u64, len: u64) -> crate::BusTarget {
        match usize::try_from(len.max(1)).map(|len| self.find_with_base(addr, len)) {
            Ok(Ok((base, _, _))) if self.peer_bases.contains(&base) => crate::BusTarget::PeerBar,
            Ok(Ok(_)) => crate::BusTarget::Ram,
            _ => crate::BusTarget::Unmapped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DmaFaultKind;

    #[test]
    fn only_added_regions_answer() {
        let memory = FakeGuestMemory::new().with_region(0x1000, 0x1000);
        memory.write_u32(0x1ffc, 0xdead_beef).unwrap();
        assert_eq!(memory.read_u32(0x1ffc).unwrap(), 0xdead_beef);
        let fault = memory.read_u32(0x1ffe).unwrap_err();
        assert_eq!(fault.kind, DmaFaultKind::Unmapped);
        assert!(memory.write(0, &[1]).is_err());
    }
}
