//! The cuFile entry points (`include/cufile.h`) over p2plab-gds's C ABI,
//! and the p2plab extensions (`include/cufile_p2plab.h`).
//!
//! What differs from p2plab-gds and is done here: cuFile's error numbers
//! ([`OpError`]), `CUfileDescr_t` instead of a bare fd, a handle that is a
//! pointer, a void deregistration, 5-argument read/write with the report
//! kept per thread instead of passed in, a driver that opens on first use,
//! GPU memory that need not be registered before I/O, and the properties.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;

use p2plab_gds::exec::{BOUNCE_BYTES, MAX_P2P_CALL};
use p2plab_gds::ffi::{self as gds, CIoReport, Status};
use p2plab_gds::ErrorCode;

use crate::error::{OpError, CUDA_ERROR_UNKNOWN};

/// `CUfileError_t` (8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUfileError {
    pub err: i32,
    pub cu_err: i32,
}

/// The union in `CUfileDescr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrHandle {
    pub fd: c_int,
    pub handle: *mut c_void,
}

/// `CUfileDescr_t` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileDescr {
    pub type_: c_int,
    pub handle: DescrHandle,
    pub fs_ops: *const c_void,
}

/// The `nvfs` part of `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUfileNvfsProps {
    pub major_version: u32,
    pub minor_version: u32,
    pub poll_thresh_size: usize,
    pub max_direct_io_size: usize,
    pub dstatusflags: u32,
    pub dcontrolflags: u32,
}

/// `CUfileDrvProps_t` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUfileDrvProps {
    pub nvfs: CUfileNvfsProps,
    pub fflags: u32,
    pub max_device_cache_size: u32,
    pub per_buffer_cache_size: u32,
    pub max_device_pinned_mem_size: u32,
    pub max_batch_io_size: u32,
    pub max_batch_io_timeout_msecs: u32,
}

const _: () = assert!(std::mem::size_of::<CUfileError>() == 8);
const _: () = assert!(std::mem::size_of::<CUfileDescr>() == 24);
const _: () = assert!(std::mem::size_of::<CUfileDrvProps>() == 56);

/// `CU_FILE_HANDLE_TYPE_*`.
pub const HANDLE_TYPE_OPAQUE_FD: c_int = 1;
pub const HANDLE_TYPE_OPAQUE_WIN32: c_int = 2;
pub const HANDLE_TYPE_USERSPACE_FS: c_int = 3;
/// `CU_FILE_RDMA_REGISTER | CU_FILE_RDMA_RELAXED_ORDERING`.
pub const BUF_REGISTER_FLAGS: c_int = 1 | (1 << 1);
/// Bit numbers of `CU_FILE_NVME_SUPPORTED`, `CU_FILE_USE_POLL_MODE`,
/// `CU_FILE_ALLOW_COMPAT_MODE`.
pub const NVME_SUPPORTED: u32 = 4;
pub const USE_POLL_MODE: u32 = 0;
pub const ALLOW_COMPAT_MODE: u32 = 1;
/// What `cuFileGetVersion` answers: the cuFile API level (1.9, CUDA
/// 12.4's libcufile) whose calls listed in the header this implements.
pub const CUFILE_VERSION: c_int = 1090;

/// What the setters recorded (sizes in KiB).
#[derive(Clone, Copy)]
struct Settings {
    poll: bool,
    poll_thresh_kb: usize,
    max_direct_io_kb: usize,
    max_cache_kb: u32,
    max_pinned_kb: u32,
}

static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    poll: false,
    poll_thresh_kb: 4,
    max_direct_io_kb: (MAX_P2P_CALL >> 10) as usize,
    max_cache_kb: 128 << 10,
    max_pinned_kb: u32::MAX,
});

fn settings() -> std::sync::MutexGuard<'static, Settings> {
    SETTINGS.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    static LAST_REPORT: RefCell<Option<CIoReport>> = const { RefCell::new(None) };
}

