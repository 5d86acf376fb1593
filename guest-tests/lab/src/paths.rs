//! Where the lab's pieces live on the host: the checkout, the caches, the
//! built binaries and the per-run folders.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The folders one lab invocation works with.
#[derive(Debug, Clone)]
pub struct LabPaths {
    /// The repository checkout (holds `scripts/`, `qemu-configs/`).
    pub repo: PathBuf,
    /// Gitignored cache: the guest environment, disk images.
    pub cache: PathBuf,
    /// Where the device server binaries are (`p2plab-nvme`, `p2plab-gpu`).
    pub bin_dir: PathBuf,
    /// Parent of the per-run folders.
    pub runs: PathBuf,
    /// Persistent device state (namespace backing files) shared across boots.
    pub state: PathBuf,
}

impl LabPaths {
    /// Finds the checkout from `P2PLAB_REPO`, else from this crate's build
    /// location (`guest-tests/lab`), else by walking up from the running
    /// executable.
    pub fn discover() -> Result<Self> {
        let repo = match std::env::var_os("P2PLAB_REPO") {
            Some(dir) => PathBuf::from(dir),
            None => find_repo()?,
        };
        let cache = std::env::var_os("P2PLAB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join(".cache"));
        let bin_dir = match std::env::var_os("P2PLAB_BIN_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => default_bin_dir(&repo),
        };
        let runs = std::env::var_os("P2PLAB_RUNS")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join("runs"));
        let state = cache.join("state");
        Ok(Self {
            repo,
            cache,
            bin_dir,
            runs,
            state,
        })
    }

    pub fn guest_env(&self) -> PathBuf {
        self.cache.join("guest")
    }

    pub fn qemu(&self) -> PathBuf {
        self.guest_env().join("bin/qemu-system-x86_64")
    }

    /// The QEMU executable inside the guest environment's Debian root (the
    /// [`LabPaths::qemu`] wrapper runs it): the file the hot-unplug fix
    /// patches (`p2plab-qemu-patch`).
    pub fn qemu_executable(&self) -> PathBuf {
        self.guest_env().join("root/usr/bin/qemu-system-x86_64")
    }

    pub fn kernel(&self) -> PathBuf {
        self.guest_env().join("vmlinuz")
    }

    pub fn base_initramfs(&self) -> PathBuf {
        self.guest_env().join("initramfs.img")
    }

    /// The base initramfs without most of /usr, which [`LabPaths::usr_image`]
    /// holds: what boots of the guest environment's own kernel use.
    pub fn early_initramfs(&self) -> PathBuf {
        self.guest_env().join("early.cpio")
    }

    /// /usr's programs, libraries and data as a read-only EROFS image, which
    /// the guest's init lays over /usr (a virtio disk, serial `p2plab-bulk`).
    pub fn usr_image(&self) -> PathBuf {
        self.guest_env().join("bulk.img")
    }

    /// The cpio appended to the base initramfs: guest drivers and programs.
    pub fn overlay_initramfs(&self) -> PathBuf {
        self.guest_env().join("overlay.img")
    }

    pub fn qemu_configs(&self) -> PathBuf {
        self.repo.join("qemu-configs")
    }

    /// Resolves a `--config` value: a path to a file, or the name of a file
    /// in `qemu-configs/` with or without its `.args` ending.
    pub fn topology(&self, name: &str) -> Result<PathBuf> {
        let as_path = Path::new(name);
        if as_path.is_file() {
            return Ok(as_path.to_path_buf());
        }
        for candidate in [
            self.qemu_configs().join(name),
            self.qemu_configs().join(format!("{name}.args")),
        ] {
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
        let known = self.known_topologies().join(", ");
        bail!("--config {name:?}: no such file, and no qemu-configs/{name}.args (known: {known})")
    }

    pub fn known_topologies(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.qemu_configs())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".args").map(str::to_owned)
            })
            .collect();
        names.sort();
        names
    }

    pub fn server_binary(&self, name: &str) -> Result<PathBuf> {
        let path = self.bin_dir.join(name);
        if !path.is_file() {
            bail!(
                "device server {} is not built (run `cargo build --release --bins`, \
                 or scripts/run-vm which does it)",
                path.display()
            );
        }
        Ok(path)
    }
}

fn find_repo() -> Result<PathBuf> {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if is_repo(&built_in) {
        return built_in
            .canonicalize()
            .context("canonicalizing the checkout path");
    }
    let exe = std::env::current_exe().context("locating the running executable")?;
    let mut dir = exe.parent();
    while let Some(d) = dir {
        if is_repo(d) {
            return Ok(d.to_path_buf());
        }
        dir = d.parent();
    }
    bail!("cannot find the p2plab checkout; set P2PLAB_REPO")
}

fn is_repo(dir: &Path) -> bool {
    dir.join("qemu-configs").is_dir() && dir.join("scripts").is_dir()
}

fn default_bin_dir(repo: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"));
    target.join("release")
}
