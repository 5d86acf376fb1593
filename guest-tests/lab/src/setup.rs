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

/// The kernel a boot uses. QEMU can enter a kernel's uncompressed ELF image
/// through its PVH entry point (the Xen PHYS32_ENTRY note, CONFIG_PVH), which
/// skips the bzImage's self-decompression: under TCG that is about 4 s of
/// every boot (measured: 1.1 s instead of 4.2-5.0 s from QEMU's start to the
/// kernel's first line). The ELF image is derived once from `vmlinuz` into
/// the cache and reused until `vmlinuz` changes. Whenever it cannot be
/// derived (a kernel compressed other than with zstd, or without PVH), the
/// bzImage is booted as before.
pub fn boot_kernel(paths: &LabPaths) -> PathBuf {
    let bz_image = paths.kernel();
    match derive_pvh_kernel(&bz_image, &paths.guest_env().join("vmlinux-pvh")) {
        Ok(elf) => elf,
        Err(why) => {
            tracing::debug!("booting {} itself: {why:#}", bz_image.display());
            bz_image
        }
    }
}

fn derive_pvh_kernel(bz_image: &std::path::Path, out: &std::path::Path) -> Result<PathBuf> {
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified());
    let input_time = modified(bz_image)?;
    if modified(out).is_ok_and(|t| t > input_time) {
        return Ok(out.to_owned());
    }
    let image = std::fs::read(bz_image)?;
    let payload = bz_image_payload(&image)?;
    if !payload.starts_with(&ZSTD_MAGIC) {
        bail!("the payload is not zstd-compressed");
    }
    // The kernel's build appends the uncompressed size (4 bytes) after the
    // zstd frame, which the zstd tool would take for a broken next frame.
    let payload = payload
        .get(..payload.len().saturating_sub(4))
        .unwrap_or_default();
    let tmp = out.with_extension(format!("tmp.{}", std::process::id()));
    let mut child = Command::new("zstd")
        .args(["-d", "-q", "-c", "-"])
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&tmp)?)
        .stderr(Stdio::null())
        .spawn()
        .context("running zstd")?;
    let fed = {
        use std::io::Write;
        let mut stdin = child.stdin.take().context("zstd's stdin")?;
        stdin.write_all(payload)
    };
    let status = child.wait()?;
    let elf = std::fs::read(&tmp);
    let checked = fed
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            if status.success() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("zstd failed ({status})"))
            }
        })
        .and_then(|()| elf.map_err(anyhow::Error::from))
        .and_then(|elf| {
            if has_pvh_entry(&elf) {
                Ok(())
            } else {
                Err(anyhow::anyhow!("the kernel has no PVH entry point"))
            }
        });
    if let Err(why) = checked {
        let _ = std::fs::remove_file(&tmp);
        return Err(why);
    }
    std::fs::rename(&tmp, out).with_context(|| format!("installing {}", out.display()))?;
    Ok(out.to_owned())
}

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The compressed kernel inside a bzImage, located by the setup header
/// (boot protocol 2.08+): `payload_offset` and `payload_length` count from
/// the protected-mode code, which follows the `setup_sects` + 1 sectors of
/// real-mode setup.
fn bz_image_payload(image: &[u8]) -> Result<&[u8]> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?))
    };
    if image.get(0x202..0x206) != Some(b"HdrS".as_slice()) {
        bail!("not a bzImage (no HdrS setup header)");
    }
    let version = image
        .get(0x206..0x208)
        .map(|v| u16::from_le_bytes([v[0], v[1]]));
    if version.is_none_or(|v| v < 0x208) {
        bail!("boot protocol older than 2.08 (no payload fields)");
    }
    let setup_sects = match image.get(0x1f1) {
        Some(0) => 4,
        Some(&n) => usize::from(n),
        None => bail!("truncated bzImage"),
    };
    let protected_mode = (setup_sects + 1) * 512;
    let (offset, length) = u32_at(0x248)
        .zip(u32_at(0x24c))
        .context("truncated setup header")?;
    let start = protected_mode + usize::try_from(offset)?;
    let end = start + usize::try_from(length)?;
    image
        .get(start..end)
        .context("the payload lies outside the bzImage")
}

