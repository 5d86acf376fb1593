//! The two ends of one peer connection as state machines, without
//! sockets: the registry's reader threads feed them the frames and fds
//! they receive and send what they answer; the `peer_session` fuzz target
//! feeds them anything.
//!
//! - [`UserSession`]: what the connecting server (the user) knows of one
//!   owner: its placement page, the BARs it shared, the peer windows they
//!   have in our [`DmaSpace`].
//! - [`UserLink`]: what the listening server (the owner) knows of one
//!   user: the placement page it writes for it, the PLACEs it sent and the
//!   ACKs it got, the user's counter page.
//!
//! Both check every frame and every fd; an error ends the connection.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use p2plab_ratelimit::log_limited;
use p2plab_vfio_user::{DmaError, DmaSpace, LocalWindowId};
use tracing::{debug, warn};

use crate::memory::{
    counter_words, holes_word, placement_word, verify_shared_fd, PeerMemory, ReadOnlyPage,
    WritablePage, REVOKED, SLOTS,
};
use crate::route::Route;
use crate::wire::{Frame, FRAME, MAX_BAR, VERSION};
use crate::Inbound;

const BARS: usize = MAX_BAR as usize + 1;

/// Why a connection must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionError {
    /// The other side sent something we cannot accept: a bad frame, a
    /// frame out of order, a wrong number or kind of fds, a counter that
    /// went backwards.
    Protocol(String),
    /// A window could not be moved or removed in time: an access through
    /// it still ran after the DMA space's timeout (the window is gone
    /// anyway).
    Stuck(String),
    /// We could not set up our side (a page, a mapping).
    Local(String),
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::Protocol(why) => write!(f, "peer protocol violation: {why}"),
            SessionError::Stuck(why) => write!(f, "peer window stuck: {why}"),
            SessionError::Local(why) => write!(f, "peer session setup: {why}"),
        }
    }
}

fn protocol(why: impl Into<String>) -> SessionError {
    SessionError::Protocol(why.into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn exactly_one_fd(fds: Vec<OwnedFd>, what: &str) -> Result<OwnedFd, SessionError> {
    let count = fds.len();
    let [fd]: [OwnedFd; 1] = fds
        .try_into()
        .map_err(|_| protocol(format!("{what} needs exactly 1 fd, got {count}")))?;
    Ok(fd)
}

fn no_fds(fds: &[OwnedFd], what: &str) -> Result<(), SessionError> {
    if fds.is_empty() {
        Ok(())
    } else {
        Err(protocol(format!("{} fds with {what}", fds.len())))
    }
}

/// A frame to send back, with the fd that rides along.
#[derive(Debug)]
pub struct Reply {
    /// The frame.
    pub frame: Frame,
    /// Its fd (COUNTERS carries our counter page).
    pub fd: Option<OwnedFd>,
}

// ----- user side -----

/// One BAR of an owner, as its user sees it.
struct PeerBar {
    memory: Arc<PeerMemory>,
    size: u64,
    slot: u64,
    window: Option<LocalWindowId>,
    /// The last PLACE applied (sequence numbers only grow).
    last_seq: u64,
}

/// The user's side of one connection: what it knows of one owner.
/// Dropping it (or [`close`](Self::close)) removes every window it placed.
pub struct UserSession {
    dma: DmaSpace,
    /// Whether our DMA reaches this owner's BARs at their bus addresses
    /// (else no window is placed: see [`Route::Translated`]).
    route: Route,
    placements: Option<Arc<ReadOnlyPage>>,
    counters: Option<Arc<WritablePage>>,
    bars: HashMap<u32, PeerBar>,
}

impl std::fmt::Debug for UserSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserSession")
            .field("hello", &self.placements.is_some())
            .field("bars", &self.bars.len())
            .field("route", &self.route)
            .finish()
    }
}

impl UserSession {
    /// A session placing the owner's BARs in `dma` at their bus
    /// addresses (no IOMMU between us, or one switch without ACS
    /// redirect).
    pub fn new(dma: DmaSpace) -> Self {
        Self::with_route(dma, Route::BusAddress)
    }

