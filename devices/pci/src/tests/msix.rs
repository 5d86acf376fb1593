use crate::{ClientMask, FireOutcome, MsixAccessError, MsixControl, MsixState, VectorBinding};

fn read32(state: &MsixState, offset: u64) -> u32 {
    let mut buf = [0u8; 4];
    state.table_read(offset, &mut buf).expect("table read");
    u32::from_le_bytes(buf)
}

fn pba64(state: &MsixState, offset: u64) -> u64 {
    let mut buf = [0u8; 8];
    state.pba_read(offset, &mut buf).expect("pba read");
    u64::from_le_bytes(buf)
}

/// Enabled, unmasked, every vector routed: what QEMU sets up.
fn live(vectors: u16) -> MsixState {
    let mut state = MsixState::new(vectors);
    for v in 0..vectors {
        assert!(state.set_binding(v, VectorBinding::Bound).is_empty());
    }
    assert!(state.set_control(MsixControl::ENABLED).is_empty());
    state
}

#[test]
fn reset_state_masks_every_entry() {
    let state = MsixState::new(3);
    assert_eq!(state.table_len(), 48);
    assert_eq!(state.pba_len(), 8);
    for v in 0..3 {
        assert_eq!(
            read32(&state, u64::from(v) * 16 + 12),
            1,
            "vector {v} masked"
        );
        assert_eq!(read32(&state, u64::from(v) * 16), 0);
        assert!(state.entry(v).is_some_and(|e| e.masked));
    }
    assert!(!state.enabled());
    assert_eq!(state.entry(3), None);
    assert_eq!(MsixState::new(0).vectors(), 1, "clamped");
    assert_eq!(MsixState::new(5000).vectors(), 2048, "clamped");
    assert_eq!(MsixState::new(65).pba_len(), 16);
}

#[test]
fn table_entries_round_trip_with_read_only_bits() {
    let mut state = MsixState::new(4);
    let entry = 2 * 16;
    state
        .table_write(entry, &0xfee0_1003u32.to_le_bytes())
        .expect("write");
    state
        .table_write(entry + 4, &0x1u32.to_le_bytes())
        .expect("write");
    state
        .table_write(entry + 8, &0x0000_4041u32.to_le_bytes())
        .expect("write");
    state
        .table_write(entry + 12, &0xffff_fffeu32.to_le_bytes())
        .expect("write");
    let e = state.entry(2).expect("entry");
    assert_eq!(
        e.address, 0x1_fee0_1000,
        "address bits 1:0 are read-only zero"
    );
    assert_eq!(e.data, 0x4041);
    assert!(!e.masked);
    assert_eq!(
        read32(&state, entry + 12),
        0,
        "reserved control bits read zero"
    );

    // 8-byte accesses.
    state
        .table_write(16, &0x0000_0002_fee0_0000u64.to_le_bytes())
        .expect("qword write");
    let mut q = [0u8; 8];
    state.table_read(16, &mut q).expect("qword read");
    assert_eq!(u64::from_le_bytes(q), 0x0000_0002_fee0_0000);
    state
        .table_write(24, &0x0000_0001_0000_beefu64.to_le_bytes())
        .expect("data + control");
    assert_eq!(
        state.entry(1).map(|e| (e.data, e.masked)),
        Some((0xbeef, true))
    );
    // Neighbours untouched.
    assert!(state.entry(0).is_some_and(|e| e.masked && e.address == 0));
    assert!(state.entry(3).is_some_and(|e| e.masked && e.address == 0));
}

#[test]
fn malformed_table_and_pba_accesses_are_errors() {
    let mut state = MsixState::new(2);
    let mut buf = [0u8; 16];
    for len in [0usize, 1, 2, 3, 5, 16] {
        assert!(
            matches!(
                state.table_read(0, &mut buf[..len]),
                Err(MsixAccessError::BadSize { .. })
            ),
            "len {len}"
        );
        assert!(state.table_write(0, &buf[..len]).is_err(), "len {len}");
    }
    assert!(matches!(
        state.table_read(2, &mut buf[..4]),
        Err(MsixAccessError::BadSize { .. })
    ));
    assert!(state.table_read(4, &mut buf[..8]).is_err(), "8-byte at 4");
    assert!(matches!(
        state.table_read(32, &mut buf[..4]),
        Err(MsixAccessError::OutOfRange { .. })
    ));
    assert!(state.table_write(28, &buf[..8]).is_err());
    assert!(state.table_read(u64::MAX - 3, &mut buf[..4]).is_err());
    assert!(state.pba_read(8, &mut buf[..4]).is_err());
    assert!(state.pba_read(1, &mut buf[..2]).is_err());
    assert!(state.pba_read(u64::MAX - 7, &mut buf[..8]).is_err());
    assert!(state.pba_write(0, &buf[..3]).is_err());
}

