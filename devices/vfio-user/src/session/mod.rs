//! One client connection, served on its reader thread: read every message,
//! route replies to our DMA requests, decode and check client commands,
//! call the device, reply.
//!
//! Replies to our DMA requests get stricter checks, because QEMU 11.1
//! drops the tail of a message its socket cannot take at once (see
//! devices/vfio-user/README.md): a reply header must match the request it
//! answers (id, command, flags, exact size) before its payload is read;
//! its payload must arrive without a pause (QEMU writes a message with one
//! sendmsg, so a pause inside it means the rest is gone); and the header
//! after a DMA_READ reply's data must look like a header before that data
//! reaches the device. Any failure fails that DMA and drops the
//! connection: the protocol has no marker to find the next header by, so
//! once bytes are missing nothing after them can be trusted.
//!
//! Stream sync is sacred: a message is always read to its last byte (the
//! header's size says how many) before it is judged, so a refused message
//! never leaves bytes behind for the next one. Only a header that cannot
//! describe a message (size below 16, or beyond any limit we could ever
//! negotiate), or a reply that does not fit our request (below), ends the
//! connection.

use std::borrow::Cow;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::config::ServerConfig;
use crate::device::{Device, DeviceError};
use crate::dma::{DmaError, DmaSpace, MessageDma};
use crate::link::Link;
use crate::protocol::{
    cmd, command_name, flags, Capabilities, Header, Reader, Writer, HEADER_SIZE,
    MAX_DATA_XFER_LIMIT, MESSAGE_OVERHEAD, VERSION_MAJOR, VERSION_MINOR,
};
use crate::record::Recorder;
use crate::socket::{peek, queued_bytes, recv_with_fds, wait_readable};

mod dma_cmds;
mod info;
mod region;

/// Smallest `max_data_xfer_size` a client may announce: one page.
const MIN_CLIENT_XFER: u32 = 4096;

/// How long the bytes of a reply may pause before we take the reply as cut
/// short. QEMU writes each message with one sendmsg, so its bytes arrive
/// within microseconds of each other; a second covers a descheduled QEMU
/// on a loaded host and stays far below the DMA timeout.
pub(crate) const REPLY_STALL: Duration = Duration::from_secs(1);

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEnd {
    /// The client closed the socket between messages.
    ClientClosed,
    /// [`ShutdownHandle::shutdown`](crate::ShutdownHandle::shutdown) was called.
    Shutdown,
    /// The client broke the protocol badly enough that the stream cannot
    /// be trusted (impossible header size, EOF inside a message).
    Protocol(String),
    /// A socket error.
    Io(String),
}

/// A refused request: the errno for the reply and a reason for the log.
#[derive(Debug)]
struct Refusal {
    errno: i32,
    why: Cow<'static, str>,
}

impl Refusal {
    fn new(errno: i32, why: impl Into<Cow<'static, str>>) -> Self {
        Refusal {
            errno,
            why: why.into(),
        }
    }
    fn inval(why: impl Into<Cow<'static, str>>) -> Self {
        Self::new(libc::EINVAL, why)
    }
}

impl From<DeviceError> for Refusal {
    fn from(e: DeviceError) -> Self {
        Refusal::new(e.errno, e.what)
    }
}

impl From<DmaError> for Refusal {
    fn from(e: DmaError) -> Self {
        Refusal::new(e.errno(), e.to_string())
    }
}

/// A successful reply: payload, and an fd to pass along.
#[derive(Default)]
struct Reply {
    payload: Vec<u8>,
    fd: Option<RawFd>,
}

impl Reply {
    fn empty() -> Self {
        Reply::default()
    }
    fn with(payload: Vec<u8>) -> Self {
        Reply { payload, fd: None }
    }
}

/// How a client command ends: a reply to send, or a refusal that becomes
/// an error reply (or a log line, for a command that asked for no reply).
type CommandOutcome = Result<Reply, Refusal>;

/// One fully read message.
struct Message {
    header: Header,
    /// `None` when the payload was over the size limit and discarded.
    payload: Option<Vec<u8>>,
    fds: Vec<OwnedFd>,
    fds_truncated: bool,
}

enum Inbound {
    Message(Message),
    Closed,
}

/// Where in the stream a read starts, which decides what an end of stream
/// means: the client hanging up, or a message cut short.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StreamPosition {
    /// Before the first byte of a message: EOF is a clean close.
    MessageStart,
    /// Inside a message: EOF breaks the protocol.
    InsideMessage,
}