/// Whether an ELF64 image carries the Xen PHYS32_ENTRY note (type 18) in a
/// PT_NOTE segment: the PVH entry QEMU's `-kernel` looks for.
fn has_pvh_entry(elf: &[u8]) -> bool {
    const PT_NOTE: u32 = 4;
    const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    // ELF64, little-endian.
    if elf.get(0..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(phnum)).any(|i| {
        let ph = phoff + i * usize::from(phentsize);
        if u32_at(ph) != Some(PT_NOTE) {
            return false;
        }
        let (Some(offset), Some(size)) = (u64_at(ph + 0x08), u64_at(ph + 0x20)) else {
            return false;
        };
        let (Ok(mut at), Ok(size)) = (usize::try_from(offset), usize::try_from(size)) else {
            return false;
        };
        let end = at.saturating_add(size);
        // Each note: namesz, descsz, type, then name and desc, each padded
        // to 4 bytes.
        while at + 12 <= end {
            let (Some(namesz), Some(descsz), Some(kind)) =
                (u32_at(at), u32_at(at + 4), u32_at(at + 8))
            else {
                return false;
            };
            let name_len = (namesz as usize).div_ceil(4) * 4;
            let desc_len = (descsz as usize).div_ceil(4) * 4;
            let name = elf.get(at + 12..at + 12 + namesz as usize);
            if kind == XEN_ELFNOTE_PHYS32_ENTRY && name == Some(b"Xen\0".as_slice()) {
                return true;
            }
            at = at.saturating_add(12 + name_len + desc_len);
        }
        false
    })
}

#[cfg(test)]
mod pvh_tests {
    use super::*;

    /// A minimal ELF64 with one PT_NOTE segment holding one note.
    fn elf_with_note(name: &[u8], kind: u32) -> Vec<u8> {
        let mut elf = vec![0u8; 0x40 + 0x38];
        elf[0..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes()); // phoff
        elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes()); // phentsize
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // phnum
        let note_at = elf.len();
        let mut note = Vec::new();
        note.extend_from_slice(&(name.len() as u32).to_le_bytes());
        note.extend_from_slice(&8u32.to_le_bytes());
        note.extend_from_slice(&kind.to_le_bytes());
        note.extend_from_slice(name);
        note.resize(note.len().div_ceil(4) * 4, 0);
        note.extend_from_slice(&0x0100_0000u64.to_le_bytes());
        let ph = 0x40;
        elf[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes()); // PT_NOTE
        elf[ph + 0x08..ph + 0x10].copy_from_slice(&(note_at as u64).to_le_bytes());
        elf[ph + 0x20..ph + 0x28].copy_from_slice(&(note.len() as u64).to_le_bytes());
        elf.extend_from_slice(&note);
        elf
    }

    /// Catches: a kernel without the PVH entry booted as an ELF (QEMU
    /// refuses it, and no lab would boot), or one with it missed.
    #[test]
    fn the_pvh_note_is_found_only_where_it_is() {
        assert!(has_pvh_entry(&elf_with_note(b"Xen\0", 18)));
        assert!(!has_pvh_entry(&elf_with_note(b"Xen\0", 17)));
        assert!(!has_pvh_entry(&elf_with_note(b"Linux\0", 18)));
        assert!(!has_pvh_entry(b"\x7fELF\x01\x01 32-bit"));
        let mut truncated = elf_with_note(b"Xen\0", 18);
        truncated.truncate(0x60);
        assert!(!has_pvh_entry(&truncated));
    }

    /// Catches: a payload read from the wrong offset (the real-mode setup
    /// sectors miscounted), or a bad header read out of bounds.
    #[test]
    fn the_payload_is_found_by_the_setup_header() {
        let mut image = vec![0u8; 3 * 512 + 16];
        image[0x1f1] = 2; // setup_sects: protected mode at 3 * 512
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
        image[0x248..0x24c].copy_from_slice(&4u32.to_le_bytes());
        image[0x24c..0x250].copy_from_slice(&8u32.to_le_bytes());
        image[3 * 512 + 4..3 * 512 + 12].copy_from_slice(b"payload!");
        assert_eq!(bz_image_payload(&image).unwrap(), b"payload!");
        image[0x24c..0x250].copy_from_slice(&64u32.to_le_bytes());
        assert!(bz_image_payload(&image).is_err(), "past the end");
        image[0x202] = b'X';
        assert!(bz_image_payload(&image).is_err(), "no header");
    }
}
