//! The EFA model driven as the upstream driver and rdma-core drive it:
//! probe, admin commands, the data path between two devices, faults and
//! resets. No QEMU, no socket.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use p2plab_efa::bytes::{u16_at, u32_at, u64_at};
use p2plab_efa::regs::reg;
use p2plab_efa::{EfaOptions, NoLink};
use p2plab_kit::DeviceControl;

fn lone_driver(options: EfaOptions) -> Driver {
    let guest = Guest::new();
    Driver::new(&guest, attrs(7), Arc::new(NoLink::default()), options)
}

/// Catches: a device the driver's probe cannot get through: readless
/// answers missing when the register write returns, a reset that ends
/// before the driver ends it, features laid out wrong, the AENQ groups
/// the driver requires missing.
#[test]
fn the_drivers_probe_gets_every_attribute() {
    let mut d = lone_driver(EfaOptions { keep_alive: None });
    let dev = d.probe();
    assert_eq!(dev[2], 0, "GET_FEATURE DEVICE_ATTR status");
    let supported = u64_at(&dev, 8);
    assert_eq!(supported & 0x3c, 0x3c);
    assert_eq!(u32_at(&dev, 8 + 20), 1, "admin_api_version");
    assert_eq!(u16_at(&dev, 8 + 28), 4, "db_bar");
    assert_eq!(
        dev[8 + 40..8 + 48],
        0x1007u64.to_be_bytes(),
        "the GUID the server set, in ib_device.node_guid's byte order"
    );
    let q = d.get_feature(4);
    assert_eq!(u32_at(&q, 8), 64, "max_qp");
    assert_eq!(u16_at(&q, 8 + 24), 1, "sub_cqs_per_cq");
    let net = d.get_feature(3);
    assert_eq!(net[8..24], gid(7), "the GID the server set");
    assert_eq!(u32_at(&net, 24), 8928);
    let s = d.stats();
    assert!(s.readless_reads >= 7, "{}", s.readless_reads);
    assert_eq!(s.readless_failures, 0);
    assert_eq!(s.admin_errors, 0);
    assert!(d.irq.count(0) >= 8, "vector 0 after each completion");
}

