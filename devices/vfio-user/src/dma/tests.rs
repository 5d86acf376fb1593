//! Unit tests of the address map, without a socket: fd-backed ranges come
//! from a SharedMemory's memfd, as QEMU's guest RAM would.

use super::*;
use crate::SharedMemory;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;

const MIB: u64 = 1 << 20;

fn guest_ram(size: u64) -> Arc<SharedMemory> {
    Arc::new(SharedMemory::new("guest-ram", size).unwrap())
}

fn map_ram(dma: &DmaSpace, ram: &SharedMemory, gpa: u64, len: u64, perms: Perms, off: u64) {
    let fd = ram.as_fd().try_clone_to_owned().unwrap();
    dma.map_fd(gpa, len, perms, fd, off).unwrap();
}

#[test]
fn fd_backed_ranges_read_and_write_guest_memory() {
    let dma = DmaSpace::new();
    let ram = guest_ram(4 * MIB);
    map_ram(&dma, &ram, 0x1000_0000, 4 * MIB, Perms::READ_WRITE, 0);

    dma.write(0x1000_0000 + 10, b"hello guest").unwrap();
    let mut seen = [0u8; 11];
    ram.read_at(10, &mut seen).unwrap();
    assert_eq!(&seen, b"hello guest");

    ram.write_at(3 * MIB, b"from ram").unwrap();
    let mut back = [0u8; 8];
    dma.read(0x1000_0000 + 3 * MIB, &mut back).unwrap();
    assert_eq!(&back, b"from ram");

    let stats = dma.stats();
    assert_eq!(stats.mmap.write_bytes, 11);
    assert_eq!(stats.mmap.read_bytes, 8);
    assert_eq!(stats.message, Traffic::default());
}

#[test]
fn unaligned_file_offsets_are_honoured() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    ram.write_at(0x1234, b"xyz").unwrap();
    map_ram(&dma, &ram, 0x8000, 0x1000, Perms::READ_WRITE, 0x1234);
    let mut buf = [0u8; 3];
    dma.read(0x8000, &mut buf).unwrap();
    assert_eq!(&buf, b"xyz");
}

#[test]
fn accesses_spanning_adjacent_ranges_are_split() {
    let dma = DmaSpace::new();
    let ram = guest_ram(2 * MIB);
    // Two ranges back to back in gpa, far apart in the file.
    map_ram(&dma, &ram, 0x10_0000, 0x1000, Perms::READ_WRITE, MIB);
    map_ram(&dma, &ram, 0x10_1000, 0x1000, Perms::READ_WRITE, 0);
    let data: Vec<u8> = (0..0x20u8).collect();
    dma.write(0x10_0ff0, &data).unwrap();
    let mut a = [0u8; 0x10];
    let mut b = [0u8; 0x10];
    ram.read_at(MIB + 0xff0, &mut a).unwrap();
    ram.read_at(0, &mut b).unwrap();
    assert_eq!(&a[..], &data[..0x10]);
    assert_eq!(&b[..], &data[0x10..]);
    assert_eq!(dma.classify(0x10_0ff0, 0x20), DmaTarget::GuestMemory);
}

#[test]
fn unmapped_and_partially_mapped_ranges_are_errors() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    map_ram(&dma, &ram, 0x2000, 0x1000, Perms::READ_WRITE, 0);
    let mut buf = [0u8; 16];
    assert!(matches!(
        dma.read(0x9000, &mut buf),
        Err(DmaError::Unmapped { gpa: 0x9000, .. })
    ));
    // Runs off the end of the only range.
    assert!(matches!(
        dma.write(0x2ff8, &buf),
        Err(DmaError::Unmapped { gpa: 0x3000, .. })
    ));
    assert!(matches!(
        dma.read(u64::MAX - 4, &mut buf),
        Err(DmaError::Overflow { .. })
    ));
    assert_eq!(dma.classify(0x2ff8, 16), DmaTarget::Unmapped);
    assert_eq!(dma.classify(0x1000, 1), DmaTarget::Unmapped);
}

#[test]
fn permissions_are_enforced() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    map_ram(&dma, &ram, 0, 0x1000, Perms::READ_ONLY, 0);
    dma.map_message_only(
        0x1000,
        0x1000,
        Perms {
            read: false,
            write: true,
        },
    )
    .unwrap();
    let mut buf = [0u8; 4];
    dma.read(0, &mut buf).unwrap();
    assert_eq!(
        dma.write(0, &buf),
        Err(DmaError::Permission {
            gpa: 0,
            write: true
        })
    );
    assert_eq!(
        dma.read(0x1000, &mut buf),
        Err(DmaError::Permission {
            gpa: 0x1000,
            write: false
        })
    );
    assert_eq!(
        dma.with_slice(0, 4, Access::ReadWrite, |_| ()),
        Err(DmaError::Permission {
            gpa: 0,
            write: true
        })
    );
}

