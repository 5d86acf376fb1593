//! Sequences of calls into p2plab-gds's C ABI (`devices/gpu/gds/src/ffi/`),
//! as a C program makes them: driver open and close (reference counted),
//! force-compat, file handles registered on regular files opened every
//! way (read-write, read-only, write-only append, O_DIRECT) and on
//! descriptors that are not files, GPU memory allocated (p2pmem) or mapped
//! (/dev/p2plab-gpuN), registered and deregistered at any offset and
//! size, freed, described; reads and writes with any sizes and file and
//! buffer offsets, with and without a report; checksums and copies; the
//! name functions with any number. The driver runs over the test GPU
//! (`p2plab_gds::testing::FakeGpu`, injected with `ffi::inject_driver`):
//! real sysfs and /proc/self/maps parsing, mmap, file I/O (on tmpfs, whose
//! device the input can place on PCI so the P2P path runs O_DIRECT into
//! the VRAM mapping), planner, executor and registration table; only the
//! GPU's ioctls and physical addresses come from the test GPU.
//!
//! Catches a panic (or one caught at the C boundary: Internal Error), an
//! error code the header does not define, a registration table that
//! disagrees with a model of it (a double or overlapping registration
//! accepted, a registered handle or buffer refused, a close that leaves
//! registrations), a read or write whose return value and report disagree
//! or that moves other bytes than asked between the file and VRAM, a
//! checksum or copy of other bytes, and a buffer described at another
//! VRAM offset than the one it maps.
#![no_main]

#[path = "common/gds_world.rs"]
mod gds_world;

use gds_world::{world, Bytes};

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use p2plab_gds::ffi::{self, CBufInfo, CIoReport, Status, BUF_P2PMEM};
use p2plab_gds::testing::GPU_BDF;
use p2plab_gds::{ErrorCode, Path};

/// The most bytes a copy or checksum moves through host memory.
const HOST: usize = 64 << 10;
const MAX_CALLS: usize = 48;

/// An open file and what it is.
struct Fd {
    file: Option<File>,
    path: Option<PathBuf>,
    append: bool,
}

impl Fd {
    fn raw(&self) -> i32 {
        self.file.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }
}

/// What the model knows of the library's table.
#[derive(Default)]
struct Model {
    opens: u32,
    /// Handle -> the fd's index.
    handles: BTreeMap<u64, usize>,
    /// Registered buffers: start -> length.
    buffers: BTreeMap<u64, u64>,
    /// Library allocations: start -> length (every one maps VRAM from 0).
    allocs: BTreeMap<u64, u64>,
}

impl Model {
    fn clear(&mut self) {
        *self = Model::default();
    }
    fn overlaps(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        self.buffers
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &l)| s.saturating_add(l) > start)
    }
    /// The registered buffer holding `[addr, addr + len)`.
    fn buffer(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.buffers.range(..=addr).next_back()?;
        (addr - s)
            .checked_add(len)
            .filter(|end| *end <= l)
            .map(|_| (s, l))
    }
    /// The VRAM offset of `addr`, in a library allocation.
    fn vram_offset(&self, addr: u64) -> Option<u64> {
        let (&s, &l) = self.allocs.range(..=addr).next_back()?;
        (addr - s < l).then_some(addr - s)
    }
}

