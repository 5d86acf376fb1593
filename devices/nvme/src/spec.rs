//! Numbers from the NVMe specifications (base 2.0, NVM command set 1.0):
//! opcodes, status codes, feature, log page and Identify CNS identifiers.
//! Only what this controller uses. Registers are in
//! [`registers`](crate::registers), command fields in
//! [`fields`](crate::fields), and which commands exist (with their names and
//! effects) in the command tables.

use std::fmt;

/// Admin command opcodes; the admin command table says which are supported.
pub mod admin {
    pub const DELETE_SQ: u8 = 0x00;
    pub const CREATE_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_CQ: u8 = 0x04;
    pub const CREATE_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
    pub const FORMAT_NVM: u8 = 0x80;
}

/// NVM command set I/O opcodes; the I/O command table says which are
/// supported.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const VERIFY: u8 = 0x0c;
}

/// Feature identifiers.
pub mod feature {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    pub const WRITE_ATOMICITY: u8 = 0x0a;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    pub const TIMESTAMP: u8 = 0x0e;
    /// OCP Datacenter NVMe SSD: Error Injection (what `nvme ocp
    /// set-error-injection` sets).
    pub const OCP_ERROR_INJECTION: u8 = 0xc0;
}

/// Identify Controller or Namespace Structure (CNS) values.
pub mod cns {
    /// Identify Namespace for the NVM command set.
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NAMESPACE_DESCRIPTORS: u8 = 0x03;
    /// I/O Command Set specific Identify Namespace (CSI in CDW11).
    pub const CSI_NAMESPACE: u8 = 0x05;
    /// I/O Command Set specific Identify Controller.
    pub const CSI_CONTROLLER: u8 = 0x06;
    /// Active Namespace ID list of one I/O Command Set.
    pub const CSI_ACTIVE_NAMESPACES: u8 = 0x07;
    /// I/O Command Set Independent Identify Namespace.
    pub const INDEPENDENT_NAMESPACE: u8 = 0x08;
}

/// Command Set Identifier of the NVM command set.
pub const CSI_NVM: u8 = 0x00;

/// Bits of a Commands Supported and Effects dword (NVMe base 2.0,
/// Commands Supported and Effects Data Structure).
pub mod effects {
    /// Command Supported: every command table row has it.
    pub const CSUPP: u32 = 1 << 0;
    /// Logical Block Content Change.
    pub const LBCC: u32 = 1 << 1;
    /// Namespace Capability Change.
    pub const NCC: u32 = 1 << 2;
    /// Namespace Inventory Change.
    pub const NIC: u32 = 1 << 3;
    /// Controller Capability Change.
    pub const CCC: u32 = 1 << 4;

    /// Command Submission and Execution (bits 18:16): 000b no restriction,
    /// 001b one at a time per namespace, 010b one at a time in the
    /// subsystem.
    pub const fn cse(value: u32) -> u32 {
        (value & 0x7) << 16
    }
}

/// Log page identifiers.
pub mod log {
    pub const ERROR_INFORMATION: u8 = 0x01;
    pub const SMART_HEALTH: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NAMESPACES: u8 = 0x04;
    pub const COMMANDS_EFFECTS: u8 = 0x05;
}

/// Asynchronous event types and information codes.
pub mod aen {
    pub const TYPE_ERROR: u8 = 0;
    pub const TYPE_SMART: u8 = 1;
    pub const TYPE_NOTICE: u8 = 2;
    pub const ERROR_INVALID_DOORBELL_REGISTER: u8 = 0x00;
    pub const ERROR_INVALID_DOORBELL_VALUE: u8 = 0x01;
    pub const ERROR_PERSISTENT_INTERNAL: u8 = 0x03;
    pub const SMART_TEMPERATURE: u8 = 0x01;
    pub const NOTICE_NAMESPACE_CHANGED: u8 = 0x00;
}

/// The broadcast namespace identifier.
pub const NSID_ALL: u32 = 0xffff_ffff;

/// Bytes in a submission / completion queue entry (2^6, 2^4).
pub const SQE_SIZE: usize = 64;
pub const CQE_SIZE: usize = 16;
pub const SQES_LOG2: u32 = 6;
pub const CQES_LOG2: u32 = 4;

/// The 15-bit status field of a completion (without the phase tag):
/// SC in bits 7:0, SCT in 10:8, CRD in 12:11, M in 13, DNR in 14.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(u16);

const SCT_GENERIC: u16 = 0;
const SCT_COMMAND: u16 = 1;
const SCT_MEDIA: u16 = 2;
const DNR: u16 = 1 << 14;

