//! Every name on the code map (`docs/development/code-map.md`) appears in
//! the file named before it, and every such file exists.
//!
//! Catches: a handler, type or function renamed or moved to another file
//! while the map still sends readers to the old place.

use std::path::Path;

use p2plab_docs::markdown::code_spans;
use p2plab_docs::reference::Page;
use p2plab_docs::repo::Repo;

/// Whether `word` occurs in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// Problems with one *where* cell: names not found in the file before them.
fn cell_problems(repo: &Repo, cell: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut file: Option<(String, String)> = None;
    for span in code_spans(cell) {
        let word = span.content.as_str();
        if repo.names_path(word) {
            if let Err(e) = repo.check_path(word) {
                problems.push(e);
                file = None;
                continue;
            }
            let path = repo.root().join(word);
            file = Some((
                word.to_string(),
                std::fs::read_to_string(&path).unwrap_or_default(),
            ));
            continue;
        }
        let is_name = word
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == ':')
            && word.starts_with(|c: char| c.is_alphabetic() || c == '_');
        let Some((path, text)) = &file else {
            continue;
        };
        if is_name {
            let last = word.rsplit("::").next().unwrap_or(word);
            if !has_word(text, last) {
                problems.push(format!("`{word}` does not appear in {path}"));
            }
        }
    }
    problems
}

#[test]
fn every_name_on_the_code_map_is_where_it_says() {
    let repo = Repo::this().unwrap();
    let page = Page::read("development/code-map.md").unwrap();
    let rows = page.rows("Where is what", &["question", "where"]).unwrap();
    let mut problems = Vec::new();
    let mut names = 0;
    for row in &rows {
        let table = page.table("Where is what").unwrap();
        let raw = table
            .rows
            .iter()
            .find(|r| p2plab_docs::markdown::plain(&r[0]) == row[0])
            .map(|r| r[1].clone())
            .unwrap_or_default();
        names += code_spans(&raw).len();
        for p in cell_problems(&repo, &raw) {
            problems.push(format!("{}: {p}", row[0]));
        }
    }
    assert!(names > 40, "only {names} names on the map");
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    // The questions the issue asks are answered.
    for q in [
        "Identify",
        "CC.EN",
        "copy engine",
        "NIC wire",
        "fail on purpose",
    ] {
        assert!(rows.iter().any(|r| r[0].contains(q)), "no row about {q}");
    }
}

#[test]
fn the_check_catches_a_moved_name_and_a_moved_file() {
    let repo = Repo::this().unwrap();
    assert!(cell_problems(&repo, "`devices/nvme/src/admin/info.rs` `identify`").is_empty());
    let moved = cell_problems(&repo, "`devices/nvme/src/io.rs` `identify` `IO_COMMANDS`");
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert!(moved[0].contains("`identify`"), "{moved:?}");
    let gone = cell_problems(&repo, "`devices/nvme/src/gone.rs` `identify`");
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert!(has_word("fn write_cc(", "write_cc"));
    assert!(!has_word("fn write_cc_x(", "write_cc"));
    assert!(Path::new(env!("CARGO_MANIFEST_DIR")).is_dir());
}
