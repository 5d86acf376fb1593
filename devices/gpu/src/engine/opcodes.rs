//! The ring opcodes: one table row per opcode, holding everything the
//! engine knows about it. The table drives dispatch, operand checks, the
//! names in logs and BAD_OPCODE; `tests/guest_header/` checks it against
//! the guest driver's `OP_*` and `P2PLAB_GPU_OP_*` defines.
//!
//! Adding an opcode: one row in the `opcode_table!` invocation below plus
//! its handler in `handlers.rs` (see README.md, "How to add a ring
//! opcode"). Fault specs can target it at once (`opcode=NAME`, the row's
//! name in lower case with `-` for `_`): the `opcode=` filter's text form
//! is here, reading the table.

use std::fmt;

use p2plab_fault::{opcode_text, parse_opcode, spec_name, Filter, Item, OpcodeNames, SpecError};

use crate::command::Command;
use crate::fault::GpuFilter;
use crate::status::StatusCode;
use crate::vram::Vram;

use super::{Engine, Outcome};

/// What a command's `src` or `dst` field holds for an opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// Nothing; any value is ignored.
    Unused,
    /// A VRAM offset: `[operand, operand + len)` must lie inside VRAM,
    /// else the command fails with VRAM_RANGE.
    VramOffset,
    /// A bus address the engine reaches by DMA (guest RAM or a peer BAR):
    /// `operand + len` must not wrap (else HOST_DMA), and Bus Master
    /// Enable must be set (else NO_BUS_MASTER).
    BusAddress,
}

/// Whether an opcode takes the 32-bit `pattern` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternUse {
    /// The field is reserved: non-zero fails with BAD_COMMAND.
    Reserved,
    /// The field is the fill pattern, repeated from `dst`.
    FillPattern,
}

/// What a successful command leaves in the record's `result` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandResult {
    /// 0.
    Nothing,
    /// The CRC32C of the range, also published in the CHECKSUM register.
    Checksum,
}

/// Which way data flows over the bus, as the operands say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    /// No guest memory is touched (VRAM only, or nothing).
    None,
    /// The engine reads guest memory (DMA read).
    FromBus,
    /// The engine writes guest memory (DMA write).
    ToBus,
}

/// Runs a command whose fields the engine has already checked against the
/// row: VRAM operands are in range, bus operands don't wrap and bus
/// mastering is on.
pub(crate) type Handler = fn(&mut Engine, &Command) -> Outcome;

/// One row of the opcode table.
#[derive(Debug)]
pub struct OpcodeSpec {
    /// The number in a ring entry's opcode byte.
    pub opcode: u8,
    /// Name as in README.md and (after `OP_`) the driver's header; logs
    /// use it too.
    pub name: &'static str,
    /// What `src` holds.
    pub src: Operand,
    /// What `dst` holds.
    pub dst: Operand,
    /// Whether `pattern` is used.
    pub pattern: PatternUse,
    /// What goes into the record's `result`.
    pub result: CommandResult,
    pub(crate) handler: Handler,
}

