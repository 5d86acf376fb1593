//! A registered file. The caller's fd is never read, written or seeked by
//! the library (its file position and flags stay the caller's): at
//! registration the library opens two private twins of the same open file
//! through /proc/self/fd, one with O_DIRECT (the P2P path; absent when the
//! file system refuses O_DIRECT) and one without (the compat path, hole
//! lookups). So an fd opened with or without O_DIRECT works alike.

use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{ErrorCode, GdsError, Result};
use crate::plan::{DirectIo, FileFacts};
use crate::topology::{block_device_chain, PciChain};

#[derive(Debug)]
pub struct FileHandle {
    direct: Option<File>,
    /// Why there is no O_DIRECT twin.
    direct_why: String,
    buffered: File,
    pub app_fd: RawFd,
    pub readable: bool,
    pub writable: bool,
    pub append_only: bool,
    /// The caller's fd had O_DIRECT.
    pub app_direct: bool,
    pub st_dev: u64,
    pub offset_align: u64,
    pub mem_align: u64,
    /// Where the file's block device sits on PCI; None when it is not on
    /// a PCI device.
    pub storage: Option<PciChain>,
}

impl FileHandle {
    /// Registers the open file behind `fd` (the caller keeps `fd`).
    pub fn register(sysfs: &Path, fd: BorrowedFd<'_>) -> Result<FileHandle> {
        let raw = fd.as_raw_fd();
        // SAFETY: F_GETFL on a descriptor the caller lent us; no memory.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
        if flags < 0 {
            return Err(GdsError::sys(
                &std::io::Error::last_os_error(),
                format!("fcntl(F_GETFL) of fd {raw}"),
            ));
        }
        let stat = fstat(raw)?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(GdsError::new(
                ErrorCode::InvalidFileType,
                format!("fd {raw} is not a regular file"),
            ));
        }
        let accmode = flags & libc::O_ACCMODE;
        let readable = accmode == libc::O_RDONLY || accmode == libc::O_RDWR;
        let writable = accmode == libc::O_WRONLY || accmode == libc::O_RDWR;
        let append_only = flags & libc::O_APPEND != 0;
        let reopen = |direct: bool| -> std::io::Result<File> {
            let mut custom = libc::O_CLOEXEC;
            if direct {
                custom |= libc::O_DIRECT;
            }
            if append_only {
                custom |= libc::O_APPEND;
            }
            OpenOptions::new()
                .read(readable)
                .write(writable)
                .custom_flags(custom)
                .open(format!("/proc/self/fd/{raw}"))
        };
        let buffered =
            reopen(false).map_err(|e| GdsError::sys(&e, format!("reopening fd {raw}")))?;
        let (mut direct, mut direct_why) = match reopen(true) {
            Ok(f) => (Some(f), String::new()),
            Err(e) => (None, format!("opening it with O_DIRECT failed ({e})")),
        };
        let (offset_align, mem_align) = match dio_alignment(buffered.as_raw_fd()) {
            Some((0, _)) | Some((_, 0)) => {
                // The open may succeed and I/O still go through the page
                // cache (ext4 data=journal): statx tells.
                if direct.take().is_some() {
                    direct_why = "statx reports no O_DIRECT support (dio_offset_align 0; \
                                  e.g. ext4 with data=journal)"
                        .to_owned();
                }
                (512, 512)
            }
            Some(aligns) => aligns,
            None => {
                let lbs = logical_block_size(sysfs, stat.st_dev).unwrap_or(512);
                (lbs, lbs)
            }
        };
        let (major, minor) = (libc::major(stat.st_dev), libc::minor(stat.st_dev));
        Ok(FileHandle {
            direct,
            direct_why,
            buffered,
            app_fd: raw,
            readable,
            writable,
            append_only,
            app_direct: flags & libc::O_DIRECT != 0,
            st_dev: stat.st_dev,
            offset_align,
            mem_align,
            storage: block_device_chain(sysfs, major, minor),
        })
    }

    pub fn size(&self) -> Result<u64> {
        let stat = fstat(self.buffered.as_raw_fd())?;
        u64::try_from(stat.st_size).map_err(|_| GdsError::invalid("negative file size"))
    }

    pub fn facts(&self) -> Result<FileFacts> {
        Ok(FileFacts {
            size: self.size()?,
            offset_align: self.offset_align,
            mem_align: self.mem_align,
            direct: if self.direct.is_some() {
                DirectIo::Available
            } else {
                DirectIo::Unavailable {
                    why: self.direct_why.clone(),
                }
            },
            append_only: self.append_only,
        })
    }

    /// Holes inside `[start, end)`, from SEEK_DATA/SEEK_HOLE on our own
    /// twin fd (its file position is ours to move). A file system without
    /// them reports none.
    pub fn holes(&self, start: u64, end: u64) -> Vec<Range<u64>> {
        let fd = self.buffered.as_raw_fd();
        let seek = |pos: u64, whence| -> Option<u64> {
            let pos = libc::off_t::try_from(pos).ok()?;
            // SAFETY: lseek on our own fd; no memory is involved.
            let r = unsafe { libc::lseek(fd, pos, whence) };
            u64::try_from(r).ok()
        };
        let mut holes = Vec::new();
        let mut pos = start;
        while pos < end {
            // ENXIO: no data at or after pos (the rest is a hole).
            let data = seek(pos, libc::SEEK_DATA).unwrap_or(end).min(end);
            if data > pos {
                holes.push(pos..data);
            }
            if data >= end {
                break;
            }
            let Some(hole) = seek(data, libc::SEEK_HOLE) else {
                break;
            };
            if hole <= data {
                break;
            }
            pos = hole;
        }
        holes
    }

    /// The O_DIRECT twin (P2P path), if the file system allowed one.
    pub fn direct(&self) -> Option<&File> {
        self.direct.as_ref()
    }

    /// The page-cache twin (compat path).
    pub fn buffered(&self) -> &File {
        &self.buffered
    }

    /// Buffered read for the compat path, retried until `buf` is full or
    /// end of file.
    pub fn read_buffered(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self
                .buffered
                .read_at(&mut buf[done..], offset + done as u64)
            {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Buffered write for the compat path (all of `buf`). With O_APPEND
    /// the kernel appends whatever `offset` says.
    pub fn write_buffered(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.buffered.write_all_at(buf, offset)
    }
}

fn fstat(fd: RawFd) -> Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value of this plain C struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one struct stat into memory we own.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return Err(GdsError::sys(
            &std::io::Error::last_os_error(),
            format!("fstat of fd {fd}"),
        ));
    }
    Ok(stat)
}

