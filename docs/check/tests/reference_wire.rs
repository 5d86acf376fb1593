//! `docs/reference/wire.md` against p2plab-wire's own definitions: the
//! frame header (`field::ALL`) and the counters
//! (`WireStatsSnapshot::NAMES`).
//!
//! Catches: a header field added, removed, renamed, moved or resized in
//! the code but not on the page (or the reverse), a header on the page
//! that does not tile 64 bytes, and a wire counter missing from the page
//! or gone from the code.

use crate::common;

use std::collections::BTreeSet;

use p2plab_docs::reference::{differences, number, Page};
use p2plab_wire::frame::{field, HEADER_LEN};
use p2plab_wire::WireStatsSnapshot;

const PAGE: &str = "reference/wire.md";

fn page() -> Page {
    Page::read(PAGE).unwrap()
}

fn page_fields(page: &Page) -> BTreeSet<(u64, u64, String)> {
    page.rows("Frame header", &["offset", "size", "field"])
        .unwrap()
        .into_iter()
        .map(|r| (number(&r[0]).unwrap(), number(&r[1]).unwrap(), r[2].clone()))
        .collect()
}

fn code_fields() -> BTreeSet<(u64, u64, String)> {
    field::ALL
        .iter()
        .map(|f| (f.offset as u64, f.len as u64, f.name.to_string()))
        .collect()
}

fn page_counters(page: &Page) -> BTreeSet<String> {
    page.rows("Counters", &["counter"])
        .unwrap()
        .into_iter()
        .map(|r| r[0].clone())
        .collect()
}

fn code_counters() -> BTreeSet<String> {
    WireStatsSnapshot::NAMES
        .iter()
        .map(|n| n.to_string())
        .collect()
}

#[test]
fn the_header_table_matches_the_fields() {
    let page = page();
    common::assert_none(differences(
        PAGE,
        "header field",
        &page_fields(&page),
        &code_fields(),
    ));
    let mut end = 0;
    for (offset, size, name) in page_fields(&page) {
        assert_eq!(
            offset, end,
            "{name} does not start where the last field ended"
        );
        end += size;
    }
    assert_eq!(end, HEADER_LEN as u64);
}

#[test]
fn the_counters_match_the_snapshot() {
    common::assert_none(differences(
        PAGE,
        "wire counter",
        &page_counters(&page()),
        &code_counters(),
    ));
}

/// Each kind of drift, made on purpose in a copy of the page, is caught.
#[test]
fn the_checks_catch_drift_on_the_page() {
    let text = page().text;
    let edited = |from: &str, to: &str| {
        assert!(text.contains(from), "{from:?} not on the page");
        Page::parse(PAGE, text.replacen(from, to, 1))
    };
    let moved = edited("| `0x10` | 4 | `seq` |", "| `0x10` | 2 | `seq` |");
    assert_eq!(
        differences(PAGE, "f", &page_fields(&moved), &code_fields()).len(),
        2
    );
    let gone = edited("| `out_of_order` |", "| `out_of_order_frames` |");
    assert_eq!(
        differences(PAGE, "c", &page_counters(&gone), &code_counters()).len(),
        2
    );
}
