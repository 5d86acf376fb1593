//! sendmsg/recvmsg with SCM_RIGHTS on a unix stream socket.
//!
//! vmm-sys-util's `ScmSocket` drops the byte count when the control data
//! is truncated (a peer sending too many fds), which would desynchronise
//! the stream, and it does not loop on short writes. These two small
//! wrappers keep every byte accounted for.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::protocol::MAX_MSG_FDS_LIMIT;

/// Control buffer large enough for the most fds we ever accept, aligned
/// for `cmsghdr`.
#[repr(C, align(8))]
struct ControlBuffer([u8; 128]);

const FD_BYTES: usize = MAX_MSG_FDS_LIMIT as usize * size_of::<RawFd>();

// The buffer must hold CMSG_SPACE(16 fds) (16 + 64 bytes on Linux).
const _: () = assert!(size_of::<ControlBuffer>() >= 16 + FD_BYTES + 8);

/// Result of one `recvmsg`.
#[derive(Debug, Default)]
pub struct Received {
    /// Bytes placed in the buffer; 0 means the peer closed the socket.
    pub bytes: usize,
    /// The peer sent more fds than `max_fds` (the extra ones were closed
    /// by the kernel or here).
    pub fds_truncated: bool,
}

/// Receives up to `buf.len()` bytes, appending at most `max_fds` received
/// descriptors to `fds` (more than that flags `fds_truncated`, and the
/// extra ones are closed). Retries on EINTR.
pub fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    max_fds: usize,
) -> io::Result<Received> {
    let max_fds = max_fds.min(MAX_MSG_FDS_LIMIT as usize);
    let mut control = MaybeUninit::<ControlBuffer>::zeroed();
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is a plain C struct; all-zero is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE only computes a size.
        msg.msg_controllen =
            unsafe { libc::CMSG_SPACE((max_fds * size_of::<RawFd>()) as u32) } as usize;
        // SAFETY: `msg` points at `iov` (covering `buf`, exclusively
        // borrowed) and at `control`, which is at least msg_controllen
        // bytes (checked by the const assertion above). Both outlive the
        // call.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        let mut fds_truncated = msg.msg_flags & libc::MSG_CTRUNC != 0;
        // SAFETY: the kernel filled `msg.msg_control` with well-formed
        // cmsg headers up to msg_controllen; the CMSG_* macros walk them
        // without leaving that range.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                let header = &*cmsg;
                if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
                    let data_len =
                        (header.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                    let count = data_len / size_of::<RawFd>();
                    let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                    for i in 0..count {
                        let raw = std::ptr::read_unaligned(data.add(i));
                        // Every fd the kernel installed is ours to close.
                        let fd = OwnedFd::from_raw_fd(raw);
                        if fds.len() < max_fds {
                            fds.push(fd);
                        } else {
                            fds_truncated = true;
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        return Ok(Received {
            bytes: n as usize,
            fds_truncated,
        });
    }
}

/// Sends all of `parts` as one message, with `fds` attached to its first
/// byte. Loops on short writes; MSG_NOSIGNAL turns a closed peer into
/// EPIPE instead of a signal.
pub fn send_all(stream: &UnixStream, parts: &[&[u8]], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_MSG_FDS_LIMIT as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut sent = 0usize;
    let mut fds_pending = !fds.is_empty();
    let mut control = MaybeUninit::<ControlBuffer>::zeroed();
    while sent < total || fds_pending {
        // Rebuild the iovec list from the first unsent byte.
        let mut iovs: Vec<libc::iovec> = Vec::with_capacity(parts.len());
        let mut skip = sent;
        for part in parts {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            let rest = part.get(skip..).unwrap_or_default();
            skip = 0;
            iovs.push(libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            });
        }
        // SAFETY: msghdr is a plain C struct; all-zero is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iovs.as_mut_ptr();
        msg.msg_iovlen = iovs.len();
        if fds_pending {
            let fd_bytes = std::mem::size_of_val(fds);
            // SAFETY: CMSG_SPACE/CMSG_LEN only compute sizes; the control
            // buffer holds CMSG_SPACE(16 fds) and fds.len() <= 16 (checked
            // above). CMSG_FIRSTHDR returns the start of that buffer and
            // CMSG_DATA a pointer inside it with room for `fd_bytes`.
            unsafe {
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = libc::CMSG_SPACE(fd_bytes as u32) as usize;
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr().cast::<u8>(),
                    libc::CMSG_DATA(cmsg),
                    fd_bytes,
                );
            }
        }
        // SAFETY: `msg` points at iovecs over live, borrowed slices and at
        // the initialised control buffer; all outlive the call.
        let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 && total > sent {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        fds_pending = false;
        sent += n as usize;
    }
    Ok(())
}

/// Waits up to `timeout` for `stream` to have bytes to read (or to be
/// closed). Returns whether it became readable. Retries on EINTR with the
/// full timeout, which only ever waits longer, never misses data.
pub fn wait_readable(stream: &UnixStream, timeout: std::time::Duration) -> io::Result<bool> {
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd, alive for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, millis) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(n > 0);
    }
}

/// Bytes waiting in the receive queue of `stream` (SIOCINQ).
pub fn queued_bytes(stream: &UnixStream) -> io::Result<usize> {
    let mut count: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points
    // at a live local.
    let r = unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &mut count) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Copies up to `buf.len()` waiting bytes without consuming them and
/// without blocking. Returns how many were copied (0 when none wait).
pub fn peek(stream: &UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is exclusively borrowed and valid for its length.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(err),
            }
        }
        return Ok(n as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn fds_travel_with_the_first_byte_and_extra_fds_are_flagged() {
        let (a, b) = UnixStream::pair().unwrap();
        let e1 = EventFd::new(0).unwrap();
        let e2 = EventFd::new(0).unwrap();
        send_all(&a, &[b"he", b"llo"], &[e1.as_raw_fd(), e2.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 5];
        let mut fds = Vec::new();
        let got = recv_with_fds(&b, &mut buf, &mut fds, 1).unwrap();
        assert_eq!(got.bytes, 5);
        assert_eq!(&buf, b"hello");
        assert_eq!(fds.len(), 1);
        assert!(got.fds_truncated);

        // The received fd is the same eventfd.
        // SAFETY: test-only; the fd is a freshly received eventfd we own.
        let received =
            unsafe { EventFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fds.remove(0))) };
        received.write(3).unwrap();
        assert_eq!(e1.read().unwrap(), 3);
    }

    #[test]
    fn large_messages_are_sent_whole() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let big = vec![0xa5u8; 4 << 20];
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            b.read_to_end(&mut all).unwrap();
            all
        });
        send_all(&a, &[b"head", &big], &[]).unwrap();
        drop(a);
        let all = reader.join().unwrap();
        assert_eq!(all.len(), 4 + big.len());
        assert_eq!(&all[..4], b"head");
        assert!(all[4..].iter().all(|&x| x == 0xa5));
    }
}
