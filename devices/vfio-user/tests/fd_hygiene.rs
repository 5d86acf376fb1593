//! Received fds that a command does not keep are closed: counted through
//! /proc/self/fd. Alone in its test binary so no other test opens fds
//! meanwhile.

mod common;

use std::os::fd::AsRawFd;

use common::*;
use p2plab_vfio_user::vfio_abi::{VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD};
use p2plab_vfio_user::{EventFd, SharedMemory};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn unused_and_refused_fds_are_closed() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let efds: Vec<EventFd> = (0..17).map(|_| EventFd::new(0).unwrap()).collect();
    let raw: Vec<i32> = efds.iter().map(|e| e.as_raw_fd()).collect();
    let ram = SharedMemory::new("ram", 1 << 20).unwrap();
    assert!(!c.dma_map(0x1000, 0x1000, 3, None, 0).hdr.is_error());
    c.assert_in_sync();
    let baseline = open_fds();

    let info = Buf::default().u32(16).u32(0).u32(0).u32(0).0;
    for _ in 0..5 {
        // Accepted request that takes no fds.
        assert!(!c
            .call_fds(cmd::DEVICE_GET_INFO, &info, &raw[..3])
            .hdr
            .is_error());
        // More fds than max_msg_fds (16).
        assert!(c.call_fds(cmd::DEVICE_GET_INFO, &info, &raw).hdr.is_error());
        // SET_IRQS whose fd count disagrees with its count.
        let set = Buf::default()
            .u32(20)
            .u32(VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER)
            .u32(MSIX)
            .u32(0)
            .u32(3)
            .0;
        assert!(c
            .call_fds(cmd::DEVICE_SET_IRQS, &set, &raw[..2])
            .hdr
            .is_error());
        // DMA_MAP refused (overlap) with an fd.
        assert!(c
            .dma_map(0x1000, 0x1000, 3, Some(ram.fd()), 0)
            .hdr
            .is_error());
        // Unknown command carrying fds.
        assert!(c.call_fds(200, &[], &raw[..4]).hdr.is_error());
    }
    c.assert_in_sync();
    assert_eq!(open_fds(), baseline, "received fds leaked");

    // An accepted fd-backed DMA_MAP keeps one fd until it is unmapped.
    assert!(!c
        .dma_map(0x10_0000, 1 << 20, 3, Some(ram.fd()), 0)
        .hdr
        .is_error());
    assert_eq!(open_fds(), baseline + 1);
    let unmap = Buf::default().u32(24).u32(0).u64(0x10_0000).u64(1 << 20).0;
    assert!(!c.call(cmd::DMA_UNMAP, &unmap).hdr.is_error());
    assert_eq!(open_fds(), baseline);
    // Bound irq eventfds live in the device until it drops them.
    let set = Buf::default()
        .u32(20)
        .u32(VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER)
        .u32(MSIX)
        .u32(0)
        .u32(2)
        .0;
    assert!(!c
        .call_fds(cmd::DEVICE_SET_IRQS, &set, &raw[..2])
        .hdr
        .is_error());
    assert_eq!(open_fds(), baseline + 2);
    assert!(!c.call(cmd::DEVICE_RESET, &[]).hdr.is_error());
    assert_eq!(open_fds(), baseline);
    drop(srv);
}
