//! NVM I/O commands through I/O queues: data paths, statuses, the CMB.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::harness::*;
use crate::command::CommandBuilder;
use crate::config::ControllerConfig;
use crate::datapointer::sgl_descriptor;
use crate::namespace::{BlockBackend, Caching, FileBackend};
use crate::spec::{io as op, Status, NSID_ALL};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn rw(opcode: u8, slba: u64, blocks: u32) -> CommandBuilder {
    CommandBuilder::new(opcode, 0)
        .nsid(1)
        .slba(slba)
        .cdw(12, blocks - 1)
}

fn ready_host() -> Host {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1);
    h
}

/// Places `data` (20 KiB) in guest RAM the way a PRP1 at an offset in its
/// page and a PRP list of five scattered pages describe it; returns PRP1
/// and PRP2 (the list).
fn scatter_over_a_prp_list(h: &Host, data: &[u8]) -> (u64, u64) {
    let first = DATA + 0x200;
    let pages: Vec<u64> = (1..=5).map(|i| DATA + 0x1_0000 + i * 0x2000).collect();
    let list = DATA + 0x8000;
    let list_bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
    h.poke(list, &list_bytes);
    h.poke(first, &data[..0xe00]);
    let mut at = 0xe00;
    for p in &pages {
        let n = (data.len() - at).min(4096);
        h.poke(*p, &data[at..at + n]);
        at += n;
        if at == data.len() {
            break;
        }
    }
    (first, list)
}

#[test]
fn write_then_read_through_a_prp_list() {
    let mut h = ready_host();
    // 20 KiB from an offset in the first page, through a PRP list.
    let len = 40 * 512;
    let data = pattern(len, 1);
    let (first, list) = scatter_over_a_prp_list(&h, &data);
    let w = rw(op::WRITE, 100, 40).prp1(first).prp2(list).build();
    let before = h.irq.count(1);
    assert_eq!(h.io(1, w).status, Status::SUCCESS);
    assert!(
        h.irq.wait_for(1, before, TIMEOUT),
        "I/O queue 1 interrupts on vector 1"
    );
    // Read it back into one contiguous SGL data block.
    let sgl = sgl_descriptor(0, DATA + 0x10_0000 + 3, len as u32);
    let r = rw(op::READ, 100, 40).sgl1(sgl).build();
    assert_eq!(h.io(1, r).status, Status::SUCCESS);
    assert_eq!(h.peek(DATA + 0x10_0000 + 3, len), data);
    let s = h.ctrl.stats().counters;
    assert_eq!(s.bytes_written, len as u64);
    assert_eq!(s.bytes_read, len as u64);
    assert_eq!(s.data_to_host_bytes, len as u64);
}

#[test]
fn read_through_an_sgl_segment_chain() {
    let mut h = ready_host();
    let data = pattern(4096, 7);
    h.poke(DATA, &data);
    assert_eq!(
        h.io(1, rw(op::WRITE, 8, 8).prp1(DATA).build()).status,
        Status::SUCCESS
    );
    let seg1 = DATA + 0x2_0000;
    let seg2 = DATA + 0x3_0000;
    let descs1 = [
        sgl_descriptor(0, DATA + 0x4_0000, 1000),
        sgl_descriptor(1, 0, 96), // bit bucket
        sgl_descriptor(3, seg2, 32),
    ];
    let descs2 = [
        sgl_descriptor(0, DATA + 0x5_0000, 2000),
        sgl_descriptor(0, DATA + 0x6_0000, 1000),
    ];
    h.poke(seg1, &descs1.concat());
    h.poke(seg2, &descs2.concat());
    let r = rw(op::READ, 8, 8).sgl1(sgl_descriptor(2, seg1, 48)).build();
    assert_eq!(h.io(1, r).status, Status::SUCCESS);
    assert_eq!(h.peek(DATA + 0x4_0000, 1000), &data[..1000]);
    assert_eq!(h.peek(DATA + 0x5_0000, 2000), &data[1096..3096]);
    assert_eq!(h.peek(DATA + 0x6_0000, 1000), &data[3096..]);
    // A bit bucket in a write is refused.
    let w = rw(op::WRITE, 8, 1).sgl1(sgl_descriptor(1, 0, 512)).build();
    assert_eq!(h.io(1, w).status, Status::SGL_DESCRIPTOR_TYPE_INVALID);
    // PSDT 11b is reserved.
    let bad = rw(op::READ, 8, 1).prp1(DATA).psdt(3).build();
    assert_eq!(h.io(1, bad).status, Status::INVALID_FIELD);
}

