//! Admin commands through the admin queue, with exact statuses.

use std::time::Duration;

use super::harness::*;
use crate::command::CommandBuilder;
use crate::registers::reg;
use crate::spec::{admin, feature, io, log, Status, NSID_ALL};

fn identify(cns: u32, nsid: u32) -> crate::Command {
    CommandBuilder::new(admin::IDENTIFY, 0)
        .nsid(nsid)
        .prp1(DATA)
        .cdw(10, cns)
        .build()
}

fn u32_at(d: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(d[at..at + 4].try_into().unwrap())
}

fn u64_at(d: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(d[at..at + 8].try_into().unwrap())
}

fn two_namespace_host() -> Host {
    Host::with(
        test_config(),
        vec![
            memory_namespace(1, 1 << 20, 512),
            memory_namespace(2, 2 << 20, 4096),
        ],
    )
}

#[test]
fn identify_controller_namespaces_and_descriptors() {
    let mut h = two_namespace_host();
    h.enable();
    assert_eq!(h.admin_status(identify(1, 0)), Status::SUCCESS);
    let c = h.peek(DATA, 4096);
    assert_eq!(&c[4..14], b"TESTSERIAL");
    assert_eq!(u32_at(&c, 516), 2, "NN");
    assert_eq!(c[77], 7, "MDTS");
    assert_eq!((c[512], c[513]), (0x66, 0x44));
    assert_eq!(u32_at(&c, 536) & 0x3, 1, "SGLs");
    assert_ne!(u32_at(&c, 536) & (1 << 16), 0, "bit buckets");
    assert_ne!(
        u16::from_le_bytes([c[256], c[257]]) & (1 << 8),
        0,
        "OACS DBBUF"
    );

    assert_eq!(h.admin_status(identify(0, 2)), Status::SUCCESS);
    let ns = h.peek(DATA, 4096);
    assert_eq!(u64_at(&ns, 0), 512, "NSZE in 4096-byte blocks");
    assert_eq!(ns[26] & 0xf, 1, "FLBAS");
    let nguid2 = ns[104..120].to_vec();
    assert_eq!(h.admin_status(identify(0, 1)), Status::SUCCESS);
    let ns1 = h.peek(DATA, 4096);
    assert_eq!(u64_at(&ns1, 0), 2048);
    assert_ne!(ns1[104..120], nguid2[..], "NGUIDs differ");

    for bad in [0, 3, NSID_ALL] {
        assert_eq!(
            h.admin_status(identify(0, bad)),
            Status::INVALID_NAMESPACE,
            "nsid {bad:#x}"
        );
        assert_eq!(h.admin_status(identify(3, bad)), Status::INVALID_NAMESPACE);
    }
    assert_eq!(h.admin_status(identify(2, 0)), Status::SUCCESS);
    let list = h.peek(DATA, 12);
    assert_eq!(
        (u32_at(&list, 0), u32_at(&list, 4), u32_at(&list, 8)),
        (1, 2, 0)
    );
    assert_eq!(
        h.admin_status(identify(2, 0xffff_fffe)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(h.admin_status(identify(3, 1)), Status::SUCCESS);
    let d = h.peek(DATA, 64);
    assert_eq!((d[0], d[1]), (1, 8), "EUI64 descriptor");
    assert_eq!(
        &d[4..12],
        &ns1[120..128],
        "same EUI64 as Identify Namespace"
    );
    assert_eq!(h.admin_status(identify(6, 0)), Status::SUCCESS);
    assert_eq!(
        h.admin_status(identify(6 | (1 << 24), 0)),
        Status::SUCCESS,
        "CNTID bits are not CSI"
    );
    let zoned_csi = CommandBuilder::new(admin::IDENTIFY, 0)
        .prp1(DATA)
        .cdw(10, 6)
        .cdw(11, 2 << 24)
        .build();
    assert_eq!(h.admin_status(zoned_csi), Status::INVALID_FIELD);
    assert_eq!(h.admin_status(identify(0x1f, 0)), Status::INVALID_FIELD);
}

#[test]
fn admin_command_form_errors() {
    let mut h = Host::new();
    h.enable();
    let unknown = CommandBuilder::new(0x7f, 0).build();
    assert_eq!(h.admin_status(unknown), Status::INVALID_OPCODE);
    let firmware_commit = CommandBuilder::new(0x10, 0).build();
    assert_eq!(h.admin_status(firmware_commit), Status::INVALID_OPCODE);
    let sgl = CommandBuilder::new(admin::IDENTIFY, 0)
        .cdw(10, 1)
        .psdt(1)
        .build();
    assert_eq!(h.admin_status(sgl), Status::INVALID_FIELD, "admin SGL");
    let fused = CommandBuilder::new(admin::IDENTIFY, 0)
        .cdw(10, 1)
        .fuse(1)
        .build();
    assert_eq!(h.admin_status(fused), Status::INVALID_FIELD);
    let unmapped = CommandBuilder::new(admin::IDENTIFY, 0)
        .prp1(0x4000_0000)
        .cdw(10, 1)
        .build();
    assert_eq!(h.admin_status(unmapped), Status::DATA_TRANSFER_ERROR);
    let bad_offset = CommandBuilder::new(admin::IDENTIFY, 0)
        .prp1(DATA + 0x800)
        .prp2(DATA + 0x2004)
        .cdw(10, 1)
        .build();
    assert_eq!(h.admin_status(bad_offset), Status::PRP_OFFSET_INVALID);
    // Still serving.
    assert_eq!(h.admin_status(identify(1, 0)), Status::SUCCESS);
}

#[test]
fn queue_creation_is_validated() {
    let mut h = Host::new();
    h.enable();
    let cq = |qid: u32, size: u32, flags: u32, iv: u32, base: u64| {
        CommandBuilder::new(admin::CREATE_CQ, 0)
            .prp1(base)
            .cdw(10, (size << 16) | qid)
            .cdw(11, (iv << 16) | flags)
            .build()
    };
    let base = RAM + 0x20_0000;
    assert_eq!(
        h.admin_status(cq(0, 15, 3, 0, base)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        h.admin_status(cq(5, 15, 3, 0, base)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        h.admin_status(cq(1, 0, 3, 0, base)),
        Status::INVALID_QUEUE_SIZE
    );
    assert_eq!(
        h.admin_status(cq(1, 1024, 3, 0, base)),
        Status::INVALID_QUEUE_SIZE
    );
    assert_eq!(
        h.admin_status(cq(1, 15, 3, 0, base + 8)),
        Status::PRP_OFFSET_INVALID
    );
    assert_eq!(
        h.admin_status(cq(1, 15, 3, 5, base)),
        Status::INVALID_INTERRUPT_VECTOR
    );
    assert_eq!(
        h.admin_status(cq(1, 15, 1, 5, base)),
        Status::SUCCESS,
        "IV unused without IEN"
    );
    assert_eq!(
        h.admin_status(cq(2, 15, 2, 0, base)),
        Status::INVALID_FIELD,
        "not contiguous"
    );
    assert_eq!(
        h.admin_status(cq(1, 15, 3, 1, base)),
        Status::INVALID_QUEUE_IDENTIFIER,
        "exists"
    );

    let sq = |qid: u32, size: u32, flags: u32, cqid: u32, base: u64| {
        CommandBuilder::new(admin::CREATE_SQ, 0)
            .prp1(base)
            .cdw(10, (size << 16) | qid)
            .cdw(11, (cqid << 16) | flags)
            .build()
    };
    let sbase = RAM + 0x30_0000;
    assert_eq!(
        h.admin_status(sq(1, 15, 1, 0, sbase)),
        Status::INVALID_COMPLETION_QUEUE
    );
    assert_eq!(
        h.admin_status(sq(1, 15, 1, 3, sbase)),
        Status::INVALID_COMPLETION_QUEUE
    );
    assert_eq!(
        h.admin_status(sq(0, 15, 1, 1, sbase)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        h.admin_status(sq(5, 15, 1, 1, sbase)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        h.admin_status(sq(1, 0, 1, 1, sbase)),
        Status::INVALID_QUEUE_SIZE
    );
    assert_eq!(
        h.admin_status(sq(1, 15, 1, 1, sbase + 64)),
        Status::PRP_OFFSET_INVALID
    );
    assert_eq!(
        h.admin_status(sq(1, 15, 0, 1, sbase)),
        Status::INVALID_FIELD
    );
    assert_eq!(h.admin_status(sq(1, 15, 1, 1, sbase)), Status::SUCCESS);
    assert_eq!(
        h.admin_status(sq(1, 15, 1, 1, sbase)),
        Status::INVALID_QUEUE_IDENTIFIER
    );

    let del = |op: u8, qid: u32| CommandBuilder::new(op, 0).cdw(10, qid).build();
    assert_eq!(
        h.admin_status(del(admin::DELETE_CQ, 1)),
        Status::INVALID_QUEUE_DELETION
    );
    assert_eq!(
        h.admin_status(del(admin::DELETE_SQ, 0)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        h.admin_status(del(admin::DELETE_SQ, 2)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(h.admin_status(del(admin::DELETE_SQ, 1)), Status::SUCCESS);
    assert_eq!(
        h.admin_status(del(admin::DELETE_SQ, 1)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(h.admin_status(del(admin::DELETE_CQ, 1)), Status::SUCCESS);
    assert_eq!(
        h.admin_status(del(admin::DELETE_CQ, 0)),
        Status::INVALID_QUEUE_IDENTIFIER
    );

    // I/O entry sizes in CC must be 64/16 bytes.
    let cc = h.read32(reg::CC);
    h.write32(reg::CC, cc & !(0xff << 16));
    assert_eq!(
        h.admin_status(cq(1, 15, 3, 1, base)),
        Status::INVALID_QUEUE_SIZE
    );
}

fn features(op: u8, fid: u32, cdw11: u32) -> crate::Command {
    CommandBuilder::new(op, 0)
        .prp1(DATA)
        .cdw(10, fid)
        .cdw(11, cdw11)
        .build()
}

#[test]
fn features_through_the_queue() {
    let mut h = Host::new();
    h.enable();
    let get = |h: &mut Host, fid: u32| {
        let c = h.admin(features(admin::GET_FEATURES, fid, 0));
        assert_eq!(c.status, Status::SUCCESS, "get feature {fid}");
        c.dw0
    };
    for fid in [1, 2, 4, 6, 7, 8, 10, 11] {
        get(&mut h, fid);
    }
    assert_eq!(get(&mut h, 7), 0x0003_0003, "NSQA = NCQA = 4 queues");
    let c = h.admin(features(
        admin::SET_FEATURES,
        u32::from(feature::NUMBER_OF_QUEUES),
        0x0001_0001,
    ));
    assert_eq!((c.status, c.dw0), (Status::SUCCESS, 0x0003_0003));
    h.create_pair(1);
    let c = h.admin(features(admin::SET_FEATURES, 7, 0));
    assert_eq!(c.status, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(
        h.admin(features(admin::SET_FEATURES, 4, 0x150)).status,
        Status::SUCCESS
    );
    assert_eq!(get(&mut h, 4), 0x150);
    // Error Recovery is per namespace.
    let er = CommandBuilder::new(admin::GET_FEATURES, 0)
        .cdw(10, 5)
        .nsid(1)
        .build();
    assert_eq!(h.admin_status(er), Status::SUCCESS);
    assert_eq!(
        h.admin(features(admin::GET_FEATURES, 5, 0)).status,
        Status::INVALID_NAMESPACE
    );
    // Interrupt Vector Configuration needs a valid vector.
    assert_eq!(
        h.admin(features(admin::GET_FEATURES, 9, 1)).status,
        Status::SUCCESS
    );
    assert_eq!(
        h.admin(features(admin::GET_FEATURES, 9, 99)).status,
        Status::INVALID_FIELD
    );
    assert_eq!(
        h.admin(features(admin::GET_FEATURES, 0x0c, 0)).status,
        Status::INVALID_FIELD
    );
    assert_eq!(
        h.admin(features(admin::SET_FEATURES, 1 | (1 << 31), 0))
            .status,
        Status::FEATURE_NOT_SAVEABLE
    );
    // Timestamp moves 8 bytes through the data pointer.
    h.poke(DATA, &123_456u64.to_le_bytes());
    assert_eq!(
        h.admin(features(admin::SET_FEATURES, 0x0e, 0)).status,
        Status::SUCCESS
    );
    h.poke(DATA, &[0; 8]);
    assert_eq!(
        h.admin(features(admin::GET_FEATURES, 0x0e, 0)).status,
        Status::SUCCESS
    );
    let ts = u64::from_le_bytes(h.peek(DATA, 8).try_into().unwrap());
    assert!((123_456..123_456 + 10_000).contains(&(ts & 0xffff_ffff_ffff)));
    // Supported capabilities (SEL 3).
    let caps = h.admin(features(admin::GET_FEATURES, 4 | (3 << 8), 0));
    assert_eq!(caps.dw0, 0b100, "changeable, not saveable");
}

/// Get Log Page with RAE clear (reading a log re-arms its event type).
fn get_log(lid: u8, nsid: u32, bytes: u32, offset: u64) -> crate::Command {
    let numd = bytes / 4 - 1;
    CommandBuilder::new(admin::GET_LOG_PAGE, 0)
        .nsid(nsid)
        .prp1(DATA)
        .prp2(DATA + 0x1000)
        .cdw(10, u32::from(lid) | ((numd & 0xffff) << 16))
        .cdw(11, numd >> 16)
        .cdw(12, offset as u32)
        .cdw(13, (offset >> 32) as u32)
        .build()
}

#[test]
fn log_pages() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1);
    // Some I/O for the SMART counters.
    for i in 0..3u64 {
        let w = CommandBuilder::new(io::WRITE, 0)
            .nsid(1)
            .prp1(DATA)
            .slba(i * 8)
            .cdw(12, 7)
            .build();
        assert_eq!(h.io(1, w).status, Status::SUCCESS);
    }
    let r = CommandBuilder::new(io::READ, 0)
        .nsid(1)
        .prp1(DATA)
        .cdw(12, 7)
        .build();
    assert_eq!(h.io(1, r).status, Status::SUCCESS);
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, NSID_ALL, 512, 0)),
        Status::SUCCESS
    );
    let smart = h.peek(DATA, 512);
    let temp = u16::from_le_bytes([smart[1], smart[2]]);
    assert!((273..373).contains(&temp));
    assert_eq!(u64_at(&smart, 32), 1, "data units read (rounded up)");
    assert_eq!(u64_at(&smart, 48), 1, "data units written");
    assert_eq!(u64_at(&smart, 64), 1, "host read commands");
    assert_eq!(u64_at(&smart, 80), 3, "host write commands");
    assert_eq!(u64_at(&smart, 112), 1, "power cycles");
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, 1, 512, 0)),
        Status::SUCCESS
    );
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, 9, 512, 0)),
        Status::INVALID_NAMESPACE
    );

    // A failing command lands in the error log.
    let bad = CommandBuilder::new(io::READ, 0)
        .nsid(1)
        .prp1(DATA)
        .slba(1 << 30)
        .build();
    let failed = h.io(1, bad);
    assert_eq!(failed.status, Status::LBA_OUT_OF_RANGE);
    assert_eq!(
        h.admin_status(get_log(log::ERROR_INFORMATION, 0, 4096, 0)),
        Status::SUCCESS
    );
    let e = h.peek(DATA, 64);
    assert_eq!(
        u64_at(&e, 0),
        2,
        "error count: the bad SMART NSID, then this"
    );
    assert_eq!(u16::from_le_bytes([e[8], e[9]]), 1, "SQID");
    assert_eq!(u16::from_le_bytes([e[10], e[11]]), failed.cid);
    assert_eq!(
        u16::from_le_bytes([e[12], e[13]]) >> 1,
        Status::LBA_OUT_OF_RANGE.raw()
    );
    assert_eq!(u64_at(&e, 16), 1 << 30, "LBA");

    assert_eq!(
        h.admin_status(get_log(log::FIRMWARE_SLOT, 0, 512, 0)),
        Status::SUCCESS
    );
    let fw = h.peek(DATA, 16);
    assert_eq!(fw[0], 1);
    let rev = env!("CARGO_PKG_VERSION");
    assert_eq!(&fw[8..8 + rev.len()], rev.as_bytes());

    assert_eq!(
        h.admin_status(get_log(log::COMMANDS_EFFECTS, 0, 4096, 0)),
        Status::SUCCESS
    );
    let fx = h.peek(DATA, 4096);
    assert_eq!(u32_at(&fx, 4 * 6) & 1, 1, "Identify supported");
    assert_eq!(u32_at(&fx, 1024 + 4 * 2) & 1, 1, "Read supported");

    // Offsets: a dword-aligned offset returns the tail of the page.
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, 0, 8, 32)),
        Status::SUCCESS
    );
    assert_eq!(u64_at(&h.peek(DATA, 8), 0), 1);
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, 0, 8, 2)),
        Status::INVALID_FIELD
    );
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, 0, 8, 512)),
        Status::INVALID_FIELD
    );
    assert_eq!(
        h.admin_status(get_log(0x7f, 0, 512, 0)),
        Status::INVALID_LOG_PAGE
    );
    assert_eq!(
        h.admin_status(get_log(log::CHANGED_NAMESPACES, 0, 4096, 0)),
        Status::SUCCESS
    );
    // MDTS applies to log pages.
    assert_eq!(
        h.admin_status(get_log(log::ERROR_INFORMATION, 0, 1 << 20, 0)),
        Status::INVALID_FIELD
    );
}

