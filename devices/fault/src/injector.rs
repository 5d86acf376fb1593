//! Armed specs at run time, for any device: IDs, the cap, which specs
//! fire (count, prob, after), what each has fired, the report `status`
//! shows, and the lock-free "anything armed?" flag the hot path reads.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Serialize;

use crate::spec::{Spec, Vocabulary};

/// One armed spec and what it has done.
#[derive(Debug, Clone, Copy)]
pub struct Armed<A: Vocabulary> {
    pub id: u64,
    pub spec: Spec<A>,
    /// Times it fired.
    pub fired: u64,
    /// Matching commands let through because of `after=`.
    pub passed: u64,
}

impl<A: Vocabulary> Armed<A> {
    /// Fires left (None: unlimited).
    pub fn remaining(&self) -> Option<u64> {
        self.spec.count.map(|c| c.saturating_sub(self.fired))
    }

    /// Whether it has fired its `count=` and never fires again.
    pub fn is_spent(&self) -> bool {
        self.remaining() == Some(0)
    }
}

/// An armed spec as `status` reports it (under `faults`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ArmedReport {
    pub id: u64,
    /// Canonical spec text (parses back to the same spec).
    pub spec: String,
    pub fired: u64,
    pub remaining: Option<u64>,
}

/// A spec refused because the device keeps as many as it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArmError {
    /// The device's cap.
    pub cap: usize,
}

impl fmt::Display for ArmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} injections that can still fire are armed already, the most one device \
             keeps (`clear` disarms them)",
            self.cap
        )
    }
}

impl std::error::Error for ArmError {}

/// The dice behind `prob=` (and random latencies): xorshift64 from a
/// fixed seed, so a test's probabilities fire on the same commands run to
/// run.
#[derive(Debug, Clone)]
pub struct Dice(u64);

impl Default for Dice {
    fn default() -> Self {
        Dice(0x9e37_79b9_7f4a_7c15)
    }
}

