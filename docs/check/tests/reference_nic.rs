//! `docs/reference/nic.md` against p2plab-nic's own definitions: the
//! register map (`Reg::ALL`), the register bits and descriptor
//! offsets (`regs::*`), the descriptor status and ring error codes, the
//! keys of stats.json and the control verbs.
//!
//! Catches: a register, status, ring error or counter added, removed,
//! renamed or moved in the code but not on the page (or the reverse); a
//! bit or descriptor field the page places elsewhere than the code; a
//! verb the server does not parse.

use crate::common;

use std::collections::BTreeSet;

use p2plab_docs::reference::{differences, number, Page};
use p2plab_kit::regs::Width;
use p2plab_nic::descriptor::{RingError, Status};
use p2plab_nic::regs::*;

const PAGE: &str = "reference/nic.md";

fn page() -> Page {
    Page::read(PAGE).unwrap()
}

fn set<T: Ord>(items: impl IntoIterator<Item = T>) -> BTreeSet<T> {
    items.into_iter().collect()
}

fn code_registers() -> BTreeSet<(u64, String, u64)> {
    set(Reg::ALL.iter().map(|reg| {
        let bits = match reg.width() {
            Width::Bits32 => 32,
            Width::Bits64 => 64,
        };
        (reg.offset(), reg.name().to_string(), bits)
    }))
}

fn page_registers(page: &Page) -> BTreeSet<(u64, String, u64)> {
    set(page
        .rows("Registers", &["offset", "name", "width"])
        .unwrap()
        .into_iter()
        .map(|r| (number(&r[0]).unwrap(), r[1].clone(), number(&r[2]).unwrap())))
}

#[test]
fn registers_match_the_register_map() {
    common::assert_none(differences(
        PAGE,
        "register",
        &page_registers(&page()),
        &code_registers(),
    ));
}

/// The named bits of STATUS, CTRL and the interrupt causes, spelled as
/// the C header spells them (`NIC_` + the type's prefix + the bit's name,
/// as `devices/nic/tests/guest_header.rs` checks them against the header).
fn code_bits() -> BTreeSet<(u64, String)> {
    let mut bits = BTreeSet::new();
    let mut add = |prefix: &str, named: Vec<(&str, u32)>| {
        for (name, bit) in named {
            assert_eq!(bit.count_ones(), 1, "{prefix}{name}");
            bits.insert((
                u64::from(bit.trailing_zeros()),
                format!("NIC_{prefix}{name}"),
            ));
        }
    };
    add(
        DeviceStatus::PREFIX,
        DeviceStatus::NAMED
            .iter()
            .map(|&(n, b)| (n, b.raw()))
            .collect(),
    );
    add(
        Ctrl::PREFIX,
        Ctrl::NAMED.iter().map(|&(n, b)| (n, b.raw())).collect(),
    );
    add(
        IntCauses::PREFIX,
        IntCauses::NAMED
            .iter()
            .map(|&(n, b)| (n, b.raw()))
            .collect(),
    );
    bits
}

fn page_bits(page: &Page) -> BTreeSet<(u64, String)> {
    set(page
        .rows("Bits", &["bit", "name"])
        .unwrap()
        .into_iter()
        .map(|r| (number(&r[0]).unwrap(), r[1].clone())))
}

#[test]
fn bits_match_the_constants() {
    common::assert_none(differences(PAGE, "bit", &page_bits(&page()), &code_bits()));
}

#[test]
fn descriptor_layout_matches_the_offsets() {
    let page = page();
    let rows = page
        .rows("Descriptors", &["offset", "size", "field"])
        .unwrap();
    let documented = set(rows
        .iter()
        .filter(|r| r[2] != "reserved")
        .map(|r| (number(&r[0]).unwrap(), r[2].clone())));
    let code = set([
        (DESC_ADDR, "addr"),
        (DESC_LEN, "len"),
        (DESC_FLAGS, "flags"),
        (DESC_STATUS, "status"),
        (DESC_COOKIE, "cookie"),
        (DESC_DONE_LEN, "done_len"),
    ]
    .map(|(at, name)| (at, name.to_string())));
    common::assert_none(differences(PAGE, "descriptor field", &documented, &code));
    // The fields tile the descriptor exactly.
    let mut end = 0;
    for r in &rows {
        assert_eq!(
            number(&r[0]).unwrap(),
            end,
            "{r:?} does not start where the last ended"
        );
        end += number(&r[1]).unwrap();
    }
    assert_eq!(end, DESC_SIZE);
}

#[test]
fn status_and_ring_error_codes_match() {
    let page = page();
    let codes = |heading: &str| {
        set(page
            .rows(heading, &["code", "name"])
            .unwrap()
            .into_iter()
            .map(|r| (number(&r[0]).unwrap(), r[1].clone())))
    };
    let status = set(Status::ALL
        .iter()
        .map(|s| (u64::from(s.code()), s.name().to_string())));
    let errors = set(RingError::ALL
        .iter()
        .map(|e| (u64::from(e.code()), e.name().to_string())));
    let mut problems = differences(
        PAGE,
        "descriptor status",
        &codes("Descriptor status"),
        &status,
    );
    problems.extend(differences(
        PAGE,
        "ring error",
        &codes("Ring errors"),
        &errors,
    ));
    common::assert_none(problems);
}

/// The keys of the device's own part of stats.json, from a real model's
/// `DeviceControl::counters` (the server binary adds the DMA-path keys).
fn code_stats_keys() -> BTreeSet<String> {
    let memory = std::sync::Arc::new(p2plab_dma::testing::FakeGuestMemory::new());
    let irq = std::sync::Arc::new(p2plab_kit::testing::RecordingInterrupts::default());
    let nic = p2plab_nic::Nic::new(p2plab_nic::Wire::loopback(), DEFAULT_MTU, memory, irq).unwrap();
    let json = p2plab_kit::DeviceControl::counters(&nic.control());
    json.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn stats_keys_match_the_snapshot() {
    common::assert_none(common::stats_key_problems(&page(), &code_stats_keys(), 16));
}

#[test]
fn control_verbs_match_the_control_requests() {
    common::assert_none(common::control_verb_problems(&page(), "Control verbs"));
}

/// Each kind of drift, made on purpose in a copy of the page, is caught.
#[test]
fn the_checks_catch_drift_on_the_page() {
    let text = page().text;
    let edited = |from: &str, to: &str| {
        assert!(text.contains(from), "{from:?} not on the page");
        Page::parse(PAGE, text.replacen(from, to, 1))
    };
    let moved = edited(
        "| `0x050` | `RX_DOORBELL` | 32 |",
        "| `0x058` | `RX_DOORBELL` | 32 |",
    );
    assert_eq!(
        differences(PAGE, "r", &page_registers(&moved), &code_registers()).len(),
        2
    );
    let bit = edited(
        "| 6 | `NIC_STATUS_TX_BUSY` |",
        "| 8 | `NIC_STATUS_TX_BUSY` |",
    );
    assert_eq!(
        differences(PAGE, "b", &page_bits(&bit), &code_bits()).len(),
        2
    );
    let gone = edited(
        "| `rx_truncated` | frames longer than the RX buffer they landed in |\n",
        "",
    );
    let keys = set(gone
        .rows("stats.json", &["key"])
        .unwrap()
        .into_iter()
        .map(|r| r[0].clone()));
    assert_eq!(differences(PAGE, "k", &keys, &code_stats_keys()).len(), 1);
}
