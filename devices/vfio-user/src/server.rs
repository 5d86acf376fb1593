//! The listening side: configuration, the accept loop, connection
//! lifecycle (reset and DMA cleanup on disconnect) and shutdown.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use tracing::{info, info_span, warn};

use crate::record::Recorder;
use p2plab_ratelimit::log_limited;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::config::{ServerConfig, ServerError};
use crate::device::Device;
use crate::dma::DmaSpace;
use crate::link::{lock, Link};
use crate::session::{ConnectionEnd, Session};

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

    /// Asks the server to stop: safe to call from any thread (a signal
    /// thread), any number of times. Returns at once; [`Server::run`]
    /// returns once the device is reset.
    pub fn shutdown(&self) {
        self.state.requested.store(true, Ordering::SeqCst);
        let _ = self.state.wake.write(1);
        if let Some(stream) = lock(&self.state.active).as_ref() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shutdown(&self) -> bool {
        self.state.requested.load(Ordering::SeqCst)
    }
}

/// A vfio-user server for one device, serving one client at a time.
pub struct Server {
    config: ServerConfig,
    dma: DmaSpace,
    shutdown: ShutdownHandle,
    recorder: Option<Recorder>,
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
        let recorder = config
            .record_session
            .as_ref()
            .map(|path| {
                Recorder::create(path).map_err(|e| {
                    ServerError::Config(format!("record_session {}: {e}", path.display()))
                })
            })
            .transpose()?;
        Ok(Server {
            config,
            dma,
            shutdown,
            recorder,
        })
    }

    /// The configuration the server was built with.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The address space DMA_MAP/DMA_UNMAP fill.
    pub fn dma(&self) -> &DmaSpace {
        &self.dma
    }

    /// A handle that stops this server from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Binds the socket, replacing a stale socket file (but nothing else),
    /// with exactly [`ServerConfig::socket_mode`] as its permissions
    /// whatever the umask. Once this returns, clients can connect.
    pub fn bind(&self) -> Result<UnixListener, ServerError> {
        let path = &self.config.socket_path;
        let sock_err = |source| ServerError::Socket {
            path: path.clone(),
            source,
        };
        let listener = bind_replacing_stale(path, self.config.socket_mode).map_err(sock_err)?;
        info!(
            socket = %path.display(),
            mode = format_args!("{:#o}", self.config.socket_mode),
            "listening"
        );
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
                // Too many open files: back off instead of stopping; the
                // fds come back when the current work lets them go.
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    log_limited!(warn, "accept: {e}; retrying");
                    thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
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
            match peer_uid(&stream) {
                Ok(uid) if self.uid_allowed(uid) => info!(uid, "client connected"),
                Ok(uid) => {
                    log_limited!(
                        warn,
                        uid,
                        "refused a client of uid {uid}: only uid {} and --allow-uid may connect",
                        current_uid()
                    );
                    continue;
                }
                Err(e) => {
                    log_limited!(warn, "refused a client whose uid is unknown: {e}");
                    continue;
                }
            }
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

    /// Whether a peer of `uid` may be served: our own effective uid, or
    /// one in [`ServerConfig::allowed_uids`].
    fn uid_allowed(&self, uid: u32) -> bool {
        uid == current_uid() || self.config.allowed_uids.contains(&uid)
    }

    /// Serves one connected client on the calling thread until it ends,
    /// then drops every DMA range of that client (waiting for device
    /// accesses to them to end) and resets the device. Works on any
    /// connected stream (a socketpair in tests); the peer's uid is checked
    /// by the accept loop, not here.
    pub fn serve_stream(&self, stream: UnixStream, device: &mut dyn Device) -> ConnectionEnd {
        let span = info_span!("vfio-user", socket = %self.config.socket_path.display());
        let _enter = span.enter();

        let end = match self.prepare(&stream) {
            Ok(link) => {
                let end = Session::new(
                    &self.config,
                    device,
                    &self.dma,
                    &stream,
                    Arc::clone(&link),
                    self.recorder.as_ref(),
                )
                .run();
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
        // DMA fails, ranges are unmapped once no device access runs in
        // them, and the device starts over; its reset returns once it has
        // quiesced (the Device::reset contract), so nothing it does can
        // reach the next client's memory.
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

/// Our effective uid.
pub fn current_uid() -> u32 {
    // SAFETY: geteuid has no side effects and cannot fail.
    unsafe { libc::geteuid() }
}

/// The uid of the process at the other end of `stream` (SO_PEERCRED: the
/// credentials it had when it connected).
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    // SAFETY: `ucred` is plain data, for which all-zero is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which is
    // that large, and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// [`bind_with_mode`] at `path` after removing a stale socket file there
/// (a server that died leaves one); any other file at `path` is left
/// alone and refused. Every listening socket of p2plab binds through here.
pub fn bind_replacing_stale(path: &Path, mode: u32) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    bind_with_mode(path, mode)
}

/// Binds a listening unix socket at `path` whose file has exactly `mode`.
/// The socket's inode gets `mode` before bind, so the file is never wider
/// than asked even for an instant (bind still applies the umask); a chmod
/// after bind then sets exactly `mode`.
///
/// The socket is bound and listening under a temporary name in the same
/// folder, then renamed to `path`: a client that waits for the file and
/// connects as soon as it appears is never refused (between bind and
/// listen a connect fails with ECONNREFUSED; a unit test of the GPU
/// binary hit exactly that on a loaded CI machine). Where the temporary
/// name would not fit in `sun_path`, it binds at `path` directly.
pub fn bind_with_mode(path: &Path, mode: u32) -> io::Result<UnixListener> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let staging = path
        .parent()
        .map(|dir| dir.join(format!(".p2plab-bind-{}-{n}", std::process::id())));
    if let Some(staging) = staging.filter(|p| fits_sun_path(p)) {
        let _ = std::fs::remove_file(&staging);
        let listener = bind_listen_at(&staging, mode)?;
        if let Err(e) = rename_noreplace(&staging, path) {
            let _ = std::fs::remove_file(&staging);
            return Err(e);
        }
        return Ok(listener);
    }
    bind_listen_at(path, mode)
}

/// rename(2) that fails with EEXIST when `to` exists, as bind(2) failed
/// with EADDRINUSE at an existing path: a file that appeared at `path`
/// since [`bind_replacing_stale`] looked is refused, never replaced.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: renameat2 on two NUL-terminated paths relative to the cwd.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn fits_sun_path(path: &Path) -> bool {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: `sockaddr_un` is plain data, for which all-zero is valid.
    let addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    bytes.len() < addr.sun_path.len() && !bytes.contains(&0)
}

/// socket, fchmod, bind at `path`, chmod, listen.
fn bind_listen_at(path: &Path, mode: u32) -> io::Result<UnixListener> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: `sockaddr_un` is plain data, for which all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if !fits_sun_path(path) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path is longer than {} bytes or holds a NUL",
                addr.sun_path.len() - 1
            ),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: socket() creates a new fd from plain arguments.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just created and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fchmod on our own socket fd only changes its inode's mode.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a valid, NUL-terminated sockaddr_un of `len` bytes.
    if unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let listening =
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .and_then(|()| {
                // SAFETY: listen on our own bound socket.
                if unsafe { libc::listen(fd.as_raw_fd(), 16) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
    if let Err(e) = listening {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(UnixListener::from(fd))
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
