//! A driver and a user space for the EFA model, written from the upstream
//! driver's and rdma-core's behaviour (readless reads, the reset
//! handshake, admin queues with phases, LLQ WQEs, receive descriptors,
//! CQ polling), over p2plab-dma's fake guest memory. No QEMU, no socket.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_efa::attrs::DeviceAttrs;
use p2plab_efa::bytes::{u16_at, u32_at, u64_at};
use p2plab_efa::link::Link;
use p2plab_efa::regs::reg;
use p2plab_efa::{Efa, EfaControl, EfaOptions, StatsSnapshot};
use p2plab_kit::testing::RecordingInterrupts;

/// Guest RAM base and size.
pub const RAM: u64 = 0x1000_0000;
pub const RAM_SIZE: usize = 96 << 20;
pub const WAIT: Duration = Duration::from_secs(10);

/// Guest RAM shared by every device of a test, with a bump allocator.
pub struct Guest {
    pub memory: Arc<FakeGuestMemory>,
    next: Mutex<u64>,
}

impl Guest {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            memory: Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE)),
            next: Mutex::new(RAM),
        })
    }

    /// `size` zeroed bytes aligned to `align`.
    pub fn alloc(&self, size: u64, align: u64) -> u64 {
        let mut next = self.next.lock().unwrap();
        let at = next.next_multiple_of(align);
        *next = at + size.max(1);
        assert!(*next <= RAM + RAM_SIZE as u64, "test guest RAM exhausted");
        at
    }

    pub fn write(&self, addr: u64, data: &[u8]) {
        self.memory.write(addr, data).unwrap();
    }

    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.memory.read(addr, &mut buf).unwrap();
        buf
    }
}

/// Waits until `f` gives `Some`, or panics after [`WAIT`] naming `what`.
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A ring the driver consumes: base, depth, entry size, its count.
#[derive(Debug, Clone, Copy)]
pub struct Consumer {
    pub base: u64,
    pub depth: u32,
    pub entry: u64,
    pub count: u32,
    /// Where the phase bit is (byte offset).
    pub phase_at: u64,
}

impl Consumer {
    /// The next entry if its phase says it is new (as the driver checks).
    pub fn next(&mut self, guest: &Guest) -> Option<Vec<u8>> {
        let slot = self.count % self.depth;
        let addr = self.base + u64::from(slot) * self.entry;
        let expected = (self.count / self.depth).is_multiple_of(2);
        let flags = guest.read(addr + self.phase_at, 1)[0];
        if (flags & 1 == 1) != expected {
            return None;
        }
        self.count += 1;
        Some(guest.read(addr, self.entry as usize))
    }
}

/// An admin completion.
#[derive(Debug, Clone)]
pub struct Completion {
    pub command_id: u16,
    pub status: u8,
    pub entry: Vec<u8>,
}

/// The driver's side of one EFA.
pub struct Driver {
    pub guest: Arc<Guest>,
    pub efa: Efa,
    pub irq: Arc<RecordingInterrupts>,
    pub llq: Arc<HeapRegion>,
    resp: u64,
    seq: u16,
    sq: u64,
    sq_pc: u16,
    pub acq: Consumer,
    pub aenq: Consumer,
    aenq_cc: u32,
}

pub const AQ_DEPTH: u32 = 32;
pub const AENQ_DEPTH: u32 = 16;

impl Driver {
    /// A device with `attrs` on `link`, bus mastering on, registers not
    /// yet touched.
    pub fn new(
        guest: &Arc<Guest>,
        attrs: DeviceAttrs,
        link: Arc<dyn Link>,
        options: EfaOptions,
    ) -> Self {
        Self::build(guest, attrs, link, options, false)
    }

    /// As [`Driver::new`], with the device's engines on the test's thread
    /// (`Efa::with_engines_on_caller`): the driver's waits run them.
    pub fn on_caller(
        guest: &Arc<Guest>,
        attrs: DeviceAttrs,
        link: Arc<dyn Link>,
        options: EfaOptions,
    ) -> Self {
        Self::build(guest, attrs, link, options, true)
    }

