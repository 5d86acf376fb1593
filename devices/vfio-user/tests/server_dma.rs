//! Server-initiated DMA (DMA_READ / DMA_WRITE) for ranges mapped without an
//! fd, interleaved with client requests, with a hand-written client that
//! answers from its own buffer on a background thread, as QEMU does.

use crate::common;

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use p2plab_vfio_user::{ConnectionEnd, DmaError, DmaSpace, DmaTarget};

const BASE: u64 = 0xe000_0000;
const SIZE: usize = 256 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Answer,
    Ignore,
    Fail(i32),
}

/// A client whose reader thread serves our DMA requests and hands replies
/// to its own requests back to the caller.
struct DmaClient {
    writer: Arc<Mutex<UnixStream>>,
    replies: Receiver<Msg>,
    next_id: u16,
    memory: Arc<Mutex<Vec<u8>>>,
    dma_reads: Arc<AtomicU64>,
    dma_writes: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl DmaClient {
    fn start(stream: UnixStream, mode: Mode) -> Self {
        let reader = stream.try_clone().unwrap();
        reader.set_read_timeout(None).unwrap();
        let writer = Arc::new(Mutex::new(stream));
        let memory = Arc::new(Mutex::new(vec![0u8; SIZE]));
        let dma_reads = Arc::new(AtomicU64::new(0));
        let dma_writes = Arc::new(AtomicU64::new(0));
        let (tx, replies) = mpsc::channel();
        let thread = {
            let (writer, memory) = (Arc::clone(&writer), Arc::clone(&memory));
            let (reads, writes) = (Arc::clone(&dma_reads), Arc::clone(&dma_writes));
            std::thread::spawn(move || {
                while let Ok(m) = read_msg(&reader) {
                    if m.hdr.flags & 0xf == REPLY {
                        let _ = tx.send(m);
                        continue;
                    }
                    let addr = u64_at(&m.payload, 0);
                    let count = u64_at(&m.payload, 8) as usize;
                    let off = (addr - BASE) as usize;
                    let reply = match (m.hdr.cmd, mode) {
                        (_, Mode::Ignore) => {
                            if m.hdr.cmd == cmd::DMA_READ {
                                reads.fetch_add(1, Ordering::SeqCst);
                            }
                            continue;
                        }
                        (_, Mode::Fail(errno)) => Hdr {
                            id: m.hdr.id,
                            cmd: m.hdr.cmd,
                            size: HDR as u32,
                            flags: REPLY | ERROR,
                            error: errno as u32,
                        }
                        .encode()
                        .to_vec(),
                        (cmd::DMA_READ, Mode::Answer) => {
                            reads.fetch_add(1, Ordering::SeqCst);
                            assert!(count <= 4096, "chunked to the client's limit");
                            let mem = memory.lock().unwrap();
                            let mut out = Hdr {
                                id: m.hdr.id,
                                cmd: m.hdr.cmd,
                                size: (HDR + 16 + count) as u32,
                                flags: REPLY,
                                error: 0,
                            }
                            .encode()
                            .to_vec();
                            out.extend_from_slice(&m.payload[..16]);
                            out.extend_from_slice(&mem[off..off + count]);
                            out
                        }
                        (cmd::DMA_WRITE, Mode::Answer) => {
                            writes.fetch_add(1, Ordering::SeqCst);
                            assert!(count <= 4096, "chunked to the client's limit");
                            assert_eq!(m.payload.len(), 16 + count);
                            memory.lock().unwrap()[off..off + count]
                                .copy_from_slice(&m.payload[16..]);
                            // QEMU answers DMA_WRITE with a bare header.
                            Hdr {
                                id: m.hdr.id,
                                cmd: m.hdr.cmd,
                                size: HDR as u32,
                                flags: REPLY,
                                error: 0,
                            }
                            .encode()
                            .to_vec()
                        }
                        (other, _) => panic!("unexpected server command {other}"),
                    };
                    send_with_fds(&writer.lock().unwrap(), &reply, &[]);
                }
            })
        };
        DmaClient {
            writer,
            replies,
            next_id: 0,
            memory,
            dma_reads,
            dma_writes,
            thread: Some(thread),
        }
    }

    fn call(&mut self, command: u16, payload: &[u8]) -> Msg {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let mut bytes = Hdr {
            id,
            cmd: command,
            size: (HDR + payload.len()) as u32,
            flags: 0,
            error: 0,
        }
        .encode()
        .to_vec();
        bytes.extend_from_slice(payload);
        send_with_fds(&self.writer.lock().unwrap(), &bytes, &[]);
        let m = self
            .replies
            .recv_timeout(Duration::from_secs(10))
            .expect("client request answered while DMA is in flight");
        assert_eq!((m.hdr.id, m.hdr.cmd), (id, command));
        m
    }

    fn negotiate_and_map(&mut self) {
        let mut json = br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":4096}}"#.to_vec();
        json.push(0);
        let m = self.call(cmd::VERSION, &Buf::default().u16(0).u16(0).bytes(&json).0);
        assert!(!m.hdr.is_error());
        let map = Buf::default()
            .u32(32)
            .u32(3)
            .u64(0)
            .u64(BASE)
            .u64(SIZE as u64)
            .0;
        assert!(!self.call(cmd::DMA_MAP, &map).hdr.is_error());
    }

    fn read_config(&mut self) {
        let p = Buf::default().u64(0).u32(CONFIG).u32(4).0;
        let m = self.call(cmd::REGION_READ, &p);
        assert!(!m.hdr.is_error());
        assert_eq!(&m.payload[16..], &[0x86, 0x80, 0x34, 0x12]);
    }

    fn disconnect(&mut self) {
        let _ = self
            .writer
            .lock()
            .unwrap()
            .shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn start(mode: Mode, dma: DmaSpace) -> (DmaClient, PairServer) {
    let (raw, srv) = serve_pair_with(config(), dma);
    let mut client = DmaClient::start(raw.stream, mode);
    client.negotiate_and_map();
    (client, srv)
}

#[test]
fn device_dma_interleaves_with_client_requests() {
    let (mut client, mut srv) = start(Mode::Answer, DmaSpace::new());
    assert_eq!(srv.dma.classify(BASE, SIZE as u64), DmaTarget::MessageOnly);

    let pattern: Vec<u8> = (0..100 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let dma = srv.dma.clone();
    let expected = pattern.clone();
    let device_thread = std::thread::spawn(move || {
        dma.write(BASE + 123, &pattern).unwrap();
        let mut back = vec![0u8; pattern.len()];
        dma.read(BASE + 123, &mut back).unwrap();
        // Scatter-gather across the fd-less range.
        let mut sg = [0u8; 6];
        dma.read_sg(&[(BASE + 123, 3), (BASE + 123 + 4096, 3)], &mut sg)
            .unwrap();
        (back, sg)
    });
    // Client requests keep being answered while the device thread's DMA
    // is in flight.
    let mut answered = 0;
    while !device_thread.is_finished() || answered < 50 {
        client.read_config();
        answered += 1;
    }
    let (back, sg) = device_thread.join().unwrap();
    assert_eq!(back, expected);
    assert_eq!(&sg[..3], &expected[..3]);
    assert_eq!(&sg[3..], &expected[4096..4099]);
    assert_eq!(
        &client.memory.lock().unwrap()[123..123 + expected.len()],
        &expected[..]
    );
    // 100 KiB in chunks of the client's 4 KiB limit.
    assert_eq!(client.dma_writes.load(Ordering::SeqCst), 25);
    assert_eq!(client.dma_reads.load(Ordering::SeqCst), 25 + 2);
    let stats = srv.dma.stats();
    assert_eq!(stats.message.write_bytes, expected.len() as u64);
    assert_eq!(stats.message.read_bytes, expected.len() as u64 + 6);
    assert_eq!(stats.mmap.read_bytes + stats.local.read_bytes, 0);

    client.disconnect();
    assert_eq!(srv.join(), ConnectionEnd::ClientClosed);
}

#[test]
fn dma_from_the_reader_thread_is_refused_instead_of_deadlocking() {
    let (mut client, srv) = start(Mode::Answer, DmaSpace::new());
    let p = Buf::default()
        .u64(REG_DMA_FROM_HANDLER)
        .u32(BAR0)
        .u32(8)
        .u64(BASE)
        .0;
    let m = client.call(cmd::REGION_WRITE, &p);
    assert!(m.hdr.is_error());
    assert_eq!(m.hdr.error, libc::EIO as u32);
    assert_eq!(
        srv.device.state.lock().unwrap().log.handler_dma,
        Some(Err(DmaError::WouldDeadlock))
    );
    assert_eq!(client.dma_reads.load(Ordering::SeqCst), 0);
    client.read_config();
}

#[test]
fn an_unanswered_dma_times_out_without_blocking_the_client() {
    let dma = DmaSpace::with_timeout(Duration::from_millis(300));
    let (mut client, srv) = start(Mode::Ignore, dma);
    let dma = srv.dma.clone();
    let t0 = Instant::now();
    let device_thread = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        dma.read(BASE, &mut buf)
    });
    client.read_config();
    let result = device_thread.join().unwrap();
    let waited = t0.elapsed();
    assert!(
        matches!(result, Err(DmaError::Timeout { .. })),
        "{result:?}"
    );
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(client.dma_reads.load(Ordering::SeqCst), 1);
    // The connection is still fine.
    client.read_config();
}

#[test]
fn a_client_error_reply_reaches_the_device() {
    let (_client, srv) = start(Mode::Fail(libc::EFAULT), DmaSpace::new());
    let dma = srv.dma.clone();
    let result = std::thread::spawn(move || dma.write(BASE, &[1, 2, 3]))
        .join()
        .unwrap();
    assert_eq!(
        result,
        Err(DmaError::Remote {
            errno: libc::EFAULT
        })
    );
}

#[test]
fn connection_drop_fails_pending_dma_promptly() {
    // Long timeout: only the disconnect can end the wait quickly.
    let dma = DmaSpace::with_timeout(Duration::from_secs(60));
    let (mut client, mut srv) = start(Mode::Ignore, dma);
    let dma = srv.dma.clone();
    let t0 = Instant::now();
    let device_thread = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        dma.read(BASE, &mut buf)
    });
    while client.dma_reads.load(Ordering::SeqCst) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "request never sent");
        std::thread::sleep(Duration::from_millis(5));
    }
    client.disconnect();
    let result = device_thread.join().unwrap();
    assert_eq!(result, Err(DmaError::Disconnected));
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(srv.join(), ConnectionEnd::ClientClosed);
    // The client's ranges are gone with it.
    let mut buf = [0u8; 4];
    assert!(matches!(
        srv.dma.read(BASE, &mut buf),
        Err(DmaError::Unmapped { .. })
    ));
    assert!(!srv.dma.is_connected());
}
