//! Helpers for tests that play a hostile peer against a TCP wire (this
//! crate's own, and the device binaries' hostile-peer suites).

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::Duration;

/// Whether the other end closed `stream` within `within`: a read sees the
/// end of the stream or a reset. Bytes it sent first (its HELLO) are
/// skipped. A read that merely times out, or a timeout that cannot be
/// set, is `false`: the connection was kept open.
pub fn closed_by_other_end(stream: &mut TcpStream, within: Duration) -> bool {
    if stream.set_read_timeout(Some(within)).is_err() {
        return false;
    }
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == ErrorKind::ConnectionReset,
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a test's
/// `tcp-listen:` (the kernel picks it; a race with another process taking
/// it in between makes the test fail at bind, loudly).
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free TCP port on 127.0.0.1: {e}"))
}
