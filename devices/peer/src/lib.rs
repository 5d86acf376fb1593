//! Peer registry: p2plab servers of one run share their BAR memory with
//! each other, so that a device DMAing into another p2plab device's BAR
//! (GPU VRAM, an NVMe CMB) writes straight into that device's memfd
//! instead of sending DMA_WRITE messages through QEMU.
//!
//! Every server listens on `<run>/peers/<id>.sock` (mode 0600 in a 0700
//! folder) and connects to every other socket there (rescanning the
//! folder, so servers started later or restarted are found). On each
//! connection the listening side is the **owner**: it sends each memory
//! BAR it exports (sealed memfd and a shared counter page by SCM_RIGHTS,
//! size), then every change of the BAR's placement. The connecting side is
//! the **user**: it checks what it gets and keeps a peer window in its
//! [`DmaSpace`] at the owner's bus address.
//!
//! The rule that keeps DMA off stale placements: the owner learns of a
//! BAR change from the guest's config write, before QEMU changes its
//! memory map, and [`PeerRegistry::set_placement`] does not return (so the
//! config write does not complete) until every user has acknowledged it.
//! A user acknowledges only once no access runs through the old window.
//! A user that does not answer in time is disconnected and so loses the
//! window. A closed connection (peer exit, crash, restart) removes the
//! owner's windows at the user.
//!
//! This crate knows no device: a server hands it fds, sizes and
//! placements.

#![deny(missing_docs)]

mod memory;
pub mod wire;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use p2plab_vfio_user::{DmaError, DmaSpace, LocalWindowId};
use tracing::{debug, info, warn};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub use memory::{sealed_memfd, verify_shared_fd, CounterPage, PeerMemory};
pub use wire::{BadFrame, Frame, FRAME, MAX_BAR};

/// Where and how a registry runs.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The folder of peer sockets (`<run>/peers`); created 0700 if missing.
    pub dir: PathBuf,
    /// This server's name there (`<id>.sock`).
    pub id: String,
    /// How long a placement change waits for each user's acknowledgement.
    pub ack_timeout: Duration,
    /// How often the folder is rescanned for new peers.
    pub rescan: Duration,
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
            ack_timeout: Duration::from_secs(2),
            rescan: Duration::from_millis(200),
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

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
    counters: CounterPage,
    /// Highest acknowledged PLACE sequence per BAR index.
    acked: Mutex<[u64; 6]>,
    changed: Condvar,
    dead: AtomicBool,
}

impl OwnerConn {
    fn kill(&self) {
        self.dead.store(true, Ordering::Release);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.changed.notify_all();
    }

