//! Random input, and VRAM staying sparse.
//!
//! Catches: a panic or halt on random ring entries or register writes, a
//! device left unusable after them, VRAM allocating untouched pages.

use crate::rig::*;

#[test]
fn random_ring_entries_never_break_the_engine() {
    let mut rig = Rig::ready();
    let size = 256u64 << 20;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..400u64 {
        let mut raw = [0u8; 64];
        for chunk in raw.chunks_exact_mut(8) {
            chunk.copy_from_slice(&next().to_le_bytes());
        }
        let mut c = Command::decode(&raw);
        // Keep a sensible share of entries close to valid, so the range
        // checks, not only the opcode check, get exercised.
        if i % 2 == 0 {
            c.opcode %= 8;
            c.reserved0 = 0;
            c.reserved1 = [0, 0];
            c.flags = c.flags & CommandFlags::IRQ;
            if c.opcode != op::FILL {
                c.pattern = 0;
            }
            c.len %= 1 << (next() % 22);
            c.src = if next() % 2 == 0 {
                c.src % size
            } else {
                DATA_GPA + c.src % (8 << 20)
            };
            c.dst = if next() % 2 == 0 {
                c.dst % size
            } else {
                DATA_GPA + c.dst % (8 << 20)
            };
        }
        c.flags = c.flags.without(CommandFlags::COMPLETION);
        c.fence = 1_000_000 + i;
        rig.submit(c);
        rig.wait_fence(c.fence);
    }
    let s = rig.gpu.stats();
    assert_eq!(s.jobs_completed + s.jobs_failed, 400);
    assert!(s.jobs_completed > 50 && s.jobs_failed > 200, "{s:?}");
    assert!(
        s.bytes_host_to_vram > 0 && s.bytes_vram_to_host > 0 && s.bytes_filled > 0,
        "{s:?}"
    );
    assert!(!rig.status().contains(Status::HALTED));
}

#[test]
fn random_register_writes_never_break_the_device() {
    let rig = Rig::ready();
    let mut x: u64 = 12345;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let offset = next() % (REGS_BAR_SIZE + 64);
        let len = [1usize, 2, 4, 8][(next() % 4) as usize];
        let value = next().to_le_bytes();
        rig.gpu.regs_write(offset & !3, &value[..len]);
        let mut back = [0u8; 8];
        rig.gpu
            .regs_read(next() % (REGS_BAR_SIZE + 64), &mut back[..len]);
    }
    assert_eq!(rig.read32(Reg::Id), ID_MAGIC);
    // After a reset the device is fully usable again.
    rig.gpu.reset().unwrap();
    let mut rig = rig;
    rig.wait_idle();
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
    rig.write32(Reg::IntMask, 0);
    assert_eq!(
        rig.run(fill_cmd(0, 16, 0x0707_0707)).status,
        StatusCode::Ok.code()
    );
}

#[test]
fn large_vram_stays_sparse() {
    let mut rig = Rig::new(4 << 30);
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
    for i in 0..4u64 {
        rig.run(fill_cmd(i << 30, 4096, 0xabcd_ef01));
    }
    let r = rig.run(cmd(op::CHECKSUM, (1 << 30) + 4096, 0, 16 << 20));
    assert_eq!(r.status, StatusCode::Ok.code());
    // As stats.json and `p2plab-ctl status` report it.
    let s = p2plab_kit::DeviceControl::counters(&rig.gpu.control());
    assert_eq!(s["vram_size"], 4u64 << 30);
    let allocated = s["vram_allocated_bytes"].as_u64().unwrap();
    assert!(
        (4 * 4096..=16 * 4096).contains(&allocated),
        "{allocated} bytes allocated"
    );
}
