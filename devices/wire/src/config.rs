//! Where a wire goes (`--wire`) and how it behaves.

use std::path::PathBuf;
use std::time::Duration;

use crate::frame::DEFAULT_MAX_PAYLOAD;

/// How long a send may wait for the peer to read before the wire gives
/// up on it (and closes a socket link), unless told otherwise.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Frames a receiver holds before its sender waits.
pub const QUEUE_FRAMES: usize = 8;

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
}

impl std::str::FromStr for WireConfig {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            _ if text == "loopback" => Ok(WireConfig::Loopback),
            Some(("listen", path)) if !path.is_empty() => Ok(WireConfig::Listen(path.into())),
            Some(("connect", path)) if !path.is_empty() => Ok(WireConfig::Connect(path.into())),
            _ => Err(format!(
                "{text:?} is not a wire: loopback, listen:PATH or connect:PATH"
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
}

impl Default for WireOptions {
    fn default() -> Self {
        Self {
            send_timeout: SEND_TIMEOUT,
            max_payload: DEFAULT_MAX_PAYLOAD,
            allowed_uids: Vec::new(),
            queue_frames: QUEUE_FRAMES,
            thread_name: "wire".into(),
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
        assert!("loopback:x".parse::<WireConfig>().is_err());
    }
}
