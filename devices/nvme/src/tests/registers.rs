//! Registers: CAP/VS, enable and reset, shutdown, the CMB sequence.

use super::harness::*;
use crate::command::CommandBuilder;
use crate::config::ControllerConfig;
use crate::registers::reg;
use crate::spec::{admin, Status};

#[test]
fn capabilities_and_version() {
    let h = Host::new();
    let cap = h.read64(reg::CAP);
    assert_eq!(cap & 0xffff, 1023, "MQES");
    assert_eq!((cap >> 16) & 1, 1, "CQR");
    assert_eq!((cap >> 24) & 0xff, 0x0f, "TO");
    assert_eq!((cap >> 32) & 0xf, 0, "DSTRD");
    assert_eq!((cap >> 37) & 0xff, 1, "CSS: NVM only");
    assert_eq!((cap >> 48) & 0xf, 0, "MPSMIN");
    assert_eq!((cap >> 52) & 0xf, 4, "MPSMAX");
    assert_eq!((cap >> 57) & 1, 1, "CMBS");
    assert_eq!(h.read32(reg::VS), 0x0001_0400);
    // Two dword reads give the same as one qword read (Linux lo_hi_readq).
    assert_eq!(
        u64::from(h.read32(reg::CAP)) | (u64::from(h.read32(reg::CAP + 4)) << 32),
        cap
    );
    let mut byte = [0u8; 1];
    h.ctrl.regs_read(reg::VS + 2, &mut byte);
    assert_eq!(byte[0], 1, "byte reads of a register");
    let no_cmb = Host::with(
        ControllerConfig {
            cmb_size: 0,
            ..test_config()
        },
        vec![memory_namespace(1, 1 << 20, 512)],
    );
    assert_eq!((no_cmb.read64(reg::CAP) >> 57) & 1, 0);
    no_cmb.write32(reg::CMBMSC, 3);
    assert_eq!(no_cmb.read32(reg::CMBSZ), 0);
    assert_eq!(no_cmb.read32(reg::CMBMSC), 0);
}

#[test]
fn interrupt_mask_set_and_clear() {
    let h = Host::new();
    h.write32(reg::INTMS, 0b1010);
    h.write32(reg::INTMS, 0b0001);
    assert_eq!(h.read32(reg::INTMS), 0b1011);
    h.write32(reg::INTMC, 0b0010);
    assert_eq!(h.read32(reg::INTMC), 0b1001);
}

#[test]
fn enable_disable_and_reenable() {
    let mut h = Host::new();
    assert_eq!(h.read32(reg::CSTS), 0);
    h.enable();
    let id = CommandBuilder::new(admin::IDENTIFY, 0)
        .prp1(DATA)
        .cdw(10, 1)
        .build();
    assert_eq!(h.admin_status(id), Status::SUCCESS);
    h.create_pair(1);
    // CC.EN 1 -> 0: every queue goes away and RDY drops once the workers
    // have stopped.
    h.write32(reg::CC, 0);
    h.wait_csts(1, 0);
    assert_eq!(h.ctrl.stats().queues.len(), 0);
    assert_eq!(h.ctrl.stats().counters.resets, 1);
    assert_eq!(
        h.ctrl.stats().counters.unsafe_shutdowns,
        1,
        "disabled without a shutdown notification"
    );
    // Enable again: the old I/O queue id is free again.
    h.enable();
    h.create_pair(1);
    assert_eq!(h.admin_status(id), Status::SUCCESS);
    assert_eq!(h.ctrl.stats().counters.enables, 2);
}

#[test]
fn bad_admin_queue_settings_give_a_fatal_status() {
    let h = Host::new();
    h.write32(reg::AQA, 0); // one-entry queues
    h.write64_lo_hi(reg::ASQ, RAM);
    h.write64_lo_hi(reg::ACQ, RAM + 0x1000);
    h.write32(reg::CC, (6 << 16) | (4 << 20) | 1);
    assert_eq!(h.read32(reg::CSTS) & 0x3, 0x2, "CFS, not ready");
    h.write32(reg::CC, 0);
    assert_eq!(h.read32(reg::CSTS), 0, "reset clears CFS");
    h.write32(reg::AQA, 0x001f_001f);
    h.write64_lo_hi(reg::ASQ, RAM + 0x10);
    h.write32(reg::CC, (6 << 16) | (4 << 20) | 1);
    assert_eq!(h.read32(reg::CSTS) & 0x3, 0x2, "misaligned ASQ");
    h.write32(reg::CC, 0);
    h.write64_lo_hi(reg::ASQ, RAM);
    h.write32(reg::CC, (6 << 16) | (4 << 20) | (1 << 4) | 1);
    assert_eq!(h.read32(reg::CSTS) & 0x3, 0x2, "unsupported command set");
    h.write32(reg::CC, 0);
    h.write32(reg::CC, (6 << 16) | (4 << 20) | (5 << 7) | 1);
    assert_eq!(h.read32(reg::CSTS) & 0x3, 0x2, "page size above MPSMAX");
    h.write32(reg::CC, 0);
    h.write64_lo_hi(reg::ACQ, 0xffff_ffff_ffff_f000);
    h.write32(reg::CC, (6 << 16) | (4 << 20) | 1);
    assert_eq!(
        h.read32(reg::CSTS) & 0x3,
        0x2,
        "ACQ wraps the address space"
    );
}

