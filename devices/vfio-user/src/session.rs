//! One client connection, served on its reader thread: read every message,
//! route replies to our DMA requests, decode and check client commands,
//! call the device, reply.
//!
//! Stream sync is sacred: a message is always read to its last byte (the
//! header's size says how many) before it is judged, so a refused message
//! never leaves bytes behind for the next one. Only a header that cannot
//! describe a message (size below 16, or beyond any limit we could ever
//! negotiate) ends the connection.

use std::borrow::Cow;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tracing::{debug, warn};
use vfio_bindings::bindings::vfio::{
    VFIO_DMA_UNMAP_FLAG_ALL, VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP, VFIO_IRQ_SET_ACTION_MASK,
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_TYPE_MASK, VFIO_IRQ_SET_ACTION_UNMASK,
    VFIO_IRQ_SET_DATA_BOOL, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_IRQ_SET_DATA_TYPE_MASK, VFIO_REGION_INFO_CAP_SPARSE_MMAP, VFIO_REGION_INFO_FLAG_CAPS,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vmm_sys_util::eventfd::EventFd;

use crate::device::{Device, DeviceError, IrqAction, IrqData, IrqSet};
use crate::dma::{DmaError, DmaSpace, Perms};
use crate::link::Link;
use crate::protocol::{
    cmd, command_name, flags, Capabilities, Header, Reader, Writer, DMA_MAP_READ, DMA_MAP_WRITE,
    HEADER_SIZE, MAX_DATA_XFER_LIMIT, MESSAGE_OVERHEAD, VERSION_MAJOR, VERSION_MINOR,
};
use crate::server::{ConnectionEnd, ServerConfig};
use crate::socket::recv_with_fds;

/// Size of `struct vfio_region_info` (argsz .. offset).
const REGION_INFO_SIZE: usize = 32;
/// Size of `struct vfio_device_info` and `struct vfio_irq_info` replies.
const DEVICE_INFO_SIZE: u32 = 16;
const IRQ_INFO_SIZE: u32 = 16;
/// One entry of REGION_WRITE_MULTI: offset, region, count, 8 data bytes.
const WRITE_MULTI_ENTRY: usize = 24;
const WRITE_MULTI_DATA: usize = 8;

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

type Handled = Result<Reply, Refusal>;

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
}

