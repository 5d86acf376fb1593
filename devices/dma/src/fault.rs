//! The one error every DMA in the lab ends in.

use std::fmt;

/// Why a DMA could not be done. Models map every kind to a status the
/// guest sees; tests and traces match on the kind, never on text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DmaFaultKind {
    /// No memory answers at that bus address (not mapped by the client,
    /// outside a region, or the range wraps around the address space).
    Unmapped,
    /// Mapped, but not for this direction (a read-only DMA_MAP written).
    Permission,
    /// The address belongs to memory only another party can reach (a peer
    /// BAR through the client), and that party failed or went away.
    PeerUnreachable,
    /// The party that serves the address did not answer in time.
    Timeout,
    /// The device may not master the bus (PCI Command.BME is clear).
    BusMasterDisabled,
    /// The device was reset after the work this access belongs to was
    /// fetched: refused, so nothing of that work outlives the reset.
    Reset,
    /// A fault injected on purpose (fault injection, not a real failure).
    Injected,
    /// The memory's backing store failed (an I/O error on a file region).
    Io,
}

impl DmaFaultKind {
    /// A short stable name for logs, traces and stats.
    pub fn name(self) -> &'static str {
        match self {
            DmaFaultKind::Unmapped => "unmapped",
            DmaFaultKind::Permission => "permission",
            DmaFaultKind::PeerUnreachable => "peer-unreachable",
            DmaFaultKind::Timeout => "timeout",
            DmaFaultKind::BusMasterDisabled => "bus-master-disabled",
            DmaFaultKind::Reset => "reset",
            DmaFaultKind::Injected => "injected",
            DmaFaultKind::Io => "io",
        }
    }
}

impl fmt::Display for DmaFaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A DMA that could not be done: where, how long, what kind of failure,
/// and a human detail (the transport's own words) for the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DMA fault at {addr:#x}+{len:#x} ({kind}): {detail}")]
pub struct DmaFault {
    /// Bus address (or region offset) of the access.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// What kind of failure it was.
    pub kind: DmaFaultKind,
    /// Free text for humans; never matched on.
    pub detail: String,
}

impl DmaFault {
    /// A fault of `kind` for `[addr, addr + len)`.
    pub fn new(kind: DmaFaultKind, addr: u64, len: u64, detail: impl Into<String>) -> Self {
        Self {
            addr,
            len,
            kind,
            detail: detail.into(),
        }
    }

    /// Nothing is mapped there.
    pub fn unmapped(addr: u64, len: u64, detail: impl Into<String>) -> Self {
        Self::new(DmaFaultKind::Unmapped, addr, len, detail)
    }

    /// The backing store failed.
    pub fn io(addr: u64, len: u64, detail: impl Into<String>) -> Self {
        Self::new(DmaFaultKind::Io, addr, len, detail)
    }
}