const OK: CUfileError = CUfileError { err: 0, cu_err: 0 };

fn error(e: OpError) -> CUfileError {
    CUfileError {
        err: e as i32,
        cu_err: if e == OpError::CudaDriverError {
            CUDA_ERROR_UNKNOWN
        } else {
            0
        },
    }
}

/// A p2plab-gds status in cuFile's numbers; a failed system call leaves
/// its errno in `errno`.
fn from_status(st: Status) -> CUfileError {
    if st.err == 0 {
        return OK;
    }
    if st.sys_errno != 0 {
        set_errno(st.sys_errno);
    }
    error(OpError::from_gds_raw(st.err, st.sys_errno))
}

fn set_errno(errno: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = errno };
}

/// Refuses with `e` and says why in the last-error text.
fn refuse(e: OpError, why: &str) -> CUfileError {
    gds::set_last_error(&format!("{why} ({})", e.name()));
    error(e)
}

/// cuFile opens the driver on first use.
fn open_on_first_use() -> CUfileError {
    from_status(gds::driver_open_if_closed())
}

/// Opens the driver (reference-counted).
#[no_mangle]
pub extern "C" fn cuFileDriverOpen() -> CUfileError {
    from_status(gds::p2plab_gds_driver_open())
}

/// Closes the driver (`cuFileDriverClose` is a macro for this name).
#[no_mangle]
pub extern "C" fn cuFileDriverClose_v2() -> CUfileError {
    from_status(gds::p2plab_gds_driver_close())
}

/// The same under the name programs built before the `_v2` macro call.
#[no_mangle]
pub extern "C" fn cuFileDriverClose() -> CUfileError {
    cuFileDriverClose_v2()
}

/// The driver's properties: NVMe takes the direct path, compat mode is
/// always allowed, no batch/stream/dynamic-routing features, the compat
/// bounce buffer as per-buffer cache, and what the setters recorded.
///
/// # Safety
/// `props` is NULL or writable for one `CUfileDrvProps_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileDriverGetProperties(props: *mut CUfileDrvProps) -> CUfileError {
    if props.is_null() {
        return refuse(OpError::InvalidValue, "NULL props");
    }
    let st = open_on_first_use();
    if st.err != 0 {
        return st;
    }
    let s = *settings();
    let out = CUfileDrvProps {
        nvfs: CUfileNvfsProps {
            major_version: 0,
            minor_version: 0,
            poll_thresh_size: s.poll_thresh_kb,
            max_direct_io_size: s.max_direct_io_kb,
            dstatusflags: 1 << NVME_SUPPORTED,
            dcontrolflags: (1 << ALLOW_COMPAT_MODE) | (u32::from(s.poll) << USE_POLL_MODE),
        },
        fflags: 0,
        max_device_cache_size: s.max_cache_kb,
        per_buffer_cache_size: (BOUNCE_BYTES >> 10) as u32,
        max_device_pinned_mem_size: s.max_pinned_kb,
        max_batch_io_size: 0,
        max_batch_io_timeout_msecs: 0,
    };
    // SAFETY: checked non-NULL; the caller provides the memory.
    unsafe { props.write(out) };
    OK
}

/// Records poll mode and its threshold (KiB); every call here completes
/// synchronously, so nothing else changes.
#[no_mangle]
pub extern "C" fn cuFileDriverSetPollMode(poll: bool, poll_threshold_size: usize) -> CUfileError {
    let mut s = settings();
    s.poll = poll;
    s.poll_thresh_kb = poll_threshold_size;
    OK
}

fn set_kib(value: usize, what: &str, apply: impl FnOnce(&mut Settings, usize)) -> CUfileError {
    if value == 0 {
        return refuse(OpError::InvalidValue, &format!("{what} of 0 KiB"));
    }
    apply(&mut settings(), value);
    OK
}

fn clamp_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// Records the largest direct I/O (KiB) that GetProperties reports.
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxDirectIOSize(max_direct_io_size: usize) -> CUfileError {
    set_kib(max_direct_io_size, "max direct I/O size", |s, v| {
        s.max_direct_io_kb = v
    })
}

