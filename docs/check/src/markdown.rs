//! Just enough Markdown for the checks: which lines are inside fenced code
//! blocks, paragraphs with their inline code spans and links, headings and
//! their anchors, and pipe tables. Follows CommonMark and GitHub's tables
//! where the docs use them; it is not a renderer.

use std::collections::BTreeSet;

/// One line of a page, and whether it is inside a fenced code block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    /// 1-based line number.
    pub number: usize,
    pub text: &'a str,
    /// Inside a fenced code block (the fence lines themselves are not).
    pub in_fence: bool,
    /// A fence line (opening or closing).
    pub is_fence: bool,
}

/// The opening fence of `line`: its character and length.
fn fence_of(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    let c = trimmed.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = trimmed.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((c, n))
}

/// Every line of `text`, marked inside or outside fenced code blocks.
pub fn lines(text: &str) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let mut open: Option<(char, usize)> = None;
    for (i, text) in text.lines().enumerate() {
        let number = i + 1;
        match (open, fence_of(text)) {
            (None, Some(fence)) => {
                open = Some(fence);
                out.push(Line {
                    number,
                    text,
                    in_fence: false,
                    is_fence: true,
                });
            }
            (Some((c, n)), Some((c2, n2)))
                if c == c2 && n2 >= n && text.trim().chars().all(|x| x == c) =>
            {
                open = None;
                out.push(Line {
                    number,
                    text,
                    in_fence: false,
                    is_fence: true,
                });
            }
            (state, _) => out.push(Line {
                number,
                text,
                in_fence: state.is_some(),
                is_fence: false,
            }),
        }
    }
    out
}

/// A fenced code block: its info string and its lines.
#[derive(Debug, Clone)]
pub struct CodeBlock<'a> {
    pub info: String,
    pub lines: Vec<Line<'a>>,
}

/// Every fenced code block of `text`.
pub fn code_blocks(text: &str) -> Vec<CodeBlock<'_>> {
    let mut blocks = Vec::new();
    let mut current: Option<CodeBlock<'_>> = None;
    for line in lines(text) {
        if line.is_fence {
            match current.take() {
                Some(block) => blocks.push(block),
                None => {
                    current = Some(CodeBlock {
                        info: line.text.trim().trim_matches(['`', '~']).trim().to_string(),
                        lines: Vec::new(),
                    })
                }
            }
        } else if let Some(block) = current.as_mut() {
            block.lines.push(line);
        }
    }
    blocks.extend(current);
    blocks
}

/// Text outside code blocks, cut where inline spans cannot continue: at
/// blank lines, headings, table rows and fences.
#[derive(Debug, Clone)]
pub struct Paragraph {
    /// Line number of the first line.
    pub first_line: usize,
    /// The lines joined with `\n`.
    pub text: String,
}

impl Paragraph {
    /// The line number of byte `offset` of [`Self::text`].
    pub fn line_at(&self, offset: usize) -> usize {
        self.first_line
            + self.text[..offset.min(self.text.len())]
                .matches('\n')
                .count()
    }
}

/// Every paragraph of `text`; table rows and headings are paragraphs of
/// their own.
pub fn paragraphs(text: &str) -> Vec<Paragraph> {
    let mut out = Vec::new();
    let mut current: Option<Paragraph> = None;
    for line in lines(text) {
        let trimmed = line.text.trim();
        let alone = trimmed.starts_with('|') || trimmed.starts_with('#');
        if line.in_fence || line.is_fence || trimmed.is_empty() || alone {
            out.extend(current.take());
            if alone && !line.in_fence {
                out.push(Paragraph {
                    first_line: line.number,
                    text: line.text.to_string(),
                });
            }
            continue;
        }
        match current.as_mut() {
            Some(p) => {
                p.text.push('\n');
                p.text.push_str(line.text);
            }
            None => {
                current = Some(Paragraph {
                    first_line: line.number,
                    text: line.text.to_string(),
                })
            }
        }
    }
    out.extend(current);
    out
}

/// An inline code span: its content and where it starts in its paragraph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeSpan {
    pub offset: usize,
    /// Its end (past the closing backticks).
    pub end: usize,
    pub content: String,
}

