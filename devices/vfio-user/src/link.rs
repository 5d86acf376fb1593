//! The shared half of one client connection: socket writes serialised by a
//! mutex, and server-initiated requests (DMA_READ / DMA_WRITE) whose
//! replies the connection's reader thread routes back by message id.
//!
//! Only device threads may wait on a reply. The reader thread is the one
//! that would deliver it, so a request from there returns
//! [`DmaError::WouldDeadlock`] instead of hanging; QEMU would be stuck too,
//! since it serves our DMA under the lock a vCPU holds while it waits for
//! our reply to its MMIO access.

use std::collections::HashMap;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::dma::{DmaError, MessageDma, RangeUse, RangeUsers};
use crate::protocol::{cmd, command_name, flags, Header, Reader, Writer, HEADER_SIZE};
use crate::socket::send_all;

/// Largest DMA_READ we ask the client for. QEMU 11.1 answers a DMA_READ with
/// one reply carrying the data, written with a single non-blocking sendmsg:
/// whatever does not fit in its socket send buffer is dropped (see
/// devices/vfio-user/README.md, "QEMU drops the tail of large replies").
/// Requests of 64 KiB keep every reply well inside that buffer, whatever
/// max_data_xfer_size was negotiated.
pub const MAX_DMA_READ_REPLY: usize = 64 << 10;

/// Most DMA_READ data bytes whose replies may be on their way at once,
/// over all device threads. Several 64 KiB replies queued behind each
/// other fill QEMU's send buffer just as one large reply does, so the
/// cap on each request alone is not enough.
pub const MAX_DMA_READ_IN_FLIGHT: usize = 128 << 10;

/// The in-flight DMA_READ budget for this host: [`MAX_DMA_READ_IN_FLIGHT`],
/// or half the default socket send buffer if that is smaller (QEMU does
/// not set SO_SNDBUF, so its buffer is `net.core.wmem_default`; the other
/// half leaves room for kernel overhead and QEMU's own requests).
fn read_budget_for_host() -> usize {
    let wmem = std::fs::read_to_string("/proc/sys/net/core/wmem_default")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    budget_for_send_buffer(wmem)
}

/// [`read_budget_for_host`] for a given send buffer size (`None`: unknown).
pub(crate) fn budget_for_send_buffer(wmem: Option<usize>) -> usize {
    const PAGE: usize = 4096;
    let half = wmem.map_or(MAX_DMA_READ_IN_FLIGHT, |w| w / 2);
    (half.min(MAX_DMA_READ_IN_FLIGHT) / PAGE * PAGE).max(PAGE)
}

/// Most of our DMA requests waiting for a reply at once. Each device
/// thread waits for one at a time, so this is far above any real device's
/// need; past it a request fails with [`DmaError::Busy`] instead of
/// growing the table without bound.
pub const MAX_PENDING_DMA: usize = 256;

/// Locks a mutex, ignoring poisoning: every critical section here leaves
/// the data consistent even if a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

type ReplyResult = Result<Vec<u8>, DmaError>;

struct Waiter {
    command: u16,
    tx: SyncSender<ReplyResult>,
    /// Its requester gave up (timeout, range closed): the reply is still
    /// expected, so that it can be checked and read past, but nobody gets
    /// it.
    expired: bool,
    /// DMA_READ budget bytes held until the reply arrives.
    reserved: usize,
    /// The range the request goes to, and the address and length it asks
    /// for: a waiter whose range is closed is failed with Revoked.
    range: Arc<RangeUsers>,
    gpa: u64,
    len: u64,
}

#[derive(Default)]
struct PendingTable {
    closed: bool,
    next_id: u16,
    waiters: HashMap<u16, Waiter>,
    /// DMA_READ budget bytes not held by any waiter.
    budget_free: usize,
}

impl PendingTable {
    /// Removes a waiter, returning its budget.
    fn take(&mut self, id: u16) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        self.budget_free += w.reserved;
        Some(w)
    }
}

/// The write half of one connection, shared by the reader thread (its
/// replies) and device threads (their DMA requests, whose replies the
/// reader hands back through [`Link::deliver`]).
pub(crate) struct Link {
    /// A clone of the connection's socket, used only for writing.
    writer: Mutex<UnixStream>,
    pending: Mutex<PendingTable>,
    /// Signalled whenever DMA_READ budget is returned or the link closes.
    budget_returned: Condvar,
    /// The whole DMA_READ budget (see [`MAX_DMA_READ_IN_FLIGHT`]).
    budget: usize,
    /// The thread that reads this connection (and calls the device).
    reader: ThreadId,
    /// Largest data count in one DMA_READ/DMA_WRITE: the smaller of both
    /// sides' max_data_xfer_size.
    max_xfer: AtomicUsize,
    timeout: Duration,
}

