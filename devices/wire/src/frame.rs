//! Frames, and how they travel on a byte stream.
//!
//! A frame on a stream is a 64-byte header, then the payload:
//!
//! ```text
//!  0  magic        4  "P2WF"
//!  4  version      1  1 (a frame of another version is refused)
//!  5  header_words 1  header length in 8-byte words (8); a longer header's
//!                     extra words are skipped (room for fields added later)
//!  6  flags        2  0 (no flag is defined; a set bit is refused)
//!  8  payload_len  4  payload bytes that follow the header
//! 12  fcs          4  CRC-32C of the payload as it was sent
//! 16  seq          4  the sender's frame number (wraps)
//! 20  dst_port     4  destination port within dst_addr (an EFA QP number; 0)
//! 24  src_port     4  source port within src_addr
//! 28  reserved     4  0
//! 32  dst_addr    16  destination endpoint (GID-shaped; all zero: the one peer)
//! 48  src_addr    16  source endpoint
//! ```
//!
//! All integers are little-endian. The header is not checksummed: the
//! streams below (a unix socket now, TCP later) are reliable, and a peer
//! that writes anything else is cut off by the magic, version, flags and
//! length checks. The FCS covers the payload only: it carries injected
//! corruption (and, on a lossy transport, real corruption) to the
//! receiver, which delivers the frame and flags it, as Ethernet does.
//!
//! [`Decoder`] is a pure state machine over bytes: it takes whatever a
//! read returned, in any pieces, and hands out whole frames or the one
//! error that ends the stream. It needs no socket (the `wire_frames` fuzz
//! target drives it directly).

use std::fmt;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"P2WF";
/// The frame format this crate speaks.
pub const VERSION: u8 = 1;
/// Bytes in a version-1 header.
pub const HEADER_LEN: usize = 64;
/// Largest payload the wire carries unless told otherwise (1 MiB, the
/// NIC's largest MTU).
pub const DEFAULT_MAX_PAYLOAD: u32 = 1 << 20;

/// One header field: where it sits and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Byte offset in the header.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
    /// Its name, as `docs/reference/wire.md` spells it.
    pub name: &'static str,
}

impl Field {
    const fn new(offset: usize, len: usize, name: &'static str) -> Self {
        Self { offset, len, name }
    }

    fn range(self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// The header's fields, in order; the encoder and decoder place every
/// field through these.
pub mod field {
    use super::Field;

    pub const MAGIC: Field = Field::new(0, 4, "magic");
    pub const VERSION: Field = Field::new(4, 1, "version");
    pub const HEADER_WORDS: Field = Field::new(5, 1, "header_words");
    pub const FLAGS: Field = Field::new(6, 2, "flags");
    pub const PAYLOAD_LEN: Field = Field::new(8, 4, "payload_len");
    pub const FCS: Field = Field::new(12, 4, "fcs");
    pub const SEQ: Field = Field::new(16, 4, "seq");
    pub const DST_PORT: Field = Field::new(20, 4, "dst_port");
    pub const SRC_PORT: Field = Field::new(24, 4, "src_port");
    pub const RESERVED: Field = Field::new(28, 4, "reserved");
    pub const DST_ADDR: Field = Field::new(32, 16, "dst_addr");
    pub const SRC_ADDR: Field = Field::new(48, 16, "src_addr");

    /// Every field, in header order.
    pub const ALL: [Field; 12] = [
        MAGIC,
        VERSION,
        HEADER_WORDS,
        FLAGS,
        PAYLOAD_LEN,
        FCS,
        SEQ,
        DST_PORT,
        SRC_PORT,
        RESERVED,
        DST_ADDR,
        SRC_ADDR,
    ];
}

/// An endpoint on a wire: an address and a port within it.
///
/// Two devices on a point-to-point wire leave both at zero ([`Endpoint::ANY`]).
/// When more than two endpoints share a wire (several EFAs behind an
/// emulated switch, or two labs over TCP), `addr` names the device (an
/// EFA's 16-byte GID fits as it is) and `port` the queue pair in it, so a
/// switch can route on the header alone and a receiver can tell senders
/// apart without looking into payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Endpoint {
    pub addr: [u8; 16],
    pub port: u32,
}

impl Endpoint {
    /// No particular endpoint: the one peer of a point-to-point wire.
    pub const ANY: Endpoint = Endpoint {
        addr: [0; 16],
        port: 0,
    };
}

/// One frame as the wire carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    pub dst: Endpoint,
    pub src: Endpoint,
    /// The sender's frame number; the wire sets it when the frame is sent.
    pub seq: u32,
    pub payload: Vec<u8>,
    /// CRC-32C of the payload as sent.
    pub fcs: u32,
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("dst", &self.dst)
            .field("src", &self.src)
            .field("seq", &self.seq)
            .field("len", &self.payload.len())
            .field("fcs", &format_args!("{:#010x}", self.fcs))
            .field("fcs_ok", &self.fcs_ok())
            .finish()
    }
}

