//! Shared test fixtures: a small device model, a raw protocol client that
//! can send any bytes, and helpers to run a server on a socketpair.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use p2plab_vfio_user::vfio_abi::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_NORESIZE,
    VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};
use p2plab_vfio_user::{
    ConnectionEnd, Device, DeviceError, DeviceInfo, DmaError, DmaSpace, EventFd, IrqAction,
    IrqData, IrqInfo, IrqSet, MmapArea, RegionInfo, Server, ServerConfig, SharedMemory,
};

pub const BAR0: u32 = 0;
pub const RO_REGION: u32 = 1;
pub const BAR2: u32 = 2;
pub const CONFIG: u32 = 7;
pub const MSIX: u32 = 2;
pub const BAR0_SIZE: u64 = 4096;
pub const BAR2_SIZE: u64 = 1 << 20;
pub const BAR2_MMAP: MmapArea = MmapArea {
    offset: 0,
    size: 512 * 1024,
};
pub const MSIX_VECTORS: u32 = 4;
/// Writing a guest address here makes the device read 8 bytes there from
/// its own handler (i.e. on the reader thread), to test deadlock
/// detection.
pub const REG_DMA_FROM_HANDLER: u64 = 0x100;

/// What the device saw, for assertions.
#[derive(Default)]
pub struct DeviceLog {
    pub resets: u32,
    pub dma_changes: u32,
    pub irq_sets: Vec<(u32, IrqAction, u32, u32, String)>,
    pub handler_dma: Option<Result<(), DmaError>>,
}

pub struct DeviceState {
    pub bar0: Vec<u8>,
    pub ro: Vec<u8>,
    pub config: Vec<u8>,
    pub msix: Vec<Option<EventFd>>,
    pub log: DeviceLog,
}

/// A device handle shared between the server thread and the test.
#[derive(Clone)]
pub struct TestDevice {
    pub state: Arc<Mutex<DeviceState>>,
    pub bar2: Arc<SharedMemory>,
    pub dma: DmaSpace,
}

impl TestDevice {
    pub fn new(dma: DmaSpace) -> Self {
        let mut ro = vec![0u8; 4096];
        ro[..4].copy_from_slice(b"RO!!");
        let mut config = vec![0u8; 256];
        config[..4].copy_from_slice(&[0x86, 0x80, 0x34, 0x12]);
        TestDevice {
            state: Arc::new(Mutex::new(DeviceState {
                bar0: vec![0u8; BAR0_SIZE as usize],
                ro,
                config,
                msix: (0..MSIX_VECTORS).map(|_| None).collect(),
                log: DeviceLog::default(),
            })),
            bar2: Arc::new(SharedMemory::new("test-bar2", BAR2_SIZE).unwrap()),
            dma,
        }
    }

    /// Fires an MSI-X vector from the device side.
    pub fn fire(&self, vector: usize) -> bool {
        let st = self.state.lock().unwrap();
        match st.msix.get(vector) {
            Some(Some(e)) => e.write(1).is_ok(),
            _ => false,
        }
    }

    pub fn resets(&self) -> u32 {
        self.state.lock().unwrap().log.resets
    }
}

fn rw() -> u32 {
    VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE
}

