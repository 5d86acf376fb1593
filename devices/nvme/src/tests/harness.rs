//! A tiny NVMe host driver over fake guest memory, enough to drive the
//! controller the way Linux does: no socket, no QEMU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::command::{Command, CommandBuilder, CompletionEntry};
use crate::config::ControllerConfig;
use crate::namespace::{BlockBackend, FileBackend, Namespace, NamespaceIds};
use crate::registers::reg;
use crate::spec::{admin, Status};
use crate::NvmeController;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_kit::testing::RecordingInterrupts;

/// Guest RAM in the fake address space.
pub const RAM: u64 = 0x10_0000;
pub const RAM_SIZE: usize = 32 << 20;
/// Where tests put data buffers.
pub const DATA: u64 = RAM + (8 << 20);
/// Bus address the tests place the CMB BAR at.
pub const CMB_BAR: u64 = 0x8000_0000;
pub const CMB_SIZE: u64 = 4 << 20;

pub const TIMEOUT: Duration = Duration::from_secs(10);

pub struct QueuePair {
    #[allow(dead_code)]
    pub qid: u16,
    pub sq_base: u64,
    pub cq_base: u64,
    pub entries: u32,
    pub sq_tail: u32,
    pub cq_head: u32,
    pub phase: bool,
}

pub struct Host {
    pub ctrl: NvmeController,
    pub guest: Arc<FakeGuestMemory>,
    pub cmb: Arc<HeapRegion>,
    pub irq: Arc<RecordingInterrupts>,
    pub queues: Vec<Option<QueuePair>>,
    next_cid: u16,
}

pub fn memory_namespace(nsid: u32, size: u64, block_size: u32) -> Arc<Namespace> {
    let backend: Arc<dyn BlockBackend> =
        Arc::new(FileBackend::memory(&format!("test-ns{nsid}"), size).unwrap());
    namespace_on(nsid, backend, block_size)
}

pub fn namespace_on(nsid: u32, backend: Arc<dyn BlockBackend>, block_size: u32) -> Arc<Namespace> {
    Arc::new(Namespace::new(
        nsid,
        backend,
        block_size,
        NamespaceIds::derive("TESTSERIAL", nsid, [2, 0x50, 0x4c]),
    ))
}

pub fn test_config() -> ControllerConfig {
    ControllerConfig {
        serial: "TESTSERIAL".into(),
        max_io_queues: 4,
        cmb_size: CMB_SIZE,
        ..ControllerConfig::default()
    }
}

impl Host {
    pub fn new() -> Self {
        Self::with(test_config(), vec![memory_namespace(1, 1 << 20, 512)])
    }

    pub fn with(config: ControllerConfig, namespaces: Vec<Arc<Namespace>>) -> Self {
        Self::with_pmr(config, namespaces, None)
    }

    pub fn with_pmr(
        config: ControllerConfig,
        namespaces: Vec<Arc<Namespace>>,
        pmr: Option<Arc<dyn RegionMemory>>,
    ) -> Self {
        Self::build(config, namespaces, pmr, |guest| guest)
    }

    /// The controller reaches guest RAM through what `wrap` makes of it
    /// (fault or delay injection); the test still pokes RAM directly.
    pub fn wrapped(
        config: ControllerConfig,
        namespaces: Vec<Arc<Namespace>>,
        wrap: impl FnOnce(Arc<dyn GuestMemory>) -> Arc<dyn GuestMemory>,
    ) -> Self {
        Self::build(config, namespaces, None, wrap)
    }

    /// A controller whose queues run on the test's thread: [`try_reap`]
    /// runs them while it looks for a completion.
    pub fn on_caller() -> Self {
        let guest = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
        let cmb = Arc::new(HeapRegion::new(CMB_SIZE as usize));
        let irq = RecordingInterrupts::new();
        let ctrl = NvmeController::with_queues_on_caller(
            test_config(),
            vec![memory_namespace(1, 1 << 20, 512)],
            guest.clone(),
            Some(cmb.clone()),
            irq.clone(),
        )
        .expect("controller");
        ctrl.set_cmb_bar_address(Some(CMB_BAR));
        let mut queues = Vec::new();
        queues.resize_with(usize::from(test_config().max_io_queues) + 1, || None);
        Self {
            ctrl,
            guest,
            cmb,
            irq,
            queues,
            next_cid: 1,
        }
    }

