//! The Persistent Memory Region: registers, decoding, persistence barrier.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::harness::*;
use crate::command::CommandBuilder;
use crate::config::ControllerConfig;
use crate::registers::reg;
use crate::spec::{io, Status};
use p2plab_dma::{DmaFault, HeapRegion, RegionMemory};

const PMR_SIZE: u64 = 64 << 10;
const PMR_GPA: u64 = 0x9000_0000;

/// Heap memory that counts flushes.
struct CountingRegion {
    inner: HeapRegion,
    flushes: AtomicU64,
}

impl RegionMemory for CountingRegion {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.inner.write(offset, data)
    }
    fn flush(&self) -> Result<(), DmaFault> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn pmr_host() -> (Host, Arc<CountingRegion>) {
    let region = Arc::new(CountingRegion {
        inner: HeapRegion::new(PMR_SIZE as usize),
        flushes: AtomicU64::new(0),
    });
    let h = Host::with_pmr(
        ControllerConfig {
            pmr_size: PMR_SIZE,
            ..test_config()
        },
        vec![memory_namespace(1, 1 << 20, 512)],
        Some(region.clone()),
    );
    (h, region)
}

#[test]
fn pmr_registers_enable_and_decode() {
    let (mut h, region) = pmr_host();
    assert_eq!((h.read64(reg::CAP) >> 56) & 1, 1, "CAP.PMRS");
    let cap = h.read32(reg::PMRCAP);
    assert_eq!(cap & 0x18, 0x18, "RDS and WDS");
    assert_eq!((cap >> 5) & 0x7, 4, "BIR: BAR4");
    assert_eq!((cap >> 10) & 0xf, 0x2, "PMRWBM: PMRSTS read barrier");
    assert_ne!(cap & (1 << 24), 0, "CMSS");
    assert_eq!(
        h.read32(reg::PMRSTS) & (1 << 8),
        1 << 8,
        "not ready while disabled"
    );
    h.write32(reg::PMRCTL, 1);
    assert_eq!(h.read32(reg::PMRSTS) & (1 << 8), 0);
    h.write32(reg::PMRMSCU, (PMR_GPA >> 32) as u32);
    h.write32(reg::PMRMSCL, PMR_GPA as u32 | 0x2);
    assert_eq!(h.ctrl.stats().pmr.cba, Some(PMR_GPA));

    // A read lands in the PMR, like a read into a CMB buffer.
    h.enable();
    h.create_pair(1);
    h.poke(DATA, &[0x77; 512]);
    let w = CommandBuilder::new(io::WRITE, 0).nsid(1).prp1(DATA).build();
    assert_eq!(h.io(1, w).status, Status::SUCCESS);
    let r = CommandBuilder::new(io::READ, 0)
        .nsid(1)
        .prp1(PMR_GPA + 0x1000)
        .build();
    assert_eq!(h.io(1, r).status, Status::SUCCESS);
    let mut got = [0u8; 512];
    region.read(0x1000, &mut got).unwrap();
    assert_eq!(got, [0x77; 512]);
    assert_eq!(h.ctrl.stats().pmr.dma_write_bytes, 512);

    // Reading PMRSTS is the persistence barrier.
    let before = region.flushes.load(Ordering::Relaxed);
    h.read32(reg::PMRSTS);
    assert_eq!(region.flushes.load(Ordering::Relaxed), before + 1);

    // Disabled, the PMR decodes nothing: the address is plain (unmapped)
    // guest memory again.
    h.write32(reg::PMRCTL, 0);
    assert_eq!(h.ctrl.stats().pmr.cba, None);
    assert_eq!(h.io(1, r).status, Status::DATA_TRANSFER_ERROR);
    // The PMR survives a controller reset but not a function reset.
    h.write32(reg::PMRCTL, 1);
    h.write32(reg::CC, 0);
    h.wait_csts(1, 0);
    assert_eq!(h.read32(reg::PMRCTL), 1);
    h.ctrl.reset();
    assert_eq!(h.read32(reg::PMRCTL), 0);
}

#[test]
fn pmr_base_that_wraps_is_refused() {
    let (h, _) = pmr_host();
    h.write32(reg::PMRCTL, 1);
    h.write32(reg::PMRMSCU, 0xffff_ffff);
    h.write32(reg::PMRMSCL, 0xffff_f000 | 0x2);
    assert_ne!(h.read32(reg::PMRSTS) & (1 << 12), 0, "CBAI");
    assert_eq!(h.ctrl.stats().pmr.cba, None);
}

#[test]
fn without_a_pmr_its_registers_read_zero() {
    let h = Host::new();
    assert_eq!((h.read64(reg::CAP) >> 56) & 1, 0);
    h.write32(reg::PMRCTL, 1);
    assert_eq!(h.read32(reg::PMRCTL), 0);
    assert_eq!(h.read32(reg::PMRCAP), 0);
}