/// (offset alignment, memory alignment) of O_DIRECT on this file, from
/// statx STATX_DIOALIGN; None when the kernel or file system does not say.
fn dio_alignment(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero statx is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx with AT_EMPTY_PATH on our own fd and an empty C
    // string writes one struct statx into memory we own.
    let rc = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((
        u64::from(stx.stx_dio_offset_align),
        u64::from(stx.stx_dio_mem_align),
    ))
}

/// The logical block size of the block device `dev` (or of the disk a
/// partition belongs to), from sysfs.
fn logical_block_size(sysfs: &Path, dev: libc::dev_t) -> Option<u64> {
    let base = sysfs.join(format!(
        "dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ));
    ["queue/logical_block_size", "../queue/logical_block_size"]
        .iter()
        .find_map(|p| std::fs::read_to_string(base.join(p)).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|v: &u64| v.is_power_of_two())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn temp_file(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("p2plab-gds-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn registers_without_touching_the_callers_fd() {
        let path = temp_file("plain");
        let mut f = File::create(&path).unwrap();
        f.write_all(&[7u8; 10_000]).unwrap();
        let app = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let h = FileHandle::register(Path::new("/sys"), app.as_fd()).unwrap();
        assert!(h.readable && h.writable && !h.append_only && !h.app_direct);
        assert_eq!(h.size().unwrap(), 10_000);
        assert!(h.offset_align.is_power_of_two());
        let mut buf = vec![0u8; 20_000];
        assert_eq!(h.read_buffered(&mut buf, 5000).unwrap(), 5000);
        assert!(buf[..5000].iter().all(|&b| b == 7));
        // The caller's file position did not move.
        assert_eq!(
            // SAFETY: lseek on our test's own fd; no memory is involved.
            unsafe { libc::lseek(app.as_raw_fd(), 0, libc::SEEK_CUR) },
            0
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn access_mode_and_append_are_kept() {
        let path = temp_file("append");
        File::create(&path).unwrap();
        let app = OpenOptions::new().append(true).open(&path).unwrap();
        let h = FileHandle::register(Path::new("/sys"), app.as_fd()).unwrap();
        assert!(!h.readable && h.writable && h.append_only);
        h.write_buffered(b"abc", 1000).unwrap();
        h.write_buffered(b"def", 0).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abcdef");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn holes_of_a_sparse_file() {
        let path = temp_file("sparse");
        let f = File::create(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        f.write_all_at(&[1u8; 65536], 256 << 10).unwrap();
        f.sync_all().unwrap();
        let h = FileHandle::register(Path::new("/sys"), f.as_fd()).unwrap();
        let holes = h.holes(0, 1 << 20);
        // File systems without SEEK_HOLE report no holes; those with it
        // must leave the written range out and cover the start.
        if !holes.is_empty() {
            assert!(holes
                .iter()
                .all(|r| r.end <= 256 << 10 || r.start >= 320 << 10));
            assert_eq!(holes[0].start, 0);
            let covered: u64 = holes.iter().map(|r| r.end - r.start).sum();
            assert!(covered >= (1 << 20) - (128 << 10), "{holes:?}");
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn directories_are_refused() {
        let dir = File::open(std::env::temp_dir()).unwrap();
        let err = FileHandle::register(Path::new("/sys"), dir.as_fd()).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidFileType);
    }
}
