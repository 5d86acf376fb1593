//! Raw byte streams over a socketpair: every bad request gets an error reply
//! with a real errno, and the next valid request still works (the stream
//! never desyncs). Headers that cannot be trusted end the connection.

use crate::common;

use std::io::Write;
use std::os::fd::AsRawFd;

use common::*;
use p2plab_vfio_user::vfio_abi::{
    VFIO_DMA_UNMAP_FLAG_ALL, VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_BOOL, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_REGION_INFO_CAP_SPARSE_MMAP, VFIO_REGION_INFO_FLAG_CAPS, VFIO_REGION_INFO_FLAG_MMAP,
};
use p2plab_vfio_user::{ConnectionEnd, DmaSpace, EventFd, SharedMemory};

#[test]
fn commands_before_version_are_refused_then_version_works() {
    let (mut c, _srv) = serve_pair();
    let p = Buf::default().u64(0).u32(CONFIG).u32(4).0;
    assert_eq!(c.call_err(cmd::REGION_READ, &p), libc::EINVAL as u32);
    // Major 1 is refused; the same connection can still negotiate 0.
    let v1 = Buf::default().u16(1).u16(0).0;
    assert_eq!(c.call_err(cmd::VERSION, &v1), libc::ENOTSUP as u32);
    // Not JSON.
    let junk = Buf::default().u16(0).u16(0).bytes(b"{nope\0").0;
    assert_eq!(c.call_err(cmd::VERSION, &junk), libc::EINVAL as u32);
    // Too short for major/minor.
    assert_eq!(c.call_err(cmd::VERSION, &[0]), libc::EINVAL as u32);

    let reply = c.negotiate();
    assert_eq!(u32_at(&reply.payload, 0) & 0xffff, 0, "major 0");
    let json = std::str::from_utf8(&reply.payload[4..reply.payload.len() - 1]).unwrap();
    assert_eq!(*reply.payload.last().unwrap(), 0, "NUL-terminated");
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    let caps = &v["capabilities"];
    assert_eq!(caps["max_msg_fds"], 16);
    assert_eq!(caps["max_data_xfer_size"], 1 << 20);
    assert_eq!(caps["pgsizes"], 4096);
    assert_eq!(caps["write_multiple"], true);
    assert!(caps.get("migration").is_none(), "{json}");
    // A second VERSION is refused.
    let v0 = Buf::default().u16(0).u16(0).0;
    assert_eq!(c.call_err(cmd::VERSION, &v0), libc::EINVAL as u32);
    c.assert_in_sync();
}

