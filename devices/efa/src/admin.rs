//! The admin queue's formats: a submission entry as the driver writes it,
//! the command it carries (parsed and checked, never trusted), and the
//! completion and AENQ entries the device writes back.
//!
//! Layouts are the driver's (`efa_admin_defs.h`, `efa_admin_cmds_defs.h`);
//! the admin API version is 0.1, so submission entries are 64 bytes with
//! the payload at byte 4, and completions carry no CRC.

use crate::bytes::{addr_at, gid_at, put, put_u16, put_u32, put_u8, u16_at, u32_at, u64_at, u8_at};
use crate::defs::{AdminOpcode, AdminStatus};

/// Bytes of one admin submission entry (API 0.1).
pub const SQ_ENTRY_SIZE: usize = 64;
/// Where the payload starts in a submission entry.
pub const PAYLOAD_OFFSET: usize = 4;
/// Bytes of payload.
pub const PAYLOAD_LEN: usize = SQ_ENTRY_SIZE - PAYLOAD_OFFSET;
/// Bytes of one admin completion entry.
pub const ACQ_ENTRY_SIZE: usize = 64;
/// Bytes of one AENQ entry.
pub const AENQ_ENTRY_SIZE: usize = 64;
/// Command IDs are 12 bits.
pub const COMMAND_ID_MASK: u16 = 0x0fff;
/// Admin queue depths the device accepts (the driver uses 32 and 16).
pub const MAX_ADMIN_DEPTH: u32 = 4096;

/// Submission entry flags (`EFA_ADMIN_AQ_COMMON_DESC_*`).
pub mod aq_flags {
    /// The entry's phase.
    pub const PHASE: u8 = 1 << 0;
    /// A control buffer is used.
    pub const CTRL_DATA: u8 = 1 << 1;
    /// The control buffer is a chain of page lists.
    pub const CTRL_DATA_INDIRECT: u8 = 1 << 2;
}

/// One admin submission entry as fetched from guest memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminEntry {
    /// The driver's command ID, echoed in the completion (12 bits).
    pub command_id: u16,
    /// Raw opcode.
    pub opcode: u8,
    /// [`aq_flags`].
    pub flags: u8,
    /// The command payload.
    pub payload: [u8; PAYLOAD_LEN],
}

impl AdminEntry {
    /// Splits a fetched entry into its fields.
    pub fn parse(raw: &[u8; SQ_ENTRY_SIZE]) -> Self {
        let mut payload = [0u8; PAYLOAD_LEN];
        payload.copy_from_slice(&raw[PAYLOAD_OFFSET..]);
        Self {
            command_id: u16_at(raw, 0) & COMMAND_ID_MASK,
            opcode: raw[2],
            flags: raw[3],
            payload,
        }
    }

    /// The entry's phase bit.
    pub fn phase(&self) -> bool {
        self.flags & aq_flags::PHASE != 0
    }

    /// The control buffer the payload names at `at`, if the entry says a
    /// control buffer is used.
    fn ctrl_buff(&self, at: usize) -> Option<CtrlBuff> {
        (self.flags & aq_flags::CTRL_DATA != 0).then(|| CtrlBuff::at(&self.payload, at))
    }
}

/// A control buffer (`struct efa_admin_ctrl_buff_info`): length and DMA
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtrlBuff {
    /// Bytes.
    pub length: u32,
    /// Bus address.
    pub addr: u64,
}

impl CtrlBuff {
    /// Size of the struct.
    pub const SIZE: usize = 12;

    /// The struct at `at` in `bytes`.
    pub fn at(bytes: &[u8], at: usize) -> Self {
        Self {
            length: u32_at(bytes, at),
            addr: addr_at(bytes, at + 4),
        }
    }
}

/// Where a REG_MR's page list is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PblSource {
    /// Up to four entries inside the command.
    Inline([u64; 4]),
    /// One physically contiguous buffer of `page_num` u64 entries.
    Direct(CtrlBuff),
    /// A chain of 4 KiB chunks listing the pages of the page list.
    Chained(CtrlBuff),
}