    fn build(
        guest: &Arc<Guest>,
        attrs: DeviceAttrs,
        link: Arc<dyn Link>,
        options: EfaOptions,
        on_caller: bool,
    ) -> Self {
        let irq = RecordingInterrupts::new();
        let llq = Arc::new(HeapRegion::new(attrs.llq_bar_size() as usize));
        let region: Arc<dyn RegionMemory> = llq.clone();
        let memory = guest.memory.clone();
        let efa = if on_caller {
            Efa::with_engines_on_caller(attrs, options, memory, region, link, irq.clone())
        } else {
            Efa::new(attrs, options, memory, region, link, irq.clone())
        }
        .unwrap();
        efa.set_bus_master(true);
        Self {
            guest: Arc::clone(guest),
            efa,
            irq,
            llq,
            resp: 0,
            seq: 0,
            sq: 0,
            sq_pc: 0,
            acq: Consumer {
                base: 0,
                depth: AQ_DEPTH,
                entry: 64,
                count: 0,
                phase_at: 3,
            },
            aenq: Consumer {
                base: 0,
                depth: AENQ_DEPTH,
                entry: 64,
                count: 0,
                phase_at: 4,
            },
            aenq_cc: 0,
        }
    }

    pub fn control(&self) -> EfaControl {
        self.efa.control()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.efa.control().stats()
    }

    pub fn write_reg(&self, offset: u64, value: u32) {
        self.efa.regs_write(offset, &value.to_le_bytes());
    }

    /// `efa_com_mmio_reg_read_init`: the response buffer, HI then LO.
    pub fn init_readless(&mut self) {
        self.resp = self.guest.alloc(8, 8);
        self.write_reg(reg::MMIO_RESP_HI, (self.resp >> 32) as u32);
        self.write_reg(reg::MMIO_RESP_LO, self.resp as u32);
    }

