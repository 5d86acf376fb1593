//! Fences, interrupts and the ring's order.
//!
//! Catches: interrupts sent while masked or lost when unmasked, W1C bugs,
//! fences out of order, head not wrapping, a VRAM ring that is not read.

use std::time::Duration;

use crate::rig::*;

#[test]
fn fence_and_interrupt_semantics() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);

    // Masked: the cause is latched, no MSI-X is sent.
    let f = rig.submit(Command {
        flags: CommandFlags::IRQ,
        fence: 1000,
        ..cmd(op::NOP, 0, 0, 0)
    });
    rig.wait_fence(f);
    assert_eq!(f, 1000, "the fence is the command's own value");
    assert_eq!(rig.read32(Reg::IntStatus), IntCauses::FENCE.raw());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.irqs(), 0);

    // Unmasking a latched cause sends one.
    rig.write32(Reg::IntMask, IntCauses::ERROR.raw());
    rig.wait_irqs(1);
    // Write-1-to-clear.
    rig.write32(Reg::IntStatus, IntCauses::ERROR.raw());
    assert_eq!(rig.read32(Reg::IntStatus), IntCauses::FENCE.raw());
    rig.write32(Reg::IntStatus, IntCauses::FENCE.raw());
    assert_eq!(rig.read32(Reg::IntStatus), 0);

    // Without CommandFlags::IRQ, a successful command raises nothing.
    let f = rig.submit(cmd(op::NOP, 0, 0, 0));
    rig.wait_fence(f);
    assert_eq!(rig.read32(Reg::IntStatus), 0);

    // With it, one interrupt per command.
    for _ in 0..5 {
        let f = rig.submit(Command {
            flags: CommandFlags::IRQ,
            ..cmd(op::NOP, 0, 0, 0)
        });
        rig.wait_fence(f);
    }
    rig.wait_irqs(6);
    // Errors raise IntCauses::ERROR.raw() even without the flag; it is masked here.
    let f = rig.submit(cmd(0x99, 0, 0, 0));
    rig.wait_fence(f);
    assert_eq!(
        rig.read32(Reg::IntStatus),
        IntCauses::FENCE.raw() | IntCauses::ERROR.raw()
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.irqs(), 6);
    assert_eq!(rig.gpu.stats().interrupts, 6);
    assert!(rig.irq.vectors().iter().all(|&v| v == ENGINE_VECTOR));
}

#[test]
fn ring_wraps_around_many_times() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(RING_GPA, 4, RingIn::GuestMemory);
    for i in 0..37u32 {
        let f = rig.submit(fill_cmd(u64::from(i) * 4, 4, 0x0101_0101 * (i % 250 + 1)));
        rig.wait_fence(f);
        assert_eq!(rig.read32(Reg::RingHead), (i + 1) % 4);
    }
    let got = vram_bytes(&rig, 0, 37 * 4);
    for i in 0..37usize {
        assert_eq!(got[i * 4], (i % 250 + 1) as u8);
    }
}

#[test]
fn a_batch_retires_in_order_with_the_last_fence() {
    let rig = Rig::ready();
    // Fill the ring (15 of 16 entries) before one doorbell.
    let base = rig.read64(Reg::RingBase);
    for i in 0..15u64 {
        let c = fill_cmd(i * 4096, 4096, 0x0101_0101 * (i as u32 + 1));
        let c = Command {
            fence: 100 + i,
            ..c
        };
        rig.poke(base + i * COMMAND_SIZE, &c.encode());
    }
    rig.write32(Reg::Doorbell, 15);
    rig.wait_fence(114);
    rig.wait_idle();
    assert_eq!(rig.read32(Reg::RingHead), 15);
    for i in 0..15u64 {
        assert_eq!(vram_bytes(&rig, i * 4096, 1)[0], i as u8 + 1);
    }
}

#[test]
fn ring_in_vram_works() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(200 << 20, 8, RingIn::Vram);
    rig.gpu.vram().write(0, b"123456789").unwrap();
    let f = rig.submit(cmd(op::CHECKSUM, 0, 0, 9));
    rig.wait_fence(f);
    assert_eq!(rig.read32(Reg::Checksum), 0xe306_9283);
}
