//! GPU fault injection: the engine's action words and its `opcode=`
//! filter for p2plab-fault's shared grammar, and what the armed specs
//! decide for one job or one VRAM read.
//!
//! ```text
//! GPU_SPEC := ACTION { (',' | ':') ITEM }
//! ACTION   := job-error=CODE | hang | drop-irq | vram-error=OFF[-LAST]
//! ITEM     := count=N | prob=P | after=N     (shared, p2plab-fault)
//!           | opcode=NAME|0xNN               (job actions only)
//! ```
//!
//! `CODE` is a status code a command can retire with (0x01..=0x06);
//! `OFF[-LAST]` an inclusive byte range of VRAM. Opcode names are the
//! opcode table's own, in lower case with `-` for `_` (`copy-to-vram`),
//! so the filter's text form lives beside the table, in
//! `engine::opcodes`; this module holds what the engine and the device
//! state need below it.

use std::fmt;

use p2plab_fault::{parse_number, parse_range, Idle, Injector, Item, SpecError, Vocabulary};

use crate::status::StatusCode;

pub use p2plab_fault::{ArmError, ArmedReport};

/// One GPU injection: a [`GpuAction`], the jobs it applies to
/// ([`GpuFilter`]), and how often.
pub type GpuFaultSpec = p2plab_fault::Spec<GpuAction>;

/// What happens to a matching engine job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuAction {
    /// The job retires at once, not executed, with this status (a command
    /// error).
    JobError(StatusCode),
    /// The engine takes the job and never retires it, until the driver
    /// disables the ring or resets the device.
    Hang,
    /// The job retires, INT_STATUS latches its causes, but no MSI-X is sent.
    DropInterrupt,
    /// Reads of these VRAM bytes (inclusive) fail with VRAM_IO and are
    /// reported in the device's VRAM error registers, until cleared.
    VramError { first: u64, last: u64 },
}

impl GpuAction {
    /// Whether the action applies to jobs one at a time (not a persistent
    /// VRAM range).
    pub fn is_job_action(&self) -> bool {
        !matches!(self, GpuAction::VramError { .. })
    }
}

/// Which jobs a GPU spec applies to. Its text form (`opcode=fill`) is
/// implemented beside the opcode table (`engine::opcodes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuFilter {
    /// Only jobs with this opcode.
    pub opcode: Option<u8>,
}

impl GpuFilter {
    /// Whether a job with `opcode` is one the spec applies to.
    pub fn applies_to(&self, opcode: u8) -> bool {
        self.opcode.is_none_or(|op| op == opcode)
    }
}

/// `job-error=CODE`: a status a command can retire with.
fn job_error(item: &Item<'_>) -> Result<GpuAction, SpecError> {
    let code = item.parse("0x06", parse_number)?;
    u32::try_from(code)
        .ok()
        .and_then(StatusCode::from_code)
        .filter(|s| s.is_command_error())
        .map(GpuAction::JobError)
        .ok_or_else(|| {
            let codes: Vec<String> = StatusCode::ALL
                .iter()
                .filter(|s| s.is_command_error())
                .map(|s| format!("{:#04x} {}", s.code(), s.name()))
                .collect();
            item.error(format!("not a command error status ({})", codes.join(", ")))
        })
}

impl Vocabulary for GpuAction {
    type Filter = GpuFilter;
    const KIND: &'static str = "GPU fault";
    const ACTIONS: &'static str = "job-error=, hang, drop-irq, vram-error=";

    fn parse(item: &Item<'_>) -> Option<Result<Self, SpecError>> {
        Some(match item.name {
            "job-error" => job_error(item),
            "hang" => item.no_value().map(|()| GpuAction::Hang),
            "drop-irq" => item.no_value().map(|()| GpuAction::DropInterrupt),
            "vram-error" => item
                .parse("0x100000-0x1fffff", parse_range)
                .map(|(first, last)| GpuAction::VramError { first, last }),
            _ => return None,
        })
    }

    fn check(spec: &mut GpuFaultSpec) -> Result<(), String> {
        if !spec.action.is_job_action()
            && (spec.filter.opcode.is_some() || spec.probability.is_some() || spec.after.is_some())
        {
            return Err(
                "vram-error is a persistent range: it takes no opcode=, prob= or after=".into(),
            );
        }
        Ok(())
    }
}

impl fmt::Display for GpuAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GpuAction::JobError(status) => write!(f, "job-error={:#04x}", status.code()),
            GpuAction::Hang => f.write_str("hang"),
            GpuAction::DropInterrupt => f.write_str("drop-irq"),
            GpuAction::VramError { first, last } if first == last => {
                write!(f, "vram-error={first:#x}")
            }
            GpuAction::VramError { first, last } => write!(f, "vram-error={first:#x}-{last:#x}"),
        }
    }
}

/// What the armed specs want done to one engine job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuDecision {
    /// Retire at once with this status.
    pub error: Option<StatusCode>,
    /// Never retire (until the ring is disabled or the device reset).
    pub hang: bool,
    /// Retire without sending the interrupt.
    pub drop_interrupt: bool,
    /// How many armed specs fired on this job.
    pub fired: u32,
}