/// Catches: a device that clears RESET_IN_PROGRESS on its own (the
/// driver's first poll would time out), keeps objects across a reset, or
/// answers readless reads wrongly during it.
#[test]
fn the_reset_handshake_waits_for_the_driver() {
    let mut d = lone_driver(EfaOptions { keep_alive: None });
    d.probe();
    d.alloc_uar();
    d.alloc_pd();
    assert_eq!(d.control().objects().pds, 1);
    d.write_reg(reg::DEV_CTL, 1);
    for _ in 0..20 {
        assert_eq!(
            d.read_reg(reg::DEV_STS as u16) & 0x9,
            0x9,
            "READY and RESET_IN_PROGRESS"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(d.control().objects().pds, 0, "objects die with the reset");
    d.write_reg(reg::DEV_CTL, 0);
    wait_for("the reset to end", || {
        (d.read_reg(reg::DEV_STS as u16) & 8 == 0).then_some(())
    });
    assert_eq!(
        d.read_reg(reg::DEV_STS as u16) & 0x11,
        0x11,
        "READY and RESET_FINISHED"
    );
    assert_eq!(d.stats().resets, 2, "the probe's and this one");
    // The device works again after the driver sets it up.
    d.probe();
    assert_eq!(d.alloc_pd(), 1);
}

/// Catches: completion phases that do not flip on the second lap of the
/// admin CQ (the driver would stop seeing completions after 32), or a
/// command ID echoed wrongly.
#[test]
fn admin_completions_keep_their_phase_over_many_laps() {
    let mut d = lone_driver(EfaOptions { keep_alive: None });
    d.probe();
    for _ in 0..50 {
        let pd = d.alloc_pd();
        let mut p = [0u8; 4];
        p[0..2].copy_from_slice(&pd.to_le_bytes());
        assert_eq!(d.admin(15, 0, &p).status, 0);
    }
    assert!(d.stats().admin_commands > 100);
}

/// Catches: unknown or malformed admin commands answered with a status
/// other than the one the driver maps to the right errno, left
/// unanswered, or breaking the queue for the next command.
#[test]
fn bad_admin_commands_get_the_drivers_statuses() {
    let mut d = lone_driver(EfaOptions { keep_alive: None });
    d.probe();
    assert_eq!(d.admin(0, 0, &[]).status, 2, "BAD_OPCODE");
    assert_eq!(d.admin(99, 0, &[]).status, 2, "BAD_OPCODE");
    assert_eq!(
        d.admin(20, 0, &[]).status,
        3,
        "ALLOC_MR: UNSUPPORTED_OPCODE"
    );
    assert_eq!(
        d.admin(25, 0, &[]).status,
        3,
        "event counters: UNSUPPORTED_OPCODE"
    );
    let mut feature = [0u8; 60];
    feature[13] = 8;
    assert_eq!(d.admin(11, 0, &feature).status, 3, "an unknown feature");
    assert_eq!(d.admin(15, 0, &[9, 0]).status, 5, "DEALLOC_PD of no PD");
    assert_eq!(d.admin(10, 0, &[3, 0]).status, 5, "DESTROY_CQ of no CQ");
    assert_eq!(
        d.admin(4, 0, &[0xff, 0xff, 0, 0]).status,
        5,
        "DESTROY_QP of no QP"
    );
    let mut mr = [0u8; 60];
    mr[44] = 12;
    assert_eq!(d.admin(7, 0, &mr).status, 5, "REG_MR without a PD");
    assert_eq!(
        d.admin(7, 4, &mr).status,
        4,
        "indirect without a control buffer"
    );
    let uar = d.alloc_uar();
    let cq = d.create_cq(uar, 64, None);
    let pd = d.alloc_pd();
    let mut bad_qp = [0u8; 60];
    bad_qp[0..2].copy_from_slice(&pd.to_le_bytes());
    bad_qp[2] = 3;
    bad_qp[20..24].copy_from_slice(&u32::from(cq.idx).to_le_bytes());
    bad_qp[24..28].copy_from_slice(&u32::from(cq.idx).to_le_bytes());
    bad_qp[52..54].copy_from_slice(&uar.to_le_bytes());
    assert_eq!(d.admin(1, 0, &bad_qp).status, 5, "qp_type 3");
    bad_qp[2] = 2;
    bad_qp[36..40].copy_from_slice(&100u32.to_le_bytes());
    assert_eq!(d.admin(1, 0, &bad_qp).status, 5, "a send ring of 100 bytes");
    // The queue still works.
    assert_eq!(d.alloc_pd(), 2);
    let s = d.stats();
    assert_eq!(s.admin_bad_opcodes, 2);
    assert_eq!(s.admin_unsupported, 3);
}

/// Catches: a table that never fills (or fills early), or a failure
/// status other than RESOURCE_ALLOCATION_FAILURE (the driver's -ENOMEM).
#[test]
fn full_tables_answer_resource_allocation_failure() {
    let mut d = lone_driver(EfaOptions { keep_alive: None });
    d.probe();
    for n in 1..=64 {
        assert_eq!(d.alloc_pd(), n);
    }
    assert_eq!(d.admin(14, 0, &[]).status, 1);
}

/// Catches: a writable MR whose pages are left for the packets to fault
/// in (a GPU buffer a zero fill punched then allocates a page per packet
/// while the transfer is timed), a prefault of a read-only MR, pieces
/// that hold the DMA gate for more than 2 MiB, or a REG_MR that fails
/// because its memory could not be prefaulted.
#[test]
fn writable_mrs_are_prefaulted_when_registered() {
    let mut d = lone_driver(EfaOptions { keep_alive: None });
    d.probe();
    let pd = d.alloc_pd();
    let mib = 1u64 << 20;
    let at = d.guest.alloc(5 * mib, 4096);
    d.reg_mr(pd, at, 5 * mib, LOCAL_WRITE);
    assert_eq!(
        d.guest.memory.prefaults(),
        [(at, 2 * mib), (at + 2 * mib, 2 * mib), (at + 4 * mib, mib)]
    );
    let remote = d.guest.alloc(mib, 4096);
    d.reg_mr(pd, remote + 100, 8192, REMOTE_WRITE);
    assert_eq!(d.guest.memory.prefaults()[3..], [(remote + 100, 8192)]);
    let source = d.guest.alloc(mib, 4096);
    d.reg_mr(pd, source, mib, REMOTE_READ);
    assert_eq!(d.guest.memory.prefaults().len(), 4, "read-only: untouched");
    // Past the end of guest RAM: not prefaulted, still registered.
    d.reg_mr(pd, RAM + RAM_SIZE as u64 - mib, 3 * mib, LOCAL_WRITE);
    assert_eq!(d.guest.memory.prefaults().len(), 4);
}

/// Catches: SEND data that arrives altered or in the wrong buffer,
/// completions with the wrong request ID, length, source QP or AH, or
/// counters that do not count what moved.
#[test]
fn srd_sends_land_byte_for_byte() {
    let mut pair = Pair::new(SRD);
    let (rx_buf, rx_key) = pair.b.buffer(64 << 10, LOCAL_WRITE);
    let (tx_buf, tx_key) = pair.a.buffer(64 << 10, 0);
    let data = pattern(3, 8000);
    pair.guest.write(tx_buf + 100, &data);
    for i in 0..4u16 {
        let b = &mut pair.b;
        b.driver.post_recv(
            &mut b.qp,
            10 + i,
            rx_buf + u64::from(i) * 9000,
            9000,
            rx_key,
        );
    }
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    a.driver.post_send(
        &mut a.qp,
        wqe::send_inline(1, b_qp, a.ah, QKEY, b"inline hello"),
    );
    let sgl = [(tx_buf + 100, 5000, tx_key), (tx_buf + 5100, 3000, tx_key)];
    a.driver.post_send(
        &mut a.qp,
        wqe::send_sgl(2, b_qp, a.ah, QKEY, Some(0xfeed), &sgl),
    );
    let mut done = [
        a.driver.wait_cqe(&mut a.send_cq),
        a.driver.wait_cqe(&mut a.send_cq),
    ];
    done.sort_by_key(|c| c.req_id);
    for (c, req_id) in done.iter().zip([1, 2]) {
        assert_eq!(
            (c.req_id, c.status, c.q_type, c.op_type, c.qp_num),
            (req_id, 0, 1, 0, pair.a.qp.num)
        );
    }
    let b = &mut pair.b;
    let mut got = [
        b.driver.wait_cqe(&mut b.recv_cq),
        b.driver.wait_cqe(&mut b.recv_cq),
    ];
    got.sort_by_key(|c| c.length);
    let (small, big) = (&got[0], &got[1]);
    assert_eq!((small.status, small.q_type, small.length), (0, 2, 12));
    assert_eq!((big.length, big.has_imm, big.imm), (8000, true, 0xfeed));
    for c in &got {
        assert_eq!(c.src_qp, pair.a.qp.num);
        assert_eq!(c.ah, pair.b.ah, "B's own AH for A's GID");
    }
    let slot = |c: &Cqe| rx_buf + u64::from(c.req_id - 10) * 9000;
    assert_eq!(pair.guest.read(slot(small), 12), b"inline hello");
    assert_eq!(pair.guest.read(slot(big), 8000), data);
    let (sa, sb) = (pair.a.driver.stats(), pair.b.driver.stats());
    assert_eq!((sa.send_wrs, sa.send_bytes), (2, 8012));
    assert_eq!((sb.recv_wrs, sb.recv_bytes), (2, 8012));
    assert_eq!(sb.rx_pkts, sa.tx_pkts, "every packet A sent, B received");
}

/// Catches: an SRD SEND to a QP with no receive posted that is lost or
/// failed instead of retried (RNR) until a receive comes.
#[test]
fn srd_waits_for_a_receive_rnr() {
    let mut pair = Pair::new(SRD);
    let (rx_buf, rx_key) = pair.b.buffer(4096, LOCAL_WRITE);
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(5, b_qp, a.ah, QKEY, b"early"));
    wait_for("an RNR", || {
        (pair.b.driver.stats().rnr_naks >= 2).then_some(())
    });
    assert!(
        pair.a.driver.poll_cqe(&mut pair.a.send_cq).is_none(),
        "no completion before delivery"
    );
    let b = &mut pair.b;
    b.driver.post_recv(&mut b.qp, 77, rx_buf, 4096, rx_key);
    let rx = b.driver.wait_cqe(&mut b.recv_cq);
    assert_eq!((rx.req_id, rx.length, rx.status), (77, 5, 0));
    assert_eq!(pair.guest.read(rx_buf, 5), b"early");
    let a = &mut pair.a;
    let tx = a.driver.wait_cqe(&mut a.send_cq);
    assert_eq!((tx.req_id, tx.status), (5, 0));
    assert_eq!(pair.b.driver.stats().recv_wrs, 1, "delivered once");
}

/// Catches: UD data without the 40-byte GRH space in front, a qkey
/// mismatch delivered, or a UD send that waits for the receiver.
#[test]
fn ud_sends_carry_the_grh_prefix_and_check_the_qkey() {
    let mut pair = Pair::new(UD);
    let (rx_buf, rx_key) = pair.b.buffer(8192, LOCAL_WRITE);
    pair.guest.write(rx_buf, &[0xee; 64]);
    let b = &mut pair.b;
    b.driver.post_recv(&mut b.qp, 1, rx_buf, 4096, rx_key);
    b.driver
        .post_recv(&mut b.qp, 2, rx_buf + 4096, 4096, rx_key);
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    a.driver.post_send(
        &mut a.qp,
        wqe::send_inline(1, b_qp, a.ah, 0xbad, b"wrong qkey"),
    );
    a.driver.post_send(
        &mut a.qp,
        wqe::send_inline(2, b_qp, a.ah, QKEY, b"ud payload"),
    );
    for _ in 0..2 {
        assert_eq!(
            a.driver.wait_cqe(&mut a.send_cq).status,
            0,
            "UD completes when sent"
        );
    }
    let b = &mut pair.b;
    let rx = b.driver.wait_cqe(&mut b.recv_cq);
    assert_eq!(
        (rx.req_id, rx.length),
        (1, 40 + 10),
        "the first receive took the good one"
    );
    assert_eq!(
        pair.guest.read(rx_buf, 40),
        vec![0; 40],
        "the GRH space is zeroed"
    );
    assert_eq!(pair.guest.read(rx_buf + 40, 10), b"ud payload");
    assert_eq!(pair.b.driver.stats().qkey_viol, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert!(pair.b.driver.poll_cqe(&mut pair.b.recv_cq).is_none());
}

/// Catches: RDMA data altered, short or placed wrongly across segments
/// and MR pages (a chained page list, an unaligned IOVA), a write's
/// immediate not consuming a receive, or completions with the wrong op.
#[test]
fn rdma_read_and_write_move_every_byte() {
    let mut pair = Pair::new(SRD);
    let len: u32 = 300_000;
    let remote = pair.guest.alloc(2 << 20, 4096);
    let remote_key = pair
        .b
        .driver
        .reg_mr_as(
            pair.b.pd,
            remote,
            2 << 20,
            REMOTE_READ | REMOTE_WRITE | LOCAL_WRITE,
            Some(true),
        )
        .unwrap();
    let local = pair.guest.alloc(2 << 20, 4096);
    let local_key = pair
        .a
        .driver
        .reg_mr_as(pair.a.pd, local, 2 << 20, LOCAL_WRITE, Some(false))
        .unwrap();
    let source = pattern(9, len as usize);
    pair.guest.write(remote + 12345, &source);
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    let read = wqe::rdma(
        1,
        41,
        b_qp,
        a.ah,
        None,
        (remote + 12345, remote_key),
        (local + 777, local_key),
        len,
    );
    a.driver.post_send(&mut a.qp, read);
    let c = a.driver.wait_cqe(&mut a.send_cq);
    assert_eq!((c.req_id, c.status, c.op_type), (41, 0, 1));
    assert_eq!(pair.guest.read(local + 777, len as usize), source);

    let (rx_buf, rx_key) = pair.b.buffer(4096, LOCAL_WRITE);
    let b = &mut pair.b;
    b.driver.post_recv(&mut b.qp, 9, rx_buf, 64, rx_key);
    let back = pattern(4, len as usize);
    pair.guest.write(local + 1_000_000, &back);
    let a = &mut pair.a;
    let write = wqe::rdma(
        2,
        42,
        b_qp,
        a.ah,
        Some(0xabc),
        (remote + 1, remote_key),
        (local + 1_000_000, local_key),
        len,
    );
    a.driver.post_send(&mut a.qp, write);
    let c = a.driver.wait_cqe(&mut a.send_cq);
    assert_eq!((c.req_id, c.status, c.op_type), (42, 0, 2));
    assert_eq!(pair.guest.read(remote + 1, len as usize), back);
    let b = &mut pair.b;
    let rx = b.driver.wait_cqe(&mut b.recv_cq);
    assert_eq!(
        (rx.req_id, rx.op_type, rx.has_imm, rx.imm, rx.length),
        (9, 2, true, 0xabc, len)
    );
    let (sa, sb) = (pair.a.driver.stats(), pair.b.driver.stats());
    assert_eq!((sa.read_wrs, sa.read_bytes), (1, u64::from(len)));
    assert_eq!(sb.read_resp_bytes, u64::from(len));
    assert_eq!((sa.write_wrs, sb.write_recv_bytes), (1, u64::from(len)));
}

/// Catches: an RDMA read timed out and asked for again, all of it, while
/// its data still arrives (the timer measuring the whole read, not the
/// silence): a long read behind a slow wire or behind other reads then
/// moves its bytes twice (the EFA bench's 4 MiB reads under load).
#[test]
fn a_read_whose_data_keeps_arriving_is_not_asked_for_again() {
    let mut pair = Pair::new(SRD);
    let len: u32 = 4 << 20;
    let remote = pair.guest.alloc(u64::from(len), 4096);
    let remote_key = pair
        .b
        .driver
        .reg_mr(pair.b.pd, remote, u64::from(len), REMOTE_READ);
    let (local, local_key) = pair.a.buffer(u64::from(len), LOCAL_WRITE);
    let source = pattern(3, len as usize);
    pair.guest.write(remote, &source);
    // Each packet B sends waits 4 ms: the read's 128 segments take about
    // 520 ms, longer than the first three timeouts together (50, 100 and
    // 200 ms).
    DeviceControl::inject(&pair.b.driver.control(), "delay=4ms").unwrap();
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    let read = wqe::rdma(
        1,
        7,
        b_qp,
        a.ah,
        None,
        (remote, remote_key),
        (local, local_key),
        len,
    );
    a.driver.post_send(&mut a.qp, read);
    let c = a.driver.wait_cqe(&mut a.send_cq);
    assert_eq!((c.req_id, c.status, c.op_type), (7, 0, 1));
    assert_eq!(pair.guest.read(local, len as usize), source);
    let (sa, sb) = (pair.a.driver.stats(), pair.b.driver.stats());
    assert!(
        sb.wire_delays >= 32,
        "the wire was slow: {}",
        sb.wire_delays
    );
    // The broken timer (measuring the whole read) fires three times, every
    // time, and the read is served four times over. A working one
    // fires only if one gap between two segments outlasts 50 ms, which a
    // scheduler stall on a loaded 2-core CI host can make happen once;
    // that read is then served a second time, and no more.
    let timeouts = sa.retrans_timeout_events;
    assert!(timeouts <= 1, "{timeouts} timeouts while the data flowed");
    let served = sb.read_resp_bytes;
    assert!(
        served >= u64::from(len) && served <= u64::from(len) * (1 + timeouts),
        "served {served} bytes of a {len}-byte read after {timeouts} timeouts"
    );
}

/// Catches: RDMA into memory the target did not allow (no remote read
/// permission, outside the MR) succeeding, or failing with a status the
/// provider maps to the wrong error.
#[test]
fn rdma_outside_what_the_target_allows_fails() {
    let mut pair = Pair::new(SRD);
    let (remote, remote_key) = pair.b.buffer(8192, LOCAL_WRITE);
    let (local, local_key) = pair.a.buffer(8192, LOCAL_WRITE);
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    a.driver.post_send(
        &mut a.qp,
        wqe::rdma(
            1,
            1,
            b_qp,
            a.ah,
            None,
            (remote, remote_key),
            (local, local_key),
            100,
        ),
    );
    assert_eq!(
        a.driver.wait_cqe(&mut a.send_cq).status,
        7,
        "no remote read: REMOTE_ERROR_BAD_ADDRESS"
    );
    a.driver.post_send(
        &mut a.qp,
        wqe::rdma(
            2,
            2,
            b_qp,
            a.ah,
            None,
            (remote + 8000, remote_key),
            (local, local_key),
            1000,
        ),
    );
    assert_eq!(a.driver.wait_cqe(&mut a.send_cq).status, 7, "past the MR");
    a.driver.post_send(
        &mut a.qp,
        wqe::rdma(
            1,
            3,
            b_qp,
            a.ah,
            None,
            (remote, remote_key),
            (local, local_key ^ 0x100),
            100,
        ),
    );
    assert_eq!(a.driver.wait_cqe(&mut a.send_cq).status, 5, "bad lkey");
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(4, b_qp, 200, QKEY, b"x"));
    assert_eq!(a.driver.wait_cqe(&mut a.send_cq).status, 4, "no such AH");
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(5, 0x7777, a.ah, QKEY, b"x"));
    assert_eq!(
        a.driver.wait_cqe(&mut a.send_cq).status,
        9,
        "no such QP: BAD_DEST_QPN"
    );
}

