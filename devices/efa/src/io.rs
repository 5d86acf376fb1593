//! The data path's formats (`efa_io_defs.h`, `efa_admin_defs.h`): the
//! 64-byte TX WQE user space writes into the LLQ, the 16-byte receive
//! descriptor it writes into the receive ring, and the completion and
//! event entries the device writes back.
//!
//! A WQE is copied out of BAR2 once and parsed from the copy: the guest
//! may rewrite the slot at any time, and every field is checked here
//! before the device acts on it.

use crate::attrs::{INLINE_BUF_SIZE, MAX_SEND_SGES};
use crate::bytes::{addr_at, put, put_u16, put_u32, u16_at, u32_at, u8_at};
use crate::defs::{IoOp, IoQueue, IoStatus};

/// Bytes of a TX WQE.
pub const TX_WQE_SIZE: usize = 64;
/// Bytes of a receive descriptor.
pub const RX_DESC_SIZE: usize = 16;
/// Bytes of an event queue entry.
pub const EQE_SIZE: usize = 16;
/// Memory keys are 24 bits in WQEs and descriptors.
pub const KEY_MASK: u32 = 0x00ff_ffff;

/// TX meta descriptor ctrl1 bits.
pub mod ctrl1 {
    /// 3:0 the operation.
    pub const OP_TYPE_MASK: u8 = 0x0f;
    /// Immediate data is valid.
    pub const HAS_IMM: u8 = 1 << 4;
    /// Inline message data follows the meta descriptor.
    pub const INLINE_MSG: u8 = 1 << 5;
    /// Extended metadata: must be zero.
    pub const META_EXTENSION: u8 = 1 << 6;
    /// This is a meta descriptor: must be set.
    pub const META_DESC: u8 = 1 << 7;
}

/// TX meta descriptor ctrl2 bits.
pub mod ctrl2 {
    /// The WQE's phase.
    pub const PHASE: u8 = 1 << 0;
    /// First descriptor of the transaction: must be set.
    pub const FIRST: u8 = 1 << 2;
    /// Last descriptor: must be set.
    pub const LAST: u8 = 1 << 3;
    /// Post a completion.
    pub const COMP_REQ: u8 = 1 << 4;
}

/// A local buffer: length, key and address (`struct efa_io_tx_buf_desc`
/// and the fields of a receive descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Bytes.
    pub length: u32,
    /// Local key (24 bits).
    pub lkey: u32,
    /// I/O virtual address.
    pub addr: u64,
}

impl Buf {
    fn at(bytes: &[u8], at: usize) -> Self {
        Self {
            length: u32_at(bytes, at),
            lkey: u32_at(bytes, at + 4) & KEY_MASK,
            addr: addr_at(bytes, at + 8),
        }
    }
}

/// What a TX WQE asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxBody {
    /// A SEND with its data in the WQE.
    Inline(Vec<u8>),
    /// A SEND gathered from up to two buffers.
    Gather(Vec<Buf>),
    /// An RDMA read of `remote` into `local`.
    Read {
        /// Remote length, key and address.
        remote: Buf,
        /// Where the data lands.
        local: Buf,
    },
    /// An RDMA write of `local` to `remote`.
    Write {
        /// Remote length, key and address.
        remote: Buf,
        /// Where the data comes from.
        local: Buf,
    },
}

/// A checked TX WQE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxWqe {
    /// The provider's request ID, echoed in the completion.
    pub req_id: u16,
    /// Immediate data, if any.
    pub imm: Option<u32>,
    /// Whether the provider wants a completion.
    pub comp_req: bool,
    /// Destination QP number.
    pub dest_qp: u16,
    /// Address handle (an index into the device's AH table).
    pub ah: u16,
    /// Queue key.
    pub qkey: u32,
    /// The operation and its buffers.
    pub body: TxBody,
}

impl TxWqe {
    /// The operation, as completions report it.
    pub fn op(&self) -> IoOp {
        match self.body {
            TxBody::Inline(_) | TxBody::Gather(_) => IoOp::Send,
            TxBody::Read { .. } => IoOp::RdmaRead,
            TxBody::Write { .. } => IoOp::RdmaWrite,
        }
    }
}

