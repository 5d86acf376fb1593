//! How a device model reaches memory as a bus master.
//!
//! Every device model (NVMe, GPU, and the ones to come) sees the bus through
//! one trait, [`GuestMemory`], and its own BAR memories through
//! [`RegionMemory`]. Both fail with one typed error, [`DmaFault`], that a
//! model turns into its own status (an NVMe Data Transfer Error, a GPU job
//! error), never a panic.
//!
//! This is the seam where cross-cutting behaviour plugs in by wrapping a
//! `GuestMemory`: the bus-master-enable gate with its reset quiesce
//! (p2plab-kit's `DmaGate`), fault injection, tracing and the zero-copy
//! peer path. Test fakes ([`testing`], behind the `testing`
//! feature) implement it once for every model.
//!
//! This crate is the bottom of the crate graph, as rust-vmm's vm-memory is
//! below its devices and VMMs: it depends on no transport. The vfio-user
//! transport's DMA address space (`p2plab_vfio_user::DmaSpace`) implements
//! [`GuestMemory`], and its shared memory [`RegionMemory`], in the
//! transport's crate, so server binaries hand them to a model as they are.

#![deny(missing_docs)]

mod access;
mod fault;
mod region;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use access::Access;
pub use fault::{DmaFault, DmaFaultKind};
pub use region::{checked_range, HeapRegion, RegionMemory};

use std::sync::Arc;

/// Volatile memory views a zero-copy access hands out.
pub use vm_memory::VolatileSlice;

/// Guest-physical memory as a bus master sees it: guest RAM and peer BARs
/// at their bus addresses. Implementations are cheap to call from any
/// thread; an access is all-or-nothing from the caller's point of view
/// (on error the buffer's contents are unspecified).
pub trait GuestMemory: Send + Sync {
    /// Reads `buf.len()` bytes at bus address `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault>;
    /// Writes `data` at bus address `addr`.
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault>;

    /// Reads a little-endian u32 at `addr`.
    fn read_u32(&self, addr: u64) -> Result<u32, DmaFault> {
        let mut bytes = [0u8; 4];
        self.read(addr, &mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    /// Writes a little-endian u32 at `addr`.
    fn write_u32(&self, addr: u64, value: u32) -> Result<(), DmaFault> {
        self.write(addr, &value.to_le_bytes())
    }

    /// Where `[addr, addr+len)` lives, for traces. Moves no data; an
    /// implementation that cannot tell says [`BusTarget::Unknown`].
    fn locate(&self, addr: u64, len: u64) -> BusTarget {
        let _ = (addr, len);
        BusTarget::Unknown
    }

    /// Zero-copy access to a scatter-gather list: calls `f` once with the
    /// memory behind every `(addr, len)` of `segments`, in order, when all
    /// of it can be touched directly for `access` (guest RAM shared with an
    /// fd, a peer's BAR memory it may write), so that a device can `preadv`
    /// straight into it. Returns `f`'s answer, or `Ok(None)` without
    /// calling `f` when the memory must be reached with
    /// [`read`](Self::read)/[`write`](Self::write) (the default).
    ///
    /// The memory stays in use while `f` runs (an unmap waits for it), so
    /// `f` must be short and wait for nothing the transport does.
    fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: Access,
        f: &mut dyn FnMut(&[VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        let _ = (segments, access, f);
        Ok(None)
    }

    /// Gets `[addr, addr+len)` ready to be written, as a device that pins
    /// memory when it is registered: pages are faulted in ahead of use
    /// where the memory allows it (guest RAM shared with an fd, a peer's
    /// BAR memory, whose holes get pages), so the writes into them later
    /// take no page fault. Moves no data and counts nothing; memory that
    /// cannot be prepared so is left as it is (the default does nothing).
    fn prefault(&self, addr: u64, len: u64) -> Result<(), DmaFault> {
        let _ = (addr, len);
        Ok(())
    }
}

/// What answers at a bus address, as far as the memory a model holds can
/// tell (the trace's "where each data pointer lives").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusTarget {
    /// Guest RAM (memory the client shared with an fd).
    Ram,
    /// Memory reached only by messages through the client: a peer
    /// device's BAR.
    PeerBar,
    /// One of this device's own BARs (its CMB, PMR or VRAM).
    Own,
    /// Nothing is mapped there.
    Unmapped,
    /// Another p2plab server's BAR memory, reached directly through the
    /// memfd it shared (the zero-copy peer path).
    PeerDirect,
    /// The range spans several kinds.
    Mixed,
    /// The memory cannot tell.
    Unknown,
}

impl BusTarget {
    /// Its name in traces.
    pub fn name(self) -> &'static str {
        match self {
            BusTarget::Ram => "ram",
            BusTarget::PeerBar => "peer-bar",
            BusTarget::PeerDirect => "peer-direct",
            BusTarget::Own => "own-bar",
            BusTarget::Unmapped => "unmapped",
            BusTarget::Mixed => "mixed",
            BusTarget::Unknown => "unknown",
        }
    }
}

impl<T: GuestMemory + ?Sized> GuestMemory for Arc<T> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        (**self).read(addr, buf)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        (**self).write(addr, data)
    }

    fn locate(&self, addr: u64, len: u64) -> BusTarget {
        (**self).locate(addr, len)
    }

    fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: Access,
        f: &mut dyn FnMut(&[VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        (**self).with_direct(segments, access, f)
    }

    fn prefault(&self, addr: u64, len: u64) -> Result<(), DmaFault> {
        (**self).prefault(addr, len)
    }
}

impl<T: GuestMemory + ?Sized> GuestMemory for &T {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        (**self).read(addr, buf)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        (**self).write(addr, data)
    }

    fn locate(&self, addr: u64, len: u64) -> BusTarget {
        (**self).locate(addr, len)
    }

    fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: Access,
        f: &mut dyn FnMut(&[VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        (**self).with_direct(segments, access, f)
    }

    fn prefault(&self, addr: u64, len: u64) -> Result<(), DmaFault> {
        (**self).prefault(addr, len)
    }
}
