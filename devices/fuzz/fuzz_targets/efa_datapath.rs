//! The EFA's data path as hostile user space and a hostile fabric peer
//! drive it: two devices set up as the driver does (UAR, PD, CQs, an MR,
//! an SRD QP each, an AH to the other) on an in-process link; then TX WQEs
//! of any bytes written into the LLQ, receive descriptors of any bytes,
//! doorbells of any value, packets of any bytes injected into a device's
//! port, wire faults armed, resets, in any order. Both devices' engines
//! run on the target's thread (`Efa::with_engines_on_caller`): after each
//! step `Efa::run_engines` runs the management, send and receive engines,
//! the pump and the link reader of one device, then the other's, until
//! neither has work, instead of ten threads per input and a sleep per
//! step (about 10-27 inputs/s). On the caller's thread a send into a
//! full outgoing queue drops the packet instead of waiting, a reordered
//! packet goes out once the queue is empty, and retransmit timers fire
//! only when a step comes after they are due; what only threads show (a
//! reset racing a send mid-message) is left to the EFA's unit tests and
//! the efa e2e suite.
//!
//! Catches a panic or overflow in the WQE, receive-descriptor and packet
//! parsers, the MR translation, the reliability table or the completion
//! writer (overflow checks are on), engines that never go idle
//! (`run_engines` not returning: libFuzzer's -timeout), and a receiver
//! that counts more receives than the sender sent messages plus the
//! packets injected.
#![no_main]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_efa::regs::reg;
use p2plab_efa::{ChannelLink, DeviceAttrs, Efa, EfaOptions, Link, LinkError};
use p2plab_kit::{DeviceControl, Interrupts};

const RAM: u64 = 0x1_0000_0000;
const RAM_SIZE: u64 = 512 << 10;
/// Per device: admin queues, CQ rings, the RQ ring, buffers.
const SPAN: u64 = 256 << 10;
const BUF: u64 = 0x8000;
const BUF_SIZE: u64 = 64 << 10;

struct NoIrq;

impl Interrupts for NoIrq {
    fn notify(&self, _vector: u16) {}
}

/// A port whose incoming packets the fuzzer can add to.
struct TapLink {
    inner: ChannelLink,
    injected: Mutex<VecDeque<Vec<u8>>>,
}

impl Link for TapLink {
    fn send(&self, packet: Vec<u8>) -> Result<(), LinkError> {
        self.inner.send(packet)
    }

    fn recv(&self, timeout: Duration) -> Option<Vec<u8>> {
        if let Some(p) = self.injected.lock().ok()?.pop_front() {
            return Some(p);
        }
        self.inner.recv(timeout)
    }

    fn is_up(&self) -> bool {
        self.inner.is_up()
    }

