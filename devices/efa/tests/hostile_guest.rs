//! A hostile driver and user space: seeded random register writes,
//! readless requests, admin commands of random bytes, WQEs and receive
//! descriptors of random bytes, doorbells anywhere, thrown at two EFAs on
//! one link. Whatever arrives, the device must not panic, hang or stop
//! serving: after each storm the driver's reset and probe, and a SEND
//! from one device to the other, must still work.

use crate::common;

use std::sync::Arc;

use common::*;
use p2plab_efa::regs::reg;
use p2plab_efa::{ChannelLink, EfaOptions};

/// xorshift64*: deterministic, so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for chunk in out.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        out
    }
}

/// A pair probed and set up, then storms, then a check it still works.
fn storm(seed: u64) {
    let mut rng = Rng(seed | 1);
    let mut pair = Pair::new(SRD);
    for _ in 0..300 {
        let side = if rng.below(2) == 0 {
            &mut pair.a
        } else {
            &mut pair.b
        };
        match rng.below(7) {
            0 => {
                // Any register but DEV_CTL and the admin queue's own (they
                // would end the storm's admin commands, not test them).
                let offsets = [
                    reg::INTR_MASK,
                    reg::AENQ_CONS_DB,
                    reg::EQ_DB,
                    reg::MMIO_REG_READ,
                    0x70,
                    0xffc,
                ];
                let offset = offsets[rng.below(offsets.len() as u64) as usize];
                side.driver.write_reg(offset, rng.next() as u32);
            }
            1 => {
                let mut bytes = [0u8; 4];
                side.driver.efa.regs_read(rng.below(4096), &mut bytes);
            }
            2 => {
                // An admin command of random bytes: answered, whatever it is.
                let opcode = rng.below(32) as u8;
                let flags = rng.below(8) as u8 & !1;
                let payload: [u8; 60] = rng.bytes();
                side.driver.admin(opcode, flags, &payload);
            }
            3 => {
                let wqe: [u8; 64] = rng.bytes();
                let mut wqe = wqe;
                wqe[3] &= !1;
                side.driver.post_send(&mut side.qp, wqe);
            }
            4 => {
                let desc: [u8; 16] = rng.bytes();
                let slot = u32::from(side.qp.rq_pc) % side.qp.rq_descs;
                side.driver
                    .guest
                    .write(side.qp.rq_ring + u64::from(slot) * 16, &desc);
                side.qp.rq_pc = side.qp.rq_pc.wrapping_add(1);
                side.driver
                    .efa
                    .db_write(side.qp.rq_db, &u32::from(side.qp.rq_pc).to_le_bytes());
            }
            5 => {
                let offset = rng.below(256 << 10) & !3;
                side.driver
                    .efa
                    .db_write(offset, &(rng.next() as u32).to_le_bytes());
            }
            _ => {
                let addr = RAM + rng.below(RAM_SIZE as u64 - 64);
                let junk: [u8; 64] = rng.bytes();
                // Not the admin rings: a driver that scribbles over them
                // gets what it asked for; the device must just survive.
                if addr > RAM + (16 << 20) {
                    side.driver.guest.write(addr, &junk);
                }
            }
        }
    }
    // The driver gives up on the storm: reset, probe, set up, send.
    let guest = Arc::clone(&pair.guest);
    let (la, lb) = ChannelLink::pair();
    drop(pair);
    let options = EfaOptions { keep_alive: None };
    let mut a = Side::new(
        Driver::new(&guest, attrs(1), Arc::new(la), options),
        SRD,
        gid(2),
    );
    let mut b = Side::new(
        Driver::new(&guest, attrs(2), Arc::new(lb), options),
        SRD,
        gid(1),
    );
    let (rx, key) = b.buffer(4096, LOCAL_WRITE);
    b.driver.post_recv(&mut b.qp, 1, rx, 4096, key);
    let b_qp = b.qp.num;
    a.driver.post_send(
        &mut a.qp,
        wqe::send_inline(9, b_qp, a.ah, QKEY, b"still alive"),
    );
    assert_eq!(a.driver.wait_cqe(&mut a.send_cq).status, 0, "seed {seed}");
    assert_eq!(b.driver.wait_cqe(&mut b.recv_cq).length, 11, "seed {seed}");
    assert_eq!(guest.read(rx, 11), b"still alive");
}

/// Catches: a panic, hang or wedged queue from random register writes,
/// admin commands, WQEs, receive descriptors, doorbells and scribbles.
#[test]
fn random_storms_never_stop_the_device() {
    for seed in [1u64, 0xdead_beef, 0x5eed_2024, 42] {
        storm(seed);
    }
}

/// Catches: a device that stops serving after the driver resets it in the
/// middle of a storm (commands half processed, messages in flight).
#[test]
fn a_reset_in_the_middle_of_traffic_leaves_a_working_device() {
    let mut pair = Pair::new(SRD);
    let (rx, key) = pair.b.buffer(64 << 10, LOCAL_WRITE);
    for i in 0..8u16 {
        let b = &mut pair.b;
        b.driver
            .post_recv(&mut b.qp, i, rx + u64::from(i) * 1024, 1024, key);
    }
    let b_qp = pair.b.qp.num;
    for i in 0..32u16 {
        let a = &mut pair.a;
        a.driver.post_send(
            &mut a.qp,
            wqe::send_inline(i, b_qp, a.ah, QKEY, b"in flight"),
        );
    }
    // Reset both mid-flight and probe again, as the driver's remove and
    // probe paths do, on the same devices and link.
    let Pair { guest, a, b } = pair;
    let mut a = Side::new(a.driver, SRD, gid(2));
    let mut b = Side::new(b.driver, SRD, gid(1));
    let (rx, key) = b.buffer(4096, LOCAL_WRITE);
    b.driver.post_recv(&mut b.qp, 1, rx, 4096, key);
    let b_qp = b.qp.num;
    a.driver
        .post_send(&mut a.qp, wqe::send_inline(3, b_qp, a.ah, QKEY, b"after"));
    assert_eq!(a.driver.wait_cqe(&mut a.send_cq).status, 0);
    assert_eq!(guest.read(rx, 5), b"after");
}
