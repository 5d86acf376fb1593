//! The device's side of the fabric: the outgoing packet queue, the pump
//! that puts it on the link (where wire faults apply: drop, delay,
//! corrupt, reorder), the reader that brings the link's packets to the
//! receive engine, and the loopback for packets to the device's own GID.
//!
//! Only the send engine waits for room in the outgoing queue; the receive
//! engine's answers (acknowledgements) are dropped when it is full, so
//! two devices sending to each other never wait on each other. SRD sends
//! a lost packet again.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::TrySendError;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::state::lock;
use super::{Device, Progress};
use crate::stats::Stats;

/// Packets waiting for the pump.
const OUTBOUND_DEPTH: usize = 1024;
/// How long blocked fabric threads look at the stop flag.
const POLL: Duration = Duration::from_millis(20);
/// How long a packet held back by `reorder` waits for one to overtake it.
const REORDER_HOLD: Duration = Duration::from_millis(20);

/// The outgoing queue.
pub(crate) struct Outbound {
    queue: Mutex<VecDeque<Vec<u8>>>,
    changed: Condvar,
}

impl Outbound {
    pub(crate) fn new() -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            changed: Condvar::new(),
        }
    }

    /// Queues `packet`, waiting for room while `go_on` says so; whether it
    /// was queued.
    pub(crate) fn push_wait(&self, packet: Vec<u8>, go_on: &dyn Fn() -> bool) -> bool {
        let mut queue = lock(&self.queue);
        while queue.len() >= OUTBOUND_DEPTH {
            if !go_on() {
                return false;
            }
            queue = match self.changed.wait_timeout(queue, POLL) {
                Ok((q, _)) => q,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        queue.push_back(packet);
        drop(queue);
        self.changed.notify_all();
        true
    }

    /// Queues `packet` if there is room; whether it was queued.
    pub(crate) fn try_push(&self, packet: Vec<u8>) -> bool {
        let mut queue = lock(&self.queue);
        if queue.len() >= OUTBOUND_DEPTH {
            return false;
        }
        queue.push_back(packet);
        drop(queue);
        self.changed.notify_all();
        true
    }

    /// The next packet, waiting at most `timeout`.
    fn pop(&self, timeout: Duration) -> Option<Vec<u8>> {
        let mut queue = lock(&self.queue);
        if queue.is_empty() && !timeout.is_zero() {
            queue = match self.changed.wait_timeout(queue, timeout) {
                Ok((q, _)) => q,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        let packet = queue.pop_front();
        drop(queue);
        if packet.is_some() {
            self.changed.notify_all();
        }
        packet
    }

    pub(crate) fn clear(&self) {
        lock(&self.queue).clear();
        self.changed.notify_all();
    }

    pub(crate) fn wake_all(&self) {
        self.changed.notify_all();
    }
}

impl Device {
    fn running(&self) -> bool {
        !self.stopping.load(Ordering::SeqCst)
    }

    /// Whether the fabric port is up (a `link-down` fault takes it down).
    pub(crate) fn port_up(&self) -> bool {
        self.lock().port_up
    }

    /// Sends a packet to `dst`: to the receive engine for our own GID,
    /// else to the pump. Waits for room when `wait` (the send engine
    /// only); whether it went.
    pub(crate) fn transmit(&self, dst: &[u8; 16], packet: Vec<u8>, wait: bool) -> bool {
        if *dst == self.gid() {
            let len = packet.len() as u64;
            return match self.inbound_tx.try_send(packet) {
                Ok(()) => {
                    Stats::add(&self.stats.tx_pkts, 1);
                    Stats::add(&self.stats.tx_bytes, len);
                    true
                }
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    Stats::add(&self.stats.tx_queue_drops, 1);
                    false
                }
            };
        }
        // On the caller's thread nobody else empties the queue: a send
        // does not wait for room there.
        let queued = if wait && !self.engines_on_caller {
            self.outbound.push_wait(packet, &|| self.running())
        } else {
            self.outbound.try_push(packet)
        };
        if !queued {
            Stats::add(&self.stats.tx_queue_drops, 1);
        }
        queued
    }
}

/// Puts queued packets on the link, applying wire faults.
pub(crate) fn pump(device: &Device) {
    let mut held: Option<Vec<u8>> = None;
    while device.running() {
        pump_step(device, &mut held, true);
    }
}

/// One step of the pump: the next outgoing packet through the armed wire
/// faults onto the link (a reordered one `held` until the next goes, or
/// until the queue stays empty). With `wait` it waits for a packet (the
/// thread: up to 20 ms); without, it takes only one already there (the
/// engines on the caller's thread).
pub(crate) fn pump_step(device: &Device, held: &mut Option<Vec<u8>>, wait: bool) -> Progress {
    let timeout = match (wait, held.is_some()) {
        (false, _) => Duration::ZERO,
        (true, true) => REORDER_HOLD,
        (true, false) => POLL,
    };
    let Some(mut packet) = device.outbound.pop(timeout) else {
        if let Some(late) = held.take() {
            put_on_link(device, late);
            return Progress::Worked;
        }
        return Progress::Idle;
    };
    let decision = {
        let mut faults = device.faults();
        if faults.is_idle() {
            Default::default()
        } else {
            faults.wire()
        }
    };
    if decision.drop {
        Stats::add(&device.stats.wire_drops, 1);
        device.trace.record(
            "wire",
            || serde_json::json!({"name": "packet dropped", "injected": true}),
        );
        return Progress::Worked;
    }
    if let Some(delay) = decision.delay {
        Stats::add(&device.stats.wire_delays, 1);
        std::thread::sleep(delay);
    }
    if decision.corrupt {
        let middle = packet.len() / 2;
        if let Some(byte) = packet.get_mut(middle) {
            *byte ^= 0x5a;
        }
        Stats::add(&device.stats.wire_corrupts, 1);
        device.trace.record(
            "wire",
            || serde_json::json!({"name": "packet corrupted", "injected": true}),
        );
    }
    if decision.reorder && held.is_none() {
        Stats::add(&device.stats.wire_reorders, 1);
        *held = Some(packet);
        return Progress::Worked;
    }
    put_on_link(device, packet);
    if let Some(late) = held.take() {
        put_on_link(device, late);
    }
    Progress::Worked
}

fn put_on_link(device: &Device, packet: Vec<u8>) {
    if !device.port_up() {
        Stats::add(&device.stats.tx_queue_drops, 1);
        return;
    }
    let len = packet.len() as u64;
    match device.link.send(packet) {
        Ok(()) => {
            Stats::add(&device.stats.tx_pkts, 1);
            Stats::add(&device.stats.tx_bytes, len);
        }
        Err(e) => {
            Stats::add(&device.stats.tx_queue_drops, 1);
            p2plab_ratelimit::log_limited!(debug, error = %e, "packet lost on the link");
        }
    }
}

/// Brings packets from the link to the receive engine.
pub(crate) fn link_reader(device: &Device) {
    let mut pending = None;
    while device.running() {
        if link_step(device, &mut pending, true) == Progress::Stop {
            return;
        }
    }
}

/// One step of the link reader: the next packet from the link (or the
/// one `pending` from the last step) to the receive engine. With `wait`
/// it waits up to 20 ms for a packet and for room in the inbound queue
/// (the thread); without, it takes only a packet already there and
/// keeps it `pending` while the queue is full (the engines on the
/// caller's thread, where the receive engine empties it between steps).
pub(crate) fn link_step(device: &Device, pending: &mut Option<Vec<u8>>, wait: bool) -> Progress {
    let mut packet = match pending.take() {
        Some(packet) => packet,
        None => {
            let Some(packet) = device.link.recv(if wait { POLL } else { Duration::ZERO }) else {
                return Progress::Idle;
            };
            if !device.port_up() {
                Stats::add(&device.stats.rx_drops, 1);
                return Progress::Worked;
            }
            packet
        }
    };
    loop {
        match device.inbound_tx.try_send(packet) {
            Ok(()) => return Progress::Worked,
            Err(TrySendError::Full(back)) if !wait => {
                *pending = Some(back);
                return Progress::Idle;
            }
            Err(TrySendError::Full(back)) if device.running() => {
                packet = back;
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(_) => return Progress::Stop,
        }
    }
}
