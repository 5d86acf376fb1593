//! Each opcode doing its job.
//!
//! Catches: wrong bytes moved, memmove overlap bugs, fill pattern phase
//! errors, a zero fill that keeps pages, a wrong CRC, wrong byte counters.

use crate::rig::*;

#[test]
fn copy_host_to_vram_and_back() {
    let mut rig = Rig::ready();
    let data = pattern(3 * (1 << 20) + 123, 7);
    rig.poke(DATA_GPA, &data);
    let vram_off = 5 * 4096 + 17;
    let r = rig.run(cmd(op::COPY_TO_VRAM, DATA_GPA, vram_off, data.len() as u64));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert_eq!(vram_bytes(&rig, vram_off, data.len()), data);

    let back_gpa = DATA_GPA + (5 << 20);
    let r = rig.run(cmd(
        op::COPY_FROM_VRAM,
        vram_off,
        back_gpa,
        data.len() as u64,
    ));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert_eq!(rig.peek(back_gpa, data.len()), data);

    let stats = rig.gpu.stats();
    assert_eq!(stats.bytes_host_to_vram, data.len() as u64);
    assert_eq!(stats.bytes_vram_to_host, data.len() as u64);
    assert_eq!(stats.jobs_completed, 2);
    assert_eq!(stats.jobs_failed, 0);
    assert_eq!(rig.read32(Reg::JobsCompleted), 2);
}

/// Catches: engine copies between VRAM and a peer's BAR counted as a
/// bounce through guest RAM (`p2plab-ctl provenance` would fail real P2P),
/// or copies with guest RAM not counted as one (it would pass a bounce).
#[test]
fn ram_copies_are_told_apart_from_peer_bar_copies() {
    const PEER_BAR: u64 = 0x40_0000_0000;
    let memory = FakeGuestMemory::new()
        .with_region(RAM_BASE, RAM_SIZE)
        .with_peer_region(PEER_BAR, 1 << 20);
    let mut rig = Rig::with_memory(256 << 20, memory);
    rig.enable_ring(RING_GPA, 16, RingIn::GuestMemory);
    let data = pattern(300_000, 3);
    rig.poke(DATA_GPA, &data);
    rig.poke(PEER_BAR, &data);
    for c in [
        cmd(op::COPY_TO_VRAM, DATA_GPA, 0, 100_000),
        cmd(op::COPY_TO_VRAM, PEER_BAR, 0, 200_000),
        cmd(op::COPY_FROM_VRAM, 0, PEER_BAR + 4096, 30_000),
        cmd(op::COPY_FROM_VRAM, 0, DATA_GPA + (1 << 20), 7_000),
    ] {
        assert_eq!(rig.run(c).status, StatusCode::Ok.code());
    }
    let s = rig.gpu.stats();
    assert_eq!(s.bytes_host_to_vram, 300_000);
    assert_eq!(s.bytes_ram_to_vram, 100_000);
    assert_eq!(s.bytes_vram_to_host, 37_000);
    assert_eq!(s.bytes_vram_to_ram, 7_000);
}

#[test]
fn copy_inside_vram_including_overlaps() {
    let mut rig = Rig::ready();
    let len = (2 << 20) + 999;
    let data = pattern(len, 11);
    rig.gpu.vram().write(0, &data).unwrap();

    // Disjoint.
    let r = rig.run(cmd(op::COPY_VRAM, 0, 64 << 20, len as u64));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert_eq!(vram_bytes(&rig, 64 << 20, len), data);

    // Overlapping, destination above the source (needs back-to-front).
    let r = rig.run(cmd(op::COPY_VRAM, 64 << 20, (64 << 20) + 4097, len as u64));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert_eq!(vram_bytes(&rig, (64 << 20) + 4097, len), data);

    // Overlapping, destination below the source.
    let r = rig.run(cmd(
        op::COPY_VRAM,
        (64 << 20) + 4097,
        (64 << 20) + 1,
        len as u64,
    ));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert_eq!(vram_bytes(&rig, (64 << 20) + 1, len), data);
    assert_eq!(rig.gpu.stats().bytes_vram_to_vram, 3 * len as u64);
}