#[test]
fn io_command_statuses() {
    let mut h = ready_host();
    let blocks = 2048; // 1 MiB of 512-byte blocks
    let c = |h: &mut Host, cmd| h.io(1, cmd).status;
    assert_eq!(
        c(&mut h, rw(op::READ, blocks - 1, 1).prp1(DATA).build()),
        Status::SUCCESS
    );
    assert_eq!(
        c(&mut h, rw(op::READ, blocks - 1, 2).prp1(DATA).build()),
        Status::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        c(&mut h, rw(op::READ, u64::MAX, 2).prp1(DATA).build()),
        Status::LBA_OUT_OF_RANGE,
        "SLBA + NLB wraps"
    );
    // 512 KiB is MDTS; one more block is too much.
    assert_eq!(
        c(&mut h, rw(op::READ, 0, 1025).prp1(DATA).build()),
        Status::INVALID_FIELD
    );
    let wrong_ns = rw(op::READ, 0, 1).nsid(2).prp1(DATA).build();
    assert_eq!(c(&mut h, wrong_ns), Status::INVALID_NAMESPACE);
    let broadcast = rw(op::READ, 0, 1).nsid(NSID_ALL).prp1(DATA).build();
    assert_eq!(c(&mut h, broadcast), Status::INVALID_NAMESPACE);
    let zero = rw(op::READ, 0, 1).nsid(0).prp1(DATA).build();
    assert_eq!(c(&mut h, zero), Status::INVALID_NAMESPACE);
    assert_eq!(
        c(&mut h, CommandBuilder::new(0x04, 0).nsid(1).build()),
        Status::INVALID_OPCODE
    );
    assert_eq!(
        c(&mut h, CommandBuilder::new(0x7e, 0).nsid(1).build()),
        Status::INVALID_OPCODE
    );
    assert_eq!(
        c(&mut h, rw(op::READ, 0, 1).prp1(DATA).fuse(1).build()),
        Status::INVALID_FIELD
    );
    assert_eq!(
        c(&mut h, rw(op::READ, 0, 1).prp1(0x7000_0000).build()),
        Status::DATA_TRANSFER_ERROR,
        "PRP outside guest memory"
    );
    assert_eq!(
        c(
            &mut h,
            rw(op::READ, 0, 16).prp1(DATA).prp2(DATA + 0x1100).build()
        ),
        Status::PRP_OFFSET_INVALID
    );
    assert_eq!(
        c(&mut h, rw(op::WRITE, 0, 1).prp1(DATA + 1).build()),
        Status::PRP_OFFSET_INVALID
    );
    // Flush: one namespace, all, or an invalid one.
    let flush = |nsid| CommandBuilder::new(op::FLUSH, 0).nsid(nsid).build();
    assert_eq!(c(&mut h, flush(1)), Status::SUCCESS);
    assert_eq!(c(&mut h, flush(NSID_ALL)), Status::SUCCESS);
    assert_eq!(c(&mut h, flush(0)), Status::INVALID_NAMESPACE);
    assert_eq!(c(&mut h, flush(3)), Status::INVALID_NAMESPACE);
    // Still serving.
    assert_eq!(
        c(&mut h, rw(op::READ, 0, 1).prp1(DATA).build()),
        Status::SUCCESS
    );
    let s = h.ctrl.stats().counters;
    assert_eq!(s.failed_commands, 14);
}

