//! Builds what the lab needs and is missing: the guest environment (a trixie
//! root with QEMU >= 11.1, the guest kernel and the initramfs) and the overlay
//! with the project's guest drivers and programs. The heavy lifting is in
//! `scripts/setup-guest-env` and `scripts/build-guest-overlay`; both are
//! idempotent and return at once when nothing changed.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::paths::LabPaths;

/// Runs a setup script with its progress lines on our stderr.
fn run_setup_script(
    paths: &LabPaths,
    script: &str,
    what: &str,
    extra: &[&std::ffi::OsStr],
) -> Result<()> {
    let path = paths.repo.join("scripts").join(script);
    if !path.is_file() {
        bail!("{} is missing from the checkout", path.display());
    }
    let status = Command::new("bash")
        .arg(&path)
        .arg("--cache")
        .arg(paths.guest_env())
        .args(extra)
        .current_dir(&paths.repo)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("running {}", path.display()))?;
    if !status.success() {
        bail!(
            "{what} failed ({status}); see {}",
            paths.guest_env().join("setup.log").display()
        );
    }
    Ok(())
}

/// Makes sure the guest environment exists and is current.
pub fn ensure_guest_env(paths: &LabPaths) -> Result<()> {
    run_setup_script(
        paths,
        "setup-guest-env",
        "building the guest environment",
        &[],
    )?;
    for needed in [paths.qemu(), paths.kernel(), paths.base_initramfs()] {
        if !needed.exists() {
            bail!("the guest environment has no {}", needed.display());
        }
    }
    Ok(())
}

/// Builds the overlay initramfs (guest drivers, test programs) if the
/// project has a script for it.
pub fn ensure_overlay(paths: &LabPaths) -> Result<()> {
    if paths.repo.join("scripts/build-guest-overlay").is_file() {
        run_setup_script(
            paths,
            "build-guest-overlay",
            "building the guest overlay",
            &["--bin-dir".as_ref(), paths.bin_dir.as_os_str()],
        )?;
    }
    Ok(())
}

/// Concatenates the base initramfs and the overlay (the kernel unpacks
/// concatenated cpio archives in order) into `dest`.
pub fn compose_initramfs(paths: &LabPaths, dest: &Path) -> Result<()> {
    let mut out =
        std::fs::File::create(dest).with_context(|| format!("creating {}", dest.display()))?;
    for part in [paths.base_initramfs(), paths.overlay_initramfs()] {
        if !part.exists() {
            continue;
        }
        let mut input =
            std::fs::File::open(&part).with_context(|| format!("opening {}", part.display()))?;
        std::io::copy(&mut input, &mut out)
            .with_context(|| format!("copying {}", part.display()))?;
    }
    Ok(())
}