/// Why a TX WQE cannot be executed: its request ID (for the completion)
/// and the status to complete it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadWqe {
    /// Request ID from the WQE (whatever it holds).
    pub req_id: u16,
    /// Whether a completion was asked for.
    pub comp_req: bool,
    /// The operation field, as far as it names one.
    pub op: IoOp,
    /// The error status.
    pub status: IoStatus,
    /// What was wrong, for logs.
    pub why: &'static str,
}

/// The phase bit of a raw WQE.
pub fn wqe_phase(raw: &[u8; TX_WQE_SIZE]) -> bool {
    raw[3] & ctrl2::PHASE != 0
}

/// Parses a WQE copied out of the LLQ.
pub fn parse_tx_wqe(raw: &[u8; TX_WQE_SIZE]) -> Result<TxWqe, BadWqe> {
    let req_id = u16_at(raw, 0);
    let c1 = raw[2];
    let c2 = raw[3];
    let comp_req = c2 & ctrl2::COMP_REQ != 0;
    let op_raw = c1 & ctrl1::OP_TYPE_MASK;
    let op = IoOp::from_code(op_raw).unwrap_or(IoOp::Send);
    let bad = |status, why| BadWqe {
        req_id,
        comp_req,
        op,
        status,
        why,
    };
    if c1 & ctrl1::META_DESC == 0 || c1 & ctrl1::META_EXTENSION != 0 {
        return Err(bad(
            IoStatus::LocalUnsupportedOp,
            "not a plain meta descriptor",
        ));
    }
    if c2 & (ctrl2::FIRST | ctrl2::LAST) != ctrl2::FIRST | ctrl2::LAST {
        return Err(bad(IoStatus::LocalUnsupportedOp, "first/last not both set"));
    }
    let length = u16_at(raw, 6);
    let has_imm = c1 & ctrl1::HAS_IMM != 0;
    let inline = c1 & ctrl1::INLINE_MSG != 0;
    let data = &raw[32..];
    let body = match IoOp::from_code(op_raw) {
        Some(IoOp::Send) if inline => {
            if u32::from(length) > INLINE_BUF_SIZE {
                return Err(bad(IoStatus::LocalBadLength, "inline data over 32 bytes"));
            }
            TxBody::Inline(data[..usize::from(length)].to_vec())
        }
        Some(IoOp::Send) => {
            if length > MAX_SEND_SGES {
                return Err(bad(IoStatus::LocalBadLength, "more than 2 buffers"));
            }
            TxBody::Gather(
                (0..usize::from(length))
                    .map(|i| Buf::at(data, i * 16))
                    .collect(),
            )
        }
        Some(op @ (IoOp::RdmaRead | IoOp::RdmaWrite)) => {
            if inline || length != 1 || (op == IoOp::RdmaRead && has_imm) {
                return Err(bad(IoStatus::LocalUnsupportedOp, "bad RDMA descriptor"));
            }
            let remote = Buf {
                length: u32_at(data, 0),
                lkey: u32_at(data, 4),
                addr: addr_at(data, 8),
            };
            let local = Buf::at(data, 16);
            if op == IoOp::RdmaRead {
                TxBody::Read { remote, local }
            } else {
                TxBody::Write { remote, local }
            }
        }
        _ => return Err(bad(IoStatus::LocalUnsupportedOp, "unsupported operation")),
    };
    Ok(TxWqe {
        req_id,
        imm: has_imm.then(|| u32_at(raw, 8)),
        comp_req,
        dest_qp: u16_at(raw, 4),
        ah: u16_at(raw, 12),
        qkey: u32_at(raw, 16),
        body,
    })
}

/// A receive descriptor (`struct efa_io_rx_desc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxDesc {
    /// The buffer.
    pub buf: Buf,
    /// Request ID (valid in a WQE's first descriptor).
    pub req_id: u16,
    /// First descriptor of a receive WQE.
    pub first: bool,
    /// Last descriptor of a receive WQE.
    pub last: bool,
}