    /// A session for an owner our DMA reaches as `route` says. With
    /// [`Route::Translated`] every frame and fd is checked and every
    /// placement acknowledged as with [`Route::BusAddress`], but no window
    /// is placed: a DMA to the BAR's bus address faults as it would at the
    /// IOMMU, and the IOVAs the guest maps for the BAR are served by
    /// message.
    pub fn with_route(dma: DmaSpace, route: Route) -> Self {
        Self {
            dma,
            route,
            placements: None,
            counters: None,
            bars: HashMap::new(),
        }
    }

    /// Handles one frame from the owner and the fds that came with it;
    /// returns what to answer. An error ends the connection (then call
    /// [`close`](Self::close), or drop the session).
    pub fn on_bytes(
        &mut self,
        bytes: &[u8; FRAME],
        fds: Vec<OwnedFd>,
    ) -> Result<Option<Reply>, SessionError> {
        let frame = Frame::decode(bytes).map_err(|e| protocol(e.0))?;
        match frame {
            Frame::Hello { version } => self.hello(version, fds).map(Some),
            Frame::Bar { bar, size, slot } => {
                self.add_bar(bar, size, slot, fds)?;
                Ok(None)
            }
            Frame::Place { bar, seq, addr } => {
                no_fds(&fds, "a PLACE")?;
                self.place(bar, seq, addr)?;
                Ok(Some(Reply {
                    frame: Frame::Ack { bar, seq },
                    fd: None,
                }))
            }
            Frame::Ack { .. } | Frame::Counters { .. } => {
                Err(protocol(format!("a user's frame from an owner: {frame:?}")))
            }
        }
    }

    fn hello(&mut self, version: u64, fds: Vec<OwnedFd>) -> Result<Reply, SessionError> {
        if self.placements.is_some() {
            return Err(protocol("a second HELLO"));
        }
        if version != VERSION {
            return Err(protocol(format!(
                "protocol version {version}, ours is {VERSION} (servers of another p2plab build?)"
            )));
        }
        let page = ReadOnlyPage::from_received(exactly_one_fd(fds, "HELLO")?)
            .map_err(|why| protocol(format!("placement page: {why}")))?;
        let counters = WritablePage::create(c"p2plab-peer-counters")
            .map_err(|e| SessionError::Local(format!("counter page: {e}")))?;
        let fd = counters
            .fd()
            .try_clone()
            .map_err(|e| SessionError::Local(format!("counter page: {e}")))?;
        self.placements = Some(Arc::new(page));
        self.counters = Some(Arc::new(counters));
        Ok(Reply {
            frame: Frame::Counters { version: VERSION },
            fd: Some(fd),
        })
    }

    fn add_bar(
        &mut self,
        bar: u32,
        size: u64,
        slot: u64,
        fds: Vec<OwnedFd>,
    ) -> Result<(), SessionError> {
        let (Some(placements), Some(counters)) = (&self.placements, &self.counters) else {
            return Err(protocol("a BAR before HELLO"));
        };
        let memory = exactly_one_fd(fds, "a BAR")?;
        if size == 0 || self.bars.contains_key(&bar) || slot >= SLOTS {
            return Err(protocol(format!(
                "BAR {bar}: empty, announced twice or slot {slot} out of range"
            )));
        }
        if self.bars.values().any(|b| b.slot == slot) {
            return Err(protocol(format!("BAR {bar}: slot {slot} already taken")));
        }
        verify_shared_fd(&memory, size).map_err(|why| protocol(format!("BAR {bar}: {why}")))?;
        let memory = PeerMemory::new(
            memory,
            size,
            Arc::clone(counters),
            Arc::clone(placements),
            slot,
        )
        .map_err(|e| protocol(format!("BAR {bar}: {e}")))?;
        self.bars.insert(
            bar,
            PeerBar {
                memory: Arc::new(memory),
                size,
                slot,
                window: None,
                last_seq: 0,
            },
        );
        Ok(())
    }

