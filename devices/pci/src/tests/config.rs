use crate::regs::{self, cap_id, ext_cap_id, status};
use crate::{
    BarKind, BarSpec, Command, ConfigChange, ConfigError, ConfigSpace, ConfigSpaceBuilder,
    ExtCapability, LinkSpeed, MsixCapSpec, MsixControl, PcieCapSpec, PowerState,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn w32(cs: &mut ConfigSpace, offset: usize, value: u32) -> Vec<ConfigChange> {
    cs.write(offset as u64, &value.to_le_bytes())
        .expect("in range")
}

fn w16(cs: &mut ConfigSpace, offset: usize, value: u16) -> Vec<ConfigChange> {
    cs.write(offset as u64, &value.to_le_bytes())
        .expect("in range")
}

fn r32(cs: &ConfigSpace, offset: usize) -> u32 {
    cs.read_u32(offset as u64).expect("in range")
}

fn r16(cs: &ConfigSpace, offset: usize) -> u16 {
    cs.read_u16(offset as u64).expect("in range")
}

fn bar_reg(index: usize) -> usize {
    regs::BAR0 + 4 * index
}

/// An NVMe-like function: 16 KiB BAR0 with MSI-X, a 64 MiB prefetchable
/// 64-bit BAR2 (CMB), a 32-byte I/O BAR4, every capability.
fn nvme_like() -> ConfigSpace {
    ConfigSpaceBuilder::new(0x1b36, 0x0010)
        .subsystem(0x1af4, 0x1100)
        .class_code(0x01, 0x08, 0x02)
        .revision(2)
        .bar(0, BarSpec::memory64(16 * 1024))
        .bar(2, BarSpec::memory64(64 * MIB).prefetchable())
        .bar(4, BarSpec::io(32))
        .power_management()
        .msix(MsixCapSpec {
            vectors: 65,
            table_bar: 0,
            table_offset: 0x2000,
            pba_bar: 0,
            pba_offset: 0x3000,
        })
        .pcie(PcieCapSpec::default())
        .device_serial_number(0x0011_2233_4455_6677)
        .build()
        .expect("valid")
}

/// A GPU-like function: 32-bit BAR0 registers, resizable 64-bit BAR2.
fn gpu_like() -> ConfigSpace {
    ConfigSpaceBuilder::new(0x1d0f, 0xf00d)
        .class_code(0x03, 0x02, 0x00)
        .bar(0, BarSpec::memory32(64 * 1024))
        .bar(2, BarSpec::memory64(256 * MIB).prefetchable())
        .pcie(PcieCapSpec::default())
        .resizable_bar(2, &[256 * MIB, 512 * MIB, GIB, 16 * GIB])
        .ext_capability(ExtCapability {
            id: 0x000b, // vendor-specific
            version: 1,
            body: vec![0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0],
            write_mask: vec![0, 0, 0, 0, 0xff, 0x0f, 0, 0],
            w1c_mask: vec![],
        })
        .build()
        .expect("valid")
}

#[test]
fn identity_registers_are_read_only() {
    let mut cs = nvme_like();
    let header = {
        let mut h = [0u8; 0x40];
        cs.read(0, &mut h).expect("read");
        h
    };
    assert_eq!(r16(&cs, regs::VENDOR_ID), 0x1b36);
    assert_eq!(r16(&cs, regs::DEVICE_ID), 0x0010);
    assert_eq!(r32(&cs, regs::REVISION_ID), 0x0108_0202);
    assert_eq!(r16(&cs, regs::SUBSYSTEM_VENDOR_ID), 0x1af4);
    assert_eq!(r16(&cs, regs::SUBSYSTEM_ID), 0x1100);
    assert_eq!(cs.interrupt_pin(), 1);

    for offset in [
        regs::VENDOR_ID,
        regs::REVISION_ID,
        regs::SUBSYSTEM_VENDOR_ID,
        regs::CARDBUS_CIS,
        regs::EXPANSION_ROM,
    ] {
        w32(&mut cs, offset, 0xdead_beef);
    }
    cs.write(regs::CAPABILITIES_POINTER as u64, &[0x99])
        .expect("write");
    cs.write(regs::INTERRUPT_PIN as u64, &[3]).expect("write");
    cs.write(regs::HEADER_TYPE as u64, &[0x80]).expect("write");
    let mut after = [0u8; 0x40];
    cs.read(0, &mut after).expect("read");
    assert_eq!(header, after);
}

#[test]
fn interrupt_line_and_cache_line_are_writable() {
    let mut cs = nvme_like();
    cs.write(regs::INTERRUPT_LINE as u64, &[0x0b])
        .expect("write");
    cs.write(regs::CACHE_LINE_SIZE as u64, &[0x10])
        .expect("write");
    assert_eq!(cs.read_u8(regs::INTERRUPT_LINE as u64), Some(0x0b));
    assert_eq!(cs.read_u8(regs::CACHE_LINE_SIZE as u64), Some(0x10));
    // Latency timer is read-only zero on PCI Express.
    cs.write(regs::LATENCY_TIMER as u64, &[0x40])
        .expect("write");
    assert_eq!(cs.read_u8(regs::LATENCY_TIMER as u64), Some(0));
}

#[test]
fn command_takes_only_implemented_bits() {
    let mut cs = gpu_like(); // no I/O BAR: IO_SPACE stays zero
    let changes = w16(&mut cs, regs::COMMAND, 0xffff);
    let expected = Command(0x0002 | 0x0004 | 0x0040 | 0x0100 | 0x0400);
    assert_eq!(cs.command(), expected);
    assert_eq!(
        changes.first(),
        Some(&ConfigChange::CommandChanged {
            old: Command(0),
            new: expected
        })
    );
    assert!(cs.bus_master_enabled() && cs.memory_decode_enabled());

    let mut with_io = nvme_like();
    w16(&mut with_io, regs::COMMAND, 0xffff);
    assert!(with_io.command().io_enabled());
}

#[test]
fn status_error_bits_are_write_one_to_clear() {
    let mut cs = nvme_like();
    assert_ne!(cs.status() & status::CAP_LIST, 0);
    cs.raise_status(
        status::RECEIVED_MASTER_ABORT | status::SIGNALED_SYSTEM_ERROR | status::CAP_LIST,
    );
    let raised = cs.status();
    assert_ne!(raised & status::RECEIVED_MASTER_ABORT, 0);
    assert_ne!(raised & status::SIGNALED_SYSTEM_ERROR, 0);

    // Writing zero clears nothing.
    w16(&mut cs, regs::STATUS, 0);
    assert_eq!(cs.status(), raised);
    // Writing 1 to one bit clears only that bit.
    w16(&mut cs, regs::STATUS, status::RECEIVED_MASTER_ABORT);
    assert_eq!(cs.status() & status::RECEIVED_MASTER_ABORT, 0);
    assert_ne!(cs.status() & status::SIGNALED_SYSTEM_ERROR, 0);
    // All ones clears every error bit but not CAP_LIST.
    w16(&mut cs, regs::STATUS, 0xffff);
    assert_eq!(cs.status(), status::CAP_LIST);
    // A 4-byte write at COMMAND reaches STATUS too.
    cs.raise_status(status::DETECTED_PARITY_ERROR);
    w32(
        &mut cs,
        regs::COMMAND,
        u32::from(status::DETECTED_PARITY_ERROR) << 16 | 0x2,
    );
    assert_eq!(cs.status(), status::CAP_LIST);
    assert!(cs.memory_decode_enabled());
}

#[test]
fn bar_32bit_size_probe_and_placement() {
    let mut cs = gpu_like();
    let at = bar_reg(0);
    assert_eq!(r32(&cs, at), 0, "32-bit, non-prefetchable flags");
    w32(&mut cs, at, 0xffff_ffff);
    assert_eq!(r32(&cs, at), 0xffff_0000, "64 KiB size mask");
    assert_eq!(cs.bar_address(0), None, "decode off");

    w32(&mut cs, at, 0xfe00_1234);
    assert_eq!(
        r32(&cs, at),
        0xfe00_0000,
        "low bits below the size are zero"
    );
    assert_eq!(cs.bar_programmed_address(0), Some(0xfe00_0000));
    assert_eq!(cs.bar_address(0), None);
    let changes = w16(&mut cs, regs::COMMAND, 0x2);
    assert!(changes.contains(&ConfigChange::BarMoved {
        index: 0,
        old: None,
        new: Some(0xfe00_0000)
    }));
    assert_eq!(cs.bar_address(0), Some(0xfe00_0000));
    assert_eq!(cs.bar_at(0xfe00_fffc), Some((0, 0xfffc)));
    assert_eq!(cs.bar_at(0xfe01_0000), None);

    // Moving it while decoding reports old and new.
    let changes = w32(&mut cs, at, 0xfd00_0000);
    assert_eq!(
        changes,
        vec![ConfigChange::BarMoved {
            index: 0,
            old: Some(0xfe00_0000),
            new: Some(0xfd00_0000)
        }]
    );
}

#[test]
fn bar_64bit_prefetchable_size_probe_uses_both_dwords() {
    let mut cs = nvme_like();
    let (low, high) = (bar_reg(2), bar_reg(3));
    assert_eq!(r32(&cs, low), 0xc, "64-bit prefetchable flags");
    w32(&mut cs, low, 0xffff_ffff);
    w32(&mut cs, high, 0xffff_ffff);
    assert_eq!(
        r32(&cs, low),
        0xfc00_000c,
        "64 MiB mask in the low dword, flags kept"
    );
    assert_eq!(r32(&cs, high), 0xffff_ffff);

    w32(&mut cs, low, 0x0000_0000);
    w32(&mut cs, high, 0x0000_0008);
    assert_eq!(cs.bar_programmed_address(2), Some(0x8_0000_0000));
    assert_eq!(
        cs.bar(2).map(|b| (b.kind, b.prefetchable)),
        Some((BarKind::Memory64, true))
    );
    assert_eq!(cs.bar(3), None, "the upper half is not a BAR");
    assert_eq!(cs.bar_size(3), None);
    w16(&mut cs, regs::COMMAND, 0x2);
    assert_eq!(cs.bar_address(2), Some(0x8_0000_0000));
}

#[test]
fn huge_64bit_bar_has_no_writable_low_address_bits() {
    let cs = ConfigSpaceBuilder::new(1, 2)
        .bar(0, BarSpec::memory64(16 * GIB).prefetchable())
        .build();
    let mut cs = cs.expect("valid");
    w32(&mut cs, bar_reg(0), 0xffff_ffff);
    w32(&mut cs, bar_reg(1), 0xffff_ffff);
    assert_eq!(r32(&cs, bar_reg(0)), 0xc);
    assert_eq!(r32(&cs, bar_reg(1)), 0xffff_fffc, "16 GiB = bits 34 and up");
}

#[test]
fn io_bar_size_probe() {
    let mut cs = nvme_like();
    let at = bar_reg(4);
    assert_eq!(r32(&cs, at), 1, "I/O space indicator");
    w32(&mut cs, at, 0xffff_ffff);
    assert_eq!(r32(&cs, at), 0xffff_ffe1, "32 bytes, bit 1 reserved");
    w32(&mut cs, at, 0xc040);
    assert_eq!(cs.bar_address(4), None, "IO decode is off");
    w16(&mut cs, regs::COMMAND, 0x1);
    assert_eq!(cs.bar_address(4), Some(0xc040));
    assert_eq!(cs.bar_address(0), None, "memory decode is off");
}

#[test]
fn unimplemented_bars_read_zero_after_probe() {
    let mut cs = gpu_like();
    for index in [1, 3, 4, 5] {
        // BAR1 is unused in the GPU; BAR3 is BAR2's upper half.
        if index == 3 {
            continue;
        }
        w32(&mut cs, bar_reg(index), 0xffff_ffff);
        assert_eq!(r32(&cs, bar_reg(index)), 0, "BAR{index}");
        assert_eq!(cs.bar(index), None);
    }
    assert_eq!(cs.bar(6), None);
    assert_eq!(cs.bar_address(usize::MAX), None);
}

#[test]
fn size_probe_value_does_not_decode() {
    let mut cs = gpu_like();
    w16(&mut cs, regs::COMMAND, 0x2);
    // Sizing with decode on (a careless guest): all-ones is not an address.
    w32(&mut cs, bar_reg(0), 0xffff_ffff);
    assert_eq!(cs.bar_address(0), None);
    w32(&mut cs, bar_reg(2), 0xffff_ffff);
    w32(&mut cs, bar_reg(3), 0xffff_ffff);
    assert_eq!(cs.bar_address(2), None);
    // Zero means unassigned.
    w32(&mut cs, bar_reg(0), 0);
    assert_eq!(cs.bar_address(0), None);
}

#[test]
fn memory_decode_toggle_moves_every_memory_bar() {
    let mut cs = nvme_like();
    w32(&mut cs, bar_reg(0), 0xfe00_0000);
    w32(&mut cs, bar_reg(2), 0x0);
    w32(&mut cs, bar_reg(3), 0x1);
    w32(&mut cs, bar_reg(4), 0xc000);
    let on = w16(&mut cs, regs::COMMAND, 0x6);
    assert_eq!(
        on,
        vec![
            ConfigChange::CommandChanged {
                old: Command(0),
                new: Command(0x6)
            },
            ConfigChange::BarMoved {
                index: 0,
                old: None,
                new: Some(0xfe00_0000)
            },
            ConfigChange::BarMoved {
                index: 2,
                old: None,
                new: Some(0x1_0000_0000)
            },
        ]
    );
    let off = w16(&mut cs, regs::COMMAND, 0x4);
    assert_eq!(off.len(), 3);
    assert!(off.contains(&ConfigChange::BarMoved {
        index: 2,
        old: Some(0x1_0000_0000),
        new: None
    }));
}

fn walk_caps(cs: &ConfigSpace) -> Vec<(u8, usize)> {
    let mut found = Vec::new();
    let mut at = usize::from(cs.read_u8(regs::CAPABILITIES_POINTER as u64).expect("ptr"));
    while at != 0 {
        assert!(
            (0x40..0x100).contains(&at) && at.is_multiple_of(4),
            "bad cap pointer {at:#x}"
        );
        assert!(found.len() < 48, "capability loop");
        let id = cs.read_u8(at as u64).expect("id");
        found.push((id, at));
        at = usize::from(cs.read_u8(at as u64 + 1).expect("next"));
    }
    found
}

fn walk_ext_caps(cs: &ConfigSpace) -> Vec<(u16, u8, usize)> {
    let mut found = Vec::new();
    let mut at = 0x100usize;
    loop {
        let header = r32(cs, at);
        if header == 0 {
            break;
        }
        found.push(((header & 0xffff) as u16, ((header >> 16) & 0xf) as u8, at));
        let next = (header >> 20) as usize;
        if next == 0 {
            break;
        }
        assert!(
            next > at && next.is_multiple_of(4) && next < 0x1000,
            "bad next {next:#x}"
        );
        at = next;
    }
    found
}

#[test]
fn capability_list_walks_from_0x34() {
    let cs = nvme_like();
    let caps = walk_caps(&cs);
    let ids: Vec<u8> = caps.iter().map(|c| c.0).collect();
    assert_eq!(
        ids,
        vec![cap_id::POWER_MANAGEMENT, cap_id::MSIX, cap_id::PCI_EXPRESS]
    );
    for (id, at) in caps {
        assert_eq!(cs.capability_offset(id), Some(at));
    }
    assert_ne!(cs.status() & status::CAP_LIST, 0);
    // The PCIe capability (0x3c bytes) must not overlap the next one.
    let pcie = cs.capability_offset(cap_id::PCI_EXPRESS).expect("pcie");
    assert!(pcie + regs::pcie::LEN <= 0x100);
}

#[test]
fn extended_capability_list_walks_from_0x100() {
    let cs = nvme_like();
    let ext = walk_ext_caps(&cs);
    assert_eq!(ext, vec![(ext_cap_id::DEVICE_SERIAL_NUMBER, 1, 0x100)]);
    assert_eq!(r32(&cs, 0x104), 0x4455_6677);
    assert_eq!(r32(&cs, 0x108), 0x0011_2233);

    let gpu = gpu_like();
    let ext = walk_ext_caps(&gpu);
    let ids: Vec<u16> = ext.iter().map(|e| e.0).collect();
    assert_eq!(ids, vec![ext_cap_id::RESIZABLE_BAR, 0x000b]);
    assert_eq!(gpu.ext_capability_offset(0x000b), Some(ext[1].2));
}

#[test]
fn function_without_capabilities() {
    let cs = ConfigSpaceBuilder::new(0x1234, 0x5678)
        .interrupt_pin(0)
        .build()
        .expect("valid");
    assert_eq!(cs.read_u8(regs::CAPABILITIES_POINTER as u64), Some(0));
    assert_eq!(cs.status() & status::CAP_LIST, 0);
    assert_eq!(r32(&cs, 0x100), 0, "no extended capabilities: zero header");
    assert_eq!(cs.interrupt_pin(), 0);
    assert_eq!(cs.msix(), None);
    assert_eq!(cs.power_state(), PowerState::D0);
}

#[test]
fn device_defined_ext_capability_masks_and_event() {
    let mut cs = gpu_like();
    let at = cs.ext_capability_offset(0x000b).expect("cap");
    // Read-only dword.
    let changes = w32(&mut cs, at + 4, 0xffff_ffff);
    assert_eq!(r32(&cs, at + 4), 0x4433_2211);
    assert_eq!(
        changes,
        vec![ConfigChange::ExtCapabilityWritten {
            id: 0x000b,
            offset: at as u16
        }]
    );
    w32(&mut cs, at + 8, 0xffff_ffff);
    assert_eq!(r32(&cs, at + 8), 0x0000_0fff);
    // The header (and its next pointer) stays read-only.
    let header = r32(&cs, at);
    w32(&mut cs, at, 0);
    assert_eq!(r32(&cs, at), header);
}

#[test]
fn power_management_accepts_d0_and_d3hot_only() {
    let mut cs = nvme_like();
    let pm = cs.capability_offset(cap_id::POWER_MANAGEMENT).expect("pm");
    assert_eq!(r16(&cs, pm + 2) & 0x7, 3, "PM spec 1.2");
    let pmcsr = pm + 4;
    assert_ne!(r16(&cs, pmcsr) & regs::pm::PMCSR_NO_SOFT_RESET, 0);

    let changes = w16(&mut cs, pmcsr, 3);
    assert_eq!(
        changes,
        vec![ConfigChange::PowerStateChanged {
            old: PowerState::D0,
            new: PowerState::D3Hot
        }]
    );
    assert_eq!(cs.power_state(), PowerState::D3Hot);
    // D1 and D2 are unsupported: the write is discarded.
    assert!(w16(&mut cs, pmcsr, 1).is_empty());
    assert_eq!(cs.power_state(), PowerState::D3Hot);
    w16(&mut cs, pmcsr, 0);
    assert_eq!(cs.power_state(), PowerState::D0);
    assert!(w16(&mut cs, pmcsr, 2).is_empty());
    assert_eq!(cs.power_state(), PowerState::D0);
    assert_ne!(
        r16(&cs, pmcsr) & regs::pm::PMCSR_NO_SOFT_RESET,
        0,
        "RO bit kept"
    );
}

#[test]
fn msix_capability_fields_and_control() {
    let mut cs = nvme_like();
    let at = cs.capability_offset(cap_id::MSIX).expect("msix");
    assert_eq!(r16(&cs, at + 2), 64, "table size is N-1");
    assert_eq!(r32(&cs, at + 4), 0x2000, "table offset, BIR 0");
    assert_eq!(r32(&cs, at + 8), 0x3000, "PBA offset, BIR 0");
    assert_eq!(cs.msix_control(), Some(MsixControl::DISABLED));

    let changes = w16(&mut cs, at + 2, 0xffff);
    assert_eq!(
        changes,
        vec![ConfigChange::MsixControlChanged(
            MsixControl::ENABLED_MASKED
        )]
    );
    assert_eq!(r16(&cs, at + 2), 0xc000 | 64, "table size unchanged");
    let changes = w16(&mut cs, at + 2, 0x8000);
    assert_eq!(
        changes,
        vec![ConfigChange::MsixControlChanged(MsixControl::ENABLED)]
    );
    assert!(
        w16(&mut cs, at + 2, 0x8000).is_empty(),
        "no change, no event"
    );
    // Table/PBA offsets are read-only.
    w32(&mut cs, at + 4, 0xffff_ffff);
    assert_eq!(r32(&cs, at + 4), 0x2000);
}

#[test]
fn pcie_capability_describes_a_gen3_x4_endpoint() {
    let mut cs = nvme_like();
    let at = cs.capability_offset(cap_id::PCI_EXPRESS).expect("pcie");
    let p = |off| at + off;
    assert_eq!(r16(&cs, p(regs::pcie::CAPS)), 0x0002, "version 2, endpoint");
    assert_eq!(r32(&cs, p(regs::pcie::DEVCAP)) & 0x7, 1, "256-byte MPS");
    assert_eq!(r32(&cs, p(regs::pcie::LNKCAP)) & 0x3ff, 0x43, "8 GT/s x4");
    assert_eq!(
        r16(&cs, p(regs::pcie::LNKSTA)) & 0x3ff,
        0x43,
        "trained at 8 GT/s x4"
    );
    assert_eq!(r32(&cs, p(regs::pcie::LNKCAP2)), 0b1110, "2.5, 5, 8 GT/s");
    assert_eq!(r16(&cs, p(regs::pcie::LNKCTL2)) & 0xf, 3, "target speed");

    // DevCtl: MPS/MRRS writable, FLR initiate bit is not.
    w16(&mut cs, p(regs::pcie::DEVCTL), 0xffff);
    assert_eq!(r16(&cs, p(regs::pcie::DEVCTL)), 0x7fff);
    // DevSta error bits: write one to clear (none set); RO bits stay.
    w16(&mut cs, p(regs::pcie::DEVSTA), 0xffff);
    assert_eq!(r16(&cs, p(regs::pcie::DEVSTA)), 0);
    // Link status is read-only.
    w16(&mut cs, p(regs::pcie::LNKSTA), 0);
    assert_eq!(r16(&cs, p(regs::pcie::LNKSTA)) & 0x3ff, 0x43);
    w16(&mut cs, p(regs::pcie::LNKCTL), 0xffff);
    assert_eq!(r16(&cs, p(regs::pcie::LNKCTL)), regs::pcie::LNKCTL_WRITABLE);
    w16(&mut cs, p(regs::pcie::DEVCTL2), 0xffff);
    assert_eq!(r16(&cs, p(regs::pcie::DEVCTL2)), 0x10);

    let gen4x16 = ConfigSpaceBuilder::new(1, 2)
        .pcie(PcieCapSpec {
            link_speed: LinkSpeed::Gen4,
            link_width: 16,
            max_payload_size: 512,
        })
        .build()
        .expect("valid");
    let at = gen4x16
        .capability_offset(cap_id::PCI_EXPRESS)
        .expect("pcie");
    assert_eq!(r32(&gen4x16, at + regs::pcie::LNKCAP) & 0x3ff, 0x104);
    assert_eq!(r32(&gen4x16, at + regs::pcie::DEVCAP) & 0x7, 2);
    assert_eq!(r32(&gen4x16, at + regs::pcie::LNKCAP2), 0b11110);
}

#[test]
fn resizable_bar_capability_and_resize() {
    let mut cs = gpu_like();
    let at = cs
        .ext_capability_offset(ext_cap_id::RESIZABLE_BAR)
        .expect("rebar");
    // Supported: 256 MiB (bit 8), 512 MiB (9), 1 GiB (10), 16 GiB (14).
    let cap = r32(&cs, at + 4);
    assert_eq!(cap, ((1 << 8) | (1 << 9) | (1 << 10) | (1 << 14)) << 4);
    let ctrl = r32(&cs, at + 8);
    assert_eq!(ctrl & 0x7, 2, "BAR index");
    assert_eq!((ctrl >> 5) & 0x7, 1, "one resizable BAR");
    assert_eq!((ctrl >> 8) & 0x3f, 8, "256 MiB now");

    // Place the BAR at 0x30_1000_0000 (256 MiB aligned, not 16 GiB aligned).
    w32(&mut cs, bar_reg(2), 0x1000_0000);
    w32(&mut cs, bar_reg(3), 0x30);
    w16(&mut cs, regs::COMMAND, 0x2);
    assert_eq!(cs.bar_address(2), Some(0x30_1000_0000));

    let changes = w32(&mut cs, at + 8, ctrl & !(0x3f << 8) | (14 << 8));
    assert_eq!(cs.bar_size(2), Some(16 * GIB));
    assert!(changes.contains(&ConfigChange::BarResized {
        index: 2,
        old_size: 256 * MIB,
        new_size: 16 * GIB
    }));
    // Address bits below 16 GiB are gone; the guest re-places the BAR.
    assert!(changes.contains(&ConfigChange::BarMoved {
        index: 2,
        old: Some(0x30_1000_0000),
        new: Some(0x30_0000_0000)
    }));
    w32(&mut cs, bar_reg(2), 0xffff_ffff);
    w32(&mut cs, bar_reg(3), 0xffff_ffff);
    assert_eq!(r32(&cs, bar_reg(2)), 0xc);
    assert_eq!(r32(&cs, bar_reg(3)), 0xffff_fffc, "probe reports 16 GiB");

    // 2 GiB (code 11) is not supported: ignored.
    let changes = w32(&mut cs, at + 8, ctrl & !(0x3f << 8) | (11 << 8));
    assert!(changes.is_empty());
    assert_eq!(cs.bar_size(2), Some(16 * GIB));
    assert_eq!((r32(&cs, at + 8) >> 8) & 0x3f, 14);

    // Reset restores the original size.
    cs.reset();
    assert_eq!(cs.bar_size(2), Some(256 * MIB));
    w32(&mut cs, bar_reg(2), 0xffff_ffff);
    assert_eq!(r32(&cs, bar_reg(2)), 0xf000_000c);
}

#[test]
fn reset_restores_build_state() {
    let mut cs = nvme_like();
    let mut pristine = vec![0u8; 4096];
    cs.read(0, &mut pristine)
        .expect("read all 4096 bytes at once");
    w16(&mut cs, regs::COMMAND, 0x6);
    w32(&mut cs, bar_reg(0), 0xfe00_0000);
    cs.raise_status(status::RECEIVED_MASTER_ABORT);
    cs.reset();
    let mut now = vec![0u8; 4096];
    cs.read(0, &mut now).expect("read");
    assert_eq!(pristine, now);
}

#[test]
fn malformed_accesses_are_errors() {
    let mut cs = nvme_like();
    let mut two = [0u8; 2];
    assert_eq!(
        cs.read(4095, &mut two),
        Err(ConfigError::OutOfRange {
            offset: 4095,
            len: 2
        })
    );
    assert!(cs.read(u64::MAX, &mut two).is_err());
    assert!(cs.read(4096, &mut [0u8; 1]).is_err());
    assert_eq!(cs.read(0, &mut []), Err(ConfigError::Empty));
    assert!(cs.write(u64::MAX - 1, &[1, 2, 3]).is_err());
    assert!(cs.write(4094, &[0; 4]).is_err());
    assert_eq!(cs.write(0, &[]), Err(ConfigError::Empty));
    assert!(cs.write(0, &[0u8; 4097]).is_err());
    assert_eq!(cs.read_u32(4094), None);
    // Unaligned accesses within range are fine (the bus splits them).
    w32(&mut cs, regs::COMMAND + 1, 0);
    assert!(cs.read(3, &mut [0u8; 5]).is_ok());
}

#[test]
fn random_writes_never_panic_and_keep_identity() {
    let mut cs = nvme_like();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let offset = next() % 4200;
        let len = (next() % 9) as usize;
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let _ = cs.write(offset, &data);
        let mut back = vec![0u8; len];
        let _ = cs.read(offset, &mut back);
    }
    assert_eq!(cs.vendor_id(), 0x1b36);
    assert_eq!(cs.device_id(), 0x0010);
    assert_eq!(walk_caps(&cs).len(), 3);
    assert_eq!(walk_ext_caps(&cs).len(), 1);
    assert_eq!(
        r16(&cs, cs.capability_offset(cap_id::MSIX).expect("msix") + 2) & 0x7ff,
        64
    );
    assert!(matches!(
        cs.power_state(),
        PowerState::D0 | PowerState::D3Hot
    ));
}

