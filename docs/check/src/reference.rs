//! What the reference-page tests share: reading a page's table by its
//! heading and columns, and comparing what the page lists with what the
//! code has, both ways.

use std::collections::BTreeSet;
use std::fmt::Debug;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::markdown::{self, Table};
use crate::repo::Repo;

/// A page of the book, by its path under `docs/`.
#[derive(Debug, Clone)]
pub struct Page {
    pub path: String,
    pub text: String,
    tables: Vec<Table>,
}

impl Page {
    /// Reads `docs/<path>` of this repository.
    pub fn read(path: &str) -> Result<Self> {
        let repo = Repo::this()?;
        let file = repo.root().join("docs").join(path);
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        Ok(Self::parse(path, text))
    }

    /// A page from its text (tests of the tests).
    pub fn parse(path: &str, text: String) -> Self {
        let tables = markdown::tables(&text);
        Self {
            path: path.to_string(),
            text,
            tables,
        }
    }

    /// The first table under `heading`.
    pub fn table(&self, heading: &str) -> Result<&Table> {
        markdown::table_under(&self.tables, &self.text, heading)
            .ok_or_else(|| anyhow!("{}: no table under the heading {heading:?}", self.path))
    }

    /// The cells of columns `columns` of the first table under `heading`,
    /// backticks dropped, one vector per row.
    pub fn rows(&self, heading: &str, columns: &[&str]) -> Result<Vec<Vec<String>>> {
        let table = self.table(heading)?;
        let at: Vec<usize> = columns
            .iter()
            .map(|c| {
                table.column(c).ok_or_else(|| {
                    anyhow!(
                        "{}: the table under {heading:?} (line {}) has no column {c:?}",
                        self.path,
                        table.line
                    )
                })
            })
            .collect::<Result<_>>()?;
        let mut rows = Vec::new();
        for row in &table.rows {
            rows.push(
                at.iter()
                    .map(|&i| markdown::plain(row.get(i).map_or("", String::as_str)))
                    .collect(),
            );
        }
        if rows.is_empty() {
            bail!("{}: the table under {heading:?} is empty", self.path);
        }
        Ok(rows)
    }
}

/// `0x1c`, `28`: a number as the pages write it.
pub fn number(text: &str) -> Result<u64> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| anyhow!("{t:?} is not a number"))
}

/// What differs between what a page lists (`page`) and what the code has
/// (`code`), as messages naming `what` and the page.
pub fn differences<T: Ord + Debug>(
    page_name: &str,
    what: &str,
    page: &BTreeSet<T>,
    code: &BTreeSet<T>,
) -> Vec<String> {
    let mut out = Vec::new();
    for item in code.difference(page) {
        out.push(format!(
            "{what} {item:?} is in the code but not on {page_name}"
        ));
    }
    for item in page.difference(code) {
        out.push(format!(
            "{what} {item:?} is on {page_name} but not in the code"
        ));
    }
    out
}

/// Every key of a JSON value as a dotted path: `a.b` for member `b` of
/// object `a`, `a[].b` for a member of the objects in list `a`. Objects
/// and lists are not keys themselves, their members are.
pub fn json_keys(value: &Value) -> BTreeSet<String> {
    fn walk(prefix: &str, value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    match v {
                        Value::Object(_) => walk(&path, v, out),
                        Value::Array(items) => {
                            let list = format!("{path}[]");
                            if items.is_empty() {
                                out.insert(path);
                            }
                            for item in items {
                                walk(&list, item, out);
                            }
                        }
                        _ => {
                            out.insert(path);
                        }
                    }
                }
            }
            other => {
                out.insert(format!("{prefix}: {other}"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk("", value, &mut out);
    out
}

#[cfg(test)]
mod tests {
    // Catches: a table read from the wrong heading or column, a difference
    // reported one way only, and nested stats keys flattened wrongly.
    use super::*;

    #[test]
    fn tables_by_heading_and_column() {
        let page = Page::parse(
            "x.md",
            "# X\n## Regs\n| offset | name |\n|---|---|\n| `0x10` | `A` |\n| 4 | B |\n".into(),
        );
        let rows = page.rows("Regs", &["name", "offset"]).unwrap();
        assert_eq!(rows, [vec!["A", "0x10"], vec!["B", "4"]]);
        assert_eq!(number(&rows[0][1]).unwrap(), 16);
        assert!(page.rows("Regs", &["width"]).is_err());
        assert!(page.rows("Bits", &["name"]).is_err());
        assert!(number("x").is_err());
    }

    #[test]
    fn differences_both_ways() {
        let page: BTreeSet<&str> = ["a", "b"].into();
        let code: BTreeSet<&str> = ["b", "c"].into();
        let d = differences("p.md", "register", &page, &code);
        assert_eq!(d.len(), 2);
        assert!(d[0].contains("\"c\" is in the code"), "{d:?}");
        assert!(d[1].contains("\"a\" is on p.md"), "{d:?}");
    }

    #[test]
    fn keys_flatten_objects_and_lists() {
        let v = serde_json::json!({"a": 1, "b": {"c": 2}, "q": [{"s": 1}], "e": []});
        let keys: Vec<String> = json_keys(&v).into_iter().collect();
        assert_eq!(keys, ["a", "b.c", "e", "q[].s"]);
    }
}
