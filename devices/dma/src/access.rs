//! What a zero-copy access intends to do with the memory it is handed.

/// What a zero-copy access intends to do with the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only reads: needs read permission.
    Read,
    /// Only writes: needs write permission.
    Write,
    /// Both (e.g. an in-place update): needs both permissions.
    ReadWrite,
}

impl Access {
    /// Whether the access reads memory (needs read permission).
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }
    /// Whether the access writes memory (needs write permission).
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}
