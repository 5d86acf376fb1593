//! NIC wire fault injection: the wire's action words for p2plab-fault's
//! shared grammar, and what the armed specs decide for one frame.
//!
//! ```text
//! NIC_SPEC := ACTION { (',' | ':') ITEM }
//! ACTION   := drop | delay=DURATION | corrupt | drop-irq
//! ITEM     := count=N | prob=P | after=N     (shared, p2plab-fault)
//! ```
//!
//! `drop` loses the frame on the wire (the sender's descriptor completes
//! OK, as on a real link); `corrupt` flips a payload byte after the frame
//! check sequence is computed, so the receiver reports a bad FCS; `delay`
//! holds the frame before it leaves; `drop-irq` completes a descriptor
//! without sending its interrupt. Every spec applies to every frame (the
//! wire has no filters).

use std::fmt;
use std::time::Duration;

use p2plab_fault::{
    format_duration, parse_duration, Idle, Injector, Item, NoFilter, SpecError, Vocabulary,
};

pub use p2plab_fault::{ArmError, ArmedReport};

/// One NIC injection: a [`NicAction`] and how often.
pub type NicFaultSpec = p2plab_fault::Spec<NicAction>;

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

impl Vocabulary for NicAction {
    type Filter = NoFilter;
    const KIND: &'static str = "NIC fault";
    const ACTIONS: &'static str = "drop, delay=, corrupt, drop-irq";

    fn parse(item: &Item<'_>) -> Option<Result<Self, SpecError>> {
        Some(match item.name {
            "drop" => item.no_value().map(|()| NicAction::Drop),
            "corrupt" => item.no_value().map(|()| NicAction::Corrupt),
            "drop-irq" => item.no_value().map(|()| NicAction::DropInterrupt),
            "delay" => item.parse("5ms", parse_duration).and_then(|d| {
                if d.is_zero() {
                    Err(item.error("a delay must be longer than 0"))
                } else {
                    Ok(NicAction::Delay(d))
                }
            }),
            _ => return None,
        })
    }
}

impl fmt::Display for NicAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            NicAction::Drop => f.write_str("drop"),
            NicAction::Corrupt => f.write_str("corrupt"),
            NicAction::DropInterrupt => f.write_str("drop-irq"),
            NicAction::Delay(d) => write!(f, "delay={}", format_duration(d)),
        }
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

/// The armed wire specs of one NIC (at most
/// [`p2plab_fault::DEFAULT_MAX_ARMED`]).
#[derive(Debug, Clone, Default)]
pub struct NicFaults {
    specs: Injector<NicAction>,
}

impl Idle for NicFaults {
    fn is_idle(&self) -> bool {
        self.specs.is_idle()
    }
}

impl NicFaults {
    /// Arms a spec; returns its ID.
    pub fn arm(&mut self, spec: NicFaultSpec) -> Result<u64, ArmError> {
        self.specs.arm(spec)
    }

    /// Disarms everything.
    pub fn clear(&mut self) {
        self.specs.clear();
    }

    /// Which specs fire on the next frame (counting them as fired).
    pub fn decide(&mut self) -> NicDecision {
        let mut d = NicDecision::default();
        d.fired = self.specs.fire(
            |_| true,
            |spec, _| match spec.action {
                NicAction::Drop => d.drop = true,
                NicAction::Corrupt => d.corrupt = true,
                NicAction::DropInterrupt => d.drop_interrupt = true,
                NicAction::Delay(t) => d.delay = Some(d.delay.map_or(t, |old| old.max(t))),
            },
        );
        d
    }

    /// Armed specs as `status` reports them.
    pub fn report(&self) -> Vec<ArmedReport> {
        self.specs.report()
    }
}

#[cfg(test)]
mod tests {
    use p2plab_fault::{round_trip, DEFAULT_MAX_ARMED};

    use super::*;

    fn spec(text: &str) -> NicFaultSpec {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    /// Catches: a spec that prints text which parses to another spec, or
    /// a canonical form other than the one scripts and docs use.
    #[test]
    fn specs_round_trip() {
        for text in [
            "drop",
            "drop,count=3",
            "delay=5ms",
            "delay=250us,prob=0.5",
            "corrupt,count=1",
            "drop-irq,count=2",
            "drop,count=1,after=4",
        ] {
            let parsed = spec(text);
            assert_eq!(parsed.to_string(), text);
            assert_eq!(round_trip::<NicAction>(text), Some(parsed));
        }
        assert_eq!(spec("delay=2000ms:count=1").to_string(), "delay=2s,count=1");
        assert_eq!(
            spec("delay=7ms").action,
            NicAction::Delay(Duration::from_millis(7))
        );
    }

    /// Catches: a bad item accepted, or an error that does not name the
    /// item.
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
            ("drop,dnr", "dnr"),
        ] {
            let err = text.parse::<NicFaultSpec>().unwrap_err();
            assert_eq!(err.item, item, "{text}: {err}");
        }
        let unknown = "drop,opcode=fill".parse::<NicFaultSpec>().unwrap_err();
        assert_eq!(
            unknown.message,
            "\"opcode\" is not an option (count=, prob=, after=)"
        );
        assert!("".parse::<NicFaultSpec>().is_err());
    }

    /// Catches: counts ignored, actions mixed up, `after=` ignored, or a
    /// NIC that arms without end.
    #[test]
    fn injector_counts_combines_and_caps() {
        let mut inj = NicFaults::default();
        assert!(inj.is_idle());
        inj.arm(spec("drop,count=1")).unwrap();
        inj.arm(spec("delay=5ms,count=2")).unwrap();
        inj.arm(spec("delay=7ms,count=1")).unwrap();
        let first = inj.decide();
        assert!(first.drop && !first.corrupt);
        assert_eq!(first.delay, Some(Duration::from_millis(7)));
        assert_eq!(first.fired, 3);
        let second = inj.decide();
        assert!(!second.drop);
        assert_eq!(second.delay, Some(Duration::from_millis(5)));
        assert_eq!(inj.decide(), NicDecision::default());
        assert!(inj.is_idle());
        let id = inj.arm(spec("corrupt")).unwrap();
        assert!(inj.decide().corrupt);
        assert!(inj.decide().corrupt, "no count: until cleared");
        let report = inj.report();
        assert_eq!(report.iter().find(|r| r.id == id).unwrap().fired, 2);
        inj.clear();
        assert_eq!(inj.decide(), NicDecision::default());

        inj.arm(spec("drop-irq,count=1,after=2")).unwrap();
        let dropped: Vec<bool> = (0..4).map(|_| inj.decide().drop_interrupt).collect();
        assert_eq!(dropped, vec![false, false, true, false]);

        inj.clear();
        for _ in 0..DEFAULT_MAX_ARMED {
            inj.arm(spec("delay=1us")).unwrap();
        }
        assert_eq!(inj.arm(spec("drop")).unwrap_err().cap, DEFAULT_MAX_ARMED);
    }
}
