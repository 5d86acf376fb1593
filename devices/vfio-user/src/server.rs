//! The listening side: configuration, the accept loop, connection
//! lifecycle (reset and DMA cleanup on disconnect) and shutdown.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use tracing::{info, info_span, warn};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::device::Device;
use crate::dma::DmaSpace;
use crate::link::{lock, Link};
use crate::protocol::{MAX_DATA_XFER_LIMIT, MAX_MSG_FDS_LIMIT};
use crate::session::Session;

/// What the server announces and enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
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
    /// Offer REGION_WRITE_MULTI (handled either way).
    pub write_multiple: bool,
    /// Return from [`Server::run`] when the client goes away, instead of
    /// waiting for the next one.
    pub exit_on_disconnect: bool,
}

impl ServerConfig {
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        ServerConfig {
            socket_path: socket_path.into(),
            max_msg_fds: MAX_MSG_FDS_LIMIT,
            max_data_xfer_size: 1 << 20,
            pgsizes: 4096,
            max_dma_maps: 65535,
            write_multiple: true,
            exit_on_disconnect: false,
        }
    }

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
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid server configuration: {0}")]
    Config(String),
    #[error("socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEnd {
    /// The client closed the socket between messages.
    ClientClosed,
    /// [`ShutdownHandle::shutdown`] was called.
    Shutdown,
    /// The client broke the protocol badly enough that the stream cannot
    /// be trusted (impossible header size, EOF inside a message).
    Protocol(String),
    /// A socket error.
    Io(String),
}

struct ShutdownState {
    requested: AtomicBool,
    wake: EventFd,
    active: Mutex<Option<UnixStream>>,
}

/// Stops a running server from any thread: the accept loop returns, and
/// a connection being served is shut down.
#[derive(Clone)]
pub struct ShutdownHandle {
    state: Arc<ShutdownState>,
}

impl std::fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownHandle")
            .field("requested", &self.is_shutdown())
            .finish()
    }
}

impl ShutdownHandle {
    fn new() -> io::Result<Self> {
        Ok(ShutdownHandle {
            state: Arc::new(ShutdownState {
                requested: AtomicBool::new(false),
                wake: EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC)?,
                active: Mutex::new(None),
            }),
        })
    }

    pub fn shutdown(&self) {
        self.state.requested.store(true, Ordering::SeqCst);
        let _ = self.state.wake.write(1);
        if let Some(stream) = lock(&self.state.active).as_ref() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn is_shutdown(&self) -> bool {
        self.state.requested.load(Ordering::SeqCst)
    }
}

/// A vfio-user server for one device, serving one client at a time.
pub struct Server {
    config: ServerConfig,
    dma: DmaSpace,
    shutdown: ShutdownHandle,
}

