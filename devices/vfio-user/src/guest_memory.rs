//! The transport as a device model's memory: its DMA address space is
//! p2plab-dma's guest memory, its shared memory (a memfd QEMU maps) is
//! region memory. The traits live below the transport, in p2plab-dma, so
//! models depend on them without depending on vfio-user.

use std::sync::Arc;

use p2plab_dma::{BusTarget, DmaFault, DmaFaultKind, GuestMemory, RegionMemory};

use crate::{DmaError, DmaSpace, DmaTarget, SharedMemory};

/// The fault kind a transport error amounts to, as the device sees it.
/// Every variant is listed, so a new one must be placed here.
pub fn fault_kind(error: &DmaError) -> DmaFaultKind {
    match error {
        // No memory answers there (any more): never mapped, the client
        // unmapped it or shrank its file under it, or the device is being
        // reset (DMA fenced) while the access ran.
        DmaError::Unmapped { .. }
        | DmaError::Overflow { .. }
        | DmaError::OutOfBounds { .. }
        | DmaError::NotDirect { .. }
        | DmaError::UnknownWindow
        | DmaError::Truncated { .. }
        | DmaError::Revoked { .. }
        | DmaError::BadBacking(_)
        | DmaError::Invalid(_) => DmaFaultKind::Unmapped,
        DmaError::Permission { .. } => DmaFaultKind::Permission,
        DmaError::Timeout { .. } | DmaError::StillInUse { .. } => DmaFaultKind::Timeout,
        DmaError::Io(_) | DmaError::Mmap(..) => DmaFaultKind::Io,
        // The party behind the address (the client, serving a peer BAR by
        // message) failed or is gone.
        DmaError::WouldDeadlock
        | DmaError::NotConnected
        | DmaError::Disconnected
        | DmaError::Busy
        | DmaError::Remote { .. }
        | DmaError::Protocol(_)
        | DmaError::Overlap { .. }
        | DmaError::PartialUnmap { .. } => DmaFaultKind::PeerUnreachable,
    }
}

fn fault(addr: u64, len: usize, error: DmaError) -> DmaFault {
    DmaFault::new(fault_kind(&error), addr, len as u64, error.to_string())
}

impl GuestMemory for DmaSpace {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        // Large reads from fd-less ranges are split by the transport.
        DmaSpace::read(self, addr, buf).map_err(|e| fault(addr, buf.len(), e))
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        DmaSpace::write(self, addr, data).map_err(|e| fault(addr, data.len(), e))
    }

    fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: p2plab_dma::Access,
        f: &mut dyn FnMut(&[p2plab_dma::VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        DmaSpace::with_slices(self, segments, access, |slices| f(slices)).map_err(|e| {
            let (addr, len) = segments.first().copied().unwrap_or_default();
            fault(addr, len, e)
        })
    }

    fn prefault(&self, addr: u64, len: u64) -> Result<(), DmaFault> {
        DmaSpace::prefault(self, addr, len)
            .map_err(|e| fault(addr, usize::try_from(len).unwrap_or(usize::MAX), e))
    }

    fn locate(&self, addr: u64, len: u64) -> BusTarget {
        match self.classify(addr, len) {
            DmaTarget::GuestMemory => BusTarget::Ram,
            DmaTarget::MessageOnly => BusTarget::PeerBar,
            DmaTarget::Local(_) => BusTarget::Own,
            DmaTarget::Peer(_) => BusTarget::PeerDirect,
            DmaTarget::Unmapped => BusTarget::Unmapped,
            DmaTarget::Mixed => BusTarget::Mixed,
        }
    }
}

/// The first `size` bytes of a shared memory object (a BAR is rounded up
/// to a power of two; the device's memory may be smaller).
pub struct SharedRegion {
    memory: Arc<SharedMemory>,
    size: u64,
}

impl SharedRegion {
    /// The first `size` bytes of `memory` (at most its whole size).
    pub fn new(memory: Arc<SharedMemory>, size: u64) -> Self {
        let size = size.min(memory.size());
        Self { memory, size }
    }

    /// The whole shared memory object behind the region.
    pub fn shared_memory(&self) -> &Arc<SharedMemory> {
        &self.memory
    }
}

impl RegionMemory for SharedRegion {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        p2plab_dma::checked_range(offset, buf.len(), self.size)?;
        self.memory
            .read_at(offset, buf)
            .map_err(|e| fault(offset, buf.len(), e))
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        p2plab_dma::checked_range(offset, data.len(), self.size)?;
        self.memory
            .write_at(offset, data)
            .map_err(|e| fault(offset, data.len(), e))
    }

    fn direct_slice(&self, offset: u64, len: usize) -> Option<p2plab_dma::VolatileSlice<'_>> {
        let range = p2plab_dma::checked_range(offset, len, self.size).ok()?;
        self.memory
            .as_volatile_slice()
            .subslice(range.start, len)
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Catches a transport error the model would report as the wrong
    /// kind: memory the client shrank or unmapped mid-access is a bus
    /// error (unmapped), not a peer failure.
    #[test]
    fn transport_errors_map_to_the_fault_a_device_reports() {
        let cases = [
            (
                DmaError::Truncated { gpa: 0, len: 8 },
                DmaFaultKind::Unmapped,
            ),
            (DmaError::Revoked { gpa: 0, len: 8 }, DmaFaultKind::Unmapped),
            (DmaError::BadBacking("x".into()), DmaFaultKind::Unmapped),
            (
                DmaError::Timeout {
                    after: Duration::from_secs(1),
                },
                DmaFaultKind::Timeout,
            ),
            (DmaError::Disconnected, DmaFaultKind::PeerUnreachable),
            (DmaError::Io("eio".into()), DmaFaultKind::Io),
        ];
        for (error, kind) in cases {
            assert_eq!(fault_kind(&error), kind, "{error}");
        }
        // Through the GuestMemory impl: a DmaSpace with nothing mapped.
        let space = DmaSpace::new();
        let fault = GuestMemory::read(&space, 0x1000, &mut [0u8; 4]).unwrap_err();
        assert_eq!(fault.kind, DmaFaultKind::Unmapped);
        assert_eq!((fault.addr, fault.len), (0x1000, 4));
    }
}