impl Frame {
    /// A frame to the one peer, with its FCS computed over `payload`.
    pub fn new(payload: Vec<u8>) -> Self {
        Self::addressed(Endpoint::ANY, Endpoint::ANY, payload)
    }

    /// A frame from `src` to `dst`, with its FCS computed over `payload`.
    pub fn addressed(src: Endpoint, dst: Endpoint, payload: Vec<u8>) -> Self {
        let fcs = fcs(&payload);
        Self {
            dst,
            src,
            seq: 0,
            payload,
            fcs,
        }
    }

    /// Whether the payload still matches its FCS.
    pub fn fcs_ok(&self) -> bool {
        fcs(&self.payload) == self.fcs
    }

    /// The version-1 header of this frame.
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let mut header = [0u8; HEADER_LEN];
        let mut put = |field: Field, bytes: &[u8]| header[field.range()].copy_from_slice(bytes);
        put(field::MAGIC, &MAGIC);
        put(field::VERSION, &[VERSION]);
        put(field::HEADER_WORDS, &[(HEADER_LEN / 8) as u8]);
        put(field::FLAGS, &0u16.to_le_bytes());
        // A payload over u32::MAX cannot be sent; `Wire` refuses it first.
        let len = u32::try_from(self.payload.len()).unwrap_or(u32::MAX);
        put(field::PAYLOAD_LEN, &len.to_le_bytes());
        put(field::FCS, &self.fcs.to_le_bytes());
        put(field::SEQ, &self.seq.to_le_bytes());
        put(field::DST_PORT, &self.dst.port.to_le_bytes());
        put(field::SRC_PORT, &self.src.port.to_le_bytes());
        put(field::RESERVED, &0u32.to_le_bytes());
        put(field::DST_ADDR, &self.dst.addr);
        put(field::SRC_ADDR, &self.src.addr);
        header
    }

    /// The frame as it goes on a stream: header, then payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_LEN + self.payload.len());
        bytes.extend_from_slice(&self.header());
        bytes.extend_from_slice(&self.payload);
        bytes
    }
}

/// The frame check sequence: CRC-32C (Castagnoli) of the payload.
pub fn fcs(payload: &[u8]) -> u32 {
    crc32c::crc32c(payload)
}

/// Why a stream's bytes are not frames. Every one ends the stream: after
/// it the receiver cannot know where the next frame starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("bad magic {0:02x?} (not a p2plab wire frame)")]
    Magic([u8; 4]),
    #[error("frame version {found}, but this wire speaks version {VERSION}")]
    Version { found: u8 },
    #[error("header of {words} 8-byte words, shorter than version {VERSION}'s {min}")]
    HeaderLength { words: u8, min: usize },
    #[error("header flags {0:#06x} set (no flag is defined in version {VERSION})")]
    Flags(u16),
    #[error("reserved header field is {0:#x}, not 0")]
    Reserved(u32),
    #[error("frame of {len} bytes is over the {max}-byte limit")]
    TooLong { len: u32, max: u32 },
}

/// Turns a byte stream into frames.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Where the unconsumed bytes start in `buf`.
    start: usize,
    max_payload: u32,
    failed: Option<DecodeError>,
    consumed: u64,
}

impl Decoder {
    /// A decoder that refuses payloads over `max_payload` bytes.
    pub fn new(max_payload: u32) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            max_payload,
            failed: None,
            consumed: 0,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// Bytes pushed and not yet handed out in a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Bytes of the stream handed out in frames so far.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The next whole frame, `Ok(None)` if more bytes are needed, or the
    /// error that ended the stream (returned again on every later call).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match parse(&self.buf[self.start..], self.max_payload) {
            Ok(Some((frame, used))) => {
                self.start += used;
                self.consumed += used as u64;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                } else if self.start >= self.buf.len() / 2 {
                    self.buf.drain(..self.start);
                    self.start = 0;
                }
                Ok(Some(frame))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.failed = Some(e.clone());
                self.buf = Vec::new();
                self.start = 0;
                Err(e)
            }
        }
    }

    /// Reads `reader` (blocking, with whatever timeout it has) until a
    /// whole frame is decoded: what a peer at the other end of a wire does
    /// (tools, hostile-peer tests). The end of the stream is
    /// `UnexpectedEof`, a decode error `InvalidData`.
    pub fn read_frame(&mut self, reader: &mut impl std::io::Read) -> std::io::Result<Frame> {
        use std::io::{Error, ErrorKind};
        loop {
            if let Some(frame) = self
                .next_frame()
                .map_err(|e| Error::new(ErrorKind::InvalidData, e))?
            {
                return Ok(frame);
            }
            let mut buf = [0u8; 4096];
            match reader.read(&mut buf)? {
                0 => return Err(ErrorKind::UnexpectedEof.into()),
                n => self.push(&buf[..n]),
            }
        }
    }
}

