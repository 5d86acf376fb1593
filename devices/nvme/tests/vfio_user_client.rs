//! Host-side tests of the `p2plab-nvme` binary through an independent
//! vfio-user client (rust-vmm's `vfio_user::Client`): a client that plays
//! a hostile guest (bad doorbells, bad queue parameters, out-of-range data
//! pointers) gets the exact NVMe statuses, and the server keeps serving.
//! Guest RAM is a memfd the client shares with DMA_MAP, like QEMU does.

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use p2plab_nvme::registers::reg;
use p2plab_nvme::spec::{admin, io, Status};
use p2plab_nvme::{Command, CommandBuilder, CompletionEntry};
use p2plab_vfio_user::vfio_abi::{VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD};
use p2plab_vfio_user::{EventFd, SharedMemory};

const BAR0: u32 = 0;
const BAR2: u32 = 2;
const CONFIG: u32 = 7;
const MSIX: u32 = 2;
/// Guest RAM as the client maps it.
const RAM: u64 = 0x1000_0000;
const RAM_SIZE: u64 = 16 << 20;
const DATA: u64 = RAM + (8 << 20);
/// Where the "guest" programs the CMB BAR.
const CMB_GPA: u64 = 0x80_0000_0000;
const TIMEOUT: Duration = Duration::from_secs(10);

struct Server {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    stats: PathBuf,
}