    fn shutdown(&self) {
        self.inner.shutdown();
    }
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn u32(&mut self) -> Option<u32> {
        let mut v = [0u8; 4];
        for b in &mut v {
            *b = self.u8()?;
        }
        Some(u32::from_le_bytes(v))
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

/// One device set up as the driver does, with what user space needs.
struct Dev {
    efa: Efa,
    llq: Arc<HeapRegion>,
    tap: Arc<TapLink>,
    base: u64,
    pc: u32,
    qp_num: u16,
    sq_db: u64,
    rq_db: u64,
    llq_offset: u64,
    rq_ring: u64,
    key: u32,
    ah: u16,
    sq_pc: u16,
    rq_pc: u16,
}

impl Dev {
    fn admin(
        &mut self,
        ram: &FakeGuestMemory,
        opcode: u8,
        flags: u8,
        payload: &[u8],
    ) -> Option<[u8; 64]> {
        let slot = self.pc % 32;
        let phase = (self.pc / 32).is_multiple_of(2);
        let mut entry = [0u8; 64];
        entry[2] = opcode;
        entry[3] = flags | u8::from(phase);
        entry[4..4 + payload.len()].copy_from_slice(payload);
        ram.write(self.base + u64::from(slot) * 64, &entry).ok()?;
        self.pc += 1;
        self.efa.regs_write(reg::AQ_PROD_DB, &self.pc.to_le_bytes());
        self.efa.run_engines();
        let at = self.base + 0x800 + u64::from(slot) * 64;
        let mut done = [0u8; 64];
        ram.read(at, &mut done).ok()?;
        ((done[3] & 1 == 1) == phase && done[2] == 0).then_some(done)
    }

    fn new(
        ram: &Arc<FakeGuestMemory>,
        base: u64,
        gid: u8,
        link: ChannelLink,
        peer_gid: u8,
    ) -> Option<Self> {
        let mut g = [0u8; 16];
        g[0] = 0xfd;
        g[15] = gid;
        let attrs = DeviceAttrs {
            gid: g,
            max_qp: 2,
            max_mr: 4,
            max_cq: 4,
            max_mr_pages: 64,
            ..DeviceAttrs::default()
        };
        let llq = Arc::new(HeapRegion::new(attrs.llq_bar_size() as usize));
        let region: Arc<dyn RegionMemory> = llq.clone();
        let tap = Arc::new(TapLink {
            inner: link,
            injected: Mutex::new(VecDeque::new()),
        });
        let options = EfaOptions { keep_alive: None };
        let efa = Efa::with_engines_on_caller(
            attrs,
            options,
            ram.clone(),
            region,
            tap.clone(),
            Arc::new(NoIrq),
        )
        .ok()?;
        efa.set_bus_master(true);
        let w = |off: u64, v: u64| efa.regs_write(off, &(v as u32).to_le_bytes());
        w(reg::AQ_BASE_LO, base);
        w(reg::AQ_BASE_HI, base >> 32);
        w(reg::AQ_CAPS, 32 | 64 << 16);
        w(reg::ACQ_BASE_LO, base + 0x800);
        w(reg::ACQ_BASE_HI, base >> 32);
        w(reg::ACQ_CAPS, 32 | 64 << 16);
        let mut d = Dev {
            efa,
            llq,
            tap,
            base,
            pc: 0,
            qp_num: 0,
            sq_db: 0,
            rq_db: 0,
            llq_offset: 0,
            rq_ring: base + 0x4000,
            key: 0,
            ah: 0,
            sq_pc: 0,
            rq_pc: 0,
        };
        let uar = u16::from_le_bytes(d.admin(ram, 16, 0, &[])?[8..10].try_into().ok()?);
        let pd = u16::from_le_bytes(d.admin(ram, 14, 0, &[])?[8..10].try_into().ok()?);
        let mut cq = [0u8; 24];
        cq[1] = 8;
        cq[2..4].copy_from_slice(&64u16.to_le_bytes());
        cq[8..16].copy_from_slice(&(base + 0x2000).to_le_bytes());
        cq[20..22].copy_from_slice(&1u16.to_le_bytes());
        cq[22..24].copy_from_slice(&uar.to_le_bytes());
        d.admin(ram, 9, 0, &cq)?;
        let mut mr = [0u8; 60];
        mr[0..2].copy_from_slice(&pd.to_le_bytes());
        let buf = base + BUF;
        let pages = (BUF_SIZE / 4096) as u32;
        let list = base + 0x6000;
        for i in 0..u64::from(pages) {
            ram.write(list + i * 8, &(buf + i * 4096).to_le_bytes())
                .ok()?;
        }
        mr[4..8].copy_from_slice(&(pages * 8).to_le_bytes());
        mr[8..12].copy_from_slice(&(list as u32).to_le_bytes());
        mr[12..16].copy_from_slice(&((list >> 32) as u32).to_le_bytes());
        mr[36..44].copy_from_slice(&BUF_SIZE.to_le_bytes());
        mr[44] = 12;
        mr[45] = 7;
        mr[48..52].copy_from_slice(&pages.to_le_bytes());
        mr[52..60].copy_from_slice(&buf.to_le_bytes());
        d.key = u32::from_le_bytes(d.admin(ram, 7, 2, &mr)?[8..12].try_into().ok()?);
        let mut qp = [0u8; 60];
        qp[0..2].copy_from_slice(&pd.to_le_bytes());
        qp[2] = 2;
        qp[12..20].copy_from_slice(&d.rq_ring.to_le_bytes());
        qp[36..40].copy_from_slice(&(16u32 * 64).to_le_bytes());
        qp[40..44].copy_from_slice(&16u32.to_le_bytes());
        qp[44..48].copy_from_slice(&(16u32 * 16).to_le_bytes());
        qp[48..52].copy_from_slice(&16u32.to_le_bytes());
        qp[52..54].copy_from_slice(&uar.to_le_bytes());
        let resp = d.admin(ram, 1, 0, &qp)?;
        let handle = u32::from_le_bytes(resp[8..12].try_into().ok()?);
        d.qp_num = u16::from_le_bytes(resp[12..14].try_into().ok()?);
        d.sq_db = u64::from(u32::from_le_bytes(resp[20..24].try_into().ok()?));
        d.rq_db = u64::from(u32::from_le_bytes(resp[24..28].try_into().ok()?));
        d.llq_offset = u64::from(u32::from_le_bytes(resp[28..32].try_into().ok()?));
        for (mask, state) in [(5u32, 1u32), (1, 2), (1, 3)] {
            let mut m = [0u8; 28];
            m[0..4].copy_from_slice(&mask.to_le_bytes());
            m[4..8].copy_from_slice(&handle.to_le_bytes());
            m[8..12].copy_from_slice(&state.to_le_bytes());
            m[16..20].copy_from_slice(&0x1111_1111u32.to_le_bytes());
            d.admin(ram, 2, 0, &m)?;
        }
        let mut ah = [0u8; 20];
        ah[0] = 0xfd;
        ah[15] = peer_gid;
        ah[16..18].copy_from_slice(&pd.to_le_bytes());
        d.ah = u16::from_le_bytes(d.admin(ram, 5, 0, &ah)?[8..10].try_into().ok()?);
        Some(d)
    }
}

fuzz_target!(|data: &[u8]| {
    let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE as usize));
    let (la, lb) = ChannelLink::pair();
    let Some(mut a) = Dev::new(&ram, RAM, 1, la, 2) else {
        return;
    };
    let Some(mut b) = Dev::new(&ram, RAM + SPAN, 2, lb, 1) else {
        return;
    };
    let mut input = Bytes(data);
    let mut injected = 0u64;
    let mut steps = 0;
    while let Some(op) = input.u8() {
        steps += 1;
        if steps > 48 {
            break;
        }
        let (dev, peer_qp) = if op & 0x80 == 0 {
            (&mut a, b.qp_num)
        } else {
            (&mut b, a.qp_num)
        };
        match op % 8 {
            // A WQE of any bytes, or one made sane (meta bits, phase, the
            // AH and QP of the peer, buffers in the MR).
            0 | 1 => {
                let mut wqe = [0u8; 64];
                let bytes = input.take(64);
                wqe[..bytes.len()].copy_from_slice(bytes);
                let slot = u32::from(dev.sq_pc) % 16;
                if op % 8 == 1 {
                    wqe[2] = (wqe[2] & 0x3f) | 0x80;
                    wqe[3] = 0x1c | ((u32::from(dev.sq_pc) / 16) % 2) as u8;
                    wqe[4..6].copy_from_slice(&peer_qp.to_le_bytes());
                    wqe[12..14].copy_from_slice(&dev.ah.to_le_bytes());
                    wqe[16..20].copy_from_slice(&0x1111_1111u32.to_le_bytes());
                    for sge in [32usize, 48] {
                        let len =
                            u32::from_le_bytes(wqe[sge..sge + 4].try_into().unwrap_or_default())
                                % 9000;
                        let off = u64::from(wqe[sge + 8]) * 64;
                        wqe[sge..sge + 4].copy_from_slice(&len.to_le_bytes());
                        wqe[sge + 4..sge + 8].copy_from_slice(&dev.key.to_le_bytes());
                        wqe[sge + 8..sge + 16]
                            .copy_from_slice(&(dev.base + BUF + off).to_le_bytes());
                    }
                }
                let _ = dev.llq.write(dev.llq_offset + u64::from(slot) * 64, &wqe);
                dev.sq_pc = dev.sq_pc.wrapping_add(1);
                dev.efa
                    .db_write(dev.sq_db, &u32::from(dev.sq_pc).to_le_bytes());
            }
            // A receive descriptor of any bytes, or a sane one.
            2 => {
                let mut desc = [0u8; 16];
                let bytes = input.take(16);
                desc[..bytes.len()].copy_from_slice(bytes);
                if op & 0x40 != 0 {
                    let addr = dev.base + BUF + u64::from(desc[0]) * 64;
                    desc[0..8].copy_from_slice(&addr.to_le_bytes());
                    desc[10..12].copy_from_slice(&9000u16.to_le_bytes());
                    desc[12..16].copy_from_slice(&(dev.key | 3 << 30).to_le_bytes());
                }
                let slot = u32::from(dev.rq_pc) % 16;
                let _ = ram.write(dev.rq_ring + u64::from(slot) * 16, &desc);
                dev.rq_pc = dev.rq_pc.wrapping_add(1);
                dev.efa
                    .db_write(dev.rq_db, &u32::from(dev.rq_pc).to_le_bytes());
            }
            // A doorbell write anywhere with any value.
            3 => {
                let Some(offset) = input.u32() else { break };
                let Some(value) = input.u32() else { break };
                dev.efa
                    .db_write(u64::from(offset) % (64 << 12), &value.to_le_bytes());
            }
            // A packet of any bytes from the fabric.
            4 => {
                let Some(len) = input.u8() else { break };
                let bytes = input.take(usize::from(len) * 4).to_vec();
                if let Ok(mut q) = dev.tap.injected.lock() {
                    q.push_back(bytes);
                    injected += 1;
                }
            }
            // Scribble guest RAM (rings, buffers, CQs).
            5 => {
                let Some(at) = input.u32() else { break };
                let bytes = input.take(16);
                let _ = ram.write(RAM + u64::from(at) % (RAM_SIZE - 16), bytes);
            }
            6 => {
                let spec = [
                    "drop,count=1",
                    "corrupt,count=1",
                    "reorder,count=2",
                    "delay=1ms,count=1",
                    "cq-error=9,count=1",
                    "link-down",
                ][usize::from(op >> 4) % 6];
                let _ = DeviceControl::inject(&dev.efa.control(), spec);
            }
            _ => {
                if op & 0x10 != 0 {
                    let _ = dev.efa.reset();
                } else {
                    DeviceControl::clear(&dev.efa.control());
                }
            }
        }
        // Both devices until neither has work: a packet one sends is
        // the other's to take.
        while a.efa.run_engines() + b.efa.run_engines() > 0 {}
    }
    // Counters are read with both devices idle and stopped (a sender
    // counts a packet after the link took it; with engine threads the
    // receiver's count could run ahead of it).
    let (ca, cb) = (a.efa.control(), b.efa.control());
    drop(a);
    drop(b);
    let (sa, sb) = (ca.stats(), cb.stats());
    assert!(
        sb.recv_wrs <= sa.tx_pkts + injected + sb.tx_pkts,
        "received more than was sent: {sa:?} {sb:?}"
    );
});
