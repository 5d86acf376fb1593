//! Armed specs at run time: which fire on a command, how often they have,
//! and the persistent bad-block ranges that media errors leave.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::spec::{Action, CommandInfo, FaultSpec, LbaRange};

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

/// One armed spec and what it has done.
#[derive(Debug, Clone)]
pub struct Armed {
    pub id: u64,
    pub spec: FaultSpec,
    /// Times it fired (media errors: reads it failed).
    pub fired: u64,
    /// Matching commands let through because of `after=`.
    pub passed: u64,
}

impl Armed {
    /// Fires left (None: unlimited).
    pub fn remaining(&self) -> Option<u64> {
        self.spec.count.map(|c| c.saturating_sub(self.fired))
    }
}

/// An armed spec as `status` reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ArmedReport {
    pub id: u64,
    /// Canonical spec text (parses back to the same spec).
    pub spec: String,
    pub fired: u64,
    pub remaining: Option<u64>,
}

impl ArmedReport {
    /// The report of spec `id`, armed as `spec` (printed in its canonical
    /// form), that fired `fired` times of at most `count`.
    pub fn new(id: u64, spec: &impl std::fmt::Display, fired: u64, count: Option<u64>) -> Self {
        Self {
            id,
            spec: spec.to_string(),
            fired,
            remaining: count.map(|c| c.saturating_sub(fired)),
        }
    }
}

/// The dice behind `prob=`: xorshift64 from a fixed seed, so a test's
/// probabilities fire on the same commands run to run.
#[derive(Debug, Clone)]
pub(crate) struct Dice(u64);

impl Default for Dice {
    fn default() -> Self {
        Dice(0x9e37_79b9_7f4a_7c15)
    }
}

