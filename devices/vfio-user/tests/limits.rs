//! Every resource a client can make us spend is bounded, and hitting a
//! bound gives a clear error: fd-backed DMA ranges (count and bytes), our
//! DMA requests waiting for replies, the client's transfer size, and log
//! lines. (DMA range count, fds per message and message sizes are covered
//! in malformed.rs.)

use crate::common;

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use p2plab_vfio_user::{DmaError, DmaSpace, Server, SharedMemory};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Catches a server that maps fd-backed ranges without bound: each keeps
/// an fd open and memory mapped. Message-only ranges stay available.
#[test]
fn fd_backed_ranges_are_bounded_in_count_and_bytes() {
    let mut cfg = config();
    cfg.max_fd_dma_maps = 2;
    cfg.max_dma_mapped_bytes = 3 << 20;
    let (mut c, srv) = serve_pair_with(cfg, DmaSpace::new());
    c.negotiate();
    let ram = SharedMemory::new("ram", 4 << 20).unwrap();
    let map = |c: &mut RawClient, gpa: u64, size: u64, fd: bool| {
        c.dma_map(gpa, size, 3, fd.then(|| ram.fd()), 0).hdr
    };
    assert!(!map(&mut c, 0, 2 << 20, true).is_error());
    // 2 MiB + 2 MiB would pass max_dma_mapped_bytes (3 MiB).
    let h = map(&mut c, 0x1000_0000, 2 << 20, true);
    assert_eq!((h.is_error(), h.error), (true, libc::ENOSPC as u32));
    assert!(!map(&mut c, 0x1000_0000, 1 << 20, true).is_error());
    // A third fd-backed range passes max_fd_dma_maps (2).
    let h = map(&mut c, 0x2000_0000, 4096, true);
    assert_eq!((h.is_error(), h.error), (true, libc::ENOSPC as u32));
    // Without an fd it costs nothing here and is still fine.
    assert!(!map(&mut c, 0x2000_0000, 1 << 30, false).is_error());
    assert_eq!(srv.dma.fd_mapping_count(), 2);
    assert_eq!(srv.dma.fd_mapped_bytes(), 3 << 20);
    c.assert_in_sync();
}

/// Catches a client announcing a tiny max_data_xfer_size: our DMA messages
/// are cut to it, so 1 byte would turn a 1 MiB DMA into a million round
/// trips.
#[test]
fn a_client_transfer_size_below_a_page_is_refused() {
    let (mut c, _srv) = serve_pair();
    let mut json = br#"{"capabilities":{"max_data_xfer_size":1}}"#.to_vec();
    json.push(0);
    let p = Buf::default().u16(0).u16(0).bytes(&json).0;
    assert_eq!(c.call_err(cmd::VERSION, &p), libc::EINVAL as u32);
    c.negotiate_with(r#"{"capabilities":{"max_data_xfer_size":4096}}"#);
    c.assert_in_sync();
}

/// Catches an unbounded table of our DMA requests waiting for replies: a
/// client that never answers while device threads keep asking. Past the
/// bound a request fails at once with Busy.
#[test]
fn dma_requests_waiting_for_replies_are_bounded() {
    const THREADS: usize = 300;
    let dma = DmaSpace::with_timeout(Duration::from_secs(3));
    let (client, mut srv) = serve_pair_with(config(), dma);
    let mut c = client;
    c.negotiate();
    assert!(!c.dma_map(0xe000_0000, 0x1000, 3, None, 0).hdr.is_error());
    // From here on the client reads but never answers.
    let reader = c.stream.try_clone().unwrap();
    reader.set_read_timeout(None).unwrap();
    let requests = Arc::new(AtomicU64::new(0));
    {
        let requests = Arc::clone(&requests);
        std::thread::spawn(move || {
            while let Ok(m) = read_msg(&reader) {
                if m.hdr.flags & 0xf != REPLY {
                    requests.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let dma = srv.dma.clone();
            std::thread::spawn(move || dma.write(0xe000_0000, &[1; 8]))
        })
        .collect();
    let results: Vec<Result<(), DmaError>> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    let busy = results
        .iter()
        .filter(|r| matches!(r, Err(DmaError::Busy)))
        .count();
    let timed_out = results
        .iter()
        .filter(|r| matches!(r, Err(DmaError::Timeout { .. })))
        .count();
    assert_eq!(busy + timed_out, THREADS, "{results:?}");
    assert_eq!(timed_out, 256, "requests waiting at once");
    assert_eq!(requests.load(Ordering::SeqCst), 256);
    // The reader thread holds a clone: shut the socket, not just drop it.
    c.stream.shutdown(std::net::Shutdown::Both).unwrap();
    srv.join();
}

/// Counts WARN events and records their `suppressed` fields.
#[derive(Clone, Default)]
struct WarnCounter {
    warnings: Arc<AtomicU64>,
    suppressed: Arc<Mutex<Vec<u64>>>,
}

struct SuppressedField(Option<u64>);

impl Visit for SuppressedField {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "suppressed" {
            self.0 = Some(value);
        }
    }
    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> Layer<S> for WarnCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        self.warnings.fetch_add(1, Ordering::SeqCst);
        let mut field = SuppressedField(None);
        event.record(&mut field);
        if let Some(n) = field.0 {
            self.suppressed.lock().unwrap().push(n);
        }
    }
}

/// Catches a log that a client can flood: thousands of bad posted writes
/// (which get no reply, only a warning) must give a few lines, the later
/// ones saying how many were suppressed.
#[test]
fn a_flood_of_bad_requests_does_not_flood_the_log() {
    const FLOOD: usize = 5000;
    let counter = WarnCounter::default();
    let subscriber = tracing_subscriber::registry().with(counter.clone());
    let (client, server_end) = UnixStream::pair().unwrap();
    let dma = DmaSpace::new();
    let mut device = TestDevice::new(dma.clone());
    let server = Server::new(config(), dma).unwrap();
    let serving = std::thread::spawn(move || {
        tracing::subscriber::with_default(subscriber, || {
            server.serve_stream(server_end, &mut device)
        })
    });
    let mut c = RawClient::new(client);
    c.negotiate();
    let start = std::time::Instant::now();
    let bad = Buf::default().u64(0).u32(77).u32(1).bytes(b"x").0;
    for _ in 0..FLOOD {
        c.send(cmd::REGION_WRITE, NO_REPLY, &bad, &[]);
    }
    // Let a refill happen, then one more bad write reports the rest.
    std::thread::sleep(Duration::from_millis(1100));
    c.send(cmd::REGION_WRITE, NO_REPLY, &bad, &[]);
    c.assert_in_sync();
    let elapsed = start.elapsed().as_secs() + 1;
    drop(c);
    serving.join().unwrap();

    let warnings = counter.warnings.load(Ordering::SeqCst);
    let most = u64::from(p2plab_ratelimit::BURST) + elapsed;
    assert!(
        warnings <= most,
        "{warnings} warnings for {FLOOD} bad requests (at most {most})"
    );
    assert!(warnings >= 2, "the first ones are logged");
    let suppressed: u64 = counter.suppressed.lock().unwrap().iter().sum();
    assert!(
        suppressed + warnings >= FLOOD as u64,
        "suppressed {suppressed} + logged {warnings} < {FLOOD}: some went unaccounted"
    );
}
