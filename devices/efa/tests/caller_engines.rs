//! The EFA with its engines on the caller's thread
//! (`Efa::with_engines_on_caller`, `Efa::run_engines`), as the
//! `efa_admin_queue` and `efa_datapath` fuzz targets run it: the
//! management, send and receive engines, the pump and the link reader
//! stepped until none has work, through the code their threads loop
//! over.

use crate::common;

use std::sync::Arc;

use common::*;
use p2plab_efa::regs::reg;
use p2plab_efa::{EfaOptions, NoLink};

fn caller_driver(n: u8) -> Driver {
    let guest = Guest::new();
    Driver::on_caller(
        &guest,
        attrs(n),
        Arc::new(NoLink::default()),
        EfaOptions { keep_alive: None },
    )
}

/// Catches: engines that run somewhere else (a reset ended before
/// `run_engines`), a `run_engines` that does not end the reset the
/// driver finished, does not run admin commands in order (the driver's
/// probe: a reset and a dozen commands), or does not return once there
/// is nothing left to do.
#[test]
fn the_probe_runs_on_the_callers_thread() {
    let mut d = caller_driver(3);
    d.init_readless();
    d.write_reg(reg::DEV_CTL, 1 | 5 << 28);
    d.init_readless();
    d.write_reg(reg::DEV_CTL, 0);
    assert_eq!(
        d.read_reg(reg::DEV_STS as u16) & 8,
        8,
        "RESET_IN_PROGRESS stays on until the management engine runs"
    );
    assert!(d.efa.run_engines() >= 1);
    assert_eq!(d.read_reg(reg::DEV_STS as u16) & 8, 0, "reset done");
    let dev = d.probe();
    assert_eq!(dev[2], 0, "GET_FEATURE DEVICE_ATTR status");
    assert_eq!(d.efa.run_engines(), 0, "nothing left to do");
}

/// Catches: a caller-thread data path that loses or alters a SEND to
/// the device's own QP (packet to the device's own GID, through the
/// inbound queue and the receive engine), or completes it with the wrong
/// request ID or length.
#[test]
fn a_send_to_the_own_qp_lands_byte_for_byte() {
    let d = caller_driver(4);
    let own = d.efa.attrs().gid;
    let mut side = Side::new(d, SRD, own);
    let (rx_buf, rx_key) = side.buffer(16 << 10, LOCAL_WRITE);
    let (tx_buf, tx_key) = side.buffer(16 << 10, 0);
    let data = pattern(5, 8000);
    side.driver.guest.write(tx_buf, &data);
    let qp_num = side.qp.num;
    side.driver
        .post_recv(&mut side.qp, 77, rx_buf, 9000, rx_key);
    let sgl = [(tx_buf, 8000, tx_key)];
    side.driver.post_send(
        &mut side.qp,
        wqe::send_sgl(5, qp_num, side.ah, QKEY, None, &sgl),
    );
    let sent = side.driver.wait_cqe(&mut side.send_cq);
    assert_eq!((sent.req_id, sent.status), (5, 0));
    let got = side.driver.wait_cqe(&mut side.recv_cq);
    assert_eq!((got.req_id, got.status, got.length), (77, 0, 8000));
    assert_eq!(side.driver.guest.read(rx_buf, 8000), data);
    let stats = side.driver.stats();
    assert_eq!((stats.send_wrs, stats.recv_wrs), (1, 1));
}

/// Catches: `run_engines` stepping a device whose engines have threads
/// (two engines on one queue).
#[test]
fn run_engines_does_nothing_with_engine_threads() {
    let guest = Guest::new();
    let d = Driver::new(
        &guest,
        attrs(5),
        Arc::new(NoLink::default()),
        EfaOptions { keep_alive: None },
    );
    d.write_reg(reg::AQ_PROD_DB, 0);
    assert_eq!(d.efa.run_engines(), 0);
}
