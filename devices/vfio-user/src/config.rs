//! What a server announces and enforces ([`ServerConfig`]), and why
//! setting one up can fail ([`ServerError`]). Both the accept loop and each
//! connection's session read the configuration; it lives here so that
//! neither has to import the other for it.

use std::io;
use std::path::PathBuf;

use crate::protocol::{MAX_DATA_XFER_LIMIT, MAX_MSG_FDS_LIMIT};

/// What the server announces in its VERSION reply and enforces on every
/// message. [`ServerConfig::new`] gives values QEMU 11.1 accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The unix socket the server listens on (QEMU's `socket.path`).
    pub socket_path: PathBuf,
    /// Most fds we accept in one message (1..=16; QEMU refuses more).
    pub max_msg_fds: u32,
    /// Largest data count of a region access or DMA message we accept
    /// (4 KiB..=64 MiB). Our own DMA messages use the smaller of this and
    /// the client's value.
    pub max_data_xfer_size: u32,
    /// Page sizes supported for DMA_MAP; 4096 at least.
    pub pgsizes: u64,
    /// Most DMA ranges mapped at once (1..=65535); more get ENOSPC.
    pub max_dma_maps: u32,
    /// Most of those ranges that come with an fd (each keeps its fd open
    /// and its memory mapped); more get ENOSPC. QEMU sends a handful (guest
    /// RAM split around holes); peer BARs come without an fd.
    pub max_fd_dma_maps: u32,
    /// Most bytes of fd-backed client memory mapped at once, all ranges
    /// together; a DMA_MAP past it gets ENOSPC.
    pub max_dma_mapped_bytes: u64,
    /// Offer REGION_WRITE_MULTI (handled either way).
    pub write_multiple: bool,
    /// Return from [`Server::run`](crate::Server::run) when the client goes
    /// away, instead of waiting for the next one.
    pub exit_on_disconnect: bool,
    /// Permission bits of the socket file (0600: only our uid; the umask
    /// does not apply).
    pub socket_mode: u32,
    /// Peer uids, besides our own effective uid, whose connections are
    /// served (checked with SO_PEERCRED); any other is closed at once.
    pub allowed_uids: Vec<u32>,
    /// Append every inbound message, with a description of its fds, to
    /// this file in the `vfio_user_session` fuzz target's input format
    /// (see [`crate::record`]).
    pub record_session: Option<PathBuf>,
}

impl ServerConfig {
    /// Listens on `socket_path` (mode 0600, our uid only) with 16 fds per
    /// message, 1 MiB transfers (QEMU's own default), 4 KiB pages, 65535
    /// DMA ranges of which 256 with an fd, 1 TiB of fd-backed memory, and
    /// REGION_WRITE_MULTI offered.
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        ServerConfig {
            socket_path: socket_path.into(),
            max_msg_fds: MAX_MSG_FDS_LIMIT,
            max_data_xfer_size: 1 << 20,
            pgsizes: 4096,
            max_dma_maps: 65535,
            max_fd_dma_maps: 256,
            max_dma_mapped_bytes: 1 << 40,
            write_multiple: true,
            exit_on_disconnect: false,
            socket_mode: 0o600,
            allowed_uids: Vec::new(),
            record_session: None,
        }
    }

    /// Checks every limit against what the protocol and QEMU allow, so a
    /// bad value fails at startup, naming the field, instead of in the
    /// client's VERSION handling.
    pub fn validate(&self) -> Result<(), ServerError> {
        let bad = |what: String| Err(ServerError::Config(what));
        if !(1..=MAX_MSG_FDS_LIMIT).contains(&self.max_msg_fds) {
            return bad(format!(
                "max_msg_fds {} not in 1..={MAX_MSG_FDS_LIMIT}",
                self.max_msg_fds
            ));
        }
        if !(4096..=MAX_DATA_XFER_LIMIT).contains(&self.max_data_xfer_size) {
            return bad(format!(
                "max_data_xfer_size {} not in 4096..={MAX_DATA_XFER_LIMIT}",
                self.max_data_xfer_size
            ));
        }
        if self.pgsizes & 4096 == 0 {
            return bad(format!("pgsizes {:#x} lacks 4 KiB", self.pgsizes));
        }
        // QEMU only accepts a server lowering its default of 65535.
        if !(1..=65535).contains(&self.max_dma_maps) {
            return bad(format!(
                "max_dma_maps {} not in 1..=65535",
                self.max_dma_maps
            ));
        }
        if !(1..=u32::from(u16::MAX)).contains(&self.max_fd_dma_maps) {
            return bad(format!(
                "max_fd_dma_maps {} not in 1..=65535",
                self.max_fd_dma_maps
            ));
        }
        if self.max_dma_mapped_bytes == 0 {
            return bad("max_dma_mapped_bytes is 0".into());
        }
        if self.socket_mode & !0o777 != 0 {
            return bad(format!(
                "socket mode {:#o} has bits beyond 0777",
                self.socket_mode
            ));
        }
        Ok(())
    }
}

/// Why a [`Server`](crate::Server) could not be set up or stopped
/// listening.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A [`ServerConfig`] value is out of range; the text names it.
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// Binding, accepting or polling on the socket failed.
    #[error("socket {path}: {source}")]
    Socket {
        /// The socket's path, for the message.
        path: PathBuf,
        /// What the system call returned.
        #[source]
        source: io::Error,
    },
}
