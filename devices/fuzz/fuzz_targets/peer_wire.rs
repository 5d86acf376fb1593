//! A peer connection as a hostile owner and a hostile user drive it,
//! through the real session code of `devices/peer` without sockets: the
//! user's side ([`UserSession`], which places peer windows in a real
//! `DmaSpace`) and the owner's side ([`UserLink`]) get frames of any bytes
//! with fds of any kind, size and seals, interleaved with well-formed
//! steps (HELLO, BAR, PLACE + ACK) so the fuzzer gets deep, with guest RAM
//! mapped and unmapped under the windows, DMA through them, the owner's
//! placement page and the user's counter page scribbled, and the user cut
//! off.
//!
//! Input: a sequence of steps; the first byte of each picks it (mod 12),
//! and a step cut short ends the input.
//!
//! ```text
//! 0 frame to user    bytes[32] nfds:u8 (mod 4) fd[nfds]
//! 1 frame to owner   bytes[32] nfds:u8 (mod 4) fd[nfds]
//! 2 good HELLO       page:u8 (0 the owner's real page, 1 ours to scribble,
//!                    2 a fresh valid page); the COUNTERS answer goes to
//!                    the owner
//! 3 good BAR         bar:u8 size:u8 slot:u8 (a sealed memfd)
//! 4 PLACE round      bar:u8 addr:u8: the owner publishes and sends a
//!                    PLACE, the user's ACK goes back to the owner
//! 5 scribble page    slot:u8 value:u8 (our placement page; slot's high
//!                    bit: the slot's hole count instead)
//! 6 scribble counts  word:u8 value:u8 (our counter page), then the owner
//!                    reads every slot
//! 7 map guest RAM    addr:u8 len:u8 (with an fd; fd-less if len is odd)
//! 8 unmap            addr:u8 len:u8
//! 9 DMA              addr:u8 kind:u8 (write a marker, read, zero-copy)
//! 10 cut off         the owner revokes the user
//! 11 close           the connection ends; a new one starts
//! fd:                kind:u8 arg:u8 (memfd with seals from arg, sealed
//!                    memfd of a size, pipe, eventfd, socket, /dev/null,
//!                    file, our scribble pages, a fresh page, a read-only
//!                    reopened memfd)
//! ```
//!
//! Catches: a panic anywhere in the sessions or the DMA space (libFuzzer
//! reports it); an accepted frame that does not encode back to its bytes;
//! a peer window left over guest RAM (either order), more windows than
//! the session placed, or any left after the connection ended; DMA that
//! lands in a peer's memory through a placement its owner did not (or no
//! longer) hold, i.e. a stale or revoked window serving; owner counts
//! that go backwards; and fds leaked by any path.
#![no_main]

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use p2plab_peer::memory::{holes_word, placement_word, WritablePage, SLOTS};
use p2plab_peer::wire::{Frame, FRAME, VERSION};
use p2plab_peer::{Inbound, SessionError, UserLink, UserSession};
use p2plab_vfio_user::record::{FdSpec, FdSpecKind};
use p2plab_vfio_user::{Access, DmaSpace, Perms, SharedMemory};

const ADDRS: [u64; 8] = [
    0x1000_0000,
    0x1000_1000,
    0x1000_2000,
    0x1000_8000,
    0x2000_0000,
    0,
    u64::MAX - 0xfff,
    0x1000_0800,
];
const SIZES: [u64; 4] = [0x1000, 0x2000, 0x4000, 0x3000];
const RAM: u64 = 0x10000;
const VALUES: [u64; 6] = [0, 1, 2, 3, u64::MAX, u64::MAX - 1];

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn frame(&mut self) -> Option<[u8; FRAME]> {
        let (head, rest) = self.0.split_first_chunk::<FRAME>()?;
        self.0 = rest;
        Some(*head)
    }
}

/// What the fuzzer, as the owner, sent for one BAR that the user took.
struct SentBar {
    memory: File,
    size: u64,
    slot: u64,
    /// Every address a PLACE put it at (a stale window can only be at one
    /// of them).
    history: Vec<u64>,
    /// The last PLACE the user acknowledged: (seq, addr).
    acked: Option<(u64, Option<u64>)>,
}

/// Which page the session took with its HELLO.
#[derive(Clone, Copy, PartialEq)]
enum SessionPage {
    /// The real owner's (`UserLink`) page: it holds what we published.
    Link,
    /// Ours, scribbled at will.
    Scribbled,
    /// A fresh one nobody writes: every slot stays 0.
    Fresh,
    /// Our counter page (we scribble it as the user).
    Counters,
}

