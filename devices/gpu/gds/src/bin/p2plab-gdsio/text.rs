//! The human-readable output of a run (the default without --json).

use serde_json::Value;

fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else {
        format!("{n} B")
    }
}

pub fn print_text(v: &Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    println!(
        "p2plab-gdsio: {} {} ({}) {} in {:.3} s = {:.1} MiB/s, {} calls, {} errors",
        v["op"].as_str().unwrap_or(""),
        v["file"].as_str().unwrap_or(""),
        v["fs_type"].as_str().unwrap_or(""),
        human_bytes(n("bytes")),
        v["elapsed_s"].as_f64().unwrap_or(0.0),
        v["mib_per_s"].as_f64().unwrap_or(0.0),
        n("ios"),
        n("errors"),
    );
    println!(
        "path: {} (p2p {}, compat {}); GPU {} buffer {} at VRAM offset {:#x}",
        v["path"].as_str().unwrap_or(""),
        human_bytes(n("p2p_bytes")),
        human_bytes(n("compat_bytes")),
        v["gpu"].as_str().unwrap_or(""),
        v["buffer"]["kind"].as_str().unwrap_or(""),
        v["buffer"]["vram_offset"].as_u64().unwrap_or(0),
    );
    if let Some(reasons) = v["reasons"].as_object() {
        for (reason, calls) in reasons {
            println!("compat reason: {reason} ({calls} calls)");
        }
    }
    for d in v["details"].as_array().into_iter().flatten() {
        println!("  why: {}", d.as_str().unwrap_or(""));
    }
    for e in v["error_messages"].as_array().into_iter().flatten() {
        println!("error: {}", e.as_str().unwrap_or(""));
    }
    if !v["verify"].is_null() {
        println!(
            "verify: {} (GPU crc32c {}, file crc32c {})",
            if v["verify"]["ok"] == true {
                "ok"
            } else {
                "MISMATCH"
            },
            v["verify"]["gpu_crc"].as_str().unwrap_or(""),
            v["verify"]["file_crc"].as_str().unwrap_or(""),
        );
    }
}
