//! Where a wire goes (`--wire`) and how it behaves.

use std::path::PathBuf;
use std::time::Duration;

use crate::frame::DEFAULT_MAX_PAYLOAD;

/// How long a send may wait for the peer to read before the wire gives
/// up on it (and closes a socket link), unless told otherwise.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Frames a receiver holds before its sender waits.
pub const QUEUE_FRAMES: usize = 8;

/// How long a TCP connection has to pass the handshake, unless told
/// otherwise.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a device's wire goes (`--wire`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireConfig {
    /// Frames sent come back to the same device.
    Loopback,
    /// Listen on a unix socket at this path for the peer.
    Listen(PathBuf),
    /// Connect to a peer listening at this path (retried until it is
    /// there, and again whenever the link goes down).
    Connect(PathBuf),
    /// Listen on this TCP address (`0.0.0.0:18600`, `[::]:18600`) for a
    /// peer that proves it holds the key (`--wire-key`).
    TcpListen(String),
    /// Connect to a peer listening at this TCP `HOST:PORT` (retried until
    /// it is there, and again whenever the link goes down).
    TcpConnect(String),
}

/// `ADDR:PORT` or `HOST:PORT`, as `tcp-listen:` and `tcp-connect:` take it
/// (a numeric address for listening; IPv6 in brackets).
fn tcp_address(text: &str, listening: bool) -> Result<String, String> {
    if listening {
        return text
            .parse::<std::net::SocketAddr>()
            .map(|_| text.to_owned())
            .map_err(|_| {
                format!("tcp-listen:{text}: expected ADDR:PORT (0.0.0.0:18600, [::1]:18600)")
            });
    }
    let port_ok = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    if port_ok {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "tcp-connect:{text}: expected HOST:PORT (10.0.0.1:18600, lab-b:18600)"
        ))
    }
}

impl std::str::FromStr for WireConfig {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            _ if text == "loopback" => Ok(WireConfig::Loopback),
            Some(("listen", path)) if !path.is_empty() => Ok(WireConfig::Listen(path.into())),
            Some(("connect", path)) if !path.is_empty() => Ok(WireConfig::Connect(path.into())),
            Some(("tcp-listen", addr)) => tcp_address(addr, true).map(WireConfig::TcpListen),
            Some(("tcp-connect", addr)) => tcp_address(addr, false).map(WireConfig::TcpConnect),
            _ => Err(format!(
                "{text:?} is not a wire: loopback, listen:PATH, connect:PATH, \
                 tcp-listen:ADDR:PORT or tcp-connect:HOST:PORT"
            )),
        }
    }
}

impl std::fmt::Display for WireConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireConfig::Loopback => f.write_str("loopback"),
            WireConfig::Listen(path) => write!(f, "listen:{}", path.display()),
            WireConfig::Connect(path) => write!(f, "connect:{}", path.display()),
            WireConfig::TcpListen(addr) => write!(f, "tcp-listen:{addr}"),
            WireConfig::TcpConnect(addr) => write!(f, "tcp-connect:{addr}"),
        }
    }
}

/// How a wire behaves.
#[derive(Debug, Clone)]
pub struct WireOptions {
    /// Longest a send waits for the peer to take the frame. Then the send
    /// fails with [`crate::SendError::TimedOut`] and a socket link is
    /// closed (the peer stopped reading; a stream cut mid-frame cannot be
    /// resumed).
    pub send_timeout: Duration,
    /// Largest payload sent or accepted; a peer that announces a longer
    /// frame is cut off.
    pub max_payload: u32,
    /// Uids besides our own that may be the peer (the server's
    /// `--allow-uid`).
    pub allowed_uids: Vec<u32>,
    /// Frames a receiver holds before its sender waits.
    pub queue_frames: usize,
    /// Name of the wire's thread (`nic-wire`).
    pub thread_name: String,
    /// The pre-shared key file a TCP wire's peer must prove it holds
    /// (`--wire-key`; mode 0600, ours). A TCP wire refuses to start
    /// without one.
    pub key_file: Option<PathBuf>,
    /// How long a TCP connection has to pass the handshake.
    pub handshake_timeout: Duration,
}

impl Default for WireOptions {
    fn default() -> Self {
        Self {
            send_timeout: SEND_TIMEOUT,
            max_payload: DEFAULT_MAX_PAYLOAD,
            allowed_uids: Vec::new(),
            queue_frames: QUEUE_FRAMES,
            thread_name: "wire".into(),
            key_file: None,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a `--wire` value taken that names no wire (or a good one
    /// refused), or one that does not print back as the user wrote it.
    #[test]
    fn wire_flags_parse_and_print_back() {
        assert_eq!("loopback".parse(), Ok(WireConfig::Loopback));
        for text in ["listen:/tmp/w.sock", "connect:/tmp/w.sock", "loopback"] {
            let config: WireConfig = text.parse().unwrap();
            assert_eq!(config.to_string(), text);
        }
        assert_eq!(
            "connect:/tmp/w.sock".parse(),
            Ok(WireConfig::Connect("/tmp/w.sock".into()))
        );
        assert!("listen:".parse::<WireConfig>().is_err());
        assert!("tcp:1.2.3.4".parse::<WireConfig>().is_err());
        for text in [
            "tcp-listen:0.0.0.0:18600",
            "tcp-listen:[::1]:0",
            "tcp-connect:10.77.0.1:18600",
            "tcp-connect:lab-b.example:18600",
            "tcp-connect:[fd00::1]:18600",
        ] {
            let config: WireConfig = text.parse().unwrap();
            assert_eq!(config.to_string(), text);
        }
        assert_eq!(
            "tcp-connect:h:1".parse(),
            Ok(WireConfig::TcpConnect("h:1".into()))
        );
        for bad in [
            "tcp-listen:",
            "tcp-listen:18600",
            "tcp-listen:lab-a:18600",
            "tcp-listen:0.0.0.0:70000",
            "tcp-connect:",
            "tcp-connect:host",
            "tcp-connect::18600",
            "tcp-connect:host:0",
            "tcp-connect:host:x",
        ] {
            assert!(bad.parse::<WireConfig>().is_err(), "{bad} taken");
        }
        assert!("loopback:x".parse::<WireConfig>().is_err());
    }
}
