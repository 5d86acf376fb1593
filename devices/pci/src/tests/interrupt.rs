use std::sync::Arc;
use std::thread;

use p2plab_vfio_user::{IrqAction, IrqData, IrqSet};
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_AUTOMASKED, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE,
    VFIO_PCI_ERR_IRQ_INDEX, VFIO_PCI_INTX_IRQ_INDEX, VFIO_PCI_MSIX_IRQ_INDEX,
    VFIO_PCI_MSI_IRQ_INDEX, VFIO_PCI_REQ_IRQ_INDEX,
};
use vmm_sys_util::eventfd::EventFd;

use crate::{Delivery, InterruptController, MsixControl};

pub(crate) fn eventfd() -> EventFd {
    EventFd::new(libc::EFD_NONBLOCK).expect("eventfd")
}

/// How many times the eventfd was signalled since the last call.
pub(crate) fn drain(fd: &EventFd) -> u64 {
    fd.read().unwrap_or(0)
}

fn bind(irq: &InterruptController, index: u32, start: u32, fds: &[&EventFd]) {
    let fds = fds
        .iter()
        .map(|fd| Some(fd.try_clone().expect("clone")))
        .collect::<Vec<_>>();
    irq.set_irqs(IrqSet {
        index,
        action: IrqAction::Trigger,
        start,
        count: fds.len() as u32,
        data: IrqData::EventFds(fds),
    })
    .expect("bind");
}

fn act(irq: &InterruptController, index: u32, action: IrqAction, start: u32, count: u32) {
    irq.set_irqs(IrqSet {
        index,
        action,
        start,
        count,
        data: IrqData::None,
    })
    .expect("set_irqs");
}

#[test]
fn irq_info_per_index() {
    let irq = InterruptController::new(8, 1);
    let msix = irq.irq_info(VFIO_PCI_MSIX_IRQ_INDEX).expect("msix");
    assert_eq!(msix.count, 8);
    assert_eq!(msix.flags, VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_MASKABLE);
    let intx = irq.irq_info(VFIO_PCI_INTX_IRQ_INDEX).expect("intx");
    assert_eq!(intx.count, 1);
    assert_ne!(intx.flags & VFIO_IRQ_INFO_AUTOMASKED, 0);
    for index in [
        VFIO_PCI_MSI_IRQ_INDEX,
        VFIO_PCI_ERR_IRQ_INDEX,
        VFIO_PCI_REQ_IRQ_INDEX,
    ] {
        assert_eq!(irq.irq_info(index).expect("info").count, 0);
    }
    assert!(irq.irq_info(5).is_err());
    assert!(irq.irq_info(u32::MAX).is_err());
    let bare = InterruptController::new(0, 0);
    assert_eq!(
        bare.irq_info(VFIO_PCI_MSIX_IRQ_INDEX).expect("msix").count,
        0
    );
    assert_eq!(
        bare.irq_info(VFIO_PCI_INTX_IRQ_INDEX).expect("intx").count,
        0
    );
}

#[test]
fn msix_vector_signals_its_own_eventfd() {
    let irq = InterruptController::new(4, 1);
    let (a, b) = (eventfd(), eventfd());
    bind(&irq, VFIO_PCI_MSIX_IRQ_INDEX, 1, &[&a, &b]);
    irq.set_msix_control(MsixControl::ENABLED);
    assert_eq!(irq.notify(1), Delivery::Signalled);
    assert_eq!(irq.notify(2), Delivery::Signalled);
    assert_eq!(irq.notify(2), Delivery::Signalled);
    assert_eq!((drain(&a), drain(&b)), (1, 2));
    // Vector 0 has no eventfd yet: it waits.
    assert_eq!(irq.notify(0), Delivery::Pending);
    assert_eq!(irq.notify(4), Delivery::Dropped, "no such vector");
}

