//! The wire between two NICs: frames with a frame check sequence, carried
//! over a host unix socket between two server processes, over an
//! in-process channel pair (tests), or looped back to the sender.
//!
//! The wire is lossless by itself: a receiver that has no RX buffer
//! posted stops reading, the socket fills, and the sender's TX engine
//! waits (link-level flow control, like Ethernet PAUSE). Losses,
//! delays and corruption come only from fault injection in the model.
//!
//! On the socket a frame is `magic u32 | len u32 | fcs u32 | payload`,
//! little-endian.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::regs::MAX_MTU;

/// Frames a receiver holds before its sender waits.
const QUEUE_FRAMES: usize = 8;
/// How often blocked wire threads look at the stop flag.
const POLL: Duration = Duration::from_millis(20);
const FRAME_MAGIC: u32 = 0x5032_4e57;

/// One frame as the wire carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub payload: Vec<u8>,
    /// CRC-32 (IEEE, as Ethernet's FCS) of the payload as sent.
    pub fcs: u32,
}

impl Frame {
    /// A frame with its FCS computed over `payload`.
    pub fn new(payload: Vec<u8>) -> Self {
        let fcs = crc32(&payload);
        Self { payload, fcs }
    }

    /// Whether the payload still matches its FCS.
    pub fn fcs_ok(&self) -> bool {
        crc32(&self.payload) == self.fcs
    }
}

/// Where a NIC's wire goes (`--wire`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireConfig {
    /// Frames sent come back to the same NIC.
    Loopback,
    /// Listen on a unix socket at this path for the peer NIC.
    Listen(PathBuf),
    /// Connect to a peer NIC listening at this path (retried until it is
    /// there).
    Connect(PathBuf),
}

impl std::str::FromStr for WireConfig {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            _ if text == "loopback" => Ok(WireConfig::Loopback),
            Some(("listen", path)) if !path.is_empty() => Ok(WireConfig::Listen(path.into())),
            Some(("connect", path)) if !path.is_empty() => Ok(WireConfig::Connect(path.into())),
            _ => Err(format!(
                "{text:?} is not a wire: loopback, listen:PATH or connect:PATH"
            )),
        }
    }
}

/// Why a frame did not go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("no peer on the wire")]
    LinkDown,
    #[error("the sender gave up waiting")]
    Stopped,
}

struct Shared {
    stop: AtomicBool,
    link: AtomicBool,
    /// The connected socket, for sending.
    writer: Mutex<Option<UnixStream>>,
    /// A second handle on it, so `shutdown` can unblock a sender.
    closer: Mutex<Option<UnixStream>>,
}

impl Shared {
    fn new(link: bool) -> Arc<Self> {
        Arc::new(Self {
            stop: AtomicBool::new(false),
            link: AtomicBool::new(link),
            writer: Mutex::new(None),
            closer: Mutex::new(None),
        })
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

enum Outlet {
    Channel(SyncSender<Frame>),
    Socket,
}

/// One NIC's end of the wire.
pub struct Wire {
    outlet: Outlet,
    inlet: Mutex<Receiver<Frame>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    socket_path: Option<PathBuf>,
    /// The listening end bound the socket file and removes it.
    owns_socket_file: bool,
}

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wire")
            .field("link_up", &self.link_up())
            .field("socket", &self.socket_path)
            .finish_non_exhaustive()
    }
}

impl Wire {
    /// The wire `config` describes. A listening wire binds its socket now
    /// (replacing a stale socket file), so a bad path fails at start.
    pub fn open(config: &WireConfig) -> io::Result<Self> {
        match config {
            WireConfig::Loopback => Ok(Self::loopback()),
            WireConfig::Listen(path) => Self::listen(path),
            WireConfig::Connect(path) => Ok(Self::connect(path.clone())),
        }
    }

    /// Frames sent come back.
    pub fn loopback() -> Self {
        let (tx, rx) = sync_channel(QUEUE_FRAMES);
        Self::channel_end(tx, rx)
    }

    /// Two ends wired to each other in this process.
    pub fn pair() -> (Self, Self) {
        let (a_tx, a_rx) = sync_channel(QUEUE_FRAMES);
        let (b_tx, b_rx) = sync_channel(QUEUE_FRAMES);
        (Self::channel_end(a_tx, b_rx), Self::channel_end(b_tx, a_rx))
    }

