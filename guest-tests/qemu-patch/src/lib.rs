//! The one fix the lab applies to the QEMU binary of its guest environment.
//!
//! QEMU 11.1's vfio-user client aborts when a `vfio-user-pci` device that
//! has an MSI-X capability is finalized, which every hot-unplug
//! (`device_del`) ends with. `vfio_user_pci_finalize()` in
//! hw/vfio-user/pci.c calls `vfio_user_msix_teardown()`, which calls
//! `memory_region_del_subregion(bar->mr, pba_region)`. Since QEMU 10.2
//! (commit ac7a892fd3, "memory: Fix leaks due to owner-shared MRs circular
//! references") the memory regions a device owns are finalized, and detached
//! from their containers, before the device's own instance_finalize runs. So
//! the PBA region has no container any more, and the assertion
//! `subregion->container == mr` (system/memory.c:2617 in 11.1.3) fails.
//! Upstream's fix ("vfio-user: Do not delete the subregion", Akihiko Odaki,
//! posted October 2025, not in 11.1.3) drops that call; the rest of the
//! teardown only frees memory. Nothing a server answers avoids it: the
//! call depends only on the device having MSI-X (see README "Hot unplug").
//!
//! The Debian package ships no source we could rebuild here, so the lab
//! applies the same change to the binary: the 5-byte `call
//! memory_region_del_subregion` in `vfio_user_pci_finalize` becomes a 5-byte
//! NOP. The function is static and the binary stripped, so it is found by
//! what it calls: QEMU exports its symbols for its modules, and
//! `vfio_user_pci_finalize` is the one place that calls
//! `vfio_pci_put_device` and, right after, `vfio_user_disconnect`. The call
//! to `memory_region_del_subregion` must be the only one in the 64 bytes
//! before that. Anything else leaves the binary alone and reports why.
//! The original is kept beside it (`.stock`), and `P2PLAB_QEMU_STOCK=1`
//! puts it back.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::elf::Elf;

mod elf;

/// Environment variable: set to 1 to run QEMU as shipped (to reproduce the
/// upstream bug).
pub const STOCK_ENV: &str = "P2PLAB_QEMU_STOCK";

const CALL: u8 = 0xe8;
const JMP: u8 = 0xe9;
/// `nopl 0x0(%rax,%rax,1)`: the recommended 5-byte NOP.
const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
/// How far before the `vfio_pci_put_device` call the teardown's call may be
/// (in 11.1.3 it is 39 bytes before).
const TEARDOWN_WINDOW: usize = 64;
/// How far after the `vfio_pci_put_device` call `vfio_user_disconnect` may
/// be called (13 bytes in 11.1.3).
const DISCONNECT_WINDOW: usize = 32;

/// Where the binary stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnplugFix {
    /// As shipped: `device_del` of a vfio-user-pci device with MSI-X aborts
    /// QEMU.
    Stock,
    /// The call is replaced by a NOP.
    Applied,
    /// Not the code we know (another build, or one with the upstream fix):
    /// left as it is.
    Unrecognized(String),
}

/// The file offset of the call to patch, from the ELF's exported symbols
/// and code.
pub fn find_teardown_call(binary: &[u8]) -> Result<usize, String> {
    let elf = Elf::parse(binary).map_err(|e| format!("{e:#}"))?;
    let names = [
        "memory_region_del_subregion",
        "vfio_pci_put_device",
        "vfio_user_disconnect",
    ];
    let symbols = elf.dynamic_symbols(&names).map_err(|e| format!("{e:#}"))?;
    let mut addrs = [0u64; 3];
    for ((slot, found), name) in addrs.iter_mut().zip(&symbols).zip(names) {
        *slot = found.ok_or_else(|| format!("no exported symbol {name}"))?;
    }
    let text = elf.section(".text").map_err(|e| format!("{e:#}"))?;
    let code = elf.data(&text).map_err(|e| format!("{e:#}"))?;
    let at = locate_teardown_call(code, text.addr, addrs[0], addrs[1], addrs[2])?;
    usize::try_from(text.offset)
        .ok()
        .and_then(|o| o.checked_add(at))
        .ok_or_else(|| "text offset overflows".to_owned())
}