impl Device for TestDevice {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
            num_regions: VFIO_PCI_NUM_REGIONS,
            num_irqs: VFIO_PCI_NUM_IRQS,
        }
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo, DeviceError> {
        let plain = |flags, size| RegionInfo {
            flags,
            size,
            fd: None,
            fd_offset: 0,
            mmap_areas: vec![],
        };
        Ok(match index {
            BAR0 => plain(rw(), BAR0_SIZE),
            RO_REGION => plain(VFIO_REGION_INFO_FLAG_READ, 4096),
            BAR2 => RegionInfo {
                flags: rw(),
                size: BAR2_SIZE,
                fd: Some(self.bar2.fd()),
                fd_offset: 0,
                mmap_areas: vec![BAR2_MMAP],
            },
            CONFIG => plain(rw(), 256),
            i if i < VFIO_PCI_NUM_REGIONS => plain(0, 0),
            _ => return Err(DeviceError::invalid("no such region")),
        })
    }

    fn irq_info(&self, index: u32) -> Result<IrqInfo, DeviceError> {
        match index {
            MSIX => Ok(IrqInfo {
                flags: VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE,
                count: MSIX_VECTORS,
            }),
            i if i < VFIO_PCI_NUM_IRQS => Ok(IrqInfo { flags: 0, count: 0 }),
            _ => Err(DeviceError::invalid("no such irq index")),
        }
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        let st = self.state.lock().unwrap();
        let off = offset as usize;
        match index {
            BAR0 => data.copy_from_slice(&st.bar0[off..off + data.len()]),
            RO_REGION => data.copy_from_slice(&st.ro[off..off + data.len()]),
            CONFIG => data.copy_from_slice(&st.config[off..off + data.len()]),
            BAR2 => self
                .bar2
                .read_at(offset, data)
                .map_err(|_| DeviceError::invalid("bar2"))?,
            _ => return Err(DeviceError::invalid("unreadable region")),
        }
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        if index == BAR0 && offset == REG_DMA_FROM_HANDLER && data.len() == 8 {
            // Deliberately wrong device code: DMA from the reader thread.
            let gpa = u64::from_le_bytes(data.try_into().unwrap());
            let mut buf = [0u8; 8];
            let r = self.dma.read(gpa, &mut buf);
            self.state.lock().unwrap().log.handler_dma = Some(r.clone());
            return r.map_err(|_| DeviceError::new(libc::EIO, "DMA from handler failed"));
        }
        let mut st = self.state.lock().unwrap();
        let off = offset as usize;
        match index {
            BAR0 => st.bar0[off..off + data.len()].copy_from_slice(data),
            CONFIG => st.config[off..off + data.len()].copy_from_slice(data),
            BAR2 => self
                .bar2
                .write_at(offset, data)
                .map_err(|_| DeviceError::invalid("bar2"))?,
            _ => return Err(DeviceError::invalid("unwritable region")),
        }
        Ok(())
    }

    fn set_irqs(&mut self, request: IrqSet) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        let data = match &request.data {
            IrqData::None => "none".to_string(),
            IrqData::Bool(b) => format!("bool{b:?}"),
            IrqData::EventFds(v) => format!(
                "eventfds{:?}",
                v.iter().map(|e| e.is_some()).collect::<Vec<_>>()
            ),
        };
        st.log.irq_sets.push((
            request.index,
            request.action,
            request.start,
            request.count,
            data,
        ));
        if request.index != MSIX {
            return Ok(());
        }
        let start = request.start as usize;
        match (request.action, request.data) {
            (IrqAction::Trigger, IrqData::EventFds(fds)) if request.count == 0 => {
                let _ = fds;
                st.msix.iter_mut().for_each(|e| *e = None);
            }
            (IrqAction::Trigger, IrqData::EventFds(fds)) => {
                for (i, fd) in fds.into_iter().enumerate() {
                    st.msix[start + i] = fd;
                }
            }
            (IrqAction::Trigger, IrqData::None) => {
                for i in start..start + request.count as usize {
                    if let Some(e) = &st.msix[i] {
                        // Non-blocking: a full counter drops the signal.
                        let _ = e.write(1);
                    }
                }
            }
            (IrqAction::Trigger, IrqData::Bool(flags)) => {
                for (i, fire) in flags.into_iter().enumerate() {
                    if let (true, Some(e)) = (fire, &st.msix[start + i]) {
                        let _ = e.write(1);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn reset(&mut self) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        st.log.resets += 1;
        st.bar0.iter_mut().for_each(|b| *b = 0);
        st.msix.iter_mut().for_each(|e| *e = None);
        Ok(())
    }

    fn dma_changed(&mut self) {
        self.state.lock().unwrap().log.dma_changes += 1;
    }
}

// ----- raw protocol client -----
// Spelled out from the spec on purpose instead of reusing the crate's
// `protocol` constants: a wrong number there must fail these tests, not be
// shared by server and test client alike.

pub const HDR: usize = 16;
pub const REPLY: u32 = 1;
pub const NO_REPLY: u32 = 1 << 4;
pub const ERROR: u32 = 1 << 5;

pub mod cmd {
    pub const VERSION: u16 = 1;
    pub const DMA_MAP: u16 = 2;
    pub const DMA_UNMAP: u16 = 3;
    pub const DEVICE_GET_INFO: u16 = 4;
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    pub const DEVICE_SET_IRQS: u16 = 8;
    pub const REGION_READ: u16 = 9;
    pub const REGION_WRITE: u16 = 10;
    pub const DMA_READ: u16 = 11;
    pub const DMA_WRITE: u16 = 12;
    pub const DEVICE_RESET: u16 = 13;
    pub const REGION_WRITE_MULTI: u16 = 15;
    pub const DEVICE_FEATURE: u16 = 16;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hdr {
    pub id: u16,
    pub cmd: u16,
    pub size: u32,
    pub flags: u32,
    pub error: u32,
}

impl Hdr {
    pub fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0..2].copy_from_slice(&self.id.to_ne_bytes());
        b[2..4].copy_from_slice(&self.cmd.to_ne_bytes());
        b[4..8].copy_from_slice(&self.size.to_ne_bytes());
        b[8..12].copy_from_slice(&self.flags.to_ne_bytes());
        b[12..16].copy_from_slice(&self.error.to_ne_bytes());
        b
    }
    pub fn decode(b: &[u8]) -> Self {
        Hdr {
            id: u16::from_ne_bytes(b[0..2].try_into().unwrap()),
            cmd: u16::from_ne_bytes(b[2..4].try_into().unwrap()),
            size: u32::from_ne_bytes(b[4..8].try_into().unwrap()),
            flags: u32::from_ne_bytes(b[8..12].try_into().unwrap()),
            error: u32::from_ne_bytes(b[12..16].try_into().unwrap()),
        }
    }
    pub fn is_error(&self) -> bool {
        self.flags & ERROR != 0
    }
}

/// Builds payloads in host byte order.
#[derive(Default)]
pub struct Buf(pub Vec<u8>);
impl Buf {
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
}

pub fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().unwrap())
}
pub fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().unwrap())
}

