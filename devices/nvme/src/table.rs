//! Command tables: one static table per command set ([admin] and [NVM
//! I/O]), one row per supported command.
//!
//! A row is everything the controller knows about a command: its opcode,
//! its name in the specification, its handler, its Commands Supported and
//! Effects dword and which way it moves data. The table drives dispatch
//! (an opcode without a row is an Invalid Command Opcode), the Commands
//! Supported and Effects log page (05h), the command names in logs and
//! the names fault specs target (`opcode=read`, `admin-opcode=identify`).
//! Adding a command is adding a row and writing its handler.
//!
//! [admin]: crate::admin::ADMIN_COMMANDS
//! [NVM I/O]: crate::io::IO_COMMANDS

use crate::command::Command;
use crate::context::{CommandContext, CommandResult};
use crate::datapointer::{DataPointers, DataTransfer};
use crate::spec::{effects, Status};

/// A handler as a table holds it: every command of every set takes the
/// same arguments. A row's handler parses the command into its typed view
/// ([`fields`](crate::fields)) and calls the function that does the work.
pub(crate) type Handler = fn(&mut CommandContext<'_>, &Command) -> CommandResult;

/// One supported command.
pub(crate) struct CommandRow {
    pub opcode: u8,
    /// The command's name in the specification, for logs and traces.
    pub name: &'static str,
    /// Its name in fault specs (`opcode=write-zeroes`): short, lower case,
    /// words joined by `-`, unique in its table.
    pub fault_name: &'static str,
    pub run: Handler,
    /// Its Commands Supported and Effects dword ([`effects`] bits).
    pub effects: u32,
    /// Which way it moves data; handlers map their data pointer this way.
    pub data: DataTransfer,
}

/// The rows of one command set, indexed by opcode.
pub(crate) struct CommandTable {
    /// What an opcode without a row is called in logs.
    unsupported: &'static str,
    /// The data pointer forms the set accepts.
    pub pointers: DataPointers,
    rows: &'static [CommandRow],
    /// `index[opcode]` is the row's position + 1; 0 for no row.
    index: [u8; 256],
}

impl CommandTable {
    /// The table of `rows`. Two rows for one opcode or one fault name, a
    /// fault name specs cannot spell, or a row without CSUPP, do not
    /// compile (the tables are statics).
    pub const fn new(
        unsupported: &'static str,
        pointers: DataPointers,
        rows: &'static [CommandRow],
    ) -> Self {
        assert!(rows.len() < 256, "more rows than opcodes");
        let mut index = [0u8; 256];
        let mut i = 0;
        while i < rows.len() {
            let row = &rows[i];
            assert!(index[row.opcode as usize] == 0, "two rows for one opcode");
            assert!(row.effects & effects::CSUPP != 0, "a row without CSUPP");
            assert!(
                is_fault_name(row.fault_name),
                "a fault name is lower-case letters, digits and '-', starting with a letter"
            );
            let mut j = 0;
            while j < i {
                assert!(
                    !same(rows[j].fault_name, row.fault_name),
                    "two rows with one fault name"
                );
                j += 1;
            }
            index[row.opcode as usize] = (i + 1) as u8;
            i += 1;
        }
        Self {
            unsupported,
            pointers,
            rows,
            index,
        }
    }

    #[cfg(test)]
    pub fn rows(&self) -> &'static [CommandRow] {
        self.rows
    }

    /// The row for `opcode`, or Invalid Command Opcode.
    pub fn find(&self, opcode: u8) -> Result<&'static CommandRow, Status> {
        match self.index[usize::from(opcode)] {
            0 => Err(Status::INVALID_OPCODE),
            at => self
                .rows
                .get(usize::from(at) - 1)
                .ok_or(Status::INVALID_OPCODE),
        }
    }

    /// `(opcode, fault name)` of every row, in table order.
    pub fn fault_names(&self) -> Vec<(u8, &'static str)> {
        self.rows
            .iter()
            .map(|row| (row.opcode, row.fault_name))
            .collect()
    }

    /// `(opcode, name)` of every row, in table order.
    pub fn list(&self) -> Vec<(u8, &'static str)> {
        self.rows.iter().map(|row| (row.opcode, row.name)).collect()
    }

    /// The name of `opcode` for logs.
    pub fn name(&self, opcode: u8) -> &'static str {
        self.find(opcode).map_or(self.unsupported, |row| row.name)
    }

    /// Runs `row`'s handler on the command in `cx`.
    pub fn run(&self, row: &CommandRow, cx: &mut CommandContext<'_>) -> CommandResult {
        cx.data = row.data;
        cx.pointers = self.pointers;
        let cmd = cx.cmd;
        (row.run)(cx, cmd)
    }

    /// The set's half of the Commands Supported and Effects log: one dword
    /// per opcode, 0 for opcodes without a row.
    pub fn effects(&self) -> [u32; 256] {
        let mut dwords = [0u32; 256];
        for row in self.rows {
            dwords[usize::from(row.opcode)] = row.effects;
        }
        dwords
    }
}

/// Fault specs name a table's commands by their rows' fault names.
impl p2plab_fault::OpcodeNames for CommandTable {
    fn opcode_names(&self) -> Vec<(u8, String)> {
        self.rows
            .iter()
            .map(|row| (row.opcode, row.fault_name.to_string()))
            .collect()
    }
}

/// `p2plab_fault::is_spec_name`, as a `const fn` for the table checks.
const fn is_fault_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.is_empty() || !bytes[0].is_ascii_lowercase() {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return false;
        }
        i += 1;
    }
    true
}

/// String equality in a `const fn`.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
