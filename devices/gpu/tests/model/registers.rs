//! BAR0 registers: identity, read/write rules, frozen ring geometry.
//!
//! Catches: a register at the wrong offset or value, a read-only register
//! that takes writes, odd-sized accesses that corrupt state or go
//! uncounted, ring geometry changing under a live ring.

use crate::rig::*;

#[test]
fn identity_registers() {
    let rig = Rig::new(1 << 30);
    assert_eq!(rig.read32(Reg::Id), ID_MAGIC);
    assert_eq!(rig.read32(Reg::Version), VERSION);
    assert_eq!(rig.read64(Reg::VramSize), 1 << 30);
    assert_eq!(rig.read_dword(Reg::VramSize, Half::Low), 1 << 30);
    assert_eq!(rig.read_dword(Reg::VramSize, Half::High), 0);
    assert_eq!(rig.status(), Status::READY | Status::BUS_MASTER);
    assert_eq!(
        rig.read32(Reg::IntMask),
        IntCauses::ALL.raw(),
        "all causes masked at power-on"
    );

    let big = Rig::new(64 << 30);
    assert_eq!(big.read_dword(Reg::VramSize, Half::High), 16);
    assert_eq!(big.read_dword(Reg::VramSize, Half::Low), 0);
}

#[test]
fn odd_reads_are_assembled_and_out_of_bar_reads_are_ones() {
    let rig = Rig::new(256 << 20);
    let mut one = [0u8; 1];
    rig.gpu.regs_read(Reg::Id.offset() + 1, &mut one);
    assert_eq!(one[0], (ID_MAGIC >> 8) as u8);
    let mut two = [0u8; 2];
    rig.gpu.regs_read(Reg::Id.offset() + 3, &mut two);
    assert_eq!(two, [(ID_MAGIC >> 24) as u8, VERSION as u8]);
    let mut tail = [0u8; 4];
    rig.gpu.regs_read(REGS_BAR_SIZE - 2, &mut tail);
    assert_eq!(tail, [0, 0, 0xff, 0xff]);
    rig.gpu.regs_read(u64::MAX - 1, &mut tail);
    assert_eq!(tail, [0xff; 4]);
}

#[test]
fn scratch_round_trip_and_read_only_registers() {
    let rig = Rig::new(256 << 20);
    rig.write32(Reg::Scratch, 0xcafe_f00d);
    assert_eq!(rig.read32(Reg::Scratch), 0xcafe_f00d);
    rig.write32(Reg::Id, 0);
    rig.write32(Reg::VramSize, 0);
    rig.write32(Reg::Fence, 77);
    rig.write32(Reg::RingHead, 3);
    assert_eq!(rig.read32(Reg::Id), ID_MAGIC);
    assert_eq!(rig.read64(Reg::VramSize), 256 << 20);
    assert_eq!(rig.read64(Reg::Fence), 0);
    assert_eq!(rig.read32(Reg::RingHead), 0);
    assert_eq!(rig.read32(Reg::Doorbell), 0);
}

#[test]
fn unsupported_writes_are_ignored_and_counted() {
    let rig = Rig::new(256 << 20);
    rig.gpu.regs_write(Reg::Scratch.offset(), &[1, 2]);
    rig.gpu.regs_write(Reg::Scratch.offset() + 1, &[1, 2, 3, 4]);
    rig.gpu.regs_write(Reg::Scratch.offset() - 4 + 4, &[]);
    rig.gpu
        .regs_write(Reg::RingBase.dword_offset(Half::High), &[0; 8]);
    rig.gpu.regs_write(u64::MAX - 3, &[1, 2, 3, 4]);
    assert_eq!(rig.read32(Reg::Scratch), 0);
    // The last write hit no register but was well-formed: only 4 are bad.
    assert_eq!(rig.gpu.stats().bad_register_accesses, 4);
}

#[test]
fn ring_geometry_is_frozen_while_enabled() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
    rig.write64(Reg::RingBase, RING_GPA + 4096);
    rig.write32(Reg::RingSize, 64);
    rig.write32(Reg::RingCtrl, (RingCtrl::ENABLE | RingCtrl::IN_VRAM).raw());
    assert_eq!(rig.read64(Reg::RingBase), RING_GPA);
    assert_eq!(rig.read32(Reg::RingSize), 16);
    assert_eq!(rig.read32(Reg::RingCtrl), RingCtrl::ENABLE.raw());
    rig.write32(Reg::RingCtrl, 0);
    rig.write32(Reg::RingSize, 64);
    assert_eq!(rig.read32(Reg::RingSize), 64);
}