#[test]
fn write_multiple_is_only_offered_to_clients_that_propose_it() {
    let (mut c, _srv) = serve_pair();
    let reply = c.negotiate_with(r#"{"capabilities":{"max_msg_fds":4}}"#);
    let json = String::from_utf8_lossy(&reply.payload[4..]);
    assert!(!json.contains("write_multiple"), "{json}");
}

#[test]
fn each_bad_request_gets_an_errno_and_the_stream_stays_in_sync() {
    let (mut c, _srv) = serve_pair();
    c.negotiate();

    // Unknown command, with a payload to skip.
    assert_eq!(c.call_err(99, &[0xaa; 10]), libc::ENOSYS as u32);
    c.assert_in_sync();
    // Device features: same errno the kernel gives for an unknown one.
    assert_eq!(
        c.call_err(cmd::DEVICE_FEATURE, &[0; 8]),
        libc::ENOTTY as u32
    );
    c.assert_in_sync();
    // DMA_READ is a server-to-client command.
    assert_eq!(c.call_err(cmd::DMA_READ, &[0; 16]), libc::EINVAL as u32);
    c.assert_in_sync();

    // Truncated payload: REGION_READ needs 16 bytes.
    assert_eq!(c.call_err(cmd::REGION_READ, &[0; 8]), libc::EINVAL as u32);
    c.assert_in_sync();

    // Bad region index.
    assert_eq!(c.region_read(42, 0, 4), Err(libc::EINVAL as u32));
    c.assert_in_sync();

    // Read past the region's end, and an offset that overflows.
    assert_eq!(
        c.region_read(BAR0, BAR0_SIZE - 4, 8),
        Err(libc::EINVAL as u32)
    );
    assert_eq!(
        c.region_read(BAR0, u64::MAX - 1, 4),
        Err(libc::EINVAL as u32)
    );
    assert_eq!(
        c.region_write(CONFIG, 255, &[1, 2]),
        Err(libc::EINVAL as u32)
    );
    c.assert_in_sync();

    // Writing a read-only region.
    assert_eq!(c.region_write(RO_REGION, 0, &[1]), Err(libc::EACCES as u32));
    assert_eq!(c.region_read(RO_REGION, 0, 4).unwrap(), b"RO!!");

    // REGION_WRITE whose count disagrees with its data.
    let p = Buf::default().u64(0).u32(BAR0).u32(8).bytes(&[1, 2, 3]).0;
    assert_eq!(c.call_err(cmd::REGION_WRITE, &p), libc::EINVAL as u32);
    c.assert_in_sync();

    // Wrong argsz.
    let p = Buf::default().u32(8).u32(0).u32(0).u32(0).0;
    assert_eq!(c.call_err(cmd::DEVICE_GET_INFO, &p), libc::EINVAL as u32);
    let p = Buf::default()
        .u32(16)
        .u32(0)
        .u32(BAR0)
        .u32(0)
        .u64(0)
        .u64(0)
        .0;
    assert_eq!(
        c.call_err(cmd::DEVICE_GET_REGION_INFO, &p),
        libc::EINVAL as u32
    );
    let p = Buf::default().u32(4).u32(0).u32(MSIX).u32(0).0;
    assert_eq!(
        c.call_err(cmd::DEVICE_GET_IRQ_INFO, &p),
        libc::EINVAL as u32
    );
    c.assert_in_sync();

    // Bad irq index and vector range.
    let p = Buf::default().u32(16).u32(0).u32(99).u32(0).0;
    assert_eq!(
        c.call_err(cmd::DEVICE_GET_IRQ_INFO, &p),
        libc::EINVAL as u32
    );
    let set = |flags: u32, start: u32, count: u32| {
        Buf::default()
            .u32(20)
            .u32(flags)
            .u32(MSIX)
            .u32(start)
            .u32(count)
            .0
    };
    let trigger_none = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
    assert_eq!(
        c.call_err(cmd::DEVICE_SET_IRQS, &set(trigger_none, 3, 2)),
        libc::EINVAL as u32
    );
    assert_eq!(
        c.call_err(cmd::DEVICE_SET_IRQS, &set(trigger_none, u32::MAX, 2)),
        libc::EINVAL as u32
    );
    // Two data types at once.
    assert_eq!(
        c.call_err(
            cmd::DEVICE_SET_IRQS,
            &set(trigger_none | VFIO_IRQ_SET_DATA_BOOL, 0, 1)
        ),
        libc::EINVAL as u32
    );
    // DATA_BOOL without its bytes.
    assert_eq!(
        c.call_err(
            cmd::DEVICE_SET_IRQS,
            &set(VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_TRIGGER, 0, 4)
        ),
        libc::EINVAL as u32
    );
    c.assert_in_sync();
}

#[test]
fn oversize_messages_are_swallowed_and_refused() {
    let (mut c, _srv) = serve_pair();
    c.negotiate();
    // 2 MiB of data against a 1 MiB limit. The server must read it all
    // while we write it, then answer E2BIG.
    let data = vec![0x5au8; 2 << 20];
    let p = Buf::default()
        .u64(0)
        .u32(BAR0)
        .u32(data.len() as u32)
        .bytes(&data)
        .0;
    assert_eq!(c.call_err(cmd::REGION_WRITE, &p), libc::E2BIG as u32);
    c.assert_in_sync();
    // A read asking for more than max_data_xfer_size.
    assert_eq!(
        c.region_read(BAR2, 0, (1 << 20) + 1),
        Err(libc::E2BIG as u32)
    );
    c.assert_in_sync();
}

#[test]
fn too_many_fds_are_refused_and_unused_fds_do_not_break_anything() {
    let mut cfg = config();
    cfg.max_msg_fds = 2;
    let (mut c, _srv) = serve_pair_with(cfg, DmaSpace::new());
    c.negotiate();
    let efds: Vec<EventFd> = (0..3).map(|_| EventFd::new(0).unwrap()).collect();
    let raw: Vec<i32> = efds.iter().map(|e| e.as_raw_fd()).collect();
    let p = Buf::default().u32(16).u32(0).u32(0).u32(0).0;
    let m = c.call_fds(cmd::DEVICE_GET_INFO, &p, &raw);
    assert!(m.hdr.is_error());
    assert_eq!(m.hdr.error, libc::EINVAL as u32);
    c.assert_in_sync();
    // One fd on a command that takes none: ignored (and closed).
    let m = c.call_fds(cmd::DEVICE_GET_INFO, &p, &raw[..1]);
    assert!(!m.hdr.is_error());
    assert_eq!(u32_at(&m.payload, 8), 9, "num_regions");
    c.assert_in_sync();
}

#[test]
fn posted_writes_get_no_reply_and_are_ordered() {
    let (mut c, _srv) = serve_pair();
    c.negotiate();
    let p = Buf::default().u64(0x40).u32(BAR0).u32(4).bytes(b"post").0;
    c.send(cmd::REGION_WRITE, NO_REPLY, &p, &[]);
    // A failing posted write: no reply either.
    let bad = Buf::default().u64(0).u32(77).u32(1).bytes(b"x").0;
    c.send(cmd::REGION_WRITE, NO_REPLY, &bad, &[]);
    // The next message we get is the reply to this read, and it sees the
    // posted data.
    assert_eq!(c.region_read(BAR0, 0x40, 4).unwrap(), b"post");
}

#[test]
fn write_multi_applies_all_or_nothing() {
    let (mut c, _srv) = serve_pair();
    c.negotiate();
    let entry = |off: u64, region: u32, count: u32, data: u64| {
        Buf::default().u64(off).u32(region).u32(count).u64(data).0
    };
    let mut p = Buf::default().u64(2).0;
    p.extend(entry(0x10, BAR0, 4, 0x1122_3344));
    p.extend(entry(0x20, BAR0, 8, 0x5566_7788_99aa_bbcc));
    let m = c.call(cmd::REGION_WRITE_MULTI, &p);
    assert!(!m.hdr.is_error());
    assert_eq!(u64_at(&m.payload, 0), 2);
    assert_eq!(
        c.region_read(BAR0, 0x10, 4).unwrap(),
        0x1122_3344u32.to_ne_bytes()
    );
    assert_eq!(
        c.region_read(BAR0, 0x20, 8).unwrap(),
        0x5566_7788_99aa_bbccu64.to_ne_bytes()
    );

    // Second entry is bad (count 9): nothing is applied.
    let mut p = Buf::default().u64(2).0;
    p.extend(entry(0x30, BAR0, 4, 0xdead_beef));
    p.extend(entry(0x38, BAR0, 9, 0));
    assert_eq!(c.call_err(cmd::REGION_WRITE_MULTI, &p), libc::EINVAL as u32);
    assert_eq!(c.region_read(BAR0, 0x30, 4).unwrap(), [0; 4]);
    // wr_cnt disagreeing with the payload.
    let mut p = Buf::default().u64(3).0;
    p.extend(entry(0x30, BAR0, 4, 1));
    assert_eq!(c.call_err(cmd::REGION_WRITE_MULTI, &p), libc::EINVAL as u32);
    // Posted multi write (as QEMU sends them).
    let mut p = Buf::default().u64(1).0;
    p.extend(entry(0x30, BAR0, 2, 0xabcd));
    c.send(cmd::REGION_WRITE_MULTI, NO_REPLY, &p, &[]);
    assert_eq!(
        c.region_read(BAR0, 0x30, 2).unwrap(),
        0xabcdu16.to_ne_bytes()
    );
}

#[test]
fn region_info_honours_argsz_and_passes_the_fd() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let ask = |argsz: u32, index: u32| {
        Buf::default()
            .u32(argsz)
            .u32(0)
            .u32(index)
            .u32(0)
            .u64(0)
            .u64(0)
            .0
    };
    // Too small for the sparse-mmap capability: needed size, no caps, no fd.
    let m = c.call(cmd::DEVICE_GET_REGION_INFO, &ask(32, BAR2));
    assert!(!m.hdr.is_error());
    let needed = u32_at(&m.payload, 0);
    assert_eq!(needed, 32 + 8 + 8 + 16);
    assert_eq!(m.payload.len(), 32);
    assert_eq!(u32_at(&m.payload, 4) & VFIO_REGION_INFO_FLAG_CAPS, 0);
    assert!(m.fds.is_empty());

    let m = c.call(cmd::DEVICE_GET_REGION_INFO, &ask(needed, BAR2));
    assert_eq!(m.payload.len(), needed as usize);
    let flags = u32_at(&m.payload, 4);
    assert_ne!(flags & VFIO_REGION_INFO_FLAG_CAPS, 0);
    assert_ne!(flags & VFIO_REGION_INFO_FLAG_MMAP, 0);
    assert_eq!(u32_at(&m.payload, 8), BAR2);
    let cap_offset = u32_at(&m.payload, 12) as usize;
    assert_eq!(cap_offset, 32);
    assert_eq!(u64_at(&m.payload, 16), BAR2_SIZE);
    let cap = &m.payload[cap_offset..];
    assert_eq!(
        u32_at(cap, 0) & 0xffff,
        VFIO_REGION_INFO_CAP_SPARSE_MMAP,
        "cap id"
    );
    assert_eq!(u32_at(cap, 4), 0, "next");
    assert_eq!(u32_at(cap, 8), 1, "nr_areas");
    assert_eq!(u64_at(cap, 16), BAR2_MMAP.offset);
    assert_eq!(u64_at(cap, 24), BAR2_MMAP.size);
    assert_eq!(m.fds.len(), 1, "region fd sent with SCM_RIGHTS");

    // The fd is the BAR's memory.
    srv.device.bar2.write_at(100, b"bar2").unwrap();
    let file = std::fs::File::from(m.fds.into_iter().next().unwrap());
    let mut seen = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut seen, 100).unwrap();
    assert_eq!(&seen, b"bar2");

    // A plain region: no caps, no fd.
    let m = c.call(cmd::DEVICE_GET_REGION_INFO, &ask(32, BAR0));
    assert_eq!(u32_at(&m.payload, 0), 32);
    assert!(m.fds.is_empty());
    c.assert_in_sync();
}

