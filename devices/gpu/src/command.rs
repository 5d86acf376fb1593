//! Decoding of 64-byte ring entries and encoding of completion records.

use crate::regs::*;

/// One ring entry as the guest wrote it. Decoding never fails: checking
/// the fields is the engine's job, so that every malformed entry still
/// retires with an error status instead of vanishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Command {
    pub opcode: u8,
    pub flags: u8,
    pub reserved0: u16,
    pub pattern: u32,
    pub fence: u64,
    pub src: u64,
    pub dst: u64,
    pub len: u64,
    pub completion_addr: u64,
    pub reserved1: [u64; 2],
}

fn le_u64(bytes: &[u8; 64], at: usize) -> u64 {
    let mut word = [0u8; 8];
    if let Some(src) = bytes.get(at..at + 8) {
        word.copy_from_slice(src);
    }
    u64::from_le_bytes(word)
}

impl Command {
    pub const SIZE: usize = COMMAND_SIZE as usize;

    pub fn decode(bytes: &[u8; Self::SIZE]) -> Self {
        let head = le_u64(bytes, 0);
        Self {
            opcode: head as u8,
            flags: (head >> 8) as u8,
            reserved0: (head >> 16) as u16,
            pattern: (head >> 32) as u32,
            fence: le_u64(bytes, 0x08),
            src: le_u64(bytes, 0x10),
            dst: le_u64(bytes, 0x18),
            len: le_u64(bytes, 0x20),
            completion_addr: le_u64(bytes, 0x28),
            reserved1: [le_u64(bytes, 0x30), le_u64(bytes, 0x38)],
        }
    }

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let head = u64::from(self.opcode)
            | u64::from(self.flags) << 8
            | u64::from(self.reserved0) << 16
            | u64::from(self.pattern) << 32;
        let words = [
            head,
            self.fence,
            self.src,
            self.dst,
            self.len,
            self.completion_addr,
            self.reserved1[0],
            self.reserved1[1],
        ];
        let mut out = [0u8; Self::SIZE];
        for (chunk, word) in out.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    pub fn opcode_name(&self) -> &'static str {
        match self.opcode {
            OP_NOP => "nop",
            OP_COPY_TO_VRAM => "copy-to-vram",
            OP_COPY_FROM_VRAM => "copy-from-vram",
            OP_COPY_VRAM => "copy-vram",
            OP_FILL => "fill",
            OP_CHECKSUM => "checksum",
            _ => "invalid",
        }
    }
}

/// The 16-byte completion record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub fence: u64,
    pub status: u32,
    pub result: u32,
}

impl Completion {
    pub fn encode(&self) -> [u8; COMPLETION_SIZE] {
        let mut out = [0u8; COMPLETION_SIZE];
        out[..8].copy_from_slice(&self.fence.to_le_bytes());
        out[8..12].copy_from_slice(&self.status.to_le_bytes());
        out[12..].copy_from_slice(&self.result.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8; COMPLETION_SIZE]) -> Self {
        let mut fence = [0u8; 8];
        fence.copy_from_slice(&bytes[..8]);
        let mut status = [0u8; 4];
        status.copy_from_slice(&bytes[8..12]);
        let mut result = [0u8; 4];
        result.copy_from_slice(&bytes[12..]);
        Self {
            fence: u64::from_le_bytes(fence),
            status: u32::from_le_bytes(status),
            result: u32::from_le_bytes(result),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_documented_offsets() {
        let cmd = Command {
            opcode: OP_FILL,
            flags: CMD_FLAG_IRQ | CMD_FLAG_COMPLETION,
            reserved0: 0x1234,
            pattern: 0xdead_beef,
            fence: 0x0102_0304_0506_0708,
            src: 0x1111,
            dst: 0x2222,
            len: 0x3333,
            completion_addr: 0x4444,
            reserved1: [0x5555, 0x6666],
        };
        let bytes = cmd.encode();
        assert_eq!(bytes[0], OP_FILL);
        assert_eq!(bytes[1], 3);
        assert_eq!(&bytes[2..4], &[0x34, 0x12]);
        assert_eq!(&bytes[4..8], &[0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(bytes[8], 0x08);
        assert_eq!(bytes[0x10], 0x11);
        assert_eq!(bytes[0x18], 0x22);
        assert_eq!(bytes[0x20], 0x33);
        assert_eq!(bytes[0x28], 0x44);
        assert_eq!(bytes[0x30], 0x55);
        assert_eq!(bytes[0x38], 0x66);
        assert_eq!(Command::decode(&bytes), cmd);
    }

    #[test]
    fn completion_round_trip() {
        let c = Completion {
            fence: u64::MAX - 1,
            status: ERR_VRAM_RANGE,
            result: 0xe306_9283,
        };
        let bytes = c.encode();
        assert_eq!(&bytes[8..12], &ERR_VRAM_RANGE.to_le_bytes());
        assert_eq!(Completion::decode(&bytes), c);
    }
}
