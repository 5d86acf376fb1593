//! GPU injection specs and their injector: engine jobs that fail, hang or
//! retire without an interrupt, and VRAM ranges that report errors.
//!
//! ```text
//! GPU_SPEC := ACTION { (',' | ':') ITEM }
//! ACTION   := job-error=CODE | hang | drop-irq | vram-error=OFF[-LAST]
//! ITEM     := count=N | prob=P | opcode=NAME|0xNN
//! ```
//!
//! `CODE` is the device status code the job retires with (the device
//! checks that it is one of its command errors); `OFF[-LAST]` an inclusive
//! byte range of VRAM. Opcode names: nop, copy-to-vram, copy-from-vram,
//! copy-vram, fill, checksum. Like [`crate::FaultSpec`], a spec prints back
//! in one canonical form that parses to the same spec.

use std::fmt;
use std::str::FromStr;

use crate::injector::{ArmedReport, Dice};
use crate::spec::{error, parse_number, parse_probability, parse_range, SpecError, SpecItem};

/// What happens to a matching engine job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuAction {
    /// The job retires at once, not executed, with this status code.
    JobError { code: u8 },
    /// The engine takes the job and never retires it, until the driver
    /// disables the ring or resets the device.
    Hang,
    /// The job retires, INT_STATUS latches its causes, but no MSI-X is sent.
    DropInterrupt,
    /// Reads of these VRAM bytes (inclusive) fail with VRAM_IO and are
    /// reported in the device's VRAM error registers, until cleared.
    VramError { first: u64, last: u64 },
}

/// Engine opcode names as specs spell them.
const GPU_OPCODES: &[(&str, u8)] = &[
    ("nop", 0x00),
    ("copy-to-vram", 0x01),
    ("copy-from-vram", 0x02),
    ("copy-vram", 0x03),
    ("fill", 0x04),
    ("checksum", 0x05),
];

fn opcode_name(value: u8) -> Option<&'static str> {
    GPU_OPCODES
        .iter()
        .find(|(_, v)| *v == value)
        .map(|(n, _)| *n)
}

/// One GPU injection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuFaultSpec {
    pub action: GpuAction,
    /// Only jobs with this opcode (job actions only).
    pub opcode: Option<u8>,
    /// Fire at most this many times (None: until cleared).
    pub count: Option<u64>,
    /// Fire on each matching job with this probability (None: always).
    pub probability: Option<f64>,
}

impl GpuFaultSpec {
    /// Whether the spec applies to jobs one at a time (not a persistent
    /// VRAM range).
    pub fn is_job_action(&self) -> bool {
        !matches!(self.action, GpuAction::VramError { .. })
    }
}

impl FromStr for GpuFaultSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let mut items = text.split([',', ':']).map(str::trim);
        let head_item = SpecItem::new(items.next().unwrap_or_default());
        let (head, name) = (head_item.text, head_item.name);
        let need_value = |what: &str| head_item.need_value(what);
        let no_value = || head_item.no_value("takes no value");
        let action = match name {
            "job-error" => {
                let code = parse_number(need_value("0x06")?).map_err(|m| error(head, m))?;
                match u8::try_from(code) {
                    Ok(code) if code != 0 => GpuAction::JobError { code },
                    _ => {
                        return Err(error(
                            head,
                            "not a failure status: a device status code 0x01..0xff \
                             (0x06 is VRAM_IO)",
                        ))
                    }
                }
            }
            "hang" => {
                no_value()?;
                GpuAction::Hang
            }
            "drop-irq" => {
                no_value()?;
                GpuAction::DropInterrupt
            }
            "vram-error" => {
                let (first, last) =
                    parse_range(need_value("0x100000-0x1fffff")?).map_err(|m| error(head, m))?;
                GpuAction::VramError { first, last }
            }
            "" => return Err(error(text, "empty spec")),
            other => {
                return Err(error(
                    head,
                    format!(
                        "{other:?} is not a GPU fault (job-error=, hang, drop-irq, vram-error=)"
                    ),
                ))
            }
        };
        let mut spec = GpuFaultSpec {
            action,
            opcode: None,
            count: None,
            probability: None,
        };
        for item in items {
            let option = SpecItem::new(item);
            let key = option.name;
            let value_of = |what: &str| option.need_value(what);
            match key {
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
                "opcode" => {
                    let text = value_of("fill")?;
                    let value = match GPU_OPCODES.iter().find(|(n, _)| *n == text) {
                        Some((_, v)) => *v,
                        None => parse_number(text)
                            .ok()
                            .and_then(|v| u8::try_from(v).ok())
                            .ok_or_else(|| {
                                let names: Vec<&str> =
                                    GPU_OPCODES.iter().map(|(n, _)| *n).collect();
                                error(
                                    item,
                                    format!(
                                        "{text:?} is not an opcode (0x00..0xff or {})",
                                        names.join(", ")
                                    ),
                                )
                            })?,
                    };
                    spec.opcode = Some(value);
                }
                "" => return Err(error(text, "empty item")),
                other => {
                    return Err(error(
                        item,
                        format!("{other:?} is not an item (count=, prob=, opcode=)"),
                    ))
                }
            }
        }
        if !spec.is_job_action() && (spec.opcode.is_some() || spec.probability.is_some()) {
            return Err(error(
                text,
                "vram-error is a persistent range: it takes no opcode= or prob=",
            ));
        }
        Ok(spec)
    }
}

