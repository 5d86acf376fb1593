//! The anchors as the bench runs them: QEMU's built-in nvme with the same
//! host caching as p2plab-nvme (`--anchor TOPOLOGY`), and SPDK's nvmf_tgt
//! (`--anchor spdk=DIR`) attached in the same switch position.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use p2plab_lab::topology::parse_size;

/// One `--anchor`: QEMU's nvme by topology (`qemu=TOPOLOGY` or just
/// `TOPOLOGY`), or an SPDK build folder (`spdk=DIR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnchorArg {
    Qemu(String),
    Spdk(PathBuf),
}

/// Parses one `--anchor` value.
pub fn parse_anchor(text: &str) -> Result<AnchorArg, String> {
    let (kind, value) = match text.split_once('=') {
        Some((kind, value)) => (kind, value),
        None => ("qemu", text),
    };
    if value.is_empty() {
        return Err(format!("{text:?}: spdk=DIR or a QEMU nvme topology"));
    }
    match kind {
        "qemu" => Ok(AnchorArg::Qemu(value.to_owned())),
        "spdk" => Ok(AnchorArg::Spdk(PathBuf::from(value))),
        _ => Err(format!(
            "{text:?}: unknown anchor {kind:?}; spdk=DIR or qemu=TOPOLOGY"
        )),
    }
}

/// The anchors of a run from its `--anchor`s: QEMU's nvme topology (the
/// default one unless named) and the SPDK folder if any. At most one of
/// each.
pub fn anchors(args: &[AnchorArg], default_qemu: &str) -> Result<(String, Option<PathBuf>)> {
    let qemu: Vec<&String> = args
        .iter()
        .filter_map(|a| match a {
            AnchorArg::Qemu(t) => Some(t),
            AnchorArg::Spdk(_) => None,
        })
        .collect();
    let spdk: Vec<&PathBuf> = args
        .iter()
        .filter_map(|a| match a {
            AnchorArg::Spdk(d) => Some(d),
            AnchorArg::Qemu(_) => None,
        })
        .collect();
    if qemu.len() > 1 || spdk.len() > 1 {
        bail!("--anchor: at most one QEMU topology and one spdk=DIR");
    }
    Ok((
        qemu.first()
            .map_or_else(|| default_qemu.to_owned(), |t| (*t).clone()),
        spdk.first().map(|d| (*d).clone()),
    ))
}

/// Writes the SPDK anchor's topology: QEMU's anchor topology without its
/// drive and nvme device (the bench attaches nvmf_tgt's controller with
/// `vfio-user-pci` on the same port). Returns the file, that port and the
/// size of the anchor's disk (that of p2plab-nvme's namespace).
pub fn write_spdk_topology(source: &Path, folder: &Path) -> Result<(PathBuf, String, u64)> {
    let text =
        std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    let (out, bus, size) = without_qemu_nvme(&text)
        .with_context(|| format!("anchor topology {}", source.display()))?;
    let path = folder.join("anchor-spdk.args");
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    Ok((path, bus, size))
}

