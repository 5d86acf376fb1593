//! A small token bucket for log lines a client or a guest can trigger at
//! will (refused requests, bad doorbells, dropped interrupts): a flood of
//! bad input must not become a flood of log lines.
//!
//! Each call site gets its own bucket through [`log_limited!`]: a burst of
//! [`BURST`] lines, then one per [`REFILL`]. The first line let through
//! after some were dropped says how many with a `suppressed` field.
//!
//! ```
//! # let (id, errno) = (1, 22);
//! p2plab_ratelimit::log_limited!(warn, id, errno, "posted request failed");
//! ```
//!
//! [`log_limited!`]: crate::log_limited
//!
//! It sits at the bottom of the crate graph, beside p2plab-dma, so the
//! transport and the device models use it without depending on each other.

#![deny(missing_docs)]

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Lines a call site may log in a row before it is limited.
pub const BURST: u32 = 10;
/// After the burst, one more line per this much time.
pub const REFILL: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Bucket {
    tokens: u32,
    /// When the last token was added (None: never used yet).
    refilled: Option<Instant>,
    suppressed: u64,
}

/// One call site's bucket; `const`, so it can live in a `static`.
#[derive(Debug)]
pub struct RateLimit {
    bucket: Mutex<Bucket>,
    burst: u32,
    refill: Duration,
}

impl RateLimit {
    /// A bucket of [`BURST`] lines refilled one per [`REFILL`].
    pub const fn per_callsite() -> Self {
        Self::new(BURST, REFILL)
    }

    /// A bucket of `burst` lines refilled one per `refill`.
    pub const fn new(burst: u32, refill: Duration) -> Self {
        RateLimit {
            bucket: Mutex::new(Bucket {
                tokens: burst,
                refilled: None,
                suppressed: 0,
            }),
            burst,
            refill,
        }
    }

    /// Whether a line may be logged now. `Some(n)`: yes, and `n` lines were
    /// suppressed since the last one let through; `None`: suppress it.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut b = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let since = *b.refilled.get_or_insert(now);
        if !self.refill.is_zero() {
            let earned = now.saturating_duration_since(since).as_nanos() / self.refill.as_nanos();
            if earned > 0 {
                let earned = u32::try_from(earned).unwrap_or(u32::MAX);
                b.tokens = b.tokens.saturating_add(earned).min(self.burst);
                // Keep the remainder: time since the last whole token.
                let step = self.refill.saturating_mul(earned);
                b.refilled = Some(since.checked_add(step).unwrap_or(now));
            }
        }
        if b.tokens == 0 {
            b.suppressed = b.suppressed.saturating_add(1);
            return None;
        }
        b.tokens -= 1;
        Some(std::mem::take(&mut b.suppressed))
    }
}

/// Logs like `tracing::<level>!`, but at most [`BURST`] lines in a row and
/// then one per [`REFILL`] from this call site; the next line let through
/// after a suppression carries `suppressed = N`. Usable from any crate
/// that depends on this one (no direct `tracing` dependency needed).
///
/// `log_limited!(warn, field = value, "message {}", arg)`.
#[macro_export]
macro_rules! log_limited {
    ($level:ident, $($rest:tt)+) => {{
        static LIMIT: $crate::RateLimit = $crate::RateLimit::per_callsite();
        match LIMIT.allow() {
            Some(0) => $crate::__tracing::$level!($($rest)+),
            Some(suppressed) => $crate::__tracing::$level!(suppressed, $($rest)+),
            None => {}
        }
    }};
}

#[doc(hidden)]
pub use tracing as __tracing;

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a limiter that lets a flood through, never refills, or
    /// loses the count of what it dropped.
    #[test]
    fn a_burst_then_one_per_refill_with_the_suppressed_count() {
        let limit = RateLimit::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let allowed: Vec<_> = (0..100).map(|_| limit.allow_at(t0)).collect();
        assert_eq!(&allowed[..3], &[Some(0), Some(0), Some(0)]);
        assert!(allowed[3..].iter().all(Option::is_none));
        // Half a second later: still nothing.
        assert_eq!(limit.allow_at(t0 + Duration::from_millis(500)), None);
        // One second later: one line, reporting the 98 dropped.
        assert_eq!(limit.allow_at(t0 + Duration::from_secs(1)), Some(98));
        assert_eq!(limit.allow_at(t0 + Duration::from_secs(1)), None);
        // A long pause refills the burst, no more.
        let later = t0 + Duration::from_secs(100);
        assert_eq!(limit.allow_at(later), Some(1));
        assert_eq!(limit.allow_at(later), Some(0));
        assert_eq!(limit.allow_at(later), Some(0));
        assert_eq!(limit.allow_at(later), None);
    }
}