#[test]
fn overlapping_maps_are_refused_and_unmap_needs_whole_ranges() {
    let dma = DmaSpace::new();
    dma.map_message_only(0x1000, 0x2000, Perms::READ_WRITE)
        .unwrap();
    for (gpa, len) in [
        (0x0, 0x1001),
        (0x2fff, 0x10),
        (0x1800, 0x10),
        (0x0, 0x10000),
    ] {
        assert_eq!(
            dma.map_message_only(gpa, len, Perms::READ_WRITE),
            Err(DmaError::Overlap { gpa, len }),
            "{gpa:#x}+{len:#x}"
        );
    }
    dma.map_message_only(0x3000, 0x1000, Perms::READ_WRITE)
        .unwrap();
    assert_eq!(
        dma.map_message_only(0, 0, Perms::READ_WRITE),
        Err(DmaError::Invalid("empty mapping"))
    );
    assert!(dma
        .map_message_only(u64::MAX, 2, Perms::READ_WRITE)
        .is_err());

    assert!(matches!(
        dma.unmap(0x1000, 0x1000),
        Err(DmaError::PartialUnmap { .. })
    ));
    assert!(matches!(
        dma.unmap(0x2000, 0x2000),
        Err(DmaError::PartialUnmap { .. })
    ));
    assert!(matches!(
        dma.unmap(0x8000, 0x1000),
        Err(DmaError::Unmapped { .. })
    ));
    assert_eq!(dma.mapping_count(), 2);
    // One call may remove several whole ranges.
    assert_eq!(dma.unmap(0x1000, 0x3000), Ok(2));
    assert_eq!(dma.mapping_count(), 0);
}

#[test]
fn message_ranges_without_a_connection_fail_cleanly() {
    let dma = DmaSpace::new();
    dma.map_message_only(0x4000, 0x1000, Perms::READ_WRITE)
        .unwrap();
    assert_eq!(dma.classify(0x4000, 0x1000), DmaTarget::MessageOnly);
    let mut buf = [0u8; 8];
    assert_eq!(dma.read(0x4000, &mut buf), Err(DmaError::NotConnected));
    assert_eq!(dma.write(0x4000, &buf), Err(DmaError::NotConnected));
    assert!(matches!(
        dma.with_slice(0x4000, 8, Access::Read, |_| ()),
        Err(DmaError::NotDirect { .. })
    ));
}

/// A client that answers DMA messages from a byte array at gpa 0x4000,
/// or fails every request with `fail`; it records what it was asked.
#[derive(Default)]
struct FakeClient {
    memory: std::sync::Mutex<Vec<u8>>,
    requests: std::sync::Mutex<Vec<(&'static str, u64, usize)>>,
    fail: Option<DmaError>,
    closed: std::sync::atomic::AtomicBool,
}

impl FakeClient {
    const BASE: u64 = 0x4000;

    fn with_memory(len: usize) -> Arc<Self> {
        Arc::new(FakeClient {
            memory: std::sync::Mutex::new((0..len).map(|i| i as u8).collect()),
            ..FakeClient::default()
        })
    }

    fn range(&self, gpa: u64, len: usize) -> std::ops::Range<usize> {
        let start = (gpa - Self::BASE) as usize;
        start..start + len
    }
}

impl MessageDma for FakeClient {
    fn dma_read(&self, gpa: u64, buf: &mut [u8], _range: &RangeUse) -> Result<(), DmaError> {
        self.requests.lock().unwrap().push(("read", gpa, buf.len()));
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        buf.copy_from_slice(&self.memory.lock().unwrap()[self.range(gpa, buf.len())]);
        Ok(())
    }

    fn dma_write(&self, gpa: u64, data: &[u8], _range: &RangeUse) -> Result<(), DmaError> {
        self.requests
            .lock()
            .unwrap()
            .push(("write", gpa, data.len()));
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        let range = self.range(gpa, data.len());
        self.memory.lock().unwrap()[range].copy_from_slice(data);
        Ok(())
    }

    fn cancel_closed(&self) {}

    fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Catches a space that sends message-only ranges anywhere but the
/// attached message path, cuts them wrongly at a neighbouring window or
/// RAM range, counts them on the wrong path, or keeps using a detached one.
#[test]
fn message_ranges_go_through_the_attached_message_path() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    map_ram(&dma, &ram, 0x3000, 0x1000, Perms::READ_WRITE, 0);
    dma.map_message_only(FakeClient::BASE, 0x1000, Perms::READ_WRITE)
        .unwrap();
    let client = FakeClient::with_memory(0x1000);
    dma.attach(Arc::clone(&client) as Arc<dyn MessageDma>);
    assert!(dma.is_connected());

    // 16 bytes: the last 8 of RAM, then the first 8 of the message range.
    let mut buf = [0u8; 16];
    dma.read(0x3ff8, &mut buf).unwrap();
    assert_eq!(&buf[8..], &[0, 1, 2, 3, 4, 5, 6, 7]);
    dma.write(0x4100, b"peer").unwrap();
    assert_eq!(&client.memory.lock().unwrap()[0x100..0x104], b"peer");
    assert_eq!(
        *client.requests.lock().unwrap(),
        vec![("read", 0x4000, 8), ("write", 0x4100, 4)]
    );
    let stats = dma.stats();
    assert_eq!(
        stats.message,
        Traffic {
            read_ops: 1,
            read_bytes: 8,
            write_ops: 1,
            write_bytes: 4,
        }
    );
    assert_eq!((stats.mmap.read_ops, stats.mmap.read_bytes), (1, 8));

