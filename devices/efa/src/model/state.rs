//! Everything the device holds behind its one state lock: BAR0's latched
//! registers, the admin queues' positions, and the tables of objects the
//! admin commands create (UARs, PDs, AHs, MRs, CQs, EQs, QPs). The lock is
//! never held across DMA: engines copy what they need out and let go.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use p2plab_kit::Epoch;

use crate::admin::MAX_ADMIN_DEPTH;
use crate::defs::{QpState, QpType};
use crate::pbl::PageList;
use crate::regs::QUEUE_CAPS_DEPTH_MASK;

/// Locks `mutex`, carrying on after a panic elsewhere (plain data).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A table of objects indexed by slot, with a generation per slot so a
/// recycled slot gets new handles.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    items: Vec<Option<T>>,
    generations: Vec<u16>,
}

impl<T> Slots<T> {
    /// `capacity` free slots.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            items: (0..capacity).map(|_| None).collect(),
            generations: vec![0; capacity],
        }
    }

    /// A free slot and its new generation, if any is free.
    pub(crate) fn free_slot(&self) -> Option<(usize, u16)> {
        let slot = self.items.iter().position(Option::is_none)?;
        Some((slot, self.generations[slot].wrapping_add(1)))
    }

    /// Fills `slot` (from [`free_slot`](Self::free_slot)) with `item`.
    pub(crate) fn fill(&mut self, slot: usize, generation: u16, item: T) {
        if let (Some(entry), Some(g)) = (self.items.get_mut(slot), self.generations.get_mut(slot)) {
            *entry = Some(item);
            *g = generation;
        }
    }

    pub(crate) fn get(&self, slot: usize) -> Option<&T> {
        self.items.get(slot)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, slot: usize) -> Option<&mut T> {
        self.items.get_mut(slot)?.as_mut()
    }

    pub(crate) fn take(&mut self, slot: usize) -> Option<T> {
        self.items.get_mut(slot)?.take()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| item.as_ref().map(|item| (i, item)))
    }

    pub(crate) fn count(&self) -> usize {
        self.items.iter().filter(|i| i.is_some()).count()
    }

    pub(crate) fn clear(&mut self) {
        for item in &mut self.items {
            *item = None;
        }
    }
}

/// A ring the driver set up through registers: base, depth, entry size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ring {
    pub base: u64,
    pub depth: u32,
}

impl Ring {
    /// The ring a base register pair and a caps register describe, if the
    /// depth is a power of two the device takes, the entry size is
    /// `entry_size`, and the base is set and aligned.
    pub(crate) fn from_caps(
        base: u64,
        caps: u32,
        size_shift: u32,
        size_mask: u32,
        entry_size: u32,
    ) -> Option<Self> {
        let depth = caps & QUEUE_CAPS_DEPTH_MASK;
        let size = (caps >> size_shift) & size_mask;
        (base != 0
            && base.is_multiple_of(8)
            && depth.is_power_of_two()
            && depth <= MAX_ADMIN_DEPTH
            && size == entry_size)
            .then_some(Ring { base, depth })
    }

    /// Bus address of entry `count` (a running count).
    pub(crate) fn entry(&self, count: u32, entry_size: u64) -> u64 {
        self.base + u64::from(count % self.depth) * entry_size
    }

    /// The phase of entry `count`: 1 on the first lap, flipping each lap.
    pub(crate) fn phase(&self, count: u32) -> bool {
        (count / self.depth).is_multiple_of(2)
    }
}

/// Where the reset handshake is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResetPhase {
    /// No reset going on.
    Idle,
    /// DEV_CTL.DEV_RESET is set.
    Requested,
    /// DEV_RESET was cleared; the device is waiting for its DMA to drain.
    Draining,
}

/// BAR0's latched values.
#[derive(Debug, Clone)]
pub(crate) struct Registers {
    pub aq_base: u64,
    pub aq_caps: u32,
    pub acq_base: u64,
    pub acq_caps: u32,
    pub aenq_base: u64,
    pub aenq_caps: u32,
    pub aenq_cons: u32,
    pub intr_mask: u32,
    pub dev_ctl: u32,
    pub mmio_resp: u64,
    pub reset: ResetPhase,
    pub reset_finished: bool,
}

impl Registers {
    pub(crate) fn new() -> Self {
        Self {
            aq_base: 0,
            aq_caps: 0,
            acq_base: 0,
            acq_caps: 0,
            aenq_base: 0,
            aenq_caps: 0,
            aenq_cons: 0,
            intr_mask: 0,
            dev_ctl: 0,
            mmio_resp: 0,
            reset: ResetPhase::Idle,
            reset_finished: false,
        }
    }
}

