//! Runs a plan: P2P segments as O_DIRECT pread/pwrite with the GPU
//! mapping as the buffer (the NVMe controller DMAs to or from the GPU's
//! BAR); compat segments through a bounce buffer in host RAM (page-cache
//! I/O, then the GPU engine copies between the bounce buffer and VRAM).
//! When the kernel refuses a P2P segment, that segment and every later
//! one run in compat mode and the driver remembers the refusal.

use std::fs::File;
use std::os::fd::AsRawFd;

use crate::buffer::{GpuBuffer, Refusal};
use crate::error::{GdsError, Result};
use crate::file::FileHandle;
use crate::plan::{Plan, Request, Segment};
use crate::report::{IoReport, Route, SegmentReport};

/// Bounce buffer size of the compat path.
pub const BOUNCE_BYTES: u64 = 4 << 20;
/// Largest single O_DIRECT call (Linux caps a call at about 2 GiB).
pub const MAX_P2P_CALL: u64 = 1 << 30;

/// errnos with which the kernel refuses O_DIRECT into P2P memory: EINVAL
/// (the DMA mapping found no P2P path), EREMOTEIO (the block device does
/// not take P2P pages), EOPNOTSUPP. Anything else is a real I/O error.
pub fn is_p2p_refusal(errno: i32) -> bool {
    matches!(errno, libc::EINVAL | libc::EREMOTEIO | libc::EOPNOTSUPP)
}

/// Runs `plan`; `refused` classifies (and lets the caller remember) a P2P
/// segment the kernel refused with an errno.
pub(crate) fn execute(
    file: &FileHandle,
    buf: &GpuBuffer,
    req: &Request,
    plan: Plan,
    refused: &dyn Fn(i32) -> Refusal,
) -> Result<IoReport> {
    let mut report = IoReport {
        write: req.write,
        requested: req.len,
        eof: plan.eof,
        ..IoReport::default()
    };
    let mut refusal: Option<Refusal> = None;
    for seg in plan.segments {
        let route = match (&seg.route, &refusal) {
            (Route::P2p, Some(r)) => Route::Compat {
                reason: r.reason,
                detail: r.detail.clone(),
            },
            (route, _) => route.clone(),
        };
        let seg = Segment { route, ..seg };
        let ended = match seg.route {
            Route::P2p => {
                let Some(direct) = file.direct() else {
                    return Err(GdsError::invalid("planned P2P without an O_DIRECT twin"));
                };
                let (done, outcome) = p2p_io(direct, req.write, buf, &seg);
                if done > 0 {
                    report.p2p_bytes += done;
                    report.segments.push(SegmentReport {
                        file_offset: seg.file_offset,
                        buf_offset: seg.buf_offset,
                        len: done,
                        done,
                        route: Route::P2p,
                    });
                }
                match outcome {
                    Ok(eof) => eof,
                    Err(err) if err.raw_os_error().is_some_and(is_p2p_refusal) => {
                        let errno = err.raw_os_error().unwrap_or(libc::EINVAL);
                        let r = refused(errno);
                        report.p2p_errno = errno;
                        let rest = Segment {
                            file_offset: seg.file_offset + done,
                            buf_offset: seg.buf_offset + done,
                            len: seg.len - done,
                            route: Route::Compat {
                                reason: r.reason,
                                detail: r.detail.clone(),
                            },
                        };
                        refusal = Some(r);
                        compat(file, buf, req.write, &rest, &mut report)?
                    }
                    Err(err) => {
                        return Err(GdsError::sys(
                            &err,
                            format!(
                                "O_DIRECT {} of {} bytes at file offset {} (after {done} bytes)",
                                if req.write { "write" } else { "read" },
                                seg.len,
                                seg.file_offset
                            ),
                        ))
                    }
                }
            }
            Route::Compat { .. } => compat(file, buf, req.write, &seg, &mut report)?,
        };
        if ended {
            // End of file under a read: nothing after it can follow.
            report.eof = true;
            break;
        }
    }
    Ok(report)
}

/// O_DIRECT between `file` and the GPU mapping. Returns the bytes moved
/// and Ok(true) if a read hit end of file early, or the error that
/// stopped it.
fn p2p_io(
    file: &File,
    write: bool,
    buf: &GpuBuffer,
    seg: &Segment,
) -> (u64, std::io::Result<bool>) {
    let fd = file.as_raw_fd();
    let base = buf.addr + seg.buf_offset;
    let mut done = 0u64;
    while done < seg.len {
        let count = (seg.len - done).min(MAX_P2P_CALL) as usize;
        let Ok(offset) = libc::off_t::try_from(seg.file_offset + done) else {
            return (done, Err(std::io::Error::from_raw_os_error(libc::EFBIG)));
        };
        let ptr = (base + done) as *mut libc::c_void;
        // SAFETY: [ptr, ptr + count) lies inside the registered GPU buffer
        // (Driver::transfer checked buf_offset + size against its length),
        // which stays mapped while registered (a library mapping is owned
        // by the registration; a caller's mapping is the caller's promise
        // in register_buffer). No Rust reference points into it; the
        // kernel validates the range and the device DMAs into it.
        let n = unsafe {
            if write {
                libc::pwrite(fd, ptr, count, offset)
            } else {
                libc::pread(fd, ptr, count, offset)
            }
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return (done, Err(err));
        }
        if n == 0 {
            if write {
                return (done, Err(std::io::Error::from_raw_os_error(libc::EIO)));
            }
            return (done, Ok(true));
        }
        done += n as u64;
    }
    (done, Ok(false))
}

/// Moves `seg` through host RAM; appends its report. Ok(true) when a read
/// hit end of file early.
fn compat(
    file: &FileHandle,
    buf: &GpuBuffer,
    write: bool,
    seg: &Segment,
    report: &mut IoReport,
) -> Result<bool> {
    let mut bounce = vec![0u8; seg.len.min(BOUNCE_BYTES) as usize];
    let mut done = 0u64;
    let mut eof = false;
    while done < seg.len {
        let n = (seg.len - done).min(BOUNCE_BYTES) as usize;
        let chunk = &mut bounce[..n];
        let at = seg.file_offset + done;
        if write {
            buf.copy_to_host(seg.buf_offset + done, chunk)?;
            file.write_buffered(chunk, at)
                .map_err(|e| GdsError::sys(&e, format!("write of {n} bytes at {at}")))?;
            done += n as u64;
        } else {
            let got = file
                .read_buffered(chunk, at)
                .map_err(|e| GdsError::sys(&e, format!("read of {n} bytes at {at}")))?;
            if got > 0 {
                buf.copy_from_host(seg.buf_offset + done, &chunk[..got])?;
            }
            done += got as u64;
            if got < n {
                eof = true;
                break;
            }
        }
    }
    report.compat_bytes += done;
    report.segments.push(SegmentReport {
        file_offset: seg.file_offset,
        buf_offset: seg.buf_offset,
        len: seg.len,
        done,
        route: seg.route.clone(),
    });
    Ok(eof)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_errnos() {
        for e in [libc::EINVAL, libc::EREMOTEIO, libc::EOPNOTSUPP] {
            assert!(is_p2p_refusal(e), "{e}");
        }
        // Real I/O errors are never papered over by a compat retry.
        for e in [
            libc::EIO,
            libc::ENOSPC,
            libc::EBADF,
            libc::EFAULT,
            libc::EDQUOT,
        ] {
            assert!(!is_p2p_refusal(e), "{e}");
        }
    }
}
