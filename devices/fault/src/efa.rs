//! EFA injection specs and their injector: packets the fabric drops,
//! delays, corrupts or reorders; admin commands and completions that fail;
//! the port going down; interrupts that are not sent.
//!
//! ```text
//! EFA_SPEC := ACTION { (',' | ':') ITEM }
//! ACTION   := drop | delay=DURATION | corrupt | reorder
//!           | admin-error=STATUS | cq-error=STATUS | link-down | drop-irq
//! ITEM     := count=N | prob=P | opcode=N   (opcode: admin-error only)
//! ```
//!
//! The wire actions act on packets leaving the device: `drop` loses one,
//! `corrupt` flips a byte after the checksum is computed (the receiver
//! drops it), `delay` holds it, `reorder` holds it back until the next
//! packet has gone. SRD recovers from all of them by sending again, and
//! delivers out of order as the real one may. `admin-error=STATUS` answers
//! the next admin command (of `opcode=N`, if given) with that status
//! without running it; `cq-error=STATUS` gives the next completion that
//! status; `link-down` takes the fabric port down (an AENQ notification,
//! then SRD sends fail as unreachable) until the spec is cleared;
//! `drop-irq` skips an interrupt.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::injector::{ArmedReport, Dice};
use crate::spec::{
    error, format_duration, parse_duration, parse_number, parse_probability, SpecError, SpecItem,
};

/// What a spec does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EfaAction {
    /// A packet is lost.
    Drop,
    /// A packet leaves this much later.
    Delay(Duration),
    /// A packet's byte is flipped after its checksum is computed.
    Corrupt,
    /// A packet is held back until the next one has left.
    Reorder,
    /// An admin command completes with this status, not run.
    AdminError(u8),
    /// A completion carries this status.
    CqError(u8),
    /// The port is down while armed.
    LinkDown,
    /// An interrupt is not sent.
    DropInterrupt,
}

impl EfaAction {
    fn is_wire(self) -> bool {
        matches!(
            self,
            EfaAction::Drop | EfaAction::Delay(_) | EfaAction::Corrupt | EfaAction::Reorder
        )
    }
}

/// One EFA injection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EfaFaultSpec {
    pub action: EfaAction,
    /// Fire at most this many times (None: until cleared).
    pub count: Option<u64>,
    /// Fire with this probability (None: always).
    pub probability: Option<f64>,
    /// `admin-error` only: the opcode it applies to.
    pub opcode: Option<u8>,
}

fn parse_status(item: &str, value: &str, max: u64) -> Result<u8, SpecError> {
    let raw = parse_number(value).map_err(|m| error(item, m))?;
    if raw == 0 || raw > max {
        return Err(error(item, format!("status must be 1..={max}")));
    }
    Ok(raw as u8)
}