impl Dice {
    /// A number in [0, 1).
    pub fn roll(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The armed specs of one device: at most a cap of them
/// ([`Vocabulary::MAX_ARMED`]), so asking which fire on a command scans a
/// bounded list.
#[derive(Debug, Clone)]
pub struct Injector<A: Vocabulary> {
    armed: Vec<Armed<A>>,
    next_id: u64,
    dice: Dice,
    cap: usize,
}

impl<A: Vocabulary> Default for Injector<A> {
    fn default() -> Self {
        Self::with_cap(A::MAX_ARMED)
    }
}

impl<A: Vocabulary> Injector<A> {
    /// An injector that keeps at most `cap` specs (at least one).
    pub fn with_cap(cap: usize) -> Self {
        Self {
            armed: Vec::new(),
            next_id: 1,
            dice: Dice::default(),
            cap: cap.max(1),
        }
    }

    /// Arms a spec; returns its ID. When the list is full, the oldest
    /// spec that has fired its `count=` makes room (it leaves the
    /// report); when none has, the spec is refused.
    pub fn arm(&mut self, spec: Spec<A>) -> Result<u64, ArmError> {
        if self.armed.len() >= self.cap {
            match self.armed.iter().position(Armed::is_spent) {
                Some(at) => {
                    self.armed.remove(at);
                }
                None => return Err(ArmError { cap: self.cap }),
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.armed.push(Armed {
            id,
            spec,
            fired: 0,
            passed: 0,
        });
        Ok(id)
    }

    /// How many more specs [`arm`](Self::arm) takes now (spent specs
    /// count as room).
    pub fn room(&self) -> usize {
        let live = self.armed.iter().filter(|a| !a.is_spent()).count();
        self.cap.saturating_sub(live)
    }

    /// The most specs this injector keeps.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Disarms one spec; returns it if it was armed.
    pub fn disarm(&mut self, id: u64) -> Option<Spec<A>> {
        let at = self.armed.iter().position(|a| a.id == id)?;
        Some(self.armed.remove(at).spec)
    }

    /// Disarms everything.
    pub fn clear(&mut self) {
        self.armed.clear();
    }

    /// Whether no spec can fire any more.
    pub fn is_idle(&self) -> bool {
        !self.can_fire(|_| true)
    }

    /// Whether an armed spec that `applies` can still fire.
    pub fn can_fire(&self, applies: impl Fn(&Spec<A>) -> bool) -> bool {
        self.armed.iter().any(|a| !a.is_spent() && applies(&a.spec))
    }

    /// Fires every armed spec that `applies` to one command, in the order
    /// they were armed: a spent spec is skipped, `prob=` rolls the dice,
    /// `after=` lets its first matching commands pass; each that fires is
    /// counted and handed to `effect` (with the dice, for random effects).
    /// Returns how many fired.
    pub fn fire(
        &mut self,
        mut applies: impl FnMut(&Spec<A>) -> bool,
        mut effect: impl FnMut(&Spec<A>, &mut Dice),
    ) -> u32 {
        let mut fired = 0;
        for at in 0..self.armed.len() {
            if self.try_fire(at, &mut applies) {
                fired += 1;
                effect(&self.armed[at].spec, &mut self.dice);
            }
        }
        fired
    }

    /// Like [`fire`](Self::fire), but stops at the first spec that fires
    /// and returns it.
    pub fn fire_first(&mut self, mut applies: impl FnMut(&Spec<A>) -> bool) -> Option<Spec<A>> {
        (0..self.armed.len())
            .find(|&at| self.try_fire(at, &mut applies))
            .map(|at| self.armed[at].spec)
    }

    fn try_fire(&mut self, at: usize, applies: &mut impl FnMut(&Spec<A>) -> bool) -> bool {
        let Some(armed) = self.armed.get_mut(at) else {
            return false;
        };
        if armed.is_spent() || !applies(&armed.spec) {
            return false;
        }
        if let Some(p) = armed.spec.probability {
            if self.dice.roll() >= p {
                return false;
            }
        }
        if armed.spec.after.is_some_and(|n| armed.passed < n) {
            armed.passed += 1;
            return false;
        }
        armed.fired += 1;
        true
    }

    /// Every armed spec.
    pub fn armed(&self) -> &[Armed<A>] {
        &self.armed
    }

    /// Armed specs as `status` reports them.
    pub fn report(&self) -> Vec<ArmedReport> {
        self.armed
            .iter()
            .map(|a| ArmedReport {
                id: a.id,
                spec: a.spec.to_string(),
                fired: a.fired,
                remaining: a.remaining(),
            })
            .collect()
    }
}

/// What [`Shared`] asks after each use: whether the device can skip
/// asking altogether.
pub trait Idle {
    /// Whether nothing armed can fire (or otherwise act).
    fn is_idle(&self) -> bool;
}

impl<A: Vocabulary> Idle for Injector<A> {
    fn is_idle(&self) -> bool {
        Injector::is_idle(self)
    }
}

/// A device's injector (and whatever state its faults keep beside it)
/// shared between the threads that arm specs and the threads that ask on
/// every command, with a flag that makes asking cost one atomic load
/// while nothing is armed.
#[derive(Debug, Default)]
pub struct Shared<T> {
    state: Mutex<T>,
    armed: AtomicBool,
}

impl<T: Idle> Shared<T> {
    pub fn new(state: T) -> Self {
        let armed = AtomicBool::new(!state.is_idle());
        Self {
            state: Mutex::new(state),
            armed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, T> {
        // The state stays consistent between statements: a panic while it
        // was held leaves nothing half-done that matters.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state under its lock, then notes whether anything
    /// is armed.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut state = self.lock();
        let result = f(&mut state);
        self.armed.store(!state.is_idle(), Ordering::Release);
        result
    }

    /// Like [`with`](Self::with) when something is armed; `None`, without
    /// taking the lock, when nothing is.
    pub fn when_armed<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.is_armed().then(|| self.with(f))
    }

    /// Whether anything is armed (one atomic load).
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::spec::tests::{toy, Toy};
    use crate::spec::Filter as _;

    /// Fires the armed toy specs on the command numbered `n`; returns the
    /// actions that fired.
    fn fire(inj: &mut Injector<Toy>, n: u64) -> Vec<Toy> {
        let mut out = Vec::new();
        inj.fire(|s| s.filter.matches(&n), |s, _| out.push(s.action));
        out
    }

    /// Catches: a count that is not honoured, or spent specs that still
    /// fire, or a report that does not show it.
    #[test]
    fn count_limits_fires_and_the_report_shows_it() {
        let mut inj = Injector::default();
        inj.arm(toy("break,count=2,at=0-9")).unwrap();
        assert!(!inj.is_idle());
        let fired: Vec<usize> = (0..4).map(|_| fire(&mut inj, 1).len()).collect();
        assert_eq!(fired, vec![1, 1, 0, 0]);
        assert!(inj.is_idle());
        let r = &inj.report()[0];
        assert_eq!((r.id, r.fired, r.remaining), (1, 2, Some(0)));
        assert_eq!(r.spec, "break,count=2,at=0-9");
        assert_eq!(fire(&mut inj, 50), vec![], "filter");
    }

    /// Catches: `after=` firing early or never, and probabilities that are
    /// ignored (fire always or never).
    #[test]
    fn after_and_probability() {
        let mut inj = Injector::default();
        inj.arm(toy("break,count=1,after=3")).unwrap();
        let fired: Vec<bool> = (0..6).map(|_| !fire(&mut inj, 0).is_empty()).collect();
        assert_eq!(fired, vec![false, false, false, true, false, false]);
        assert_eq!(inj.armed()[0].passed, 3);

        let mut inj = Injector::default();
        inj.arm(toy("break,prob=0.25")).unwrap();
        let n = (0..4000).filter(|_| !fire(&mut inj, 0).is_empty()).count();
        assert!((800..1200).contains(&n), "{n} of 4000");
    }

    /// Catches: disarming the wrong spec, IDs reused, `fire_first` firing
    /// more than one.
    #[test]
    fn disarm_clear_and_fire_first() {
        let mut inj = Injector::default();
        let a = inj.arm(toy("break")).unwrap();
        let b = inj.arm(toy("wait=3")).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            inj.disarm(a).map(|s| s.action),
            Some(Toy::Break { loud: false })
        );
        assert_eq!(inj.disarm(a), None);
        let c = inj.arm(toy("once")).unwrap();
        assert!(c > b, "IDs are never reused");
        assert_eq!(
            inj.fire_first(|_| true).map(|s| s.action),
            Some(Toy::Wait(3))
        );
        assert_eq!(inj.armed()[1].fired, 0, "only the first fired");
        inj.clear();
        assert!(inj.is_idle() && inj.report().is_empty());
    }

    /// Catches: an unbounded list (a client arming without end), a full
    /// list that refuses though spent specs could make room, or a refusal
    /// that arms anyway.
    #[test]
    fn the_list_is_capped_and_spent_specs_make_room() {
        let mut inj: Injector<Toy> = Injector::default();
        assert_eq!(inj.cap(), 4, "the toy's MAX_ARMED");
        for _ in 0..3 {
            inj.arm(toy("break")).unwrap();
        }
        let once = inj.arm(toy("once")).unwrap();
        assert_eq!(inj.room(), 0);
        let refused = inj.arm(toy("break")).unwrap_err();
        assert_eq!(refused, ArmError { cap: 4 });
        assert!(refused.to_string().contains("4 injections"), "{refused}");
        assert_eq!(inj.armed().len(), 4);
        assert!(inj.fire_first(|s| s.action == Toy::Once).is_some());
        assert_eq!(inj.room(), 1, "the spent once makes room");
        let next = inj.arm(toy("wait=1")).unwrap();
        let ids: Vec<u64> = inj.armed().iter().map(|a| a.id).collect();
        assert!(!ids.contains(&once) && ids.contains(&next), "{ids:?}");
        assert_eq!(inj.armed().len(), 4);
        assert_eq!(Injector::<Toy>::with_cap(0).cap(), 1);
    }

    /// Catches: a per-command check that grows with what a client armed
    /// (the list is capped, so a full list costs a bounded scan), and a
    /// shared flag that makes an idle device take the lock.
    #[test]
    fn a_full_list_is_a_bounded_scan_and_idle_is_one_load() {
        let mut inj: Injector<Toy> = Injector::with_cap(crate::DEFAULT_MAX_ARMED);
        while inj.arm(toy("break,at=1000-2000")).is_ok() {}
        assert_eq!(inj.armed().len(), crate::DEFAULT_MAX_ARMED);
        let start = Instant::now();
        for n in 0..10_000 {
            assert!(fire(&mut inj, n % 100).is_empty());
        }
        // 10k commands against a full list: well under a microsecond each
        // on any machine this runs on (debug build included).
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );

        let shared = Shared::new(Injector::<Toy>::default());
        assert!(!shared.is_armed());
        assert_eq!(
            shared.when_armed(|_| unreachable!("idle takes no lock")),
            None::<()>
        );
        shared.with(|inj| inj.arm(toy("once")).unwrap());
        assert!(shared.is_armed());
        assert_eq!(
            shared.when_armed(|inj| inj.fire_first(|_| true).is_some()),
            Some(true)
        );
        assert!(!shared.is_armed(), "the spent spec left nothing armed");
    }
}