#[test]
fn fill_repeats_the_pattern_from_dst() {
    let mut rig = Rig::ready();
    let (dst, len) = (4096 * 3 + 1, (1 << 20) + 4099);
    rig.gpu.vram().write(dst - 1, &[0xaa]).unwrap();
    rig.gpu.vram().write(dst + len, &[0xbb]).unwrap();
    let r = rig.run(fill_cmd(dst, len, 0x4433_2211));
    assert_eq!(r.status, StatusCode::Ok.code());
    let got = vram_bytes(&rig, dst - 1, len as usize + 2);
    assert_eq!(got[0], 0xaa, "byte before the range untouched");
    assert_eq!(
        got[len as usize + 1],
        0xbb,
        "byte after the range untouched"
    );
    for (i, b) in got[1..=len as usize].iter().enumerate() {
        assert_eq!(*b, [0x11, 0x22, 0x33, 0x44][i % 4], "byte {i}");
    }
    assert_eq!(rig.gpu.stats().bytes_filled, len);
}

#[test]
fn zero_fill_zeroes_and_frees_pages() {
    let mut rig = Rig::ready();
    let r = rig.run(fill_cmd(0, 8 << 20, 0xffff_ffff));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert!(rig.gpu.vram().allocated_bytes().unwrap() >= 8 << 20);
    let r = rig.run(fill_cmd(100, (8 << 20) - 200, 0));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert!(rig.gpu.vram().allocated_bytes().unwrap() <= 2 * 4096);
    let got = vram_bytes(&rig, 0, 8 << 20);
    assert!(got[..100].iter().all(|&b| b == 0xff));
    assert!(got[100..(8 << 20) - 100].iter().all(|&b| b == 0));
    assert!(got[(8 << 20) - 100..].iter().all(|&b| b == 0xff));
}

/// Bit-at-a-time CRC-32C (Castagnoli, reflected, inverted in and out),
/// as the guest tool computes it: independent of the crate the device
/// uses.
fn crc32c_reference(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Catches: a checksum engine (or CRC library) that is not the CRC-32C
/// the guest tool and its file verification expect, or that splits a
/// multi-step range wrongly.
#[test]
fn checksum_matches_known_vectors() {
    let mut rig = Rig::ready();
    rig.gpu.vram().write(12345, b"123456789").unwrap();
    let r = rig.run(cmd(op::CHECKSUM, 12345, 0, 9));
    assert_eq!(r.status, StatusCode::Ok.code());
    assert_eq!(r.result, 0xe306_9283);
    assert_eq!(rig.read32(Reg::Checksum), 0xe306_9283);

    // 32 bytes of zeros (RFC 3720 B.4) straight from an untouched hole.
    let r = rig.run(cmd(op::CHECKSUM, 100 << 20, 0, 32));
    assert_eq!(r.result, 0x8a91_36aa);

    // A multi-chunk range with data written by a copy.
    let data = pattern((5 << 20) / 2 + 3, 5);
    rig.poke(DATA_GPA, &data);
    rig.run(cmd(op::COPY_TO_VRAM, DATA_GPA, 1 << 20, data.len() as u64));
    let r = rig.run(cmd(op::CHECKSUM, 1 << 20, 0, data.len() as u64));
    assert_eq!(r.result, crc32c_reference(&data));
    assert_eq!(
        rig.gpu.stats().bytes_checksummed,
        9 + 32 + data.len() as u64
    );

    // Empty range: CRC of nothing is 0.
    let r = rig.run(cmd(op::CHECKSUM, 0, 0, 0));
    assert_eq!((r.status, r.result), (StatusCode::Ok.code(), 0));
}

/// Catches: a fill that reuses the pattern bytes of an earlier fill (the
/// engine keeps them between fills), or that writes a short fill's
/// pattern where a longer one follows.
#[test]
fn fills_with_other_patterns_and_lengths_write_their_own() {
    let mut rig = Rig::ready();
    for (dst, len, pattern) in [
        (0u64, 8u64, 0x0403_0201u32),
        (4096, 3 << 20, 0x0403_0201),
        (4096, 5, 0xddcc_bbaa),
        (9000, (1 << 20) + 7, 0x4433_2211),
        (100, 4096, 0x4433_2211),
    ] {
        let r = rig.run(fill_cmd(dst, len, pattern));
        assert_eq!(r.status, StatusCode::Ok.code());
        let want = pattern.to_le_bytes();
        let got = vram_bytes(&rig, dst, len as usize);
        for (i, b) in got.iter().enumerate() {
            assert_eq!(
                *b,
                want[i % 4],
                "fill {pattern:#x} of {len} at {dst}: byte {i}"
            );
        }
    }
}
