//! The message path: client memory that is not mmapped here (a peer
//! device's BAR, which QEMU maps without an fd) is reached by asking the
//! client with DMA_READ / DMA_WRITE messages and waiting for its replies.
//!
//! The address space only knows the [`MessageDma`] trait. The connection
//! implements it and hands itself over with [`DmaSpace::attach`] once
//! VERSION is negotiated, so this module never names the connection, and
//! unit tests can attach a fake instead of a socket.
//!
//! [`DmaSpace::attach`]: super::DmaSpace::attach

use super::{DmaError, RangeUse};

/// Sends DMA_READ / DMA_WRITE messages to the client and waits for the
/// replies. Implementations split an access into as many messages as the
/// negotiated transfer size needs and bound every wait.
///
/// Every access carries the [`RangeUse`] of the range it goes to. After
/// registering a reply waiter and before sending, an implementation checks
/// that the range is not cancelled ([`RangeUsers::is_cancelled`]); and
/// [`cancel_closed`](MessageDma::cancel_closed) fails every waiter whose
/// range is. Together they guarantee that once a range is closed, no
/// message for it is sent after the closer's next reply, and no access to
/// it waits for a reply the reader thread would have to route.
///
/// The errors are the message-path variants of [`DmaError`]:
/// [`WouldDeadlock`](DmaError::WouldDeadlock) when called from the thread
/// that would have to read the reply, [`Timeout`](DmaError::Timeout),
/// [`Disconnected`](DmaError::Disconnected), [`Busy`](DmaError::Busy) (too
/// many requests in flight), [`Revoked`](DmaError::Revoked) (the range was
/// closed), [`Remote`](DmaError::Remote) (the client answered with an
/// error), [`Protocol`](DmaError::Protocol) (a malformed reply) and
/// [`Io`](DmaError::Io) (the request could not be sent).
///
/// [`RangeUsers::is_cancelled`]: super::RangeUsers::is_cancelled
pub(crate) trait MessageDma: Send + Sync {
    /// Fills `buf` with guest memory at `gpa`, read by DMA_READ requests.
    /// On error, part of `buf` may already be filled.
    fn dma_read(&self, gpa: u64, buf: &mut [u8], range: &RangeUse) -> Result<(), DmaError>;

    /// Writes `data` to guest memory at `gpa` with DMA_WRITE requests. On
    /// error, part of it may already be written.
    fn dma_write(&self, gpa: u64, data: &[u8], range: &RangeUse) -> Result<(), DmaError>;

    /// Fails, with [`DmaError::Revoked`], every request waiting for a
    /// reply whose range is now cancelled (unmapped or fenced).
    fn cancel_closed(&self);

    /// The address space lets go of this path (the client went away, or a
    /// newer connection replaced it): requests still waiting fail with
    /// [`DmaError::Disconnected`] and new ones are refused.
    fn close(&self);
}