/// Catches: SRD losing, duplicating or refusing messages when the wire
/// drops, corrupts, delays and reorders packets: every message must be
/// delivered exactly once, and every send completed OK.
#[test]
fn srd_recovers_from_every_wire_fault() {
    let mut pair = Pair::new(SRD);
    let count = 40u16;
    let (rx_buf, rx_key) = pair.b.buffer(u64::from(count) * 256, LOCAL_WRITE);
    for i in 0..count {
        let b = &mut pair.b;
        b.driver
            .post_recv(&mut b.qp, i, rx_buf + u64::from(i) * 256, 256, rx_key);
    }
    let control = pair.a.driver.control();
    for spec in [
        "drop,prob=0.2",
        "corrupt,prob=0.1",
        "reorder,prob=0.3",
        "delay=1ms,prob=0.1",
    ] {
        DeviceControl::inject(&control, spec).unwrap();
    }
    // B's acknowledgements are dropped too.
    DeviceControl::inject(&pair.b.driver.control(), "drop,prob=0.2").unwrap();
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    for i in 0..count {
        let msg = format!("message {i:03}");
        a.driver.post_send(
            &mut a.qp,
            wqe::send_inline(i, b_qp, a.ah, QKEY, msg.as_bytes()),
        );
    }
    let mut sent = std::collections::BTreeSet::new();
    for _ in 0..count {
        let c = a.driver.wait_cqe(&mut a.send_cq);
        assert_eq!(c.status, 0);
        sent.insert(c.req_id);
    }
    assert_eq!(sent.len(), usize::from(count));
    let mut received = std::collections::BTreeSet::new();
    let b = &mut pair.b;
    for _ in 0..count {
        let c = b.driver.wait_cqe(&mut b.recv_cq);
        assert_eq!(c.status, 0);
        let got = pair
            .guest
            .read(rx_buf + u64::from(c.req_id) * 256, c.length as usize);
        received.insert(String::from_utf8(got).unwrap());
    }
    let expected: std::collections::BTreeSet<String> =
        (0..count).map(|i| format!("message {i:03}")).collect();
    assert_eq!(received, expected, "each message exactly once");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        pair.b.driver.poll_cqe(&mut pair.b.recv_cq).is_none(),
        "no duplicate delivery"
    );
    let (sa, sb) = (pair.a.driver.stats(), pair.b.driver.stats());
    assert!(
        sa.wire_drops > 0 && sa.wire_corrupts > 0 && sa.wire_reorders > 0,
        "{sa:?}"
    );
    assert!(sa.retrans_pkts > 0);
    assert!(sb.bad_packets > 0, "corrupted packets caught by the CRC");
    assert_eq!(sb.recv_wrs, u64::from(count));
}

