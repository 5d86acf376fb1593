//! Peer registry: p2plab servers of one run share their BAR memory with
//! each other, so that a device DMAing into another p2plab device's BAR
//! (GPU VRAM, an NVMe CMB) writes straight into that device's memfd
//! instead of sending DMA_WRITE messages through QEMU.
//!
//! Every server listens on `<run>/peers/<id>.sock` (mode 0600 from bind,
//! in a 0700 folder; peers checked with SO_PEERCRED, at most
//! [`MAX_PEERS`]) and connects to every other socket there (rescanning
//! the folder, so servers started later or restarted are found). On each
//! connection the listening side is the **owner**: it sends its placement
//! page, each memory BAR it exports (sealed memfd, size), then every
//! change of the BAR's placement. The connecting side is the **user**: it
//! checks what it gets, answers with its counter page, and keeps a peer
//! window in its [`DmaSpace`] at the owner's bus address, if its DMA
//! reaches that address (its routing table, [`PeerConfig::direct`]: under
//! an IOMMU only peers below the same switch without ACS redirect are
//! reached there; see [`route`]).
//!
//! The rules that keep DMA off stale placements: the owner learns of a
//! BAR change from the guest's config write, before QEMU changes its
//! memory map. [`PeerRegistry::set_placement`] first writes the new
//! placement into each user's placement page (from then on no new access
//! goes through the old window: the window checks the page on every
//! access), then sends the PLACE and waits, at most
//! [`PeerConfig::ack_timeout`], until the user acknowledged it, which it
//! does once the accesses already running through the old window have
//! ended. A user that does not answer in time is cut off (its page says
//! [`memory::REVOKED`], its connection is closed), so the guest's config
//! write never waits longer than that. A closed connection (peer exit,
//! crash, restart) removes the owner's windows at the user.
//!
//! This crate knows no device: a server hands it fds, sizes and
//! placements.

#![deny(missing_docs)]

pub mod memory;
pub mod route;
pub mod session;
pub mod wire;

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use p2plab_ratelimit::log_limited;
use p2plab_vfio_user::server::{bind_replacing_stale, current_uid, peer_uid};
use p2plab_vfio_user::{recv_with_fds, DmaSpace};
use tracing::{debug, info, warn};

pub use memory::{sealed_memfd, verify_shared_fd, CopyPaths, PeerMemory};
pub use route::{DirectPeers, Route};
pub use session::{Reply, SessionError, UserLink, UserSession};
pub use wire::{BadFrame, Frame, FRAME, MAX_BAR};

/// How long a placement change waits for a user's acknowledgement by
/// default: the longest a guest's BAR write can be held by a silent or
/// slow peer. A user acknowledges within microseconds unless a DMA
/// through the old window is still copying.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_millis(100);
/// Most peer connections a server keeps each way (users of its socket,
/// owners it connects to); a lab has a handful of servers.
pub const MAX_PEERS: usize = 64;

/// Where and how a registry runs.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The folder of peer sockets (`<run>/peers`); created 0700 if
    /// missing, made 0700 if it is ours and wider.
    pub dir: PathBuf,
    /// This server's name there (`<id>.sock`).
    pub id: String,
    /// How long a placement change waits for each user's acknowledgement
    /// before it cuts that user off.
    pub ack_timeout: Duration,
    /// How often the folder is rescanned for new peers.
    pub rescan: Duration,
    /// Most users served and owners connected to at once; more are
    /// refused with a log line.
    pub max_peers: usize,
    /// The uids a peer may run as (SO_PEERCRED, both ways). Servers of
    /// one run share one uid: the folder is 0700, so no other uid can
    /// reach a socket in it anyway.
    pub allowed_uids: Vec<u32>,
    /// The peers whose BARs our DMA reaches at their bus addresses: we
    /// place windows on those only (see [`route`]).
    pub direct: DirectPeers,
}

