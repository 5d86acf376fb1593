//! Injection specs: what to break, on which commands, how often.
//!
//! ```text
//! SPEC   := ACTION { (',' | ':') ITEM }
//! ACTION := status=SCT_SC | ns-not-ready | media-error | timeout
//!         | latency=DURATION[-DURATION] | cfs | internal-error | drop-irq
//!         | delay-irq=DURATION | corrupt | peer-fail | peer-stall=DURATION
//! ITEM   := dnr | more | no-abort | count=N | prob=P | after=N | opcode=NAME|0xNN
//!         | admin-opcode=NAME|0xNN | queue=N | nsid=N | lba=A[-B]
//! ```
//!
//! A spec prints back in one canonical form (`Display`), which parses to
//! the same spec: logs, `status` output and command lines all show text a
//! user can paste.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The longest latency a spec may ask for: longer is a hang, and hangs are
/// `timeout`.
pub const MAX_LATENCY: Duration = Duration::from_secs(60);

/// What happens to a matching command.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Complete without executing, with this status: SCT in bits 10:8, SC
    /// in 7:0 (as `status=0x281`), plus the DNR and More bits.
    Status { sct_sc: u16, dnr: bool, more: bool },
    /// Namespace Not Ready (generic status 82h), retryable unless `dnr`.
    NamespaceNotReady { dnr: bool },
    /// The LBA range reads as Unrecovered Read Error until it is rewritten
    /// or deallocated (persistent, not per command).
    MediaError,
    /// The command never completes; an Abort naming it aborts it with
    /// Command Abort Requested unless `abortable` is false.
    Timeout { abortable: bool },
    /// The command runs later: `min` when `min == max`, else a uniformly
    /// random delay in `[min, max]` per command.
    Latency { min: Duration, max: Duration },
    /// The command completes, and its MSI-X message is sent this much
    /// later (the completion is in the queue meanwhile).
    DelayInterrupt(Duration),
    /// The controller raises CSTS.CFS instead of running the command.
    ControllerFatal,
    /// The command's handler fails as if the device had a bug (the queue
    /// worker panics): the worker boundary must catch it and raise
    /// CSTS.CFS, exactly as for a real internal error.
    InternalError,
    /// The command completes, but its MSI-X message is not sent.
    DropInterrupt,
    /// A read returns its data with one bit flipped in every block of the
    /// range.
    Corrupt,
    /// A data transfer whose target lies in a peer device's BAR fails (the
    /// command completes with Data Transfer Error); transfers to RAM and
    /// to the controller's own CMB/PMR are untouched.
    PeerFail,
    /// A data transfer to a peer BAR waits this long, then completes
    /// normally.
    PeerStall(Duration),
}

impl Action {
    /// Whether the action works on transfers to peer BARs rather than on
    /// whole commands.
    pub fn is_peer(&self) -> bool {
        matches!(self, Action::PeerFail | Action::PeerStall(_))
    }
}

/// Which command set an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandSet {
    Admin,
    Io,
}

/// An opcode filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opcode {
    pub set: CommandSet,
    pub value: u8,
}

const IO_OPCODES: &[(&str, u8)] = &[
    ("flush", 0x00),
    ("write", 0x01),
    ("read", 0x02),
    ("compare", 0x05),
    ("write-zeroes", 0x08),
    ("dsm", 0x09),
    ("verify", 0x0c),
];

const ADMIN_OPCODES: &[(&str, u8)] = &[
    ("delete-sq", 0x00),
    ("create-sq", 0x01),
    ("get-log-page", 0x02),
    ("delete-cq", 0x04),
    ("create-cq", 0x05),
    ("identify", 0x06),
    ("abort", 0x08),
    ("set-features", 0x09),
    ("get-features", 0x0a),
    ("async-event-request", 0x0c),
    ("format-nvm", 0x80),
];

