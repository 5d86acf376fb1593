//! Who may connect: the socket file is created with exactly the configured
//! mode (0600 by default) whatever the umask, and a peer of another uid is
//! refused (SO_PEERCRED) unless allowed. The other uid is a forked child
//! that drops to `nobody`; these tests need root for that and say so
//! otherwise.

mod common;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use p2plab_vfio_user::{DmaSpace, Server, ServerConfig, ShutdownHandle};

/// The umask is per process: tests that set it run one at a time.
static UMASK: Mutex<()> = Mutex::new(());

const NOBODY: u32 = 65534;

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-sock-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Reachable by any uid, so only the socket's own mode decides.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn start(config: ServerConfig) -> (ShutdownHandle, JoinHandle<()>) {
    let server = Server::new(config, DmaSpace::new()).unwrap();
    let stop = server.shutdown_handle();
    // Bound before this returns: the mode is set by then.
    let listener = server.bind().unwrap();
    let thread = std::thread::spawn(move || {
        let mut device = TestDevice::new(server.dma().clone());
        server.serve(listener, &mut device).unwrap();
    });
    (stop, thread)
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Catches a socket created with the umask's leftovers (0777 under umask
/// 000: anyone could connect and drive the device).
#[test]
fn the_socket_gets_exactly_its_mode_whatever_the_umask() {
    let _umask = UMASK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = dir("mode");
    // SAFETY: umask only changes this process's file creation mask.
    let old = unsafe { libc::umask(0) };
    let path = dir.join("open.sock");
    let (stop, thread) = start(ServerConfig::new(&path));
    let default_mode = mode_of(&path);
    stop.shutdown();
    thread.join().unwrap();

    // Widened on purpose, under a strict umask: exactly what was asked.
    // SAFETY: as above.
    unsafe { libc::umask(0o077) };
    let mut config = ServerConfig::new(dir.join("group.sock"));
    config.socket_mode = 0o660;
    let (stop, thread) = start(config);
    let widened = mode_of(&dir.join("group.sock"));
    stop.shutdown();
    thread.join().unwrap();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    assert_eq!(default_mode, 0o600, "socket mode {default_mode:o}");
    assert_eq!(widened, 0o660, "socket mode {widened:o}");
    let _ = std::fs::remove_dir_all(dir);
}

/// What the forked client saw.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Its VERSION got a reply: it was served.
    Served,
    /// Connected, then closed without a reply: refused by the server.
    Closed,
    /// connect() failed with EACCES: the file mode kept it out.
    NoAccess,
    /// Something else went wrong (exit status).
    Other(i32),
}

/// Forks a child that becomes `uid`, connects to `path` and sends a
/// VERSION. Only async-signal-safe calls run in the child.
fn connect_as(uid: u32, path: &Path) -> Outcome {
    // Everything the child needs is built before the fork.
    // SAFETY: `sockaddr_un` is plain data, for which all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *dst = *src as libc::c_char;
    }
    let mut json = br#"{"capabilities":{"max_msg_fds":16}}"#.to_vec();
    json.push(0);
    let payload = Buf::default().u16(0).u16(0).bytes(&json).0;
    let mut msg = Hdr {
        id: 1,
        cmd: cmd::VERSION,
        size: (HDR + payload.len()) as u32,
        flags: 0,
        error: 0,
    }
    .encode()
    .to_vec();
    msg.extend_from_slice(&payload);
    let timeout = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };

    // SAFETY: fork; the child below only makes async-signal-safe calls
    // on data prepared above, and always ends in _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: plain syscalls on local data, then _exit; no allocation,
        // no locks (the child of a threaded process may only do this).
        unsafe {
            if libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                libc::_exit(10);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                libc::_exit(11);
            }
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                let errno = *libc::__errno_location();
                libc::_exit(if errno == libc::EACCES { 2 } else { 12 });
            }
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            // A refused client may see EPIPE here; either way, no reply.
            libc::send(fd, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL);
            let mut reply = [0u8; 16];
            let n = libc::recv(fd, reply.as_mut_ptr().cast(), reply.len(), 0);
            libc::_exit(if n == 16 {
                0
            } else if n == 0 || (n < 0 && *libc::__errno_location() == libc::ECONNRESET) {
                1
            } else {
                13
            });
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: {status:#x}");
    match libc::WEXITSTATUS(status) {
        0 => Outcome::Served,
        1 => Outcome::Closed,
        2 => Outcome::NoAccess,
        other => Outcome::Other(other),
    }
}

fn am_root() -> bool {
    // SAFETY: geteuid has no side effects.
    unsafe { libc::geteuid() == 0 }
}

