//! Builds what the lab needs and is missing: the guest environment (a trixie
//! root with QEMU >= 11.1, the guest kernel and the initramfs) and the overlay
//! with the project's guest drivers and programs. The heavy lifting is in
//! `scripts/setup-guest-env` and `scripts/build-guest-overlay`; both are
//! idempotent and return at once when nothing changed.

use std::path::PathBuf;
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
    if let p2plab_qemu_patch::UnplugFix::Unrecognized(why) =
        p2plab_qemu_patch::ensure(&paths.qemu_executable())?
    {
        tracing::warn!(
            "QEMU left as it is ({why}); if it is 11.1, device_del of a vfio-user-pci \
             device aborts it (README \"Hot unplug\")"
        );
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

/// The initramfs a boot uses: the base archive followed by the overlay
/// (the kernel unpacks concatenated cpio archives in order). It is composed
/// once into the cache and reused until an input changes. The uncompressed
/// base is preferred: it reaches user space about a second sooner under TCG.
pub fn boot_initramfs(paths: &LabPaths) -> Result<PathBuf> {
    let env = paths.guest_env();
    let base = [env.join("initramfs.cpio"), paths.base_initramfs()]
        .into_iter()
        .find(|p| p.is_file())
        .context("the guest environment has no initramfs")?;
    let overlay = paths.overlay_initramfs();
    let parts: Vec<PathBuf> = [base, overlay]
        .into_iter()
        .filter(|p| p.is_file())
        .collect();
    let composed = env.join("boot-initramfs.img");
    let newest_input = parts
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max();
    let current = std::fs::metadata(&composed)
        .and_then(|m| m.modified())
        .ok()
        .zip(newest_input)
        .is_some_and(|(out, input)| out > input);
    if current {
        return Ok(composed);
    }
    let tmp = env.join(format!(".boot-initramfs.{}", std::process::id()));
    {
        let mut out =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        for part in &parts {
            let mut input =
                std::fs::File::open(part).with_context(|| format!("opening {}", part.display()))?;
            std::io::copy(&mut input, &mut out)
                .with_context(|| format!("copying {}", part.display()))?;
        }
    }
    std::fs::rename(&tmp, &composed)
        .with_context(|| format!("installing {}", composed.display()))?;
    Ok(composed)
}
