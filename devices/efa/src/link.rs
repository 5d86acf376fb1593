//! The device's port on the fabric: where its packets go when they are not
//! for itself. One trait, so the model runs over a unix-socket wire between
//! two server processes and over an in-process pair in tests.
//!
//! A link carries packets as opaque bytes and may lose them (a full queue,
//! a peer that went away): SRD sends again, UD does not care. It must not
//! block a sender for long, so a device never stalls on a slow peer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Why a packet did not go out (it is lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No peer is attached.
    #[error("no peer on the link")]
    Down,
    /// The peer did not take the packet in time.
    #[error("the peer is not taking packets")]
    Congested,
}

/// One device's port.
pub trait Link: Send + Sync + 'static {
    /// Sends one packet. May wait a bounded time while the peer is slow.
    fn send(&self, packet: Vec<u8>) -> Result<(), LinkError>;
    /// The next packet from the peer, waiting at most `timeout`.
    fn recv(&self, timeout: Duration) -> Option<Vec<u8>>;
    /// Whether a peer is attached.
    fn is_up(&self) -> bool;
    /// Wakes and fails every waiter; the link is done.
    fn shutdown(&self);
    /// The carrier's own counters, for `status` under `wire` (none for
    /// an in-process link).
    fn counters(&self) -> Option<serde_json::Value> {
        None
    }
}

/// A port with nothing attached: sends fail, nothing arrives.
#[derive(Debug, Default)]
pub struct NoLink {
    stopped: AtomicBool,
}

impl Link for NoLink {
    fn send(&self, _packet: Vec<u8>) -> Result<(), LinkError> {
        Err(LinkError::Down)
    }

    fn recv(&self, timeout: Duration) -> Option<Vec<u8>> {
        if !self.stopped.load(Ordering::SeqCst) {
            std::thread::sleep(timeout.min(Duration::from_millis(20)));
        }
        None
    }

    fn is_up(&self) -> bool {
        false
    }