impl Status {
    pub const SUCCESS: Status = Status(0);

    // Generic command status (SCT 0).
    pub const INVALID_OPCODE: Status = Status::generic(0x01).with_dnr();
    pub const INVALID_FIELD: Status = Status::generic(0x02).with_dnr();
    pub const DATA_TRANSFER_ERROR: Status = Status::generic(0x04);
    pub const INTERNAL_ERROR: Status = Status::generic(0x06);
    pub const ABORT_REQUESTED: Status = Status::generic(0x07);
    pub const ABORTED_SQ_DELETION: Status = Status::generic(0x08);
    pub const INVALID_NAMESPACE: Status = Status::generic(0x0b).with_dnr();
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::generic(0x0c).with_dnr();
    pub const INVALID_SGL_SEGMENT_DESCRIPTOR: Status = Status::generic(0x0d).with_dnr();
    pub const INVALID_SGL_DESCRIPTOR_COUNT: Status = Status::generic(0x0e).with_dnr();
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::generic(0x0f).with_dnr();
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::generic(0x11).with_dnr();
    pub const PRP_OFFSET_INVALID: Status = Status::generic(0x13).with_dnr();
    pub const LBA_OUT_OF_RANGE: Status = Status::generic(0x80).with_dnr();
    pub const CAPACITY_EXCEEDED: Status = Status::generic(0x81).with_dnr();
    pub const FORMAT_IN_PROGRESS: Status = Status::generic(0x84);

    // Command specific status (SCT 1).
    pub const INVALID_COMPLETION_QUEUE: Status = Status::command(0x00).with_dnr();
    pub const INVALID_QUEUE_IDENTIFIER: Status = Status::command(0x01).with_dnr();
    pub const INVALID_QUEUE_SIZE: Status = Status::command(0x02).with_dnr();
    pub const ASYNC_EVENT_LIMIT_EXCEEDED: Status = Status::command(0x05).with_dnr();
    pub const INVALID_INTERRUPT_VECTOR: Status = Status::command(0x08).with_dnr();
    pub const INVALID_LOG_PAGE: Status = Status::command(0x09).with_dnr();
    pub const INVALID_FORMAT: Status = Status::command(0x0a).with_dnr();
    pub const INVALID_QUEUE_DELETION: Status = Status::command(0x0c).with_dnr();
    pub const FEATURE_NOT_SAVEABLE: Status = Status::command(0x0d).with_dnr();
    pub const FEATURE_NOT_NAMESPACE_SPECIFIC: Status = Status::command(0x0f).with_dnr();

    // Media and data integrity errors (SCT 2).
    pub const WRITE_FAULT: Status = Status::media(0x80);
    pub const UNRECOVERED_READ_ERROR: Status = Status::media(0x81);
    pub const COMPARE_FAILURE: Status = Status::media(0x85).with_dnr();

