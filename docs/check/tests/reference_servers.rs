//! `docs/reference/servers.md` against p2plab-server: the common flags
//! (`ServerArgs`), the control verbs (`ControlRequest`) and the keys of
//! the `process` object (`usage::process_usage`), both ways.
//!
//! Catches: a flag every server takes added, removed or renamed without
//! the page following (or the reverse); a verb or request the server does
//! not parse; a `process` key renamed or added.

use crate::common;

use std::collections::BTreeSet;

use clap::Args;
use p2plab_docs::reference::{differences, Page};
use p2plab_server::ServerArgs;

const PAGE: &str = "reference/servers.md";

fn page() -> Page {
    Page::read(PAGE).unwrap()
}

fn column(page: &Page, heading: &str, name: &str) -> BTreeSet<String> {
    page.rows(heading, &[name])
        .unwrap()
        .into_iter()
        .map(|r| r[0].clone())
        .collect()
}

fn code_flags() -> BTreeSet<String> {
    ServerArgs::augment_args(clap::Command::new("server"))
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|long| format!("--{long}"))
        .collect()
}

#[test]
fn common_flags_match_server_args() {
    let code = code_flags();
    assert!(code.len() > 10, "{code:?}");
    common::assert_none(differences(
        PAGE,
        "flag",
        &column(&page(), "Common flags", "flag"),
        &code,
    ));
}

#[test]
fn control_verbs_match_the_control_requests() {
    common::assert_none(common::control_verb_problems(&page(), "Verbs"));
}

fn code_process_keys() -> BTreeSet<String> {
    p2plab_server::usage::process_usage()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

#[test]
fn process_keys_match_process_usage() {
    common::assert_none(differences(
        PAGE,
        "process key",
        &column(&page(), "process", "key"),
        &code_process_keys(),
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
    let flag = edited("| `--log-file` |", "| `--logfile` |");
    assert_eq!(
        differences(
            PAGE,
            "f",
            &column(&flag, "Common flags", "flag"),
            &code_flags()
        )
        .len(),
        2
    );
    let wrong = edited(
        r#"| `reset` | `{"cmd":"reset"}` |"#,
        r#"| `reset` | `{"cmd":"clear"}` |"#,
    );
    let problems = common::control_verb_problems(&wrong, "Verbs");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("is a clear request"), "{problems:?}");
    let missing = edited("| `max_rss_kib` | peak resident memory |\n", "");
    assert_eq!(
        differences(
            PAGE,
            "p",
            &column(&missing, "process", "key"),
            &code_process_keys()
        )
        .len(),
        1
    );
}
