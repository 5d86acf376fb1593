//! Opcode filters (`opcode=read`) by the names in a device's own command
//! table: a command added to the table can be targeted by name at once,
//! and this crate keeps no list of names to fall out of step.

/// A device's command table as fault specs name its commands.
pub trait OpcodeNames {
    /// `(opcode, name in specs)` of every command the table has. Names are
    /// lower case with `-` between words (see [`spec_name`]), one per
    /// opcode.
    fn opcode_names(&self) -> Vec<(u8, String)>;
}

/// A table's name as specs spell it: lower case, `-` for `_` and spaces
/// (`COPY_TO_VRAM` is `copy-to-vram`).
pub fn spec_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '_' | ' ' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// Whether `name` can be an opcode's name in specs: not empty, starts with
/// a letter (so it is never read as a number), and only lower-case
/// letters, digits and `-` (no separator or `=`).
pub fn is_spec_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The opcode `text` names: a row's name in specs, or a number
/// 0x00..=0xff (any opcode, with a row or not).
pub fn parse_opcode(text: &str, table: &dyn OpcodeNames) -> Result<u8, String> {
    let names = table.opcode_names();
    if let Some((opcode, _)) = names.iter().find(|(_, name)| name == text) {
        return Ok(*opcode);
    }
    crate::grammar::parse_number(text)
        .ok()
        .and_then(|v| u8::try_from(v).ok())
        .ok_or_else(|| {
            let names: Vec<&str> = names.iter().map(|(_, n)| n.as_str()).collect();
            format!(
                "{text:?} is not an opcode (0x00..0xff or {})",
                names.join(", ")
            )
        })
}

/// How a spec spells `opcode`: its row's name, else `0xNN`.
pub fn opcode_text(opcode: u8, table: &dyn OpcodeNames) -> String {
    table
        .opcode_names()
        .into_iter()
        .find(|(value, _)| *value == opcode)
        .map_or_else(|| format!("{opcode:#04x}"), |(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device table with two rows, named the two ways device tables
    /// name theirs (an identifier, words from a specification); made-up
    /// commands, since the device crates check that no real name is
    /// spelled out here.
    struct Table;

    impl OpcodeNames for Table {
        fn opcode_names(&self) -> Vec<(u8, String)> {
            vec![
                (0x01, spec_name("MAKE_TEA")),
                (0x09, spec_name("Brew Coffee")),
            ]
        }
    }

    const TABLE: Table = Table;

    /// Catches: names not taken from the table, numbers refused, or a
    /// printed opcode that does not parse back.
    #[test]
    fn names_come_from_the_table() {
        assert_eq!(parse_opcode("make-tea", &TABLE), Ok(0x01));
        assert_eq!(parse_opcode("brew-coffee", &TABLE), Ok(0x09));
        assert_eq!(parse_opcode("0x7f", &TABLE), Ok(0x7f));
        let e = parse_opcode("teleport", &TABLE).unwrap_err();
        assert!(e.contains("make-tea, brew-coffee"), "{e}");
        assert!(parse_opcode("0x100", &TABLE).is_err());
        for opcode in [0x01, 0x09, 0x7f] {
            let text = opcode_text(opcode, &TABLE);
            assert_eq!(parse_opcode(&text, &TABLE), Ok(opcode), "{text}");
        }
        assert_eq!(opcode_text(0x7f, &TABLE), "0x7f");
        assert!(is_spec_name("two-words") && is_spec_name("a1"));
        assert!(!is_spec_name("0x10") && !is_spec_name("Read") && !is_spec_name("a,b"));
        assert!(!is_spec_name(""));
    }
}