#[test]
fn dma_map_and_unmap_refusals() {
    let mut cfg = config();
    cfg.max_dma_maps = 2;
    let (mut c, srv) = serve_pair_with(cfg, DmaSpace::new());
    c.negotiate();
    let rw = 3;
    let m = c.dma_map(0x1000, 0x1000, rw, None, 0);
    assert!(!m.hdr.is_error());
    // Overlap.
    let m = c.dma_map(0x1800, 0x1000, rw, None, 0);
    assert_eq!(m.hdr.error, libc::EEXIST as u32);
    // Bad flags, size 0.
    assert_eq!(
        c.dma_map(0x9000, 0x1000, 0x80 | rw, None, 0).hdr.error,
        libc::EINVAL as u32
    );
    assert_eq!(
        c.dma_map(0x9000, 0, rw, None, 0).hdr.error,
        libc::EINVAL as u32
    );
    // An fd that cannot be mmapped.
    let ev = EventFd::new(0).unwrap();
    let m = c.dma_map(0x9000, 0x1000, rw, Some(ev.as_raw_fd()), 0);
    assert!(m.hdr.is_error());
    assert_ne!(m.hdr.error, 0);
    // Limit of 2 maps.
    assert!(!c.dma_map(0x2000, 0x1000, rw, None, 0).hdr.is_error());
    assert_eq!(
        c.dma_map(0x3000, 0x1000, rw, None, 0).hdr.error,
        libc::ENOSPC as u32
    );
    assert_eq!(srv.dma.mapping_count(), 2);

    let unmap =
        |flags: u32, gpa: u64, size: u64| Buf::default().u32(24).u32(flags).u64(gpa).u64(size).0;
    // Nothing mapped there: success, as kernel VFIO answers (QEMU with a
    // vIOMMU unmaps whole windows, up to the top of the address space).
    assert!(!c
        .call(cmd::DMA_UNMAP, &unmap(0, 0x7000, 0x1000))
        .hdr
        .is_error());
    assert!(!c
        .call(
            cmd::DMA_UNMAP,
            &unmap(0, 0xfef0_0000, 0u64.wrapping_sub(0xfef0_0000))
        )
        .hdr
        .is_error());
    assert_eq!(srv.dma.mapping_count(), 2);
    // Cutting a mapping in two stays an error.
    assert_eq!(
        c.call_err(cmd::DMA_UNMAP, &unmap(0, 0x2800, 0x100)),
        libc::EINVAL as u32
    );
    assert_eq!(
        c.call_err(
            cmd::DMA_UNMAP,
            &unmap(VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP, 0x1000, 0x1000)
        ),
        libc::ENOTSUP as u32
    );
    assert_eq!(
        c.call_err(cmd::DMA_UNMAP, &unmap(VFIO_DMA_UNMAP_FLAG_ALL, 0x1000, 1)),
        libc::EINVAL as u32
    );
    assert_eq!(
        c.call_err(cmd::DMA_UNMAP, &unmap(0, 0x1000, 0x800)),
        libc::EINVAL as u32
    );
    // Exact unmap echoes the entry.
    let m = c.call(cmd::DMA_UNMAP, &unmap(0, 0x1000, 0x1000));
    assert!(!m.hdr.is_error());
    assert_eq!(m.payload, unmap(0, 0x1000, 0x1000));
    // Unmap-all.
    let m = c.call(cmd::DMA_UNMAP, &unmap(VFIO_DMA_UNMAP_FLAG_ALL, 0, 0));
    assert!(!m.hdr.is_error());
    assert_eq!(srv.dma.mapping_count(), 0);
    c.assert_in_sync();
}

