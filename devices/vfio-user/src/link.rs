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
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};
use std::time::Duration;

use tracing::{debug, warn};

use crate::dma::{DmaError, MessageDma, RangeUse, RangeUsers};
use crate::protocol::{cmd, command_name, Header, Reader, Writer};
use crate::socket::send_all;

/// Largest DMA_READ we ask the client for. QEMU 11.1 answers a DMA_READ with
/// one reply carrying the data; replies larger than its socket send buffer
/// stall for seconds and then trip an assertion in QEMU (seen with 512 KiB
/// reads from a peer GPU BAR). Requests of 64 KiB keep every reply well
/// inside that buffer, whatever max_data_xfer_size was negotiated.
pub const MAX_DMA_READ_REPLY: usize = 64 << 10;

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
}

/// The write half of one connection, shared by the reader thread (its
/// replies) and device threads (their DMA requests, whose replies the
/// reader hands back through [`Link::deliver`]).
pub(crate) struct Link {
    /// A clone of the connection's socket, used only for writing.
    writer: Mutex<UnixStream>,
    pending: Mutex<PendingTable>,
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
        Link {
            writer: Mutex::new(writer),
            pending: Mutex::new(PendingTable::default()),
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
        for (_, w) in waiters {
            let _ = w.tx.send(Err(DmaError::Disconnected));
        }
    }

    /// Hands a reply read by the reader thread to the request waiting for
    /// it. Returns false if nobody waits (it timed out, or the peer sent a
    /// stray reply).
    pub(crate) fn deliver(&self, header: &Header, payload: ReplyResult) -> bool {
        let waiter = lock(&self.pending).waiters.remove(&header.msg_id);
        let Some(waiter) = waiter else {
            debug!(
                id = header.msg_id,
                cmd = command_name(header.command),
                "reply matches no pending request; dropped"
            );
            return false;
        };
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

    fn forget(&self, id: u16) {
        lock(&self.pending).waiters.remove(&id);
    }

    /// Fails every waiter whose range is now closed.
    pub(crate) fn cancel_closed(&self) {
        let cancelled: Vec<Waiter> = {
            let mut table = lock(&self.pending);
            let ids: Vec<u16> = table
                .waiters
                .iter()
                .filter(|(_, w)| w.range.is_cancelled())
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| table.waiters.remove(id))
                .collect()
        };
        if !cancelled.is_empty() {
            debug!(
                count = cancelled.len(),
                "failing DMA requests to closed ranges"
            );
        }
        for w in cancelled {
            let _ = w.tx.send(Err(DmaError::Revoked {
                gpa: w.gpa,
                len: w.len,
            }));
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
        let id = {
            let mut table = lock(&self.pending);
            if table.closed {
                return Err(DmaError::Disconnected);
            }
            if table.waiters.len() >= MAX_PENDING_DMA {
                return Err(DmaError::Busy);
            }
            // Message ids are ours alone; skip ids still waiting.
            let mut id = table.next_id;
            let mut tries = 0u32;
            while table.waiters.contains_key(&id) {
                id = id.wrapping_add(1);
                tries += 1;
                if tries > u32::from(u16::MAX) {
                    return Err(DmaError::Busy);
                }
            }
            table.next_id = id.wrapping_add(1);
            table.waiters.insert(
                id,
                Waiter {
                    command,
                    tx,
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
                self.forget(id);
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
        for chunk in buf.chunks_mut(self.max_xfer().min(MAX_DMA_READ_REPLY)) {
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