    fn shutdown(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

/// Packets a channel end holds before its sender waits.
pub const CHANNEL_DEPTH: usize = 4096;
/// How long a channel sender waits for room.
pub const SEND_TIMEOUT: Duration = Duration::from_millis(200);

/// One end of an in-process link (tests, or two devices in one process).
#[derive(Debug)]
pub struct ChannelLink {
    tx: SyncSender<Vec<u8>>,
    rx: Mutex<Receiver<Vec<u8>>>,
    stopped: AtomicBool,
}

impl ChannelLink {
    /// Two ends wired to each other.
    pub fn pair() -> (Self, Self) {
        let (a_tx, a_rx) = sync_channel(CHANNEL_DEPTH);
        let (b_tx, b_rx) = sync_channel(CHANNEL_DEPTH);
        let end = |tx, rx| Self {
            tx,
            rx: Mutex::new(rx),
            stopped: AtomicBool::new(false),
        };
        (end(a_tx, b_rx), end(b_tx, a_rx))
    }
}

impl Link for ChannelLink {
    fn send(&self, packet: Vec<u8>) -> Result<(), LinkError> {
        let deadline = Instant::now() + SEND_TIMEOUT;
        let mut packet = packet;
        loop {
            if self.stopped.load(Ordering::SeqCst) {
                return Err(LinkError::Down);
            }
            match self.tx.try_send(packet) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(_)) => return Err(LinkError::Down),
                Err(TrySendError::Full(back)) => {
                    if Instant::now() >= deadline {
                        return Err(LinkError::Congested);
                    }
                    packet = back;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
    }

    fn recv(&self, timeout: Duration) -> Option<Vec<u8>> {
        if self.stopped.load(Ordering::SeqCst) {
            return None;
        }
        let rx = self.rx.lock().unwrap_or_else(PoisonError::into_inner);
        match rx.recv_timeout(timeout) {
            Ok(packet) => Some(packet),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                drop(rx);
                std::thread::sleep(timeout.min(Duration::from_millis(20)));
                None
            }
        }
    }

    fn is_up(&self) -> bool {
        !self.stopped.load(Ordering::SeqCst)
    }

    fn shutdown(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

/// How long a [`WireLink`] send waits for a slow peer before the packet
/// counts as lost (SRD sends it again).
pub const WIRE_SEND_WAIT: Duration = Duration::from_millis(200);

/// A port on p2plab-wire: the unix-socket wire between two server
/// processes (`--wire listen:PATH` / `connect:PATH`), or a loopback. Each
/// packet is one frame's payload; the EFA's own checksum stays inside it,
/// so a frame the wire corrupted is dropped by the receiving device.
#[derive(Debug)]
pub struct WireLink {
    wire: p2plab_wire::Wire,
}

impl WireLink {
    /// A port on `wire`.
    pub fn new(wire: p2plab_wire::Wire) -> Self {
        Self { wire }
    }

    /// The wire's counters.
    pub fn stats(&self) -> p2plab_wire::WireStatsSnapshot {
        self.wire.stats()
    }
}

impl Link for WireLink {
    fn send(&self, packet: Vec<u8>) -> Result<(), LinkError> {
        use p2plab_wire::{Frame, SendError};
        let deadline = Instant::now() + WIRE_SEND_WAIT;
        let give_up = || Instant::now() >= deadline;
        match self.wire.send(Frame::new(packet), &give_up) {
            Ok(_) => Ok(()),
            // Our own wait ran out (Stopped) or the wire's did: the peer
            // is slow; the packet is lost.
            Err(SendError::TimedOut) => Err(LinkError::Congested),
            Err(SendError::Stopped) if give_up() => Err(LinkError::Congested),
            Err(_) => Err(LinkError::Down),
        }
    }

    fn recv(&self, timeout: Duration) -> Option<Vec<u8>> {
        self.wire.recv_timeout(timeout).map(|frame| frame.payload)
    }

    fn is_up(&self) -> bool {
        self.wire.link_up()
    }

    fn shutdown(&self) {
        self.wire.shutdown();
    }

    fn counters(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.wire.stats()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: an in-process pair that loses, reorders or misroutes
    /// packets, or a stopped end that still takes them.
    #[test]
    fn a_pair_carries_packets_both_ways_in_order() {
        let (a, b) = ChannelLink::pair();
        for i in 0..100u8 {
            a.send(vec![i]).unwrap();
        }
        for i in 0..100u8 {
            assert_eq!(b.recv(Duration::from_secs(1)), Some(vec![i]));
        }
        b.send(vec![7]).unwrap();
        assert_eq!(a.recv(Duration::from_secs(1)), Some(vec![7]));
        assert_eq!(a.recv(Duration::from_millis(1)), None);
        a.shutdown();
        assert!(!a.is_up());
        assert_eq!(a.send(vec![1]), Err(LinkError::Down));
        let none = NoLink::default();
        assert_eq!(none.send(vec![1]), Err(LinkError::Down));
        assert!(!none.is_up());
    }

    /// Catches: a wire port that loses, alters or misroutes packets
    /// between two ends, or that says it is up after shutdown.
    #[test]
    fn a_wire_pair_carries_packets_both_ways() {
        let (a, b) = p2plab_wire::Wire::pair();
        let (a, b) = (WireLink::new(a), WireLink::new(b));
        assert!(a.is_up() && b.is_up());
        for i in 0..4u8 {
            a.send(vec![i; 100 + usize::from(i)]).unwrap();
        }
        for i in 0..4u8 {
            assert_eq!(
                b.recv(Duration::from_secs(1)),
                Some(vec![i; 100 + usize::from(i)])
            );
        }
        b.send(vec![9; 9000]).unwrap();
        assert_eq!(a.recv(Duration::from_secs(1)), Some(vec![9; 9000]));
        assert_eq!(a.stats().frames_received, 1);
        let counters = a.counters().unwrap();
        assert_eq!(counters["frames_received"], 1, "{counters}");
        assert_eq!(NoLink::default().counters(), None);
        assert_eq!(a.recv(Duration::from_millis(1)), None);
    }
}