/// CREATE_QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateQp {
    /// Protection domain.
    pub pd: u16,
    /// Raw transport type ([`crate::defs::QpType`]).
    pub qp_type: u8,
    /// Create flags (sq_virt, rq_virt, unsolicited write recv, 64-bit req
    /// IDs); the device supports none of them.
    pub flags: u8,
    /// Host-memory SQ base: always 0 (the SQ is in the LLQ).
    pub sq_base_addr: u64,
    /// The receive ring's bus address (0: no receive queue).
    pub rq_base_addr: u64,
    /// CQ of send completions.
    pub send_cq_idx: u32,
    /// CQ of receive completions.
    pub recv_cq_idx: u32,
    /// Bytes of the send ring (WQEs × 64).
    pub sq_ring_size: u32,
    /// Send WQEs that may be outstanding.
    pub sq_depth: u32,
    /// Bytes of the receive ring (descriptors × 16).
    pub rq_ring_size: u32,
    /// Receive WQEs that may be outstanding.
    pub rq_depth: u32,
    /// The UAR whose doorbell page the QP's doorbells are on.
    pub uar: u16,
    /// Service level.
    pub sl: u8,
}

/// MODIFY_QP mask bits (`EFA_ADMIN_MODIFY_QP_CMD_*_MASK`).
pub mod modify_mask {
    /// qp_state is valid.
    pub const QP_STATE: u32 = 1 << 0;
    /// cur_qp_state is valid.
    pub const CUR_QP_STATE: u32 = 1 << 1;
    /// qkey is valid.
    pub const QKEY: u32 = 1 << 2;
    /// sq_psn is valid.
    pub const SQ_PSN: u32 = 1 << 3;
    /// sq_drained_async_notify is valid.
    pub const SQ_DRAINED_ASYNC_NOTIFY: u32 = 1 << 4;
    /// rnr_retry is valid.
    pub const RNR_RETRY: u32 = 1 << 5;
    /// Every bit the device knows.
    pub const ALL: u32 = 0x3f;
}

/// MODIFY_QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModifyQp {
    /// Which fields are valid ([`modify_mask`]).
    pub mask: u32,
    /// The QP.
    pub handle: u32,
    /// New state.
    pub state: u32,
    /// The state the driver believes the QP is in.
    pub cur_state: u32,
    /// New qkey.
    pub qkey: u32,
    /// New send PSN.
    pub sq_psn: u32,
    /// Whether SQ-drained events are wanted.
    pub sq_drained_async_notify: u8,
    /// RNR retry count (7: forever).
    pub rnr_retry: u8,
}

/// REG_MR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegMr {
    /// Protection domain.
    pub pd: u16,
    /// The page list.
    pub pbl: PblSource,
    /// Bytes the MR covers from `iova`.
    pub mr_length: u64,
    /// log2 of the page size of the page list's entries.
    pub page_shift: u8,
    /// Physical addressing mode (never used by the driver; refused).
    pub phys_mode: bool,
    /// Access bits: local write (0), remote write (1), remote read (2).
    pub permissions: u8,
    /// Entries in the page list.
    pub page_num: u32,
    /// The MR's first I/O virtual address.
    pub iova: u64,
}

/// REG_MR permission bits.
pub mod mr_access {
    /// Local write (receive buffers, RDMA read targets).
    pub const LOCAL_WRITE: u8 = 1 << 0;
    /// Remote write.
    pub const REMOTE_WRITE: u8 = 1 << 1;
    /// Remote read.
    pub const REMOTE_READ: u8 = 1 << 2;
    /// Every bit the device knows.
    pub const ALL: u8 = 0x7;
}

/// CREATE_CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateCq {
    /// Completion events to an event queue (bit 5 of caps_1).
    pub interrupt_mode: bool,
    /// The ring is addressed virtually (bit 6 of caps_1; never used).
    pub virt: bool,
    /// Entry size in 32-bit words (4 or 8).
    pub entry_words: u8,
    /// Receive completions carry the source GID when the AH is unknown.
    pub set_src_addr: bool,
    /// 64-bit send request IDs (not supported).
    pub sq_comp_64_bit_req_id: bool,
    /// Entries per sub-CQ.
    pub sub_cq_depth: u16,
    /// Event queue (with interrupt mode).
    pub eqn: u16,
    /// The ring's bus address.
    pub cq_ba: u64,
    /// Sub-CQs (the device offers 1).
    pub num_sub_cqs: u16,
    /// The UAR whose page holds the CQ's doorbell.
    pub uar: u16,
}