impl Dice {
    /// A number in [0, 1).
    pub(crate) fn roll(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A bad-block range as `status` reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BadRangeReport {
    pub nsid: u32,
    pub first: u64,
    pub last: u64,
}

/// Persistent unreadable blocks per namespace: disjoint, sorted,
/// inclusive ranges.
#[derive(Debug, Clone, Default)]
pub struct BadBlocks {
    ranges: BTreeMap<u32, Vec<LbaRange>>,
}

impl BadBlocks {
    /// Marks a range unreadable (merging with neighbours).
    pub fn add(&mut self, nsid: u32, range: LbaRange) {
        let list = self.ranges.entry(nsid).or_default();
        list.push(range);
        list.sort_by_key(|r| r.first);
        let mut merged: Vec<LbaRange> = Vec::with_capacity(list.len());
        for r in list.drain(..) {
            match merged.last_mut() {
                Some(last) if r.first <= last.last.saturating_add(1) => {
                    last.last = last.last.max(r.last)
                }
                _ => merged.push(r),
            }
        }
        *list = merged;
    }

    /// The first unreadable block among `blocks` blocks from `slba`.
    pub fn first_bad(&self, nsid: u32, slba: u64, blocks: u64) -> Option<u64> {
        self.ranges
            .get(&nsid)?
            .iter()
            .find(|r| r.overlaps(slba, blocks))
            .map(|r| r.first.max(slba))
    }

    /// The blocks were rewritten or deallocated: they read fine again.
    pub fn repair(&mut self, nsid: u32, slba: u64, blocks: u64) {
        if blocks == 0 {
            return;
        }
        let Some(list) = self.ranges.get_mut(&nsid) else {
            return;
        };
        let end = slba.saturating_add(blocks - 1);
        let mut kept = Vec::with_capacity(list.len() + 1);
        for r in list.drain(..) {
            if !r.overlaps(slba, blocks) {
                kept.push(r);
                continue;
            }
            if r.first < slba {
                kept.push(LbaRange {
                    first: r.first,
                    last: slba - 1,
                });
            }
            if r.last > end {
                kept.push(LbaRange {
                    first: end + 1,
                    last: r.last,
                });
            }
        }
        *list = kept;
        if list.is_empty() {
            self.ranges.remove(&nsid);
        }
    }

    /// Every bad range, by namespace.
    pub fn report(&self) -> Vec<BadRangeReport> {
        self.ranges
            .iter()
            .flat_map(|(&nsid, list)| {
                list.iter().map(move |r| BadRangeReport {
                    nsid,
                    first: r.first,
                    last: r.last,
                })
            })
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The whole namespace was formatted.
    pub fn forget_namespace(&mut self, nsid: u32) {
        self.ranges.remove(&nsid);
    }
}

/// The armed specs of one device.
#[derive(Debug, Clone)]
pub struct Injector {
    armed: Vec<Armed>,
    next_id: u64,
    bad: BadBlocks,
    rng: Dice,
}

impl Default for Injector {
    fn default() -> Self {
        Self {
            armed: Vec::new(),
            next_id: 1,
            bad: BadBlocks::default(),
            rng: Dice::default(),
        }
    }
}

impl Injector {
    /// Arms a spec; returns its ID. A media error marks its blocks bad at
    /// once.
    pub fn arm(&mut self, spec: FaultSpec) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        if spec.action == Action::MediaError {
            if let (Some(nsid), Some(range)) = (spec.filter.nsid, spec.filter.lba) {
                self.bad.add(nsid, range);
            }
        }
        self.armed.push(Armed {
            id,
            spec,
            fired: 0,
            passed: 0,
        });
        id
    }

    /// Disarms one spec; a media error's blocks read fine again. Returns
    /// whether it was armed.
    pub fn disarm(&mut self, id: u64) -> bool {
        let Some(at) = self.armed.iter().position(|a| a.id == id) else {
            return false;
        };
        let gone = self.armed.remove(at);
        if gone.spec.action == Action::MediaError {
            if let (Some(nsid), Some(r)) = (gone.spec.filter.nsid, gone.spec.filter.lba) {
                let blocks = r.last.saturating_sub(r.first).saturating_add(1);
                self.bad.repair(nsid, r.first, blocks);
            }
        }
        true
    }

    /// Disarms everything, bad blocks included.
    pub fn clear(&mut self) {
        self.armed.clear();
        self.bad = BadBlocks::default();
    }

    /// Whether no spec is armed and no block is bad: the device can skip
    /// asking.
    pub fn is_idle(&self) -> bool {
        self.bad.is_empty()
            && self
                .armed
                .iter()
                .all(|a| a.spec.action == Action::MediaError || a.remaining() == Some(0))
    }

    pub fn bad_blocks(&self) -> &BadBlocks {
        &self.bad
    }

    pub fn bad_blocks_mut(&mut self) -> &mut BadBlocks {
        &mut self.bad
    }

    /// Counts a read failed by a media error on `nsid`'s block `lba`.
    pub fn note_media_error(&mut self, nsid: u32, lba: u64) {
        for a in &mut self.armed {
            if a.spec.action == Action::MediaError
                && a.spec.filter.nsid == Some(nsid)
                && a.spec.filter.lba.is_some_and(|r| r.overlaps(lba, 1))
            {
                a.fired += 1;
            }
        }
    }

    fn roll(&mut self) -> f64 {
        self.rng.roll()
    }

    /// Which armed specs fire on this command (counting them as fired).
    pub fn decide(&mut self, cmd: &CommandInfo) -> Decision {
        let mut d = Decision::default();
        for i in 0..self.armed.len() {
            let spec = self.armed[i].spec;
            if spec.action == Action::MediaError
                || spec.action.is_peer()
                || self.armed[i].remaining() == Some(0)
                || !spec.matches(cmd)
            {
                continue;
            }
            if let Some(p) = spec.probability {
                if self.roll() >= p {
                    continue;
                }
            }
            if spec.after.is_some_and(|n| self.armed[i].passed < n) {
                self.armed[i].passed += 1;
                continue;
            }
            self.armed[i].fired += 1;
            d.fired += 1;
            match spec.action {
                Action::Status { sct_sc, dnr, more } => {
                    d.status.get_or_insert((sct_sc, dnr, more));
                }
                Action::NamespaceNotReady { dnr } => {
                    d.status.get_or_insert((0x082, dnr, false));
                }
                Action::Timeout { abortable } => d.hang = Some(abortable),
                Action::Latency { min, max } => {
                    let spread = max.saturating_sub(min);
                    d.latency += min + spread.mul_f64(self.roll());
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
            }
        }
        d
    }

    /// What the armed `peer-fail`/`peer-stall` specs do to one data
    /// transfer to a peer BAR (counting those that fire). A failure wins
    /// over stalls; stalls add up. Transfers elsewhere never ask, so they
    /// spend no `count=`.
    pub fn peer_transfer(&mut self) -> Option<PeerEffect> {
        let mut fail = false;
        let mut stall = Duration::ZERO;
        let mut fired = false;
        for i in 0..self.armed.len() {
            let spec = self.armed[i].spec;
            if !spec.action.is_peer() || self.armed[i].remaining() == Some(0) {
                continue;
            }
            if let Some(p) = spec.probability {
                if self.roll() >= p {
                    continue;
                }
            }
            if spec.after.is_some_and(|n| self.armed[i].passed < n) {
                self.armed[i].passed += 1;
                continue;
            }
            self.armed[i].fired += 1;
            fired = true;
            match spec.action {
                Action::PeerFail => fail = true,
                Action::PeerStall(d) => stall += d,
                _ => {}
            }
        }
        match (fired, fail) {
            (false, _) => None,
            (true, true) => Some(PeerEffect::Fail),
            (true, false) => Some(PeerEffect::Stall(stall)),
        }
    }

    /// Every armed spec.
    pub fn armed(&self) -> &[Armed] {
        &self.armed
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

    fn spec(text: &str) -> FaultSpec {
        text.parse().unwrap()
    }

    fn read(slba: u64, blocks: u64) -> CommandInfo {
        CommandInfo {
            queue: 1,
            opcode: 0x02,
            nsid: 1,
            lba: Some((slba, blocks)),
        }
    }

    /// Catches a count that is not honoured, or exhausted specs that still
    /// fire.
    #[test]
    fn count_limits_fires() {
        let mut inj = Injector::default();
        inj.arm(spec("status=0x281,dnr,count=2,opcode=read"));
        assert!(!inj.is_idle());
        let statuses: Vec<_> = (0..4).map(|_| inj.decide(&read(0, 1)).status).collect();
        assert_eq!(
            statuses,
            vec![
                Some((0x281, true, false)),
                Some((0x281, true, false)),
                None,
                None
            ]
        );
        assert!(inj.is_idle());
        let r = &inj.report()[0];
        assert_eq!((r.fired, r.remaining), (2, Some(0)));
        assert_eq!(r.spec, "status=0x281,dnr,count=2,opcode=read");
    }

    /// Catches `after=` firing early or never.
    #[test]
    fn after_lets_commands_pass_first() {
        let mut inj = Injector::default();
        inj.arm(spec("status=0x281,count=1,after=3,opcode=read"));
        let fired: Vec<bool> = (0..6).map(|_| !inj.decide(&read(0, 1)).is_none()).collect();
        assert_eq!(fired, vec![false, false, false, true, false, false]);
    }

    /// Disarming one spec leaves the others.
    #[test]
    fn disarm_removes_one_spec() {
        let mut inj = Injector::default();
        let a = inj.arm(spec("status=0x4"));
        let b = inj.arm(spec("media-error,lba=1-2"));
        assert!(inj.disarm(a));
        assert!(!inj.disarm(a));
        assert_eq!(inj.report().len(), 1);
        assert!(inj.decide(&read(0, 1)).is_none());
        assert!(inj.disarm(b));
        assert!(inj.is_idle(), "the media error's blocks went with it");
    }

    /// Catches a latency range that is ignored or escapes its bounds.
    #[test]
    fn latency_ranges_spread_within_their_bounds() {
        let mut inj = Injector::default();
        inj.arm(spec("latency=1ms-3ms"));
        let delays: Vec<Duration> = (0..500).map(|_| inj.decide(&read(0, 1)).latency).collect();
        let (lo, hi) = (Duration::from_millis(1), Duration::from_millis(3));
        assert!(delays.iter().all(|d| (lo..=hi).contains(d)));
        let mean = delays.iter().sum::<Duration>() / 500;
        assert!(
            (Duration::from_micros(1800)..Duration::from_micros(2200)).contains(&mean),
            "{mean:?}"
        );
        let mut inj = Injector::default();
        inj.arm(spec("delay-irq=4ms,count=1"));
        assert_eq!(
            inj.decide(&read(0, 1)).interrupt_delay,
            Duration::from_millis(4)
        );
        assert_eq!(inj.decide(&read(0, 1)).interrupt_delay, Duration::ZERO);
    }

    #[test]
    fn several_specs_fire_on_one_command() {
        let mut inj = Injector::default();
        inj.arm(spec("latency=5ms"));
        inj.arm(spec("latency=2ms,opcode=read"));
        inj.arm(spec("drop-irq,count=1"));
        inj.arm(spec("corrupt,lba=10-11"));
        let d = inj.decide(&read(8, 8));
        assert_eq!(d.latency, Duration::from_millis(7));
        assert!(d.drop_interrupt);
        assert_eq!(
            d.corrupt,
            Some(LbaRange {
                first: 10,
                last: 11
            })
        );
        assert_eq!(d.fired, 4);
        let d = inj.decide(&read(0, 4));
        assert_eq!(d.fired, 2, "drop-irq spent, corrupt range missed");
        assert!(!d.drop_interrupt);
        assert_eq!(d.corrupt, None);
    }

    /// Catches probabilities that are ignored (fire always or never).
    #[test]
    fn probability_fires_about_that_often() {
        let mut inj = Injector::default();
        inj.arm(spec("status=0x4,prob=0.25"));
        let fired = (0..4000)
            .filter(|_| !inj.decide(&read(0, 1)).is_none())
            .count();
        assert!((800..1200).contains(&fired), "{fired} of 4000");
    }

    /// Catches repairs that clear too much or too little.
    #[test]
    fn bad_blocks_split_and_merge() {
        let mut inj = Injector::default();
        inj.arm(spec("media-error,lba=100-199"));
        assert!(!inj.is_idle());
        let bad = inj.bad_blocks_mut();
        assert_eq!(bad.first_bad(1, 0, 100), None);
        assert_eq!(bad.first_bad(1, 0, 101), Some(100));
        assert_eq!(bad.first_bad(1, 150, 1000), Some(150));
        assert_eq!(bad.first_bad(1, 200, 8), None);
        assert_eq!(bad.first_bad(2, 150, 1), None);
        bad.repair(1, 120, 10);
        let ranges: Vec<_> = bad.report().iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(ranges, vec![(100, 119), (130, 199)]);
        assert_eq!(bad.first_bad(1, 120, 10), None);
        bad.add(
            1,
            LbaRange {
                first: 120,
                last: 129,
            },
        );
        bad.add(
            1,
            LbaRange {
                first: 200,
                last: 200,
            },
        );
        let ranges: Vec<_> = bad.report().iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(ranges, vec![(100, 200)]);
        bad.repair(1, 0, 1000);
        assert!(bad.is_empty());
        assert!(inj.is_idle());
    }

    /// Catches peer specs that fire on whole commands (and so on RAM
    /// transfers), or whose count is not honoured per peer transfer.
    #[test]
    fn peer_specs_fire_on_peer_transfers_only() {
        let mut inj = Injector::default();
        inj.arm(spec("peer-fail,count=1"));
        inj.arm(spec("peer-stall=3ms,count=2"));
        assert!(inj.decide(&read(0, 1)).is_none(), "not a command fault");
        assert_eq!(inj.peer_transfer(), Some(PeerEffect::Fail));
        assert_eq!(
            inj.peer_transfer(),
            Some(PeerEffect::Stall(Duration::from_millis(3)))
        );
        assert_eq!(inj.peer_transfer(), None);
        assert!(inj.is_idle());
        let fired: Vec<_> = inj.report().iter().map(|r| r.fired).collect();
        assert_eq!(fired, vec![1, 2]);
    }

    #[test]
    fn media_errors_are_counted_on_their_spec_and_clear_disarms() {
        let mut inj = Injector::default();
        inj.arm(spec("media-error,lba=5-6"));
        assert!(
            inj.decide(&read(5, 1)).is_none(),
            "handled by the bad blocks"
        );
        inj.note_media_error(1, 5);
        assert_eq!(inj.report()[0].fired, 1);
        inj.clear();
        assert!(inj.is_idle());
        assert!(inj.report().is_empty());
    }
}
