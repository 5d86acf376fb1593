//! The guest driver's C view of the NIC (`guest-driver/p2plab_nic_hw.h`)
//! against the device's own definitions, both ways.
//!
//! Catches: a register, bit, status or error code added, removed, renamed
//! or renumbered on one side only; a descriptor field moved in C.

use std::collections::BTreeMap;

use p2plab_nic::descriptor::{RingError, Status};
use p2plab_nic::regs::*;

const HW_H: &str = include_str!("../guest-driver/p2plab_nic_hw.h");

fn rust_defines() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut add = |name: &str, value: u64| {
        assert!(
            out.insert(name.to_string(), value).is_none(),
            "{name} twice"
        );
    };
    for (name, value) in [
        ("P2PLAB_NIC_VENDOR_ID", DEFAULT_IDS.vendor_id.into()),
        ("P2PLAB_NIC_DEVICE_ID", DEFAULT_IDS.device_id.into()),
        ("P2PLAB_NIC_REGS_BAR", REGS_BAR.into()),
        ("P2PLAB_NIC_REGS_BAR_SIZE", REGS_BAR_SIZE),
        ("P2PLAB_NIC_MSIX_BAR", MSIX.bar.into()),
        ("P2PLAB_NIC_ID_MAGIC", ID_MAGIC.into()),
        ("P2PLAB_NIC_VERSION_MAJOR", VERSION_MAJOR.into()),
        ("P2PLAB_NIC_MIN_RING_ENTRIES", MIN_RING_ENTRIES.into()),
        ("P2PLAB_NIC_MAX_RING_ENTRIES", MAX_RING_ENTRIES.into()),
        ("P2PLAB_NIC_MAX_MTU", MAX_MTU.into()),
        ("NIC_INT_ALL", IntCauses::ALL.raw().into()),
        ("NIC_DESC_SIZE", DESC_SIZE),
    ] {
        add(name, value);
    }
    for reg in Reg::ALL {
        add(&format!("NIC_REG_{}", reg.name()), reg.offset());
    }
    let bits = [
        (
            DeviceStatus::PREFIX,
            DeviceStatus::NAMED
                .iter()
                .map(|(n, b)| (*n, u64::from(b.raw())))
                .collect::<Vec<_>>(),
        ),
        (
            Ctrl::PREFIX,
            Ctrl::NAMED
                .iter()
                .map(|(n, b)| (*n, u64::from(b.raw())))
                .collect(),
        ),
        (
            IntCauses::PREFIX,
            IntCauses::NAMED
                .iter()
                .map(|(n, b)| (*n, u64::from(b.raw())))
                .collect(),
        ),
        (
            DescFlags::PREFIX,
            DescFlags::NAMED
                .iter()
                .map(|(n, b)| (*n, u64::from(b.raw())))
                .collect(),
        ),
    ];
    for (prefix, named) in bits {
        for (name, value) in named {
            add(&format!("NIC_{prefix}{name}"), value);
        }
    }
    for status in Status::ALL {
        add(
            &format!("NIC_DESC_STATUS_{}", status.name()),
            status.code().into(),
        );
    }
    for error in RingError::ALL {
        add(&format!("NIC_ERR_{}", error.name()), error.code().into());
    }
    out
}

/// `#define NAME VALUE` lines with a numeric value (include guards and
/// other value-less defines left out).
fn c_defines(header: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in header.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        let value = value.trim_end_matches(['u', 'U', 'l', 'L']);
        let parsed = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => value.parse(),
        };
        let parsed = parsed.unwrap_or_else(|_| panic!("{name}: {value:?} is not a number"));
        assert!(
            out.insert(name.to_string(), parsed).is_none(),
            "{name} twice in C"
        );
    }
    out
}

fn compare(c: &BTreeMap<String, u64>, rust: &BTreeMap<String, u64>) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, value) in rust {
        match c.get(name) {
            None => problems.push(format!("{name} missing in C")),
            Some(v) if v != value => problems.push(format!("{name}: C {v:#x}, Rust {value:#x}")),
            Some(_) => {}
        }
    }
    for name in c.keys() {
        if !rust.contains_key(name) {
            problems.push(format!("{name} only in C"));
        }
    }
    problems
}

#[test]
fn header_matches_the_device() {
    let problems = compare(&c_defines(HW_H), &rust_defines());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The descriptor struct's fields, in order, at the offsets the device
/// reads (each field's size from its C type).
#[test]
fn descriptor_struct_matches_the_offsets() {
    let body = HW_H
        .split("struct p2plab_nic_desc {")
        .nth(1)
        .and_then(|rest| rest.split("};").next())
        .expect("struct p2plab_nic_desc in the header");
    let mut offset = 0u64;
    let mut fields = BTreeMap::new();
    for line in body.lines() {
        let decl = line.split(';').next().unwrap_or("").trim();
        let mut words = decl.split_whitespace();
        let (Some(ty), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        let size = match ty {
            "__le64" => 8,
            "__le32" => 4,
            "__le16" => 2,
            other => panic!("unexpected type {other}"),
        };
        assert_eq!(offset % size, 0, "{name} unaligned");
        fields.insert(name.to_string(), offset);
        offset += size;
    }
    assert_eq!(offset, DESC_SIZE);
    for (name, at) in [
        ("addr", DESC_ADDR),
        ("len", DESC_LEN),
        ("flags", DESC_FLAGS),
        ("status", DESC_STATUS),
        ("cookie", DESC_COOKIE),
        ("done_len", DESC_DONE_LEN),
    ] {
        assert_eq!(fields.get(name), Some(&at), "{name}");
    }
}

/// Shows the comparison can fail: a renumbered, a missing and an extra
/// define are all reported.
#[test]
fn the_comparison_catches_drift() {
    let rust = rust_defines();
    let mut c = c_defines(HW_H);
    c.insert("NIC_REG_CTRL".into(), 0x44);
    c.remove("NIC_DESC_STATUS_BAD_FCS");
    c.insert("NIC_REG_BOGUS".into(), 0x80);
    let problems = compare(&c, &rust);
    assert_eq!(problems.len(), 3, "{problems:?}");
}