struct World {
    dma: DmaSpace,
    ram: SharedMemory,
    link: UserLink,
    session: UserSession,
    session_page: Option<SessionPage>,
    /// What the link's page holds per slot, as far as we published.
    published: [u64; SLOTS as usize],
    owner_page: WritablePage,
    user_page: WritablePage,
    bars: Vec<(u32, SentBar)>,
    seq: u64,
    marker: u64,
    /// What the owner last read per slot.
    counts: [Inbound; SLOTS as usize],
}

fn make_fd(input: &mut Input<'_>, world: &World) -> Option<OwnedFd> {
    let kind = input.byte()?;
    let arg = input.byte()?;
    let dup = |fd: &OwnedFd| fd.try_clone().ok();
    let size = SIZES[usize::from(arg) % SIZES.len()];
    match kind % 12 {
        0 => p2plab_peer::sealed_memfd(c"fuzz-bar", size).ok(),
        1 => spec(FdSpecKind::Memfd, u32::from(arg >> 4), arg & 0xf),
        2 => spec(FdSpecKind::PipeRead, 0, 0),
        3 => spec(FdSpecKind::EventFd, 0, arg & 1),
        4 => spec(FdSpecKind::Socket, 0, 0),
        5 => spec(FdSpecKind::DevNull, 0, 0),
        6 => spec(FdSpecKind::File, u32::from(arg % 5), 0),
        7 => dup(world.owner_page.fd()),
        8 => dup(world.user_page.fd()),
        9 => WritablePage::create(c"fuzz-fresh")
            .ok()
            .and_then(|p| dup(p.fd())),
        10 => {
            let fd = p2plab_peer::sealed_memfd(c"fuzz-ro", size).ok()?;
            File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .ok()
                .map(OwnedFd::from)
        }
        _ => dup(world.link.placement_fd()),
    }
}

fn spec(kind: FdSpecKind, arg: u32, flags: u8) -> Option<OwnedFd> {
    FdSpec { kind, arg, flags }.create().ok()
}

fn fds(input: &mut Input<'_>, world: &World) -> Option<Vec<OwnedFd>> {
    let n = input.byte()? % 4;
    let mut out = Vec::new();
    for _ in 0..n {
        if let Some(fd) = make_fd(input, world) {
            out.push(fd);
        }
    }
    Some(out)
}

fn check_round_trip(bytes: &[u8; FRAME]) {
    if let Ok(frame) = Frame::decode(bytes) {
        assert_eq!(&frame.encode(), bytes, "{frame:?}");
    }
}

impl World {
    fn new() -> Self {
        let dma = DmaSpace::with_timeout(Duration::from_millis(50));
        Self {
            session: UserSession::new(dma.clone()),
            dma,
            ram: SharedMemory::new("fuzz-ram", RAM).expect("memfd"),
            link: UserLink::new().expect("page"),
            session_page: None,
            published: [0; SLOTS as usize],
            owner_page: WritablePage::create(c"fuzz-owner-page").expect("page"),
            user_page: WritablePage::create(c"fuzz-user-page").expect("page"),
            bars: Vec::new(),
            seq: 0,
            marker: 0x5a5a_0000_0000_0000,
            counts: [Inbound::default(); SLOTS as usize],
        }
    }

    /// The connection ends (as the registry ends it on any error).
    fn close(&mut self) {
        self.session.close();
        assert!(
            self.dma.peer_windows().is_empty(),
            "windows outlived their connection"
        );
        self.session = UserSession::new(self.dma.clone());
        self.session_page = None;
        self.bars.clear();
    }

    /// Feeds the user; what it answers goes to the owner.
    fn to_user(&mut self, bytes: &[u8; FRAME], fds: Vec<OwnedFd>, page: Option<SessionPage>) {
        let frame = Frame::decode(bytes).ok();
        let memory = match (&frame, fds.first()) {
            (Some(Frame::Bar { .. }), Some(fd)) => fd.try_clone().ok().map(File::from),
            _ => None,
        };
        match self.session.on_bytes(bytes, fds) {
            Ok(reply) => {
                match frame {
                    Some(Frame::Hello { .. }) => self.session_page = page,
                    Some(Frame::Bar { bar, size, slot }) => {
                        if let Some(memory) = memory {
                            self.bars.push((
                                bar,
                                SentBar {
                                    memory,
                                    size,
                                    slot,
                                    history: Vec::new(),
                                    acked: None,
                                },
                            ));
                        }
                    }
                    Some(Frame::Place { bar, seq, addr }) => {
                        if let Some((_, b)) = self.bars.iter_mut().find(|(n, _)| *n == bar) {
                            b.history.extend(addr);
                            b.acked = Some((seq, addr));
                        }
                    }
                    _ => {}
                }
                if let Some(reply) = reply {
                    let fds: Vec<OwnedFd> = reply.fd.into_iter().collect();
                    if self.link.on_bytes(&reply.frame.encode(), fds).is_err() {
                        self.link.revoke();
                    }
                }
            }
            Err(SessionError::Protocol(_) | SessionError::Stuck(_) | SessionError::Local(_)) => {
                self.close();
            }
        }
    }

