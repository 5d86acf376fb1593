//! One injection as text, for any device:
//!
//! ```text
//! SPEC   := ACTION { (',' | ':') ITEM }
//! ITEM   := count=N | prob=P | probability=P | after=N | FLAG | FILTER
//! ```
//!
//! The device says what `ACTION`, `FLAG` and `FILTER` are (its
//! [`Vocabulary`] and [`Filter`]); this module parses and prints the rest,
//! the same for every device. A spec prints back in one canonical form
//! (`Display`) that parses to the same spec: logs, `status` output and
//! command lines all show text a user can paste.

use std::fmt;
use std::str::FromStr;

use crate::grammar::{parse_number, parse_probability, Item, SpecError};

/// A device's fault vocabulary: the type is its action (the word a spec
/// starts with, and the flags that modify it); [`Self::Filter`] says which
/// of its commands a spec applies to.
///
/// `Display` prints the action and its flags (`status=0x281,dnr`); the
/// shared items and the filter follow.
pub trait Vocabulary: Copy + PartialEq + fmt::Debug + fmt::Display + Send + Sync + 'static {
    /// Which commands a spec applies to; `Default` is every command.
    type Filter: Filter;

    /// What the device's faults are called in errors ("NVMe fault").
    const KIND: &'static str;
    /// The action words, for the error that names an unknown one.
    const ACTIONS: &'static str;
    /// The flags, for the error that names an unknown option (`dnr,
    /// more`); empty when the actions take none.
    const FLAGS: &'static str = "";
    /// The most specs one device keeps armed ([`crate::Injector`]).
    const MAX_ARMED: usize = DEFAULT_MAX_ARMED;

    /// The action a spec's first item names, or `None` when its word is
    /// not one of this device's actions.
    fn parse(item: &Item<'_>) -> Option<Result<Self, SpecError>>;

    /// Applies a flag item (`dnr`) to the action, or `None` when the word
    /// is not one of this device's flags.
    fn flag(&mut self, item: &Item<'_>) -> Option<Result<(), SpecError>> {
        let _ = item;
        None
    }

    /// Refuses combinations that cannot mean anything, and fills in
    /// defaults (an action that fires once unless asked). The error is
    /// about the whole spec.
    fn check(spec: &mut Spec<Self>) -> Result<(), String> {
        let _ = spec;
        Ok(())
    }
}

/// The cap on armed specs per device unless its vocabulary says
/// otherwise. Every armed spec is matched against every command, so the
/// cap bounds that scan; 64 is several times what any test or script arms
/// at once (the e2e suites arm at most a handful per phase).
pub const DEFAULT_MAX_ARMED: usize = 64;

/// Which commands a spec applies to: the filter items a device takes
/// (`opcode=`, `queue=` ...) and how they match a command.
pub trait Filter: Copy + PartialEq + fmt::Debug + Default + Send + Sync + 'static {
    /// What a filter matches: the fields of one command.
    type Subject: ?Sized;

    /// The filter items, for the error that names an unknown option
    /// (`opcode=, queue=`); empty for none.
    const ITEMS: &'static str;

    /// Whether the canonical form prints the filter before `count=` and
    /// `prob=` (the GPU's form) rather than after them (NVMe's).
    const PRINTED_FIRST: bool = false;

    /// Takes a filter item, or `None` when the word is not one.
    fn parse_item(&mut self, item: &Item<'_>) -> Option<Result<(), SpecError>>;

    /// Prints the filter's items, each with a leading `,`.
    fn fmt_items(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// Whether a command with these fields is one the spec applies to.
    fn matches(&self, subject: &Self::Subject) -> bool;
}

/// The filter of a device whose specs apply to everything it does (the
/// NIC's wire: every frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoFilter;

impl Filter for NoFilter {
    type Subject = ();
    const ITEMS: &'static str = "";

    fn parse_item(&mut self, _: &Item<'_>) -> Option<Result<(), SpecError>> {
        None
    }

    fn fmt_items(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }

    fn matches(&self, _: &()) -> bool {
        true
    }
}

/// One injection: an action, the commands it applies to, and how often.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec<A: Vocabulary> {
    pub action: A,
    pub filter: A::Filter,
    /// Fire at most this many times (None: until cleared).
    pub count: Option<u64>,
    /// Fire on each matching command with this probability (None: always).
    pub probability: Option<f64>,
    /// Let this many matching commands pass before firing (None: fire
    /// from the first).
    pub after: Option<u64>,
}

