//! Two wire ends over TCP on the loopback interface, and hostile peers:
//! a wrong key, no key at all (garbage), a slowloris, a crowd of silent
//! connections, an oversized frame after a valid handshake, a second
//! peer, and hostile listeners for the dialing side. Nothing here needs a
//! device.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use p2plab_wire::handshake::HELLO_LEN;
use p2plab_wire::tcp::{authenticate, MAX_HANDSHAKES};
use p2plab_wire::testing::closed_by_other_end;
use p2plab_wire::{
    Frame, Role, Sent, TcpOptions, TcpTransport, Wire, WireConfig, WireKey, WireOptions,
};

const KEY: &str = "3f5c0a1e9b7d4c2a8e6f1b3d5c7a9e0f2b4d6f8a1c3e5b7d9f0a2c4e6b8d0f1a";
const OTHER_KEY: &str = "00000000000000000000000000000000000000000000000000000000000000ff";

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-wire-tcp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn key_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn never() -> bool {
    false
}

fn options(key: &Path) -> WireOptions {
    WireOptions {
        key_file: Some(key.to_path_buf()),
        handshake_timeout: Duration::from_secs(1),
        ..WireOptions::default()
    }
}

/// A listening wire on 127.0.0.1 (a port the kernel picks) and its address.
fn listen(key: &Path, wire_options: WireOptions) -> (Wire, SocketAddr) {
    let mut tcp = TcpOptions::new(WireKey::load(key).unwrap());
    tcp.handshake_timeout = wire_options.handshake_timeout;
    let transport = TcpTransport::listen("127.0.0.1:0", tcp).unwrap();
    let addr = transport.local_addr().unwrap();
    (Wire::over(Box::new(transport), wire_options).unwrap(), addr)
}

fn connect(addr: SocketAddr, key: &Path) -> Wire {
    Wire::open(&WireConfig::TcpConnect(addr.to_string()), options(key)).unwrap()
}

/// Sends one frame from `from` and checks `to` gets it whole.
fn exchange(from: &Wire, to: &Wire, payload: Vec<u8>) {
    assert_eq!(
        from.send(Frame::new(payload.clone()), &never),
        Ok(Sent::Delivered)
    );
    let got = to.recv_timeout(Duration::from_secs(5)).expect("a frame");
    assert_eq!(got.payload, payload);
    assert!(got.fcs_ok());
}

/// A raw client that passes the handshake with `key`.
fn authenticated_raw(addr: SocketAddr, key: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    let tcp = TcpOptions::new(WireKey::from_bytes(key.as_bytes().to_vec()).unwrap());
    authenticate(stream, Role::Dialer, &tcp).unwrap()
}

/// Catches: frames lost or altered over TCP, a link that never comes up
/// with the right key on both ends, or a listener that cannot take its
/// peer back after the peer went away (reconnect after a drop).
#[test]
fn two_ends_over_tcp_with_one_key_and_a_reconnect() {
    let dir = dir("pair");
    let key = key_file(&dir, "wire.key", KEY, 0o600);
    let (a, addr) = listen(&key, options(&key));
    let b = connect(addr, &key);
    wait_until("link up", 10, || a.link_up() && b.link_up());
    for i in 0..10u8 {
        exchange(&a, &b, vec![i; 100 + usize::from(i) * 70_000]);
        exchange(&b, &a, vec![!i; 1 + usize::from(i)]);
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.frames_sent, sa.frames_received), (10, 10));
    assert_eq!((sb.frames_sent, sb.frames_received), (10, 10));
    assert_eq!(sa.bytes_sent, sb.bytes_received);
    assert_eq!((sa.connections, sa.peers_refused), (1, 0));

    // The dialing lab goes away and comes back.
    drop(b);
    wait_until("the listener sees the drop", 10, || !a.link_up());
    let b = connect(addr, &key);
    wait_until("link up again", 10, || a.link_up() && b.link_up());
    exchange(&b, &a, b"after the reconnect".to_vec());
    assert_eq!(a.stats().connections, 2);
}