/// One message received by the raw client.
#[derive(Debug)]
pub struct Msg {
    pub hdr: Hdr,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// Sends raw bytes with optional fds (uses vmm-sys-util, independent of
/// the server's own socket code).
pub fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) {
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    if fds.is_empty() {
        (&*stream).write_all(bytes).unwrap();
        return;
    }
    let n = stream.send_with_fds(&[bytes], fds).unwrap();
    (&*stream).write_all(&bytes[n..]).unwrap();
}

/// Reads one whole message (and any fds that came with it).
pub fn read_msg(stream: &UnixStream) -> std::io::Result<Msg> {
    use std::os::fd::FromRawFd;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let mut head = [0u8; HDR];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < HDR {
        let mut raw = [-1 as RawFd; 4];
        let mut iov = [libc::iovec {
            iov_base: head[got..].as_mut_ptr().cast(),
            iov_len: HDR - got,
        }];
        // SAFETY: iov covers the unfilled part of `head`.
        let (n, nfds) = unsafe { stream.recv_with_fds(&mut iov, &mut raw) }
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        for fd in &raw[..nfds] {
            // SAFETY: freshly received fds are ours.
            fds.push(unsafe { OwnedFd::from_raw_fd(*fd) });
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    let hdr = Hdr::decode(&head);
    let mut payload = vec![0u8; hdr.size as usize - HDR];
    (&*stream).read_exact(&mut payload)?;
    Ok(Msg { hdr, payload, fds })
}

pub struct RawClient {
    pub stream: UnixStream,
    pub next_id: u16,
}

impl RawClient {
    pub fn new(stream: UnixStream) -> Self {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        RawClient { stream, next_id: 1 }
    }

    pub fn id(&mut self) -> u16 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }

    /// Sends a command; returns its id.
    pub fn send(&mut self, cmd: u16, flags: u32, payload: &[u8], fds: &[RawFd]) -> u16 {
        let id = self.id();
        let hdr = Hdr {
            id,
            cmd,
            size: (HDR + payload.len()) as u32,
            flags,
            error: 0,
        };
        let mut bytes = hdr.encode().to_vec();
        bytes.extend_from_slice(payload);
        send_with_fds(&self.stream, &bytes, fds);
        id
    }

    /// Sends a command and reads the next message, which must be its reply.
    pub fn call_fds(&mut self, cmd: u16, payload: &[u8], fds: &[RawFd]) -> Msg {
        let id = self.send(cmd, 0, payload, fds);
        let m = read_msg(&self.stream).expect("reply");
        assert_eq!(m.hdr.id, id, "reply id");
        assert_eq!(m.hdr.cmd, cmd, "reply command");
        assert_eq!(m.hdr.flags & 0xf, REPLY, "reply type");
        m
    }

    pub fn call(&mut self, cmd: u16, payload: &[u8]) -> Msg {
        self.call_fds(cmd, payload, &[])
    }

    /// Expects an error reply; returns its errno.
    pub fn call_err(&mut self, cmd: u16, payload: &[u8]) -> u32 {
        let m = self.call(cmd, payload);
        assert!(m.hdr.is_error(), "expected an error reply, got {m:?}");
        assert_eq!(m.hdr.size as usize, HDR, "error replies are header only");
        assert_ne!(m.hdr.error, 0, "errno must be set");
        m.hdr.error
    }

    pub fn negotiate_with(&mut self, json: &str) -> Msg {
        let mut data = json.as_bytes().to_vec();
        data.push(0);
        let p = Buf::default().u16(0).u16(0).bytes(&data).0;
        let m = self.call(cmd::VERSION, &p);
        assert!(!m.hdr.is_error(), "version refused: {m:?}");
        m
    }

    pub fn negotiate(&mut self) -> Msg {
        self.negotiate_with(
            r#"{"capabilities":{"pgsizes":4096,"max_msg_fds":16,"max_dma_maps":65535,"max_data_xfer_size":1048576,"migration":{"pgsize":4096,"max_bitmap_size":268435456},"write_multiple":true}}"#,
        )
    }

    pub fn region_read(&mut self, region: u32, offset: u64, count: u32) -> Result<Vec<u8>, u32> {
        let p = Buf::default().u64(offset).u32(region).u32(count).0;
        let m = self.call(cmd::REGION_READ, &p);
        if m.hdr.is_error() {
            return Err(m.hdr.error);
        }
        assert_eq!(u64_at(&m.payload, 0), offset);
        assert_eq!(u32_at(&m.payload, 8), region);
        assert_eq!(u32_at(&m.payload, 12), count);
        Ok(m.payload[16..].to_vec())
    }

    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), u32> {
        let p = Buf::default()
            .u64(offset)
            .u32(region)
            .u32(data.len() as u32)
            .bytes(data)
            .0;
        let m = self.call(cmd::REGION_WRITE, &p);
        if m.hdr.is_error() {
            return Err(m.hdr.error);
        }
        Ok(())
    }

    pub fn dma_map(
        &mut self,
        gpa: u64,
        size: u64,
        flags: u32,
        fd: Option<RawFd>,
        offset: u64,
    ) -> Msg {
        let p = Buf::default()
            .u32(32)
            .u32(flags)
            .u64(offset)
            .u64(gpa)
            .u64(size)
            .0;
        let fds: Vec<RawFd> = fd.into_iter().collect();
        self.call_fds(cmd::DMA_MAP, &p, &fds)
    }

    /// A known-good request whose answer is checked: proves the stream is
    /// still in sync after whatever came before.
    pub fn assert_in_sync(&mut self) {
        let bytes = self.region_read(CONFIG, 0, 4).expect("config read");
        assert_eq!(bytes, vec![0x86, 0x80, 0x34, 0x12]);
    }
}