    /// `efa_com_reg_read32`: the answer must be there when the register
    /// write returns (the driver polls at most 50 ms; here not at all).
    pub fn read_reg(&mut self, offset: u16) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.guest
            .write(self.resp, &self.seq.wrapping_add(0x9a).to_le_bytes());
        self.write_reg(
            reg::MMIO_REG_READ,
            u32::from(offset) << 16 | u32::from(self.seq),
        );
        let resp = self.guest.read(self.resp, 8);
        assert_eq!(
            u16_at(&resp, 0),
            self.seq,
            "readless answer not there when the write returned"
        );
        assert_eq!(
            u16_at(&resp, 2),
            offset,
            "readless answer for another register"
        );
        u32_at(&resp, 4)
    }

    /// `efa_com_dev_reset`, with the 100 ms polls shortened.
    pub fn reset(&mut self) {
        let sts = self.read_reg(reg::DEV_STS as u16);
        assert_eq!(sts & 1, 1, "READY");
        let caps = self.read_reg(reg::CAPS as u16);
        let polls = (caps >> 1) & 0x1f;
        assert!(polls > 0);
        self.write_reg(reg::DEV_CTL, 1 | 5 << 28);
        self.write_reg(reg::MMIO_RESP_HI, (self.resp >> 32) as u32);
        self.write_reg(reg::MMIO_RESP_LO, self.resp as u32);
        assert_eq!(
            self.read_reg(reg::DEV_STS as u16) & 8,
            8,
            "RESET_IN_PROGRESS on"
        );
        self.write_reg(reg::DEV_CTL, 0);
        wait_for("RESET_IN_PROGRESS off", || {
            // Engines on the test's thread run here (a no-op with threads).
            self.efa.run_engines();
            (self.read_reg(reg::DEV_STS as u16) & 8 == 0).then_some(())
        });
        self.sq_pc = 0;
        self.acq.count = 0;
        self.aenq.count = 0;
        self.aenq_cc = 0;
    }

    /// `efa_com_admin_init` and the probe's first commands, as the 7.3
    /// driver issues them. Returns the DEVICE_ATTR feature data.
    pub fn probe(&mut self) -> Vec<u8> {
        self.init_readless();
        self.reset();
        assert!(self.read_reg(reg::VERSION as u16) >= 1);
        assert!(self.read_reg(reg::CONTROLLER_VERSION as u16) & 0xff_ffff >= 1);
        let width = (self.read_reg(reg::CAPS as u16) >> 8) & 0xff;
        assert!((32..=64).contains(&width));
        self.write_reg(reg::INTR_MASK, 1);
        self.sq = self.guest.alloc(u64::from(AQ_DEPTH) * 64, 4096);
        self.acq.base = self.guest.alloc(u64::from(AQ_DEPTH) * 64, 4096);
        self.aenq.base = self.guest.alloc(u64::from(AENQ_DEPTH) * 64, 4096);
        self.write_reg(reg::AQ_BASE_LO, self.sq as u32);
        self.write_reg(reg::AQ_BASE_HI, (self.sq >> 32) as u32);
        self.write_reg(reg::AQ_CAPS, AQ_DEPTH | 64 << 16);
        self.write_reg(reg::ACQ_BASE_LO, self.acq.base as u32);
        self.write_reg(reg::ACQ_BASE_HI, (self.acq.base >> 32) as u32);
        self.write_reg(reg::ACQ_CAPS, AQ_DEPTH | 64 << 16);
        self.write_reg(reg::AENQ_BASE_LO, self.aenq.base as u32);
        self.write_reg(reg::AENQ_BASE_HI, (self.aenq.base >> 32) as u32);
        self.write_reg(reg::AENQ_CAPS, AENQ_DEPTH | 64 << 16);
        self.write_reg(reg::AENQ_CONS_DB, 0);
        self.write_reg(reg::INTR_MASK, 0);
        let dev = self.get_feature(1);
        let supported = u64_at(&dev, 8);
        for feature in [4u8, 9, 3, 7, 5] {
            if supported & 1 << feature != 0 {
                self.get_feature(feature);
            }
        }
        let aenq = self.get_feature(2);
        assert_eq!(u32_at(&aenq, 8) & 0x1e, 0x1e);
        let mut set = [0u8; 60];
        set[13] = 2;
        set[20..24].copy_from_slice(&0x1eu32.to_le_bytes());
        let c = self.admin(12, 0, &set);
        assert_eq!(c.status, 0);
        dev
    }

    /// Submits one admin command and waits for its completion (polling
    /// the ACQ by phase, as the driver does).
    pub fn admin(&mut self, opcode: u8, flags: u8, payload: &[u8]) -> Completion {
        let slot = u32::from(self.sq_pc) % AQ_DEPTH;
        let phase = (u32::from(self.sq_pc) / AQ_DEPTH).is_multiple_of(2);
        let command_id = (slot as u16 | self.sq_pc << 5) & 0xfff;
        let mut entry = [0u8; 64];
        entry[0..2].copy_from_slice(&command_id.to_le_bytes());
        entry[2] = opcode;
        entry[3] = flags | u8::from(phase);
        entry[4..4 + payload.len()].copy_from_slice(payload);
        self.guest.write(self.sq + u64::from(slot) * 64, &entry);
        self.sq_pc = self.sq_pc.wrapping_add(1);
        self.write_reg(reg::AQ_PROD_DB, u32::from(self.sq_pc));
        let entry = wait_for("an admin completion", || {
            self.efa.run_engines();
            self.acq.next(&self.guest)
        });
        let c = Completion {
            command_id: u16_at(&entry, 0) & 0xfff,
            status: entry[2],
            entry,
        };
        assert_eq!(c.command_id, command_id, "completion for another command");
        c
    }

    /// GET_FEATURE `feature`, asserting success; the completion entry.
    pub fn get_feature(&mut self, feature: u8) -> Vec<u8> {
        let mut p = [0u8; 60];
        p[13] = feature;
        let c = self.admin(11, 0, &p);
        assert_eq!(c.status, 0, "GET_FEATURE {feature}");
        c.entry
    }

    /// Takes the AENQ entries that arrived, as the driver's handler does,
    /// and writes AENQ_CONS_DB.
    pub fn drain_aenq(&mut self) -> Vec<(u16, u16)> {
        let mut events = Vec::new();
        while let Some(e) = self.aenq.next(&self.guest) {
            events.push((u16_at(&e, 0), u16_at(&e, 2)));
        }
        if !events.is_empty() {
            self.aenq_cc += events.len() as u32;
            self.write_reg(reg::AENQ_CONS_DB, self.aenq_cc);
        }
        events
    }

    fn ok_u16(&mut self, opcode: u8, payload: &[u8], at: usize) -> u16 {
        let c = self.admin(opcode, 0, payload);
        assert_eq!(c.status, 0, "opcode {opcode}");
        u16_at(&c.entry, at)
    }

    pub fn alloc_uar(&mut self) -> u16 {
        self.ok_u16(16, &[], 8)
    }

    pub fn alloc_pd(&mut self) -> u16 {
        self.ok_u16(14, &[], 8)
    }

    pub fn create_ah(&mut self, pd: u16, gid: [u8; 16]) -> u16 {
        let mut p = [0u8; 20];
        p[..16].copy_from_slice(&gid);
        p[16..18].copy_from_slice(&pd.to_le_bytes());
        self.ok_u16(5, &p, 8)
    }

    /// REG_MR of `[addr, addr+len)` of guest RAM (identity IOVA), with
    /// 4 KiB pages; the list inline, direct or chained as the driver
    /// picks. Returns the key.
    pub fn reg_mr(&mut self, pd: u16, addr: u64, len: u64, access: u8) -> u32 {
        self.reg_mr_as(pd, addr, len, access, None).expect("REG_MR")
    }

    /// REG_MR with the list form forced (`Some(true)`: chained,
    /// `Some(false)`: direct); the status on failure.
    pub fn reg_mr_as(
        &mut self,
        pd: u16,
        iova: u64,
        len: u64,
        access: u8,
        chained: Option<bool>,
    ) -> Result<u32, u8> {
        let first = iova & !0xfff;
        let pages = ((iova + len + 0xfff) & !0xfff) - first;
        let page_num = (pages / 4096) as u32;
        let entries: Vec<u64> = (0..u64::from(page_num)).map(|i| first + i * 4096).collect();
        let mut p = [0u8; 60];
        p[0..2].copy_from_slice(&pd.to_le_bytes());
        p[36..44].copy_from_slice(&len.to_le_bytes());
        p[44] = 12;
        p[45] = access;
        // page_num (payload 48..52) stays 0: the 7.3 driver never sets
        // it ("redundant, could be calculated"), the device counts.
        p[52..60].copy_from_slice(&iova.to_le_bytes());
        let mut flags = 0u8;
        if page_num <= 4 && chained.is_none() {
            for (i, e) in entries.iter().enumerate() {
                p[4 + i * 8..12 + i * 8].copy_from_slice(&e.to_le_bytes());
            }
        } else if chained == Some(true) {
            let (length, addr) = self.chain(&entries);
            p[4..8].copy_from_slice(&length.to_le_bytes());
            p[8..12].copy_from_slice(&(addr as u32).to_le_bytes());
            p[12..16].copy_from_slice(&((addr >> 32) as u32).to_le_bytes());
            flags = 2 | 4;
        } else {
            let list = self.guest.alloc(entries.len() as u64 * 8, 8);
            let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
            self.guest.write(list, &bytes);
            p[4..8].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
            p[8..12].copy_from_slice(&(list as u32).to_le_bytes());
            p[12..16].copy_from_slice(&((list >> 32) as u32).to_le_bytes());
            flags = 2;
        }
        let c = self.admin(7, flags, &p);
        if c.status != 0 {
            return Err(c.status);
        }
        let (lkey, rkey) = (u32_at(&c.entry, 8), u32_at(&c.entry, 12));
        assert_eq!(lkey, rkey);
        assert_eq!(lkey & !0xff_ffff, 0, "keys are 24 bits");
        Ok(lkey)
    }

    /// A chained page list as `pbl_chunk_list_create` builds it.
    fn chain(&self, entries: &[u64]) -> (u32, u64) {
        let list_pages = entries.len().div_ceil(512);
        let list = self.guest.alloc(list_pages as u64 * 4096, 4096);
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        self.guest.write(list, &bytes);
        let chunks = list_pages.div_ceil(510);
        let base = self.guest.alloc(chunks as u64 * 4096, 4096);
        let mut lengths = vec![4092u32; chunks];
        if !list_pages.is_multiple_of(510) {
            lengths[chunks - 1] = ((list_pages % 510) * 8 + 12) as u32;
        }
        for p in 0..list_pages {
            let at = base + (p / 510) as u64 * 4096 + (p % 510) as u64 * 8;
            self.guest
                .write(at, &(list + p as u64 * 4096).to_le_bytes());
        }
        for (c, length) in lengths.iter().enumerate().skip(1) {
            let at = base + (c as u64 - 1) * 4096 + 4080;
            let next = base + c as u64 * 4096;
            let mut info = length.to_le_bytes().to_vec();
            info.extend((next as u32).to_le_bytes());
            info.extend(((next >> 32) as u32).to_le_bytes());
            self.guest.write(at, &info);
        }
        (lengths[0], base)
    }

    pub fn create_eq(&mut self, depth: u16, vector: u8) -> (u16, Consumer) {
        let ba = self.guest.alloc(u64::from(depth) * 16, 4096);
        let mut p = [0u8; 20];
        p[0..2].copy_from_slice(&depth.to_le_bytes());
        p[2] = vector;
        p[3] = 4;
        p[4..12].copy_from_slice(&ba.to_le_bytes());
        p[12..16].copy_from_slice(&1u32.to_le_bytes());
        let eqn = self.ok_u16(18, &p, 8);
        self.write_reg(reg::EQ_DB, u32::from(eqn) | 1 << 31);
        (
            eqn,
            Consumer {
                base: ba,
                depth: u32::from(depth),
                entry: 16,
                count: 0,
                phase_at: 0,
            },
        )
    }

    /// CREATE_CQ with 32-byte entries; `eqn` for interrupt mode.
    pub fn create_cq(&mut self, uar: u16, depth: u16, eqn: Option<u16>) -> Cq {
        let ring = self.guest.alloc(u64::from(depth) * 32, 4096);
        let mut p = [0u8; 24];
        if eqn.is_some() {
            p[0] = 1 << 5;
        }
        p[1] = 8;
        p[2..4].copy_from_slice(&depth.to_le_bytes());
        p[4..6].copy_from_slice(&eqn.unwrap_or(0).to_le_bytes());
        p[8..16].copy_from_slice(&ring.to_le_bytes());
        p[20..22].copy_from_slice(&1u16.to_le_bytes());
        p[22..24].copy_from_slice(&uar.to_le_bytes());
        let c = self.admin(9, 0, &p);
        assert_eq!(c.status, 0, "CREATE_CQ");
        assert_eq!(u32_at(&c.entry, 16) & 1, 1, "db_valid");
        Cq {
            idx: u16_at(&c.entry, 8),
            db: u64::from(u32_at(&c.entry, 12)),
            consumer: Consumer {
                base: ring,
                depth: u32::from(depth),
                entry: 32,
                count: 0,
                phase_at: 3,
            },
        }
    }

    /// CREATE_QP (SRD or UD) with `sq_wqes` and `rq_descs` ring entries,
    /// then RESET → INIT (qkey) → RTR → RTS as perftest does.
    #[allow(clippy::too_many_arguments)]
    pub fn create_qp(
        &mut self,
        pd: u16,
        uar: u16,
        qp_type: u8,
        send: &Cq,
        recv: &Cq,
        sq_wqes: u32,
        rq_descs: u32,
    ) -> Qp {
        let rq_ring = self.guest.alloc(u64::from(rq_descs) * 16, 4096);
        let mut p = [0u8; 60];
        p[0..2].copy_from_slice(&pd.to_le_bytes());
        p[2] = qp_type;
        p[12..20].copy_from_slice(&rq_ring.to_le_bytes());
        p[20..24].copy_from_slice(&u32::from(send.idx).to_le_bytes());
        p[24..28].copy_from_slice(&u32::from(recv.idx).to_le_bytes());
        p[36..40].copy_from_slice(&(sq_wqes * 64).to_le_bytes());
        p[40..44].copy_from_slice(&sq_wqes.to_le_bytes());
        p[44..48].copy_from_slice(&(rq_descs * 16).to_le_bytes());
        p[48..52].copy_from_slice(&rq_descs.to_le_bytes());
        p[52..54].copy_from_slice(&uar.to_le_bytes());
        let c = self.admin(1, 0, &p);
        assert_eq!(c.status, 0, "CREATE_QP");
        let qp = Qp {
            handle: u32_at(&c.entry, 8),
            num: u16_at(&c.entry, 12),
            sq_db: u64::from(u32_at(&c.entry, 20)),
            rq_db: u64::from(u32_at(&c.entry, 24)),
            llq: u64::from(u32_at(&c.entry, 28)),
            sq_wqes,
            rq_descs,
            rq_ring,
            sq_pc: 0,
            rq_pc: 0,
        };
        for (mask, state) in [(1u32 | 4, 1u32), (1, 2), (1 | 8, 3)] {
            assert_eq!(self.modify_qp(qp.handle, mask, state, QKEY), 0);
        }
        qp
    }

    pub fn modify_qp(&mut self, handle: u32, mask: u32, state: u32, qkey: u32) -> u8 {
        let mut p = [0u8; 28];
        p[0..4].copy_from_slice(&mask.to_le_bytes());
        p[4..8].copy_from_slice(&handle.to_le_bytes());
        p[8..12].copy_from_slice(&state.to_le_bytes());
        p[16..20].copy_from_slice(&qkey.to_le_bytes());
        self.admin(2, 0, &p).status
    }

    /// Copies a WQE into the QP's LLQ slot (as the provider's 64-byte
    /// stores do) and rings the SQ doorbell.
    pub fn post_send(&self, qp: &mut Qp, mut wqe: [u8; 64]) {
        let slot = u32::from(qp.sq_pc) % qp.sq_wqes;
        let phase = (u32::from(qp.sq_pc) / qp.sq_wqes) % 2;
        wqe[3] |= phase as u8;
        self.llq.write(qp.llq + u64::from(slot) * 64, &wqe).unwrap();
        qp.sq_pc = qp.sq_pc.wrapping_add(1);
        self.efa
            .db_write(qp.sq_db, &u32::from(qp.sq_pc).to_le_bytes());
    }

    /// Posts a one-descriptor receive of `len` bytes at `addr`.
    pub fn post_recv(&self, qp: &mut Qp, req_id: u16, addr: u64, len: u16, lkey: u32) {
        let slot = u32::from(qp.rq_pc) % qp.rq_descs;
        let mut desc = [0u8; 16];
        desc[0..8].copy_from_slice(&addr.to_le_bytes());
        desc[8..10].copy_from_slice(&req_id.to_le_bytes());
        desc[10..12].copy_from_slice(&len.to_le_bytes());
        desc[12..16].copy_from_slice(&(lkey | 3 << 30).to_le_bytes());
        self.guest.write(qp.rq_ring + u64::from(slot) * 16, &desc);
        qp.rq_pc = qp.rq_pc.wrapping_add(1);
        self.efa
            .db_write(qp.rq_db, &u32::from(qp.rq_pc).to_le_bytes());
    }

    /// The next completion of `cq`, waiting for it.
    pub fn wait_cqe(&self, cq: &mut Cq) -> Cqe {
        let entry = wait_for("a completion", || {
            self.efa.run_engines();
            cq.consumer.next(&self.guest)
        });
        let cqe = Cqe::parse(&entry);
        self.efa
            .db_write(cq.db, &(cq.consumer.count & 0xffff).to_le_bytes());
        cqe
    }

    /// The next completion of `cq` if one is there.
    pub fn poll_cqe(&self, cq: &mut Cq) -> Option<Cqe> {
        cq.consumer.next(&self.guest).map(|e| Cqe::parse(&e))
    }
}