/// Catches: a peer with another key (either end) getting the link, a
/// refusal that is not counted, or a refused peer that keeps the right
/// one out.
#[test]
fn a_wrong_key_is_refused_both_ways() {
    let dir = dir("wrong");
    let key = key_file(&dir, "wire.key", KEY, 0o600);
    let other = key_file(&dir, "other.key", OTHER_KEY, 0o600);
    let (a, addr) = listen(&key, options(&key));
    let intruder = connect(addr, &other);
    wait_until("the listener refuses the intruder", 10, || {
        a.stats().peers_refused >= 1 && intruder.stats().peers_refused >= 1
    });
    assert!(!a.link_up() && !intruder.link_up());
    assert_eq!(a.stats().connections, 0);
    drop(intruder);
    let b = connect(addr, &key);
    wait_until("the right peer gets the link", 10, || {
        a.link_up() && b.link_up()
    });
    exchange(&a, &b, b"ok".to_vec());
}

/// Catches: a listener that gives the link (or a thread forever) to a
/// peer that is not a p2plab wire at all, or that is slowed by one.
#[test]
fn garbage_is_cut_off_at_its_first_bytes() {
    let dir = dir("garbage");
    let key = key_file(&dir, "wire.key", KEY, 0o600);
    let (a, addr) = listen(&key, options(&key));
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: lab\r\n\r\n0123456789abc")
        .unwrap();
    let start = Instant::now();
    assert!(
        closed_by_other_end(&mut raw, Duration::from_secs(5)),
        "garbage kept open"
    );
    assert!(
        start.elapsed() < Duration::from_millis(900),
        "not cut at once"
    );
    wait_until("counted", 5, || a.stats().peers_refused == 1);
    assert!(!a.link_up());
    assert_eq!(a.stats().protocol_errors, 0, "never reached the framing");
    // Fewer bytes than a HELLO, and the connection kept open: refused on
    // its first 4 bytes, not at the handshake timeout.
    let mut short = TcpStream::connect(addr).unwrap();
    short.write_all(b"SSH-").unwrap();
    let start = Instant::now();
    assert!(
        closed_by_other_end(&mut short, Duration::from_secs(5)),
        "short garbage kept open"
    );
    assert!(
        start.elapsed() < Duration::from_millis(900),
        "not cut at once"
    );
    wait_until("counted", 5, || a.stats().peers_refused == 2);
}

