//! The link thread of a stream wire: it takes ONE peer from the transport
//! (refusing, with a rate-limited log line, anyone else who connects
//! meanwhile), reads frames into the receiver's queue only while the
//! queue has room (the peer's sends wait otherwise: flow control), and
//! takes the link down when the peer goes away, breaks the framing, or a
//! sender closed it. A peer that comes back (or a new one) is taken again.

use std::io::{self, Read};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_ratelimit::log_limited;

use crate::core::{lock, Core, Outlet, Queued, StreamOut, SLICE};
use crate::frame::{DecodeError, Decoder, Frame};
use crate::stats::WireStats;
use crate::transport::{Arrival, Stream, Transport};

/// Bytes taken from the stream per read.
const READ_CHUNK: usize = 64 << 10;
/// A connection that ends sooner than this makes the dialing side back
/// off (a listener that refuses us, a peer that crashes at once).
const SHORT_LIVED: Duration = Duration::from_secs(1);
/// Longest wait between dials after refusals.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The connected peer.
struct Peer {
    link: u64,
    stream: Box<dyn Stream>,
    who: String,
    since: Instant,
    decoder: Decoder,
    /// A decoded frame the queue had no room for yet.
    stash: Option<Frame>,
}

/// Why the connection ended.
enum End {
    Closed(String),
    Protocol(DecodeError),
    /// The wire's handle is gone: stop.
    QueueGone,
}

impl Peer {
    /// Moves decoded frames into the queue until it is full.
    fn deliver(&mut self, queue: &SyncSender<Queued>) -> Result<(), End> {
        loop {
            let frame = match self.stash.take() {
                Some(frame) => frame,
                None => match self.decoder.next_frame() {
                    Ok(Some(frame)) => frame,
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(End::Protocol(e)),
                },
            };
            match queue.try_send(Queued {
                link: self.link,
                frame,
            }) {
                Ok(()) => {}
                Err(TrySendError::Full(back)) => {
                    self.stash = Some(back.frame);
                    return Ok(());
                }
                Err(TrySendError::Disconnected(_)) => return Err(End::QueueGone),
            }
        }
    }