    pub const fn generic(sc: u8) -> Status {
        Status((SCT_GENERIC << 8) | sc as u16)
    }
    pub const fn command(sc: u8) -> Status {
        Status((SCT_COMMAND << 8) | sc as u16)
    }
    pub const fn media(sc: u8) -> Status {
        Status((SCT_MEDIA << 8) | sc as u16)
    }
    /// Do Not Retry: the same command would fail again.
    pub const fn with_dnr(self) -> Status {
        Status(self.0 | DNR)
    }
    pub const fn from_raw(raw: u16) -> Status {
        Status(raw & 0x7fff)
    }
    pub const fn raw(self) -> u16 {
        self.0
    }
    pub const fn sc(self) -> u8 {
        (self.0 & 0xff) as u8
    }
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }
    pub const fn dnr(self) -> bool {
        self.0 & DNR != 0
    }
    pub const fn is_success(self) -> bool {
        self.sc() == 0 && self.sct() == 0
    }

    pub fn name(self) -> &'static str {
        match (self.sct() as u16, self.sc()) {
            (SCT_GENERIC, 0x00) => "Successful Completion",
            (SCT_GENERIC, 0x01) => "Invalid Command Opcode",
            (SCT_GENERIC, 0x02) => "Invalid Field in Command",
            (SCT_GENERIC, 0x04) => "Data Transfer Error",
            (SCT_GENERIC, 0x06) => "Internal Error",
            (SCT_GENERIC, 0x07) => "Command Abort Requested",
            (SCT_GENERIC, 0x08) => "Command Aborted due to SQ Deletion",
            (SCT_GENERIC, 0x0b) => "Invalid Namespace or Format",
            (SCT_GENERIC, 0x0c) => "Command Sequence Error",
            (SCT_GENERIC, 0x0d) => "Invalid SGL Segment Descriptor",
            (SCT_GENERIC, 0x0e) => "Invalid Number of SGL Descriptors",
            (SCT_GENERIC, 0x0f) => "Data SGL Length Invalid",
            (SCT_GENERIC, 0x11) => "SGL Descriptor Type Invalid",
            (SCT_GENERIC, 0x13) => "PRP Offset Invalid",
            (SCT_GENERIC, 0x80) => "LBA Out of Range",
            (SCT_GENERIC, 0x81) => "Capacity Exceeded",
            (SCT_GENERIC, 0x84) => "Format In Progress",
            (SCT_COMMAND, 0x00) => "Completion Queue Invalid",
            (SCT_COMMAND, 0x01) => "Invalid Queue Identifier",
            (SCT_COMMAND, 0x02) => "Invalid Queue Size",
            (SCT_COMMAND, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (SCT_COMMAND, 0x08) => "Invalid Interrupt Vector",
            (SCT_COMMAND, 0x09) => "Invalid Log Page",
            (SCT_COMMAND, 0x0a) => "Invalid Format",
            (SCT_COMMAND, 0x0c) => "Invalid Queue Deletion",
            (SCT_COMMAND, 0x0d) => "Feature Identifier Not Saveable",
            (SCT_COMMAND, 0x0f) => "Feature Not Namespace Specific",
            (SCT_MEDIA, 0x80) => "Write Fault",
            (SCT_MEDIA, 0x81) => "Unrecovered Read Error",
            (SCT_MEDIA, 0x85) => "Compare Failure",
            _ => "other status",
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (sct {} sc {:#04x}{})",
            self.name(),
            self.sct(),
            self.sc(),
            if self.dnr() { " dnr" } else { "" }
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Little-endian field writers for the fixed-layout data structures this
/// controller returns (Identify, log pages). Offsets are constants from the
/// specification, never guest input; an out-of-bounds offset is a bug in
/// this crate and the helpers ignore it rather than panic.
pub(crate) fn put_bytes(buf: &mut [u8], offset: usize, bytes: &[u8]) {
    if let Some(dst) = buf.get_mut(offset..offset + bytes.len()) {
        dst.copy_from_slice(bytes);
    } else {
        debug_assert!(false, "structure field out of bounds at {offset}");
    }
}

pub(crate) fn put_u8(buf: &mut [u8], offset: usize, value: u8) {
    put_bytes(buf, offset, &[value]);
}

pub(crate) fn put_u16(buf: &mut [u8], offset: usize, value: u16) {
    put_bytes(buf, offset, &value.to_le_bytes());
}

pub(crate) fn put_u32(buf: &mut [u8], offset: usize, value: u32) {
    put_bytes(buf, offset, &value.to_le_bytes());
}

pub(crate) fn put_u64(buf: &mut [u8], offset: usize, value: u64) {
    put_bytes(buf, offset, &value.to_le_bytes());
}

/// A 128-bit little-endian counter (SMART log) from a u64.
pub(crate) fn put_u128(buf: &mut [u8], offset: usize, value: u64) {
    put_bytes(buf, offset, &u128::from(value).to_le_bytes());
}

/// An ASCII field padded with spaces, truncated to `len`.
pub(crate) fn put_ascii(buf: &mut [u8], offset: usize, len: usize, text: &str) {
    let mut field = vec![b' '; len];
    for (dst, src) in field.iter_mut().zip(text.bytes()) {
        *dst = src;
    }
    put_bytes(buf, offset, &field);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_and_names() {
        let s = Status::INVALID_QUEUE_IDENTIFIER;
        assert_eq!(s.sct(), 1);
        assert_eq!(s.sc(), 1);
        assert!(s.dnr());
        assert_eq!(s.raw(), 0x4101);
        assert_eq!(s.name(), "Invalid Queue Identifier");
        assert!(Status::SUCCESS.is_success());
        assert!(!Status::WRITE_FAULT.dnr());
        assert_eq!(Status::WRITE_FAULT.raw(), 0x0280);
        assert_eq!(Status::from_raw(0xffff).raw(), 0x7fff);
    }

    #[test]
    fn ascii_fields_are_space_padded_and_truncated() {
        let mut buf = [0u8; 8];
        put_ascii(&mut buf, 2, 4, "ab");
        assert_eq!(&buf, b"\0\0ab  \0\0");
        put_ascii(&mut buf, 0, 3, "xyzw");
        assert_eq!(&buf[..3], b"xyz");
    }
}