    /// Waits for ACK `seq` of `bar` until `deadline`; false if the user
    /// died or was too slow.
    fn wait_ack(&self, bar: u32, seq: u64, deadline: Instant) -> bool {
        let mut acked = lock(&self.acked);
        loop {
            if acked.get(bar as usize).is_some_and(|&a| a >= seq) {
                return true;
            }
            let now = Instant::now();
            if self.dead.load(Ordering::Acquire) || now >= deadline {
                return false;
            }
            acked = self
                .changed
                .wait_timeout(acked, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
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
    retired: [Inbound; 6],
}

impl OwnerState {
    /// Drops `conn` from the list, keeping its counts.
    fn retire(&mut self, conn: &Arc<OwnerConn>) {
        let before = self.conns.len();
        self.conns.retain(|c| !Arc::ptr_eq(c, conn));
        if self.conns.len() != before {
            for bar in &self.bars {
                let (w, r) = conn.counters.get(bar.slot);
                if let Some(t) = self.retired.get_mut(bar.slot as usize) {
                    t.written += w;
                    t.read += r;
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

fn prepare_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no side effects.
    let uid = unsafe { libc::geteuid() };
    if !meta.file_type().is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory of ours that only we can write to",
                dir.display()
            ),
        ));
    }
    Ok(())
}

fn bind(path: &Path) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

impl PeerRegistry {
    /// Listens on `<dir>/<id>.sock` exporting `exports`, and connects to
    /// every other server's socket there, placing their BARs as peer
    /// windows in `dma`. Every export starts "not decoding".
    pub fn start(config: PeerConfig, dma: DmaSpace, exports: Vec<Export>) -> io::Result<Self> {
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
    /// unassigned, reset). Returns once every connected user has applied
    /// it (no access through the old placement runs any more); users that
    /// do not acknowledge within the timeout are disconnected. Call it
    /// from the config-space write, before the write completes.
    pub fn set_placement(&self, bar: u8, addr: Option<u64>) {
        let mut owner = lock(&self.shared.owner);
        let Some(index) = owner.bars.iter().position(|b| b.bar == u32::from(bar)) else {
            return;
        };
        if owner.bars[index].addr == addr {
            return;
        }
        owner.bars[index].addr = addr;
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
            if (&conn.stream).write_all(&frame.encode()).is_err() {
                conn.kill();
            }
        }
        let deadline = Instant::now() + self.shared.config.ack_timeout;
        for conn in &conns {
            if !conn.wait_ack(u32::from(bar), seq, deadline) {
                if !conn.dead.load(Ordering::Acquire) {
                    warn!(
                        bar,
                        "a peer did not acknowledge a BAR placement in time: disconnected"
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
            "BAR placement pushed to peers"
        );
    }

    /// Bytes peers moved into and out of exported BAR `bar`.
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
            let (w, r) = conn.counters.get(b.slot);
            total.written += w;
            total.read += r;
        }
        total
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
            .filter(|c| !c.dead.load(Ordering::Acquire))
            .count()
    }

    /// Owners we are connected to right now.
    pub fn owners(&self) -> usize {
        lock(&self.shared.users).len()
    }
}

impl PeerRegistry {
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

// ----- owner side -----

fn accept_loop(shared: &Arc<Shared>, listener: &UnixListener) {
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = welcome(shared, stream) {
                    warn!("peer connection refused: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                warn!("peer accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Sends a new user our BARs and their current placement, then reads its
/// acknowledgements until it goes away.
fn welcome(shared: &Arc<Shared>, stream: UnixStream) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    // A user that stops reading cannot hold a config write (and the owner
    // lock) longer than an ACK may take.
    stream.set_write_timeout(Some(shared.config.ack_timeout))?;
    let conn = Arc::new(OwnerConn {
        stream,
        counters: CounterPage::create()?,
        acked: Mutex::new([0; 6]),
        changed: Condvar::new(),
        dead: AtomicBool::new(false),
    });
    {
        let mut owner = lock(&shared.owner);
        owner.seq += 1;
        let seq = owner.seq;
        for b in &owner.bars {
            let frame = Frame::Bar {
                bar: b.bar,
                size: b.size,
                slot: b.slot,
            };
            let fds: [RawFd; 2] = [b.fd.as_raw_fd(), conn.counters.fd().as_raw_fd()];
            let sent = conn.stream.send_with_fds(&[&frame.encode()[..]], &fds)?;
            if sent != FRAME {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
            }
            let place = Frame::Place {
                bar: b.bar,
                seq,
                addr: b.addr,
            };
            (&conn.stream).write_all(&place.encode())?;
        }
        owner.conns.push(Arc::clone(&conn));
    }
    debug!("peer user connected");
    let s = Arc::clone(shared);
    spawn_reader(shared, "peer-owner", move || {
        read_acks(&conn);
        conn.kill();
        lock(&s.owner).retire(&conn);
        debug!("peer user gone");
    });
    Ok(())
}

fn read_acks(conn: &OwnerConn) {
    let mut buf = [0u8; FRAME];
    loop {
        if (&conn.stream).read_exact(&mut buf).is_err() {
            return;
        }
        match Frame::decode(&buf) {
            Ok(Frame::Ack { bar, seq }) => {
                let mut acked = lock(&conn.acked);
                if let Some(a) = acked.get_mut(bar as usize) {
                    *a = (*a).max(seq);
                }
                drop(acked);
                conn.changed.notify_all();
            }
            Ok(other) => {
                warn!(
                    ?other,
                    "peer user sent something else than an ACK: disconnected"
                );
                return;
            }
            Err(e) => {
                warn!("{e}: disconnected");
                return;
            }
        }
    }
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
                if lock(&shared.users).contains_key(&path) {
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
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    lock(&shared.users).insert(path.clone(), clone);
    info!(peer = %path.display(), "connected to peer");
    let s = Arc::clone(shared);
    spawn_reader(shared, "peer-user", move || {
        let mut owner = OwnerView::default();
        if let Err(e) = owner.serve(&s.dma, &stream) {
            if !s.stop.load(Ordering::Acquire) {
                info!(peer = %path.display(), "peer connection ended: {e}");
            }
        }
        owner.remove_all(&s.dma);
        let _ = stream.shutdown(std::net::Shutdown::Both);
        lock(&s.users).remove(&path);
    });
}

/// One BAR of an owner, as its user sees it.
struct PeerBar {
    memory: Arc<PeerMemory>,
    size: u64,
    window: Option<LocalWindowId>,
}

/// What a user knows of one owner.
#[derive(Default)]
struct OwnerView {
    bars: HashMap<u32, PeerBar>,
}

fn protocol(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Receives one frame and the fds that came with it (at most 2).
fn recv_frame(stream: &UnixStream) -> io::Result<(Frame, Vec<OwnedFd>)> {
    let mut buf = [0u8; FRAME];
    let mut raw: [RawFd; 2] = [-1; 2];
    let mut iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: FRAME,
    }];
    // SAFETY: the iovec points at `buf`, alive and writable for FRAME bytes.
    let (bytes, nfds) = unsafe { stream.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    let fds: Vec<OwnedFd> = raw[..nfds.min(2)]
        .iter()
        // SAFETY: recvmsg just gave us these fds; nobody else owns them.
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if bytes == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed"));
    }
    if bytes < FRAME {
        // A frame split by the stream: its fds came with its first byte.
        (&*stream).read_exact(&mut buf[bytes..])?;
    }
    let frame = Frame::decode(&buf).map_err(|e| protocol(e.to_string()))?;
    Ok((frame, fds))
}

impl OwnerView {
    fn serve(&mut self, dma: &DmaSpace, stream: &UnixStream) -> io::Result<()> {
        loop {
            let (frame, fds) = recv_frame(stream)?;
            match frame {
                Frame::Bar { bar, size, slot } => self.add_bar(bar, size, slot, fds)?,
                Frame::Place { bar, seq, addr } => {
                    if !fds.is_empty() {
                        return Err(protocol("fds with a PLACE".into()));
                    }
                    self.place(dma, bar, addr)?;
                    (&*stream).write_all(&Frame::Ack { bar, seq }.encode())?;
                }
                Frame::Ack { .. } => return Err(protocol("an ACK from an owner".into())),
            }
        }
    }

    fn add_bar(&mut self, bar: u32, size: u64, slot: u64, fds: Vec<OwnedFd>) -> io::Result<()> {
        let [memory, counters]: [OwnedFd; 2] = fds
            .try_into()
            .map_err(|_| protocol("a BAR needs exactly 2 fds".into()))?;
        if size == 0 || self.bars.contains_key(&bar) || slot >= memory::SLOTS {
            return Err(protocol(format!(
                "BAR {bar}: empty, announced twice or bad slot"
            )));
        }
        verify_shared_fd(&memory, size).map_err(|why| protocol(format!("BAR {bar}: {why}")))?;
        let counters = Arc::new(
            CounterPage::from_received(counters)
                .map_err(|why| protocol(format!("counter page: {why}")))?,
        );
        let memory = PeerMemory::new(memory, size, counters, slot)
            .map_err(|why| protocol(format!("BAR {bar}: {why}")))?;
        self.bars.insert(
            bar,
            PeerBar {
                memory: Arc::new(memory),
                size,
                window: None,
            },
        );
        Ok(())
    }

    /// Applies a placement; returns once no access runs through the old
    /// one. A placement we cannot take (overlap with our own windows or
    /// guest RAM) leaves no window: DMA there takes the message path.
    fn place(&mut self, dma: &DmaSpace, bar: u32, addr: Option<u64>) -> io::Result<()> {
        let b = self
            .bars
            .get_mut(&bar)
            .ok_or_else(|| protocol(format!("PLACE for unknown BAR {bar}")))?;
        if let Some(a) = addr {
            if a.checked_add(b.size).is_none() {
                return Err(protocol(format!(
                    "BAR {bar} at {a:#x} wraps the address space"
                )));
            }
        }
        let drained = |r: Result<bool, DmaError>| match r {
            Ok(_) => Ok(()),
            Err(e) => Err(io::Error::new(io::ErrorKind::TimedOut, e.to_string())),
        };
        match (b.window, addr) {
            (Some(id), Some(a)) => {
                if dma.peer_window(id).is_some_and(|(gpa, _)| gpa == a) {
                    return Ok(());
                }
                match dma.move_peer_window(id, a) {
                    Ok(()) => {}
                    Err(DmaError::StillInUse { .. }) => {
                        b.window = None;
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "accesses still run",
                        ));
                    }
                    Err(e) => {
                        warn!(bar, addr = a, "peer window refused: {e}");
                        b.window = None;
                    }
                }
            }
            (None, Some(a)) => match dma.add_peer_window(a, b.size, b.memory.clone(), 0) {
                Ok(id) => b.window = Some(id),
                Err(e) => warn!(bar, addr = a, "peer window refused: {e}"),
            },
            (Some(id), None) => {
                b.window = None;
                drained(dma.remove_peer_window(id))?;
            }
            (None, None) => {}
        }
        debug!(bar, ?addr, "peer BAR placed");
        Ok(())
    }

    fn remove_all(&mut self, dma: &DmaSpace) {
        for b in self.bars.values_mut() {
            if let Some(id) = b.window.take() {
                if let Err(e) = dma.remove_peer_window(id) {
                    warn!("peer window removal: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