/// Catches a server that serves any uid that can reach its socket
/// (another user drove BAR0 of the lab's NVMe), or that stops serving
/// after refusing one.
#[test]
fn clients_of_another_uid_are_refused_unless_allowed() {
    if !am_root() {
        eprintln!("skipped: needs root to connect as another uid");
        return;
    }
    let _umask = UMASK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = dir("peer");

    // The default mode already keeps other uids out of the file.
    let path = dir.join("default.sock");
    let (stop, thread) = start(ServerConfig::new(&path));
    assert_eq!(connect_as(NOBODY, &path), Outcome::NoAccess);
    stop.shutdown();
    thread.join().unwrap();

    // A world-writable socket: SO_PEERCRED still refuses them.
    let path = dir.join("open.sock");
    let mut config = ServerConfig::new(&path);
    config.socket_mode = 0o666;
    let (stop, thread) = start(config);
    assert_eq!(connect_as(NOBODY, &path), Outcome::Closed);
    assert_eq!(connect_as(NOBODY, &path), Outcome::Closed);
    // Our own uid is still served after the refusals.
    // SAFETY: geteuid has no side effects.
    let me = unsafe { libc::geteuid() };
    assert_eq!(connect_as(me, &path), Outcome::Served);
    stop.shutdown();
    thread.join().unwrap();

    // --allow-uid lets that uid in.
    let path = dir.join("allowed.sock");
    let mut config = ServerConfig::new(&path);
    config.socket_mode = 0o666;
    config.allowed_uids = vec![NOBODY];
    let (stop, thread) = start(config);
    assert_eq!(connect_as(NOBODY, &path), Outcome::Served);
    stop.shutdown();
    thread.join().unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let _ = std::fs::remove_dir_all(dir);
}

/// The socket file appears only once it listens: it is created under a
/// staging name and renamed into place, so a client that waits for the
/// file and connects at once is never refused, and no staging file is
/// left. Catches a socket file that appears at bind, before listen (a
/// connect in between fails with ECONNREFUSED: the GPU binary's
/// control-socket test was refused exactly so on a loaded CI machine).
/// inotify tells how the name came to be: IN_CREATE at the final name is
/// the race, IN_MOVED_TO is the fix.
#[test]
fn a_socket_file_appears_only_once_it_listens() {
    const IN_CREATE: u32 = 0x100;
    const IN_MOVED_TO: u32 = 0x80;
    let _umask = UMASK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = dir("appear");
    let path = dir.join("s.sock");
    // SAFETY: inotify_init1 creates a new fd from plain flags.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(
        fd >= 0,
        "inotify_init1: {}",
        std::io::Error::last_os_error()
    );
    let cdir = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a watch on a NUL-terminated path with our own fd.
    let wd = unsafe { libc::inotify_add_watch(fd, cdir.as_ptr(), IN_CREATE | IN_MOVED_TO) };
    assert!(
        wd >= 0,
        "inotify_add_watch: {}",
        std::io::Error::last_os_error()
    );

    let listener = p2plab_vfio_user::server::bind_with_mode(&path, 0o600).unwrap();
    std::os::unix::net::UnixStream::connect(&path).expect("connectable");
    assert_eq!(mode_of(&path), 0o600);

    let mut buf = [0u8; 4096];
    // SAFETY: read into our own buffer of its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        n > 0,
        "no inotify event: {}",
        std::io::Error::last_os_error()
    );
    let mut events = Vec::new();
    let mut at = 0usize;
    let header = std::mem::size_of::<libc::inotify_event>();
    while at + header <= n as usize {
        // SAFETY: the kernel wrote a whole inotify_event at `at` (read
        // returns whole events); read_unaligned copes with the alignment.
        let event: libc::inotify_event =
            unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
        let name = &buf[at + header..at + header + event.len as usize];
        let name = String::from_utf8_lossy(name)
            .trim_end_matches('\0')
            .to_owned();
        events.push((event.mask & (IN_CREATE | IN_MOVED_TO), name));
        at += header + event.len as usize;
    }
    // SAFETY: closing our own inotify fd.
    unsafe { libc::close(fd) };
    assert!(
        events.contains(&(IN_MOVED_TO, "s.sock".to_owned())),
        "the socket was not renamed into place: {events:?}"
    );
    assert!(
        !events.contains(&(IN_CREATE, "s.sock".to_owned())),
        "the socket file was created at its final name, before listen: {events:?}"
    );
    drop(listener);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "s.sock")
        .collect();
    assert!(left.is_empty(), "staging files left: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file already at the path is refused, never replaced: bind(2) at an
/// existing name fails, and the rename that now puts the socket there
/// must fail the same way (RENAME_NOREPLACE). Catches a bind that
/// silently overwrites a file that appeared after the stale-socket check.
#[test]
fn an_existing_file_at_the_path_is_refused_not_replaced() {
    let dir = dir("noreplace");
    let path = dir.join("taken.sock");
    std::fs::write(&path, b"somebody's file").unwrap();
    let err = p2plab_vfio_user::server::bind_with_mode(&path, 0o600).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists, "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"somebody's file");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "taken.sock")
        .collect();
    assert!(left.is_empty(), "staging files left: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