/// Catches: injected completion and admin errors not reaching the
/// guest, or reaching the wrong command.
#[test]
fn injected_errors_reach_completions_and_admin_commands() {
    let mut pair = Pair::new(SRD);
    let control = pair.a.driver.control();
    DeviceControl::inject(&control, "cq-error=12,count=1").unwrap();
    let b_qp = pair.b.qp.num;
    let (rx_buf, rx_key) = pair.b.buffer(4096, LOCAL_WRITE);
    let b = &mut pair.b;
    b.driver.post_recv(&mut b.qp, 1, rx_buf, 100, rx_key);
    let a = &mut pair.a;
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(1, b_qp, a.ah, QKEY, b"x"));
    assert_eq!(a.driver.wait_cqe(&mut a.send_cq).status, 12);
    assert_eq!(a.driver.stats().injected_cq_errors, 1);
    assert!(
        DeviceControl::inject(&control, "cq-error=16").is_err(),
        "not a status"
    );
    DeviceControl::inject(&control, "admin-error=1,opcode=14,count=1").unwrap();
    assert_eq!(a.driver.admin(16, 0, &[]).status, 0, "another opcode runs");
    assert_eq!(
        a.driver.admin(14, 0, &[]).status,
        1,
        "ALLOC_PD fails as injected"
    );
    assert_eq!(a.driver.admin(14, 0, &[]).status, 0, "once");
    let report = DeviceControl::fault_report(&control);
    assert_eq!(report[1]["fired"], 1);
}