    // Detaching closes the path and drops every client range.
    dma.detach();
    assert!(client.closed.load(std::sync::atomic::Ordering::SeqCst));
    assert!(!dma.is_connected());
    assert_eq!(dma.mapping_count(), 0);
}

/// Catches a space that swallows a message-path error or counts bytes the
/// client never delivered.
#[test]
fn message_path_errors_reach_the_caller_uncounted() {
    let dma = DmaSpace::new();
    dma.map_message_only(FakeClient::BASE, 0x1000, Perms::READ_WRITE)
        .unwrap();
    let client = Arc::new(FakeClient {
        fail: Some(DmaError::Remote {
            errno: libc::EFAULT,
        }),
        ..FakeClient::default()
    });
    dma.attach(Arc::clone(&client) as Arc<dyn MessageDma>);
    let mut buf = [0u8; 8];
    assert_eq!(
        dma.read(FakeClient::BASE, &mut buf),
        Err(DmaError::Remote {
            errno: libc::EFAULT
        })
    );
    assert_eq!(
        dma.write(FakeClient::BASE, &buf),
        Err(DmaError::Remote {
            errno: libc::EFAULT
        })
    );
    assert_eq!(dma.stats().message, Traffic::default());

    // A second connection replaces the first, which is closed.
    let next = FakeClient::with_memory(0x1000);
    dma.attach(Arc::clone(&next) as Arc<dyn MessageDma>);
    assert!(client.closed.load(std::sync::atomic::Ordering::SeqCst));
    dma.read(FakeClient::BASE, &mut buf).unwrap();
    assert_eq!(buf, [0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn local_windows_take_precedence_and_move() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    map_ram(&dma, &ram, 0x10_0000, MIB, Perms::READ_WRITE, 0);
    let bar = guest_ram(0x4000);
    let id = dma
        .add_local_window(0x10_2000, 0x2000, bar.clone(), 0x1000)
        .unwrap();
    assert_eq!(dma.classify(0x10_2000, 0x2000), DmaTarget::Local(id));
    assert_eq!(dma.classify(0x10_1000, 0x2000), DmaTarget::Mixed);

    // A write across the window edge: first part to RAM, rest to the BAR.
    dma.write(0x10_1ffc, b"ABCDEFGH").unwrap();
    let mut in_ram = [0u8; 4];
    let mut in_bar = [0u8; 4];
    ram.read_at(0x1ffc, &mut in_ram).unwrap();
    bar.read_at(0x1000, &mut in_bar).unwrap();
    assert_eq!(&in_ram, b"ABCD");
    assert_eq!(&in_bar, b"EFGH");
    // RAM under the window was not touched.
    let mut under = [0u8; 4];
    ram.read_at(0x2000, &mut under).unwrap();
    assert_eq!(under, [0; 4]);
    let stats = dma.stats();
    assert_eq!(stats.local.write_bytes, 4);
    assert_eq!(stats.mmap.write_bytes, 4);

    // Move the window (the guest reprogrammed the BAR) to unmapped space:
    // it works there with no client range at all.
    dma.move_local_window(id, 0xf000_0000).unwrap();
    assert_eq!(dma.local_window(id), Some((0xf000_0000, 0x2000)));
    let mut back = [0u8; 4];
    dma.read(0xf000_0000, &mut back).unwrap();
    assert_eq!(&back, b"EFGH");
    assert_eq!(dma.classify(0x10_2000, 4), DmaTarget::GuestMemory);

    // Windows may not overlap each other, and must fit their memory.
    let other = guest_ram(0x1000);
    assert!(matches!(
        dma.add_local_window(0xf000_1000, 0x1000, other.clone(), 0),
        Err(DmaError::Overlap { .. })
    ));
    assert!(matches!(
        dma.add_local_window(0xe000_0000, 0x2000, other, 0),
        Err(DmaError::OutOfBounds { .. })
    ));
    assert!(dma.remove_local_window(id));
    assert!(!dma.remove_local_window(id));
    assert_eq!(dma.move_local_window(id, 0), Err(DmaError::UnknownWindow));
    assert_eq!(dma.classify(0xf000_0000, 4), DmaTarget::Unmapped);
}

#[test]
fn scatter_gather_follows_segment_order() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    map_ram(&dma, &ram, 0, MIB, Perms::READ_WRITE, 0);
    let segs = [(0x3000u64, 4usize), (0x1000, 2), (0x2000, 3)];
    dma.write_sg(&segs, b"abcdefghi").unwrap();
    let mut a = [0u8; 4];
    ram.read_at(0x3000, &mut a).unwrap();
    assert_eq!(&a, b"abcd");
    let mut back = [0u8; 9];
    dma.read_sg(&segs, &mut back).unwrap();
    assert_eq!(&back, b"abcdefghi");
    assert!(matches!(
        dma.read_sg(&segs, &mut [0u8; 8]),
        Err(DmaError::Invalid(_))
    ));
    assert!(dma.write_sg(&[(0, usize::MAX), (0, 2)], b"x").is_err());
    // A bad segment fails the whole call.
    assert!(matches!(
        dma.write_sg(&[(0, 1), (2 * MIB, 1)], b"xy"),
        Err(DmaError::Unmapped { .. })
    ));
}

/// Catches an unmap that returns (and so lets the transport answer
/// DMA_UNMAP) while a device thread still writes through a zero-copy
/// slice: the client would get its memory back with our writes still
/// landing in it.
#[test]
fn unmap_waits_for_a_running_zero_copy_access() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    map_ram(&dma, &ram, 0x4000_0000, MIB, Perms::READ_WRITE, 0);
    let (started_tx, started) = std::sync::mpsc::channel();
    let worker = {
        let dma = dma.clone();
        std::thread::spawn(move || {
            dma.with_slice(0x4000_0000 + 64, 8, Access::ReadWrite, |slice| {
                started_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(200));
                slice.copy_from(&[7u8; 8]);
                Instant::now()
            })
            .unwrap()
        })
    };
    started.recv().unwrap();
    dma.unmap(0x4000_0000, MIB).unwrap();
    let unmapped_at = Instant::now();
    let wrote_at = worker.join().unwrap();
    assert!(
        wrote_at <= unmapped_at,
        "unmap returned before the access ended"
    );
    let mut seen = [0u8; 8];
    ram.read_at(64, &mut seen).unwrap();
    assert_eq!(seen, [7u8; 8]);
    assert_eq!(dma.classify(0x4000_0000, 8), DmaTarget::Unmapped);