#[test]
fn write_zeroes_dsm_compare_verify() {
    let mut h = ready_host();
    let data = pattern(64 * 512, 3);
    h.poke(DATA, &data);
    let w = rw(op::WRITE, 0, 64).prp1(DATA).prp2(DATA + 0x9000).build();
    let list: Vec<u8> = (1..8u64)
        .flat_map(|i| (DATA + i * 0x1000).to_le_bytes())
        .collect();
    h.poke(DATA + 0x9000, &list);
    assert_eq!(h.io(1, w).status, Status::SUCCESS);
    let read_back = |h: &mut Host| {
        let list: Vec<u8> = (1..8u64)
            .flat_map(|i| (DATA + 0x10_0000 + i * 0x1000).to_le_bytes())
            .collect();
        h.poke(DATA + 0xa000, &list);
        let r = rw(op::READ, 0, 64)
            .prp1(DATA + 0x10_0000)
            .prp2(DATA + 0xa000)
            .build();
        assert_eq!(h.io(1, r).status, Status::SUCCESS);
        h.peek(DATA + 0x10_0000, 64 * 512)
    };
    assert_eq!(read_back(&mut h), data);
    // Write Zeroes blocks 8..15, and with Deallocate blocks 20..21 + FUA.
    let wz = rw(op::WRITE_ZEROES, 8, 8).build();
    assert_eq!(h.io(1, wz).status, Status::SUCCESS);
    let wz_dealloc = CommandBuilder::new(op::WRITE_ZEROES, 0)
        .nsid(1)
        .slba(20)
        .cdw(12, 1 | (1 << 25) | (1 << 30))
        .build();
    assert_eq!(h.io(1, wz_dealloc).status, Status::SUCCESS);
    let mut want = data.clone();
    want[8 * 512..16 * 512].fill(0);
    want[20 * 512..22 * 512].fill(0);
    assert_eq!(read_back(&mut h), want);
    assert_eq!(
        h.io(1, rw(op::WRITE_ZEROES, 2047, 2).build()).status,
        Status::LBA_OUT_OF_RANGE
    );
    // DSM deallocate two ranges (one empty).
    let mut ranges = Vec::new();
    for (nlb, slba) in [(4u32, 40u64), (0, 1 << 40)] {
        ranges.extend_from_slice(&0u32.to_le_bytes());
        ranges.extend_from_slice(&nlb.to_le_bytes());
        ranges.extend_from_slice(&slba.to_le_bytes());
    }
    h.poke(DATA + 0xb000, &ranges);
    let dsm = CommandBuilder::new(op::DATASET_MANAGEMENT, 0)
        .nsid(1)
        .prp1(DATA + 0xb000)
        .cdw(10, 1)
        .cdw(11, 1 << 2)
        .build();
    assert_eq!(h.io(1, dsm).status, Status::SUCCESS);
    want[40 * 512..44 * 512].fill(0);
    assert_eq!(read_back(&mut h), want);
    // A range past the end refuses the whole command.
    let mut bad = Vec::new();
    for (nlb, slba) in [(2u32, 50u64), (4, 2046)] {
        bad.extend_from_slice(&0u32.to_le_bytes());
        bad.extend_from_slice(&nlb.to_le_bytes());
        bad.extend_from_slice(&slba.to_le_bytes());
    }
    h.poke(DATA + 0xb000, &bad);
    let dsm = CommandBuilder::new(op::DATASET_MANAGEMENT, 0)
        .nsid(1)
        .prp1(DATA + 0xb000)
        .cdw(10, 1)
        .cdw(11, 1 << 2)
        .build();
    assert_eq!(h.io(1, dsm).status, Status::LBA_OUT_OF_RANGE);
    assert_eq!(read_back(&mut h), want, "nothing deallocated");
    // Compare equal and different data.
    h.poke(DATA + 0xc000, &want[..512]);
    let cmp = rw(op::COMPARE, 0, 1).prp1(DATA + 0xc000).build();
    assert_eq!(h.io(1, cmp).status, Status::SUCCESS);
    h.poke(DATA + 0xc000 + 100, &[!want[100]]);
    assert_eq!(h.io(1, cmp).status, Status::COMPARE_FAILURE);
    // Verify: in range and past the end.
    assert_eq!(
        h.io(1, rw(op::VERIFY, 0, 2048).build()).status,
        Status::SUCCESS
    );
    assert_eq!(
        h.io(1, rw(op::VERIFY, 1, 2048).build()).status,
        Status::LBA_OUT_OF_RANGE
    );
    let s = h.ctrl.stats().counters;
    assert_eq!(
        (s.write_zeroes_commands, s.dsm_commands, s.compare_commands),
        (2, 2, 2)
    );
}

