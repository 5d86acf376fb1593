//! Issue 13 end to end: GPUDirect Storage with p2plab-gds. Files on ext4
//! and xfs are read into and written from GPU memory by `p2plab-gdsio`
//! (and by a C program linked against libp2plab_gds); every transfer is
//! verified with the GPU's CRC32C engine against the CPU's CRC of the
//! file, and the JSON each run prints says which path moved the bytes
//! and why. Two boots: the lab (both file systems, one after the other on
//! nvme0n1) and separate-root-ports (compat mode, topology), which the p2p
//! suite's refusal check shares.
//!
//! What each test catches: `gds_on_ext4_and_xfs_in_the_lab` fails on an
//! NVMe or GPU device that moves the wrong bytes (GPU CRC32C against the
//! CPU's), on a P2P path that silently falls back to bounce buffers (the
//! reported path and the servers' DMA counters say where the bytes went),
//! and on kernel warnings; `separate_root_ports_run_in_compat_mode` fails
//! when P2P is attempted across a non-whitelisted host bridge (the NVMe
//! server must count zero peer DMA bytes) or the refusal comes without its
//! reason, and, in the same boot, when the kernel lets a plain O_DIRECT
//! P2P read (`p2plab-p2pio`, the p2p suite's check) through the host
//! bridge or any byte reaches the GPU BAR. Both also run the cases through cuFile's API
//! (`cufile-gds-cases`, written against cuFile's documentation and linked
//! with p2plab's libcufile.so): the same paths, reasons and bytes.

mod common;

use std::collections::BTreeMap;

