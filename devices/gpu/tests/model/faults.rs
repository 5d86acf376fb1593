//! Injected faults: jobs that fail with a chosen status, hangs that only a
//! ring disable or reset ends, lost interrupts, VRAM error ranges.
//!
//! Catches: an injected error that runs the job anyway (VRAM changes) or
//! retires with another status; a hang that retires by itself or that a
//! ring disable does not end; a dropped interrupt that is still sent or
//! whose cause is not latched for a polling driver; a VRAM error that
//! fails jobs outside its range or is not reported in VRAM_ERR_*.

use p2plab_kit::DeviceControl;

use crate::rig::*;
use p2plab_gpu::GpuFaultSpec;

fn arm(rig: &Rig, text: &str) -> u64 {
    let spec: GpuFaultSpec = text.parse().unwrap();
    rig.gpu.inject(spec).unwrap()
}

#[test]
fn job_error_retires_with_the_injected_status_without_running() {
    let mut rig = Rig::ready();
    arm(&rig, "job-error=0x06,opcode=fill,count=1");
    let record = rig.run(fill_cmd(0, 4096, 0x1122_3344));
    assert_eq!(record.status, StatusCode::VramIo.code());
    assert_eq!(rig.read32(Reg::EngineError), StatusCode::VramIo.code());
    assert!(vram_bytes(&rig, 0, 4096).iter().all(|&b| b == 0), "not run");
    assert_ne!(rig.read32(Reg::IntStatus) & IntCauses::ERROR.raw(), 0);
    // count=1: the same job now runs.
    let record = rig.run(fill_cmd(0, 4096, 0x1122_3344));
    assert_eq!(record.status, StatusCode::Ok.code());
    assert_eq!(&vram_bytes(&rig, 0, 4)[..], &0x1122_3344u32.to_le_bytes());
    let s = rig.gpu.stats();
    assert_eq!(
        (s.injected_job_errors, s.jobs_failed, s.jobs_completed),
        (1, 1, 1)
    );
}

/// Catches: a job-error code that no command retires with reaching the
/// device, or a device that arms without end.
#[test]
fn bad_codes_and_too_many_specs_are_refused() {
    let rig = Rig::ready();
    for bad in ["job-error=0x07", "job-error=0x10", "job-error=0x99"] {
        let err = bad.parse::<GpuFaultSpec>().unwrap_err();
        assert!(err.message.contains("not a command error"), "{bad}: {err}");
        let control = rig.gpu.control();
        let err = DeviceControl::inject(&control, bad).unwrap_err();
        assert!(err.starts_with(&format!("{bad}: ")), "{err}");
    }
    for _ in 0..p2plab_fault::DEFAULT_MAX_ARMED {
        arm(&rig, "drop-irq,opcode=0x7f");
    }
    let err = DeviceControl::inject(&rig.gpu.control(), "hang").unwrap_err();
    assert!(err.contains("64 injections"), "{err}");
    DeviceControl::clear(&rig.gpu.control());
    arm(&rig, "hang,opcode=0x7f");
}

