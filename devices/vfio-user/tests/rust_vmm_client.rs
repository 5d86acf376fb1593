//! Conformance against an independent peer: rust-vmm's `vfio_user::Client`
//! over a real unix socket bound by `Server::bind`.

use crate::common;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use p2plab_vfio_user::vfio_abi::{
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD,
};
use p2plab_vfio_user::{DmaSpace, DmaTarget, EventFd, Server, ServerConfig, SharedMemory};
use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory};

fn socket_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-vfio-user-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn rust_vmm_client_full_flow() {
    let path = socket_path("full-flow.sock");
    // A stale socket file from an earlier run must not stop us.
    let _ = std::os::unix::net::UnixListener::bind(&path);
    assert!(path.exists());

    let dma = DmaSpace::new();
    let device = TestDevice::new(dma.clone());
    let server = Arc::new(Server::new(ServerConfig::new(&path), dma.clone()).unwrap());
    let listener = server.bind().unwrap();
    let shutdown = server.shutdown_handle();
    let mut dev = device.clone();
    let srv = Arc::clone(&server);
    let thread = std::thread::spawn(move || srv.serve(listener, &mut dev));

    // Negotiation, device info and every region's info happen in new().
    let mut client = vfio_user::Client::new(&path).expect("client connects and negotiates");

    // --- region info: BAR2 has an fd and a sparse-mmap area ---
    let bar2 = client.region(BAR2).expect("BAR2 info");
    assert_eq!(bar2.size, BAR2_SIZE);
    assert_eq!(bar2.sparse_areas.len(), 1);
    assert_eq!(bar2.sparse_areas[0].offset, BAR2_MMAP.offset);
    assert_eq!(bar2.sparse_areas[0].size, BAR2_MMAP.size);
    let fo = bar2.file_offset.as_ref().expect("BAR2 fd");
    // mmap it from the client side, as QEMU does, and see the server's
    // memory both ways.
    let client_map: MmapRegion = MmapRegion::from_file(
        FileOffset::new(
            fo.file().try_clone().unwrap(),
            fo.start() + BAR2_MMAP.offset,
        ),
        BAR2_MMAP.size as usize,
    )
    .unwrap();
    device.bar2.write_at(0x2000, b"server wrote").unwrap();
    let mut seen = [0u8; 12];
    client_map.get_slice(0x2000, 12).unwrap().copy_to(&mut seen);
    assert_eq!(&seen, b"server wrote");
    client_map
        .get_slice(0x3000, 12)
        .unwrap()
        .copy_from(b"client wrote");
    let mut back = [0u8; 12];
    device.bar2.read_at(0x3000, &mut back).unwrap();
    assert_eq!(&back, b"client wrote");
    // Regions without fd have no file offset.
    assert!(client.region(BAR0).unwrap().file_offset.is_none());
    assert_eq!(client.region(CONFIG).unwrap().size, 256);

    // --- trapped region access ---
    client.region_write(BAR0, 0x80, b"abcdefgh").unwrap();
    let mut regs = [0u8; 8];
    client.region_read(BAR0, 0x80, &mut regs).unwrap();
    assert_eq!(&regs, b"abcdefgh");
    assert_eq!(&device.state.lock().unwrap().bar0[0x80..0x88], b"abcdefgh");
    let mut cfg = [0u8; 4];
    client.region_read(CONFIG, 0, &mut cfg).unwrap();
    assert_eq!(cfg, [0x86, 0x80, 0x34, 0x12]);

    // --- interrupts ---
    let info = client.get_irq_info(MSIX).unwrap();
    assert_eq!(info.count, MSIX_VECTORS);
    assert_ne!(info.flags & VFIO_IRQ_INFO_EVENTFD, 0);
    let efds: Vec<EventFd> = (0..2).map(|_| EventFd::new(0).unwrap()).collect();
    let raw: Vec<i32> = efds.iter().map(|e| e.as_raw_fd()).collect();
    client
        .set_irqs(
            MSIX,
            VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            2,
            &raw,
        )
        .unwrap();
    // The device fires vector 1 from its side; the client's eventfd sees it.
    assert!(device.fire(1));
    assert_eq!(eventfd_count(&efds[1]), Some(1));
    assert!(device.fire(0));
    assert_eq!(eventfd_count(&efds[0]), Some(1));

    // --- DMA through an fd the client shares ---
    let ram = SharedMemory::new("client-ram", 1 << 20).unwrap();
    ram.write_at(0x100, b"guest data").unwrap();
    client
        .dma_map(0, 0x8000_0000, 1 << 20, ram.fd())
        .expect("dma_map");
    wait_until("DMA map", || dma.mapping_count() == 1);
    assert_eq!(dma.classify(0x8000_0000, 1 << 20), DmaTarget::GuestMemory);
    // A device thread reads and writes guest memory directly.
    let dma2 = dma.clone();
    let from_guest = std::thread::spawn(move || {
        let mut buf = [0u8; 10];
        dma2.read(0x8000_0100, &mut buf).unwrap();
        dma2.write(0x8000_0200, b"device data").unwrap();
        buf
    })
    .join()
    .unwrap();
    assert_eq!(&from_guest, b"guest data");
    let mut written = [0u8; 11];
    ram.read_at(0x200, &mut written).unwrap();
    assert_eq!(&written, b"device data");
    assert_eq!(dma.stats().message.read_ops, 0, "no messages for fd memory");

    // --- reset ---
    client.reset().unwrap();
    assert_eq!(device.resets(), 1);
    // Reset dropped the device's eventfds (our test device's choice).
    assert!(!device.fire(0));

    // --- unmap ---
    client.dma_unmap(0x8000_0000, 1 << 20).unwrap();
    assert_eq!(dma.mapping_count(), 0);
    let mut buf = [0u8; 4];
    assert!(dma.read(0x8000_0100, &mut buf).is_err());

    // --- disconnect: the server resets the device and waits for more ---
    client.shutdown().unwrap();
    drop(client);
    wait_until("reset after disconnect", || device.resets() == 2);
    assert!(!dma.is_connected());

    // A second client can connect to the same server.
    let mut again = vfio_user::Client::new(&path).expect("second client");
    let mut cfg = [0u8; 4];
    again.region_read(CONFIG, 0, &mut cfg).unwrap();
    assert_eq!(cfg, [0x86, 0x80, 0x34, 0x12]);

    shutdown.shutdown();
    thread.join().unwrap().unwrap();
    assert!(!path.exists(), "socket file removed on exit");
}

