//! Memory behind one of a device's own BARs, addressed by offset.

use std::sync::{Mutex, PoisonError};

use crate::DmaFault;

/// Memory behind one of the device's own BARs (a CMB, a PMR, VRAM),
/// addressed by offset. The guest may map the same memory directly, so
/// accesses race with guest CPU accesses exactly as on hardware.
pub trait RegionMemory: Send + Sync {
    /// Size in bytes; offsets at or past it fault.
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaFault>;
    /// Writes `data` at `offset`.
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault>;
    /// Makes what was written durable (a persistent memory region backed by
    /// a file); volatile memory has nothing to do.
    fn flush(&self) -> Result<(), DmaFault> {
        Ok(())
    }
    /// Zero-copy: the memory of `[offset, offset+len)` when it is plain
    /// process memory (shared memory a client maps too); `None` makes the
    /// caller copy with read/write.
    fn direct_slice(&self, offset: u64, len: usize) -> Option<crate::VolatileSlice<'_>> {
        let _ = (offset, len);
        None
    }
}

/// `[offset, offset + len)` as indices into a region of `size` bytes, or
/// the fault an access past its end gets.
pub fn checked_range(
    offset: u64,
    len: usize,
    size: u64,
) -> Result<std::ops::Range<usize>, DmaFault> {
    offset
        .checked_add(len as u64)
        .filter(|&end| end <= size)
        .and_then(|end| Some(usize::try_from(offset).ok()?..usize::try_from(end).ok()?))
        .ok_or_else(|| DmaFault::unmapped(offset, len as u64, "outside the region"))
}

/// A region of plain process memory: a CMB when no shared memory is needed
/// (unit tests), and the building block of the fakes.
pub struct HeapRegion {
    bytes: Mutex<Vec<u8>>,
    size: u64,
}

impl HeapRegion {
    /// `size` zeroed bytes.
    pub fn new(size: usize) -> Self {
        Self {
            bytes: Mutex::new(vec![0; size]),
            size: size as u64,
        }
    }
}

impl RegionMemory for HeapRegion {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let range = checked_range(offset, buf.len(), self.size)?;
        let bytes = self.bytes.lock().unwrap_or_else(PoisonError::into_inner);
        buf.copy_from_slice(&bytes[range]);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        let range = checked_range(offset, data.len(), self.size)?;
        let mut bytes = self.bytes.lock().unwrap_or_else(PoisonError::into_inner);
        bytes[range].copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_region_round_trips_and_refuses_past_its_end() {
        let region = HeapRegion::new(16);
        region.write(8, &[1, 2, 3, 4]).unwrap();
        let mut back = [0u8; 4];
        region.read(8, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3, 4]);
        let fault = region.write(14, &[0; 4]).unwrap_err();
        assert_eq!(fault.kind, crate::DmaFaultKind::Unmapped);
        assert!(region.read(u64::MAX, &mut back).is_err(), "wrapping range");
    }
}
