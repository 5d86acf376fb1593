//! What a received file descriptor really is. A client may send any fd
//! where the protocol expects an eventfd or a memory file; the kernel's
//! own description (`/proc/self/fd/N`) is the only trustworthy answer.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The kind of object behind an fd, as far as the transport cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FdKind {
    /// An eventfd (`anon_inode:[eventfd]`).
    EventFd,
    /// A memfd (`/memfd:<name>`).
    Memfd,
    /// A regular file on a file system.
    File,
    /// A pipe end.
    Pipe,
    /// A socket.
    Socket,
    /// Anything else (another anonymous inode, a device node...): what
    /// the kernel calls it.
    Other(String),
}

/// What `/proc/self/fd/N` points to for `fd`.
pub fn fd_target(fd: BorrowedFd<'_>) -> io::Result<String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok(link.to_string_lossy().into_owned())
}

/// Classifies `fd` by its `/proc/self/fd` link.
pub fn fd_kind(fd: BorrowedFd<'_>) -> io::Result<FdKind> {
    let target = fd_target(fd)?;
    Ok(if target == "anon_inode:[eventfd]" {
        FdKind::EventFd
    } else if target.starts_with("/memfd:") {
        FdKind::Memfd
    } else if target.starts_with("pipe:[") {
        FdKind::Pipe
    } else if target.starts_with("socket:[") {
        FdKind::Socket
    } else if is_regular(fd) {
        FdKind::File
    } else {
        FdKind::Other(target)
    })
}

fn is_regular(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: `stat` is plain data, for which all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into a valid stat struct.
    let ok = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0;
    ok && st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// Whether `fd` is an eventfd.
pub fn is_eventfd(fd: BorrowedFd<'_>) -> bool {
    matches!(fd_kind(fd), Ok(FdKind::EventFd))
}

/// Sets O_NONBLOCK on `fd`'s open file description. For an fd received
/// from a client this also changes the client's copy (they share the
/// description); QEMU creates its eventfds non-blocking anyway.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: F_GETFL takes no argument and only reads the fd's flags.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_NONBLOCK != 0 {
        return Ok(());
    }
    // SAFETY: F_SETFL with an int argument changes only the fd's flags.
    if unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    use vmm_sys_util::eventfd::EventFd;

    /// Catches a check that takes a pipe, a memfd or a socket for an
    /// eventfd (a pipe bound as an interrupt once hung the device).
    #[test]
    fn tells_eventfds_from_other_fds() {
        let e = EventFd::new(0).unwrap();
        // SAFETY: `e` stays open for the borrow's whole use.
        assert!(is_eventfd(unsafe { BorrowedFd::borrow_raw(e.as_raw_fd()) }));
        let mut fds = [0; 2];
        // SAFETY: pipe fills two fds that we then own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both fds were just created and are owned here.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        assert_eq!(fd_kind(r.as_fd()).unwrap(), FdKind::Pipe);
        assert!(!is_eventfd(w.as_fd()));
        let shm = crate::SharedMemory::new("kind", 4096).unwrap();
        assert_eq!(fd_kind(shm.as_fd()).unwrap(), FdKind::Memfd);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(fd_kind(a.as_fd()).unwrap(), FdKind::Socket);
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(
            fd_kind(null.as_fd()).unwrap(),
            FdKind::Other("/dev/null".into())
        );

        set_nonblocking(r.as_fd()).unwrap();
        // SAFETY: F_GETFL only reads the flags.
        let flags = unsafe { libc::fcntl(r.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(flags & libc::O_NONBLOCK, 0);
    }
}
