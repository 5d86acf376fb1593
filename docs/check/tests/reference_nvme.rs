//! `docs/reference/nvme.md` against p2plab-nvme's own tables, both ways:
//! the registers (`Reg::ALL`), the admin and I/O command tables (names and
//! fault names), the keys of stats.json (`StatsSnapshot` and its parts)
//! and the control verbs.
//!
//! Catches: a register, command or counter added, removed, renamed or
//! moved in the code but not on the page (or the reverse); a register
//! whose width changed; a verb the page lists that the server does not
//! parse; a DMA key naming a path the transport does not have.

use crate::common;

use std::collections::BTreeSet;

use p2plab_docs::reference::{differences, json_keys, number, Page};
use p2plab_kit::regs::Width;
use p2plab_nvme::registers::{register_name, Reg, DOORBELLS};
use p2plab_nvme::stats::{
    CmbSnapshot, ControllerSnapshot, Counters, HostMemorySnapshot, NamespaceSnapshot, PmrSnapshot,
    QueueSnapshot, StatsSnapshot,
};

const PAGE: &str = "reference/nvme.md";

fn page() -> Page {
    Page::read(PAGE).unwrap()
}

/// (offset, name, width) of every register in the register map (`Reg`,
/// declared with p2plab-kit's `registers!`), plus the doorbells as one row
/// at their start, named as `register_name` names them.
fn code_registers() -> BTreeSet<(u64, String, u64)> {
    let mut out: BTreeSet<(u64, String, u64)> = Reg::ALL
        .iter()
        .map(|reg| {
            let bits = match reg.width() {
                Width::Bits32 => 32,
                Width::Bits64 => 64,
            };
            (reg.offset(), reg.name().to_string(), bits)
        })
        .collect();
    out.insert((DOORBELLS, register_name(DOORBELLS).into_owned(), 32));
    out
}

fn page_registers(page: &Page) -> BTreeSet<(u64, String, u64)> {
    page.rows("Registers", &["offset", "name", "width"])
        .unwrap()
        .into_iter()
        .map(|r| (number(&r[0]).unwrap(), r[1].clone(), number(&r[2]).unwrap()))
        .collect()
}

#[test]
fn registers_match_the_register_map() {
    let page = page();
    let code = code_registers();
    assert!(code.len() > 20, "{code:?}");
    common::assert_none(differences(PAGE, "register", &page_registers(&page), &code));
}

fn commands(page: &Page, heading: &str) -> BTreeSet<(u8, String)> {
    page.rows(heading, &["opcode", "name"])
        .unwrap()
        .into_iter()
        .map(|r| (u8::try_from(number(&r[0]).unwrap()).unwrap(), r[1].clone()))
        .collect()
}

fn code_commands(list: Vec<(u8, &'static str)>) -> BTreeSet<(u8, String)> {
    list.into_iter().map(|(o, n)| (o, n.to_string())).collect()
}

#[test]
fn commands_match_the_command_tables() {
    let page = page();
    let admin = code_commands(p2plab_nvme::admin_commands());
    let io = code_commands(p2plab_nvme::io_commands());
    assert!(admin.len() >= 10 && io.len() >= 5);
    let mut problems = differences(
        PAGE,
        "admin command",
        &commands(&page, "Admin commands"),
        &admin,
    );
    problems.extend(differences(
        PAGE,
        "I/O command",
        &commands(&page, "I/O commands"),
        &io,
    ));
    common::assert_none(problems);
}

fn fault_names(page: &Page, heading: &str) -> BTreeSet<(u8, String)> {
    page.rows(heading, &["opcode", "fault name"])
        .unwrap()
        .into_iter()
        .map(|r| (u8::try_from(number(&r[0]).unwrap()).unwrap(), r[1].clone()))
        .collect()
}

/// Catches: a command whose name in fault specs (`opcode=`,
/// `admin-opcode=`, each row's `fault_name`) differs from the one the page
/// tells users to type.
#[test]
fn fault_names_match_the_command_tables() {
    let page = page();
    let admin = code_commands(p2plab_nvme::admin_fault_names());
    let io = code_commands(p2plab_nvme::io_fault_names());
    assert!(admin.len() >= 10 && io.len() >= 5);
    let mut problems = differences(
        PAGE,
        "admin fault name",
        &fault_names(&page, "Admin commands"),
        &admin,
    );
    problems.extend(differences(
        PAGE,
        "I/O fault name",
        &fault_names(&page, "I/O commands"),
        &io,
    ));
    common::assert_none(problems);
}

/// Every key of the stats snapshot. The struct literals name every field
/// (no `..Default::default()`), so a new field does not compile until it
/// is here, and then the page must list it.
fn code_stats_keys() -> BTreeSet<String> {
    let snapshot = StatsSnapshot {
        uptime_ms: 0,
        controller: ControllerSnapshot::default(),
        cmb: CmbSnapshot::default(),
        pmr: PmrSnapshot::default(),
        host: HostMemorySnapshot::default(),
        queues: vec![QueueSnapshot {
            sqid: 1,
            cqid: 1,
            entries: 64,
            base: 0,
            in_cmb: true,
            cq_in_cmb: false,
            fetched: 0,
        }],
        namespaces: vec![NamespaceSnapshot {
            nsid: 1,
            block_size: 512,
            blocks: 8,
            backing: String::new(),
            read_commands: 0,
            write_commands: 0,
            bytes_read: 0,
            bytes_written: 0,
        }],
        counters: Counters::default(),
    };
    json_keys(&serde_json::to_value(&snapshot).unwrap())
}

#[test]
fn stats_keys_match_the_snapshot() {
    common::assert_none(common::stats_key_problems(&page(), &code_stats_keys(), 81));
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
    let moved = edited("| `0x014` | `CC` | 32 |", "| `0x018` | `CC` | 32 |");
    assert_eq!(
        differences(PAGE, "register", &page_registers(&moved), &code_registers()).len(),
        2
    );
    let narrowed = edited("| `0x028` | `ASQ` | 64 |", "| `0x028` | `ASQ` | 32 |");
    assert_eq!(
        differences(
            PAGE,
            "register",
            &page_registers(&narrowed),
            &code_registers()
        )
        .len(),
        2
    );
    let renamed = edited("| `0x06` | Identify |", "| `0x06` | Identity |");
    let admin = code_commands(p2plab_nvme::admin_commands());
    assert_eq!(
        differences(PAGE, "admin", &commands(&renamed, "Admin commands"), &admin).len(),
        2
    );
    let dropped = edited("| `counters.dsm_commands` | Dataset Management |\n", "");
    let keys: BTreeSet<String> = dropped
        .rows("stats.json", &["key"])
        .unwrap()
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    assert_eq!(
        differences(PAGE, "stats key", &keys, &code_stats_keys()).len(),
        1
    );
    let verb = edited(r#"`{"cmd":"clear"}`"#, r#"`{"cmd":"clean"}`"#);
    assert_eq!(
        common::control_verb_problems(&verb, "Control verbs").len(),
        1
    );
    let dma = edited("`dma.dma_local_read_bytes`", "`dma.dma_remote_read_bytes`");
    assert_eq!(
        common::dma_key_problems(&dma, "Added by the server binary").len(),
        1
    );
}
