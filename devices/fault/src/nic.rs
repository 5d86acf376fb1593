//! NIC wire injection specs and their injector: frames the wire drops,
//! delays or corrupts on their way out of a NIC.
//!
//! ```text
//! NIC_SPEC := ACTION { (',' | ':') ITEM }
//! ACTION   := drop | delay=DURATION | corrupt | drop-irq
//! ITEM     := count=N | prob=P
//! ```
//!
//! `drop` loses the frame on the wire (the sender's descriptor completes
//! OK, as on a real link); `corrupt` flips a payload byte after the frame
//! check sequence is computed, so the receiver reports a bad FCS; `delay`
//! holds the frame before it leaves; `drop-irq` completes a descriptor
//! without sending its interrupt. Like the other specs, one prints back in
//! a canonical form that parses to the same spec.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::injector::{ArmedReport, Dice};
use crate::spec::{
    error, format_duration, parse_duration, parse_number, parse_probability, SpecError, SpecItem,
};

/// What happens to a matching frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicAction {
    /// The wire loses the frame.
    Drop,
    /// The frame leaves this much later.
    Delay(Duration),
    /// One payload byte is flipped after the FCS is computed.
    Corrupt,
    /// The descriptor completes, INT_STATUS latches, no MSI-X is sent.
    DropInterrupt,
}

/// One NIC injection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NicFaultSpec {
    pub action: NicAction,
    /// Fire at most this many times (None: until cleared).
    pub count: Option<u64>,
    /// Fire on each frame with this probability (None: always).
    pub probability: Option<f64>,
}