    /// Applies a placement; returns once no access runs through the old
    /// one. A placement we cannot take (overlap with another window or
    /// guest RAM) leaves no window: DMA there takes the message path.
    fn place(&mut self, bar: u32, seq: u64, addr: Option<u64>) -> Result<(), SessionError> {
        let b = self
            .bars
            .get_mut(&bar)
            .ok_or_else(|| protocol(format!("PLACE for unknown BAR {bar}")))?;
        if seq <= b.last_seq || seq == REVOKED {
            return Err(protocol(format!(
                "BAR {bar}: PLACE {seq} after PLACE {}",
                b.last_seq
            )));
        }
        if let Some(a) = addr {
            if a.checked_add(b.size).is_none() {
                return Err(protocol(format!(
                    "BAR {bar} at {a:#x} wraps the address space"
                )));
            }
        }
        b.last_seq = seq;
        if self.route == Route::Translated {
            // Nothing to place: no window can serve this BAR (and none
            // was ever placed, so none has to wait for accesses).
            b.memory.set_applied(seq);
            debug!(
                bar,
                ?addr,
                seq,
                "peer BAR placed (reached through the IOMMU: no window)"
            );
            return Ok(());
        }
        let stuck = |e: DmaError| SessionError::Stuck(format!("BAR {bar}: {e}"));
        let dma = &self.dma;
        match (b.window, addr) {
            (Some(id), Some(a)) if dma.peer_window(id).is_some_and(|(gpa, _)| gpa == a) => {}
            (Some(id), Some(a)) => match dma.move_peer_window(id, a) {
                Ok(()) => {}
                Err(DmaError::UnknownWindow) => {
                    // Guest RAM mapped over it took it away: place anew.
                    b.window = add_window(dma, bar, a, b);
                }
                Err(e @ DmaError::StillInUse { .. }) => {
                    b.window = None;
                    return Err(stuck(e));
                }
                Err(e) => {
                    warn!(bar, addr = a, "peer window refused: {e}");
                    b.window = None;
                }
            },
            (None, Some(a)) => b.window = add_window(dma, bar, a, b),
            (Some(id), None) => {
                b.window = None;
                dma.remove_peer_window(id).map_err(stuck)?;
            }
            (None, None) => {}
        }
        // Only now, with the window where PLACE `seq` says: accesses
        // through it are served (before, they took the path below it).
        b.memory.set_applied(seq);
        debug!(bar, ?addr, seq, "peer BAR placed");
        Ok(())
    }

    /// Removes every window this session placed (the connection ended).
    pub fn close(&mut self) {
        for b in self.bars.values_mut() {
            if let Some(id) = b.window.take() {
                if let Err(e) = self.dma.remove_peer_window(id) {
                    warn!("peer window removal: {e}");
                }
            }
        }
    }

    /// Windows this session has placed right now.
    pub fn windows(&self) -> usize {
        self.bars.values().filter(|b| b.window.is_some()).count()
    }
}

fn add_window(dma: &DmaSpace, bar: u32, addr: u64, b: &PeerBar) -> Option<LocalWindowId> {
    let memory: Arc<dyn p2plab_vfio_user::LocalMemory> = b.memory.clone();
    match dma.add_peer_window(addr, b.size, memory, 0) {
        Ok(id) => Some(id),
        Err(e) => {
            warn!(bar, addr, "peer window refused: {e}");
            None
        }
    }
}

impl Drop for UserSession {
    fn drop(&mut self) {
        self.close();
    }
}

// ----- owner side -----

#[derive(Default)]
struct LinkState {
    /// Highest PLACE sequence sent, per BAR index.
    sent: [u64; BARS],
    /// Highest PLACE sequence acknowledged, per BAR index.
    acked: [u64; BARS],
    /// The user's counter page, once COUNTERS came.
    counters: Option<ReadOnlyPage>,
    /// Per slot, the counts last read and found plausible.
    seen: [Inbound; SLOTS as usize],
    /// A counter went backwards: the page is not read any more and the
    /// user's counts are worth nothing.
    lied: bool,
}