    // Local windows backed by SharedMemory are direct too; a range split
    // across two kinds is not.
    let bar = guest_ram(0x1000);
    dma.add_local_window(0x9000, 0x1000, bar.clone(), 0)
        .unwrap();
    dma.with_slice(0x9010, 4, Access::Write, |s| s.copy_from(b"WXYZ"))
        .unwrap();
    let mut w = [0u8; 4];
    bar.read_at(0x10, &mut w).unwrap();
    assert_eq!(&w, b"WXYZ");
    assert!(matches!(
        dma.with_slice(0x8ffc, 8, Access::Read, |_| ()),
        Err(DmaError::Unmapped { .. })
    ));
}

/// Catches an unmap that waits forever (or gives the memory back) when a
/// device access outlives the timeout: it must fail with StillInUse and
/// leave the range removed.
#[test]
fn unmap_gives_up_after_the_timeout_and_says_which_range_is_busy() {
    let dma = DmaSpace::with_timeout(Duration::from_millis(50));
    let ram = guest_ram(MIB);
    map_ram(&dma, &ram, 0x10_0000, MIB, Perms::READ_WRITE, 0);
    let (started_tx, started) = std::sync::mpsc::channel();
    let worker = {
        let dma = dma.clone();
        std::thread::spawn(move || {
            dma.with_slice(0x10_0000, 8, Access::Write, |_| {
                started_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(400));
            })
        })
    };
    started.recv().unwrap();
    let err = dma.unmap(0x10_0000, MIB).unwrap_err();
    assert!(
        matches!(
            err,
            DmaError::StillInUse {
                gpa: 0x10_0000,
                len: MIB,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.errno(), libc::EBUSY);
    assert_eq!(dma.mapping_count(), 0);
    worker.join().unwrap().unwrap();
}

/// A client that never answers: every message DMA waits until its range
/// is closed and `cancel_closed` runs, as the connection's waiters do.
#[derive(Default)]
struct SilentClient {
    waiting: std::sync::Mutex<Vec<Arc<RangeUsers>>>,
    wake: std::sync::Condvar,
}

impl SilentClient {
    fn wait(&self, range: &RangeUse, gpa: u64, len: usize) -> Result<(), DmaError> {
        let mut waiting = self.waiting.lock().unwrap();
        waiting.push(Arc::clone(range.users()));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !range.users().is_cancelled() {
            assert!(Instant::now() < deadline, "never cancelled");
            waiting = self
                .wake
                .wait_timeout(waiting, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        Err(DmaError::Revoked {
            gpa,
            len: len as u64,
        })
    }
    fn waiters(&self) -> usize {
        self.waiting.lock().unwrap().len()
    }
}

impl MessageDma for SilentClient {
    fn dma_read(&self, gpa: u64, buf: &mut [u8], range: &RangeUse) -> Result<(), DmaError> {
        self.wait(range, gpa, buf.len())
    }
    fn dma_write(&self, gpa: u64, data: &[u8], range: &RangeUse) -> Result<(), DmaError> {
        self.wait(range, gpa, data.len())
    }
    fn cancel_closed(&self) {
        self.wake.notify_all();
    }
    fn close(&self) {
        self.wake.notify_all();
    }
}

/// Catches an unmap or a fence that waits for a message DMA whose reply
/// only the (blocked) reader thread could deliver, instead of failing it:
/// the unmap would hang until the DMA timeout.
#[test]
fn unmap_and_fence_fail_message_dma_waiting_for_a_reply() {
    let dma = DmaSpace::with_timeout(Duration::from_secs(30));
    let client = Arc::new(SilentClient::default());
    dma.attach(Arc::clone(&client) as Arc<dyn MessageDma>);
    dma.map_message_only(0x8000_0000, 0x1000, Perms::READ_WRITE)
        .unwrap();
    dma.map_message_only(0x9000_0000, 0x1000, Perms::READ_WRITE)
        .unwrap();
    let spawn_write = |gpa: u64| {
        let dma = dma.clone();
        std::thread::spawn(move || dma.write(gpa, b"late"))
    };
    let first = spawn_write(0x8000_0000);
    while client.waiters() < 1 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let t0 = Instant::now();
    dma.unmap(0x8000_0000, 0x1000).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "unmap waited for the reply"
    );
    assert!(matches!(
        first.join().unwrap(),
        Err(DmaError::Revoked {
            gpa: 0x8000_0000,
            ..
        })
    ));

    // A fence (device reset) does the same for every range, then lets
    // accesses through again once dropped.
    let second = spawn_write(0x9000_0000);
    while client.waiters() < 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (fence, drained) = dma.fence();
    drained.unwrap();
    assert!(matches!(
        second.join().unwrap(),
        Err(DmaError::Revoked { .. })
    ));
    assert!(matches!(
        dma.write(0x9000_0000, b"x"),
        Err(DmaError::Revoked { .. })
    ));
    drop(fence);
    assert_eq!(dma.mapping_count(), 1);
    assert_eq!(dma.classify(0x9000_0000, 1), DmaTarget::MessageOnly);
}

#[test]
fn readonly_client_memory_is_mapped_without_write() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    ram.write_at(0, b"rom!").unwrap();
    map_ram(&dma, &ram, 0xfff0_0000, 0x1000, Perms::READ_ONLY, 0);
    let mut buf = [0u8; 4];
    dma.read(0xfff0_0000, &mut buf).unwrap();
    assert_eq!(&buf, b"rom!");
    assert_eq!(dma.mappings()[0].perms, Perms::READ_ONLY);
    assert!(dma.mappings()[0].fd_backed);
}

fn memfd(size: u64, seals: i32) -> File {
    // SAFETY: memfd_create reads a valid NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"test".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    // SAFETY: `raw` was just created and nothing else owns it.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    file.set_len(size).unwrap();
    if seals != 0 {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        // SAFETY: F_ADD_SEALS on our own memfd.
        let rc = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) };
        assert_eq!(rc, 0);
    }
    file
}