/// The armed GPU specs of one device (at most
/// [`p2plab_fault::DEFAULT_MAX_ARMED`]).
#[derive(Debug, Clone, Default)]
pub struct GpuFaults {
    specs: Injector<GpuAction>,
}

impl Idle for GpuFaults {
    fn is_idle(&self) -> bool {
        self.specs.is_idle()
    }
}

impl GpuFaults {
    /// Arms a spec; returns its ID.
    pub fn arm(&mut self, spec: GpuFaultSpec) -> Result<u64, ArmError> {
        self.specs.arm(spec)
    }

    /// Disarms everything, VRAM error ranges included.
    pub fn clear(&mut self) {
        self.specs.clear();
    }

    /// Which job specs fire on a job with `opcode` (counting them as fired).
    pub fn decide(&mut self, opcode: u8) -> GpuDecision {
        let mut d = GpuDecision::default();
        d.fired = self.specs.fire(
            |s| s.action.is_job_action() && s.filter.applies_to(opcode),
            |spec, _| match spec.action {
                GpuAction::JobError(status) => {
                    d.error.get_or_insert(status);
                }
                GpuAction::Hang => d.hang = true,
                GpuAction::DropInterrupt => d.drop_interrupt = true,
                GpuAction::VramError { .. } => {}
            },
        );
        d
    }

    /// The first bad byte among `len` bytes of VRAM from `offset`, if an
    /// armed VRAM error range (with fires left) overlaps them; that range
    /// counts one fire.
    pub fn vram_error(&mut self, offset: u64, len: u64) -> Option<u64> {
        if len == 0 {
            return None;
        }
        let end = offset.saturating_add(len - 1);
        let range = |spec: &GpuFaultSpec| match spec.action {
            GpuAction::VramError { first, last } if offset <= last && end >= first => Some(first),
            _ => None,
        };
        let spec = self.specs.fire_first(|s| range(s).is_some())?;
        range(&spec).map(|first| first.max(offset))
    }

    /// Armed specs as `status` reports them.
    pub fn report(&self) -> Vec<ArmedReport> {
        self.specs.report()
    }
}

#[cfg(test)]
mod tests {
    use p2plab_fault::{round_trip, spec_name, DEFAULT_MAX_ARMED};

    use super::*;
    use crate::engine::opcodes::OPCODES;

    fn spec(text: &str) -> GpuFaultSpec {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    /// Catches: a spec that prints text which parses to another spec, or
    /// a canonical form other than the one scripts and docs use.
    #[test]
    fn specs_round_trip() {
        for text in [
            "job-error=0x06",
            "job-error=0x01,opcode=fill,count=2",
            "hang,count=1",
            "drop-irq,opcode=checksum,prob=0.5",
            "vram-error=0x100000-0x1fffff",
            "vram-error=0x1000,count=3",
            "hang,opcode=0x7f",
            "hang,opcode=nop,count=2,after=1",
        ] {
            let parsed = spec(text);
            assert_eq!(parsed.to_string(), text);
            assert_eq!(round_trip::<GpuAction>(text), Some(parsed));
        }
        assert_eq!(
            spec("job-error=6:count=1").to_string(),
            "job-error=0x06,count=1"
        );
        assert_eq!(
            spec("vram-error=4096-8191").action,
            GpuAction::VramError {
                first: 4096,
                last: 8191
            }
        );
        assert_eq!(
            spec("job-error=0x04").action,
            GpuAction::JobError(StatusCode::HostDma)
        );
    }

    /// Catches: a bad item accepted, or an error that does not name the
    /// item.
    #[test]
    fn errors_name_the_item() {
        let cases = [
            ("job-error", "job-error"),
            ("job-error=0", "job-error=0"),
            ("job-error=0x07", "job-error=0x07"),
            ("job-error=0x10", "job-error=0x10"),
            ("job-error=0x100", "job-error=0x100"),
            ("hang=1", "hang=1"),
            ("explode", "explode"),
            ("hang,count=0", "count=0"),
            ("hang,opcode=teleport", "opcode=teleport"),
            ("hang,lba=1", "lba=1"),
            ("hang,dnr", "dnr"),
            ("vram-error=9-1", "vram-error=9-1"),
            ("drop-irq,prob=2", "prob=2"),
            ("hang,cnt=1", "cnt=1"),
        ];
        for (text, item) in cases {
            let err = text.parse::<GpuFaultSpec>().unwrap_err();
            assert_eq!(err.item, item, "{text}: {err}");
        }
        let code = "job-error=0x07".parse::<GpuFaultSpec>().unwrap_err();
        assert!(code.message.contains("not a command error"), "{code}");
        assert!(code.message.contains("0x06 ERR_VRAM_IO"), "{code}");
        for text in [
            "vram-error=0-1,opcode=fill",
            "vram-error=0-1,prob=0.5",
            "vram-error=0-1,after=1",
            "",
        ] {
            assert!(text.parse::<GpuFaultSpec>().is_err(), "{text}");
        }
    }

    /// Catches: an opcode row that cannot be targeted by name (a second
    /// list of names that fell behind the table), or a name that parses to
    /// another opcode. Adding a row is enough: this test reads the table.
    #[test]
    fn every_opcode_of_the_table_is_an_opcode_filter() {
        assert!(OPCODES.len() >= 6);
        for row in OPCODES {
            let text = format!("hang,opcode={}", spec_name(row.name));
            let parsed = spec(&text);
            assert_eq!(parsed.filter.opcode, Some(row.opcode), "{text}");
            assert_eq!(parsed.to_string(), text);
            let by_number = spec(&format!("hang,opcode={:#04x}", row.opcode));
            assert_eq!(by_number.to_string(), text);
        }
    }

    /// Catches: a list of opcode names brought back beside the table (in
    /// p2plab-fault or in this module), where a new opcode could fall out
    /// of it: no row's name in specs may be spelled out as a string there.
    #[test]
    fn no_fault_code_spells_out_an_opcode_name() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![root.join("src/fault.rs")];
        for entry in std::fs::read_dir(root.join("../fault/src")).unwrap() {
            files.push(entry.unwrap().path());
        }
        for path in &files {
            let text = std::fs::read_to_string(path).unwrap();
            for row in OPCODES {
                let quoted = format!("\"{}\"", spec_name(row.name));
                assert!(
                    !text.contains(&quoted),
                    "{} spells out {quoted}: opcode names come from the opcode table",
                    path.display()
                );
            }
        }
        assert!(files.len() >= 5, "{files:?}");
    }