impl<'a> Session<'a> {
    pub(crate) fn new(
        config: &'a ServerConfig,
        device: &'a mut dyn Device,
        dma: &'a DmaSpace,
        stream: &'a UnixStream,
        link: Arc<Link>,
    ) -> Self {
        Session {
            config,
            device,
            dma,
            stream,
            link,
            negotiated: None,
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
        at_start: bool,
    ) -> Result<bool, ConnectionEnd> {
        let max_fds = self.config.max_msg_fds as usize;
        let mut filled = 0;
        while filled < buf.len() {
            let rest = buf.get_mut(filled..).unwrap_or_default();
            let got = recv_with_fds(self.stream, rest, fds, max_fds)
                .map_err(|e| ConnectionEnd::Io(e.to_string()))?;
            *truncated |= got.fds_truncated;
            if got.bytes == 0 {
                if at_start && filled == 0 {
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
        if !self.read_full(&mut raw, &mut fds, &mut fds_truncated, true)? {
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
        let payload = if payload_len > self.payload_limit() {
            // Over our limit but plausible: swallow it so the stream stays
            // in sync, then refuse it.
            let mut scratch = vec![0u8; 64 * 1024];
            let mut left = payload_len;
            while left > 0 {
                let n = left.min(scratch.len());
                let part = scratch.get_mut(..n).unwrap_or_default();
                self.read_full(part, &mut fds, &mut fds_truncated, false)?;
                left -= n;
            }
            None
        } else {
            let mut payload = vec![0u8; payload_len];
            self.read_full(&mut payload, &mut fds, &mut fds_truncated, false)?;
            Some(payload)
        };
        Ok(Inbound::Message(Message {
            header,
            payload,
            fds,
            fds_truncated,
        }))
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
                warn!("client accepts no fds; region fd not sent");
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
                    warn!(
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

    fn dispatch(&mut self, command: u16, payload: &[u8], fds: Vec<OwnedFd>) -> Handled {
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
            cmd::DEVICE_RESET => {
                self.device.reset()?;
                Ok(Reply::empty())
            }
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

    fn version(&mut self, payload: &[u8]) -> Handled {
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
        if client.max_data_xfer_size == 0 {
            return Err(Refusal::inval("max_data_xfer_size 0"));
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
        self.dma.attach(Arc::clone(&self.link));

        let json = ours.to_version_data();
        let mut w = Writer::with_capacity(4 + json.len());
        // We speak minor 0, which every client must support (the spec
        // requires all minors up to the proposed one).
        w.u16(VERSION_MAJOR).u16(VERSION_MINOR).bytes(&json);
        Ok(Reply::with(w.finish()))
    }

    fn dma_map(&mut self, payload: &[u8], mut fds: Vec<OwnedFd>) -> Handled {
        let mut r = Reader::new(payload);
        let (Some(_argsz), Some(map_flags), Some(offset), Some(gpa), Some(size)) =
            (r.u32(), r.u32(), r.u64(), r.u64(), r.u64())
        else {
            return Err(Refusal::inval("DMA_MAP payload shorter than 32 bytes"));
        };
        debug!(
            gpa,
            size,
            offset,
            flags = map_flags,
            fd = !fds.is_empty(),
            "DMA_MAP"
        );
        if map_flags & !(DMA_MAP_READ | DMA_MAP_WRITE) != 0 {
            return Err(Refusal::inval(format!(
                "unknown DMA_MAP flags {map_flags:#x}"
            )));
        }
        let perms = Perms {
            read: map_flags & DMA_MAP_READ != 0,
            write: map_flags & DMA_MAP_WRITE != 0,
        };
        if !perms.read && !perms.write {
            return Err(Refusal::inval("DMA_MAP with neither read nor write"));
        }
        if size == 0 {
            return Err(Refusal::inval("DMA_MAP of size 0"));
        }
        if fds.len() > 1 {
            return Err(Refusal::inval("DMA_MAP with more than one fd"));
        }
        if self.dma.mapping_count() >= self.config.max_dma_maps as usize {
            return Err(Refusal::new(
                libc::ENOSPC,
                format!("already {} DMA mappings", self.config.max_dma_maps),
            ));
        }
        match fds.pop() {
            Some(fd) => self.dma.map_fd(gpa, size, perms, fd, offset)?,
            None => self.dma.map_message_only(gpa, size, perms)?,
        }
        self.device.dma_changed();
        Ok(Reply::empty())
    }

    fn dma_unmap(&mut self, payload: &[u8]) -> Handled {
        let mut r = Reader::new(payload);
        let (Some(_argsz), Some(unmap_flags), Some(gpa), Some(size)) =
            (r.u32(), r.u32(), r.u64(), r.u64())
        else {
            return Err(Refusal::inval("DMA_UNMAP payload shorter than 24 bytes"));
        };
        debug!(gpa, size, flags = unmap_flags, "DMA_UNMAP");
        if unmap_flags & VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP != 0 {
            return Err(Refusal::new(
                libc::ENOTSUP,
                "dirty page tracking is not supported",
            ));
        }
        if unmap_flags & !VFIO_DMA_UNMAP_FLAG_ALL != 0 {
            return Err(Refusal::inval(format!(
                "unknown DMA_UNMAP flags {unmap_flags:#x}"
            )));
        }
        if unmap_flags & VFIO_DMA_UNMAP_FLAG_ALL != 0 {
            if gpa != 0 || size != 0 {
                return Err(Refusal::inval("unmap-all with a non-zero range"));
            }
            self.dma.unmap_all();
        } else {
            if size == 0 {
                return Err(Refusal::inval("DMA_UNMAP of size 0"));
            }
            self.dma.unmap(gpa, size)?;
        }
        self.device.dma_changed();
        // The reply echoes the request's entry.
        let mut w = Writer::with_capacity(24);
        w.u32(24).u32(unmap_flags).u64(gpa).u64(size);
        Ok(Reply::with(w.finish()))
    }

    fn device_get_info(&mut self, payload: &[u8]) -> Handled {
        let argsz = Reader::new(payload)
            .u32()
            .ok_or_else(|| Refusal::inval("DEVICE_GET_INFO without argsz"))?;
        if argsz < DEVICE_INFO_SIZE {
            return Err(Refusal::inval(format!(
                "DEVICE_GET_INFO argsz {argsz} < {DEVICE_INFO_SIZE}"
            )));
        }
        let info = self.device.device_info();
        let mut w = Writer::with_capacity(16);
        w.u32(DEVICE_INFO_SIZE)
            .u32(info.flags)
            .u32(info.num_regions)
            .u32(info.num_irqs);
        Ok(Reply::with(w.finish()))
    }

    fn check_region_index(&self, index: u32) -> Result<(), Refusal> {
        let regions = self.device.device_info().num_regions;
        if index >= regions {
            return Err(Refusal::inval(format!(
                "region {index} does not exist ({regions} regions)"
            )));
        }
        Ok(())
    }

    fn region_info(&mut self, payload: &[u8]) -> Handled {
        let mut r = Reader::new(payload);
        let (Some(argsz), Some(_flags), Some(index)) = (r.u32(), r.u32(), r.u32()) else {
            return Err(Refusal::inval("GET_REGION_INFO payload too short"));
        };
        if payload.len() < REGION_INFO_SIZE || (argsz as usize) < REGION_INFO_SIZE {
            return Err(Refusal::inval(format!(
                "GET_REGION_INFO argsz {argsz} / payload {} < {REGION_INFO_SIZE}",
                payload.len()
            )));
        }
        self.check_region_index(index)?;
        let info = self.device.region_info(index)?;

        // Sparse-mmap capability, placed right after vfio_region_info.
        let mut caps = Writer::default();
        if !info.mmap_areas.is_empty() {
            let nr_areas = u32::try_from(info.mmap_areas.len())
                .map_err(|_| Refusal::inval("too many mmap areas"))?;
            caps.u16(VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16)
                .u16(1) // capability version
                .u32(0) // next: end of the list
                .u32(nr_areas)
                .u32(0); // reserved
            for area in &info.mmap_areas {
                caps.u64(area.offset).u64(area.size);
            }
        }
        let caps = caps.finish();
        let needed = REGION_INFO_SIZE + caps.len();
        let needed32 =
            u32::try_from(needed).map_err(|_| Refusal::inval("region info too large"))?;
        // VFIO semantics: if the caller's buffer is too small, report the
        // size needed and leave the capabilities (and the fd) for the retry.
        let complete = argsz as usize >= needed;

        let mut region_flags = info.flags;
        if info.fd.is_some() {
            region_flags |= VFIO_REGION_INFO_FLAG_MMAP;
        }
        let mut cap_offset = 0;
        if complete && !caps.is_empty() {
            region_flags |= VFIO_REGION_INFO_FLAG_CAPS;
            cap_offset = REGION_INFO_SIZE as u32;
        } else {
            region_flags &= !VFIO_REGION_INFO_FLAG_CAPS;
        }
        debug!(
            index,
            size = info.size,
            flags = region_flags,
            fd = info.fd.is_some(),
            areas = info.mmap_areas.len(),
            argsz,
            needed,
            "GET_REGION_INFO"
        );
        let mut w = Writer::with_capacity(needed);
        w.u32(needed32)
            .u32(region_flags)
            .u32(index)
            .u32(cap_offset)
            .u64(info.size)
            .u64(info.fd_offset);
        if complete {
            w.bytes(&caps);
        }
        Ok(Reply {
            payload: w.finish(),
            fd: if complete { info.fd } else { None },
        })
    }

    fn irq_info(&mut self, payload: &[u8]) -> Handled {
        let mut r = Reader::new(payload);
        let (Some(argsz), Some(_flags), Some(index)) = (r.u32(), r.u32(), r.u32()) else {
            return Err(Refusal::inval("GET_IRQ_INFO payload too short"));
        };
        if argsz < IRQ_INFO_SIZE {
            return Err(Refusal::inval(format!(
                "GET_IRQ_INFO argsz {argsz} < {IRQ_INFO_SIZE}"
            )));
        }
        self.check_irq_index(index)?;
        let info = self.device.irq_info(index)?;
        debug!(
            index,
            flags = info.flags,
            count = info.count,
            "GET_IRQ_INFO"
        );
        let mut w = Writer::with_capacity(16);
        w.u32(IRQ_INFO_SIZE)
            .u32(info.flags)
            .u32(index)
            .u32(info.count);
        Ok(Reply::with(w.finish()))
    }

    fn check_irq_index(&self, index: u32) -> Result<(), Refusal> {
        let irqs = self.device.device_info().num_irqs;
        if index >= irqs {
            return Err(Refusal::inval(format!(
                "irq index {index} does not exist ({irqs} indexes)"
            )));
        }
        Ok(())
    }

    fn set_irqs(&mut self, payload: &[u8], fds: Vec<OwnedFd>) -> Handled {
        let mut r = Reader::new(payload);
        let (Some(_argsz), Some(set_flags), Some(index), Some(start), Some(count)) =
            (r.u32(), r.u32(), r.u32(), r.u32(), r.u32())
        else {
            return Err(Refusal::inval("SET_IRQS payload shorter than 20 bytes"));
        };
        debug!(
            index,
            start,
            count,
            flags = set_flags,
            fds = fds.len(),
            "SET_IRQS"
        );
        let data_kind = set_flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
        let action_kind = set_flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
        if set_flags & !(VFIO_IRQ_SET_DATA_TYPE_MASK | VFIO_IRQ_SET_ACTION_TYPE_MASK) != 0
            || data_kind.count_ones() != 1
            || action_kind.count_ones() != 1
        {
            return Err(Refusal::inval(format!(
                "SET_IRQS flags {set_flags:#x} must name one data type and one action"
            )));
        }
        let action = match action_kind {
            VFIO_IRQ_SET_ACTION_MASK => IrqAction::Mask,
            VFIO_IRQ_SET_ACTION_UNMASK => IrqAction::Unmask,
            VFIO_IRQ_SET_ACTION_TRIGGER => IrqAction::Trigger,
            _ => return Err(Refusal::inval("unknown SET_IRQS action")),
        };
        self.check_irq_index(index)?;

        // count 0 + DATA_NONE + TRIGGER: disable every vector of the index.
        if count == 0 && data_kind == VFIO_IRQ_SET_DATA_NONE && action == IrqAction::Trigger {
            if !fds.is_empty() {
                return Err(Refusal::inval("fds sent with DATA_NONE"));
            }
            self.device.set_irqs(IrqSet {
                index,
                action,
                start,
                count: 0,
                data: IrqData::EventFds(Vec::new()),
            })?;
            return Ok(Reply::empty());
        }

        if count == 0 {
            // Nothing to act on. QEMU never sends this; refuse the data
            // kinds where it would be ambiguous with "disable all".
            if data_kind == VFIO_IRQ_SET_DATA_NONE && fds.is_empty() {
                return Ok(Reply::empty());
            }
            return Err(Refusal::inval("SET_IRQS with count 0"));
        }
        let vectors = self.device.irq_info(index)?.count;
        match start.checked_add(count) {
            Some(end) if end <= vectors => {}
            _ => {
                return Err(Refusal::inval(format!(
                    "vectors {start}+{count} exceed the {vectors} of irq index {index}"
                )))
            }
        }
        let data = match data_kind {
            VFIO_IRQ_SET_DATA_NONE => {
                if !fds.is_empty() {
                    return Err(Refusal::inval("fds sent with DATA_NONE"));
                }
                IrqData::None
            }
            VFIO_IRQ_SET_DATA_BOOL => {
                if !fds.is_empty() {
                    return Err(Refusal::inval("fds sent with DATA_BOOL"));
                }
                let bools = r.take(count as usize).ok_or_else(|| {
                    Refusal::inval(format!("DATA_BOOL needs {count} bytes of data"))
                })?;
                IrqData::Bool(bools.iter().map(|&b| b != 0).collect())
            }
            VFIO_IRQ_SET_DATA_EVENTFD => {
                if fds.is_empty() {
                    // No fds: unbind the vectors (QEMU sends -1 this way).
                    IrqData::EventFds((0..count).map(|_| None).collect())
                } else if fds.len() == count as usize {
                    IrqData::EventFds(
                        fds.into_iter()
                            // SAFETY: each fd was received over the socket
                            // and is owned by us alone; EventFd takes over
                            // that ownership.
                            .map(|fd| Some(unsafe { EventFd::from_raw_fd(fd.into_raw_fd()) }))
                            .collect(),
                    )
                } else {
                    return Err(Refusal::inval(format!(
                        "DATA_EVENTFD with {} fds for {count} vectors",
                        fds.len()
                    )));
                }
            }
            _ => return Err(Refusal::inval("unknown SET_IRQS data type")),
        };
        self.device.set_irqs(IrqSet {
            index,
            action,
            start,
            count,
            data,
        })?;
        Ok(Reply::empty())
    }

    /// Checks a region access against the region's size and flags.
    fn check_access(
        &self,
        index: u32,
        offset: u64,
        count: usize,
        write: bool,
    ) -> Result<(), Refusal> {
        if count > self.config.max_data_xfer_size as usize {
            return Err(Refusal::new(
                libc::E2BIG,
                format!("access of {count} bytes exceeds max_data_xfer_size"),
            ));
        }
        self.check_region_index(index)?;
        let info = self.device.region_info(index)?;
        let needed = if write {
            VFIO_REGION_INFO_FLAG_WRITE
        } else {
            VFIO_REGION_INFO_FLAG_READ
        };
        if info.flags & needed == 0 {
            return Err(Refusal::new(
                libc::EACCES,
                format!(
                    "region {index} is not {}",
                    if write { "writable" } else { "readable" }
                ),
            ));
        }
        match offset.checked_add(count as u64) {
            Some(end) if end <= info.size => Ok(()),
            _ => Err(Refusal::inval(format!(
                "access {offset:#x}+{count} outside region {index} of {} bytes",
                info.size
            ))),
        }
    }

    fn region_read(&mut self, payload: &[u8]) -> Handled {
        let mut r = Reader::new(payload);
        let (Some(offset), Some(index), Some(count)) = (r.u64(), r.u32(), r.u32()) else {
            return Err(Refusal::inval("REGION_READ payload shorter than 16 bytes"));
        };
        self.check_access(index, offset, count as usize, false)?;
        let mut data = vec![0u8; count as usize];
        if count > 0 {
            self.device.region_read(index, offset, &mut data)?;
        }
        debug!(region = index, offset, len = count, data = ?Hex(&data), "REGION_READ");
        let mut w = Writer::with_capacity(16 + data.len());
        w.u64(offset).u32(index).u32(count).bytes(&data);
        Ok(Reply::with(w.finish()))
    }

    fn region_write(&mut self, payload: &[u8]) -> Handled {
        let mut r = Reader::new(payload);
        let (Some(offset), Some(index), Some(count)) = (r.u64(), r.u32(), r.u32()) else {
            return Err(Refusal::inval("REGION_WRITE payload shorter than 16 bytes"));
        };
        let data = r.rest();
        if data.len() != count as usize {
            return Err(Refusal::inval(format!(
                "REGION_WRITE count {count} but {} data bytes",
                data.len()
            )));
        }
        self.check_access(index, offset, data.len(), true)?;
        debug!(region = index, offset, len = count, data = ?Hex(data), "REGION_WRITE");
        if count > 0 {
            self.device.region_write(index, offset, data)?;
        }
        let mut w = Writer::with_capacity(16);
        w.u64(offset).u32(index).u32(count);
        Ok(Reply::with(w.finish()))
    }

    fn region_write_multi(&mut self, payload: &[u8]) -> Handled {
        let mut r = Reader::new(payload);
        let wr_cnt = r
            .u64()
            .ok_or_else(|| Refusal::inval("REGION_WRITE_MULTI without wr_cnt"))?;
        let expected = usize::try_from(wr_cnt)
            .ok()
            .and_then(|n| n.checked_mul(WRITE_MULTI_ENTRY));
        if expected != Some(r.rest().len()) {
            return Err(Refusal::inval(format!(
                "REGION_WRITE_MULTI wr_cnt {wr_cnt} but {} bytes of entries",
                r.rest().len()
            )));
        }
        // Check every entry before applying any, so a bad one does not
        // leave half the batch applied.
        let mut writes = Vec::with_capacity(expected.unwrap_or(0) / WRITE_MULTI_ENTRY);
        for _ in 0..wr_cnt {
            let (Some(offset), Some(index), Some(count), Some(data)) =
                (r.u64(), r.u32(), r.u32(), r.take(WRITE_MULTI_DATA))
            else {
                return Err(Refusal::inval("truncated REGION_WRITE_MULTI entry"));
            };
            let data = data
                .get(..count as usize)
                .filter(|d| !d.is_empty())
                .ok_or_else(|| {
                    Refusal::inval(format!("REGION_WRITE_MULTI entry count {count} not 1..=8"))
                })?;
            self.check_access(index, offset, data.len(), true)?;
            writes.push((index, offset, data));
        }
        for (index, offset, data) in writes {
            debug!(region = index, offset, len = data.len(), data = ?Hex(data), "REGION_WRITE (multi)");
            self.device.region_write(index, offset, data)?;
        }
        let mut w = Writer::with_capacity(8);
        w.u64(wr_cnt);
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
