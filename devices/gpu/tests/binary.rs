//! The `p2plab-gpu` binary as the lab runs it: flags, startup, RSS with a
//! large sparse VRAM, the stats file, and a clean exit on SIGTERM.

use p2plab_kit::testing::wait_until;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_p2plab-gpu");

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-gpu-bin-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn json_u64(json: &str, key: &str) -> u64 {
    let pattern = format!("\"{key}\":");
    let at = json
        .find(&pattern)
        .unwrap_or_else(|| panic!("{key} in {json}"))
        + pattern.len();
    json[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    for (args, flag) in [
        (vec!["--vram-size", "3G"], "--vram-size"),
        (vec!["--vram-size", "128M"], "--vram-size"),
        (vec!["--vram-size", "lots"], "--vram-size"),
        (vec!["--vendor-id", "0x12345"], "--vendor-id"),
        (vec!["--device-id", "0xffff"], "--device-id"),
        (vec!["--inject", "explode"], "--inject"),
        (vec!["--inject", "job-error=0x10"], "--inject"),
        (vec!["--inject", "hang,lba=1-2"], "--inject"),
    ] {
        let out = Command::new(BIN)
            .args(["--socket", "/nonexistent/x.sock"])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    let out = Command::new(BIN)
        .args(["--socket", "/tmp/x.sock", "--log-level", "nope=["])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-level"));
}

/// Catches: a server that arms any number of `--inject` specs, or refuses
/// the one past its cap without naming the flag.
#[test]
fn injections_past_the_cap_are_refused_naming_the_flag() {
    let dir = temp_dir("cap");
    let mut args = vec!["--vram-size".to_string(), "256M".to_string()];
    for _ in 0..=p2plab_fault::DEFAULT_MAX_ARMED {
        args.extend(["--inject".to_string(), "drop-irq".to_string()]);
    }
    let out = Command::new(BIN)
        .arg("--socket")
        .arg(dir.join("gpu.sock"))
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--inject drop-irq: 64 injections"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn large_vram_keeps_rss_low_and_sigterm_exits_cleanly() {
    let dir = temp_dir("run");
    let socket = dir.join("gpu.sock");
    let stats = dir.join("stats.json");
    let log = dir.join("gpu.log");
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&socket)
        .args(["--vram-size", "64G", "--stats-interval-ms", "3600000"])
        .arg("--stats-file")
        .arg(&stats)
        .arg("--log-file")
        .arg(&log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("socket", Duration::from_secs(20), || socket.exists());
    wait_until("stats file", Duration::from_secs(20), || stats.exists());
    let json = std::fs::read_to_string(&stats).unwrap();
    assert_eq!(json_u64(&json, "vram_size"), 64 << 30);
    assert_eq!(json_u64(&json, "vram_allocated_bytes"), 0);

    // 64 GiB of VRAM costs no resident memory.
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(
        rss_kib < 64 * 1024,
        "server RSS {rss_kib} kB with 64 GiB VRAM"
    );

    // SIGTERM: final stats written (the periodic writer would only run in
    // an hour), socket removed, exit status 0.
    std::fs::remove_file(&stats).unwrap();
    // SAFETY: kill(2) on the child we spawned and still own.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "socket removed");
    let json = std::fs::read_to_string(&stats).expect("final stats written at exit");
    assert_eq!(json_u64(&json, "resets"), 0);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("p2plab-gpu starting"), "{log}");
    assert!(log.contains("signal received"), "{log}");
    assert!(log.contains("p2plab-gpu exiting"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The control socket of a running server: armed `--inject` specs show in
/// `status` with the registers, `inject` refuses a bad spec naming it,
/// `clear` disarms, `reset` resets. Catches a GPU server whose control
/// socket is missing or ignores its requests.
#[test]
fn control_socket_arms_lists_clears_and_resets() {
    use p2plab_server::control::{request, ControlRequest};
    let dir = temp_dir("ctl");
    let socket = dir.join("gpu0.sock");
    let ctl = dir.join("gpu0.ctl");
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&socket)
        .args(["--vram-size", "256M", "--inject", "hang,count=1"])
        .args(["--log-level", "warn"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("control socket", Duration::from_secs(20), || ctl.exists());
    let status = request(&ctl, &ControlRequest::Status).unwrap();
    assert_eq!(status["faults"][0]["spec"], "hang,count=1", "{status}");
    assert_eq!(status["faults"][0]["remaining"], 1, "{status}");
    assert_eq!(status["registers"]["ID"], 0x5032_4750, "{status}");
    assert_eq!(status["registers"]["VRAM_SIZE"], 256u64 << 20, "{status}");
    let armed = request(
        &ctl,
        &ControlRequest::Inject {
            spec: "vram-error=4096-8191".into(),
        },
    )
    .unwrap();
    assert_eq!(armed["spec"], "vram-error=0x1000-0x1fff", "{armed}");
    let err = request(
        &ctl,
        &ControlRequest::Inject {
            spec: "drop-irq,cnt=1".into(),
        },
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("cnt=1:"), "{err}");
    let status = request(&ctl, &ControlRequest::Status).unwrap();
    assert_eq!(
        status["faults"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    request(&ctl, &ControlRequest::Clear).unwrap();
    request(&ctl, &ControlRequest::Reset).unwrap();
    let status = request(&ctl, &ControlRequest::Status).unwrap();
    assert_eq!(status["faults"], serde_json::json!([]), "{status}");
    assert_eq!(status["resets"], 1, "{status}");
    // SAFETY: kill(2) on the child we spawned and still own.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(child.wait().unwrap().success());
    assert!(!ctl.exists(), "control socket removed");
    let _ = std::fs::remove_dir_all(&dir);
}
