//! Reads and writes through the C ABI, and their reports.

use std::ffi::c_void;

use super::{copy_c_string, find_buffer, guarded, set_last_error, with_state, CIoReport};
use crate::error::{ErrorCode, GdsError};
use crate::report::IoReport;

fn fill_report(report: &IoReport) -> CIoReport {
    let mut out = CIoReport {
        path: report.path() as u32,
        reasons: report.reason_mask(),
        requested: report.requested,
        bytes: report.bytes(),
        p2p_bytes: report.p2p_bytes,
        compat_bytes: report.compat_bytes,
        p2p_errno: report.p2p_errno,
        eof: u32::from(report.eof),
        detail: [0; 256],
    };
    copy_c_string(&mut out.detail, &report.detail());
    out
}

fn io(
    write: bool,
    fh: u64,
    base: u64,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
    report: *mut CIoReport,
) -> isize {
    let result = guarded(|| {
        let (Ok(file_offset), Ok(buf_offset)) =
            (u64::try_from(file_offset), u64::try_from(buf_offset))
        else {
            return Err(GdsError::invalid("negative offset"));
        };
        let addr = base
            .checked_add(buf_offset)
            .ok_or_else(|| GdsError::invalid("buffer address overflows"))?;
        let (driver, file, (buf, offset)) = with_state(|s| {
            let file = s.handles.get(&fh).cloned().ok_or_else(|| {
                GdsError::new(
                    ErrorCode::HandleNotRegistered,
                    format!("handle {fh} is not registered"),
                )
            })?;
            Ok((s.driver.clone(), file, find_buffer(s, addr, size as u64)?))
        })?;
        if write {
            driver.write(&file, &buf, size as u64, file_offset, offset)
        } else {
            driver.read(&file, &buf, size as u64, file_offset, offset)
        }
    });
    let (ret, out) = match result {
        Ok(r) => {
            set_last_error("");
            (r.bytes() as isize, fill_report(&r))
        }
        Err(e) => {
            set_last_error(&e.to_string());
            let mut out = fill_report(&IoReport {
                write,
                requested: size as u64,
                ..IoReport::default()
            });
            copy_c_string(&mut out.detail, &e.to_string());
            let ret = if e.code == ErrorCode::SystemError {
                set_errno(e.errno);
                -1
            } else {
                -(e.code as isize)
            };
            (ret, out)
        }
    };
    if !report.is_null() {
        // SAFETY: non-NULL; the header makes the caller provide one struct.
        unsafe { report.write(out) };
    }
    ret
}

fn set_errno(errno: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = errno };
}

/// Reads `size` bytes at `file_offset` into `buf_base + buf_offset`.
/// Returns the bytes read (short at end of file), -1 with errno for a
/// system error, or -P2PLAB_GDS_* for a library error.
///
/// # Safety
/// `report` is NULL or writable for one struct.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_read(
    fh: u64,
    buf_base: *mut c_void,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
    report: *mut CIoReport,
) -> isize {
    io(
        false,
        fh,
        buf_base as u64,
        size,
        file_offset,
        buf_offset,
        report,
    )
}

/// Writes `size` bytes from `buf_base + buf_offset` at `file_offset`.
///
/// # Safety
/// As for `p2plab_gds_read`.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_write(
    fh: u64,
    buf_base: *const c_void,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
    report: *mut CIoReport,
) -> isize {
    io(
        true,
        fh,
        buf_base as u64,
        size,
        file_offset,
        buf_offset,
        report,
    )
}
