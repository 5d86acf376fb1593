//! The C ABI of `include/p2plab_gds.h`: cuFile's shape (driver open and
//! close, handle and buffer registration, read/write with a file offset
//! and a buffer offset) over [`Driver`]. Registrations live in one global
//! table, like cuFile's; I/O clones what it needs out of the table and
//! runs without holding its lock, so threads transfer in parallel.
//!
//! No function panics across the boundary (a panic becomes
//! P2PLAB_GDS_INTERNAL_ERROR) or aborts; pointers from C are only
//! dereferenced where the header says the caller provides memory.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, CString};
use std::os::fd::BorrowedFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::driver::{Driver, GpuBuffer};
use crate::error::{ErrorCode, GdsError, Result};
use crate::file::FileHandle;
use crate::vram::VramMapping;

mod io;
mod memory;
mod names;

pub use io::*;
pub use memory::*;
pub use names::*;

/// `p2plab_gds_status_t`: a library code and an errno.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub err: i32,
    pub sys_errno: i32,
}

/// `struct p2plab_gds_io_report` (304 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CIoReport {
    pub path: u32,
    pub reasons: u32,
    pub requested: u64,
    pub bytes: u64,
    pub p2p_bytes: u64,
    pub compat_bytes: u64,
    pub p2p_errno: i32,
    pub eof: u32,
    pub detail: [c_char; 256],
}

/// `struct p2plab_gds_buf_info` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CBufInfo {
    pub gpu: [c_char; 16],
    pub kind: u32,
    pub bar: u32,
    pub vram_offset: u64,
    pub size: u64,
}

const _: () = assert!(std::mem::size_of::<CIoReport>() == 304);
const _: () = assert!(std::mem::size_of::<CBufInfo>() == 40);
const _: () = assert!(std::mem::size_of::<Status>() == 8);

/// `P2PLAB_GDS_BUF_P2PMEM` / `P2PLAB_GDS_BUF_DEVMAP`.
pub const BUF_P2PMEM: u32 = 1;
pub const BUF_DEVMAP: u32 = 2;

pub(crate) struct Registered {
    pub(crate) buf: Arc<GpuBuffer>,
    /// The library allocation it lies in, kept mapped while registered.
    pub(crate) _alloc: Option<Arc<VramMapping>>,
}

pub(crate) struct State {
    pub(crate) driver: Arc<Driver>,
    opens: u32,
    next_handle: u64,
    pub(crate) handles: HashMap<u64, Arc<FileHandle>>,
    pub(crate) buffers: BTreeMap<u64, Registered>,
    pub(crate) allocs: BTreeMap<u64, Arc<VramMapping>>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// What makes the driver a first `p2plab_gds_driver_open` opens.
#[cfg(feature = "testing")]
pub type MakeDriver = Box<dyn Fn() -> Result<Driver> + Send>;

#[cfg(feature = "testing")]
static MAKE_DRIVER: Mutex<Option<MakeDriver>> = Mutex::new(None);

/// Testing: the driver that the C ABI opens from now on (`None`: the real
/// one, on /sys), such as one over a test GPU
/// ([`FakeGpu::driver`](crate::testing::FakeGpu::driver)). Everything
/// behind `p2plab_gds_*` then runs as it does on a real system.
#[cfg(feature = "testing")]
pub fn inject_driver(make: Option<MakeDriver>) {
    *MAKE_DRIVER.lock().unwrap_or_else(|p| p.into_inner()) = make;
}

fn open_driver() -> Result<Driver> {
    #[cfg(feature = "testing")]
    if let Some(make) = MAKE_DRIVER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
    {
        return make();
    }
    Driver::open()
}

thread_local! {
    pub(crate) static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn state() -> MutexGuard<'static, Option<State>> {
    // Every update of the table is a single insert or remove, so a
    // poisoned lock (a panic elsewhere) leaves it consistent.
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
    match state().as_mut() {
        Some(s) => f(s),
        None => Err(GdsError::new(
            ErrorCode::DriverNotInitialized,
            "p2plab_gds_driver_open has not been called",
        )),
    }
}

/// Sets this thread's last-error text (what `p2plab_gds_last_error`
/// returns), for layers over this ABI that refuse a call themselves.
pub fn set_last_error(text: &str) {
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

pub(crate) fn status_of(result: Result<()>) -> Status {
    match result {
        Ok(()) => {
            set_last_error("");
            Status {
                err: 0,
                sys_errno: 0,
            }
        }
        Err(e) => {
            set_last_error(&e.to_string());
            Status {
                err: e.code as i32,
                sys_errno: e.errno,
            }
        }
    }
}

/// Runs `f`, turning a panic into INTERNAL_ERROR.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(GdsError::new(
            ErrorCode::InternalError,
            "p2plab-gds panicked (a bug; please report it)",
        ))
    })
}

