//! When things go wrong inside the device: a panic at the worker boundary,
//! a function reset while a worker is in the middle of a DMA, a backing
//! store whose flush or writes fail.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_dma::{DmaFault, GuestMemory};

use super::harness::*;
use crate::command::CommandBuilder;
use crate::namespace::{BlockBackend, FileBackend};
use crate::registers::{reg, Csts};
use crate::spec::{io as op, Status};

/// What [`TroubleMemory`] does to accesses in its window.
#[derive(Clone, Copy)]
enum Trouble {
    /// Panics: a bug somewhere below a handler.
    Panic,
    /// Sleeps before the access: a slow bus, so a reset can overtake it.
    Delay(Duration),
}

/// Guest memory that misbehaves in one window of bus addresses and counts
/// the accesses there (started, and running now).
struct TroubleMemory {
    inner: Arc<dyn GuestMemory>,
    window: Range<u64>,
    trouble: Trouble,
    started: AtomicU64,
    running: AtomicUsize,
}

impl TroubleMemory {
    fn new(inner: Arc<dyn GuestMemory>, window: Range<u64>, trouble: Trouble) -> Self {
        Self {
            inner,
            window,
            trouble,
            started: AtomicU64::new(0),
            running: AtomicUsize::new(0),
        }
    }

    fn around<T>(&self, addr: u64, access: impl FnOnce() -> T) -> T {
        if !self.window.contains(&addr) {
            return access();
        }
        self.running.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        match self.trouble {
            Trouble::Panic => panic!("injected fault at {addr:#x}"),
            Trouble::Delay(d) => std::thread::sleep(d),
        }
        let result = access();
        self.running.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

impl GuestMemory for TroubleMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.around(addr, || self.inner.read(addr, buf))
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.around(addr, || self.inner.write(addr, data))
    }
}

/// A page of guest RAM the trouble is confined to.
const TROUBLE: u64 = DATA + 0x10_0000;

fn trouble_host(trouble: Trouble) -> (Host, Arc<TroubleMemory>) {
    let mut memory = None;
    let h = Host::wrapped(
        test_config(),
        vec![memory_namespace(1, 1 << 20, 512)],
        |guest| {
            let m = Arc::new(TroubleMemory::new(
                guest,
                TROUBLE..TROUBLE + 0x1000,
                trouble,
            ));
            memory = Some(Arc::clone(&m));
            m
        },
    );
    (h, memory.expect("wrap ran"))
}

fn rw(opcode: u8, slba: u64, blocks: u32) -> CommandBuilder {
    CommandBuilder::new(opcode, 0)
        .nsid(1)
        .slba(slba)
        .cdw(12, blocks - 1)
}

fn flush() -> crate::command::Command {
    CommandBuilder::new(op::FLUSH, 0).nsid(1).build()
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Catches a device whose worker dies silently on an internal error (the
/// queue wedges, CSTS.CFS never rises, Linux waits for a timeout and
/// gets nothing), or that stays failed after the host resets it.
#[test]
fn a_panicking_worker_sets_cfs_and_a_controller_reset_recovers() {
    let (mut h, memory) = trouble_host(Trouble::Panic);
    h.enable();
    h.create_pair(1);
    let block: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
    h.poke(DATA, &block);
    assert_eq!(
        h.io(1, rw(op::WRITE, 3, 1).prp1(DATA).build()).status,
        Status::SUCCESS
    );
    // A Read whose data lands in the window: the DMA panics mid-command.
    h.submit(1, rw(op::READ, 3, 1).prp1(TROUBLE).build());
    h.wait_csts(Csts::CFS.raw(), Csts::CFS.raw());
    assert_eq!(memory.started.load(Ordering::SeqCst), 1);
    assert_eq!(h.ctrl.stats().counters.internal_errors, 1);
    // Linux's recovery: CC.EN 1->0, wait for RDY 0, enable again.
    h.write32(reg::CC, 0);
    h.wait_csts(Csts::RDY.raw(), 0);
    assert_eq!(h.read32(reg::CSTS) & Csts::CFS.raw(), 0, "reset clears CFS");
    h.enable();
    h.create_pair(1);
    let c = h.io(1, rw(op::READ, 3, 1).prp1(DATA + 0x2000).build());
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(h.peek(DATA + 0x2000, 512), block);
}

/// Catches a function reset (DEVICE_RESET, disconnect) that returns while
/// a detached worker still DMAs into memory the client may reuse at once.
#[test]
fn a_function_reset_returns_only_once_no_worker_dmas() {
    let delay = Duration::from_millis(300);
    let (mut h, memory) = trouble_host(Trouble::Delay(delay));
    h.enable();
    h.create_pair(1);
    h.submit(1, rw(op::READ, 0, 8).prp1(TROUBLE).build());
    wait_until("the read's DMA to start", || {
        memory.started.load(Ordering::SeqCst) > 0
    });
    h.ctrl.reset();
    assert_eq!(
        memory.running.load(Ordering::SeqCst),
        0,
        "a DMA was still running when reset returned"
    );
    assert_eq!(
        h.ctrl.csts() & Csts::RDY.raw(),
        0,
        "a worker outlived the reset"
    );
    let started = memory.started.load(Ordering::SeqCst);
    std::thread::sleep(delay + Duration::from_millis(100));
    assert_eq!(
        memory.started.load(Ordering::SeqCst),
        started,
        "DMA after the reset returned"
    );
}

/// A file store whose next fdatasync fails once with EIO (as Linux
/// reports a writeback error once, then lets fdatasync succeed), and
/// whose writes and reads fail with a chosen errno.
struct FailingStore {
    inner: FileBackend,
    fail_next_flush: AtomicBool,
    flushes: AtomicU64,
    /// Flushes that returned.
    flushes_done: AtomicU64,
    /// How long each flush takes, in milliseconds.
    flush_ms: AtomicU64,
    write_errno: AtomicI32,
    read_errno: AtomicI32,
}

impl FailingStore {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: FileBackend::memory("failing", 1 << 20).unwrap(),
            fail_next_flush: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
            flushes_done: AtomicU64::new(0),
            flush_ms: AtomicU64::new(0),
            write_errno: AtomicI32::new(0),
            read_errno: AtomicI32::new(0),
        })
    }
}

