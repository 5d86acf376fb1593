//! Interrupt fds from a hostile client: only real eventfds are bound, and
//! they are made non-blocking, so a full counter can never block the
//! thread that signals an interrupt.

use crate::common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use common::*;
use p2plab_vfio_user::vfio_abi::{VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD};
use p2plab_vfio_user::{EventFd, SharedMemory};

fn bind(c: &mut RawClient, start: u32, fds: &[i32]) -> Msg {
    let p = Buf::default()
        .u32(20)
        .u32(VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER)
        .u32(MSIX)
        .u32(start)
        .u32(fds.len() as u32)
        .0;
    c.call_fds(cmd::DEVICE_SET_IRQS, &p, fds)
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two fds that we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both fds were just created and are owned here.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Catches a SET_IRQS that binds any fd as an "eventfd": a blocking pipe
/// bound as an interrupt hung the device thread for good once it filled.
#[test]
fn only_real_eventfds_are_bound() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let (_r, w) = pipe();
    let m = bind(&mut c, 0, &[w.as_raw_fd()]);
    assert!(m.hdr.is_error(), "a pipe was bound as an interrupt");
    assert_eq!(m.hdr.error, libc::EINVAL as u32);
    let shm = SharedMemory::new("not-an-eventfd", 4096).unwrap();
    let ok = EventFd::new(0).unwrap();
    let m = bind(&mut c, 0, &[ok.as_raw_fd(), shm.fd()]);
    assert_eq!(m.hdr.error, libc::EINVAL as u32, "one bad fd refuses all");
    assert!(srv.device.state.lock().unwrap().log.irq_sets.is_empty());
    c.assert_in_sync();

    // A real eventfd is bound, and made non-blocking.
    let m = bind(&mut c, 1, &[ok.as_raw_fd()]);
    assert!(!m.hdr.is_error(), "{m:?}");
    // SAFETY: F_GETFL only reads the flags of our own fd.
    let flags = unsafe { libc::fcntl(ok.as_raw_fd(), libc::F_GETFL) };
    assert_ne!(flags & libc::O_NONBLOCK, 0);
    assert!(srv.device.fire(1));
    assert_eq!(eventfd_count(&ok), Some(1));
}

/// Catches a bound eventfd whose counter the client filled to the
/// maximum blocking the device when it signals: the signal is dropped.
#[test]
fn a_full_eventfd_does_not_block_the_device() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let full = EventFd::new(0).unwrap();
    full.write(u64::MAX - 1).unwrap();
    assert!(!bind(&mut c, 0, &[full.as_raw_fd()]).hdr.is_error());
    let device = srv.device.clone();
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || done_tx.send(device.fire(0)).unwrap());
    let fired = done
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("signalling a full eventfd blocked the device");
    assert!(!fired, "the signal cannot fit; it is dropped");
    c.assert_in_sync();
}
