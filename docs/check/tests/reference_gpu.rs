//! `docs/reference/gpu.md` against p2plab-gpu's own tables, both ways: the
//! register map (`Reg::ALL`), the named bits, the ring entry and
//! completion record layouts, the opcode table, the status codes, the
//! keys of stats.json and the control verbs.
//!
//! Catches: a register, bit, field, opcode, status code or counter added,
//! removed, renamed, moved or renumbered in the code but not on the page
//! (or the reverse); a register whose width or access changed; an opcode
//! whose operands changed; a verb the server does not parse.

use crate::common;

use std::collections::BTreeSet;

use p2plab_docs::reference::{differences, number, Page};
use p2plab_gpu::command::{Command, CommandFlags, Completion, FieldSpan};
use p2plab_gpu::engine::opcodes::{Operand, OPCODES};
use p2plab_gpu::regs::{Access, IntCauses, Reg, RingCtrl, Status, Width};
use p2plab_gpu::status::StatusCode;

const PAGE: &str = "reference/gpu.md";

fn page() -> Page {
    Page::read(PAGE).unwrap()
}

fn set<T: Ord>(items: impl IntoIterator<Item = T>) -> BTreeSet<T> {
    items.into_iter().collect()
}

type Register = (u64, String, u64, String);

fn code_registers() -> BTreeSet<Register> {
    set(Reg::ALL.iter().map(|r| {
        let width = match r.width() {
            Width::Bits32 => 32,
            Width::Bits64 => 64,
        };
        let access = match r.access() {
            Access::ReadOnly => "RO",
            Access::ReadWrite => "RW",
            Access::ReadWrite1Clear => "RW1C",
            Access::WriteOnly => "WO",
        };
        (r.offset(), r.name().to_string(), width, access.to_string())
    }))
}

fn page_registers(page: &Page) -> BTreeSet<Register> {
    set(page
        .rows("Registers", &["offset", "name", "width", "access"])
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                number(&r[0]).unwrap(),
                r[1].clone(),
                number(&r[2]).unwrap(),
                r[3].clone(),
            )
        }))
}

#[test]
fn registers_match_the_register_map() {
    let page = page();
    common::assert_none(differences(
        PAGE,
        "register",
        &page_registers(&page),
        &code_registers(),
    ));
}

fn code_bits() -> BTreeSet<(u64, String)> {
    fn named<T: Copy>(
        prefix: &str,
        named: &[(&str, T)],
        raw: impl Fn(T) -> u32,
    ) -> Vec<(u64, String)> {
        named
            .iter()
            .map(|&(name, bit)| {
                (
                    u64::from(raw(bit).trailing_zeros()),
                    format!("{prefix}{name}"),
                )
            })
            .collect()
    }
    let mut out = BTreeSet::new();
    out.extend(named(Status::PREFIX, Status::NAMED, |b| b.raw()));
    out.extend(named(RingCtrl::PREFIX, RingCtrl::NAMED, |b| b.raw()));
    out.extend(named(IntCauses::PREFIX, IntCauses::NAMED, |b| b.raw()));
    out.extend(named(CommandFlags::PREFIX, CommandFlags::NAMED, |b| {
        u32::from(b.raw())
    }));
    out
}

fn page_bits(page: &Page) -> BTreeSet<(u64, String)> {
    set(page
        .rows("Bits", &["bit", "name"])
        .unwrap()
        .into_iter()
        .map(|r| (number(&r[0]).unwrap(), r[1].clone())))
}

#[test]
fn bits_match_the_named_bits() {
    common::assert_none(differences(PAGE, "bit", &page_bits(&page()), &code_bits()));
}

fn fields(page: &Page, heading: &str) -> BTreeSet<(u64, u64, String)> {
    set(page
        .rows(heading, &["offset", "size", "field"])
        .unwrap()
        .into_iter()
        .map(|r| (number(&r[0]).unwrap(), number(&r[1]).unwrap(), r[2].clone())))
}

fn code_fields(spans: &[FieldSpan]) -> BTreeSet<(u64, u64, String)> {
    set(spans
        .iter()
        .map(|f| (f.offset as u64, f.size as u64, f.name.to_string())))
}

