//! A hostile client's memory: DMA_MAP fds that are too short, shrink after
//! the map, or are not memory at all, and the client resizing memory we
//! hand it. None of it may crash the server (a SIGBUS kills this test
//! process, which fails it); DMA fails cleanly and the stream stays in sync.

use crate::common;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use common::*;

/// A memfd of `size` bytes the client would share, with `seals`.
fn memfd(size: u64, seals: i32) -> File {
    // SAFETY: memfd_create reads a valid NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"client-ram".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    // SAFETY: `raw` was just created and nothing else owns it.
    let file = unsafe { File::from_raw_fd(raw) };
    file.set_len(size).unwrap();
    if seals != 0 {
        // SAFETY: F_ADD_SEALS on our own memfd.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
        assert_eq!(rc, 0);
    }
    file
}

/// Asks the test device to read 8 bytes at `gpa` (it does so from its
/// BAR0 handler). Returns the errno of a failed DMA.
fn device_reads(c: &mut RawClient, gpa: u64) -> Result<(), u32> {
    c.region_write(BAR0, REG_DMA_FROM_HANDLER, &gpa.to_le_bytes())
}

/// Catches a server that accepts a 1 MiB DMA_MAP backed by a 4 KiB memfd
/// (its first DMA past 4 KiB then died of SIGBUS), or one backed by a pipe.
#[test]
fn a_map_larger_than_its_file_is_refused() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let small = memfd(4096, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
    let m = c.dma_map(0x10_0000, 1 << 20, 3, Some(small.as_raw_fd()), 0);
    assert!(m.hdr.is_error(), "1 MiB over a 4 KiB memfd was accepted");
    assert_eq!(m.hdr.error, libc::EINVAL as u32);
    // Right size, but the offset runs it past the end.
    let m = c.dma_map(0x10_0000, 4096, 3, Some(small.as_raw_fd()), 4096);
    assert_eq!(m.hdr.error, libc::EINVAL as u32);
    assert_eq!(srv.dma.mapping_count(), 0);
    // Nothing there, so the device's DMA fails instead of crashing.
    assert!(device_reads(&mut c, 0x10_0000 + 8192).is_err());
    // The exact size is fine.
    let m = c.dma_map(0x10_0000, 4096, 3, Some(small.as_raw_fd()), 0);
    assert!(!m.hdr.is_error(), "{m:?}");
    device_reads(&mut c, 0x10_0000 + 8).unwrap();
    c.assert_in_sync();
}

/// Catches unsealed client memory mapped with mmap: the client truncates
/// its memfd after the map, and the device's next DMA there was a SIGBUS.
/// Now that DMA fails with an error and the server keeps serving.
#[test]
fn memory_truncated_after_the_map_fails_dma_cleanly() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let ram = memfd(1 << 20, 0);
    let m = c.dma_map(0x4000_0000, 1 << 20, 3, Some(ram.as_raw_fd()), 0);
    assert!(
        !m.hdr.is_error(),
        "an unsealed memfd is still usable: {m:?}"
    );
    std::os::unix::fs::FileExt::write_all_at(&ram, b"before!!", 0x8000).unwrap();
    device_reads(&mut c, 0x4000_0000 + 0x8000).unwrap();
    assert_eq!(
        srv.device.state.lock().unwrap().log.handler_dma,
        Some(Ok(()))
    );

    ram.set_len(4096).unwrap();
    let err = device_reads(&mut c, 0x4000_0000 + 0x8000).unwrap_err();
    assert_eq!(err, libc::EIO as u32, "the device reports a failed DMA");
    let logged = srv.device.state.lock().unwrap().log.handler_dma.clone();
    assert!(
        matches!(
            logged,
            Some(Err(p2plab_vfio_user::DmaError::Truncated { .. }))
        ),
        "{logged:?}"
    );
    // The first page is still there.
    device_reads(&mut c, 0x4000_0000).unwrap();
    c.assert_in_sync();
    assert_eq!(
        srv.dma.stats().mmap.read_ops,
        0,
        "unsealed memory was mmapped"
    );
}

/// Catches BAR memory handed to the client without seals: a client that
/// shrank the fd of an mmappable region made the server's next access to
/// it a SIGBUS.
#[test]
fn region_memory_handed_to_the_client_cannot_be_resized() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let ask = Buf::default()
        .u32(64)
        .u32(0)
        .u32(BAR2)
        .u32(0)
        .u64(0)
        .u64(0)
        .0;
    let m = c.call(cmd::DEVICE_GET_REGION_INFO, &ask);
    let fd = m.fds.into_iter().next().expect("BAR2 comes with its fd");
    let file = File::from(fd);
    let before = file.metadata().unwrap().len();
    assert!(file.set_len(4096).is_err(), "the client shrank BAR2");
    assert!(file.set_len(before * 2).is_err(), "the client grew BAR2");
    assert_eq!(file.metadata().unwrap().len(), before);
    // The server still reaches all of it.
    assert_eq!(c.region_read(BAR2, BAR2_SIZE - 8, 8).unwrap(), vec![0u8; 8]);
    srv.device.bar2.write_at(BAR2_SIZE - 4, b"last").unwrap();
}
