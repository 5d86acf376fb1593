//! Reads of a peer's memory: through the mapping where its pages are
//! known to be in memory, by pread elsewhere, never allocating a hole.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;

use p2plab_vfio_user::{Access, LocalMemory};

use crate::memory::{counter_words, ReadOnlyPage, WritablePage, RELOOK_EVERY};
use crate::session::UserLink;
use crate::{sealed_memfd, CopyPaths, PeerMemory};

const SIZE: u64 = 8 << 20;
const MIB: u64 = 1 << 20;
const PACKET: usize = 8192;

/// A user's view of an owner's memfd, current under the owner's
/// placement page of `link` (slot 0); the owner's own file on the same
/// memory; the user's counter page.
fn peer_memory() -> (PeerMemory, UserLink, File, Arc<WritablePage>) {
    let fd = sealed_memfd(c"test-vram", SIZE).unwrap();
    let owner_view = File::from(fd.try_clone().unwrap());
    let link = UserLink::new().unwrap();
    let placements =
        Arc::new(ReadOnlyPage::from_received(link.placement_fd().try_clone().unwrap()).unwrap());
    let counters = Arc::new(WritablePage::create(c"test-counters").unwrap());
    let memory = PeerMemory::new(fd, SIZE, Arc::clone(&counters), placements, 0).unwrap();
    (memory, link, owner_view, counters)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ seed)
        .collect::<Vec<u8>>()
}

/// Bytes the memfd really holds.
fn allocated(file: &File) -> u64 {
    file.metadata().unwrap().blocks() * 512
}

fn punch(file: &File, offset: u64, len: u64) {
    // SAFETY: fallocate on a memfd we own, inside its size.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    assert_eq!(rc, 0, "punch: {}", std::io::Error::last_os_error());
}

fn read(memory: &PeerMemory, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xeeu8; len];
    memory.read_at(offset, &mut buf).unwrap();
    buf
}

/// Catches a peer read that allocates the owner's holes (a read through
/// the mapping without knowing the pages are there), returns wrong data
/// across a resident/hole boundary, miscounts the bytes read in the
/// counter page, or goes back to a pread per packet for pages already
/// known to be in memory (the EFA GPU->GPU bench's extra system time).
#[test]
fn known_pages_are_read_through_the_mapping_and_holes_by_pread_without_allocating() {
    let (memory, _link, owner, counters) = peer_memory();
    let data = pattern(MIB as usize, 0);
    owner.write_all_at(&data, 0).unwrap();
    let before = allocated(&owner);
    assert_eq!(before, MIB, "the owner's write allocated exactly its pages");

    // 64 packets of one buffer: one mincore, no pread.
    let mut total = 0u64;
    for i in 0..64u64 {
        let at = i * PACKET as u64;
        let got = read(&memory, at, PACKET);
        assert_eq!(got, data[at as usize..at as usize + PACKET], "packet {i}");
        total += PACKET as u64;
    }
    assert_eq!(
        memory.copy_paths(),
        CopyPaths {
            read_mapped: 64,
            read_pread: 0,
            ..CopyPaths::default()
        }
    );

    // A hole reads zeros by pread, and stays a hole.
    assert_eq!(read(&memory, 4 * MIB, PACKET), vec![0u8; PACKET]);
    total += PACKET as u64;
    // Across the end of the written data: its bytes, then zeros.
    let straddle = read(&memory, MIB - 4096, PACKET);
    assert_eq!(straddle[..4096], data[data.len() - 4096..]);
    assert_eq!(straddle[4096..], [0u8; 4096]);
    total += PACKET as u64;
    assert_eq!(
        memory.copy_paths(),
        CopyPaths {
            read_mapped: 64,
            read_pread: 2,
            ..CopyPaths::default()
        }
    );
    // Zero-copy reads: handed out only where the pages are known.
    assert!(memory.direct_slice(2 * MIB, PACKET, Access::Read).is_none());
    assert!(memory.direct_slice(0, PACKET, Access::Read).is_some());
    assert_eq!(allocated(&owner), before, "a read allocated a hole");

    // Pages the owner writes later into a chunk looked up before are
    // read right at once (pread), and learnt within RELOOK_EVERY misses.
    owner.write_all_at(&data[..PACKET], 4 * MIB).unwrap();
    for _ in 0..RELOOK_EVERY {
        assert_eq!(read(&memory, 4 * MIB, PACKET), data[..PACKET]);
        total += PACKET as u64;
    }
    assert_eq!(memory.copy_paths().read_mapped, 65);

    assert_eq!(counters.load(counter_words(0).1), total);
    assert_eq!(counters.load(counter_words(0).0), 0);
}

