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
use p2plab_server::testing::SpawnedServer;
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

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
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
        wait_until("the peer is taken", || link_up(&server));
        peer.write_all(bytes).unwrap();
        assert!(closed_by_other_end(&mut peer), "not cut off");
        wait_until("the protocol error is counted", || {
            wire_counter(&server.status(), "protocol_errors") == n as u64 + 1
        });
        wait_until("link down", || !link_up(&server));
    }

    // A peer that speaks frames; an intruder meanwhile is refused.
    let mut peer = wire_peer(&wire);
    wait_until("the good peer is taken", || link_up(&server));
    let mut intruder = wire_peer(&wire);
    let _ = intruder.write_all(&Frame::new(vec![0xdd; 64]).encode());
    assert!(closed_by_other_end(&mut intruder), "intruder kept");
    wait_until("the refusal is counted", || {
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
    wait_until("the bad packets are counted", || {
        counter(&server.status(), "bad_packets") == bad.len() as u64
    });
    // A well-formed SEND for a QP that does not exist is answered with an
    // ACK that carries an error status, back to the sender's QP.
    peer.write_all(&Frame::new(good).encode()).unwrap();
    let mut decoder = Decoder::new(DEFAULT_MAX_PAYLOAD);
    let frame = loop {
        if let Some(frame) = decoder.next_frame().unwrap() {
            break frame;
        }
        let mut buf = [0u8; 4096];
        let n = peer.read(&mut buf).expect("the EFA answers");
        assert_ne!(n, 0, "the EFA closed the wire");
        decoder.push(&buf[..n]);
    };
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
    wait_until("link down after the peer left", || !link_up(&server));
    let _peer = wire_peer(&wire);
    wait_until("a new peer is taken", || link_up(&server));

    let log = server.log();
    let exit = server.stop();
    assert!(exit.success(), "the server exited with {exit}:\n{log}");
    assert!(!log.contains("panicked"), "a thread panicked:\n{log}");
    assert!(!wire.exists(), "the wire socket outlived the server");
}
