//! Two `p2plab-nic` servers joined by a TCP wire, as two labs on two hosts
//! (or in two network namespaces) join theirs: the same pre-shared key on
//! both ends brings the link up on both; a NIC holding another key never
//! gets it, and the listener counts the refusal.
//!
//! Catches: a NIC binary that refuses or ignores `--wire-key` (a TCP wire
//! that never comes up), or that hands the link to a peer without the key.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use p2plab_kit::testing::wait_until;
use p2plab_server::testing::SpawnedServer;
use p2plab_wire::testing::free_tcp_port;

const KEY: &str = "6b1f0c3a9d7e2f4a8b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a";
const PATIENCE: Duration = Duration::from_secs(10);

fn key_file(dir: &Path, key: &str) -> String {
    let path = dir.join("wire.key");
    std::fs::write(&path, format!("{key}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

fn nic(name: &str, wire: String, key: &'static str) -> SpawnedServer {
    SpawnedServer::start(env!("CARGO_BIN_EXE_p2plab-nic"), name, move |dir| {
        vec![
            "--wire".to_string(),
            wire,
            "--wire-key".to_string(),
            key_file(dir, key),
        ]
    })
}

fn link_up(server: &SpawnedServer) -> bool {
    server.status()["link_up"].as_u64() == Some(1)
}

fn wire_counter(server: &SpawnedServer, name: &str) -> u64 {
    let status = server.status();
    status["wire"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no wire counter {name} in {status}"))
}

#[test]
fn two_nics_over_tcp_need_the_same_key() {
    let addr = format!("127.0.0.1:{}", free_tcp_port());
    let listener = nic("nic-tcp-a", format!("tcp-listen:{addr}"), KEY);
    assert!(!link_up(&listener), "up with no peer");

    // Another key: refused at the handshake, the link stays down.
    let other = KEY.replace('6', "7").leak();
    let stranger = nic("nic-tcp-x", format!("tcp-connect:{addr}"), other);
    wait_until("the stranger is refused", PATIENCE, || {
        wire_counter(&listener, "peers_refused") >= 1
    });
    assert!(!link_up(&listener), "a NIC with another key got the link");
    assert!(!link_up(&stranger), "the stranger thinks it is linked");
    drop(stranger);

    // The same key: up on both ends.
    let dialer = nic("nic-tcp-b", format!("tcp-connect:{addr}"), KEY);
    wait_until("the link comes up on both ends", PATIENCE, || {
        link_up(&listener) && link_up(&dialer)
    });
}
