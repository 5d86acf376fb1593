//! One device's end of a wire: send frames (with the fault hooks), take
//! frames, ask whether a peer is there, read the counters.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{WireConfig, WireOptions};
use crate::core::{lock, Core, Outlet, Queued, SendError, StreamOut};
use crate::frame::Frame;
use crate::impair::{corrupt, Impairment};
use crate::key::WireKey;
use crate::link;
use crate::order::ArrivalOrder;
use crate::stats::{WireStats, WireStatsSnapshot};
use crate::tcp::{TcpOptions, TcpTransport};
use crate::transport::Transport;
use crate::unix::UnixTransport;

/// What became of a frame handed to [`Wire::send_impaired`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// It went out (to the peer's queue or socket).
    Delivered,
    /// Injection dropped it.
    Dropped,
    /// Injection holds it, to go out after later frames.
    Held,
}

struct Inlet {
    queue: Receiver<Queued>,
    order: ArrivalOrder,
}

/// One device's end of the wire.
pub struct Wire {
    core: Arc<Core>,
    inlet: Mutex<Inlet>,
    link_thread: Option<JoinHandle<()>>,
    hold_thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wire")
            .field("wire", &self.core.describe)
            .field("link_up", &self.link_up())
            .finish_non_exhaustive()
    }
}

