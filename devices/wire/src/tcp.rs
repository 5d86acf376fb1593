//! The TCP transport: `tcp-listen:ADDR:PORT` on one server,
//! `tcp-connect:HOST:PORT` on the other, so two labs (two hosts, or two
//! network namespaces) share a wire.
//!
//! TCP has no SO_PEERCRED, so a peer proves it holds the pre-shared key
//! ([`WireKey`], `--wire-key FILE`) by the [`crate::handshake`] before it
//! gets the link; a connection that fails it is closed and logged with
//! its address and the reason. The handshake is bounded as a whole
//! ([`TcpOptions::handshake_timeout`], 5 s): a peer that trickles its
//! bytes (slowloris) or sends none is cut off then. Handshakes run on
//! their own threads, at most [`MAX_HANDSHAKES`] at once (more
//! connections are closed at once), so the link thread never waits on a
//! stranger and the connected peer's frames keep flowing meanwhile.
//!
//! A connection that passed carries frames with TCP_NODELAY (a frame is
//! one write; Nagle would hold small ones back) and TCP keepalive, so a
//! peer whose host or namespace vanished without a FIN is noticed within
//! seconds and the dialing side's next connection is taken. Everything
//! after the handshake (one peer at a time, frame caps, send timeouts,
//! reconnecting) is the wire's, the same as over a unix socket.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use p2plab_ratelimit::log_limited;
use socket2::{SockRef, TcpKeepalive};

use crate::handshake::{check_magic, fresh_nonce, Handshake, Role, HELLO_LEN};
use crate::key::WireKey;
use crate::transport::{Arrival, Stream, Transport};

pub use crate::config::HANDSHAKE_TIMEOUT;
/// How long a dial waits for the listener to accept.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Handshakes under way at once on a listener; a connection beyond them
/// is closed at once (and logged).
pub const MAX_HANDSHAKES: usize = 4;
/// Keepalive: idle time before the first probe, time between probes, and
/// unanswered probes before the connection is dead (about 5 s in all).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(2);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_PROBES: u32 = 3;
/// How often the accepting thread looks whether the wire stopped.
const ACCEPT_SLICE: Duration = Duration::from_millis(20);

/// How a TCP transport checks and keeps its peer.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    /// The pre-shared key both ends hold.
    pub key: WireKey,
    /// How long a connection has to pass the handshake.
    pub handshake_timeout: Duration,
    /// How long a dial waits for the listener to accept.
    pub connect_timeout: Duration,
    /// Unacknowledged data older than this ends the connection
    /// (TCP_USER_TIMEOUT); the wire's send timeout is the natural value.
    pub user_timeout: Duration,
}

impl TcpOptions {
    /// The defaults with `key`.
    pub fn new(key: WireKey) -> Self {
        Self {
            key,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            connect_timeout: CONNECT_TIMEOUT,
            user_timeout: crate::config::SEND_TIMEOUT,
        }
    }
}

impl Stream for TcpStream {
    fn poll_fd(&self) -> RawFd {
        self.as_raw_fd()
    }

    fn clone_stream(&self) -> io::Result<Box<dyn Stream>> {
        Ok(Box::new(self.try_clone()?))
    }

    fn close(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }

    fn set_write_slice(&self, slice: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(slice))
    }

    fn set_read_slice(&self, slice: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(slice))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A queue of arrivals: a panic elsewhere leaves it usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the helper threads hand the link thread.
struct Mailbox {
    arrivals: Mutex<VecDeque<Arrival>>,
    /// Written one byte per arrival; its other end is the listening
    /// transport's poll fd.
    wake_tx: UnixStream,
    wake_rx: UnixStream,
    /// Set when the transport is dropped (the wire stopped).
    stop: AtomicBool,
    /// Handshakes (or a dial) under way.
    pending: AtomicUsize,
}

impl Mailbox {
    fn new() -> io::Result<Self> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(Self {
            arrivals: Mutex::new(VecDeque::new()),
            wake_tx,
            wake_rx,
            stop: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
        })
    }

    fn post(&self, arrival: Arrival) {
        lock(&self.arrivals).push_back(arrival);
        // A full wake buffer already says "look".
        let _ = (&self.wake_tx).write(&[1]);
    }

    fn take(&self) -> Arrival {
        let mut drain = [0u8; 64];
        while matches!((&self.wake_rx).read(&mut drain), Ok(n) if n > 0) {}
        let mut arrivals = lock(&self.arrivals);
        let next = arrivals.pop_front();
        if !arrivals.is_empty() {
            let _ = (&self.wake_tx).write(&[1]);
        }
        next.unwrap_or(Arrival::Nothing)
    }
}