fn owned(file: &File) -> OwnedFd {
    file.as_fd().try_clone_to_owned().unwrap()
}

/// Catches a DMA_MAP that accepts memory which faults later: a file
/// shorter than the range (the first DMA past its end was a SIGBUS), a
/// pipe or device node, or an fd whose open mode lacks the permission.
#[test]
fn fds_that_could_fault_later_are_refused() {
    let dma = DmaSpace::new();
    let small = memfd(4096, libc::F_SEAL_SHRINK);
    let err = dma
        .map_fd(0, MIB, Perms::READ_WRITE, owned(&small), 0)
        .unwrap_err();
    assert!(matches!(err, DmaError::BadBacking(_)), "{err:?}");
    assert_eq!(err.errno(), libc::EINVAL);
    // Inside the size, but the offset pushes the end past it.
    let err = dma
        .map_fd(0, 4096, Perms::READ_WRITE, owned(&small), 1)
        .unwrap_err();
    assert!(matches!(err, DmaError::BadBacking(_)), "{err:?}");
    let err = dma
        .map_fd(0, 4096, Perms::READ_WRITE, owned(&small), u64::MAX)
        .unwrap_err();
    assert!(matches!(err, DmaError::BadBacking(_)), "{err:?}");

    // A pipe and a character device are not memory.
    let mut fds = [0; 2];
    // SAFETY: pipe fills two fds that we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both fds were just created and are owned here.
    let (r, _w) = unsafe {
        (
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[0]),
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]),
        )
    };
    let err = dma.map_fd(0, 0x1000, Perms::READ_WRITE, r, 0).unwrap_err();
    assert!(matches!(err, DmaError::BadBacking(_)), "{err:?}");
    let zero = File::open("/dev/zero").unwrap();
    let err = dma
        .map_fd(0, 0x1000, Perms::READ_ONLY, zero.into(), 0)
        .unwrap_err();
    assert!(matches!(err, DmaError::BadBacking(_)), "{err:?}");

    // A read-only fd cannot back a writable range, sealed or not.
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&small));
    let readonly = File::open(&path).unwrap();
    let err = dma
        .map_fd(0, 4096, Perms::READ_WRITE, readonly.into(), 0)
        .unwrap_err();
    assert!(matches!(err, DmaError::BadBacking(_)), "{err:?}");
    assert_eq!(dma.mapping_count(), 0);

    // mmap itself can still refuse: a write-sealed memfd mapped writable.
    let write_sealed = memfd(4096, libc::F_SEAL_SHRINK | libc::F_SEAL_WRITE);
    let err = dma
        .map_fd(0, 4096, Perms::READ_WRITE, owned(&write_sealed), 0)
        .unwrap_err();
    assert!(matches!(err, DmaError::Mmap(_, libc::EPERM)), "{err:?}");
    assert_eq!(dma.mapping_count(), 0);
}