#[test]
fn client_mask_latches_and_unmask_delivers() {
    let irq = InterruptController::new(2, 0);
    let fd = eventfd();
    bind(&irq, VFIO_PCI_MSIX_IRQ_INDEX, 0, &[&fd]);
    irq.set_msix_control(MsixControl::ENABLED);
    act(&irq, VFIO_PCI_MSIX_IRQ_INDEX, IrqAction::Mask, 0, 1);
    assert_eq!(irq.notify(0), Delivery::Pending);
    assert_eq!(irq.notify(0), Delivery::Pending);
    assert!(irq.msix_pending(0));
    let mut pba = [0u8; 8];
    irq.msix_pba_read(0, &mut pba).expect("pba");
    assert_eq!(u64::from_le_bytes(pba), 1);
    assert_eq!(drain(&fd), 0);
    act(&irq, VFIO_PCI_MSIX_IRQ_INDEX, IrqAction::Unmask, 0, 1);
    assert_eq!(
        drain(&fd),
        1,
        "one delivery for the coalesced pending vector"
    );
    assert!(!irq.msix_pending(0));
}

#[test]
fn data_bool_selects_vectors() {
    let irq = InterruptController::new(3, 0);
    let fds = [eventfd(), eventfd(), eventfd()];
    bind(
        &irq,
        VFIO_PCI_MSIX_IRQ_INDEX,
        0,
        &[&fds[0], &fds[1], &fds[2]],
    );
    irq.set_msix_control(MsixControl::ENABLED);
    irq.set_irqs(IrqSet {
        index: VFIO_PCI_MSIX_IRQ_INDEX,
        action: IrqAction::Mask,
        start: 0,
        count: 3,
        data: IrqData::Bool(vec![false, true, false]),
    })
    .expect("mask");
    assert_eq!(irq.notify(0), Delivery::Signalled);
    assert_eq!(irq.notify(1), Delivery::Pending);
    // Loopback trigger with DATA_BOOL fires vector 2 only.
    irq.set_irqs(IrqSet {
        index: VFIO_PCI_MSIX_IRQ_INDEX,
        action: IrqAction::Trigger,
        start: 0,
        count: 3,
        data: IrqData::Bool(vec![false, false, true]),
    })
    .expect("trigger");
    assert_eq!(fds.iter().map(drain).collect::<Vec<_>>(), vec![1, 0, 1]);
}

#[test]
fn function_mask_and_disable_from_config() {
    let irq = InterruptController::new(1, 1);
    let (fd, intx) = (eventfd(), eventfd());
    bind(&irq, VFIO_PCI_MSIX_IRQ_INDEX, 0, &[&fd]);
    bind(&irq, VFIO_PCI_INTX_IRQ_INDEX, 0, &[&intx]);
    irq.set_msix_control(MsixControl::ENABLED_MASKED);
    assert_eq!(irq.notify(0), Delivery::Pending);
    irq.set_msix_control(MsixControl::ENABLED);
    assert_eq!(drain(&fd), 1);
    // MSI-X off: the device falls back to INTx.
    irq.set_msix_control(MsixControl::DISABLED);
    assert!(!irq.msix_enabled());
    assert_eq!(irq.notify(0), Delivery::Signalled);
    assert_eq!((drain(&fd), drain(&intx)), (0, 1));
}

#[test]
fn intx_is_automasked_until_unmask() {
    let irq = InterruptController::new(0, 1);
    assert_eq!(irq.notify(0), Delivery::Dropped, "no eventfd yet");
    let fd = eventfd();
    bind(&irq, VFIO_PCI_INTX_IRQ_INDEX, 0, &[&fd]);
    assert_eq!(irq.notify(0), Delivery::Signalled);
    assert_eq!(irq.notify(0), Delivery::Pending, "automasked");
    assert_eq!(drain(&fd), 1);
    act(&irq, VFIO_PCI_INTX_IRQ_INDEX, IrqAction::Unmask, 0, 1);
    assert_eq!(drain(&fd), 1, "pending assertion re-fires on unmask");
    act(&irq, VFIO_PCI_INTX_IRQ_INDEX, IrqAction::Unmask, 0, 1);
    assert_eq!(irq.notify(0), Delivery::Signalled);
    drain(&fd);
    // COMMAND.INTX_DISABLE blocks it.
    act(&irq, VFIO_PCI_INTX_IRQ_INDEX, IrqAction::Unmask, 0, 1);
    irq.set_intx_disabled(true);
    assert_eq!(irq.notify(0), Delivery::Dropped);
    irq.set_intx_disabled(false);
    assert_eq!(irq.notify(0), Delivery::Signalled);
    // Disable (count 0) drops the eventfd.
    act(&irq, VFIO_PCI_INTX_IRQ_INDEX, IrqAction::Trigger, 0, 0);
    assert_eq!(irq.notify(0), Delivery::Dropped);
}