/// What the client announced in VERSION, once negotiated.
struct Negotiated {
    client: Capabilities,
}

pub(crate) struct Session<'a> {
    config: &'a ServerConfig,
    device: &'a mut dyn Device,
    dma: &'a DmaSpace,
    stream: &'a UnixStream,
    link: Arc<Link>,
    negotiated: Option<Negotiated>,
    recorder: Option<&'a Recorder>,
}

impl<'a> Session<'a> {
    pub(crate) fn new(
        config: &'a ServerConfig,
        device: &'a mut dyn Device,
        dma: &'a DmaSpace,
        stream: &'a UnixStream,
        link: Arc<Link>,
        recorder: Option<&'a Recorder>,
    ) -> Self {
        Session {
            config,
            device,
            dma,
            stream,
            link,
            negotiated: None,
            recorder,
        }
    }

    /// Largest payload we accept: our transfer size plus room for the
    /// fixed part of any command.
    fn payload_limit(&self) -> usize {
        (self.config.max_data_xfer_size as usize).saturating_add(MESSAGE_OVERHEAD)
    }

    /// Serves messages until the connection ends.
    pub(crate) fn run(&mut self) -> ConnectionEnd {
        loop {
            let msg = match self.read_message() {
                Ok(Inbound::Message(m)) => m,
                Ok(Inbound::Closed) => return ConnectionEnd::ClientClosed,
                Err(end) => return end,
            };
            if msg.header.is_reply() {
                self.route_reply(msg);
                continue;
            }
            if let Err(end) = self.handle_command(msg) {
                return end;
            }
        }
    }

    // ----- reading -----

    /// Fills `buf` completely. `Ok(false)` means the peer closed the
    /// socket before the first byte (only allowed at a message start).
    fn read_full(
        &self,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
        truncated: &mut bool,
        position: StreamPosition,
    ) -> Result<bool, ConnectionEnd> {
        let max_fds = self.config.max_msg_fds as usize;
        let mut filled = 0;
        while filled < buf.len() {
            let rest = buf.get_mut(filled..).unwrap_or_default();
            let got = recv_with_fds(self.stream, rest, fds, max_fds)
                .map_err(|e| ConnectionEnd::Io(e.to_string()))?;
            *truncated |= got.fds_truncated;
            if got.bytes == 0 {
                if position == StreamPosition::MessageStart && filled == 0 {
                    return Ok(false);
                }
                return Err(ConnectionEnd::Protocol(format!(
                    "connection closed inside a message ({filled} of {} bytes)",
                    buf.len()
                )));
            }
            filled += got.bytes;
        }
        Ok(true)
    }

    fn read_message(&mut self) -> Result<Inbound, ConnectionEnd> {
        let mut fds = Vec::new();
        let mut fds_truncated = false;
        let mut raw = [0u8; HEADER_SIZE];
        if !self.read_full(
            &mut raw,
            &mut fds,
            &mut fds_truncated,
            StreamPosition::MessageStart,
        )? {
            return Ok(Inbound::Closed);
        }
        let header = Header::decode(&raw);
        let Some(payload_len) = header.payload_len() else {
            return Err(ConnectionEnd::Protocol(format!(
                "message {} ({}) claims size {} < header size",
                header.msg_id,
                command_name(header.command),
                header.size
            )));
        };
        let hard_limit = (MAX_DATA_XFER_LIMIT as usize).saturating_add(MESSAGE_OVERHEAD);
        if payload_len > hard_limit {
            return Err(ConnectionEnd::Protocol(format!(
                "message {} ({}) claims an absurd size of {} bytes",
                header.msg_id,
                command_name(header.command),
                header.size
            )));
        }
        if header.is_reply() {
            return self.read_reply(header, &raw, payload_len, fds, fds_truncated);
        }
        let payload = if payload_len > self.payload_limit() {
            // Over our limit but plausible: swallow it so the stream stays
            // in sync, then refuse it.
            let mut scratch = vec![0u8; 64 * 1024];
            let mut left = payload_len;
            while left > 0 {
                let n = left.min(scratch.len());
                let part = scratch.get_mut(..n).unwrap_or_default();
                self.read_full(
                    part,
                    &mut fds,
                    &mut fds_truncated,
                    StreamPosition::InsideMessage,
                )?;
                left -= n;
            }
            None
        } else {
            let mut payload = vec![0u8; payload_len];
            self.read_full(
                &mut payload,
                &mut fds,
                &mut fds_truncated,
                StreamPosition::InsideMessage,
            )?;
            Some(payload)
        };
        if let Some(recorder) = self.recorder {
            // An oversize payload was discarded: only its header is kept.
            recorder.message(&fds, &[&raw, payload.as_deref().unwrap_or_default()]);
        }
        Ok(Inbound::Message(Message {
            header,
            payload,
            fds,
            fds_truncated,
        }))
    }