impl FromStr for EfaFaultSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let mut items = text.split([',', ':']).map(str::trim);
        let head_item = SpecItem::new(items.next().unwrap_or_default());
        let head = head_item.text;
        let no_value = || head_item.no_value("takes no value");
        let action = match head_item.name {
            "drop" => no_value().map(|()| EfaAction::Drop)?,
            "corrupt" => no_value().map(|()| EfaAction::Corrupt)?,
            "reorder" => no_value().map(|()| EfaAction::Reorder)?,
            "link-down" => no_value().map(|()| EfaAction::LinkDown)?,
            "drop-irq" => no_value().map(|()| EfaAction::DropInterrupt)?,
            "delay" => {
                let d = parse_duration(head_item.need_value("5ms")?).map_err(|m| error(head, m))?;
                if d.is_zero() {
                    return Err(error(head, "a delay must be longer than 0"));
                }
                EfaAction::Delay(d)
            }
            "admin-error" => {
                EfaAction::AdminError(parse_status(head, head_item.need_value("5")?, 255)?)
            }
            "cq-error" => EfaAction::CqError(parse_status(head, head_item.need_value("12")?, 255)?),
            "" => return Err(error(text, "empty spec")),
            other => {
                return Err(error(
                    head,
                    format!(
                        "{other:?} is not an EFA fault (drop, delay=, corrupt, reorder, \
                         admin-error=, cq-error=, link-down, drop-irq)"
                    ),
                ))
            }
        };
        let mut spec = EfaFaultSpec {
            action,
            count: None,
            probability: None,
            opcode: None,
        };
        for item in items {
            let option = SpecItem::new(item);
            match option.name {
                "count" if action != EfaAction::LinkDown => {
                    let n = parse_number(option.need_value("N")?).map_err(|m| error(item, m))?;
                    if n == 0 {
                        return Err(error(item, "count must be at least 1"));
                    }
                    spec.count = Some(n);
                }
                "prob" | "probability" if action != EfaAction::LinkDown => {
                    spec.probability = Some(
                        parse_probability(option.need_value("0.1")?).map_err(|m| error(item, m))?,
                    );
                }
                "opcode" if matches!(action, EfaAction::AdminError(_)) => {
                    let n = parse_number(option.need_value("9")?).map_err(|m| error(item, m))?;
                    let n = u8::try_from(n).map_err(|_| error(item, "opcode must be 0..=255"))?;
                    spec.opcode = Some(n);
                }
                "" => return Err(error(text, "empty item")),
                other => {
                    return Err(error(
                        item,
                        format!("{other:?} is not an item of {head} (count=, prob=, opcode= for admin-error)"),
                    ))
                }
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for EfaFaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.action {
            EfaAction::Drop => f.write_str("drop")?,
            EfaAction::Corrupt => f.write_str("corrupt")?,
            EfaAction::Reorder => f.write_str("reorder")?,
            EfaAction::LinkDown => f.write_str("link-down")?,
            EfaAction::DropInterrupt => f.write_str("drop-irq")?,
            EfaAction::Delay(d) => write!(f, "delay={}", format_duration(d))?,
            EfaAction::AdminError(s) => write!(f, "admin-error={s}")?,
            EfaAction::CqError(s) => write!(f, "cq-error={s}")?,
        }
        if let Some(op) = self.opcode {
            write!(f, ",opcode={op}")?;
        }
        if let Some(n) = self.count {
            write!(f, ",count={n}")?;
        }
        if let Some(p) = self.probability {
            write!(f, ",prob={p}")?;
        }
        Ok(())
    }
}

/// What the armed wire specs want done to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireDecision {
    pub drop: bool,
    pub corrupt: bool,
    pub reorder: bool,
    /// The longest delay that fired.
    pub delay: Option<Duration>,
}

#[derive(Debug, Clone)]
struct EfaArmed {
    id: u64,
    spec: EfaFaultSpec,
    fired: u64,
}

impl EfaArmed {
    fn live(&self) -> bool {
        self.spec.count.is_none_or(|c| self.fired < c)
    }
}

/// The armed specs of one EFA.
#[derive(Debug, Clone)]
pub struct EfaInjector {
    armed: Vec<EfaArmed>,
    next_id: u64,
    rng: Dice,
}

impl Default for EfaInjector {
    fn default() -> Self {
        Self {
            armed: Vec::new(),
            next_id: 1,
            rng: Dice::default(),
        }
    }
}