    fn build(
        config: ControllerConfig,
        namespaces: Vec<Arc<Namespace>>,
        pmr: Option<Arc<dyn RegionMemory>>,
        wrap: impl FnOnce(Arc<dyn GuestMemory>) -> Arc<dyn GuestMemory>,
    ) -> Self {
        let guest = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
        let cmb = Arc::new(HeapRegion::new(CMB_SIZE as usize));
        let irq = RecordingInterrupts::new();
        let cmb_dyn: Option<Arc<dyn RegionMemory>> = if config.cmb_size > 0 {
            Some(cmb.clone())
        } else {
            None
        };
        let max = usize::from(config.max_io_queues) + 1;
        let memory = wrap(guest.clone());
        let ctrl = NvmeController::with_pmr(config, namespaces, memory, cmb_dyn, pmr, irq.clone())
            .expect("controller");
        ctrl.set_cmb_bar_address(Some(CMB_BAR));
        let mut queues = Vec::new();
        queues.resize_with(max, || None);
        Self {
            ctrl,
            guest,
            cmb,
            irq,
            queues,
            next_cid: 1,
        }
    }

    pub fn read32(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.ctrl.regs_read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    pub fn read64(&self, offset: u64) -> u64 {
        let mut b = [0u8; 8];
        self.ctrl.regs_read(offset, &mut b);
        u64::from_le_bytes(b)
    }

    pub fn write32(&self, offset: u64, value: u32) {
        self.ctrl.regs_write(offset, &value.to_le_bytes());
    }

    pub fn write64(&self, offset: u64, value: u64) {
        self.ctrl.regs_write(offset, &value.to_le_bytes());
    }

    /// Like Linux's lo_hi_writeq.
    pub fn write64_lo_hi(&self, offset: u64, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }

    pub fn wait_csts(&self, mask: u32, want: u32) {
        let deadline = Instant::now() + TIMEOUT;
        while self.read32(reg::CSTS) & mask != want {
            assert!(
                Instant::now() < deadline,
                "CSTS {:#x} never matched",
                self.read32(reg::CSTS)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Linux's sequence: disable, program the admin queue, CC without EN,
    /// then with EN; wait for RDY.
    pub fn enable_at(&mut self, asq: u64, acq: u64, entries: u32) {
        self.write32(reg::CC, 0);
        self.wait_csts(1, 0);
        // Like a driver allocating fresh queue memory: no stale entries.
        self.write_mem(acq, &vec![0; entries as usize * 16]);
        self.write32(reg::AQA, ((entries - 1) << 16) | (entries - 1));
        self.write64_lo_hi(reg::ASQ, asq);
        self.write64_lo_hi(reg::ACQ, acq);
        let cc = (6 << 16) | (4 << 20);
        self.write32(reg::CC, cc);
        self.write32(reg::CC, cc | 1);
        self.wait_csts(1, 1);
        self.queues[0] = Some(QueuePair {
            qid: 0,
            sq_base: asq,
            cq_base: acq,
            entries,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
        });
    }

    pub fn enable(&mut self) {
        self.enable_at(RAM, RAM + 0x1000, 32);
    }

    fn cid(&mut self) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        cid
    }

    /// Writes a command into the memory a queue lives in (RAM or CMB).
    pub fn write_mem(&self, addr: u64, data: &[u8]) {
        if (CMB_BAR..CMB_BAR + CMB_SIZE).contains(&addr) {
            self.cmb.write(addr - CMB_BAR, data).unwrap();
        } else {
            self.guest.write(addr, data).unwrap();
        }
    }

    pub fn read_mem(&self, addr: u64, buf: &mut [u8]) {
        if (CMB_BAR..CMB_BAR + CMB_SIZE).contains(&addr) {
            self.cmb.read(addr - CMB_BAR, buf).unwrap();
        } else {
            self.guest.read(addr, buf).unwrap();
        }
    }

    /// Places a command on queue `qid` without ringing the doorbell.
    pub fn place(&mut self, qid: u16, cmd: Command) -> u16 {
        let cid = self.cid();
        let mut raw = *cmd.as_bytes();
        raw[2..4].copy_from_slice(&cid.to_le_bytes());
        let q = self.queues[usize::from(qid)]
            .as_mut()
            .expect("queue exists");
        let addr = q.sq_base + u64::from(q.sq_tail) * 64;
        q.sq_tail = (q.sq_tail + 1) % q.entries;
        self.write_mem(addr, &raw);
        cid
    }

    pub fn ring_sq(&self, qid: u16) {
        let q = self.queues[usize::from(qid)]
            .as_ref()
            .expect("queue exists");
        self.write32(0x1000 + 8 * u64::from(qid), q.sq_tail);
    }

    pub fn submit(&mut self, qid: u16, cmd: Command) -> u16 {
        let cid = self.place(qid, cmd);
        self.ring_sq(qid);
        cid
    }

    /// The next completion on `qid`'s CQ, or None after `timeout`.
    pub fn try_reap(&mut self, qid: u16, timeout: Duration) -> Option<CompletionEntry> {
        let deadline = Instant::now() + timeout;
        let (addr, phase) = {
            let q = self.queues[usize::from(qid)]
                .as_ref()
                .expect("queue exists");
            (q.cq_base + u64::from(q.cq_head) * 16, q.phase)
        };
        loop {
            // Does nothing unless the queues run on this thread.
            self.ctrl.run_queues();
            let mut e = [0u8; 16];
            self.read_mem(addr, &mut e);
            let entry = CompletionEntry::decode(&e);
            if entry.phase == phase {
                let q = self.queues[usize::from(qid)].as_mut().unwrap();
                q.cq_head = (q.cq_head + 1) % q.entries;
                if q.cq_head == 0 {
                    q.phase = !q.phase;
                }
                let head = q.cq_head;
                self.write32(0x1000 + 8 * u64::from(qid) + 4, head);
                return Some(entry);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn reap(&mut self, qid: u16) -> CompletionEntry {
        self.try_reap(qid, TIMEOUT)
            .unwrap_or_else(|| panic!("no completion on queue {qid}"))
    }

    pub fn admin(&mut self, cmd: Command) -> CompletionEntry {
        let cid = self.submit(0, cmd);
        let c = self.reap(0);
        assert_eq!(c.cid, cid, "completion for another command: {c:?}");
        c
    }

    pub fn io(&mut self, qid: u16, cmd: Command) -> CompletionEntry {
        let cid = self.submit(qid, cmd);
        let c = self.reap(qid);
        assert_eq!(c.cid, cid, "completion for another command: {c:?}");
        assert_eq!(c.sqid, qid);
        c
    }

    pub fn admin_status(&mut self, cmd: Command) -> Status {
        self.admin(cmd).status
    }

    pub fn create_cq(&mut self, qid: u16, base: u64, entries: u32, vector: u16) -> Status {
        let cmd = CommandBuilder::new(admin::CREATE_CQ, 0)
            .prp1(base)
            .cdw(10, ((entries - 1) << 16) | u32::from(qid))
            .cdw(11, (u32::from(vector) << 16) | 0x3)
            .build();
        self.admin_status(cmd)
    }

    pub fn create_sq(&mut self, qid: u16, base: u64, entries: u32, cqid: u16) -> Status {
        let cmd = CommandBuilder::new(admin::CREATE_SQ, 0)
            .prp1(base)
            .cdw(10, ((entries - 1) << 16) | u32::from(qid))
            .cdw(11, (u32::from(cqid) << 16) | 0x1)
            .build();
        self.admin_status(cmd)
    }

    /// I/O queue pair `qid` with both queues at the given addresses.
    pub fn create_pair_at(&mut self, qid: u16, sq_base: u64, cq_base: u64, entries: u32) {
        self.write_mem(cq_base, &vec![0; entries as usize * 16]);
        assert_eq!(self.create_cq(qid, cq_base, entries, qid), Status::SUCCESS);
        assert_eq!(self.create_sq(qid, sq_base, entries, qid), Status::SUCCESS);
        self.queues[usize::from(qid)] = Some(QueuePair {
            qid,
            sq_base,
            cq_base,
            entries,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
        });
    }

    pub fn create_pair(&mut self, qid: u16) {
        let base = RAM + 0x10_0000 + u64::from(qid) * 0x2_0000;
        self.create_pair_at(qid, base, base + 0x1_0000, 64);
    }

    /// Reads guest memory.
    pub fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.read_mem(addr, &mut b);
        b
    }

    pub fn poke(&self, addr: u64, data: &[u8]) {
        self.write_mem(addr, data);
    }

    /// Turns on the CMB the way Linux does and returns (CMBLOC, CMBSZ).
    pub fn map_cmb(&self) -> (u32, u32) {
        self.write32(reg::CMBMSC, 1);
        let sz = self.read32(reg::CMBSZ);
        let loc = self.read32(reg::CMBLOC);
        // hi_lo_writeq(CRE | CMSE | base)
        let value = CMB_BAR | 0x3;
        self.write32(reg::CMBMSC + 4, (value >> 32) as u32);
        self.write32(reg::CMBMSC, value as u32);
        (loc, sz)
    }
}