impl Opcode {
    fn table(set: CommandSet) -> &'static [(&'static str, u8)] {
        match set {
            CommandSet::Admin => ADMIN_OPCODES,
            CommandSet::Io => IO_OPCODES,
        }
    }

    fn parse(set: CommandSet, text: &str) -> Result<Self, String> {
        let value = match Self::table(set).iter().find(|(name, _)| *name == text) {
            Some((_, v)) => *v,
            None => parse_number(text)
                .ok()
                .and_then(|v| u8::try_from(v).ok())
                .ok_or_else(|| {
                    let names: Vec<&str> = Self::table(set).iter().map(|(n, _)| *n).collect();
                    format!(
                        "{text:?} is not an opcode (0x00..0xff or {})",
                        names.join(", ")
                    )
                })?,
        };
        Ok(Self { set, value })
    }

    /// The opcode's name in specs, if it has one.
    pub fn name(&self) -> Option<&'static str> {
        Self::table(self.set)
            .iter()
            .find(|(_, v)| *v == self.value)
            .map(|(n, _)| *n)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "{:#04x}", self.value),
        }
    }
}

/// An inclusive range of logical blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaRange {
    pub first: u64,
    pub last: u64,
}

impl LbaRange {
    /// Whether `blocks` blocks from `slba` touch this range.
    pub fn overlaps(&self, slba: u64, blocks: u64) -> bool {
        blocks > 0 && slba <= self.last && slba.saturating_add(blocks - 1) >= self.first
    }
}

impl fmt::Display for LbaRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// Which commands a spec applies to: every field that is set must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Filter {
    pub opcode: Option<Opcode>,
    /// Submission queue ID (0: the admin queue).
    pub queue: Option<u16>,
    pub nsid: Option<u32>,
    pub lba: Option<LbaRange>,
}

impl Filter {
    /// Whether the spec is about admin commands (queue 0 or an admin
    /// opcode); otherwise it only ever matches I/O commands, so that a
    /// bare `status=...` cannot break controller initialisation.
    pub fn admin(&self) -> bool {
        self.queue == Some(0) || self.opcode.is_some_and(|o| o.set == CommandSet::Admin)
    }
}

/// One injection: an action, the commands it applies to, and how often.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultSpec {
    pub action: Action,
    pub filter: Filter,
    /// Fire at most this many times (None: until cleared).
    pub count: Option<u64>,
    /// Fire on each matching command with this probability (None: always).
    pub probability: Option<f64>,
    /// Let this many matching commands pass before firing (None: fire
    /// from the first).
    pub after: Option<u64>,
}

/// A spec that does not parse: which item, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The item as written (`count=x`), or the whole spec.
    pub item: String,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.item, self.message)
    }
}

impl std::error::Error for SpecError {}

pub(crate) fn error(item: &str, message: impl Into<String>) -> SpecError {
    SpecError {
        item: item.to_string(),
        message: message.into(),
    }
}

/// A decimal or 0x-prefixed hex number.
pub(crate) fn parse_number(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("{text:?} is not a number"))
}

/// `5ms`, `250us`, `2s` (a unit is required).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
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
    if d > MAX_LATENCY {
        return Err(format!(
            "{text} is over {}s; use timeout for a command that never completes",
            MAX_LATENCY.as_secs()
        ));
    }
    Ok(d)
}

pub(crate) fn format_duration(d: Duration) -> String {
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
pub(crate) fn parse_probability(text: &str) -> Result<f64, String> {
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
pub(crate) fn parse_range(text: &str) -> Result<(u64, u64), String> {
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

fn parse_lba(text: &str) -> Result<LbaRange, String> {
    parse_range(text).map(|(first, last)| LbaRange { first, last })
}

/// One `name` or `name=value` item of a spec (its head or an option),
/// with the errors that name it.
#[derive(Clone, Copy)]
pub(crate) struct SpecItem<'a> {
    pub text: &'a str,
    pub name: &'a str,
    pub value: Option<&'a str>,
}

impl<'a> SpecItem<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let (name, value) = match text.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (text, None),
        };
        SpecItem { text, name, value }
    }

    /// The value; `example` shows the form in the error.
    pub(crate) fn need_value(&self, example: &str) -> Result<&'a str, SpecError> {
        let name = self.name;
        self.value.ok_or_else(|| {
            error(
                self.text,
                format!("{name} needs a value ({name}={example})"),
            )
        })
    }

    /// Refuses a value on an item that takes none; `what` says why.
    pub(crate) fn no_value(&self, what: &str) -> Result<(), SpecError> {
        match self.value {
            Some(_) => Err(error(self.text, format!("{} {what}", self.name))),
            None => Ok(()),
        }
    }
}