/// Catches: a handshake with no time bound (a slowloris holds a thread
/// and the port forever), a link thread that waits on a stranger's
/// handshake (the real peer's frames stall), or no cap on handshakes at
/// once.
#[test]
fn slowloris_and_silent_crowds_are_bounded() {
    let dir = dir("slow");
    let key = key_file(&dir, "wire.key", KEY, 0o600);
    let (a, addr) = listen(&key, options(&key));
    let b = connect(addr, &key);
    wait_until("link up", 10, || a.link_up() && b.link_up());

    // A trickler: a valid-looking HELLO, one byte every 100 ms.
    let trickler = {
        let mut stream = TcpStream::connect(addr).unwrap();
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut hello = vec![0u8; HELLO_LEN];
            hello[..6].copy_from_slice(b"P2WH\x01\x02");
            for byte in hello {
                if stream.write_all(&[byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (
                closed_by_other_end(&mut stream, Duration::from_secs(5)),
                start.elapsed(),
            )
        })
    };
    // Meanwhile the connected peer's frames flow.
    let start = Instant::now();
    for i in 0..20u8 {
        exchange(&b, &a, vec![i; 4096]);
    }
    assert!(
        start.elapsed() < Duration::from_millis(900),
        "frames stalled"
    );
    let (closed, after) = trickler.join().unwrap();
    assert!(closed, "the trickler was never cut off");
    assert!(
        after < Duration::from_secs(3),
        "cut off after {after:?}, the handshake timeout is 1 s"
    );

    // A crowd that says nothing: MAX_HANDSHAKES are held (for the
    // handshake timeout), the next is closed at once.
    let before = a.stats().peers_refused;
    let mut crowd: Vec<TcpStream> = (0..MAX_HANDSHAKES)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(addr).unwrap();
    let start = Instant::now();
    assert!(closed_by_other_end(&mut extra, Duration::from_secs(5)));
    assert!(start.elapsed() < Duration::from_millis(900));
    for silent in &mut crowd {
        assert!(
            closed_by_other_end(silent, Duration::from_secs(5)),
            "a silent connection kept open"
        );
    }
    wait_until("all counted", 5, || {
        a.stats().peers_refused == before + MAX_HANDSHAKES as u64 + 1
    });
    assert!(a.link_up(), "the real peer kept the link through it all");
    exchange(&a, &b, b"still here".to_vec());
}

/// Catches: a peer that proved the key but then announces a frame over
/// the cap getting it read (or allocated), or keeping the link.
#[test]
fn an_oversized_frame_after_the_handshake_cuts_the_peer_off() {
    let dir = dir("big");
    let key = key_file(&dir, "wire.key", KEY, 0o600);
    let (a, addr) = listen(&key, options(&key));
    let mut raw = authenticated_raw(addr, KEY);
    wait_until("the raw peer gets the link", 5, || a.link_up());
    let header = Frame::new(vec![0; 2 << 20]).encode();
    raw.write_all(&header[..64]).unwrap();
    assert!(closed_by_other_end(&mut raw, Duration::from_secs(5)));
    wait_until("counted", 5, || a.stats().protocol_errors == 1);
    assert!(!a.link_up());
    let b = connect(addr, &key);
    wait_until("the next peer gets the link", 10, || {
        a.link_up() && b.link_up()
    });
}

/// Catches: a second peer (even one with the key) taking the link from
/// the first, or not being counted.
#[test]
fn one_peer_at_a_time() {
    let dir = dir("second");
    let key = key_file(&dir, "wire.key", KEY, 0o600);
    let (a, addr) = listen(&key, options(&key));
    let b = connect(addr, &key);
    wait_until("link up", 10, || a.link_up() && b.link_up());
    let mut second = authenticated_raw(addr, KEY);
    assert!(
        closed_by_other_end(&mut second, Duration::from_secs(5)),
        "a second peer kept open"
    );
    wait_until("counted", 5, || a.stats().peers_refused == 1);
    exchange(&b, &a, b"first peer".to_vec());
    assert_eq!(a.stats().connections, 1);
}

/// Catches: the dialing side trusting a listener that does not prove
/// the key (one that sends garbage, or one that accepts and says
/// nothing), or a wire whose shutdown waits on such a listener.
#[test]
fn hostile_listeners_are_refused_by_the_dialer() {
    let dir = dir("listeners");
    let key = key_file(&dir, "wire.key", KEY, 0o600);
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut held = Vec::new();
        for (i, stream) in fake.incoming().take(2).enumerate() {
            let mut stream = stream.unwrap();
            if i == 0 {
                let _ = stream.write_all(&[0xAA; 200]);
            }
            held.push(stream); // the others: silent
        }
        std::thread::sleep(Duration::from_secs(3));
    });
    let b = connect(addr, &key);
    wait_until("the garbage listener and a silent one refused", 15, || {
        b.stats().peers_refused >= 2
    });
    assert!(!b.link_up());
    assert_eq!(b.stats().connections, 0);
    let start = Instant::now();
    drop(b);
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "the wire's shutdown waited {:?} on a hostile listener",
        start.elapsed()
    );
    server.join().unwrap();
}

/// Catches: a TCP wire that starts without a key, or with a key file
/// others may read, or an error that does not say how to fix it.
#[test]
fn a_tcp_wire_needs_a_private_key_file() {
    let dir = dir("keys");
    let loose = key_file(&dir, "loose.key", KEY, 0o644);
    let err = Wire::open(
        &WireConfig::TcpListen("127.0.0.1:0".into()),
        WireOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("--wire-key"), "{err}");
    let err = Wire::open(
        &WireConfig::TcpListen("127.0.0.1:0".into()),
        options(&loose),
    )
    .unwrap_err();
    assert!(err.to_string().contains("chmod 600"), "{err}");
    let err = Wire::open(
        &WireConfig::TcpConnect("127.0.0.1:9".into()),
        options(&dir.join("missing.key")),
    )
    .unwrap_err();
    assert!(err.to_string().contains("missing.key"), "{err}");
}
