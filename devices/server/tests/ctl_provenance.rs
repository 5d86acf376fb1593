//! `p2plab-ctl RUN mark` and `provenance` as a user's CI runs them: the
//! binary against a run folder whose control sockets answer like a GPU's
//! and an NVMe's, with the exit status as the verdict.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use p2plab_server::control::{
    ControlHandler, ControlRequest, ControlServer, ControlSockets, Dispatcher,
};
use serde_json::{json, Value};

/// A server whose `status` is whatever the test set last.
struct Canned(Mutex<Value>);

impl ControlHandler for Canned {
    fn handle(&self, request: &ControlRequest) -> Result<Value, String> {
        match request {
            ControlRequest::Status => Ok(self.0.lock().unwrap().clone()),
            _ => Err("not here".into()),
        }
    }
}

fn gpu(ram_in: u64, peer_in: u64) -> Value {
    json!({
        "bytes_ram_to_vram": ram_in, "bytes_vram_to_ram": 0,
        "bytes_host_to_vram": ram_in, "bytes_vram_to_host": 0,
        "peer_inbound_write_bytes": peer_in, "peer_inbound_read_bytes": 0,
    })
}

fn nvme(peer_out: u64, ram: u64) -> Value {
    json!({"dma": {"dma_peer_write_bytes": peer_out, "dma_message_write_bytes": 0,
                   "dma_mmap_write_bytes": ram}})
}

fn run_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-ctl-provenance-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ctl(run: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_p2plab-ctl"))
        .arg(run)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Catches: a provenance command whose exit status does not carry the
/// verdict (0 for real P2P, 1 for a bounce through guest RAM or too few
/// P2P bytes, 2 when it cannot tell), marks that do not cover every server
/// of the run, and a JSON answer that disagrees with the words.
#[test]
fn the_exit_status_is_the_verdict() {
    let run = run_dir();
    let gpu0 = Arc::new(Canned(Mutex::new(gpu(0, 0))));
    let nvme0 = Arc::new(Canned(Mutex::new(nvme(0, 0))));
    let serve = |name: &str, handler: Arc<Canned>| {
        let sockets = ControlSockets {
            host: run.join(format!("{name}.ctl")),
            guest: None,
        };
        ControlServer::start(&sockets, Arc::new(Dispatcher::new(handler))).unwrap()
    };
    let _g = serve("gpu0", gpu0.clone());
    let _n = serve("nvme0", nvme0.clone());

    let (code, out, err) = ctl(&run, &["mark", "before"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("gpu0, nvme0"), "{out}");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(run.join("marks/before.json")).unwrap()).unwrap();
    assert_eq!(saved["servers"]["nvme0"]["dma"], nvme(0, 0)["dma"]);
    assert!(
        saved["servers"]["gpu0"]["process"]["pid"].is_u64(),
        "{saved}"
    );

    // Real P2P: NVMe wrote 16 MiB straight into VRAM.
    *nvme0.0.lock().unwrap() = nvme(16 << 20, 4096);
    *gpu0.0.lock().unwrap() = gpu(0, 16 << 20);
    let (code, out, _) = ctl(&run, &["provenance", "--since", "before"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("PASS"), "{out}");
    let (code, out, _) = ctl(&run, &["mark", "p2p"]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = ctl(
        &run,
        &[
            "provenance",
            "--since",
            "before",
            "--until",
            "p2p",
            "--min-p2p",
            "17M",
        ],
    );
    assert_eq!(code, 1, "fewer P2P bytes than asked: {out}");

    // A bounce: the same bytes into RAM, then a GPU engine copy.
    *nvme0.0.lock().unwrap() = nvme(16 << 20, (16 << 20) + 4096);
    *gpu0.0.lock().unwrap() = gpu(16 << 20, 16 << 20);
    let (code, out, _) = ctl(&run, &["--json", "provenance", "--since", "p2p"]);
    assert_eq!(code, 1, "{out}");
    let answer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["pass"], false);
    assert_eq!(answer["bounced_bytes"], 16 << 20);
    assert_eq!(answer["devices"][0]["device"], "gpu0");
    assert_eq!(answer["other_ram_dma"]["nvme0"], 16 << 20);

    // Cannot tell: an unknown mark, a bad name, a run that is not one.
    assert_eq!(ctl(&run, &["provenance", "--since", "nope"]).0, 2);
    assert_eq!(ctl(&run, &["provenance", "--since", "../x"]).0, 2);
    assert_eq!(ctl(&run, &["mark", "../x"]).0, 1);
    let (code, _, err) = ctl(&run.join("gpu0.ctl"), &["provenance", "--since", "before"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("run folder"), "{err}");
    let _ = std::fs::remove_dir_all(&run);
}