#[test]
fn fire_while_client_masked_sets_pending_then_unmask_delivers() {
    let mut state = live(4);
    assert_eq!(state.fire(1), FireOutcome::Deliver);
    assert!(state.set_client_mask(1, ClientMask::Masked).is_empty());
    assert_eq!(state.fire(1), FireOutcome::Pending);
    assert_eq!(state.fire(1), FireOutcome::Pending, "coalesces");
    assert!(state.is_pending(1));
    assert_eq!(pba64(&state, 0), 0b10);
    assert_eq!(
        state.fire(2),
        FireOutcome::Deliver,
        "other vectors unaffected"
    );

    assert_eq!(state.set_client_mask(1, ClientMask::Unmasked), vec![1]);
    assert!(!state.is_pending(1));
    assert_eq!(pba64(&state, 0), 0);
    assert!(
        state.set_client_mask(1, ClientMask::Unmasked).is_empty(),
        "delivered once"
    );
}

#[test]
fn function_mask_holds_every_vector() {
    let mut state = live(3);
    assert!(state.set_control(MsixControl::ENABLED_MASKED).is_empty());
    assert_eq!(state.fire(0), FireOutcome::Pending);
    assert_eq!(state.fire(2), FireOutcome::Pending);
    assert_eq!(pba64(&state, 0), 0b101);
    assert_eq!(state.set_control(MsixControl::ENABLED), vec![0, 2]);
    assert_eq!(pba64(&state, 0), 0);
}

#[test]
fn unbound_vector_waits_for_its_eventfd() {
    let mut state = MsixState::new(2);
    state.set_control(MsixControl::ENABLED);
    assert_eq!(state.fire(0), FireOutcome::Pending);
    assert_eq!(state.set_binding(0, VectorBinding::Bound), vec![0]);
    assert_eq!(state.fire(0), FireOutcome::Deliver);
    // Unbinding also forgets a client mask.
    state.set_client_mask(0, ClientMask::Masked);
    state.set_binding(0, VectorBinding::Unbound);
    assert!(state.set_binding(0, VectorBinding::Bound).is_empty());
    assert_eq!(state.fire(0), FireOutcome::Deliver);
}

#[test]
fn disabled_msix_neither_delivers_nor_latches() {
    let mut state = MsixState::new(2);
    state.set_binding(0, VectorBinding::Bound);
    assert_eq!(state.fire(0), FireOutcome::NotEnabled);
    assert!(!state.is_pending(0));
    state.set_control(MsixControl::ENABLED_MASKED);
    assert_eq!(state.fire(0), FireOutcome::Pending);
    // Turning MSI-X off drops what was pending.
    assert!(state.set_control(MsixControl::DISABLED).is_empty());
    assert!(!state.is_pending(0));
    assert!(state.set_control(MsixControl::ENABLED).is_empty());
    assert_eq!(state.fire(9), FireOutcome::NotEnabled, "no such vector");
}

#[test]
fn table_mask_counts_only_when_asked() {
    let mut state = live(2);
    // Default: QEMU emulates the table, our copy's mask bit (set at reset)
    // does not block delivery.
    assert_eq!(state.fire(0), FireOutcome::Deliver);
    assert!(state.set_table_masks_delivery(true).is_empty());
    assert_eq!(state.fire(0), FireOutcome::Pending);
    // Unmasking through the table delivers the pending vector.
    let ready = state
        .table_write(12, &0u32.to_le_bytes())
        .expect("unmask write");
    assert_eq!(ready, vec![0]);
    assert_eq!(state.fire(0), FireOutcome::Deliver);
}

#[test]
fn pba_reads_of_any_natural_size_and_ignored_writes() {
    let mut state = live(72);
    state.set_control(MsixControl::ENABLED_MASKED);
    state.fire(0);
    state.fire(9);
    state.fire(70);
    assert_eq!(pba64(&state, 0), (1 << 0) | (1 << 9));
    assert_eq!(pba64(&state, 8), 1 << 6);
    let mut b = [0u8; 1];
    state.pba_read(1, &mut b).expect("byte read");
    assert_eq!(b[0], 0b10);
    let mut h = [0u8; 2];
    state.pba_read(8, &mut h).expect("word read");
    assert_eq!(u16::from_le_bytes(h), 1 << 6);
    state.pba_write(0, &[0u8; 8]).expect("ignored");
    assert_eq!(pba64(&state, 0), (1 << 0) | (1 << 9), "PBA is read-only");
}

#[test]
fn reset_forgets_routing_and_pending() {
    let mut state = live(2);
    state.set_control(MsixControl::ENABLED_MASKED);
    state.fire(1);
    state.reset();
    assert!(!state.enabled() && !state.is_pending(1));
    state.set_control(MsixControl::ENABLED);
    assert_eq!(
        state.fire(1),
        FireOutcome::Pending,
        "no eventfd bound after reset"
    );
}
