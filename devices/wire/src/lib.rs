//! p2plab-wire: the wire between RDMA-like devices (the NIC today, the
//! EFA next), knowing no device.
//!
//! A device hands [`Wire::send_impaired`] a [`Frame`] (a payload with a
//! CRC-32C FCS, a sequence number, and source and destination
//! [`Endpoint`]s) and what to do to it ([`Impairment`]: drop, delay,
//! corrupt, reorder); the peer device takes it with
//! [`Wire::recv_timeout`]. [`WireStats`] counts what happened.
//!
//! The wire is lossless by itself: a receiver that takes no frames stops
//! reading, the stream fills and the sender waits (link-level flow
//! control, like Ethernet PAUSE), but never longer than the send timeout
//! ([`WireOptions::send_timeout`], 10 s by default), and never once the
//! device gives up (a reset).
//!
//! Ends: [`Wire::loopback`] and [`Wire::pair`] in one process; over a
//! stream [`Transport`] between processes: [`UnixTransport`] (listen or
//! connect on a unix socket, mode 0600 from bind, peers checked with
//! SO_PEERCRED, one peer at a time) and [`TcpTransport`] (two labs on two
//! hosts or in two network namespaces: the peer proves it holds a
//! pre-shared [`WireKey`] by an HMAC challenge-response, [`handshake`]).
//!
//! Modules, lowest first (each imports only those before it):
//!
//! | module | what |
//! |---|---|
//! | [`frame`] | the frame header, [`Frame`], the FCS, the pure [`Decoder`] |
//! | [`impair`] | [`Impairment`], corruption, the [`Outbox`] that holds reordered frames |
//! | [`stats`] | [`WireStats`] and its serde snapshot |
//! | [`order`] | arrival order on the receiving end |
//! | [`config`] | [`WireConfig`] (`--wire`), [`WireOptions`], [`SEND_TIMEOUT`] |
//! | [`transport`] | the [`Transport`] and [`Stream`] traits |
//! | [`unix`] | [`UnixTransport`] |
//! | [`key`] | [`WireKey`], the TCP transport's pre-shared key file |
//! | [`handshake`] | the TCP peer check, a pure state machine |
//! | [`tcp`] | [`TcpTransport`] |
//! | `core` | what the threads share; the one bounded send path |
//! | `link` | the link thread of a stream wire (one peer, reads under flow control) |
//! | `wire` | [`Wire`], the device's handle |

pub mod config;
mod core;
pub mod frame;
pub mod handshake;
pub mod impair;
pub mod key;
mod link;
pub mod order;
pub mod stats;
pub mod tcp;
pub mod testing;
pub mod transport;
pub mod unix;
mod wire;

pub use crate::core::SendError;
pub use config::{WireConfig, WireOptions, QUEUE_FRAMES, SEND_TIMEOUT};
pub use frame::{fcs, DecodeError, Decoder, Endpoint, Frame, DEFAULT_MAX_PAYLOAD};
pub use handshake::{Handshake, HandshakeError, Role};
pub use impair::{Impairment, Outbox, HOLD_LIMIT};
pub use key::WireKey;
pub use stats::{WireStats, WireStatsSnapshot};
pub use tcp::{TcpOptions, TcpTransport};
pub use transport::{Arrival, Stream, Transport};
pub use unix::UnixTransport;
pub use wire::{Sent, Wire};