#[test]
fn queues_in_the_cmb_and_data_in_both_places() {
    let mut h = Host::new();
    h.map_cmb();
    h.enable();
    // SQ in the CMB (as Linux places it), CQ in guest memory.
    h.create_pair_at(1, CMB_BAR, RAM + 0x20_0000, 64);
    let s = h.ctrl.stats();
    assert_eq!(s.cmb.io_sqs_created, 1);
    assert!(s
        .queues
        .iter()
        .any(|q| q.sqid == 1 && q.in_cmb && !q.cq_in_cmb));
    // Write from the CMB (P2P-style buffer), 2 pages: PRP1 in guest RAM,
    // PRP2 in the CMB (mixed locations).
    let data = pattern(8192, 9);
    h.poke(DATA, &data[..4096]);
    h.poke(CMB_BAR + 0x10_0000, &data[4096..]);
    let w = rw(op::WRITE, 0, 16)
        .prp1(DATA)
        .prp2(CMB_BAR + 0x10_0000)
        .build();
    assert_eq!(h.io(1, w).status, Status::SUCCESS);
    // Read into the CMB.
    let r = rw(op::READ, 0, 16)
        .prp1(CMB_BAR + 0x20_0000)
        .prp2(CMB_BAR + 0x20_1000)
        .build();
    assert_eq!(h.io(1, r).status, Status::SUCCESS);
    assert_eq!(h.peek(CMB_BAR + 0x20_0000, 8192), data);
    let s = h.ctrl.stats();
    assert_eq!(s.cmb.sq_entries_fetched, 2);
    assert_eq!(s.cmb.data_bytes_from, 4096);
    assert_eq!(s.host.data_bytes_from, 4096);
    assert_eq!(s.cmb.data_bytes_to, 8192);
    // PRP lists may live in the CMB too (LISTS).
    let list: Vec<u8> = [CMB_BAR + 0x30_1000, CMB_BAR + 0x30_2000]
        .iter()
        .flat_map(|a| a.to_le_bytes())
        .collect();
    h.poke(CMB_BAR + 0x30_4000, &list);
    let r = rw(op::READ, 0, 24)
        .prp1(CMB_BAR + 0x30_0000)
        .prp2(CMB_BAR + 0x30_4000)
        .build();
    assert_eq!(h.io(1, r).status, Status::SUCCESS);
    assert_eq!(h.peek(CMB_BAR + 0x30_0000, 8192), data);
}

#[test]
fn completion_queues_in_the_cmb() {
    let mut h = Host::new();
    h.map_cmb();
    h.enable();
    h.create_pair_at(1, RAM + 0x20_0000, CMB_BAR + 0x1000, 16);
    for _ in 0..40 {
        assert_eq!(
            h.io(1, rw(op::READ, 0, 1).prp1(DATA).build()).status,
            Status::SUCCESS
        );
    }
    assert_eq!(h.ctrl.stats().cmb.cq_entries_posted, 40);
}

#[test]
fn many_commands_in_flight_wrap_the_phase() {
    let mut h = Host::new();
    h.enable();
    h.create_pair_at(1, RAM + 0x20_0000, RAM + 0x30_0000, 8);
    // 7 outstanding at a time on an 8-entry queue, 10 rounds: the phase
    // tag flips many times and completions keep their order.
    for round in 0..10u64 {
        let cids: Vec<u16> = (0..7u64)
            .map(|i| {
                h.place(
                    1,
                    rw(op::READ, round * 7 + i, 1).prp1(DATA + i * 512).build(),
                )
            })
            .collect();
        h.ring_sq(1);
        for cid in cids {
            let c = h.reap(1);
            assert_eq!((c.cid, c.status), (cid, Status::SUCCESS));
        }
    }
    assert_eq!(h.ctrl.stats().counters.read_commands, 70);
}

