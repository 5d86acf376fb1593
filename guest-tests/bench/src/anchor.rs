//! The anchor's topology as the bench runs it: QEMU's built-in nvme with
//! the same host caching as p2plab-nvme.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Writes a copy of the anchor topology whose one `-drive` uses `cache`,
/// so the anchor caches like p2plab-nvme. Returns the copy and the drive
/// line as run.
pub fn write_topology(source: &Path, cache: &str, folder: &Path) -> Result<(PathBuf, String)> {
    let text =
        std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    let (out, drive) = set_drive_cache(&text, cache)
        .with_context(|| format!("anchor topology {}", source.display()))?;
    let name = source.file_name().context("anchor topology has no name")?;
    let path = folder.join(name);
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    Ok((path, drive))
}

/// `text` (a topology) with its one `-drive` line's `cache=` set to
/// `cache`, and that line.
fn set_drive_cache(text: &str, cache: &str) -> Result<(String, String)> {
    let mut out = String::with_capacity(text.len() + 16);
    let mut drives = Vec::new();
    for line in text.lines() {
        if let Some(value) = line.trim().strip_prefix("-drive ") {
            let options: Vec<String> = value
                .trim()
                .split(',')
                .filter(|o| !o.starts_with("cache="))
                .map(str::to_owned)
                .chain(std::iter::once(format!("cache={cache}")))
                .collect();
            let drive = format!("-drive {}", options.join(","));
            out.push_str(&drive);
            drives.push(drive);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    match <[String; 1]>::try_from(drives) {
        Ok([drive]) => Ok((out, drive)),
        Err(drives) => bail!(
            "has {} -drive lines; the bench needs exactly one",
            drives.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a drive left with its old cache mode, two cache options
    /// on one drive, and a topology with no or several drives accepted.
    #[test]
    fn anchor_drive_gets_the_cache_mode() {
        let text = "# c\n-drive file=/s/a.img,if=none,id=a0,format=raw,cache=none,aio=threads\n-device nvme,drive=a0\n";
        let (out, drive) = set_drive_cache(text, "writeback").unwrap();
        assert_eq!(
            drive,
            "-drive file=/s/a.img,if=none,id=a0,format=raw,aio=threads,cache=writeback"
        );
        assert_eq!(out.matches("cache=").count(), 1);
        assert!(out.contains("-device nvme,drive=a0\n"));
        let (_, drive) = set_drive_cache("-drive file=x,if=none\n", "none").unwrap();
        assert_eq!(drive, "-drive file=x,if=none,cache=none");
        assert!(set_drive_cache("-device nvme\n", "none").is_err());
        assert!(set_drive_cache("-drive file=x\n-drive file=y\n", "none").is_err());
    }
}
