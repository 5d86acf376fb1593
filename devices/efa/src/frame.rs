//! The fabric's packets: what one EFA sends another over the wire (or to
//! itself, for its own GID). The driver defines no wire format; this one
//! carries what SRD and UD need: the addresses (GIDs and QP numbers), the
//! qkey, a message ID per sender that acknowledgements, retransmissions and
//! duplicate detection use, and a CRC-32C over the whole packet so that a
//! corrupted packet is dropped (and, for SRD, sent again) rather than
//! delivered.
//!
//! ```text
//! 0  magic u32 "P2EF"   4 version u8   5 kind u8   6 flags u16
//! 8  src_gid [16]       24 dst_gid [16]
//! 40 src_qp u16         42 dst_qp u16   44 qkey u32
//! 48 msg_id u64         56 body_len u32 60 crc32c u32 (of all, this field 0)
//! 64 body (by kind, below)
//! ```

use crate::bytes::{gid_at, put, put_u16, put_u32, put_u64, put_u8, u16_at, u32_at, u64_at, u8_at};

/// First word of every packet.
pub const MAGIC: u32 = 0x4645_3250; // "P2EF" little-endian
/// Format version.
pub const VERSION: u8 = 1;
/// Header bytes.
pub const HEADER_SIZE: usize = 64;
/// Largest body: 64 KiB of data plus its fields.
pub const MAX_BODY: usize = (64 << 10) + 32;
/// Data bytes an RDMA read response or write segment carries at most.
pub const SEGMENT_SIZE: usize = 32 << 10;

/// What a packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A SEND message (SRD or UD).
    Send = 1,
    /// An acknowledgement of a SEND, a write segment or a write-with-imm.
    Ack = 2,
    /// An RDMA read request.
    ReadReq = 3,
    /// A segment of RDMA read data (or the read's error).
    ReadResp = 4,
    /// A segment of RDMA write data.
    Write = 5,
    /// The immediate of an RDMA write, after all its data: consumes a
    /// receive at the target.
    WriteImm = 6,
}

impl Kind {
    fn from_u8(raw: u8) -> Option<Self> {
        Some(match raw {
            1 => Kind::Send,
            2 => Kind::Ack,
            3 => Kind::ReadReq,
            4 => Kind::ReadResp,
            5 => Kind::Write,
            6 => Kind::WriteImm,
            _ => return None,
        })
    }

    /// A short name for traces.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Send => "send",
            Kind::Ack => "ack",
            Kind::ReadReq => "read-req",
            Kind::ReadResp => "read-resp",
            Kind::Write => "write",
            Kind::WriteImm => "write-imm",
        }
    }
}

/// The addressing every packet carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Sender's GID.
    pub src_gid: [u8; 16],
    /// Receiver's GID.
    pub dst_gid: [u8; 16],
    /// Sender's QP.
    pub src_qp: u16,
    /// Receiver's QP.
    pub dst_qp: u16,
    /// Queue key (SEND).
    pub qkey: u32,
    /// The message this packet belongs to, unique per sender.
    pub msg_id: u64,
}

impl Header {
    /// The header of an answer to a packet with this header.
    pub fn reply(&self) -> Self {
        Self {
            src_gid: self.dst_gid,
            dst_gid: self.src_gid,
            src_qp: self.dst_qp,
            dst_qp: self.src_qp,
            qkey: 0,
            msg_id: self.msg_id,
        }
    }
}

/// A packet's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A SEND.
    Send {
        /// Reliable (SRD) or not (UD): the receiving QP must be the same.
        reliable: bool,
        /// Immediate data.
        imm: Option<u32>,
        /// The message.
        data: Vec<u8>,
    },
    /// An acknowledgement with a completion status code (0: done).
    Ack {
        /// [`crate::defs::IoStatus`] code for the sender.
        status: u8,
        /// For a write segment: its offset in the message.
        offset: u64,
    },
    /// An RDMA read request.
    ReadReq {
        /// Remote key.
        rkey: u32,
        /// Remote address.
        addr: u64,
        /// Bytes.
        length: u32,
    },
    /// RDMA read data.
    ReadResp {
        /// 0, or the status the read failed with.
        status: u8,
        /// Where this segment goes in the read.
        offset: u64,
        /// The data.
        data: Vec<u8>,
    },
    /// RDMA write data.
    Write {
        /// Remote key.
        rkey: u32,
        /// The write's first remote address.
        addr: u64,
        /// Where this segment goes in the write.
        offset: u64,
        /// Bytes of the whole write.
        total: u32,
        /// The data.
        data: Vec<u8>,
    },
    /// The immediate of a finished RDMA write.
    WriteImm {
        /// Immediate data.
        imm: u32,
        /// Bytes the write moved.
        total: u32,
    },
}