    /// What the session's page holds for `slot` now.
    fn page_value(&self, slot: u64) -> Option<u64> {
        let word = placement_word(slot);
        match self.session_page? {
            SessionPage::Fresh => Some(0),
            SessionPage::Scribbled => Some(self.owner_page.load(word)),
            SessionPage::Counters => Some(self.user_page.load(word)),
            SessionPage::Link if self.link.is_dead() => Some(u64::MAX),
            SessionPage::Link => self.published.get(word).copied(),
        }
    }

    fn check_windows(&self) {
        let windows = self.dma.peer_windows();
        assert!(
            windows.len() <= self.session.windows(),
            "{windows:?} but the session placed {}",
            self.session.windows()
        );
        for (gpa, len) in windows {
            for m in self.dma.mappings() {
                let overlap = m.gpa < gpa.saturating_add(len) && gpa < m.gpa.saturating_add(m.len);
                assert!(
                    !(overlap && m.fd_backed),
                    "peer window {gpa:#x}+{len:#x} over guest RAM {m:?}"
                );
            }
        }
    }

    /// A marker written at `gpa` may sit in a BAR's memory only at an
    /// offset where a placement the owner still holds puts it.
    fn check_marker(&self, gpa: u64, marker: u64) {
        for (bar, b) in &self.bars {
            for &at in &b.history {
                let Some(offset) = gpa.checked_sub(at) else {
                    continue;
                };
                if offset.saturating_add(8) > b.size {
                    continue;
                }
                let mut seen = [0u8; 8];
                if b.memory.read_exact_at(&mut seen, offset).is_err() {
                    continue;
                }
                if u64::from_le_bytes(seen) != marker {
                    continue;
                }
                let held = b.acked.is_some_and(|(seq, addr)| {
                    addr == Some(at) && self.page_value(b.slot) == Some(seq)
                });
                assert!(
                    held,
                    "DMA at {gpa:#x} reached BAR {bar} through placement {at:#x}, \
                     which its owner does not hold (acked {:?}, page {:?})",
                    b.acked,
                    self.page_value(b.slot)
                );
            }
        }
    }

