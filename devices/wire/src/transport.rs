//! What a stream transport provides the wire: connections to one peer,
//! checked before they are handed over. The unix socket is
//! [`crate::unix::UnixTransport`]; a TCP transport (two labs on two hosts,
//! issue 25) implements the same two traits and no device changes.
//!
//! The wire itself ([`crate::Wire`]) does the rest, the same for every
//! transport: one peer at a time (a second is refused and logged), frames
//! encoded and decoded on the stream, sends bounded by a timeout, and
//! reads only while the receiver has room (flow control).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connected, reliable byte stream to the peer.
pub trait Stream: Read + Write + Send + Sync + 'static {
    /// The fd the wire polls for readability.
    fn poll_fd(&self) -> RawFd;
    /// A second handle on the same connection (one writes, one reads).
    fn clone_stream(&self) -> io::Result<Box<dyn Stream>>;
    /// Ends the connection both ways; blocked reads and writes return.
    fn close(&self);
    /// How long one write may block (the wire writes in such slices and
    /// checks between them whether it should give up).
    fn set_write_slice(&self, slice: Duration) -> io::Result<()>;
    /// How long one read may block.
    fn set_read_slice(&self, slice: Duration) -> io::Result<()>;
}

impl Stream for UnixStream {
    fn poll_fd(&self) -> RawFd {
        self.as_raw_fd()
    }

    fn clone_stream(&self) -> io::Result<Box<dyn Stream>> {
        Ok(Box::new(self.try_clone()?))
    }

    fn close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }

    fn set_write_slice(&self, slice: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(slice))
    }

    fn set_read_slice(&self, slice: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(slice))
    }
}

/// What a transport found when asked for a peer.
pub enum Arrival {
    /// A connection that passed the transport's checks, and who it is
    /// (for the log: "uid 1000").
    Peer(Box<dyn Stream>, String),
    /// A connection refused by the transport's checks, and why. The
    /// connection itself, where the transport still holds it, is closed
    /// by the wire only after it counted the refusal: a peer that sees
    /// its connection end then finds it counted.
    Refused(String, Option<Box<dyn Stream>>),
    /// Nothing yet.
    Nothing,
}

/// Where connections to the peer come from.
pub trait Transport: Send + 'static {
    /// The transport as the user named it (`listen:/run/x/wire.sock`).
    fn describe(&self) -> String;
    /// A listening transport's fd, polled for incoming connections; `None`
    /// for one that dials.
    fn listen_fd(&self) -> Option<RawFd>;
    /// Takes one incoming connection (called when the listening fd is
    /// readable) and checks who it is.
    fn accept(&mut self) -> Arrival;
    /// Connects to the peer (called while a dialing transport has none)
    /// and checks who it is.
    fn dial(&mut self) -> Arrival;
}
