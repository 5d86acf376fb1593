//! The controller's armed specs (p2plab-fault's generic injector) and the
//! bad blocks their media errors leave, and what they decide for one
//! command or one transfer to a peer BAR.

use std::time::Duration;

use p2plab_fault::{ArmError, ArmedReport, Idle, Injector};

use super::bad_blocks::BadBlocks;
use super::filter::{CommandInfo, LbaRange};
use super::{Action, FaultSpec};

/// What the armed specs want done to one command. Several specs can fire
/// on one command (a latency and a status, say).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Decision {
    /// Complete with this status instead of running: SCT/SC, DNR, More.
    pub status: Option<(u16, bool, bool)>,
    /// Never complete; `Some(abortable)`.
    pub hang: Option<bool>,
    /// Run this much later.
    pub latency: Duration,
    /// Raise CSTS.CFS instead of running.
    pub fatal: bool,
    /// Fail the handler as a device bug would (the worker panics).
    pub internal_error: bool,
    /// Complete but send no interrupt.
    pub drop_interrupt: bool,
    /// Complete, and send the interrupt this much later.
    pub interrupt_delay: Duration,
    /// Flip a bit in each block of this range of the read data (the whole
    /// command's range when the spec names none).
    pub corrupt: Option<LbaRange>,
    /// How many armed specs fired on this command.
    pub fired: u32,
}

impl Decision {
    /// Whether nothing fired.
    pub fn is_none(&self) -> bool {
        self.fired == 0
    }
}

/// What the armed specs do to one data transfer whose target is a peer
/// BAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEffect {
    /// The transfer fails (the command: Data Transfer Error).
    Fail,
    /// The transfer waits this long, then goes ahead.
    Stall(Duration),
}

/// The armed specs of one controller, at most [`super::MAX_ARMED`], and
/// the blocks their media errors made unreadable.
#[derive(Debug, Clone, Default)]
pub struct NvmeFaults {
    specs: Injector<Action>,
    bad: BadBlocks,
}

/// The blocks of a media error's range.
fn media_range(spec: &FaultSpec) -> Option<(u32, LbaRange)> {
    match spec.action {
        Action::MediaError => spec.filter.nsid.zip(spec.filter.lba),
        _ => None,
    }
}

impl Idle for NvmeFaults {
    /// Bad blocks act on reads; armed media errors act only through them.
    fn is_idle(&self) -> bool {
        self.bad.is_empty() && !self.specs.can_fire(|s| s.action != Action::MediaError)
    }
}

impl NvmeFaults {
    /// Arms a spec; returns its ID. A media error marks its blocks bad at
    /// once.
    pub fn arm(&mut self, spec: FaultSpec) -> Result<u64, ArmError> {
        let id = self.specs.arm(spec)?;
        if let Some((nsid, range)) = media_range(&spec) {
            self.bad.add(nsid, range);
        }
        Ok(id)
    }

    /// Disarms one spec; a media error's blocks read fine again. Returns
    /// whether it was armed.
    pub fn disarm(&mut self, id: u64) -> bool {
        let Some(gone) = self.specs.disarm(id) else {
            return false;
        };
        if let Some((nsid, r)) = media_range(&gone) {
            let blocks = r.last.saturating_sub(r.first).saturating_add(1);
            self.bad.repair(nsid, r.first, blocks);
        }
        true
    }

    /// Disarms the specs `old` and arms `new` in their place, all or
    /// nothing: refused, with nothing changed, when `new` does not fit.
    pub fn replace(&mut self, old: &[u64], new: &[FaultSpec]) -> Result<Vec<u64>, ArmError> {
        let freed = self
            .specs
            .armed()
            .iter()
            .filter(|a| old.contains(&a.id) && !a.is_spent())
            .count();
        if new.len() > self.specs.room() + freed {
            return Err(ArmError {
                cap: self.specs.cap(),
            });
        }
        for &id in old {
            self.disarm(id);
        }
        new.iter().map(|&spec| self.arm(spec)).collect()
    }

    /// Disarms everything, bad blocks included.
    pub fn clear(&mut self) {
        self.specs.clear();
        self.bad = BadBlocks::default();
    }

    pub fn bad_blocks(&self) -> &BadBlocks {
        &self.bad
    }

    pub fn bad_blocks_mut(&mut self) -> &mut BadBlocks {
        &mut self.bad
    }

    /// Counts a read failed by a media error on `nsid`'s block `lba`.
    pub fn note_media_error(&mut self, nsid: u32, lba: u64) {
        self.specs.fire(
            |s| media_range(s).is_some_and(|(n, r)| n == nsid && r.overlaps(lba, 1)),
            |_, _| {},
        );
    }

    /// Which armed specs fire on this command (counting them as fired).
    pub fn decide(&mut self, cmd: &CommandInfo) -> Decision {
        let mut d = Decision::default();
        d.fired = self.specs.fire(
            |s| s.action.is_per_command() && s.filter.applies_to(cmd),
            |spec, dice| match spec.action {
                Action::Status { sct_sc, dnr, more } => {
                    d.status.get_or_insert((sct_sc, dnr, more));
                }
                Action::NamespaceNotReady { dnr } => {
                    d.status.get_or_insert((0x082, dnr, false));
                }
                Action::Timeout { abortable } => d.hang = Some(abortable),
                Action::Latency { min, max } => {
                    let spread = max.saturating_sub(min);
                    d.latency += min + spread.mul_f64(dice.roll());
                }
                Action::DelayInterrupt(t) => d.interrupt_delay = d.interrupt_delay.max(t),
                Action::ControllerFatal => d.fatal = true,
                Action::InternalError => d.internal_error = true,
                Action::DropInterrupt => d.drop_interrupt = true,
                Action::Corrupt => {
                    let whole = cmd.lba.map(|(slba, blocks)| LbaRange {
                        first: slba,
                        last: slba.saturating_add(blocks.saturating_sub(1)),
                    });
                    d.corrupt = spec.filter.lba.or(whole);
                }
                Action::MediaError | Action::PeerFail | Action::PeerStall(_) => {}
            },
        );
        d
    }

    /// What the armed `peer-fail`/`peer-stall` specs do to one data
    /// transfer to a peer BAR (counting those that fire). A failure wins
    /// over stalls; stalls add up. Transfers elsewhere never ask, so they
    /// spend no `count=`.
    pub fn peer_transfer(&mut self) -> Option<PeerEffect> {
        let mut fail = false;
        let mut stall = Duration::ZERO;
        let fired = self.specs.fire(
            |s| s.action.is_peer(),
            |spec, _| match spec.action {
                Action::PeerFail => fail = true,
                Action::PeerStall(d) => stall += d,
                _ => {}
            },
        );
        match (fired, fail) {
            (0, _) => None,
            (_, true) => Some(PeerEffect::Fail),
            (_, false) => Some(PeerEffect::Stall(stall)),
        }
    }

    /// The armed specs.
    pub fn specs(&self) -> &Injector<Action> {
        &self.specs
    }

    /// Armed specs as `status` reports them.
    pub fn report(&self) -> Vec<ArmedReport> {
        self.specs.report()
    }
}