#[test]
fn shutdown_notification_reports_completion() {
    let mut h = Host::new();
    h.enable();
    let cc = h.read32(reg::CC);
    h.write32(reg::CC, cc | (1 << 14));
    h.wait_csts(0xc, 0x8);
    assert_eq!(h.ctrl.stats().counters.shutdowns, 1);
    h.write32(reg::CC, 0);
    h.wait_csts(0xd, 0);
    assert_eq!(
        h.ctrl.stats().counters.unsafe_shutdowns,
        0,
        "the reset came after a clean shutdown"
    );
}

#[test]
fn cmb_registers_follow_the_nvme_1_4_sequence() {
    let mut h = Host::new();
    assert_eq!(h.read32(reg::CMBSZ), 0, "CMBSZ reads 0 until CRE");
    assert_eq!(h.read32(reg::CMBLOC), 0, "CMBLOC reads 0 until CRE");
    let (loc, sz) = h.map_cmb();
    assert_eq!(loc & 0x7, 2, "BIR: BAR2");
    assert_eq!(loc >> 12, 0, "offset 0");
    assert_ne!(loc & (1 << 5), 0, "CDPMLS: mixed locations");
    assert_ne!(loc & (1 << 6), 0, "CDPCILS");
    for (bit, name) in [(0, "SQS"), (1, "CQS"), (2, "LISTS"), (3, "RDS"), (4, "WDS")] {
        assert_ne!(sz & (1 << bit), 0, "{name}");
    }
    assert_eq!((sz >> 8) & 0xf, 2, "SZU: 1 MiB");
    assert_eq!(u64::from(sz >> 12) << 20, CMB_SIZE, "SZ");
    let s = h.ctrl.stats();
    assert!(s.cmb.cmse);
    assert_eq!(s.cmb.cba, Some(CMB_BAR));
    assert_eq!(h.read64(reg::CMBMSC), CMB_BAR | 3);
    // CMBMSC survives a controller reset (CC.EN 1 -> 0).
    h.enable();
    h.write32(reg::CC, 0);
    h.wait_csts(1, 0);
    assert_eq!(h.read64(reg::CMBMSC), CMB_BAR | 3);
    assert!(h.ctrl.stats().cmb.cmse);
    assert_eq!(h.read32(reg::CMBSZ), sz);
    // Linux's failure path: hi_lo_writeq(0).
    h.write32(reg::CMBMSC + 4, 0);
    h.write32(reg::CMBMSC, 0);
    assert_eq!(h.read32(reg::CMBSZ), 0);
    assert!(!h.ctrl.stats().cmb.cmse);
    // A function reset clears CMBMSC.
    h.map_cmb();
    h.ctrl.reset();
    assert_eq!(h.read64(reg::CMBMSC), 0);
    assert!(!h.ctrl.stats().cmb.cmse);
}

#[test]
fn cmbmsc_latches_cba_on_the_low_dword_and_flags_invalid_bases() {
    let h = Host::new();
    // A 64-bit write is applied high dword first.
    h.write64(reg::CMBMSC, 0x1_0000_0000 | 3);
    assert_eq!(h.ctrl.stats().cmb.cba, Some(0x1_0000_0000));
    // The high dword alone does not move the latched base.
    h.write32(reg::CMBMSC + 4, 0x2);
    assert_eq!(h.ctrl.stats().cmb.cba, Some(0x1_0000_0000));
    h.write32(reg::CMBMSC, 3);
    assert_eq!(h.ctrl.stats().cmb.cba, Some(0x2_0000_0000));
    // A base whose CMB would wrap the address space is refused (CBAI).
    h.write64(reg::CMBMSC, 0xffff_ffff_fff0_0000 | 3);
    assert_eq!(h.read32(reg::CMBSTS) & 1, 1, "CBAI");
    assert_eq!(h.ctrl.stats().cmb.cba, None);
    h.write64(reg::CMBMSC, CMB_BAR | 3);
    assert_eq!(h.read32(reg::CMBSTS) & 1, 0);
    // CRE without CMSE: registers visible, nothing decoded.
    h.write64(reg::CMBMSC, CMB_BAR | 1);
    assert_ne!(h.read32(reg::CMBSZ), 0);
    assert_eq!(h.ctrl.stats().cmb.cba, None);
}

#[test]
fn odd_register_writes_are_ignored() {
    let h = Host::new();
    h.ctrl.regs_write(reg::AQA, &[0xff, 0xff]);
    assert_eq!(h.read32(reg::AQA), 0, "2-byte write ignored");
    h.ctrl.regs_write(reg::AQA + 1, &[0xff; 4]);
    assert_eq!(h.read32(reg::AQA), 0, "misaligned write ignored");
    h.write32(reg::CAP, 0xffff_ffff);
    assert_eq!(h.read64(reg::CAP) & 0xffff, 1023, "CAP is read-only");
    h.write32(reg::CSTS, 0xffff_ffff);
    assert_eq!(h.read32(reg::CSTS), 0);
    h.write32(reg::AQA, 0xffff_ffff);
    assert_eq!(h.read32(reg::AQA), 0x0fff_0fff, "reserved bits masked");
    let mut wide = [0u8; 8];
    h.ctrl.regs_read(0x3ff8, &mut wide);
    assert_eq!(wide, [0; 8], "reads beyond the registers are 0");
}
