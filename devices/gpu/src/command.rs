//! The ring's wire format: 64-byte ring entries and 16-byte completion
//! records, little-endian, laid out as `struct p2plab_gpu_hw_cmd` and
//! `struct p2plab_gpu_hw_completion` in the guest driver's header.
//!
//! What each opcode does with the fields is in [`crate::engine::opcodes`].

use p2plab_kit::bit_flags;

/// Bytes per ring entry.
pub const COMMAND_SIZE: u64 = 64;
/// Bytes per completion record.
pub const COMPLETION_SIZE: usize = 16;

/// Where a field sits in a ring entry or record: its name as in the C
/// struct, byte offset and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpan {
    /// Field name, as in the guest driver's struct.
    pub name: &'static str,
    /// Byte offset.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

impl FieldSpan {
    const fn new(name: &'static str, offset: usize, size: usize) -> Self {
        Self { name, offset, size }
    }

    /// The field's `N` bytes of `bytes` (zeros if out of range, which the
    /// compile-time checks below rule out).
    fn get<const N: usize>(self, bytes: &[u8]) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(src) = bytes.get(self.offset..self.offset + N) {
            out.copy_from_slice(src);
        }
        out
    }

    /// Stores `value` at the field (nothing if out of range).
    fn put(self, bytes: &mut [u8], value: &[u8]) {
        if let Some(dst) = bytes.get_mut(self.offset..self.offset + value.len()) {
            dst.copy_from_slice(value);
        }
    }
}

bit_flags! {
    /// A ring entry's flags byte. Other bits are reserved: a command with
    /// one set fails with BAD_COMMAND and writes no record.
    pub struct CommandFlags(u8), prefix "CMD_FLAG_" {
        /// Raise INT_FENCE when this command retires.
        IRQ = 1 << 0;
        /// Write a completion record to the entry's completion_addr.
        COMPLETION = 1 << 1;
    }
}

/// One ring entry as the guest wrote it. Decoding never fails: checking
/// the fields is the engine's job, so that every malformed entry still
/// retires with an error status instead of vanishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Command {
    /// Which row of the opcode table runs it.
    pub opcode: u8,
    /// Unknown bits included.
    pub flags: CommandFlags,
    /// Must be 0.
    pub reserved0: u16,
    /// FILL's 32-bit pattern; must be 0 for other opcodes.
    pub pattern: u32,
    /// Published in FENCE (and the record) when the command retires.
    pub fence: u64,
    /// Source operand: a bus address or a VRAM offset, per opcode.
    pub src: u64,
    /// Destination operand: a bus address or a VRAM offset, per opcode.
    pub dst: u64,
    /// Bytes to process (0 is a valid no-op).
    pub len: u64,
    /// Guest-physical address of the completion record, used with
    /// [`CommandFlags::COMPLETION`].
    pub completion_addr: u64,
    /// Must be 0.
    pub reserved1: [u64; 2],
}

impl Command {
    /// Bytes per entry.
    pub const SIZE: usize = COMMAND_SIZE as usize;

    /// Field `opcode`.
    pub const OPCODE: FieldSpan = FieldSpan::new("opcode", 0x00, 1);
    /// Field `flags`.
    pub const FLAGS: FieldSpan = FieldSpan::new("flags", 0x01, 1);
    /// Field `reserved0`.
    pub const RESERVED0: FieldSpan = FieldSpan::new("reserved0", 0x02, 2);
    /// Field `pattern`.
    pub const PATTERN: FieldSpan = FieldSpan::new("pattern", 0x04, 4);
    /// Field `fence`.
    pub const FENCE: FieldSpan = FieldSpan::new("fence", 0x08, 8);
    /// Field `src`.
    pub const SRC: FieldSpan = FieldSpan::new("src", 0x10, 8);
    /// Field `dst`.
    pub const DST: FieldSpan = FieldSpan::new("dst", 0x18, 8);
    /// Field `len`.
    pub const LEN: FieldSpan = FieldSpan::new("len", 0x20, 8);
    /// Field `completion_addr`.
    pub const COMPLETION_ADDR: FieldSpan = FieldSpan::new("completion_addr", 0x28, 8);
    /// Field `reserved1`: two u64.
    pub const RESERVED1: FieldSpan = FieldSpan::new("reserved1", 0x30, 16);
    /// The second u64 of `reserved1`.
    const RESERVED1_HIGH: FieldSpan = FieldSpan::new("reserved1[1]", 0x38, 8);

    /// Every field in offset order.
    pub const FIELDS: [FieldSpan; 10] = [
        Self::OPCODE,
        Self::FLAGS,
        Self::RESERVED0,
        Self::PATTERN,
        Self::FENCE,
        Self::SRC,
        Self::DST,
        Self::LEN,
        Self::COMPLETION_ADDR,
        Self::RESERVED1,
    ];

    /// The entry as the guest wrote it.
    pub fn decode(bytes: &[u8; Self::SIZE]) -> Self {
        Self {
            opcode: u8::from_le_bytes(Self::OPCODE.get(bytes)),
            flags: CommandFlags::from_raw(u8::from_le_bytes(Self::FLAGS.get(bytes))),
            reserved0: u16::from_le_bytes(Self::RESERVED0.get(bytes)),
            pattern: u32::from_le_bytes(Self::PATTERN.get(bytes)),
            fence: u64::from_le_bytes(Self::FENCE.get(bytes)),
            src: u64::from_le_bytes(Self::SRC.get(bytes)),
            dst: u64::from_le_bytes(Self::DST.get(bytes)),
            len: u64::from_le_bytes(Self::LEN.get(bytes)),
            completion_addr: u64::from_le_bytes(Self::COMPLETION_ADDR.get(bytes)),
            reserved1: [
                u64::from_le_bytes(Self::RESERVED1.get(bytes)),
                u64::from_le_bytes(Self::RESERVED1_HIGH.get(bytes)),
            ],
        }
    }