/// The admin queues' positions.
#[derive(Debug, Clone, Default)]
pub(crate) struct AdminState {
    /// The driver's producer count (AQ_PROD_DB).
    pub sq_tail: u16,
    /// Entries the device has taken.
    pub sq_head: u16,
    /// Completions written.
    pub cq_count: u32,
    /// AENQ entries written.
    pub aenq_count: u32,
    /// Groups SET_FEATURE(AENQ_CONFIG) enabled.
    pub aenq_enabled: u32,
}

/// An AENQ event waiting to be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AenqEvent {
    pub group: u16,
    pub syndrome: u16,
}

/// Work for the management thread that the register path hands over (it
/// must not do DMA itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MgmtJob {
    /// A CQ was armed with completions pending: post its event.
    CqEvent { cq: u16, generation: u16 },
    /// A readless response that could not be written directly.
    Readless {
        addr: u64,
        response: [u8; 8],
        epoch: Epoch,
    },
}

/// Work for the send engine from elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SendJob {
    /// Serve an RDMA read a peer asked for.
    ServeRead {
        header: crate::frame::Header,
        rkey: u32,
        addr: u64,
        length: u32,
    },
}

/// A user access region: one doorbell page.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Uar;

/// A protection domain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pd;

/// An address handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ah {
    pub pd: u16,
    pub gid: [u8; 16],
}

/// A registered memory region.
#[derive(Debug)]
pub(crate) struct Mr {
    pub pd: u16,
    pub key: u32,
    pub access: u8,
    pub list: PageList,
}

/// A completion queue's writer side (taken by whoever posts a completion;
/// DMA happens under it, so the register path never takes it).
#[derive(Debug, Default)]
pub(crate) struct CqWriter {
    pub count: u32,
}

/// A completion queue's event side, shared with the register path.
#[derive(Debug, Default)]
pub(crate) struct CqSignal {
    /// Armed by a doorbell: the next completion posts an event.
    pub armed: bool,
}

/// What a CQ shares between the engines and the register path.
#[derive(Debug, Default)]
pub(crate) struct CqShared {
    pub writer: Mutex<CqWriter>,
    /// Completions written so far (the writer's count, readable without
    /// its lock).
    pub produced: AtomicU32,
    pub signal: Mutex<CqSignal>,
}

impl CqShared {
    pub(crate) fn produced(&self) -> u32 {
        self.produced.load(Ordering::SeqCst)
    }
}

/// A completion queue.
#[derive(Debug, Clone)]
pub(crate) struct Cq {
    pub generation: u16,
    pub uar: u16,
    pub ring: u64,
    pub depth: u32,
    pub entry_size: usize,
    pub eq: Option<u16>,
    pub set_src_addr: bool,
    pub shared: Arc<CqShared>,
}

/// An event queue's writer side.
#[derive(Debug, Default)]
pub(crate) struct EqWriter {
    pub count: u32,
}

/// An event queue's interrupt state.
#[derive(Debug, Default)]
pub(crate) struct EqSignal {
    /// Armed by EQ_DB: the next event raises the vector.
    pub armed: bool,
    /// Events written since the last interrupt.
    pub pending: bool,
}

/// What an EQ shares.
#[derive(Debug, Default)]
pub(crate) struct EqShared {
    pub writer: Mutex<EqWriter>,
    pub signal: Mutex<EqSignal>,
}

/// An event queue.
#[derive(Debug, Clone)]
pub(crate) struct Eq {
    pub ring: u64,
    pub depth: u32,
    pub vector: u16,
    pub shared: Arc<EqShared>,
}

/// A queue pair: what CREATE_QP fixed, and what runs.
#[derive(Debug, Clone)]
pub(crate) struct Qp {
    pub num: u16,
    pub pd: u16,
    pub ty: QpType,
    pub uar: u16,
    pub send_cq: u16,
    pub recv_cq: u16,
    /// WQEs in the send ring (0: no send queue).
    pub sq_entries: u32,
    /// Where the send ring is in BAR2.
    pub llq_offset: u64,
    /// The receive ring's bus address.
    pub rq_ring: u64,
    /// Descriptors in the receive ring (0: no receive queue).
    pub rq_entries: u32,
    pub state: QpState,
    pub qkey: u32,
    pub sq_psn: u32,
    pub rnr_retry: u8,
    /// Next send WQE to take.
    pub sq_head: u16,
    /// The SQ doorbell's producer count.
    pub sq_tail: u16,
    /// Next receive descriptor to use.
    pub rq_head: u16,
    /// The RQ doorbell's producer count.
    pub rq_tail: u16,
}

impl Qp {
    /// Whether the send queue may be processed.
    pub(crate) fn can_send(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd) && self.sq_entries > 0
    }

    /// Whether messages may be received.
    pub(crate) fn can_receive(&self) -> bool {
        matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
    }

    /// Send WQEs posted and not taken.
    pub(crate) fn sq_pending(&self) -> u16 {
        self.sq_tail.wrapping_sub(self.sq_head)
    }
}