    /// Reads a reply to one of our DMA requests after checking its header
    /// against the request (see the module comment). Any doubt ends the
    /// connection and fails the DMA: once the client dropped bytes,
    /// nothing tells where its next message starts.
    fn read_reply(
        &mut self,
        header: Header,
        raw: &[u8; HEADER_SIZE],
        payload_len: usize,
        mut fds: Vec<OwnedFd>,
        mut fds_truncated: bool,
    ) -> Result<Inbound, ConnectionEnd> {
        let out_of_sync = |why: String| {
            ConnectionEnd::Protocol(format!(
                "stream out of sync: {why}; the client probably cut an earlier \
                 message short (QEMU short write, see devices/vfio-user/README.md)"
            ))
        };
        if let Err(why) = self.link.check_reply(&header) {
            self.link
                .fail(header.msg_id, DmaError::Protocol(why.clone()));
            return Err(out_of_sync(why));
        }
        let mut payload = vec![0u8; payload_len];
        let mut filled = 0usize;
        let max_fds = self.config.max_msg_fds as usize;
        while filled < payload_len {
            if !wait_readable(self.stream, REPLY_STALL)
                .map_err(|e| ConnectionEnd::Io(e.to_string()))?
            {
                let why = format!(
                    "reply id {} ({}) cut short: {filled} of {payload_len} payload bytes \
                     arrived, then nothing for {REPLY_STALL:?}",
                    header.msg_id,
                    command_name(header.command)
                );
                self.link
                    .fail(header.msg_id, DmaError::Protocol(why.clone()));
                return Err(ConnectionEnd::Protocol(format!(
                    "{why}; QEMU drops what its socket cannot take at once \
                     (see devices/vfio-user/README.md)"
                )));
            }
            let rest = payload.get_mut(filled..).unwrap_or_default();
            let got = recv_with_fds(self.stream, rest, &mut fds, max_fds)
                .map_err(|e| ConnectionEnd::Io(e.to_string()))?;
            fds_truncated |= got.fds_truncated;
            if got.bytes == 0 {
                return Err(ConnectionEnd::Protocol(format!(
                    "connection closed inside a reply ({filled} of {payload_len} payload bytes)"
                )));
            }
            filled += got.bytes;
        }
        if header.command == cmd::DMA_READ && !header.is_error() {
            if let Err(why) = self.next_header_fits() {
                let why = format!(
                    "after DMA_READ reply id {} ({payload_len} bytes): {why}",
                    header.msg_id
                );
                self.link
                    .fail(header.msg_id, DmaError::Protocol(why.clone()));
                return Err(out_of_sync(why));
            }
        }
        if let Some(recorder) = self.recorder {
            recorder.message(&fds, &[raw, &payload]);
        }
        Ok(Inbound::Message(Message {
            header,
            payload: Some(payload),
            fds,
            fds_truncated,
        }))
    }

