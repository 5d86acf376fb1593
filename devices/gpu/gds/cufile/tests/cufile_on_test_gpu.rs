//! cuFile's API end to end on p2plab-gds's test GPU (`testing::FakeGpu`):
//! the real library (sysfs, maps, p2pmem mmap, planner, executor) under
//! cuFile's entry points, with VRAM read back from the test GPU.
//!
//! Catches: cuFile calls answering with p2plab-gds's numbers instead of
//! cuFile's, argument checks missing (NULL, handle types, flags, negative
//! offsets, ranges past a buffer), a 5-argument read or write that
//! ignores or misapplies devPtr_offset or file_offset (the bytes land
//! elsewhere in VRAM or the file), short reads not short, a report that
//! disagrees with the return value, unregistered GPU memory refused (cuFile
//! takes it) or left registered after the call, a void deregistration
//! that fails silently without a last error, and the driver's open count
//! (explicit, and implicit on first use).

use std::ffi::{c_void, CStr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use cufile::api::*;
use p2plab_gds::ffi::{self as gds, CBufInfo, CIoReport};
use p2plab_gds::testing::FakeGpu;
use p2plab_gds::{Path, Reason};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(p2plab_cufile_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn last_report() -> CIoReport {
    let mut r = std::mem::MaybeUninit::<CIoReport>::zeroed();
    // SAFETY: r is writable for one struct.
    assert_eq!(unsafe { p2plab_cufile_last_report(r.as_mut_ptr()) }, 0);
    // SAFETY: filled by the call.
    unsafe { r.assume_init() }
}

fn descr(type_: i32, fd: i32) -> CUfileDescr {
    CUfileDescr {
        type_,
        handle: DescrHandle { fd },
        fs_ops: std::ptr::null(),
    }
}

fn register(fd: i32) -> (CUfileError, *mut c_void) {
    let mut fh: *mut c_void = std::ptr::null_mut();
    let mut d = descr(HANDLE_TYPE_OPAQUE_FD, fd);
    // SAFETY: both pointers are valid.
    (unsafe { cuFileHandleRegister(&mut fh, &mut d) }, fh)
}

fn read(fh: *mut c_void, base: *mut c_void, size: usize, foff: i64, boff: i64) -> isize {
    // SAFETY: the range is checked by the library.
    unsafe { cuFileRead(fh, base, size, foff, boff) }
}

fn vram_offset(ptr: *const c_void) -> u64 {
    let mut info = std::mem::MaybeUninit::<CBufInfo>::zeroed();
    // SAFETY: info is writable for one struct.
    let st = unsafe { gds::p2plab_gds_buf_info(ptr, info.as_mut_ptr()) };
    assert_eq!(st.err, 0);
    // SAFETY: filled by the call.
    unsafe { info.assume_init() }.vram_offset
}

fn alloc(len: usize) -> *mut c_void {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: &mut ptr is writable; NULL picks the first GPU.
    let st = unsafe { gds::p2plab_gds_mem_alloc(&mut ptr, len, std::ptr::null()) };
    assert_eq!(st.err, 0, "{}", last_error());
    ptr
}

#[test]
fn cufile_api_on_the_test_gpu() {
    // Before any open: cuFile's "not initialized", not p2plab's number.
    assert_eq!(cuFileDriverClose().err, 5001);
    assert_eq!(cuFileBufDeregister(std::ptr::null()).err, 5001);
    let mut version = 0;
    // SAFETY: &mut version is writable.
    assert_eq!(unsafe { cuFileGetVersion(&mut version) }.err, 0);
    assert_eq!(version, CUFILE_VERSION);
    // SAFETY: NULL is refused before use.
    assert_eq!(unsafe { cuFileGetVersion(std::ptr::null_mut()) }.err, 5022);

    let dir = std::env::temp_dir().join(format!("p2plab-cufile-{}", std::process::id()));
    let gpu = FakeGpu::new(&dir, 1 << 20).expect("test GPU");
    let for_abi = gpu.clone();
    gds::inject_driver(Some(Box::new(move || Ok(for_abi.driver()))));

    // Properties open the driver on first use (one implicit open).
    assert_eq!(cuFileDriverSetMaxDirectIOSize(0).err, 5022);
    assert_eq!(cuFileDriverSetMaxDirectIOSize(512).err, 0);
    assert_eq!(cuFileDriverSetMaxCacheSize(0).err, 5022);
    assert_eq!(cuFileDriverSetMaxPinnedMemSize(1 << 20).err, 0);
    assert_eq!(cuFileDriverSetPollMode(true, 8).err, 0);
    let mut props = CUfileDrvProps::default();
    // SAFETY: &mut props is writable.
    let st = unsafe { cuFileDriverGetProperties(&mut props) };
    assert_eq!(st.err, 0, "{}", last_error());
    assert_eq!(props.nvfs.max_direct_io_size, 512);
    assert_eq!(props.nvfs.poll_thresh_size, 8);
    assert_eq!(props.nvfs.dstatusflags, 1 << NVME_SUPPORTED);
    assert_eq!(
        props.nvfs.dcontrolflags,
        (1 << ALLOW_COMPAT_MODE) | (1 << USE_POLL_MODE)
    );
    assert_eq!(props.per_buffer_cache_size, 4096, "the 4 MiB bounce buffer");
    assert_eq!(props.max_device_pinned_mem_size, 1 << 20);
    assert_eq!(props.fflags, 0, "no batch, streams or dynamic routing");
    assert_eq!(cuFileDriverSetPollMode(false, 4).err, 0);
    // And an explicit open on top: two closes needed.
    assert_eq!(cuFileDriverOpen().err, 0, "{}", last_error());

    const LEN: usize = 64 << 10;
    let ptr = alloc(LEN);
    assert_eq!(cuFileBufRegister(ptr, LEN, 4).err, 5022, "unknown flag");
    assert_eq!(cuFileBufRegister(ptr, LEN, 1).err, 0, "{}", last_error());
    assert_eq!(cuFileBufRegister(ptr, LEN, 0).err, 5023);
    let host = vec![0u8; 4096];
    assert_eq!(cuFileBufRegister(host.as_ptr().cast(), 4096, 0).err, 5012);
    let base_vram = vram_offset(ptr);

    // Handles: argument checks, then a file of 3 * LEN bytes.
    let path = dir.join("data");
    let content = pattern(3 * LEN, 7);
    std::fs::write(&path, &content).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let fd = file.as_raw_fd();
    let mut fh: *mut c_void = std::ptr::null_mut();
    // SAFETY: NULL descriptor is refused before use.
    let st = unsafe { cuFileHandleRegister(&mut fh, std::ptr::null_mut()) };
    assert_eq!(st.err, 5022);
    for (type_, want) in [
        (HANDLE_TYPE_USERSPACE_FS, 5008),
        (HANDLE_TYPE_OPAQUE_WIN32, 5008),
        (9, 5022),
    ] {
        let mut d = descr(type_, fd);
        // SAFETY: both pointers are valid.
        let st = unsafe { cuFileHandleRegister(&mut fh, &mut d) };
        assert_eq!(st.err, want, "type {type_}");
    }
    assert_eq!(register(-1).0.err, 5022);
    assert_eq!(register(9999).0.err, 5022, "not an open fd (EBADF)");
    let dir_fd = std::fs::File::open(&dir).unwrap();
    assert_eq!(register(dir_fd.as_raw_fd()).0.err, 5018, "a directory");
    let (st, fh) = register(fd);
    assert_eq!(st.err, 0, "{}", last_error());
    assert!(!fh.is_null());

    // A read with both offsets: file [LEN, LEN + 4096) lands at
    // devPtr + 8192, and nothing else in VRAM changes.
    gpu.write_vram(base_vram, &vec![0xee; LEN]).unwrap();
    assert_eq!(
        read(fh, ptr, 4096, LEN as i64, 8192),
        4096,
        "{}",
        last_error()
    );
    let mut vram = vec![0u8; LEN];
    gpu.read_vram(base_vram, &mut vram).unwrap();
    assert!(vram[8192..8192 + 4096] == content[LEN..LEN + 4096]);
    assert!(vram[..8192]
        .iter()
        .chain(&vram[8192 + 4096..])
        .all(|b| *b == 0xee));
    let r = last_report();
    assert_eq!((r.bytes, r.compat_bytes, r.p2p_bytes), (4096, 4096, 0));
    assert_eq!(r.path, Path::Compat as u32);
    assert_eq!(
        r.reasons,
        Reason::NotPciStorage.bit(),
        "a temp dir is not on PCI"
    );

    // Argument and range checks in cuFile's numbers.
    assert_eq!(read(fh, ptr, 4096, -1, 0), -5022);
    assert_eq!(read(fh, ptr, 4096, 0, -1), -5022);
    assert_eq!(
        read(fh, ptr, 4096, 0, (LEN - 100) as i64),
        -5022,
        "past the buffer"
    );
    assert_eq!(read(0xdead as *mut c_void, ptr, 4096, 0, 0), -5027);
    assert_eq!(read(fh, host.as_ptr() as *mut c_void, 4096, 0, 0), -5012);
    let r = last_report();
    assert_eq!(r.bytes, 0);
    // SAFETY: NUL-terminated by the library.
    let detail = unsafe { CStr::from_ptr(r.detail.as_ptr()) }.to_string_lossy();
    assert!(detail.contains("POINTER_INVALID"), "{detail}");

    // A short read at the end of the file.
    assert_eq!(read(fh, ptr, 4096, (3 * LEN - 100) as i64, 0), 100);
    assert_eq!(last_report().eof, 1);

    // A write with both offsets: VRAM [8192, +4096) at file 3 * LEN
    // (appending to the file).
    let fresh = pattern(4096, 99);
    gpu.write_vram(base_vram + 8192, &fresh).unwrap();
    // SAFETY: the range is registered.
    let ret = unsafe { cuFileWrite(fh, ptr, 4096, (3 * LEN) as i64, 8192) };
    assert_eq!(ret, 4096, "{}", last_error());
    let mut written = vec![0u8; 4096];
    file.read_exact_at(&mut written, (3 * LEN) as u64).unwrap();
    assert!(written == fresh, "the write stored other bytes");
    assert_eq!(last_report().bytes, 4096);

    // Unregistered GPU memory works, for the call only.
    let other = alloc(LEN);
    assert_eq!(read(fh, other, 4096, 0, 4096), 4096, "{}", last_error());
    assert_eq!(cuFileBufDeregister(other).err, 5022, "left registered");
    assert_eq!(cuFileBufRegister(other, LEN, 0).err, 0);
    let mut got = vec![0u8; 4096];
    gpu.read_vram(vram_offset(other) + 4096, &mut got).unwrap();
    assert!(got == content[..4096]);
    assert_eq!(cuFileBufDeregister(other).err, 0);

    // A write through a read-only handle.
    let ro = std::fs::File::open(&path).unwrap();
    let (st, ro_fh) = register(ro.as_raw_fd());
    assert_eq!(st.err, 0);
    // SAFETY: the range is registered.
    assert_eq!(unsafe { cuFileWrite(ro_fh, ptr, 4096, 0, 0) }, -5008);
    cuFileHandleDeregister(ro_fh);

    // Deregistration: void, with the reason of a failure kept.
    cuFileHandleDeregister(fh);
    assert_eq!(last_error(), "");
    assert_eq!(read(fh, ptr, 4096, 0, 0), -5027);
    cuFileHandleDeregister(fh);
    assert!(last_error().contains("not registered"), "{}", last_error());
    assert_eq!(cuFileBufDeregister(ptr).err, 0);
    assert_eq!(
        cuFileBufDeregister(ptr).err,
        5022,
        "documented: INVALID_VALUE"
    );

    // The explicit and the implicit open: two closes, then none left.
    assert_eq!(cuFileDriverClose_v2().err, 0);
    assert_eq!(cuFileDriverClose().err, 0);
    assert_eq!(cuFileDriverClose().err, 5001);
    // SAFETY: a static string.
    let text = unsafe { CStr::from_ptr(cufileop_status_error(5022)) };
    assert_eq!(text.to_str(), Ok("invalid argument"));
    gds::inject_driver(None);
    let _ = std::fs::remove_dir_all(&dir);
}
