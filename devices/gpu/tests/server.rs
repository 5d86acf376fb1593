//! The whole server path without QEMU: p2plab-vfio-user's Server serving
//! the GPU function to rust-vmm's independent `vfio_user::Client`, which
//! plays QEMU: it maps VRAM from the region fd, shares "guest RAM" as a
//! memfd, binds an MSI-X eventfd and drives the engine through BAR0.

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crc32c::crc32c;
use p2plab_gpu::command::{Command, CommandFlags, Completion, COMMAND_SIZE, COMPLETION_SIZE};
use p2plab_gpu::engine::opcodes::op;
use p2plab_gpu::pci::config_space;
use p2plab_gpu::regs::*;
use p2plab_gpu::status::StatusCode;
use p2plab_gpu::{gpu_function, Vram, DEFAULT_IDS};
use p2plab_kit::testing::wait_until;
use p2plab_vfio_user::vfio_abi::{
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use p2plab_vfio_user::{DmaSpace, EventFd, Server, ServerConfig, SharedMemory};

const RAM_GPA: u64 = 0x4000_0000;
const RAM_SIZE: u64 = 16 << 20;
const RING_OFF: u64 = 0;
const RECORD_OFF: u64 = 64 << 10;
const DATA_OFF: u64 = 1 << 20;
const VRAM_SIZE: u64 = 256 << 20;
/// Where the test "BIOS" places BAR2.
const BAR2_GPA: u64 = 0x80_0000_0000;

// Config space as firmware programs it, spelled out so the test checks
// the server's layout instead of reusing it.
const COMMAND: u64 = 0x04;
const COMMAND_MEMORY_AND_BUS_MASTER: u16 = 0b110;
const BAR2_LOW: u64 = 0x18;
const BAR2_HIGH: u64 = 0x1c;
const BAR_MEM64_PREFETCHABLE: u32 = 0b1100;
const CAP_ID_MSIX: u8 = 0x11;
const MSIX_CONTROL: u64 = 2;
const MSIX_CONTROL_ENABLE: u16 = 1 << 15;
const MSIX_ENTRY_VECTOR_CONTROL: u64 = 12;

fn socket_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("p2plab-gpu-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

struct Guest {
    client: vfio_user::Client,
    ram: SharedMemory,
    tail: u32,
    fence: u64,
}

impl Guest {
    fn write32(&mut self, reg: Reg, value: u32) {
        self.write_dword(reg, Half::Low, value);
    }

    fn write_dword(&mut self, reg: Reg, half: Half, value: u32) {
        self.client
            .region_write(
                REGS_BAR.into(),
                reg.dword_offset(half),
                &value.to_le_bytes(),
            )
            .unwrap();
    }

    fn read32(&mut self, reg: Reg) -> u32 {
        let mut b = [0u8; 4];
        self.client
            .region_read(REGS_BAR.into(), reg.offset(), &mut b)
            .unwrap();
        u32::from_le_bytes(b)
    }

    fn read64(&mut self, reg: Reg) -> u64 {
        let mut b = [0u8; 8];
        self.client
            .region_read(REGS_BAR.into(), reg.offset(), &mut b)
            .unwrap();
        u64::from_le_bytes(b)
    }

    fn config_write(&mut self, offset: u64, data: &[u8]) {
        self.client
            .region_write(VFIO_PCI_CONFIG_REGION_INDEX, offset, data)
            .unwrap();
    }

    /// Runs one command to completion through the ring; returns its record.
    fn run(&mut self, mut cmd: Command, irq: &EventFd) -> Completion {
        self.fence += 1;
        cmd.fence = self.fence;
        cmd.flags = CommandFlags::IRQ | CommandFlags::COMPLETION;
        cmd.completion_addr = RAM_GPA + RECORD_OFF;
        self.ram
            .write_at(RECORD_OFF, &[0; COMPLETION_SIZE])
            .unwrap();
        self.ram
            .write_at(
                RING_OFF + u64::from(self.tail) * COMMAND_SIZE,
                &cmd.encode(),
            )
            .unwrap();
        self.tail = (self.tail + 1) % 16;
        self.write32(Reg::Doorbell, self.tail);
        // The MSI-X eventfd fires when the command retires.
        wait_until("MSI-X", Duration::from_secs(20), || irq.read().is_ok());
        assert_eq!(self.read64(Reg::Fence), self.fence);
        self.write32(Reg::IntStatus, IntCauses::ALL.raw());
        let mut record = [0u8; COMPLETION_SIZE];
        self.ram.read_at(RECORD_OFF, &mut record).unwrap();
        let record = Completion::decode(&record);
        assert_eq!(record.fence, self.fence);
        record
    }
}

#[test]
fn client_drives_the_engine_through_the_server() {
    let path = socket_path("gpu.sock");
    let ids = DEFAULT_IDS;
    let dma = DmaSpace::new();
    let mut function =
        gpu_function(&ids, Vram::new(VRAM_SIZE).unwrap(), Arc::new(dma.clone())).unwrap();
    function.model_mut().serve_vram_locally(dma.clone());
    let stats = function.model().gpu().control();
    let server = Server::new(ServerConfig::new(&path), dma.clone()).unwrap();
    let listener = server.bind().unwrap();
    let shutdown = server.shutdown_handle();
    let thread = std::thread::spawn(move || server.serve(listener, &mut function));

    let client = vfio_user::Client::new(&path).expect("client connects");
    let ram = SharedMemory::new("guest-ram", RAM_SIZE).unwrap();
    let mut guest = Guest {
        client,
        ram,
        tail: 0,
        fence: 0,
    };

    // VRAM is offered as an fd the client maps, like QEMU does.
    let bar2 = guest.client.region(VRAM_BAR.into()).expect("BAR2");
    assert_eq!(bar2.size, VRAM_SIZE);
    assert!(bar2.flags & VFIO_REGION_INFO_FLAG_MMAP != 0);
    let vram_file = bar2
        .file_offset
        .as_ref()
        .expect("BAR2 fd")
        .file()
        .try_clone()
        .unwrap();
    assert_eq!(guest.read32(Reg::Id), ID_MAGIC);

    // "Firmware": place BAR2, enable memory decode and bus mastering,
    // enable MSI-X and unmask vector 0.
    guest.config_write(
        BAR2_LOW,
        &(BAR2_GPA as u32 | BAR_MEM64_PREFETCHABLE).to_le_bytes(),
    );
    guest.config_write(BAR2_HIGH, &((BAR2_GPA >> 32) as u32).to_le_bytes());
    guest.config_write(COMMAND, &COMMAND_MEMORY_AND_BUS_MASTER.to_le_bytes());
    let msix_cap = config_space(&ids, VRAM_SIZE)
        .unwrap()
        .capability_offset(CAP_ID_MSIX)
        .unwrap() as u64;
    guest.config_write(msix_cap + MSIX_CONTROL, &MSIX_CONTROL_ENABLE.to_le_bytes());
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    guest
        .client
        .set_irqs(
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            1,
            &[irq.as_raw_fd()],
        )
        .unwrap();
    guest
        .client
        .region_write(
            MSIX.bar.into(),
            MSIX_ENTRY_VECTOR_CONTROL,
            &0u32.to_le_bytes(),
        )
        .unwrap();

    // Guest RAM shared with the server.
    guest
        .client
        .dma_map(0, RAM_GPA, RAM_SIZE, guest.ram.as_raw_fd())
        .unwrap();
    wait_until("DMA map", Duration::from_secs(20), || {
        dma.mapping_count() == 1
    });

    // Driver: ring in guest RAM, interrupts on.
    guest.write_dword(Reg::RingBase, Half::Low, RAM_GPA as u32);
    guest.write_dword(Reg::RingBase, Half::High, (RAM_GPA >> 32) as u32);
    guest.write32(Reg::RingSize, 16);
    guest.write32(Reg::IntMask, 0);
    guest.write32(Reg::RingCtrl, RingCtrl::ENABLE.raw());
    let status = Status::from_raw(guest.read32(Reg::Status));
    assert!(!status.contains(Status::HALTED), "{status:?}");

    // Host -> VRAM.
    let data: Vec<u8> = (0..(3u32 << 20) / 2)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    guest.ram.write_at(DATA_OFF, &data).unwrap();
    let record = guest.run(
        Command {
            opcode: op::COPY_TO_VRAM,
            src: RAM_GPA + DATA_OFF,
            dst: 4096,
            len: data.len() as u64,
            ..Command::default()
        },
        &irq,
    );
    assert_eq!(record.status, StatusCode::Ok.code());
    let mut seen = vec![0u8; data.len()];
    vram_file.read_exact_at(&mut seen, 4096).unwrap();
    assert_eq!(seen, data, "the client's view of VRAM has the data");

    // The client writes VRAM through its fd; the engine checksums it.
    vram_file.write_all_at(b"123456789", 100 << 20).unwrap();
    let record = guest.run(
        Command {
            opcode: op::CHECKSUM,
            src: 100 << 20,
            len: 9,
            ..Command::default()
        },
        &irq,
    );
    assert_eq!(record.result, 0xe306_9283);
    let record = guest.run(
        Command {
            opcode: op::CHECKSUM,
            src: 4096,
            len: data.len() as u64,
            ..Command::default()
        },
        &irq,
    );
    assert_eq!(record.result, crc32c(&data));

    // VRAM -> host.
    let back_off = DATA_OFF + (4 << 20);
    let record = guest.run(
        Command {
            opcode: op::COPY_FROM_VRAM,
            src: 4096,
            dst: RAM_GPA + back_off,
            len: data.len() as u64,
            ..Command::default()
        },
        &irq,
    );
    assert_eq!(record.status, StatusCode::Ok.code());
    let mut back = vec![0u8; data.len()];
    guest.ram.read_at(back_off, &mut back).unwrap();
    assert_eq!(back, data);

    // VRAM -> our own BAR2 as a "host" address: served by the local window,
    // not by a DMA message to the client.
    let record = guest.run(
        Command {
            opcode: op::COPY_FROM_VRAM,
            src: 4096,
            dst: BAR2_GPA + (200 << 20),
            len: 8192,
            ..Command::default()
        },
        &irq,
    );
    assert_eq!(record.status, StatusCode::Ok.code());
    let mut copy = vec![0u8; 8192];
    vram_file.read_exact_at(&mut copy, 200 << 20).unwrap();
    assert_eq!(copy, data[..8192]);
    let d = dma.stats();
    assert_eq!(d.local.write_bytes, 8192);
    assert_eq!(d.message.write_bytes + d.message.read_bytes, 0);
    assert!(d.mmap.read_bytes >= data.len() as u64);

    // A bad command reports an error and raises the interrupt too.
    let record = guest.run(
        Command {
            opcode: op::FILL,
            dst: VRAM_SIZE - 8,
            len: 16,
            pattern: 1,
            ..Command::default()
        },
        &irq,
    );
    assert_eq!(record.status, StatusCode::VramRange.code());

    let s = stats.stats();
    assert_eq!(s.bytes_host_to_vram, data.len() as u64);
    assert_eq!(s.bytes_vram_to_host, data.len() as u64 + 8192);
    assert_eq!((s.jobs_completed, s.jobs_failed), (5, 1));
    assert!(s.interrupts >= 6);

    // Disconnect: the server resets the device and keeps listening.
    guest.client.shutdown().unwrap();
    drop(guest);
    wait_until("reset after disconnect", Duration::from_secs(20), || {
        stats.stats().resets >= 1
    });

    shutdown.shutdown();
    thread.join().unwrap().unwrap();
    assert!(!path.exists());
}