/// CREATE_EQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateEq {
    /// Entries (a power of two).
    pub depth: u16,
    /// MSI-X vector.
    pub msix_vec: u8,
    /// Entry size in 32-bit words (4).
    pub entry_words: u8,
    /// The ring's bus address.
    pub ba: u64,
    /// Which events (bit 0: completions).
    pub event_bitmask: u32,
}

/// One parsed admin command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminCommand {
    /// CREATE_QP.
    CreateQp(CreateQp),
    /// MODIFY_QP.
    ModifyQp(ModifyQp),
    /// QUERY_QP.
    QueryQp {
        /// The QP.
        handle: u32,
    },
    /// DESTROY_QP.
    DestroyQp {
        /// The QP.
        handle: u32,
    },
    /// CREATE_AH.
    CreateAh {
        /// Destination GID.
        gid: [u8; 16],
        /// Protection domain.
        pd: u16,
    },
    /// DESTROY_AH.
    DestroyAh {
        /// The AH.
        ah: u16,
        /// Its protection domain.
        pd: u16,
    },
    /// REG_MR.
    RegMr(RegMr),
    /// DEREG_MR.
    DeregMr {
        /// The MR's local key.
        lkey: u32,
    },
    /// CREATE_CQ.
    CreateCq(CreateCq),
    /// DESTROY_CQ.
    DestroyCq {
        /// The CQ.
        cq_idx: u16,
    },
    /// GET_FEATURE.
    GetFeature {
        /// Raw feature ID.
        feature: u8,
    },
    /// SET_FEATURE of AENQ_CONFIG.
    SetAenqConfig {
        /// Groups to enable.
        enabled_groups: u32,
    },
    /// SET_FEATURE of HOST_INFO.
    SetHostInfo {
        /// Where the host info is.
        buffer: CtrlBuff,
    },
    /// GET_STATS.
    GetStats {
        /// Raw stats type.
        stats_type: u8,
        /// Scope (0: all).
        scope: u8,
        /// Queue, for scope 1.
        scope_modifier: u16,
    },
    /// ALLOC_PD.
    AllocPd,
    /// DEALLOC_PD.
    DeallocPd {
        /// The PD.
        pd: u16,
    },
    /// ALLOC_UAR.
    AllocUar,
    /// DEALLOC_UAR.
    DeallocUar {
        /// The UAR.
        uar: u16,
    },
    /// CREATE_EQ.
    CreateEq(CreateEq),
    /// DESTROY_EQ.
    DestroyEq {
        /// The EQ.
        eqn: u16,
    },
}

/// Offset of the feature ID in a GET/SET_FEATURE payload.
const FEATURE_ID_AT: usize = 13;
/// Offset of the feature data in a SET_FEATURE payload.
const SET_FEATURE_DATA_AT: usize = 16;