pub const QKEY: u32 = 0x1111_1111;
pub const SRD: u8 = 2;
pub const UD: u8 = 1;
pub const LOCAL_WRITE: u8 = 1;
pub const REMOTE_WRITE: u8 = 2;
pub const REMOTE_READ: u8 = 4;

#[derive(Debug, Clone)]
pub struct Cq {
    pub idx: u16,
    pub db: u64,
    pub consumer: Consumer,
}

#[derive(Debug, Clone)]
pub struct Qp {
    pub handle: u32,
    pub num: u16,
    pub sq_db: u64,
    pub rq_db: u64,
    pub llq: u64,
    pub sq_wqes: u32,
    pub rq_descs: u32,
    pub rq_ring: u64,
    pub sq_pc: u16,
    pub rq_pc: u16,
}

/// A completion as the provider decodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cqe {
    pub req_id: u16,
    pub status: u8,
    pub q_type: u8,
    pub op_type: u8,
    pub has_imm: bool,
    pub qp_num: u16,
    pub length: u32,
    pub ah: u16,
    pub src_qp: u16,
    pub imm: u32,
    pub ex: [u8; 16],
}

impl Cqe {
    pub fn parse(e: &[u8]) -> Self {
        let flags = e[3];
        let mut ex = [0u8; 16];
        ex.copy_from_slice(&e[16..32]);
        let op_type = (flags >> 4) & 7;
        let mut length = u32::from(u16_at(e, 6));
        if op_type == 2 && (flags >> 1) & 3 == 2 {
            length |= u32::from(u16_at(e, 16)) << 16;
        }
        Self {
            req_id: u16_at(e, 0),
            status: e[2],
            q_type: (flags >> 1) & 3,
            op_type,
            has_imm: flags & 8 != 0,
            qp_num: u16_at(e, 4),
            length,
            ah: u16_at(e, 8),
            src_qp: u16_at(e, 10),
            imm: u32_at(e, 12),
            ex,
        }
    }
}