    /// Whether to read more: only when every frame read so far is queued.
    fn has_room(&self) -> bool {
        self.stash.is_none()
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), End> {
        match self.stream.read(buf) {
            Ok(0) => Err(End::Closed("the peer closed the connection".into())),
            Ok(n) => {
                self.decoder.push(&buf[..n]);
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(End::Closed(format!("read failed: {e}"))),
        }
    }
}

/// When the dialing side tries next.
struct Dialer {
    next: Instant,
    backoff: Duration,
}

impl Dialer {
    fn new() -> Self {
        Self {
            next: Instant::now(),
            backoff: Duration::ZERO,
        }
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// Not there yet: try again soon.
    fn soon(&mut self) {
        self.next = Instant::now() + SLICE;
    }

    /// Refused or cut off at once: wait longer each time.
    fn back_off(&mut self) {
        self.backoff = (self.backoff * 2).clamp(Duration::from_millis(50), MAX_BACKOFF);
        self.next = Instant::now() + self.backoff;
    }

    fn reset(&mut self) {
        self.backoff = Duration::ZERO;
        self.next = Instant::now();
    }
}

/// Runs the link until the wire stops.
pub(crate) fn run(core: Arc<Core>, mut transport: Box<dyn Transport>, queue: SyncSender<Queued>) {
    let Outlet::Stream(out) = &core.outlet else {
        return;
    };
    let mut peer: Option<Peer> = None;
    let mut dialer = Dialer::new();
    let mut buf = vec![0u8; READ_CHUNK];
    while !core.stopped() {
        if let Some(p) = &mut peer {
            match p.deliver(&queue) {
                Ok(()) => {}
                Err(end) => {
                    let stop = matches!(end, End::QueueGone);
                    end_peer(&core, out, &mut peer, end, &mut dialer);
                    if stop {
                        break;
                    }
                    continue;
                }
            }
        }
        if peer.is_none() && transport.listen_fd().is_none() && dialer.due() {
            match transport.dial() {
                Arrival::Peer(stream, who) => {
                    peer = install(&core, out, stream, who);
                    if peer.is_none() {
                        dialer.back_off();
                    }
                }
                Arrival::Refused(why, connection) => {
                    WireStats::add(&core.stats.peers_refused, 1);
                    log_limited!(warn, "wire {}: refused {why}", core.describe);
                    close_counted(connection);
                    dialer.back_off();
                }
                Arrival::Nothing => dialer.soon(),
            }
        }
        let read_fd = peer
            .as_ref()
            .filter(|p| p.has_room())
            .map(|p| p.stream.poll_fd());
        // With a frame waiting for room, look again soon.
        let wait = if peer.as_ref().is_some_and(|p| !p.has_room()) {
            Duration::from_millis(1)
        } else {
            SLICE
        };
        let [accept_ready, read_ready] = poll_readable([transport.listen_fd(), read_fd], wait);
        if accept_ready {
            match transport.accept() {
                Arrival::Peer(stream, who) => match &peer {
                    None => peer = install(&core, out, stream, who),
                    Some(current) => {
                        WireStats::add(&core.stats.peers_refused, 1);
                        stream.close();
                        log_limited!(
                            warn,
                            "wire {}: refused a second peer ({who}): the wire takes one peer and {} is connected",
                            core.describe,
                            current.who
                        );
                    }
                },
                Arrival::Refused(why, connection) => {
                    WireStats::add(&core.stats.peers_refused, 1);
                    log_limited!(warn, "wire {}: refused {why}", core.describe);
                    close_counted(connection);
                }
                Arrival::Nothing => {}
            }
        }
        if read_ready {
            if let Some(p) = &mut peer {
                if let Err(end) = p.read(&mut buf) {
                    end_peer(&core, out, &mut peer, end, &mut dialer);
                }
            }
        }
    }
    if peer.is_some() {
        end_peer(
            &core,
            out,
            &mut peer,
            End::Closed("the wire stopped".into()),
            &mut dialer,
        );
    }
}

/// Ends a refused connection, once its refusal is counted.
fn close_counted(connection: Option<Box<dyn Stream>>) {
    if let Some(connection) = connection {
        connection.close();
    }
}

/// Makes `stream` the peer: the writer and closer handles go to the
/// senders, the link comes up.
fn install(core: &Core, out: &StreamOut, stream: Box<dyn Stream>, who: String) -> Option<Peer> {
    let handles = stream
        .set_write_slice(SLICE)
        .and_then(|()| stream.set_read_slice(SLICE))
        .and_then(|()| Ok((stream.clone_stream()?, stream.clone_stream()?)));
    let (writer, closer) = match handles {
        Ok(handles) => handles,
        Err(e) => {
            log_limited!(warn, "wire {}: cannot use a connection: {e}", core.describe);
            stream.close();
            return None;
        }
    };
    let link = core.links.fetch_add(1, Ordering::SeqCst) + 1;
    *lock(&out.writer) = Some((link, writer));
    *lock(&out.closer) = Some((link, closer));
    core.link_up.store(true, Ordering::SeqCst);
    WireStats::add(&core.stats.connections, 1);
    tracing::info!(wire = %core.describe, peer = %who, "wire link up");
    Some(Peer {
        link,
        stream,
        who,
        since: Instant::now(),
        decoder: Decoder::new(core.options.max_payload),
        stash: None,
    })
}

/// Takes the peer's link down and says why.
fn end_peer(core: &Core, out: &StreamOut, peer: &mut Option<Peer>, end: End, dialer: &mut Dialer) {
    let Some(p) = peer.take() else {
        return;
    };
    let why = match end {
        End::Closed(why) => why,
        End::Protocol(e) => {
            WireStats::add(&core.stats.protocol_errors, 1);
            log_limited!(
                warn,
                "wire {}: the peer ({}) sent bytes that are not a frame ({e}); closing the connection",
                core.describe,
                p.who
            );
            format!("protocol error: {e}")
        }
        End::QueueGone => "the wire stopped".into(),
    };
    if p.stash.is_some() {
        tracing::debug!(wire = %core.describe, "a frame read before the link went down is dropped");
    }
    core.close_link(out, p.link, &why);
    p.stream.close();
    let mut writer = lock(&out.writer);
    if writer.as_ref().is_some_and(|(l, _)| *l == p.link) {
        *writer = None;
    }
    drop(writer);
    if p.since.elapsed() < SHORT_LIVED {
        dialer.back_off();
    } else {
        dialer.reset();
    }
}

/// Which of `fds` are readable (or closed) within `wait`.
fn poll_readable(fds: [Option<RawFd>; 2], wait: Duration) -> [bool; 2] {
    let mut polled: Vec<libc::pollfd> = Vec::with_capacity(2);
    let mut slots = [None; 2];
    for (i, fd) in fds.iter().enumerate() {
        if let Some(fd) = fd {
            slots[i] = Some(polled.len());
            polled.push(libc::pollfd {
                fd: *fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
    }
    let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `polled` is a live array of `polled.len()` pollfd structs,
    // which poll only reads and updates in place.
    let rc = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
    if rc <= 0 {
        return [false, false];
    }
    slots.map(|slot| {
        slot.is_some_and(|i| {
            polled[i].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
        })
    })
}
