//! Session recordings: every message a client sent, with a description of
//! the fds that came with it, in the input format of the
//! `vfio_user_session` fuzz target (devices/fuzz). A server started with
//! `--record-session FILE` writes one ([`Recorder`]); [`replay`] plays one
//! (or any fuzz input) into a socket, creating fds like the described ones.
//!
//! The format is a sequence of records; the first byte that starts no
//! known record, or a record cut short, ends the input:
//!
//! ```text
//! MSG     00 len:u32le bytes[len]           sent with one sendmsg, carrying
//!                                          every fd queued since the last MSG
//! FD      01 kind:u8 arg:u32le flags:u8     queue an fd for the next MSG
//! SHRINK  02 index:u8 pages:u32le           ftruncate the index-th memory fd
//!                                          made so far to pages * 4 KiB
//! ```
//!
//! FD kinds ([`FdSpec`]): 0 memfd of `arg` 4 KiB pages, `flags` = seals
//! (bit 0 shrink, 1 grow, 2 write, 3 seal); 1 eventfd with counter `arg`
//! (flags bit 0: pre-filled to its maximum, so a blocking write would
//! hang); 2 pipe read end; 3 pipe write end; 4 unlinked regular file of
//! `arg` pages; 5 /dev/null; 6 a unix socket. Anything else is /dev/null.
//!
//! A recording keeps the messages' bytes as sent, so replies the client
//! sent to our DMA_READ/DMA_WRITE are in it too; a replay delivers them as
//! stray replies, which the server drops.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;

use crate::fdkind::{fd_kind, FdKind};
use crate::socket::send_all;

const OP_MSG: u8 = 0;
const OP_FD: u8 = 1;
const OP_SHRINK: u8 = 2;

/// Memory fds are capped at this many 4 KiB pages (4 GiB) when replayed:
/// sparse, so only touched pages cost memory.
pub const MAX_REPLAY_PAGES: u32 = 1 << 20;
/// At most this many fds are made for one replayed input.
pub const MAX_REPLAY_FDS: usize = 256;
/// At most this many fds travel with one replayed message (the server
/// refuses more than 16, which the replay must still be able to send).
pub const MAX_FDS_PER_MESSAGE: usize = 32;

const PAGE: u64 = 4096;

/// What kind of fd an FD record asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdSpecKind {
    /// A memfd (guest RAM as QEMU shares it).
    Memfd,
    /// An eventfd (an interrupt).
    EventFd,
    /// The read end of a pipe.
    PipeRead,
    /// The write end of a pipe.
    PipeWrite,
    /// An unlinked regular file.
    File,
    /// `/dev/null`.
    DevNull,
    /// A unix socket.
    Socket,
}

impl FdSpecKind {
    fn code(self) -> u8 {
        match self {
            FdSpecKind::Memfd => 0,
            FdSpecKind::EventFd => 1,
            FdSpecKind::PipeRead => 2,
            FdSpecKind::PipeWrite => 3,
            FdSpecKind::File => 4,
            FdSpecKind::DevNull => 5,
            FdSpecKind::Socket => 6,
        }
    }

    fn from_code(code: u8) -> Self {
        match code {
            0 => FdSpecKind::Memfd,
            1 => FdSpecKind::EventFd,
            2 => FdSpecKind::PipeRead,
            3 => FdSpecKind::PipeWrite,
            4 => FdSpecKind::File,
            6 => FdSpecKind::Socket,
            _ => FdSpecKind::DevNull,
        }
    }
}

/// Seal bits of a memfd FD record.
pub mod seal {
    /// F_SEAL_SHRINK.
    pub const SHRINK: u8 = 1 << 0;
    /// F_SEAL_GROW.
    pub const GROW: u8 = 1 << 1;
    /// F_SEAL_WRITE.
    pub const WRITE: u8 = 1 << 2;
    /// F_SEAL_SEAL.
    pub const SEAL: u8 = 1 << 3;
}

/// An fd described by an FD record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdSpec {
    /// What to create.
    pub kind: FdSpecKind,
    /// Size in 4 KiB pages (memfd, file) or the eventfd's counter.
    pub arg: u32,
    /// Seals (memfd) or, for an eventfd, bit 0: pre-fill to the maximum.
    pub flags: u8,
}

