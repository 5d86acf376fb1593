//! The NVMe data-pointer walker: PRP1/PRP2 and PRP lists, SGL Data Block,
//! Bit Bucket, Segment and Last Segment chains, read from fuzzed guest
//! memory and a CMB, for any length, page size and direction; then the
//! data moved through the result both ways.
//!
//! Catches a panic or arithmetic overflow on a hostile pointer (libFuzzer
//! aborts; overflow checks are on), a walk that accepts a buffer whose
//! segments do not add up to the length asked for, a PRP entry after the
//! first that is not page aligned, a segment that wraps the address
//! space, and an unbounded walk (libFuzzer's -timeout, -rss_limit_mb).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_nvme::datapointer::{DataBuffer, DataPointers, Direction};
use p2plab_nvme::{Command, DmaRouter, Stats};

const RAM: u64 = 0x10_0000;
const RAM_SIZE: usize = 64 << 10;
const CMB: u64 = 0x8000_0000;
const CMB_SIZE: usize = 64 << 10;
/// The largest transfer tried (MDTS-sized).
const MAX_LEN: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // [64-byte command][len: 4][page shift, flags: 2][guest RAM image...]
    let Some((head, image)) = data.split_at_checked(70) else {
        return;
    };
    let mut raw = [0u8; 64];
    raw.copy_from_slice(&head[..64]);
    let cmd = Command::from_bytes(raw);
    let len = u64::from(u32::from_le_bytes([head[64], head[65], head[66], head[67]])) % MAX_LEN;
    let page_size = 4096u64 << (head[68] % 5);
    let flags = head[69];
    let dir = if flags & 1 == 0 {
        Direction::ToHost
    } else {
        Direction::FromHost
    };
    let accepted = if flags & 2 == 0 {
        DataPointers::PrpOrSgl
    } else {
        DataPointers::PrpOnly
    };

    let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
    // The image fills RAM from its start and the CMB after it: PRP lists
    // and SGL segments the command points at.
    let (ram_image, cmb_image) = image.split_at(image.len().min(RAM_SIZE));
    let _ = ram.write(RAM, ram_image);
    let cmb = Arc::new(HeapRegion::new(CMB_SIZE));
    let _ = cmb.write(0, &cmb_image[..cmb_image.len().min(CMB_SIZE)]);
    let router = DmaRouter::new(
        ram as Arc<dyn GuestMemory>,
        Some(cmb as Arc<dyn RegionMemory>),
        Arc::new(Stats::default()),
    );
    if flags & 4 != 0 {
        router.set_window(Some(CMB));
    }

    let Ok(buf) = DataBuffer::map(&router, &cmd, len, dir, page_size, accepted) else {
        return;
    };
    assert_eq!(buf.len(), len, "mapped length");
    let total: u64 = buf.segments().iter().map(|s| s.len).sum();
    assert_eq!(total, len, "segments add up to the length");
    for s in buf.segments() {
        assert!(s.addr.checked_add(s.len).is_some(), "segment wraps: {s:?}");
        assert!(s.len > 0, "empty segment kept");
    }
    if cmd.psdt() == 0 {
        for s in buf.segments().iter().skip(1) {
            assert_eq!(s.addr % page_size, 0, "PRP entry not page aligned: {s:?}");
        }
    }
    let mut bytes = vec![0u8; len as usize];
    match dir {
        Direction::ToHost => {
            let _ = buf.write_to_host(&router, &bytes);
        }
        Direction::FromHost => {
            let _ = buf.read_from_host(&router, &mut bytes);
        }
    }
});