impl Server {
    /// `dma` is the address space the device model also holds; the server
    /// fills it from DMA_MAP/DMA_UNMAP and attaches the connection to it.
    pub fn new(config: ServerConfig, dma: DmaSpace) -> Result<Self, ServerError> {
        config.validate()?;
        let shutdown = ShutdownHandle::new().map_err(|source| ServerError::Socket {
            path: config.socket_path.clone(),
            source,
        })?;
        Ok(Server {
            config,
            dma,
            shutdown,
        })
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub fn dma(&self) -> &DmaSpace {
        &self.dma
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Binds the socket, replacing a stale socket file (but nothing else).
    /// Once this returns, clients can connect.
    pub fn bind(&self) -> Result<UnixListener, ServerError> {
        let path = &self.config.socket_path;
        let sock_err = |source| ServerError::Socket {
            path: path.clone(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                std::fs::remove_file(path).map_err(sock_err)?;
            }
            Ok(_) => {
                return Err(sock_err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "path exists and is not a socket",
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(sock_err(e)),
        }
        let listener = UnixListener::bind(path).map_err(sock_err)?;
        info!(socket = %path.display(), "listening");
        Ok(listener)
    }

    /// Binds, then serves clients until shutdown (or the first disconnect
    /// with `exit_on_disconnect`). Removes the socket file on return.
    pub fn run(&self, device: &mut dyn Device) -> Result<(), ServerError> {
        let listener = self.bind()?;
        self.serve(listener, device)
    }

    /// Serves clients from an already bound listener, one at a time.
    pub fn serve(
        &self,
        listener: UnixListener,
        device: &mut dyn Device,
    ) -> Result<(), ServerError> {
        let path = self.config.socket_path.clone();
        let result = self.accept_loop(&listener, device);
        drop(listener);
        remove_socket(&path);
        result
    }

    fn accept_loop(
        &self,
        listener: &UnixListener,
        device: &mut dyn Device,
    ) -> Result<(), ServerError> {
        let sock_err = |source| ServerError::Socket {
            path: self.config.socket_path.clone(),
            source,
        };
        loop {
            if self.shutdown.is_shutdown() {
                info!("shutdown requested");
                return Ok(());
            }
            if !wait_readable(listener.as_raw_fd(), self.shutdown.state.wake.as_raw_fd())
                .map_err(sock_err)?
            {
                continue;
            }
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(sock_err(e)),
            };
            info!("client connected");
            let end = self.serve_stream(stream, device);
            if end == ConnectionEnd::Shutdown {
                info!("shutdown requested");
                return Ok(());
            }
            if self.config.exit_on_disconnect {
                info!("exiting after disconnect");
                return Ok(());
            }
            info!("waiting for the next client");
        }
    }

    /// Serves one connected client on the calling thread until it ends,
    /// then resets the device and drops every DMA range of that client.
    /// Works on any connected stream (a socketpair in tests).
    pub fn serve_stream(&self, stream: UnixStream, device: &mut dyn Device) -> ConnectionEnd {
        let span = info_span!("vfio-user", socket = %self.config.socket_path.display());
        let _enter = span.enter();

        let end = match self.prepare(&stream) {
            Ok(link) => {
                let end =
                    Session::new(&self.config, device, &self.dma, &stream, Arc::clone(&link)).run();
                link.close();
                end
            }
            Err(e) => ConnectionEnd::Io(e.to_string()),
        };
        *lock(&self.shutdown.state.active) = None;
        let end = if self.shutdown.is_shutdown() {
            ConnectionEnd::Shutdown
        } else {
            end
        };
        match &end {
            ConnectionEnd::ClientClosed => info!("client disconnected"),
            ConnectionEnd::Shutdown => info!("connection closed for shutdown"),
            ConnectionEnd::Protocol(why) => warn!("connection dropped: protocol error: {why}"),
            ConnectionEnd::Io(why) => warn!("connection dropped: socket error: {why}"),
        }
        // Spec: a client's memory and its state go away with it. Pending
        // DMA fails, ranges are unmapped, the device starts over.
        self.dma.detach();
        device.dma_changed();
        if let Err(e) = device.reset() {
            warn!("device reset after disconnect failed: {e}");
        }
        end
    }

    /// Registers the stream for shutdown and builds its writer half.
    fn prepare(&self, stream: &UnixStream) -> io::Result<Arc<Link>> {
        {
            let mut active = lock(&self.shutdown.state.active);
            *active = Some(stream.try_clone()?);
        }
        if self.shutdown.is_shutdown() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let writer = stream.try_clone()?;
        // A client that stops reading must not block us forever: after
        // this long a write fails and the connection is dropped.
        writer.set_write_timeout(Some(
            self.dma.timeout().max(std::time::Duration::from_secs(1)),
        ))?;
        Ok(Arc::new(Link::new(
            writer,
            thread::current().id(),
            self.config.max_data_xfer_size as usize,
            self.dma.timeout(),
        )))
    }
}

fn remove_socket(path: &Path) {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Waits until `fd` is readable or `wake` is signalled. Returns whether
/// `fd` is readable.
fn wait_readable(fd: i32, wake: i32) -> io::Result<bool> {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        let [listen, wake] = fds;
        if wake.revents != 0 {
            return Ok(false);
        }
        return Ok(listen.revents & libc::POLLIN != 0);
    }
}