#[test]
fn builder_rejects_invalid_descriptions() {
    let base = || ConfigSpaceBuilder::new(0x1234, 0x5678);
    let cases: Vec<(&str, ConfigSpaceBuilder)> = vec![
        ("non power of two", base().bar(0, BarSpec::memory32(3000))),
        ("64-bit in BAR5", base().bar(5, BarSpec::memory64(4096))),
        (
            "BAR inside a 64-bit BAR's upper half",
            base()
                .bar(0, BarSpec::memory64(4096))
                .bar(1, BarSpec::memory32(4096)),
        ),
        ("no BAR6", base().bar(6, BarSpec::memory32(4096))),
        (
            "32-bit over 2 GiB",
            base().bar(0, BarSpec::memory32(4 * GIB)),
        ),
        ("I/O too big", base().bar(0, BarSpec::io(512))),
        (
            "prefetchable I/O",
            base().bar(0, BarSpec::io(16).prefetchable()),
        ),
        (
            "MSI-X in a missing BAR",
            base().msix(MsixCapSpec {
                vectors: 4,
                table_bar: 1,
                table_offset: 0,
                pba_bar: 1,
                pba_offset: 0x800,
            }),
        ),
        (
            "MSI-X table beyond BAR",
            base().bar(0, BarSpec::memory32(4096)).msix(MsixCapSpec {
                vectors: 300,
                table_bar: 0,
                table_offset: 0,
                pba_bar: 0,
                pba_offset: 0xff0,
            }),
        ),
        (
            "MSI-X overlapping PBA",
            base().bar(0, BarSpec::memory32(8192)).msix(MsixCapSpec {
                vectors: 16,
                table_bar: 0,
                table_offset: 0,
                pba_bar: 0,
                pba_offset: 0x80,
            }),
        ),
        (
            "MSI-X unaligned offset",
            base().bar(0, BarSpec::memory32(8192)).msix(MsixCapSpec {
                vectors: 1,
                table_bar: 0,
                table_offset: 4,
                pba_bar: 0,
                pba_offset: 0x1000,
            }),
        ),
        (
            "MSI-X zero vectors",
            base().bar(0, BarSpec::memory32(8192)).msix(MsixCapSpec {
                vectors: 0,
                table_bar: 0,
                table_offset: 0,
                pba_bar: 0,
                pba_offset: 0x1000,
            }),
        ),
        (
            "rebar current size unsupported",
            base()
                .bar(0, BarSpec::memory64(256 * MIB))
                .resizable_bar(0, &[512 * MIB]),
        ),
        ("rebar on a missing BAR", base().resizable_bar(2, &[MIB])),
        (
            "rebar size too small",
            base()
                .bar(0, BarSpec::memory64(4096))
                .resizable_bar(0, &[4096]),
        ),
        (
            "link width",
            base().pcie(PcieCapSpec {
                link_width: 3,
                ..PcieCapSpec::default()
            }),
        ),
        ("pin", base().interrupt_pin(5)),
        ("no-device vendor id", ConfigSpaceBuilder::new(0xffff, 0)),
        (
            "ext cap too big",
            base().ext_capability(ExtCapability::read_only(0x0b, 1, vec![0; 4000])),
        ),
    ];
    for (what, builder) in cases {
        assert!(builder.build().is_err(), "{what} should be rejected");
    }
}

#[test]
fn register_names_decode_header_and_capabilities() {
    let cs = nvme_like();
    assert_eq!(cs.register_name(0x04), "COMMAND");
    assert_eq!(cs.register_name(0x19), "BAR2");
    let pm = cs.capability_offset(cap_id::POWER_MANAGEMENT).expect("pm");
    assert_eq!(cs.register_name(pm + 4), "PM.PMCSR");
    let msix = cs.capability_offset(cap_id::MSIX).expect("msix");
    assert_eq!(cs.register_name(msix + 2), "MSIX.CONTROL");
    let pcie = cs.capability_offset(cap_id::PCI_EXPRESS).expect("pcie");
    assert_eq!(cs.register_name(pcie + regs::pcie::DEVCTL), "PCIE.DEVCTL");
    assert_eq!(cs.register_name(0x104), "EXT.DEVICE_SERIAL_NUMBER");
    assert_eq!(cs.register_name(0x200), "EXT.UNUSED");
    assert_eq!(cs.register_name(0xfc), "UNUSED");
    assert_eq!(cs.register_name(usize::MAX), "EXT.UNUSED");
}