#[test]
fn a_full_completion_queue_holds_completions_until_the_host_frees_it() {
    let mut h = Host::new();
    h.enable();
    // CQ of 4 entries (3 usable), SQ of 16.
    assert_eq!(h.create_cq(1, RAM + 0x30_0000, 4, 1), Status::SUCCESS);
    assert_eq!(h.create_sq(1, RAM + 0x20_0000, 16, 1), Status::SUCCESS);
    h.queues[1] = Some(QueuePair {
        qid: 1,
        sq_base: RAM + 0x20_0000,
        cq_base: RAM + 0x30_0000,
        entries: 4,
        sq_tail: 0,
        cq_head: 0,
        phase: true,
    });
    // The harness pairs one size for both; submit by hand on a 16-deep SQ.
    let mut sq_tail = 0u32;
    let mut cids = Vec::new();
    for i in 0..6u64 {
        let mut raw = *rw(op::READ, i, 1).prp1(DATA).build().as_bytes();
        let cid = 100 + i as u16;
        raw[2..4].copy_from_slice(&cid.to_le_bytes());
        h.poke(RAM + 0x20_0000 + u64::from(sq_tail) * 64, &raw);
        sq_tail += 1;
        cids.push(cid);
    }
    h.write32(0x1008, sq_tail);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        h.ctrl.stats().counters.read_commands,
        4,
        "3 posted, 1 waiting"
    );
    for cid in cids {
        let c = h.reap(1);
        assert_eq!(c.cid, cid);
    }
}

/// Fails reads with EIO and writes with ENOSPC while `broken` is set;
/// counts flushes.
struct FaultyBackend {
    inner: FileBackend,
    broken: AtomicBool,
    flushes: AtomicU64,
}

impl BlockBackend for FaultyBackend {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.broken.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.broken.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        if self.broken.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }
    fn describe(&self) -> String {
        "faulty".into()
    }
}

#[test]
fn backing_store_errors_map_to_media_statuses() {
    let backend = Arc::new(FaultyBackend {
        inner: FileBackend::memory("faulty", 1 << 20).unwrap(),
        broken: AtomicBool::new(true),
        flushes: AtomicU64::new(0),
    });
    let mut h = Host::with(test_config(), vec![namespace_on(1, backend.clone(), 512)]);
    h.enable();
    h.create_pair(1);
    let c = |h: &mut Host, cmd| h.io(1, cmd).status;
    assert_eq!(
        c(&mut h, rw(op::READ, 0, 1).prp1(DATA).build()),
        Status::UNRECOVERED_READ_ERROR
    );
    // ENOSPC: the store is full.
    assert_eq!(
        c(&mut h, rw(op::WRITE, 0, 1).prp1(DATA).build()),
        Status::CAPACITY_EXCEEDED
    );
    assert_eq!(
        c(&mut h, CommandBuilder::new(op::FLUSH, 0).nsid(1).build()),
        Status::WRITE_FAULT
    );
    assert_eq!(
        c(&mut h, rw(op::VERIFY, 0, 1).build()),
        Status::UNRECOVERED_READ_ERROR
    );
    backend.broken.store(false, Ordering::Relaxed);
    assert_eq!(
        c(&mut h, rw(op::WRITE, 0, 1).prp1(DATA).build()),
        Status::SUCCESS
    );
    let s = h.ctrl.stats().counters;
    assert_eq!(s.backend_errors, 4);
}

