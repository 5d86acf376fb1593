//! Fault hooks: what a device asks the wire to do to one frame it sends
//! (the device decides, from its armed fault specs; the wire does it and
//! counts it).
//!
//! - **drop**: the frame is lost; the sender cannot tell.
//! - **delay**: the frame leaves this much later (the sender waits, as
//!   behind a slow link).
//! - **corrupt**: one payload byte is flipped after the FCS was computed
//!   (the FCS itself when the payload is empty), so the receiver gets the
//!   frame and sees a bad FCS.
//! - **reorder=N**: the frame is held and goes out right after the next N
//!   frames, or after [`HOLD_LIMIT`] if fewer follow.
//!
//! [`Outbox`] holds reordered frames; it is a pure state machine (time is
//! passed in), so its order is testable without threads.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::frame::Frame;

/// Longest a reordered frame is held when fewer frames than asked follow
/// it: then it goes out anyway, late.
pub const HOLD_LIMIT: Duration = Duration::from_millis(100);

/// What to do to one frame on its way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Impairment {
    pub drop: bool,
    pub delay: Option<Duration>,
    pub corrupt: bool,
    /// Hold the frame until this many later frames went out (0: none).
    pub reorder: u32,
}

impl Impairment {
    /// Nothing at all.
    pub const NONE: Impairment = Impairment {
        drop: false,
        delay: None,
        corrupt: false,
        reorder: 0,
    };
}

/// Damages `frame` so its FCS no longer matches: flips every bit of the
/// middle payload byte, or of the FCS when there is no payload.
pub fn corrupt(frame: &mut Frame) {
    let middle = frame.payload.len() / 2;
    match frame.payload.get_mut(middle) {
        Some(byte) => *byte ^= 0xff,
        None => frame.fcs ^= 0xffff_ffff,
    }
}

#[derive(Debug)]
struct Held {
    frame: Frame,
    /// Frames still to go out before this one.
    after: u32,
    /// When it goes out anyway.
    until: Instant,
}

/// Frames held back by `reorder`, in the order they were held.
#[derive(Debug, Default)]
pub struct Outbox {
    held: VecDeque<Held>,
}

impl Outbox {
    /// Holds `frame` until `after` later frames went out (or until
    /// `now + HOLD_LIMIT`).
    pub fn hold(&mut self, frame: Frame, after: u32, now: Instant) {
        self.held.push_back(Held {
            frame,
            after: after.max(1),
            until: now + HOLD_LIMIT,
        });
    }

    /// `frame` goes out now: it, then the held frames it was the last one
    /// to wait for, in the order they were held.
    pub fn send(&mut self, frame: Frame) -> Vec<Frame> {
        let mut out = vec![frame];
        let mut kept = VecDeque::with_capacity(self.held.len());
        for mut held in self.held.drain(..) {
            held.after -= 1;
            if held.after == 0 {
                out.push(held.frame);
            } else {
                kept.push_back(held);
            }
        }
        self.held = kept;
        out
    }

    /// Held frames whose time is up at `now`, in the order they were held.
    pub fn expire(&mut self, now: Instant) -> Vec<Frame> {
        let (due, kept): (VecDeque<Held>, VecDeque<Held>) =
            self.held.drain(..).partition(|h| h.until <= now);
        self.held = kept;
        due.into_iter().map(|h| h.frame).collect()
    }

    /// When the next held frame's time is up.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.held.iter().map(|h| h.until).min()
    }

    /// Frames held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u32) -> Frame {
        let mut f = Frame::new(vec![seq as u8; 4]);
        f.seq = seq;
        f
    }

    fn seqs(frames: &[Frame]) -> Vec<u32> {
        frames.iter().map(|f| f.seq).collect()
    }

    /// Catches: a reordered frame that goes out before the frames it must
    /// follow, after more of them than asked, or never.
    #[test]
    fn a_held_frame_follows_exactly_n_later_frames() {
        let now = Instant::now();
        let mut outbox = Outbox::default();
        outbox.hold(frame(1), 2, now);
        assert_eq!(seqs(&outbox.send(frame(2))), [2]);
        assert_eq!(seqs(&outbox.send(frame(3))), [3, 1]);
        assert!(outbox.is_empty());
        // Two held at once go out in the order they were held.
        outbox.hold(frame(4), 1, now);
        outbox.hold(frame(5), 1, now);
        assert_eq!(seqs(&outbox.send(frame(6))), [6, 4, 5]);
    }

    /// Catches: a held frame lost when no frame follows it.
    #[test]
    fn a_held_frame_goes_out_late_when_nothing_follows() {
        let now = Instant::now();
        let mut outbox = Outbox::default();
        outbox.hold(frame(1), 5, now);
        assert_eq!(outbox.next_deadline(), Some(now + HOLD_LIMIT));
        assert!(outbox.expire(now).is_empty());
        assert_eq!(seqs(&outbox.expire(now + HOLD_LIMIT)), [1]);
        assert_eq!(outbox.len(), 0);
    }

    /// Catches: corruption the FCS does not see, including on an empty
    /// payload.
    #[test]
    fn corruption_always_breaks_the_fcs() {
        for len in [0, 1, 2, 1000] {
            let mut f = Frame::new(vec![0x5a; len]);
            corrupt(&mut f);
            assert!(!f.fcs_ok(), "len {len}");
        }
    }
}