/// Catches a user that keeps reading through its mapping after the owner
/// said it punched holes (each such read would allocate the punched
/// pages again in the owner's memfd). The second half shows that the
/// danger is real: a punch the owner does not announce is allocated
/// again by the next read, which is why the owner must announce it.
#[test]
fn a_punch_announced_by_the_owner_sends_the_next_read_to_pread() {
    let (memory, link, owner, counters) = peer_memory();
    let data = pattern(MIB as usize, 7);
    owner.write_all_at(&data, 0).unwrap();
    assert_eq!(read(&memory, 0, PACKET), data[..PACKET]);
    assert_eq!(memory.copy_paths().read_mapped, 1);

    link.holes_changing(0);
    punch(&owner, 0, MIB);
    link.holes_changing(0);
    assert_eq!(allocated(&owner), 0);
    assert_eq!(read(&memory, 0, PACKET), vec![0u8; PACKET]);
    assert_eq!(read(&memory, 64 * 1024, PACKET), vec![0u8; PACKET]);
    assert_eq!(
        memory.copy_paths(),
        CopyPaths {
            read_mapped: 1,
            read_pread: 2,
            ..CopyPaths::default()
        }
    );
    assert_eq!(allocated(&owner), 0, "a read allocated a punched hole");

    assert_eq!(counters.load(counter_words(0).1), 3 * PACKET as u64);

    // Unannounced (a fresh user, which learns the pages on its first
    // read): the stale knowledge reads through the mapping, which gives
    // the right bytes (zeros) but allocates the pages read.
    let (memory, _link, owner, _counters) = peer_memory();
    owner.write_all_at(&data, 0).unwrap();
    assert_eq!(read(&memory, 0, PACKET), data[..PACKET]);
    punch(&owner, 0, MIB);
    assert_eq!(read(&memory, 0, PACKET), vec![0u8; PACKET]);
    assert!(
        allocated(&owner) >= PACKET as u64,
        "a read fault on a hole of a shared mapping allocates it (kernel behaviour this cache guards against)"
    );
}

/// Catches an owner protocol that announces a punch only before it: a
/// user whose access starts between the announcement and the punch looks
/// the pages up while they are still there, and without the second
/// announcement would keep reading them through its mapping after the
/// punch, allocating them again.
#[test]
fn what_a_user_learns_while_a_punch_runs_is_forgotten_after_it() {
    let (memory, link, owner, _counters) = peer_memory();
    let data = pattern(MIB as usize, 3);
    owner.write_all_at(&data, 0).unwrap();
    link.holes_changing(0);
    // An access between the announcement and the punch: learns the
    // pages, reads them through the mapping, rightly.
    assert_eq!(read(&memory, 0, PACKET), data[..PACKET]);
    assert_eq!(memory.copy_paths().read_mapped, 1);
    punch(&owner, 0, MIB);
    link.holes_changing(0);
    assert_eq!(read(&memory, 0, PACKET), vec![0u8; PACKET]);
    assert_eq!(memory.copy_paths().read_pread, 1);
    assert_eq!(allocated(&owner), 0, "a read allocated a punched hole");
}