/// Catches: a keep-alive or link event missing from the AENQ, written
/// with the wrong phase, sent while management interrupts are masked, or
/// a link-down that does not fail SRD sends.
#[test]
fn aenq_carries_keep_alives_and_link_state() {
    let guest = Guest::new();
    let mut d = Driver::new(
        &guest,
        attrs(3),
        Arc::new(NoLink::default()),
        EfaOptions {
            keep_alive: Some(Duration::from_millis(20)),
        },
    );
    d.probe();
    let events = wait_for("keep-alives", || {
        let events = d.drain_aenq();
        (!events.is_empty()).then_some(events)
    });
    assert!(events.iter().all(|&(group, _)| group == 4), "{events:?}");
    // More than a queue's worth, consumed as the driver does.
    let mut total = events.len();
    while total < 40 {
        total += d.drain_aenq().len();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(d.stats().keep_alives >= 40);
    let control = d.control();
    DeviceControl::inject(&control, "link-down").unwrap();
    let link = wait_for("the link-down event", || {
        d.drain_aenq().into_iter().find(|&(group, _)| group == 3)
    });
    assert_eq!(link, (3, 1), "NOTIFICATION / LINK_DOWN");
    assert!(!control.link_up());
    DeviceControl::clear(&control);
    let up = wait_for("the link-up event", || {
        d.drain_aenq().into_iter().find(|&(g, _)| g == 3)
    });
    assert_eq!(up, (3, 2));
    // Masked management interrupts: events still land, no vector.
    d.write_reg(reg::INTR_MASK, 1);
    let before = d.irq.count(0);
    wait_for("a masked keep-alive", || {
        (!d.drain_aenq().is_empty()).then_some(())
    });
    assert_eq!(d.irq.count(0), before, "no interrupt while masked");
}

/// Catches: a link-down fault that lets SRD sends through or hangs them.
#[test]
fn a_down_port_fails_srd_sends_as_unreachable() {
    let mut pair = Pair::new(SRD);
    DeviceControl::inject(&pair.a.driver.control(), "link-down").unwrap();
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(8, b_qp, a.ah, QKEY, b"x"));
    let c = a.driver.wait_cqe(&mut a.send_cq);
    assert_eq!((c.req_id, c.status), (8, 15), "LOCAL_ERROR_UNREACH_REMOTE");
}

