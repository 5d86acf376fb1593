//! Two wire ends over a real unix socket, and raw peers that misbehave:
//! ones that never read, write garbage, or crowd in while a peer is
//! connected. Nothing here needs a device.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_wire::{Frame, Impairment, SendError, Sent, Wire, WireConfig, WireOptions, HOLD_LIMIT};

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-wire-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn listen(path: &std::path::Path, options: WireOptions) -> Wire {
    Wire::open(&WireConfig::Listen(path.to_path_buf()), options).unwrap()
}

fn never() -> bool {
    false
}

/// Whether the other end closed `stream` (a read sees the end, or a
/// reset when it closed with our bytes unread), as opposed to a read
/// that merely timed out.
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

/// A raw peer: connects and waits until the wire has taken it.
fn raw_peer(path: &std::path::Path, wire: &Wire) -> UnixStream {
    let before = wire.stats().connections;
    let stream = UnixStream::connect(path).unwrap();
    wait_until("the wire takes the raw peer", 5, || {
        wire.stats().connections > before && wire.link_up()
    });
    stream
}

/// Catches: frames lost, reordered or altered on the socket, a link that
/// never comes up or never goes down, or a wire that cannot take its
/// peer back after it went away.
#[test]
fn two_ends_over_a_unix_socket_and_a_reconnect() {
    let dir = dir("pair");
    let path = dir.join("wire.sock");
    let a = listen(&path, WireOptions::default());
    let b = Wire::open(&WireConfig::Connect(path.clone()), WireOptions::default()).unwrap();
    wait_until("link up", 10, || a.link_up() && b.link_up());
    for i in 0..20u8 {
        let payload = vec![i; 1000 + usize::from(i) * 3000];
        assert_eq!(
            a.send(Frame::new(payload.clone()), &never),
            Ok(Sent::Delivered)
        );
        let got = b.recv_timeout(Duration::from_secs(5)).expect("frame");
        assert_eq!(got.payload, payload);
        assert!(got.fcs_ok());
        assert_eq!(got.seq, u32::from(i));
    }
    b.send(Frame::new(b"back".to_vec()), &never).unwrap();
    assert_eq!(
        a.recv_timeout(Duration::from_secs(5)).unwrap().payload,
        b"back"
    );
    drop(b);
    wait_until("link down", 10, || !a.link_up());
    assert_eq!(
        a.send(Frame::new(vec![1]), &never),
        Err(SendError::LinkDown)
    );
    // The peer comes back: taken again.
    let b = Wire::open(&WireConfig::Connect(path.clone()), WireOptions::default()).unwrap();
    wait_until("link up again", 10, || a.link_up() && b.link_up());
    a.send(Frame::new(vec![7; 10]), &never).unwrap();
    assert_eq!(
        b.recv_timeout(Duration::from_secs(5)).unwrap().payload,
        vec![7; 10]
    );
    let s = a.stats();
    assert_eq!(
        (s.connections, s.frames_sent, s.frames_received),
        (2, 21, 1)
    );
    assert_eq!(
        (s.protocol_errors, s.peers_refused, s.fcs_errors),
        (0, 0, 0)
    );
    drop((a, b));
    assert!(!path.exists(), "the listener removes its socket");
}

/// Catches: a wire whose receiver drops or reorders frames when it is
/// slow (the sender must wait instead: flow control), or a sender that
/// does not wait.
#[test]
fn a_slow_receiver_makes_the_sender_wait_without_losing_frames() {
    let dir = dir("flow");
    let path = dir.join("wire.sock");
    let a = listen(&path, WireOptions::default());
    let b = Wire::open(&WireConfig::Connect(path), WireOptions::default()).unwrap();
    wait_until("link up", 10, || a.link_up() && b.link_up());
    let frames = 200u32;
    let sender = std::thread::spawn(move || {
        for i in 0..frames {
            a.send(Frame::new(vec![i as u8; 64 << 10]), &never).unwrap();
        }
        a
    });
    // Far more than the queue and the socket buffers hold: the sender
    // must be waiting now.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!sender.is_finished(), "13 MiB went nowhere");
    for i in 0..frames {
        let got = b.recv_timeout(Duration::from_secs(10)).expect("frame");
        assert_eq!((got.seq, got.payload[0]), (i, i as u8));
    }
    let a = sender.join().unwrap();
    assert_eq!(a.stats().frames_sent, u64::from(frames));
    assert_eq!(b.stats().out_of_order, 0);
}

