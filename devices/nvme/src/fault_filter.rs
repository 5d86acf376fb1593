//! The text form of NVMe fault filters: `opcode=`, `admin-opcode=`,
//! `queue=`, `nsid=`, `lba=`. It lives here, above both command tables,
//! because opcode names are the tables' own (each row's `fault_name`): a
//! command added to a table can be targeted by name with no second list.
//! What the filters mean, and everything the hot path needs, is in
//! [`crate::fault`], below the tables.

use std::fmt;

use p2plab_fault::{opcode_text, parse_number, parse_opcode, parse_range, Filter, Item, SpecError};

use crate::admin::ADMIN_COMMANDS;
use crate::fault::{CommandFilter, CommandInfo, CommandSet, LbaRange, Opcode};
use crate::io::IO_COMMANDS;
use crate::table::CommandTable;

fn table(set: CommandSet) -> &'static CommandTable {
    match set {
        CommandSet::Admin => &ADMIN_COMMANDS,
        CommandSet::Io => &IO_COMMANDS,
    }
}

/// An `opcode=` or `admin-opcode=` item: a name from the set's table, or
/// any number.
fn opcode(item: &Item<'_>, set: CommandSet) -> Result<Opcode, SpecError> {
    let value = item.parse("NAME|0xNN", |text| parse_opcode(text, table(set)))?;
    Ok(Opcode { set, value })
}

impl Filter for CommandFilter {
    type Subject = CommandInfo;
    const ITEMS: &'static str = "opcode=, admin-opcode=, queue=, nsid=, lba=";

    fn parse_item(&mut self, item: &Item<'_>) -> Option<Result<(), SpecError>> {
        Some(match item.name {
            "opcode" => opcode(item, CommandSet::Io).map(|o| self.opcode = Some(o)),
            "admin-opcode" => opcode(item, CommandSet::Admin).map(|o| self.opcode = Some(o)),
            "queue" | "qid" => item.parse("1", parse_number).and_then(|n| {
                let q = u16::try_from(n).map_err(|_| item.error("queue IDs are 16-bit"))?;
                self.queue = Some(q);
                Ok(())
            }),
            "nsid" => item
                .parse("1", parse_number)
                .and_then(|n| match u32::try_from(n) {
                    Ok(n) if n > 0 => {
                        self.nsid = Some(n);
                        Ok(())
                    }
                    _ => Err(item.error("NSIDs are 1..0xffffffff")),
                }),
            "lba" => item.parse("100-199", parse_range).map(|(first, last)| {
                self.lba = Some(LbaRange { first, last });
            }),
            _ => return None,
        })
    }

    fn fmt_items(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(o) = self.opcode {
            let name = opcode_text(o.value, table(o.set));
            match o.set {
                CommandSet::Io => write!(f, ",opcode={name}")?,
                CommandSet::Admin => write!(f, ",admin-opcode={name}")?,
            }
        }
        if let Some(q) = self.queue {
            write!(f, ",queue={q}")?;
        }
        if let Some(n) = self.nsid {
            write!(f, ",nsid={n}")?;
        }
        if let Some(r) = self.lba {
            write!(f, ",lba={r}")?;
        }
        Ok(())
    }

    fn matches(&self, cmd: &CommandInfo) -> bool {
        self.applies_to(cmd)
    }
}