/// Catches: an armed CQ that posts no event (or one per completion, or
/// raises a vector while its EQ is not armed).
#[test]
fn armed_cqs_post_events_to_their_eq() {
    let mut pair = Pair::new(SRD);
    let b = &mut pair.b;
    let (eqn, mut eq) = b.driver.create_eq(512, 1);
    let mut cq = b.driver.create_cq(b.uar, 64, Some(eqn));
    let send_cq = b.send_cq.clone();
    let mut qp = b.driver.create_qp(b.pd, b.uar, SRD, &send_cq, &cq, 16, 64);
    let (rx_buf, rx_key) = b.buffer(4096, LOCAL_WRITE);
    for i in 0..3 {
        b.driver
            .post_recv(&mut qp, i, rx_buf + u64::from(i) * 100, 100, rx_key);
    }
    // Arm: consumer index 0, arm bit.
    b.driver.efa.db_write(cq.db, &(1u32 << 31).to_le_bytes());
    let a = &mut pair.a;
    for i in 0..2 {
        a.driver
            .post_send(&mut a.qp, wqe::send_inline(i, qp.num, a.ah, QKEY, b"ev"));
    }
    for _ in 0..2 {
        a.driver.wait_cqe(&mut a.send_cq);
    }
    let b = &mut pair.b;
    wait_for("one event", || (b.driver.irq.count(1) == 1).then_some(()));
    let eqe = eq.next(&b.driver.guest).expect("an EQE");
    assert_eq!(u16_at(&eqe, 8), cq.idx);
    assert!(eq.next(&b.driver.guest).is_none(), "one event per arm");
    b.driver.wait_cqe(&mut cq);
    b.driver.wait_cqe(&mut cq);
    // Re-arm with everything consumed: nothing until the next completion.
    b.driver.write_reg(reg::EQ_DB, u32::from(eqn) | 1 << 31);
    b.driver
        .efa
        .db_write(cq.db, &(2u32 | 1 << 31).to_le_bytes());
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(b.driver.irq.count(1), 1);
    let a = &mut pair.a;
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(9, qp.num, a.ah, QKEY, b"ev"));
    let b = &mut pair.b;
    wait_for("a second event", || {
        (b.driver.irq.count(1) == 2).then_some(())
    });
    assert!(eq.next(&b.driver.guest).is_some());
}

/// Catches: work taken before a reset that still lands in guest memory
/// after it (a completion written into a CQ ring the driver freed).
#[test]
fn a_reset_overtakes_messages_in_flight() {
    let mut pair = Pair::new(SRD);
    let b_qp = pair.b.qp.num;
    // Nothing posted at B: A's send keeps retrying (RNR).
    let a = &mut pair.a;
    let ring = a.send_cq.consumer.base;
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(1, b_qp, a.ah, QKEY, b"late"));
    wait_for("the RNR loop", || {
        (pair.b.driver.stats().rnr_naks > 0).then_some(())
    });
    pair.a.driver.write_reg(reg::DEV_CTL, 1);
    let (rx_buf, rx_key) = pair.b.buffer(4096, LOCAL_WRITE);
    let b = &mut pair.b;
    b.driver.post_recv(&mut b.qp, 1, rx_buf, 100, rx_key);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        pair.guest.read(ring, 32),
        vec![0; 32],
        "no completion after the reset"
    );
    assert_eq!(
        pair.b.driver.stats().recv_wrs,
        0,
        "the message died with the reset"
    );
}