/// Records the device cache size (KiB) that GetProperties reports.
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxCacheSize(max_cache_size: usize) -> CUfileError {
    set_kib(max_cache_size, "max cache size", |s, v| {
        s.max_cache_kb = clamp_u32(v)
    })
}

/// Records the pinned-memory limit (KiB) that GetProperties reports.
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxPinnedMemSize(max_pinned_size: usize) -> CUfileError {
    set_kib(max_pinned_size, "max pinned memory size", |s, v| {
        s.max_pinned_kb = clamp_u32(v)
    })
}

/// `1000 * major + 10 * minor` of the cuFile API implemented.
///
/// # Safety
/// `version` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetVersion(version: *mut c_int) -> CUfileError {
    if version.is_null() {
        return refuse(OpError::InvalidValue, "NULL version");
    }
    // SAFETY: checked non-NULL; the caller provides the memory.
    unsafe { version.write(CUFILE_VERSION) };
    OK
}

/// Registers `descr->handle.fd` (type OPAQUE_FD; `fs_ops` is ignored).
///
/// # Safety
/// `fh` is NULL or writable for one handle; `descr` is NULL or readable
/// for one `CUfileDescr_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileHandleRegister(
    fh: *mut *mut c_void,
    descr: *mut CUfileDescr,
) -> CUfileError {
    if fh.is_null() || descr.is_null() {
        return refuse(OpError::InvalidValue, "NULL handle or descriptor pointer");
    }
    // SAFETY: checked non-NULL; the header makes the caller provide it.
    let d = unsafe { descr.read() };
    let fd = match d.type_ {
        // SAFETY: for OPAQUE_FD the union holds an int (cuFile's
        // contract); any int is a valid value to read.
        HANDLE_TYPE_OPAQUE_FD => unsafe { d.handle.fd },
        HANDLE_TYPE_OPAQUE_WIN32 | HANDLE_TYPE_USERSPACE_FS => {
            return refuse(
                OpError::IoNotSupported,
                &format!(
                "handle type {} is not supported: register an fd (CU_FILE_HANDLE_TYPE_OPAQUE_FD)",
                d.type_
            ),
            )
        }
        other => {
            return refuse(
                OpError::InvalidValue,
                &format!("unknown handle type {other}"),
            )
        }
    };
    if fd < 0 {
        return refuse(OpError::InvalidValue, &format!("negative fd {fd}"));
    }
    let st = open_on_first_use();
    if st.err != 0 {
        return st;
    }
    let mut id = 0u64;
    // SAFETY: &mut id is writable; the fd is the caller's, open.
    let st = from_status(unsafe { gds::p2plab_gds_handle_register(&mut id, fd) });
    if st.err == 0 {
        // SAFETY: checked non-NULL; the caller provides the memory. The
        // handle is the p2plab-gds handle number (never 0).
        unsafe { fh.write(id as usize as *mut c_void) };
    }
    st
}

/// Forgets a handle; a failure is in `p2plab_cufile_last_error`.
#[no_mangle]
pub extern "C" fn cuFileHandleDeregister(fh: *mut c_void) {
    let _ = gds::p2plab_gds_handle_deregister(fh as usize as u64);
}

/// Registers GPU memory; the RDMA flags are accepted and change nothing.
#[no_mangle]
pub extern "C" fn cuFileBufRegister(
    buf_ptr_base: *const c_void,
    length: usize,
    flags: c_int,
) -> CUfileError {
    if flags & !BUF_REGISTER_FLAGS != 0 {
        return refuse(OpError::InvalidValue, &format!("unknown flags {flags:#x}"));
    }
    let st = open_on_first_use();
    if st.err != 0 {
        return st;
    }
    from_status(gds::p2plab_gds_buf_register(buf_ptr_base, length, 0))
}

