//! Ring-level errors: each halts the engine with its own code.
//!
//! Catches: a bad ring setup, tail or fetch that does not halt, halts with
//! the wrong code or without INT_ERROR, and a halt that cannot be cleared.

use crate::rig::*;

fn assert_halted(rig: &Rig, error: StatusCode) {
    let status = rig.status();
    assert!(status.contains(Status::HALTED), "{status:?}");
    assert_eq!(rig.read32(Reg::EngineError), error.code());
    assert!(rig.read32(Reg::IntStatus) & IntCauses::ERROR.raw() != 0);
}

#[test]
fn bad_ring_setups_halt_with_their_error() {
    use RingIn::{GuestMemory, Vram};
    let cases: [(u64, u32, RingIn, StatusCode); 7] = [
        (RING_GPA + 32, 16, GuestMemory, StatusCode::RingMisaligned),
        (RING_GPA, 0, GuestMemory, StatusCode::RingBadSize),
        (RING_GPA, 1, GuestMemory, StatusCode::RingBadSize),
        (RING_GPA, 24, GuestMemory, StatusCode::RingBadSize),
        (
            RING_GPA,
            MAX_RING_ENTRIES * 2,
            GuestMemory,
            StatusCode::RingBadSize,
        ),
        ((256 << 20) - 64 * 8, 16, Vram, StatusCode::RingRange),
        (u64::MAX - 63, 16, GuestMemory, StatusCode::RingRange),
    ];
    for (base, entries, place, error) in cases {
        let mut rig = Rig::new(256 << 20);
        rig.write32(Reg::IntMask, 0);
        rig.enable_ring(base, entries, place);
        assert_halted(&rig, error);
        rig.wait_irqs(1);
        // A halted ring ignores doorbells, and disabling recovers it.
        rig.write32(Reg::Doorbell, 1);
        assert_eq!(rig.read32(Reg::RingTail), 0);
        rig.write32(Reg::RingCtrl, 0);
        assert!(!rig.status().contains(Status::HALTED));
        rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
        assert_eq!(rig.read32(Reg::EngineError), 0);
        let record = rig.run(fill_cmd(0, 4096, 0x0101_0101));
        assert_eq!(record.status, StatusCode::Ok.code());
    }
    // The largest legal ring in VRAM fits exactly at the end.
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(
        (256 << 20) - u64::from(MAX_RING_ENTRIES) * 64,
        MAX_RING_ENTRIES,
        RingIn::Vram,
    );
    assert!(!rig.status().contains(Status::HALTED));
}

#[test]
fn tail_beyond_ring_size_halts() {
    let rig = Rig::ready();
    rig.write32(Reg::Doorbell, 16);
    assert_halted(&rig, StatusCode::BadTail);
    assert_eq!(rig.read32(Reg::RingTail), 0);
    assert_eq!(rig.gpu.stats().ring_errors, 1);
}

#[test]
fn ring_in_unmapped_memory_halts_with_fetch_error() {
    let mut rig = Rig::new(256 << 20);
    rig.write32(Reg::IntMask, 0);
    rig.enable_ring(0x4000_0000, 16, RingIn::GuestMemory);
    rig.write32(Reg::Doorbell, 1);
    wait_until("halt", || rig.status().contains(Status::HALTED));
    assert_halted(&rig, StatusCode::RingFetch);
    assert_eq!(rig.read32(Reg::RingHead), 0);
    assert_eq!(rig.read64(Reg::Fence), 0);
    rig.wait_irqs(1);
}

#[test]
fn no_bus_master_halts_a_host_ring() {
    let mut rig = Rig::ready();
    rig.gpu.set_bus_master(false);
    rig.submit(cmd(op::NOP, 0, 0, 0));
    wait_until("halt", || rig.status().contains(Status::HALTED));
    assert_halted(&rig, StatusCode::NoBusMaster);
}
