//! Just enough of ELF64 (little-endian) to find a section and the address of
//! an exported (dynamic) symbol in an executable: what `qemu_fix` needs to
//! locate one call instruction in QEMU's stripped binary.

use anyhow::{bail, Context, Result};

const SHT_DYNSYM: u32 = 11;
const SECTION_HEADER_SIZE: usize = 64;
const SYMBOL_SIZE: usize = 24;

/// One section header, as far as we need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub name_offset: u32,
    pub kind: u32,
    /// Virtual address when loaded.
    pub addr: u64,
    /// Where its bytes start in the file.
    pub offset: u64,
    pub size: u64,
    /// For a symbol table: the index of its string table.
    pub link: u32,
}

/// A parsed view of an ELF64 little-endian file held in memory.
#[derive(Debug)]
pub struct Elf<'a> {
    bytes: &'a [u8],
    sections: Vec<Section>,
    names: Section,
}

fn u16_at(bytes: &[u8], at: usize) -> Result<u16> {
    let raw = bytes
        .get(at..at + 2)
        .with_context(|| format!("ELF: offset {at:#x} is past the end"))?;
    Ok(u16::from_le_bytes([raw[0], raw[1]]))
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32> {
    let raw = bytes
        .get(at..at + 4)
        .with_context(|| format!("ELF: offset {at:#x} is past the end"))?;
    Ok(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]))
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64> {
    let raw = bytes
        .get(at..at + 8)
        .with_context(|| format!("ELF: offset {at:#x} is past the end"))?;
    let mut word = [0u8; 8];
    word.copy_from_slice(raw);
    Ok(u64::from_le_bytes(word))
}

fn to_usize(value: u64) -> Result<usize> {
    usize::try_from(value).context("ELF: offset does not fit in memory")
}