impl Wire {
    /// The wire `config` describes. A listening wire binds its socket now
    /// (replacing a stale socket file), so a bad path fails at start.
    pub fn open(config: &WireConfig, options: WireOptions) -> io::Result<Self> {
        let tcp = matches!(config, WireConfig::TcpListen(_) | WireConfig::TcpConnect(_));
        if options.key_file.is_some() && !tcp {
            // A key the user gave for nothing: they meant a TCP wire.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--wire-key is for a TCP wire (tcp-listen:ADDR:PORT or tcp-connect:HOST:PORT)",
            ));
        }
        match config {
            WireConfig::Loopback => Ok(Self::loopback_with(options)),
            WireConfig::Listen(path) => {
                let transport = UnixTransport::listen(path, &options.allowed_uids)?;
                Self::over(Box::new(transport), options)
            }
            WireConfig::Connect(path) => {
                let transport = UnixTransport::connect(path, &options.allowed_uids);
                Self::over(Box::new(transport), options)
            }
            WireConfig::TcpListen(addr) => {
                let transport = TcpTransport::listen(addr, Self::tcp_options(&options)?)?;
                Self::over(Box::new(transport), options)
            }
            WireConfig::TcpConnect(target) => {
                let transport = TcpTransport::connect(target, Self::tcp_options(&options)?)?;
                Self::over(Box::new(transport), options)
            }
        }
    }

    /// A TCP wire's options: its key is loaded (and checked) now, so a
    /// missing or loose key file fails at start.
    fn tcp_options(options: &WireOptions) -> io::Result<TcpOptions> {
        let Some(path) = &options.key_file else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a TCP wire needs a pre-shared key: --wire-key FILE (mode 0600, \
                 the same file on both ends; `openssl rand -hex 32` makes one)",
            ));
        };
        let mut tcp = TcpOptions::new(WireKey::load(path)?);
        tcp.handshake_timeout = options.handshake_timeout;
        tcp.user_timeout = options.send_timeout;
        Ok(tcp)
    }

    /// A wire over a stream transport; its link thread starts now.
    pub fn over(transport: Box<dyn Transport>, options: WireOptions) -> io::Result<Self> {
        let (tx, rx) = sync_channel(options.queue_frames.max(1));
        let name = options.thread_name.clone();
        let core = Arc::new(Core::new(
            transport.describe(),
            options,
            Outlet::Stream(StreamOut::default()),
            false,
        ));
        let thread_core = Arc::clone(&core);
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let _span = span.enter();
            link::run(thread_core, transport, tx);
        })?;
        Ok(Self::with(core, rx, Some(thread)))
    }

    /// Frames sent come back.
    pub fn loopback() -> Self {
        Self::loopback_with(WireOptions::default())
    }

    /// Frames sent come back; with `options`.
    pub fn loopback_with(options: WireOptions) -> Self {
        let (tx, rx) = sync_channel(options.queue_frames.max(1));
        let core = Core::new("loopback".into(), options, Outlet::Channel(tx), true);
        Self::with(Arc::new(core), rx, None)
    }

    /// Two ends wired to each other in this process.
    pub fn pair() -> (Self, Self) {
        Self::pair_with(WireOptions::default())
    }

    /// Two ends wired to each other in this process; with `options`.
    pub fn pair_with(options: WireOptions) -> (Self, Self) {
        let (a_tx, a_rx) = sync_channel(options.queue_frames.max(1));
        let (b_tx, b_rx) = sync_channel(options.queue_frames.max(1));
        let a = Core::new(
            "pair:a".into(),
            options.clone(),
            Outlet::Channel(b_tx),
            true,
        );
        let b = Core::new("pair:b".into(), options, Outlet::Channel(a_tx), true);
        (
            Self::with(Arc::new(a), a_rx, None),
            Self::with(Arc::new(b), b_rx, None),
        )
    }

    fn with(core: Arc<Core>, queue: Receiver<Queued>, link_thread: Option<JoinHandle<()>>) -> Self {
        Self {
            core,
            inlet: Mutex::new(Inlet {
                queue,
                order: ArrivalOrder::default(),
            }),
            link_thread,
            hold_thread: Mutex::new(None),
        }
    }

    /// The wire as configured (`listen:/run/x/wire.sock`, `loopback`).
    pub fn describe(&self) -> &str {
        &self.core.describe
    }

    /// Whether a peer is there.
    pub fn link_up(&self) -> bool {
        self.core.link_up.load(Ordering::SeqCst)
    }

    /// The options the wire runs with.
    pub fn options(&self) -> &WireOptions {
        &self.core.options
    }

    /// The counters now.
    pub fn stats(&self) -> WireStatsSnapshot {
        self.core.stats.snapshot()
    }

    /// Sends `frame` as it is. See [`Wire::send_impaired`].
    pub fn send(&self, frame: Frame, give_up: &dyn Fn() -> bool) -> Result<Sent, SendError> {
        self.send_impaired(frame, Impairment::NONE, give_up)
    }

    /// Sends `frame` after doing `impairment` to it, waiting while the
    /// receiver is full (flow control), at most the send timeout. Gives
    /// up, without sending, as soon as `give_up` says so (the device was
    /// reset, its ring disabled) or the wire shuts down; `give_up` is
    /// asked at least every 20 ms while the send waits.
    pub fn send_impaired(
        &self,
        mut frame: Frame,
        impairment: Impairment,
        give_up: &dyn Fn() -> bool,
    ) -> Result<Sent, SendError> {
        let core = &self.core;
        if frame.payload.len() > core.options.max_payload as usize {
            return Err(SendError::TooLong);
        }
        frame.seq = core.seq.fetch_add(1, Ordering::Relaxed);
        if let Some(delay) = impairment.delay {
            WireStats::add(&core.stats.delays, 1);
            if !core.wait(delay, give_up) {
                WireStats::add(&core.stats.sends_abandoned, 1);
                return Err(SendError::Stopped);
            }
        }
        if impairment.corrupt {
            corrupt(&mut frame);
            WireStats::add(&core.stats.corrupts, 1);
        }
        if impairment.drop {
            WireStats::add(&core.stats.drops, 1);
            return Ok(Sent::Dropped);
        }
        if impairment.reorder > 0 {
            WireStats::add(&core.stats.reorders, 1);
            lock(&core.outbox).hold(frame, impairment.reorder, Instant::now());
            self.start_hold_thread();
            core.outbox_changed.notify_all();
            return Ok(Sent::Held);
        }
        let mut out = lock(&core.outbox).send(frame).into_iter();
        let result = match out.next() {
            Some(first) => core.transmit(first, give_up),
            None => Ok(()),
        };
        // Held frames this one was the last to wait for go right behind
        // it (they are already "on the wire": only a shutdown stops them).
        for held in out {
            let _ = core.transmit(held, &|| false);
        }
        result.map(|()| Sent::Delivered)
    }

    /// Starts the thread that sends held frames whose time is up, once.
    fn start_hold_thread(&self) {
        let mut slot = lock(&self.hold_thread);
        if slot.is_some() {
            return;
        }
        let core = Arc::clone(&self.core);
        let name = format!("{}-hold", core.options.thread_name);
        match std::thread::Builder::new()
            .name(name)
            .spawn(move || release_held(&core))
        {
            Ok(thread) => *slot = Some(thread),
            // Held frames then go out behind the next frames sent only.
            Err(e) => tracing::warn!("cannot start the wire's hold thread: {e}"),
        }
    }

    /// The next frame, waiting at most `timeout`. A frame whose payload
    /// does not match its FCS is delivered all the same
    /// ([`Frame::fcs_ok`] says so) and counted.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Frame> {
        let mut inlet = lock(&self.inlet);
        match inlet.queue.recv_timeout(timeout) {
            Ok(Queued { link, frame }) => {
                let in_order = inlet.order.arrive(link, frame.seq);
                drop(inlet);
                let stats = &self.core.stats;
                WireStats::add(&stats.frames_received, 1);
                WireStats::add(&stats.bytes_received, frame.payload.len() as u64);
                if !frame.fcs_ok() {
                    WireStats::add(&stats.fcs_errors, 1);
                }
                if !in_order {
                    WireStats::add(&stats.out_of_order, 1);
                }
                Some(frame)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // The link thread is gone (shutdown): do not spin.
                drop(inlet);
                std::thread::sleep(timeout);
                None
            }
        }
    }

    /// Stops the wire's threads and closes the connection; senders and
    /// receivers waiting on it return.
    pub fn shutdown(&self) {
        let core = &self.core;
        core.stop.store(true, Ordering::SeqCst);
        if let Outlet::Stream(out) = &core.outlet {
            if let Some((_, stream)) = lock(&out.closer).take() {
                stream.close();
            }
            core.link_up.store(false, Ordering::SeqCst);
        }
        core.outbox_changed.notify_all();
    }
}

/// Sends held frames when their time is up, until the wire stops.
fn release_held(core: &Core) {
    let mut outbox = lock(&core.outbox);
    loop {
        if core.stopped() {
            return;
        }
        let now = Instant::now();
        let due = outbox.expire(now);
        if !due.is_empty() {
            drop(outbox);
            for frame in due {
                let _ = core.transmit(frame, &|| false);
            }
            outbox = lock(&core.outbox);
            continue;
        }
        let wait = outbox.next_deadline().map_or(Duration::from_secs(1), |at| {
            at.saturating_duration_since(now)
        });
        outbox = core
            .outbox_changed
            .wait_timeout(outbox, wait)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.shutdown();
        for thread in [self.link_thread.take(), lock(&self.hold_thread).take()]
            .into_iter()
            .flatten()
        {
            if thread.join().is_err() {
                tracing::error!("a wire thread panicked");
            }
        }
    }
}
