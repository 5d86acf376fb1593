//! Sequences of calls into p2plab's cuFile API (`devices/gpu/gds/cufile/`,
//! libcufile.so's entry points), as a cuFile program makes them:
//! `CUfileDescr_t`s with any type, fd and fs_ops pointer, handle pointers
//! NULL or not, driver open and close (and the implicit open on first
//! use), buffer registration of p2pmem allocations, host memory or any
//! address with any flags, reads and writes with any size, file offset and
//! devPtr offset into registered, unregistered and non-GPU memory, the
//! properties calls and setters with any value, `cufileop_status_error`
//! with any number, the last report. The driver runs over the test GPU,
//! as in `gds_c_abi`.
//!
//! Catches a panic, a status or a negative return that is not a
//! documented `CUfileOpError` (or is CU_FILE_INTERNAL_ERROR: the library
//! caught its own panic), a -1 without errno, a read or write whose return
//! value disagrees with its report or moves more than asked, memory left
//! registered by an I/O into unregistered memory, properties that do not
//! hold what the setters recorded, and close counts that disagree with the
//! opens (explicit and implicit).
#![no_main]

#[path = "common/gds_world.rs"]
mod gds_world;

use gds_world::{world, Bytes, VRAM};

use std::ffi::{c_int, c_void, CStr};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;

use cufile::api::*;
use cufile::OpError;
use libfuzzer_sys::fuzz_target;
use p2plab_gds::ffi::{self as gds, CIoReport};

const MAX_CALLS: usize = 40;

/// A status is success or a documented cuFile error, never the library's
/// own panic.
fn check(st: CUfileError) -> bool {
    if st.err == 0 {
        return true;
    }
    let e = OpError::from_i32(st.err).unwrap_or_else(|| panic!("undocumented {}", st.err));
    assert_ne!(e, OpError::InternalError, "{}", last_error());
    false
}

