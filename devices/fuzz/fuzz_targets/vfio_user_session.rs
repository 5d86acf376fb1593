//! The whole vfio-user session, as a hostile client drives it: raw message
//! bytes and fds (memfds of any size and seals, eventfds pre-filled to
//! their maximum, pipes, files, sockets, memory shrunk after the map)
//! over a socketpair, into a small PCI device whose register writes DMA
//! through the mapped memory and raise interrupts. The input format is
//! `p2plab_vfio_user::record` (servers record seeds with
//! `--record-session`).
//!
//! Catches: a panic anywhere in the transport or p2plab-pci (libFuzzer
//! reports it), a SIGBUS from client memory, a hang (libFuzzer's
//! -timeout), a session that leaves DMA ranges behind after the client
//! left, and fds leaked by any path.
#![no_main]

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use p2plab_pci::{
    BarBacking, BarSpec, ConfigSpaceBuilder, InterruptController, MsixCapSpec, PciFunction,
    PciModel,
};
use p2plab_vfio_user::{record, Access, DeviceError, DmaSpace, Server, ServerConfig, SharedMemory};

const REGS: u64 = 0x1000;
const BAR2: u64 = 64 << 10;
/// Longest DMA one register write asks for.
const MAX_DMA: usize = 64 << 10;

/// BAR0: registers at 0x0..0x1000 (0x00 gpa, 0x08 length, 0x0c go),
/// MSI-X table and PBA above; BAR2: shared memory the client may mmap.
/// Writing `go` runs one operation on the reader thread: 1 read, 2 write,
/// 3 zero-copy read, 4 zero-copy write, 5 raise MSI-X vector `length`.
struct FuzzModel {
    regs: [u8; 16],
    dma: DmaSpace,
    irq: Arc<InterruptController>,
    bar2: Arc<SharedMemory>,
}

impl FuzzModel {
    fn reg_u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.regs[at..at + 8]);
        u64::from_le_bytes(b)
    }

    fn run(&mut self, op: u8) {
        let gpa = self.reg_u64(0);
        let len = (self.reg_u64(8) & 0xffff_ffff) as usize;
        let len = len.min(MAX_DMA);
        let mut buf = vec![0u8; len];
        // Errors are the point: unmapped, refused, truncated memory.
        let _ = match op {
            1 => self.dma.read(gpa, &mut buf),
            2 => {
                buf.fill(0x5a);
                self.dma.write(gpa, &buf)
            }
            3 => self
                .dma
                .with_slice(gpa, len, Access::Read, |s| s.copy_to(&mut buf))
                .map(|_| ()),
            4 => self
                .dma
                .with_slice(gpa, len, Access::Write, |s| s.copy_from(&buf))
                .map(|_| ()),
            5 => {
                self.irq.notify(len as u16);
                Ok(())
            }
            _ => Ok(()),
        };
    }
}

impl PciModel for FuzzModel {
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        match bar {
            0 => {
                for (i, byte) in data.iter_mut().enumerate() {
                    *byte = usize::try_from(offset)
                        .ok()
                        .and_then(|o| o.checked_add(i))
                        .and_then(|at| self.regs.get(at))
                        .copied()
                        .unwrap_or(0);
                }
                Ok(())
            }
            2 => self
                .bar2
                .read_at(offset, data)
                .map_err(|_| DeviceError::invalid("outside BAR2")),
            _ => Err(DeviceError::invalid("no such BAR")),
        }
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        match bar {
            0 => {
                for (i, byte) in data.iter().enumerate() {
                    let at = usize::try_from(offset).ok().and_then(|o| o.checked_add(i));
                    match at {
                        Some(0x0c) => self.run(*byte),
                        Some(at) => {
                            if let Some(slot) = self.regs.get_mut(at) {
                                *slot = *byte;
                            }
                        }
                        None => {}
                    }
                }
                Ok(())
            }
            2 => self
                .bar2
                .write_at(offset, data)
                .map_err(|_| DeviceError::invalid("outside BAR2")),
            _ => Err(DeviceError::invalid("no such BAR")),
        }
    }

    fn reset(&mut self) {
        // DMA runs on the reader thread only: nothing to quiesce.
        self.regs = [0; 16];
    }

    fn bar_backing(&self, bar: u8) -> Option<BarBacking> {
        (bar == 2).then(|| BarBacking {
            fd: self.bar2.fd(),
            fd_offset: 0,
            areas: Vec::new(),
        })
    }
}

fn device(dma: &DmaSpace) -> PciFunction<FuzzModel> {
    let config = ConfigSpaceBuilder::new(0x1b36, 0x00ff)
        .class_code(0xff, 0, 0)
        .interrupt_pin(1)
        .bar(0, BarSpec::memory64(REGS * 4))
        .bar(2, BarSpec::memory64(BAR2).prefetchable())
        .power_management()
        .msix(MsixCapSpec {
            vectors: 4,
            table_bar: 0,
            table_offset: 0x2000,
            pba_bar: 0,
            pba_offset: 0x3000,
        })
        .build()
        .expect("the fuzzed device's layout is valid");
    let bar2 = Arc::new(SharedMemory::new("fuzz-bar2", BAR2).expect("memfd"));
    PciFunction::new(config, |irq| FuzzModel {
        regs: [0; 16],
        dma: dma.clone(),
        irq,
        bar2,
    })
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fuzz_target!(|data: &[u8]| {
    let fds_before = open_fds();
    let dma = DmaSpace::with_timeout(Duration::from_millis(200));
    let mut config = ServerConfig::new("/nonexistent/fuzz.sock");
    config.max_fd_dma_maps = 8;
    let server = Server::new(config, dma.clone()).expect("valid config");
    let mut function = device(&dma);
    let (client, server_end) = UnixStream::pair().expect("socketpair");
    let reader = client.try_clone().expect("clone");
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        while matches!(std::io::Read::read(&mut &reader, &mut buf), Ok(n) if n > 0) {}
    });
    let serving = std::thread::spawn(move || {
        server.serve_stream(server_end, &mut function);
        function
    });
    let _ = record::replay(data, &client);
    let _ = client.shutdown(std::net::Shutdown::Write);
    let function = serving.join().expect("the server thread panicked");
    let _ = client.shutdown(std::net::Shutdown::Both);
    drain.join().expect("drain");
    assert_eq!(dma.mapping_count(), 0, "DMA ranges outlived the session");
    assert!(
        !function.irq().msix_enabled(),
        "the disconnect reset the device"
    );
    drop(function);
    drop(client);
    drop(dma);
    assert_eq!(open_fds(), fds_before, "fds leaked");
});