impl Body {
    fn kind(&self) -> Kind {
        match self {
            Body::Send { .. } => Kind::Send,
            Body::Ack { .. } => Kind::Ack,
            Body::ReadReq { .. } => Kind::ReadReq,
            Body::ReadResp { .. } => Kind::ReadResp,
            Body::Write { .. } => Kind::Write,
            Body::WriteImm { .. } => Kind::WriteImm,
        }
    }
}

/// A whole packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Addresses and message ID.
    pub header: Header,
    /// What it carries.
    pub body: Body,
}

/// Why bytes off the wire are not a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than a header, or than its body length says.
    #[error("truncated packet")]
    Truncated,
    /// Not our magic or version.
    #[error("not an EFA fabric packet")]
    Foreign,
    /// The CRC does not match: corrupted on the way.
    #[error("packet checksum mismatch")]
    Checksum,
    /// An unknown kind or an inconsistent body.
    #[error("malformed packet")]
    Malformed,
}

impl Packet {
    /// The packet's kind.
    pub fn kind(&self) -> Kind {
        self.body.kind()
    }

    /// The packet as bytes, with its checksum.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let mut field = |bytes: &[u8]| body.extend_from_slice(bytes);
        match &self.body {
            Body::Send {
                reliable,
                imm,
                data,
            } => {
                field(&[u8::from(*reliable), u8::from(imm.is_some()), 0, 0]);
                field(&imm.unwrap_or(0).to_le_bytes());
                field(data);
            }
            Body::Ack { status, offset } => {
                field(&[*status, 0, 0, 0, 0, 0, 0, 0]);
                field(&offset.to_le_bytes());
            }
            Body::ReadReq { rkey, addr, length } => {
                field(&rkey.to_le_bytes());
                field(&length.to_le_bytes());
                field(&addr.to_le_bytes());
            }
            Body::ReadResp {
                status,
                offset,
                data,
            } => {
                field(&[*status, 0, 0, 0, 0, 0, 0, 0]);
                field(&offset.to_le_bytes());
                field(data);
            }
            Body::Write {
                rkey,
                addr,
                offset,
                total,
                data,
            } => {
                field(&rkey.to_le_bytes());
                field(&total.to_le_bytes());
                field(&addr.to_le_bytes());
                field(&offset.to_le_bytes());
                field(data);
            }
            Body::WriteImm { imm, total } => {
                field(&imm.to_le_bytes());
                field(&total.to_le_bytes());
            }
        }
        let mut out = vec![0u8; HEADER_SIZE];
        let h = &self.header;
        put_u32(&mut out, 0, MAGIC);
        put_u8(&mut out, 4, VERSION);
        put_u8(&mut out, 5, self.kind() as u8);
        put(&mut out, 8, &h.src_gid);
        put(&mut out, 24, &h.dst_gid);
        put_u16(&mut out, 40, h.src_qp);
        put_u16(&mut out, 42, h.dst_qp);
        put_u32(&mut out, 44, h.qkey);
        put_u64(&mut out, 48, h.msg_id);
        put_u32(&mut out, 56, body.len() as u32);
        out.extend_from_slice(&body);
        let crc = crc32c::crc32c(&out);
        put_u32(&mut out, 60, crc);
        out
    }

    /// Parses and checks bytes off the wire.
    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        if bytes.len() < HEADER_SIZE {
            return Err(FrameError::Truncated);
        }
        if u32_at(bytes, 0) != MAGIC || u8_at(bytes, 4) != VERSION {
            return Err(FrameError::Foreign);
        }
        let body_len = u32_at(bytes, 56) as usize;
        if body_len > MAX_BODY || bytes.len() != HEADER_SIZE + body_len {
            return Err(FrameError::Truncated);
        }
        let mut zeroed = bytes.to_vec();
        put_u32(&mut zeroed, 60, 0);
        if crc32c::crc32c(&zeroed) != u32_at(bytes, 60) {
            return Err(FrameError::Checksum);
        }
        let header = Header {
            src_gid: gid_at(bytes, 8),
            dst_gid: gid_at(bytes, 24),
            src_qp: u16_at(bytes, 40),
            dst_qp: u16_at(bytes, 42),
            qkey: u32_at(bytes, 44),
            msg_id: u64_at(bytes, 48),
        };
        let b = &bytes[HEADER_SIZE..];
        let need = |n: usize| {
            if b.len() < n {
                Err(FrameError::Malformed)
            } else {
                Ok(())
            }
        };
        let exact = |n: usize| {
            if b.len() != n {
                Err(FrameError::Malformed)
            } else {
                Ok(())
            }
        };
        let kind = Kind::from_u8(u8_at(bytes, 5)).ok_or(FrameError::Malformed)?;
        let body = match kind {
            Kind::Send => {
                need(8)?;
                let has_imm = u8_at(b, 1) != 0;
                Body::Send {
                    reliable: u8_at(b, 0) != 0,
                    imm: has_imm.then(|| u32_at(b, 4)),
                    data: b[8..].to_vec(),
                }
            }
            Kind::Ack => {
                exact(16)?;
                Body::Ack {
                    status: u8_at(b, 0),
                    offset: u64_at(b, 8),
                }
            }
            Kind::ReadReq => {
                exact(16)?;
                Body::ReadReq {
                    rkey: u32_at(b, 0),
                    length: u32_at(b, 4),
                    addr: u64_at(b, 8),
                }
            }
            Kind::ReadResp => {
                need(16)?;
                Body::ReadResp {
                    status: u8_at(b, 0),
                    offset: u64_at(b, 8),
                    data: b[16..].to_vec(),
                }
            }
            Kind::Write => {
                need(24)?;
                Body::Write {
                    rkey: u32_at(b, 0),
                    total: u32_at(b, 4),
                    addr: u64_at(b, 8),
                    offset: u64_at(b, 16),
                    data: b[24..].to_vec(),
                }
            }
            Kind::WriteImm => {
                exact(8)?;
                Body::WriteImm {
                    imm: u32_at(b, 0),
                    total: u32_at(b, 4),
                }
            }
        };
        Ok(Packet { header, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            src_gid: [1; 16],
            dst_gid: [2; 16],
            src_qp: 65,
            dst_qp: 66,
            qkey: 0x1111_1111,
            msg_id: 0x0102_0304_0506_0708,
        }
    }

    /// Catches: a body kind that does not survive the wire, or fields
    /// swapped between encode and decode.
    #[test]
    fn every_kind_round_trips() {
        let bodies = [
            Body::Send {
                reliable: true,
                imm: Some(7),
                data: vec![1, 2, 3],
            },
            Body::Send {
                reliable: false,
                imm: None,
                data: vec![],
            },
            Body::Ack {
                status: 10,
                offset: 1 << 40,
            },
            Body::ReadReq {
                rkey: 0x12_3456,
                addr: 0x7f00_0000_1000,
                length: 1 << 20,
            },
            Body::ReadResp {
                status: 0,
                offset: 32768,
                data: vec![9; SEGMENT_SIZE],
            },
            Body::Write {
                rkey: 3,
                addr: 0x1000,
                offset: 0,
                total: 5,
                data: vec![5; 5],
            },
            Body::WriteImm { imm: 1, total: 5 },
        ];
        for body in bodies {
            let packet = Packet {
                header: header(),
                body,
            };
            let bytes = packet.encode();
            assert_eq!(Packet::decode(&bytes), Ok(packet.clone()));
            let reply = packet.header.reply();
            assert_eq!((reply.src_qp, reply.dst_gid), (66, [1; 16]));
        }
    }

    /// Catches: a corrupted, truncated, padded or foreign packet being
    /// accepted (any flipped bit must be caught by the CRC).
    #[test]
    fn damaged_packets_are_refused() {
        let bytes = Packet {
            header: header(),
            body: Body::Send {
                reliable: true,
                imm: None,
                data: vec![0xab; 100],
            },
        }
        .encode();
        for at in [0usize, 5, 9, 44, 60, 64, 100, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(Packet::decode(&bad).is_err(), "flip at {at}");
        }
        let mut flipped = bytes.clone();
        flipped[100] ^= 1;
        assert_eq!(Packet::decode(&flipped), Err(FrameError::Checksum));
        assert_eq!(Packet::decode(&bytes[..63]), Err(FrameError::Truncated));
        assert_eq!(
            Packet::decode(&bytes[..bytes.len() - 1]),
            Err(FrameError::Truncated)
        );
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Packet::decode(&long), Err(FrameError::Truncated));
        assert_eq!(Packet::decode(&[0u8; 64]), Err(FrameError::Foreign));
    }
}