#[test]
fn ring_entry_and_completion_match_their_layouts() {
    let page = page();
    let mut problems = differences(
        PAGE,
        "ring entry field",
        &fields(&page, "Ring entry"),
        &code_fields(&Command::FIELDS),
    );
    problems.extend(differences(
        PAGE,
        "completion field",
        &fields(&page, "Completion record"),
        &code_fields(&Completion::FIELDS),
    ));
    common::assert_none(problems);
}

fn operand(o: Operand) -> &'static str {
    match o {
        Operand::Unused => "-",
        Operand::VramOffset => "VRAM offset",
        Operand::BusAddress => "bus address",
    }
}

type Opcode = (u64, String, String, String);

fn page_opcodes(page: &Page) -> BTreeSet<Opcode> {
    set(page
        .rows("Opcodes", &["opcode", "name", "src", "dst"])
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                number(&r[0]).unwrap(),
                r[1].clone(),
                r[2].clone(),
                r[3].clone(),
            )
        }))
}

fn code_opcodes() -> BTreeSet<Opcode> {
    set(OPCODES.iter().map(|o| {
        (
            u64::from(o.opcode),
            o.name.to_string(),
            operand(o.src).to_string(),
            operand(o.dst).to_string(),
        )
    }))
}

#[test]
fn opcodes_match_the_opcode_table() {
    common::assert_none(differences(
        PAGE,
        "opcode",
        &page_opcodes(&page()),
        &code_opcodes(),
    ));
}

#[test]
fn status_codes_match() {
    let page = page();
    let documented = set(page
        .rows("Status codes", &["code", "name"])
        .unwrap()
        .into_iter()
        .map(|r| (number(&r[0]).unwrap(), r[1].clone())));
    let code = set(StatusCode::ALL
        .iter()
        .map(|s| (u64::from(s.code()), s.name().to_string())));
    common::assert_none(differences(PAGE, "status code", &documented, &code));
}

/// The keys of the device's own part of stats.json, from a real model's
/// `DeviceControl::counters` (the server binary adds the DMA-path keys).
fn code_stats_keys() -> BTreeSet<String> {
    let memory = std::sync::Arc::new(p2plab_dma::testing::FakeGuestMemory::new());
    let irq = std::sync::Arc::new(p2plab_kit::testing::RecordingInterrupts::default());
    let gpu = p2plab_gpu::Gpu::new(p2plab_gpu::Vram::new(256 << 20).unwrap(), memory, irq).unwrap();
    let json = p2plab_kit::DeviceControl::counters(&gpu.control());
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
    let access = edited(
        "| `0x038` | `DOORBELL` | 32 | WO |",
        "| `0x038` | `DOORBELL` | 32 | RW |",
    );
    assert_eq!(
        differences(PAGE, "r", &page_registers(&access), &code_registers()).len(),
        2
    );
    let bit = edited("| 3 | `STATUS_HALTED` |", "| 5 | `STATUS_HALTED` |");
    assert_eq!(
        differences(PAGE, "b", &page_bits(&bit), &code_bits()).len(),
        2
    );
    let field = edited("| `0x20` | 8 | `len` |", "| `0x20` | 4 | `len` |");
    assert_eq!(
        differences(
            PAGE,
            "f",
            &fields(&field, "Ring entry"),
            &code_fields(&Command::FIELDS)
        )
        .len(),
        2
    );
    let op = edited(
        "| `0x05` | `CHECKSUM` | VRAM offset | - |",
        "| `0x05` | `CHECKSUM` | bus address | - |",
    );
    assert_eq!(
        differences(PAGE, "o", &page_opcodes(&op), &code_opcodes()).len(),
        2
    );
    let extra = edited(
        "| `bytes_filled` |",
        "| `bytes_zeroed` | made up |\n| `bytes_filled` |",
    );
    let keys = set(extra
        .rows("stats.json", &["key"])
        .unwrap()
        .into_iter()
        .map(|r| r[0].clone()));
    assert_eq!(differences(PAGE, "k", &keys, &code_stats_keys()).len(), 1);
}
