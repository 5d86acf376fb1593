//! Which words of a page name repository paths, and whether they exist.
//!
//! The rule (also in `docs/development/writing-docs.md`):
//!
//! - **Links.** Every link or image target that has no URL scheme
//!   (`https:`, `mailto:`...) is a path relative to the page's folder and
//!   must exist inside the repository; a `#anchor` on a Markdown file must
//!   be one of its headings' anchors (`#anchor` alone: this page's).
//! - **Inline code.** The first word of an inline code span names a
//!   repository path when it starts with a top-level folder the repository
//!   tracks (`devices/`, `docs/`, `guest-tests/`, `qemu-configs/`,
//!   `scripts/`...: the root's entries that are neither hidden nor ignored
//!   by the root `.gitignore`) or is a top-level file (`README.md`). Paths
//!   are written from the repository root. `runs/latest/nvme0.log`,
//!   `.cache/...`, `target/release/...` and `/opt/p2plab/bin` are places
//!   a run creates, not repository paths, and are not checked.
//! - **Code blocks.** Code blocks hold commands, their output and source
//!   code, so only the first word of each line (after a `$ ` prompt) is
//!   checked, by the same rule: `scripts/run-vm --exec ...` checks
//!   `scripts/run-vm`; arguments, output and comments are never checked.
//! - **Placeholders.** A path is checked up to its first component with a
//!   placeholder (`<`, `>`, `{`, `}`, `$`, `@`): `devices/fuzz/seeds/<target>/`
//!   checks `devices/fuzz/seeds`. A `*` in the last component must match
//!   at least one entry.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};

use crate::markdown;

/// A repository checkout and the top-level names a path may start with.
#[derive(Debug, Clone)]
pub struct Repo {
    root: PathBuf,
    top_level: BTreeSet<String>,
}

/// Characters that make a path component a placeholder.
const PLACEHOLDER: &[char] = &['<', '>', '{', '}', '$', '@'];

impl Repo {
    /// The repository at `root`: its top-level entries that are neither
    /// hidden nor listed in the root `.gitignore` as `/name` or `/name/`.
    pub fn open(root: &Path) -> Result<Self> {
        let ignored: BTreeSet<String> = fs::read_to_string(root.join(".gitignore"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().strip_prefix('/'))
            .map(|l| l.trim_end_matches('/').to_string())
            .filter(|l| !l.contains('/'))
            .collect();
        let mut top_level = BTreeSet::new();
        for entry in fs::read_dir(root).with_context(|| format!("reading {}", root.display()))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && !ignored.contains(&name) {
                top_level.insert(name);
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            top_level,
        })
    }

