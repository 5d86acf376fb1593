//! Submission and completion queue entries. The fields every command has
//! (CDW0, NSID, MPTR, DPTR) have accessors here; what a command's CDW10-15
//! mean is in its typed view in [`fields`](crate::fields).

use crate::spec::{Status, CQE_SIZE, SQE_SIZE};

/// A 64-byte submission queue entry as fetched from the queue. Every field
/// accessor reads a fixed offset, so any byte pattern is a valid command.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Command {
    raw: [u8; SQE_SIZE],
}

impl Command {
    pub fn from_bytes(raw: [u8; SQE_SIZE]) -> Self {
        Self { raw }
    }

    pub fn as_bytes(&self) -> &[u8; SQE_SIZE] {
        &self.raw
    }

    fn dword(&self, index: usize) -> u32 {
        let at = index * 4;
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.raw[at..at + 4]);
        u32::from_le_bytes(b)
    }

    fn qword(&self, index: usize) -> u64 {
        u64::from(self.dword(index)) | (u64::from(self.dword(index + 1)) << 32)
    }

    pub fn opcode(&self) -> u8 {
        self.raw[0]
    }
    /// Fused operation bits (CDW0 9:8).
    pub fn fuse(&self) -> u8 {
        self.raw[1] & 0x3
    }
    /// PRP or SGL for Data Transfer (CDW0 15:14).
    pub fn psdt(&self) -> u8 {
        self.raw[1] >> 6
    }
    pub fn cid(&self) -> u16 {
        u16::from_le_bytes([self.raw[2], self.raw[3]])
    }
    pub fn nsid(&self) -> u32 {
        self.dword(1)
    }
    pub fn mptr(&self) -> u64 {
        self.qword(4)
    }
    pub fn prp1(&self) -> u64 {
        self.qword(6)
    }
    pub fn prp2(&self) -> u64 {
        self.qword(8)
    }
    /// The data pointer as one SGL descriptor (bytes 24..40).
    pub fn sgl1(&self) -> [u8; 16] {
        let mut d = [0u8; 16];
        d.copy_from_slice(&self.raw[24..40]);
        d
    }
    pub fn cdw10(&self) -> u32 {
        self.dword(10)
    }
    pub fn cdw11(&self) -> u32 {
        self.dword(11)
    }
    pub fn cdw12(&self) -> u32 {
        self.dword(12)
    }
    pub fn cdw13(&self) -> u32 {
        self.dword(13)
    }
    pub fn cdw14(&self) -> u32 {
        self.dword(14)
    }
    pub fn cdw15(&self) -> u32 {
        self.dword(15)
    }
    /// CDW11:CDW10 as one little-endian qword (SLBA of NVM commands).
    pub fn cdw10_11(&self) -> u64 {
        self.qword(10)
    }
    /// CDW13:CDW12 as one qword (LPO of Get Log Page).
    pub fn cdw12_13(&self) -> u64 {
        self.qword(12)
    }
}

/// A builder for test code and the controller: a command with its fields.
#[derive(Clone, Copy)]
pub struct CommandBuilder {
    raw: [u8; SQE_SIZE],
}

impl CommandBuilder {
    pub fn new(opcode: u8, cid: u16) -> Self {
        let mut b = Self { raw: [0; SQE_SIZE] };
        b.raw[0] = opcode;
        b.raw[2..4].copy_from_slice(&cid.to_le_bytes());
        b
    }
    fn set_dword(mut self, index: usize, value: u32) -> Self {
        self.raw[index * 4..index * 4 + 4].copy_from_slice(&value.to_le_bytes());
        self
    }
    fn set_qword(self, index: usize, value: u64) -> Self {
        self.set_dword(index, value as u32)
            .set_dword(index + 1, (value >> 32) as u32)
    }
    pub fn psdt(mut self, psdt: u8) -> Self {
        self.raw[1] = (self.raw[1] & 0x3f) | (psdt << 6);
        self
    }
    pub fn fuse(mut self, fuse: u8) -> Self {
        self.raw[1] = (self.raw[1] & !0x3) | (fuse & 0x3);
        self
    }
    pub fn nsid(self, nsid: u32) -> Self {
        self.set_dword(1, nsid)
    }
    pub fn prp1(self, addr: u64) -> Self {
        self.set_qword(6, addr)
    }
    pub fn prp2(self, addr: u64) -> Self {
        self.set_qword(8, addr)
    }
    pub fn sgl1(mut self, descriptor: [u8; 16]) -> Self {
        self.raw[24..40].copy_from_slice(&descriptor);
        self.psdt(1)
    }
    pub fn cdw(self, index: usize, value: u32) -> Self {
        assert!(
            (10..=15).contains(&index),
            "CDW{index} is not a command dword"
        );
        self.set_dword(index, value)
    }
    pub fn slba(self, slba: u64) -> Self {
        self.set_qword(10, slba)
    }
    pub fn build(self) -> Command {
        Command { raw: self.raw }
    }
}

