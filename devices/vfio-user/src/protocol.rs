//! Wire format of vfio-user messages (QEMU docs/interop/vfio-user.rst):
//! the 16-byte header, command numbers, and helpers to decode payloads
//! without ever indexing past what the peer actually sent.
//!
//! All integers are in host byte order, as the protocol says.

/// Size of the header that starts every message.
pub const HEADER_SIZE: usize = 16;

/// The largest `max_data_xfer_size` QEMU accepts from a server (64 MiB).
pub const MAX_DATA_XFER_LIMIT: u32 = 64 << 20;

/// The most file descriptors QEMU lets a server ask for in one message.
pub const MAX_MSG_FDS_LIMIT: u32 = 16;

/// Room for the fixed part of any message on top of its data bytes
/// (region access header, argsz structures, version JSON).
pub const MESSAGE_OVERHEAD: usize = 4096;

/// Protocol major version this server speaks; QEMU refuses any other.
pub const VERSION_MAJOR: u16 = 0;
/// Protocol minor version this server speaks (0: every client supports it).
pub const VERSION_MINOR: u16 = 0;

/// Header flag bits.
pub mod flags {
    /// The bits that hold the message type.
    pub const TYPE_MASK: u32 = 0xf;
    /// Message type: a command (a request).
    pub const TYPE_COMMAND: u32 = 0;
    /// Message type: the reply to a command with the same message id.
    pub const TYPE_REPLY: u32 = 1;
    /// The sender wants no reply (a posted write); errors are only logged.
    pub const NO_REPLY: u32 = 1 << 4;
    /// In a reply: the command failed and `error` holds the errno.
    pub const ERROR: u32 = 1 << 5;
}

/// DMA_MAP flag: the server may read the range.
pub const DMA_MAP_READ: u32 = 1 << 0;
/// DMA_MAP flag: the server may write the range.
pub const DMA_MAP_WRITE: u32 = 1 << 1;

/// Command numbers, named as in the spec without the VFIO_USER_ prefix.
/// Kept as plain constants because an unknown number must still be echoed
/// in the error reply.
pub mod cmd {
    /// Client to server, first message: protocol version and capabilities.
    pub const VERSION: u16 = 1;
    /// Client adds a guest memory range, with an fd when it can be mmapped.
    pub const DMA_MAP: u16 = 2;
    /// Client removes guest memory ranges (or all of them).
    pub const DMA_UNMAP: u16 = 3;
    /// Device flags and the number of regions and IRQ indexes.
    pub const DEVICE_GET_INFO: u16 = 4;
    /// One region's size, flags and mmappable areas (with its fd).
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    /// ioeventfds for a region; not supported here.
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    /// One IRQ index's flags and vector count.
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    /// Bind eventfds to vectors, mask, unmask or trigger them.
    pub const DEVICE_SET_IRQS: u16 = 8;
    /// A trapped read of a region (config space, registers).
    pub const REGION_READ: u16 = 9;
    /// A trapped write of a region, possibly posted (no reply).
    pub const REGION_WRITE: u16 = 10;
    /// Server to client: read guest memory that is not mmapped here.
    pub const DMA_READ: u16 = 11;
    /// Server to client: write guest memory that is not mmapped here.
    pub const DMA_WRITE: u16 = 12;
    /// Reset the device.
    pub const DEVICE_RESET: u16 = 13;
    /// Dirty page logging for migration; not supported here.
    pub const DIRTY_PAGES: u16 = 14;
    /// Several small region writes in one message.
    pub const REGION_WRITE_MULTI: u16 = 15;
    /// Device features (migration); answered with ENOTTY.
    pub const DEVICE_FEATURE: u16 = 16;
    /// Migration data from the device; not supported here.
    pub const MIG_DATA_READ: u16 = 17;
    /// Migration data to the device; not supported here.
    pub const MIG_DATA_WRITE: u16 = 18;
}