/// The target of a `call`/`jmp rel32` at `at`, if there is one.
fn branch_target(code: &[u8], code_addr: u64, at: usize) -> Option<u64> {
    let opcode = *code.get(at)?;
    if opcode != CALL && opcode != JMP {
        return None;
    }
    let raw = code.get(at + 1..at + 5)?;
    let rel = i32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
    let next = code_addr.checked_add(u64::try_from(at + 5).ok()?)?;
    next.checked_add_signed(i64::from(rel))
}

fn calls(code: &[u8], code_addr: u64, at: usize, target: u64) -> bool {
    code.get(at) == Some(&CALL) && branch_target(code, code_addr, at) == Some(target)
}

/// The offset in `code` of the `call memory_region_del_subregion` in
/// `vfio_user_pci_finalize` (see the module comment for how it is told
/// apart).
pub fn locate_teardown_call(
    code: &[u8],
    code_addr: u64,
    del_subregion: u64,
    put_device: u64,
    disconnect: u64,
) -> Result<usize, String> {
    let finalize: Vec<usize> = (0..code.len())
        .filter(|&at| calls(code, code_addr, at, put_device))
        .filter(|&at| {
            (at + 5..at + 5 + DISCONNECT_WINDOW)
                .any(|next| branch_target(code, code_addr, next) == Some(disconnect))
        })
        .collect();
    let [put_call] = finalize[..] else {
        return Err(format!(
            "expected one call of vfio_pci_put_device followed by vfio_user_disconnect \
             (vfio_user_pci_finalize), found {}",
            finalize.len()
        ));
    };
    let teardown: Vec<usize> = (put_call.saturating_sub(TEARDOWN_WINDOW)..put_call)
        .filter(|&at| calls(code, code_addr, at, del_subregion))
        .collect();
    match teardown[..] {
        [call] => Ok(call),
        [] => Err(
            "vfio_user_pci_finalize does not call memory_region_del_subregion \
                   (this QEMU may carry the upstream fix)"
                .to_owned(),
        ),
        _ => Err(format!(
            "vfio_user_pci_finalize calls memory_region_del_subregion {} times",
            teardown.len()
        )),
    }
}

/// `binary` with the call at `at` replaced by a NOP.
pub fn patched(binary: &[u8], at: usize) -> Vec<u8> {
    let mut out = binary.to_vec();
    out[at..at + NOP5.len()].copy_from_slice(&NOP5);
    out
}

/// What `binary` is, given the stock copy kept beside it (if any).
pub fn inspect(binary: &[u8], stock: Option<&[u8]>) -> UnplugFix {
    let why = match find_teardown_call(binary) {
        Ok(_) => return UnplugFix::Stock,
        Err(why) => why,
    };
    if let Some(stock) = stock {
        if let Ok(at) = find_teardown_call(stock) {
            if patched(stock, at) == binary {
                return UnplugFix::Applied;
            }
        }
    }
    UnplugFix::Unrecognized(why)
}

fn stock_copy(binary: &Path) -> PathBuf {
    let mut name = binary.as_os_str().to_owned();
    name.push(".stock");
    PathBuf::from(name)
}

/// Writes `bytes` over `path` atomically, executable.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".p2plab-tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

/// The state of the QEMU executable `binary`, without changing it.
pub fn status(binary: &Path) -> Result<UnplugFix> {
    let current = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let stock = std::fs::read(stock_copy(binary)).ok();
    Ok(inspect(&current, stock.as_deref()))
}