#[test]
fn async_event_requests_limit_abort_and_delivery() {
    let mut h = Host::new();
    h.enable();
    let aer = || CommandBuilder::new(admin::ASYNC_EVENT_REQUEST, 0).build();
    let mut parked = Vec::new();
    for _ in 0..4 {
        parked.push(h.submit(0, aer()));
    }
    assert!(
        h.try_reap(0, Duration::from_millis(100)).is_none(),
        "AERs stay outstanding"
    );
    assert_eq!(h.admin_status(aer()), Status::ASYNC_EVENT_LIMIT_EXCEEDED);
    // Abort one parked AER: its completion comes first, then the Abort's.
    let abort = CommandBuilder::new(admin::ABORT, 0)
        .cdw(10, u32::from(parked[3]) << 16)
        .build();
    let abort_cid = h.submit(0, abort);
    let aborted = h.reap(0);
    assert_eq!(
        (aborted.cid, aborted.status),
        (parked[3], Status::ABORT_REQUESTED)
    );
    let done = h.reap(0);
    assert_eq!(
        (done.cid, done.status, done.dw0),
        (abort_cid, Status::SUCCESS, 0)
    );
    // Aborting something already finished: "not aborted".
    let again = CommandBuilder::new(admin::ABORT, 0)
        .cdw(10, 0xfff0 << 16)
        .build();
    assert_eq!(h.admin(again).dw0, 1);
    let bad_sq = CommandBuilder::new(admin::ABORT, 0).cdw(10, 3).build();
    assert_eq!(h.admin_status(bad_sq), Status::INVALID_FIELD);
    // An invalid doorbell completes an AER with an Error event.
    h.write32(0x1000 + 8 * 3, 1);
    let ev = h.reap(0);
    assert!(parked[..3].contains(&ev.cid));
    assert_eq!(ev.status, Status::SUCCESS);
    assert_eq!(ev.dw0 & 0x7, 0, "error event");
    assert_eq!((ev.dw0 >> 8) & 0xff, 0, "invalid doorbell register");
    assert_eq!((ev.dw0 >> 16) & 0xff, 1, "error log page");
    // Masked until the error log is read.
    h.write32(0x1000, 999);
    assert!(h.try_reap(0, Duration::from_millis(100)).is_none());
    assert_eq!(
        h.admin_status(get_log(log::ERROR_INFORMATION, 0, 64, 0)),
        Status::SUCCESS
    );
    h.write32(0x1000, 999);
    let ev = h.reap(0);
    assert_eq!((ev.dw0 >> 8) & 0xff, 1, "invalid doorbell write value");
    assert_eq!(h.ctrl.stats().counters.async_events, 2);
    // The server went on serving.
    assert_eq!(h.admin_status(identify(1, 0)), Status::SUCCESS);
}