impl<'a> Elf<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        if bytes.get(..4) != Some(b"\x7fELF".as_slice()) {
            bail!("not an ELF file");
        }
        if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
            bail!("not a 64-bit little-endian ELF file");
        }
        let table = to_usize(u64_at(bytes, 0x28)?)?;
        let entry_size = usize::from(u16_at(bytes, 0x3a)?);
        let count = usize::from(u16_at(bytes, 0x3c)?);
        let names_index = usize::from(u16_at(bytes, 0x3e)?);
        if entry_size < SECTION_HEADER_SIZE {
            bail!("ELF: section headers of {entry_size} bytes");
        }
        let mut sections = Vec::with_capacity(count);
        for index in 0..count {
            let at = table + index * entry_size;
            sections.push(Section {
                name_offset: u32_at(bytes, at)?,
                kind: u32_at(bytes, at + 4)?,
                addr: u64_at(bytes, at + 16)?,
                offset: u64_at(bytes, at + 24)?,
                size: u64_at(bytes, at + 32)?,
                link: u32_at(bytes, at + 40)?,
            });
        }
        let names = *sections
            .get(names_index)
            .context("ELF: no section-name table")?;
        Ok(Self {
            bytes,
            sections,
            names,
        })
    }

    /// The bytes of a section.
    pub fn data(&self, section: &Section) -> Result<&'a [u8]> {
        let start = to_usize(section.offset)?;
        let end = start
            .checked_add(to_usize(section.size)?)
            .context("ELF: section size overflows")?;
        self.bytes
            .get(start..end)
            .context("ELF: section extends past the end of the file")
    }

    /// A NUL-terminated string at `offset` in string table `table`.
    fn string(&self, table: &Section, offset: u32) -> Result<&'a [u8]> {
        let data = self.data(table)?;
        let start = usize::try_from(offset).context("ELF: string offset")?;
        let rest = data
            .get(start..)
            .context("ELF: string offset past its table")?;
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .context("ELF: unterminated string")?;
        Ok(&rest[..len])
    }

    pub fn section(&self, name: &str) -> Result<Section> {
        for section in &self.sections {
            if self.string(&self.names, section.name_offset)? == name.as_bytes() {
                return Ok(*section);
            }
        }
        bail!("ELF: no {name} section")
    }

    /// The address of each of `names` in the dynamic symbol table (None for
    /// a name that is not there), in the order asked.
    pub fn dynamic_symbols(&self, names: &[&str]) -> Result<Vec<Option<u64>>> {
        let mut found = vec![None; names.len()];
        let Some(table) = self.sections.iter().find(|s| s.kind == SHT_DYNSYM) else {
            bail!("ELF: no dynamic symbol table");
        };
        let strings = *self
            .sections
            .get(usize::try_from(table.link).context("ELF: symbol string table index")?)
            .context("ELF: dynamic symbol table names a missing string table")?;
        let data = self.data(table)?;
        for symbol in data.chunks_exact(SYMBOL_SIZE) {
            let name = self.string(&strings, u32_at(symbol, 0)?)?;
            let value = u64_at(symbol, 8)?;
            let defined = u16_at(symbol, 6)? != 0;
            if let Some(slot) = names.iter().position(|n| n.as_bytes() == name) {
                if defined {
                    found[slot] = Some(value);
                }
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a small ELF64 file: `.text` with `code` at `text_addr`, and a
    /// dynamic symbol table with `symbols` (name, address).
    pub(crate) fn build(text_addr: u64, code: &[u8], symbols: &[(&str, u64)]) -> Vec<u8> {
        let mut shstrtab = b"\0.text\0.dynsym\0.dynstr\0.shstrtab\0".to_vec();
        shstrtab.resize(40, 0);
        let mut dynstr = vec![0u8];
        let mut dynsym = vec![0u8; SYMBOL_SIZE]; // the null symbol
        for (name, addr) in symbols {
            let name_offset = dynstr.len() as u32;
            dynstr.extend_from_slice(name.as_bytes());
            dynstr.push(0);
            let mut symbol = [0u8; SYMBOL_SIZE];
            symbol[0..4].copy_from_slice(&name_offset.to_le_bytes());
            symbol[4] = 0x12; // global function
            symbol[6..8].copy_from_slice(&1u16.to_le_bytes()); // defined in .text
            symbol[8..16].copy_from_slice(&addr.to_le_bytes());
            dynsym.extend_from_slice(&symbol);
        }
        let mut file = vec![0u8; 64];
        let place = |file: &mut Vec<u8>, data: &[u8]| {
            let at = file.len() as u64;
            file.extend_from_slice(data);
            while !file.len().is_multiple_of(8) {
                file.push(0);
            }
            (at, data.len() as u64)
        };
        let text = place(&mut file, code);
        let sym = place(&mut file, &dynsym);
        let strs = place(&mut file, &dynstr);
        let names = place(&mut file, &shstrtab);
        let table = file.len() as u64;
        // (name offset, type, addr, (offset, size), link)
        let headers = [
            (0u32, 0u32, 0u64, (0u64, 0u64), 0u32),
            (1, 1, text_addr, text, 0),
            (7, SHT_DYNSYM, 0, sym, 3),
            (15, 3, 0, strs, 0),
            (23, 3, 0, names, 0),
        ];
        for (name, kind, addr, (offset, size), link) in headers {
            let mut header = [0u8; SECTION_HEADER_SIZE];
            header[0..4].copy_from_slice(&name.to_le_bytes());
            header[4..8].copy_from_slice(&kind.to_le_bytes());
            header[16..24].copy_from_slice(&addr.to_le_bytes());
            header[24..32].copy_from_slice(&offset.to_le_bytes());
            header[32..40].copy_from_slice(&size.to_le_bytes());
            header[40..44].copy_from_slice(&link.to_le_bytes());
            file.extend_from_slice(&header);
        }
        file[0..4].copy_from_slice(b"\x7fELF");
        file[4] = 2;
        file[5] = 1;
        file[0x28..0x30].copy_from_slice(&table.to_le_bytes());
        file[0x3a..0x3c].copy_from_slice(&(SECTION_HEADER_SIZE as u16).to_le_bytes());
        file[0x3c..0x3e].copy_from_slice(&(headers.len() as u16).to_le_bytes());
        file[0x3e..0x40].copy_from_slice(&4u16.to_le_bytes());
        file
    }

    #[test]
    fn finds_sections_and_dynamic_symbols() {
        let file = build(0x1000, &[0xc3; 16], &[("alpha", 0x1004), ("beta", 0x1008)]);
        let elf = Elf::parse(&file).unwrap();
        let text = elf.section(".text").unwrap();
        assert_eq!(text.addr, 0x1000);
        assert_eq!(elf.data(&text).unwrap(), &[0xc3; 16]);
        assert_eq!(
            elf.dynamic_symbols(&["beta", "gamma", "alpha"]).unwrap(),
            [Some(0x1008), None, Some(0x1004)]
        );
        assert!(elf.section(".data").is_err());
    }

    #[test]
    fn rejects_what_is_not_elf64_le() {
        assert!(Elf::parse(b"#!/bin/sh\n").is_err());
        let mut file = build(0x1000, &[0xc3], &[]);
        file[4] = 1; // 32-bit
        assert!(Elf::parse(&file).is_err());
        let mut truncated = build(0x1000, &[0xc3], &[]);
        truncated.truncate(80);
        assert!(Elf::parse(&truncated).is_err());
    }
}