/// One frame from the front of `bytes` and how many bytes it took, or
/// `None` if `bytes` holds less than a whole frame (and nothing wrong yet).
fn parse(bytes: &[u8], max_payload: u32) -> Result<Option<(Frame, usize)>, DecodeError> {
    let get = |field: Field| bytes.get(field.range());
    // Check what has arrived as early as it arrives: a peer writing
    // garbage is cut off at its first bytes, not after 64 of them.
    if let Some(magic) = get(field::MAGIC) {
        if magic != MAGIC {
            let mut found = [0u8; 4];
            found.copy_from_slice(magic);
            return Err(DecodeError::Magic(found));
        }
    }
    if let Some(&[version]) = get(field::VERSION) {
        if version != VERSION {
            return Err(DecodeError::Version { found: version });
        }
    }
    if bytes.len() < HEADER_LEN {
        return Ok(None);
    }
    let u32_at = |field: Field| {
        let mut word = [0u8; 4];
        word.copy_from_slice(&bytes[field.range()]);
        u32::from_le_bytes(word)
    };
    let words = bytes[field::HEADER_WORDS.offset];
    let header_len = usize::from(words) * 8;
    if header_len < HEADER_LEN {
        return Err(DecodeError::HeaderLength {
            words,
            min: HEADER_LEN,
        });
    }
    let flags = u16::from_le_bytes([bytes[field::FLAGS.offset], bytes[field::FLAGS.offset + 1]]);
    if flags != 0 {
        return Err(DecodeError::Flags(flags));
    }
    let reserved = u32_at(field::RESERVED);
    if reserved != 0 {
        return Err(DecodeError::Reserved(reserved));
    }
    let len = u32_at(field::PAYLOAD_LEN);
    if len > max_payload {
        return Err(DecodeError::TooLong {
            len,
            max: max_payload,
        });
    }
    let total = header_len + len as usize;
    if bytes.len() < total {
        return Ok(None);
    }
    let addr = |field: Field| {
        let mut addr = [0u8; 16];
        addr.copy_from_slice(&bytes[field.range()]);
        addr
    };
    let frame = Frame {
        dst: Endpoint {
            addr: addr(field::DST_ADDR),
            port: u32_at(field::DST_PORT),
        },
        src: Endpoint {
            addr: addr(field::SRC_ADDR),
            port: u32_at(field::SRC_PORT),
        },
        seq: u32_at(field::SEQ),
        payload: bytes[header_len..total].to_vec(),
        fcs: u32_at(field::FCS),
    };
    Ok(Some((frame, total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seq: u32, len: usize) -> Frame {
        let mut frame = Frame::addressed(
            Endpoint {
                addr: [7; 16],
                port: 0x00ab_cdef,
            },
            Endpoint {
                addr: [9; 16],
                port: 3,
            },
            (0..len).map(|i| (i * 13) as u8).collect(),
        );
        frame.seq = seq;
        frame
    }

    /// Catches: a field the encoder writes where the decoder does not
    /// read it (or not at all), or fields that overlap or leave a gap.
    #[test]
    fn fields_tile_the_header_and_round_trip() {
        let mut end = 0;
        for f in field::ALL {
            assert_eq!(
                f.offset, end,
                "{} does not start where the last ended",
                f.name
            );
            end += f.len;
        }
        assert_eq!(end, HEADER_LEN);
        let frame = sample(0xdead_beef, 1000);
        let mut decoder = Decoder::new(DEFAULT_MAX_PAYLOAD);
        decoder.push(&frame.encode());
        assert_eq!(decoder.next_frame().unwrap(), Some(frame));
        assert_eq!(decoder.next_frame().unwrap(), None);
        assert_eq!(decoder.buffered(), 0);
    }

    /// Catches: a decoder that loses sync when frames arrive split at any
    /// byte, or glued together in one read.
    #[test]
    fn frames_split_and_glued_anywhere_decode_the_same() {
        let frames: Vec<Frame> = (0..5).map(|i| sample(i, (i as usize) * 37)).collect();
        let stream: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        for piece in [1, 3, 63, 64, 65, 200, stream.len()] {
            let mut decoder = Decoder::new(DEFAULT_MAX_PAYLOAD);
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                decoder.push(chunk);
                while let Some(frame) = decoder.next_frame().unwrap() {
                    got.push(frame);
                }
            }
            assert_eq!(got, frames, "pieces of {piece}");
            assert_eq!(decoder.consumed(), stream.len() as u64);
        }
    }

    /// Catches: a header extended by a later minor revision that an
    /// older reader cannot skip (the extra words must be ignored).
    #[test]
    fn a_longer_header_is_skipped() {
        let frame = sample(5, 10);
        let mut bytes = frame.header().to_vec();
        bytes[field::HEADER_WORDS.offset] = 10;
        bytes.extend_from_slice(&[0xee; 16]);
        bytes.extend_from_slice(&frame.payload);
        let mut decoder = Decoder::new(DEFAULT_MAX_PAYLOAD);
        decoder.push(&bytes);
        assert_eq!(decoder.next_frame().unwrap(), Some(frame));
    }

    /// Catches: garbage, another version, set flags or an oversized
    /// length taken as a frame, or an error that does not stick (the
    /// stream is out of sync after it).
    #[test]
    fn bad_streams_are_refused_early_and_for_good() {
        let cases: Vec<(Vec<u8>, DecodeError)> = vec![
            (b"GET /".to_vec(), DecodeError::Magic(*b"GET ")),
            (
                {
                    let mut h = sample(0, 0).header().to_vec();
                    h[4] = 2;
                    h.truncate(5);
                    h
                },
                DecodeError::Version { found: 2 },
            ),
            (
                {
                    let mut h = sample(0, 0).header().to_vec();
                    h[field::HEADER_WORDS.offset] = 7;
                    h
                },
                DecodeError::HeaderLength { words: 7, min: 64 },
            ),
            (
                {
                    let mut h = sample(0, 0).header().to_vec();
                    h[field::FLAGS.offset] = 1;
                    h
                },
                DecodeError::Flags(1),
            ),
            (
                {
                    let mut h = sample(0, 0).header().to_vec();
                    h[field::RESERVED.offset + 3] = 1;
                    h
                },
                DecodeError::Reserved(1 << 24),
            ),
            (
                {
                    let mut h = sample(0, 0).header().to_vec();
                    h[field::PAYLOAD_LEN.range()].copy_from_slice(&(4097u32).to_le_bytes());
                    h
                },
                DecodeError::TooLong {
                    len: 4097,
                    max: 4096,
                },
            ),
        ];
        for (bytes, want) in cases {
            let mut decoder = Decoder::new(4096);
            decoder.push(&bytes);
            assert_eq!(decoder.next_frame(), Err(want.clone()), "{bytes:02x?}");
            decoder.push(&sample(1, 1).encode());
            assert_eq!(decoder.next_frame(), Err(want));
            assert_eq!(decoder.buffered(), 0, "bytes kept after the stream failed");
        }
    }

    /// Catches: an FCS that does not notice a flipped byte, or a
    /// different checksum than the CRC-32C the docs name.
    #[test]
    fn the_fcs_is_crc32c_of_the_payload() {
        assert_eq!(fcs(b"123456789"), 0xe306_9283);
        let mut frame = sample(0, 100);
        assert!(frame.fcs_ok());
        frame.payload[50] ^= 1;
        assert!(!frame.fcs_ok());
    }

    /// A reader that hands out its bytes a few at a time.
    struct Trickle(Vec<u8>, usize);

    impl std::io::Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.1).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
    }

    /// Catches: a peer-side read that returns before a whole frame, loses
    /// the bytes after it, spins on the end of the stream, or passes a
    /// garbage stream off as a timeout.
    #[test]
    fn read_frame_takes_whole_frames_and_names_the_end() {
        let (a, b) = (sample(1, 300), sample(2, 5));
        let mut bytes = a.encode();
        bytes.extend(b.encode());
        let mut reader = Trickle(bytes, 7);
        let mut decoder = Decoder::new(DEFAULT_MAX_PAYLOAD);
        assert_eq!(decoder.read_frame(&mut reader).unwrap(), a);
        assert_eq!(decoder.read_frame(&mut reader).unwrap(), b);
        let end = decoder.read_frame(&mut reader).unwrap_err();
        assert_eq!(end.kind(), std::io::ErrorKind::UnexpectedEof);
        let mut garbage = Trickle(b"GET / HTTP/1.1".to_vec(), 64);
        let bad = Decoder::new(DEFAULT_MAX_PAYLOAD)
            .read_frame(&mut garbage)
            .unwrap_err();
        assert_eq!(bad.kind(), std::io::ErrorKind::InvalidData);
    }
}
