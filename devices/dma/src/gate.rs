//! The PCI Command register's Bus Master Enable, as a `GuestMemory`
//! wrapper: while it is clear, the device may not start a bus access.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::{DmaFault, DmaFaultKind, GuestMemory};

/// Guest memory behind the device's Bus Master Enable bit. It starts
/// closed, as COMMAND is 0 at power-on and after a reset; the PCI layer
/// opens it when the guest sets BME. A closed gate fails every access with
/// [`DmaFaultKind::BusMasterDisabled`] without touching the memory behind
/// it (a real function's request would end as an Unsupported Request).
///
/// An access already past the check when BME is cleared completes; the
/// PCI spec leaves in-flight requests to the device, and a reset (which
/// waits for the device's DMA) is what fences them.
pub struct BusMasterGate {
    inner: Arc<dyn GuestMemory>,
    enabled: AtomicBool,
}

impl BusMasterGate {
    /// `inner` behind a closed gate.
    pub fn new(inner: Arc<dyn GuestMemory>) -> Self {
        Self {
            inner,
            enabled: AtomicBool::new(false),
        }
    }

    /// Follows COMMAND.BME.
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Release);
    }

    /// Whether the device may master the bus now.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    fn check(&self, addr: u64, len: usize) -> Result<(), DmaFault> {
        if self.is_enabled() {
            Ok(())
        } else {
            Err(DmaFault::new(
                DmaFaultKind::BusMasterDisabled,
                addr,
                len as u64,
                "PCI Command.BME is clear",
            ))
        }
    }
}

impl GuestMemory for BusMasterGate {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.check(addr, buf.len())?;
        self.inner.read(addr, buf)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.check(addr, data.len())?;
        self.inner.write(addr, data)
    }

    fn locate(&self, addr: u64, len: u64) -> crate::BusTarget {
        self.inner.locate(addr, len)
    }

    fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: crate::Access,
        f: &mut dyn FnMut(&[crate::VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<std::io::Result<()>>, DmaFault> {
        let (addr, len) = segments.first().copied().unwrap_or_default();
        self.check(addr, len)?;
        self.inner.with_direct(segments, access, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeGuestMemory;

    #[test]
    fn a_closed_gate_refuses_and_leaves_memory_alone() {
        let ram = Arc::new(FakeGuestMemory::new().with_region(0x1000, 0x1000));
        let gate = BusMasterGate::new(ram.clone());
        assert!(!gate.is_enabled(), "closed at power-on");
        let fault = gate.write_u32(0x1000, 0xdead_beef).unwrap_err();
        assert_eq!(fault.kind, DmaFaultKind::BusMasterDisabled);
        assert_eq!(ram.read_u32(0x1000).unwrap(), 0, "nothing was written");
        assert_eq!(
            gate.read_u32(0x1000).unwrap_err().kind,
            DmaFaultKind::BusMasterDisabled
        );
        gate.set_enabled(true);
        gate.write_u32(0x1000, 7).unwrap();
        assert_eq!(gate.read_u32(0x1000).unwrap(), 7);
        gate.set_enabled(false);
        assert!(gate.read_u32(0x1000).is_err());
    }
}