/// One record of a recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// Message bytes, sent with the fds queued before.
    Msg(&'a [u8]),
    /// An fd for the next message.
    Fd(FdSpec),
    /// Shrink the `index`-th memory fd made so far to `pages` pages.
    Shrink {
        /// Which memory fd (memfd or file), in creation order.
        index: u8,
        /// Its new size in 4 KiB pages.
        pages: u32,
    },
}

/// Splits an input into records; stops at the first one that is unknown
/// or cut short. Never fails.
pub fn parse(mut input: &[u8]) -> Vec<Record<'_>> {
    let mut out = Vec::new();
    let u32_at =
        |b: &[u8]| -> Option<u32> { Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)) };
    while let Some((&op, rest)) = input.split_first() {
        match op {
            OP_MSG => {
                let Some(len) = u32_at(rest) else { break };
                let body = rest.get(4..).unwrap_or_default();
                let len = (len as usize).min(body.len());
                out.push(Record::Msg(body.get(..len).unwrap_or_default()));
                input = body.get(len..).unwrap_or_default();
            }
            OP_FD => {
                let (Some(&kind), Some(arg), Some(&flags)) =
                    (rest.first(), rest.get(1..).and_then(u32_at), rest.get(5))
                else {
                    break;
                };
                out.push(Record::Fd(FdSpec {
                    kind: FdSpecKind::from_code(kind),
                    arg,
                    flags,
                }));
                input = rest.get(6..).unwrap_or_default();
            }
            OP_SHRINK => {
                let (Some(&index), Some(pages)) = (rest.first(), rest.get(1..).and_then(u32_at))
                else {
                    break;
                };
                out.push(Record::Shrink { index, pages });
                input = rest.get(5..).unwrap_or_default();
            }
            _ => break,
        }
    }
    out
}

/// Appends the encoding of `record` to `out`.
pub fn encode(record: &Record<'_>, out: &mut Vec<u8>) {
    match record {
        Record::Msg(bytes) => {
            out.push(OP_MSG);
            let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(bytes.get(..len as usize).unwrap_or(bytes));
        }
        Record::Fd(spec) => {
            out.push(OP_FD);
            out.push(spec.kind.code());
            out.extend_from_slice(&spec.arg.to_le_bytes());
            out.push(spec.flags);
        }
        Record::Shrink { index, pages } => {
            out.push(OP_SHRINK);
            out.push(*index);
            out.extend_from_slice(&pages.to_le_bytes());
        }
    }
}

fn pages_of(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(PAGE)).unwrap_or(u32::MAX)
}

fn seals_of(fd: BorrowedFd<'_>) -> u8 {
    // SAFETY: F_GET_SEALS takes no argument and only reads the fd's state.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return 0;
    }
    let mut out = 0;
    for (bit, ours) in [
        (libc::F_SEAL_SHRINK, seal::SHRINK),
        (libc::F_SEAL_GROW, seal::GROW),
        (libc::F_SEAL_WRITE, seal::WRITE),
        (libc::F_SEAL_SEAL, seal::SEAL),
    ] {
        if seals & bit != 0 {
            out |= ours;
        }
    }
    out
}

/// Describes a received fd as an FD record would create it.
pub fn describe(fd: BorrowedFd<'_>) -> FdSpec {
    let size = || {
        File::from(match fd.try_clone_to_owned() {
            Ok(owned) => owned,
            Err(_) => return 0,
        })
        .metadata()
        .map_or(0, |m| m.len())
    };
    let spec = |kind, arg, flags| FdSpec { kind, arg, flags };
    match fd_kind(fd) {
        Ok(FdKind::Memfd) => spec(FdSpecKind::Memfd, pages_of(size()), seals_of(fd)),
        Ok(FdKind::File) => spec(FdSpecKind::File, pages_of(size()), 0),
        Ok(FdKind::EventFd) => spec(FdSpecKind::EventFd, 0, 0),
        Ok(FdKind::Pipe) => {
            // SAFETY: F_GETFL takes no argument and only reads the flags.
            let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
            if flags >= 0 && flags & libc::O_ACCMODE == libc::O_WRONLY {
                spec(FdSpecKind::PipeWrite, 0, 0)
            } else {
                spec(FdSpecKind::PipeRead, 0, 0)
            }
        }
        Ok(FdKind::Socket) => spec(FdSpecKind::Socket, 0, 0),
        _ => spec(FdSpecKind::DevNull, 0, 0),
    }
}