/// Catches: a send that waits forever for a peer that stopped reading
/// (the device's TX engine wedged for good). The send must fail after the
/// timeout, say so in the counters, and close the connection (the peer
/// got part of a frame and could never find the next one).
#[test]
fn a_peer_that_never_reads_times_the_send_out() {
    let dir = dir("timeout");
    let path = dir.join("wire.sock");
    let options = WireOptions {
        send_timeout: Duration::from_millis(300),
        ..WireOptions::default()
    };
    let wire = listen(&path, options);
    let mut peer = raw_peer(&path, &wire);
    let start = Instant::now();
    let mut result = Ok(Sent::Delivered);
    for _ in 0..100 {
        result = wire.send(Frame::new(vec![0; 256 << 10]), &never);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(result, Err(SendError::TimedOut));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let s = wire.stats();
    assert_eq!(s.send_timeouts, 1);
    assert!(!wire.link_up());
    // The peer sees the connection end once it drains what was sent.
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sink = Vec::new();
    assert!(
        peer.read_to_end(&mut sink).is_ok(),
        "the connection was not closed"
    );
    assert_eq!(
        wire.send(Frame::new(vec![1]), &never),
        Err(SendError::LinkDown)
    );
}

/// Catches: a device that cannot get its TX engine back from a send to a
/// peer that stopped reading (the NIC's TX stayed stuck across resets):
/// `give_up` must end the send within a few slices even though the send
/// timeout is far away.
#[test]
fn giving_up_ends_a_send_blocked_on_a_peer_that_never_reads() {
    let dir = dir("giveup");
    let path = dir.join("wire.sock");
    let options = WireOptions {
        send_timeout: Duration::from_secs(600),
        ..WireOptions::default()
    };
    let wire = Arc::new(listen(&path, options));
    let _peer = raw_peer(&path, &wire);
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (wire, stop) = (Arc::clone(&wire), Arc::clone(&stop));
        std::thread::spawn(move || loop {
            let give_up = || stop.load(Ordering::SeqCst);
            if let Err(e) = wire.send(Frame::new(vec![0; 256 << 10]), &give_up) {
                return e;
            }
        })
    };
    wait_until("the sender blocks", 10, || {
        let sent = wire.stats().frames_sent;
        std::thread::sleep(Duration::from_millis(200));
        wire.stats().frames_sent == sent
    });
    let asked = Instant::now();
    stop.store(true, Ordering::SeqCst);
    wait_until("the send gives up", 2, || sender.is_finished());
    assert_eq!(sender.join().unwrap(), SendError::Stopped);
    assert!(asked.elapsed() < Duration::from_secs(1));
    let s = wire.stats();
    assert_eq!((s.sends_abandoned, s.send_timeouts), (1, 0));
}

/// Catches: a wire that takes garbage as frames, crashes or hangs on it,
/// or never takes a good peer again after a bad one.
#[test]
fn a_peer_writing_garbage_is_cut_off_and_the_next_peer_is_served() {
    let dir = dir("garbage");
    let path = dir.join("wire.sock");
    let wire = listen(&path, WireOptions::default());
    let garbage: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\n\r\n",
        &{
            let mut h = Frame::new(vec![1; 8]).encode();
            h[4] = 9; // version 9
            h
        },
        &{
            let mut h = Frame::new(vec![]).header().to_vec();
            h[8..12].copy_from_slice(&u32::MAX.to_le_bytes()); // 4 GiB frame
            h
        },
        &{
            let mut h = Frame::new(vec![]).header().to_vec();
            h[6] = 0x80; // a flag no version defines
            h
        },
    ];
    for (i, bytes) in garbage.iter().enumerate() {
        let mut peer = raw_peer(&path, &wire);
        peer.write_all(bytes).unwrap();
        wait_until("the garbage peer is cut off", 5, || {
            wire.stats().protocol_errors == i as u64 + 1
        });
        assert!(closed_by_other_end(&mut peer), "still connected");
        wait_until("link down", 5, || !wire.link_up());
    }
    assert!(wire.recv_timeout(Duration::from_millis(50)).is_none());
    // A well-behaved peer after them.
    let mut peer = raw_peer(&path, &wire);
    let mut frame = Frame::new(b"fine".to_vec());
    frame.seq = 1;
    peer.write_all(&frame.encode()).unwrap();
    let got = wire.recv_timeout(Duration::from_secs(5)).expect("frame");
    assert_eq!(got, frame);
    assert_eq!(wire.stats().frames_received, 1);
}

