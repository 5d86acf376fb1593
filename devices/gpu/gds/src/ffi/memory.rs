//! GPU memory through the C ABI: allocation (p2pmem or a
//! /dev/p2plab-gpuN mapping), registration, where a buffer lives, and the
//! GPU engine's copies and checksum.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use super::{
    copy_c_string, find_buffer, guarded, overlaps_registration, status_of, with_state, CBufInfo,
    Registered, Status, BUF_DEVMAP, BUF_P2PMEM,
};
use crate::error::{ErrorCode, GdsError, Result};
use crate::vram::{VramKind, VramMapping, VRAM_BAR};

/// # Safety
/// `gpu` is NULL or a NUL-terminated string.
unsafe fn gpu_arg(gpu: *const c_char) -> Result<Option<String>> {
    if gpu.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and NUL-terminated per the header.
    let text = unsafe { CStr::from_ptr(gpu) };
    text.to_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| GdsError::invalid("the GPU name is not UTF-8"))
}

fn store_allocation(ptr: *mut *mut c_void, mapping: VramMapping) -> Result<()> {
    let mapping = Arc::new(mapping);
    let addr = mapping.as_ptr();
    with_state(|s| {
        s.allocs.insert(addr as u64, mapping);
        Ok(())
    })?;
    // SAFETY: the caller checked ptr non-NULL; it provides the memory.
    unsafe { ptr.write(addr.cast()) };
    Ok(())
}

/// Allocates `size` bytes of the GPU's p2pmem (O_DIRECT-capable VRAM).
///
/// # Safety
/// `ptr` is NULL or writable; `gpu` is NULL or a NUL-terminated BDF.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_mem_alloc(
    ptr: *mut *mut c_void,
    size: usize,
    gpu: *const c_char,
) -> Status {
    status_of(guarded(|| {
        if ptr.is_null() || size == 0 {
            return Err(GdsError::invalid("NULL pointer or zero size"));
        }
        // SAFETY: the caller's contract for `gpu`.
        let gpu = unsafe { gpu_arg(gpu) }?;
        let driver = with_state(|s| Ok(s.driver.clone()))?;
        store_allocation(ptr, driver.alloc_vram(gpu.as_deref(), size as u64)?)
    }))
}

/// Maps `size` bytes of VRAM at `vram_offset` through /dev/p2plab-gpuN
/// (such buffers always take the compat path).
///
/// # Safety
/// As for `p2plab_gds_mem_alloc`.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_mem_map_vram(
    ptr: *mut *mut c_void,
    size: usize,
    vram_offset: u64,
    gpu: *const c_char,
) -> Status {
    status_of(guarded(|| {
        if ptr.is_null() || size == 0 {
            return Err(GdsError::invalid("NULL pointer or zero size"));
        }
        // SAFETY: the caller's contract for `gpu`.
        let gpu = unsafe { gpu_arg(gpu) }?;
        let driver = with_state(|s| Ok(s.driver.clone()))?;
        store_allocation(
            ptr,
            driver.map_vram(gpu.as_deref(), vram_offset, size as u64)?,
        )
    }))
}

/// Frees memory from `p2plab_gds_mem_alloc`/`_map_vram` (deregister first).
#[no_mangle]
pub extern "C" fn p2plab_gds_mem_free(ptr: *mut c_void) -> Status {
    status_of(guarded(|| {
        with_state(|s| {
            let addr = ptr as u64;
            let Some(mapping) = s.allocs.get(&addr) else {
                return Err(GdsError::invalid(format!(
                    "{addr:#x} was not returned by p2plab_gds_mem_alloc"
                )));
            };
            if overlaps_registration(s, addr, mapping.len() as u64) {
                return Err(GdsError::new(
                    ErrorCode::MemoryAlreadyRegistered,
                    "the memory is still registered: p2plab_gds_buf_deregister it first",
                ));
            }
            s.allocs.remove(&addr);
            Ok(())
        })
    }))
}

