//! NVMe fault injection: the controller's action words and filters for
//! p2plab-fault's shared grammar, and what the armed specs decide for a
//! command or a transfer to a peer BAR.
//!
//! ```text
//! SPEC   := ACTION { (',' | ':') ITEM }
//! ACTION := status=SCT_SC | ns-not-ready | media-error | timeout
//!         | latency=DURATION[-DURATION] | cfs | internal-error | drop-irq
//!         | delay-irq=DURATION | corrupt | peer-fail | peer-stall=DURATION
//! ITEM   := count=N | prob=P | after=N                 (shared, p2plab-fault)
//!         | dnr | more | no-abort                      (flags of an action)
//!         | opcode=NAME|0xNN | admin-opcode=NAME|0xNN  (filters)
//!         | queue=N | nsid=N | lba=A[-B]
//! ```
//!
//! Opcode names are the command tables' own (each row's `fault_name`),
//! so the filter's text form lives above both tables, in
//! `crate::fault_filter`; this module holds what the worker, the DMA
//! router and the state need below them.

mod bad_blocks;
mod filter;
mod injector;
#[cfg(test)]
mod tests;

use std::fmt;
use std::time::Duration;

use p2plab_fault::{format_duration, parse_duration, parse_number, Item, Vocabulary};

use crate::spec::io;

pub use bad_blocks::{BadBlocks, BadRangeReport};
pub use filter::{CommandFilter, CommandInfo, CommandSet, LbaRange, Opcode};
pub use injector::{Decision, NvmeFaults, PeerEffect};
pub use p2plab_fault::{ArmError, ArmedReport, SpecError};

/// One NVMe injection: an [`Action`], the commands it applies to
/// ([`CommandFilter`]), and how often.
pub type FaultSpec = p2plab_fault::Spec<Action>;

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

    /// Whether the action fires on whole commands (not a persistent range,
    /// not a peer transfer).
    pub fn is_per_command(&self) -> bool {
        *self != Action::MediaError && !self.is_peer()
    }
}

/// The most specs one controller keeps armed: the OCP Error Injection
/// feature lets a guest set 127 entries in one Set Features (each one
/// spec), and the host must still be able to arm one of its own beside
/// them. 128 specs matched against a command cost well under a
/// microsecond.
pub const MAX_ARMED: usize = 128;

fn status_code(item: &Item<'_>) -> Result<Action, SpecError> {
    let raw = item.parse("0x281", parse_number)?;
    if raw == 0 || raw > 0x7ff {
        return Err(item.error(
            "not a failure status: SCT in bits 10:8, SC in 7:0, not 0 (0x281 is \
             Unrecovered Read Error)",
        ));
    }
    Ok(Action::Status {
        sct_sc: raw as u16,
        dnr: false,
        more: false,
    })
}

fn latency(item: &Item<'_>) -> Result<Action, SpecError> {
    let (min, max) = item.parse("5ms", |text| match text.split_once('-') {
        Some((a, b)) => Ok((parse_duration(a)?, parse_duration(b)?)),
        None => parse_duration(text).map(|d| (d, d)),
    })?;
    if max < min {
        return Err(item.error("the range ends before it starts"));
    }
    Ok(Action::Latency { min, max })
}

/// An action word without a value.
fn word(item: &Item<'_>, action: Action) -> Result<Action, SpecError> {
    item.no_value().map(|()| action)
}

impl Vocabulary for Action {
    type Filter = CommandFilter;
    const KIND: &'static str = "NVMe fault";
    const ACTIONS: &'static str = "status=, ns-not-ready, media-error, timeout, latency=, cfs, \
                                   internal-error, drop-irq, delay-irq=, corrupt, peer-fail, \
                                   peer-stall=";
    const FLAGS: &'static str = "dnr, more, no-abort";
    const MAX_ARMED: usize = MAX_ARMED;

    fn parse(item: &Item<'_>) -> Option<Result<Self, SpecError>> {
        Some(match item.name {
            "status" => status_code(item),
            "ns-not-ready" => word(item, Action::NamespaceNotReady { dnr: false }),
            "media-error" => word(item, Action::MediaError),
            "timeout" => word(item, Action::Timeout { abortable: true }),
            "latency" => latency(item),
            "delay-irq" => item
                .parse("5ms", parse_duration)
                .map(Action::DelayInterrupt),
            "cfs" => word(item, Action::ControllerFatal),
            "internal-error" => word(item, Action::InternalError),
            "drop-irq" => word(item, Action::DropInterrupt),
            "corrupt" => word(item, Action::Corrupt),
            "peer-fail" => word(item, Action::PeerFail),
            "peer-stall" => item.parse("5ms", parse_duration).map(Action::PeerStall),
            _ => return None,
        })
    }