impl Link {
    pub(crate) fn new(
        writer: UnixStream,
        reader: ThreadId,
        max_xfer: usize,
        timeout: Duration,
    ) -> Self {
        let budget = read_budget_for_host();
        Link {
            writer: Mutex::new(writer),
            pending: Mutex::new(PendingTable {
                budget_free: budget,
                ..PendingTable::default()
            }),
            budget_returned: Condvar::new(),
            budget,
            reader,
            max_xfer: AtomicUsize::new(max_xfer.max(1)),
            timeout,
        }
    }

    /// Sets the DMA chunk size once VERSION is negotiated.
    pub(crate) fn set_max_xfer(&self, max_xfer: usize) {
        self.max_xfer.store(max_xfer.max(1), Ordering::Relaxed);
    }

    fn max_xfer(&self) -> usize {
        self.max_xfer.load(Ordering::Relaxed).max(1)
    }

    /// Data bytes in one DMA_READ: the negotiated transfer size, capped
    /// by [`MAX_DMA_READ_REPLY`] and by the in-flight budget.
    pub(crate) fn dma_read_chunk(&self) -> usize {
        self.max_xfer().min(MAX_DMA_READ_REPLY).min(self.budget)
    }

    /// Sends one whole message. A failed or partial write leaves the
    /// stream unusable, so the socket is shut down: the reader then sees
    /// the end of the connection and cleans up.
    pub(crate) fn send(&self, parts: &[&[u8]], fds: &[RawFd]) -> io::Result<()> {
        let writer = lock(&self.writer);
        let result = send_all(&writer, parts, fds);
        if let Err(e) = &result {
            warn!(error = %e, "socket write failed; dropping the connection");
            let _ = writer.shutdown(std::net::Shutdown::Both);
        }
        result
    }

    /// Fails every waiting request and refuses new ones.
    pub(crate) fn close(&self) {
        let waiters = {
            let mut table = lock(&self.pending);
            table.closed = true;
            std::mem::take(&mut table.waiters)
        };
        if !waiters.is_empty() {
            debug!(count = waiters.len(), "failing pending DMA requests");
        }
        self.budget_returned.notify_all();
        for (_, w) in waiters {
            let _ = w.tx.send(Err(DmaError::Disconnected));
        }
    }

    /// Checks a reply header from the client against the request it
    /// answers, before a byte of its payload is read: the id must be one
    /// we wait for, the command that request's, the flags a reply's, and
    /// the size exactly what that request's reply carries. Any mismatch
    /// means the stream is out of sync (a reply cut short by the client
    /// and the next message read as its tail) and nothing after this
    /// header can be trusted.
    pub(crate) fn check_reply(&self, header: &Header) -> Result<(), String> {
        let table = lock(&self.pending);
        let Some(w) = table.waiters.get(&header.msg_id) else {
            return Err(format!(
                "reply id {} ({}) answers no request of ours",
                header.msg_id,
                command_name(header.command)
            ));
        };
        if w.command != header.command {
            return Err(format!(
                "reply id {} carries command {} but answers {}",
                header.msg_id,
                command_name(header.command),
                command_name(w.command)
            ));
        }
        let allowed = flags::TYPE_MASK | flags::ERROR;
        if header.flags & !allowed != 0 {
            return Err(format!(
                "reply id {} has flags {:#x}",
                header.msg_id, header.flags
            ));
        }
        let size = header.size as usize;
        let fits = if header.is_error() {
            size == HEADER_SIZE
        } else if !header.is_error() && header.error != 0 {
            false
        } else if w.command == cmd::DMA_READ {
            usize::try_from(w.len).is_ok_and(|len| size == HEADER_SIZE + 16 + len)
        } else {
            // DMA_WRITE: QEMU replies with a bare header, the spec adds
            // address and count.
            size == HEADER_SIZE || size == HEADER_SIZE + 16
        };
        if fits {
            Ok(())
        } else {
            Err(format!(
                "reply id {} ({} of {} bytes at {:#x}) has size {}, flags {:#x}, errno {}",
                header.msg_id,
                command_name(w.command),
                w.len,
                w.gpa,
                header.size,
                header.flags,
                header.error
            ))
        }
    }