/// Writes a server's inbound messages to a file, in the fuzz input
/// format. Shared by every connection of a server; each message is
/// written whole and flushed, so a killed server leaves a usable file.
#[derive(Debug)]
pub struct Recorder {
    file: Mutex<File>,
}

impl Recorder {
    /// Creates (or appends to) `path`, mode 0600, refusing to follow a
    /// symlink there.
    pub fn create(path: &Path) -> io::Result<Self> {
        let file = File::options()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Recorder {
            file: Mutex::new(file),
        })
    }

    /// Appends one message: an FD record per fd, then the bytes.
    pub fn message(&self, fds: &[OwnedFd], parts: &[&[u8]]) {
        let mut out = Vec::new();
        for fd in fds {
            encode(&Record::Fd(describe(fd.as_fd())), &mut out);
        }
        let bytes: Vec<u8> = parts.concat();
        encode(&Record::Msg(&bytes), &mut out);
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = file.write_all(&out) {
            p2plab_ratelimit::log_limited!(warn, "recording the session failed: {e}");
        }
    }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of a freshly created fd.
fn owned(raw: RawFd) -> io::Result<OwnedFd> {
    cvt(raw)?;
    // SAFETY: `raw` was just returned by a syscall that created it; nothing
    // else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl FdSpec {
    /// Creates the fd this record describes. Memory fds are capped at
    /// [`MAX_REPLAY_PAGES`].
    pub fn create(&self) -> io::Result<OwnedFd> {
        let bytes = u64::from(self.arg.min(MAX_REPLAY_PAGES)) * PAGE;
        match self.kind {
            FdSpecKind::Memfd => {
                // SAFETY: the name is a valid NUL-terminated string.
                let fd = owned(unsafe {
                    libc::memfd_create(
                        c"replay".as_ptr(),
                        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
                    )
                })?;
                let file = File::from(fd);
                file.set_len(bytes)?;
                let mut seals = 0;
                for (ours, bit) in [
                    (seal::SHRINK, libc::F_SEAL_SHRINK),
                    (seal::GROW, libc::F_SEAL_GROW),
                    (seal::WRITE, libc::F_SEAL_WRITE),
                    (seal::SEAL, libc::F_SEAL_SEAL),
                ] {
                    if self.flags & ours != 0 {
                        seals |= bit;
                    }
                }
                if seals != 0 {
                    // SAFETY: F_ADD_SEALS with an int argument only adds
                    // seals to our own memfd.
                    cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
                }
                Ok(file.into())
            }
            FdSpecKind::EventFd => {
                // SAFETY: eventfd creates a new fd from plain arguments.
                let fd = owned(unsafe { libc::eventfd(self.arg, libc::EFD_CLOEXEC) })?;
                if self.flags & 1 != 0 {
                    let max = u64::MAX - 1 - u64::from(self.arg);
                    // SAFETY: writes 8 bytes from a live u64 to our eventfd;
                    // the counter ends at its maximum, which does not block.
                    let n = unsafe { libc::write(fd.as_raw_fd(), (&max as *const u64).cast(), 8) };
                    if n != 8 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(fd)
            }
            FdSpecKind::PipeRead | FdSpecKind::PipeWrite => {
                let mut fds = [0; 2];
                // SAFETY: pipe2 fills two new fds into the array.
                cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
                let (r, w) = (owned(fds[0])?, owned(fds[1])?);
                Ok(if self.kind == FdSpecKind::PipeRead {
                    r
                } else {
                    w
                })
            }
            FdSpecKind::File => {
                let file = File::options()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
                    .open(std::env::temp_dir())?;
                file.set_len(bytes)?;
                Ok(file.into())
            }
            FdSpecKind::DevNull => Ok(File::open("/dev/null")?.into()),
            FdSpecKind::Socket => Ok(UnixStream::pair()?.0.into()),
        }
    }
}

/// Plays `input` into `stream`: creates the described fds and sends each
/// message with the fds queued before it. Returns when the input ends or
/// the socket fails (the server closed it: the rest is not sent).
pub fn replay(input: &[u8], stream: &UnixStream) -> io::Result<()> {
    let mut made = 0usize;
    let mut memory: Vec<OwnedFd> = Vec::new();
    let mut queued: Vec<OwnedFd> = Vec::new();
    for record in parse(input) {
        match record {
            Record::Fd(spec) => {
                if made >= MAX_REPLAY_FDS || queued.len() >= MAX_FDS_PER_MESSAGE {
                    continue;
                }
                made += 1;
                let fd = spec.create()?;
                if matches!(spec.kind, FdSpecKind::Memfd | FdSpecKind::File) {
                    memory.push(fd.try_clone()?);
                }
                queued.push(fd);
            }
            Record::Shrink { index, pages } => {
                if let Some(fd) = memory.get(usize::from(index)) {
                    let bytes = u64::from(pages.min(MAX_REPLAY_PAGES)) * PAGE;
                    let len = libc::off_t::try_from(bytes).unwrap_or(libc::off_t::MAX);
                    // SAFETY: ftruncate on our own fd; a sealed one refuses.
                    let _ = unsafe { libc::ftruncate(fd.as_raw_fd(), len) };
                }
            }
            Record::Msg(bytes) => {
                let raw: Vec<RawFd> = queued.iter().map(AsRawFd::as_raw_fd).collect();
                // The server takes at most 16 fds per message; more cannot
                // even be sent in one control message here.
                let raw = raw.get(..raw.len().min(16)).unwrap_or_default();
                if bytes.is_empty() && raw.is_empty() {
                    continue;
                }
                let sent = if bytes.is_empty() {
                    // fds need at least one byte to travel with.
                    Ok(())
                } else {
                    send_all(stream, &[bytes], raw)
                };
                queued.clear();
                sent?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a format whose encoder and parser disagree, or a parser
    /// that reads past a cut-short record.
    #[test]
    fn records_round_trip_and_cut_inputs_stop_cleanly() {
        let records = vec![
            Record::Fd(FdSpec {
                kind: FdSpecKind::Memfd,
                arg: 256,
                flags: seal::SHRINK | seal::GROW,
            }),
            Record::Msg(b"hello"),
            Record::Shrink { index: 0, pages: 1 },
            Record::Fd(FdSpec {
                kind: FdSpecKind::EventFd,
                arg: 0,
                flags: 1,
            }),
            Record::Msg(&[]),
        ];
        let mut bytes = Vec::new();
        for r in &records {
            encode(r, &mut bytes);
        }
        assert_eq!(parse(&bytes), records);
        for cut in 0..bytes.len() {
            let parsed = parse(&bytes[..cut]);
            assert!(parsed.len() <= records.len());
        }
        // A MSG whose length runs past the end takes what is there.
        assert_eq!(parse(&[0, 9, 0, 0, 0, b'a']), vec![Record::Msg(b"a")]);
        assert_eq!(parse(&[7, 1, 2]), vec![]);
    }

    /// Catches a description that loses a memfd's size or seals, or takes
    /// a pipe for something else: seeds recorded from QEMU must replay
    /// the same memory.
    #[test]
    fn described_fds_are_recreated_alike() {
        for spec in [
            FdSpec {
                kind: FdSpecKind::Memfd,
                arg: 3,
                flags: seal::SHRINK | seal::GROW | seal::SEAL,
            },
            FdSpec {
                kind: FdSpecKind::Memfd,
                arg: 1,
                flags: 0,
            },
            FdSpec {
                kind: FdSpecKind::EventFd,
                arg: 0,
                flags: 0,
            },
            FdSpec {
                kind: FdSpecKind::PipeWrite,
                arg: 0,
                flags: 0,
            },
            FdSpec {
                kind: FdSpecKind::File,
                arg: 2,
                flags: 0,
            },
            FdSpec {
                kind: FdSpecKind::Socket,
                arg: 0,
                flags: 0,
            },
        ] {
            let fd = spec.create().unwrap();
            assert_eq!(describe(fd.as_fd()), spec);
        }
    }
}