    /// This crate's repository (two folders above `docs/check`).
    pub fn this() -> Result<Self> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        Self::open(&root.canonicalize().context("the repository root")?)
    }

    /// The repository root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether `word` names a repository path by the rule above.
    pub fn names_path(&self, word: &str) -> bool {
        match word.split_once('/') {
            Some((first, _)) => self.top_level.contains(first),
            None => self.top_level.contains(word) && self.root.join(word).is_file(),
        }
    }

    /// Checks that the repository path `path` exists (up to a placeholder;
    /// a `*` in the last component must match something).
    pub fn check_path(&self, path: &str) -> Result<(), String> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let mut at = self.root.clone();
        for (i, part) in parts.iter().enumerate() {
            if part.contains(PLACEHOLDER) || *part == "..." {
                return Ok(());
            }
            if part.contains('*') {
                if i + 1 != parts.len() {
                    return Ok(());
                }
                let found = fs::read_dir(&at)
                    .map(|entries| {
                        entries
                            .flatten()
                            .any(|e| glob_matches(part, &e.file_name().to_string_lossy()))
                    })
                    .unwrap_or(false);
                return if found {
                    Ok(())
                } else {
                    Err(format!("nothing matches {path}"))
                };
            }
            at.push(part);
            if fs::symlink_metadata(&at).is_err() {
                return Err(format!("{} does not exist", parts[..=i].join("/")));
            }
        }
        Ok(())
    }

    /// Checks one link target written on the page at `page` (a path in
    /// the repository); URLs pass.
    pub fn check_link(&self, page: &Path, target: &str) -> Result<(), String> {
        if has_scheme(target) {
            return Ok(());
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target, None),
        };
        let file = if path.is_empty() {
            page.to_path_buf()
        } else {
            let folder = page.parent().unwrap_or(Path::new(""));
            normalize(&folder.join(path))
                .ok_or_else(|| format!("{target} leaves the repository"))?
        };
        let full = self.root.join(&file);
        if fs::symlink_metadata(&full).is_err() {
            return Err(format!("{target}: {} does not exist", file.display()));
        }
        if let Some(anchor) = anchor {
            if full.extension().is_some_and(|e| e == "md") {
                let text = fs::read_to_string(&full).map_err(|e| format!("{target}: {e}"))?;
                if !markdown::anchors(&text).contains(anchor) {
                    return Err(format!(
                        "{target}: {} has no heading with the anchor #{anchor}",
                        file.display()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every problem with the links and repository paths of the page at
    /// `page` (relative to the root) whose text is `text`, as
    /// `page:line: message`.
    pub fn page_problems(&self, page: &Path, text: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let mut report = |line: usize, message: String| {
            problems.push(format!("{}:{line}: {message}", page.display()));
        };
        let own_anchors = markdown::anchors(text);
        for link in markdown::links(text) {
            // `#anchor` alone: a heading of this text, which need not be
            // on disk yet.
            let result = match link.target.strip_prefix('#') {
                Some(anchor) if !own_anchors.contains(anchor) => Err(format!(
                    "{}: this page has no heading with that anchor",
                    link.target
                )),
                Some(_) => Ok(()),
                None => self.check_link(page, &link.target),
            };
            if let Err(e) = result {
                report(link.line, format!("link {e}"));
            }
        }
        for p in markdown::paragraphs(text) {
            for span in markdown::code_spans(&p.text) {
                let Some(word) = span.content.split_whitespace().next() else {
                    continue;
                };
                if self.names_path(word) {
                    if let Err(e) = self.check_path(word) {
                        report(p.line_at(span.offset), format!("`{}`: {e}", span.content));
                    }
                }
            }
        }
        for block in markdown::code_blocks(text) {
            for line in &block.lines {
                let text = line.text.trim_start();
                let text = text.strip_prefix("$ ").unwrap_or(text);
                let Some(word) = text.split_whitespace().next() else {
                    continue;
                };
                if self.names_path(word) {
                    if let Err(e) = self.check_path(word) {
                        report(line.number, format!("code block: {e}"));
                    }
                }
            }
        }
        problems
    }
}

impl Repo {
    /// What [`Repo::page_problems`] finds in a crate's README, plus its
    /// crate-relative paths: the first word of an inline code span that
    /// starts with one of the crate's own entries (`src/...`,
    /// `tests/...`, `guest-driver/...`: any folder or file next to the
    /// README) is checked against the README's folder.
    pub fn crate_readme_problems(&self, readme: &Path, text: &str) -> Vec<String> {
        let mut problems = self.page_problems(readme, text);
        let folder = readme.parent().unwrap_or(Path::new(""));
        let own: BTreeSet<String> = fs::read_dir(self.root.join(folder))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let crate_relative = |word: &str| match word.split_once('/') {
            Some((first, rest)) => !rest.is_empty() && own.contains(first),
            None => false,
        };
        for p in markdown::paragraphs(text) {
            for span in markdown::code_spans(&p.text) {
                let Some(word) = span.content.split_whitespace().next() else {
                    continue;
                };
                let word = word.trim_end_matches([',', ';', ':', ')']);
                if self.names_path(word) || !crate_relative(word) {
                    continue;
                }
                let path = format!("{}/{word}", folder.display());
                if let Err(e) = self.check_path(&path) {
                    problems.push(format!(
                        "{}:{}: `{}`: {e}",
                        readme.display(),
                        p.line_at(span.offset),
                        span.content
                    ));
                }
            }
        }
        problems
    }
}

/// `https:`, `mailto:`, `chrome:`...: a scheme before any `/`, `#` or `.`.
fn has_scheme(target: &str) -> bool {
    match target.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => false,
    }
}

/// `path` with `.` and `..` resolved; `None` if it climbs above its root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Whether `name` matches `pattern`, where `*` matches any run.
fn glob_matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = parts.split_first().unwrap_or((&"", &[]));
    let Some(mut tail) = name.strip_prefix(first) else {
        return false;
    };
    for (i, part) in rest.iter().enumerate() {
        if i + 1 == rest.len() {
            return tail.ends_with(part);
        }
        match tail.find(part) {
            Some(at) => tail = &tail[at + part.len()..],
            None => return false,
        }
    }
    tail.is_empty()
}

#[cfg(test)]
mod tests {
    // Catches: a URL taken for a path, a path that climbs out of the
    // repository passing, and globs that match too much or too little.
    use super::*;

    #[test]
    fn schemes_and_paths() {
        assert!(has_scheme("https://ui.perfetto.dev"));
        assert!(has_scheme("mailto:x@y"));
        assert!(!has_scheme("docs/a.md#b:c"));
        assert!(!has_scheme("../a.md"));
        assert_eq!(
            normalize(Path::new("docs/user-guide/../../README.md")),
            Some(PathBuf::from("README.md"))
        );
        assert_eq!(normalize(Path::new("docs/../../x")), None);
    }

    #[test]
    fn globs() {
        assert!(glob_matches("results-page.*", "results-page.json"));
        assert!(!glob_matches("results-page.*", "results-direct.json"));
        assert!(glob_matches("*.rs", "a.rs"));
        assert!(glob_matches("a*b*c", "a1b2c"));
        assert!(!glob_matches("a*b*c", "a1b2"));
    }
}