/// A readable name for a command number, for logs.
pub fn command_name(command: u16) -> &'static str {
    match command {
        cmd::VERSION => "VERSION",
        cmd::DMA_MAP => "DMA_MAP",
        cmd::DMA_UNMAP => "DMA_UNMAP",
        cmd::DEVICE_GET_INFO => "DEVICE_GET_INFO",
        cmd::DEVICE_GET_REGION_INFO => "DEVICE_GET_REGION_INFO",
        cmd::DEVICE_GET_REGION_IO_FDS => "DEVICE_GET_REGION_IO_FDS",
        cmd::DEVICE_GET_IRQ_INFO => "DEVICE_GET_IRQ_INFO",
        cmd::DEVICE_SET_IRQS => "DEVICE_SET_IRQS",
        cmd::REGION_READ => "REGION_READ",
        cmd::REGION_WRITE => "REGION_WRITE",
        cmd::DMA_READ => "DMA_READ",
        cmd::DMA_WRITE => "DMA_WRITE",
        cmd::DEVICE_RESET => "DEVICE_RESET",
        cmd::DIRTY_PAGES => "DIRTY_PAGES",
        cmd::REGION_WRITE_MULTI => "REGION_WRITE_MULTI",
        cmd::DEVICE_FEATURE => "DEVICE_FEATURE",
        cmd::MIG_DATA_READ => "MIG_DATA_READ",
        cmd::MIG_DATA_WRITE => "MIG_DATA_WRITE",
        _ => "UNKNOWN",
    }
}

/// The header in front of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Chosen by the sender of a command; its reply carries the same id.
    pub msg_id: u16,
    /// The command number ([`cmd`]), also in replies.
    pub command: u16,
    /// Size of the whole message, header included.
    pub size: u32,
    /// Message type and [`flags`] bits.
    pub flags: u32,
    /// In an error reply: the errno (positive).
    pub error: u32,
}

impl Header {
    /// Reads a header from its 16 wire bytes (cannot fail: every bit
    /// pattern is a header; [`Header::payload_len`] judges the size).
    pub fn decode(bytes: &[u8; HEADER_SIZE]) -> Self {
        let mut r = Reader::new(bytes);
        // The array is exactly HEADER_SIZE bytes, so every read succeeds;
        // the defaults are never used.
        Header {
            msg_id: r.u16().unwrap_or_default(),
            command: r.u16().unwrap_or_default(),
            size: r.u32().unwrap_or_default(),
            flags: r.u32().unwrap_or_default(),
            error: r.u32().unwrap_or_default(),
        }
    }

