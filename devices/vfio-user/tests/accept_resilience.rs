//! The accept loop survives running out of file descriptors: accept()
//! failing with EMFILE (a process at its open-file limit) used to end
//! `Server::run` with an error, so the device server exited and no client
//! was ever served again. Alone in its test binary: it lowers the
//! process's open-file limit.

mod common;

use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use p2plab_vfio_user::{DmaSpace, Server, ServerConfig};

fn set_soft_limit(soft: u64) -> u64 {
    // SAFETY: `rlimit` is plain data, for which all-zero is valid.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes into a valid rlimit struct.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    let old = limit.rlim_cur;
    limit.rlim_cur = soft;
    // SAFETY: setrlimit reads a valid rlimit struct (soft <= hard).
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(rc, 0);
    old
}

/// The lowest fd number not open now: with the soft limit there, no new
/// fd can be created (the kernel hands out the lowest free number).
fn lowest_free_fd() -> u64 {
    use std::os::fd::AsRawFd;
    let probe = std::fs::File::open("/dev/null").unwrap();
    probe.as_raw_fd() as u64
}

fn connect(stream: &UnixStream, path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: `sockaddr_un` is plain data, for which all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    let rc = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

/// Catches an accept loop that gives up on EMFILE: the server must keep
/// listening and serve the client once fds are available again.
#[test]
fn accept_waits_out_a_full_fd_table() {
    let dir = std::env::temp_dir().join(format!("p2plab-emfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dev.sock");
    let server = Server::new(ServerConfig::new(&path), DmaSpace::new()).unwrap();
    let stop = server.shutdown_handle();
    let listener = server.bind().unwrap();
    let mut device = TestDevice::new(server.dma().clone());
    let serving = std::thread::spawn(move || server.serve(listener, &mut device));
    // The client's socket exists before the limit drops and connects
    // after: accept() then has no fd to give the server's end.
    // SAFETY: socket() creates a new fd from plain arguments.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(raw >= 0);
    // SAFETY: `raw` was just created and nothing else owns it.
    let client = unsafe { <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let old = set_soft_limit(lowest_free_fd());
    assert!(
        std::fs::File::open("/dev/null").is_err(),
        "the limit leaves room for a new fd"
    );
    connect(&client, &path);
    std::thread::sleep(Duration::from_millis(300));
    let finished_early = serving.is_finished();
    set_soft_limit(old);
    assert!(!finished_early, "the server stopped on EMFILE");

    let mut c = RawClient::new(client);
    c.negotiate();
    c.assert_in_sync();
    drop(c);
    stop.shutdown();
    serving.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