/// Deregisters GPU memory. As cuFile documents, a pointer that is not the
/// base of a registered buffer is CU_FILE_INVALID_VALUE.
#[no_mangle]
pub extern "C" fn cuFileBufDeregister(buf_ptr_base: *const c_void) -> CUfileError {
    let st = gds::p2plab_gds_buf_deregister(buf_ptr_base);
    if st.err == ErrorCode::MemoryNotRegistered as i32 {
        return error(OpError::InvalidValue);
    }
    from_status(st)
}

/// A read or write: the driver opened on first use, unregistered GPU
/// memory registered for the call, the report kept for the thread.
fn io(
    write: bool,
    fh: *mut c_void,
    base: *mut c_void,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
) -> isize {
    cufile_return(io_reported(write, fh, base, size, file_offset, buf_offset))
}

/// A p2plab-gds read/write return value as cuFile's: bytes and -1 (errno
/// set) stay, a negated p2plab-gds code becomes a negated CU_FILE_* code.
pub fn cufile_return(gds_ret: isize) -> isize {
    if gds_ret >= -1 {
        return gds_ret;
    }
    let gds_code = gds_ret
        .checked_neg()
        .and_then(|c| i32::try_from(c).ok())
        .unwrap_or(ErrorCode::InternalError as i32);
    -(OpError::from_gds_raw(gds_code, 0) as isize)
}

fn io_reported(
    write: bool,
    fh: *mut c_void,
    base: *mut c_void,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
) -> isize {
    let mut report = std::mem::MaybeUninit::<CIoReport>::zeroed();
    // p2plab-gds numbers here: `io` maps them.
    let st = gds::driver_open_if_closed();
    if st.err != 0 {
        return -(st.err as isize);
    }
    let handle = fh as usize as u64;
    let call = |base: *mut c_void, buf_offset: i64, report: *mut CIoReport| {
        // SAFETY: `report` is writable for one struct; the GPU range is
        // checked against the registrations before any use.
        unsafe {
            if write {
                gds::p2plab_gds_write(handle, base, size, file_offset, buf_offset, report)
            } else {
                gds::p2plab_gds_read(handle, base, size, file_offset, buf_offset, report)
            }
        }
    };
    let mut ret = call(base, buf_offset, report.as_mut_ptr());
    if ret == -(ErrorCode::MemoryNotRegistered as isize) && size > 0 {
        // cuFile takes unregistered GPU memory: register exactly the range
        // of this call, for this call.
        let addr = u64::try_from(buf_offset)
            .ok()
            .and_then(|off| (base as u64).checked_add(off));
        if let Some(addr) = addr {
            let start = addr as usize as *mut c_void;
            let st = gds::p2plab_gds_buf_register(start, size, 0);
            if st.err == ErrorCode::MemoryAlreadyRegistered as i32 {
                // Another thread may have registered it meanwhile (its
                // registration holds the buffer for our call too).
                ret = call(base, buf_offset, report.as_mut_ptr());
                if ret == -(ErrorCode::MemoryNotRegistered as isize) {
                    // The range starts or ends in a registered buffer but
                    // does not fit in it: an invalid offset or size.
                    ret = -(ErrorCode::InvalidValue as isize);
                }
                // SAFETY: the call filled the report.
                let out = unsafe { report.assume_init() };
                LAST_REPORT.with(|r| *r.borrow_mut() = Some(out));
                return ret;
            }
            if st.err != 0 {
                // Why the registration failed, in the report too.
                let mut out = {
                    // SAFETY: the failed call filled the report.
                    unsafe { report.assume_init() }
                };
                // SAFETY: p2plab_gds_last_error returns a NUL-terminated
                // thread-local string.
                let text = unsafe { std::ffi::CStr::from_ptr(gds::p2plab_gds_last_error()) };
                copy_detail(&mut out, &text.to_string_lossy());
                LAST_REPORT.with(|r| *r.borrow_mut() = Some(out));
                if st.sys_errno != 0 && st.err == ErrorCode::SystemError as i32 {
                    set_errno(st.sys_errno);
                    return -1;
                }
                return -(st.err as isize);
            }
            ret = call(start, 0, report.as_mut_ptr());
            // Keep errno and the last error of the transfer.
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            let _ = gds::p2plab_gds_buf_deregister(start);
            set_errno(errno);
        }
    }
    // SAFETY: every p2plab_gds_read/write call fills the report.
    let out = unsafe { report.assume_init() };
    LAST_REPORT.with(|r| *r.borrow_mut() = Some(out));
    ret
}

