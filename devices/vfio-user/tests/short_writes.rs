//! Replies to our DMA_READs that a client cuts short, answers with the
//! wrong id or size, or runs into its next message: what QEMU 11.1 does
//! when its socket cannot take a whole reply (one non-blocking sendmsg, the
//! rest dropped; see devices/vfio-user/README.md). A fake client on a
//! socketpair writes the exact bytes.
//!
//! Would catch: a server that reads the client's next message as reply
//! data or as a DMA_READ payload (a desynchronised stream), hands cut or
//! foreign bytes to the device, waits out the whole DMA timeout instead of
//! noticing the cut, executes requests it swallowed as data, or lets many
//! device threads queue more DMA_READ reply bytes than a socket holds.

use crate::common;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use p2plab_vfio_user::{ConnectionEnd, DmaError, DmaSpace};

const BASE: u64 = 0xd000_0000;
const SIZE: u64 = 1 << 20;
const LEN: usize = 8192;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 % 251) as u8).collect()
}

/// A negotiated client with an fd-less range at BASE, so device DMA there
/// goes through DMA_READ messages.
fn start() -> (RawClient, PairServer) {
    let (mut client, srv) = serve_pair();
    client.negotiate();
    let m = client.dma_map(BASE, SIZE, 3, None, 0);
    assert!(!m.hdr.is_error(), "{m:?}");
    (client, srv)
}

/// A device thread reading LEN bytes at BASE.
fn device_read(dma: &DmaSpace, len: usize) -> JoinHandle<(Result<(), DmaError>, Vec<u8>)> {
    let dma = dma.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; len];
        let r = dma.read(BASE, &mut buf);
        (r, buf)
    })
}