impl EfaInjector {
    /// Arms a spec; returns its ID.
    pub fn arm(&mut self, spec: EfaFaultSpec) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.armed.push(EfaArmed { id, spec, fired: 0 });
        id
    }

    /// Disarms everything.
    pub fn clear(&mut self) {
        self.armed.clear();
    }

    /// Whether nothing can fire.
    pub fn is_idle(&self) -> bool {
        !self.armed.iter().any(EfaArmed::live)
    }

    /// Whether a `link-down` spec is armed (it fired once when armed).
    pub fn link_down(&self) -> bool {
        self.armed
            .iter()
            .any(|a| a.spec.action == EfaAction::LinkDown)
    }

    /// Marks the `link-down` specs as having fired (their AENQ event went
    /// out).
    pub fn note_link_down(&mut self) {
        for a in &mut self.armed {
            if a.spec.action == EfaAction::LinkDown {
                a.fired = a.fired.max(1);
            }
        }
    }

    /// Fires the live specs `select` accepts (counting them), after their
    /// probability; calls `apply` with each that fired.
    fn fire(&mut self, select: impl Fn(&EfaFaultSpec) -> bool, mut apply: impl FnMut(EfaAction)) {
        for i in 0..self.armed.len() {
            let spec = self.armed[i].spec;
            if !self.armed[i].live() || !select(&spec) {
                continue;
            }
            if let Some(p) = spec.probability {
                if self.rng.roll() >= p {
                    continue;
                }
            }
            self.armed[i].fired += 1;
            apply(spec.action);
        }
    }

    /// What happens to the next packet leaving the device.
    pub fn wire(&mut self) -> WireDecision {
        let mut d = WireDecision::default();
        self.fire(
            |s| s.action.is_wire(),
            |action| match action {
                EfaAction::Drop => d.drop = true,
                EfaAction::Corrupt => d.corrupt = true,
                EfaAction::Reorder => d.reorder = true,
                EfaAction::Delay(t) => d.delay = Some(d.delay.map_or(t, |old| old.max(t))),
                _ => {}
            },
        );
        d
    }

    /// The status the next admin command of `opcode` completes with
    /// instead of running, if one fires.
    pub fn admin_error(&mut self, opcode: u8) -> Option<u8> {
        let mut status = None;
        self.fire(
            |s| {
                matches!(s.action, EfaAction::AdminError(_)) && s.opcode.is_none_or(|o| o == opcode)
            },
            |action| {
                if let EfaAction::AdminError(s) = action {
                    status.get_or_insert(s);
                }
            },
        );
        status
    }

    /// The status the next completion carries instead of its own, if one
    /// fires.
    pub fn cq_error(&mut self) -> Option<u8> {
        let mut status = None;
        self.fire(
            |s| matches!(s.action, EfaAction::CqError(_)),
            |action| {
                if let EfaAction::CqError(s) = action {
                    status.get_or_insert(s);
                }
            },
        );
        status
    }

    /// Whether the next interrupt is skipped.
    pub fn drop_interrupt(&mut self) -> bool {
        let mut drop = false;
        self.fire(|s| s.action == EfaAction::DropInterrupt, |_| drop = true);
        drop
    }

    /// Armed specs as `status` reports them.
    pub fn report(&self) -> Vec<ArmedReport> {
        self.armed
            .iter()
            .map(|a| ArmedReport::new(a.id, &a.spec, a.fired, a.spec.count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> EfaFaultSpec {
        text.parse().unwrap()
    }

    /// Catches: a spec that prints text which parses to another spec.
    #[test]
    fn specs_round_trip() {
        for text in [
            "drop",
            "drop,count=3",
            "delay=5ms,prob=0.5",
            "corrupt,count=1",
            "reorder,count=4",
            "admin-error=5",
            "admin-error=1,opcode=9,count=1",
            "cq-error=12,count=2",
            "link-down",
            "drop-irq,count=1",
        ] {
            let parsed = spec(text);
            assert_eq!(parsed.to_string(), text);
            assert_eq!(spec(&parsed.to_string()), parsed);
        }
    }

    /// Catches: a bad item accepted, or an error that does not name it.
    #[test]
    fn errors_name_the_item() {
        for (text, item) in [
            ("drop=1", "drop=1"),
            ("admin-error", "admin-error"),
            ("admin-error=0", "admin-error=0"),
            ("admin-error=256", "admin-error=256"),
            ("cq-error=x", "cq-error=x"),
            ("link-down,count=2", "count=2"),
            ("drop,opcode=3", "opcode=3"),
            ("admin-error=5,opcode=300", "opcode=300"),
            ("reorder,count=0", "count=0"),
            ("explode", "explode"),
        ] {
            let err = text.parse::<EfaFaultSpec>().unwrap_err();
            assert_eq!(err.item, item, "{text}: {err}");
        }
    }

    /// Catches: actions firing on the wrong events, counts ignored, or an
    /// admin error that ignores its opcode filter.
    #[test]
    fn each_action_fires_where_it_belongs() {
        let mut inj = EfaInjector::default();
        assert!(inj.is_idle());
        inj.arm(spec("admin-error=5,opcode=9,count=1"));
        inj.arm(spec("cq-error=12,count=1"));
        inj.arm(spec("reorder,count=1"));
        inj.arm(spec("delay=2ms,count=1"));
        assert_eq!(inj.admin_error(7), None, "other opcode");
        assert_eq!(inj.admin_error(9), Some(5));
        assert_eq!(inj.admin_error(9), None, "count spent");
        let first = inj.wire();
        assert!(first.reorder && !first.drop);
        assert_eq!(first.delay, Some(Duration::from_millis(2)));
        assert_eq!(inj.wire(), WireDecision::default());
        assert_eq!(inj.cq_error(), Some(12));
        assert_eq!(inj.cq_error(), None);
        assert!(!inj.drop_interrupt());
        assert!(inj.is_idle());
        inj.arm(spec("link-down"));
        assert!(inj.link_down());
        assert!(!inj.is_idle());
        inj.note_link_down();
        assert_eq!(inj.report().last().unwrap().fired, 1);
        inj.clear();
        assert!(!inj.link_down());
    }
}
