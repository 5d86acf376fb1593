//! SRD's bookkeeping: the messages a device sent and waits to hear about
//! (for retransmission, RNR retries and completion), and the messages it
//! received recently (so a retransmitted one is acknowledged again, not
//! delivered twice).
//!
//! SRD may deliver out of order; nothing here orders messages. A message
//! is done when its acknowledgement (or, for a read, all its data) comes
//! back, or when its retries run out.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_kit::Epoch;

use super::state::Mr;
use crate::defs::IoOp;
use crate::frame::{Header, SEGMENT_SIZE};
use crate::io::Buf;

/// First retransmission timeout; it doubles per try up to [`MAX_RTO`].
pub(crate) const BASE_RTO: Duration = Duration::from_millis(50);
/// Longest retransmission timeout.
pub(crate) const MAX_RTO: Duration = Duration::from_millis(400);
/// Tries before a message is given up on (about 6 s of silence).
pub(crate) const MAX_TRIES: u32 = 16;
/// How long a sender waits before trying again after an RNR.
pub(crate) const RNR_DELAY: Duration = Duration::from_millis(2);
/// An RNR retry count of 7 means "forever".
pub(crate) const RNR_FOREVER: u8 = 7;
/// Received messages remembered for duplicate detection.
pub(crate) const SEEN_CAPACITY: usize = 1 << 16;

/// The retransmission timeout after `tries` sends.
pub(crate) fn rto(tries: u32) -> Duration {
    (BASE_RTO * (1 << tries.min(8).saturating_sub(1))).min(MAX_RTO)
}

/// What a message in flight is waiting for.
#[derive(Debug)]
pub(crate) enum Work {
    /// A SEND: its packet, sent again as it is.
    Send { packet: Vec<u8> },
    /// An RDMA read: the request, and which segments of data arrived.
    Read {
        request: Vec<u8>,
        mr: Arc<Mr>,
        local: u64,
        length: u32,
        received: Vec<bool>,
        left: usize,
    },
    /// An RDMA write: which segments were acknowledged; then the
    /// immediate, if any.
    Write {
        mr: Arc<Mr>,
        local: u64,
        remote: Buf,
        acked: Vec<bool>,
        left: usize,
        imm: Option<u32>,
        /// The immediate's packet, once all data is acknowledged.
        imm_packet: Option<Vec<u8>>,
    },
}

/// Segments of an RDMA of `length` bytes.
pub(crate) fn segments(length: u32) -> usize {
    (length as usize).div_ceil(SEGMENT_SIZE)
}

/// The bytes of segment `index` of an RDMA of `length` bytes.
pub(crate) fn segment_len(length: u32, index: usize) -> usize {
    (length as usize - index * SEGMENT_SIZE).min(SEGMENT_SIZE)
}

/// One message in flight.
#[derive(Debug)]
pub(crate) struct Pending {
    pub qp_num: u16,
    pub send_cq: u16,
    pub req_id: u16,
    pub comp_req: bool,
    pub op: IoOp,
    pub epoch: Epoch,
    /// Its addressing (destination GID and QP, message ID).
    pub header: Header,
    pub work: Work,
    /// Bytes the message moves (for the counters).
    pub bytes: u64,
    pub deadline: Instant,
    pub tries: u32,
    pub rnr_tries: u32,
    pub rnr_limit: u8,
    /// The next send is an RNR retry, not a timeout.
    pub rnr_wait: bool,
}

/// Remembered answers to received messages, oldest forgotten first.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    answers: HashMap<([u8; 16], u16, u64), u8>,
    order: VecDeque<([u8; 16], u16, u64)>,
}

impl Seen {
    pub(crate) fn get(&self, header: &Header) -> Option<u8> {
        self.answers
            .get(&(header.src_gid, header.src_qp, header.msg_id))
            .copied()
    }

    pub(crate) fn record(&mut self, header: &Header, status: u8) {
        let key = (header.src_gid, header.src_qp, header.msg_id);
        if self.answers.insert(key, status).is_none() {
            self.order.push_back(key);
            if self.order.len() > SEEN_CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.answers.remove(&old);
                }
            }
        }
    }
}

/// The device's reliability state.
#[derive(Debug, Default)]
pub(crate) struct Reliability {
    pub pending: HashMap<u64, Pending>,
    /// Peers that answered at least once (a timeout then means
    /// "unresponsive", not "unreachable").
    pub answered: HashSet<[u8; 16]>,
    pub seen: Seen,
}

impl Reliability {
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.seen = Seen::default();
    }

    /// Forgets the messages of a QP that is gone or reset.
    pub(crate) fn forget_qp(&mut self, qp_num: u16) -> Vec<Pending> {
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.qp_num == qp_num)
            .map(|(&id, _)| id)
            .collect();
        ids.into_iter()
            .filter_map(|id| self.pending.remove(&id))
            .collect()
    }

    /// The message IDs whose deadline has passed, and the next deadline of
    /// the others.
    pub(crate) fn due(&self, now: Instant) -> (Vec<u64>, Option<Instant>) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (&id, p) in &self.pending {
            if p.deadline <= now {
                due.push(id);
            } else {
                next = Some(next.map_or(p.deadline, |n| n.min(p.deadline)));
            }
        }
        (due, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a timeout that does not back off, or grows without bound.
    #[test]
    fn the_timeout_doubles_up_to_its_cap() {
        assert_eq!(rto(1), Duration::from_millis(50));
        assert_eq!(rto(2), Duration::from_millis(100));
        assert_eq!(rto(3), Duration::from_millis(200));
        assert_eq!(rto(4), MAX_RTO);
        assert_eq!(rto(40), MAX_RTO);
        assert_eq!(segments(0), 0);
        assert_eq!(segments(SEGMENT_SIZE as u32 + 1), 2);
        assert_eq!(segment_len(SEGMENT_SIZE as u32 + 1, 1), 1);
    }

    /// Catches: a duplicate not recognised, or a memory of received
    /// messages that grows without bound.
    #[test]
    fn seen_messages_are_remembered_and_forgotten_oldest_first() {
        let mut seen = Seen::default();
        let header = |msg_id| Header {
            src_gid: [1; 16],
            dst_gid: [2; 16],
            src_qp: 5,
            dst_qp: 6,
            qkey: 0,
            msg_id,
        };
        seen.record(&header(1), 0);
        assert_eq!(seen.get(&header(1)), Some(0));
        assert_eq!(seen.get(&header(2)), None);
        for id in 2..(SEEN_CAPACITY as u64 + 2) {
            seen.record(&header(id), 9);
        }
        assert_eq!(seen.get(&header(1)), None, "the oldest is forgotten");
        assert_eq!(seen.answers.len(), SEEN_CAPACITY);
        assert_eq!(seen.get(&header(SEEN_CAPACITY as u64 + 1)), Some(9));
    }
}