/// TX WQE builders, as rdma-core's provider fills them.
pub mod wqe {
    pub const META: u8 = 1 << 7;
    pub const INLINE: u8 = 1 << 5;
    pub const HAS_IMM: u8 = 1 << 4;
    pub const GO: u8 = 1 << 2 | 1 << 3 | 1 << 4;

    fn meta(
        req_id: u16,
        ctrl1: u8,
        dest_qp: u16,
        length: u16,
        ah: u16,
        qkey: u32,
        imm: Option<u32>,
    ) -> [u8; 64] {
        let mut w = [0u8; 64];
        w[0..2].copy_from_slice(&req_id.to_le_bytes());
        w[2] = ctrl1 | META | if imm.is_some() { HAS_IMM } else { 0 };
        w[3] = GO;
        w[4..6].copy_from_slice(&dest_qp.to_le_bytes());
        w[6..8].copy_from_slice(&length.to_le_bytes());
        w[8..12].copy_from_slice(&imm.unwrap_or(0).to_le_bytes());
        w[12..14].copy_from_slice(&ah.to_le_bytes());
        w[16..20].copy_from_slice(&qkey.to_le_bytes());
        w
    }

    pub fn send_inline(req_id: u16, dest_qp: u16, ah: u16, qkey: u32, data: &[u8]) -> [u8; 64] {
        let mut w = meta(req_id, INLINE, dest_qp, data.len() as u16, ah, qkey, None);
        w[32..32 + data.len()].copy_from_slice(data);
        w
    }

