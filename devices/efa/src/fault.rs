//! EFA fault injection: the EFA's action words for p2plab-fault's shared
//! grammar, its `opcode=` filter by the admin opcode table, and what the
//! armed specs decide for one packet, admin command, completion or
//! interrupt.
//!
//! ```text
//! EFA_SPEC := ACTION { (',' | ':') ITEM }
//! ACTION   := drop | delay=DURATION | corrupt | reorder
//!           | admin-error=STATUS | cq-error=STATUS | link-down | drop-irq
//! ITEM     := count=N | prob=P | after=N     (shared, p2plab-fault)
//!           | opcode=NAME|N                  (admin-error only)
//! ```
//!
//! The wire actions act on packets leaving the device: `drop` loses one,
//! `corrupt` flips a byte after the checksum is computed (the receiver
//! drops it), `delay` holds it, `reorder` holds it back until the next
//! packet has gone. SRD recovers from all of them by sending again, and
//! delivers out of order as the real one may. `admin-error=STATUS` answers
//! the next admin command (of `opcode=`, if given: a name from
//! `efa_admin_aq_opcode` such as `create-qp`, or a number) with that
//! status without running it; `cq-error=STATUS` gives the next completion
//! that status; `link-down` takes the fabric port down (an AENQ
//! notification, then SRD sends fail as unreachable) until the spec is
//! cleared; `drop-irq` skips an interrupt.

use std::fmt;
use std::time::Duration;

use p2plab_fault::{
    format_duration, opcode_text, parse_duration, parse_number, parse_opcode, spec_name, Filter,
    Idle, Injector, Item, OpcodeNames, SpecError, Vocabulary,
};

pub use p2plab_fault::{ArmError, ArmedReport};

use crate::defs::AdminOpcode;

/// One EFA injection: an [`EfaAction`], its filter and how often.
pub type EfaFaultSpec = p2plab_fault::Spec<EfaAction>;

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

/// The admin opcode table (`efa_admin_aq_opcode`) as fault specs name its
/// rows: `opcode=create-qp`.
#[derive(Debug, Clone, Copy)]
pub struct AdminOpcodeTable;

impl OpcodeNames for AdminOpcodeTable {
    fn opcode_names(&self) -> Vec<(u8, String)> {
        AdminOpcode::ALL
            .iter()
            .map(|op| (op.code(), spec_name(op.name())))
            .collect()
    }
}

/// `opcode=` in EFA specs: which admin command an `admin-error` applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EfaFilter {
    pub opcode: Option<u8>,
}

impl Filter for EfaFilter {
    type Subject = u8;
    const ITEMS: &'static str = "opcode= (admin-error only)";

    fn parse_item(&mut self, item: &Item<'_>) -> Option<Result<(), SpecError>> {
        (item.name == "opcode").then(|| {
            self.opcode =
                Some(item.parse("create-qp|9", |text| parse_opcode(text, &AdminOpcodeTable))?);
            Ok(())
        })
    }

    fn fmt_items(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.opcode {
            Some(op) => write!(f, ",opcode={}", opcode_text(op, &AdminOpcodeTable)),
            None => Ok(()),
        }
    }

    fn matches(&self, opcode: &u8) -> bool {
        self.opcode.is_none_or(|o| o == *opcode)
    }
}

fn parse_status(item: &Item<'_>, example: &str) -> Result<u8, SpecError> {
    let raw = item.parse(example, parse_number)?;
    match u8::try_from(raw) {
        Ok(status) if status != 0 => Ok(status),
        _ => Err(item.error("status must be 1..=255")),
    }
}

impl Vocabulary for EfaAction {
    type Filter = EfaFilter;
    const KIND: &'static str = "EFA fault";
    const ACTIONS: &'static str =
        "drop, delay=, corrupt, reorder, admin-error=, cq-error=, link-down, drop-irq";