    /// The bytes a driver puts in the ring for this entry.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        Self::OPCODE.put(&mut out, &self.opcode.to_le_bytes());
        Self::FLAGS.put(&mut out, &self.flags.raw().to_le_bytes());
        Self::RESERVED0.put(&mut out, &self.reserved0.to_le_bytes());
        Self::PATTERN.put(&mut out, &self.pattern.to_le_bytes());
        Self::FENCE.put(&mut out, &self.fence.to_le_bytes());
        Self::SRC.put(&mut out, &self.src.to_le_bytes());
        Self::DST.put(&mut out, &self.dst.to_le_bytes());
        Self::LEN.put(&mut out, &self.len.to_le_bytes());
        Self::COMPLETION_ADDR.put(&mut out, &self.completion_addr.to_le_bytes());
        Self::RESERVED1.put(&mut out, &self.reserved1[0].to_le_bytes());
        Self::RESERVED1_HIGH.put(&mut out, &self.reserved1[1].to_le_bytes());
        out
    }
}

/// The completion record the engine writes before FENCE advances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The command's fence.
    pub fence: u64,
    /// A [`crate::status::StatusCode`] number.
    pub status: u32,
    /// CHECKSUM's CRC32C; 0 for other opcodes.
    pub result: u32,
}

impl Completion {
    /// Field `fence`.
    pub const FENCE: FieldSpan = FieldSpan::new("fence", 0, 8);
    /// Field `status`.
    pub const STATUS: FieldSpan = FieldSpan::new("status", 8, 4);
    /// Field `result`.
    pub const RESULT: FieldSpan = FieldSpan::new("result", 12, 4);
    /// Every field in offset order.
    pub const FIELDS: [FieldSpan; 3] = [Self::FENCE, Self::STATUS, Self::RESULT];

    /// The record's bytes.
    pub fn encode(&self) -> [u8; COMPLETION_SIZE] {
        let mut out = [0u8; COMPLETION_SIZE];
        Self::FENCE.put(&mut out, &self.fence.to_le_bytes());
        Self::STATUS.put(&mut out, &self.status.to_le_bytes());
        Self::RESULT.put(&mut out, &self.result.to_le_bytes());
        out
    }

    /// A record as the engine wrote it.
    pub fn decode(bytes: &[u8; COMPLETION_SIZE]) -> Self {
        Self {
            fence: u64::from_le_bytes(Self::FENCE.get(bytes)),
            status: u32::from_le_bytes(Self::STATUS.get(bytes)),
            result: u32::from_le_bytes(Self::RESULT.get(bytes)),
        }
    }
}

/// Each span fits its struct and has the size of the Rust field it is
/// read into, so `get`/`put` never fall back to zeros.
const _: () = {
    use std::mem::size_of;
    let spans = [
        (Command::OPCODE, size_of::<u8>()),
        (Command::FLAGS, size_of::<u8>()),
        (Command::RESERVED0, size_of::<u16>()),
        (Command::PATTERN, size_of::<u32>()),
        (Command::FENCE, size_of::<u64>()),
        (Command::SRC, size_of::<u64>()),
        (Command::DST, size_of::<u64>()),
        (Command::LEN, size_of::<u64>()),
        (Command::COMPLETION_ADDR, size_of::<u64>()),
        (Command::RESERVED1, size_of::<[u64; 2]>()),
    ];
    let mut i = 0;
    while i < spans.len() {
        assert!(spans[i].0.size == spans[i].1);
        assert!(spans[i].0.offset + spans[i].0.size <= Command::SIZE);
        i += 1;
    }
    assert!(Command::RESERVED1_HIGH.offset == Command::RESERVED1.offset + 8);
    assert!(Completion::FENCE.size == size_of::<u64>());
    assert!(Completion::STATUS.size == size_of::<u32>());
    assert!(Completion::RESULT.size == size_of::<u32>());
    assert!(Completion::RESULT.offset + Completion::RESULT.size == COMPLETION_SIZE);
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::StatusCode;

    #[test]
    fn fields_tile_the_entry_and_the_record() {
        for (fields, size) in [
            (&Command::FIELDS[..], Command::SIZE),
            (&Completion::FIELDS[..], COMPLETION_SIZE),
        ] {
            let mut end = 0;
            for field in fields {
                assert_eq!(field.offset, end, "gap or overlap before {}", field.name);
                end += field.size;
            }
            assert_eq!(end, size);
        }
    }

    #[test]
    fn layout_matches_the_documented_offsets() {
        let cmd = Command {
            opcode: 0x04,
            flags: CommandFlags::IRQ | CommandFlags::COMPLETION,
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
        assert_eq!(bytes[0], 0x04);
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
            status: StatusCode::VramRange.code(),
            result: 0xe306_9283,
        };
        let bytes = c.encode();
        assert_eq!(&bytes[8..12], &StatusCode::VramRange.code().to_le_bytes());
        assert_eq!(Completion::decode(&bytes), c);
    }
}