fn errno_result(errno: &AtomicI32) -> io::Result<()> {
    match errno.load(Ordering::SeqCst) {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

impl BlockBackend for FailingStore {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        errno_result(&self.read_errno)?;
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        errno_result(&self.write_errno)?;
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(self.flush_ms.load(Ordering::SeqCst)));
        let result = if self.fail_next_flush.swap(false, Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(libc::EIO))
        } else {
            self.inner.flush()
        };
        self.flushes_done.fetch_add(1, Ordering::SeqCst);
        result
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }
    fn describe(&self) -> String {
        "failing".into()
    }
}

fn failing_host() -> (Host, Arc<FailingStore>) {
    let store = FailingStore::new();
    let mut h = Host::with(test_config(), vec![namespace_on(1, store.clone(), 512)]);
    h.enable();
    h.create_pair(1);
    (h, store)
}

/// Catches a Flush that reports success after an earlier fdatasync lost
/// writes (the kernel reports that only once), and one that stays failed
/// after the host reset the controller.
#[test]
fn a_failed_flush_fails_every_flush_until_a_controller_reset() {
    let (mut h, store) = failing_host();
    assert_eq!(
        h.io(1, rw(op::WRITE, 0, 1).prp1(DATA).build()).status,
        Status::SUCCESS
    );
    assert_eq!(h.io(1, flush()).status, Status::SUCCESS);
    store.fail_next_flush.store(true, Ordering::SeqCst);
    let before = store.flushes.load(Ordering::SeqCst);
    assert_eq!(h.io(1, flush()).status, Status::WRITE_FAULT);
    // The store would succeed now; the device must not.
    assert_eq!(h.io(1, flush()).status, Status::WRITE_FAULT);
    let fua = rw(op::WRITE, 1, 1).prp1(DATA).cdw(12, 1 << 30).build();
    assert_eq!(h.io(1, fua).status, Status::WRITE_FAULT);
    assert_eq!(
        store.flushes.load(Ordering::SeqCst),
        before + 1,
        "refused flushes never reach the store"
    );
    assert_eq!(h.ctrl.stats().counters.sticky_flush_failures, 2);
    // A controller reset: the host has been told; flushing works again.
    h.enable();
    h.create_pair(1);
    assert_eq!(h.io(1, flush()).status, Status::SUCCESS);
}

/// Catches a shutdown flush that outlives what ended its controller: the
/// thread that flushes the namespaces for CC.SHN ran on after a function
/// reset and after the controller was dropped (LeakSanitizer found its
/// memory after an `nvme_commands` input). Both must wait for it; the
/// store's flush takes 300 ms here.
#[test]
fn a_function_reset_and_the_controllers_end_wait_for_a_shutdown_flush() {
    for end in ["function reset", "drop"] {
        let (h, store) = failing_host();
        store.flush_ms.store(300, Ordering::SeqCst);
        let cc = h.read32(reg::CC);
        h.write32(reg::CC, cc | (1 << 14));
        let deadline = Instant::now() + TIMEOUT;
        while store.flushes.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "the shutdown flush never started"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        match end {
            "function reset" => h.ctrl.reset(),
            _ => drop(h),
        }
        assert_eq!(
            store.flushes_done.load(Ordering::SeqCst),
            store.flushes.load(Ordering::SeqCst),
            "the {end} returned while the shutdown flush still ran"
        );
    }
}

/// Catches write and read errors of the store reported with the wrong
/// status (a full disk as a media Write Fault, a short read as success).
#[test]
fn store_errors_map_to_the_spec_statuses() {
    let (mut h, store) = failing_host();
    let write_status = |h: &mut Host, errno: i32| {
        store.write_errno.store(errno, Ordering::SeqCst);
        h.io(1, rw(op::WRITE, 0, 1).prp1(DATA).build()).status
    };
    assert_eq!(
        write_status(&mut h, libc::ENOSPC),
        Status::CAPACITY_EXCEEDED
    );
    assert_eq!(
        write_status(&mut h, libc::EDQUOT),
        Status::CAPACITY_EXCEEDED
    );
    assert_eq!(
        write_status(&mut h, libc::EROFS),
        Status::NAMESPACE_WRITE_PROTECTED
    );
    assert_eq!(write_status(&mut h, libc::EIO), Status::WRITE_FAULT);
    assert_eq!(Status::WRITE_FAULT.raw(), 0x280);
    assert_eq!(write_status(&mut h, 0), Status::SUCCESS);
    let read_status = |h: &mut Host, errno: i32| {
        store.read_errno.store(errno, Ordering::SeqCst);
        h.io(1, rw(op::READ, 0, 1).prp1(DATA).build()).status
    };
    assert_eq!(
        read_status(&mut h, libc::EIO),
        Status::UNRECOVERED_READ_ERROR
    );
    assert_eq!(Status::UNRECOVERED_READ_ERROR.raw(), 0x281);
    assert_eq!(read_status(&mut h, libc::ENOMEM), Status::INTERNAL_ERROR);
    assert_eq!(read_status(&mut h, 0), Status::SUCCESS);
}
