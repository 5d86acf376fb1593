//! The words every spec is made of: items (`name` or `name=value`), the
//! errors that name them, and the values items take (numbers, durations,
//! probabilities, ranges).

use std::fmt;
use std::time::Duration;

/// The longest duration a spec may ask for (a latency, a stall, a delay):
/// longer is a hang, and hangs are actions of their own.
pub const MAX_DURATION: Duration = Duration::from_secs(60);

/// A spec that does not parse: which item, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The item as written (`count=x`), or the whole spec.
    pub item: String,
    pub message: String,
}

impl SpecError {
    /// An error about `item` (an item's text, or the whole spec).
    pub fn new(item: &str, message: impl Into<String>) -> Self {
        Self {
            item: item.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.item, self.message)
    }
}

impl std::error::Error for SpecError {}

/// One `name` or `name=value` item of a spec (its action or an option),
/// with the errors that name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item<'a> {
    /// The item as written.
    pub text: &'a str,
    pub name: &'a str,
    pub value: Option<&'a str>,
}

impl<'a> Item<'a> {
    pub fn new(text: &'a str) -> Self {
        let (name, value) = match text.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (text, None),
        };
        Item { text, name, value }
    }

    /// An error that names this item.
    pub fn error(&self, message: impl Into<String>) -> SpecError {
        SpecError::new(self.text, message)
    }

    /// The value; `example` shows its form in the error.
    pub fn value(&self, example: &str) -> Result<&'a str, SpecError> {
        let name = self.name;
        self.value
            .ok_or_else(|| self.error(format!("{name} needs a value ({name}={example})")))
    }

    /// The value, parsed by `parse` (whose message the error carries).
    pub fn parse<T>(
        &self,
        example: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, SpecError> {
        parse(self.value(example)?).map_err(|m| self.error(m))
    }

    /// Refuses a value on an action word that takes none.
    pub fn no_value(&self) -> Result<(), SpecError> {
        self.refuse_value("takes no value")
    }

    /// Refuses a value on a flag (`dnr`).
    pub fn flag(&self) -> Result<(), SpecError> {
        self.refuse_value("is a flag and takes no value")
    }

    fn refuse_value(&self, what: &str) -> Result<(), SpecError> {
        match self.value {
            Some(_) => Err(self.error(format!("{} {what}", self.name))),
            None => Ok(()),
        }
    }
}

/// A decimal or 0x-prefixed hex number.
pub fn parse_number(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("{text:?} is not a number"))
}

/// `5ms`, `250us`, `2s` (a unit is required), at most [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit (us, ms, s)"))?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 5ms"))?;
    let d = match unit {
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err(format!("unit {unit:?} is not one of us, ms, s")),
    };
    if d > MAX_DURATION {
        return Err(format!(
            "{text} is over {}s, the longest a spec may wait (a command that never \
             completes is an action of its own)",
            MAX_DURATION.as_secs()
        ));
    }
    Ok(d)
}

/// A duration as [`parse_duration`] reads it, in the largest unit that
/// keeps it whole.
pub fn format_duration(d: Duration) -> String {
    let us = d.as_micros();
    if us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

/// `0.25` or `25%`, in (0, 1].
pub fn parse_probability(text: &str) -> Result<f64, String> {
    let p = match text.strip_suffix('%') {
        Some(pct) => pct.parse::<f64>().map(|v| v / 100.0),
        None => text.parse::<f64>(),
    }
    .map_err(|_| format!("{text:?} is not a probability like 0.1 or 10%"))?;
    if !(p > 0.0 && p <= 1.0) {
        return Err(format!("{text} is not in (0, 1]"));
    }
    Ok(p)
}

/// `A-B` or `A` (decimal or 0x hex), inclusive, `A <= B`.
pub fn parse_range(text: &str) -> Result<(u64, u64), String> {
    let (first, last) = match text.split_once('-') {
        Some((a, b)) => (parse_number(a)?, parse_number(b)?),
        None => {
            let a = parse_number(text)?;
            (a, a)
        }
    };
    if last < first {
        return Err(format!("{text}: the range ends before it starts"));
    }
    Ok((first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a value parser that accepts what it should refuse, or
    /// reads a value wrongly.
    #[test]
    fn values_parse_and_refuse() {
        assert_eq!(parse_number("0x1f"), Ok(31));
        assert_eq!(parse_number("31"), Ok(31));
        assert!(parse_number("x").is_err());
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("60s"), Ok(MAX_DURATION));
        assert!(parse_duration("61s").is_err());
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5h").is_err());
        assert_eq!(format_duration(Duration::from_millis(2000)), "2s");
        assert_eq!(format_duration(Duration::from_micros(1500)), "1500us");
        assert_eq!(parse_probability("25%"), Ok(0.25));
        assert!(parse_probability("0").is_err());
        assert!(parse_probability("NaN").is_err());
        assert_eq!(parse_range("0x10-0x1f"), Ok((16, 31)));
        assert_eq!(parse_range("7"), Ok((7, 7)));
        assert!(parse_range("9-3").is_err());
    }

    /// Catches: item errors that do not name the item as written.
    #[test]
    fn item_errors_name_the_item() {
        let bare = Item::new("latency");
        assert_eq!(bare.value("5ms").unwrap_err().item, "latency");
        let valued = Item::new("dnr=1");
        assert_eq!((valued.name, valued.value), ("dnr", Some("1")));
        let e = valued.flag().unwrap_err();
        assert_eq!(e.to_string(), "dnr=1: dnr is a flag and takes no value");
        let bad = Item::new("count=x");
        assert_eq!(bad.parse("N", parse_number).unwrap_err().item, "count=x");
    }
}