#[test]
fn write_cache_off_means_write_through_and_fua_flushes() {
    let backend = Arc::new(FaultyBackend {
        inner: FileBackend::memory("wc", 1 << 20).unwrap(),
        broken: AtomicBool::new(false),
        flushes: AtomicU64::new(0),
    });
    let flushes = || backend.flushes.load(Ordering::Relaxed);
    let mut h = Host::with(test_config(), vec![namespace_on(1, backend.clone(), 512)]);
    h.enable();
    h.create_pair(1);
    assert_eq!(
        h.io(1, rw(op::WRITE, 0, 1).prp1(DATA).build()).status,
        Status::SUCCESS
    );
    assert_eq!(flushes(), 0, "cached write");
    let fua = CommandBuilder::new(op::WRITE, 0)
        .nsid(1)
        .prp1(DATA)
        .cdw(12, 1 << 30)
        .build();
    assert_eq!(h.io(1, fua).status, Status::SUCCESS);
    assert_eq!(flushes(), 1, "FUA write reaches stable storage");
    let no_cache = CommandBuilder::new(crate::spec::admin::SET_FEATURES, 0)
        .cdw(10, 6)
        .cdw(11, 0)
        .build();
    assert_eq!(h.admin(no_cache).status, Status::SUCCESS);
    assert_eq!(flushes(), 2, "turning the cache off flushes it");
    let get = CommandBuilder::new(crate::spec::admin::GET_FEATURES, 0)
        .cdw(10, 6)
        .build();
    assert_eq!(h.admin(get).dw0, 0);
    assert_eq!(
        h.io(1, rw(op::WRITE, 0, 1).prp1(DATA).build()).status,
        Status::SUCCESS
    );
    assert_eq!(flushes(), 3, "write-through without a cache");
}

#[test]
fn four_kib_namespaces_and_file_backing() {
    let path = std::env::temp_dir().join(format!("p2plab-nvme-io-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let backend: Arc<dyn BlockBackend> =
        Arc::new(FileBackend::open(&path, Some(4 << 20), Caching::Page).unwrap());
    let mut h = Host::with(
        ControllerConfig {
            cmb_size: 0,
            ..test_config()
        },
        vec![namespace_on(1, backend, 4096)],
    );
    h.enable();
    h.create_pair(1);
    let data = pattern(8192, 5);
    h.poke(DATA, &data);
    let w = rw(op::WRITE, 3, 2).prp1(DATA).prp2(DATA + 0x1000).build();
    assert_eq!(h.io(1, w).status, Status::SUCCESS);
    assert_eq!(
        h.io(1, CommandBuilder::new(op::FLUSH, 0).nsid(1).build())
            .status,
        Status::SUCCESS
    );
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[3 * 4096..5 * 4096], &data[..]);
    assert_eq!(
        h.io(1, rw(op::READ, 1023, 2).prp1(DATA).build()).status,
        Status::LBA_OUT_OF_RANGE
    );
    drop(h);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn deleting_a_queue_whose_completion_queue_is_full_does_not_hang() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.create_cq(1, RAM + 0x30_0000, 2, 1), Status::SUCCESS);
    assert_eq!(h.create_sq(1, RAM + 0x20_0000, 16, 1), Status::SUCCESS);
    for i in 0..4u64 {
        let mut raw = *rw(op::READ, i, 1).prp1(DATA).build().as_bytes();
        raw[2..4].copy_from_slice(&(200 + i as u16).to_le_bytes());
        h.poke(RAM + 0x20_0000 + i * 64, &raw);
    }
    h.write32(0x1008, 4);
    std::thread::sleep(std::time::Duration::from_millis(50));
    // One completion fits; the worker now waits for space that never comes.
    let started = std::time::Instant::now();
    let delete = CommandBuilder::new(crate::spec::admin::DELETE_SQ, 0)
        .cdw(10, 1)
        .build();
    assert_eq!(h.admin(delete).status, Status::SUCCESS);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    let delete_cq = CommandBuilder::new(crate::spec::admin::DELETE_CQ, 0)
        .cdw(10, 1)
        .build();
    assert_eq!(h.admin(delete_cq).status, Status::SUCCESS);
}

#[test]
fn transfers_larger_than_the_bounce_chunk_without_mdts() {
    let mut h = Host::with(
        ControllerConfig {
            mdts: 0,
            ..test_config()
        },
        vec![memory_namespace(1, 8 << 20, 512)],
    );
    h.enable();
    h.create_pair(1);
    // 2 MiB + 4 KiB: three bounce-buffer pieces, one SGL data block each way.
    let len = (2 << 20) + 4096;
    let data = pattern(len, 11);
    h.poke(DATA, &data);
    let blocks = (len / 512) as u32;
    let w = rw(op::WRITE, 7, blocks)
        .sgl1(sgl_descriptor(0, DATA, len as u32))
        .build();
    assert_eq!(h.io(1, w).status, Status::SUCCESS);
    let back = DATA + (4 << 20);
    let r = rw(op::READ, 7, blocks)
        .sgl1(sgl_descriptor(0, back, len as u32))
        .build();
    assert_eq!(h.io(1, r).status, Status::SUCCESS);
    assert_eq!(h.peek(back, len), data);
    let cmp = rw(op::COMPARE, 7, blocks)
        .sgl1(sgl_descriptor(0, DATA, len as u32))
        .build();
    assert_eq!(h.io(1, cmp).status, Status::SUCCESS);
    h.poke(DATA + (2 << 20) + 100, &[!data[(2 << 20) + 100]]);
    assert_eq!(
        h.io(1, cmp).status,
        Status::COMPARE_FAILURE,
        "difference in the last piece"
    );
}

