//! The engine on the caller's thread (`Gpu::with_engine_on_caller`,
//! `Gpu::run_engine`), as the `gpu_ring` fuzz target runs it: the same
//! fetch, execute and retire code as the engine thread, stepped until
//! idle.

use crate::rig::*;

/// Catches: an engine that runs somewhere else (the job done before
/// `run_engine`), a `run_engine` that does not run queued jobs in order
/// with their bytes, fences, counters and interrupt, or one that does
/// not return once the ring is empty.
#[test]
fn run_engine_runs_queued_jobs_and_returns_when_idle() {
    let mut rig = Rig::on_caller(16 << 20);
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
    rig.write32(Reg::IntMask, 0);
    let data = pattern(100_000, 5);
    rig.poke(DATA_GPA, &data);
    let mut copy = cmd(op::COPY_TO_VRAM, DATA_GPA, 4096, data.len() as u64);
    copy.flags |= CommandFlags::IRQ;
    rig.submit(copy);
    let back = rig.submit(cmd(op::COPY_FROM_VRAM, 4096, DATA_GPA + (1 << 20), 100_000));
    assert_eq!(
        rig.read64(Reg::Fence),
        0,
        "no job may run before run_engine"
    );
    assert!(rig.gpu.run_engine() >= 2);
    assert_eq!(rig.read64(Reg::Fence), back);
    assert_eq!(rig.peek(DATA_GPA + (1 << 20), data.len()), data);
    assert!(!rig.status().contains(Status::BUSY));
    let stats = rig.gpu.stats();
    assert_eq!((stats.jobs_completed, stats.jobs_failed), (2, 0));
    assert_eq!(rig.irqs(), 1);
    assert_eq!(rig.gpu.run_engine(), 0, "nothing left to do");
}

/// Catches: a caller-thread engine that fetches a ring in guest memory
/// with Bus Master Enable off (it must halt the ring with NoBusMaster
/// and run nothing), or one that keeps stepping a halted ring.
#[test]
fn run_engine_halts_a_guest_ring_without_bus_mastering() {
    let mut rig = Rig::on_caller(16 << 20);
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
    rig.gpu.set_bus_master(false);
    rig.submit(fill_cmd(0, 4096, 0x1234_5678));
    assert_eq!(rig.gpu.run_engine(), 1);
    assert_eq!(rig.read64(Reg::Fence), 0);
    assert!(rig.status().contains(Status::HALTED));
    assert_eq!(rig.read32(Reg::EngineError), StatusCode::NoBusMaster.code());
    rig.gpu.set_bus_master(true);
    assert_eq!(rig.gpu.run_engine(), 0, "a halted ring runs nothing");
}

/// Catches: `run_engine` stepping a device that has an engine thread
/// (two engines on one ring).
#[test]
fn run_engine_does_nothing_with_an_engine_thread() {
    let rig = Rig::new(16 << 20);
    assert_eq!(rig.gpu.run_engine(), 0);
}
