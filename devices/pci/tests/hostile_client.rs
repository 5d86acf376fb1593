//! A PCI function served over a real socket to rust-vmm's independent
//! vfio-user client, which binds an interrupt eventfd whose counter it
//! filled to the maximum and leaves blocking. Signalling it must never
//! block the device, and the next client must still be served.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use p2plab_pci::{
    BarSpec, ConfigSpaceBuilder, Delivery, InterruptController, MsixCapSpec, PciFunction, PciModel,
};
use p2plab_vfio_user::vfio_abi::{
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX,
};
use p2plab_vfio_user::{DeviceError, DmaSpace, EventFd, Server, ServerConfig};

/// Registers only; interrupts come from the test through the controller.
struct Quiet;

impl PciModel for Quiet {
    fn bar_read(&mut self, _bar: u8, _offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        data.fill(0);
        Ok(())
    }
    fn bar_write(&mut self, _bar: u8, _offset: u64, _data: &[u8]) -> Result<(), DeviceError> {
        Ok(())
    }
    fn reset(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
}

/// Runs `f` on a thread; `None` if it did not finish within `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

fn socket_path() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-pci-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("dev.sock")
}

fn wait_for(path: &Path) {
    for _ in 0..500 {
        if path.exists() {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("{} never appeared", path.display());
}

/// Catches interrupt delivery that blocks on a client's fd: the device
/// thread signalling a full blocking eventfd hung for good while holding
/// the interrupt lock, so the reset on disconnect hung too, and the next
/// client was never served.
#[test]
fn a_full_eventfd_neither_wedges_the_device_nor_the_next_client() {
    let config = ConfigSpaceBuilder::new(0x1234, 0x0001)
        .bar(0, BarSpec::memory64(0x4000))
        .msix(MsixCapSpec {
            vectors: 2,
            table_bar: 0,
            table_offset: 0x2000,
            pba_bar: 0,
            pba_offset: 0x3000,
        })
        .build()
        .unwrap();
    let msix_cap = config.capability_offset(0x11).unwrap() as u64;
    let mut function = PciFunction::new(config, |_| Quiet);
    let irq: Arc<InterruptController> = Arc::clone(function.irq());
    let path = socket_path();
    let server = Server::new(ServerConfig::new(&path), DmaSpace::new()).unwrap();
    let stop = server.shutdown_handle();
    let serving = thread::spawn(move || server.run(&mut function));
    wait_for(&path);

    let mut client = vfio_user::Client::new(&path).unwrap();
    client
        .region_write(
            VFIO_PCI_CONFIG_REGION_INDEX,
            msix_cap + 2,
            &0x8000u16.to_le_bytes(),
        )
        .unwrap();
    let full = EventFd::new(0).unwrap();
    full.write(u64::MAX - 1).unwrap();
    client
        .set_irqs(
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            1,
            &[full.as_raw_fd()],
        )
        .unwrap();
    assert!(irq.msix_enabled());

    // A device thread raises the vector.
    let worker_irq = Arc::clone(&irq);
    let delivered = within(5, move || worker_irq.notify(0))
        .expect("the device thread blocked on the full eventfd");
    assert_eq!(delivered, Delivery::Dropped);
    // The reader thread fires it too (loopback trigger): still answered.
    let client = within(5, move || {
        client
            .set_irqs(
                VFIO_PCI_MSIX_IRQ_INDEX,
                VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                0,
                1,
                &[],
            )
            .unwrap();
        client
    })
    .expect("the reader thread blocked on the full eventfd");
    assert_eq!(irq.dropped_signals(), 2);
    drop(client);

    // The next client is served: the disconnect's reset got the lock.
    let path2 = path.clone();
    let next = within(10, move || vfio_user::Client::new(&path2).unwrap())
        .expect("the next client was not served");
    assert!(!irq.msix_enabled(), "the disconnect reset the function");
    drop(next);
    stop.shutdown();
    serving.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