/// Registers GPU memory for I/O (`flags` must be 0).
#[no_mangle]
pub extern "C" fn p2plab_gds_buf_register(ptr: *const c_void, size: usize, flags: c_int) -> Status {
    status_of(guarded(|| {
        if ptr.is_null() || size == 0 || flags != 0 {
            return Err(GdsError::invalid(
                "NULL pointer, zero size or unknown flags",
            ));
        }
        let addr = ptr as u64;
        let len = size as u64;
        // A range that wraps the address space is no buffer; refusing it
        // here keeps every `addr + len` below in range.
        let end = addr
            .checked_add(len)
            .ok_or_else(|| GdsError::invalid("[ptr, ptr + size) wraps the address space"))?;
        let (driver, alloc) = with_state(|s| {
            if overlaps_registration(s, addr, len) {
                return Err(GdsError::new(
                    ErrorCode::MemoryAlreadyRegistered,
                    format!("[{addr:#x}, +{len}) overlaps a registered buffer"),
                ));
            }
            let alloc = s
                .allocs
                .range(..=addr)
                .next_back()
                .filter(|(a, m)| a.checked_add(m.len() as u64).is_some_and(|e| end <= e))
                .map(|(_, m)| m.clone());
            Ok((s.driver.clone(), alloc))
        })?;
        // SAFETY: the header makes the caller keep [ptr, ptr + size)
        // mapped while registered; a library allocation is additionally
        // kept alive by the registration (`_alloc`).
        let buf = unsafe { driver.register_buffer(ptr.cast_mut().cast(), len) }?;
        with_state(|s| {
            if overlaps_registration(s, addr, len) {
                return Err(GdsError::new(
                    ErrorCode::MemoryAlreadyRegistered,
                    "registered concurrently by another thread",
                ));
            }
            s.buffers.insert(
                addr,
                Registered {
                    buf: Arc::new(buf),
                    _alloc: alloc,
                },
            );
            Ok(())
        })
    }))
}

#[no_mangle]
pub extern "C" fn p2plab_gds_buf_deregister(ptr: *const c_void) -> Status {
    status_of(guarded(|| {
        with_state(|s| match s.buffers.remove(&(ptr as u64)) {
            Some(_) => Ok(()),
            None => Err(GdsError::new(
                ErrorCode::MemoryNotRegistered,
                format!("{ptr:?} is not the start of a registered buffer"),
            )),
        })
    }))
}

/// Where a registered buffer lives: GPU, kind, BAR and VRAM offset.
///
/// # Safety
/// `info` is NULL or writable for one struct.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_buf_info(ptr: *const c_void, info: *mut CBufInfo) -> Status {
    status_of(guarded(|| {
        if info.is_null() {
            return Err(GdsError::invalid("NULL info pointer"));
        }
        let (buf, offset) = with_state(|s| find_buffer(s, ptr as u64, 1))?;
        let mut out = CBufInfo {
            gpu: [0; 16],
            kind: match buf.location.kind {
                VramKind::P2pmem => BUF_P2PMEM,
                VramKind::DeviceMap => BUF_DEVMAP,
            },
            bar: VRAM_BAR as u32,
            vram_offset: buf.vram_offset(offset),
            size: buf.len - offset,
        };
        copy_c_string(&mut out.gpu, &buf.location.bdf);
        // SAFETY: checked non-NULL; the caller provides the memory.
        unsafe { info.write(out) };
        Ok(())
    }))
}

/// CRC32C of registered GPU memory, computed by the GPU's engine.
///
/// # Safety
/// `crc` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_checksum(
    ptr: *const c_void,
    size: usize,
    crc: *mut u32,
) -> Status {
    status_of(guarded(|| {
        if crc.is_null() {
            return Err(GdsError::invalid("NULL result pointer"));
        }
        let (buf, offset) = with_state(|s| find_buffer(s, ptr as u64, size as u64))?;
        let value = buf.checksum(offset, size as u64)?;
        // SAFETY: checked non-NULL; the caller provides the memory.
        unsafe { crc.write(value) };
        Ok(())
    }))
}

/// Host memory -> registered GPU memory, by the GPU engine.
///
/// # Safety
/// `src` is valid for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_memcpy_htod(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
) -> Status {
    status_of(guarded(|| {
        if src.is_null() {
            return Err(GdsError::invalid("NULL source"));
        }
        let (buf, offset) = with_state(|s| find_buffer(s, dst as u64, size as u64))?;
        // SAFETY: the caller makes src valid for size bytes (memcpy's
        // contract); we only read it.
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), size) };
        buf.copy_from_host(offset, data)
    }))
}

/// Registered GPU memory -> host memory, by the GPU engine.
///
/// # Safety
/// `dst` is valid for `size` bytes and not otherwise in use.
#[no_mangle]
pub unsafe extern "C" fn p2plab_gds_memcpy_dtoh(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
) -> Status {
    status_of(guarded(|| {
        if dst.is_null() {
            return Err(GdsError::invalid("NULL destination"));
        }
        let (buf, offset) = with_state(|s| find_buffer(s, src as u64, size as u64))?;
        // SAFETY: the caller makes dst valid and exclusively ours for size
        // bytes (memcpy's contract).
        let data = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), size) };
        buf.copy_to_host(offset, data)
    }))
}