/// Catches: doorbells and WQEs a hostile user space writes (garbage
/// values, a producer beyond the ring, a WQE of random bytes, a phase
/// that does not match) crashing the device or doing anything but error
/// completions and counted refusals.
#[test]
fn hostile_doorbells_and_wqes_are_refused() {
    let mut pair = Pair::new(SRD);
    let a = &mut pair.a;
    let before = a.driver.stats().bad_doorbells;
    for (offset, value) in [
        (0x3f_f000u64, 1u32),
        (0x10, 5),
        (a.qp.sq_db, 5000),
        (a.qp.rq_db, 60000),
        (0x800 + 4 * 50, 1),
    ] {
        a.driver.efa.db_write(offset, &value.to_le_bytes());
    }
    a.driver.efa.db_write(a.qp.sq_db, &[1, 2]);
    assert_eq!(a.driver.stats().bad_doorbells - before, 5);
    let mut junk = [0u8; 64];
    for (i, b) in junk.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(97) ^ 0x5a;
    }
    junk[0..2].copy_from_slice(&0x33u16.to_le_bytes());
    a.driver.post_send(&mut a.qp, junk);
    let c = a.driver.wait_cqe(&mut a.send_cq);
    assert_eq!(c.req_id, 0x33);
    assert_ne!(c.status, 0);
    // A WQE with the wrong phase (the doorbell ran ahead of the stores).
    let mut w = wqe::send_inline(0x44, 1, a.ah, QKEY, b"x");
    w[3] |= 1;
    a.driver.post_send(&mut a.qp, w);
    let c = a.driver.wait_cqe(&mut a.send_cq);
    assert_eq!(
        (c.req_id, c.status),
        (0x44, 2),
        "LOCAL_ERROR_QP_INTERNAL_ERROR"
    );
    assert_eq!(a.driver.stats().bad_wqes, 2);
}

/// Catches: admin commands or WQEs processed while Bus Master Enable is
/// off (no DMA may happen), or lost once it is back on.
#[test]
fn nothing_moves_without_bus_mastering() {
    let mut d = lone_driver(EfaOptions { keep_alive: None });
    d.probe();
    let sq = {
        let r = d.read_reg(reg::AQ_BASE_LO as u16);
        u64::from(r) | u64::from(d.read_reg(reg::AQ_BASE_HI as u16)) << 32
    };
    d.efa.set_bus_master(false);
    let mut entry = [0u8; 64];
    entry[2] = 14;
    entry[3] = 1;
    // Submit by hand: the completion must not come yet.
    let before = d.stats().readless_failures;
    d.write_reg(reg::MMIO_REG_READ, (reg::VERSION as u32) << 16 | 0x77);
    assert_eq!(
        d.stats().readless_failures,
        before + 1,
        "no readless answer without BME"
    );
    let count = d.acq.count;
    let slot = u64::from(count % AQ_DEPTH);
    entry[0..2].copy_from_slice(&(count as u16).to_le_bytes());
    d.guest.write(sq + slot * 64, &entry);
    d.write_reg(reg::AQ_PROD_DB, count + 1);
    std::thread::sleep(Duration::from_millis(50));
    let mut acq = d.acq;
    assert!(acq.next(&d.guest).is_none(), "no completion with BME off");
    d.efa.set_bus_master(true);
    let done = wait_for("the completion", || d.acq.next(&d.guest));
    assert_eq!(done[2], 0);
}

/// Catches: GET_STATS answering other numbers than the device counts
/// (the guest's hw_counters and the server's stats must agree).
#[test]
fn get_stats_reports_the_device_counters() {
    let mut pair = Pair::new(SRD);
    let (rx_buf, rx_key) = pair.b.buffer(4096, LOCAL_WRITE);
    let b = &mut pair.b;
    b.driver.post_recv(&mut b.qp, 1, rx_buf, 100, rx_key);
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    a.driver.post_send(
        &mut a.qp,
        wqe::send_inline(1, b_qp, a.ah, QKEY, b"count me"),
    );
    a.driver.wait_cqe(&mut a.send_cq);
    let stats = |d: &mut Driver, ty: u8| {
        let mut p = [0u8; 16];
        p[12] = ty;
        let c = d.admin(13, 0, &p);
        assert_eq!(c.status, 0);
        (0..6)
            .map(|i| u64_at(&c.entry, 8 + i * 8))
            .collect::<Vec<u64>>()
    };
    let messages = stats(&mut pair.a.driver, 1);
    let s = pair.a.driver.stats();
    assert_eq!(
        messages[..4],
        [s.send_bytes, s.send_wrs, s.recv_bytes, s.recv_wrs]
    );
    assert_eq!(messages[..2], [8, 1]);
    let basic = stats(&mut pair.a.driver, 0);
    let s = pair.a.driver.stats();
    assert_eq!(
        basic,
        vec![
            s.tx_bytes,
            s.tx_pkts,
            s.rx_bytes,
            s.rx_pkts,
            s.rx_drops,
            s.qkey_viol
        ]
    );
    for ty in [2u8, 3, 4] {
        stats(&mut pair.a.driver, ty);
    }
    let mut p = [0u8; 16];
    p[12] = 9;
    assert_eq!(pair.a.driver.admin(13, 0, &p).status, 5);
}