enum Side {
    Listen { local: SocketAddr },
    Connect { target: String },
}

/// One end of a TCP wire.
pub struct TcpTransport {
    side: Side,
    configured: String,
    options: TcpOptions,
    mailbox: Arc<Mailbox>,
}

impl TcpTransport {
    /// Binds `addr` (`0.0.0.0:18600`, `[::1]:0`) and starts taking
    /// connections; each gets the handshake before the wire sees it.
    pub fn listen(addr: &str, options: TcpOptions) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("binding {addr}: {e}")))?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        let mailbox = Arc::new(Mailbox::new()?);
        let thread_mailbox = Arc::clone(&mailbox);
        let thread_options = options.clone();
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name("wire-accept".into())
            .spawn(move || {
                let _span = span.enter();
                accept_loop(&listener, &thread_mailbox, &thread_options);
            })?;
        Ok(Self {
            side: Side::Listen { local },
            configured: addr.to_owned(),
            options,
            mailbox,
        })
    }

    /// Dials `target` (`HOST:PORT`, resolved at each dial) whenever the
    /// wire has no peer.
    pub fn connect(target: &str, options: TcpOptions) -> io::Result<Self> {
        Ok(Self {
            side: Side::Connect {
                target: target.to_owned(),
            },
            configured: target.to_owned(),
            options,
            mailbox: Arc::new(Mailbox::new()?),
        })
    }

    /// The address a listening transport is bound to (with the port the
    /// kernel chose for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self.side {
            Side::Listen { local } => Some(local),
            Side::Connect { .. } => None,
        }
    }
}

impl Transport for TcpTransport {
    fn describe(&self) -> String {
        match self.side {
            Side::Listen { .. } => format!("tcp-listen:{}", self.configured),
            Side::Connect { .. } => format!("tcp-connect:{}", self.configured),
        }
    }

    fn listen_fd(&self) -> Option<RawFd> {
        match self.side {
            Side::Listen { .. } => Some(self.mailbox.wake_rx.as_raw_fd()),
            Side::Connect { .. } => None,
        }
    }

    fn accept(&mut self) -> Arrival {
        match self.side {
            Side::Listen { .. } => self.mailbox.take(),
            Side::Connect { .. } => Arrival::Nothing,
        }
    }

    fn dial(&mut self) -> Arrival {
        let Side::Connect { target } = &self.side else {
            return Arrival::Nothing;
        };
        let arrival = self.mailbox.take();
        if !matches!(arrival, Arrival::Nothing) {
            return arrival;
        }
        // One dial at a time, off the link thread: a black-holed address
        // or a listener that stalls the handshake never holds it.
        if self
            .mailbox
            .pending
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Arrival::Nothing;
        }
        let mailbox = Arc::clone(&self.mailbox);
        let options = self.options.clone();
        let target = target.clone();
        let span = tracing::Span::current();
        let spawned = std::thread::Builder::new()
            .name("wire-dial".into())
            .spawn(move || {
                let _span = span.enter();
                if let Some(arrival) = dial_once(&target, &options) {
                    if !mailbox.stop.load(Ordering::SeqCst) {
                        mailbox.post(arrival);
                    }
                }
                mailbox.pending.store(0, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            self.mailbox.pending.store(0, Ordering::SeqCst);
            log_limited!(
                warn,
                "wire tcp-connect:{}: cannot start a dial: {e}",
                self.configured
            );
        }
        Arrival::Nothing
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.mailbox.stop.store(true, Ordering::SeqCst);
        // Connections that passed a handshake no one will take.
        lock(&self.mailbox.arrivals).clear();
    }
}

/// Takes connections until the transport is dropped, giving each a
/// handshake thread (at most [`MAX_HANDSHAKES`] at once).
fn accept_loop(listener: &TcpListener, mailbox: &Arc<Mailbox>, options: &TcpOptions) {
    while !mailbox.stop.load(Ordering::SeqCst) {
        let (stream, addr) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_SLICE);
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and the like: the fds come back; try again later.
                log_limited!(warn, "wire accept: {e}");
                std::thread::sleep(ACCEPT_SLICE);
                continue;
            }
        };
        if mailbox.pending.fetch_add(1, Ordering::SeqCst) >= MAX_HANDSHAKES {
            mailbox.pending.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.shutdown(Shutdown::Both);
            mailbox.post(Arrival::Refused(
                format!("{addr}: {MAX_HANDSHAKES} handshakes are already under way"),
                None,
            ));
            continue;
        }
        let thread_mailbox = Arc::clone(mailbox);
        let thread_options = options.clone();
        let span = tracing::Span::current();
        let spawned = std::thread::Builder::new()
            .name("wire-handshake".into())
            .spawn(move || {
                let _span = span.enter();
                let arrival = match authenticate(stream, Role::Listener, &thread_options) {
                    Ok(stream) => Arrival::Peer(Box::new(stream), format!("{addr} (key proved)")),
                    Err(why) => Arrival::Refused(format!("{addr}: {why}"), None),
                };
                if !thread_mailbox.stop.load(Ordering::SeqCst) {
                    thread_mailbox.post(arrival);
                }
                thread_mailbox.pending.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            mailbox.pending.fetch_sub(1, Ordering::SeqCst);
            log_limited!(warn, "wire accept: cannot start a handshake: {e}");
        }
    }
}