#[test]
fn disable_all_and_reset_drop_eventfds() {
    let irq = InterruptController::new(2, 1);
    let fd = eventfd();
    bind(&irq, VFIO_PCI_MSIX_IRQ_INDEX, 0, &[&fd, &fd]);
    irq.set_msix_control(MsixControl::ENABLED);
    act(&irq, VFIO_PCI_MSIX_IRQ_INDEX, IrqAction::Trigger, 0, 0);
    assert_eq!(irq.notify(1), Delivery::Pending);
    bind(&irq, VFIO_PCI_MSIX_IRQ_INDEX, 1, &[&fd]);
    assert_eq!(drain(&fd), 1, "rebinding delivers the pending vector");

    irq.reset();
    assert!(!irq.msix_enabled());
    irq.set_msix_control(MsixControl::ENABLED);
    assert_eq!(irq.notify(1), Delivery::Pending);
    assert_eq!(drain(&fd), 0);
    // "MSI-X on, no vectors": QEMU binds vector 0 to fd -1.
    irq.set_irqs(IrqSet {
        index: VFIO_PCI_MSIX_IRQ_INDEX,
        action: IrqAction::Trigger,
        start: 0,
        count: 1,
        data: IrqData::EventFds(vec![None]),
    })
    .expect("no-vector enable");
    assert_eq!(irq.notify(0), Delivery::Pending);
}

#[test]
fn bad_set_irqs_requests_are_refused() {
    let irq = InterruptController::new(4, 1);
    let bad = |index, action, start, count, data| {
        irq.set_irqs(IrqSet {
            index,
            action,
            start,
            count,
            data,
        })
        .is_err()
    };
    let msix = VFIO_PCI_MSIX_IRQ_INDEX;
    assert!(
        bad(msix, IrqAction::Mask, 3, 2, IrqData::None),
        "beyond vectors"
    );
    assert!(
        bad(msix, IrqAction::Mask, u32::MAX, 2, IrqData::None),
        "overflow"
    );
    assert!(
        bad(msix, IrqAction::Mask, 0, 2, IrqData::Bool(vec![true])),
        "bool len"
    );
    assert!(
        bad(
            msix,
            IrqAction::Trigger,
            0,
            2,
            IrqData::EventFds(vec![None])
        ),
        "fd count"
    );
    assert!(
        bad(
            msix,
            IrqAction::Unmask,
            0,
            1,
            IrqData::EventFds(vec![Some(eventfd())])
        ),
        "unmask eventfd"
    );
    assert!(bad(
        VFIO_PCI_MSI_IRQ_INDEX,
        IrqAction::Trigger,
        0,
        1,
        IrqData::EventFds(vec![Some(eventfd())])
    ));
    assert!(bad(
        VFIO_PCI_INTX_IRQ_INDEX,
        IrqAction::Mask,
        0,
        2,
        IrqData::None
    ));
    assert!(bad(
        VFIO_PCI_INTX_IRQ_INDEX,
        IrqAction::Mask,
        1,
        1,
        IrqData::None
    ));
    assert!(bad(7, IrqAction::Trigger, 0, 0, IrqData::None));
    // Disabling an index without vectors is fine.
    assert!(!bad(
        VFIO_PCI_MSI_IRQ_INDEX,
        IrqAction::Trigger,
        0,
        0,
        IrqData::None
    ));
    assert!(!bad(
        VFIO_PCI_ERR_IRQ_INDEX,
        IrqAction::Trigger,
        0,
        0,
        IrqData::None
    ));
    let no_intx = InterruptController::new(1, 0);
    assert!(no_intx
        .set_irqs(IrqSet {
            index: VFIO_PCI_INTX_IRQ_INDEX,
            action: IrqAction::Trigger,
            start: 0,
            count: 1,
            data: IrqData::EventFds(vec![Some(eventfd())]),
        })
        .is_err());
}

