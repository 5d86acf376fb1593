//! Malformed commands and failed transfers: they retire with an error
//! status and change nothing else.
//!
//! Catches: an invalid command that touches memory, hangs the ring or gets
//! the wrong status, a record written for an unknown flag, guest memory
//! reached without bus mastering.

use crate::rig::*;

#[test]
fn malformed_commands_retire_with_an_error_and_change_nothing() {
    let mut rig = Rig::ready();
    let size = 256u64 << 20;
    let base_data = pattern(8192, 3);
    rig.gpu.vram().write(size - 8192, &base_data).unwrap();
    rig.poke(DATA_GPA, &[0x77; 8192]);
    let with = |c: Command, f: &dyn Fn(&mut Command)| {
        let mut c = c;
        f(&mut c);
        c
    };
    let cases: Vec<(&str, Command, u32)> = vec![
        (
            "bad opcode",
            cmd(0x42, 0, 0, 16),
            StatusCode::BadOpcode.code(),
        ),
        (
            "opcode 0xff",
            cmd(0xff, 0, 0, 16),
            StatusCode::BadOpcode.code(),
        ),
        (
            "reserved0",
            with(cmd(op::COPY_VRAM, 0, size - 4096, 16), &|c| c.reserved0 = 1),
            StatusCode::BadCommand.code(),
        ),
        (
            "reserved1",
            with(cmd(op::COPY_VRAM, 0, size - 4096, 16), &|c| {
                c.reserved1[1] = 1
            }),
            StatusCode::BadCommand.code(),
        ),
        (
            "pattern on a copy",
            with(cmd(op::COPY_VRAM, 0, size - 4096, 16), &|c| c.pattern = 9),
            StatusCode::BadCommand.code(),
        ),
        (
            "copy-to-vram past the end",
            cmd(op::COPY_TO_VRAM, DATA_GPA, size - 4096, 8192),
            StatusCode::VramRange.code(),
        ),
        (
            "copy-to-vram wraps",
            cmd(op::COPY_TO_VRAM, DATA_GPA, u64::MAX - 10, 100),
            StatusCode::VramRange.code(),
        ),
        (
            "copy-from-vram past the end",
            cmd(op::COPY_FROM_VRAM, size - 10, DATA_GPA, 11),
            StatusCode::VramRange.code(),
        ),
        (
            "copy-vram dst past the end",
            cmd(op::COPY_VRAM, 0, size - 8, 16),
            StatusCode::VramRange.code(),
        ),
        (
            "copy-vram src past the end",
            cmd(op::COPY_VRAM, size, size - 8192, 1),
            StatusCode::VramRange.code(),
        ),
        (
            "fill past the end",
            fill_cmd(size - 4096, 4097, 0x1234_5678),
            StatusCode::VramRange.code(),
        ),
        (
            "zero fill past the end",
            fill_cmd(size - 4096, 1 << 40, 0),
            StatusCode::VramRange.code(),
        ),
        (
            "checksum past the end",
            cmd(op::CHECKSUM, size - 1, 0, 2),
            StatusCode::VramRange.code(),
        ),
        (
            "host source unmapped",
            cmd(op::COPY_TO_VRAM, 0x1000, size - 8192, 4096),
            StatusCode::HostDma.code(),
        ),
        (
            "host source wraps",
            cmd(op::COPY_TO_VRAM, u64::MAX - 10, size - 8192, 100),
            StatusCode::HostDma.code(),
        ),
        (
            "host destination runs off RAM",
            cmd(
                op::COPY_FROM_VRAM,
                size - 8192,
                RAM_BASE + RAM_SIZE as u64 - 4096,
                8192,
            ),
            StatusCode::HostDma.code(),
        ),
    ];
    let irqs_before = rig.irqs();
    for (i, (what, c, code)) in cases.iter().enumerate() {
        rig.write32(Reg::IntStatus, IntCauses::ALL.raw());
        let r = rig.run(*c);
        assert_eq!(r.status, *code, "{what}");
        assert_eq!(rig.read32(Reg::EngineError), *code, "{what}");
        assert_eq!(
            rig.read32(Reg::IntStatus) & IntCauses::ERROR.raw(),
            IntCauses::ERROR.raw(),
            "{what}"
        );
        assert!(
            !rig.status().contains(Status::HALTED),
            "{what}: engine keeps going"
        );
        assert_eq!(rig.read32(Reg::JobsFailed), i as u32 + 1);
    }
    assert!(rig.irqs() >= irqs_before + cases.len() as u64);
    assert_eq!(
        vram_bytes(&rig, size - 8192, 8192),
        base_data,
        "VRAM unchanged"
    );
    assert_eq!(rig.peek(DATA_GPA, 8192), vec![0x77; 8192], "RAM unchanged");
    // A failed host write stops at the first bad chunk; the RAM tail stays.
    let s = rig.gpu.stats();
    assert_eq!(s.jobs_failed, cases.len() as u64);
    assert_eq!(s.jobs_completed, 0);
    assert_eq!(
        s.bytes_host_to_vram + s.bytes_vram_to_vram + s.bytes_filled,
        0
    );
    // And the engine still works.
    assert_eq!(rig.run(cmd(op::NOP, 0, 0, 0)).status, StatusCode::Ok.code());
}

