//! The NIC model's TX and RX rings as a hostile guest drives them over a
//! loopback wire: register writes (ring bases, sizes, control, doorbells,
//! interrupt bits) with any value, descriptors with any fields (buffers
//! optionally steered into guest RAM so frames really move), wire faults
//! armed, Bus Master Enable toggled, resets, in any order. Both engines
//! run on the target's thread (`Nic::with_engines_on_caller`): after each
//! step `Nic::run_engines` runs the engines' own descriptor, DMA, wire and
//! completion code (`tx_descriptor`, `RxEngine::step` in
//! devices/nic/src/model.rs, the same the engine threads loop over) until
//! neither has work, instead of two threads per input and a sleep per
//! step (about 40 inputs/s). The wire's send timeout is zero: a send into
//! a full loopback queue fails at once (LinkDown), as it does after 10 s
//! on the threaded NIC. What only threads show (a reset racing an engine
//! mid-descriptor) is left to the NIC's unit tests (tests/reset_quiesce.rs,
//! tests/wire_wedge.rs) and the rdma e2e suite.
//!
//! Catches a panic or overflow anywhere in the model, the descriptor
//! parser or the wire (overflow checks are on), an engine that never
//! lets go (`run_engines` not returning: libFuzzer's -timeout), and a
//! device that counts more frames received than were sent on its wire.
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::GuestMemory;
use p2plab_kit::Interrupts;
use p2plab_nic::descriptor::encode;
use p2plab_nic::regs::*;
use p2plab_nic::{Nic, Wire, WireOptions};

const RAM: u64 = 0x1_0000_0000;
const RAM_SIZE: u64 = 256 << 10;
const TX_RING: u64 = RAM;
const RX_RING: u64 = RAM + 0x1000;
const BUFFERS: u64 = RAM + 0x2000;
const MAX_STEERED_LEN: u64 = 16 << 10;

struct NoIrq;

impl Interrupts for NoIrq {
    fn notify(&self, _vector: u16) {}
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn u32(&mut self) -> Option<u32> {
        let mut v = [0u8; 4];
        for b in &mut v {
            *b = self.u8()?;
        }
        Some(u32::from_le_bytes(v))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from(self.u32()?) | u64::from(self.u32()?) << 32)
    }
}

const REGS: &[u64] = &[
    reg::CTRL,
    reg::SCRATCH,
    reg::TX_RING_BASE,
    reg::TX_RING_SIZE,
    reg::TX_DOORBELL,
    reg::RX_RING_BASE,
    reg::RX_RING_SIZE,
    reg::RX_DOORBELL,
    reg::INT_STATUS,
    reg::INT_MASK,
    reg::ID,
    0xffc,
];

fuzz_target!(|data: &[u8]| {
    let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE as usize));
    let wire = Wire::loopback_with(WireOptions {
        send_timeout: Duration::ZERO,
        ..WireOptions::default()
    });
    let nic = Nic::with_engines_on_caller(wire, MIN_MTU * 16, ram.clone(), Arc::new(NoIrq));
    nic.set_bus_master(true);
    let mut input = Bytes(data);
    let mut steps = 0;
    while let Some(op) = input.u8() {
        steps += 1;
        if steps > 64 {
            break;
        }
        match op % 8 {
            // A register write with any value.
            0 | 1 => {
                let Some(reg) = input.u8() else { break };
                let Some(value) = input.u64() else { break };
                let offset = REGS[usize::from(reg) % REGS.len()];
                if reg & 0x80 != 0 {
                    nic.regs_write(offset, &value.to_le_bytes());
                } else {
                    nic.regs_write(offset, &(value as u32).to_le_bytes());
                }
            }
            // Sane rings, both engines on.
            2 => {
                nic.regs_write(reg::TX_RING_BASE, &TX_RING.to_le_bytes());
                nic.regs_write(reg::TX_RING_SIZE, &16u32.to_le_bytes());
                nic.regs_write(reg::RX_RING_BASE, &RX_RING.to_le_bytes());
                nic.regs_write(reg::RX_RING_SIZE, &16u32.to_le_bytes());
                nic.regs_write(reg::INT_MASK, &0u32.to_le_bytes());
                nic.regs_write(
                    reg::CTRL,
                    &(Ctrl::TX_ENABLE.raw() | Ctrl::RX_ENABLE.raw()).to_le_bytes(),
                );
            }
            // A descriptor with any fields, or one steered into RAM.
            3 => {
                let Some(slot) = input.u8() else { break };
                let Some(addr) = input.u64() else { break };
                let Some(len) = input.u32() else { break };
                let Some(flags) = input.u8() else { break };
                let ring = if slot & 0x80 != 0 { RX_RING } else { TX_RING };
                let (addr, len) = if slot & 0x40 != 0 {
                    (
                        BUFFERS + addr % (RAM_SIZE - 0x2000 - MAX_STEERED_LEN),
                        len % MAX_STEERED_LEN as u32,
                    )
                } else {
                    (addr, len)
                };
                let at = ring + u64::from(slot % 16) * DESC_SIZE;
                let _ = ram.write(at, &encode(addr, len, u16::from(flags), 0));
            }
            // Scribble guest RAM (rings included).
            4 => {
                let Some(at) = input.u32() else { break };
                let Some(byte) = input.u8() else { break };
                let _ = ram.write(RAM + u64::from(at) % RAM_SIZE, &[byte]);
            }
            5 => nic.set_bus_master(op & 0x10 != 0),
            6 => {
                // No DMA can stay in flight against FakeGuestMemory.
                let _ = nic.reset();
            }
            _ => {
                let spec = [
                    "drop,count=1",
                    "corrupt,count=1",
                    "delay=1ms,count=1",
                    "drop-irq",
                ][usize::from(op >> 4) % 4];
                if let Ok(spec) = spec.parse() {
                    // Past the cap the spec is refused; the rings go on.
                    let _ = nic.control().inject(spec);
                }
            }
        }
        nic.run_engines();
    }
    let stats = nic.control().stats();
    assert!(
        stats.rx_packets + stats.rx_discarded <= stats.tx_packets,
        "received more than was sent: {stats:?}"
    );
    drop(nic);
});