#[test]
fn notify_from_worker_threads_counts_every_interrupt() {
    const THREADS: u64 = 4;
    const EACH: u64 = 2000;
    let irq = InterruptController::new(4, 0);
    let fds: Vec<EventFd> = (0..4).map(|_| eventfd()).collect();
    bind(
        &irq,
        VFIO_PCI_MSIX_IRQ_INDEX,
        0,
        &fds.iter().collect::<Vec<_>>(),
    );
    irq.set_msix_control(MsixControl::ENABLED);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let irq = Arc::clone(&irq);
            thread::spawn(move || {
                for _ in 0..EACH {
                    assert_eq!(irq.notify(t as u16), Delivery::Signalled);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    for fd in &fds {
        assert_eq!(drain(fd), EACH);
    }
}

#[test]
fn notify_races_with_mask_toggling_without_losing_the_last_interrupt() {
    let irq = InterruptController::new(1, 0);
    let fd = eventfd();
    bind(&irq, VFIO_PCI_MSIX_IRQ_INDEX, 0, &[&fd]);
    irq.set_msix_control(MsixControl::ENABLED);
    let worker = {
        let irq = Arc::clone(&irq);
        thread::spawn(move || {
            let mut signalled = 0u64;
            for _ in 0..5000 {
                if irq.notify(0) == Delivery::Signalled {
                    signalled += 1;
                }
            }
            signalled
        })
    };
    for round in 0..2000 {
        let action = if round % 2 == 0 {
            IrqAction::Mask
        } else {
            IrqAction::Unmask
        };
        act(&irq, VFIO_PCI_MSIX_IRQ_INDEX, action, 0, 1);
    }
    // Masked for a while, then a final notify, then unmask.
    act(&irq, VFIO_PCI_MSIX_IRQ_INDEX, IrqAction::Mask, 0, 1);
    let signalled_by_worker = worker.join().expect("worker");
    assert_eq!(irq.notify(0), Delivery::Pending);
    act(&irq, VFIO_PCI_MSIX_IRQ_INDEX, IrqAction::Unmask, 0, 1);
    assert!(!irq.msix_pending(0), "the pending vector was delivered");
    let total = drain(&fd);
    assert!(
        total > signalled_by_worker,
        "the final pending one arrived too"
    );
    assert!(total <= 5001 + 2000, "no invented interrupts");
}

/// Catches an interrupt controller that writes a client's eventfd in
/// blocking mode under its lock: a counter pre-filled to the maximum made
/// `notify` block forever, and with it every later interrupt, SET_IRQS and
/// the reset the next client needs. The signal is dropped and counted.
#[test]
fn a_full_blocking_eventfd_never_blocks_notify() {
    let irq = InterruptController::new(2, 1);
    // Blocking, as a hostile client would leave it, and full.
    let full = EventFd::new(0).expect("eventfd");
    full.write(u64::MAX - 1).expect("fill");
    bind(&irq, VFIO_PCI_MSIX_IRQ_INDEX, 0, &[&full]);
    irq.set_msix_control(MsixControl::ENABLED);
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let irq = Arc::clone(&irq);
        thread::spawn(move || {
            let first = irq.notify(0);
            let second = irq.notify(0);
            tx.send((first, second)).expect("send");
        });
    }
    let delivered = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("notify blocked on a full eventfd");
    assert_eq!(delivered, (Delivery::Dropped, Delivery::Dropped));
    assert_eq!(irq.dropped_signals(), 2);
    // The controller still works: reset (needed for the next client)
    // takes the lock, and a fresh eventfd is signalled.
    irq.reset();
    let fresh = eventfd();
    bind(&irq, VFIO_PCI_MSIX_IRQ_INDEX, 1, &[&fresh]);
    irq.set_msix_control(MsixControl::ENABLED);
    assert_eq!(irq.notify(1), Delivery::Signalled);
    assert_eq!(drain(&fresh), 1);
}