impl fmt::Display for GpuFaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.action {
            GpuAction::JobError { code } => write!(f, "job-error={code:#04x}")?,
            GpuAction::Hang => f.write_str("hang")?,
            GpuAction::DropInterrupt => f.write_str("drop-irq")?,
            GpuAction::VramError { first, last } if first == last => {
                write!(f, "vram-error={first:#x}")?
            }
            GpuAction::VramError { first, last } => write!(f, "vram-error={first:#x}-{last:#x}")?,
        }
        if let Some(op) = self.opcode {
            match opcode_name(op) {
                Some(name) => write!(f, ",opcode={name}")?,
                None => write!(f, ",opcode={op:#04x}")?,
            }
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

/// What the armed specs want done to one engine job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuDecision {
    /// Retire at once with this status code.
    pub error: Option<u8>,
    /// Never retire (until the ring is disabled or the device reset).
    pub hang: bool,
    /// Retire without sending the interrupt.
    pub drop_interrupt: bool,
    /// How many armed specs fired on this job.
    pub fired: u32,
}

#[derive(Debug, Clone)]
struct GpuArmed {
    id: u64,
    spec: GpuFaultSpec,
    fired: u64,
}

impl GpuArmed {
    fn remaining(&self) -> Option<u64> {
        self.spec.count.map(|c| c.saturating_sub(self.fired))
    }
}

/// The armed GPU specs of one device.
#[derive(Debug, Clone)]
pub struct GpuInjector {
    armed: Vec<GpuArmed>,
    next_id: u64,
    rng: Dice,
}

impl Default for GpuInjector {
    fn default() -> Self {
        Self {
            armed: Vec::new(),
            next_id: 1,
            rng: Dice::default(),
        }
    }
}

