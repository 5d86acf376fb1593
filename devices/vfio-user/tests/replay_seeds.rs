//! Replays the `vfio_user_session` fuzz seeds (recorded from QEMU with
//! `--record-session`, plus hand-made hostile ones) and every saved crash
//! input on the stable toolchain, against the test device: each session
//! must end cleanly, leave no DMA range and no fd behind. The QEMU
//! recordings must also replay faithfully: every DMA_MAP they hold is
//! accepted (their guest RAM is recreated with the recorded size and
//! seals).

mod common;

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use common::*;
use p2plab_vfio_user::{record, ConnectionEnd, DmaSpace, Server};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

/// The fd count is per process: these tests run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Error replies per command number, and replies in all.
type Errors = HashMap<u16, usize>;

/// Commands in `input` that ask for a reply.
fn expected_replies(input: &[u8]) -> usize {
    record::parse(input)
        .iter()
        .filter(|r| match r {
            record::Record::Msg(bytes) if bytes.len() >= HDR => {
                let h = Hdr::decode(bytes);
                h.flags & 0xf == 0 && h.flags & NO_REPLY == 0
            }
            _ => false,
        })
        .count()
}

fn replay(input: &[u8]) -> (ConnectionEnd, Errors, usize, usize) {
    let dma = DmaSpace::with_timeout(std::time::Duration::from_millis(200));
    let mut device = TestDevice::new(dma.clone());
    let server = Server::new(config(), dma.clone()).unwrap();
    let (client, server_end) = UnixStream::pair().unwrap();
    let reader = client.try_clone().unwrap();
    let replies = std::thread::spawn(move || {
        let mut errors = Errors::new();
        let mut replies = 0;
        while let Ok(m) = read_msg(&reader) {
            replies += 1;
            if m.hdr.is_error() {
                *errors.entry(m.hdr.cmd).or_default() += 1;
            }
        }
        (errors, replies)
    });
    let serving = std::thread::spawn(move || server.serve_stream(server_end, &mut device));
    let _ = record::replay(input, &client);
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let end = serving.join().unwrap();
    client.shutdown(std::net::Shutdown::Both).unwrap();
    let (errors, replies) = replies.join().unwrap();
    (end, errors, replies, dma.mapping_count())
}

/// Catches a seed or saved crash input that panics, hangs or leaks in the
/// transport, and a recording that no longer replays as QEMU sent it.
#[test]
fn seeds_and_saved_crashes_replay_cleanly() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let seeds = inputs(&fuzz.join("seeds/vfio_user_session"));
    assert!(
        seeds.iter().any(|p| p.ends_with("qemu-nvme0-boot")),
        "the recorded seeds are missing: {seeds:?}"
    );
    let all: Vec<PathBuf> = seeds
        .into_iter()
        .chain(inputs(&fuzz.join("regressions/vfio_user_session")))
        .collect();
    let baseline = open_fds();
    for path in &all {
        let input = std::fs::read(path).unwrap();
        let (end, errors, replies, left) = replay(&input);
        let name = path.file_name().unwrap().to_string_lossy();
        assert_eq!(left, 0, "{name}: DMA ranges outlived the session");
        assert!(
            matches!(
                end,
                ConnectionEnd::ClientClosed | ConnectionEnd::Protocol(_)
            ),
            "{name}: {end:?}"
        );
        if name.starts_with("qemu-") {
            assert_eq!(end, ConnectionEnd::ClientClosed, "{name}");
            assert_eq!(
                errors.get(&cmd::DMA_MAP),
                None,
                "{name}: recorded DMA_MAPs were refused ({errors:?})"
            );
            assert_eq!(errors.get(&cmd::VERSION), None, "{name}");
            assert_eq!(replies, expected_replies(&input), "{name}: replies");
            assert!(replies > 50, "{name}: only {replies} replies");
        }
        assert_eq!(open_fds(), baseline, "{name}: fds leaked");
    }
}

/// Catches a recorder that loses messages, cuts them, or describes their
/// fds wrongly (a seed whose guest RAM comes back smaller or unsealed
/// replays a different session).
#[test]
fn a_recorded_session_holds_every_message_and_its_fds() {
    use p2plab_vfio_user::record::{seal, FdSpec, FdSpecKind, Record};
    use p2plab_vfio_user::vfio_abi::{VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD};
    use p2plab_vfio_user::{EventFd, SharedMemory};
    use std::os::fd::AsRawFd;
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);

    let dir = std::env::temp_dir().join(format!("p2plab-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("session.rec");
    let mut cfg = config();
    cfg.record_session = Some(file.clone());
    let (mut c, mut srv) = serve_pair_with(cfg, DmaSpace::new());
    c.negotiate();
    let ram = SharedMemory::new("ram", 3 << 20).unwrap();
    assert!(!c.dma_map(0, 3 << 20, 3, Some(ram.fd()), 0).hdr.is_error());
    let efd = EventFd::new(0).unwrap();
    let set = Buf::default()
        .u32(20)
        .u32(VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER)
        .u32(MSIX)
        .u32(0)
        .u32(1)
        .0;
    assert!(!c
        .call_fds(cmd::DEVICE_SET_IRQS, &set, &[efd.as_raw_fd()])
        .hdr
        .is_error());
    c.assert_in_sync();
    drop(c);
    srv.join();

    let bytes = std::fs::read(&file).unwrap();
    let records = record::parse(&bytes);
    let messages: Vec<Hdr> = records
        .iter()
        .filter_map(|r| match r {
            Record::Msg(m) => Some(Hdr::decode(m)),
            _ => None,
        })
        .collect();
    let commands: Vec<u16> = messages.iter().map(|h| h.cmd).collect();
    assert_eq!(
        commands,
        vec![
            cmd::VERSION,
            cmd::DMA_MAP,
            cmd::DEVICE_SET_IRQS,
            cmd::REGION_READ
        ]
    );
    for r in &records {
        if let Record::Msg(m) = r {
            assert_eq!(Hdr::decode(m).size as usize, m.len(), "whole messages");
        }
    }
    let fds: Vec<FdSpec> = records
        .iter()
        .filter_map(|r| match r {
            Record::Fd(spec) => Some(*spec),
            _ => None,
        })
        .collect();
    assert_eq!(
        fds,
        vec![
            FdSpec {
                kind: FdSpecKind::Memfd,
                arg: (3 << 20) / 4096,
                flags: seal::SHRINK | seal::GROW | seal::SEAL,
            },
            FdSpec {
                kind: FdSpecKind::EventFd,
                arg: 0,
                flags: 0,
            },
        ]
    );
    // The file is private and replays without a refused map.
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let (_, errors, _, _) = replay(&bytes);
    assert!(errors.is_empty(), "{errors:?}");
    let _ = std::fs::remove_dir_all(dir);
}