fn copy_detail(report: &mut CIoReport, text: &str) {
    let n = text.len().min(report.detail.len() - 1);
    for (d, s) in report.detail.iter_mut().zip(&text.as_bytes()[..n]) {
        *d = *s as c_char;
    }
    report.detail[n] = 0;
}

/// Reads `size` bytes at `file_offset` into `buf_ptr_base +
/// buf_ptr_offset`: bytes read, -1 with errno, or -CU_FILE_*.
///
/// # Safety
/// The GPU range is mapped (cuFile's contract); it is checked against the
/// registrations (or registered for the call) before use.
#[no_mangle]
pub unsafe extern "C" fn cuFileRead(
    fh: *mut c_void,
    buf_ptr_base: *mut c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_ptr_offset: libc::off_t,
) -> isize {
    io(false, fh, buf_ptr_base, size, file_offset, buf_ptr_offset)
}

/// Writes `size` bytes from `buf_ptr_base + buf_ptr_offset` at
/// `file_offset`.
///
/// # Safety
/// As for `cuFileRead`.
#[no_mangle]
pub unsafe extern "C" fn cuFileWrite(
    fh: *mut c_void,
    buf_ptr_base: *const c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_ptr_offset: libc::off_t,
) -> isize {
    io(
        true,
        fh,
        buf_ptr_base.cast_mut(),
        size,
        file_offset,
        buf_ptr_offset,
    )
}

/// A static sentence for a `CUfileOpError`.
#[no_mangle]
pub extern "C" fn cufileop_status_error(status: c_int) -> *const c_char {
    OpError::from_i32(status)
        .map_or(c"unknown cuFile error", OpError::describe)
        .as_ptr()
}

/// This thread's last cuFileRead/cuFileWrite report.
///
/// # Safety
/// `report` is NULL or writable for one struct.
#[no_mangle]
pub unsafe extern "C" fn p2plab_cufile_last_report(report: *mut CIoReport) -> c_int {
    if report.is_null() {
        return -1;
    }
    match LAST_REPORT.with(|r| *r.borrow()) {
        Some(last) => {
            // SAFETY: checked non-NULL; the caller provides the memory.
            unsafe { report.write(last) };
            0
        }
        None => -1,
    }
}

/// This thread's last failure in full ("" after a success).
#[no_mangle]
pub extern "C" fn p2plab_cufile_last_error() -> *const c_char {
    gds::p2plab_gds_last_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: read/write returning p2plab-gds's numbers (-5002) where
    /// cuFile documents its own (-5022), or a -1 (errno) or a byte count
    /// turned into an error code.
    #[test]
    fn read_write_returns_are_cufiles() {
        assert_eq!(cufile_return(4096), 4096);
        assert_eq!(cufile_return(0), 0);
        assert_eq!(cufile_return(-1), -1);
        assert_eq!(cufile_return(-(ErrorCode::InvalidValue as isize)), -5022);
        assert_eq!(
            cufile_return(-(ErrorCode::HandleNotRegistered as isize)),
            -5027
        );
        assert_eq!(cufile_return(-(ErrorCode::PointerInvalid as isize)), -5012);
        assert_eq!(cufile_return(-(ErrorCode::SystemError as isize)), -5044);
        assert_eq!(cufile_return(-4), -5030, "an unknown code is internal");
        assert_eq!(cufile_return(isize::MIN), -5030);
    }
}