/// Guest memory that only copies: the transport's answer for memory
/// reached by messages.
struct CopyOnly(Arc<dyn p2plab_dma::GuestMemory>);

impl p2plab_dma::GuestMemory for CopyOnly {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), p2plab_dma::DmaFault> {
        self.0.read(addr, buf)
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), p2plab_dma::DmaFault> {
        self.0.write(addr, data)
    }
}

/// Catches a zero-copy data path (preadv/pwritev straight between the
/// backing file and guest memory) that differs from the copying one: the
/// same PRP-list write, SGL read with an odd offset, and a read with a Bit
/// Bucket, through both, on a file namespace; the bytes, the data counters
/// and the path taken must be as expected.
#[test]
fn zero_copy_and_copying_data_paths_agree() {
    for copy in [false, true] {
        let path =
            std::env::temp_dir().join(format!("p2plab-nvme-zc-{}-{copy}.img", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let backend: Arc<dyn BlockBackend> =
            Arc::new(FileBackend::open(&path, Some(4 << 20), Caching::Page).unwrap());
        let mut h = Host::wrapped(test_config(), vec![namespace_on(1, backend, 512)], |g| {
            if copy {
                Arc::new(CopyOnly(g))
            } else {
                g
            }
        });
        h.enable();
        h.create_pair(1);
        let len = 40 * 512;
        let data = pattern(len, 9);
        let (first, list) = scatter_over_a_prp_list(&h, &data);
        let w = rw(op::WRITE, 100, 40).prp1(first).prp2(list).build();
        assert_eq!(h.io(1, w).status, Status::SUCCESS);
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[100 * 512..140 * 512], &data[..], "copy={copy}");
        let back = DATA + 0x10_0000 + 3;
        let r = rw(op::READ, 100, 40)
            .sgl1(sgl_descriptor(0, back, len as u32))
            .build();
        assert_eq!(h.io(1, r).status, Status::SUCCESS);
        assert_eq!(h.peek(back, len), data, "copy={copy}");
        let direct = h.guest.direct_bytes();
        assert_eq!(direct, if copy { 0 } else { 2 * len as u64 }, "copy={copy}");
        // A Bit Bucket in the middle always copies (the data is cut).
        let seg = DATA + 0x3_0000;
        let descs = [
            sgl_descriptor(0, DATA + 0x20_0000, 512),
            sgl_descriptor(1, 0, 512),
            sgl_descriptor(0, DATA + 0x20_1000, 512),
        ];
        let bytes: Vec<u8> = descs.iter().flatten().copied().collect();
        h.poke(seg, &bytes);
        let sgl = sgl_descriptor(3, seg, bytes.len() as u32);
        let r = rw(op::READ, 100, 3).sgl1(sgl).build();
        assert_eq!(h.io(1, r).status, Status::SUCCESS);
        assert_eq!(h.peek(DATA + 0x20_0000, 512), &data[..512]);
        assert_eq!(h.peek(DATA + 0x20_1000, 512), &data[1024..1536]);
        assert_eq!(h.guest.direct_bytes(), direct, "bit bucket copied");
        let s = h.ctrl.stats().counters;
        assert_eq!(s.data_from_host_bytes, len as u64);
        assert_eq!(s.data_to_host_bytes, len as u64 + 1024);
        assert!(s.host_write_bytes >= len as u64 + 1024);
        drop(h);
        let _ = std::fs::remove_file(&path);
    }
}