impl Server {
    fn start(name: &str, extra: &[&str]) -> Server {
        let dir = std::env::temp_dir().join(format!("p2plab-nvme-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("nvme.sock");
        let stats = dir.join("stats.json");
        let child = Process::new(env!("CARGO_BIN_EXE_p2plab-nvme"))
            .arg("--socket")
            .arg(&socket)
            .args([
                "--namespace",
                "mem,size=16M",
                "--cmb-size",
                "4M",
                "--queues",
                "4",
            ])
            .arg("--stats-file")
            .arg(&stats)
            .args([
                "--stats-interval-ms",
                "50",
                "--log-level",
                "debug",
                "--log-file",
            ])
            .arg(dir.join("nvme.log"))
            .args(extra)
            .stdin(Stdio::null())
            .spawn()
            .expect("starting p2plab-nvme");
        let deadline = Instant::now() + TIMEOUT;
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the server never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        Server {
            child,
            dir,
            socket,
            stats,
        }
    }

    fn stats(&self) -> serde_json::Value {
        // Rewritten every 50 ms; wait for a fresh copy.
        std::thread::sleep(Duration::from_millis(150));
        let text = std::fs::read_to_string(&self.stats).expect("stats file");
        serde_json::from_str(&text).expect("stats JSON")
    }

    /// SIGTERM, then the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill only sends a signal to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Ring {
    sq: u64,
    cq: u64,
    entries: u32,
    tail: u32,
    head: u32,
    phase: bool,
}

/// A minimal NVMe driver speaking vfio-user.
struct Guest {
    client: vfio_user::Client,
    ram: SharedMemory,
    rings: Vec<Option<Ring>>,
    next_cid: u16,
}

impl Guest {
    fn connect(socket: &Path) -> Guest {
        let mut client = vfio_user::Client::new(socket).expect("client connects");
        let ram = SharedMemory::new("guest-ram", RAM_SIZE).unwrap();
        client.dma_map(0, RAM, RAM_SIZE, ram.fd()).expect("dma_map");
        let mut rings = Vec::new();
        rings.resize_with(5, || None);
        Guest {
            client,
            ram,
            rings,
            next_cid: 1,
        }
    }

    fn cfg_read(&mut self, offset: u64, len: usize) -> u32 {
        let mut b = [0u8; 4];
        self.client
            .region_read(CONFIG, offset, &mut b[..len])
            .unwrap();
        u32::from_le_bytes(b)
    }

    fn cfg_write(&mut self, offset: u64, data: &[u8]) {
        self.client.region_write(CONFIG, offset, data).unwrap();
    }

    fn read32(&mut self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.client.region_read(BAR0, offset, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    fn write32(&mut self, offset: u64, value: u32) {
        self.client
            .region_write(BAR0, offset, &value.to_le_bytes())
            .unwrap();
    }

    fn mem_write(&self, gpa: u64, data: &[u8]) {
        if gpa >= CMB_GPA {
            let fo = self
                .client
                .region(BAR2)
                .unwrap()
                .file_offset
                .as_ref()
                .unwrap();
            fo.file()
                .write_all_at(data, fo.start() + gpa - CMB_GPA)
                .unwrap();
        } else {
            self.ram.write_at(gpa - RAM, data).unwrap();
        }
    }

    fn mem_read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        if gpa >= CMB_GPA {
            let fo = self
                .client
                .region(BAR2)
                .unwrap()
                .file_offset
                .as_ref()
                .unwrap();
            fo.file()
                .read_exact_at(&mut b, fo.start() + gpa - CMB_GPA)
                .unwrap();
        } else {
            self.ram.read_at(gpa - RAM, &mut b).unwrap();
        }
        b
    }

    fn wait_csts(&mut self, mask: u32, want: u32) {
        let deadline = Instant::now() + TIMEOUT;
        while self.read32(reg::CSTS) & mask != want {
            assert!(Instant::now() < deadline, "CSTS never matched");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn enable(&mut self) {
        // Bus mastering and memory decode, as the guest kernel does.
        self.cfg_write(0x04, &0x0006u16.to_le_bytes());
        self.write32(reg::CC, 0);
        self.wait_csts(1, 0);
        self.mem_write(RAM + 0x1000, &[0; 32 * 16]);
        self.write32(reg::AQA, (31 << 16) | 31);
        self.write32(reg::ASQ, RAM as u32);
        self.write32(reg::ASQ + 4, (RAM >> 32) as u32);
        self.write32(reg::ACQ, (RAM + 0x1000) as u32);
        self.write32(reg::ACQ + 4, ((RAM + 0x1000) >> 32) as u32);
        self.write32(reg::CC, (6 << 16) | (4 << 20));
        self.write32(reg::CC, (6 << 16) | (4 << 20) | 1);
        self.wait_csts(1, 1);
        self.rings[0] = Some(Ring {
            sq: RAM,
            cq: RAM + 0x1000,
            entries: 32,
            tail: 0,
            head: 0,
            phase: true,
        });
    }

    fn submit(&mut self, qid: u16, cmd: Command) -> u16 {
        let cid = self.next_cid;
        self.next_cid += 1;
        let mut raw = *cmd.as_bytes();
        raw[2..4].copy_from_slice(&cid.to_le_bytes());
        let ring = self.rings[usize::from(qid)].as_mut().unwrap();
        let at = ring.sq + u64::from(ring.tail) * 64;
        ring.tail = (ring.tail + 1) % ring.entries;
        let tail = ring.tail;
        self.mem_write(at, &raw);
        self.write32(0x1000 + 8 * u64::from(qid), tail);
        cid
    }

    fn try_reap(&mut self, qid: u16, timeout: Duration) -> Option<CompletionEntry> {
        let deadline = Instant::now() + timeout;
        loop {
            let ring = self.rings[usize::from(qid)].as_ref().unwrap();
            let raw = self.mem_read(ring.cq + u64::from(ring.head) * 16, 16);
            let e = CompletionEntry::decode(&raw.try_into().unwrap());
            if e.phase == ring.phase {
                let ring = self.rings[usize::from(qid)].as_mut().unwrap();
                ring.head = (ring.head + 1) % ring.entries;
                if ring.head == 0 {
                    ring.phase = !ring.phase;
                }
                let head = ring.head;
                self.write32(0x1000 + 8 * u64::from(qid) + 4, head);
                return Some(e);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn run(&mut self, qid: u16, cmd: Command) -> CompletionEntry {
        let cid = self.submit(qid, cmd);
        let e = self.try_reap(qid, TIMEOUT).expect("a completion");
        assert_eq!(e.cid, cid);
        e
    }

    fn status(&mut self, qid: u16, cmd: Command) -> Status {
        self.run(qid, cmd).status
    }

    fn create_pair(&mut self, qid: u16, sq: u64, cq: u64, entries: u32) {
        self.mem_write(cq, &vec![0; entries as usize * 16]);
        let c = CommandBuilder::new(admin::CREATE_CQ, 0)
            .prp1(cq)
            .cdw(10, ((entries - 1) << 16) | u32::from(qid))
            .cdw(11, (u32::from(qid) << 16) | 3)
            .build();
        assert_eq!(self.status(0, c), Status::SUCCESS);
        let s = CommandBuilder::new(admin::CREATE_SQ, 0)
            .prp1(sq)
            .cdw(10, ((entries - 1) << 16) | u32::from(qid))
            .cdw(11, (u32::from(qid) << 16) | 1)
            .build();
        assert_eq!(self.status(0, s), Status::SUCCESS);
        self.rings[usize::from(qid)] = Some(Ring {
            sq,
            cq,
            entries,
            tail: 0,
            head: 0,
            phase: true,
        });
    }

    /// Enables MSI-X in the capability's Message Control.
    fn enable_msix(&mut self) {
        let mut cap = self.cfg_read(0x34, 1) as u64;
        while cap != 0 {
            if self.cfg_read(cap, 1) == 0x11 {
                let control = self.cfg_read(cap + 2, 2) as u16;
                self.cfg_write(cap + 2, &(control | 0x8000).to_le_bytes());
                return;
            }
            cap = u64::from(self.cfg_read(cap + 1, 1));
        }
        panic!("no MSI-X capability");
    }
}

fn rw(opcode: u8, slba: u64, blocks: u32) -> CommandBuilder {
    CommandBuilder::new(opcode, 0)
        .nsid(1)
        .slba(slba)
        .cdw(12, blocks - 1)
}

/// Whether the eventfd fires within a second (the interrupt follows the
/// completion entry, so a fast poller may see the entry first).
fn fired(eventfd: &EventFd) -> bool {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        if eventfd.read().is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn counter(stats: &serde_json::Value, name: &str) -> u64 {
    stats["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("counter {name}"))
}

#[test]
fn bad_input_gets_exact_statuses_and_the_server_keeps_serving() {
    let server = Server::start("bad-input", &[]);
    let mut g = Guest::connect(&server.socket);
    g.enable();

    // Interrupts reach the client's eventfds once MSI-X is on.
    let vectors: Vec<EventFd> = (0..5)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    let fds: Vec<i32> = vectors.iter().map(|e| e.as_raw_fd()).collect();
    g.client
        .set_irqs(
            MSIX,
            VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            5,
            &fds,
        )
        .unwrap();
    g.enable_msix();
    let identify = CommandBuilder::new(admin::IDENTIFY, 0)
        .prp1(DATA)
        .cdw(10, 1)
        .build();
    assert_eq!(g.status(0, identify), Status::SUCCESS);
    assert!(fired(&vectors[0]), "admin completion interrupt on vector 0");
    assert_eq!(&g.mem_read(DATA + 77, 1), &[7], "MDTS from Identify");

    // Bad queue parameters.
    let cq = |qid: u32, size: u32, iv: u32, base: u64| {
        CommandBuilder::new(admin::CREATE_CQ, 0)
            .prp1(base)
            .cdw(10, (size << 16) | qid)
            .cdw(11, (iv << 16) | 3)
            .build()
    };
    let base = RAM + 0x20_0000;
    assert_eq!(
        g.status(0, cq(0, 63, 1, base)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        g.status(0, cq(9, 63, 1, base)),
        Status::INVALID_QUEUE_IDENTIFIER
    );
    assert_eq!(
        g.status(0, cq(1, 4096, 1, base)),
        Status::INVALID_QUEUE_SIZE
    );
    assert_eq!(g.status(0, cq(1, 0, 1, base)), Status::INVALID_QUEUE_SIZE);
    assert_eq!(
        g.status(0, cq(1, 63, 1, base + 0x10)),
        Status::PRP_OFFSET_INVALID
    );
    assert_eq!(
        g.status(0, cq(1, 63, 99, base)),
        Status::INVALID_INTERRUPT_VECTOR
    );
    let sq_on_missing_cq = CommandBuilder::new(admin::CREATE_SQ, 0)
        .prp1(RAM + 0x30_0000)
        .cdw(10, (63 << 16) | 1)
        .cdw(11, (3 << 16) | 1)
        .build();
    assert_eq!(
        g.status(0, sq_on_missing_cq),
        Status::INVALID_COMPLETION_QUEUE
    );
    let delete_missing = CommandBuilder::new(admin::DELETE_SQ, 0).cdw(10, 2).build();
    assert_eq!(
        g.status(0, delete_missing),
        Status::INVALID_QUEUE_IDENTIFIER
    );

    g.create_pair(1, RAM + 0x30_0000, RAM + 0x20_0000, 64);

    // Out-of-range and malformed data pointers.
    let outside = rw(io::READ, 0, 8).prp1(0x7_0000_0000).build();
    assert_eq!(g.status(1, outside), Status::DATA_TRANSFER_ERROR);
    let beyond_ram = rw(io::READ, 0, 16)
        .prp1(RAM + RAM_SIZE - 4096)
        .prp2(RAM + RAM_SIZE)
        .build();
    assert_eq!(
        g.status(1, beyond_ram),
        Status::DATA_TRANSFER_ERROR,
        "runs past the mapping"
    );
    let list_outside = rw(io::READ, 0, 24).prp1(DATA).prp2(0x7_0000_0000).build();
    assert_eq!(g.status(1, list_outside), Status::DATA_TRANSFER_ERROR);
    let misaligned = rw(io::READ, 0, 16).prp1(DATA).prp2(DATA + 0x1008).build();
    assert_eq!(g.status(1, misaligned), Status::PRP_OFFSET_INVALID);
    let lba = rw(io::READ, 32768, 1).prp1(DATA).build();
    assert_eq!(g.status(1, lba), Status::LBA_OUT_OF_RANGE);
    let too_big = rw(io::WRITE, 0, 2048).prp1(DATA).build();
    assert_eq!(g.status(1, too_big), Status::INVALID_FIELD, "above MDTS");
    let no_ns = rw(io::READ, 0, 1).nsid(2).prp1(DATA).build();
    assert_eq!(g.status(1, no_ns), Status::INVALID_NAMESPACE);
    assert_eq!(
        g.status(1, CommandBuilder::new(0x99, 0).nsid(1).build()),
        Status::INVALID_OPCODE
    );

    // Bad doorbells, with an Asynchronous Event Request outstanding.
    let aer = g.submit(
        0,
        CommandBuilder::new(admin::ASYNC_EVENT_REQUEST, 0).build(),
    );
    g.write32(0x1000 + 8, 64); // SQ 1 tail == queue size
    let event = g.try_reap(0, TIMEOUT).expect("asynchronous event");
    assert_eq!(event.cid, aer);
    assert_eq!(
        event.dw0, 0x01_01_00,
        "error / invalid doorbell value / error log"
    );
    g.write32(0x1000 + 8 * 3, 1); // no SQ 3
    g.write32(0x1000 + 8 * 100, 1); // beyond every queue
    g.write32(0x1000 + 8 + 4, 40); // CQ 1 head past posted entries

    // Still serving: a write and a read back.
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    g.mem_write(DATA, &pattern);
    assert_eq!(
        g.status(1, rw(io::WRITE, 100, 8).prp1(DATA).build()),
        Status::SUCCESS
    );
    g.mem_write(DATA, &[0; 4096]);
    assert_eq!(
        g.status(1, rw(io::READ, 100, 8).prp1(DATA).build()),
        Status::SUCCESS
    );
    assert_eq!(g.mem_read(DATA, 4096), pattern);
    assert!(fired(&vectors[1]), "I/O completions interrupt on vector 1");

    let stats = server.stats();
    assert_eq!(counter(&stats, "invalid_doorbell_writes"), 4);
    assert_eq!(counter(&stats, "failed_commands"), 16);
    assert!(stats["controller"]["ready"].as_bool().unwrap());
    let serial = stats["controller"]["serial"].as_str().unwrap().to_owned();
    assert!(serial.starts_with("P2PLAB"), "default serial {serial}");
    assert_eq!(g.status(0, identify), Status::SUCCESS);
    assert_eq!(
        g.mem_read(DATA + 4, serial.len()),
        serial.as_bytes(),
        "same as Identify SN"
    );

    drop(g);
    let status = server.stop_and_check();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
}

#[test]
fn submission_queue_in_the_cmb_through_the_transport() {
    let server = Server::start("cmb", &[]);
    let mut g = Guest::connect(&server.socket);
    let bar2 = g.client.region(BAR2).expect("BAR2");
    assert_eq!(bar2.size, 4 << 20);
    assert!(bar2.file_offset.is_some(), "the CMB is mmappable");
    // Program BAR2 (64-bit) and turn on memory decode.
    g.cfg_write(0x18, &(CMB_GPA as u32).to_le_bytes());
    g.cfg_write(0x1c, &((CMB_GPA >> 32) as u32).to_le_bytes());
    g.enable();
    // Linux's CMB sequence.
    g.write32(reg::CMBMSC, 1);
    let cmbsz = g.read32(reg::CMBSZ);
    assert_eq!(cmbsz & 0x1f, 0x1f, "SQS CQS LISTS RDS WDS");
    assert_eq!(g.read32(reg::CMBLOC) & 7, 2);
    g.write32(reg::CMBMSC + 4, (CMB_GPA >> 32) as u32);
    g.write32(reg::CMBMSC, CMB_GPA as u32 | 3);
    g.create_pair(1, CMB_GPA, RAM + 0x20_0000, 64);
    // Data into and out of the CMB as well.
    g.mem_write(CMB_GPA + 0x10_0000, &[0xa5; 4096]);
    let w = rw(io::WRITE, 0, 8).prp1(CMB_GPA + 0x10_0000).build();
    assert_eq!(g.status(1, w), Status::SUCCESS);
    let r = rw(io::READ, 0, 8).prp1(DATA).build();
    assert_eq!(g.status(1, r), Status::SUCCESS);
    assert_eq!(g.mem_read(DATA, 4096), vec![0xa5; 4096]);
    let stats = server.stats();
    assert_eq!(stats["cmb"]["sq_entries_fetched"].as_u64(), Some(2));
    assert_eq!(stats["cmb"]["io_sqs_created"].as_u64(), Some(1));
    assert_eq!(stats["cmb"]["data_bytes_from"].as_u64(), Some(4096));
    assert_eq!(stats["cmb"]["bar_address"].as_u64(), Some(CMB_GPA));
    assert_eq!(stats["cmb"]["cba"].as_u64(), Some(CMB_GPA));
    // Served locally: 2 SQ entries and the write's data; guest RAM through
    // the client's mmapped fd, never through messages.
    let dma = &stats["dma"];
    assert!(
        dma["dma_local_read_bytes"].as_u64().unwrap() >= 4096 + 2 * 64,
        "{dma}"
    );
    assert!(
        dma["dma_mmap_write_bytes"].as_u64().unwrap() >= 4096,
        "{dma}"
    );
    assert_eq!(dma["dma_message_read_bytes"].as_u64(), Some(0), "{dma}");
    drop(g);
    assert!(server.stop_and_check().success());
}

impl Server {
    /// Stops the server and checks what a clean exit leaves behind.
    fn stop_and_check(self) -> std::process::ExitStatus {
        let socket = self.socket.clone();
        let stats = self.stats.clone();
        let dir = self.dir.clone();
        let status = self.stop();
        assert!(!socket.exists(), "socket removed at exit");
        let text = std::fs::read_to_string(&stats).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(json["counters"]["io_commands"].as_u64().unwrap() > 0);
        let _ = std::fs::remove_dir_all(dir);
        status
    }
}