/// Parses a receive descriptor copied out of the receive ring.
pub fn parse_rx_desc(raw: &[u8; RX_DESC_SIZE]) -> RxDesc {
    let ctrl = u32_at(raw, 12);
    RxDesc {
        buf: Buf {
            length: u32::from(u16_at(raw, 10)),
            lkey: ctrl & KEY_MASK,
            addr: addr_at(raw, 0),
        },
        req_id: u16_at(raw, 8),
        first: ctrl & (1 << 30) != 0,
        last: ctrl & (1 << 31) != 0,
    }
}

/// Completion flags (`EFA_IO_CDESC_COMMON_*`).
pub mod cdesc {
    /// Phase.
    pub const PHASE: u8 = 1 << 0;
    /// 2:1 queue type.
    pub const Q_TYPE_SHIFT: u8 = 1;
    /// Receive completion with immediate data.
    pub const HAS_IMM: u8 = 1 << 3;
    /// 6:4 operation.
    pub const OP_TYPE_SHIFT: u8 = 4;
    /// No matching receive (write with immediate, unsolicited).
    pub const UNSOLICITED: u8 = 1 << 7;
}

/// Where a completion's flags byte (with the phase) is: written last.
pub const CQE_FLAGS_AT: usize = 3;

/// A completion to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// Request ID of the WQE it completes.
    pub req_id: u16,
    /// Status.
    pub status: IoStatus,
    /// Send or receive queue.
    pub queue: IoQueue,
    /// Operation.
    pub op: IoOp,
    /// The local QP.
    pub qp_num: u16,
    /// Receive: bytes received (for a write with immediate, its length).
    pub length: u32,
    /// Receive: the receiver's AH for the sender, or 0xffff.
    pub ah: u16,
    /// Receive: the sender's QP.
    pub src_qp: u16,
    /// Receive: immediate data.
    pub imm: Option<u32>,
    /// Receive: the sender's GID, for a CQ that asked for it when the AH
    /// is unknown.
    pub src_addr: Option<[u8; 16]>,
}

impl Cqe {
    /// A send-queue completion.
    pub fn send(req_id: u16, status: IoStatus, op: IoOp, qp_num: u16) -> Self {
        Self {
            req_id,
            status,
            queue: IoQueue::SendQueue,
            op,
            qp_num,
            length: 0,
            ah: 0,
            src_qp: 0,
            imm: None,
            src_addr: None,
        }
    }

    /// The entry (`entry_size` is 16 or 32 bytes) with the phase in byte
    /// 3: the caller writes the other bytes first, byte 3 last.
    pub fn encode(&self, phase: bool, entry_size: usize) -> [u8; 32] {
        let mut e = [0u8; 32];
        put_u16(&mut e, 0, self.req_id);
        e[2] = self.status.code();
        let mut flags = u8::from(phase)
            | self.queue.code() << cdesc::Q_TYPE_SHIFT
            | (self.op.code() & 0x7) << cdesc::OP_TYPE_SHIFT;
        put_u16(&mut e, 4, self.qp_num);
        if self.queue == IoQueue::RecvQueue {
            put_u16(&mut e, 6, self.length as u16);
            put_u16(&mut e, 8, self.ah);
            put_u16(&mut e, 10, self.src_qp);
            if let Some(imm) = self.imm {
                flags |= cdesc::HAS_IMM;
                put_u32(&mut e, 12, imm);
            }
            if entry_size >= 32 {
                if self.op == IoOp::RdmaWrite {
                    put_u16(&mut e, 16, (self.length >> 16) as u16);
                } else if let Some(gid) = self.src_addr {
                    put(&mut e, 16, &gid);
                }
            }
        }
        e[CQE_FLAGS_AT] = flags;
        e
    }
}

/// An event queue entry for a completion event on `cqn`, with its phase
/// in word 0 (written last).
pub fn encode_eqe(cqn: u16, phase: bool) -> [u8; EQE_SIZE] {
    let mut e = [0u8; EQE_SIZE];
    // event_type (8:1) 0: a completion event.
    put_u32(&mut e, 0, u32::from(phase));
    put_u16(&mut e, 8, cqn);
    e
}

