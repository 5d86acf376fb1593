//! Who may be the wire's peer: the socket file is 0600 whatever the
//! umask, and a peer of another uid is refused (SO_PEERCRED), both ways,
//! unless allowed. The other uid is a forked child that drops to
//! `nobody`; those tests need root and say so otherwise.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use p2plab_wire::{Frame, Wire, WireConfig, WireOptions};

/// The umask is per process: tests that set it run one at a time.
static UMASK: Mutex<()> = Mutex::new(());

const NOBODY: u32 = 65534;

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-wire-acc-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Reachable by any uid, so only the socket's own mode and the peer
    // check decide.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn am_root() -> bool {
    // SAFETY: geteuid has no side effects.
    unsafe { libc::geteuid() == 0 }
}

/// Catches: a wire socket whose mode comes from the umask (0777 under
/// umask 0: any local user could connect and take the link), as the
/// NIC's first wire had it.
#[test]
fn the_socket_is_0600_whatever_the_umask() {
    let _umask = UMASK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = dir("mode");
    for mask in [0, 0o022, 0o077] {
        // SAFETY: umask only changes this process's file creation mask.
        let old = unsafe { libc::umask(mask) };
        let path = dir.join(format!("wire-{mask:o}.sock"));
        let wire = Wire::open(&WireConfig::Listen(path.clone()), WireOptions::default());
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let wire = wire.unwrap();
        assert_eq!(mode_of(&path), 0o600, "under umask {mask:o}");
        drop(wire);
    }
    // Something that is not a socket is never replaced.
    let file = dir.join("file");
    std::fs::write(&file, b"keep").unwrap();
    let err = Wire::open(&WireConfig::Listen(file.clone()), WireOptions::default()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

/// What a forked child saw.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The connection stayed open (the other end kept it).
    Kept,
    /// The other end closed it: refused.
    Closed,
    /// Something else went wrong (exit status).
    Other(i32),
}

fn sockaddr(path: &Path) -> libc::sockaddr_un {
    // SAFETY: `sockaddr_un` is plain data, for which all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *dst = *src as libc::c_char;
    }
    addr
}

/// In a forked child (async-signal-safe calls only): becomes `uid`,
/// sends `frame` on `fd` (connected or accepted by `setup`), then waits
/// up to a second for the other end to close. Never returns.
///
/// # Safety
/// Only in a child of fork.
unsafe fn child_send_and_watch(uid: u32, frame: &[u8], setup: impl Fn() -> i32) -> ! {
    // SAFETY: plain syscalls on data prepared before the fork, then _exit.
    unsafe {
        if libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
            libc::_exit(10);
        }
        let fd = setup();
        if fd < 0 {
            libc::_exit(-fd);
        }
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        libc::send(fd, frame.as_ptr().cast(), frame.len(), libc::MSG_NOSIGNAL);
        let mut byte = [0u8; 1];
        let n = libc::recv(fd, byte.as_mut_ptr().cast(), 1, 0);
        let errno = *libc::__errno_location();
        libc::_exit(if n == 0 || (n < 0 && errno == libc::ECONNRESET) {
            1
        } else if n < 0 && errno == libc::EAGAIN {
            0
        } else {
            13
        });
    }
}

fn wait_child(pid: libc::pid_t) -> Outcome {
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: {status:#x}");
    match libc::WEXITSTATUS(status) {
        0 => Outcome::Kept,
        1 => Outcome::Closed,
        other => Outcome::Other(other),
    }
}

/// A child of `uid` connects to `path` and sends a frame.
fn connect_as(uid: u32, path: &Path) -> Outcome {
    let addr = sockaddr(path);
    let frame = Frame::new(b"from the child".to_vec()).encode();
    // SAFETY: fork; the child only makes async-signal-safe calls on data
    // prepared above, and always ends in _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: we are the child.
        unsafe {
            child_send_and_watch(uid, &frame, || {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if fd < 0 || libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0
                {
                    return -11;
                }
                fd
            })
        }
    }
    wait_child(pid)
}

/// A child of `uid` listens at `path` (mode 0666), accepts one
/// connection and sends a frame on it.
fn listen_as(uid: u32, path: &Path) -> libc::pid_t {
    let addr = sockaddr(path);
    let frame = Frame::new(b"from the listener".to_vec()).encode();
    // SAFETY: as in connect_as.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: we are the child.
        unsafe {
            child_send_and_watch(uid, &frame, || {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                libc::umask(0);
                if fd < 0
                    || libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0
                    || libc::listen(fd, 4) != 0
                {
                    return -11;
                }
                libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut())
            })
        }
    }
    pid
}

/// Catches: a wire that takes a peer of any uid that can reach its socket
/// (another local user feeding frames into the lab's NIC), that refuses
/// silently, or that ignores `--allow-uid`.
#[test]
fn a_peer_of_another_uid_is_refused_unless_allowed() {
    if !am_root() {
        eprintln!("skipped: needs root to connect as another uid");
        return;
    }
    let _umask = UMASK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = dir("uid");
    let path = dir.join("wire.sock");
    let wire = Wire::open(&WireConfig::Listen(path.clone()), WireOptions::default()).unwrap();
    // The file mode alone keeps nobody out; open it up so SO_PEERCRED is
    // what refuses.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(connect_as(NOBODY, &path), Outcome::Closed);
    assert_eq!(connect_as(NOBODY, &path), Outcome::Closed);
    assert_eq!(wire.stats().peers_refused, 2);
    assert_eq!(wire.stats().connections, 0);
    assert!(wire.recv_timeout(Duration::from_millis(100)).is_none());
    drop(wire);

    let options = WireOptions {
        allowed_uids: vec![NOBODY],
        ..WireOptions::default()
    };
    let wire = Wire::open(&WireConfig::Listen(path.clone()), options).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(connect_as(NOBODY, &path), Outcome::Kept);
    let frame = wire
        .recv_timeout(Duration::from_secs(5))
        .expect("the allowed peer's frame");
    assert_eq!(frame.payload, b"from the child");
    assert_eq!(wire.stats().peers_refused, 0);
}

/// Catches: a connecting wire that takes whatever listens at its path
/// (another uid's socket planted there), or that ignores `--allow-uid`.
#[test]
fn a_listener_of_another_uid_is_refused_unless_allowed() {
    if !am_root() {
        eprintln!("skipped: needs root to listen as another uid");
        return;
    }
    let _umask = UMASK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = dir("listener");
    for allowed in [false, true] {
        let path = dir.join(format!("planted-{allowed}.sock"));
        let child = listen_as(NOBODY, &path);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !path.exists() {
            assert!(Instant::now() < deadline, "the child never listened");
            std::thread::sleep(Duration::from_millis(5));
        }
        let options = WireOptions {
            allowed_uids: if allowed { vec![NOBODY] } else { vec![] },
            ..WireOptions::default()
        };
        let wire = Wire::open(&WireConfig::Connect(path.clone()), options).unwrap();
        if allowed {
            let frame = wire.recv_timeout(Duration::from_secs(5)).expect("frame");
            assert_eq!(frame.payload, b"from the listener");
            assert_eq!(wait_child(child), Outcome::Kept);
        } else {
            assert_eq!(wait_child(child), Outcome::Closed);
            assert!(wire.stats().peers_refused >= 1);
            assert_eq!(wire.stats().connections, 0);
            assert!(!wire.link_up());
            assert!(wire.recv_timeout(Duration::from_millis(100)).is_none());
        }
    }
}