/// The code spans of one paragraph (CommonMark: a run of n backticks up to
/// the next run of exactly n; an unmatched run is literal text).
pub fn code_spans(paragraph: &str) -> Vec<CodeSpan> {
    let bytes = paragraph.as_bytes();
    let run_at = |i: usize| bytes[i..].iter().take_while(|&&b| b == b'`').count();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'`' => {
                let n = run_at(i);
                let start = i + n;
                let mut j = start;
                let mut close = None;
                while j < bytes.len() {
                    if bytes[j] == b'`' {
                        let m = run_at(j);
                        if m == n {
                            close = Some(j);
                            break;
                        }
                        j += m;
                    } else {
                        j += 1;
                    }
                }
                match close {
                    Some(j) => {
                        let raw = paragraph[start..j].replace('\n', " ");
                        let content = match raw.strip_prefix(' ').and_then(|r| r.strip_suffix(' '))
                        {
                            Some(inner) if !inner.trim().is_empty() => inner.to_string(),
                            _ => raw,
                        };
                        spans.push(CodeSpan {
                            offset: i,
                            end: j + n,
                            content,
                        });
                        i = j + n;
                    }
                    None => i = start,
                }
            }
            _ => i += 1,
        }
    }
    spans
}

/// `paragraph` with every code span blanked out (same length, so offsets
/// still hold).
pub fn without_code(paragraph: &str) -> String {
    let mut masked = paragraph.as_bytes().to_vec();
    for span in code_spans(paragraph) {
        for b in &mut masked[span.offset..span.end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    String::from_utf8_lossy(&masked).into_owned()
}

/// A link target as written (`path#anchor`, a URL, `#anchor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub line: usize,
    pub target: String,
}

/// Every link and image target of `text`: inline `[..](target "title")`
/// and reference definitions `[label]: target`, outside code.
pub fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for p in paragraphs(text) {
        let masked = without_code(&p.text);
        let mut from = 0;
        while let Some(at) = masked[from..].find("](") {
            let start = from + at + 2;
            let mut depth = 0usize;
            let mut end = None;
            for (k, c) in masked[start..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = Some(start + k);
                        break;
                    }
                    ')' => depth -= 1,
                    '\n' => break,
                    _ => {}
                }
            }
            let Some(end) = end else {
                from = start;
                continue;
            };
            let inner = masked[start..end].trim();
            let target = inner
                .strip_prefix('<')
                .and_then(|t| t.split('>').next())
                .unwrap_or_else(|| inner.split_whitespace().next().unwrap_or(""));
            if !target.is_empty() {
                out.push(Link {
                    line: p.line_at(start),
                    target: target.to_string(),
                });
            }
            from = end;
        }
        for (k, line) in masked.lines().enumerate() {
            let trimmed = line.trim_start();
            if let Some(rest) = trimmed.strip_prefix('[') {
                if let Some((label, def)) = rest.split_once("]:") {
                    if !label.is_empty() && !label.contains(']') {
                        if let Some(target) = def.split_whitespace().next() {
                            out.push(Link {
                                line: p.first_line + k,
                                target: target.trim_matches(['<', '>']).to_string(),
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// A heading: its level and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heading {
    pub line: usize,
    pub level: usize,
    pub text: String,
}

/// Every ATX heading (`## Text`) outside code blocks.
pub fn headings(text: &str) -> Vec<Heading> {
    lines(text)
        .into_iter()
        .filter(|l| !l.in_fence && !l.is_fence)
        .filter_map(|l| {
            let level = l.text.chars().take_while(|&c| c == '#').count();
            let rest = &l.text[level..];
            ((1..=6).contains(&level) && rest.starts_with(' ')).then(|| Heading {
                line: l.number,
                level,
                text: rest.trim().trim_end_matches('#').trim().to_string(),
            })
        })
        .collect()
}

/// The anchor GitHub and mdBook give a heading: lower case, letters,
/// digits, `-` and `_` kept, spaces turned into `-`, the rest dropped.
pub fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a page: each heading's slug, repeats numbered `-1`,
/// `-2`... as GitHub does.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for h in headings(text) {
        let base = slug(&h.text);
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.insert(anchor);
    }
    out
}

/// A pipe table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Line of the header row.
    pub line: usize,
    /// The text of the nearest heading above it ("" if none).
    pub section: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// The column whose header is `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }
}

/// The cells of a table row: split at pipes that are not escaped (`\|`),
/// outer pipes dropped, cells trimmed, `\|` unescaped.
pub fn cells(row: &str) -> Vec<String> {
    let row = row.trim();
    let row = row.strip_prefix('|').unwrap_or(row);
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = row.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_string()),
            c => cell.push(c),
        }
    }
    if !cell.trim().is_empty() {
        cells.push(cell.trim().to_string());
    }
    cells
}

fn is_delimiter_row(row: &str) -> bool {
    let cells = cells(row);
    !cells.is_empty()
        && cells.iter().all(|c| {
            let c = c.trim_matches(':');
            !c.is_empty() && c.chars().all(|x| x == '-')
        })
}