/// One dial: the first address of `target` that accepts, authenticated.
/// `None` when nothing listens there (yet).
fn dial_once(target: &str, options: &TcpOptions) -> Option<Arrival> {
    let addrs: Vec<SocketAddr> = match target.to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            log_limited!(warn, "wire tcp-connect:{target}: cannot resolve: {e}");
            return None;
        }
    };
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, options.connect_timeout) {
            Ok(stream) => {
                return Some(match authenticate(stream, Role::Dialer, options) {
                    Ok(stream) => Arrival::Peer(Box::new(stream), format!("{addr} (key proved)")),
                    Err(why) => Arrival::Refused(format!("the listener at {addr}: {why}"), None),
                });
            }
            // Not listening yet, or not reachable yet: the peer lab is
            // still starting.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                ) => {}
            Err(e) => log_limited!(warn, "wire tcp-connect:{target}: {addr}: {e}"),
        }
    }
    None
}

/// Runs the handshake on `stream` within the handshake timeout, then
/// sets it up to carry frames; why not, for the log line.
pub fn authenticate(
    stream: TcpStream,
    role: Role,
    options: &TcpOptions,
) -> Result<TcpStream, String> {
    let deadline = Instant::now() + options.handshake_timeout;
    let io_error = |e: io::Error| -> String {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            format!(
                "no handshake within {:?} (a silent or trickling peer)",
                options.handshake_timeout
            )
        } else if matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
        ) {
            "the peer closed the connection during the handshake".into()
        } else {
            format!("handshake: {e}")
        }
    };
    stream.set_nodelay(true).map_err(io_error)?;
    let nonce = fresh_nonce().map_err(io_error)?;
    let (mut handshake, hello) = Handshake::start(role, &options.key, nonce);
    write_by(&stream, &hello, deadline).map_err(io_error)?;
    let mut first = [0u8; 4];
    read_by(&stream, &mut first, deadline).map_err(io_error)?;
    check_magic(first).map_err(|e| e.to_string())?;
    while !handshake.is_done() {
        let mut message = vec![0u8; handshake.wants()];
        let from = if message.len() == HELLO_LEN { 4 } else { 0 };
        message[..from].copy_from_slice(&first[..from]);
        read_by(&stream, &mut message[from..], deadline).map_err(io_error)?;
        if let Some(proof) = handshake.take(&message).map_err(|e| e.to_string())? {
            write_by(&stream, &proof, deadline).map_err(io_error)?;
        }
    }
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let socket = SockRef::from(&stream);
    socket
        .set_tcp_keepalive(&keepalive)
        .and_then(|()| socket.set_tcp_user_timeout(Some(options.user_timeout)))
        .map_err(|e| format!("setting keepalive: {e}"))?;
    Ok(stream)
}

/// The time left until `deadline`, or a timeout error.
fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::ErrorKind::TimedOut.into());
    }
    Ok(left)
}

/// Fills `buf` from `stream` by `deadline`, however the peer slices it.
fn read_by(mut stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        stream.set_read_timeout(Some(left(deadline)?))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `bytes` to `stream` by `deadline`.
fn write_by(mut stream: &TcpStream, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        stream.set_write_timeout(Some(left(deadline)?))?;
        match stream.write(&bytes[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