/// Catches unsealed client memory being mmapped: a client truncating it
/// after DMA_MAP would make the next DMA a SIGBUS that kills the server.
/// Such memory is reached by pread/pwrite, and a shrink makes DMA fail.
#[test]
fn memory_that_may_shrink_is_not_mmapped_and_a_shrink_fails_dma_cleanly() {
    let dma = DmaSpace::new();
    let sealed = memfd(MIB, libc::F_SEAL_SHRINK);
    let loose = memfd(MIB, 0);
    dma.map_fd(0, MIB, Perms::READ_WRITE, owned(&sealed), 0)
        .unwrap();
    dma.map_fd(0x1000_0000, MIB, Perms::READ_WRITE, owned(&loose), 0)
        .unwrap();
    let ranges = dma.mappings();
    assert!(ranges[0].mmapped && ranges[0].fd_backed);
    assert!(!ranges[1].mmapped && ranges[1].fd_backed);

    dma.write(0x1000_0000 + 0x8000, b"pwrite").unwrap();
    let mut back = [0u8; 6];
    loose.read_exact_at(&mut back, 0x8000).unwrap();
    assert_eq!(&back, b"pwrite");
    dma.read(0x1000_0000 + 0x8000, &mut back).unwrap();
    assert_eq!(&back, b"pwrite");
    let stats = dma.stats();
    assert_eq!((stats.file.read_bytes, stats.file.write_bytes), (6, 6));
    assert_eq!(stats.mmap, Traffic::default());
    // Zero-copy needs a mapping: the caller falls back to copying.
    assert!(matches!(
        dma.with_slice(0x1000_0000, 8, Access::Read, |_| ()),
        Err(DmaError::NotDirect { .. })
    ));

    // The client shrinks its file to one page.
    loose.set_len(4096).unwrap();
    let mut buf = [0u8; 16];
    assert!(matches!(
        dma.read(0x1000_0000 + 0x8000, &mut buf),
        Err(DmaError::Truncated { .. })
    ));
    assert!(matches!(
        dma.write(0x1000_0000 + 0x8000, &buf),
        Err(DmaError::Truncated { .. })
    ));
    assert_eq!(loose.metadata().unwrap().len(), 4096, "a DMA grew the file");
    dma.read(0x1000_0000, &mut buf).unwrap();
    // The sealed one cannot shrink at all.
    assert!(sealed.set_len(4096).is_err());
}

/// Catches a space that cannot unmap a range ending at 2^64 (QEMU unmaps
/// "everything above X" that way when the guest turns a vIOMMU off): the
/// mappings up there would stay live in the server.
#[test]
fn unmap_reaching_the_top_of_the_address_space_removes_what_is_there() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    let high = u64::MAX - 0xfff - 0x1_0000;
    map_ram(&dma, &ram, high, 0x1000, Perms::READ_WRITE, 0);
    map_ram(&dma, &ram, 0x1000, 0x1000, Perms::READ_WRITE, 0);
    let from = 0xfef0_0000u64;
    assert_eq!(dma.unmap(from, 0u64.wrapping_sub(from)).unwrap(), 1);
    assert_eq!(dma.classify(high, 16), DmaTarget::Unmapped);
    assert_eq!(dma.classify(0x1000, 16), DmaTarget::GuestMemory);
    // One byte further does overflow.
    assert!(matches!(
        dma.unmap(from, 1u64.wrapping_sub(from)),
        Err(DmaError::Overflow { .. })
    ));
}

/// Catches a zero-copy scatter-gather access that hands out memory it
/// must not (bytes reached only by messages, an unmapped hole) or in the
/// wrong order, or that counts bytes it did not hand out.
#[test]
fn scatter_gather_zero_copy_is_all_or_nothing() {
    let dma = DmaSpace::new();
    let ram = guest_ram(2 * MIB);
    // Two ranges back to back in gpa, far apart in the file, and a window.
    map_ram(&dma, &ram, 0x10_0000, 0x1000, Perms::READ_WRITE, MIB);
    map_ram(&dma, &ram, 0x10_1000, 0x1000, Perms::READ_WRITE, 0);
    let bar = guest_ram(0x1000);
    dma.add_local_window(0x9000, 0x1000, bar.clone(), 0)
        .unwrap();
    dma.map_message_only(0x20_0000, 0x1000, Perms::READ_WRITE)
        .unwrap();
    let segments = [(0x10_0ff0, 0x20), (0x9008, 4)];
    let lens = dma
        .with_slices(&segments, Access::Write, |slices| {
            let mut byte = 0u8;
            for s in slices {
                let fill: Vec<u8> = (0..s.len())
                    .map(|_| {
                        byte += 1;
                        byte
                    })
                    .collect();
                s.copy_from(&fill);
            }
            slices.iter().map(|s| s.len()).collect::<Vec<_>>()
        })
        .unwrap();
    assert_eq!(lens, Some(vec![0x10, 0x10, 4]), "split at the range edge");
    let mut first = [0u8; 0x10];
    ram.read_at(MIB + 0xff0, &mut first).unwrap();
    let mut second = [0u8; 0x10];
    ram.read_at(0, &mut second).unwrap();
    let mut third = [0u8; 4];
    bar.read_at(8, &mut third).unwrap();
    let all: Vec<u8> = [&first[..], &second[..], &third[..]].concat();
    assert_eq!(all, (1..=0x24).collect::<Vec<u8>>());
    let stats = dma.stats();
    assert_eq!(stats.mmap.write_bytes, 0x20);
    assert_eq!(stats.local.write_bytes, 4);
    // One byte behind messages: nothing handed out, nothing counted.
    let mut called = false;
    let none = dma
        .with_slices(&[(0x10_0000, 8), (0x20_0000, 8)], Access::Read, |_| {
            called = true
        })
        .unwrap();
    assert_eq!(none, None);
    assert!(!called);
    assert_eq!(dma.stats().mmap.read_bytes, 0);
    // A hole is an error, as for read/write.
    assert!(matches!(
        dma.with_slices(&[(0x10_0000, 8), (0x30_0000, 8)], Access::Read, |_| ()),
        Err(DmaError::Unmapped { .. })
    ));
}

