//! `docs/reference/efa.md` against p2plab-efa's own definitions: the
//! register map (`Reg::ALL`), the register bits, the admin opcodes and
//! statuses, the feature IDs, the completion statuses, the AENQ groups and
//! link syndromes, the keys of stats.json and the control verbs.
//!
//! Catches: a register, bit, opcode, status, feature, group or counter
//! added, removed, renamed or renumbered in the code but not on the page
//! (or the reverse); a verb the server does not parse.

use crate::common;

use std::collections::BTreeSet;

use p2plab_docs::reference::{differences, number, Page};
use p2plab_efa::defs::{AdminOpcode, AdminStatus, AenqGroup, FeatureId, IoStatus, LinkSyndrome};
use p2plab_efa::regs::*;

const PAGE: &str = "reference/efa.md";

fn page() -> Page {
    Page::read(PAGE).unwrap()
}

fn set<T: Ord>(items: impl IntoIterator<Item = T>) -> BTreeSet<T> {
    items.into_iter().collect()
}

fn code_registers() -> BTreeSet<(u64, String, u64)> {
    set(Reg::ALL
        .iter()
        .map(|reg| (reg.offset(), reg.name().to_string(), 32)))
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

/// The named bits of DEV_STS, DEV_CTL and INTR_MASK, spelled as
/// `efa_regs_defs.h` spells them after `EFA_REGS_` (without `_MASK`).
fn code_bits() -> BTreeSet<(u64, String)> {
    let mut bits = BTreeSet::new();
    let mut add = |prefix: &str, named: Vec<(&str, u32)>| {
        for (name, bit) in named {
            assert_eq!(bit.count_ones(), 1, "{prefix}{name}");
            bits.insert((u64::from(bit.trailing_zeros()), format!("{prefix}{name}")));
        }
    };
    add(
        DevSts::PREFIX,
        DevSts::NAMED.iter().map(|&(n, b)| (n, b.raw())).collect(),
    );
    add(
        DevCtl::PREFIX,
        DevCtl::NAMED.iter().map(|&(n, b)| (n, b.raw())).collect(),
    );
    add(
        IntrMask::PREFIX,
        IntrMask::NAMED.iter().map(|&(n, b)| (n, b.raw())).collect(),
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

/// A page table of codes (`first` column and `name`).
fn page_codes(page: &Page, heading: &str, first: &str) -> BTreeSet<(u64, String)> {
    set(page
        .rows(heading, &[first, "name"])
        .unwrap()
        .into_iter()
        .map(|r| (number(&r[0]).unwrap(), r[1].clone())))
}

macro_rules! code_table {
    ($ty:ty) => {
        set(<$ty>::ALL
            .iter()
            .map(|c| (u64::from(c.code()), c.name().to_string())))
    };
}

#[test]
fn code_tables_match_the_definitions() {
    let page = page();
    let mut problems = Vec::new();
    let mut check = |what: &str, heading: &str, first: &str, code: BTreeSet<(u64, String)>| {
        problems.extend(differences(
            PAGE,
            what,
            &page_codes(&page, heading, first),
            &code,
        ));
    };
    check(
        "admin opcode",
        "Admin commands",
        "opcode",
        code_table!(AdminOpcode),
    );
    check(
        "admin status",
        "Admin statuses",
        "code",
        code_table!(AdminStatus),
    );
    check("feature", "Features", "id", code_table!(FeatureId));
    check(
        "completion status",
        "Completion statuses",
        "code",
        code_table!(IoStatus),
    );
    check("AENQ group", "AENQ", "group", code_table!(AenqGroup));
    check(
        "link syndrome",
        "Link syndromes",
        "syndrome",
        set(LinkSyndrome::ALL.iter().map(|c| {
            (
                u64::from(c.code()),
                format!("{}{}", LinkSyndrome::PREFIX, c.name()),
            )
        })),
    );
    common::assert_none(problems);
}

/// The keys of the device's own part of stats.json, from a real model's
/// `DeviceControl::counters` (the server binary adds the DMA-path keys).
fn code_stats_keys() -> BTreeSet<String> {
    let memory = std::sync::Arc::new(p2plab_dma::testing::FakeGuestMemory::new());
    let irq = std::sync::Arc::new(p2plab_kit::testing::RecordingInterrupts::default());
    let attrs = p2plab_efa::DeviceAttrs::default();
    let llq = std::sync::Arc::new(p2plab_dma::HeapRegion::new(attrs.llq_bar_size() as usize));
    let efa = p2plab_efa::Efa::new(
        attrs,
        p2plab_efa::EfaOptions { keep_alive: None },
        memory,
        llq,
        std::sync::Arc::new(p2plab_efa::NoLink::default()),
        irq,
    )
    .unwrap();
    let json = p2plab_kit::DeviceControl::counters(&efa.control());
    json.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn stats_keys_match_the_snapshot() {
    common::assert_none(common::stats_key_problems(&page(), &code_stats_keys(), 51));
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
    let moved = edited("| `0x68` | `EQ_DB` | 32 |", "| `0x6c` | `EQ_DB` | 32 |");
    assert_eq!(
        differences(PAGE, "r", &page_registers(&moved), &code_registers()).len(),
        2
    );
    let bit = edited(
        "| 3 | `DEV_STS_RESET_IN_PROGRESS` |",
        "| 4 | `DEV_STS_RESET_IN_PROGRESS` |",
    );
    assert_eq!(
        differences(PAGE, "b", &page_bits(&bit), &code_bits()).len(),
        2
    );
    let opcode = edited("| 7 | `REG_MR` |", "| 8 | `REG_MR` |");
    assert_eq!(
        differences(
            PAGE,
            "o",
            &page_codes(&opcode, "Admin commands", "opcode"),
            &code_table!(AdminOpcode)
        )
        .len(),
        2
    );
    let gone = edited(
        "| `duplicates` | duplicate packets recognised and acknowledged again |\n",
        "",
    );
    let keys = set(gone
        .rows("stats.json", &["key"])
        .unwrap()
        .into_iter()
        .map(|r| r[0].clone()));
    assert_eq!(differences(PAGE, "k", &keys, &code_stats_keys()).len(), 1);
}