impl AdminCommand {
    /// Parses and checks the payload of `entry`. An opcode the interface
    /// does not define is BAD_OPCODE; one it defines that the device does
    /// not implement is UNSUPPORTED_OPCODE; a payload that cannot be a
    /// command is MALFORMED_REQUEST.
    pub fn parse(entry: &AdminEntry) -> Result<Self, AdminStatus> {
        let p = &entry.payload;
        let opcode = AdminOpcode::from_code(entry.opcode).ok_or(AdminStatus::BadOpcode)?;
        Ok(match opcode {
            AdminOpcode::CreateQp => AdminCommand::CreateQp(CreateQp {
                pd: u16_at(p, 0),
                qp_type: u8_at(p, 2),
                flags: u8_at(p, 3),
                sq_base_addr: u64_at(p, 4),
                rq_base_addr: u64_at(p, 12),
                send_cq_idx: u32_at(p, 20),
                recv_cq_idx: u32_at(p, 24),
                sq_ring_size: u32_at(p, 36),
                sq_depth: u32_at(p, 40),
                rq_ring_size: u32_at(p, 44),
                rq_depth: u32_at(p, 48),
                uar: u16_at(p, 52),
                sl: u8_at(p, 54),
            }),
            AdminOpcode::ModifyQp => AdminCommand::ModifyQp(ModifyQp {
                mask: u32_at(p, 0),
                handle: u32_at(p, 4),
                state: u32_at(p, 8),
                cur_state: u32_at(p, 12),
                qkey: u32_at(p, 16),
                sq_psn: u32_at(p, 20),
                sq_drained_async_notify: u8_at(p, 24),
                rnr_retry: u8_at(p, 25),
            }),
            AdminOpcode::QueryQp => AdminCommand::QueryQp {
                handle: u32_at(p, 0),
            },
            AdminOpcode::DestroyQp => AdminCommand::DestroyQp {
                handle: u32_at(p, 0),
            },
            AdminOpcode::CreateAh => AdminCommand::CreateAh {
                gid: gid_at(p, 0),
                pd: u16_at(p, 16),
            },
            AdminOpcode::DestroyAh => AdminCommand::DestroyAh {
                ah: u16_at(p, 0),
                pd: u16_at(p, 2),
            },
            AdminOpcode::RegMr => {
                let flags = u8_at(p, 44);
                let pbl = match entry.ctrl_buff(4) {
                    None => {
                        if entry.flags & aq_flags::CTRL_DATA_INDIRECT != 0 {
                            return Err(AdminStatus::MalformedRequest);
                        }
                        PblSource::Inline([
                            u64_at(p, 4),
                            u64_at(p, 12),
                            u64_at(p, 20),
                            u64_at(p, 28),
                        ])
                    }
                    Some(buffer) if entry.flags & aq_flags::CTRL_DATA_INDIRECT != 0 => {
                        PblSource::Chained(buffer)
                    }
                    Some(buffer) => PblSource::Direct(buffer),
                };
                AdminCommand::RegMr(RegMr {
                    pd: u16_at(p, 0),
                    pbl,
                    mr_length: u64_at(p, 36),
                    page_shift: flags & 0x3f,
                    phys_mode: flags & 0x80 != 0,
                    permissions: u8_at(p, 45),
                    page_num: u32_at(p, 48),
                    iova: u64_at(p, 52),
                })
            }
            AdminOpcode::DeregMr => AdminCommand::DeregMr { lkey: u32_at(p, 0) },
            AdminOpcode::CreateCq => {
                let caps1 = u8_at(p, 0);
                let caps2 = u8_at(p, 1);
                AdminCommand::CreateCq(CreateCq {
                    interrupt_mode: caps1 & (1 << 5) != 0,
                    virt: caps1 & (1 << 6) != 0,
                    entry_words: caps2 & 0x1f,
                    set_src_addr: caps2 & (1 << 5) != 0,
                    sq_comp_64_bit_req_id: caps2 & (1 << 6) != 0,
                    sub_cq_depth: u16_at(p, 2),
                    eqn: u16_at(p, 4),
                    cq_ba: u64_at(p, 8),
                    num_sub_cqs: u16_at(p, 20),
                    uar: u16_at(p, 22),
                })
            }
            AdminOpcode::DestroyCq => AdminCommand::DestroyCq {
                cq_idx: u16_at(p, 0),
            },
            AdminOpcode::GetFeature => AdminCommand::GetFeature {
                feature: u8_at(p, FEATURE_ID_AT),
            },
            AdminOpcode::SetFeature => match u8_at(p, FEATURE_ID_AT) {
                2 => AdminCommand::SetAenqConfig {
                    enabled_groups: u32_at(p, SET_FEATURE_DATA_AT + 4),
                },
                6 => AdminCommand::SetHostInfo {
                    buffer: entry.ctrl_buff(0).ok_or(AdminStatus::MalformedRequest)?,
                },
                _ => return Err(AdminStatus::UnsupportedOpcode),
            },
            AdminOpcode::GetStats => AdminCommand::GetStats {
                stats_type: u8_at(p, 12),
                scope: u8_at(p, 13),
                scope_modifier: u16_at(p, 14),
            },
            AdminOpcode::AllocPd => AdminCommand::AllocPd,
            AdminOpcode::DeallocPd => AdminCommand::DeallocPd { pd: u16_at(p, 0) },
            AdminOpcode::AllocUar => AdminCommand::AllocUar,
            AdminOpcode::DeallocUar => AdminCommand::DeallocUar { uar: u16_at(p, 0) },
            AdminOpcode::CreateEq => AdminCommand::CreateEq(CreateEq {
                depth: u16_at(p, 0),
                msix_vec: u8_at(p, 2),
                entry_words: u8_at(p, 3) & 0x1f,
                ba: u64_at(p, 4),
                event_bitmask: u32_at(p, 12),
            }),
            AdminOpcode::DestroyEq => AdminCommand::DestroyEq { eqn: u16_at(p, 0) },
            AdminOpcode::AllocMr
            | AdminOpcode::Service
            | AdminOpcode::CreateEventCounter
            | AdminOpcode::DestroyEventCounter
            | AdminOpcode::AttachEventCounter
            | AdminOpcode::ModifyEventCounter
            | AdminOpcode::DetachEventCounter => return Err(AdminStatus::UnsupportedOpcode),
        })
    }