impl FromStr for FaultSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let mut items = text.split([',', ':']).map(str::trim);
        let head_item = SpecItem::new(items.next().unwrap_or_default());
        let (head, name) = (head_item.text, head_item.name);
        let need_value = |what: &str| head_item.need_value(what);
        let no_value = || head_item.no_value("takes no value");
        let mut action = match name {
            "status" => {
                let raw = parse_number(need_value("0x281")?).map_err(|m| error(head, m))?;
                if raw == 0 || raw > 0x7ff {
                    return Err(error(
                        head,
                        "not a failure status: SCT in bits 10:8, SC in 7:0, not 0 (0x281 is \
                         Unrecovered Read Error)",
                    ));
                }
                Action::Status {
                    sct_sc: raw as u16,
                    dnr: false,
                    more: false,
                }
            }
            "ns-not-ready" => {
                no_value()?;
                Action::NamespaceNotReady { dnr: false }
            }
            "media-error" => {
                no_value()?;
                Action::MediaError
            }
            "timeout" => {
                no_value()?;
                Action::Timeout { abortable: true }
            }
            "latency" => {
                let text = need_value("5ms")?;
                let (min, max) = match text.split_once('-') {
                    Some((a, b)) => (
                        parse_duration(a).map_err(|m| error(head, m))?,
                        parse_duration(b).map_err(|m| error(head, m))?,
                    ),
                    None => {
                        let d = parse_duration(text).map_err(|m| error(head, m))?;
                        (d, d)
                    }
                };
                if max < min {
                    return Err(error(head, "the range ends before it starts"));
                }
                Action::Latency { min, max }
            }
            "delay-irq" => Action::DelayInterrupt(
                parse_duration(need_value("5ms")?).map_err(|m| error(head, m))?,
            ),
            "cfs" => {
                no_value()?;
                Action::ControllerFatal
            }
            "internal-error" => {
                no_value()?;
                Action::InternalError
            }
            "drop-irq" => {
                no_value()?;
                Action::DropInterrupt
            }
            "corrupt" => {
                no_value()?;
                Action::Corrupt
            }
            "peer-fail" => {
                no_value()?;
                Action::PeerFail
            }
            "peer-stall" => {
                Action::PeerStall(parse_duration(need_value("5ms")?).map_err(|m| error(head, m))?)
            }
            "" => return Err(error(text, "empty spec")),
            other => {
                return Err(error(
                    head,
                    format!(
                        "{other:?} is not a fault (status=, ns-not-ready, media-error, timeout, \
                         latency=, cfs, internal-error, drop-irq, delay-irq=, corrupt, peer-fail, \
                         peer-stall=)"
                    ),
                ))
            }
        };
        let mut spec = FaultSpec {
            action,
            filter: Filter::default(),
            count: None,
            probability: None,
            after: None,
        };
        for item in items {
            let option = SpecItem::new(item);
            let key = option.name;
            let value_of = |what: &str| option.need_value(what);
            let flag_only = || option.no_value("is a flag and takes no value");
            match key {
                "dnr" => {
                    flag_only()?;
                    match &mut action {
                        Action::Status { dnr, .. } | Action::NamespaceNotReady { dnr } => {
                            *dnr = true
                        }
                        _ => return Err(error(item, "only status and ns-not-ready carry DNR")),
                    }
                }
                "more" => {
                    flag_only()?;
                    match &mut action {
                        Action::Status { more, .. } => *more = true,
                        _ => return Err(error(item, "only status carries More")),
                    }
                }
                "no-abort" => {
                    flag_only()?;
                    match &mut action {
                        Action::Timeout { abortable } => *abortable = false,
                        _ => return Err(error(item, "only timeout can refuse an Abort")),
                    }
                }
                "after" => {
                    spec.after = Some(parse_number(value_of("N")?).map_err(|m| error(item, m))?);
                }
                "count" => {
                    let n = parse_number(value_of("N")?).map_err(|m| error(item, m))?;
                    if n == 0 {
                        return Err(error(item, "count must be at least 1"));
                    }
                    spec.count = Some(n);
                }
                "prob" | "probability" => {
                    spec.probability =
                        Some(parse_probability(value_of("0.1")?).map_err(|m| error(item, m))?);
                }
                "opcode" | "admin-opcode" => {
                    let set = if key == "opcode" {
                        CommandSet::Io
                    } else {
                        CommandSet::Admin
                    };
                    spec.filter.opcode =
                        Some(Opcode::parse(set, value_of("read")?).map_err(|m| error(item, m))?);
                }
                "queue" | "qid" => {
                    let n = parse_number(value_of("1")?).map_err(|m| error(item, m))?;
                    spec.filter.queue =
                        Some(u16::try_from(n).map_err(|_| error(item, "queue IDs are 16-bit"))?);
                }
                "nsid" => {
                    let n = parse_number(value_of("1")?).map_err(|m| error(item, m))?;
                    match u32::try_from(n) {
                        Ok(n) if n > 0 => spec.filter.nsid = Some(n),
                        _ => return Err(error(item, "NSIDs are 1..0xffffffff")),
                    }
                }
                "lba" => {
                    spec.filter.lba =
                        Some(parse_lba(value_of("100-199")?).map_err(|m| error(item, m))?);
                }
                "" => return Err(error(text, "empty item (two separators in a row?)")),
                other => {
                    return Err(error(
                        item,
                        format!(
                        "{other:?} is not an option (dnr, more, no-abort, count=, prob=, after=, \
                             opcode=, admin-opcode=, queue=, nsid=, lba=)"
                    ),
                    ))
                }
            }
        }
        spec.action = action;
        spec.check().map_err(|m| error(text, m))?;
        Ok(spec)
    }
}