/// Every pipe table of `text` outside code blocks.
pub fn tables(text: &str) -> Vec<Table> {
    let mut out = Vec::new();
    let mut section = String::new();
    let all = lines(text);
    let mut i = 0;
    while i < all.len() {
        let line = &all[i];
        if !line.in_fence && !line.is_fence {
            if let Some(h) = headings(line.text).first() {
                section = h.text.clone();
            }
        }
        let starts_table = !line.in_fence
            && line.text.trim().starts_with('|')
            && all
                .get(i + 1)
                .is_some_and(|next| !next.in_fence && is_delimiter_row(next.text));
        if !starts_table {
            i += 1;
            continue;
        }
        let mut table = Table {
            line: line.number,
            section: section.clone(),
            header: cells(line.text),
            rows: Vec::new(),
        };
        i += 2;
        while let Some(row) = all.get(i) {
            if row.in_fence || !row.text.trim().starts_with('|') {
                break;
            }
            table.rows.push(cells(row.text));
            i += 1;
        }
        out.push(table);
    }
    out
}

/// The first table under the heading `heading` (any level), before the
/// next heading of the same or a higher level.
pub fn table_under<'t>(tables: &'t [Table], text: &str, heading: &str) -> Option<&'t Table> {
    let all = headings(text);
    let at = all.iter().position(|h| h.text == heading)?;
    let start = all[at].line;
    let end = all[at + 1..]
        .iter()
        .find(|h| h.level <= all[at].level)
        .map_or(usize::MAX, |h| h.line);
    tables.iter().find(|t| t.line > start && t.line < end)
}

/// A cell without its code-span backticks.
pub fn plain(cell: &str) -> String {
    code_spans(cell)
        .iter()
        .rev()
        .fold(cell.to_string(), |mut text, span| {
            text.replace_range(span.offset..span.end, &span.content);
            text
        })
}

#[cfg(test)]
mod tests {
    // Catches: a reader that sees links or code inside code blocks, splits a
    // table at an escaped pipe, pairs backticks across a paragraph break, or
    // makes anchors other than GitHub's and mdBook's.
    use super::*;

    #[test]
    fn fences_hide_their_lines() {
        let text = "a\n```sh\nx `y`\n```\nb\n  ~~~\n  z\n  ~~~\n";
        let inside: Vec<usize> = lines(text)
            .iter()
            .filter(|l| l.in_fence)
            .map(|l| l.number)
            .collect();
        assert_eq!(inside, [3, 7]);
        let blocks = code_blocks(text);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].info, "sh");
    }

    #[test]
    fn code_spans_follow_commonmark() {
        let spans: Vec<String> = code_spans("a `b` c ``d ` e`` f `g\nh` \\`i and `j")
            .into_iter()
            .map(|s| s.content)
            .collect();
        assert_eq!(spans, ["b", "d ` e", "g h"]);
        assert_eq!(without_code("x `y` z"), "x     z");
    }

    #[test]
    fn links_outside_code_only() {
        let text = "see [a](b.md#c) and `[x](y)`\n[i](<d e.md>) ![p](q.svg \"t\")\n\n```\n[n](m)\n```\n[ref]: r/s.md\n";
        let targets: Vec<(usize, String)> = links(text)
            .into_iter()
            .map(|l| (l.line, l.target))
            .collect();
        assert_eq!(
            targets,
            [
                (1, "b.md#c".to_string()),
                (2, "d e.md".to_string()),
                (2, "q.svg".to_string()),
                (7, "r/s.md".to_string()),
            ]
        );
    }

    #[test]
    fn anchors_as_github_makes_them() {
        assert_eq!(slug("P2P by hand: NVMe → GPU"), "p2p-by-hand-nvme--gpu");
        assert_eq!(slug("QEMU 11.1: device_del"), "qemu-111-device_del");
        assert_eq!(
            slug("Conformance (`scripts/conformance`)"),
            "conformance-scriptsconformance"
        );
        let a = anchors("# A\n## B\n## B\n```\n# C\n```\n");
        assert_eq!(a.into_iter().collect::<Vec<_>>(), ["a", "b", "b-1"]);
    }

    #[test]
    fn tables_with_escaped_pipes_and_sections() {
        let text = "## Regs\n\ntext\n\n| a | b |\n|---|--:|\n| `x \\| y` | 2 |\n| 3 | |\n\n## Other\n| c |\n|---|\n| 4 |\n";
        let t = tables(text);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].section, "Regs");
        assert_eq!(t[0].header, ["a", "b"]);
        assert_eq!(t[0].rows, [vec!["`x | y`", "2"], vec!["3", ""]]);
        assert_eq!(plain(&t[0].rows[0][0]), "x | y");
        assert_eq!(table_under(&t, text, "Other").map(|t| t.line), Some(11));
        assert_eq!(table_under(&t, text, "Regs").map(|t| t.line), Some(5));
        assert!(table_under(&t, text, "None").is_none());
    }
}
