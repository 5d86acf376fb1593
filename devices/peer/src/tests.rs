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
    // Log lines of a failing test show with it (`RUST_LOG=debug` for more).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
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
        direct: DirectPeers::All,
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
    wait_for("the GPU to connect to the NVMe socket too", || {
        gpu.owners() == 1
    });

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

// ----- hostile and slow peers -----

use crate::memory::{counter_words, WritablePage, PAGE};
use crate::wire::VERSION;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;

fn frame_of(stream: &UnixStream) -> (Frame, Vec<OwnedFd>) {
    let (bytes, fds) = recv_frame(stream).unwrap();
    (Frame::decode(&bytes).unwrap(), fds)
}

/// Feeds one frame from `stream` to `session` and sends its answer.
fn pump(stream: &UnixStream, session: &mut UserSession) -> Frame {
    let (bytes, fds) = recv_frame(stream).unwrap();
    let reply = session.on_bytes(&bytes, fds).unwrap();
    if let Some(reply) = reply {
        send_frame(
            stream,
            &reply.frame,
            reply.fd.as_ref().map(|f| f.as_fd()),
            true,
        )
        .unwrap();
    }
    Frame::decode(&bytes).unwrap()
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o777
}

/// Catches an owner that panics (overflow checks are on in release) or
/// mis-counts on what a user writes into its counter page: values whose
/// sum wraps, counts that go backwards (that user is cut off and its
/// counts dropped; the honest user's stay exact). Also catches a
/// placement page that its user could map writable or write to.
#[test]
fn a_user_scribbling_its_counter_page_never_panics_or_miscounts_the_owner() {
    let dir = temp_dir();
    let (gpu, _vram) = owner(&dir, "gpu0");
    let nvme_dma = DmaSpace::new();
    let nvme = PeerRegistry::start(config(&dir, "nvme0"), nvme_dma.clone(), vec![]).unwrap();
    wait_for("the honest user", || gpu.users() == 1);
    gpu.set_placement(2, Some(PLACE_A));
    nvme_dma.write(PLACE_A, &[1u8; 4096]).unwrap();

    let hostile = UnixStream::connect(gpu.socket_path()).unwrap();
    let (hello, mut fds) = frame_of(&hostile);
    assert_eq!(hello, Frame::Hello { version: VERSION });
    let placements = fds.pop().unwrap();
    // SAFETY: a fresh mapping request the kernel refuses or places where
    // nothing else lives; unmapped below if it succeeded.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            placements.as_raw_fd(),
            0,
        )
    };
    let mmap_error = io::Error::last_os_error();
    if mapped != libc::MAP_FAILED {
        // SAFETY: the mapping just made.
        unsafe { libc::munmap(mapped, PAGE) };
    }
    assert_eq!(
        mapped,
        libc::MAP_FAILED,
        "the placement page is mapped writable"
    );
    assert_eq!(mmap_error.raw_os_error(), Some(libc::EPERM));
    let wrote = std::fs::File::from(placements.try_clone().unwrap()).write_at(&[1], 0);
    assert!(wrote.is_err(), "the placement page takes write(2)");

    let counters = WritablePage::create(c"hostile-counters").unwrap();
    send_frame(
        &hostile,
        &Frame::Counters { version: VERSION },
        Some(counters.fd().as_fd()),
        true,
    )
    .unwrap();
    assert!(matches!(frame_of(&hostile).0, Frame::Bar { bar: 2, .. }));
    let Frame::Place { seq, .. } = frame_of(&hostile).0 else {
        panic!("no PLACE")
    };
    send_frame(&hostile, &Frame::Ack { bar: 2, seq }, None, true).unwrap();
    // One placement round with both users: once it is acknowledged, the
    // owner has taken the counter page (sent before the ACKs).
    std::thread::scope(|s| {
        let placing = s.spawn(|| gpu.set_placement(2, Some(PLACE_B)));
        let Frame::Place { seq, .. } = frame_of(&hostile).0 else {
            panic!("no PLACE")
        };
        send_frame(&hostile, &Frame::Ack { bar: 2, seq }, None, true).unwrap();
        placing.join().unwrap();
    });
    assert_eq!(gpu.users(), 2);

    let (w, r) = counter_words(0);
    counters.store(w, u64::MAX - 100);
    counters.store(r, u64::MAX);
    assert_eq!(
        gpu.inbound(2),
        Inbound {
            written: u64::MAX,
            read: u64::MAX
        },
        "sums saturate, never wrap"
    );
    counters.store(w, 7);
    assert_eq!(
        gpu.inbound(2),
        Inbound {
            written: 4096,
            read: 0
        },
        "a count gone backwards: that user's counts are dropped"
    );
    wait_for("the liar to be cut off", || gpu.users() == 1);
    let mut byte = [0u8; 1];
    assert_eq!(
        (&hostile).read(&mut byte).unwrap(),
        0,
        "its connection closed"
    );
    drop(nvme);
    wait_for("the honest user to go", || gpu.users() == 0);
    assert_eq!(
        gpu.inbound(2),
        Inbound {
            written: 4096,
            read: 0
        }
    );
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches an owner whose placement change waits on a user that does not
/// answer for longer than `ack_timeout`, and a user's window that keeps
/// serving the old placement while its user is stuck (the owner revokes
/// it through the placement page at once): DMA must go by message or
/// fail, never into the BAR's memory at an address it left. Also catches
/// an owner that keeps a user it cut off.
#[test]
fn a_stuck_user_holds_a_placement_at_most_the_ack_timeout_and_its_window_stops_at_once() {
    let dir = temp_dir();
    let (gpu, vram) = owner(&dir, "gpu0");
    let stream = UnixStream::connect(gpu.socket_path()).unwrap();
    let dma = DmaSpace::new();
    let mut session = UserSession::new(dma.clone());
    assert!(matches!(pump(&stream, &mut session), Frame::Hello { .. }));
    assert!(matches!(pump(&stream, &mut session), Frame::Bar { .. }));
    assert!(matches!(pump(&stream, &mut session), Frame::Place { .. }));
    wait_for("the user", || gpu.users() == 1);

    std::thread::scope(|s| {
        let placing = s.spawn(|| gpu.set_placement(2, Some(PLACE_A)));
        assert!(matches!(pump(&stream, &mut session), Frame::Place { .. }));
        placing.join().unwrap();
    });
    dma.write(PLACE_A, b"first").unwrap();
    let mut seen = [0u8; 5];
    vram.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(&seen, b"first");

    // The user is stuck now (its reader never reads the next PLACE).
    let timeout = config(&dir, "x").ack_timeout;
    let took = std::thread::scope(|s| {
        let placing = s.spawn(|| {
            let started = Instant::now();
            gpu.set_placement(2, Some(PLACE_B));
            started.elapsed()
        });
        wait_for("the old window to stop serving", || {
            dma.classify(PLACE_A, 4096) == DmaTarget::Unmapped
        });
        assert!(!placing.is_finished(), "checked while the owner waits");
        assert!(dma.write(PLACE_A, b"stale").is_err());
        placing.join().unwrap()
    });
    assert!(took >= timeout, "waited for the ACK: {took:?}");
    assert!(
        took < timeout + Duration::from_millis(300),
        "bounded by the ACK timeout: {took:?}"
    );
    vram.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(&seen, b"first", "nothing landed in stale memory");
    assert_eq!(gpu.users(), 0, "cut off");
    dma.map_message_only(PLACE_A, BAR_SIZE, Perms::READ_WRITE)
        .unwrap();
    assert_eq!(
        dma.classify(PLACE_A, 4096),
        DmaTarget::MessageOnly,
        "DMA there goes by message"
    );
    // The user wakes up: it applies the PLACE it was sent, but the
    // owner revoked it, so the window serves nothing; then the connection
    // ends and the window goes.
    let (bytes, fds) = recv_frame(&stream).unwrap();
    assert!(matches!(Frame::decode(&bytes), Ok(Frame::Place { .. })));
    let ack = session.on_bytes(&bytes, fds).unwrap();
    assert!(ack.is_some_and(|a| send_frame(&stream, &a.frame, None, true).is_err()));
    assert_eq!(session.windows(), 1);
    assert_eq!(dma.classify(PLACE_B, 4096), DmaTarget::Unmapped);
    assert!(recv_frame(&stream).is_err(), "the owner closed it");
    session.close();
    assert_eq!(dma.peer_windows(), vec![]);
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The worst case a guest BAR write can see: every connection the cap
/// allows is held by a user that never answers. Catches an owner that
/// waits for them one after another (or longer than one ACK timeout in
/// all), blocks on a user that stopped reading, or keeps any of them.
#[test]
fn the_most_silent_users_cost_a_placement_one_ack_timeout() {
    let dir = temp_dir();
    let mut cfg = config(&dir, "gpu0");
    cfg.ack_timeout = DEFAULT_ACK_TIMEOUT;
    let fd = sealed_memfd(c"test-vram", BAR_SIZE).unwrap();
    let gpu = PeerRegistry::start(
        cfg,
        DmaSpace::new(),
        vec![Export {
            bar: 2,
            fd,
            size: BAR_SIZE,
        }],
    )
    .unwrap();
    let silent: Vec<UnixStream> = (0..MAX_PEERS)
        .map(|_| UnixStream::connect(gpu.socket_path()).unwrap())
        .collect();
    wait_for("every silent user", || gpu.users() == MAX_PEERS);
    let mut worst = Duration::ZERO;
    for (i, addr) in [Some(PLACE_A), None].into_iter().enumerate() {
        let started = Instant::now();
        gpu.set_placement(2, addr);
        let took = started.elapsed();
        worst = worst.max(took);
        eprintln!("placement {i} with {MAX_PEERS} silent users: {took:?}");
        if i == 0 {
            assert!(took >= DEFAULT_ACK_TIMEOUT, "{took:?}");
        }
    }
    assert!(
        worst < DEFAULT_ACK_TIMEOUT + Duration::from_millis(150),
        "one timeout for all of them: {worst:?}"
    );
    assert_eq!(gpu.users(), 0, "all cut off at the first placement");
    drop(silent);
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches an owner that blocks (for the socket's send timeout, or for
/// ever) when a user stopped reading: it must cut the user off at once.
/// Thousands of sends fill the socket, so one preempted on a loaded host
/// must not count as blocked: the bound is a second, and the socket's send
/// timeout two, so a send that waits fails the bound instead of hanging.
#[test]
fn sending_to_a_user_that_stopped_reading_fails_at_once() {
    let (ours, _theirs) = UnixStream::pair().unwrap();
    ours.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let frame = Frame::Ack { bar: 0, seq: 1 };
    let mut sent = 0usize;
    let err = loop {
        let started = Instant::now();
        let result = send_frame(&ours, &frame, None, false);
        assert!(started.elapsed() < Duration::from_secs(1), "blocked");
        match result {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 1_000_000, "the socket never filled up");
    };
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    assert!(sent > 0);
}

/// Catches a peer socket that is wider than 0600 at any moment (its
/// inode must have the mode before bind creates the file), a peer folder
/// left open to other users, an owner or user that does not check who is
/// at the other end (SO_PEERCRED), and an owner without a connection cap.
#[test]
fn the_peer_socket_is_private_from_bind_and_admits_only_allowed_peers_up_to_the_cap() {
    let dir = temp_dir();
    let peers = dir.join("peers");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&peers)
        .unwrap();
    std::fs::set_permissions(&peers, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cfg = config(&dir, "gpu0");
    cfg.max_peers = 2;
    let gpu = PeerRegistry::start(cfg, DmaSpace::new(), vec![]).unwrap();
    assert_eq!(mode_of(&peers), 0o700, "the folder is narrowed");
    assert_eq!(mode_of(&gpu.socket_path()), 0o600);
    let path = peers.join("probe.sock");
    let listener = bind(&path).unwrap();
    // SAFETY: `stat` is plain data, for which all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a valid stat struct on our listener's fd.
    assert_eq!(unsafe { libc::fstat(listener.as_raw_fd(), &mut st) }, 0);
    assert_eq!(
        st.st_mode & 0o777,
        0o600,
        "the socket's inode had the mode before bind"
    );
    assert_eq!(mode_of(&path), 0o600);
    drop(listener);

    let first = UnixStream::connect(gpu.socket_path()).unwrap();
    let second = UnixStream::connect(gpu.socket_path()).unwrap();
    assert!(matches!(frame_of(&first).0, Frame::Hello { .. }));
    assert!(matches!(frame_of(&second).0, Frame::Hello { .. }));
    let third = UnixStream::connect(gpu.socket_path()).unwrap();
    assert!(recv_frame(&third).is_err(), "refused: closed at once");
    assert_eq!(gpu.users(), 2);
    assert_eq!(gpu.refused_connections(), 1);
    drop((first, second, third));
    drop(gpu);

    // A registry that only admits another uid: our own connections are
    // refused both ways.
    let (owner_of_ours, _vram) = owner(&dir, "nvme0");
    let mut cfg = config(&dir, "strict");
    cfg.allowed_uids = vec![current_uid().wrapping_add(1)];
    let strict_dma = DmaSpace::new();
    let strict = PeerRegistry::start(cfg, strict_dma.clone(), vec![]).unwrap();
    let knock = UnixStream::connect(strict.socket_path()).unwrap();
    assert!(
        recv_frame(&knock).is_err(),
        "an unknown uid: closed at once"
    );
    wait_for("its scan to refuse our owner", || {
        strict.refused_connections() >= 2
    });
    assert_eq!(strict.users(), 0);
    assert_eq!(strict.owners(), 0);
    owner_of_ours.set_placement(2, Some(PLACE_A));
    assert_eq!(strict_dma.peer_windows(), vec![]);
    drop(strict);
    drop(owner_of_ours);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches a user that loses track of a window whose move timed out (an
/// access still copying into the old place): the window stayed at its
/// new place, served DMA into the dead owner's memory, and refused the
/// restarted owner's placement there (silent data loss).
#[test]
fn a_window_whose_move_times_out_is_removed_and_a_restarted_owner_is_placed() {
    let dir = temp_dir();
    let nvme_dma = DmaSpace::with_timeout(Duration::from_millis(100));
    let nvme = PeerRegistry::start(config(&dir, "nvme0"), nvme_dma.clone(), vec![]).unwrap();
    let (gpu, _old_vram) = owner(&dir, "gpu0");
    wait_for("the connection", || gpu.users() == 1);
    gpu.set_placement(2, Some(PLACE_A));
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let copying = {
        let dma = nvme_dma.clone();
        std::thread::spawn(move || {
            dma.with_slices(&[(PLACE_A, 16)], Access::Write, |_| {
                entered_tx.send(()).unwrap();
                let _ = release_rx.recv();
            })
        })
    };
    entered.recv().unwrap();
    gpu.set_placement(2, Some(PLACE_B));
    wait_for("the window to go", || nvme_dma.peer_windows().is_empty());
    release.send(()).unwrap();
    assert_eq!(copying.join().unwrap(), Ok(Some(())));
    drop(gpu);

    let (gpu, vram) = owner(&dir, "gpu0");
    wait_for("the reconnection", || {
        gpu.users() == 1 && nvme.owners() == 1
    });
    gpu.set_placement(2, Some(PLACE_B));
    nvme_dma.write(PLACE_B, b"to the new owner").unwrap();
    let mut seen = [0u8; 16];
    vram.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(&seen, b"to the new owner");
    drop(nvme);
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches a placed peer window that stays in front of guest RAM the
/// client maps over it afterwards (DMA meant for RAM would reach the
/// peer's BAR), and a user that never places the BAR again after that
/// (it must add the window anew at the owner's next placement).
#[test]
fn guest_ram_mapped_over_a_placed_window_wins_and_the_next_placement_comes_back() {
    let dir = temp_dir();
    let nvme_dma = DmaSpace::new();
    let nvme = PeerRegistry::start(config(&dir, "nvme0"), nvme_dma.clone(), vec![]).unwrap();
    let (gpu, vram) = owner(&dir, "gpu0");
    wait_for("the connection", || gpu.users() == 1);
    gpu.set_placement(2, Some(PLACE_A));
    assert!(matches!(
        nvme_dma.classify(PLACE_A, 4096),
        DmaTarget::Peer(_)
    ));
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
    assert_eq!(nvme_dma.classify(PLACE_A, 4096), DmaTarget::GuestMemory);
    nvme_dma.write(PLACE_A, b"ram").unwrap();
    let mut seen = [0u8; 3];
    ram.read_at(0, &mut seen).unwrap();
    assert_eq!(&seen, b"ram");
    vram.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(seen, [0; 3], "nothing reached the GPU");

    gpu.set_placement(2, Some(PLACE_B));
    assert!(matches!(
        nvme_dma.classify(PLACE_B, 4096),
        DmaTarget::Peer(_)
    ));
    nvme_dma.write(PLACE_B, b"gpu").unwrap();
    vram.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(&seen, b"gpu");
    assert_eq!(gpu.users(), 1, "the user stayed connected throughout");
    drop(nvme);
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches: a user that places a window for a peer its routing table says
/// is reached through the IOMMU (a DMA to that BAR's bus address would then
/// land in the peer, where real hardware sends it to the IOMMU, which
/// faults it), one that leaves such an owner's placements unacknowledged
/// (the owner's BAR write would wait out the ACK timeout and cut the user
/// off), and one that stops placing the peer it does reach directly.
#[test]
fn only_peers_the_routing_table_reaches_directly_get_a_window() {
    let dir = temp_dir();
    let (gpu, vram) = owner(&dir, "gpu0");
    let (cmb, _cmb_memory) = owner(&dir, "nvme1");
    let dma = DmaSpace::new();
    let mut routed = config(&dir, "nvme0");
    routed.direct = DirectPeers::parse("gpu0").unwrap();
    let nvme = PeerRegistry::start(routed, dma.clone(), vec![]).unwrap();
    wait_for("every connection", || {
        nvme.owners() == 2 && gpu.users() == 2 && cmb.users() == 2
    });

    let started = Instant::now();
    cmb.set_placement(2, Some(PLACE_B));
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "acknowledged at once, not waited out ({:?})",
        started.elapsed()
    );
    assert_eq!(cmb.users(), 2, "no user was cut off");
    gpu.set_placement(2, Some(PLACE_A));
    assert_eq!(dma.peer_windows(), vec![(PLACE_A, BAR_SIZE)]);
    assert!(matches!(dma.classify(PLACE_A, 4096), DmaTarget::Peer(_)));

    // The translated peer's bus address faults, as at the IOMMU.
    assert_eq!(dma.classify(PLACE_B, 4096), DmaTarget::Unmapped);
    assert!(matches!(
        dma.write(PLACE_B, &[1; 8]),
        Err(DmaError::Unmapped { .. })
    ));
    // The IOVA the guest maps for that BAR comes from QEMU without an fd:
    // served by message, never by a window.
    let iova = 0x7000_0000;
    dma.map_message_only(iova, 4096, Perms::READ_WRITE).unwrap();
    assert_eq!(dma.classify(iova, 4096), DmaTarget::MessageOnly);

    // The direct peer is served by its window, and moves are followed
    // for both (the translated one still acknowledges at once).
    dma.write(PLACE_A, &[7; 16]).unwrap();
    let mut seen = [0u8; 16];
    vram.read_exact_at(&mut seen, 0).unwrap();
    assert_eq!(seen, [7; 16]);
    let started = Instant::now();
    cmb.set_placement(2, Some(PLACE_B + BAR_SIZE));
    assert!(started.elapsed() < Duration::from_millis(400));
    assert_eq!(cmb.users(), 2);
    gpu.set_placement(2, Some(PLACE_A + BAR_SIZE));
    assert_eq!(dma.peer_windows(), vec![(PLACE_A + BAR_SIZE, BAR_SIZE)]);
    assert_eq!(cmb.inbound(2), Inbound::default());
    assert_eq!(gpu.inbound(2).written, 16);
    drop(nvme);
    drop(cmb);
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Catches a registry whose `holes_changing` does not reach its users'
/// placement pages (a user would then read a zero-filled VRAM range
/// through its mapping and allocate it again in the owner's memfd), or a
/// user whose reads of known pages stop going through the mapping.
#[test]
fn a_punch_announced_by_the_owner_keeps_its_holes_unallocated_at_the_user() {
    use std::os::unix::fs::MetadataExt;
    let dir = temp_dir();
    let (gpu, vram) = owner(&dir, "gpu0");
    let efa_dma = DmaSpace::new();
    let efa = PeerRegistry::start(config(&dir, "efa0"), efa_dma.clone(), vec![]).unwrap();
    wait_for("the connection", || gpu.users() == 1 && efa.owners() == 1);
    gpu.set_placement(2, Some(PLACE_A));
    assert!(matches!(
        efa_dma.classify(PLACE_A, BAR_SIZE),
        DmaTarget::Peer(_)
    ));

    let data: Vec<u8> = (0..BAR_SIZE as u32).map(|i| (i % 253) as u8).collect();
    vram.write_all_at(&data, 0).unwrap();
    let mut seen = vec![0u8; 8192];
    for at in (0..BAR_SIZE).step_by(8192) {
        efa_dma.read(PLACE_A + at, &mut seen).unwrap();
        assert_eq!(seen, data[at as usize..at as usize + 8192]);
    }

    gpu.holes_changing(2);
    // SAFETY: fallocate on the owner's memfd, inside its size.
    let rc = unsafe {
        libc::fallocate(
            vram.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            BAR_SIZE as libc::off_t,
        )
    };
    assert_eq!(rc, 0);
    gpu.holes_changing(2);
    for at in (0..BAR_SIZE).step_by(8192) {
        efa_dma.read(PLACE_A + at, &mut seen).unwrap();
        assert_eq!(seen, [0u8; 8192]);
    }
    assert_eq!(
        vram.metadata().unwrap().blocks(),
        0,
        "the user's reads allocated punched pages"
    );
    assert_eq!(efa_dma.stats().peer.read_bytes, 2 * BAR_SIZE);
    assert_eq!(
        gpu.inbound(2),
        Inbound {
            written: 0,
            read: 2 * BAR_SIZE
        }
    );
}