/// The owner's side of one connection: what it knows of one user.
pub struct UserLink {
    placements: WritablePage,
    state: Mutex<LinkState>,
    changed: Condvar,
    dead: AtomicBool,
}

impl std::fmt::Debug for UserLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserLink")
            .field("dead", &self.is_dead())
            .finish()
    }
}

impl UserLink {
    /// A link with a fresh placement page (every slot 0: nothing placed).
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            placements: WritablePage::create(c"p2plab-peer-placements")?,
            state: Mutex::new(LinkState::default()),
            changed: Condvar::new(),
            dead: AtomicBool::new(false),
        })
    }

    /// The first frame to send, with [`placement_fd`](Self::placement_fd).
    pub fn hello(&self) -> Frame {
        Frame::Hello { version: VERSION }
    }

    /// The placement page, to send with HELLO.
    pub fn placement_fd(&self) -> &OwnedFd {
        self.placements.fd()
    }

    /// BAR `bar` (slot `slot`) is about to get PLACE `seq`: from now on
    /// the user's window for an older placement serves no new access.
    /// Call before sending the PLACE. Does nothing once the link is cut.
    pub fn publish(&self, bar: u32, slot: u64, seq: u64) {
        let mut state = lock(&self.state);
        if self.is_dead() {
            return;
        }
        if let Some(sent) = state.sent.get_mut(bar as usize) {
            *sent = (*sent).max(seq);
        }
        self.placements.store(placement_word(slot), seq);
    }

    /// The owner is punching holes into slot `slot`'s memory: the user
    /// forgets which of its pages it knew to be in memory (it reads
    /// through its mapping only there) before its next access. Call
    /// right before punching and right after (see
    /// [`PeerRegistry::holes_changing`](crate::PeerRegistry::holes_changing)).
    /// Does nothing once the link is cut.
    pub fn holes_changing(&self, slot: u64) {
        let _state = lock(&self.state);
        if self.is_dead() {
            return;
        }
        let word = holes_word(slot);
        self.placements
            .store(word, self.placements.load(word).wrapping_add(1));
    }

    /// Handles one frame from the user and the fds that came with it. An
    /// error ends the connection.
    pub fn on_bytes(&self, bytes: &[u8; FRAME], fds: Vec<OwnedFd>) -> Result<(), SessionError> {
        let frame = Frame::decode(bytes).map_err(|e| protocol(e.0))?;
        match frame {
            Frame::Ack { bar, seq } => {
                no_fds(&fds, "an ACK")?;
                let mut state = lock(&self.state);
                let sent = state.sent.get(bar as usize).copied().unwrap_or(0);
                if seq == 0 || seq > sent {
                    return Err(protocol(format!(
                        "ACK {seq} of BAR {bar}, whose last PLACE was {sent}"
                    )));
                }
                if let Some(acked) = state.acked.get_mut(bar as usize) {
                    *acked = (*acked).max(seq);
                }
                drop(state);
                self.changed.notify_all();
                Ok(())
            }
            Frame::Counters { version } => {
                if version != VERSION {
                    return Err(protocol(format!(
                        "protocol version {version}, ours is {VERSION}"
                    )));
                }
                let fd = exactly_one_fd(fds, "COUNTERS")?;
                let mut state = lock(&self.state);
                if state.counters.is_some() {
                    return Err(protocol("a second COUNTERS"));
                }
                let page = ReadOnlyPage::from_received(fd)
                    .map_err(|why| protocol(format!("counter page: {why}")))?;
                state.counters = Some(page);
                Ok(())
            }
            Frame::Bar { .. } | Frame::Place { .. } | Frame::Hello { .. } => {
                Err(protocol(format!("an owner's frame from a user: {frame:?}")))
            }
        }
    }

    /// Waits for the ACK of PLACE `seq` of `bar` until `deadline`; false
    /// if the link was cut or the user was too slow.
    pub fn wait_ack(&self, bar: u32, seq: u64, deadline: Instant) -> bool {
        let mut state = lock(&self.state);
        loop {
            if state.acked.get(bar as usize).is_some_and(|&a| a >= seq) {
                return true;
            }
            let now = Instant::now();
            if self.is_dead() || now >= deadline {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// What the user counted for `slot`, as far as it is plausible: the
    /// counts only grow, so one that went backwards cuts the user off and
    /// all its counts are dropped (none of them can be believed). Never
    /// panics, whatever the page holds.
    pub fn counts(&self, slot: u64) -> Inbound {
        let mut state = lock(&self.state);
        let Some(index) = usize::try_from(slot).ok().filter(|&i| i < SLOTS as usize) else {
            return Inbound::default();
        };
        if state.lied {
            return Inbound::default();
        }
        let seen = state.seen[index];
        let (w, r) = counter_words(slot);
        let Some(now) = state.counters.as_ref().map(|page| Inbound {
            written: page.load(w),
            read: page.load(r),
        }) else {
            return seen;
        };
        if now.written < seen.written || now.read < seen.read {
            state.lied = true;
            self.revoke_locked();
            log_limited!(
                warn,
                slot,
                before = ?seen,
                now = ?now,
                "a peer user's byte counts went backwards: cut off, its counts dropped"
            );
            return Inbound::default();
        }
        state.seen[index] = now;
        now
    }

    /// Cuts the user off: every placement in its page becomes
    /// [`REVOKED`], so none of its windows serves a new access, and
    /// waiters for its ACKs return.
    pub fn revoke(&self) {
        let _state = lock(&self.state);
        self.revoke_locked();
    }

    fn revoke_locked(&self) {
        self.dead.store(true, Ordering::Release);
        for slot in 0..SLOTS {
            self.placements.store(placement_word(slot), REVOKED);
        }
        self.changed.notify_all();
    }

    /// Whether the link was cut (revoked, or the user lied).
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{add_seals, memfd, PAGE};
    use p2plab_vfio_user::record::{seal, FdSpec, FdSpecKind};
    use std::os::fd::AsRawFd;

    fn spec(kind: FdSpecKind, pages: u32, flags: u8) -> OwnedFd {
        FdSpec {
            kind,
            arg: pages,
            flags,
        }
        .create()
        .unwrap()
    }

    /// A memfd of `size` bytes with exactly `seals`.
    fn sealed(size: u64, seals: i32) -> OwnedFd {
        let fd = memfd(c"test", size).unwrap();
        if seals != 0 {
            add_seals(&fd, seals).unwrap();
        }
        fd
    }

    fn reopened_read_only(fd: &OwnedFd) -> OwnedFd {
        std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .into()
    }

    fn is_protocol(r: Result<Option<Reply>, SessionError>) -> bool {
        matches!(r, Err(SessionError::Protocol(_)))
    }

    fn hello() -> [u8; FRAME] {
        Frame::Hello { version: VERSION }.encode()
    }

    fn good_page() -> OwnedFd {
        WritablePage::create(c"page")
            .unwrap()
            .fd()
            .try_clone()
            .unwrap()
    }

    /// A session that took a good HELLO.
    fn greeted(dma: &DmaSpace) -> UserSession {
        let mut s = UserSession::new(dma.clone());
        let reply = s.on_bytes(&hello(), vec![good_page()]).unwrap().unwrap();
        assert_eq!(reply.frame, Frame::Counters { version: VERSION });
        let counters = reply.fd.expect("the counter page rides along");
        // SAFETY: F_GET_SEALS only reads the fd's state.
        let seals = unsafe { libc::fcntl(counters.as_raw_fd(), libc::F_GET_SEALS) };
        assert_eq!(
            seals & crate::memory::PAGE_SEALS,
            crate::memory::PAGE_SEALS,
            "our counter page is sealed against the owner's writes"
        );
        s
    }

    fn bar(size: u64, slot: u64) -> [u8; FRAME] {
        Frame::Bar { bar: 2, size, slot }.encode()
    }

    /// Catches a user that accepts, or crashes on, a HELLO or BAR whose fd
    /// is of the wrong kind (pipe, eventfd, socket, file, /dev/null), the
    /// wrong size, missing a seal (a placement page its owner's peers could
    /// write, memory that could shrink under a mapping), opened read-only,
    /// missing or doubled; and one that takes frames out of order.
    #[test]
    fn the_user_checks_every_fd_and_frame_it_gets() {
        let dma = DmaSpace::new();
        let page_seals = crate::memory::PAGE_SEALS;
        let bad_pages: Vec<(&str, Vec<OwnedFd>)> = vec![
            ("no fd", vec![]),
            ("two fds", vec![good_page(), good_page()]),
            ("a pipe", vec![spec(FdSpecKind::PipeRead, 0, 0)]),
            ("an eventfd", vec![spec(FdSpecKind::EventFd, 0, 0)]),
            ("a socket", vec![spec(FdSpecKind::Socket, 0, 0)]),
            ("/dev/null", vec![spec(FdSpecKind::DevNull, 0, 0)]),
            ("a file", vec![spec(FdSpecKind::File, 1, 0)]),
            ("an unsealed memfd", vec![sealed(PAGE as u64, 0)]),
            (
                "a page others may write",
                vec![sealed(PAGE as u64, crate::memory::REQUIRED_SEALS)],
            ),
            ("two pages", vec![sealed(2 * PAGE as u64, page_seals)]),
            ("an empty page", vec![sealed(0, page_seals)]),
        ];
        for (what, fds) in bad_pages {
            let mut s = UserSession::new(dma.clone());
            assert!(is_protocol(s.on_bytes(&hello(), fds)), "HELLO with {what}");
        }
        let mut s = UserSession::new(dma.clone());
        let old = Frame::Hello { version: 1 }.encode();
        assert!(is_protocol(s.on_bytes(&old, vec![good_page()])), "version");
        let mut s = UserSession::new(dma.clone());
        let memory = sealed(4096, crate::memory::REQUIRED_SEALS);
        assert!(
            is_protocol(s.on_bytes(&bar(4096, 0), vec![memory])),
            "BAR before HELLO"
        );
        let mut s = greeted(&dma);
        assert!(
            is_protocol(s.on_bytes(&hello(), vec![good_page()])),
            "HELLO twice"
        );

        let required = crate::memory::REQUIRED_SEALS;
        let good = sealed(8192, required);
        let bad_bars: Vec<(&str, Vec<OwnedFd>)> = vec![
            ("no fd", vec![]),
            (
                "two fds",
                vec![sealed(8192, required), sealed(8192, required)],
            ),
            ("a pipe", vec![spec(FdSpecKind::PipeWrite, 0, 0)]),
            ("a file", vec![spec(FdSpecKind::File, 2, 0)]),
            (
                "memory that may shrink",
                vec![sealed(8192, libc::F_SEAL_GROW)],
            ),
            (
                "memory that may grow",
                vec![spec(FdSpecKind::Memfd, 2, seal::SHRINK)],
            ),
            ("too little memory", vec![sealed(4096, required)]),
            ("read-only memory", vec![reopened_read_only(&good)]),
            ("a write-sealed page", vec![sealed(8192, page_seals)]),
        ];
        for (what, fds) in bad_bars {
            let mut s = greeted(&dma);
            assert!(
                is_protocol(s.on_bytes(&bar(8192, 0), fds)),
                "BAR with {what}"
            );
        }
        let mut s = greeted(&dma);
        assert!(
            is_protocol(s.on_bytes(&bar(0, 0), vec![sealed(4096, required)])),
            "empty"
        );
        assert!(
            is_protocol(s.on_bytes(&bar(4096, 6), vec![sealed(4096, required)])),
            "slot 6"
        );
        assert_eq!(
            s.on_bytes(&bar(8192, 1), vec![good])
                .unwrap()
                .map(|r| r.frame),
            None
        );
        let other = Frame::Bar {
            bar: 4,
            size: 4096,
            slot: 1,
        }
        .encode();
        assert!(
            is_protocol(s.on_bytes(&other, vec![sealed(4096, required)])),
            "slot taken"
        );

        let place = |seq| {
            Frame::Place {
                bar: 2,
                seq,
                addr: Some(0x1000_0000),
            }
            .encode()
        };
        let mut s2 = greeted(&dma);
        assert!(
            is_protocol(s2.on_bytes(&place(1), vec![])),
            "PLACE of an unknown BAR"
        );
        assert!(
            is_protocol(s.on_bytes(&place(1), vec![good_page()])),
            "PLACE with an fd"
        );
        let mut s = greeted(&dma);
        s.on_bytes(&bar(8192, 1), vec![sealed(8192, required)])
            .unwrap();
        let ack = s.on_bytes(&place(5), vec![]).unwrap().unwrap();
        assert_eq!(ack.frame, Frame::Ack { bar: 2, seq: 5 });
        assert_eq!(dma.peer_windows(), vec![(0x1000_0000, 8192)]);
        assert!(
            is_protocol(s.on_bytes(&place(5), vec![])),
            "a PLACE not newer"
        );
        let wraps = Frame::Place {
            bar: 2,
            seq: 9,
            addr: Some(u64::MAX - 4096),
        }
        .encode();
        assert!(
            is_protocol(s.on_bytes(&wraps, vec![])),
            "wrapping placement"
        );
        let from_user = Frame::Ack { bar: 2, seq: 1 }.encode();
        assert!(
            is_protocol(s.on_bytes(&from_user, vec![])),
            "an ACK from an owner"
        );
        drop(s);
        assert_eq!(
            dma.peer_windows(),
            vec![],
            "the session took its window along"
        );
    }

    /// Catches an owner that accepts a user's counter page of the wrong
    /// kind, size or seals, a second one, an ACK of a placement it never
    /// sent (a user acknowledging ahead would make the owner skip the
    /// wait for running accesses), or an owner's frame from a user.
    #[test]
    fn the_owner_checks_every_fd_and_frame_it_gets() {
        let counters = |fds| {
            UserLink::new()
                .unwrap()
                .on_bytes(&Frame::Counters { version: VERSION }.encode(), fds)
        };
        let page_seals = crate::memory::PAGE_SEALS;
        for (what, fds) in [
            ("no fd", vec![]),
            ("two fds", vec![good_page(), good_page()]),
            ("a pipe", vec![spec(FdSpecKind::PipeRead, 0, 0)]),
            ("a socket", vec![spec(FdSpecKind::Socket, 0, 0)]),
            ("an unsealed memfd", vec![sealed(PAGE as u64, 0)]),
            ("a short page", vec![sealed(16, page_seals)]),
        ] {
            assert!(
                matches!(counters(fds), Err(SessionError::Protocol(_))),
                "COUNTERS with {what}"
            );
        }
        let link = UserLink::new().unwrap();
        let frame = Frame::Counters { version: VERSION }.encode();
        link.on_bytes(&frame, vec![good_page()]).unwrap();
        assert!(link.on_bytes(&frame, vec![good_page()]).is_err(), "twice");
        let ack = |seq| Frame::Ack { bar: 2, seq }.encode();
        assert!(
            link.on_bytes(&ack(1), vec![]).is_err(),
            "nothing was placed"
        );
        link.publish(2, 0, 3);
        assert!(
            link.on_bytes(&ack(4), vec![]).is_err(),
            "ahead of the PLACE"
        );
        assert!(link.on_bytes(&ack(3), vec![good_page()]).is_err(), "an fd");
        link.on_bytes(&ack(3), vec![]).unwrap();
        assert!(link.wait_ack(2, 3, Instant::now()));
        let hello = Frame::Hello { version: VERSION }.encode();
        assert!(link.on_bytes(&hello, vec![good_page()]).is_err());
        assert!(!link.is_dead(), "the registry cuts it off on an error");
        link.revoke();
        assert!(link.is_dead());
        assert!(!link.wait_ack(2, 4, Instant::now() + std::time::Duration::from_secs(5)));
    }
}
