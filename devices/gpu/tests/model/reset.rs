//! Reset and ring disable overtaking a job in flight.
//!
//! Catches: an abandoned job that still retires (fence, record or
//! interrupt), registers not back to power-on values, VRAM written after
//! a reset, a reset that returns while the engine's DMA still runs.

use std::time::Duration;

use crate::rig::*;

/// Holds a 3 MiB host→VRAM copy inside its first guest read, then runs
/// `interrupt`, then lets the read finish.
fn abandon_copy_midway(interrupt: impl FnOnce(&mut Rig)) -> Rig {
    let mut rig = Rig::ready();
    rig.poke(DATA_GPA, &vec![0x3c; 3 << 20]);
    rig.poke(rig.record_gpa(0), &[0xee; COMPLETION_SIZE]);
    rig.ram.close_gate();
    rig.submit(Command {
        flags: CommandFlags::COMPLETION | CommandFlags::IRQ,
        ..cmd(op::COPY_TO_VRAM, DATA_GPA, 0, 3 << 20)
    });
    wait_until("engine inside the guest read", || rig.ram.reads_held() > 0);
    assert!(rig.status().contains(Status::BUSY));
    interrupt(&mut rig);
    rig.ram.open_gate();
    rig.wait_idle();
    rig
}

#[test]
fn reset_abandons_the_job_in_flight_and_restores_defaults() {
    let rig = abandon_copy_midway(|rig| {
        rig.write32(Reg::Scratch, 5);
        // The transport fences DMA while it resets; the fake cannot, so
        // the held read is what the reset must wait for.
        std::thread::scope(|s| {
            let (done_tx, done) = std::sync::mpsc::channel();
            let gpu = &rig.gpu;
            s.spawn(move || done_tx.send(gpu.reset()));
            assert!(
                done.recv_timeout(Duration::from_millis(100)).is_err(),
                "reset returned while the engine's DMA was in flight"
            );
            rig.ram.open_gate();
            let quiesced = done.recv_timeout(Duration::from_secs(10));
            assert_eq!(quiesced.expect("reset returned"), Ok(()));
        });
    });
    assert_eq!(rig.read64(Reg::Fence), 0);
    assert_eq!(rig.read32(Reg::Scratch), 0);
    assert_eq!(rig.read32(Reg::RingCtrl), 0);
    assert_eq!(rig.read64(Reg::RingBase), 0);
    assert_eq!(rig.read32(Reg::IntMask), IntCauses::ALL.raw());
    assert_eq!(rig.read32(Reg::IntStatus), 0);
    assert_eq!(rig.status(), Status::READY | Status::BUS_MASTER);
    // No record, no fence, no interrupt, and at most the chunk that was
    // already in flight reached VRAM.
    assert_eq!(
        rig.peek(rig.record_gpa(0), COMPLETION_SIZE),
        vec![0xee; COMPLETION_SIZE]
    );
    assert_eq!(rig.irqs(), 0);
    assert!(vram_bytes(&rig, 1 << 20, 2 << 20).iter().all(|&b| b == 0));
    let s = rig.gpu.stats();
    assert_eq!((s.jobs_completed, s.jobs_failed, s.resets), (0, 0, 1));
}

#[test]
fn disabling_the_ring_abandons_the_job_and_reenable_starts_clean() {
    let mut rig = abandon_copy_midway(|rig| rig.write32(Reg::RingCtrl, 0));
    assert_eq!(rig.read64(Reg::Fence), 0);
    assert_eq!(
        rig.peek(rig.record_gpa(0), COMPLETION_SIZE),
        vec![0xee; COMPLETION_SIZE]
    );
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
    assert_eq!(
        (rig.read32(Reg::RingHead), rig.read32(Reg::RingTail)),
        (0, 0)
    );
    let r = rig.run(cmd(op::COPY_TO_VRAM, DATA_GPA, 0, 3 << 20));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert!(vram_bytes(&rig, 0, 3 << 20).iter().all(|&b| b == 0x3c));
}