impl<A: Vocabulary> Spec<A> {
    /// A spec that fires `action` on every command, always.
    pub fn new(action: A) -> Self {
        Self {
            action,
            filter: A::Filter::default(),
            count: None,
            probability: None,
            after: None,
        }
    }
}

impl<A: Vocabulary> FromStr for Spec<A> {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let mut items = text.split([',', ':']).map(str::trim);
        let head = Item::new(items.next().unwrap_or_default());
        if head.name.is_empty() {
            return Err(SpecError::new(text, "empty spec"));
        }
        let action = A::parse(&head).unwrap_or_else(|| {
            Err(head.error(format!(
                "{:?} is not a {} ({})",
                head.name,
                A::KIND,
                A::ACTIONS
            )))
        })?;
        let mut spec = Spec::new(action);
        for text_item in items {
            let item = Item::new(text_item);
            match item.name {
                "" => {
                    return Err(SpecError::new(
                        text,
                        "empty item (two separators in a row?)",
                    ))
                }
                "count" => {
                    let n = item.parse("N", parse_number)?;
                    if n == 0 {
                        return Err(item.error("count must be at least 1"));
                    }
                    spec.count = Some(n);
                }
                "prob" | "probability" => {
                    spec.probability = Some(item.parse("0.1", parse_probability)?);
                }
                "after" => spec.after = Some(item.parse("N", parse_number)?),
                _ => {
                    let taken = spec
                        .action
                        .flag(&item)
                        .or_else(|| spec.filter.parse_item(&item));
                    match taken {
                        Some(result) => result?,
                        None => return Err(unknown_option::<A>(&item)),
                    }
                }
            }
        }
        A::check(&mut spec).map_err(|m| SpecError::new(text, m))?;
        Ok(spec)
    }
}

fn unknown_option<A: Vocabulary>(item: &Item<'_>) -> SpecError {
    let mut known: Vec<&str> = Vec::new();
    if !A::FLAGS.is_empty() {
        known.push(A::FLAGS);
    }
    known.push("count=, prob=, after=");
    if !A::Filter::ITEMS.is_empty() {
        known.push(A::Filter::ITEMS);
    }
    item.error(format!(
        "{:?} is not an option ({})",
        item.name,
        known.join(", ")
    ))
}

impl<A: Vocabulary> fmt::Display for Spec<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.action)?;
        if A::Filter::PRINTED_FIRST {
            self.filter.fmt_items(f)?;
        }
        if let Some(n) = self.count {
            write!(f, ",count={n}")?;
        }
        if let Some(p) = self.probability {
            write!(f, ",prob={p}")?;
        }
        if let Some(n) = self.after {
            write!(f, ",after={n}")?;
        }
        if !A::Filter::PRINTED_FIRST {
            self.filter.fmt_items(f)?;
        }
        Ok(())
    }
}

/// Parses `text` as a spec of `A` and checks that its canonical form
/// parses back to the same spec; panics (naming both texts) when it does
/// not. For fuzz targets and tests: `None` when `text` is no spec.
pub fn round_trip<A: Vocabulary>(text: &str) -> Option<Spec<A>> {
    let spec: Spec<A> = text.parse().ok()?;
    let printed = spec.to_string();
    let again: Spec<A> = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, spec, "{text:?} printed as {printed:?}");
    assert_eq!(
        again.to_string(),
        printed,
        "{text:?}: not one canonical form"
    );
    Some(spec)
}

#[cfg(test)]
pub(crate) mod tests {
    //! A toy vocabulary that uses every hook, so the shared grammar is
    //! tested without any device.

    use super::*;
    use crate::grammar::parse_range;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Toy {
        Break { loud: bool },
        Once,
        Wait(u64),
    }

    impl fmt::Display for Toy {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Toy::Break { loud } => {
                    f.write_str("break")?;
                    if *loud {
                        f.write_str(",loud")?;
                    }
                    Ok(())
                }
                Toy::Once => f.write_str("once"),
                Toy::Wait(n) => write!(f, "wait={n}"),
            }
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub(crate) struct ToyFilter {
        pub range: Option<(u64, u64)>,
    }

    impl Filter for ToyFilter {
        type Subject = u64;
        const ITEMS: &'static str = "at=";

        fn parse_item(&mut self, item: &Item<'_>) -> Option<Result<(), SpecError>> {
            (item.name == "at").then(|| {
                self.range = Some(item.parse("1-2", parse_range)?);
                Ok(())
            })
        }

