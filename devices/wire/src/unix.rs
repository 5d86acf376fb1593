//! The unix-socket transport: `listen:PATH` binds a socket that is mode
//! 0600 from the bind on, `connect:PATH` dials it; both ends check the
//! other's uid with SO_PEERCRED (our own, or one allowed by the server's
//! `--allow-uid`).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use p2plab_ratelimit::log_limited;
use p2plab_vfio_user::server::{bind_replacing_stale, current_uid, peer_uid};

use crate::transport::{Arrival, Transport};

/// The socket file's mode: only our uid may connect.
pub const SOCKET_MODE: u32 = 0o600;

enum Side {
    Listen(UnixListener),
    Connect,
}

/// One end of a unix-socket wire.
pub struct UnixTransport {
    side: Side,
    path: PathBuf,
    allowed_uids: Vec<u32>,
}

impl UnixTransport {
    /// Binds `path` (replacing a stale socket there, nothing else) with
    /// mode 0600 from the bind on: the socket's inode gets the mode before
    /// `bind` creates the file, so no umask ever makes it wider, not even
    /// for an instant.
    pub fn listen(path: &Path, allowed_uids: &[u32]) -> io::Result<Self> {
        let listener = bind_replacing_stale(path, SOCKET_MODE)?;
        listener.set_nonblocking(true)?;
        Ok(Self {
            side: Side::Listen(listener),
            path: path.to_path_buf(),
            allowed_uids: allowed_uids.to_vec(),
        })
    }

    /// Dials `path` whenever the wire has no peer.
    pub fn connect(path: &Path, allowed_uids: &[u32]) -> Self {
        Self {
            side: Side::Connect,
            path: path.to_path_buf(),
            allowed_uids: allowed_uids.to_vec(),
        }
    }

    /// Where the socket is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection if its other end runs as a uid we allow.
    fn admit(&self, stream: UnixStream, what: &str) -> Arrival {
        let ours = current_uid();
        match peer_uid(&stream) {
            Ok(uid) if uid == ours || self.allowed_uids.contains(&uid) => {
                Arrival::Peer(Box::new(stream), format!("uid {uid}"))
            }
            Ok(uid) => Arrival::Refused(
                format!(
                    "{what} of uid {uid}: only uid {ours} and --allow-uid may be the wire's peer"
                ),
                Some(Box::new(stream)),
            ),
            Err(e) => Arrival::Refused(
                format!("{what} whose uid is unknown (SO_PEERCRED: {e})"),
                Some(Box::new(stream)),
            ),
        }
    }
}

impl Transport for UnixTransport {
    fn describe(&self) -> String {
        match self.side {
            Side::Listen(_) => format!("listen:{}", self.path.display()),
            Side::Connect => format!("connect:{}", self.path.display()),
        }
    }

    fn listen_fd(&self) -> Option<RawFd> {
        match &self.side {
            Side::Listen(listener) => Some(listener.as_raw_fd()),
            Side::Connect => None,
        }
    }

    fn accept(&mut self) -> Arrival {
        let Side::Listen(listener) = &self.side else {
            return Arrival::Nothing;
        };
        match listener.accept() {
            // An accepted socket does not inherit the listener's O_NONBLOCK.
            Ok((stream, _)) => self.admit(stream, "a connection"),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Arrival::Nothing
            }
            Err(e) => {
                // EMFILE and the like: the fds come back; try again later.
                log_limited!(warn, "wire accept on {}: {e}", self.path.display());
                Arrival::Nothing
            }
        }
    }

    fn dial(&mut self) -> Arrival {
        if matches!(self.side, Side::Listen(_)) {
            return Arrival::Nothing;
        }
        match UnixStream::connect(&self.path) {
            Ok(stream) => self.admit(stream, "the listener"),
            // Not listening yet: the peer server is still starting.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Arrival::Nothing
            }
            Err(e) => {
                log_limited!(warn, "wire connect to {}: {e}", self.path.display());
                Arrival::Nothing
            }
        }
    }
}

impl Drop for UnixTransport {
    fn drop(&mut self) {
        if let Side::Listen(_) = self.side {
            if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}