/// Declares the opcode table, and a constant per opcode (in [`op`]) for
/// code that builds commands.
macro_rules! opcode_table {
    ($(
        $(#[$doc:meta])*
        $name:ident = $opcode:literal {
            src: $src:ident,
            dst: $dst:ident,
            pattern: $pattern:ident,
            result: $result:ident,
            handler: $handler:path $(,)?
        }
    )+) => {
        /// Opcode numbers by name, for code that builds commands.
        pub mod op {
            $( $(#[$doc])* pub const $name: u8 = $opcode; )+
        }

        /// Every ring opcode the engine runs.
        pub static OPCODES: &[OpcodeSpec] = &[$(
            OpcodeSpec {
                opcode: $opcode,
                name: stringify!($name),
                src: Operand::$src,
                dst: Operand::$dst,
                pattern: PatternUse::$pattern,
                result: CommandResult::$result,
                handler: $handler,
            },
        )+];
    };
}

opcode_table! {
    /// Does nothing; retires at once.
    NOP = 0x00 {
        src: Unused, dst: Unused, pattern: Reserved, result: Nothing,
        handler: Engine::nop,
    }
    /// Copies guest memory (RAM or a peer BAR) into VRAM.
    COPY_TO_VRAM = 0x01 {
        src: BusAddress, dst: VramOffset, pattern: Reserved, result: Nothing,
        handler: Engine::copy_to_vram,
    }
    /// Copies VRAM out to guest memory (RAM or a peer BAR).
    COPY_FROM_VRAM = 0x02 {
        src: VramOffset, dst: BusAddress, pattern: Reserved, result: Nothing,
        handler: Engine::copy_from_vram,
    }
    /// Copies inside VRAM; overlapping ranges behave like memmove.
    COPY_VRAM = 0x03 {
        src: VramOffset, dst: VramOffset, pattern: Reserved, result: Nothing,
        handler: Engine::copy_vram,
    }
    /// Fills VRAM with the little-endian 32-bit pattern repeated from dst;
    /// pattern 0 punches holes (gives host memory back).
    FILL = 0x04 {
        src: Unused, dst: VramOffset, pattern: FillPattern, result: Nothing,
        handler: Engine::fill,
    }
    /// CRC32C (Castagnoli, as iSCSI/ext4) of a VRAM range.
    CHECKSUM = 0x05 {
        src: VramOffset, dst: Unused, pattern: Reserved, result: Checksum,
        handler: Engine::checksum,
    }
}

/// The row for `opcode`, if the engine knows it.
pub fn lookup(opcode: u8) -> Option<&'static OpcodeSpec> {
    OPCODES.iter().find(|spec| spec.opcode == opcode)
}

/// The opcode's name for logs ("invalid" if no row has it).
pub fn name_of(opcode: u8) -> &'static str {
    lookup(opcode).map_or("invalid", |spec| spec.name)
}

/// The opcode table as fault specs name its rows: `opcode=copy-to-vram`.
#[derive(Debug, Clone, Copy)]
pub struct OpcodeTable;

impl OpcodeNames for OpcodeTable {
    fn opcode_names(&self) -> Vec<(u8, String)> {
        OPCODES
            .iter()
            .map(|row| (row.opcode, spec_name(row.name)))
            .collect()
    }
}

/// `opcode=` in GPU fault specs, by the table's names. It prints before
/// `count=` and `prob=`, as GPU specs always have.
impl Filter for GpuFilter {
    type Subject = u8;
    const ITEMS: &'static str = "opcode=";
    const PRINTED_FIRST: bool = true;

    fn parse_item(&mut self, item: &Item<'_>) -> Option<Result<(), SpecError>> {
        (item.name == "opcode").then(|| {
            self.opcode = Some(item.parse("NAME|0xNN", |text| parse_opcode(text, &OpcodeTable))?);
            Ok(())
        })
    }

    fn fmt_items(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.opcode {
            Some(op) => write!(f, ",opcode={}", opcode_text(op, &OpcodeTable)),
            None => Ok(()),
        }
    }

    fn matches(&self, opcode: &u8) -> bool {
        self.applies_to(*opcode)
    }
}

impl OpcodeSpec {
    /// Which way the command moves data over the bus.
    pub fn data_direction(&self) -> DataDirection {
        match (self.src, self.dst) {
            (Operand::BusAddress, _) => DataDirection::FromBus,
            (_, Operand::BusAddress) => DataDirection::ToBus,
            _ => DataDirection::None,
        }
    }

    /// Whether a command with this opcode may carry `pattern`.
    pub fn allows_pattern(&self, pattern: u32) -> bool {
        pattern == 0 || self.pattern == PatternUse::FillPattern
    }

    /// Checks `cmd`'s operands against the row: every VRAM range first
    /// (VRAM_RANGE), then every bus range (HOST_DMA if it wraps), then bus
    /// mastering (NO_BUS_MASTER) if any bus operand is used.
    pub(crate) fn check_operands(
        &self,
        cmd: &Command,
        vram: &Vram,
        bus_master_enabled: bool,
    ) -> Result<(), StatusCode> {
        let operands = [(self.src, cmd.src), (self.dst, cmd.dst)];
        for (kind, at) in operands {
            if kind == Operand::VramOffset && !vram.contains(at, cmd.len) {
                return Err(StatusCode::VramRange);
            }
        }
        let mut uses_bus = false;
        for (kind, at) in operands {
            if kind == Operand::BusAddress {
                if at.checked_add(cmd.len).is_none() {
                    return Err(StatusCode::HostDma);
                }
                uses_bus = true;
            }
        }
        if uses_bus && !bus_master_enabled {
            return Err(StatusCode::NoBusMaster);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_and_names_are_unique() {
        for (i, a) in OPCODES.iter().enumerate() {
            for b in &OPCODES[i + 1..] {
                assert_ne!(a.opcode, b.opcode, "{} and {}", a.name, b.name);
                assert_ne!(a.name, b.name);
            }
            assert_eq!(lookup(a.opcode).map(|s| s.name), Some(a.name));
        }
        assert!(lookup(0xff).is_none());
        assert_eq!(name_of(0x42), "invalid");
        assert_eq!(name_of(op::FILL), "FILL");
    }

    #[test]
    fn directions_follow_the_operands() {
        let direction = |code| lookup(code).map(OpcodeSpec::data_direction);
        assert_eq!(direction(op::COPY_TO_VRAM), Some(DataDirection::FromBus));
        assert_eq!(direction(op::COPY_FROM_VRAM), Some(DataDirection::ToBus));
        assert_eq!(direction(op::COPY_VRAM), Some(DataDirection::None));
        assert_eq!(direction(op::NOP), Some(DataDirection::None));
    }
}