use common::{counter, peer_dma_bytes_in, run_guest, shared_boot_script, stats, Boot, GuestRun};
use p2plab_lab::GuestScript;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// One p2plab-gdsio run's JSON, from the run folder.
fn gdsio(run: &GuestRun, fs: &str, name: &str) -> Value {
    let key = format!("{}_{}_STATUS", fs.to_uppercase(), name.to_uppercase());
    let text = run.file(&format!("guest/gds/{fs}-{name}.json"));
    let err = run.file(&format!("guest/gds/{fs}-{name}.err"));
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{fs}-{name}.json is not JSON ({e}): {text:?}; stderr: {err}"));
    assert_eq!(run.fact(&key), "0", "{fs} {name} exit status: {v}\n{err}");
    v
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

/// Calls per compat reason, as the run reported them.
fn reasons(v: &Value) -> BTreeMap<String, u64> {
    v["reasons"]
        .as_object()
        .unwrap_or_else(|| panic!("no reasons in {v}"))
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
        .collect()
}

fn reasons_are(v: &Value, want: &[(&str, u64)]) {
    let want: BTreeMap<String, u64> = want.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    assert_eq!(reasons(v), want, "{v}");
}

/// The GPU's CRC of the buffer equals the CPU's CRC of the file range.
fn verified(v: &Value, bytes: u64) {
    assert_eq!(v["verify"]["ok"], true, "{v}");
    assert_eq!(v["verify"]["bytes"], bytes, "{v}");
    assert_eq!(v["verify"]["gpu_crc"], v["verify"]["file_crc"], "{v}");
    assert_eq!(u(v, "errors"), 0, "{v}");
}

fn details(v: &Value) -> String {
    v["details"].to_string()
}

/// One `cufile-gds-cases` run (a program written against cuFile's
/// documentation, linked with libcufile.so), from its facts.
struct CufileCase {
    ret: u64,
    path: String,
    p2p: u64,
    compat: u64,
    reasons: String,
    p2p_errno: u64,
    eof: u64,
    detail: String,
}

/// The run under `prefix` (e.g. EXT4_CF_SPARSE) exited 0 and its bytes
/// verified: the GPU buffer equals the file range (reads), the file range
/// equals what the GPU buffer held (writes).
fn cufile_case(run: &GuestRun, prefix: &str) -> CufileCase {
    let f = |key: &str| run.fact(&format!("{prefix}_{key}")).to_owned();
    assert_eq!(f("STATUS"), "0", "{prefix}: {}", f("DETAIL"));
    assert_eq!(f("VERIFY"), "ok", "{prefix}");
    let n = |key: &str| run.fact_u64(&format!("{prefix}_{key}"));
    CufileCase {
        ret: n("RET"),
        path: f("PATH"),
        p2p: n("P2P_BYTES"),
        compat: n("COMPAT_BYTES"),
        reasons: f("REASONS"),
        p2p_errno: n("P2P_ERRNO"),
        eof: n("EOF"),
        detail: f("DETAIL"),
    }
}

/// The cuFile program's cases on one file system, as p2plab-gdsio's:
/// returns (P2P bytes read into the GPU, P2P bytes written from it).
///
/// Would catch: cuFile's 5-argument read/write applying devPtr_offset or
/// file_offset wrongly (the verification compares the bytes), a cuFile
/// layer that loses P2P (path and byte counts) or the reasons of a
/// fallback, short reads that are not short, appends in the wrong place.
fn check_cufile_cases(run: &GuestRun, fs: &str, align: u64) -> (u64, u64) {
    let up = fs.to_uppercase();
    let case = |name: &str| cufile_case(run, &format!("{up}_CF_{}", name.to_uppercase()));
    let (mut p2p_read, mut p2p_written) = (0, 0);

    let c = case("aligned_read");
    assert_eq!((c.ret, c.path.as_str()), (4 * MIB, "p2p"), "{}", c.detail);
    assert_eq!((c.p2p, c.compat, c.reasons.as_str()), (4 * MIB, 0, ""));
    p2p_read += c.p2p;

    let c = case("aligned_write");
    assert_eq!((c.ret, c.path.as_str()), (4 * MIB, "p2p"), "{}", c.detail);
    assert_eq!((c.p2p, c.compat), (4 * MIB, 0));
    p2p_written += c.p2p;

    let c = case("unaligned_file");
    assert_eq!(
        (c.path.as_str(), c.compat, c.reasons.as_str()),
        ("compat", MIB, "alignment")
    );
    assert!(c.detail.contains("file offset 1000"), "{}", c.detail);

    let c = case("unaligned_gpu");
    assert_eq!(
        (c.path.as_str(), c.compat, c.reasons.as_str()),
        ("compat", MIB, "alignment")
    );
    assert!(c.detail.contains("GPU address"), "{}", c.detail);

    let c = case("sparse");
    assert_eq!((c.path.as_str(), c.reasons.as_str()), ("mixed", "sparse"));
    assert_eq!((c.p2p, c.compat), (4 * MIB, 12 * MIB));
    p2p_read += c.p2p;

    let c = case("short");
    assert_eq!((c.ret, c.eof, c.reasons.as_str()), (10_000, 1, "eof_tail"));
    let head = 10_000 / align * align;
    assert_eq!((c.p2p, c.compat), (head, 10_000 - head));
    p2p_read += c.p2p;

    let c = case("append");
    assert_eq!(
        (c.ret, c.path.as_str(), c.reasons.as_str()),
        (5000, "compat", "append")
    );

    let c = case("forced");
    assert_eq!((c.path.as_str(), c.reasons.as_str()), ("compat", "forced"));
    assert_eq!(c.compat, MIB);

    if fs == "ext4" {
        let c = case("journal");
        assert_eq!(
            (c.path.as_str(), c.reasons.as_str()),
            ("compat", "fs_no_direct_io")
        );
        assert_eq!(c.compat, 2 * MIB);
    }
    (p2p_read, p2p_written)
}

/// Checks one file system's runs; returns (P2P bytes read into the GPU,
/// P2P bytes written from it), for the NVMe log check.
///
/// Would catch: a library that claims P2P but bounces (or the reverse), a
/// wrong buffer or file offset (CRC mismatch: the poisoned buffer or a
/// shifted range), holes or EOF tails read by DMA, appends written at the
/// wrong place, O_DIRECT trusted where ext4 data=journal would copy, a
/// reason missing or wrong.
fn check_file_system(run: &GuestRun, fs: &str) -> (u64, u64) {
    let up = fs.to_uppercase();
    run.expect(&format!("{up}_MKFS"), "0");
    run.expect(&format!("{up}_MOUNT"), "0");
    let (mut p2p_read, mut p2p_written) = (0, 0);

    // Aligned reads and writes: all P2P, two threads, both O_DIRECT and a
    // plain fd (the library reopens it with O_DIRECT).
    let v = gdsio(run, fs, "aligned_read");
    assert_eq!(v["fs_type"], fs, "{v}");
    assert_eq!(v["path"], "p2p", "{v}");
    assert_eq!((u(&v, "p2p_bytes"), u(&v, "compat_bytes")), (32 * MIB, 0));
    assert_eq!(u(&v, "ios"), 32);
    assert_eq!(v["buffer"]["kind"], "p2pmem");
    assert_eq!(v["buffer"]["bar"], 2);
    assert_eq!(v["route"]["relation"], "shared_bridge", "{v}");
    reasons_are(&v, &[]);
    verified(&v, 32 * MIB);
    p2p_read += u(&v, "p2p_bytes");

    let v = gdsio(run, fs, "nodirect_read");
    assert_eq!(v["app_direct"], false);
    assert_eq!(v["path"], "p2p", "{v}");
    assert_eq!(u(&v, "p2p_bytes"), 8 * MIB);
    verified(&v, 8 * MIB);
    p2p_read += u(&v, "p2p_bytes");

    let v = gdsio(run, fs, "aligned_write");
    assert_eq!(v["path"], "p2p", "{v}");
    assert_eq!((u(&v, "p2p_bytes"), u(&v, "compat_bytes")), (16 * MIB, 0));
    assert_eq!(u(&v, "file_size_after"), 16 * MIB);
    verified(&v, 16 * MIB);
    p2p_written += u(&v, "p2p_bytes");

    let v = gdsio(run, fs, "overwrite");
    assert_eq!(v["path"], "p2p", "{v}");
    assert_eq!(u(&v, "p2p_bytes"), 8 * MIB);
    assert_eq!(u(&v, "file_size_after"), 32 * MIB);
    assert_eq!(v["verify"]["file_offset"], 8 * MIB);
    verified(&v, 8 * MIB);
    p2p_written += u(&v, "p2p_bytes");

    // Unaligned file offset, GPU address and length fall back and say why.
    let v = gdsio(run, fs, "unaligned_file");
    assert_eq!(v["path"], "compat", "{v}");
    assert_eq!(u(&v, "compat_bytes"), MIB);
    reasons_are(&v, &[("alignment", 1)]);
    assert!(details(&v).contains("file offset 1000"), "{v}");
    verified(&v, MIB);

    let v = gdsio(run, fs, "unaligned_gpu");
    assert_eq!(v["path"], "compat", "{v}");
    reasons_are(&v, &[("alignment", 1)]);
    assert!(details(&v).contains("GPU address"), "{v}");
    verified(&v, MIB);

    let v = gdsio(run, fs, "unaligned_len");
    assert_eq!(v["path"], "mixed", "{v}");
    let align = u(&v, "dio_offset_align");
    let head = 1_000_000 / align * align;
    assert_eq!(
        (u(&v, "p2p_bytes"), u(&v, "compat_bytes")),
        (head, 1_000_000 - head)
    );
    reasons_are(&v, &[("alignment", 1)]);
    verified(&v, 1_000_000);
    p2p_read += u(&v, "p2p_bytes");

    // A sparse file: the holes go compat, the data between them P2P.
    let v = gdsio(run, fs, "sparse");
    assert_eq!(v["path"], "mixed", "{v}");
    assert_eq!(
        (u(&v, "p2p_bytes"), u(&v, "compat_bytes")),
        (4 * MIB, 12 * MIB)
    );
    reasons_are(&v, &[("sparse", 1)]);
    let segments = v["first_report"]["segments"]
        .as_array()
        .unwrap_or_else(|| panic!("no segments: {v}"));
    let shape: Vec<(u64, u64, &str)> = segments
        .iter()
        .map(|s| {
            (
                u(s, "file_offset"),
                u(s, "len"),
                s["route"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (0, 4 * MIB, "compat"),
            (4 * MIB, 4 * MIB, "p2p"),
            (8 * MIB, 8 * MIB, "compat")
        ],
        "{v}"
    );
    verified(&v, 16 * MIB);
    p2p_read += u(&v, "p2p_bytes");

    // A short file: a short read, the partial last block through the page
    // cache.
    let v = gdsio(run, fs, "short");
    assert_eq!(u(&v, "bytes"), 10_000);
    assert_eq!(v["eof"], true);
    assert_eq!(v["path"], "mixed", "{v}");
    let head = 10_000 / align * align;
    assert_eq!(
        (u(&v, "p2p_bytes"), u(&v, "compat_bytes")),
        (head, 10_000 - head)
    );
    reasons_are(&v, &[("eof_tail", 1)]);
    verified(&v, 10_000);
    p2p_read += u(&v, "p2p_bytes");

    // Appends: at an unaligned end of file, and through an O_APPEND fd.
    let v = gdsio(run, fs, "append");
    assert_eq!(v["path"], "compat", "{v}");
    assert_eq!(u(&v, "compat_bytes"), 5000);
    reasons_are(&v, &[("append", 1)]);
    assert_eq!(u(&v, "file_size_after"), 15_000);
    verified(&v, 5000);

    let v = gdsio(run, fs, "append_mode");
    assert_eq!(v["path"], "compat", "{v}");
    reasons_are(&v, &[("append", 1)]);
    assert!(details(&v).contains("O_APPEND"), "{v}");
    assert_eq!(
        (u(&v, "file_size_before"), u(&v, "file_size_after")),
        (8192, 8192 + 4096)
    );
    assert_eq!(v["verify"]["file_offset"], 8192);
    verified(&v, 4096);

    // VRAM mapped through /dev/p2plab-gpuN cannot be pinned: compat.
    let v = gdsio(run, fs, "devmap");
    assert_eq!(v["buffer"]["kind"], "devmap");
    assert_eq!(v["path"], "compat", "{v}");
    reasons_are(&v, &[("not_p2pmem", 1)]);
    verified(&v, MIB);

    let v = gdsio(run, fs, "forced");
    assert_eq!(v["path"], "compat", "{v}");
    assert_eq!(v["force_compat"], true);
    reasons_are(&v, &[("forced", 1)]);
    verified(&v, MIB);

    // The C program linked against libp2plab_gds: one read, verified.
    run.expect(&format!("{up}_C_STATUS"), "0");
    run.expect(&format!("{up}_C_RET"), "4194304");
    run.expect(&format!("{up}_C_PATH"), "p2p");
    run.expect(&format!("{up}_C_BUF_KIND"), "p2pmem");
    run.expect(&format!("{up}_C_VERIFY"), "ok");
    run.expect(
        &format!("{up}_C_GPU_CRC"),
        run.fact(&format!("{up}_C_FILE_CRC")),
    );
    p2p_read += run.fact_u64(&format!("{up}_C_P2P_BYTES"));
    let (r, w) = check_cufile_cases(run, fs, align);
    p2p_read += r;
    p2p_written += w;
    if fs == "ext4" {
        run.expect("EXT4_JOURNAL_MOUNT", "0");
        let v = gdsio(run, fs, "journal");
        assert_eq!(v["path"], "compat", "{v}");
        reasons_are(&v, &[("fs_no_direct_io", 2)]);
        assert!(details(&v).contains("statx"), "{v}");
        verified(&v, 2 * MIB);
    }
    run.expect(&format!("{up}_UMOUNT"), "0");
    (p2p_read, p2p_written)
}

/// ext4 and xfs on nvme0n1 in the lab (NVMe and GPU under one switch).
///
/// Would catch besides the per-run checks: bytes counted as P2P that did
/// not travel between nvme0 and the GPU's BAR2 (the NVMe server's log
/// must show exactly the P2P bytes there, through DMA messages), compat
/// copies not done by the GPU engine, kernel warnings.
#[test]
fn gds_on_ext4_and_xfs_in_the_lab() {
    let script = GuestScript::new("gds-lab.sh", include_str!("../guest/gds-lab.sh"));
    let run = run_guest("lab", &script, Boot::default());
    let mut p2p_read = 0;
    let mut p2p_written = 0;
    for fs in ["ext4", "xfs"] {
        let (r, w) = check_file_system(&run, fs);
        p2p_read += r;
        p2p_written += w;
    }
    // The cuFile library's version and properties.
    run.expect("CF_INFO_STATUS", "0");
    run.expect("CF_INFO_VERSION", "1090");
    run.expect("CF_INFO_NVME_SUPPORTED", "1");
    run.expect("CF_INFO_ALLOW_COMPAT", "1");
    run.expect("CF_INFO_PER_BUFFER_CACHE_KB", "4096");

    let v = gdsio(&run, "tmpfs", "read");
    assert_eq!(v["fs_type"], "tmpfs", "{v}");
    assert_eq!(v["path"], "compat", "{v}");
    reasons_are(&v, &[("not_pci_storage", 2)]);
    assert!(v["route"]["storage"].is_null(), "{v}");
    verified(&v, 2 * MIB);
    run.expect("KERNEL_COMPLAINTS", "0");

    // Every byte reported as P2P went between nvme0 and BAR2 of the GPU,
    // straight through the GPU's VRAM memfd (the zero-copy peer path),
    // and nothing went through QEMU by message.
    let (bar2_start, bar2_end) = (run.fact_u64("GPU_BAR2_START"), run.fact_u64("GPU_BAR2_END"));
    let log = run.file("nvme0.log");
    assert_eq!(
        peer_dma_bytes_in(&log, "write", bar2_start, bar2_end),
        p2p_read,
        "NVMe DMA writes into GPU BAR2 = P2P bytes read"
    );
    assert_eq!(
        peer_dma_bytes_in(&log, "read", bar2_start, bar2_end),
        p2p_written,
        "NVMe DMA reads from GPU BAR2 = P2P bytes written"
    );
    let nvme = stats(&run, "nvme0");
    assert_eq!(counter(&nvme, "dma_peer_write_bytes"), p2p_read, "{nvme}");
    assert_eq!(counter(&nvme, "dma_peer_read_bytes"), p2p_written, "{nvme}");
    assert_eq!(counter(&nvme, "dma_message_write_bytes"), 0, "{nvme}");
    assert_eq!(counter(&nvme, "dma_message_read_bytes"), 0, "{nvme}");
    // The GPU engine did the compat copies and the verification.
    let gpu = stats(&run, "gpu0");
    assert!(counter(&gpu, "bytes_host_to_vram") >= 2 * 12 * MIB, "{gpu}");
    assert!(counter(&gpu, "bytes_checksummed") >= 2 * 80 * MIB, "{gpu}");
}

/// separate-root-ports: the kernel refuses P2P between nvme0 and the GPU
/// (q35 host bridge not whitelisted). Reads and writes still complete,
/// in compat mode, and say "topology" with the kernel's errno. The same
/// boot first runs the p2p suite's refusal (`p2p-refused.sh`, its facts
/// under `P2P_`): a plain user-space P2P read must fail. One boot for
/// both saves one of the suites' ~30 (about 12 s of a lane under TCG).
///
/// Would catch: a refusal reported as an error instead of falling back,
/// a fallback that does not say why, data corrupted by the failed attempt,
/// a kernel that lets the O_DIRECT P2P read through the host bridge, any
/// byte reaching the GPU's BAR from the NVMe controller.
#[test]
fn separate_root_ports_run_in_compat_mode() {
    let p2p = GuestScript::new("p2p-refused.sh", include_str!("../guest/p2p-refused.sh"))
        .lib("p2p.sh", include_str!("../guest/lib/p2p.sh"));
    let gds = GuestScript::new("gds-refused.sh", include_str!("../guest/gds-refused.sh"));
    let script = shared_boot_script(&[("P2P_", &p2p), ("", &gds)]);
    let run = run_guest("separate-root-ports", &script, Boot::default());

    // The p2p suite's refusal, before any GDS call: the O_DIRECT read
    // into the GPU's p2pmem fails (EINVAL from the DMA mapping), nothing
    // is transferred, and dmesg names the reason.
    let refused = run.part("P2P_");
    assert_ne!(
        refused.fact("REFUSED_STATUS"),
        "0",
        "the transfer must fail"
    );
    refused.expect("REFUSED_ERRORS", "1");
    refused.expect("REFUSED_BYTES", "0");
    assert!(
        run.output().contains("Invalid argument (os error 22)"),
        "the user sees the error: {}",
        run.output()
    );
    assert!(
        refused.fact_u64("REFUSED_DMESG") >= 1,
        "the kernel says why in dmesg"
    );
    run.expect("EXT4_MKFS", "0");
    run.expect("EXT4_MOUNT", "0");
    run.expect("EXT4_INFO_STATUS", "0");
    let info_text = run.file("guest/gds/ext4-info.json");
    let info: Value =
        serde_json::from_str(&info_text).unwrap_or_else(|e| panic!("info JSON ({e}): {info_text}"));
    assert_eq!(info["route"]["relation"], "host_bridge_only", "{info}");
    assert_eq!(info["file"]["direct_io"], true, "{info}");

    for (name, bytes) in [("read", 8 * MIB), ("write", 4 * MIB)] {
        let v = gdsio(&run, "ext4", name);
        assert_eq!(v["path"], "compat", "{v}");
        assert_eq!((u(&v, "p2p_bytes"), u(&v, "compat_bytes")), (0, bytes));
        // The first call tried P2P and the kernel refused with EINVAL;
        // the rest knew it already. All say topology.
        reasons_are(&v, &[("topology", bytes / MIB)]);
        assert_eq!(u(&v, "p2p_errno"), libc::EINVAL as u64, "{v}");
        assert_eq!(v["route"]["refusal"]["reason"], "topology", "{v}");
        assert!(details(&v).contains("host bridge"), "{v}");
        verified(&v, bytes);
    }

    run.expect("EXT4_C_STATUS", "0");
    run.expect("EXT4_C_PATH", "compat");
    run.expect("EXT4_C_REASONS", "64");
    run.expect("EXT4_C_VERIFY", "ok");
    // Through cuFile's API: the same fallback, reason and errno.
    let c = cufile_case(&run, "EXT4_CF");
    assert_eq!(
        (c.ret, c.path.as_str(), c.reasons.as_str()),
        (MIB, "compat", "topology")
    );
    assert_eq!((c.p2p, c.compat), (0, MIB));
    assert_eq!(c.p2p_errno, libc::EINVAL as u64, "{}", c.detail);

    // The kernel says why when it first decides on the pair, here during
    // the p2p part: it keeps the verdict (p2pdma's map_types cache), so
    // the GDS calls after it may find no new line.
    assert!(
        run.fact_u64("REFUSED_DMESG") + refused.fact_u64("REFUSED_DMESG") >= 1,
        "the kernel says why"
    );
    let nvme = stats(&run, "nvme0");
    assert_eq!(counter(&nvme, "dma_message_write_bytes"), 0, "{nvme}");
    assert_eq!(counter(&nvme, "dma_message_read_bytes"), 0, "{nvme}");
    assert_eq!(counter(&nvme, "dma_peer_write_bytes"), 0, "{nvme}");
    assert_eq!(counter(&nvme, "dma_peer_read_bytes"), 0, "{nvme}");
}
