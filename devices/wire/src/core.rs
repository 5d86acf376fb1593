//! What a wire's handle, its link thread and its hold thread share, and
//! the one way a frame leaves: [`Core::transmit`], bounded in time and
//! abandoned when the device asks.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use p2plab_ratelimit::log_limited;

use crate::config::WireOptions;
use crate::frame::Frame;
use crate::impair::Outbox;
use crate::stats::WireStats;
use crate::transport::Stream;

/// How often a waiting sender, the link thread and a delay look at
/// whether to give up; also how long one socket write may block.
pub(crate) const SLICE: Duration = Duration::from_millis(20);

/// Why a frame did not go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("no peer on the wire")]
    LinkDown,
    #[error("the sender gave up (reset, ring disabled or shutdown)")]
    Stopped,
    #[error("the peer did not take the frame within the send timeout")]
    TimedOut,
    #[error("the frame is longer than the wire carries")]
    TooLong,
}

/// A frame on its way to a receiver's queue, with the number of the link
/// it came over (arrival order is tracked per link).
pub(crate) struct Queued {
    pub link: u64,
    pub frame: Frame,
}

/// A connection handle and the link it belongs to.
pub(crate) type Conn = (u64, Box<dyn Stream>);

/// The sending side of a stream link.
#[derive(Default)]
pub(crate) struct StreamOut {
    /// The connection frames are written to.
    pub writer: Mutex<Option<Conn>>,
    /// A second handle on it, to close it without waiting for a writer.
    pub closer: Mutex<Option<Conn>>,
}

pub(crate) enum Outlet {
    /// In-process: straight into the receiver's queue.
    Channel(SyncSender<Queued>),
    /// A byte stream, set up by the link thread.
    Stream(StreamOut),
}

pub(crate) struct Core {
    pub describe: String,
    pub options: WireOptions,
    pub outlet: Outlet,
    pub stop: AtomicBool,
    pub link_up: AtomicBool,
    /// The last link number handed out (one per connection).
    pub links: AtomicU64,
    pub seq: AtomicU32,
    pub stats: WireStats,
    pub outbox: Mutex<Outbox>,
    pub outbox_changed: Condvar,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic elsewhere leaves it usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Core {
    pub fn new(describe: String, options: WireOptions, outlet: Outlet, link_up: bool) -> Self {
        Self {
            describe,
            options,
            outlet,
            stop: AtomicBool::new(false),
            link_up: AtomicBool::new(link_up),
            links: AtomicU64::new(0),
            seq: AtomicU32::new(0),
            stats: WireStats::default(),
            outbox: Mutex::new(Outbox::default()),
            outbox_changed: Condvar::new(),
        }
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Waits `delay`, unless `give_up` says otherwise first; whether the
    /// whole delay passed.
    pub fn wait(&self, delay: Duration, give_up: &dyn Fn() -> bool) -> bool {
        let end = Instant::now() + delay;
        loop {
            if give_up() || self.stopped() {
                return false;
            }
            let now = Instant::now();
            if now >= end {
                return true;
            }
            std::thread::sleep(SLICE.min(end - now));
        }
    }

    /// Puts `frame` on the wire, waiting while the receiver is full, at
    /// most the send timeout, and giving up as soon as `give_up` (or a
    /// shutdown) says so.
    pub fn transmit(&self, frame: Frame, give_up: &dyn Fn() -> bool) -> Result<(), SendError> {
        let deadline = Instant::now() + self.options.send_timeout;
        let bytes = frame.payload.len() as u64;
        match &self.outlet {
            Outlet::Channel(tx) => self.put_in_queue(tx, frame, give_up, deadline)?,
            Outlet::Stream(out) => self.write_stream(out, &frame.encode(), give_up, deadline)?,
        }
        WireStats::add(&self.stats.frames_sent, 1);
        WireStats::add(&self.stats.bytes_sent, bytes);
        Ok(())
    }

    fn give_up_now(&self, give_up: &dyn Fn() -> bool) -> bool {
        give_up() || self.stopped()
    }

    fn put_in_queue(
        &self,
        tx: &SyncSender<Queued>,
        frame: Frame,
        give_up: &dyn Fn() -> bool,
        deadline: Instant,
    ) -> Result<(), SendError> {
        let mut item = Queued { link: 0, frame };
        loop {
            match tx.try_send(item) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(back)) => {
                    if self.give_up_now(give_up) {
                        WireStats::add(&self.stats.sends_abandoned, 1);
                        return Err(SendError::Stopped);
                    }
                    if Instant::now() >= deadline {
                        WireStats::add(&self.stats.send_timeouts, 1);
                        log_limited!(
                            warn,
                            "wire {}: the receiver took no frame for {:?}; the send failed",
                            self.describe,
                            self.options.send_timeout
                        );
                        return Err(SendError::TimedOut);
                    }
                    item = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TrySendError::Disconnected(_)) => return Err(SendError::LinkDown),
            }
        }
    }

    fn write_stream(
        &self,
        out: &StreamOut,
        bytes: &[u8],
        give_up: &dyn Fn() -> bool,
        deadline: Instant,
    ) -> Result<(), SendError> {
        let mut writer = lock(&out.writer);
        let Some((link, stream)) = writer.as_mut() else {
            return Err(SendError::LinkDown);
        };
        let link = *link;
        let mut written = 0;
        while written < bytes.len() {
            match stream.write(&bytes[written..]) {
                Ok(0) => {
                    *writer = None;
                    self.close_link(out, link, "the peer stopped taking bytes");
                    return Err(SendError::LinkDown);
                }
                Ok(n) => written += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    *writer = None;
                    self.close_link(out, link, &format!("send failed: {e}"));
                    return Err(SendError::LinkDown);
                }
            }
            if written == bytes.len() {
                break;
            }
            // Between slices: the device may have given up, the peer may
            // have stopped reading for too long.
            if self.give_up_now(give_up) {
                WireStats::add(&self.stats.sends_abandoned, 1);
                if written > 0 {
                    // The peer now holds part of a frame and could never
                    // find where the next one starts.
                    *writer = None;
                    self.close_link(
                        out,
                        link,
                        "a send was given up mid-frame (reset or shutdown)",
                    );
                }
                return Err(SendError::Stopped);
            }
            if Instant::now() >= deadline {
                WireStats::add(&self.stats.send_timeouts, 1);
                log_limited!(
                    warn,
                    "wire {}: the peer read nothing for {:?}; closing the connection",
                    self.describe,
                    self.options.send_timeout
                );
                *writer = None;
                self.close_link(out, link, "send timed out");
                return Err(SendError::TimedOut);
            }
        }
        Ok(())
    }

    /// Takes link `link` down: the flag drops at once and its connection
    /// is closed, so the link thread's reader ends and a dialing side
    /// dials again.
    pub fn close_link(&self, out: &StreamOut, link: u64, why: &str) {
        let mut closer = lock(&out.closer);
        if closer.as_ref().is_some_and(|(l, _)| *l == link) {
            // Down before the close: a peer that sees its connection end
            // (and whoever it tells) must find the link down too.
            self.link_up.store(false, Ordering::SeqCst);
            if let Some((_, stream)) = closer.take() {
                stream.close();
            }
            tracing::info!(wire = %self.describe, "wire link down: {why}");
        }
    }
}