    /// The 16 wire bytes of this header.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..2].copy_from_slice(&self.msg_id.to_ne_bytes());
        out[2..4].copy_from_slice(&self.command.to_ne_bytes());
        out[4..8].copy_from_slice(&self.size.to_ne_bytes());
        out[8..12].copy_from_slice(&self.flags.to_ne_bytes());
        out[12..16].copy_from_slice(&self.error.to_ne_bytes());
        out
    }

    /// A command message of ours with `payload_len` bytes after the header.
    pub fn command(msg_id: u16, command: u16, payload_len: usize) -> Self {
        Header {
            msg_id,
            command,
            size: message_size(payload_len),
            flags: flags::TYPE_COMMAND,
            error: 0,
        }
    }

    /// A successful reply to `self` carrying `payload_len` bytes.
    pub fn reply(&self, payload_len: usize) -> Self {
        Header {
            msg_id: self.msg_id,
            command: self.command,
            size: message_size(payload_len),
            flags: flags::TYPE_REPLY,
            error: 0,
        }
    }

    /// An error reply to `self`: header only, as the spec requires.
    pub fn error_reply(&self, errno: i32) -> Self {
        Header {
            msg_id: self.msg_id,
            command: self.command,
            size: HEADER_SIZE as u32,
            flags: flags::TYPE_REPLY | flags::ERROR,
            error: errno.unsigned_abs(),
        }
    }

    /// [`flags::TYPE_COMMAND`], [`flags::TYPE_REPLY`] or an invalid type.
    pub fn message_type(&self) -> u32 {
        self.flags & flags::TYPE_MASK
    }
    /// Whether this is a reply (to one of our DMA requests).
    pub fn is_reply(&self) -> bool {
        self.message_type() == flags::TYPE_REPLY
    }
    /// Whether the sender asked for no reply.
    pub fn no_reply(&self) -> bool {
        self.flags & flags::NO_REPLY != 0
    }
    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        self.flags & flags::ERROR != 0
    }
    /// Bytes after the header, as announced; `None` if `size` is smaller
    /// than a header (a protocol violation).
    pub fn payload_len(&self) -> Option<usize> {
        (self.size as usize).checked_sub(HEADER_SIZE)
    }

    /// Why these 16 bytes cannot be the start of a message a conforming
    /// peer sends, or `None` if they can. Used where the stream may have
    /// lost sync (after a reply whose tail a client may have dropped): a
    /// real header has a known type and command, no unknown flag bits, an
    /// errno only with the error flag, and a size between the header's
    /// own and `max_size`.
    pub fn implausible(&self, max_size: usize) -> Option<String> {
        let known_flags = flags::TYPE_MASK | flags::NO_REPLY | flags::ERROR;
        let why = if !matches!(self.message_type(), flags::TYPE_COMMAND | flags::TYPE_REPLY) {
            format!("message type {}", self.message_type())
        } else if self.flags & !known_flags != 0 {
            format!("unknown flag bits {:#x}", self.flags & !known_flags)
        } else if !(cmd::VERSION..=cmd::MIG_DATA_WRITE).contains(&self.command) {
            format!("command {}", self.command)
        } else if self.error != 0 && !self.is_error() {
            format!("errno {} without the error flag", self.error)
        } else if (self.size as usize) < HEADER_SIZE || self.size as usize > max_size {
            format!("size {}", self.size)
        } else {
            return None;
        };
        Some(why)
    }
}

/// Message size for a payload. Payloads are bounded by the negotiated
/// transfer size (at most 64 MiB), so this never saturates in practice;
/// saturating keeps it panic-free anyway.
fn message_size(payload_len: usize) -> u32 {
    u32::try_from(payload_len.saturating_add(HEADER_SIZE)).unwrap_or(u32::MAX)
}

/// Reads host-endian integers from a byte slice, front to back. Every
/// accessor returns `None` instead of reading past the end.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Starts reading at the first byte of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    /// The next `n` bytes, or `None` (consuming nothing) if fewer are left.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.bytes.len() {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// The next 2 bytes as a host-endian u16.
    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_ne_bytes)
    }
    /// The next 4 bytes as a host-endian u32.
    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_ne_bytes)
    }
    /// The next 8 bytes as a host-endian u64.
    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_ne_bytes)
    }

    /// Everything not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.bytes
    }
}

/// Appends host-endian integers to a byte vector.
#[derive(Debug, Default)]
pub struct Writer {
    /// What was written so far.
    pub bytes: Vec<u8>,
}

impl Writer {
    /// An empty writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            bytes: Vec::with_capacity(n),
        }
    }
    /// Appends a host-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_ne_bytes());
        self
    }
    /// Appends a host-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_ne_bytes());
        self
    }
    /// Appends a host-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_ne_bytes());
        self
    }
    /// Appends raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(v);
        self
    }
    /// The bytes written.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// Capabilities one side announces in VERSION. Missing fields take the
/// defaults the spec gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Most fds the side accepts in one message (default 1).
    pub max_msg_fds: u32,
    /// Largest data count in one region access or DMA message the side
    /// accepts (default 1 MiB).
    pub max_data_xfer_size: u32,
    /// Bit mask of the page sizes DMA_MAP may use (default 4 KiB).
    pub pgsizes: u64,
    /// Most DMA ranges mapped at once (default 65535).
    pub max_dma_maps: u32,
    /// Whether the side takes REGION_WRITE_MULTI (default no).
    pub write_multiple: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            max_msg_fds: 1,
            max_data_xfer_size: 1 << 20,
            pgsizes: 4096,
            max_dma_maps: 65535,
            write_multiple: false,
        }
    }
}