    fn flag(&mut self, item: &Item<'_>) -> Option<Result<(), SpecError>> {
        let bit = match (item.name, self) {
            ("dnr", Action::Status { dnr, .. } | Action::NamespaceNotReady { dnr }) => Ok(dnr),
            ("dnr", _) => Err("only status and ns-not-ready carry DNR"),
            ("more", Action::Status { more, .. }) => Ok(more),
            ("more", _) => Err("only status carries More"),
            ("no-abort", Action::Timeout { abortable }) => {
                // The bit says "refuses an Abort": the opposite of abortable.
                *abortable = false;
                return Some(item.flag());
            }
            ("no-abort", _) => Err("only timeout can refuse an Abort"),
            _ => return None,
        };
        Some(item.flag().and_then(|()| match bit {
            Ok(bit) => {
                *bit = true;
                Ok(())
            }
            Err(refusal) => Err(item.error(refusal)),
        }))
    }

    fn check(spec: &mut FaultSpec) -> Result<(), String> {
        let f = &spec.filter;
        if f.queue == Some(0) && f.opcode.is_some_and(|o| o.set == CommandSet::Io) {
            return Err("queue 0 is the admin queue: use admin-opcode=".into());
        }
        if f.queue.is_some_and(|q| q > 0) && f.opcode.is_some_and(|o| o.set == CommandSet::Admin) {
            return Err("admin commands only run on queue 0".into());
        }
        match spec.action {
            Action::MediaError => {
                if f.lba.is_none() {
                    return Err("media-error needs lba=FIRST-LAST".into());
                }
                if spec.count.is_some() || spec.probability.is_some() {
                    return Err(
                        "media-error is persistent until rewritten: no count= or prob=".into(),
                    );
                }
                if spec.after.is_some() {
                    return Err("media-error is persistent until rewritten: no after=".into());
                }
                if f.opcode.is_some() || f.queue.is_some() {
                    return Err("media-error applies to blocks, not to opcodes or queues".into());
                }
                // One namespace: rewriting a block clears it there.
                spec.filter.nsid.get_or_insert(1);
            }
            Action::Corrupt if f.admin() || f.opcode.is_some_and(|o| o.value != io::READ) => {
                return Err("corrupt applies to Read data only".into());
            }
            Action::PeerFail | Action::PeerStall(_) if *f != CommandFilter::default() => {
                return Err(
                    "peer-fail and peer-stall apply to every transfer to a peer BAR: no opcode=, \
                     admin-opcode=, queue=, nsid= or lba="
                        .into(),
                );
            }
            Action::ControllerFatal | Action::InternalError => {
                // Once, unless asked: after the reset that CFS causes, the
                // controller must be able to come back.
                spec.count.get_or_insert(1);
            }
            _ => {}
        }
        Ok(())
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Status { sct_sc, dnr, more } => {
                write!(f, "status={sct_sc:#05x}")?;
                if dnr {
                    f.write_str(",dnr")?;
                }
                if more {
                    f.write_str(",more")?;
                }
                Ok(())
            }
            Action::NamespaceNotReady { dnr } => {
                f.write_str("ns-not-ready")?;
                if dnr {
                    f.write_str(",dnr")?;
                }
                Ok(())
            }
            Action::MediaError => f.write_str("media-error"),
            Action::Timeout { abortable } => {
                f.write_str("timeout")?;
                if !abortable {
                    f.write_str(",no-abort")?;
                }
                Ok(())
            }
            Action::Latency { min, max } if min == max => {
                write!(f, "latency={}", format_duration(min))
            }
            Action::Latency { min, max } => write!(
                f,
                "latency={}-{}",
                format_duration(min),
                format_duration(max)
            ),
            Action::DelayInterrupt(d) => write!(f, "delay-irq={}", format_duration(d)),
            Action::ControllerFatal => f.write_str("cfs"),
            Action::InternalError => f.write_str("internal-error"),
            Action::DropInterrupt => f.write_str("drop-irq"),
            Action::Corrupt => f.write_str("corrupt"),
            Action::PeerFail => f.write_str("peer-fail"),
            Action::PeerStall(d) => write!(f, "peer-stall={}", format_duration(d)),
        }
    }
}