    /// The opcode.
    pub fn opcode(&self) -> AdminOpcode {
        match self {
            AdminCommand::CreateQp(_) => AdminOpcode::CreateQp,
            AdminCommand::ModifyQp(_) => AdminOpcode::ModifyQp,
            AdminCommand::QueryQp { .. } => AdminOpcode::QueryQp,
            AdminCommand::DestroyQp { .. } => AdminOpcode::DestroyQp,
            AdminCommand::CreateAh { .. } => AdminOpcode::CreateAh,
            AdminCommand::DestroyAh { .. } => AdminOpcode::DestroyAh,
            AdminCommand::RegMr(_) => AdminOpcode::RegMr,
            AdminCommand::DeregMr { .. } => AdminOpcode::DeregMr,
            AdminCommand::CreateCq(_) => AdminOpcode::CreateCq,
            AdminCommand::DestroyCq { .. } => AdminOpcode::DestroyCq,
            AdminCommand::GetFeature { .. } => AdminOpcode::GetFeature,
            AdminCommand::SetAenqConfig { .. } | AdminCommand::SetHostInfo { .. } => {
                AdminOpcode::SetFeature
            }
            AdminCommand::GetStats { .. } => AdminOpcode::GetStats,
            AdminCommand::AllocPd => AdminOpcode::AllocPd,
            AdminCommand::DeallocPd { .. } => AdminOpcode::DeallocPd,
            AdminCommand::AllocUar => AdminOpcode::AllocUar,
            AdminCommand::DeallocUar { .. } => AdminOpcode::DeallocUar,
            AdminCommand::CreateEq(_) => AdminOpcode::CreateEq,
            AdminCommand::DestroyEq { .. } => AdminOpcode::DestroyEq,
        }
    }
}

/// A completion being built: 64 bytes whose response fields are set at
/// the offsets the driver's `*_resp` structs give (from the entry's start,
/// so `qp_handle` is at 8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response(pub [u8; ACQ_ENTRY_SIZE]);

impl Default for Response {
    fn default() -> Self {
        Self([0; ACQ_ENTRY_SIZE])
    }
}

impl Response {
    /// Sets the u8 at `at`.
    pub fn u8(mut self, at: usize, value: u8) -> Self {
        put_u8(&mut self.0, at, value);
        self
    }
    /// Sets the u16 at `at`.
    pub fn u16(mut self, at: usize, value: u16) -> Self {
        put_u16(&mut self.0, at, value);
        self
    }
    /// Sets the u32 at `at`.
    pub fn u32(mut self, at: usize, value: u32) -> Self {
        put_u32(&mut self.0, at, value);
        self
    }
    /// Copies `bytes` to `at`.
    pub fn bytes(mut self, at: usize, bytes: &[u8]) -> Self {
        put(&mut self.0, at, bytes);
        self
    }
}