impl FaultSpec {
    /// Refuses combinations that cannot mean anything.
    fn check(&mut self) -> Result<(), String> {
        let f = &self.filter;
        if f.queue == Some(0) && f.opcode.is_some_and(|o| o.set == CommandSet::Io) {
            return Err("queue 0 is the admin queue: use admin-opcode=".into());
        }
        if f.queue.is_some_and(|q| q > 0) && f.opcode.is_some_and(|o| o.set == CommandSet::Admin) {
            return Err("admin commands only run on queue 0".into());
        }
        match self.action {
            Action::MediaError => {
                if f.lba.is_none() {
                    return Err("media-error needs lba=FIRST-LAST".into());
                }
                if self.count.is_some() || self.probability.is_some() {
                    return Err(
                        "media-error is persistent until rewritten: no count= or prob=".into(),
                    );
                }
                if self.after.is_some() {
                    return Err("media-error is persistent until rewritten: no after=".into());
                }
                if f.opcode.is_some() || f.queue.is_some() {
                    return Err("media-error applies to blocks, not to opcodes or queues".into());
                }
                // One namespace: rewriting a block clears it there.
                self.filter.nsid.get_or_insert(1);
            }
            Action::Corrupt if f.admin() || f.opcode.is_some_and(|o| o.value != 0x02) => {
                return Err("corrupt applies to Read data only".into());
            }
            Action::PeerFail | Action::PeerStall(_)
                if f.opcode.is_some()
                    || f.queue.is_some()
                    || f.nsid.is_some()
                    || f.lba.is_some() =>
            {
                return Err(
                    "peer-fail and peer-stall apply to every transfer to a peer BAR: no opcode=, \
                     admin-opcode=, queue=, nsid= or lba="
                        .into(),
                );
            }
            Action::ControllerFatal | Action::InternalError => {
                // Once, unless asked: after the reset that CFS causes, the
                // controller must be able to come back.
                self.count.get_or_insert(1);
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether a command with these fields is one this spec applies to.
    pub fn matches(&self, cmd: &CommandInfo) -> bool {
        let f = &self.filter;
        if f.admin() != (cmd.queue == 0) {
            return false;
        }
        if f.opcode.is_some_and(|o| o.value != cmd.opcode) {
            return false;
        }
        if f.queue.is_some_and(|q| q != cmd.queue) {
            return false;
        }
        if f.nsid.is_some_and(|n| n != cmd.nsid) {
            return false;
        }
        if let Some(range) = f.lba {
            match cmd.lba {
                Some((slba, blocks)) if range.overlaps(slba, blocks) => {}
                _ => return false,
            }
        }
        true
    }
}

/// The fields of a command that specs match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandInfo {
    /// Submission queue ID (0: admin).
    pub queue: u16,
    pub opcode: u8,
    pub nsid: u32,
    /// Starting LBA and block count, for commands that address blocks.
    pub lba: Option<(u64, u64)>,
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.action {
            Action::Status { sct_sc, dnr, more } => {
                write!(f, "status={sct_sc:#05x}")?;
                if dnr {
                    f.write_str(",dnr")?;
                }
                if more {
                    f.write_str(",more")?;
                }
            }
            Action::NamespaceNotReady { dnr } => {
                f.write_str("ns-not-ready")?;
                if dnr {
                    f.write_str(",dnr")?;
                }
            }
            Action::MediaError => f.write_str("media-error")?,
            Action::Timeout { abortable } => {
                f.write_str("timeout")?;
                if !abortable {
                    f.write_str(",no-abort")?;
                }
            }
            Action::Latency { min, max } if min == max => {
                write!(f, "latency={}", format_duration(min))?
            }
            Action::Latency { min, max } => write!(
                f,
                "latency={}-{}",
                format_duration(min),
                format_duration(max)
            )?,
            Action::DelayInterrupt(d) => write!(f, "delay-irq={}", format_duration(d))?,
            Action::ControllerFatal => f.write_str("cfs")?,
            Action::InternalError => f.write_str("internal-error")?,
            Action::DropInterrupt => f.write_str("drop-irq")?,
            Action::Corrupt => f.write_str("corrupt")?,
            Action::PeerFail => f.write_str("peer-fail")?,
            Action::PeerStall(d) => write!(f, "peer-stall={}", format_duration(d))?,
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
        if let Some(o) = self.filter.opcode {
            match o.set {
                CommandSet::Io => write!(f, ",opcode={o}")?,
                CommandSet::Admin => write!(f, ",admin-opcode={o}")?,
            }
        }
        if let Some(q) = self.filter.queue {
            write!(f, ",queue={q}")?;
        }
        if let Some(n) = self.filter.nsid {
            write!(f, ",nsid={n}")?;
        }
        if let Some(r) = self.filter.lba {
            write!(f, ",lba={r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> FaultSpec {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    fn refuse(text: &str) -> SpecError {
        match text.parse::<FaultSpec>() {
            Ok(spec) => panic!("{text:?} should be refused, parsed as {spec:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn parses_the_fields_of_a_status_spec() {
        let s = parse("status=0x281,dnr,count=3,opcode=read,nsid=1,lba=0-1023");
        assert_eq!(
            s.action,
            Action::Status {
                sct_sc: 0x281,
                dnr: true,
                more: false
            }
        );
        assert_eq!(s.count, Some(3));
        assert_eq!(
            s.filter.opcode,
            Some(Opcode {
                set: CommandSet::Io,
                value: 0x02
            })
        );
        assert_eq!(s.filter.nsid, Some(1));
        assert_eq!(
            s.filter.lba,
            Some(LbaRange {
                first: 0,
                last: 1023
            })
        );
        assert_eq!(s.filter.queue, None);
    }

    #[test]
    fn parses_every_action_in_both_separator_styles() {
        assert_eq!(parse("media-error:lba=100-199").action, Action::MediaError);
        assert_eq!(parse("media-error:lba=100-199").filter.nsid, Some(1));
        let t = parse("timeout:opcode=read,count=1");
        assert_eq!(t.action, Action::Timeout { abortable: true });
        assert_eq!(t.count, Some(1));
        assert_eq!(
            parse("timeout,no-abort").action,
            Action::Timeout { abortable: false }
        );
        assert_eq!(
            parse("latency=5ms:opcode=write").action,
            Action::Latency {
                min: Duration::from_millis(5),
                max: Duration::from_millis(5)
            }
        );
        assert_eq!(
            parse("latency=250us").action,
            Action::Latency {
                min: Duration::from_micros(250),
                max: Duration::from_micros(250)
            }
        );
        let cfs = parse("cfs");
        assert_eq!(cfs.action, Action::ControllerFatal);
        assert_eq!(cfs.count, Some(1), "cfs fires once unless asked");
        let bug = parse("internal-error,opcode=read");
        assert_eq!(bug.action, Action::InternalError);
        assert_eq!(bug.count, Some(1), "internal-error fires once unless asked");
        assert_eq!(bug.to_string(), parse(&bug.to_string()).to_string());
        assert_eq!(parse("drop-irq:count=1").action, Action::DropInterrupt);
        assert_eq!(parse("corrupt:lba=8-15").action, Action::Corrupt);
        assert_eq!(parse("peer-fail:count=1").action, Action::PeerFail);
        assert_eq!(
            parse("peer-stall=5ms").action,
            Action::PeerStall(Duration::from_millis(5))
        );
        assert!(parse("peer-stall=5ms").action.is_peer());
        assert_eq!(
            parse("ns-not-ready,nsid=2").action,
            Action::NamespaceNotReady { dnr: false }
        );
        assert_eq!(parse("status=0x4,prob=25%").probability, Some(0.25));
        assert_eq!(parse("status=0x4,probability=0.5").probability, Some(0.5));
        let admin = parse("status=0x6,admin-opcode=identify");
        assert!(admin.filter.admin());
        assert!(parse("status=0x6,queue=0").filter.admin());
        assert!(!parse("status=0x6").filter.admin());
    }

    /// Catches a printer and a parser that disagree: what `status` shows
    /// must be pasteable.
    #[test]
    fn canonical_text_round_trips() {
        for text in [
            "status=0x281,dnr,count=3,opcode=read,nsid=1,lba=0-1023",
            "status=0x004,more,prob=0.5,queue=2",
            "status=0x281,count=1,after=99,opcode=read",
            "ns-not-ready,dnr,nsid=2",
            "media-error,nsid=1,lba=100-199",
            "timeout,no-abort,count=1,opcode=read",
            "latency=5ms,opcode=write",
            "latency=2s",
            "latency=7us",
            "latency=1ms-20ms",
            "delay-irq=3ms,count=1",
            "cfs,count=1",
            "drop-irq,count=1",
            "corrupt,lba=7",
            "peer-fail,count=1",
            "peer-stall=5ms,prob=0.5,after=2",
            "status=0x006,admin-opcode=identify",
            "status=0x006,admin-opcode=0x7f",
            "status=0x002,opcode=0x99",
        ] {
            let spec = parse(text);
            assert_eq!(spec.to_string(), text);
            assert_eq!(parse(&spec.to_string()), spec);
        }
        assert_eq!(
            parse("media-error:lba=100-199").to_string(),
            "media-error,nsid=1,lba=100-199"
        );
    }

    /// Catches errors that do not say which item is wrong.
    #[test]
    fn errors_name_the_bad_item() {
        let cases = [
            ("status=0x281,count=x", "count=x"),
            ("status=0x281,count=0", "count=0"),
            ("status", "status"),
            ("status=0", "status=0"),
            ("status=0x800", "status=0x800"),
            ("explode", "explode"),
            ("latency=5", "latency=5"),
            ("latency=5h", "latency=5h"),
            ("latency=61s", "latency=61s"),
            ("latency=9ms-2ms", "latency=9ms-2ms"),
            ("latency=1ms-", "latency=1ms-"),
            ("delay-irq", "delay-irq"),
            ("timeout,dnr", "dnr"),
            ("cfs,more", "more"),
            ("drop-irq,no-abort", "no-abort"),
            ("status=0x4,prob=0", "prob=0"),
            ("status=0x4,prob=150%", "prob=150%"),
            ("status=0x4,opcode=reed", "opcode=reed"),
            ("status=0x4,queue=70000", "queue=70000"),
            ("status=0x4,nsid=0", "nsid=0"),
            ("status=0x4,lba=9-3", "lba=9-3"),
            ("status=0x4,colour=red", "colour=red"),
            ("status=0x4,dnr=1", "dnr=1"),
            ("cfs=1", "cfs=1"),
            ("peer-fail=1", "peer-fail=1"),
            ("peer-fail,dnr", "dnr"),
            ("peer-stall", "peer-stall"),
            ("peer-stall=5h", "peer-stall=5h"),
        ];
        for (text, item) in cases {
            let e = refuse(text);
            assert_eq!(e.item, item, "{text}: {e}");
            assert!(!e.message.is_empty());
        }
        for text in [
            "media-error",
            "media-error,lba=1-2,count=1",
            "media-error,lba=1-2,opcode=read",
            "corrupt,opcode=write",
            "peer-fail,opcode=read",
            "peer-stall=1ms,lba=0-7",
            "status=0x4,queue=0,opcode=read",
            "status=0x4,queue=1,admin-opcode=identify",
            "",
            "status=0x4,,count=1",
        ] {
            refuse(text);
        }
    }

    fn io(opcode: u8, nsid: u32, lba: Option<(u64, u64)>) -> CommandInfo {
        CommandInfo {
            queue: 1,
            opcode,
            nsid,
            lba,
        }
    }

    /// Catches filters that ignore a field, LBA overlap off by one, and a
    /// bare spec that would hit admin commands.
    #[test]
    fn matches_on_every_field() {
        let s = parse("status=0x281,opcode=read,nsid=1,lba=100-199");
        assert!(s.matches(&io(0x02, 1, Some((100, 1)))));
        assert!(s.matches(&io(0x02, 1, Some((199, 1)))));
        assert!(s.matches(&io(0x02, 1, Some((90, 11)))));
        assert!(!s.matches(&io(0x02, 1, Some((90, 10)))));
        assert!(!s.matches(&io(0x02, 1, Some((200, 8)))));
        assert!(!s.matches(&io(0x01, 1, Some((100, 1)))));
        assert!(!s.matches(&io(0x02, 2, Some((100, 1)))));
        assert!(!s.matches(&io(0x02, 1, None)));
        let bare = parse("status=0x4");
        assert!(bare.matches(&io(0x00, 1, None)));
        let admin_cmd = CommandInfo {
            queue: 0,
            opcode: 0x06,
            nsid: 0,
            lba: None,
        };
        assert!(!bare.matches(&admin_cmd));
        assert!(parse("status=0x4,admin-opcode=identify").matches(&admin_cmd));
        assert!(!parse("status=0x4,admin-opcode=abort").matches(&admin_cmd));
        let q = parse("status=0x4,queue=2");
        assert!(!q.matches(&io(0x02, 1, None)));
        assert!(q.matches(&CommandInfo {
            queue: 2,
            ..io(0x02, 1, None)
        }));
    }
}