    /// Whether the bytes after a DMA_READ reply start a plausible message.
    /// If the client cut that reply short, its data ran into the next
    /// message and what follows starts mid-message: caught here, before
    /// the data reaches the device. Nothing waiting means the reply ended
    /// where the client's write did, which is fine.
    fn next_header_fits(&self) -> Result<(), String> {
        let io = |e: std::io::Error| format!("socket error: {e}");
        if queued_bytes(self.stream).map_err(io)? == 0 {
            return Ok(());
        }
        let mut next = [0u8; HEADER_SIZE];
        let deadline = Instant::now() + REPLY_STALL;
        loop {
            if peek(self.stream, &mut next).map_err(io)? == HEADER_SIZE {
                break;
            }
            if Instant::now() >= deadline {
                return Err("the next message's header did not arrive whole".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let next = Header::decode(&next);
        let max_size = (MAX_DATA_XFER_LIMIT as usize)
            .saturating_add(MESSAGE_OVERHEAD)
            .saturating_add(HEADER_SIZE);
        if let Some(why) = next.implausible(max_size) {
            return Err(format!("the next 16 bytes are no header ({why})"));
        }
        if next.is_reply() {
            self.link
                .check_reply(&next)
                .map_err(|why| format!("the next message is a bad reply: {why}"))?;
        }
        Ok(())
    }

    fn route_reply(&self, msg: Message) {
        let header = msg.header;
        debug!(
            id = header.msg_id,
            cmd = command_name(header.command),
            size = header.size,
            error = header.is_error(),
            "reply from client"
        );
        let payload = msg.payload.ok_or_else(|| {
            DmaError::Protocol(format!("reply of {} bytes exceeds the limit", header.size))
        });
        // fds in a reply are never expected; dropping `msg.fds` closes them.
        self.link.deliver(&header, payload);
    }

    // ----- writing -----

    fn send_reply(&self, request: &Header, reply: Reply) -> Result<(), ConnectionEnd> {
        let header = request.reply(reply.payload.len()).encode();
        let mut fds: Vec<RawFd> = Vec::new();
        if let Some(fd) = reply.fd {
            let client_max = self
                .negotiated
                .as_ref()
                .map(|n| n.client.max_msg_fds)
                .unwrap_or(1);
            if client_max >= 1 {
                fds.push(fd);
            } else {
                p2plab_ratelimit::log_limited!(warn, "client accepts no fds; region fd not sent");
            }
        }
        self.link
            .send(&[&header, &reply.payload], &fds)
            .map_err(|e| ConnectionEnd::Io(e.to_string()))
    }

    fn send_error(&self, request: &Header, errno: i32) -> Result<(), ConnectionEnd> {
        let header = request.error_reply(errno).encode();
        self.link
            .send(&[&header], &[])
            .map_err(|e| ConnectionEnd::Io(e.to_string()))
    }

    // ----- commands -----

    fn handle_command(&mut self, msg: Message) -> Result<(), ConnectionEnd> {
        let header = msg.header;
        debug!(
            id = header.msg_id,
            cmd = command_name(header.command),
            size = header.size,
            fds = msg.fds.len(),
            no_reply = header.no_reply(),
            "request"
        );
        let result = if header.message_type() != flags::TYPE_COMMAND {
            Err(Refusal::inval(format!(
                "message type {} is neither command nor reply",
                header.message_type()
            )))
        } else if msg.fds_truncated {
            Err(Refusal::inval(format!(
                "more than {} fds in one message",
                self.config.max_msg_fds
            )))
        } else {
            match msg.payload {
                None => Err(Refusal::new(
                    libc::E2BIG,
                    format!(
                        "message of {} bytes exceeds the limit of {}",
                        header.size,
                        self.payload_limit() + HEADER_SIZE
                    ),
                )),
                Some(payload) => {
                    if self.negotiated.is_none() && header.command != cmd::VERSION {
                        Err(Refusal::inval("VERSION must be the first message"))
                    } else {
                        self.dispatch(header.command, &payload, msg.fds)
                    }
                }
            }
        };
        match result {
            Ok(reply) => {
                if header.no_reply() {
                    Ok(())
                } else {
                    self.send_reply(&header, reply)
                }
            }
            Err(refusal) => {
                if header.no_reply() {
                    p2plab_ratelimit::log_limited!(
                        warn,
                        id = header.msg_id,
                        cmd = command_name(header.command),
                        errno = refusal.errno,
                        "posted request failed (no reply possible): {}",
                        refusal.why
                    );
                    Ok(())
                } else {
                    debug!(
                        id = header.msg_id,
                        cmd = command_name(header.command),
                        errno = refusal.errno,
                        "refused: {}",
                        refusal.why
                    );
                    self.send_error(&header, refusal.errno)
                }
            }
        }
    }

    fn dispatch(&mut self, command: u16, payload: &[u8], fds: Vec<OwnedFd>) -> CommandOutcome {
        // Commands that take no fds close any they got (dropping the Vec).
        match command {
            cmd::VERSION => self.version(payload),
            cmd::DMA_MAP => self.dma_map(payload, fds),
            cmd::DMA_UNMAP => self.dma_unmap(payload),
            cmd::DEVICE_GET_INFO => self.device_get_info(payload),
            cmd::DEVICE_GET_REGION_INFO => self.region_info(payload),
            cmd::DEVICE_GET_IRQ_INFO => self.irq_info(payload),
            cmd::DEVICE_SET_IRQS => self.set_irqs(payload, fds),
            cmd::REGION_READ => self.region_read(payload),
            cmd::REGION_WRITE => self.region_write(payload),
            cmd::REGION_WRITE_MULTI => self.region_write_multi(payload),
            cmd::DEVICE_RESET => self.device_reset(),
            // Same answer as the kernel for a feature it does not know.
            cmd::DEVICE_FEATURE => Err(Refusal::new(libc::ENOTTY, "no device features")),
            cmd::DMA_READ | cmd::DMA_WRITE => Err(Refusal::inval(
                "DMA_READ/DMA_WRITE go from server to client",
            )),
            cmd::DEVICE_GET_REGION_IO_FDS
            | cmd::DIRTY_PAGES
            | cmd::MIG_DATA_READ
            | cmd::MIG_DATA_WRITE => Err(Refusal::new(libc::ENOTSUP, "not supported")),
            other => Err(Refusal::new(
                libc::ENOSYS,
                format!("unknown command {other}"),
            )),
        }
    }

    /// DEVICE_RESET. DMA to client memory is fenced while the device
    /// resets: device threads blocked in DMA (a message waiting for a reply
    /// only this thread could route) fail at once, so the device can wait
    /// for them (the [`Device::reset`] contract). The reply goes out once
    /// the device has quiesced.
    fn device_reset(&mut self) -> CommandOutcome {
        let (fence, drained) = self.dma.fence();
        if let Err(e) = &drained {
            warn!("device reset: {e}");
        }
        let reset = self.device.reset();
        drop(fence);
        reset?;
        Ok(Reply::empty())
    }

    fn version(&mut self, payload: &[u8]) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let (Some(major), Some(minor)) = (r.u16(), r.u16()) else {
            return Err(Refusal::inval("VERSION payload shorter than 4 bytes"));
        };
        if self.negotiated.is_some() {
            return Err(Refusal::inval("version already negotiated"));
        }
        if major != VERSION_MAJOR {
            return Err(Refusal::new(
                libc::ENOTSUP,
                format!("protocol major {major} is not supported (only {VERSION_MAJOR})"),
            ));
        }
        let client = Capabilities::parse(r.rest()).map_err(|e| Refusal::inval(e.to_string()))?;
        // Our DMA messages are cut to the client's size: below a page a
        // DMA would become thousands of round trips per MiB.
        if client.max_data_xfer_size < MIN_CLIENT_XFER {
            return Err(Refusal::inval(format!(
                "max_data_xfer_size {} is below {MIN_CLIENT_XFER}",
                client.max_data_xfer_size
            )));
        }
        let pgsizes = client.pgsizes & self.config.pgsizes;
        if pgsizes == 0 {
            return Err(Refusal::new(
                libc::ENOTSUP,
                format!("no common page size (client {:#x})", client.pgsizes),
            ));
        }
        let ours = Capabilities {
            max_msg_fds: self.config.max_msg_fds,
            max_data_xfer_size: self.config.max_data_xfer_size,
            pgsizes,
            max_dma_maps: self.config.max_dma_maps,
            // Capabilities in the reply must be a subset of the proposal.
            write_multiple: self.config.write_multiple && client.write_multiple,
        };
        // Our own DMA messages must fit what the client accepts.
        let dma_xfer = client
            .max_data_xfer_size
            .min(self.config.max_data_xfer_size);
        self.link.set_max_xfer(dma_xfer as usize);
        debug!(
            major,
            minor,
            ?client,
            reply = ?ours,
            dma_xfer,
            "version negotiated"
        );
        self.negotiated = Some(Negotiated { client });
        self.dma
            .attach(Arc::clone(&self.link) as Arc<dyn MessageDma>);

        let json = ours.to_version_data();
        let mut w = Writer::with_capacity(4 + json.len());
        // We speak minor 0, which every client must support (the spec
        // requires all minors up to the proposed one).
        w.u16(VERSION_MAJOR).u16(VERSION_MINOR).bytes(&json);
        Ok(Reply::with(w.finish()))
    }
}

/// Debug-formats small buffers as hex for access logs; long ones are cut.
struct Hex<'a>(&'a [u8]);

impl std::fmt::Debug for Hex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 16;
        for b in self.0.iter().take(SHOWN) {
            write!(f, "{b:02x}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, "..(+{})", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}