#[test]
fn temperature_threshold_below_current_raises_a_smart_event() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(
        h.admin(features(admin::SET_FEATURES, 0x0b, 0x2)).status,
        Status::SUCCESS
    );
    let aer = h.submit(
        0,
        CommandBuilder::new(admin::ASYNC_EVENT_REQUEST, 0).build(),
    );
    assert_eq!(
        h.admin(features(admin::SET_FEATURES, 4, 300)).status,
        Status::SUCCESS
    );
    let ev = h.reap(0);
    assert_eq!(ev.cid, aer);
    assert_eq!(
        ev.dw0,
        1 | (1 << 8) | (2 << 16),
        "SMART, temperature, SMART log"
    );
    assert_eq!(
        h.admin_status(get_log(log::SMART_HEALTH, 0, 512, 0)),
        Status::SUCCESS
    );
    assert_eq!(
        h.peek(DATA, 1)[0] & 0x2,
        0x2,
        "critical warning: temperature"
    );
}

#[test]
fn format_nvm_changes_the_block_size_and_erases() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1);
    h.poke(DATA, &[0x5a; 512]);
    let w = CommandBuilder::new(io::WRITE, 0).nsid(1).prp1(DATA).build();
    assert_eq!(h.io(1, w).status, Status::SUCCESS);
    let format = |lbaf: u32, nsid: u32| {
        CommandBuilder::new(admin::FORMAT_NVM, 0)
            .nsid(nsid)
            .cdw(10, lbaf)
            .build()
    };
    assert_eq!(h.admin_status(format(2, 1)), Status::INVALID_FORMAT);
    assert_eq!(
        h.admin_status(format(1 | (1 << 5), 1)),
        Status::INVALID_FORMAT,
        "PI"
    );
    assert_eq!(
        h.admin_status(format(1 | (2 << 9), 1)),
        Status::INVALID_FIELD,
        "crypto erase"
    );
    assert_eq!(h.admin_status(format(1, 5)), Status::INVALID_NAMESPACE);
    assert_eq!(h.admin_status(format(1, NSID_ALL)), Status::SUCCESS);
    assert_eq!(h.admin_status(identify(0, 1)), Status::SUCCESS);
    let ns = h.peek(DATA, 4096);
    assert_eq!(u64_at(&ns, 0), 256);
    assert_eq!(ns[26] & 0xf, 1);
    let r = CommandBuilder::new(io::READ, 0).nsid(1).prp1(DATA).build();
    assert_eq!(h.io(1, r).status, Status::SUCCESS);
    assert_eq!(
        h.peek(DATA, 4096),
        vec![0; 4096],
        "erased, one 4 KiB block read"
    );
}