/// The phase of a raw completion entry (for tests and fuzzing).
pub fn cqe_phase(entry: &[u8]) -> bool {
    u8_at(entry, CQE_FLAGS_AT) & cdesc::PHASE != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wqe(c1: u8, c2: u8, length: u16, data: &[u8]) -> [u8; TX_WQE_SIZE] {
        let mut raw = [0u8; TX_WQE_SIZE];
        raw[0..2].copy_from_slice(&0x0102u16.to_le_bytes());
        raw[2] = c1;
        raw[3] = c2;
        raw[4..6].copy_from_slice(&0x0345u16.to_le_bytes());
        raw[6..8].copy_from_slice(&length.to_le_bytes());
        raw[8..12].copy_from_slice(&0xaabb_ccddu32.to_le_bytes());
        raw[12..14].copy_from_slice(&7u16.to_le_bytes());
        raw[16..20].copy_from_slice(&0x1111_1111u32.to_le_bytes());
        raw[32..32 + data.len()].copy_from_slice(data);
        raw
    }

    const GO: u8 = ctrl2::FIRST | ctrl2::LAST | ctrl2::COMP_REQ;

    /// Catches: WQE fields read at the wrong offsets (inline data at 32,
    /// buffer descriptors of 16 bytes, the RDMA remote address before
    /// the local buffer), or the lkey's reserved bits kept.
    #[test]
    fn wqes_decode_as_the_provider_writes_them() {
        let send = parse_tx_wqe(&wqe(
            ctrl1::META_DESC | ctrl1::INLINE_MSG | ctrl1::HAS_IMM,
            GO | 1,
            5,
            b"hello",
        ))
        .unwrap();
        assert_eq!(send.req_id, 0x0102);
        assert_eq!((send.dest_qp, send.ah, send.qkey), (0x345, 7, 0x1111_1111));
        assert_eq!(send.imm, Some(0xaabb_ccdd));
        assert_eq!(send.body, TxBody::Inline(b"hello".to_vec()));
        assert!(send.comp_req);

        let mut sgl = [0u8; 32];
        sgl[0..4].copy_from_slice(&100u32.to_le_bytes());
        sgl[4..8].copy_from_slice(&0xff00_0005u32.to_le_bytes());
        sgl[8..16].copy_from_slice(&0x1_0000_2000u64.to_le_bytes());
        sgl[16..20].copy_from_slice(&7u32.to_le_bytes());
        let gather = parse_tx_wqe(&wqe(ctrl1::META_DESC, GO, 2, &sgl)).unwrap();
        assert_eq!(
            gather.body,
            TxBody::Gather(vec![
                Buf {
                    length: 100,
                    lkey: 5,
                    addr: 0x1_0000_2000
                },
                Buf {
                    length: 7,
                    lkey: 0,
                    addr: 0
                }
            ])
        );
        assert_eq!(gather.imm, None);

        let read = parse_tx_wqe(&wqe(ctrl1::META_DESC | 1, GO, 1, &sgl)).unwrap();
        assert_eq!(read.op(), IoOp::RdmaRead);
        let TxBody::Read { remote, local } = read.body else {
            panic!()
        };
        assert_eq!(
            (remote.length, remote.lkey, remote.addr),
            (100, 0xff00_0005, 0x1_0000_2000)
        );
        assert_eq!(local.length, 7);
    }

    /// Catches: a malformed WQE (no meta bit, first/last missing, an
    /// unknown op, too much inline data, too many buffers, a read with
    /// immediate) executed instead of completed with an error.
    #[test]
    fn malformed_wqes_complete_with_errors() {
        let cases = [
            (wqe(0, GO, 0, &[]), IoStatus::LocalUnsupportedOp),
            (
                wqe(ctrl1::META_DESC | ctrl1::META_EXTENSION, GO, 0, &[]),
                IoStatus::LocalUnsupportedOp,
            ),
            (
                wqe(ctrl1::META_DESC, ctrl2::FIRST, 0, &[]),
                IoStatus::LocalUnsupportedOp,
            ),
            (
                wqe(ctrl1::META_DESC | 3, GO, 0, &[]),
                IoStatus::LocalUnsupportedOp,
            ),
            (
                wqe(ctrl1::META_DESC | 9, GO, 0, &[]),
                IoStatus::LocalUnsupportedOp,
            ),
            (
                wqe(ctrl1::META_DESC | ctrl1::INLINE_MSG, GO, 33, &[]),
                IoStatus::LocalBadLength,
            ),
            (wqe(ctrl1::META_DESC, GO, 3, &[]), IoStatus::LocalBadLength),
            (
                wqe(ctrl1::META_DESC | 1 | ctrl1::HAS_IMM, GO, 1, &[]),
                IoStatus::LocalUnsupportedOp,
            ),
            (
                wqe(ctrl1::META_DESC | 2, GO, 2, &[]),
                IoStatus::LocalUnsupportedOp,
            ),
        ];
        for (raw, status) in cases {
            let bad = parse_tx_wqe(&raw).unwrap_err();
            assert_eq!(bad.status, status, "{}", bad.why);
            assert_eq!(bad.req_id, 0x0102);
        }
    }

    /// Catches: completion flags with q_type or op_type in the wrong bits,
    /// a receive length split wrongly, or the source GID where the write
    /// length belongs.
    #[test]
    fn completions_encode_every_field() {
        let tx = Cqe::send(9, IoStatus::RemoteRnr, IoOp::RdmaWrite, 0x41).encode(true, 32);
        assert_eq!((u16_at(&tx, 0), tx[2]), (9, 10));
        assert_eq!(tx[3], 1 | 1 << 1 | 2 << 4);
        assert_eq!(u16_at(&tx, 4), 0x41);
        let rx = Cqe {
            queue: IoQueue::RecvQueue,
            length: 0x3_0010,
            ah: 0xffff,
            src_qp: 66,
            imm: Some(0x1234),
            src_addr: Some([7; 16]),
            ..Cqe::send(3, IoStatus::Ok, IoOp::RdmaWrite, 0x42)
        }
        .encode(false, 32);
        assert_eq!(rx[3], 2 << 1 | cdesc::HAS_IMM | 2 << 4);
        assert_eq!(
            (u16_at(&rx, 6), u16_at(&rx, 8), u16_at(&rx, 10)),
            (0x10, 0xffff, 66)
        );
        assert_eq!(u32_at(&rx, 12), 0x1234);
        assert_eq!(u16_at(&rx, 16), 3, "length_hi");
        let send_rx = Cqe {
            queue: IoQueue::RecvQueue,
            op: IoOp::Send,
            src_addr: Some([7; 16]),
            ..Cqe::send(3, IoStatus::Ok, IoOp::Send, 0x42)
        };
        assert_eq!(send_rx.encode(true, 32)[16..32], [7; 16]);
        assert_eq!(
            send_rx.encode(true, 16)[16..32],
            [0; 16],
            "16-byte entries have no extension"
        );
        let eqe = encode_eqe(0x33, true);
        assert_eq!((u32_at(&eqe, 0), u16_at(&eqe, 8)), (1, 0x33));
        let mut desc = [0u8; RX_DESC_SIZE];
        desc[0..8].copy_from_slice(&0x2_0000_1000u64.to_le_bytes());
        desc[8..10].copy_from_slice(&5u16.to_le_bytes());
        desc[10..12].copy_from_slice(&0xffffu16.to_le_bytes());
        desc[12..16].copy_from_slice(&(0xc000_0000u32 | 0x12_3456 | 0x3f00_0000).to_le_bytes());
        let d = parse_rx_desc(&desc);
        assert_eq!(
            (d.buf.addr, d.buf.length, d.buf.lkey),
            (0x2_0000_1000, 65535, 0x12_3456)
        );
        assert!(d.first && d.last);
        assert_eq!(d.req_id, 5);
    }
}
