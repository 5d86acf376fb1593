//! Every link and repository path named in `docs/` and `README.md` exists
//! (the rule for what counts as a path: `src/repo.rs`, and
//! `docs/development/writing-docs.md`).
//!
//! Catches: a file, folder, script or page that moved or was renamed while
//! a page still names it; a link to a heading that was renamed; a link
//! that climbs out of the repository.

use std::path::Path;

use p2plab_docs::{pages, repo::Repo};

#[test]
fn every_link_and_repository_path_exists() {
    let repo = Repo::this().unwrap();
    let pages = pages(repo.root()).unwrap();
    assert!(pages.len() > 20, "only {} pages found", pages.len());
    let mut problems = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(repo.root().join(page)).unwrap();
        problems.extend(repo.page_problems(page, &text));
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_chapter_is_in_the_summary_and_every_summary_entry_exists() {
    let repo = Repo::this().unwrap();
    let summary = std::fs::read_to_string(repo.root().join("docs/SUMMARY.md")).unwrap();
    let listed: std::collections::BTreeSet<String> = p2plab_docs::markdown::links(&summary)
        .into_iter()
        .map(|l| format!("docs/{}", l.target))
        .collect();
    let mut problems = Vec::new();
    for page in pages(repo.root()).unwrap() {
        let name = page.to_string_lossy().into_owned();
        if name == "README.md" || name == "docs/SUMMARY.md" {
            continue;
        }
        if !listed.contains(&name) {
            problems.push(format!("{name} is not in docs/SUMMARY.md"));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The check reports a missing file, a missing heading, a missing path in
/// inline code and in a command line, and passes what it must pass.
#[test]
fn the_check_catches_each_kind_of_dangling_name() {
    let repo = Repo::this().unwrap();
    let page = Path::new("docs/user-guide/example.md");
    let bad = "\
[gone](nowhere.md) [heading](running.md#no-such-heading) [up](../../../x) [here](#nope)
Named `devices/nvme/src/nowhere.rs` and `scripts/no-such-script --flag`.

```sh
scripts/not-there --exec 'ls'
```
";
    let problems = repo.page_problems(page, bad);
    assert_eq!(problems.len(), 7, "{problems:#?}");
    for (line, what) in [
        (1, "nowhere.md"),
        (1, "no-such-heading"),
        (1, "leaves the repository"),
        (1, "#nope"),
        (2, "devices/nvme/src/nowhere.rs"),
        (2, "scripts/no-such-script"),
        (5, "scripts/not-there"),
    ] {
        assert!(
            problems
                .iter()
                .any(|p| p.contains(&format!("example.md:{line}:")) && p.contains(what)),
            "{what} not reported on line {line}: {problems:#?}"
        );
    }
    let good = "\
[ok](running.md#in-the-guest) [web](https://example.org) [here](#x)
# X
`devices/nvme/src/io.rs`, `devices/fuzz/seeds/<target>/`, `guest-tests/bench/results-page.*`,
`runs/latest/nvme0.log`, `cargo test -p p2plab-docs`, `scripts/run-vm --keep`.

```
scripts/run-vm --exec 'cat devices/not/checked'
# scripts/not/a/command
```
";
    let problems = repo.page_problems(page, good);
    assert!(problems.is_empty(), "{problems:#?}");
    let code_block = repo.page_problems(page, "```\nscripts/nope\n```\n");
    assert_eq!(code_block.len(), 1, "{code_block:?}");
    assert!(code_block[0].contains("example.md:2:"), "{code_block:?}");
}
