//! The benchmark tables in `docs/` are what their `results.json` gives
//! (`p2plab_docs::bench`): nobody edits a figure by hand.
//!
//! Catches: a table cell edited by hand, a results file replaced without
//! regenerating the page, a marker naming a file that is gone, and a
//! results file in `guest-tests/bench/` that no page shows.

use std::collections::BTreeSet;

use p2plab_docs::{bench, pages, repo::Repo};

fn read_json(repo: &Repo) -> impl Fn(&str) -> anyhow::Result<String> + '_ {
    |path| Ok(std::fs::read_to_string(repo.root().join(path))?)
}

#[test]
fn generated_tables_match_their_json() {
    let repo = Repo::this().unwrap();
    let mut problems = Vec::new();
    let mut shown = BTreeSet::new();
    for page in pages(repo.root()).unwrap() {
        let text = std::fs::read_to_string(repo.root().join(&page)).unwrap();
        for region in bench::regions(&text).unwrap() {
            shown.insert(region.json.clone());
        }
        let regenerated = bench::regenerate(&text, read_json(&repo))
            .unwrap_or_else(|e| panic!("{}: {e:#}", page.display()));
        if regenerated != text {
            let line = text
                .lines()
                .zip(regenerated.lines())
                .position(|(a, b)| a != b)
                .map_or(0, |i| i + 1);
            problems.push(format!(
                "{}: the benchmark tables differ from their JSON from line {line} on; \
                 run `cargo run -p p2plab-docs -- bench-tables`",
                page.display()
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    let results: BTreeSet<String> = std::fs::read_dir(repo.root().join("guest-tests/bench"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .map(|n| format!("guest-tests/bench/{n}"))
        .collect();
    assert!(!results.is_empty());
    let unshown: Vec<&String> = results.difference(&shown).collect();
    assert!(unshown.is_empty(), "no page shows {unshown:?}");
}

/// A cell changed by hand in the benchmarks page (as generated from the
/// JSON, whatever the page holds now) is caught and put back.
#[test]
fn a_hand_edited_cell_is_caught() {
    let repo = Repo::this().unwrap();
    let text = std::fs::read_to_string(repo.root().join("docs/user-guide/benchmarks.md")).unwrap();
    let good = bench::regenerate(&text, read_json(&repo)).unwrap();
    let cell = "| 4k-randread-qd32 IOPS | 37127 (35331–38057) |";
    assert!(good.contains(cell), "the page no longer shows that run");
    let edited = good.replacen(cell, "| 4k-randread-qd32 IOPS | 47127 (35331–38057) |", 1);
    let regenerated = bench::regenerate(&edited, read_json(&repo)).unwrap();
    assert!(regenerated != edited, "the edited cell was not noticed");
    assert!(regenerated == good, "regenerating did not restore the cell");
}