pub(crate) fn copy_c_string(dst: &mut [c_char], text: &str) {
    let n = text.len().min(dst.len().saturating_sub(1));
    for (d, s) in dst.iter_mut().zip(text.as_bytes()[..n].iter()) {
        *d = *s as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

/// The registered buffer holding `[addr, addr + len)` and the offset of
/// `addr` in it.
pub(crate) fn find_buffer(s: &State, addr: u64, len: u64) -> Result<(Arc<GpuBuffer>, u64)> {
    let not_registered = || {
        GdsError::new(
            ErrorCode::MemoryNotRegistered,
            format!("[{addr:#x}, +{len}) is not inside a registered buffer"),
        )
    };
    let (_, reg) = s
        .buffers
        .range(..=addr)
        .next_back()
        .ok_or_else(not_registered)?;
    let offset = addr - reg.buf.addr;
    match offset.checked_add(len) {
        Some(end) if end <= reg.buf.len => Ok((reg.buf.clone(), offset)),
        _ => Err(not_registered()),
    }
}

pub(crate) fn overlaps_registration(s: &State, start: u64, len: u64) -> bool {
    let end = start.saturating_add(len);
    s.buffers
        .range(..end)
        .next_back()
        .is_some_and(|(_, r)| r.buf.addr.saturating_add(r.buf.len) > start)
}

// SAFETY (for every `unsafe extern` below): the caller follows the header:
// pointers are NULL or valid for the stated sizes.

fn new_state() -> Result<State> {
    Ok(State {
        driver: Arc::new(open_driver()?),
        opens: 1,
        next_handle: 1,
        handles: HashMap::new(),
        buffers: BTreeMap::new(),
        allocs: BTreeMap::new(),
    })
}

/// Opens the driver (reference-counted: every open needs a close).
#[no_mangle]
pub extern "C" fn p2plab_gds_driver_open() -> Status {
    status_of(guarded(|| {
        let mut guard = state();
        match guard.as_mut() {
            Some(s) => s.opens += 1,
            None => *guard = Some(new_state()?),
        }
        Ok(())
    }))
}

/// Opens the driver unless it is open (then nothing changes): for
/// layers that open it on first use, as cuFile does when a program
/// registers a file or buffer without `cuFileDriverOpen`. Not part of the
/// C header; one `p2plab_gds_driver_close` closes what this opened.
pub fn driver_open_if_closed() -> Status {
    status_of(guarded(|| {
        let mut guard = state();
        if guard.is_none() {
            *guard = Some(new_state()?);
        }
        Ok(())
    }))
}

/// Closes the driver; the last close drops every registration and
/// allocation still left.
#[no_mangle]
pub extern "C" fn p2plab_gds_driver_close() -> Status {
    status_of(guarded(|| {
        let mut guard = state();
        let last = with_state_in(&mut guard, |s| {
            s.opens -= 1;
            Ok(s.opens == 0)
        })?;
        if last {
            *guard = None;
        }
        Ok(())
    }))
}

fn with_state_in<T>(
    guard: &mut MutexGuard<'static, Option<State>>,
    f: impl FnOnce(&mut State) -> Result<T>,
) -> Result<T> {
    match guard.as_mut() {
        Some(s) => f(s),
        None => Err(GdsError::new(
            ErrorCode::DriverNotInitialized,
            "p2plab_gds_driver_open has not been called",
        )),
    }
}

/// Forces compat mode for every transfer (non-zero) or lets P2P run (0).
#[no_mangle]
pub extern "C" fn p2plab_gds_driver_set_force_compat(on: c_int) -> Status {
    status_of(guarded(|| {
        with_state(|s| {
            s.driver.set_force_compat(on != 0);
            Ok(())
        })
    }))
}

/// Registers the open file `fd` (the caller keeps it and its position).
///
/// # Safety
/// `fh` is NULL or points to writable memory for one handle.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_handle_register(fh: *mut u64, fd: c_int) -> Status {
    status_of(guarded(|| {
        if fh.is_null() || fd < 0 {
            return Err(GdsError::invalid("NULL handle pointer or negative fd"));
        }
        let driver = with_state(|s| Ok(s.driver.clone()))?;
        // SAFETY: the fd is the caller's, open for the duration of this
        // call (the header's contract); FileHandle only reopens it.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let handle = Arc::new(driver.register_file(borrowed)?);
        let id = with_state(|s| {
            let id = s.next_handle;
            s.next_handle += 1;
            s.handles.insert(id, handle);
            Ok(id)
        })?;
        // SAFETY: checked non-NULL above; the caller provides the memory.
        unsafe { fh.write(id) };
        Ok(())
    }))
}

/// Forgets a handle (its private fds close when in-flight I/O ends).
#[no_mangle]
pub extern "C" fn p2plab_gds_handle_deregister(fh: u64) -> Status {
    status_of(guarded(|| {
        with_state(|s| match s.handles.remove(&fh) {
            Some(_) => Ok(()),
            None => Err(GdsError::new(
                ErrorCode::HandleNotRegistered,
                format!("handle {fh} is not registered"),
            )),
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Path, Reason};
    use std::ffi::{c_void, CStr};

    fn name(p: *const c_char) -> String {
        // SAFETY: the functions return static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    #[test]
    fn c_names_match_the_rust_names() {
        for r in Reason::ALL {
            assert_eq!(name(p2plab_gds_reason_name(r.bit())), r.name());
        }
        for p in [Path::None, Path::P2p, Path::Compat, Path::Mixed] {
            assert_eq!(name(p2plab_gds_path_name(p as u32)), p.name());
        }
        for code in ErrorCode::ALL {
            assert_eq!(name(p2plab_gds_error_string(code as i32)), code.describe());
            // Negative return values of read/write name the same code.
            assert_eq!(
                name(p2plab_gds_error_string(-(code as i32))),
                code.describe()
            );
        }
    }

    /// The C API without a GPU: calls before open fail cleanly, handles
    /// register and deregister, bad pointers are refused with codes.
    #[test]
    fn c_api_lifecycle_without_a_gpu() {
        // Serialise with any other test touching the global table.
        let _serial = TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let mut fh = 0u64;
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        // SAFETY: &mut fh is valid.
        let st = unsafe { p2plab_gds_handle_register(&mut fh, fd) };
        assert_eq!(st.err, ErrorCode::DriverNotInitialized as i32);
        assert!(name(p2plab_gds_last_error()).contains("driver_open"));

        assert_eq!(p2plab_gds_driver_open().err, 0);
        assert_eq!(p2plab_gds_driver_open().err, 0);
        // SAFETY: &mut fh is valid.
        let st = unsafe { p2plab_gds_handle_register(&mut fh, fd) };
        assert_eq!(st.err, 0, "{}", name(p2plab_gds_last_error()));
        assert_ne!(fh, 0);
        // SAFETY: NULL handle pointer is allowed and refused.
        let st = unsafe { p2plab_gds_handle_register(std::ptr::null_mut(), fd) };
        assert_eq!(st.err, ErrorCode::InvalidValue as i32);

        // Host memory is not GPU memory.
        let host = vec![0u8; 4096];
        let st = p2plab_gds_buf_register(host.as_ptr().cast(), host.len(), 0);
        assert_eq!(st.err, ErrorCode::PointerInvalid as i32);
        assert_eq!(
            p2plab_gds_buf_register(host.as_ptr().cast(), host.len(), 7).err,
            ErrorCode::InvalidValue as i32
        );
        // A range that wraps the address space (the cufile_c_abi fuzz
        // target found the add overflowing into a panic): refused.
        let near_top = (u64::MAX - 4095) as usize as *const c_void;
        assert_eq!(
            p2plab_gds_buf_register(near_top, 1 << 20, 0).err,
            ErrorCode::InvalidValue as i32
        );

        // I/O into an unregistered buffer: a library code, the report says so.
        let mut report = std::mem::MaybeUninit::<CIoReport>::zeroed();
        // SAFETY: report points to writable memory of the right size.
        let ret = unsafe {
            p2plab_gds_read(
                fh,
                host.as_ptr() as *mut c_void,
                4096,
                0,
                0,
                report.as_mut_ptr(),
            )
        };
        assert_eq!(ret, -(ErrorCode::MemoryNotRegistered as isize));
        // SAFETY: p2plab_gds_read filled the report.
        let report = unsafe { report.assume_init() };
        assert_eq!(report.path, Path::None as u32);
        // SAFETY: the detail is NUL-terminated by copy_c_string.
        let detail = unsafe { CStr::from_ptr(report.detail.as_ptr()) };
        assert!(detail
            .to_string_lossy()
            .contains("not inside a registered buffer"));
        // SAFETY: negative offsets are refused before any pointer use.
        let ret = unsafe {
            p2plab_gds_read(
                fh,
                host.as_ptr() as *mut c_void,
                1,
                -1,
                0,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(ret, -(ErrorCode::InvalidValue as isize));

        assert_eq!(p2plab_gds_handle_deregister(fh).err, 0);
        assert_eq!(
            p2plab_gds_handle_deregister(fh).err,
            ErrorCode::HandleNotRegistered as i32
        );
        assert_eq!(
            p2plab_gds_mem_free(host.as_ptr() as *mut c_void).err,
            ErrorCode::InvalidValue as i32
        );
        assert_eq!(p2plab_gds_driver_close().err, 0);
        assert_eq!(p2plab_gds_driver_close().err, 0);
        assert_eq!(
            p2plab_gds_driver_close().err,
            ErrorCode::DriverNotInitialized as i32
        );
    }

    static TEST_LOCK: Mutex<()> = Mutex::new(());
}