impl GpuInjector {
    /// Arms a spec; returns its ID.
    pub fn arm(&mut self, spec: GpuFaultSpec) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.armed.push(GpuArmed { id, spec, fired: 0 });
        id
    }

    /// Disarms everything, VRAM error ranges included.
    pub fn clear(&mut self) {
        self.armed.clear();
    }

    /// Whether nothing can fire: the engine can skip asking.
    pub fn is_idle(&self) -> bool {
        self.armed.iter().all(|a| a.remaining() == Some(0))
    }

    fn roll(&mut self) -> f64 {
        self.rng.roll()
    }

    /// Which job specs fire on a job with `opcode` (counting them as fired).
    pub fn decide(&mut self, opcode: u8) -> GpuDecision {
        let mut d = GpuDecision::default();
        for i in 0..self.armed.len() {
            let spec = self.armed[i].spec;
            if !spec.is_job_action()
                || self.armed[i].remaining() == Some(0)
                || spec.opcode.is_some_and(|op| op != opcode)
            {
                continue;
            }
            if let Some(p) = spec.probability {
                if self.roll() >= p {
                    continue;
                }
            }
            self.armed[i].fired += 1;
            d.fired += 1;
            match spec.action {
                GpuAction::JobError { code } => {
                    d.error.get_or_insert(code);
                }
                GpuAction::Hang => d.hang = true,
                GpuAction::DropInterrupt => d.drop_interrupt = true,
                GpuAction::VramError { .. } => {}
            }
        }
        d
    }

    /// The first bad byte among `len` bytes of VRAM from `offset`, if an
    /// armed VRAM error range (with fires left) overlaps them; that range
    /// counts one fire.
    pub fn vram_error(&mut self, offset: u64, len: u64) -> Option<u64> {
        if len == 0 {
            return None;
        }
        let last = offset.saturating_add(len - 1);
        for a in &mut self.armed {
            if a.remaining() == Some(0) {
                continue;
            }
            if let GpuAction::VramError { first, last: end } = a.spec.action {
                if offset <= end && last >= first {
                    a.fired += 1;
                    return Some(first.max(offset));
                }
            }
        }
        None
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

    fn spec(text: &str) -> GpuFaultSpec {
        text.parse().unwrap()
    }

    /// Would catch a spec that prints text which parses to another spec.
    #[test]
    fn specs_round_trip() {
        for text in [
            "job-error=0x06",
            "job-error=0x01,opcode=fill,count=2",
            "hang,count=1",
            "drop-irq,opcode=checksum,prob=0.5",
            "vram-error=0x100000-0x1fffff",
            "vram-error=0x1000",
            "hang,opcode=0x7f",
        ] {
            let parsed = spec(text);
            assert_eq!(parsed.to_string(), text);
            assert_eq!(spec(&parsed.to_string()), parsed);
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
    }

    /// Would catch a bad item being accepted or an error that does not
    /// name the item.
    #[test]
    fn errors_name_the_item() {
        let cases = [
            ("job-error", "job-error"),
            ("job-error=0", "job-error=0"),
            ("job-error=0x100", "job-error=0x100"),
            ("hang=1", "hang=1"),
            ("explode", "explode"),
            ("hang,count=0", "count=0"),
            ("hang,opcode=teleport", "opcode=teleport"),
            ("hang,lba=1", "lba=1"),
            ("vram-error=9-1", "vram-error=9-1"),
            ("drop-irq,prob=2", "prob=2"),
        ];
        for (text, item) in cases {
            let err = text.parse::<GpuFaultSpec>().unwrap_err();
            assert_eq!(err.item, item, "{text}: {err}");
        }
        assert!("vram-error=0-1,opcode=fill"
            .parse::<GpuFaultSpec>()
            .is_err());
        assert!("".parse::<GpuFaultSpec>().is_err());
    }

    /// Would catch count, opcode filters or the VRAM range being ignored.
    #[test]
    fn injector_counts_filters_and_ranges() {
        let mut inj = GpuInjector::default();
        assert!(inj.is_idle());
        inj.arm(spec("job-error=0x06,opcode=fill,count=1"));
        inj.arm(spec("hang,opcode=checksum,count=1"));
        inj.arm(spec("drop-irq,count=2"));
        let nop = inj.decide(0x00);
        assert_eq!(
            (nop.error, nop.hang, nop.drop_interrupt),
            (None, false, true)
        );
        let fill = inj.decide(0x04);
        assert_eq!(fill.error, Some(6));
        assert!(fill.drop_interrupt);
        assert_eq!(inj.decide(0x04), GpuDecision::default(), "counts used up");
        let sum = inj.decide(0x05);
        assert!(sum.hang);
        assert_eq!(inj.decide(0x05), GpuDecision::default());
        assert!(inj.is_idle());

        let id = inj.arm(spec("vram-error=0x1000-0x1fff"));
        assert!(!inj.is_idle());
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

    /// Would catch a probability that fires always or never.
    #[test]
    fn probability_fires_sometimes() {
        let mut inj = GpuInjector::default();
        inj.arm(spec("job-error=0x06,prob=0.5"));
        let fired = (0..1000).filter(|_| inj.decide(0).error.is_some()).count();
        assert!((350..650).contains(&fired), "{fired}");
    }
}