// ----- peer windows against guest RAM, revocation, moves that time out -----

/// Peer memory whose owner can revoke it (as the placement page does).
struct Revocable {
    memory: Arc<SharedMemory>,
    current: std::sync::atomic::AtomicBool,
}

impl Revocable {
    fn new(size: u64) -> Arc<Self> {
        Arc::new(Self {
            memory: guest_ram(size),
            current: std::sync::atomic::AtomicBool::new(true),
        })
    }
}

impl LocalMemory for Revocable {
    fn size(&self) -> u64 {
        LocalMemory::size(&*self.memory)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        LocalMemory::read_at(&*self.memory, offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DmaError> {
        LocalMemory::write_at(&*self.memory, offset, data)
    }
    fn direct_slice(
        &self,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Option<vm_memory::VolatileSlice<'_>> {
        self.memory.direct_slice(offset, len, access)
    }
    fn is_current(&self) -> bool {
        self.current.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Catches a DMA_MAP with an fd that lands over a placed peer window and
/// leaves the window in front of the new guest RAM (DMA meant for RAM
/// would go into another server's BAR), a DMA_MAP over a window that is
/// refused (QEMU's memory map would break), and a fd-less DMA_MAP (what
/// QEMU sends for the peer BAR itself) that removes the window.
#[test]
fn guest_ram_mapped_over_a_peer_window_removes_the_window() {
    let dma = DmaSpace::new();
    let peer = Revocable::new(0x4000);
    dma.map_message_only(0x10_0000, 0x4000, Perms::READ_WRITE)
        .unwrap();
    let id = dma
        .add_peer_window(0x10_0000, 0x4000, peer.clone(), 0)
        .unwrap();
    assert_eq!(dma.classify(0x10_0000, 0x4000), DmaTarget::Peer(id));

    let ram = guest_ram(MIB);
    // The fd-less range sits there: RAM next to it, overlapping the window.
    map_ram(&dma, &ram, 0x10_4000, 0x1000, Perms::READ_WRITE, 0);
    assert_eq!(
        dma.peer_windows(),
        vec![(0x10_0000, 0x4000)],
        "no overlap yet"
    );
    dma.unmap(0x10_0000, 0x4000).unwrap();
    map_ram(&dma, &ram, 0x10_2000, 0x2000, Perms::READ_WRITE, 0x2000);
    assert_eq!(dma.peer_windows(), vec![], "RAM wins: the window is gone");
    assert_eq!(dma.peer_window(id), None);
    assert_eq!(dma.classify(0x10_2000, 0x2000), DmaTarget::GuestMemory);
    dma.write(0x10_2000, b"to RAM").unwrap();
    let mut in_ram = [0u8; 6];
    ram.read_at(0x2000, &mut in_ram).unwrap();
    assert_eq!(&in_ram, b"to RAM");
    let mut in_peer = [0u8; 6];
    peer.memory.read_at(0x2000, &mut in_peer).unwrap();
    assert_eq!(in_peer, [0; 6], "nothing reached the peer");
    assert!(
        dma.write(0x10_0000, b"x").is_err(),
        "below the RAM: nothing"
    );
    assert_eq!(
        dma.move_peer_window(id, 0x20_0000),
        Err(DmaError::UnknownWindow),
        "the user adds it anew at the next placement"
    );
    // The other order: a placement over RAM is refused.
    assert!(matches!(
        dma.add_peer_window(0x10_3000, 0x4000, peer.clone(), 0),
        Err(DmaError::Overlap { .. })
    ));
    let id = dma
        .add_peer_window(0x20_0000, 0x4000, peer.clone(), 0)
        .unwrap();
    assert!(matches!(
        dma.move_peer_window(id, 0x10_1000),
        Err(DmaError::Overlap { .. })
    ));
    assert_eq!(dma.peer_windows(), vec![], "a refused move leaves nothing");
}

/// Catches a peer window that keeps serving after its owner revoked it
/// (moved the BAR, cut us off) but before its user applied that: DMA
/// would land in memory no longer at that address.
#[test]
fn a_revoked_peer_window_is_skipped_for_the_range_below() {
    let dma = DmaSpace::new();
    let peer = Revocable::new(0x2000);
    dma.map_message_only(0x10_0000, 0x2000, Perms::READ_WRITE)
        .unwrap();
    let id = dma
        .add_peer_window(0x10_0000, 0x2000, peer.clone(), 0)
        .unwrap();
    dma.write(0x10_0000, b"live").unwrap();
    peer.current
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(dma.classify(0x10_0000, 0x2000), DmaTarget::MessageOnly);
    assert_eq!(
        dma.write(0x10_0000, b"gone"),
        Err(DmaError::NotConnected),
        "the message path below (no client here)"
    );
    assert_eq!(
        dma.with_slices(&[(0x10_0000, 4)], Access::Write, |_| ())
            .unwrap(),
        None,
        "no zero-copy slice of revoked memory"
    );
    let mut seen = [0u8; 4];
    peer.memory.read_at(0, &mut seen).unwrap();
    assert_eq!(&seen, b"live");
    assert_eq!(dma.stats().peer.write_bytes, 4);
    dma.unmap(0x10_0000, 0x2000).unwrap();
    assert_eq!(dma.classify(0x10_0000, 1), DmaTarget::Unmapped);
    assert!(matches!(
        dma.read(0x10_0000, &mut seen),
        Err(DmaError::Unmapped { .. })
    ));
    peer.current
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(dma.classify(0x10_0000, 1), DmaTarget::Peer(id));
}

/// Catches a window move that times out on an access in flight and
/// leaves the window at its new place with nobody owning it (DMA there
/// would reach a dead peer's memory, and that peer's next placement would
/// be refused as an overlap).
#[test]
fn a_peer_window_move_that_times_out_leaves_no_window() {
    let dma = DmaSpace::with_timeout(std::time::Duration::from_millis(100));
    let peer = Revocable::new(0x2000);
    let id = dma
        .add_peer_window(0x10_0000, 0x2000, peer.clone(), 0)
        .unwrap();
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let stuck = {
        let dma = dma.clone();
        std::thread::spawn(move || {
            dma.with_slices(&[(0x10_0000, 16)], Access::Write, |_| {
                entered_tx.send(()).unwrap();
                let _ = release_rx.recv();
            })
        })
    };
    entered.recv().unwrap();
    assert!(matches!(
        dma.move_peer_window(id, 0x20_0000),
        Err(DmaError::StillInUse { .. })
    ));
    assert_eq!(dma.peer_windows(), vec![], "neither place keeps it");
    assert_eq!(dma.classify(0x20_0000, 1), DmaTarget::Unmapped);
    // A restarted owner's placement there is taken.
    let again = dma.add_peer_window(0x20_0000, 0x2000, peer.clone(), 0);
    assert!(again.is_ok(), "{again:?}");
    release.send(()).unwrap();
    assert_eq!(stuck.join().unwrap(), Ok(Some(())));
}

/// A window's memory that records the prefaults asked of it.
struct PrefaultLog {
    size: u64,
    asked: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl LocalMemory for PrefaultLog {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, _offset: u64, _buf: &mut [u8]) -> Result<(), DmaError> {
        Ok(())
    }
    fn write_at(&self, _offset: u64, _data: &[u8]) -> Result<(), DmaError> {
        Ok(())
    }
    fn prefault(&self, offset: u64, len: u64) -> Result<(), DmaError> {
        self.asked.lock().unwrap().push((offset, len));
        Ok(())
    }
}

/// Catches a prefault (an EFA registering a writable MR) that leaves
/// mmapped guest RAM's pages to be faulted in by the packets, changes a
/// byte, counts itself as DMA traffic, prefaults a range the client made
/// read-only or one served by pwrite, or skips a window (a peer's VRAM)
/// or asks it about the wrong part of its memory.
#[test]
fn prefault_allocates_mmapped_pages_and_asks_windows_moving_no_data() {
    use std::os::unix::fs::MetadataExt;
    let allocated = |f: &File| f.metadata().unwrap().blocks() * 512;
    let dma = DmaSpace::new();
    let ram = memfd(8 * MIB, libc::F_SEAL_SHRINK);
    dma.map_fd(0, 8 * MIB, Perms::READ_WRITE, owned(&ram), 0)
        .unwrap();
    ram.write_all_at(b"kept", 5 * MIB).unwrap();
    assert_eq!(allocated(&ram), 4096);

    // 5 MiB from 1 MiB: three pieces, every page of them allocated.
    dma.prefault(MIB, 5 * MIB + 1).unwrap();
    assert_eq!(allocated(&ram), 5 * MIB + 4096);
    let mut back = [0u8; 4];
    ram.read_exact_at(&mut back, 5 * MIB).unwrap();
    assert_eq!(&back, b"kept");
    let mut zeros = vec![0xffu8; MIB as usize];
    ram.read_exact_at(&mut zeros, MIB).unwrap();
    assert!(zeros.iter().all(|&b| b == 0));
    assert_eq!(dma.stats(), DmaStats::default(), "a prefault is no traffic");

    // A window over part of RAM gets its own part asked, in pieces.
    let log = Arc::new(PrefaultLog {
        size: 16 * MIB,
        asked: std::sync::Mutex::new(Vec::new()),
    });
    dma.add_peer_window(0x1000_0000, 4 * MIB, log.clone(), 8 * MIB)
        .unwrap();
    dma.prefault(0x1000_0000 + 4096, 3 * MIB).unwrap();
    assert_eq!(
        *log.asked.lock().unwrap(),
        [(8 * MIB + 4096, 2 * MIB), (10 * MIB + 4096, MIB)]
    );

    // Read-only memory is refused; memory served by pwrite is left alone.
    let rom = memfd(MIB, libc::F_SEAL_SHRINK);
    dma.map_fd(0x2000_0000, MIB, Perms::READ_ONLY, owned(&rom), 0)
        .unwrap();
    assert!(matches!(
        dma.prefault(0x2000_0000, MIB),
        Err(DmaError::Permission { .. })
    ));
    assert_eq!(allocated(&rom), 0);
    let loose = memfd(MIB, 0);
    dma.map_fd(0x3000_0000, MIB, Perms::READ_WRITE, owned(&loose), 0)
        .unwrap();
    dma.prefault(0x3000_0000, MIB).unwrap();
    assert_eq!(allocated(&loose), 0);
    assert!(matches!(
        dma.prefault(0x4000_0000, 4096),
        Err(DmaError::Unmapped { .. })
    ));
}
