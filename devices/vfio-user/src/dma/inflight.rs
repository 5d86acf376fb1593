//! Who is using a client range right now. Every access to a client range
//! holds a [`RangeUse`] while it touches the range's memory (or waits for
//! a DMA message to it). DMA_UNMAP, a reset and a disconnect close the
//! range to new users, cancel the message waits, and then wait here until
//! the last use is gone: only then may the client reuse that memory.
//!
//! Ordering with the message path: an access first takes its use, then
//! registers its reply waiter, then checks [`RangeUsers::is_cancelled`]
//! once more before it sends. A canceller first closes the range, then
//! fails the waiters it finds, then waits for the uses to drain. Either the
//! waiter is registered before the close (and is failed), or the access
//! sees the close (and never sends).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

#[derive(Debug, Default)]
struct UsersState {
    /// Accesses holding a [`RangeUse`].
    active: usize,
    /// The range left the address map (unmap, disconnect): for good.
    removed: bool,
    /// Fences (device reset) currently holding the range closed.
    fences: usize,
    /// Threads in [`RangeUsers::wait_idle`]. The last use only signals
    /// `idle` when someone waits: a condvar notify is a futex syscall even
    /// with no waiter, and every DMA access ends a use.
    waiting: usize,
}

/// The users of one client range.
#[derive(Debug, Default)]
pub(crate) struct RangeUsers {
    state: Mutex<UsersState>,
    idle: Condvar,
}

impl RangeUsers {
    fn lock(&self) -> MutexGuard<'_, UsersState> {
        // Plain counters: consistent whatever a panicking holder did.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a use, unless the range is removed or fenced.
    pub(super) fn enter(self: &Arc<Self>) -> Option<RangeUse> {
        let mut state = self.lock();
        if state.removed || state.fences > 0 {
            return None;
        }
        state.active += 1;
        Some(RangeUse {
            users: Arc::clone(self),
        })
    }

    /// Whether accesses through this range must stop: it was removed, or a
    /// fence holds it closed.
    pub(crate) fn is_cancelled(&self) -> bool {
        let state = self.lock();
        state.removed || state.fences > 0
    }

    /// The range left the map: no new use starts, ever.
    pub(super) fn remove(&self) {
        self.lock().removed = true;
    }

    /// A fence closes the range until [`unfence`](Self::unfence).
    pub(super) fn fence(&self) {
        self.lock().fences += 1;
    }

    pub(super) fn unfence(&self) {
        let mut state = self.lock();
        state.fences = state.fences.saturating_sub(1);
    }

    /// Uses still running.
    #[cfg(test)]
    pub(super) fn active(&self) -> usize {
        self.lock().active
    }

    /// Waits until no use is running, or `deadline` passes. Returns
    /// whether the range is idle.
    pub(super) fn wait_idle(&self, deadline: Instant) -> bool {
        let mut state = self.lock();
        while state.active > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state.waiting += 1;
            state = self
                .idle
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.waiting -= 1;
        }
        true
    }
}

/// One running access to a range; dropping it ends the use.
#[derive(Debug)]
pub(crate) struct RangeUse {
    users: Arc<RangeUsers>,
}

impl RangeUse {
    /// The range's users, for the message path's cancellation check.
    pub(crate) fn users(&self) -> &Arc<RangeUsers> {
        &self.users
    }
}

impl Drop for RangeUse {
    fn drop(&mut self) {
        let mut state = self.users.lock();
        state.active = state.active.saturating_sub(1);
        if state.active == 0 && state.waiting > 0 {
            self.users.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Catches a drain that returns while a use is still running, or a
    /// removed or fenced range that still lets new users in.
    #[test]
    fn removal_waits_for_running_uses_and_refuses_new_ones() {
        let users = Arc::new(RangeUsers::default());
        let first = users.enter().unwrap();
        users.remove();
        assert!(users.enter().is_none(), "no new use after removal");
        assert!(users.is_cancelled());
        let soon = Instant::now() + Duration::from_millis(30);
        assert!(!users.wait_idle(soon), "one use still runs");
        let waiter = {
            let users = Arc::clone(&users);
            std::thread::spawn(move || users.wait_idle(Instant::now() + Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(first);
        assert!(waiter.join().unwrap());
        assert_eq!(users.active(), 0);

        let fenced = Arc::new(RangeUsers::default());
        fenced.fence();
        assert!(fenced.enter().is_none());
        fenced.unfence();
        assert!(fenced.enter().is_some());
        assert!(!fenced.is_cancelled());
    }
}