/// The bytes of a whole DMA_READ reply to `req` carrying `data`.
fn reply_bytes(req: &Msg, data: &[u8]) -> Vec<u8> {
    let mut out = Hdr {
        id: req.hdr.id,
        cmd: cmd::DMA_READ,
        size: (HDR + 16 + data.len()) as u32,
        flags: REPLY,
        error: 0,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(&req.payload[..16]);
    out.extend_from_slice(data);
    out
}

fn region_write_bytes(id: u16, offset: u64, value: u64) -> Vec<u8> {
    let payload = Buf::default().u64(offset).u32(BAR0).u32(8).u64(value).0;
    let mut out = Hdr {
        id,
        cmd: cmd::REGION_WRITE,
        size: (HDR + payload.len()) as u32,
        flags: 0,
        error: 0,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(&payload);
    out
}

fn config_read_bytes(id: u16) -> Vec<u8> {
    let payload = Buf::default().u64(0).u32(CONFIG).u32(4).0;
    let mut out = Hdr {
        id,
        cmd: cmd::REGION_READ,
        size: (HDR + payload.len()) as u32,
        flags: 0,
        error: 0,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(&payload);
    out
}

/// Reads the server's next message, which must be a DMA_READ of `len`
/// bytes at BASE.
fn expect_dma_read(client: &RawClient, len: usize) -> Msg {
    let req = read_msg(&client.stream).expect("DMA_READ request");
    assert_eq!(req.hdr.cmd, cmd::DMA_READ, "{req:?}");
    assert_eq!(u64_at(&req.payload, 0), BASE);
    assert_eq!(u64_at(&req.payload, 8), len as u64);
    req
}

fn protocol_error(r: &Result<(), DmaError>) -> String {
    match r {
        Err(DmaError::Protocol(why)) => why.clone(),
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

fn protocol_end(end: ConnectionEnd) -> String {
    match end {
        ConnectionEnd::Protocol(why) => why,
        other => panic!("expected the connection dropped for a protocol error, got {other:?}"),
    }
}

/// The server closed its end: reading gives EOF, not a reply.
fn assert_dropped(client: &RawClient) {
    assert!(
        read_msg(&client.stream).is_err(),
        "the server must close the connection"
    );
}

#[test]
fn a_reply_cut_short_fails_the_dma_within_the_stall_time_and_drops_the_connection() {
    let (client, mut srv) = start();
    let device = device_read(&srv.dma, LEN);
    let req = expect_dma_read(&client, LEN);
    let whole = reply_bytes(&req, &pattern(LEN));
    // What QEMU's short write leaves: the header announces LEN bytes, a
    // bit over half of them arrive, then nothing.
    let t0 = Instant::now();
    (&client.stream)
        .write_all(&whole[..HDR + 16 + 4096])
        .unwrap();
    let (result, data) = device.join().unwrap();
    let waited = t0.elapsed();
    let why = protocol_error(&result);
    assert!(why.contains("cut short"), "{why}");
    assert!(why.contains("4112 of 8208"), "{why}");
    assert!(
        waited < Duration::from_secs(5),
        "noticed after {waited:?}, not within the stall time"
    );
    assert!(
        data.iter().all(|&b| b == 0),
        "no cut data reaches the device"
    );
    assert!(protocol_end(srv.join()).contains("cut short"));
    assert_dropped(&client);
    assert_eq!(srv.dma.stats().message.read_bytes, 0);
}

#[test]
fn a_cut_reply_that_runs_into_the_next_requests_is_caught_before_the_data_is_used() {
    let (client, mut srv) = start();
    let device = device_read(&srv.dma, LEN);
    let req = expect_dma_read(&client, LEN);
    let whole = reply_bytes(&req, &pattern(LEN));
    // The cut reply and, in the same write, enough REGION_WRITEs (40 bytes
    // each) to fill the missing 4096 bytes and more: the server's reply
    // payload ends 16 bytes into one of them.
    let mut bytes = whole[..HDR + 16 + 4096].to_vec();
    for i in 0..150u16 {
        bytes.extend_from_slice(&region_write_bytes(1000 + i, 0x10, 0xdead_beef));
    }
    (&client.stream).write_all(&bytes).unwrap();
    let (result, data) = device.join().unwrap();
    let why = protocol_error(&result);
    assert!(why.contains("no header"), "{why}");
    assert!(
        data.iter().all(|&b| b == 0),
        "no foreign bytes reach the device"
    );
    assert!(protocol_end(srv.join()).contains("out of sync"));
    // None of the swallowed requests ran.
    let bar0 = srv.device.state.lock().unwrap().bar0.clone();
    assert!(bar0.iter().all(|&b| b == 0), "a swallowed REGION_WRITE ran");
    assert_dropped(&client);
}

#[test]
fn a_reply_with_the_wrong_id_drops_the_connection_without_reading_its_payload() {
    let (client, mut srv) = start();
    let device = device_read(&srv.dma, LEN);
    let req = expect_dma_read(&client, LEN);
    let mut bytes = reply_bytes(&req, &pattern(LEN));
    bytes[0..2].copy_from_slice(&req.hdr.id.wrapping_add(7).to_ne_bytes());
    // A valid request right behind it: it must not be answered, since
    // after a bad reply header nothing marks where it starts.
    bytes.extend_from_slice(&config_read_bytes(4242));
    (&client.stream).write_all(&bytes).unwrap();
    let (result, _) = device.join().unwrap();
    // The request itself is failed when the connection drops.
    assert_eq!(result, Err(DmaError::Disconnected));
    let why = protocol_end(srv.join());
    assert!(why.contains("answers no request"), "{why}");
    assert_dropped(&client);
}

#[test]
fn a_reply_whose_size_does_not_match_the_request_is_refused() {
    let (client, mut srv) = start();
    let device = device_read(&srv.dma, LEN);
    let req = expect_dma_read(&client, LEN);
    // Right id and command, but 4 KiB of data for an 8 KiB request.
    let bytes = reply_bytes(&req, &pattern(4096));
    (&client.stream).write_all(&bytes).unwrap();
    let (result, data) = device.join().unwrap();
    let why = protocol_error(&result);
    assert!(why.contains("has size 4128"), "{why}");
    assert!(data.iter().all(|&b| b == 0));
    assert!(protocol_end(srv.join()).contains("out of sync"));
    assert_dropped(&client);
}

#[test]
fn a_reply_with_a_foreign_command_or_flags_is_refused() {
    for (cmd_no, flags) in [(cmd::DMA_WRITE, REPLY), (cmd::DMA_READ, REPLY | NO_REPLY)] {
        let (client, mut srv) = start();
        let device = device_read(&srv.dma, LEN);
        let req = expect_dma_read(&client, LEN);
        let mut bytes = reply_bytes(&req, &pattern(LEN));
        bytes[2..4].copy_from_slice(&cmd_no.to_ne_bytes());
        bytes[8..12].copy_from_slice(&flags.to_ne_bytes());
        (&client.stream).write_all(&bytes).unwrap();
        let (result, _) = device.join().unwrap();
        protocol_error(&result);
        assert!(protocol_end(srv.join()).contains("out of sync"));
        assert_dropped(&client);
    }
}

#[test]
fn a_reply_and_a_request_in_one_write_are_both_served() {
    let (mut client, mut srv) = start();
    let device = device_read(&srv.dma, LEN);
    let req = expect_dma_read(&client, LEN);
    let expected = pattern(LEN);
    let mut bytes = reply_bytes(&req, &expected);
    bytes.extend_from_slice(&config_read_bytes(4242));
    (&client.stream).write_all(&bytes).unwrap();
    let answer = read_msg(&client.stream).expect("the request is answered");
    assert_eq!((answer.hdr.id, answer.hdr.cmd), (4242, cmd::REGION_READ));
    assert!(!answer.hdr.is_error());
    assert_eq!(&answer.payload[16..], &[0x86, 0x80, 0x34, 0x12]);
    let (result, data) = device.join().unwrap();
    assert_eq!(result, Ok(()));
    assert_eq!(data, expected);
    client.assert_in_sync();
    drop(client);
    assert_eq!(srv.join(), ConnectionEnd::ClientClosed);
}

#[test]
fn a_late_reply_to_an_abandoned_request_is_read_past() {
    let (client, srv) =
        serve_pair_with(config(), DmaSpace::with_timeout(Duration::from_millis(300)));
    let mut client = client;
    client.negotiate();
    assert!(!client.dma_map(BASE, SIZE, 3, None, 0).hdr.is_error());
    let device = device_read(&srv.dma, LEN);
    let req = expect_dma_read(&client, LEN);
    let (result, _) = device.join().unwrap();
    assert!(
        matches!(result, Err(DmaError::Timeout { .. })),
        "{result:?}"
    );
    // The answer comes after the device gave up: the server must read it
    // whole and stay in sync, not take it for a stray or drop the client.
    (&client.stream)
        .write_all(&reply_bytes(&req, &pattern(LEN)))
        .unwrap();
    client.assert_in_sync();
    assert_eq!(srv.dma.stats().message.read_bytes, 0);
}

#[test]
fn dma_reads_are_cut_to_64k_and_never_queue_more_than_128k_of_replies() {
    const THREADS: usize = 4;
    const EACH: usize = 256 * 1024;
    let (client, mut srv) = start();
    let memory = Arc::new(pattern(SIZE as usize));
    let devices: Vec<_> = (0..THREADS)
        .map(|t| {
            let dma = srv.dma.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; EACH];
                let gpa = BASE + (t * EACH) as u64;
                dma.read(gpa, &mut buf).map(|()| (gpa, buf))
            })
        })
        .collect();
    // The client collects requests for a while before answering, as a
    // busy QEMU main loop does, and records how many reply bytes the
    // server had asked for at once.
    let outstanding = Arc::new(Mutex::new(Vec::<Msg>::new()));
    let most = AtomicUsize::new(0);
    let mut served = 0usize;
    let total = THREADS * EACH;
    while served < total {
        let req = read_msg(&client.stream).expect("DMA_READ");
        assert_eq!(req.hdr.cmd, cmd::DMA_READ);
        let count = u64_at(&req.payload, 8) as usize;
        assert!(count <= 64 * 1024, "a DMA_READ of {count} bytes");
        let mut pending = outstanding.lock().unwrap();
        pending.push(req);
        let asked: usize = pending.iter().map(|m| u64_at(&m.payload, 8) as usize).sum();
        most.fetch_max(asked, Ordering::SeqCst);
        // Wait for more requests unless the server holds back.
        let more = {
            let mut pfd = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&client.stream),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 50) == 1 }
        };
        if more {
            continue;
        }
        for m in pending.drain(..) {
            let addr = u64_at(&m.payload, 0);
            let count = u64_at(&m.payload, 8) as usize;
            let off = (addr - BASE) as usize;
            (&client.stream)
                .write_all(&reply_bytes(&m, &memory[off..off + count]))
                .unwrap();
            served += count;
        }
    }
    for d in devices {
        let (gpa, buf) = d.join().unwrap().expect("read");
        let off = (gpa - BASE) as usize;
        assert!(buf == memory[off..off + EACH], "data at {gpa:#x}");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= 128 * 1024,
        "{most} bytes of replies asked for at once"
    );
    assert!(most >= 64 * 1024, "requests were serialised: {most}");
    drop(client);
    assert_eq!(srv.join(), ConnectionEnd::ClientClosed);
}
