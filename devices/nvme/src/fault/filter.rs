//! Which commands an NVMe spec applies to, and the fields of a command it
//! is matched on. The text form of these filters (`opcode=read` ...) is in
//! `crate::fault_filter`, next to the command tables it takes names from.

/// Which command set an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandSet {
    Admin,
    Io,
}

/// An opcode filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opcode {
    pub set: CommandSet,
    pub value: u8,
}

/// An inclusive range of logical blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaRange {
    pub first: u64,
    pub last: u64,
}

impl LbaRange {
    /// Whether `blocks` blocks from `slba` touch this range.
    pub fn overlaps(&self, slba: u64, blocks: u64) -> bool {
        blocks > 0 && slba <= self.last && slba.saturating_add(blocks - 1) >= self.first
    }
}

impl std::fmt::Display for LbaRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// Which commands a spec applies to: every field that is set must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandFilter {
    pub opcode: Option<Opcode>,
    /// Submission queue ID (0: the admin queue).
    pub queue: Option<u16>,
    pub nsid: Option<u32>,
    pub lba: Option<LbaRange>,
}

impl CommandFilter {
    /// Whether the spec is about admin commands (queue 0 or an admin
    /// opcode); otherwise it only ever matches I/O commands, so that a
    /// bare `status=...` cannot break controller initialisation.
    pub fn admin(&self) -> bool {
        self.queue == Some(0) || self.opcode.is_some_and(|o| o.set == CommandSet::Admin)
    }

    /// Whether a command with these fields is one the spec applies to.
    pub fn applies_to(&self, cmd: &CommandInfo) -> bool {
        if self.admin() != (cmd.queue == 0) {
            return false;
        }
        if self.opcode.is_some_and(|o| o.value != cmd.opcode) {
            return false;
        }
        if self.queue.is_some_and(|q| q != cmd.queue) {
            return false;
        }
        if self.nsid.is_some_and(|n| n != cmd.nsid) {
            return false;
        }
        if let Some(range) = self.lba {
            match cmd.lba {
                Some((slba, blocks)) if range.overlaps(slba, blocks) => {}
                _ => return false,
            }
        }
        true
    }
}

/// The fields of a command that specs match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandInfo {
    /// Submission queue ID (0: admin).
    pub queue: u16,
    pub opcode: u8,
    pub nsid: u32,
    /// Starting LBA and block count, for commands that address blocks.
    pub lba: Option<(u64, u64)>,
}