/// A server on one end of a socketpair, served on its own thread.
pub struct PairServer {
    pub device: TestDevice,
    pub dma: DmaSpace,
    pub thread: Option<JoinHandle<ConnectionEnd>>,
}

pub fn config() -> ServerConfig {
    ServerConfig::new("/nonexistent/socketpair")
}

pub fn serve_pair_with(config: ServerConfig, dma: DmaSpace) -> (RawClient, PairServer) {
    let (client, server_end) = UnixStream::pair().unwrap();
    let device = TestDevice::new(dma.clone());
    let mut dev = device.clone();
    let server = Server::new(config, dma.clone()).unwrap();
    let thread = std::thread::spawn(move || server.serve_stream(server_end, &mut dev));
    (
        RawClient::new(client),
        PairServer {
            device,
            dma,
            thread: Some(thread),
        },
    )
}

pub fn serve_pair() -> (RawClient, PairServer) {
    serve_pair_with(config(), DmaSpace::new())
}

impl PairServer {
    /// Waits for the server thread to finish the connection.
    pub fn join(&mut self) -> ConnectionEnd {
        self.thread.take().unwrap().join().unwrap()
    }
}

/// Reads the counter of an eventfd without blocking forever.
pub fn eventfd_count(e: &EventFd) -> Option<u64> {
    let mut pfd = libc::pollfd {
        fd: e.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 2000) };
    if n == 1 {
        e.read().ok()
    } else {
        None
    }
}