    fn parse(item: &Item<'_>) -> Option<Result<Self, SpecError>> {
        Some(match item.name {
            "drop" => item.no_value().map(|()| EfaAction::Drop),
            "corrupt" => item.no_value().map(|()| EfaAction::Corrupt),
            "reorder" => item.no_value().map(|()| EfaAction::Reorder),
            "link-down" => item.no_value().map(|()| EfaAction::LinkDown),
            "drop-irq" => item.no_value().map(|()| EfaAction::DropInterrupt),
            "delay" => item.parse("5ms", parse_duration).and_then(|d| {
                if d.is_zero() {
                    Err(item.error("a delay must be longer than 0"))
                } else {
                    Ok(EfaAction::Delay(d))
                }
            }),
            "admin-error" => parse_status(item, "5").map(EfaAction::AdminError),
            "cq-error" => parse_status(item, "12").map(EfaAction::CqError),
            _ => return None,
        })
    }

    /// `opcode=` means something only to `admin-error`; `link-down` holds
    /// the port down while armed, so it takes no `count=`, `prob=` or
    /// `after=`.
    fn check(spec: &mut EfaFaultSpec) -> Result<(), String> {
        if spec.filter.opcode.is_some() && !matches!(spec.action, EfaAction::AdminError(_)) {
            return Err(format!(
                "opcode= applies to admin-error only, not {}",
                spec.action
            ));
        }
        if spec.action == EfaAction::LinkDown
            && (spec.count.is_some() || spec.probability.is_some() || spec.after.is_some())
        {
            return Err(
                "link-down holds the port down until cleared: no count=, prob= or after=".into(),
            );
        }
        Ok(())
    }
}

impl fmt::Display for EfaAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            EfaAction::Drop => f.write_str("drop"),
            EfaAction::Corrupt => f.write_str("corrupt"),
            EfaAction::Reorder => f.write_str("reorder"),
            EfaAction::LinkDown => f.write_str("link-down"),
            EfaAction::DropInterrupt => f.write_str("drop-irq"),
            EfaAction::Delay(d) => write!(f, "delay={}", format_duration(d)),
            EfaAction::AdminError(s) => write!(f, "admin-error={s}"),
            EfaAction::CqError(s) => write!(f, "cq-error={s}"),
        }
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

/// The armed specs of one EFA (at most
/// [`p2plab_fault::DEFAULT_MAX_ARMED`]).
#[derive(Debug, Clone, Default)]
pub struct EfaFaults {
    specs: Injector<EfaAction>,
}

impl Idle for EfaFaults {
    fn is_idle(&self) -> bool {
        self.specs.is_idle()
    }
}

impl EfaFaults {
    /// Arms a spec; returns its ID. A `link-down` counts as fired once
    /// when armed (its AENQ event goes out then).
    pub fn arm(&mut self, spec: EfaFaultSpec) -> Result<u64, ArmError> {
        let id = self.specs.arm(spec)?;
        if spec.action == EfaAction::LinkDown {
            // The new spec is the last link-down in arming order; older
            // ones fired when they were armed.
            let older = self.link_downs().saturating_sub(1);
            let mut seen = 0;
            self.specs.fire(
                |s| {
                    let new = s.action == EfaAction::LinkDown && seen == older;
                    seen += usize::from(s.action == EfaAction::LinkDown);
                    new
                },
                |_, _| {},
            );
        }
        Ok(id)
    }

    /// Disarms everything.
    pub fn clear(&mut self) {
        self.specs.clear();
    }

    /// Whether nothing can fire.
    pub fn is_idle(&self) -> bool {
        self.specs.is_idle()
    }

    /// Whether a `link-down` spec is armed.
    pub fn link_down(&self) -> bool {
        self.link_downs() > 0
    }

    fn link_downs(&self) -> usize {
        self.specs
            .armed()
            .iter()
            .filter(|a| a.spec.action == EfaAction::LinkDown)
            .count()
    }