#[test]
fn set_irqs_decodes_every_data_kind() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let set = |flags: u32, start: u32, count: u32| {
        Buf::default()
            .u32(20)
            .u32(flags)
            .u32(MSIX)
            .u32(start)
            .u32(count)
            .0
    };
    let efds: Vec<EventFd> = (0..2).map(|_| EventFd::new(0).unwrap()).collect();
    let raw: Vec<i32> = efds.iter().map(|e| e.as_raw_fd()).collect();
    let eventfd_trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    // Count and fds disagree.
    let m = c.call_fds(cmd::DEVICE_SET_IRQS, &set(eventfd_trigger, 0, 3), &raw);
    assert_eq!(m.hdr.error, libc::EINVAL as u32);
    // count 0 only means something with DATA_NONE.
    assert_eq!(
        c.call_err(cmd::DEVICE_SET_IRQS, &set(eventfd_trigger, 0, 0)),
        libc::EINVAL as u32
    );
    // Bind vectors 1 and 2.
    let m = c.call_fds(cmd::DEVICE_SET_IRQS, &set(eventfd_trigger, 1, 2), &raw);
    assert!(!m.hdr.is_error());
    // Client-side trigger through DATA_BOOL fires only vector 2.
    let p = Buf::default()
        .bytes(&set(
            VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_TRIGGER,
            1,
            2,
        ))
        .bytes(&[0, 1])
        .0;
    assert!(!c.call(cmd::DEVICE_SET_IRQS, &p).hdr.is_error());
    assert_eq!(eventfd_count(&efds[1]), Some(1));
    // DATA_NONE trigger fires both.
    let trig = set(VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER, 1, 2);
    assert!(!c.call(cmd::DEVICE_SET_IRQS, &trig).hdr.is_error());
    assert_eq!(eventfd_count(&efds[0]), Some(1));
    assert_eq!(eventfd_count(&efds[1]), Some(1));
    // Device-side fire.
    assert!(srv.device.fire(1));
    assert_eq!(eventfd_count(&efds[0]), Some(1));
    // EVENTFD without fds unbinds.
    assert!(!c
        .call(cmd::DEVICE_SET_IRQS, &set(eventfd_trigger, 1, 1))
        .hdr
        .is_error());
    assert!(!srv.device.fire(1));
    assert!(srv.device.fire(2));
    // count 0 + DATA_NONE + TRIGGER disables all.
    assert!(!c
        .call(
            cmd::DEVICE_SET_IRQS,
            &set(VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER, 0, 0)
        )
        .hdr
        .is_error());
    assert!(!srv.device.fire(2));
    let log = &srv.device.state.lock().unwrap().log.irq_sets;
    let kinds: Vec<&str> = log.iter().map(|e| e.4.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "eventfds[true, true]",
            "bool[false, true]",
            "none",
            "eventfds[false]",
            "eventfds[]"
        ]
    );
}

