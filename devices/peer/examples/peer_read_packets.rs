//! Reads a peer's memory the way an EFA engine does, one packet at a
//! time, to count the syscalls per MiB with `strace -c -f`:
//!
//! ```text
//! cargo build -p p2plab-peer --example peer_read_packets
//! strace -c -f target/debug/examples/peer_read_packets [PACKET] [PASSES]
//! ```
//!
//! A 64 MiB memfd whose first 32 MiB the owner wrote (a GPU buffer after
//! COPY_TO_VRAM) is read PASSES times (default 4) in PACKET-byte reads
//! (default 8192, the size of an SRD packet's payload), then 8 MiB of its
//! never-written half once (holes, which must stay holes). Prints the
//! bytes read, the time taken and the memfd's allocated bytes before and
//! after. Then, for the receiving side (efa1 writing into a GPU buffer
//! that a zero fill just punched), 32 MiB of packets written into
//! punched pages by a store through a mapping (the old path: a page
//! fault that allocates and clears each page) and by
//! `PeerMemory::write_at` (pwrite where the pages are not known to be in
//! memory), then again into the pages just written: time, minor faults
//! and the paths taken. Last, into punched pages again after
//! `PeerMemory::prefault` (what an EFA does at REG_MR of a writable MR):
//! the prefault's time apart from the writes'.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::time::Instant;

use p2plab_peer::memory::{ReadOnlyPage, WritablePage};
use p2plab_peer::{sealed_memfd, PeerMemory, UserLink};
use p2plab_vfio_user::LocalMemory;
use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory};

const SIZE: u64 = 64 << 20;
const WRITTEN: u64 = 32 << 20;
const HOLES: u64 = 8 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let packet: usize = args.next().map_or(Ok(8192), |a| a.parse())?;
    let passes: u64 = args.next().map_or(Ok(4), |a| a.parse())?;
    if packet == 0 || !WRITTEN.is_multiple_of(packet as u64) || !HOLES.is_multiple_of(packet as u64)
    {
        return Err(format!("packet {packet}: must divide {WRITTEN} and {HOLES}").into());
    }

    let fd = sealed_memfd(c"bench-vram", SIZE)?;
    let owner = std::fs::File::from(fd.try_clone()?);
    let link = UserLink::new()?;
    let placements = Arc::new(ReadOnlyPage::from_received(
        link.placement_fd().try_clone()?,
    )?);
    let counters = Arc::new(WritablePage::create(c"bench-counters")?);
    let memory = PeerMemory::new(fd, SIZE, counters, placements, 0)?;

    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    for at in (0..WRITTEN).step_by(chunk.len()) {
        owner.write_all_at(&chunk, at)?;
    }
    let allocated = |f: &std::fs::File| f.metadata().map(|m| m.blocks() * 512);
    let before = allocated(&owner)?;

    let mut buf = vec![0u8; packet];
    let started = Instant::now();
    let mut bytes = 0u64;
    for _ in 0..passes {
        for at in (0..WRITTEN).step_by(packet) {
            memory.read_at(at, &mut buf)?;
            bytes += packet as u64;
        }
    }
    let written_took = started.elapsed();
    let started = Instant::now();
    for at in (WRITTEN..WRITTEN + HOLES).step_by(packet) {
        memory.read_at(at, &mut buf)?;
        if buf.iter().any(|&b| b != 0) {
            return Err(format!("a hole at {at} read non-zero bytes").into());
        }
    }
    let holes_took = started.elapsed();
    let after = allocated(&owner)?;
    println!(
        "packet={packet} written_mib={} written_ms={:.1} hole_mib={} hole_ms={:.1} allocated_before={before} allocated_after={after}",
        bytes >> 20,
        written_took.as_secs_f64() * 1e3,
        HOLES >> 20,
        holes_took.as_secs_f64() * 1e3,
    );
    if after != before {
        return Err("reading holes allocated pages".into());
    }

    // The old write path, a store through a mapping whatever the page:
    // a mapping of our own (PeerMemory's now avoids it on holes).
    let store = MmapRegion::<()>::build(
        Some(FileOffset::from_arc(Arc::new(owner.try_clone()?), 0)),
        SIZE as usize,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_NORESERVE,
    )?;
    for (how, holes) in [
        ("store", true),
        ("peer", true),
        ("peer", false),
        ("store", false),
        ("store", false),
        ("prefaulted", true),
    ] {
        if holes {
            // A zero fill, announced as p2plab-gpu does.
            link.holes_changing(0);
            punch(&owner, 0, WRITTEN)?;
            link.holes_changing(0);
        }
        // What an EFA does when the buffer's MR is registered (before
        // the transfer, untimed there).
        let prefault_started = Instant::now();
        if how == "prefaulted" {
            memory.prefault(0, WRITTEN)?;
        }
        let prefault_ms = prefault_started.elapsed().as_secs_f64() * 1e3;
        let faults = minor_faults();
        let paths = memory.copy_paths();
        let started = Instant::now();
        for at in (0..WRITTEN).step_by(packet) {
            let data = &chunk[..packet];
            if how != "store" {
                memory.write_at(at, data)?;
            } else {
                store
                    .as_volatile_slice()
                    .subslice(at as usize, packet)?
                    .copy_from(data);
            }
        }
        let now = memory.copy_paths();
        println!(
            "write via={how} into_holes={holes} mib={} ms={:.1} prefault_ms={prefault_ms:.1} minor_faults={} pwrites={} mapped={}",
            WRITTEN >> 20,
            started.elapsed().as_secs_f64() * 1e3,
            minor_faults() - faults,
            now.write_pwrite - paths.write_pwrite,
            now.write_mapped - paths.write_mapped,
        );
    }
    Ok(())
}

/// Punches `[offset, offset+len)` out of `file` (a GPU zero fill).
fn punch(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(std::io::Error::from_raw_os_error(libc::EOVERFLOW));
    };
    // SAFETY: fallocate on a memfd we own, inside its size.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Minor page faults of this process so far.
fn minor_faults() -> i64 {
    // SAFETY: `rusage` is plain data, for which all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into a valid rusage struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_minflt
}
