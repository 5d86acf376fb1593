//! No device DMA after the reply: once the server answers DMA_UNMAP or
//! DEVICE_RESET, or has handled a disconnect, nothing the device started
//! touches that memory any more. Each test has a device thread busy
//! DMAing when the client acts, then hands the memory back to the client
//! (a canary pattern, and a new canary region mapped at the same IOVA)
//! and checks that no byte of it changes.

use crate::common;

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use p2plab_vfio_user::{
    Access, ConnectionEnd, Device, DeviceError, DeviceInfo, DmaError, DmaSpace, IrqInfo, IrqSet,
    RegionInfo, Server,
};

const GPA: u64 = 0x4000_0000;
const LEN: usize = 256 * 1024;
const PAGE: usize = 4096;
const WORKER_BYTE: u8 = 0xaa;

/// Guest RAM as QEMU shares it: a sealed memfd.
fn ram(len: usize) -> File {
    // SAFETY: memfd_create reads a valid NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"guest-ram".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    // SAFETY: `raw` was just created and nothing else owns it.
    let file = unsafe { File::from_raw_fd(raw) };
    file.set_len(len as u64).unwrap();
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    // SAFETY: F_ADD_SEALS on our own memfd.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    assert_eq!(rc, 0);
    file
}

fn fill(file: &File, byte: u8) {
    file.write_all_at(&vec![byte; LEN], 0).unwrap();
}

/// Which bytes of `file` differ from `byte` (first offset and count).
fn changed(file: &File, byte: u8) -> Option<(usize, usize)> {
    let mut buf = vec![0u8; LEN];
    file.read_exact_at(&mut buf, 0).unwrap();
    let bad: Vec<usize> = (0..LEN).filter(|&i| buf[i] != byte).collect();
    bad.first().map(|&first| (first, bad.len()))
}

/// A device thread in the middle of a long DMA: one zero-copy access over
/// the whole range, writing it a page at a time, as a device streaming a
/// read from disk into guest memory does. Returns once the access has
/// begun.
fn slow_dma_write(dma: &DmaSpace) -> JoinHandle<Result<(), DmaError>> {
    let (started_tx, started) = mpsc::channel();
    let dma = dma.clone();
    let worker = std::thread::spawn(move || {
        dma.with_slice(GPA, LEN, Access::Write, |slice| {
            started_tx.send(()).unwrap();
            for page in (0..LEN).step_by(PAGE) {
                std::thread::sleep(Duration::from_millis(2));
                slice
                    .subslice(page, PAGE)
                    .unwrap()
                    .copy_from(&[WORKER_BYTE; PAGE]);
            }
        })
    });
    started.recv().unwrap();
    worker
}

fn unmap(gpa: u64, size: u64) -> Vec<u8> {
    Buf::default().u32(24).u32(0).u64(gpa).u64(size).0
}

/// Catches a DMA_UNMAP answered while the device still writes the range:
/// the client reuses the memory at once (here: fills it with a canary and
/// maps a fresh canary region at the same IOVA), and the device's late
/// writes corrupt it.
#[test]
fn no_dma_lands_after_the_unmap_reply() {
    let (mut c, srv) = serve_pair();
    c.negotiate();
    let old = ram(LEN);
    assert!(!c
        .dma_map(GPA, LEN as u64, 3, Some(old.as_raw_fd()), 0)
        .hdr
        .is_error());
    let worker = slow_dma_write(&srv.dma);

    let m = c.call(cmd::DMA_UNMAP, &unmap(GPA, LEN as u64));
    assert!(!m.hdr.is_error(), "{m:?}");
    // The memory is the client's again.
    fill(&old, 0xc1);
    let canary = ram(LEN);
    fill(&canary, 0xc2);
    assert!(!c
        .dma_map(GPA, LEN as u64, 3, Some(canary.as_raw_fd()), 0)
        .hdr
        .is_error());

    worker.join().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        changed(&old, 0xc1),
        None,
        "device wrote after the unmap reply"
    );
    assert_eq!(changed(&canary, 0xc2), None, "device wrote the new region");
    c.assert_in_sync();
}

