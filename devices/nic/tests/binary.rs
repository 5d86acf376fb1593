//! The `p2plab-nic` binary's flags: bad values are refused before
//! anything starts, with a message naming the flag and the bad value.
//!
//! Catches: a server that starts with a wire, MTU or fault spec it cannot
//! honour, or that fails with a message the user cannot act on.

use std::process::Command;

fn refused(args: &[&str], mentions: &[&str]) {
    let dir = std::env::temp_dir().join(format!("p2plab-nic-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_p2plab-nic"))
        .arg("--socket")
        .arg(dir.join("nic.sock"))
        .args(args)
        .output()
        .expect("running p2plab-nic");
    assert!(!out.status.success(), "{args:?} was accepted");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for word in mentions {
        assert!(stderr.contains(word), "{args:?}: {word:?} not in {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_flags_are_refused_by_name() {
    refused(&["--wire", "tcp:1.2.3.4"], &["--wire", "tcp:1.2.3.4"]);
    refused(&["--wire", "listen:"], &["--wire"]);
    refused(&["--mtu", "100"], &["--mtu", "100"]);
    refused(&["--mtu", "lots"], &["--mtu", "lots"]);
    refused(&["--inject", "explode"], &["--inject", "explode"]);
    refused(&["--inject", "drop,count=0"], &["--inject", "count=0"]);
    refused(
        &["--wire", "listen:/nonexistent-dir/wire.sock"],
        &["--wire", "nonexistent-dir"],
    );
}

/// Catches: a key given for a wire that has no use for it (the user meant
/// a TCP wire), or a TCP wire started without its key.
#[test]
fn wire_key_goes_with_a_tcp_wire() {
    refused(&["--wire", "tcp-listen:127.0.0.1:0"], &["--wire-key"]);
    refused(
        &["--wire", "loopback", "--wire-key", "/nonexistent/wire.key"],
        &["--wire-key", "TCP wire"],
    );
}