impl PeerConfig {
    /// The registry of the server listening on `vfio_socket`: folder
    /// `peers` beside it, named after the socket's file stem.
    pub fn beside(vfio_socket: &Path) -> Self {
        let dir = vfio_socket
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join("peers");
        let id = vfio_socket
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "server".into());
        Self {
            dir,
            id,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            rescan: Duration::from_millis(200),
            max_peers: MAX_PEERS,
            allowed_uids: vec![current_uid()],
            direct: DirectPeers::All,
        }
    }

    fn socket_path(&self) -> PathBuf {
        self.dir.join(format!("{}.sock", self.id))
    }
}

/// A memory BAR this server shares with its peers.
#[derive(Debug)]
pub struct Export {
    /// BAR index (0..=5).
    pub bar: u8,
    /// The BAR's memory: a memfd sealed against resizing.
    pub fd: OwnedFd,
    /// Its size in bytes.
    pub size: u64,
}

/// Bytes peers moved into and out of one exported BAR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inbound {
    /// Bytes peers wrote into the BAR's memory.
    pub written: u64,
    /// Bytes peers read from it.
    pub read: u64,
}

/// Counts summed without overflow (each user's may be anything).
#[derive(Debug, Clone, Copy, Default)]
struct Total {
    written: u128,
    read: u128,
}

impl Total {
    fn add(&mut self, i: Inbound) {
        self.written += u128::from(i.written);
        self.read += u128::from(i.read);
    }
    fn saturated(self) -> Inbound {
        Inbound {
            written: u64::try_from(self.written).unwrap_or(u64::MAX),
            read: u64::try_from(self.read).unwrap_or(u64::MAX),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ----- sockets -----

/// Sends one frame (and `fd`) in one sendmsg. `wait`: block (up to the
/// socket's send timeout); else fail at once when the socket has no room,
/// which only a peer that stopped reading causes. A frame sent in part
/// is an error too (the connection is then cut).
fn send_frame(
    stream: &UnixStream,
    frame: &Frame,
    fd: Option<BorrowedFd<'_>>,
    wait: bool,
) -> io::Result<()> {
    let bytes = frame.encode();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    #[repr(C, align(8))]
    struct Control([u8; 32]);
    let mut control = Control([0; 32]);
    // SAFETY: msghdr is a plain C struct; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let raw = fd.as_raw_fd();
        let fd_bytes = std::mem::size_of_val(&raw) as u32;
        // SAFETY: CMSG_SPACE(4) = 24 <= 32 bytes of `control`, which is
        // aligned for cmsghdr; CMSG_FIRSTHDR points at its start and
        // CMSG_DATA inside it with room for one fd.
        unsafe {
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(fd_bytes) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), raw);
        }
    }
    let flags = libc::MSG_NOSIGNAL | if wait { 0 } else { libc::MSG_DONTWAIT };
    loop {
        // SAFETY: `msg` points at `iov` (over `bytes`) and `control`, all
        // alive for the call.
        let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, flags) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n as usize != FRAME {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("{n} of {FRAME} bytes sent: the peer stopped reading"),
            ));
        }
        return Ok(());
    }
}

/// Receives one frame and the fds that came with it (at most one; more
/// is an error, the extra ones closed).
fn recv_frame(stream: &UnixStream) -> io::Result<([u8; FRAME], Vec<OwnedFd>)> {
    let mut buf = [0u8; FRAME];
    let mut fds = Vec::new();
    let got = recv_with_fds(stream, &mut buf, &mut fds, 1)?;
    if got.bytes == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed"));
    }
    if got.fds_truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more than one fd with a frame",
        ));
    }
    if got.bytes < FRAME {
        // A frame split by the stream: its fd came with its first byte
        // (any sent with the rest is closed by the kernel).
        (&*stream).read_exact(&mut buf[got.bytes..])?;
    }
    Ok((buf, fds))
}

