//! Static names for codes, reasons and paths, and the thread's last error.

use std::ffi::{c_char, c_int, CStr};

use super::LAST_ERROR;
use crate::error::ErrorCode;
use crate::report::{Path, Reason};

fn static_str(text: &'static CStr) -> *const c_char {
    text.as_ptr()
}

/// Name of a P2PLAB_GDS_* code (static string).
#[no_mangle]
pub extern "C" fn p2plab_gds_error_string(err: c_int) -> *const c_char {
    let text = ErrorCode::from_i32(err.saturating_abs())
        .map(ErrorCode::describe_c)
        .unwrap_or(c"unknown error code");
    static_str(text)
}

/// Name of one P2PLAB_GDS_REASON_* bit, e.g. "alignment" (static string).
#[no_mangle]
pub extern "C" fn p2plab_gds_reason_name(reason: u32) -> *const c_char {
    static_str(match Reason::from_bit(reason) {
        Some(Reason::Alignment) => c"alignment",
        Some(Reason::EofTail) => c"eof_tail",
        Some(Reason::Sparse) => c"sparse",
        Some(Reason::Append) => c"append",
        Some(Reason::FsNoDirectIo) => c"fs_no_direct_io",
        Some(Reason::FsRefused) => c"fs_refused",
        Some(Reason::Topology) => c"topology",
        Some(Reason::NotPciStorage) => c"not_pci_storage",
        Some(Reason::NotP2pmem) => c"not_p2pmem",
        Some(Reason::Forced) => c"forced",
        None => c"unknown",
    })
}

/// Name of a P2PLAB_GDS_PATH_* value (static string).
#[no_mangle]
pub extern "C" fn p2plab_gds_path_name(path: u32) -> *const c_char {
    static_str(match path {
        p if p == Path::None as u32 => c"none",
        p if p == Path::P2p as u32 => c"p2p",
        p if p == Path::Compat as u32 => c"compat",
        p if p == Path::Mixed as u32 => c"mixed",
        _ => c"unknown",
    })
}

/// The full text of this thread's last failure ("" after a success);
/// valid until this thread's next p2plab_gds_* call.
#[no_mangle]
pub extern "C" fn p2plab_gds_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}