/// The object tables.
#[derive(Debug)]
pub(crate) struct Objects {
    pub uars: Slots<Uar>,
    pub pds: Slots<Pd>,
    pub ahs: Slots<Ah>,
    pub mrs: Slots<Arc<Mr>>,
    pub cqs: Slots<Cq>,
    pub eqs: Slots<Eq>,
    pub qps: Slots<Qp>,
}

impl Objects {
    pub(crate) fn new(attrs: &crate::attrs::DeviceAttrs) -> Self {
        Self {
            uars: Slots::new(attrs.max_uar as usize),
            pds: Slots::new(attrs.max_pd as usize),
            ahs: Slots::new(attrs.max_ah as usize),
            mrs: Slots::new(attrs.max_mr as usize),
            cqs: Slots::new(attrs.max_cq as usize),
            eqs: Slots::new(attrs.max_eq as usize),
            qps: Slots::new(attrs.max_qp as usize),
        }
    }

    pub(crate) fn clear(&mut self) {
        self.uars.clear();
        self.pds.clear();
        self.ahs.clear();
        self.mrs.clear();
        self.cqs.clear();
        self.eqs.clear();
        self.qps.clear();
    }

    /// PD numbers are slot + 1.
    pub(crate) fn pd_exists(&self, pd: u16) -> bool {
        usize::from(pd)
            .checked_sub(1)
            .is_some_and(|slot| self.pds.get(slot).is_some())
    }

    /// The QP with number `num` (the slot is its low bits).
    pub(crate) fn qp_by_num(&self, num: u16, qp_slots: u32) -> Option<(usize, &Qp)> {
        let slot = usize::from(num) & (qp_slots as usize - 1);
        self.qps
            .get(slot)
            .filter(|qp| qp.num == num)
            .map(|qp| (slot, qp))
    }

    /// The MR with key `key`.
    pub(crate) fn mr_by_key(&self, key: u32, key_slot_bits: u32) -> Option<&Arc<Mr>> {
        let slot = (key & ((1 << key_slot_bits) - 1)).checked_sub(1)?;
        self.mrs.get(slot as usize).filter(|mr| mr.key == key)
    }
}

/// Everything behind the state lock.
#[derive(Debug)]
pub(crate) struct State {
    pub regs: Registers,
    pub admin: AdminState,
    pub objects: Objects,
    pub aenq_pending: VecDeque<AenqEvent>,
    pub mgmt_jobs: VecDeque<MgmtJob>,
    pub send_jobs: VecDeque<SendJob>,
    pub bus_master: bool,
    pub shutdown: bool,
    /// The fabric port is up (a `link-down` fault takes it down).
    pub port_up: bool,
    /// What SET_FEATURE(HOST_INFO) told about the guest, for `status`.
    pub host_kernel: Option<String>,
}

impl State {
    pub(crate) fn new(attrs: &crate::attrs::DeviceAttrs) -> Self {
        Self {
            regs: Registers::new(),
            admin: AdminState::default(),
            objects: Objects::new(attrs),
            aenq_pending: VecDeque::new(),
            mgmt_jobs: VecDeque::new(),
            send_jobs: VecDeque::new(),
            bus_master: false,
            shutdown: false,
            port_up: true,
            host_kernel: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a recycled slot that keeps its generation (stale handles
    /// would then reach the new object).
    #[test]
    fn slots_recycle_with_a_new_generation() {
        let mut slots = Slots::new(2);
        let (a, ga) = slots.free_slot().unwrap();
        slots.fill(a, ga, 'a');
        let (b, gb) = slots.free_slot().unwrap();
        slots.fill(b, gb, 'b');
        assert_eq!((a, b), (0, 1));
        assert!(slots.free_slot().is_none());
        assert_eq!(slots.take(0), Some('a'));
        let (again, g2) = slots.free_slot().unwrap();
        assert_eq!(again, 0);
        assert_ne!(g2, ga);
        assert_eq!(slots.count(), 1);
        assert_eq!(slots.get(5), None);
    }

    /// Catches: ring phases that start at 0 or flip at the wrong count,
    /// or caps with a bad depth or entry size taken as a ring.
    #[test]
    fn rings_have_the_drivers_phases() {
        let ring = Ring::from_caps(0x1000, 32 | 64 << 16, 16, 0xffff, 64).unwrap();
        assert!(ring.phase(0) && ring.phase(31));
        assert!(!ring.phase(32) && !ring.phase(63));
        assert!(ring.phase(64));
        assert_eq!(ring.entry(33, 64), 0x1040);
        assert!(Ring::from_caps(0x1000, 30 | 64 << 16, 16, 0xffff, 64).is_none());
        assert!(Ring::from_caps(0x1000, 32 | 128 << 16, 16, 0xffff, 64).is_none());
        assert!(Ring::from_caps(0, 32 | 64 << 16, 16, 0xffff, 64).is_none());
        assert!(Ring::from_caps(0x1000, 8192 | 64 << 16, 16, 0xffff, 64).is_none());
    }
}