#[test]
fn exit_on_disconnect_returns_after_the_first_client() {
    let path = socket_path("exit-on-disconnect.sock");
    let dma = DmaSpace::new();
    let mut device = TestDevice::new(dma.clone());
    let mut config = ServerConfig::new(&path);
    config.exit_on_disconnect = true;
    let server = Server::new(config, dma).unwrap();
    let listener = server.bind().unwrap();
    let probe = device.clone();
    let thread = std::thread::spawn(move || server.serve(listener, &mut device));
    let client = vfio_user::Client::new(&path).unwrap();
    drop(client);
    thread.join().unwrap().unwrap();
    assert_eq!(probe.resets(), 1);
}

#[test]
fn shutdown_while_idle_and_refusing_a_non_socket_path() {
    let path = socket_path("idle.sock");
    let dma = DmaSpace::new();
    let mut device = TestDevice::new(dma.clone());
    let server = Server::new(ServerConfig::new(&path), dma.clone()).unwrap();
    let handle = server.shutdown_handle();
    let listener = server.bind().unwrap();
    let thread = std::thread::spawn(move || server.serve(listener, &mut device));
    std::thread::sleep(Duration::from_millis(50));
    handle.shutdown();
    thread.join().unwrap().unwrap();

    // A regular file at the socket path is not removed.
    let file_path = socket_path("not-a-socket");
    std::fs::write(&file_path, b"keep me").unwrap();
    let server = Server::new(ServerConfig::new(&file_path), dma).unwrap();
    assert!(server.bind().is_err());
    assert_eq!(std::fs::read(&file_path).unwrap(), b"keep me");

    // Bad configurations are refused up front.
    let mut bad = ServerConfig::new(&path);
    bad.max_msg_fds = 17;
    assert!(Server::new(bad, DmaSpace::new()).is_err());
    let mut bad = ServerConfig::new(&path);
    bad.max_data_xfer_size = (64 << 20) + 1;
    assert!(Server::new(bad, DmaSpace::new()).is_err());
    let mut bad = ServerConfig::new(&path);
    bad.max_dma_maps = 65536;
    assert!(Server::new(bad, DmaSpace::new()).is_err());
}

#[test]
fn shutdown_during_a_connection_ends_it_and_resets() {
    let path = socket_path("busy.sock");
    let dma = DmaSpace::new();
    let mut device = TestDevice::new(dma.clone());
    let probe = device.clone();
    let server = Server::new(ServerConfig::new(&path), dma.clone()).unwrap();
    let handle = server.shutdown_handle();
    let listener = server.bind().unwrap();
    let thread = std::thread::spawn(move || server.serve(listener, &mut device));
    let mut client = vfio_user::Client::new(&path).unwrap();
    let mut cfg = [0u8; 4];
    client.region_read(CONFIG, 0, &mut cfg).unwrap();
    assert!(dma.is_connected());
    handle.shutdown();
    thread.join().unwrap().unwrap();
    assert!(!dma.is_connected());
    assert_eq!(probe.resets(), 1);
    assert!(client.region_read(CONFIG, 0, &mut cfg).is_err());
    assert!(!path.exists());
}