/// Applies the fix to the QEMU executable `binary`, or with
/// `P2PLAB_QEMU_STOCK=1` puts the stock binary back. Returns the state it
/// leaves. Idempotent and cheap (reads the binary once or twice).
pub fn ensure(binary: &Path) -> Result<UnplugFix> {
    let want_stock = std::env::var_os(STOCK_ENV).is_some_and(|v| v == "1");
    let current = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let stock_path = stock_copy(binary);
    let stock = std::fs::read(&stock_path).ok();
    match inspect(&current, stock.as_deref()) {
        UnplugFix::Stock if !want_stock => {
            let at = find_teardown_call(&current).map_err(anyhow::Error::msg)?;
            replace_file(&stock_path, &current)?;
            replace_file(binary, &patched(&current, at))?;
            eprintln!(
                "p2plab: patched {} at file offset {at:#x}: vfio-user hot-unplug fix \
                 (see README \"Hot unplug\"; {STOCK_ENV}=1 undoes it)",
                binary.display()
            );
            Ok(UnplugFix::Applied)
        }
        UnplugFix::Applied if want_stock => {
            if let Some(stock) = stock {
                replace_file(binary, &stock)?;
                eprintln!(
                    "p2plab: {STOCK_ENV}=1: restored the stock {}",
                    binary.display()
                );
            }
            Ok(UnplugFix::Stock)
        }
        state => Ok(state),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::tests::build;

    const TEXT: u64 = 0x40_0000;
    const DEL: u64 = 0x40_0800;
    const PUT: u64 = 0x40_0900;
    const DISCONNECT: u64 = 0x40_0a00;

    fn call(from: u64, at: usize, opcode: u8, to: u64) -> [u8; 5] {
        let rel = (to as i64 - (from + at as u64 + 5) as i64) as i32;
        let b = rel.to_le_bytes();
        [opcode, b[0], b[1], b[2], b[3]]
    }

    /// The shape of vfio_user_pci_finalize in 11.1.3: the teardown call, a
    /// few instructions, put_device, a test, then a tail jump to
    /// disconnect. `teardown` false leaves the call out (upstream's fix).
    fn finalize_code(teardown: bool) -> Vec<u8> {
        let mut code = vec![0x90u8; 0x100];
        if teardown {
            code[0x4b..0x50].copy_from_slice(&call(TEXT, 0x4b, CALL, DEL));
        }
        code[0x72..0x77].copy_from_slice(&call(TEXT, 0x72, CALL, PUT));
        code[0x84..0x89].copy_from_slice(&call(TEXT, 0x84, JMP, DISCONNECT));
        code
    }

    fn binary(code: &[u8]) -> Vec<u8> {
        build(
            TEXT,
            code,
            &[
                ("memory_region_del_subregion", DEL),
                ("vfio_pci_put_device", PUT),
                ("vfio_user_disconnect", DISCONNECT),
            ],
        )
    }

    #[test]
    fn finds_the_teardown_call_and_patches_it_to_a_nop() {
        let stock = binary(&finalize_code(true));
        let at = find_teardown_call(&stock).unwrap();
        assert_eq!(stock[at], CALL);
        let fixed = patched(&stock, at);
        assert_eq!(fixed[at..at + 5], NOP5);
        assert_eq!(fixed.len(), stock.len());
        assert_eq!(inspect(&stock, None), UnplugFix::Stock);
        assert_eq!(inspect(&fixed, Some(&stock)), UnplugFix::Applied);
        // Without the stock copy a patched binary is not recognised.
        assert!(matches!(inspect(&fixed, None), UnplugFix::Unrecognized(_)));
    }

    #[test]
    fn leaves_a_binary_with_the_upstream_fix_alone() {
        let upstream = binary(&finalize_code(false));
        match inspect(&upstream, None) {
            UnplugFix::Unrecognized(why) => assert!(why.contains("upstream fix"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refuses_when_the_finalize_function_is_not_unique() {
        let mut code = finalize_code(true);
        code.extend(finalize_code(true));
        // The second copy's calls are relative to its own position.
        let base = 0x100;
        code[base + 0x72..base + 0x77].copy_from_slice(&call(TEXT, base + 0x72, CALL, PUT));
        code[base + 0x84..base + 0x89].copy_from_slice(&call(TEXT, base + 0x84, JMP, DISCONNECT));
        let err = find_teardown_call(&binary(&code)).unwrap_err();
        assert!(err.contains("found 2"), "{err}");
    }

    #[test]
    fn ignores_a_put_device_call_without_disconnect() {
        let mut code = finalize_code(true);
        // The realize error path: put_device, then no disconnect.
        code.extend(vec![0x90; 0x100]);
        code[0x1a0..0x1a5].copy_from_slice(&call(TEXT, 0x1a0, CALL, PUT));
        assert!(find_teardown_call(&binary(&code)).is_ok());
    }

    #[test]
    fn a_modified_binary_is_neither_stock_nor_applied() {
        let stock = binary(&finalize_code(true));
        let at = find_teardown_call(&stock).unwrap();
        let mut other = patched(&stock, at);
        let last = other.len() - 1;
        other[last] ^= 1;
        assert!(matches!(
            inspect(&other, Some(&stock)),
            UnplugFix::Unrecognized(_)
        ));
    }
}
