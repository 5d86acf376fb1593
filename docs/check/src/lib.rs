//! Keeps the `docs/` book and `README.md` true to the repository:
//!
//! - [`repo`]: links and repository paths named on a page must exist (the
//!   rule for what counts as a path is at the top of that module and in
//!   `docs/development/writing-docs.md`);
//! - [`bench`]: the benchmark tables are generated from
//!   `guest-tests/bench/*.json`, never edited by hand;
//! - [`reference`]: what the tests in `tests/` use to compare each
//!   device's reference page with the device crate's own tables;
//! - [`layering`]: the crate graph follows the layers
//!   `docs/development/layering.md` declares, and no crate root has a
//!   module circle;
//! - [`markdown`]: the small Markdown reader all of them use.
//!
//! `cargo test -p p2plab-docs` runs every check (`scripts/test` runs it
//! with the workspace); `cargo run -p p2plab-docs -- bench-tables`
//! regenerates the benchmark tables.

pub mod bench;
pub mod layering;
pub mod markdown;
pub mod reference;
pub mod repo;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Every Markdown file of the book (`docs/**/*.md`) plus `README.md`, as
/// paths relative to the repository root, sorted.
pub fn pages(root: &Path) -> Result<Vec<PathBuf>> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        let dir = root.join(rel);
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                walk(root, &rel, out)?;
            } else if rel.extension().is_some_and(|e| e == "md") {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut out = vec![PathBuf::from("README.md")];
    walk(root, Path::new("docs"), &mut out)?;
    out.sort();
    Ok(out)
}
