//! The facts a guest script reports: `KEY=VALUE` lines on its output, which
//! the host side reads back and asserts on (a failure names the fact and
//! shows the value).

use std::collections::BTreeMap;

/// The `KEY=VALUE` lines of `output`: KEY starts with an upper-case letter
/// and has only letters, digits and underscores; both sides are trimmed.
/// A key reported twice keeps its last value.
pub fn parse(output: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|line| {
            let (key, value) = line.trim().split_once('=')?;
            let is_key = key.starts_with(|c: char| c.is_ascii_uppercase())
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            is_key.then(|| (key.to_owned(), value.trim().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a parser that takes noise (lower-case keys, keys with
    /// dashes or spaces) for facts, cuts a value at a second `=`, keeps
    /// the first of two reports, or does not trim indented lines.
    #[test]
    fn only_upper_case_keys_are_facts() {
        let facts = parse(
            "WRITE_STATUS=0\nnoise=1\nVERIFY_r1_SLOT0=84\n  PAIR=x=y \nBAD-KEY=1\nA B=2\nWRITE_STATUS=1\n",
        );
        assert_eq!(facts.get("WRITE_STATUS").map(String::as_str), Some("1"));
        assert_eq!(facts.get("VERIFY_r1_SLOT0").map(String::as_str), Some("84"));
        assert_eq!(facts.get("PAIR").map(String::as_str), Some("x=y"));
        assert_eq!(facts.len(), 3, "{facts:?}");
    }
}
