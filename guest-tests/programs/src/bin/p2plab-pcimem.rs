//! `p2plab-pcimem`: a guest program that reads and writes a PCI BAR through
//! its sysfs resource file (`/sys/bus/pci/devices/<bdf>/resourceN`), the way
//! a user-space driver would. Used by the end-to-end tests to prove that
//! trapped and mmapped BARs both round-trip.
//!
//! ```text
//! p2plab-pcimem FILE read32 OFFSET
//! p2plab-pcimem FILE write32 OFFSET VALUE
//! p2plab-pcimem FILE fill OFFSET LEN SEED    # writes a seeded pattern
//! p2plab-pcimem FILE check OFFSET LEN SEED   # verifies it, exit 1 on mismatch
//! ```
//! Widths: read8/16/32/64, write8/16/32/64. Numbers take 0x for hex.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

fn parse_number(text: &str, what: &str) -> Result<u64> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.with_context(|| format!("{what}: not a number: {text:?}"))
}

/// A shared mapping of a whole resource file.
struct Mapping {
    base: *mut u8,
    len: usize,
}

impl Mapping {
    fn open(path: &str) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {path}"))?;
        let len = usize::try_from(file.metadata()?.len()).context("resource too large")?;
        if len == 0 {
            bail!("{path} has size 0");
        }
        // SAFETY: mapping a file we opened read-write, length from its
        // metadata; the result is checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("mmap {path}"));
        }
        Ok(Self {
            base: base.cast(),
            len,
        })
    }

    fn check(&self, offset: u64, width: usize) -> Result<usize> {
        let offset = usize::try_from(offset)?;
        if offset % width != 0 {
            bail!("offset {offset:#x} is not aligned to {width}");
        }
        match offset.checked_add(width) {
            Some(end) if end <= self.len => Ok(offset),
            _ => bail!(
                "offset {offset:#x}+{width} is beyond the resource ({:#x} bytes)",
                self.len
            ),
        }
    }

    fn read(&self, offset: u64, width: usize) -> Result<u64> {
        let offset = self.check(offset, width)?;
        // SAFETY: offset..offset+width is inside the mapping and aligned;
        // volatile because this is device memory.
        unsafe {
            let p = self.base.add(offset);
            Ok(match width {
                1 => u64::from(p.read_volatile()),
                2 => u64::from(p.cast::<u16>().read_volatile()),
                4 => u64::from(p.cast::<u32>().read_volatile()),
                _ => p.cast::<u64>().read_volatile(),
            })
        }
    }

    fn write(&self, offset: u64, width: usize, value: u64) -> Result<()> {
        let offset = self.check(offset, width)?;
        // SAFETY: as in `read`; the truncating casts are the access width.
        unsafe {
            let p = self.base.add(offset);
            match width {
                1 => p.write_volatile(value as u8),
                2 => p.cast::<u16>().write_volatile(value as u16),
                4 => p.cast::<u32>().write_volatile(value as u32),
                _ => p.cast::<u64>().write_volatile(value),
            }
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `open`.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

fn width_of(op: &str) -> Option<usize> {
    let digits = op.trim_start_matches("read").trim_start_matches("write");
    match digits {
        "8" => Some(1),
        "16" => Some(2),
        "32" => Some(4),
        "64" => Some(8),
        _ => None,
    }
}

fn run(args: &[String]) -> Result<bool> {
    let [file, op, rest @ ..] = args else {
        bail!("usage: p2plab-pcimem FILE read32|write32|fill|check OFFSET [VALUE|LEN SEED]");
    };
    let map = Mapping::open(file)?;
    match (op.as_str(), rest) {
        (o, [offset]) if o.starts_with("read") => {
            let width = width_of(o).with_context(|| format!("unknown operation {o}"))?;
            println!("{:#x}", map.read(parse_number(offset, "OFFSET")?, width)?);
        }
        (o, [offset, value]) if o.starts_with("write") => {
            let width = width_of(o).with_context(|| format!("unknown operation {o}"))?;
            map.write(
                parse_number(offset, "OFFSET")?,
                width,
                parse_number(value, "VALUE")?,
            )?;
        }
        ("fill" | "check", [offset, len, seed]) => {
            let offset = parse_number(offset, "OFFSET")?;
            let len = parse_number(len, "LEN")?;
            let seed = parse_number(seed, "SEED")?;
            if len % 8 != 0 {
                bail!("LEN must be a multiple of 8");
            }
            for i in 0..len / 8 {
                let at = offset + i * 8;
                let want = p2plab_guest_programs::pattern::word(seed, i);
                if op == "fill" {
                    map.write(at, 8, want)?;
                } else {
                    let got = map.read(at, 8)?;
                    if got != want {
                        eprintln!("mismatch at {at:#x}: got {got:#018x}, want {want:#018x}");
                        return Ok(false);
                    }
                }
            }
        }
        _ => bail!("unknown operation or wrong argument count: {op} {rest:?}"),
    }
    Ok(true)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!("p2plab-pcimem: {err:#}");
            ExitCode::from(2)
        }
    }
}
