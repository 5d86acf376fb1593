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
/// once into the cache and reused until an input changes. With `split`, the
/// base is the early archive, and /usr comes from [`LabPaths::usr_image`]
/// (see [`usr_image_args`]); otherwise the whole base, uncompressed when
/// there is that copy: it reaches user space about a second sooner under
/// TCG.
pub fn boot_initramfs(paths: &LabPaths, split: bool) -> Result<PathBuf> {
    let env = paths.guest_env();
    let (candidates, composed) = if split {
        (
            vec![paths.early_initramfs()],
            env.join("boot-initramfs-early.img"),
        )
    } else {
        (
            vec![env.join("initramfs.cpio"), paths.base_initramfs()],
            env.join("boot-initramfs.img"),
        )
    };
    let base = candidates
        .into_iter()
        .find(|p| p.is_file())
        .context("the guest environment has no initramfs")?;
    let overlay = paths.overlay_initramfs();
    let parts: Vec<PathBuf> = [base, overlay]
        .into_iter()
        .filter(|p| p.is_file())
        .collect();
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

/// Whether a boot with this kernel uses the split initramfs and /usr's
/// image: boots of the guest environment's own kernel do, when the image is
/// there. A kernel of the user's (`--kernel`) gets the whole archive: its
/// virtio_blk, erofs and overlay may be modules the archive does not have.
pub fn use_usr_image(paths: &LabPaths, own_kernel: bool) -> bool {
    !own_kernel && paths.usr_image().is_file() && paths.early_initramfs().is_file()
}

/// QEMU's arguments for /usr's image: read-only (every lab on the host
/// shares the one file), a virtio disk whose serial the init looks for.
pub fn usr_image_args(paths: &LabPaths) -> Vec<String> {
    vec![
        "-drive".to_owned(),
        format!(
            "file={},if=none,id=p2plab-usr,format=raw,readonly=on",
            paths.usr_image().display()
        ),
        "-device".to_owned(),
        "virtio-blk-pci,drive=p2plab-usr,serial=p2plab-bulk".to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest environment folder of its own under the system temp dir.
    fn env_with(files: &[(&str, &[u8])]) -> LabPaths {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cache =
            std::env::temp_dir().join(format!("p2plab-setup-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        std::fs::create_dir_all(cache.join("guest")).unwrap();
        for (name, bytes) in files {
            std::fs::write(cache.join("guest").join(name), bytes).unwrap();
        }
        LabPaths {
            repo: cache.clone(),
            cache: cache.clone(),
            bin_dir: cache.clone(),
            runs: cache.clone(),
            state: cache.join("state"),
        }
    }

    /// Catches a user's kernel booted with the split archive (its own
    /// virtio_blk, erofs or overlay may be missing from our modules: no
    /// /usr at all), and a split boot asked for without its two parts.
    #[test]
    fn only_the_environments_own_kernel_boots_split() {
        let both = env_with(&[("early.cpio", b"e"), ("bulk.img", b"b")]);
        assert!(use_usr_image(&both, false));
        assert!(!use_usr_image(&both, true), "a kernel of the user's");
        let no_image = env_with(&[("early.cpio", b"e")]);
        assert!(!use_usr_image(&no_image, false));
        let no_early = env_with(&[("bulk.img", b"b"), ("initramfs.cpio", b"i")]);
        assert!(!use_usr_image(&no_early, false));
        for paths in [both, no_image, no_early] {
            let _ = std::fs::remove_dir_all(&paths.cache);
        }
    }

    /// Catches a split boot composed from the whole archive (the guest
    /// would copy all of /usr into RAM again) or without the overlay, and
    /// a whole boot that picks up the early archive.
    #[test]
    fn a_boot_composes_its_base_then_the_overlay() {
        let paths = env_with(&[
            ("early.cpio", b"EARLY"),
            ("initramfs.cpio", b"WHOLE"),
            ("bulk.img", b"usr"),
            ("overlay.img", b"+OVERLAY"),
        ]);
        let split = boot_initramfs(&paths, true).unwrap();
        assert_eq!(std::fs::read(&split).unwrap(), b"EARLY+OVERLAY");
        let whole = boot_initramfs(&paths, false).unwrap();
        assert_eq!(std::fs::read(&whole).unwrap(), b"WHOLE+OVERLAY");
        assert_ne!(split, whole, "the two compositions share a file");
        let args = usr_image_args(&paths).join(" ");
        assert!(args.contains("readonly=on"), "{args}");
        assert!(args.contains("serial=p2plab-bulk"), "{args}");
        assert!(args.contains(&paths.usr_image().display().to_string()));
        let _ = std::fs::remove_dir_all(&paths.cache);
    }
}