/// Catches a write path that stores into holes through the mapping (a
/// page fault and a page clearing per page: the EFA receiver's extra
/// system time on a zero-filled GPU buffer), that never learns the pages
/// its pwrites allocated (a buffer written twice would stay on pwrite),
/// that keeps storing through the mapping after an announced punch, or
/// that allocates more than the bytes written or miscounts them.
#[test]
fn writes_into_holes_go_by_pwrite_and_then_through_the_mapping() {
    let (memory, link, owner, counters) = peer_memory();
    let data = pattern(512 << 10, 9);
    let write_all = |memory: &PeerMemory| {
        for (i, packet) in data.chunks(PACKET).enumerate() {
            memory.write_at((i * PACKET) as u64, packet).unwrap();
        }
    };
    write_all(&memory);
    assert_eq!(
        memory.copy_paths(),
        CopyPaths {
            write_pwrite: 64,
            ..CopyPaths::default()
        }
    );
    assert_eq!(allocated(&owner), 512 << 10);
    let mut seen = vec![0u8; data.len()];
    owner.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(seen, data);

    // Written twice: the second time through the mapping.
    write_all(&memory);
    assert_eq!(memory.copy_paths().write_mapped, 64);
    assert_eq!(read(&memory, 0, PACKET), data[..PACKET]);
    assert_eq!(memory.copy_paths().read_mapped, 1);

    // A zero fill, announced: pwrite again, no page more than written.
    link.holes_changing(0);
    punch(&owner, 0, MIB);
    link.holes_changing(0);
    write_all(&memory);
    assert_eq!(
        memory.copy_paths(),
        CopyPaths {
            read_mapped: 1,
            read_pread: 0,
            write_mapped: 64,
            write_pwrite: 128,
        }
    );
    assert_eq!(allocated(&owner), 512 << 10);
    owner.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(seen, data);
    assert_eq!(counters.load(counter_words(0).0), 3 * data.len() as u64);
    assert_eq!(counters.load(counter_words(0).1), PACKET as u64);
}

/// Catches a prefault (an EFA registering a writable dma-buf MR over VRAM
/// a zero fill punched) that leaves the holes for the packets to
/// allocate, changes the owner's bytes, counts itself as traffic, is not
/// remembered (the packets then still go by pwrite, the GPU->GPU bench's
/// receive cost), or is still trusted after a punch the owner announced.
#[test]
fn a_prefault_allocates_the_holes_keeps_the_data_and_makes_writes_plain_copies() {
    let (memory, link, owner, counters) = peer_memory();
    let kept = pattern(PACKET, 7);
    owner.write_all_at(&kept, MIB).unwrap();
    memory.prefault(4096, 2 * MIB - 8192).unwrap();
    assert_eq!(allocated(&owner), 2 * MIB - 8192);
    let mut back = vec![0u8; PACKET];
    owner.read_exact_at(&mut back, MIB).unwrap();
    assert_eq!(back, kept);
    assert_eq!(memory.copy_paths(), CopyPaths::default());
    assert_eq!(counters.load(counter_words(0).0), 0);
    assert!(memory.prefault(SIZE - 4096, 8192).is_err(), "past the end");

    // Packets into the prefaulted pages: plain copies, nothing allocated.
    for i in 0..8u64 {
        let data = pattern(PACKET, i as u8);
        memory.write_at(4096 + i * PACKET as u64, &data).unwrap();
    }
    assert_eq!(
        memory.copy_paths(),
        CopyPaths {
            write_mapped: 8,
            ..CopyPaths::default()
        }
    );
    assert_eq!(allocated(&owner), 2 * MIB - 8192);
    owner
        .read_exact_at(&mut back, 4096 + 3 * PACKET as u64)
        .unwrap();
    assert_eq!(back, pattern(PACKET, 3));

    // The owner punches them, announced: the next packet goes by pwrite.
    link.holes_changing(0);
    punch(&owner, 0, 2 * MIB);
    link.holes_changing(0);
    memory.write_at(4096, &kept).unwrap();
    assert_eq!(memory.copy_paths().write_pwrite, 1);
    assert_eq!(allocated(&owner), PACKET as u64);
}