/// Catches a disconnect whose handling ends (and the next client is
/// served) while a device DMA into the old client's memory still runs.
#[test]
fn no_dma_lands_after_a_disconnect_is_handled() {
    let dma = DmaSpace::new();
    let server = Arc::new(Server::new(config(), dma.clone()).unwrap());
    let mut device = TestDevice::new(dma.clone());
    let (first, first_end) = UnixStream::pair().unwrap();
    let (second, second_end) = UnixStream::pair().unwrap();
    // The accept loop's order: one client after the other.
    let serving = {
        let server = Arc::clone(&server);
        std::thread::spawn(move || {
            let a = server.serve_stream(first_end, &mut device);
            let b = server.serve_stream(second_end, &mut device);
            (a, b)
        })
    };
    let mut c = RawClient::new(first);
    c.negotiate();
    let old = ram(LEN);
    assert!(!c
        .dma_map(GPA, LEN as u64, 3, Some(old.as_raw_fd()), 0)
        .hdr
        .is_error());
    let worker = slow_dma_write(&dma);
    drop(c);

    // The next client being served proves the disconnect was handled.
    let mut next = RawClient::new(second);
    next.negotiate();
    fill(&old, 0xc1);
    let canary = ram(LEN);
    fill(&canary, 0xc2);
    assert!(!next
        .dma_map(GPA, LEN as u64, 3, Some(canary.as_raw_fd()), 0)
        .hdr
        .is_error());
    worker.join().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        changed(&old, 0xc1),
        None,
        "device wrote the old client's memory after the disconnect"
    );
    assert_eq!(changed(&canary, 0xc2), None);
    drop(next);
    let (a, b) = serving.join().unwrap();
    assert_eq!(
        (a, b),
        (ConnectionEnd::ClientClosed, ConnectionEnd::ClientClosed)
    );
}

// ----- reset: a device that keeps the Device::reset contract -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    Idle,
    /// Write the range over and over (zero-copy, page by page).
    Stream,
    /// Write 8 bytes at `gpa` over and over (message DMA if fd-less).
    Poke(u64),
}

#[derive(Default)]
struct WorkerState {
    job: Option<Job>,
    busy: bool,
}

/// TestDevice plus one DMA worker thread. `reset` stops the worker and
/// returns only once it is idle: the contract `Device::reset` documents.
struct QuiescingDevice {
    inner: TestDevice,
    worker: Arc<(Mutex<WorkerState>, Condvar)>,
    dma_errors: Arc<Mutex<Vec<DmaError>>>,
}