#[test]
fn reset_reaches_the_device() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    c.region_write(BAR0, 0, b"dirty").unwrap();
    let m = c.call(cmd::DEVICE_RESET, &[]);
    assert!(!m.hdr.is_error());
    assert_eq!(srv.device.resets(), 1);
    assert_eq!(c.region_read(BAR0, 0, 5).unwrap(), [0; 5]);
}

#[test]
fn a_header_smaller_than_a_header_closes_the_connection() {
    let (mut c, mut srv) = serve_pair();
    c.negotiate();
    let mut bad = Hdr {
        id: 1,
        cmd: cmd::REGION_READ,
        size: 8,
        flags: 0,
        error: 0,
    }
    .encode()
    .to_vec();
    bad.extend_from_slice(&[0; 16]);
    c.stream.write_all(&bad).unwrap();
    assert!(matches!(srv.join(), ConnectionEnd::Protocol(_)));
    assert!(read_msg(&c.stream).is_err(), "connection must be closed");
    // Disconnect resets the device.
    assert_eq!(srv.device.resets(), 1);
}

#[test]
fn an_absurd_size_closes_the_connection() {
    let (mut c, mut srv) = serve_pair();
    c.negotiate();
    let bad = Hdr {
        id: 1,
        cmd: cmd::REGION_WRITE,
        size: u32::MAX,
        flags: 0,
        error: 0,
    }
    .encode();
    c.stream.write_all(&bad).unwrap();
    assert!(matches!(srv.join(), ConnectionEnd::Protocol(_)));
}

#[test]
fn eof_inside_a_message_is_a_protocol_error() {
    let (mut c, mut srv) = serve_pair();
    c.negotiate();
    let hdr = Hdr {
        id: 1,
        cmd: cmd::REGION_READ,
        size: 32,
        flags: 0,
        error: 0,
    }
    .encode();
    c.stream.write_all(&hdr).unwrap();
    c.stream.write_all(&[0; 5]).unwrap();
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(matches!(srv.join(), ConnectionEnd::Protocol(_)));
}

#[test]
fn disconnect_resets_the_device_and_drops_dma_ranges() {
    let (mut c, mut srv) = serve_pair();
    c.negotiate();
    let ram = SharedMemory::new("ram", 1 << 20).unwrap();
    assert!(!c
        .dma_map(0x10_0000, 1 << 20, 3, Some(ram.fd()), 0)
        .hdr
        .is_error());
    assert_eq!(srv.dma.mapping_count(), 1);
    assert!(srv.dma.is_connected());
    drop(c);
    assert_eq!(srv.join(), ConnectionEnd::ClientClosed);
    assert_eq!(srv.dma.mapping_count(), 0);
    assert!(!srv.dma.is_connected());
    assert_eq!(srv.device.resets(), 1);
}