    /// A SEND from up to two (addr, len, lkey) buffers.
    pub fn send_sgl(
        req_id: u16,
        dest_qp: u16,
        ah: u16,
        qkey: u32,
        imm: Option<u32>,
        bufs: &[(u64, u32, u32)],
    ) -> [u8; 64] {
        let mut w = meta(req_id, 0, dest_qp, bufs.len() as u16, ah, qkey, imm);
        for (i, &(addr, len, lkey)) in bufs.iter().enumerate() {
            let at = 32 + i * 16;
            w[at..at + 4].copy_from_slice(&len.to_le_bytes());
            w[at + 4..at + 8].copy_from_slice(&lkey.to_le_bytes());
            w[at + 8..at + 16].copy_from_slice(&addr.to_le_bytes());
        }
        w
    }

    /// An RDMA read (op 1) or write (op 2) of `len` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn rdma(
        op: u8,
        req_id: u16,
        dest_qp: u16,
        ah: u16,
        imm: Option<u32>,
        remote: (u64, u32),
        local: (u64, u32),
        len: u32,
    ) -> [u8; 64] {
        let mut w = meta(req_id, op, dest_qp, 1, ah, 0, imm);
        w[32..36].copy_from_slice(&len.to_le_bytes());
        w[36..40].copy_from_slice(&remote.1.to_le_bytes());
        w[40..48].copy_from_slice(&remote.0.to_le_bytes());
        w[48..52].copy_from_slice(&len.to_le_bytes());
        w[52..56].copy_from_slice(&local.1.to_le_bytes());
        w[56..64].copy_from_slice(&local.0.to_le_bytes());
        w
    }
}