/// Why the version data of a VERSION message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// The data does not parse as JSON; the parser's message.
    #[error("version data is not NUL-terminated UTF-8 JSON: {0}")]
    NotJson(String),
    /// A known capability has the wrong JSON type; its name.
    #[error("capability {0} has the wrong type or is out of range")]
    BadField(&'static str),
}

impl Capabilities {
    /// Parses the optional JSON that follows major/minor in VERSION.
    /// Empty data means "all defaults". Unknown capabilities (migration,
    /// twin_socket, future ones) are ignored: we never enable them.
    pub fn parse(data: &[u8]) -> Result<Self, CapabilityError> {
        let mut caps = Capabilities::default();
        // The string is NUL-terminated; tolerate a missing NUL and any
        // padding after it.
        let text = match data.iter().position(|&b| b == 0) {
            Some(end) => data.get(..end).unwrap_or_default(),
            None => data,
        };
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok(caps);
        }
        let value: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| CapabilityError::NotJson(e.to_string()))?;
        let root = value
            .as_object()
            .ok_or(CapabilityError::BadField("(root)"))?;
        let Some(list) = root.get("capabilities") else {
            return Ok(caps);
        };
        let list = list
            .as_object()
            .ok_or(CapabilityError::BadField("capabilities"))?;

        let number = |name: &'static str| -> Result<Option<u64>, CapabilityError> {
            match list.get(name) {
                None => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or(CapabilityError::BadField(name)),
            }
        };
        let clamp32 = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        if let Some(v) = number("max_msg_fds")? {
            caps.max_msg_fds = clamp32(v);
        }
        if let Some(v) = number("max_data_xfer_size")? {
            caps.max_data_xfer_size = clamp32(v);
        }
        if let Some(v) = number("pgsizes")? {
            caps.pgsizes = v;
        }
        if let Some(v) = number("max_dma_maps")? {
            caps.max_dma_maps = clamp32(v);
        }
        match list.get("write_multiple") {
            None => {}
            Some(v) => {
                caps.write_multiple = v
                    .as_bool()
                    .ok_or(CapabilityError::BadField("write_multiple"))?
            }
        }
        Ok(caps)
    }

    /// The NUL-terminated JSON for our VERSION reply. Migration and
    /// twin_socket are never announced; write_multiple only when true.
    pub fn to_version_data(&self) -> Vec<u8> {
        let mut list = serde_json::Map::new();
        list.insert("max_msg_fds".into(), self.max_msg_fds.into());
        list.insert("max_data_xfer_size".into(), self.max_data_xfer_size.into());
        list.insert("pgsizes".into(), self.pgsizes.into());
        list.insert("max_dma_maps".into(), self.max_dma_maps.into());
        if self.write_multiple {
            list.insert("write_multiple".into(), true.into());
        }
        let mut root = serde_json::Map::new();
        root.insert("capabilities".into(), serde_json::Value::Object(list));
        let mut out = serde_json::Value::Object(root).to_string().into_bytes();
        out.push(0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implausible_headers_are_named() {
        let good = Header::command(3, cmd::REGION_WRITE, 24);
        assert_eq!(good.implausible(1 << 20), None);
        assert_eq!(good.error_reply(5).implausible(1 << 20), None);
        let with = |f: fn(&mut Header)| {
            let mut h = good;
            f(&mut h);
            h.implausible(1 << 20)
        };
        assert!(with(|h| h.flags = 2).is_some_and(|w| w.contains("type")));
        assert!(with(|h| h.flags = 1 << 9).is_some_and(|w| w.contains("flag")));
        assert!(with(|h| h.command = 0).is_some_and(|w| w.contains("command")));
        assert!(with(|h| h.command = 19).is_some_and(|w| w.contains("command")));
        assert!(with(|h| h.error = 4).is_some_and(|w| w.contains("errno")));
        assert!(with(|h| h.size = 15).is_some_and(|w| w.contains("size")));
        assert!(with(|h| h.size = (1 << 20) + 1).is_some_and(|w| w.contains("size")));
    }

    #[test]
    fn header_round_trip() {
        let h = Header {
            msg_id: 0x1234,
            command: cmd::REGION_WRITE,
            size: 40,
            flags: flags::NO_REPLY,
            error: 7,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        assert!(h.no_reply());
        assert!(!h.is_reply());
        assert_eq!(h.payload_len(), Some(24));
        let bad = Header { size: 3, ..h };
        assert_eq!(bad.payload_len(), None);
    }

    #[test]
    fn error_reply_is_header_only() {
        let req = Header::command(9, cmd::REGION_READ, 16);
        let e = req.error_reply(libc::EINVAL);
        assert_eq!(e.size as usize, HEADER_SIZE);
        assert!(e.is_reply() && e.is_error());
        assert_eq!(e.error, libc::EINVAL as u32);
        assert_eq!((e.msg_id, e.command), (9, cmd::REGION_READ));
    }

    #[test]
    fn reader_never_reads_past_end() {
        let mut r = Reader::new(&[1, 0, 0]);
        assert_eq!(r.u16(), Some(1));
        assert_eq!(r.u16(), None);
        assert_eq!(r.rest(), &[0]);
        assert_eq!(r.take(2), None);
    }

    #[test]
    fn parses_qemu_capabilities() {
        let json = br#"{"capabilities":{"pgsizes":4096,"max_msg_fds":16,"max_dma_maps":65535,"max_data_xfer_size":1048576,"migration":{"pgsize":4096,"max_bitmap_size":268435456},"write_multiple":true}}"#;
        let mut data = json.to_vec();
        data.push(0);
        let caps = Capabilities::parse(&data).unwrap();
        assert_eq!(
            caps,
            Capabilities {
                max_msg_fds: 16,
                max_data_xfer_size: 1 << 20,
                pgsizes: 4096,
                max_dma_maps: 65535,
                write_multiple: true,
            }
        );
    }

    #[test]
    fn missing_data_means_defaults() {
        assert_eq!(Capabilities::parse(b"").unwrap(), Capabilities::default());
        assert_eq!(
            Capabilities::parse(b"{}\0").unwrap(),
            Capabilities::default()
        );
    }

    #[test]
    fn refuses_garbage() {
        assert!(matches!(
            Capabilities::parse(b"{not json\0"),
            Err(CapabilityError::NotJson(_))
        ));
        assert_eq!(
            Capabilities::parse(br#"{"capabilities":{"max_msg_fds":"x"}}"#),
            Err(CapabilityError::BadField("max_msg_fds"))
        );
        assert_eq!(
            Capabilities::parse(br#"{"capabilities":[]}"#),
            Err(CapabilityError::BadField("capabilities"))
        );
    }

    #[test]
    fn version_data_round_trips_and_omits_migration() {
        let caps = Capabilities {
            max_msg_fds: 8,
            max_data_xfer_size: 1 << 16,
            pgsizes: 4096,
            max_dma_maps: 100,
            write_multiple: true,
        };
        let data = caps.to_version_data();
        assert_eq!(data.last(), Some(&0));
        let text = std::str::from_utf8(&data[..data.len() - 1]).unwrap();
        assert!(!text.contains("migration"), "{text}");
        assert_eq!(Capabilities::parse(&data).unwrap(), caps);
        let no_multi = Capabilities {
            write_multiple: false,
            ..caps
        };
        assert!(!String::from_utf8_lossy(&no_multi.to_version_data()).contains("write_multiple"));
    }
}