/// A status is success or a code the header defines, never the library
/// catching its own panic.
fn check_status(st: Status) -> Option<ErrorCode> {
    if st.err == 0 {
        assert_eq!(st.sys_errno, 0, "success with an errno");
        return None;
    }
    let code = ErrorCode::from_i32(st.err).unwrap_or_else(|| panic!("undefined code {}", st.err));
    assert_ne!(
        code,
        ErrorCode::InternalError,
        "the library panicked: {}",
        last_error()
    );
    assert!(st.sys_errno >= 0);
    Some(code)
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(ffi::p2plab_gds_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn vram(offset: u64, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    world().gpu.read_vram(offset, &mut data).expect("VRAM");
    data
}

fn open_fds(dir: &std::path::Path, sizes: [u64; 2]) -> Vec<Fd> {
    let a = dir.join("a");
    let b = dir.join("b");
    for (path, size) in [(&a, sizes[0]), (&b, sizes[1])] {
        let content: Vec<u8> = (0..size).map(|i| (i * 13 + size) as u8).collect();
        std::fs::write(path, content).expect("a file");
    }
    let open = |path: &PathBuf, rw: (bool, bool), flags: i32, append: bool| Fd {
        file: OpenOptions::new()
            .read(rw.0)
            .write(rw.1)
            .append(append)
            .custom_flags(flags)
            .open(path)
            .ok(),
        path: Some(path.clone()),
        append,
    };
    vec![
        open(&a, (true, true), 0, false),
        open(&a, (true, false), 0, false),
        open(&a, (false, true), 0, true),
        open(&b, (true, true), libc::O_DIRECT, false),
        Fd {
            file: File::open(dir).ok(),
            path: None,
            append: false,
        },
        Fd {
            file: None,
            path: None,
            append: false,
        },
    ]
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let mut input = Bytes(data);
    let (Some(sa), Some(sb)) = (input.u8(), input.u8()) else {
        return;
    };
    let fds = open_fds(&w.dir, [u64::from(sa) * 1024, u64::from(sb) * 512]);
    let mut host = vec![0u8; HOST];
    let mut model = Model::default();
    let mut ptrs: Vec<u64> = Vec::new();
    for _ in 0..MAX_CALLS {
        let Some(op) = input.u8() else { break };
        // A buffer address: near an allocation, or anything.
        let addr = |input: &mut Bytes<'_>| -> Option<u64> {
            let pick = input.u8()?;
            let offset = input.amount()?;
            Some(match (pick % 4, ptrs.is_empty()) {
                (0 | 1, false) => ptrs[usize::from(pick / 4) % ptrs.len()].wrapping_add(offset),
                (2, _) => host.as_ptr() as u64 + offset % HOST as u64,
                _ => offset,
            })
        };
        match op % 16 {
            0 => {
                let st = ffi::p2plab_gds_driver_open();
                assert_eq!(check_status(st), None, "open: {}", last_error());
                model.opens += 1;
            }
            1 => {
                let st = ffi::p2plab_gds_driver_close();
                if model.opens == 0 {
                    assert_eq!(check_status(st), Some(ErrorCode::DriverNotInitialized));
                } else {
                    assert_eq!(check_status(st), None);
                    model.opens -= 1;
                    if model.opens == 0 {
                        model.clear();
                        ptrs.clear();
                    }
                }
            }
            2 => {
                let Some(on) = input.u8() else { break };
                let st = ffi::p2plab_gds_driver_set_force_compat(i32::from(on & 1));
                assert_eq!(check_status(st).is_none(), model.opens > 0);
            }
            3 => {
                let _ = w.gpu.put_storage_on_pci(w.st_dev);
            }
            4 => {
                let Some(which) = input.u8() else { break };
                let index = usize::from(which) % fds.len();
                let mut fh = 0u64;
                let out = if which & 0x80 != 0 {
                    std::ptr::null_mut()
                } else {
                    &mut fh as *mut u64
                };
                // SAFETY: NULL or a writable u64.
                let st = unsafe { ffi::p2plab_gds_handle_register(out, fds[index].raw()) };
                if check_status(st).is_none() {
                    assert!(model.opens > 0 && !out.is_null() && fds[index].path.is_some());
                    assert!(
                        model.handles.insert(fh, index).is_none(),
                        "handle {fh} reused"
                    );
                }
            }
            5 => {
                let Some(raw) = input.u64() else { break };
                let fh = match model.handles.keys().nth(raw as usize % 4) {
                    Some(&fh) if raw & 0x100 == 0 => fh,
                    _ => raw,
                };
                let st = ffi::p2plab_gds_handle_deregister(fh);
                let known = model.handles.remove(&fh).is_some();
                assert_eq!(check_status(st).is_none(), known, "deregister {fh}");
            }
            6 | 7 => {
                let (Some(size), Some(offset), Some(name)) =
                    (input.amount(), input.amount(), input.u8())
                else {
                    break;
                };
                let gpu: &[u8] = match name % 4 {
                    0 => b"0000:04:00.0\0",
                    1 => b"0000:09:00.0\0",
                    2 => b"\xff\xfe\0",
                    _ => b"\0",
                };
                let gpu_ptr = if name & 0x80 != 0 {
                    std::ptr::null()
                } else {
                    gpu.as_ptr().cast::<c_char>()
                };
                let mut ptr: *mut c_void = std::ptr::null_mut();
                // SAFETY: &mut ptr is writable; the name is NUL-terminated.
                let st = unsafe {
                    if op % 16 == 6 {
                        ffi::p2plab_gds_mem_alloc(&mut ptr, size as usize, gpu_ptr)
                    } else {
                        ffi::p2plab_gds_mem_map_vram(&mut ptr, size as usize, offset, gpu_ptr)
                    }
                };
                if check_status(st).is_none() {
                    let page = 4096;
                    let len = size.max(1).div_ceil(page) * page;
                    assert!(model.opens > 0 && !ptr.is_null());
                    model.allocs.insert(ptr as u64, len);
                    ptrs.push(ptr as u64);
                }
            }
            8 => {
                let Some(at) = addr(&mut input) else { break };
                let st = ffi::p2plab_gds_mem_free(at as *mut c_void);
                let ok = check_status(st).is_none();
                if let Some(&len) = model.allocs.get(&at) {
                    assert_eq!(ok, !model.overlaps(at, len), "free {at:#x}");
                } else {
                    assert!(!ok, "freed {at:#x}, which was not allocated");
                }
                if ok {
                    model.allocs.remove(&at);
                }
            }
            9 => {
                let (Some(at), Some(size), Some(flags)) =
                    (addr(&mut input), input.amount(), input.u8())
                else {
                    break;
                };
                let flags = i32::from(flags % 8 == 0) ^ 1;
                let st = ffi::p2plab_gds_buf_register(at as *const c_void, size as usize, flags);
                match check_status(st) {
                    None => {
                        assert!(!model.overlaps(at, size), "an overlapping registration");
                        assert!(
                            model.vram_offset(at).is_some(),
                            "registered {at:#x}: not VRAM"
                        );
                        model.buffers.insert(at, size);
                    }
                    Some(ErrorCode::MemoryAlreadyRegistered) => {
                        assert!(model.overlaps(at, size), "refused as registered: {at:#x}");
                    }
                    Some(_) => {}
                }
            }
            10 => {
                let Some(at) = addr(&mut input) else { break };
                let st = ffi::p2plab_gds_buf_deregister(at as *const c_void);
                let known = model.buffers.remove(&at).is_some();
                assert_eq!(check_status(st).is_none(), known, "deregister {at:#x}");
            }
            11 => {
                let Some(at) = addr(&mut input) else { break };
                let mut info = std::mem::MaybeUninit::<CBufInfo>::zeroed();
                // SAFETY: info is writable for one struct.
                let st =
                    unsafe { ffi::p2plab_gds_buf_info(at as *const c_void, info.as_mut_ptr()) };
                if check_status(st).is_none() {
                    // SAFETY: filled by the successful call.
                    let info = unsafe { info.assume_init() };
                    let (start, len) = model.buffer(at, 1).expect("described: registered");
                    assert_eq!(info.kind, BUF_P2PMEM);
                    assert_eq!(info.size, len - (at - start));
                    assert_eq!(Some(info.vram_offset), model.vram_offset(at), "VRAM offset");
                    // SAFETY: NUL-terminated by the library.
                    let gpu = unsafe { CStr::from_ptr(info.gpu.as_ptr()) };
                    assert_eq!(gpu.to_str(), Ok(GPU_BDF));
                }
            }
            12 | 13 => {
                let write = op % 16 == 13;
                let (Some(raw_fh), Some(base), Some(size), Some(file_offset), Some(buf_offset)) = (
                    input.u8(),
                    addr(&mut input),
                    input.amount(),
                    input.amount(),
                    input.amount(),
                ) else {
                    break;
                };
                let fh = model
                    .handles
                    .keys()
                    .nth(usize::from(raw_fh % 4))
                    .copied()
                    .unwrap_or(u64::from(raw_fh));
                let (file_offset, buf_offset) = (file_offset as i64, buf_offset as i64);
                let mut report = std::mem::MaybeUninit::<CIoReport>::zeroed();
                let out = if raw_fh & 0x80 != 0 {
                    std::ptr::null_mut()
                } else {
                    report.as_mut_ptr()
                };
                // SAFETY: `out` is NULL or writable for one report; the
                // buffer is only used if registered.
                let ret = unsafe {
                    if write {
                        ffi::p2plab_gds_write(
                            fh,
                            base as *const c_void,
                            size as usize,
                            file_offset,
                            buf_offset,
                            out,
                        )
                    } else {
                        ffi::p2plab_gds_read(
                            fh,
                            base as *mut c_void,
                            size as usize,
                            file_offset,
                            buf_offset,
                            out,
                        )
                    }
                };
                let report = (!out.is_null()).then(|| {
                    // SAFETY: filled by the call whenever it is non-NULL.
                    unsafe { report.assume_init() }
                });
                if ret < 0 {
                    if ret != -1 {
                        let code = ErrorCode::from_i32(-ret as i32).expect("a defined code");
                        assert_ne!(code, ErrorCode::InternalError, "{}", last_error());
                    }
                    if let Some(r) = report {
                        assert_eq!(r.path, Path::None as u32);
                    }
                    continue;
                }
                let n = ret as u64;
                assert!(n <= size, "moved {n} of {size} bytes");
                if let Some(r) = report {
                    assert_eq!((r.bytes, r.requested), (n, size));
                    assert_eq!(r.p2p_bytes + r.compat_bytes, n, "p2p + compat");
                }
                if n == 0 {
                    continue;
                }
                // The bytes moved are the file's at file_offset and VRAM's
                // under base + buf_offset.
                let at = base.wrapping_add(buf_offset as u64);
                model.buffer(at, n).expect("moved bytes: registered");
                let vram_at = model.vram_offset(at).expect("a registered buffer is VRAM");
                let index = model.handles[&fh];
                if write && fds[index].append {
                    continue;
                }
                let path = fds[index].path.as_ref().expect("a registered file");
                let mut file = vec![0u8; n as usize];
                File::open(path)
                    .and_then(|f| f.read_exact_at(&mut file, file_offset as u64))
                    .expect("the file holds what was moved");
                assert!(file == vram(vram_at, n as usize), "other bytes moved");
            }
            14 => {
                let (Some(which), Some(at), Some(size)) =
                    (input.u8(), addr(&mut input), input.amount())
                else {
                    break;
                };
                let size = (size as usize).min(HOST);
                // An empty range may sit at a buffer's very end, past
                // every allocation: there is nothing to compare then.
                let offset = || model.vram_offset(at).expect("a registered buffer is VRAM");
                match which % 3 {
                    0 => {
                        let mut crc = 0u32;
                        // SAFETY: crc is writable.
                        let st = unsafe {
                            ffi::p2plab_gds_checksum(at as *const c_void, size, &mut crc)
                        };
                        if check_status(st).is_none() {
                            if size == 0 {
                                continue;
                            }
                            let v = vram(offset(), size);
                            assert_eq!(crc, crc32c::crc32c(&v), "checksum of other bytes");
                        }
                    }
                    1 => {
                        host[..size]
                            .iter_mut()
                            .enumerate()
                            .for_each(|(i, b)| *b = (i as u8) ^ which);
                        // SAFETY: host is valid for `size` bytes.
                        let st = unsafe {
                            ffi::p2plab_gds_memcpy_htod(
                                at as *mut c_void,
                                host.as_ptr().cast(),
                                size,
                            )
                        };
                        if check_status(st).is_none() {
                            if size == 0 {
                                continue;
                            }
                            let v = vram(offset(), size);
                            assert!(v == host[..size], "htod stored other bytes");
                        }
                    }
                    _ => {
                        // SAFETY: host is valid and ours for `size` bytes.
                        let st = unsafe {
                            ffi::p2plab_gds_memcpy_dtoh(
                                host.as_mut_ptr().cast(),
                                at as *const c_void,
                                size,
                            )
                        };
                        if check_status(st).is_none() {
                            if size == 0 {
                                continue;
                            }
                            let v = vram(offset(), size);
                            assert!(v == host[..size], "dtoh returned other bytes");
                        }
                    }
                }
            }
            _ => {
                let Some(n) = input.u32() else { break };
                for text in [
                    ffi::p2plab_gds_error_string(n as i32),
                    ffi::p2plab_gds_reason_name(n),
                    ffi::p2plab_gds_path_name(n),
                    ffi::p2plab_gds_last_error(),
                ] {
                    // SAFETY: every one is a NUL-terminated string.
                    assert!(unsafe { CStr::from_ptr(text) }.to_str().is_ok());
                }
            }
        }
    }
    // The last close drops everything; the next input starts afresh.
    while model.opens > 0 {
        assert_eq!(check_status(ffi::p2plab_gds_driver_close()), None);
        model.opens -= 1;
    }
    let st = ffi::p2plab_gds_driver_close();
    assert_eq!(check_status(st), Some(ErrorCode::DriverNotInitialized));
    let mut fh = 0u64;
    let file = &fds[0];
    // SAFETY: &mut fh is writable.
    let st = unsafe { ffi::p2plab_gds_handle_register(&mut fh, file.raw()) };
    assert_eq!(check_status(st), Some(ErrorCode::DriverNotInitialized));
    // Storage off PCI again, as the next input expects.
    let _ = std::fs::remove_file(w.gpu.sysfs().join(format!(
        "dev/block/{}:{}",
        libc::major(w.st_dev),
        libc::minor(w.st_dev)
    )));
});