/// Two EFAs in one guest, on an in-process link, each probed, with a UAR,
/// a PD, CQs, an SRD QP and an AH to the other.
pub struct Pair {
    pub guest: Arc<Guest>,
    pub a: Side,
    pub b: Side,
}

pub struct Side {
    pub driver: Driver,
    pub uar: u16,
    pub pd: u16,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub qp: Qp,
    /// AH to the other side.
    pub ah: u16,
    pub gid: [u8; 16],
}

pub fn gid(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfd;
    g[15] = n;
    g
}

pub fn attrs(n: u8) -> DeviceAttrs {
    DeviceAttrs {
        gid: gid(n),
        guid: 0x1000 + u64::from(n),
        ..DeviceAttrs::default()
    }
}

impl Pair {
    pub fn new(qp_type: u8) -> Self {
        let guest = Guest::new();
        let (la, lb) = p2plab_efa::ChannelLink::pair();
        let options = EfaOptions { keep_alive: None };
        let a = Driver::new(&guest, attrs(1), Arc::new(la), options);
        let b = Driver::new(&guest, attrs(2), Arc::new(lb), options);
        Self {
            a: Side::new(a, qp_type, gid(2)),
            b: Side::new(b, qp_type, gid(1)),
            guest,
        }
    }
}

impl Side {
    pub fn new(mut driver: Driver, qp_type: u8, peer: [u8; 16]) -> Self {
        driver.probe();
        let uar = driver.alloc_uar();
        let pd = driver.alloc_pd();
        let send_cq = driver.create_cq(uar, 256, None);
        let recv_cq = driver.create_cq(uar, 512, None);
        let qp = driver.create_qp(pd, uar, qp_type, &send_cq, &recv_cq, 128, 512);
        let ah = driver.create_ah(pd, peer);
        let gid = driver.efa.attrs().gid;
        Self {
            driver,
            uar,
            pd,
            send_cq,
            recv_cq,
            qp,
            ah,
            gid,
        }
    }

    /// A buffer of `len` bytes registered with `access`.
    pub fn buffer(&mut self, len: u64, access: u8) -> (u64, u32) {
        let addr = self.driver.guest.alloc(len, 4096);
        let key = self.driver.reg_mr(self.pd, addr, len, access);
        (addr, key)
    }
}

/// `len` bytes of a pattern seeded by `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