fn last_error() -> String {
    // SAFETY: a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(p2plab_cufile_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let mut input = Bytes(data);
    let Some(size) = input.u8() else { return };
    let path = w.dir.join("f");
    let content: Vec<u8> = (0..u64::from(size) * 512).map(|i| (i * 7) as u8).collect();
    std::fs::write(&path, content).expect("a file");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("the file");
    let dir = std::fs::File::open(&w.dir).expect("the folder");
    let host = vec![0u8; 8192];
    let mut opens = 0u32;
    let mut handles: Vec<*mut c_void> = Vec::new();
    let mut ptrs: Vec<u64> = Vec::new();
    let mut registered: Vec<u64> = Vec::new();
    for _ in 0..MAX_CALLS {
        let Some(op) = input.u8() else { break };
        let addr = |input: &mut Bytes<'_>, ptrs: &[u64]| -> Option<u64> {
            let pick = input.u8()?;
            let offset = input.amount()?;
            Some(match (pick % 4, ptrs.is_empty()) {
                (0 | 1, false) => {
                    ptrs[usize::from(pick / 4) % ptrs.len()].wrapping_add(offset % VRAM)
                }
                (2, _) => host.as_ptr() as u64 + offset % 8192,
                _ => offset,
            })
        };
        match op % 12 {
            0 => {
                assert!(check(cuFileDriverOpen()), "{}", last_error());
                opens += 1;
            }
            1 => {
                let ok = check(cuFileDriverClose());
                assert_eq!(ok, opens > 0, "close with {opens} opens");
                if ok {
                    opens -= 1;
                    if opens == 0 {
                        handles.clear();
                        ptrs.clear();
                        registered.clear();
                    }
                }
            }
            2 => {
                let (Some(t), Some(which), Some(null)) = (input.u8(), input.u8(), input.u8())
                else {
                    break;
                };
                let fd = match which % 4 {
                    0 => file.as_raw_fd(),
                    1 => dir.as_raw_fd(),
                    2 => -1,
                    _ => c_int::from(which),
                };
                let mut d = CUfileDescr {
                    type_: c_int::from(t % 5),
                    handle: DescrHandle { fd },
                    fs_ops: usize::from(null) as *const c_void,
                };
                let mut fh: *mut c_void = std::ptr::null_mut();
                let fh_ptr = if null & 1 == 1 {
                    std::ptr::null_mut()
                } else {
                    &mut fh as *mut _
                };
                let d_ptr = if null & 2 == 2 {
                    std::ptr::null_mut()
                } else {
                    &mut d as *mut _
                };
                // SAFETY: NULL or valid pointers.
                let st = unsafe { cuFileHandleRegister(fh_ptr, d_ptr) };
                if check(st) {
                    assert!(!fh.is_null());
                    handles.push(fh);
                }
            }
            3 => {
                let Some(i) = input.u8() else { break };
                let fh = handles.get(usize::from(i) % handles.len().max(1)).copied();
                cuFileHandleDeregister(fh.unwrap_or(usize::from(i) as *mut c_void));
                handles.retain(|h| Some(*h) != fh);
            }
            4 => {
                let Some(len) = input.amount() else { break };
                let mut ptr: *mut c_void = std::ptr::null_mut();
                // SAFETY: &mut ptr is writable.
                let st =
                    unsafe { gds::p2plab_gds_mem_alloc(&mut ptr, len as usize, std::ptr::null()) };
                if st.err == 0 {
                    ptrs.push(ptr as u64);
                }
            }
            5 => {
                let (Some(at), Some(len), Some(flags)) =
                    (addr(&mut input, &ptrs), input.amount(), input.u8())
                else {
                    break;
                };
                let st =
                    cuFileBufRegister(at as *const c_void, len as usize, c_int::from(flags % 8));
                if check(st) {
                    registered.push(at);
                }
            }
            6 => {
                let Some(at) = addr(&mut input, &ptrs) else {
                    break;
                };
                let ok = check(cuFileBufDeregister(at as *const c_void));
                assert_eq!(ok, registered.contains(&at), "deregister {at:#x}");
                registered.retain(|r| *r != at);
            }
            7 | 8 => {
                let (Some(i), Some(base), Some(len), Some(foff), Some(boff)) = (
                    input.u8(),
                    addr(&mut input, &ptrs),
                    input.amount(),
                    input.amount(),
                    input.amount(),
                ) else {
                    break;
                };
                let fh = handles
                    .get(usize::from(i) % handles.len().max(1))
                    .copied()
                    .unwrap_or(usize::from(i) as *mut c_void);
                // SAFETY: the library checks the range before any use.
                let ret = unsafe {
                    if op % 12 == 7 {
                        cuFileRead(
                            fh,
                            base as *mut c_void,
                            len as usize,
                            foff as i64,
                            boff as i64,
                        )
                    } else {
                        cuFileWrite(
                            fh,
                            base as *const c_void,
                            len as usize,
                            foff as i64,
                            boff as i64,
                        )
                    }
                };
                let mut r = std::mem::MaybeUninit::<CIoReport>::zeroed();
                // SAFETY: r is writable for one struct.
                let have = unsafe { p2plab_cufile_last_report(r.as_mut_ptr()) } == 0;
                if ret == -1 {
                    assert_ne!(std::io::Error::last_os_error().raw_os_error(), Some(0));
                } else if ret < 0 {
                    let e = OpError::from_i32((-ret) as i32)
                        .unwrap_or_else(|| panic!("undocumented {ret}"));
                    assert_ne!(e, OpError::InternalError, "{}", last_error());
                } else if have {
                    // SAFETY: filled by the call.
                    let r = unsafe { r.assume_init() };
                    assert_eq!(r.bytes, ret as u64, "report and return value");
                    assert!(ret as u64 <= len, "moved more than asked");
                    assert_eq!(r.p2p_bytes + r.compat_bytes, r.bytes);
                }
                // An I/O into unregistered memory leaves nothing registered.
                let start = base.wrapping_add(boff);
                if !registered.contains(&start) && len > 0 {
                    let still = cuFileBufDeregister(start as *const c_void).err == 0;
                    assert!(
                        !still || registered.contains(&start),
                        "left registered: {start:#x}"
                    );
                }
            }
            9 => {
                let (Some(which), Some(v)) = (input.u8(), input.amount()) else {
                    break;
                };
                let v = v as usize;
                let st = match which % 4 {
                    0 => cuFileDriverSetMaxDirectIOSize(v),
                    1 => cuFileDriverSetMaxCacheSize(v),
                    2 => cuFileDriverSetMaxPinnedMemSize(v),
                    _ => cuFileDriverSetPollMode(v & 1 == 1, v),
                };
                let ok = check(st);
                assert!(ok || v == 0, "refused {v}");
                if ok && which % 4 == 0 {
                    let mut p = CUfileDrvProps::default();
                    // SAFETY: &mut p is writable.
                    if check(unsafe { cuFileDriverGetProperties(&mut p) }) {
                        assert_eq!(p.nvfs.max_direct_io_size, v);
                    }
                }
            }
            10 => {
                let Some(n) = input.u64() else { break };
                // SAFETY: a static NUL-terminated string.
                let text = unsafe { CStr::from_ptr(cufileop_status_error(n as i32)) };
                assert!(text.to_str().is_ok());
            }
            _ => {
                let mut v = 0;
                // SAFETY: &mut v is writable.
                assert!(check(unsafe { cuFileGetVersion(&mut v) }));
                assert_eq!(v, CUFILE_VERSION);
            }
        }
        // Registration, I/O and GetProperties open the driver on first
        // use (one open, closed by one close).
        if opens == 0 && gds_open() {
            opens = 1;
        }
    }
    while opens > 0 {
        assert!(check(cuFileDriverClose()), "{}", last_error());
        opens -= 1;
    }
    assert_eq!(
        cuFileDriverClose().err,
        OpError::DriverNotInitialized as i32,
        "opens left"
    );
});

/// Whether p2plab-gds's driver is open (a read or write opens it on
/// first use even when it then fails).
fn gds_open() -> bool {
    gds::p2plab_gds_driver_set_force_compat(0).err == 0
}
