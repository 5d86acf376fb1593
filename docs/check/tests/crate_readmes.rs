//! Every crate's README (`devices/*/README.md`, `guest-tests/*/README.md`
//! and deeper) names only files that exist: links, repository paths, and
//! paths relative to the crate (`src/...`, `tests/...`,
//! `guest-driver/...`).
//!
//! Catches: a crate README that still names a file a refactor moved or
//! deleted (a `build-in-root.sh` after the shared guest build, a module
//! merged into the device kit), which the book's own link check never
//! reads.

use std::path::{Path, PathBuf};

use p2plab_docs::repo::Repo;

fn readmes(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(rel)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let rel = rel.join(&*name);
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if name != "target" && !name.starts_with('.') {
                readmes(root, &rel, out);
            }
        } else if name == "README.md" {
            out.push(rel);
        }
    }
}

#[test]
fn every_crate_readme_names_files_that_exist() {
    let repo = Repo::this().unwrap();
    let mut found = Vec::new();
    for top in ["devices", "guest-tests"] {
        readmes(repo.root(), Path::new(top), &mut found);
    }
    assert!(found.len() >= 8, "only {} crate READMEs found", found.len());
    let mut problems = Vec::new();
    for readme in &found {
        let text = std::fs::read_to_string(repo.root().join(readme)).unwrap();
        problems.extend(repo.crate_readme_problems(readme, &text));
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The crate-relative rule reports a missing `src/` file next to the
/// README and passes one that exists.
#[test]
fn the_crate_readme_check_catches_a_moved_file() {
    let repo = Repo::this().unwrap();
    let readme = Path::new("devices/gpu/README.md");
    let bad = "| `src/bits.rs` | gone |\n| `src/lib.rs` | here |\n";
    let problems = repo.crate_readme_problems(readme, bad);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].contains("src/bits.rs"), "{problems:#?}");
}