/// Makes `dir` a folder only we can enter: created 0700, or, if it
/// exists, ours and then narrowed to 0700 (a peer socket must never be
/// reachable by another uid, not even between its bind and a chmod).
fn prepare_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    let meta = handle.metadata()?;
    if !meta.is_dir() || meta.uid() != current_uid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of ours", dir.display()),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        // SAFETY: fchmod on the directory we just opened (not a path that
        // could be swapped for a symlink meanwhile).
        if unsafe { libc::fchmod(handle.as_raw_fd(), 0o700) } != 0 {
            return Err(io::Error::last_os_error());
        }
        info!(dir = %dir.display(), mode = format!("{:o}", meta.mode() & 0o777), "peer folder narrowed to 0700");
    }
    Ok(())
}

/// Listens at `path`, 0600 from the bind on (the socket's inode gets the
/// mode before bind creates the file).
fn bind(path: &Path) -> io::Result<UnixListener> {
    let listener = bind_replacing_stale(path, 0o600)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

// ----- the registry -----

struct OwnedBar {
    bar: u32,
    fd: OwnedFd,
    size: u64,
    addr: Option<u64>,
    slot: u64,
}

/// One user connected to our socket.
struct OwnerConn {
    stream: UnixStream,
    link: UserLink,
}

impl OwnerConn {
    /// Cuts the user off: its windows stop serving at once (placement
    /// page), the connection closes (so it drops them).
    fn kill(&self) {
        self.link.revoke();
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

#[derive(Default)]
struct OwnerState {
    bars: Vec<OwnedBar>,
    conns: Vec<Arc<OwnerConn>>,
    seq: u64,
    /// Placement changes pushed so far.
    changes: u64,
    /// Counts of connections gone, per slot.
    retired: [Total; memory::SLOTS as usize],
}

impl OwnerState {
    /// Drops `conn` from the list, keeping its counts.
    fn retire(&mut self, conn: &Arc<OwnerConn>) {
        let before = self.conns.len();
        self.conns.retain(|c| !Arc::ptr_eq(c, conn));
        if self.conns.len() != before {
            for bar in &self.bars {
                let counts = conn.link.counts(bar.slot);
                if let Some(t) = self.retired.get_mut(bar.slot as usize) {
                    t.add(counts);
                }
            }
        }
    }
}

struct Shared {
    config: PeerConfig,
    dma: DmaSpace,
    stop: AtomicBool,
    owner: Mutex<OwnerState>,
    /// Owners we are connected to, by socket path (a clone of the stream,
    /// to shut it down on exit).
    users: Mutex<HashMap<PathBuf, UnixStream>>,
    readers: Mutex<Vec<JoinHandle<()>>>,
    /// Connections refused either way (uid, cap).
    refused: AtomicU64,
}

/// A running registry. Dropping it closes every connection (peers then
/// drop our windows and we drop theirs) and removes the socket.
pub struct PeerRegistry {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for PeerRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerRegistry")
            .field("socket", &self.shared.config.socket_path())
            .finish()
    }
}

impl PeerRegistry {
    /// Listens on `<dir>/<id>.sock` exporting `exports`, and connects to
    /// every other server's socket there, placing their BARs as peer
    /// windows in `dma`. Every export starts "not decoding".
    pub fn start(config: PeerConfig, dma: DmaSpace, exports: Vec<Export>) -> io::Result<Self> {
        if config.max_peers == 0 || config.ack_timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a peer registry needs room for a peer and time for an ACK",
            ));
        }
        prepare_dir(&config.dir)?;
        let mut owner = OwnerState::default();
        for (slot, e) in exports.into_iter().enumerate() {
            if u32::from(e.bar) > MAX_BAR || owner.bars.iter().any(|b| b.bar == u32::from(e.bar)) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("BAR {} exported twice or out of range", e.bar),
                ));
            }
            verify_shared_fd(&e.fd, e.size).map_err(|why| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("BAR {}: {why}", e.bar))
            })?;
            owner.bars.push(OwnedBar {
                bar: u32::from(e.bar),
                fd: e.fd,
                size: e.size,
                addr: None,
                slot: slot as u64,
            });
        }
        let listener = bind(&config.socket_path())?;
        info!(socket = %config.socket_path().display(), bars = owner.bars.len(), "peer registry listening");
        let shared = Arc::new(Shared {
            config,
            dma,
            stop: AtomicBool::new(false),
            owner: Mutex::new(owner),
            users: Mutex::new(HashMap::new()),
            readers: Mutex::new(Vec::new()),
            refused: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        let s = Arc::clone(&shared);
        threads.push(
            std::thread::Builder::new()
                .name("peer-accept".into())
                .spawn(move || accept_loop(&s, &listener))?,
        );
        let s = Arc::clone(&shared);
        threads.push(
            std::thread::Builder::new()
                .name("peer-scan".into())
                .spawn(move || scan_loop(&s))?,
        );
        Ok(Self {
            shared,
            threads: Mutex::new(threads),
        })
    }

    /// The socket peers connect to.
    pub fn socket_path(&self) -> PathBuf {
        self.shared.config.socket_path()
    }

    /// BAR `bar` now decodes at `addr` (None: memory decode off, BAR
    /// unassigned, reset). Call it from the config-space write, before the
    /// write completes. From the moment it starts, no user's window serves
    /// a new access at the old placement; it returns once every user
    /// acknowledged (the accesses already running through the old window
    /// have ended), or after [`PeerConfig::ack_timeout`] at the latest,
    /// cutting off the users that did not answer.
    pub fn set_placement(&self, bar: u8, addr: Option<u64>) {
        let started = Instant::now();
        let mut owner = lock(&self.shared.owner);
        let Some(index) = owner.bars.iter().position(|b| b.bar == u32::from(bar)) else {
            return;
        };
        if owner.bars[index].addr == addr {
            return;
        }
        owner.bars[index].addr = addr;
        let slot = owner.bars[index].slot;
        owner.changes += 1;
        owner.seq += 1;
        let seq = owner.seq;
        let frame = Frame::Place {
            bar: u32::from(bar),
            seq,
            addr,
        };
        let conns: Vec<Arc<OwnerConn>> = owner.conns.clone();
        for conn in &conns {
            conn.link.publish(u32::from(bar), slot, seq);
            if let Err(e) = send_frame(&conn.stream, &frame, None, false) {
                if !conn.link.is_dead() {
                    log_limited!(warn, bar, "peer user cut off: cannot send a placement: {e}");
                }
                conn.kill();
            }
        }
        let deadline = Instant::now() + self.shared.config.ack_timeout;
        for conn in &conns {
            if !conn.link.wait_ack(u32::from(bar), seq, deadline) {
                if !conn.link.is_dead() {
                    log_limited!(
                        warn,
                        bar,
                        timeout_ms = self.shared.config.ack_timeout.as_millis() as u64,
                        "a peer user did not acknowledge a BAR placement in time: cut off"
                    );
                }
                conn.kill();
                owner.retire(conn);
            }
        }
        debug!(
            bar,
            ?addr,
            users = owner.conns.len(),
            took_us = started.elapsed().as_micros() as u64,
            "BAR placement pushed to peers"
        );
    }

    /// Holes are being punched into exported BAR `bar`'s memory (a zero
    /// fill giving pages back): every user forgets which of the BAR's
    /// pages it knew to be in memory, so none reads a fresh hole through
    /// its mapping (which would allocate it again). Call it right before
    /// the punch and again right after it: the first call stops the
    /// accesses that start during the punch from trusting what was known
    /// before it, the second one discards what they learnt while the
    /// punch ran (a lookup may see a page the punch frees a moment
    /// later). It waits for no user: an access already running costs at
    /// most the pages it touches (zeros, never wrong data); it only waits
    /// for a placement change in progress to end (at most the ack
    /// timeout), whose lock it takes.
    pub fn holes_changing(&self, bar: u8) {
        let owner = lock(&self.shared.owner);
        let Some(b) = owner.bars.iter().find(|b| b.bar == u32::from(bar)) else {
            return;
        };
        for conn in &owner.conns {
            conn.link.holes_changing(b.slot);
        }
    }

    /// Bytes peers moved into and out of exported BAR `bar`, as they
    /// counted them (a user whose counts go backwards is cut off; sums
    /// saturate instead of wrapping).
    pub fn inbound(&self, bar: u8) -> Inbound {
        let owner = lock(&self.shared.owner);
        let Some(b) = owner.bars.iter().find(|b| b.bar == u32::from(bar)) else {
            return Inbound::default();
        };
        let mut total = owner
            .retired
            .get(b.slot as usize)
            .copied()
            .unwrap_or_default();
        for conn in &owner.conns {
            total.add(conn.link.counts(b.slot));
            if conn.link.is_dead() {
                conn.kill();
            }
        }
        total.saturated()
    }

    /// Placement changes pushed so far (each BAR move, decode on or off,
    /// reset).
    pub fn placement_changes(&self) -> u64 {
        lock(&self.shared.owner).changes
    }

    /// Users connected to our socket right now.
    pub fn users(&self) -> usize {
        lock(&self.shared.owner)
            .conns
            .iter()
            .filter(|c| !c.link.is_dead())
            .count()
    }

    /// Owners we are connected to right now.
    pub fn owners(&self) -> usize {
        lock(&self.shared.users).len()
    }

    /// Peer connections refused so far, either way (a uid not allowed,
    /// the cap reached).
    pub fn refused_connections(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Closes every connection (peers drop their windows on our memory,
    /// we drop ours on theirs) and removes the socket. Dropping the
    /// registry does the same; a server calls this on its way out, where
    /// clones of the registry may still be held.
    pub fn close(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        {
            // Keep what the users counted: the final stats come after this.
            let mut owner = lock(&self.shared.owner);
            for c in owner.conns.clone() {
                c.kill();
                owner.retire(&c);
            }
        }
        for stream in lock(&self.shared.users).values() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let readers = std::mem::take(&mut *lock(&self.shared.readers));
        for r in readers {
            let _ = r.join();
        }
        let path = self.shared.config.socket_path();
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

impl Drop for PeerRegistry {
    fn drop(&mut self) {
        self.close();
    }
}

fn spawn_reader(shared: &Arc<Shared>, name: &str, f: impl FnOnce() + Send + 'static) {
    match std::thread::Builder::new().name(name.into()).spawn(f) {
        Ok(h) => {
            let mut readers = lock(&shared.readers);
            // Threads of connections gone have ended: forget them.
            readers.retain(|r| !r.is_finished());
            readers.push(h);
        }
        Err(e) => warn!("cannot start a peer thread: {e}"),
    }
}

/// Whether the process at the other end of `stream` may be our peer;
/// logs (rate-limited) and counts a refusal.
fn admit(shared: &Shared, stream: &UnixStream, side: &str) -> bool {
    match peer_uid(stream) {
        Ok(uid) if shared.config.allowed_uids.contains(&uid) => true,
        Ok(uid) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            log_limited!(
                warn,
                uid,
                side,
                "peer connection refused: uid {uid} is not allowed"
            );
            false
        }
        Err(e) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            log_limited!(warn, side, "peer connection refused: SO_PEERCRED: {e}");
            false
        }
    }
}

// ----- owner side -----

fn accept_loop(shared: &Arc<Shared>, listener: &UnixListener) {
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                if !admit(shared, &stream, "user") {
                    continue;
                }
                let serving = lock(&shared.owner).conns.len();
                if serving >= shared.config.max_peers {
                    shared.refused.fetch_add(1, Ordering::Relaxed);
                    log_limited!(
                        warn,
                        serving,
                        "peer connection refused: already serving {serving} peer users (the most allowed)"
                    );
                    continue;
                }
                if let Err(e) = welcome(shared, stream) {
                    log_limited!(warn, "peer user dropped at once: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                log_limited!(warn, "peer accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Sends a new user our placement page, our BARs and their current
/// placement, then reads its frames until it goes away. Nothing here
/// waits on the user: every send fails at once if it does not read.
fn welcome(shared: &Arc<Shared>, stream: UnixStream) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let conn = Arc::new(OwnerConn {
        stream,
        link: UserLink::new()?,
    });
    {
        let mut owner = lock(&shared.owner);
        owner.seq += 1;
        let seq = owner.seq;
        let link = &conn.link;
        send_frame(
            &conn.stream,
            &link.hello(),
            Some(link.placement_fd().as_fd()),
            false,
        )?;
        for b in &owner.bars {
            let frame = Frame::Bar {
                bar: b.bar,
                size: b.size,
                slot: b.slot,
            };
            send_frame(&conn.stream, &frame, Some(b.fd.as_fd()), false)?;
            link.publish(b.bar, b.slot, seq);
            let place = Frame::Place {
                bar: b.bar,
                seq,
                addr: b.addr,
            };
            send_frame(&conn.stream, &place, None, false)?;
        }
        owner.conns.push(Arc::clone(&conn));
    }
    debug!("peer user connected");
    let s = Arc::clone(shared);
    spawn_reader(shared, "peer-owner", move || {
        let end = loop {
            let (bytes, fds) = match recv_frame(&conn.stream) {
                Ok(got) => got,
                Err(e) => break e.to_string(),
            };
            if let Err(e) = conn.link.on_bytes(&bytes, fds) {
                break e.to_string();
            }
        };
        if !conn.link.is_dead() && !s.stop.load(Ordering::Acquire) {
            debug!("peer user gone: {end}");
        }
        conn.kill();
        lock(&s.owner).retire(&conn);
    });
    Ok(())
}

// ----- user side -----

fn scan_loop(shared: &Arc<Shared>) {
    let own = shared.config.socket_path();
    while !shared.stop.load(Ordering::Acquire) {
        if let Ok(entries) = std::fs::read_dir(&shared.config.dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path == own || path.extension().is_none_or(|e| e != "sock") {
                    continue;
                }
                // Never follow a symlink planted in the folder.
                if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
                    continue;
                }
                let connected = {
                    let users = lock(&shared.users);
                    if users.contains_key(&path) {
                        continue;
                    }
                    users.len()
                };
                if connected >= shared.config.max_peers {
                    shared.refused.fetch_add(1, Ordering::Relaxed);
                    log_limited!(
                        warn,
                        peer = %path.display(),
                        "not connecting to a peer: already connected to {connected} (the most allowed)"
                    );
                    continue;
                }
                connect(shared, path);
            }
        }
        std::thread::sleep(shared.config.rescan);
    }
}

fn connect(shared: &Arc<Shared>, path: PathBuf) {
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            debug!(peer = %path.display(), "peer socket not answering: {e}");
            return;
        }
    };
    if !admit(shared, &stream, "owner") {
        return;
    }
    // Our answers are tiny; an owner that stops reading them only stalls
    // this connection's thread, for this long per frame.
    if stream
        .set_write_timeout(Some(shared.config.ack_timeout))
        .is_err()
    {
        return;
    }
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    lock(&shared.users).insert(path.clone(), clone);
    let owner_id = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let route = shared.config.direct.route_to(&owner_id);
    info!(peer = %path.display(), ?route, "connected to peer");
    let s = Arc::clone(shared);
    spawn_reader(shared, "peer-user", move || {
        let mut session = UserSession::with_route(s.dma.clone(), route);
        let end = loop {
            let (bytes, fds) = match recv_frame(&stream) {
                Ok(got) => got,
                Err(e) => break e.to_string(),
            };
            match session.on_bytes(&bytes, fds) {
                Ok(Some(reply)) => {
                    let fd = reply.fd.as_ref().map(|f| f.as_fd());
                    if let Err(e) = send_frame(&stream, &reply.frame, fd, true) {
                        break e.to_string();
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    log_limited!(warn, peer = %path.display(), "{e}: disconnected");
                    break e.to_string();
                }
            }
        };
        if !s.stop.load(Ordering::Acquire) {
            info!(peer = %path.display(), "peer connection ended: {end}");
        }
        session.close();
        let _ = stream.shutdown(std::net::Shutdown::Both);
        lock(&s.users).remove(&path);
    });
}

#[cfg(test)]
mod residency_tests;
#[cfg(test)]
mod tests;