/// Catches: a wire that lets anyone take over the link while a peer is
/// connected (the first connector wins), or that refuses silently.
#[test]
fn a_second_peer_is_refused_while_the_first_is_connected() {
    let dir = dir("second");
    let path = dir.join("wire.sock");
    let wire = listen(&path, WireOptions::default());
    let mut first = raw_peer(&path, &wire);
    for n in 1..=3u64 {
        let mut intruder = UnixStream::connect(&path).unwrap();
        let mut frame = Frame::new(b"intruder".to_vec());
        frame.seq = 99;
        let _ = intruder.write_all(&frame.encode());
        assert!(closed_by_other_end(&mut intruder), "not closed");
        wait_until("the refusal is counted", 5, || {
            wire.stats().peers_refused == n
        });
    }
    assert!(wire.link_up(), "the first peer lost the link");
    first
        .write_all(&Frame::new(b"first".to_vec()).encode())
        .unwrap();
    let got = wire.recv_timeout(Duration::from_secs(5)).expect("frame");
    assert_eq!(got.payload, b"first");
    assert!(wire.recv_timeout(Duration::from_millis(100)).is_none());
    assert_eq!(wire.stats().connections, 1);
}

/// Catches: injected reordering that does not reorder (or loses the held
/// frame), drops that deliver, corruption the receiver does not see, a
/// delay that does not hold the frame, or counters that miss any of them.
#[test]
fn faults_drop_delay_corrupt_and_reorder_over_the_socket() {
    let dir = dir("faults");
    let path = dir.join("wire.sock");
    let a = listen(&path, WireOptions::default());
    let b = Wire::open(&WireConfig::Connect(path), WireOptions::default()).unwrap();
    wait_until("link up", 10, || a.link_up() && b.link_up());
    let send = |tag: u8, impairment: Impairment| {
        a.send_impaired(Frame::new(vec![tag; 100]), impairment, &never)
    };
    let reorder = |n| Impairment {
        reorder: n,
        ..Impairment::NONE
    };
    assert_eq!(send(1, reorder(2)), Ok(Sent::Held));
    assert_eq!(send(2, Impairment::NONE), Ok(Sent::Delivered));
    assert_eq!(
        send(
            3,
            Impairment {
                drop: true,
                ..Impairment::NONE
            }
        ),
        Ok(Sent::Dropped)
    );
    assert_eq!(
        send(
            4,
            Impairment {
                corrupt: true,
                ..Impairment::NONE
            }
        ),
        Ok(Sent::Delivered)
    );
    let start = Instant::now();
    let delay = Impairment {
        delay: Some(Duration::from_millis(200)),
        ..Impairment::NONE
    };
    assert_eq!(send(5, delay), Ok(Sent::Delivered));
    assert!(start.elapsed() >= Duration::from_millis(200));
    let mut got = Vec::new();
    while let Some(frame) = b.recv_timeout(Duration::from_millis(300)) {
        got.push((frame.payload[0], frame.fcs_ok()));
    }
    assert_eq!(got, [(2, true), (4, false), (1, true), (5, true)]);
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.reorders, sa.drops, sa.corrupts, sa.delays),
        (1, 1, 1, 1)
    );
    assert_eq!((sa.frames_sent, sb.frames_received), (4, 4));
    assert_eq!((sb.fcs_errors, sb.out_of_order), (1, 1));
    // A held frame that nothing follows goes out late, not never.
    assert_eq!(send(6, reorder(5)), Ok(Sent::Held));
    let held_at = Instant::now();
    let frame = b
        .recv_timeout(Duration::from_secs(5))
        .expect("the held frame");
    assert_eq!(frame.payload[0], 6);
    assert!(held_at.elapsed() >= HOLD_LIMIT - Duration::from_millis(5));
}