    fn channel_end(tx: SyncSender<Frame>, rx: Receiver<Frame>) -> Self {
        Self {
            outlet: Outlet::Channel(tx),
            inlet: Mutex::new(rx),
            shared: Shared::new(true),
            thread: None,
            socket_path: None,
            owns_socket_file: false,
        }
    }

    fn listen(path: &Path) -> io::Result<Self> {
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Self::socket_end(path.to_path_buf(), true, move |shared| loop {
            if shared.stopped() {
                return None;
            }
            match listener.accept() {
                Ok((stream, _)) => return Some(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
                Err(e) => {
                    tracing::warn!(error = %e, "wire accept failed");
                    std::thread::sleep(POLL);
                }
            }
        })
    }

    fn connect(path: PathBuf) -> Self {
        let target = path.clone();
        let wire = Self::socket_end(path, false, move |shared| loop {
            if shared.stopped() {
                return None;
            }
            match UnixStream::connect(&target) {
                Ok(stream) => return Some(stream),
                Err(_) => std::thread::sleep(POLL),
            }
        });
        // Spawning only fails when the process is out of threads.
        wire.unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot start the wire thread; the link stays down");
            let (tx, rx) = sync_channel(1);
            let mut dead = Self::channel_end(tx, rx);
            dead.outlet = Outlet::Socket;
            dead.shared.link.store(false, Ordering::SeqCst);
            dead
        })
    }

    fn socket_end(
        path: PathBuf,
        owns_socket_file: bool,
        mut next_peer: impl FnMut(&Shared) -> Option<UnixStream> + Send + 'static,
    ) -> io::Result<Self> {
        let (tx, rx) = sync_channel(QUEUE_FRAMES);
        let shared = Shared::new(false);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("nic-wire".into())
            .spawn(move || {
                while let Some(stream) = next_peer(&thread_shared) {
                    serve_peer(&thread_shared, stream, &tx);
                }
            })?;
        Ok(Self {
            outlet: Outlet::Socket,
            inlet: Mutex::new(rx),
            shared,
            thread: Some(thread),
            socket_path: Some(path),
            owns_socket_file,
        })
    }

    /// Whether a peer is there.
    pub fn link_up(&self) -> bool {
        self.shared.link.load(Ordering::SeqCst)
    }

    /// Sends `frame`, waiting while the peer is not reading; gives up
    /// when `give_up` says so (reset, shutdown) or the wire stops.
    pub fn send(&self, frame: Frame, give_up: &dyn Fn() -> bool) -> Result<(), SendError> {
        match &self.outlet {
            Outlet::Channel(tx) => {
                let mut frame = frame;
                loop {
                    match tx.try_send(frame) {
                        Ok(()) => return Ok(()),
                        Err(TrySendError::Full(back)) => {
                            if give_up() || self.shared.stopped() {
                                return Err(SendError::Stopped);
                            }
                            frame = back;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(TrySendError::Disconnected(_)) => return Err(SendError::LinkDown),
                    }
                }
            }
            Outlet::Socket => {
                let mut writer = self
                    .shared
                    .writer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let Some(stream) = writer.as_mut() else {
                    return Err(SendError::LinkDown);
                };
                let len = u32::try_from(frame.payload.len()).map_err(|_| SendError::LinkDown)?;
                let mut header = [0u8; 12];
                header[..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
                header[4..8].copy_from_slice(&len.to_le_bytes());
                header[8..].copy_from_slice(&frame.fcs.to_le_bytes());
                let sent = stream
                    .write_all(&header)
                    .and_then(|()| stream.write_all(&frame.payload));
                match sent {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        tracing::info!(error = %e, "wire send failed: link down");
                        *writer = None;
                        self.shared.link.store(false, Ordering::SeqCst);
                        Err(SendError::LinkDown)
                    }
                }
            }
        }
    }

    /// The next frame, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Frame> {
        let inlet = self.inlet.lock().unwrap_or_else(PoisonError::into_inner);
        match inlet.recv_timeout(timeout) {
            Ok(frame) => Some(frame),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // The wire thread is gone; do not spin.
                drop(inlet);
                std::thread::sleep(timeout);
                None
            }
        }
    }

    /// Stops the wire's thread and closes the socket; senders and
    /// receivers waiting on it return.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(stream) = self
            .shared
            .closer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.shutdown();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("wire thread panicked");
            }
        }
        if self.owns_socket_file {
            if let Some(path) = &self.socket_path {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Reads frames from a connected peer into `queue` until it goes away.
fn serve_peer(shared: &Shared, stream: UnixStream, queue: &SyncSender<Frame>) {
    let (Ok(writer), Ok(closer)) = (stream.try_clone(), stream.try_clone()) else {
        tracing::warn!("cannot clone the wire socket; dropping the peer");
        return;
    };
    *shared.writer.lock().unwrap_or_else(PoisonError::into_inner) = Some(writer);
    *shared.closer.lock().unwrap_or_else(PoisonError::into_inner) = Some(closer);
    shared.link.store(true, Ordering::SeqCst);
    tracing::info!("wire link up");
    let mut reader = stream;
    loop {
        match read_frame(&mut reader) {
            Ok(Some(frame)) => {
                let mut frame = frame;
                loop {
                    match queue.try_send(frame) {
                        Ok(()) => break,
                        Err(TrySendError::Full(back)) if !shared.stopped() => {
                            frame = back;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(_) => return,
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "wire peer sent a bad frame; closing");
                break;
            }
        }
    }
    shared.link.store(false, Ordering::SeqCst);
    *shared.writer.lock().unwrap_or_else(PoisonError::into_inner) = None;
    if let Some(closer) = shared
        .closer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        let _ = closer.shutdown(Shutdown::Both);
    }
    tracing::info!("wire link down");
}

/// One frame, `None` at a clean end of stream.
fn read_frame(reader: &mut impl Read) -> io::Result<Option<Frame>> {
    let mut header = [0u8; 12];
    match reader.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let word = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    if word(0) != FRAME_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad frame magic",
        ));
    }
    let len = word(4);
    if len > MAX_MTU {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over {MAX_MTU}"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    reader.read_exact(&mut payload)?;
    Ok(Some(Frame {
        payload,
        fcs: word(8),
    }))
}

/// CRC-32 with the IEEE polynomial (reflected 0xEDB88320), as Ethernet's
/// frame check sequence.
pub fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [0u32; 256];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        table
    });
    let mut crc = !0u32;
    for &byte in data {
        crc = table[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn wire_flags_parse() {
        assert_eq!("loopback".parse(), Ok(WireConfig::Loopback));
        assert_eq!(
            "listen:/tmp/w.sock".parse(),
            Ok(WireConfig::Listen("/tmp/w.sock".into()))
        );
        assert_eq!(
            "connect:/tmp/w.sock".parse(),
            Ok(WireConfig::Connect("/tmp/w.sock".into()))
        );
        assert!("listen:".parse::<WireConfig>().is_err());
        assert!("tcp:1.2.3.4".parse::<WireConfig>().is_err());
    }

    /// Would catch frames lost, reordered or altered on the socket, or
    /// a link that never comes up or never goes down.
    #[test]
    fn two_ends_over_a_unix_socket() {
        let dir = std::env::temp_dir().join(format!("p2plab-nic-wire-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("wire.sock");
        let a = Wire::open(&WireConfig::Listen(path.clone())).unwrap();
        let b = Wire::open(&WireConfig::Connect(path.clone())).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !(a.link_up() && b.link_up()) {
            assert!(std::time::Instant::now() < deadline, "link never came up");
            std::thread::sleep(Duration::from_millis(5));
        }
        let never = || false;
        for i in 0..20u8 {
            let payload = vec![i; 1000 + usize::from(i) * 3000];
            a.send(Frame::new(payload.clone()), &never).unwrap();
            let got = b.recv_timeout(Duration::from_secs(5)).expect("frame");
            assert_eq!(got.payload, payload);
            assert!(got.fcs_ok());
        }
        b.send(Frame::new(b"back".to_vec()), &never).unwrap();
        assert_eq!(
            a.recv_timeout(Duration::from_secs(5)).unwrap().payload,
            b"back"
        );
        drop(b);
        while a.link_up() {
            assert!(std::time::Instant::now() < deadline, "link never went down");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            a.send(Frame::new(vec![1]), &never),
            Err(SendError::LinkDown)
        );
        drop(a);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_channel_gives_up_when_told() {
        let wire = Wire::loopback();
        for _ in 0..QUEUE_FRAMES {
            wire.send(Frame::new(vec![0]), &|| false).unwrap();
        }
        assert_eq!(
            wire.send(Frame::new(vec![0]), &|| true),
            Err(SendError::Stopped)
        );
    }
}