/// Offset of the phase byte in a completion: written last.
pub const ACQ_FLAGS_AT: usize = 3;

/// A finished completion entry: `command_id` and `status` in the common
/// descriptor, the phase in byte 3 (which the device writes last).
pub fn acq_entry(
    command_id: u16,
    status: AdminStatus,
    phase: bool,
    response: &Response,
) -> [u8; ACQ_ENTRY_SIZE] {
    let mut entry = response.0;
    put_u16(&mut entry, 0, command_id & COMMAND_ID_MASK);
    entry[2] = status.code();
    entry[ACQ_FLAGS_AT] = u8::from(phase);
    put_u16(&mut entry, 4, 0); // checksum: not used below API 0.2
    put_u16(&mut entry, 6, 0);
    entry
}

/// Offset of the phase byte in an AENQ entry: written last.
pub const AENQ_FLAGS_AT: usize = 4;

/// An AENQ entry: group, syndrome, phase, a timestamp (ns since the
/// device started) and up to 48 bytes of inline data.
pub fn aenq_entry(
    group: u16,
    syndrome: u16,
    phase: bool,
    timestamp: u64,
    data: &[u8],
) -> [u8; AENQ_ENTRY_SIZE] {
    let mut entry = [0u8; AENQ_ENTRY_SIZE];
    put_u16(&mut entry, 0, group);
    put_u16(&mut entry, 2, syndrome);
    entry[AENQ_FLAGS_AT] = u8::from(phase);
    put_u32(&mut entry, 8, timestamp as u32);
    put_u32(&mut entry, 12, (timestamp >> 32) as u32);
    let data = &data[..data.len().min(48)];
    put(&mut entry, 16, data);
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(opcode: u8, flags: u8, payload: &[(usize, &[u8])]) -> AdminEntry {
        let mut raw = [0u8; SQ_ENTRY_SIZE];
        raw[0..2].copy_from_slice(&0xf123u16.to_le_bytes());
        raw[2] = opcode;
        raw[3] = flags;
        for (at, bytes) in payload {
            raw[PAYLOAD_OFFSET + at..PAYLOAD_OFFSET + at + bytes.len()].copy_from_slice(bytes);
        }
        AdminEntry::parse(&raw)
    }

    /// Catches: command fields read at offsets other than the driver's
    /// (measured from `efa_admin_cmds_defs.h`), or the command ID's
    /// reserved bits leaking into the echo.
    #[test]
    fn create_qp_and_reg_mr_fields_are_at_the_drivers_offsets() {
        let e = entry(
            1,
            1,
            &[
                (0, &7u16.to_le_bytes()),
                (2, &[2]),
                (12, &0x1234_5000u64.to_le_bytes()),
                (20, &3u32.to_le_bytes()),
                (24, &4u32.to_le_bytes()),
                (36, &8192u32.to_le_bytes()),
                (40, &128u32.to_le_bytes()),
                (44, &8192u32.to_le_bytes()),
                (48, &512u32.to_le_bytes()),
                (52, &9u16.to_le_bytes()),
            ],
        );
        assert_eq!(e.command_id, 0x123);
        assert!(e.phase());
        let AdminCommand::CreateQp(c) = AdminCommand::parse(&e).unwrap() else {
            panic!("not CREATE_QP")
        };
        assert_eq!(
            (
                c.pd,
                c.qp_type,
                c.rq_base_addr,
                c.send_cq_idx,
                c.recv_cq_idx
            ),
            (7, 2, 0x1234_5000, 3, 4)
        );
        assert_eq!(
            (
                c.sq_ring_size,
                c.sq_depth,
                c.rq_ring_size,
                c.rq_depth,
                c.uar
            ),
            (8192, 128, 8192, 512, 9)
        );

        let inline = entry(
            7,
            0,
            &[
                (4, &0x1000u64.to_le_bytes()),
                (28, &0x4000u64.to_le_bytes()),
                (36, &0x3000u64.to_le_bytes()),
                (44, &[12, 0b101]),
                (48, &4u32.to_le_bytes()),
                (52, &0x7f00_0000_0800u64.to_le_bytes()),
            ],
        );
        let AdminCommand::RegMr(mr) = AdminCommand::parse(&inline).unwrap() else {
            panic!("not REG_MR")
        };
        assert_eq!(mr.pbl, PblSource::Inline([0x1000, 0, 0, 0x4000]));
        assert_eq!(
            (mr.mr_length, mr.page_shift, mr.permissions),
            (0x3000, 12, 5)
        );
        assert_eq!((mr.page_num, mr.iova), (4, 0x7f00_0000_0800));

        let direct = entry(
            7,
            aq_flags::CTRL_DATA,
            &[(4, &[40, 0, 0, 0, 0, 0x20, 0, 0, 1, 0, 0, 0])],
        );
        let AdminCommand::RegMr(mr) = AdminCommand::parse(&direct).unwrap() else {
            panic!()
        };
        assert_eq!(
            mr.pbl,
            PblSource::Direct(CtrlBuff {
                length: 40,
                addr: 0x1_0000_2000
            })
        );
        let chained = entry(7, aq_flags::CTRL_DATA | aq_flags::CTRL_DATA_INDIRECT, &[]);
        assert!(matches!(
            AdminCommand::parse(&chained),
            Ok(AdminCommand::RegMr(RegMr {
                pbl: PblSource::Chained(_),
                ..
            }))
        ));
        let nonsense = entry(7, aq_flags::CTRL_DATA_INDIRECT, &[]);
        assert_eq!(
            AdminCommand::parse(&nonsense),
            Err(AdminStatus::MalformedRequest)
        );
    }

    /// Catches: an unknown opcode answered as anything but BAD_OPCODE, or
    /// an unimplemented known one as anything but UNSUPPORTED_OPCODE (the
    /// driver maps the latter to -EOPNOTSUPP).
    #[test]
    fn unknown_and_unsupported_opcodes_get_the_drivers_statuses() {
        for opcode in [0u8, 22, 24, 30, 255] {
            assert_eq!(
                AdminCommand::parse(&entry(opcode, 0, &[])),
                Err(AdminStatus::BadOpcode),
                "{opcode}"
            );
        }
        for opcode in [20u8, 21, 25, 29] {
            assert_eq!(
                AdminCommand::parse(&entry(opcode, 0, &[])),
                Err(AdminStatus::UnsupportedOpcode)
            );
        }
        let set_unknown = entry(12, 0, &[(13, &[4])]);
        assert_eq!(
            AdminCommand::parse(&set_unknown),
            Err(AdminStatus::UnsupportedOpcode)
        );
        let aenq = entry(12, 0, &[(13, &[2]), (20, &0x1eu32.to_le_bytes())]);
        assert_eq!(
            AdminCommand::parse(&aenq),
            Ok(AdminCommand::SetAenqConfig {
                enabled_groups: 0x1e
            })
        );
        let host_info_without_buffer = entry(12, 0, &[(13, &[6])]);
        assert_eq!(
            AdminCommand::parse(&host_info_without_buffer),
            Err(AdminStatus::MalformedRequest)
        );
    }

    /// Catches: a completion whose phase is not in byte 3, whose command
    /// ID keeps reserved bits, or whose response fields move.
    #[test]
    fn completions_and_aenq_entries_are_laid_out_as_the_driver_reads() {
        let response = Response::default().u32(8, 0xabcd).u16(12, 5);
        let e = acq_entry(0xfff5, AdminStatus::IllegalParameter, true, &response);
        assert_eq!(u16_at(&e, 0), 0xff5);
        assert_eq!(e[2], 5);
        assert_eq!(e[3], 1);
        assert_eq!(u32_at(&e, 8), 0xabcd);
        assert_eq!(u16_at(&e, 12), 5);
        let a = aenq_entry(4, 0, false, 0x1_0000_0002, &[9; 60]);
        assert_eq!((u16_at(&a, 0), a[4]), (4, 0));
        assert_eq!((u32_at(&a, 8), u32_at(&a, 12)), (2, 1));
        assert_eq!(a[16..64], [9; 48]);
    }
}
