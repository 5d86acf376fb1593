//! Serving the control sockets: one thread runs a single-threaded tokio
//! runtime that accepts on both sockets and serves every connection as a
//! task, so a hundred idle connections cost a hundred small tasks, not a
//! hundred threads, and each can be timed out and closed on its own.
//! Requests run on tokio's blocking pool (a device reset may take a
//! while) so one slow request never delays another connection.
//!
//! The limits, per channel:
//!
//! | | host socket | guest socket |
//! |---|---|---|
//! | connections | [`MAX_HOST_CONNECTIONS`]; at the cap, the one idle the longest is closed to make room | 1 (QEMU's); more are refused |
//! | a request line | [`MAX_LINE`] bytes, whole within [`IDLE_TIMEOUT`] of the connection or the last reply | [`MAX_LINE`] bytes, no time limit: QEMU holds the connection for the whole run, and the guest only stalls its own channel |
//! | a reply | written within [`WRITE_TIMEOUT`] | the same |
//!
//! A connection past a limit gets an error reply where it can, then is
//! closed.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use p2plab_ratelimit::log_limited;
use p2plab_vfio_user::server::{bind_replacing_stale, current_uid};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tracing::info;

use super::{Channel, Dispatcher, Reply};

/// Longest request line accepted (newline included); a longer one gets an
/// error reply and its connection is closed.
pub const MAX_LINE: u64 = 64 * 1024;

/// Connections the host socket serves at once. A new one beyond them
/// closes the connection that has been idle the longest, so idle
/// connections can never lock a client out.
pub const MAX_HOST_CONNECTIONS: usize = 64;

/// How long a host connection may take to send a whole request line,
/// counted from its connection or its last reply: an idle connection, or
/// one trickling bytes, is closed after this.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a reply may take to be written (a client that does not read).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections the guest socket serves at once: QEMU's.
const MAX_GUEST_CONNECTIONS: usize = 1;

/// Requests answered at once (on tokio's blocking pool); more wait.
const MAX_REQUESTS_RUNNING: usize = 8;

/// A channel's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limits {
    max_connections: usize,
    /// At the cap, close the longest idle connection rather than refuse.
    evict_idle: bool,
    /// Time for a whole request line; `None`: no limit.
    request_timeout: Option<Duration>,
    write_timeout: Duration,
}

impl Limits {
    fn of(channel: Channel) -> Self {
        match channel {
            Channel::Host => Self {
                max_connections: MAX_HOST_CONNECTIONS,
                evict_idle: true,
                request_timeout: Some(IDLE_TIMEOUT),
                write_timeout: WRITE_TIMEOUT,
            },
            Channel::Guest => Self {
                max_connections: MAX_GUEST_CONNECTIONS,
                evict_idle: false,
                request_timeout: None,
                write_timeout: WRITE_TIMEOUT,
            },
        }
    }
}

/// Where a device's control sockets go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlSockets {
    /// The host's (`--control-socket`).
    pub host: PathBuf,
    /// The guest's (`--guest-control-socket`), if it has one.
    pub guest: Option<PathBuf>,
}

/// The listening control sockets; dropping it closes them and every
/// connection, and removes the socket files.
pub struct ControlServer {
    paths: Vec<PathBuf>,
    stop: Option<oneshot::Sender<()>>,
}

impl ControlServer {
    /// Binds the sockets (replacing stale socket files there, refusing to
    /// replace anything else) and serves them on a thread.
    pub fn start(sockets: &ControlSockets, dispatcher: Arc<Dispatcher>) -> io::Result<Self> {
        let mut channels = vec![(Channel::Host, sockets.host.clone())];
        if let Some(guest) = &sockets.guest {
            channels.push((Channel::Guest, guest.clone()));
        }
        let limits = channels
            .into_iter()
            .map(|(channel, path)| (channel, path, Limits::of(channel)))
            .collect();
        Self::start_with(limits, dispatcher)
    }