    /// Fails the request `id` with `error` (its reply was cut short or
    /// came with the stream out of sync).
    pub(crate) fn fail(&self, id: u16, error: DmaError) {
        let waiter = lock(&self.pending).take(id);
        self.budget_returned.notify_all();
        if let Some(w) = waiter {
            let _ = w.tx.send(Err(error));
        }
    }

    /// Hands a reply read by the reader thread to the request waiting for
    /// it. Returns false if nobody waits (it timed out, or the peer sent a
    /// stray reply).
    pub(crate) fn deliver(&self, header: &Header, payload: ReplyResult) -> bool {
        let waiter = lock(&self.pending).take(header.msg_id);
        self.budget_returned.notify_all();
        let Some(waiter) = waiter else {
            debug!(
                id = header.msg_id,
                cmd = command_name(header.command),
                "reply matches no pending request; dropped"
            );
            return false;
        };
        if waiter.expired {
            debug!(
                id = header.msg_id,
                cmd = command_name(header.command),
                "late reply to an abandoned request; dropped"
            );
            return false;
        }
        let result = if waiter.command != header.command {
            Err(DmaError::Protocol(format!(
                "reply to {} carries command {}",
                command_name(waiter.command),
                header.command
            )))
        } else if header.is_error() {
            Err(DmaError::Remote {
                errno: header.error as i32,
            })
        } else {
            payload
        };
        let _ = waiter.tx.send(result);
        true
    }

    /// Drops a request whose message never went out.
    fn forget(&self, id: u16) {
        lock(&self.pending).take(id);
        self.budget_returned.notify_all();
    }

    /// Marks a request whose requester stopped waiting: its reply may
    /// still come and must then be read past, not taken for a stray.
    fn abandon(&self, id: u16) {
        if let Some(w) = lock(&self.pending).waiters.get_mut(&id) {
            w.expired = true;
        }
    }

    /// Waits until `bytes` of DMA_READ budget are free and takes them.
    fn reserve(&self, bytes: usize) -> Result<usize, DmaError> {
        let bytes = bytes.min(self.budget);
        let deadline = Instant::now() + self.timeout;
        let mut table = lock(&self.pending);
        loop {
            if table.closed {
                return Err(DmaError::Disconnected);
            }
            if table.budget_free >= bytes {
                table.budget_free -= bytes;
                return Ok(bytes);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DmaError::Timeout {
                    after: self.timeout,
                });
            }
            table = self
                .budget_returned
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Returns budget that no waiter took over.
    fn unreserve(&self, bytes: usize) {
        lock(&self.pending).budget_free += bytes;
        self.budget_returned.notify_all();
    }

    /// Fails every waiter whose range is now closed. Their replies are
    /// still expected (the client answers every request) and are read
    /// past when they come.
    pub(crate) fn cancel_closed(&self) {
        let mut table = lock(&self.pending);
        let mut count = 0usize;
        for w in table.waiters.values_mut() {
            if w.expired || !w.range.is_cancelled() {
                continue;
            }
            w.expired = true;
            count += 1;
            let _ = w.tx.send(Err(DmaError::Revoked {
                gpa: w.gpa,
                len: w.len,
            }));
        }
        drop(table);
        if count > 0 {
            debug!(count, "failed DMA requests to closed ranges");
        }
    }

    /// Sends a DMA command for `len` bytes at `gpa` in `range` and blocks
    /// until its reply arrives, the timeout passes, the range is closed or
    /// the connection drops. Returns the reply payload.
    fn request(
        &self,
        command: u16,
        parts: &[&[u8]],
        range: &RangeUse,
        gpa: u64,
        len: u64,
    ) -> ReplyResult {
        if thread::current().id() == self.reader {
            return Err(DmaError::WouldDeadlock);
        }
        let (tx, rx) = mpsc::sync_channel(1);
        // Only DMA_READ replies are large; their data must fit in the
        // client's socket buffer together with every other reply on its way.
        let reserved = if command == cmd::DMA_READ {
            self.reserve(usize::try_from(len).unwrap_or(usize::MAX))?
        } else {
            0
        };
        let id = {
            let mut table = lock(&self.pending);
            let refused = if table.closed {
                Some(DmaError::Disconnected)
            } else if table.waiters.len() >= MAX_PENDING_DMA {
                Some(DmaError::Busy)
            } else {
                None
            };
            if let Some(e) = refused {
                drop(table);
                self.unreserve(reserved);
                return Err(e);
            }
            // Message ids are ours alone; skip ids still waiting.
            let mut id = table.next_id;
            let mut tries = 0u32;
            while table.waiters.contains_key(&id) {
                id = id.wrapping_add(1);
                tries += 1;
                if tries > u32::from(u16::MAX) {
                    drop(table);
                    self.unreserve(reserved);
                    return Err(DmaError::Busy);
                }
            }
            table.next_id = id.wrapping_add(1);
            table.waiters.insert(
                id,
                Waiter {
                    command,
                    tx,
                    expired: false,
                    reserved,
                    range: Arc::clone(range.users()),
                    gpa,
                    len,
                },
            );
            id
        };
        // Registered first, checked second: a closer that missed this
        // waiter in its sweep closed the range before this check.
        if range.users().is_cancelled() {
            self.forget(id);
            return Err(DmaError::Revoked { gpa, len });
        }
        let payload_len: usize = parts.iter().map(|p| p.len()).sum();
        let header = Header::command(id, command, payload_len).encode();
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(&header);
        all.extend_from_slice(parts);
        if let Err(e) = self.send(&all, &[]) {
            self.forget(id);
            return Err(DmaError::Io(e.to_string()));
        }
        match rx.recv_timeout(self.timeout) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => {
                self.abandon(id);
                warn!(id, cmd = command_name(command), timeout = ?self.timeout, "no reply from client");
                Err(DmaError::Timeout {
                    after: self.timeout,
                })
            }
            Err(RecvTimeoutError::Disconnected) => Err(DmaError::Disconnected),
        }
    }
}