impl QuiescingDevice {
    fn new(dma: DmaSpace) -> Self {
        let worker = Arc::new((Mutex::new(WorkerState::default()), Condvar::new()));
        let dma_errors = Arc::new(Mutex::new(Vec::new()));
        {
            let (worker, errors, dma) = (Arc::clone(&worker), Arc::clone(&dma_errors), dma.clone());
            std::thread::spawn(move || loop {
                let job = {
                    let (lock, cv) = &*worker;
                    let mut st = lock.lock().unwrap();
                    st.busy = false;
                    cv.notify_all();
                    while matches!(st.job, None | Some(Job::Idle)) {
                        st = cv.wait(st).unwrap();
                    }
                    st.busy = true;
                    cv.notify_all();
                    st.job.unwrap()
                };
                let result = match job {
                    Job::Stream => dma
                        .with_slice(GPA, LEN, Access::Write, |slice| {
                            for page in (0..LEN).step_by(PAGE) {
                                std::thread::sleep(Duration::from_millis(1));
                                slice
                                    .subslice(page, PAGE)
                                    .unwrap()
                                    .copy_from(&[WORKER_BYTE; PAGE]);
                            }
                        })
                        .map(|_| ()),
                    Job::Poke(gpa) => dma.write(gpa, &[WORKER_BYTE; 8]),
                    Job::Idle => Ok(()),
                };
                if let Err(e) = result {
                    errors.lock().unwrap().push(e);
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        }
        QuiescingDevice {
            inner: TestDevice::new(dma),
            worker,
            dma_errors,
        }
    }
}

impl Device for QuiescingDevice {
    fn device_info(&self) -> DeviceInfo {
        self.inner.device_info()
    }
    fn region_info(&self, index: u32) -> Result<RegionInfo, DeviceError> {
        self.inner.region_info(index)
    }
    fn irq_info(&self, index: u32) -> Result<IrqInfo, DeviceError> {
        self.inner.irq_info(index)
    }
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.region_read(index, offset, data)
    }
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.inner.region_write(index, offset, data)
    }
    fn set_irqs(&mut self, request: IrqSet) -> Result<(), DeviceError> {
        self.inner.set_irqs(request)
    }
    /// Stops the worker and waits until it is idle (its DMA finished or
    /// failed): only then is the device quiesced.
    fn reset(&mut self) -> Result<(), DeviceError> {
        let (lock, cv) = &*self.worker;
        let mut st = lock.lock().unwrap();
        st.job = Some(Job::Idle);
        while st.busy {
            st = cv.wait(st).unwrap();
        }
        drop(st);
        self.inner.reset()
    }
}

/// Serves a QuiescingDevice on a socketpair; the client's reader thread
/// routes replies and leaves the server's DMA requests unanswered (as QEMU
/// does while it waits for our reply to its own request).
struct Rig {
    stream: UnixStream,
    replies: Receiver<Msg>,
    dma_requests: Arc<AtomicU64>,
    next_id: u16,
    worker: Arc<(Mutex<WorkerState>, Condvar)>,
    dma_errors: Arc<Mutex<Vec<DmaError>>>,
}

impl Rig {
    fn start(dma_timeout: Duration) -> (Rig, QuiescingDeviceHandle) {
        let dma = DmaSpace::with_timeout(dma_timeout);
        let device = QuiescingDevice::new(dma.clone());
        let handle = QuiescingDeviceHandle {
            worker: Arc::clone(&device.worker),
        };
        let (worker, dma_errors) = (Arc::clone(&device.worker), Arc::clone(&device.dma_errors));
        let (client, server_end) = UnixStream::pair().unwrap();
        let server = Server::new(config(), dma).unwrap();
        std::thread::spawn(move || {
            let mut device = device;
            server.serve_stream(server_end, &mut device)
        });
        let reader = client.try_clone().unwrap();
        let (tx, replies) = mpsc::channel();
        let dma_requests = Arc::new(AtomicU64::new(0));
        {
            let counter = Arc::clone(&dma_requests);
            std::thread::spawn(move || {
                while let Ok(m) = read_msg(&reader) {
                    if m.hdr.flags & 0xf == REPLY {
                        let _ = tx.send(m);
                    } else {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
        let mut rig = Rig {
            stream: client,
            replies,
            dma_requests,
            next_id: 0,
            worker,
            dma_errors,
        };
        let mut json =
            br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576}}"#.to_vec();
        json.push(0);
        assert!(!rig
            .call(
                cmd::VERSION,
                &Buf::default().u16(0).u16(0).bytes(&json).0,
                &[]
            )
            .hdr
            .is_error());
        (rig, handle)
    }

    fn call(&mut self, command: u16, payload: &[u8], fds: &[i32]) -> Msg {
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
        send_with_fds(&self.stream, &bytes, fds);
        let m = self
            .replies
            .recv_timeout(Duration::from_secs(30))
            .expect("reply");
        assert_eq!((m.hdr.id, m.hdr.cmd), (id, command));
        m
    }

    fn map(&mut self, gpa: u64, size: u64, fd: Option<i32>) {
        let p = Buf::default().u32(32).u32(3).u64(0).u64(gpa).u64(size).0;
        let fds: Vec<i32> = fd.into_iter().collect();
        assert!(!self.call(cmd::DMA_MAP, &p, &fds).hdr.is_error());
    }
}

struct QuiescingDeviceHandle {
    worker: Arc<(Mutex<WorkerState>, Condvar)>,
}

impl QuiescingDeviceHandle {
    fn start(&self, job: Job) {
        let (lock, cv) = &*self.worker;
        lock.lock().unwrap().job = Some(job);
        cv.notify_all();
    }
    fn wait_busy(&self) {
        let (lock, cv) = &*self.worker;
        let mut st = lock.lock().unwrap();
        while !st.busy {
            st = cv.wait(st).unwrap();
        }
    }
}

/// Catches a DEVICE_RESET that deadlocks with a device thread waiting for
/// a DMA_READ/DMA_WRITE reply: the device's reset waits for its worker,
/// the worker waits for a reply the blocked reader thread would route,
/// and the client (like QEMU) answers nothing until the reset is answered.
/// The transport must fail such DMA first; the reply comes at once.
#[test]
fn reset_fails_message_dma_in_flight_instead_of_deadlocking() {
    let (mut rig, device) = Rig::start(Duration::from_secs(60));
    let peer_bar = 0xe000_0000;
    rig.map(peer_bar, 0x1000, None);
    device.start(Job::Poke(peer_bar));
    device.wait_busy();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.dma_requests.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the worker sent no DMA_WRITE");
        std::thread::sleep(Duration::from_millis(5));
    }
    let t0 = Instant::now();
    let m = rig.call(cmd::DEVICE_RESET, &[], &[]);
    let took = t0.elapsed();
    assert!(!m.hdr.is_error(), "{m:?}");
    assert!(
        took < Duration::from_secs(5),
        "reset waited {took:?} for a DMA reply"
    );
    let errors = rig.dma_errors.lock().unwrap().clone();
    assert!(
        matches!(errors.first(), Some(DmaError::Revoked { gpa, .. }) if *gpa == peer_bar),
        "{errors:?}"
    );
    // Once reset, the device is quiet: no more DMA requests arrive.
    let sent = rig.dma_requests.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(rig.dma_requests.load(Ordering::SeqCst), sent);
    let worker = rig.worker.0.lock().unwrap();
    assert!(!worker.busy);
}

/// Catches a device DMA landing after the DEVICE_RESET reply: the range
/// stays mapped, so the client checks its memory directly (it fills it
/// with a canary after the reply; nothing may change it).
#[test]
fn no_dma_lands_after_the_reset_reply() {
    let (mut rig, device) = Rig::start(Duration::from_secs(10));
    let mem = ram(LEN);
    rig.map(GPA, LEN as u64, Some(mem.as_fd().as_raw_fd()));
    device.start(Job::Stream);
    device.wait_busy();
    let m = rig.call(cmd::DEVICE_RESET, &[], &[]);
    assert!(!m.hdr.is_error());
    fill(&mem, 0xc3);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        changed(&mem, 0xc3),
        None,
        "device wrote after the reset reply"
    );
    // And the range is usable again: a new canary region at the same IOVA
    // after an unmap stays untouched too.
    assert!(!rig
        .call(cmd::DMA_UNMAP, &unmap(GPA, LEN as u64), &[])
        .hdr
        .is_error());
    let canary = ram(LEN);
    fill(&canary, 0xc4);
    rig.map(GPA, LEN as u64, Some(canary.as_raw_fd()));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(changed(&canary, 0xc4), None);
}

/// Catches an unmap of a message-only range (a peer BAR) that leaves a
/// device thread waiting for the DMA reply until its timeout: the wait
/// must fail at once with Revoked.
#[test]
fn unmap_fails_message_dma_waiting_on_that_range() {
    let (mut rig, device) = Rig::start(Duration::from_secs(60));
    let peer_bar = 0xe000_0000;
    rig.map(peer_bar, 0x1000, None);
    device.start(Job::Poke(peer_bar));
    device.wait_busy();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.dma_requests.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the worker sent no DMA_WRITE");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!rig
        .call(cmd::DMA_UNMAP, &unmap(peer_bar, 0x1000), &[])
        .hdr
        .is_error());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let errors = rig.dma_errors.lock().unwrap().clone();
        if let Some(first) = errors.first() {
            assert!(
                matches!(first, DmaError::Revoked { gpa, .. } if *gpa == peer_bar),
                "{errors:?}"
            );
            // Later attempts find nothing mapped there.
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the DMA still waits for its reply after the unmap"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    device.start(Job::Idle);
}
