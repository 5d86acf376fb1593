//! The NVMe sides' backing files, made alike before every round.
//!
//! With `--caching direct` a read of a block the file system never
//! allocated (a hole of a sparse file) costs no disk I/O: the kernel
//! fills the buffer with zeros. The three backing files start out very
//! differently allocated (p2plab-nvme's namespace is shared with the
//! e2e suites and the P2P jobs, which write its first 512 MiB; SPDK's is
//! created empty), so the same random reads would cost one server disk
//! I/O and another a memset. Before each round the bench therefore
//! rewrites every file that has holes with its own bytes (a hole reads
//! as zeros, so the content stays what it was) and syncs it: every read
//! of every side then reaches allocated blocks. This is the usual
//! preconditioning of a drive before a read benchmark.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use p2plab_lab::topology::{Placeholders, Topology};
use serde_json::{json, Value};

/// Bytes rewritten per call.
const CHUNK: usize = 1 << 20;

/// One side's backing file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// Which side (`p2plab-nvme`, `qemu nvme`, `spdk nvmf_tgt`).
    pub side: &'static str,
    pub path: PathBuf,
    pub size: u64,
}

/// What preconditioning found and left, for results.json.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub side: &'static str,
    pub path: PathBuf,
    pub size: u64,
    /// Allocated bytes before the first round and after the last
    /// preconditioning.
    pub allocated_before: u64,
    pub allocated_after: u64,
}

impl Allocation {
    pub fn to_json(&self) -> Value {
        json!({"side": self.side, "path": self.path, "size": self.size,
               "allocated_before": self.allocated_before, "allocated_after": self.allocated_after})
    }
}

/// The file and size of server `id`'s first `--namespace file=PATH,size=N`
/// in `topology`.
pub fn server_namespace(topology: &Topology, id: &str) -> Result<(PathBuf, u64)> {
    let server = topology
        .servers
        .iter()
        .find(|s| s.id == id)
        .with_context(|| format!("topology {} has no server {id}", topology.name))?;
    let spec = server
        .args
        .windows(2)
        .find(|w| w[0] == "--namespace")
        .map(|w| w[1].as_str())
        .with_context(|| format!("{id} has no --namespace"))?;
    namespace_file(spec).with_context(|| format!("{id}'s --namespace {spec}"))
}

/// `file=PATH,size=N,...` → (PATH, N).
fn namespace_file(spec: &str) -> Result<(PathBuf, u64)> {
    let mut path = None;
    let mut size = None;
    for option in spec.split(',') {
        if let Some(p) = option.strip_prefix("file=") {
            path = Some(PathBuf::from(p));
        } else if let Some(s) = option.strip_prefix("size=") {
            size = Some(p2plab_lab::topology::parse_size(s).context("size=")?);
        }
    }
    match (path, size) {
        (Some(p), Some(s)) => Ok((p, s)),
        _ => bail!("the bench needs file= and size="),
    }
}

/// The topology at `path` with `@STATE@` set (and `@RUN@` somewhere
/// harmless: only file paths are read from it).
pub fn load_topology(path: &Path, state: &Path, run: &Path) -> Result<Topology> {
    Topology::load(
        path,
        &Placeholders {
            run: run.to_path_buf(),
            state: state.to_path_buf(),
        },
    )
}

/// Bytes of `path` the file system has allocated.
fn allocated(file: &File) -> Result<u64> {
    Ok(file.metadata()?.blocks() * 512)
}

/// Makes `disk` exist with its size and have no holes, keeping its bytes;
/// returns its allocated bytes before and after.
pub fn precondition(disk: &Disk) -> Result<(u64, u64)> {
    let what = || format!("preconditioning {} ({})", disk.path.display(), disk.side);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&disk.path)
        .with_context(what)?;
    let len = file.metadata().with_context(what)?.len();
    if len == 0 {
        file.set_len(disk.size).with_context(what)?;
    } else if len != disk.size {
        bail!(
            "{} has {len} bytes, not the {} its side serves; remove it",
            disk.path.display(),
            disk.size
        );
    }
    let before = allocated(&file).with_context(what)?;
    if before >= disk.size {
        return Ok((before, before));
    }
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    while offset < disk.size {
        let n = CHUNK.min((disk.size - offset) as usize);
        file.read_exact_at(&mut buf[..n], offset)
            .with_context(what)?;
        file.write_all_at(&buf[..n], offset).with_context(what)?;
        offset += n as u64;
    }
    file.sync_all().with_context(what)?;
    let after = allocated(&file).with_context(what)?;
    if after < disk.size {
        bail!(
            "{}: {after} of {} bytes allocated after rewriting it (a file system that \
             deduplicates or compresses zeros?); its reads would not all reach the disk",
            disk.path.display(),
            disk.size
        );
    }
    Ok((before, after))
}

/// Preconditions every disk; `seen` keeps the first `before` per disk
/// and the latest `after`.
pub fn precondition_all(disks: &[Disk], seen: &mut Vec<Allocation>) -> Result<()> {
    for disk in disks {
        let (before, after) = precondition(disk)?;
        match seen.iter_mut().find(|a| a.path == disk.path) {
            Some(a) => a.allocated_after = after,
            None => seen.push(Allocation {
                side: disk.side,
                path: disk.path.clone(),
                size: disk.size,
                allocated_before: before,
                allocated_after: after,
            }),
        }
        if before < disk.size {
            eprintln!(
                "p2plab-bench: {} ({}) preconditioned: {} of {} MiB were allocated, now all",
                disk.path.display(),
                disk.side,
                before >> 20,
                disk.size >> 20
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a sparse file left with holes (its reads would cost no
    /// disk I/O), its bytes changed by the rewrite, or a file of another
    /// size accepted.
    #[test]
    fn a_sparse_file_is_allocated_with_its_bytes_kept() {
        let dir = std::env::temp_dir().join(format!("p2plab-disks-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.img");
        let size = 3 * CHUNK as u64 + 4096;
        let file = File::create(&path).unwrap();
        file.set_len(size).unwrap();
        file.write_all_at(b"kept", CHUNK as u64 + 7).unwrap();
        file.sync_all().unwrap();
        let disk = Disk {
            side: "test",
            path: path.clone(),
            size,
        };
        let mut seen = Vec::new();
        precondition_all(std::slice::from_ref(&disk), &mut seen).unwrap();
        let a = &seen[0];
        assert!(a.allocated_before < size, "the test file started sparse");
        assert!(a.allocated_after >= size);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, size);
        assert_eq!(&bytes[CHUNK + 7..CHUNK + 11], b"kept");
        assert!(bytes[..CHUNK + 7].iter().all(|&b| b == 0));
        assert!(bytes[CHUNK + 11..].iter().all(|&b| b == 0));
        // Again: nothing to do, the first `before` is kept.
        precondition_all(std::slice::from_ref(&disk), &mut seen).unwrap();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].allocated_before < size);
        let wrong = Disk {
            size: size + 4096,
            ..disk
        };
        let err = format!("{:#}", precondition(&wrong).unwrap_err());
        assert!(err.contains("remove it"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Catches: the namespace file or size read from the wrong option,
    /// or a spec without one accepted.
    #[test]
    fn namespace_file_and_size() {
        assert_eq!(
            namespace_file("file=/s/nvme0n1.img,size=1G,lba=512").unwrap(),
            (PathBuf::from("/s/nvme0n1.img"), 1 << 30)
        );
        assert!(namespace_file("file=/s/x.img").is_err());
        assert!(namespace_file("size=1G").is_err());
    }
}
