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