    /// Catches: count, opcode filters or the VRAM range ignored.
    #[test]
    fn injector_counts_filters_and_ranges() {
        let mut inj = GpuFaults::default();
        assert!(inj.is_idle());
        inj.arm(spec("job-error=0x06,opcode=fill,count=1")).unwrap();
        inj.arm(spec("hang,opcode=checksum,count=1")).unwrap();
        inj.arm(spec("drop-irq,count=2")).unwrap();
        let nop = inj.decide(0x00);
        assert_eq!(
            (nop.error, nop.hang, nop.drop_interrupt),
            (None, false, true)
        );
        let fill = inj.decide(0x04);
        assert_eq!(fill.error, Some(StatusCode::VramIo));
        assert!(fill.drop_interrupt);
        assert_eq!(inj.decide(0x04), GpuDecision::default(), "counts used up");
        let sum = inj.decide(0x05);
        assert!(sum.hang);
        assert_eq!(inj.decide(0x05), GpuDecision::default());
        assert!(inj.is_idle());

        let id = inj.arm(spec("vram-error=0x1000-0x1fff")).unwrap();
        assert!(!inj.is_idle());
        assert_eq!(inj.decide(0x05), GpuDecision::default(), "not a job fault");
        assert_eq!(inj.vram_error(0, 0x1000), None, "just below");
        assert_eq!(inj.vram_error(0x2000, 0x1000), None, "just above");
        assert_eq!(inj.vram_error(0x1fff, 0), None, "empty");
        assert_eq!(inj.vram_error(0, 0x1001), Some(0x1000));
        assert_eq!(inj.vram_error(0x1800, 0x10), Some(0x1800));
        let report = inj.report();
        let armed = report.iter().find(|r| r.id == id).unwrap();
        assert_eq!(armed.fired, 2);
        assert_eq!(armed.spec, "vram-error=0x1000-0x1fff");
        inj.clear();
        assert_eq!(inj.vram_error(0x1800, 0x10), None);
        assert!(inj.is_idle());
    }

    /// Catches: a probability that fires always or never, and `after=`
    /// ignored on jobs.
    #[test]
    fn probability_and_after() {
        let mut inj = GpuFaults::default();
        inj.arm(spec("job-error=0x06,prob=0.5")).unwrap();
        let fired = (0..1000).filter(|_| inj.decide(0).error.is_some()).count();
        assert!((350..650).contains(&fired), "{fired}");
        let mut inj = GpuFaults::default();
        inj.arm(spec("hang,count=1,after=2")).unwrap();
        let hangs: Vec<bool> = (0..4).map(|_| inj.decide(0).hang).collect();
        assert_eq!(hangs, vec![false, false, true, false]);
    }

    /// Catches: a device that arms without end (its control socket is
    /// reachable from the guest).
    #[test]
    fn armed_specs_are_capped() {
        let mut inj = GpuFaults::default();
        for _ in 0..DEFAULT_MAX_ARMED {
            inj.arm(spec("drop-irq")).unwrap();
        }
        let refused = inj.arm(spec("drop-irq")).unwrap_err();
        assert_eq!(refused.cap, DEFAULT_MAX_ARMED);
        assert_eq!(inj.report().len(), DEFAULT_MAX_ARMED);
    }
}