    fn start_with(
        channels: Vec<(Channel, PathBuf, Limits)>,
        dispatcher: Arc<Dispatcher>,
    ) -> io::Result<Self> {
        let mut listeners = Vec::new();
        let mut paths = Vec::new();
        for (channel, path, limits) in channels {
            let listener = bind(&path)?;
            info!(path = %path.display(), channel = channel.name(), "control socket listening");
            paths.push(path);
            listeners.push((channel, listener, limits));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(MAX_REQUESTS_RUNNING)
            .thread_name("control-request")
            .build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let connections = Arc::new(Connections::default());
        thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let mut accepting = tokio::task::JoinSet::new();
                    for (channel, listener, limits) in listeners {
                        let shared = Shared {
                            channel,
                            limits,
                            dispatcher: Arc::clone(&dispatcher),
                            connections: Arc::clone(&connections),
                        };
                        match UnixListener::from_std(listener) {
                            Ok(listener) => {
                                accepting.spawn(accept_loop(listener, shared));
                            }
                            Err(e) => tracing::error!(%e, "control socket not served"),
                        }
                    }
                    // Until dropped (or the sender is gone).
                    let _ = stopped.await;
                    accepting.shutdown().await;
                });
                // Requests still running on the blocking pool finish on
                // their own; nothing waits for them.
                runtime.shutdown_background();
            })?;
        Ok(Self {
            paths,
            stop: Some(stop),
        })
    }

    /// Where the host's socket is.
    pub fn path(&self) -> &Path {
        &self.paths[0]
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Listens at `path`, mode 0600 from the bind on, replacing a stale
/// socket file but nothing else.
fn bind(path: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    let listener = bind_replacing_stale(path, 0o600)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// What every connection task of one socket shares.
#[derive(Clone)]
struct Shared {
    channel: Channel,
    limits: Limits,
    dispatcher: Arc<Dispatcher>,
    connections: Arc<Connections>,
}

/// One connection being served.
struct Connection {
    channel: Channel,
    /// When it connected or was last answered.
    idle_since: Instant,
    /// A request of it is being answered.
    busy: bool,
    abort: AbortHandle,
}

/// The connections being served, of both sockets.
#[derive(Default)]
struct Connections {
    next_id: AtomicU64,
    live: Mutex<BTreeMap<u64, Connection>>,
}

impl Connections {
    fn live(&self) -> MutexGuard<'_, BTreeMap<u64, Connection>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes room for one more connection of `channel`: `Ok` when there
    /// is (closing the longest idle one if `limits` say so), `Err` when
    /// the new one must be refused.
    fn make_room(&self, channel: Channel, limits: &Limits) -> Result<(), ()> {
        let mut live = self.live();
        let count = live.values().filter(|c| c.channel == channel).count();
        if count < limits.max_connections {
            return Ok(());
        }
        if !limits.evict_idle {
            return Err(());
        }
        let oldest = live
            .iter()
            .filter(|(_, c)| c.channel == channel && !c.busy)
            .min_by_key(|(_, c)| c.idle_since)
            .map(|(&id, _)| id);
        let Some(id) = oldest else {
            return Err(());
        };
        if let Some(evicted) = live.remove(&id) {
            evicted.abort.abort();
            log_limited!(
                warn,
                channel = channel.name(),
                idle_ms = evicted.idle_since.elapsed().as_millis() as u64,
                "control connection closed to make room for a new one"
            );
        }
        Ok(())
    }

    fn set_busy(&self, id: u64, busy: bool) {
        if let Some(c) = self.live().get_mut(&id) {
            c.busy = busy;
            c.idle_since = Instant::now();
        }
    }
}

/// Removes its connection from [`Connections`] when the task ends,
/// aborted or not.
struct Registration {
    id: u64,
    connections: Arc<Connections>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.connections.live().remove(&self.id);
    }
}

async fn accept_loop(listener: UnixListener, shared: Shared) {
    let ours = current_uid();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                log_limited!(warn, %e, "control socket accept failed");
                // EMFILE and the like: let some connections end first.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match stream.peer_cred().map(|c| c.uid()) {
            Ok(uid) if uid == ours => {}
            Ok(uid) => {
                log_limited!(warn, uid, ours, "control connection refused: another uid");
                continue;
            }
            Err(e) => {
                log_limited!(warn, %e, "control connection refused: no peer credentials");
                continue;
            }
        }
        let channel = shared.channel;
        if shared
            .connections
            .make_room(channel, &shared.limits)
            .is_err()
        {
            log_limited!(
                warn,
                channel = channel.name(),
                "control connection refused: too many"
            );
            let line = Reply::error(format!(
                "too many connections on the {} control socket (at most {})",
                channel.name(),
                shared.limits.max_connections
            ))
            .line();
            // Best effort: a fresh socket's buffer takes one line.
            let _ = stream.try_write(line.as_bytes());
            continue;
        }
        let id = shared.connections.new_id();
        let registration = Registration {
            id,
            connections: Arc::clone(&shared.connections),
        };
        let task_shared = shared.clone();
        let task = tokio::spawn(async move {
            let _registration = registration;
            if let Err(e) = serve(stream, id, &task_shared).await {
                log_limited!(
                    info,
                    channel = task_shared.channel.name(),
                    %e,
                    "control connection closed"
                );
            }
        });
        shared.connections.live().insert(
            id,
            Connection {
                channel,
                idle_since: Instant::now(),
                busy: false,
                abort: task.abort_handle(),
            },
        );
    }
}