/// Catches: a destroyed QP whose messages in flight still complete into
/// its CQ, or a CQ that can be destroyed while a QP uses it.
#[test]
fn destroying_a_qp_stops_its_messages() {
    let mut pair = Pair::new(SRD);
    let b_qp = pair.b.qp.num;
    let a = &mut pair.a;
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(1, b_qp, a.ah, QKEY, b"orphan"));
    wait_for("the RNR loop", || {
        (pair.b.driver.stats().rnr_naks > 0).then_some(())
    });
    let a = &mut pair.a;
    let mut p = [0u8; 4];
    p.copy_from_slice(&u32::from(a.send_cq.idx).to_le_bytes());
    assert_eq!(
        a.driver.admin(10, 0, &p[..2]).status,
        7,
        "CQ in use: RESOURCE_BUSY"
    );
    assert_eq!(a.driver.admin(4, 0, &a.qp.handle.to_le_bytes()).status, 0);
    let (rx_buf, rx_key) = pair.b.buffer(4096, LOCAL_WRITE);
    let b = &mut pair.b;
    b.driver.post_recv(&mut b.qp, 1, rx_buf, 100, rx_key);
    std::thread::sleep(Duration::from_millis(100));
    assert!(pair.a.driver.poll_cqe(&mut pair.a.send_cq).is_none());
    assert_eq!(pair.a.driver.control().objects().qps, 0);
}

/// Catches: a QP moved to the error state that keeps its receives (the
/// provider gets no flushed completions) or keeps receiving.
#[test]
fn the_error_state_flushes_posted_receives() {
    let mut pair = Pair::new(SRD);
    let (rx_buf, rx_key) = pair.b.buffer(4096, LOCAL_WRITE);
    let b = &mut pair.b;
    for i in 0..3 {
        b.driver.post_recv(&mut b.qp, 20 + i, rx_buf, 100, rx_key);
    }
    assert_eq!(b.driver.modify_qp(b.qp.handle, 1, 6, 0), 0);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let c = b.driver.wait_cqe(&mut b.recv_cq);
        assert_eq!((c.status, c.q_type), (1, 2), "FLUSHED receive completions");
        ids.push(c.req_id);
    }
    assert_eq!(ids, vec![20, 21, 22]);
    let mut p = [0u8; 4];
    p.copy_from_slice(&b.qp.handle.to_le_bytes());
    let q = b.driver.admin(3, 0, &p);
    assert_eq!(u32_at(&q.entry, 8), 6, "QUERY_QP says ERR");
}

/// Catches: a trace that does not name admin opcodes, features, QP types,
/// WQE operations and completion statuses as the driver's headers do, or
/// loses the fields a developer reads.
#[test]
fn the_trace_names_opcodes_and_fields_as_the_headers_do() {
    let dir = std::env::temp_dir().join(format!("p2plab-efa-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("efa0.trace.jsonl");
    let guest = Guest::new();
    let (la, lb) = p2plab_efa::ChannelLink::pair();
    let options = EfaOptions { keep_alive: None };
    let a = Driver::new(&guest, attrs(1), Arc::new(la), options);
    let tracer = a.control();
    tracer.trace().configure(&path, "efa0");
    tracer.trace().enable().unwrap();
    let b = Driver::new(&guest, attrs(2), Arc::new(lb), options);
    let mut a = Side::new(a, SRD, gid(2));
    let mut b = Side::new(b, SRD, gid(1));
    let (rx_buf, rx_key) = b.buffer(4096, LOCAL_WRITE);
    b.driver.post_recv(&mut b.qp, 1, rx_buf, 100, rx_key);
    let b_qp = b.qp.num;
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(3, b_qp, a.ah, QKEY, b"traced"));
    a.driver.wait_cqe(&mut a.send_cq);
    assert_eq!(a.driver.admin(99, 0, &[]).status, 2);
    tracer.trace().disable();
    let text = std::fs::read_to_string(&path).unwrap();
    let events = p2plab_trace::parse_lines(&text).unwrap();
    let named = |kind: &str, name: &str| {
        events
            .iter()
            .find(|e| e["kind"] == kind && e["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the trace"))
            .clone()
    };
    let create = named("admin", "CREATE_QP");
    assert_eq!(create["qp_type"], "SRD");
    assert_eq!(create["status"], "SUCCESS");
    assert_eq!(create["send_queue_ring_size"], 128 * 64);
    assert!(create["dur_ns"].is_u64());
    assert_eq!(named("admin", "GET_FEATURE")["feature_id"], "DEVICE_ATTR");
    let modify = named("admin", "MODIFY_QP");
    assert_eq!(modify["qp_state"], "INIT");
    assert_eq!(named("admin", "UNKNOWN(99)")["status"], "BAD_OPCODE");
    let send = named("wqe", "SEND");
    assert_eq!(
        (send["req_id"].as_u64(), send["dest_qp_num"].as_u64()),
        (Some(3), Some(u64::from(b_qp)))
    );
    assert_eq!(send["data"]["inline_msg"], true);
    let cqe = named("cqe", "send OK");
    assert_eq!(
        (cqe["q_type"].as_str(), cqe["op_type"].as_str()),
        (Some("SEND_QUEUE"), Some("SEND"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}