impl FromStr for NicFaultSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let mut items = text.split([',', ':']).map(str::trim);
        let head_item = SpecItem::new(items.next().unwrap_or_default());
        let head = head_item.text;
        let no_value = || head_item.no_value("takes no value");
        let action = match head_item.name {
            "drop" => {
                no_value()?;
                NicAction::Drop
            }
            "corrupt" => {
                no_value()?;
                NicAction::Corrupt
            }
            "drop-irq" => {
                no_value()?;
                NicAction::DropInterrupt
            }
            "delay" => {
                let d = parse_duration(head_item.need_value("5ms")?).map_err(|m| error(head, m))?;
                if d.is_zero() {
                    return Err(error(head, "a delay must be longer than 0"));
                }
                NicAction::Delay(d)
            }
            "" => return Err(error(text, "empty spec")),
            other => {
                return Err(error(
                    head,
                    format!("{other:?} is not a NIC fault (drop, delay=, corrupt, drop-irq)"),
                ))
            }
        };
        let mut spec = NicFaultSpec {
            action,
            count: None,
            probability: None,
        };
        for item in items {
            let option = SpecItem::new(item);
            match option.name {
                "count" => {
                    let n = parse_number(option.need_value("N")?).map_err(|m| error(item, m))?;
                    if n == 0 {
                        return Err(error(item, "count must be at least 1"));
                    }
                    spec.count = Some(n);
                }
                "prob" | "probability" => {
                    spec.probability = Some(
                        parse_probability(option.need_value("0.1")?).map_err(|m| error(item, m))?,
                    );
                }
                "" => return Err(error(text, "empty item")),
                other => {
                    return Err(error(
                        item,
                        format!("{other:?} is not an item (count=, prob=)"),
                    ))
                }
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for NicFaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.action {
            NicAction::Drop => f.write_str("drop")?,
            NicAction::Corrupt => f.write_str("corrupt")?,
            NicAction::DropInterrupt => f.write_str("drop-irq")?,
            NicAction::Delay(d) => write!(f, "delay={}", format_duration(d))?,
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

/// What the armed specs want done to one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NicDecision {
    pub drop: bool,
    pub corrupt: bool,
    pub drop_interrupt: bool,
    /// The longest delay that fired.
    pub delay: Option<Duration>,
    /// How many armed specs fired on this frame.
    pub fired: u32,
}

#[derive(Debug, Clone)]
struct NicArmed {
    id: u64,
    spec: NicFaultSpec,
    fired: u64,
}

impl NicArmed {
    fn remaining(&self) -> Option<u64> {
        self.spec.count.map(|c| c.saturating_sub(self.fired))
    }
}

/// The armed wire specs of one NIC.
#[derive(Debug, Clone)]
pub struct NicInjector {
    armed: Vec<NicArmed>,
    next_id: u64,
    rng: Dice,
}

impl Default for NicInjector {
    fn default() -> Self {
        Self {
            armed: Vec::new(),
            next_id: 1,
            rng: Dice::default(),
        }
    }
}

impl NicInjector {
    /// Arms a spec; returns its ID.
    pub fn arm(&mut self, spec: NicFaultSpec) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.armed.push(NicArmed { id, spec, fired: 0 });
        id
    }

    /// Disarms everything.
    pub fn clear(&mut self) {
        self.armed.clear();
    }

    /// Whether nothing can fire.
    pub fn is_idle(&self) -> bool {
        self.armed.iter().all(|a| a.remaining() == Some(0))
    }

    /// Which specs fire on the next frame (counting them as fired).
    pub fn decide(&mut self) -> NicDecision {
        let mut d = NicDecision::default();
        for i in 0..self.armed.len() {
            let spec = self.armed[i].spec;
            if self.armed[i].remaining() == Some(0) {
                continue;
            }
            if let Some(p) = spec.probability {
                if self.rng.roll() >= p {
                    continue;
                }
            }
            self.armed[i].fired += 1;
            d.fired += 1;
            match spec.action {
                NicAction::Drop => d.drop = true,
                NicAction::Corrupt => d.corrupt = true,
                NicAction::DropInterrupt => d.drop_interrupt = true,
                NicAction::Delay(t) => d.delay = Some(d.delay.map_or(t, |old| old.max(t))),
            }
        }
        d
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

    fn spec(text: &str) -> NicFaultSpec {
        text.parse().unwrap()
    }

    /// Would catch a spec that prints text which parses to another spec.
    #[test]
    fn specs_round_trip() {
        for text in [
            "drop",
            "drop,count=3",
            "delay=5ms",
            "delay=250us,prob=0.5",
            "corrupt,count=1",
            "drop-irq,count=2",
        ] {
            let parsed = spec(text);
            assert_eq!(parsed.to_string(), text);
            assert_eq!(spec(&parsed.to_string()), parsed);
        }
        assert_eq!(spec("delay=2000ms:count=1").to_string(), "delay=2s,count=1");
    }

    /// Would catch a bad item being accepted or an error that does not
    /// name the item.
    #[test]
    fn errors_name_the_item() {
        for (text, item) in [
            ("drop=1", "drop=1"),
            ("delay", "delay"),
            ("delay=5", "delay=5"),
            ("delay=0ms", "delay=0ms"),
            ("delay=61s", "delay=61s"),
            ("explode", "explode"),
            ("drop,count=0", "count=0"),
            ("corrupt,prob=2", "prob=2"),
            ("drop,opcode=fill", "opcode=fill"),
        ] {
            let err = text.parse::<NicFaultSpec>().unwrap_err();
            assert_eq!(err.item, item, "{text}: {err}");
        }
        assert!("".parse::<NicFaultSpec>().is_err());
    }

    /// Would catch counts being ignored or actions mixed up.
    #[test]
    fn injector_counts_and_combines() {
        let mut inj = NicInjector::default();
        assert!(inj.is_idle());
        inj.arm(spec("drop,count=1"));
        inj.arm(spec("delay=5ms,count=2"));
        inj.arm(spec("delay=7ms,count=1"));
        let first = inj.decide();
        assert!(first.drop && !first.corrupt);
        assert_eq!(first.delay, Some(Duration::from_millis(7)));
        assert_eq!(first.fired, 3);
        let second = inj.decide();
        assert!(!second.drop);
        assert_eq!(second.delay, Some(Duration::from_millis(5)));
        assert_eq!(inj.decide(), NicDecision::default());
        assert!(inj.is_idle());
        let id = inj.arm(spec("corrupt"));
        assert!(inj.decide().corrupt);
        assert!(inj.decide().corrupt, "no count: until cleared");
        let report = inj.report();
        assert_eq!(report.iter().find(|r| r.id == id).unwrap().fired, 2);
        inj.clear();
        assert_eq!(inj.decide(), NicDecision::default());
    }
}