#[test]
fn hang_holds_the_job_until_the_ring_is_disabled() {
    let mut rig = Rig::ready();
    arm(&rig, "hang,count=1");
    rig.poke(rig.record_gpa(0), &[0xee; COMPLETION_SIZE]);
    let fence = rig.submit(Command {
        flags: CommandFlags::COMPLETION | CommandFlags::IRQ,
        ..cmd(op::NOP, 0, 0, 0)
    });
    wait_until("the hang to be taken", || {
        rig.gpu.stats().injected_hangs == 1
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(rig.status().contains(Status::BUSY), "still held");
    assert_eq!(rig.read64(Reg::Fence), 0);
    assert_eq!(rig.irqs(), 0);
    // What the guest driver's recovery does: disable, wait idle, enable.
    rig.write32(Reg::RingCtrl, 0);
    rig.wait_idle();
    assert_eq!(rig.read64(Reg::Fence), 0, "the hung job never retires");
    assert_eq!(
        rig.peek(rig.record_gpa(0), COMPLETION_SIZE),
        vec![0xee; COMPLETION_SIZE]
    );
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
    rig.next_fence = fence;
    let record = rig.run(fill_cmd(0, 4096, 7));
    assert_eq!((record.fence, record.status), (fence, 0));
    assert_eq!(rig.gpu.stats().jobs_failed, 0);
}

#[test]
fn hang_ends_with_a_device_reset_too() {
    let mut rig = Rig::ready();
    arm(&rig, "hang,count=1");
    rig.submit(cmd(op::NOP, 0, 0, 0));
    wait_until("the hang to be taken", || {
        rig.gpu.stats().injected_hangs == 1
    });
    rig.gpu.control().reset().unwrap();
    rig.wait_idle();
    assert_eq!(rig.read64(Reg::Fence), 0);
    assert_eq!(rig.gpu.stats().resets, 1);
}

#[test]
fn dropped_interrupt_is_latched_but_not_sent() {
    let mut rig = Rig::ready();
    arm(&rig, "drop-irq,count=1");
    let record = rig.run(cmd(op::NOP, 0, 0, 0));
    assert_eq!(record.status, 0);
    // The fence moved and the cause is there for a driver that polls.
    assert_eq!(rig.read64(Reg::Fence), record.fence);
    assert_eq!(rig.read32(Reg::IntStatus), IntCauses::FENCE.raw());
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(rig.irqs(), 0, "interrupt sent anyway");
    rig.write32(Reg::IntStatus, IntCauses::ALL.raw());
    rig.run(cmd(op::NOP, 0, 0, 0));
    rig.wait_irqs(1);
    assert_eq!(rig.gpu.stats().dropped_interrupts, 1);
}

#[test]
fn vram_error_fails_reads_of_its_range_only_and_is_reported() {
    let mut rig = Rig::ready();
    let id = arm(&rig, "vram-error=0x3000-0x3fff");
    // A read next to the range is fine.
    let ok = rig.run(cmd(op::CHECKSUM, 0x2000, 0, 0x1000));
    assert_eq!(ok.status, 0);
    // A checksum and a VRAM→host copy over it fail, naming the first bad byte.
    let bad = rig.run(cmd(op::CHECKSUM, 0x2000, 0, 0x2000));
    assert_eq!(bad.status, StatusCode::VramIo.code());
    assert_eq!(rig.read64(Reg::VramErrAddr), 0x3000);
    let bad = rig.run(cmd(op::COPY_FROM_VRAM, 0x3800, DATA_GPA, 0x100));
    assert_eq!(bad.status, StatusCode::VramIo.code());
    assert_eq!(rig.read64(Reg::VramErrAddr), 0x3800);
    assert_eq!(rig.read32(Reg::VramErrCount), 2);
    // Writes into it are not reads: they run.
    assert_eq!(rig.run(fill_cmd(0x3000, 0x1000, 5)).status, 0);
    let registers = rig.gpu.control().registers().unwrap();
    let reg = |name: &str| registers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    assert_eq!(reg("VRAM_ERR_COUNT"), Some(2));
    assert_eq!(reg("VRAM_ERR_ADDR"), Some(0x3800));
    assert_eq!(reg("ENGINE_ERROR"), Some(StatusCode::VramIo.code().into()));
    assert_eq!(reg("DOORBELL"), None, "write-only");
    let report = rig.gpu.control().report();
    assert_eq!(report.len(), 1);
    assert_eq!((report[0].id, report[0].fired), (id, 2));
    assert_eq!(rig.gpu.stats().vram_errors, 2);
    // Cleared: the range reads again; reset clears the registers.
    rig.gpu.control().clear();
    assert_eq!(rig.run(cmd(op::CHECKSUM, 0x3000, 0, 0x1000)).status, 0);
    rig.gpu.reset().unwrap();
    assert_eq!(rig.read32(Reg::VramErrCount), 0);
    assert_eq!(rig.read64(Reg::VramErrAddr), 0);
}
