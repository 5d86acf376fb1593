//! `p2plab-gdsio info`, and the facts about a file and the GPU that the
//! runs' JSON shares with it: file system type, route.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Context, Result};
use p2plab_gds::{Driver, FileHandle};
use serde_json::{json, Value};

use crate::InfoArgs;

/// File system type name from statfs.
pub fn fs_type(file: &File) -> &'static str {
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one struct statfs into memory we own.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return "unknown";
    }
    match st.f_type as u64 {
        0xef53 => "ext4",
        0x5846_5342 => "xfs",
        0x0102_1994 => "tmpfs",
        0x0102_7803 => "9p",
        0x858_458f6 => "ramfs",
        _ => "other",
    }
}

pub fn route_json(driver: &Driver, file: &FileHandle, gpu: &str) -> Value {
    let route = driver.route(file, gpu);
    json!({
        "storage": route.storage.as_ref().map(|c| c.device().to_owned()),
        "gpu": gpu,
        "relation": route.relation.as_ref().map(|r| r.name()),
        "relation_detail": route.relation.as_ref().map(|r| r.describe()),
        "refusal": route.refusal.as_ref().map(|r| json!({
            "reason": r.reason.name(), "errno": r.errno, "detail": r.detail,
        })),
    })
}

pub fn run_info(args: &InfoArgs) -> Result<Value> {
    let driver = Driver::open()?;
    let mut gpus = Vec::new();
    for bdf in driver.list_gpus() {
        let published =
            std::fs::read_to_string(format!("/sys/bus/pci/devices/{bdf}/p2pmem/published"))
                .map(|s| s.trim() == "1")
                .unwrap_or(false);
        let gpu = driver.gpu(&bdf).ok();
        gpus.push(json!({
            "gpu": bdf,
            "node": gpu.as_ref().map(|g| g.node.clone()),
            "vram_size": gpu.as_ref().map(|g| g.vram_size),
            "p2pmem_published": published,
        }));
    }
    let mut out = json!({ "gpus": gpus, "force_compat": driver.force_compat() });
    if let Some(path) = &args.file {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let handle = driver.register_file(file.as_fd())?;
        let gpu = driver.pick_gpu(args.gpu.as_deref())?;
        let facts = handle.facts()?;
        out["file"] = json!({
            "path": path.display().to_string(),
            "fs_type": fs_type(&file),
            "size": facts.size,
            "dio_offset_align": handle.offset_align,
            "dio_mem_align": handle.mem_align,
            "direct_io": handle.direct().is_some(),
        });
        out["route"] = route_json(&driver, &handle, &gpu);
    }
    Ok(out)
}