    /// What happens to the next packet leaving the device.
    pub fn wire(&mut self) -> WireDecision {
        let mut d = WireDecision::default();
        self.specs.fire(
            |s| s.action.is_wire(),
            |s, _| match s.action {
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
        self.specs
            .fire_first(|s| {
                matches!(s.action, EfaAction::AdminError(_)) && s.filter.matches(&opcode)
            })
            .and_then(|s| match s.action {
                EfaAction::AdminError(status) => Some(status),
                _ => None,
            })
    }

    /// The status the next completion carries instead of its own, if one
    /// fires.
    pub fn cq_error(&mut self) -> Option<u8> {
        self.specs
            .fire_first(|s| matches!(s.action, EfaAction::CqError(_)))
            .and_then(|s| match s.action {
                EfaAction::CqError(status) => Some(status),
                _ => None,
            })
    }

    /// Whether the next interrupt is skipped.
    pub fn drop_interrupt(&mut self) -> bool {
        self.specs
            .fire_first(|s| s.action == EfaAction::DropInterrupt)
            .is_some()
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

    fn spec(text: &str) -> EfaFaultSpec {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    /// Catches: a spec that prints text which parses to another spec, or
    /// an opcode printed as a number when the table names it.
    #[test]
    fn specs_round_trip() {
        for text in [
            "drop",
            "drop,count=3",
            "delay=5ms,prob=0.5",
            "corrupt,count=1",
            "reorder,count=4,after=2",
            "admin-error=5",
            "admin-error=1,count=1,opcode=create-qp",
            "admin-error=2,opcode=0xee",
            "cq-error=12,count=2",
            "link-down",
            "drop-irq,count=1",
        ] {
            let parsed = round_trip::<EfaAction>(text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(parsed.to_string(), text);
        }
        let by_number = spec("admin-error=1,opcode=1");
        assert_eq!(by_number.filter.opcode, Some(AdminOpcode::CreateQp.code()));
        assert_eq!(by_number.to_string(), "admin-error=1,opcode=create-qp");
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
            ("admin-error=5,opcode=300", "opcode=300"),
            ("admin-error=5,opcode=launch", "opcode=launch"),
            ("reorder,count=0", "count=0"),
            ("explode", "explode"),
        ] {
            let err = text.parse::<EfaFaultSpec>().unwrap_err();
            assert_eq!(err.item, item, "{text}: {err}");
        }
        for text in ["link-down,count=2", "drop,opcode=3", "link-down,prob=0.5"] {
            let err = text.parse::<EfaFaultSpec>().unwrap_err();
            assert_eq!(err.item, text, "{text}: the whole spec is refused: {err}");
        }
    }

    /// Catches: actions firing on the wrong events, counts ignored, an
    /// admin error that ignores its opcode filter, or a link-down that is
    /// not reported as fired.
    #[test]
    fn each_action_fires_where_it_belongs() {
        let mut inj = EfaFaults::default();
        assert!(inj.is_idle());
        inj.arm(spec("admin-error=5,opcode=9,count=1")).unwrap();
        inj.arm(spec("cq-error=12,count=1")).unwrap();
        inj.arm(spec("reorder,count=1")).unwrap();
        inj.arm(spec("delay=2ms,count=1")).unwrap();
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
        inj.arm(spec("link-down")).unwrap();
        assert!(inj.link_down());
        assert!(!inj.is_idle());
        assert_eq!(inj.report().last().map(|r| r.fired), Some(1));
        inj.arm(spec("link-down")).unwrap();
        let fired: Vec<u64> = inj.report().iter().rev().take(2).map(|r| r.fired).collect();
        assert_eq!(fired, [1, 1], "each link-down fires once, when armed");
        inj.clear();
        assert!(!inj.link_down());
    }

    /// Catches: an injector without the shared cap (a control client
    /// could grow it without bound).
    #[test]
    fn arming_is_capped() {
        let mut inj = EfaFaults::default();
        for _ in 0..DEFAULT_MAX_ARMED {
            inj.arm(spec("drop,count=1")).unwrap();
        }
        assert!(inj.arm(spec("drop,count=1")).is_err());
    }
}
