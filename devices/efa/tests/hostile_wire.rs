//! The `p2plab-efa` binary with a hostile fabric peer on its wire, as
//! `devices/nic/tests/hostile_client.rs` attacks the NIC's: bytes that are
//! no frame, frames whose payload is no EFA packet or has a bad checksum,
//! packets for QPs that do not exist, a second peer crowding in. The
//! server must never crash or hang, must cut off what is not a frame,
//! drop what is not a packet, and its counters (its own and the wire's
//! under `wire`) must say what happened. The hostile guest side (admin
//! queue, WQEs, doorbells) is `hostile_guest.rs`; the server runs here as
//! a child process (`p2plab_server::testing::SpawnedServer`).

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use p2plab_efa::frame::{Body, Header, Packet};
use p2plab_kit::testing::wait_until;
use p2plab_server::testing::SpawnedServer;
use p2plab_wire::testing::closed_by_other_end as tcp_closed_by_other_end;
use p2plab_wire::testing::free_tcp_port;
use p2plab_wire::{Decoder, Frame, DEFAULT_MAX_PAYLOAD};

const PATIENCE: Duration = Duration::from_secs(10);
const GID: [u8; 16] = [
    0xfd, 0x00, 0x70, 0x32, 0xef, 0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
];

fn counter(status: &serde_json::Value, name: &str) -> u64 {
    status[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {status}"))
}

fn wire_counter(status: &serde_json::Value, name: &str) -> u64 {
    status["wire"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no wire counter {name} in {status}"))
}

fn closed_by_other_end(stream: &mut UnixStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    match stream.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

fn wire_peer(socket: &Path) -> UnixStream {
    let stream = UnixStream::connect(socket).expect("wire connect");
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// A SEND from another GID to `dst_qp` of the device.
fn send_to(dst_qp: u16) -> Packet {
    let mut src_gid = GID;
    src_gid[15] = 2;
    Packet {
        header: Header {
            src_gid,
            dst_gid: GID,
            src_qp: 1,
            dst_qp,
            qkey: 0x1234,
            msg_id: 7,
        },
        body: Body::Send {
            reliable: true,
            imm: None,
            data: vec![0x5a; 64],
        },
    }
}

/// Catches: an EFA whose wire socket any local user can reach, that dies
/// on bytes that are no frame or on payloads that are no packet (bad
/// magic, bad checksum, cut short), delivers such a payload, lets a
/// second peer take the link, or cannot take a peer again after one was
/// cut off; the EFA's and the wire's counters must say each of these.
#[test]
fn a_hostile_fabric_peer_is_cut_off_refused_and_its_packets_dropped() {
    let server = SpawnedServer::start(
        env!("CARGO_BIN_EXE_p2plab-efa"),
        "efa-hostile-wire",
        |dir| {
            vec![
                "--wire".to_string(),
                format!("listen:{}", dir.join("wire.sock").display()),
                "--gid".to_string(),
                "fd00:7032:efa0::1".to_string(),
                "--keep-alive-ms".to_string(),
                "0".to_string(),
            ]
        },
    );
    let wire = server.dir().join("wire.sock");
    let mode = std::fs::metadata(&wire).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the wire socket is the owner's only");
    let link_up = |server: &SpawnedServer| counter(&server.status(), "link_up") == 1;
    assert!(!link_up(&server), "up with no peer");

    // Bytes that are no frame, and a frame longer than the wire carries:
    // the peer is cut off each time.
    let mut too_long = Frame::new(vec![]).header().to_vec();
    too_long[8..12].copy_from_slice(&(DEFAULT_MAX_PAYLOAD + 1).to_le_bytes());
    for (n, bytes) in [b"\x00\x01no frame at all".to_vec(), too_long]
        .iter()
        .enumerate()
    {
        let mut peer = wire_peer(&wire);
        wait_until("the peer is taken", PATIENCE, || link_up(&server));
        peer.write_all(bytes).unwrap();
        assert!(closed_by_other_end(&mut peer), "not cut off");
        wait_until("the protocol error is counted", PATIENCE, || {
            wire_counter(&server.status(), "protocol_errors") == n as u64 + 1
        });
        wait_until("link down", PATIENCE, || !link_up(&server));
    }

    // A peer that speaks frames; an intruder meanwhile is refused.
    let mut peer = wire_peer(&wire);
    wait_until("the good peer is taken", PATIENCE, || link_up(&server));
    let mut intruder = wire_peer(&wire);
    let _ = intruder.write_all(&Frame::new(vec![0xdd; 64]).encode());
    assert!(closed_by_other_end(&mut intruder), "intruder kept");
    wait_until("the refusal is counted", PATIENCE, || {
        wire_counter(&server.status(), "peers_refused") == 1
    });
    assert!(link_up(&server), "the intruder took the link");

    // Payloads that are no packet: garbage, a packet with one byte
    // flipped (its CRC-32C no longer matches), a packet cut short, an
    // empty payload.
    let good = send_to(9).encode();
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    let bad = [
        b"P2EF but nothing after".to_vec(),
        flipped,
        good[..good.len() / 2].to_vec(),
        Vec::new(),
    ];
    for payload in &bad {
        peer.write_all(&Frame::new(payload.clone()).encode())
            .unwrap();
    }
    wait_until("the bad packets are counted", PATIENCE, || {
        counter(&server.status(), "bad_packets") == bad.len() as u64
    });
    // A well-formed SEND for a QP that does not exist is answered with an
    // ACK that carries an error status, back to the sender's QP.
    peer.write_all(&Frame::new(good).encode()).unwrap();
    let frame = Decoder::new(DEFAULT_MAX_PAYLOAD)
        .read_frame(&mut peer)
        .expect("the EFA answers with a frame");
    assert!(frame.fcs_ok());
    let answer = Packet::decode(&frame.payload).expect("the answer is a packet");
    assert_eq!(answer.header.dst_qp, 1, "{answer:?}");
    assert_eq!(answer.header.src_gid, GID, "{answer:?}");
    match answer.body {
        Body::Ack { status, .. } => assert_ne!(status, 0, "a SEND to no QP acknowledged as done"),
        other => panic!("expected an ACK, got {other:?}"),
    }

    let status = server.status();
    assert_eq!(counter(&status, "recv_wrs"), 0, "{status}");
    assert_eq!(
        counter(&status, "bad_packets"),
        bad.len() as u64,
        "{status}"
    );
    assert_eq!(wire_counter(&status, "protocol_errors"), 2, "{status}");
    assert_eq!(wire_counter(&status, "connections"), 3, "{status}");
    assert_eq!(
        wire_counter(&status, "frames_received"),
        bad.len() as u64 + 1,
        "{status}"
    );

    // The peer leaves; a new one is taken.
    drop(peer);
    wait_until("link down after the peer left", PATIENCE, || {
        !link_up(&server)
    });
    let _peer = wire_peer(&wire);
    wait_until("a new peer is taken", PATIENCE, || link_up(&server));

    let log = server.log();
    let exit = server.stop();
    assert!(exit.success(), "the server exited with {exit}:\n{log}");
    assert!(!log.contains("panicked"), "a thread panicked:\n{log}");
    assert!(!wire.exists(), "the wire socket outlived the server");
}

const TCP_KEY: &str = "6b1f0e3d2c5a4978b6e1d0c3f2a59487b6e1d0c3f2a59487b6e1d0c3f2a59487";

/// Catches: an EFA whose TCP wire gives the link to a peer without the
/// key (a wrong key, garbage, a slowloris that never finishes), keeps a
/// stranger's connection open past the handshake timeout, lets an
/// authenticated peer's oversized frame through, or does not carry an
/// authenticated peer's packets to the device; and one that starts with a
/// key file others may read, or a TCP wire without a key.
#[test]
fn a_hostile_tcp_peer_is_refused_unless_it_proves_the_key() {
    use p2plab_wire::tcp::authenticate;
    use p2plab_wire::{Role, TcpOptions, WireKey};
    use std::net::TcpStream;

    // Start-up refusals: a key file others may read, no key at all.
    let dir = std::env::temp_dir().join(format!("p2plab-efa-tcp-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let loose = dir.join("loose.key");
    std::fs::write(&loose, TCP_KEY).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    for (extra, says) in [
        (vec!["--wire-key", loose.to_str().unwrap()], "chmod 600"),
        (vec![], "--wire-key"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_p2plab-efa"))
            .arg("--socket")
            .arg(dir.join("efa.sock"))
            .args(["--wire", "tcp-listen:127.0.0.1:0"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started with a bad key setup");
        assert!(stderr.contains(says), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();

    let port = free_tcp_port();
    let addr = format!("127.0.0.1:{port}");
    let server = SpawnedServer::start(env!("CARGO_BIN_EXE_p2plab-efa"), "efa-hostile-tcp", |dir| {
        let key = dir.join("wire.key");
        std::fs::write(&key, format!("{TCP_KEY}\n")).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        vec![
            "--wire".to_string(),
            format!("tcp-listen:{addr}"),
            "--wire-key".to_string(),
            key.display().to_string(),
            "--gid".to_string(),
            "fd00:7032:efa0::1".to_string(),
            "--keep-alive-ms".to_string(),
            "0".to_string(),
        ]
    });
    let link_up = |server: &SpawnedServer| counter(&server.status(), "link_up") == 1;
    let refused = |server: &SpawnedServer| wire_counter(&server.status(), "peers_refused");
    let options =
        |key: &str| TcpOptions::new(WireKey::from_bytes(key.as_bytes().to_vec()).unwrap());

    // A peer with another key: the handshake fails on both ends.
    let stream = TcpStream::connect(&addr).unwrap();
    let other = TCP_KEY.replace('6', "7");
    let err = authenticate(stream, Role::Dialer, &options(&other)).unwrap_err();
    assert!(err.contains("does not match our key"), "{err}");
    wait_until("the wrong key is counted", PATIENCE, || {
        refused(&server) == 1
    });

    // Garbage: cut off at once.
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").unwrap();
    garbage.write_all(&[0u8; 64]).unwrap();
    assert!(tcp_closed_by_other_end(
        &mut garbage,
        Duration::from_secs(3)
    ));
    wait_until("the garbage is counted", PATIENCE, || refused(&server) == 2);

    // A slowloris: a few bytes, then silence; cut off at the handshake
    // timeout (5 s).
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"P2WH").unwrap();
    let start = Instant::now();
    assert!(
        tcp_closed_by_other_end(&mut slow, Duration::from_secs(10)),
        "the slowloris kept its connection"
    );
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    wait_until("the slowloris is counted", PATIENCE, || {
        refused(&server) == 3
    });
    assert!(!link_up(&server), "a peer without the key got the link");

    // A peer with the key gets the link; its oversized frame cuts it off.
    let mut peer = authenticate(
        TcpStream::connect(&addr).unwrap(),
        Role::Dialer,
        &options(TCP_KEY),
    )
    .unwrap();
    wait_until("the peer with the key is taken", PATIENCE, || {
        link_up(&server)
    });
    let mut too_long = Frame::new(vec![]).header().to_vec();
    too_long[8..12].copy_from_slice(&(DEFAULT_MAX_PAYLOAD + 1).to_le_bytes());
    peer.write_all(&too_long).unwrap();
    assert!(
        tcp_closed_by_other_end(&mut peer, Duration::from_secs(5)),
        "not cut off"
    );
    wait_until("the protocol error is counted", PATIENCE, || {
        wire_counter(&server.status(), "protocol_errors") == 1
    });

    // Another with the key: its SEND to no QP reaches the device, whose
    // error ACK comes back over TCP.
    let mut peer = authenticate(
        TcpStream::connect(&addr).unwrap(),
        Role::Dialer,
        &options(TCP_KEY),
    )
    .unwrap();
    wait_until("the next peer is taken", PATIENCE, || link_up(&server));
    peer.write_all(&Frame::new(send_to(9).encode()).encode())
        .unwrap();
    peer.set_read_timeout(Some(PATIENCE)).unwrap();
    let frame = Decoder::new(DEFAULT_MAX_PAYLOAD)
        .read_frame(&mut peer)
        .expect("the EFA answers with a frame");
    let answer = Packet::decode(&frame.payload).expect("the answer is a packet");
    assert!(
        matches!(answer.body, Body::Ack { status, .. } if status != 0),
        "{answer:?}"
    );
    // The server counts a frame as sent once its write returns, which can
    // be after the peer has read it: wait for the count, do not sample it.
    wait_until("the answer is counted as sent", PATIENCE, || {
        wire_counter(&server.status(), "frames_sent") == 1
    });
    let status = server.status();
    assert_eq!(wire_counter(&status, "connections"), 2, "{status}");
    assert_eq!(wire_counter(&status, "frames_received"), 1, "{status}");
    assert_eq!(wire_counter(&status, "frames_sent"), 1, "{status}");

    let log = server.log();
    assert!(
        log.contains("does not match our key"),
        "no log line for the wrong key:\n{log}"
    );
    assert!(
        log.contains("no handshake within"),
        "no log line for the slowloris:\n{log}"
    );
    let exit = server.stop();
    assert!(exit.success(), "the server exited with {exit}:\n{log}");
    assert!(!log.contains("panicked"), "a thread panicked:\n{log}");
}