impl MessageDma for Link {
    /// Reads guest memory through DMA_READ messages, in chunks of the
    /// negotiated transfer size, and never more than
    /// [`MAX_DMA_READ_REPLY`] per request.
    fn dma_read(&self, gpa: u64, buf: &mut [u8], range: &RangeUse) -> Result<(), DmaError> {
        let mut addr = gpa;
        for chunk in buf.chunks_mut(self.dma_read_chunk()) {
            let count = chunk.len() as u64;
            let mut req = Writer::with_capacity(16);
            req.u64(addr).u64(count);
            let req = req.finish();
            let reply = self.request(cmd::DMA_READ, &[&req], range, addr, count)?;
            let mut r = Reader::new(&reply);
            let (got_addr, got_count) = (r.u64(), r.u64());
            let data = r.rest();
            if got_addr != Some(addr) || got_count != Some(count) || data.len() != chunk.len() {
                return Err(DmaError::Protocol(format!(
                    "DMA_READ reply for {addr:#x}+{count} has address {got_addr:?}, \
                     count {got_count:?}, {} data bytes",
                    data.len()
                )));
            }
            chunk.copy_from_slice(data);
            debug!(gpa = addr, len = count, "DMA_READ completed");
            addr = addr.wrapping_add(count);
        }
        Ok(())
    }

    /// Writes guest memory through DMA_WRITE messages (no extra cap: the
    /// data travels in our request, not in QEMU's reply).
    fn dma_write(&self, gpa: u64, data: &[u8], range: &RangeUse) -> Result<(), DmaError> {
        let mut addr = gpa;
        for chunk in data.chunks(self.max_xfer()) {
            let count = chunk.len() as u64;
            let mut req = Writer::with_capacity(16);
            req.u64(addr).u64(count);
            let req = req.finish();
            // QEMU replies with a bare header; the spec adds address and
            // count. Both are fine, so the payload is not checked.
            self.request(cmd::DMA_WRITE, &[&req, chunk], range, addr, count)?;
            debug!(gpa = addr, len = count, "DMA_WRITE completed");
            addr = addr.wrapping_add(count);
        }
        Ok(())
    }

    fn cancel_closed(&self) {
        Link::cancel_closed(self);
    }

    fn close(&self) {
        // The inherent method, which the server also calls when the
        // session ends.
        Link::close(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_budget_follows_the_hosts_socket_buffer() {
        // Debian's default wmem: half of it, page aligned.
        assert_eq!(budget_for_send_buffer(Some(212_992)), 104 << 10);
        // Big buffers: the fixed cap.
        assert_eq!(
            budget_for_send_buffer(Some(4 << 20)),
            MAX_DMA_READ_IN_FLIGHT
        );
        assert_eq!(budget_for_send_buffer(None), MAX_DMA_READ_IN_FLIGHT);
        // Tiny buffers: still one page, so DMA can make progress.
        assert_eq!(budget_for_send_buffer(Some(1000)), 4096);
    }
}
