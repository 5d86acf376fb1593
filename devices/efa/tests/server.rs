//! The EFA through the vfio-user server, without QEMU: rust-vmm's
//! independent `vfio_user::Client` plays QEMU (maps BAR2 from its fd,
//! shares guest RAM as a memfd, binds the management vector's eventfd)
//! and the test plays the driver: a readless read whose answer must be in
//! guest RAM when the trapped register write returns, and an admin
//! command completed with an interrupt.

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use p2plab_efa::pci::{config_space, MSIX_BAR};
use p2plab_efa::regs::{reg, LLQ_BAR, REGS_BAR};
use p2plab_efa::{efa_function, DeviceAttrs, EfaOptions, NoLink, DEFAULT_IDS};
use p2plab_kit::testing::wait_until;
use p2plab_vfio_user::vfio_abi::{
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use p2plab_vfio_user::{DmaSpace, EventFd, Server, ServerConfig, SharedMemory};

const RAM_GPA: u64 = 0x4000_0000;
const RAM_SIZE: u64 = 4 << 20;
const RESP: u64 = 0x1000;
const AQ: u64 = 0x2000;
const ACQ: u64 = 0x3000;
const COMMAND: u64 = 0x04;
const CAP_ID_MSIX: u8 = 0x11;

fn socket_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-efa-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Catches: a readless answer that is not in guest RAM when the register
/// write's reply arrives (the driver's 50 ms poll would then race QEMU),
/// BAR2 not offered for mmap, or admin completions without the
/// management MSI-X.
#[test]
fn readless_reads_and_admin_commands_through_the_server() {
    let path = socket_path("efa.sock");
    let dma = DmaSpace::new();
    let attrs = DeviceAttrs::default();
    let function = efa_function(
        &DEFAULT_IDS,
        attrs.clone(),
        EfaOptions { keep_alive: None },
        Arc::new(dma.clone()),
        Arc::new(NoLink::default()),
    )
    .unwrap();
    let control = function.model().efa().control();
    let server = Server::new(ServerConfig::new(&path), dma.clone()).unwrap();
    let listener = server.bind().unwrap();
    let shutdown = server.shutdown_handle();
    let mut function = function;
    let thread = std::thread::spawn(move || server.serve(listener, &mut function));

    let mut client = vfio_user::Client::new(&path).expect("client connects");
    let bar2 = client.region(LLQ_BAR.into()).expect("BAR2");
    assert_eq!(bar2.size, attrs.llq_bar_size());
    assert!(
        bar2.flags & VFIO_REGION_INFO_FLAG_MMAP != 0,
        "LLQ memory is mappable"
    );
    let llq = bar2
        .file_offset
        .as_ref()
        .expect("BAR2 fd")
        .file()
        .try_clone()
        .unwrap();
    llq.write_all_at(b"descriptor", 64 << 10).unwrap();
    let mut seen = [0u8; 10];
    client
        .region_read(LLQ_BAR.into(), 64 << 10, &mut seen)
        .unwrap();
    assert_eq!(
        &seen, b"descriptor",
        "the device sees what the guest stores"
    );

    let ram = SharedMemory::new("guest-ram", RAM_SIZE).unwrap();
    client
        .dma_map(0, RAM_GPA, RAM_SIZE, ram.as_raw_fd())
        .unwrap();
    wait_until("DMA map", Duration::from_secs(20), || {
        dma.mapping_count() == 1
    });
    client
        .region_write(
            VFIO_PCI_CONFIG_REGION_INDEX,
            COMMAND,
            &0b110u16.to_le_bytes(),
        )
        .unwrap();
    let msix_cap = config_space(&DEFAULT_IDS, &attrs)
        .unwrap()
        .capability_offset(CAP_ID_MSIX)
        .unwrap() as u64;
    client
        .region_write(
            VFIO_PCI_CONFIG_REGION_INDEX,
            msix_cap + 2,
            &(1u16 << 15).to_le_bytes(),
        )
        .unwrap();
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    client
        .set_irqs(
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            1,
            &[irq.as_raw_fd()],
        )
        .unwrap();
    client
        .region_write(MSIX_BAR.into(), 12, &0u32.to_le_bytes())
        .unwrap();

    let write = |client: &mut vfio_user::Client, offset: u64, value: u32| {
        client
            .region_write(REGS_BAR.into(), offset, &value.to_le_bytes())
            .unwrap();
    };
    write(&mut client, reg::MMIO_RESP_HI, 0);
    write(&mut client, reg::MMIO_RESP_LO, (RAM_GPA + RESP) as u32);
    for (seq, offset, expected) in [
        (1u16, reg::VERSION, 1u32),
        (2, reg::CAPS, 0x3014),
        (3, reg::DEV_STS, 1),
    ] {
        write(
            &mut client,
            reg::MMIO_REG_READ,
            (offset as u32) << 16 | u32::from(seq),
        );
        // No waiting: the reply to the write came after the answer.
        let mut resp = [0u8; 8];
        ram.read_at(RESP, &mut resp).unwrap();
        assert_eq!(u16::from_le_bytes([resp[0], resp[1]]), seq);
        assert_eq!(u16::from_le_bytes([resp[2], resp[3]]), offset as u16);
        assert_eq!(
            u32::from_le_bytes([resp[4], resp[5], resp[6], resp[7]]),
            expected
        );
    }

    write(&mut client, reg::AQ_BASE_LO, (RAM_GPA + AQ) as u32);
    write(&mut client, reg::AQ_BASE_HI, 0);
    write(&mut client, reg::AQ_CAPS, 32 | 64 << 16);
    write(&mut client, reg::ACQ_BASE_LO, (RAM_GPA + ACQ) as u32);
    write(&mut client, reg::ACQ_BASE_HI, 0);
    write(&mut client, reg::ACQ_CAPS, 32 | 64 << 16);
    let mut entry = [0u8; 64];
    entry[0] = 0x21;
    entry[2] = 16; // ALLOC_UAR
    entry[3] = 1;
    ram.write_at(AQ, &entry).unwrap();
    write(&mut client, reg::AQ_PROD_DB, 1);
    wait_until("the management MSI-X", Duration::from_secs(20), || {
        irq.read().is_ok()
    });
    let mut completion = [0u8; 64];
    ram.read_at(ACQ, &mut completion).unwrap();
    assert_eq!(u16::from_le_bytes([completion[0], completion[1]]), 0x21);
    assert_eq!((completion[2], completion[3]), (0, 1), "SUCCESS, phase 1");
    assert_eq!(control.objects().uars, 1);

    // Disconnect: the server resets the device and keeps listening.
    client.shutdown().unwrap();
    drop(client);
    wait_until("reset after disconnect", Duration::from_secs(20), || {
        control.stats().resets >= 1
    });
    assert_eq!(control.objects().uars, 0);
    shutdown.shutdown();
    thread.join().unwrap().unwrap();
    assert!(!path.exists());
}
