//! The C ABI end to end on the test GPU (`testing::FakeGpu`): the library's
//! real sysfs and /proc/self/maps parsing, mmap of p2pmem, file I/O,
//! planner, executor and registrations, with the kernel's two answers
//! (the GPU's ioctls, physical addresses) given by the test GPU.
//!
//! Catches a C ABI that cannot find, allocate, register or describe GPU
//! memory it should, a read or write that moves other bytes than asked
//! (on the compat path and, where the file system takes O_DIRECT, the P2P
//! path), a report whose byte counts disagree with the return value, and
//! registrations that outlive the last driver close.

use std::ffi::{c_void, CStr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

use p2plab_gds::ffi::{self, CBufInfo, CIoReport, BUF_P2PMEM};
use p2plab_gds::testing::{FakeGpu, GPU_BDF};
use p2plab_gds::{ErrorCode, Path};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(ffi::p2plab_gds_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Reads or writes through the ABI; returns the result and the report.
fn io(
    write: bool,
    fh: u64,
    base: *mut c_void,
    size: usize,
    file_offset: i64,
) -> (isize, CIoReport) {
    let mut report = std::mem::MaybeUninit::<CIoReport>::zeroed();
    // SAFETY: `report` is writable for one struct; `base` is registered.
    let ret = unsafe {
        if write {
            ffi::p2plab_gds_write(fh, base, size, file_offset, 0, report.as_mut_ptr())
        } else {
            ffi::p2plab_gds_read(fh, base, size, file_offset, 0, report.as_mut_ptr())
        }
    };
    // SAFETY: the call filled the report.
    (ret, unsafe { report.assume_init() })
}

#[test]
fn reads_and_writes_move_the_right_bytes_on_both_paths() {
    let dir = std::env::temp_dir().join(format!("p2plab-gds-abi-{}", std::process::id()));
    let gpu = FakeGpu::new(&dir, 1 << 20).expect("test GPU");
    let for_abi = gpu.clone();
    ffi::inject_driver(Some(Box::new(move || Ok(for_abi.driver()))));
    assert_eq!(ffi::p2plab_gds_driver_open().err, 0, "{}", last_error());

    const LEN: usize = 64 << 10;
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: &mut ptr is writable; NULL picks the first GPU.
    let st = unsafe { ffi::p2plab_gds_mem_alloc(&mut ptr, LEN, std::ptr::null()) };
    assert_eq!(st.err, 0, "{}", last_error());
    assert_eq!(
        ffi::p2plab_gds_buf_register(ptr, LEN, 0).err,
        0,
        "{}",
        last_error()
    );
    let mut info = std::mem::MaybeUninit::<CBufInfo>::zeroed();
    // SAFETY: info is writable for one struct.
    let st = unsafe {
        ffi::p2plab_gds_buf_info(
            ptr.cast::<u8>().wrapping_add(4096).cast(),
            info.as_mut_ptr(),
        )
    };
    assert_eq!(st.err, 0, "{}", last_error());
    // SAFETY: filled by the call.
    let info = unsafe { info.assume_init() };
    // SAFETY: NUL-terminated by the library.
    let name = unsafe { CStr::from_ptr(info.gpu.as_ptr()) };
    assert_eq!(name.to_str(), Ok(GPU_BDF));
    assert_eq!(
        (info.kind, info.vram_offset, info.size),
        (BUF_P2PMEM, 4096, (LEN - 4096) as u64)
    );

    // A file on a device that is not on PCI: compat, through the engine.
    let path = dir.join("data");
    let content = pattern(3 * LEN, 7);
    std::fs::write(&path, &content).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut fh = 0u64;
    // SAFETY: &mut fh is writable; the fd stays open.
    let st = unsafe { ffi::p2plab_gds_handle_register(&mut fh, file.as_raw_fd()) };
    assert_eq!(st.err, 0, "{}", last_error());
    let (ret, report) = io(false, fh, ptr, LEN, LEN as i64);
    assert_eq!(ret, LEN as isize, "{}", last_error());
    assert_eq!(report.path, Path::Compat as u32);
    assert_eq!(
        (report.bytes, report.compat_bytes, report.p2p_bytes),
        (LEN as u64, LEN as u64, 0)
    );
    let mut vram = vec![0u8; LEN];
    gpu.read_vram(0, &mut vram).unwrap();
    assert!(
        vram == content[LEN..2 * LEN],
        "the read left other bytes in VRAM"
    );
    let mut crc = 0u32;
    // SAFETY: crc is writable.
    let st = unsafe { ffi::p2plab_gds_checksum(ptr, LEN, &mut crc) };
    assert_eq!(st.err, 0, "{}", last_error());
    assert_eq!(crc, crc32c::crc32c(&content[LEN..2 * LEN]));

    // The same file system's device under the GPU's switch: P2P where it
    // takes O_DIRECT.
    gpu.put_storage_on_pci(std::fs::metadata(&path).unwrap().dev())
        .unwrap();
    let mut p2p_fh = 0u64;
    // SAFETY: as above.
    let st = unsafe { ffi::p2plab_gds_handle_register(&mut p2p_fh, file.as_raw_fd()) };
    assert_eq!(st.err, 0, "{}", last_error());
    let fresh = pattern(LEN, 99);
    gpu.write_vram(0, &fresh).unwrap();
    let (ret, report) = io(true, p2p_fh, ptr, LEN, 0);
    assert_eq!(ret, LEN as isize, "{}", last_error());
    assert_eq!(report.p2p_bytes + report.compat_bytes, LEN as u64);
    let mut written = vec![0u8; LEN];
    file.read_exact_at(&mut written, 0).unwrap();
    assert!(written == fresh, "the write stored other bytes in the file");
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .is_ok();
    if direct {
        assert_eq!(
            report.path,
            Path::P2p as u32,
            "O_DIRECT works here, yet no P2P"
        );
    } else {
        eprintln!(
            "{}: no O_DIRECT here, the P2P path is not checked",
            dir.display()
        );
    }

    // The last close drops every registration.
    assert_eq!(ffi::p2plab_gds_driver_close().err, 0);
    let (ret, _) = io(false, fh, ptr, 512, 0);
    assert_eq!(ret, -(ErrorCode::DriverNotInitialized as isize));
    ffi::inject_driver(None);
    let _ = std::fs::remove_dir_all(&dir);
}
