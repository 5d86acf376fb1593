//! Two registries in one process over a temp folder, without QEMU.

use super::*;
use p2plab_vfio_user::{Access, DmaError, DmaTarget, LocalMemory, Perms, SharedMemory};
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicUsize;
use std::sync::Condvar;

const BAR_SIZE: u64 = 2 << 20;
const PLACE_A: u64 = 0x1_0000_0000;
const PLACE_B: u64 = 0x2_0000_0000;

fn temp_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "p2plab-peer-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    dir
}

fn config(dir: &Path, id: &str) -> PeerConfig {
    PeerConfig {
        dir: dir.join("peers"),
        id: id.into(),
        ack_timeout: Duration::from_millis(500),
        rescan: Duration::from_millis(20),
        max_peers: MAX_PEERS,
        allowed_uids: vec![current_uid()],
    }
}

/// A GPU-like owner exporting a sealed memfd as BAR 2; returns the
/// registry and a file on the same memory (what the owner's engine reads).
fn owner(dir: &Path, id: &str) -> (PeerRegistry, std::fs::File) {
    let fd = sealed_memfd(c"test-vram", BAR_SIZE).unwrap();
    let engine_view = std::fs::File::from(fd.try_clone().unwrap());
    let reg = PeerRegistry::start(
        config(dir, id),
        DmaSpace::new(),
        vec![Export {
            bar: 2,
            fd,
            size: BAR_SIZE,
        }],
    )
    .unwrap();
    (reg, engine_view)
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Catches a peer path that does not reach the owner's memory, counts on
/// the wrong path, lets DMA use a placement after `set_placement` moved or
/// removed it, or lets the engine miss bytes written before.
#[test]
fn a_peer_window_follows_the_owners_placement_synchronously() {
    let dir = temp_dir();
    let (gpu, vram) = owner(&dir, "gpu0");
    let nvme_dma = DmaSpace::new();
    let nvme = PeerRegistry::start(config(&dir, "nvme0"), nvme_dma.clone(), vec![]).unwrap();
    wait_for("the connection", || gpu.users() == 1 && nvme.owners() == 1);
    // The GPU server's own side is a user of nothing.
    assert_eq!(gpu.owners(), 1, "the GPU connects to the NVMe socket too");

    assert_eq!(nvme_dma.classify(PLACE_A, 4096), DmaTarget::Unmapped);
    gpu.set_placement(2, Some(PLACE_A));
    // No wait: set_placement returned after the user acknowledged.
    assert!(matches!(
        nvme_dma.classify(PLACE_A, BAR_SIZE),
        DmaTarget::Peer(_)
    ));

    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    nvme_dma.write(PLACE_A + 4096, &data).unwrap();
    // What the owner's engine reads from the same memfd (the ordering
    // a GPU job submitted after the NVMe completion relies on).
    let mut seen = vec![0u8; data.len()];
    vram.read_exact_at(&mut seen, 4096).unwrap();
    assert_eq!(seen, data);
    let mut back = vec![0u8; 4096];
    nvme_dma.read(PLACE_A + 4096, &mut back).unwrap();
    assert_eq!(back, data[..4096]);

    let stats = nvme_dma.stats();
    assert_eq!(stats.peer.write_bytes, 8192);
    assert_eq!(stats.peer.read_bytes, 4096);
    assert_eq!(stats.message.write_bytes + stats.message.read_bytes, 0);
    assert_eq!(
        gpu.inbound(2),
        Inbound {
            written: 8192,
            read: 4096
        }
    );

    // Zero-copy (an NVMe preadv straight into VRAM): writes are handed
    // out and counted on both sides; reads only where VRAM has no hole (a
    // read through the mapping would allocate one), else the caller copies.
    let wrote = nvme_dma
        .with_slices(&[(PLACE_A, 16), (PLACE_A + 8192, 16)], Access::Write, |s| {
            s.iter().for_each(|s| s.copy_from(&[0xabu8; 16]));
            s.len()
        })
        .unwrap();
    assert_eq!(wrote, Some(2));
    let mut seen = [0u8; 16];
    vram.read_exact_at(&mut seen, 8192).unwrap();
    assert_eq!(seen, [0xab; 16]);
    let hole = 1 << 20;
    assert_eq!(
        nvme_dma
            .with_slices(&[(PLACE_A, 16), (PLACE_A + hole, 16)], Access::Read, |_| ())
            .unwrap(),
        None,
        "a hole: copied"
    );
    let read = nvme_dma
        .with_slices(&[(PLACE_A + 8192, 16)], Access::Read, |s| {
            let mut b = [0u8; 16];
            s[0].copy_to(&mut b[..]);
            b
        })
        .unwrap();
    assert_eq!(read, Some([0xab; 16]));
    let stats = nvme_dma.stats();
    assert_eq!(stats.peer.write_bytes, 8192 + 32);
    assert_eq!(stats.peer.read_bytes, 4096 + 16);
    assert_eq!(
        gpu.inbound(2),
        Inbound {
            written: 8192 + 32,
            read: 4096 + 16
        }
    );
    assert!(
        vram.metadata().unwrap().blocks() * 512 < hole,
        "no page of the hole was allocated"
    );

    gpu.set_placement(2, Some(PLACE_B));
    assert_eq!(nvme_dma.peer_windows(), vec![(PLACE_B, BAR_SIZE)]);
    assert_eq!(nvme_dma.classify(PLACE_A, 4096), DmaTarget::Unmapped);
    assert!(matches!(
        nvme_dma.classify(PLACE_B, 4096),
        DmaTarget::Peer(_)
    ));
    nvme_dma.read(PLACE_B + 4096, &mut back).unwrap();
    assert_eq!(back, data[..4096], "the same memory at the new place");

    gpu.set_placement(2, None);
    assert_eq!(nvme_dma.classify(PLACE_B, 4096), DmaTarget::Unmapped);
    gpu.set_placement(2, None);
    assert_eq!(
        gpu.placement_changes(),
        3,
        "A, B, off; a repeat is no change"
    );
    assert!(nvme_dma.write(PLACE_B, &data).is_err());
    drop(nvme);
    wait_for("the owner to see the user go", || gpu.users() == 0);
    assert_eq!(
        gpu.inbound(2),
        Inbound {
            written: 8192 + 32,
            read: 8192 + 16
        },
        "counts of a user gone are kept"
    );
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches a user that keeps a dead owner's window (writes into memory
/// nobody maps any more), one that never reconnects to a restarted
/// owner, and an owner whose close forgets what its users counted (the
/// final stats are written after it) or leaves its socket behind.
#[test]
fn owner_death_removes_the_window_and_a_restart_brings_it_back() {
    let dir = temp_dir();
    let nvme_dma = DmaSpace::new();
    let nvme = PeerRegistry::start(config(&dir, "nvme0"), nvme_dma.clone(), vec![]).unwrap();
    let (gpu, _vram) = owner(&dir, "gpu0");
    wait_for("the connection", || gpu.users() == 1);
    gpu.set_placement(2, Some(PLACE_A));
    nvme_dma.write(PLACE_A, &[1u8; 512]).unwrap();
    drop(gpu);
    wait_for("the window to go", || {
        nvme_dma.classify(PLACE_A, 4096) == DmaTarget::Unmapped
    });
    wait_for("the user to forget the owner", || nvme.owners() == 0);

    let (gpu, vram) = owner(&dir, "gpu0");
    wait_for("the reconnection", || gpu.users() == 1);
    assert_eq!(
        nvme_dma.classify(PLACE_A, 4096),
        DmaTarget::Unmapped,
        "new owner starts unplaced"
    );
    gpu.set_placement(2, Some(PLACE_A));
    nvme_dma.write(PLACE_A, &[2u8; 512]).unwrap();
    let mut seen = [0u8; 512];
    vram.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(seen, [2u8; 512]);

    nvme_dma.write(PLACE_A, &[3u8; 256]).unwrap();
    gpu.close();
    assert_eq!(
        gpu.inbound(2).written,
        768,
        "counts survive the owner's close"
    );
    wait_for("the window to go", || {
        nvme_dma.classify(PLACE_A, 4096) == DmaTarget::Unmapped
    });
    assert!(!gpu.socket_path().exists(), "close removes the socket");
    drop(nvme);
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches an owner whose placement change hangs on (or keeps) a user that
/// never acknowledges, and an owner that accepts an unsealed memfd.
#[test]
fn a_silent_user_is_dropped_and_unsealed_memory_is_refused() {
    let dir = temp_dir();
    let (gpu, _vram) = owner(&dir, "gpu0");
    let silent = UnixStream::connect(gpu.socket_path()).unwrap();
    wait_for("the connection", || gpu.users() == 1);
    let started = Instant::now();
    gpu.set_placement(2, Some(PLACE_A));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450),
        "waited for the ACK: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "bounded: {took:?}");
    assert_eq!(gpu.users(), 0);
    drop(silent);

    let shm = SharedMemory::new("unsealed-test", 4096).unwrap();
    drop(shm);
    // SAFETY: memfd_create with a valid name.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(fd.try_clone().unwrap())
        .set_len(4096)
        .unwrap();
    let err = PeerRegistry::start(
        config(&dir, "bad"),
        DmaSpace::new(),
        vec![Export {
            bar: 2,
            fd,
            size: 4096,
        }],
    )
    .unwrap_err();
    assert!(err.to_string().contains("sealed"), "{err}");
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches a peer window placed over guest RAM (a peer that could
/// redirect our DMA away from memory the client gave us).
#[test]
fn a_placement_over_guest_ram_is_refused_and_dma_stays_on_ram() {
    let dir = temp_dir();
    let nvme_dma = DmaSpace::new();
    let ram = SharedMemory::new("ram", BAR_SIZE).unwrap();
    nvme_dma
        .map_fd(
            PLACE_A,
            BAR_SIZE,
            Perms::READ_WRITE,
            ram.as_fd().try_clone_to_owned().unwrap(),
            0,
        )
        .unwrap();
    let nvme = PeerRegistry::start(config(&dir, "nvme0"), nvme_dma.clone(), vec![]).unwrap();
    let (gpu, _vram) = owner(&dir, "gpu0");
    wait_for("the connection", || gpu.users() == 1);
    gpu.set_placement(2, Some(PLACE_A));
    assert_eq!(nvme_dma.classify(PLACE_A, 4096), DmaTarget::GuestMemory);
    assert_eq!(gpu.users(), 1, "a refused placement is still acknowledged");
    drop(nvme);
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

use std::os::fd::AsFd;

/// Memory whose writes block until released: an access in flight.
struct Gate {
    entered: Mutex<bool>,
    release: Mutex<bool>,
    cond: Condvar,
}

impl LocalMemory for Gate {
    fn size(&self) -> u64 {
        BAR_SIZE
    }
    fn read_at(&self, _: u64, _: &mut [u8]) -> Result<(), DmaError> {
        Ok(())
    }
    fn write_at(&self, _: u64, _: &[u8]) -> Result<(), DmaError> {
        *lock(&self.entered) = true;
        self.cond.notify_all();
        let mut released = lock(&self.release);
        while !*released {
            released = self.cond.wait(released).unwrap();
        }
        Ok(())
    }
}

/// Catches a window move that returns (so the owner would be told "done")
/// while an access through the old placement still runs.
#[test]
fn moving_a_peer_window_waits_for_the_access_in_flight() {
    let dma = DmaSpace::new();
    let gate = Arc::new(Gate {
        entered: Mutex::new(false),
        release: Mutex::new(false),
        cond: Condvar::new(),
    });
    let id = dma
        .add_peer_window(PLACE_A, BAR_SIZE, gate.clone(), 0)
        .unwrap();
    let writer = {
        let dma = dma.clone();
        std::thread::spawn(move || dma.write(PLACE_A, &[7u8; 64]))
    };
    wait_for("the access to start", || *lock(&gate.entered));
    let mover = {
        let dma = dma.clone();
        std::thread::spawn(move || dma.move_peer_window(id, PLACE_B))
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !mover.is_finished(),
        "the move waits for the access in flight"
    );
    assert_eq!(
        dma.classify(PLACE_A, 64),
        DmaTarget::Unmapped,
        "no new access at the old place"
    );
    *lock(&gate.release) = true;
    gate.cond.notify_all();
    writer.join().unwrap().unwrap();
    mover.join().unwrap().unwrap();
    assert_eq!(dma.peer_window(id), Some((PLACE_B, BAR_SIZE)));
    assert_eq!(dma.stats().peer.write_bytes, 64);
    assert!(dma.remove_peer_window(id).unwrap());
    assert!(
        !dma.remove_local_window(id),
        "peer windows are not local ones"
    );
}