/// Answers request lines until the peer closes or breaks a limit.
async fn serve(stream: UnixStream, id: u64, shared: &Shared) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let limits = shared.limits;
    loop {
        let mut line = Vec::new();
        let mut limited = (&mut reader).take(MAX_LINE);
        let reading = limited.read_until(b'\n', &mut line);
        let n = match limits.request_timeout {
            Some(limit) => match tokio::time::timeout(limit, reading).await {
                Ok(n) => n?,
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no whole request within {limit:?}"),
                    ))
                }
            },
            None => reading.await?,
        };
        if n == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            if n as u64 >= MAX_LINE {
                let reply = Reply::error(format!("request line longer than {MAX_LINE} bytes"));
                let _ = tokio::time::timeout(
                    limits.write_timeout,
                    write.write_all(reply.line().as_bytes()),
                )
                .await;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "request line too long",
                ));
            }
            // The peer closed mid-line: nothing to answer.
            return Ok(());
        }
        shared.connections.set_busy(id, true);
        let dispatcher = Arc::clone(&shared.dispatcher);
        let channel = shared.channel;
        let reply = tokio::task::spawn_blocking(move || dispatcher.reply_line(channel, &line))
            .await
            .map_err(io::Error::other)?;
        match tokio::time::timeout(limits.write_timeout, write.write_all(reply.as_bytes())).await {
            Ok(written) => written?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("reply not taken within {:?}", limits.write_timeout),
                ))
            }
        }
        shared.connections.set_busy(id, false);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{host_only, temp_path, Recorder};
    use super::super::{request, ControlRequest};
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::UnixStream as StdStream;

    /// A host socket at `name` with `request_timeout`, the rest as the
    /// host's limits.
    fn quick_host(name: &str, request_timeout: Duration) -> (ControlServer, PathBuf) {
        let path = temp_path(name);
        let limits = Limits {
            request_timeout: Some(request_timeout),
            ..Limits::of(Channel::Host)
        };
        let dispatcher = Arc::new(Dispatcher::new(Arc::new(Recorder::default())));
        let server =
            ControlServer::start_with(vec![(Channel::Host, path.clone(), limits)], dispatcher)
                .unwrap();
        (server, path)
    }

    /// Whether the server closed `stream` within `within` (EOF or a reset).
    fn closed_within(mut stream: &StdStream, within: Duration) -> bool {
        stream.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Catches a control socket that idle connections lock out (a cap
    /// without eviction, a thread per connection that never times out):
    /// with 100 idle connections open, `status` is answered within 1 s,
    /// and the oldest idle ones were closed to make room.
    #[test]
    fn a_client_gets_through_100_idle_connections_within_a_second() {
        let path = temp_path("idle100.ctl");
        let server = host_only(&path, Arc::new(Recorder::default()));
        let idle: Vec<StdStream> = (0..100)
            .map(|_| StdStream::connect(&path).unwrap())
            .collect();
        let start = Instant::now();
        let status = request(&path, &ControlRequest::Status).unwrap();
        let took = start.elapsed();
        assert_eq!(status["seen"], 1);
        assert!(took < Duration::from_secs(1), "status took {took:?}");
        // 101 connections against a cap of 64: the 37 oldest are gone.
        let closed = idle
            .iter()
            .take(37)
            .filter(|s| closed_within(s, Duration::from_secs(2)))
            .count();
        assert_eq!(closed, 37);
        assert!(!closed_within(&idle[99], Duration::from_millis(100)));
        drop(server);
    }

    /// Catches idle connections that are never closed (the default limit
    /// is [`IDLE_TIMEOUT`]; this server's is shorter).
    #[test]
    fn an_idle_connection_is_closed() {
        let (server, path) = quick_host("idle.ctl", Duration::from_millis(300));
        let idle = StdStream::connect(&path).unwrap();
        let start = Instant::now();
        assert!(closed_within(&idle, Duration::from_secs(3)));
        assert!(
            start.elapsed() >= Duration::from_millis(250),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(
            Limits::of(Channel::Host).request_timeout,
            Some(IDLE_TIMEOUT)
        );
        drop(server);
    }

    /// Catches a timeout that each byte restarts (a slowloris client
    /// trickling a request holds its connection forever) or one that
    /// counts the connection's whole life (a client that keeps asking is
    /// cut off).
    #[test]
    fn a_trickled_request_is_cut_off_and_a_busy_client_is_not() {
        let (server, path) = quick_host("slow.ctl", Duration::from_millis(400));
        let mut slow = StdStream::connect(&path).unwrap();
        let start = Instant::now();
        let mut sent = 0;
        let cut_off = loop {
            if slow.write_all(b" ").is_err() {
                break start.elapsed();
            }
            sent += 1;
            std::thread::sleep(Duration::from_millis(50));
            if start.elapsed() > Duration::from_secs(5) {
                panic!("still connected after {sent} bytes");
            }
        };
        assert!(cut_off < Duration::from_secs(2), "{cut_off:?}");
        assert!(sent >= 4, "{sent}");

        let busy = StdStream::connect(&path).unwrap();
        let mut writer = busy.try_clone().unwrap();
        let mut reader = BufReader::new(busy);
        for _ in 0..12 {
            writer.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            assert!(line.starts_with("{\"ok\":true"), "{line}");
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(server);
    }

    /// Catches a request line past [`MAX_LINE`] that is buffered without
    /// bound, or cut without telling the client why.
    #[test]
    fn a_request_line_over_the_limit_is_refused() {
        let path = temp_path("long.ctl");
        let server = host_only(&path, Arc::new(Recorder::default()));
        let stream = StdStream::connect(&path).unwrap();
        let mut writer = stream.try_clone().unwrap();
        // The server stops reading at the limit: write from a thread.
        let flood = std::thread::spawn(move || {
            let chunk = vec![b'x'; 4096];
            for _ in 0..(MAX_LINE as usize / 4096 + 4) {
                if writer.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let reply: Reply = serde_json::from_str(&line).unwrap();
        assert!(!reply.ok);
        let error = reply.error.unwrap();
        assert!(error.contains("longer than 65536 bytes"), "{error}");
        let mut rest = Vec::new();
        let end = reader.read_to_end(&mut rest);
        assert!(end.is_err() || rest.is_empty(), "closed after the reply");
        flood.join().unwrap();
        // The socket still serves others.
        assert!(request(&path, &ControlRequest::Status).is_ok());
        drop(server);
    }
}