        fn fmt_items(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.range {
                Some((a, b)) => write!(f, ",at={a}-{b}"),
                None => Ok(()),
            }
        }

        fn matches(&self, n: &u64) -> bool {
            self.range.is_none_or(|(a, b)| (a..=b).contains(n))
        }
    }

    impl Vocabulary for Toy {
        type Filter = ToyFilter;
        const KIND: &'static str = "toy fault";
        const ACTIONS: &'static str = "break, once, wait=";
        const FLAGS: &'static str = "loud";
        const MAX_ARMED: usize = 4;

        fn parse(item: &Item<'_>) -> Option<Result<Self, SpecError>> {
            Some(match item.name {
                "break" => item.no_value().map(|()| Toy::Break { loud: false }),
                "once" => item.no_value().map(|()| Toy::Once),
                "wait" => item.parse("3", parse_number).map(Toy::Wait),
                _ => return None,
            })
        }

        fn flag(&mut self, item: &Item<'_>) -> Option<Result<(), SpecError>> {
            (item.name == "loud").then(|| {
                item.flag()?;
                match self {
                    Toy::Break { loud } => {
                        *loud = true;
                        Ok(())
                    }
                    _ => Err(item.error("only break is loud")),
                }
            })
        }

        fn check(spec: &mut Spec<Self>) -> Result<(), String> {
            if spec.action == Toy::Once {
                spec.count.get_or_insert(1);
            }
            if matches!(spec.action, Toy::Wait(_)) && spec.filter.range.is_some() {
                return Err("wait applies everywhere".into());
            }
            Ok(())
        }
    }

    pub(crate) fn toy(text: &str) -> Spec<Toy> {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    /// Catches: a shared item (count, prob, after) read wrongly, a flag or
    /// filter not handed to the device, or defaults not filled in.
    #[test]
    fn parses_shared_items_flags_and_filters() {
        let s = toy("break:loud,count=3,prob=25%,after=2,at=5-9");
        assert_eq!(s.action, Toy::Break { loud: true });
        assert_eq!(
            (s.count, s.probability, s.after),
            (Some(3), Some(0.25), Some(2))
        );
        assert_eq!(s.filter.range, Some((5, 9)));
        assert_eq!(toy("once").count, Some(1));
        assert_eq!(toy("wait=7,probability=0.5").probability, Some(0.5));
    }

    /// Catches: a printer and a parser that disagree.
    #[test]
    fn canonical_text_round_trips() {
        for text in [
            "break,loud,count=3,prob=0.25,after=2,at=5-9",
            "once,count=1",
            "wait=7,after=0",
        ] {
            let spec = toy(text);
            assert_eq!(spec.to_string(), text);
            assert_eq!(round_trip::<Toy>(text), Some(spec));
        }
        assert_eq!(toy("break:at=1-2:loud").to_string(), "break,loud,at=1-2");
        assert_eq!(round_trip::<Toy>("explode"), None);
    }

    /// Catches: errors that do not name the bad item.
    #[test]
    fn errors_name_the_bad_item() {
        for (text, item) in [
            ("", ""),
            ("=3", "=3"),
            ("explode", "explode"),
            ("break=1", "break=1"),
            ("wait", "wait"),
            ("wait=x", "wait=x"),
            ("break,count=0", "count=0"),
            ("break,count=x", "count=x"),
            ("break,count", "count"),
            ("break,prob=0", "prob=0"),
            ("break,prob=150%", "prob=150%"),
            ("break,after=-1", "after=-1"),
            ("break,loud=1", "loud=1"),
            ("once,loud", "loud"),
            ("break,at=9-3", "at=9-3"),
            ("break,colour=red", "colour=red"),
            ("break,,count=1", "break,,count=1"),
            ("wait=1,at=1-2", "wait=1,at=1-2"),
        ] {
            let e = text.parse::<Spec<Toy>>().unwrap_err();
            assert_eq!(e.item, item, "{text}: {e}");
            assert!(!e.message.is_empty());
        }
        let unknown = "break,colour=red".parse::<Spec<Toy>>().unwrap_err();
        assert_eq!(
            unknown.message,
            "\"colour\" is not an option (loud, count=, prob=, after=, at=)"
        );
        let word = "explode".parse::<Spec<Toy>>().unwrap_err();
        assert_eq!(
            word.message,
            "\"explode\" is not a toy fault (break, once, wait=)"
        );
    }
}
