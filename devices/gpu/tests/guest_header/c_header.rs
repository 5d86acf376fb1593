//! Just enough of C to read a hardware header: object-like `#define`s
//! whose values are integer expressions (literals, earlier defines,
//! parentheses, `<<`, `|`), and structs of fixed-size integer fields.

use std::collections::BTreeMap;

/// One `#define NAME VALUE /* comment */`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Define {
    /// `None` if the value is not an integer expression we evaluate
    /// (e.g. an `_IOR(...)`).
    pub value: Option<u64>,
    pub comment: String,
}

/// Every object-like define with a value, by name.
pub fn defines(header: &str) -> BTreeMap<String, Define> {
    let mut out: BTreeMap<String, Define> = BTreeMap::new();
    for line in header.lines() {
        let Some(rest) = line.trim_start().strip_prefix("#define") else {
            continue;
        };
        let (code, comment) = match rest.split_once("/*") {
            Some((code, comment)) => (code, comment.trim_end().trim_end_matches("*/")),
            None => (rest, ""),
        };
        let code = code.trim();
        let name_end = code
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(code.len());
        let (name, value) = code.split_at(name_end);
        if value.starts_with('(') || value.trim().is_empty() {
            continue; // a function-like macro or a bare flag (header guard)
        }
        let known: BTreeMap<&str, u64> = out
            .iter()
            .filter_map(|(name, define)| Some((name.as_str(), define.value?)))
            .collect();
        let value = evaluate(value.trim(), &known);
        out.insert(
            name.to_string(),
            Define {
                value,
                comment: comment.trim().to_string(),
            },
        );
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(u64),
    Name(String),
    Open,
    Close,
    Or,
    ShiftLeft,
}

fn tokens(text: &str) -> Option<Vec<Token>> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let (token, len) = if let Some(after) = rest.strip_prefix("<<") {
            (Token::ShiftLeft, rest.len() - after.len())
        } else if rest.starts_with('|') {
            (Token::Or, 1)
        } else if rest.starts_with('(') {
            (Token::Open, 1)
        } else if rest.starts_with(')') {
            (Token::Close, 1)
        } else {
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let word = rest.get(..len).filter(|w| !w.is_empty())?;
            if word.starts_with(|c: char| c.is_ascii_digit()) {
                let digits = word.trim_end_matches(['u', 'U', 'l', 'L']);
                let number = match digits.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok()?,
                    None => digits.parse().ok()?,
                };
                (Token::Number(number), len)
            } else {
                (Token::Name(word.to_string()), len)
            }
        };
        out.push(token);
        rest = rest.get(len..)?.trim_start();
    }
    Some(out)
}

/// An integer expression, or `None` if it uses anything else.
pub fn evaluate(text: &str, known: &BTreeMap<&str, u64>) -> Option<u64> {
    let tokens = tokens(text)?;
    let mut at = 0;
    let value = or_expr(&tokens, &mut at, known)?;
    (at == tokens.len()).then_some(value)
}

fn or_expr(tokens: &[Token], at: &mut usize, known: &BTreeMap<&str, u64>) -> Option<u64> {
    let mut value = shift_expr(tokens, at, known)?;
    while tokens.get(*at) == Some(&Token::Or) {
        *at += 1;
        value |= shift_expr(tokens, at, known)?;
    }
    Some(value)
}

fn shift_expr(tokens: &[Token], at: &mut usize, known: &BTreeMap<&str, u64>) -> Option<u64> {
    let mut value = primary(tokens, at, known)?;
    while tokens.get(*at) == Some(&Token::ShiftLeft) {
        *at += 1;
        let by = primary(tokens, at, known)?;
        value = value.checked_shl(u32::try_from(by).ok()?)?;
    }
    Some(value)
}

fn primary(tokens: &[Token], at: &mut usize, known: &BTreeMap<&str, u64>) -> Option<u64> {
    let token = tokens.get(*at)?;
    *at += 1;
    match token {
        Token::Number(n) => Some(*n),
        Token::Name(name) => known.get(name.as_str()).copied(),
        Token::Open => {
            let value = or_expr(tokens, at, known)?;
            (tokens.get(*at) == Some(&Token::Close)).then(|| *at += 1)?;
            Some(value)
        }
        _ => None,
    }
}

/// One field of a C struct: name, offset and size in bytes.
pub type Field = (String, usize, usize);

/// The fields of `struct NAME { ... };` with C's natural alignment,
/// and the struct's size; `Err` names what could not be read.
pub fn struct_layout(header: &str, name: &str) -> Result<(Vec<Field>, usize), String> {
    let opening = format!("struct {name} {{");
    let body = header
        .split_once(&opening)
        .and_then(|(_, after)| after.split_once("};"))
        .map(|(body, _)| body)
        .ok_or_else(|| format!("no `{opening}` ... `}};` in the header"))?;
    let mut fields = Vec::new();
    let (mut offset, mut align) = (0usize, 1usize);
    for line in body.lines() {
        let code = line.split("/*").next().unwrap_or("").trim();
        if code.is_empty() {
            continue;
        }
        let declaration = code
            .strip_suffix(';')
            .ok_or_else(|| format!("{name}: cannot read `{code}`"))?;
        let (ty, field) = declaration
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("{name}: cannot read `{code}`"))?;
        let element = match ty {
            "__u8" => 1,
            "__u16" | "__le16" => 2,
            "__u32" | "__le32" => 4,
            "__u64" | "__le64" => 8,
            _ => return Err(format!("{name}: unknown type `{ty}`")),
        };
        let field = field.trim();
        let (field, count) = match field.split_once('[') {
            Some((field, count)) => {
                let count = count
                    .trim_end_matches(']')
                    .parse::<usize>()
                    .map_err(|_| format!("{name}: bad array `{code}`"))?;
                (field, count)
            }
            None => (field, 1),
        };
        offset = offset.next_multiple_of(element);
        align = align.max(element);
        fields.push((field.to_string(), offset, element * count));
        offset += element * count;
    }
    Ok((fields, offset.next_multiple_of(align)))
}