    fn step(&mut self, input: &mut Input<'_>) -> Option<()> {
        match input.byte()? % 12 {
            0 => {
                let bytes = input.frame()?;
                check_round_trip(&bytes);
                let fds = fds(input, self)?;
                // An fd of our scribble page makes it the session's page.
                let page = fds.first().map(|fd| {
                    if same_file(fd, self.owner_page.fd()) {
                        SessionPage::Scribbled
                    } else if same_file(fd, self.user_page.fd()) {
                        SessionPage::Counters
                    } else if same_file(fd, self.link.placement_fd()) {
                        SessionPage::Link
                    } else {
                        SessionPage::Fresh
                    }
                });
                self.to_user(&bytes, fds, page);
            }
            1 => {
                let bytes = input.frame()?;
                check_round_trip(&bytes);
                let fds = fds(input, self)?;
                if self.link.on_bytes(&bytes, fds).is_err() {
                    self.link.revoke();
                }
            }
            2 => {
                let (fd, page) = match input.byte()? % 3 {
                    0 => (
                        self.link.placement_fd().try_clone().ok()?,
                        SessionPage::Link,
                    ),
                    1 => (
                        self.owner_page.fd().try_clone().ok()?,
                        SessionPage::Scribbled,
                    ),
                    _ => {
                        let p = WritablePage::create(c"fuzz-fresh").ok()?;
                        (p.fd().try_clone().ok()?, SessionPage::Fresh)
                    }
                };
                let hello = Frame::Hello { version: VERSION }.encode();
                self.to_user(&hello, vec![fd], Some(page));
            }
            3 => {
                let bar = u32::from(input.byte()? % 6);
                let size = SIZES[usize::from(input.byte()?) % SIZES.len()];
                let slot = u64::from(input.byte()? % 7);
                let fd = p2plab_peer::sealed_memfd(c"fuzz-bar", size).ok()?;
                let frame = Frame::Bar { bar, size, slot }.encode();
                self.to_user(&frame, vec![fd], None);
            }
            4 => {
                let bar = u32::from(input.byte()? % 6);
                let pick = input.byte()?;
                let addr = (pick < 240).then(|| ADDRS[usize::from(pick) % ADDRS.len()]);
                self.seq += 1;
                let slot = self
                    .bars
                    .iter()
                    .find(|(n, _)| *n == bar)
                    .map_or(u64::from(bar), |(_, b)| b.slot);
                self.link.publish(bar, slot, self.seq);
                if !self.link.is_dead() {
                    if let Some(word) = self.published.get_mut(placement_word(slot)) {
                        *word = self.seq;
                    }
                }
                let frame = Frame::Place {
                    bar,
                    seq: self.seq,
                    addr,
                }
                .encode();
                self.to_user(&frame, Vec::new(), None);
            }
            5 => {
                let pick = input.byte()?;
                let slot = u64::from(pick % 7);
                let value = match input.byte()? {
                    v if v < 200 => self.seq.wrapping_sub(u64::from(v % 3)),
                    v => VALUES[usize::from(v) % VALUES.len()],
                };
                // High bit: the slot's hole count (any value only makes
                // the user forget what it knew to be in memory).
                let word = if pick & 0x80 != 0 {
                    holes_word(slot)
                } else {
                    placement_word(slot)
                };
                self.owner_page.store(word, value);
            }
            6 => {
                let word = usize::from(input.byte()? % 14);
                let value = VALUES[usize::from(input.byte()?) % VALUES.len()]
                    .wrapping_add(u64::from(self.marker as u8));
                self.user_page.store(word, value);
                for slot in 0..SLOTS {
                    let now = self.link.counts(slot);
                    let before = self.counts[slot as usize];
                    if self.link.is_dead() && now == Inbound::default() {
                        // A liar's counts are dropped.
                    } else {
                        assert!(
                            now.written >= before.written && now.read >= before.read,
                            "counts went backwards: {before:?} -> {now:?}"
                        );
                    }
                    self.counts[slot as usize] = now;
                }
            }
            7 => {
                let gpa = ADDRS[usize::from(input.byte()?) % ADDRS.len()];
                let len_pick = input.byte()?;
                let len = SIZES[usize::from(len_pick >> 1) % SIZES.len()];
                if len_pick & 1 == 1 {
                    let _ = self.dma.map_message_only(gpa, len, Perms::READ_WRITE);
                } else if let Ok(fd) = self.ram.as_fd().try_clone_to_owned() {
                    let _ = self.dma.map_fd(gpa, len, Perms::READ_WRITE, fd, 0);
                }
            }
            8 => {
                let gpa = ADDRS[usize::from(input.byte()?) % ADDRS.len()];
                let len = SIZES[usize::from(input.byte()?) % SIZES.len()];
                let _ = self.dma.unmap(gpa, len);
            }
            9 => {
                let pick = input.byte()?;
                let gpa =
                    ADDRS[usize::from(pick) % ADDRS.len()].wrapping_add(u64::from(pick >> 3) * 8);
                match input.byte()? % 4 {
                    0 => {
                        self.marker += 1;
                        let marker = self.marker;
                        if self.dma.write(gpa, &marker.to_le_bytes()).is_ok() {
                            self.check_marker(gpa, marker);
                        }
                    }
                    1 => {
                        let mut buf = [0u8; 64];
                        let _ = self.dma.read(gpa, &mut buf);
                    }
                    2 => {
                        self.marker += 1;
                        let marker = self.marker;
                        let wrote = self.dma.with_slices(&[(gpa, 8)], Access::Write, |s| {
                            s.iter().for_each(|s| s.copy_from(&marker.to_le_bytes()));
                        });
                        if matches!(wrote, Ok(Some(()))) {
                            self.check_marker(gpa, marker);
                        }
                    }
                    _ => {
                        let _ = self.dma.with_slices(&[(gpa, 64)], Access::Read, |_| ());
                    }
                }
            }
            10 => self.link.revoke(),
            _ => self.close(),
        }
        self.check_windows();
        Some(())
    }
}

fn same_file(a: &OwnedFd, b: &OwnedFd) -> bool {
    let id = |fd: &OwnedFd| {
        File::from(fd.try_clone().ok()?).metadata().ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        })
    };
    id(a).is_some() && id(a) == id(b)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fuzz_target!(|data: &[u8]| {
    let fds_before = open_fds();
    {
        let mut world = World::new();
        let mut input = Input(data);
        let mut steps = 0;
        while steps < 256 && world.step(&mut input).is_some() {
            steps += 1;
        }
        world.close();
    }
    assert_eq!(open_fds(), fds_before, "fds leaked");
});