/// What a command handler returns: status and the command-specific dwords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub status: Status,
    pub dw0: u32,
    pub dw1: u32,
}

impl Completion {
    pub fn success() -> Self {
        Self::with_result(0)
    }
    pub fn with_result(dw0: u32) -> Self {
        Self {
            status: Status::SUCCESS,
            dw0,
            dw1: 0,
        }
    }
    pub fn error(status: Status) -> Self {
        Self {
            status,
            dw0: 0,
            dw1: 0,
        }
    }
}

impl From<Status> for Completion {
    fn from(status: Status) -> Self {
        Completion::error(status)
    }
}

/// A completion queue entry: what the controller posts, and what tests
/// and tracing decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionEntry {
    pub dw0: u32,
    pub dw1: u32,
    pub sq_head: u16,
    pub sqid: u16,
    pub cid: u16,
    pub phase: bool,
    pub status: Status,
}

impl CompletionEntry {
    /// The 16 bytes in the queue; the phase tag is bit 0 of the status word.
    pub fn encode(&self) -> [u8; CQE_SIZE] {
        let mut e = [0u8; CQE_SIZE];
        e[0..4].copy_from_slice(&self.dw0.to_le_bytes());
        e[4..8].copy_from_slice(&self.dw1.to_le_bytes());
        e[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        e[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        e[12..14].copy_from_slice(&self.cid.to_le_bytes());
        let status = (self.status.raw() << 1) | u16::from(self.phase);
        e[14..16].copy_from_slice(&status.to_le_bytes());
        e
    }

    pub fn decode(e: &[u8; CQE_SIZE]) -> Self {
        let u16_at = |at: usize| u16::from_le_bytes([e[at], e[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes([e[at], e[at + 1], e[at + 2], e[at + 3]]);
        let sf = u16_at(14);
        Self {
            dw0: u32_at(0),
            dw1: u32_at(4),
            sq_head: u16_at(8),
            sqid: u16_at(10),
            cid: u16_at(12),
            phase: sf & 1 != 0,
            status: Status::from_raw(sf >> 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_fields_round_trip() {
        let c = CommandBuilder::new(0x02, 0xbeef)
            .nsid(7)
            .prp1(0x1122_3344_5566_7788)
            .prp2(0x99)
            .slba(0x1_0000_0002)
            .cdw(12, 0x4000_0007)
            .psdt(2)
            .fuse(1)
            .build();
        assert_eq!(c.opcode(), 2);
        assert_eq!(c.cid(), 0xbeef);
        assert_eq!(c.nsid(), 7);
        assert_eq!(c.prp1(), 0x1122_3344_5566_7788);
        assert_eq!(c.prp2(), 0x99);
        assert_eq!(c.cdw10_11(), 0x1_0000_0002);
        assert_eq!(c.cdw12() & 0xffff, 7);
        assert_eq!(c.psdt(), 2);
        assert_eq!(c.fuse(), 1);
        assert_eq!(c.cdw12() >> 30, 1, "FUA bit");
    }

    #[test]
    fn cqe_encoding_puts_phase_in_bit_0_of_the_status_word() {
        let entry = CompletionEntry {
            dw0: 0xdead_beef,
            dw1: 0,
            sq_head: 5,
            sqid: 3,
            cid: 0x1234,
            phase: true,
            status: Status::INVALID_FIELD,
        };
        let e = entry.encode();
        let d = CompletionEntry::decode(&e);
        assert_eq!(d, entry);
        assert_eq!(d.dw0, 0xdead_beef);
        assert_eq!(d.sq_head, 5);
        assert_eq!(d.sqid, 3);
        assert_eq!(d.cid, 0x1234);
        assert!(d.phase);
        assert_eq!(d.status, Status::INVALID_FIELD);
        assert_eq!(u16::from_le_bytes([e[14], e[15]]), (0x4002 << 1) | 1);
    }
}