#[test]
fn unknown_flags_are_rejected_without_writing_a_record() {
    let mut rig = Rig::ready();
    rig.poke(rig.record_gpa(0), &[0xee; COMPLETION_SIZE]);
    let fence = rig.submit(Command {
        flags: CommandFlags::from_raw(0x80) | CommandFlags::COMPLETION,
        ..cmd(op::NOP, 0, 0, 0)
    });
    rig.wait_fence(fence);
    assert_eq!(rig.read32(Reg::EngineError), StatusCode::BadCommand.code());
    // A command we do not understand must not make us write guest memory.
    assert_eq!(
        rig.peek(rig.record_gpa(0), COMPLETION_SIZE),
        vec![0xee; COMPLETION_SIZE]
    );
}

#[test]
fn host_copies_without_bus_master_fail_but_vram_ring_keeps_working() {
    let mut rig = Rig::new(256 << 20);
    rig.enable_ring(128 << 20, 8, RingIn::Vram);
    rig.gpu.set_bus_master(false);
    let f = rig.submit(cmd(op::COPY_TO_VRAM, DATA_GPA, 0, 4096));
    rig.wait_fence(f);
    assert_eq!(rig.read32(Reg::EngineError), StatusCode::NoBusMaster.code());
    let f = rig.submit(fill_cmd(0, 4096, 0x5a5a_5a5a));
    rig.wait_fence(f);
    assert_eq!(vram_bytes(&rig, 0, 4096), vec![0x5a; 4096]);
    // A completion record needs bus mastering too.
    let f = rig.submit(Command {
        flags: CommandFlags::COMPLETION,
        completion_addr: RECORDS_GPA,
        ..cmd(op::NOP, 0, 0, 0)
    });
    rig.wait_fence(f);
    assert_eq!(
        rig.read32(Reg::EngineError),
        StatusCode::CompletionWrite.code()
    );
}

#[test]
fn completion_write_failure_is_reported() {
    let mut rig = Rig::ready();
    let f = rig.submit(Command {
        flags: CommandFlags::COMPLETION,
        completion_addr: 0x10,
        ..fill_cmd(0, 64, 0x0101_0101)
    });
    rig.wait_fence(f);
    assert_eq!(
        rig.read32(Reg::EngineError),
        StatusCode::CompletionWrite.code()
    );
    assert!(rig.read32(Reg::IntStatus) & IntCauses::ERROR.raw() != 0);
    // The work itself was done.
    assert_eq!(vram_bytes(&rig, 0, 64), vec![1; 64]);
}