/// `text` (a topology) without its `-drive`, `#@disk` and `-device nvme`
/// lines, the `bus=` of that nvme device and the size of its disk.
fn without_qemu_nvme(text: &str) -> Result<(String, String, u64)> {
    // `-boot strict=on`: SeaBIOS then skips the controller at POST (it
    // initialises only bootable NVMe controllers; the guest boots from
    // `-kernel`, whose option ROM is the boot device). Otherwise SeaBIOS
    // creates an I/O queue pair near the top of guest RAM, QEMU then
    // re-sends the RAM region that holds it as a new DMA mapping when the
    // firmware makes its shadow ROM read-only, and nvmf_tgt, whose
    // unmap callback passes over regions not 2 MiB aligned, keeps reading
    // that queue through the old mapping: the next command SeaBIOS
    // submits is read from whatever was mapped there since, and the
    // completion nvmf_tgt posts for that garbage
    // crashes nvmf_tgt (SIGSEGV in `post_completion`) when that is the
    // read-only BIOS mapping (docs/user-guide/benchmarks.md).
    let mut out = String::from(
        "# Written by the bench: QEMU's anchor topology without its nvme; the\n\
         # bench attaches SPDK nvmf_tgt's vfio-user controller in its place.\n\
         # SeaBIOS leaves that controller alone at POST (see the bench's anchor.rs).\n\
         -boot strict=on\n",
    );
    let mut buses = Vec::new();
    let mut sizes = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(disk) = trimmed.strip_prefix("#@disk ") {
            let size = disk
                .split_whitespace()
                .nth(1)
                .and_then(parse_size)
                .with_context(|| format!("{trimmed:?}: no size"))?;
            sizes.push(size);
            continue;
        }
        if trimmed.starts_with("-drive ") {
            continue;
        }
        if let Some(value) = trimmed.strip_prefix("-device nvme,") {
            let bus = value
                .split(',')
                .find_map(|o| o.strip_prefix("bus="))
                .context("its nvme device has no bus=")?;
            buses.push(bus.to_owned());
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    let Ok([size]) = <[u64; 1]>::try_from(sizes) else {
        bail!("the bench needs exactly one #@disk line (the nvme's)");
    };
    match <[String; 1]>::try_from(buses) {
        Ok([bus]) => Ok((out, bus, size)),
        Err(b) => bail!("has {} nvme devices; the bench needs exactly one", b.len()),
    }
}

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

    /// Catches: `--anchor spdk=DIR` taken for a topology named
    /// `spdk=DIR`, an unknown kind accepted, two SPDK anchors accepted,
    /// and the QEMU anchor dropped when only SPDK is named.
    #[test]
    fn anchor_arguments() {
        assert_eq!(
            parse_anchor("spdk=/s/spdk"),
            Ok(AnchorArg::Spdk("/s/spdk".into()))
        );
        assert_eq!(
            parse_anchor("anchor-qemu-nvme"),
            Ok(AnchorArg::Qemu("anchor-qemu-nvme".into()))
        );
        assert_eq!(parse_anchor("qemu=t"), Ok(AnchorArg::Qemu("t".into())));
        assert!(parse_anchor("spdk=").is_err());
        assert!(parse_anchor("vhost=/x").is_err());
        let spdk = AnchorArg::Spdk("/s".into());
        assert_eq!(
            anchors(std::slice::from_ref(&spdk), "def").unwrap(),
            ("def".to_owned(), Some("/s".into()))
        );
        assert_eq!(
            anchors(&[AnchorArg::Qemu("t".into())], "def").unwrap(),
            ("t".to_owned(), None)
        );
        assert!(anchors(&[spdk.clone(), spdk], "def").is_err());
    }

    /// Catches: QEMU's nvme (or its drive or disk) left in the SPDK
    /// topology, so the guest would see two controllers, the port of
    /// the controller lost, or the topology without `-boot strict=on`
    /// (SeaBIOS would set up queues on nvmf_tgt's controller at POST).
    #[test]
    fn spdk_topology_drops_qemus_nvme() {
        let text = "#@disk @STATE@/a.img 1G\n-m 2G\n-drive file=x,if=none,id=a0\n\
                    -device nvme,id=nvme0,bus=dn0,serial=a,drive=a0\n-device x3130-upstream,id=up0\n";
        let (out, bus, size) = without_qemu_nvme(text).unwrap();
        assert_eq!((bus.as_str(), size), ("dn0", 1 << 30));
        assert!(!out.contains("-drive") && !out.contains("nvme,") && !out.contains("#@disk"));
        assert!(out.contains("-m 2G\n-device x3130-upstream,id=up0\n"));
        assert_eq!(
            out.lines().filter(|l| *l == "-boot strict=on").count(),
            1,
            "SeaBIOS must skip nvmf_tgt's controller at POST"
        );
        assert!(without_qemu_nvme("#@disk a 1G\n-m 2G\n").is_err());
        assert!(
            without_qemu_nvme("-device nvme,id=n,bus=dn0\n").is_err(),
            "no disk"
        );
        assert!(without_qemu_nvme("#@disk a 1G\n-device nvme,id=n\n").is_err());
    }

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
