//! Status codes: what a completion record's status and the ENGINE_ERROR
//! register report. The guest driver's header spells them `HW_` + name.

/// Declares the status codes: one row per code.
macro_rules! status_codes {
    ($( $(#[$doc:meta])* $code:ident = $value:literal, $name:literal, $meaning:literal; )+) => {
        /// A status code the device reports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum StatusCode {
            $( $(#[$doc])* $code, )+
        }

        impl StatusCode {
            /// Every code.
            pub const ALL: &'static [StatusCode] = &[$(StatusCode::$code),+];

            /// The number the guest sees.
            pub const fn code(self) -> u32 {
                match self { $(StatusCode::$code => $value,)+ }
            }

            /// Name as in the guest driver's header after `HW_`.
            pub const fn name(self) -> &'static str {
                match self { $(StatusCode::$code => $name,)+ }
            }

            /// A short meaning for logs.
            pub const fn meaning(self) -> &'static str {
                match self { $(StatusCode::$code => $meaning,)+ }
            }
        }
    };
}

status_codes! {
    /// The command did what it says.
    Ok = 0x00, "STATUS_OK", "ok";

    // Command errors: the command retires (the fence advances) with this
    // status and INT_ERROR; nothing outside the valid range is touched.

    /// No row of the opcode table has this opcode.
    BadOpcode = 0x01, "ERR_BAD_OPCODE", "bad opcode";
    /// A reserved field or unknown flag is set, or a pattern on an opcode
    /// that takes none.
    BadCommand = 0x02, "ERR_BAD_COMMAND", "bad command (reserved field or flag set)";
    /// A VRAM operand's range is outside VRAM or wraps.
    VramRange = 0x03, "ERR_VRAM_RANGE", "VRAM range out of bounds";
    /// A bus-address operand wraps, or guest memory did not answer.
    HostDma = 0x04, "ERR_HOST_DMA", "guest memory access failed";
    /// The command needs guest memory and Bus Master Enable is clear.
    NoBusMaster = 0x05, "ERR_NO_BUS_MASTER", "bus mastering disabled";
    /// The VRAM backing store failed.
    VramIo = 0x06, "ERR_VRAM_IO", "VRAM backing I/O failed";
    /// The completion record could not be written (ENGINE_ERROR only).
    CompletionWrite = 0x07, "ERR_COMPLETION_WRITE", "completion record write failed";

    // Ring errors: the engine halts (STATUS.HALTED) without retiring
    // anything.

    /// RING_BASE is not command-size aligned.
    RingMisaligned = 0x10, "ERR_RING_MISALIGNED", "ring base misaligned";
    /// RING_SIZE is not a power of two in range.
    RingBadSize = 0x11, "ERR_RING_BAD_SIZE", "ring size not a power of two in range";
    /// The ring runs past VRAM or the address space.
    RingRange = 0x12, "ERR_RING_RANGE", "ring outside VRAM or address space";
    /// A ring entry could not be read.
    RingFetch = 0x13, "ERR_RING_FETCH", "ring entry fetch failed";
    /// A tail at or past RING_SIZE.
    BadTail = 0x14, "ERR_BAD_TAIL", "tail beyond ring size";
}

impl StatusCode {
    /// The code with this number, if the device has one.
    pub fn from_code(code: u32) -> Option<StatusCode> {
        StatusCode::ALL.iter().copied().find(|s| s.code() == code)
    }

    /// Whether a command can retire with it (an error that is not a ring
    /// error and not the record-write failure, which only ENGINE_ERROR
    /// reports).
    pub fn is_command_error(self) -> bool {
        (0x01..0x07).contains(&self.code())
    }
}

impl std::fmt::Display for StatusCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#04x} ({})", self.code(), self.meaning())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique() {
        let mut codes: Vec<u32> = StatusCode::ALL.iter().map(|c| c.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), StatusCode::ALL.len());
        assert_eq!(StatusCode::Ok.code(), 0, "a zeroed record reads as OK");
        assert_eq!(
            StatusCode::BadTail.to_string(),
            "0x14 (tail beyond ring size)"
        );
    }
}
