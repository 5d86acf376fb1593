//! Unit tests of the address map, without a socket: fd-backed ranges come
//! from a SharedMemory's memfd, as QEMU's guest RAM would.

use super::*;
use crate::SharedMemory;
use std::os::fd::{AsFd, OwnedFd};

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

#[test]
fn zero_copy_slices_outlive_a_concurrent_unmap() {
    let dma = DmaSpace::new();
    let ram = guest_ram(MIB);
    map_ram(&dma, &ram, 0x4000_0000, MIB, Perms::READ_WRITE, 0);
    let value = dma
        .with_slice(0x4000_0000 + 64, 8, Access::ReadWrite, |slice| {
            // The client unmaps while we hold the slice: the mapping must
            // stay valid until we are done.
            dma.unmap(0x4000_0000, MIB).unwrap();
            slice.copy_from(&[7u8; 8]);
            let mut out = [0u8; 8];
            slice.copy_to(&mut out);
            out
        })
        .unwrap();
    assert_eq!(value, [7u8; 8]);
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

#[test]
fn mmap_failures_become_errors() {
    let dma = DmaSpace::new();
    // A pipe cannot be mmapped.
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
    assert!(matches!(err, DmaError::Mmap(_, _)), "{err:?}");
    assert_ne!(err.errno(), 0);
    assert_eq!(dma.mapping_count(), 0);
}
