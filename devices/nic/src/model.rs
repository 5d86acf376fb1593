//! The NIC as a state machine: BAR0 registers behind one lock, and two
//! engine threads (TX and RX) that move frames between descriptor rings in
//! guest memory and the [`Wire`].
//!
//! Register accesses arrive on the transport's socket thread and never
//! wait for an engine or for guest memory: the engines do their DMA with
//! the lock released (a DMA to a peer BAR is a message QEMU answers in the
//! same loop that waits for our register reply).
//!
//! All DMA goes through p2plab-kit's [`DmaGate`]: an engine reads the
//! gate's epoch when it takes a descriptor (under the lock) and does that
//! descriptor's DMA bound to it. A reset quiesces the gate before it
//! returns, so nothing taken before it (a descriptor fetched, a frame
//! waiting for a buffer) reaches guest memory after it.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use p2plab_dma::{BusTarget, DmaFault, DmaFaultKind, GuestMemory};
use p2plab_fault::Shared;
use p2plab_kit::regs::{accepted_write_dwords, read_bytes, register_values};
use p2plab_kit::{
    arm_spec, counters_with, Armed, DeviceControl, DmaGate, Epoch, Half, Interrupts, QuiesceTimeout,
};
use p2plab_wire::{Frame, Impairment, SendError, Sent, Wire};

use crate::descriptor::{valid_ring, Descriptor, RingError, Status};
use crate::fault::{ArmError, ArmedReport, NicFaultSpec, NicFaults};
use crate::regs::*;
use crate::stats::{Stats, StatsSnapshot};

/// How long the RX engine waits for a frame before it looks at the
/// registers again.
const RX_POLL: Duration = Duration::from_millis(20);

/// One descriptor an engine works on: which ring, under which
/// generation and DMA epoch, at which bus address.
#[derive(Debug, Clone, Copy)]
struct Work {
    dir: Dir,
    generation: u64,
    epoch: Epoch,
    slot: u64,
}

/// One ring's registers.
#[derive(Debug, Clone, Copy, Default)]
struct Ring {
    base: u64,
    size: u32,
    head: u32,
    tail: u32,
    enabled: bool,
    halted: bool,
    /// The engine holds a descriptor of this ring.
    busy: bool,
    /// Bumped by reset and by disabling the ring: an engine drops work it
    /// fetched under an older generation.
    generation: u64,
}

impl Ring {
    fn runnable(&self, bus_master: bool) -> bool {
        self.enabled && bus_master && !self.halted && self.head != self.tail
    }

    fn slot(&self) -> u64 {
        self.base + u64::from(self.head) * DESC_SIZE
    }
}

/// What an engine does next.
enum Next {
    /// Work on the descriptor of this work.
    Work(Work),
    /// RX is disabled: take frames off the wire and drop them (RX only).
    Drain,
    /// Nothing to do now (only when the engine does not wait).
    Idle,
    /// The device is shutting down.
    Stop,
}

/// Whether an engine waits for work or returns when there is none: its
/// own thread waits; an engine run on the caller's thread
/// ([`Nic::with_engines_on_caller`]) returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Wait on the registers' condition variable, and up to
    /// [`RX_POLL`] for a frame.
    Block,
    /// Return [`Next::Idle`] instead of waiting; take only frames that
    /// are already there.
    NoWait,
}

impl Wait {
    fn poll(self) -> Duration {
        match self {
            Wait::Block => RX_POLL,
            Wait::NoWait => Duration::ZERO,
        }
    }
}

/// Which ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Tx,
    Rx,
}

impl Dir {
    fn cause(self) -> u32 {
        match self {
            Dir::Tx => IntCauses::TX.raw(),
            Dir::Rx => IntCauses::RX.raw(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dir::Tx => "tx",
            Dir::Rx => "rx",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Registers {
    ctrl: u32,
    error: u32,
    scratch: u32,
    tx: Ring,
    rx: Ring,
    int_status: u32,
    int_mask: u32,
    bus_master: bool,
    shutdown: bool,
}

impl Registers {
    fn new() -> Self {
        Self {
            ctrl: 0,
            error: 0,
            scratch: 0,
            tx: Ring::default(),
            rx: Ring::default(),
            int_status: 0,
            int_mask: IntCauses::ALL.raw(),
            bus_master: false,
            shutdown: false,
        }
    }

    fn ring(&mut self, dir: Dir) -> &mut Ring {
        match dir {
            Dir::Tx => &mut self.tx,
            Dir::Rx => &mut self.rx,
        }
    }

    fn status(&self, link_up: bool) -> u32 {
        DeviceStatus::READY
            .with(DeviceStatus::LINK_UP, link_up)
            .with(DeviceStatus::TX_ENABLED, self.tx.enabled)
            .with(DeviceStatus::RX_ENABLED, self.rx.enabled)
            .with(DeviceStatus::BUS_MASTER, self.bus_master)
            .with(DeviceStatus::HALTED, self.tx.halted || self.rx.halted)
            .with(DeviceStatus::TX_BUSY, self.tx.busy)
            .with(DeviceStatus::RX_BUSY, self.rx.busy)
            .raw()
    }

    /// Raises `cause`; whether an MSI-X should go out now.
    fn raise(&mut self, cause: u32) -> bool {
        self.int_status |= cause;
        cause & !self.int_mask != 0
    }

    /// Halts `dir`'s engine with `error`; whether to interrupt.
    fn halt(&mut self, dir: Dir, error: RingError) -> bool {
        self.ring(dir).halted = true;
        self.error = error.code();
        self.raise(IntCauses::ERROR.raw())
    }
}

/// What both engines and the register path share.
struct Device {
    regs: Mutex<Registers>,
    wake: Condvar,
    /// Guest memory behind Bus Master Enable and the reset epoch.
    gate: DmaGate,
    /// Never called with the lock held.
    irq: Arc<dyn Interrupts>,
    wire: Wire,
    mtu: u32,
    stats: Stats,
    /// Armed wire faults; skipped while nothing is armed.
    faults: Shared<NicFaults>,
    trace: p2plab_trace::Tracer,
    stopping: AtomicBool,
}

impl Device {
    fn new(wire: Wire, mtu: u32, memory: Arc<dyn GuestMemory>, irq: Arc<dyn Interrupts>) -> Self {
        Device {
            regs: Mutex::new(Registers::new()),
            wake: Condvar::new(),
            gate: DmaGate::new(memory),
            irq,
            wire,
            mtu: mtu.clamp(MIN_MTU, MAX_MTU),
            stats: Stats::default(),
            faults: Shared::default(),
            trace: p2plab_trace::Tracer::new(),
            stopping: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registers> {
        // Plain data: a panic elsewhere leaves it usable.
        self.regs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn interrupt(&self) {
        Stats::add(&self.stats.interrupts, 1);
        self.irq.notify(NIC_VECTOR);
    }

    fn generation(&self, dir: Dir) -> u64 {
        self.lock().ring(dir).generation
    }

    /// Counts a failed DMA, unless it failed because a reset overtook its
    /// work (that is no device error: the work is gone). Whether it
    /// counted.
    fn dma_failed(&self, what: &str, fault: &DmaFault) -> bool {
        if fault.kind == DmaFaultKind::Reset {
            tracing::debug!(error = %fault, "{what} refused: reset since");
            return false;
        }
        tracing::debug!(error = %fault, "{what} failed");
        Stats::add(&self.stats.dma_errors, 1);
        true
    }

    /// Halts `dir` if its generation is still `generation`.
    fn ring_error(&self, dir: Dir, generation: u64, error: RingError) {
        let notify = {
            let mut regs = self.lock();
            if regs.ring(dir).generation != generation {
                return;
            }
            Stats::add(&self.stats.ring_errors, 1);
            regs.halt(dir, error)
        };
        tracing::debug!(ring = dir.name(), error = error.name(), "ring halted");
        if notify {
            self.interrupt();
        }
    }

    /// Writes a descriptor's result (length first, status last) and
    /// retires it, unless the ring moved on meanwhile.
    fn complete(&self, work: Work, desc_irq: bool, status: Status, done_len: u32, drop_irq: bool) {
        let Work {
            dir,
            generation,
            epoch,
            slot,
        } = work;
        if self.generation(dir) != generation {
            return;
        }
        let memory = self.gate.bound(epoch);
        let written = memory
            .write_u32(slot + DESC_DONE_LEN, done_len)
            .and_then(|()| memory.write(slot + DESC_STATUS, &status.code().to_le_bytes()));
        if let Err(e) = written {
            if self.dma_failed("descriptor write-back", &e) {
                self.ring_error(dir, generation, RingError::RingDma);
            }
            return;
        }
        let notify = {
            let mut regs = self.lock();
            let ring = regs.ring(dir);
            if ring.generation != generation {
                return;
            }
            ring.head = (ring.head + 1) % ring.size.max(1);
            desc_irq && regs.raise(dir.cause())
        };
        if status != Status::Ok {
            let counter = match dir {
                Dir::Tx => &self.stats.tx_errors,
                Dir::Rx => &self.stats.rx_errors,
            };
            Stats::add(counter, 1);
        }
        self.trace.record(dir.name(), || {
            serde_json::json!({"name": format!("{} {}", dir.name(), status.name()), "len": done_len})
        });
        if notify {
            if drop_irq {
                Stats::add(&self.stats.dropped_interrupts, 1);
            } else {
                self.interrupt();
            }
        }
        // Each completion may let the other side of a loopback go on.
        self.wake.notify_all();
    }

    /// What `dir`'s engine does next: work on a descriptor, drain the
    /// wire (RX disabled), stop at shutdown, or (when it does not wait)
    /// nothing for now.
    fn next(&self, dir: Dir, wait: Wait) -> Next {
        let mut regs = self.lock();
        // Whatever the engine held is done with (or abandoned).
        regs.ring(dir).busy = false;
        loop {
            if regs.shutdown {
                return Next::Stop;
            }
            let bus_master = regs.bus_master;
            let ring = regs.ring(dir);
            if ring.runnable(bus_master) {
                ring.busy = true;
                return Next::Work(Work {
                    dir,
                    generation: ring.generation,
                    epoch: self.gate.epoch(),
                    slot: ring.slot(),
                });
            }
            if dir == Dir::Rx && !ring.enabled {
                return Next::Drain;
            }
            if wait == Wait::NoWait {
                return Next::Idle;
            }
            // Enabled with no descriptor (or no bus master): wait, and
            // hold the wire on RX.
            regs = self.wake.wait(regs).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Reads and parses the descriptor of `work`; `Err(None)` when the
    /// ring halted or a reset overtook it.
    fn fetch(&self, work: Work) -> Result<Descriptor, Option<(bool, Status)>> {
        let Work {
            dir,
            generation,
            epoch,
            slot,
        } = work;
        let mut raw = [0u8; DESC_SIZE as usize];
        if let Err(e) = self.gate.bound(epoch).read(slot, &mut raw) {
            if self.dma_failed("descriptor fetch", &e) {
                self.ring_error(dir, generation, RingError::RingDma);
            }
            return Err(None);
        }
        let flags = u16::from_le_bytes([raw[DESC_FLAGS as usize], raw[DESC_FLAGS as usize + 1]]);
        let irq = DescFlags::from_raw(flags).contains(DescFlags::IRQ);
        Descriptor::parse(&raw, self.mtu, dir == Dir::Tx).map_err(|e| {
            tracing::debug!(ring = dir.name(), error = ?e, "bad descriptor");
            Some((irq, e.status()))
        })
    }

    fn count_peer(&self, counter: &std::sync::atomic::AtomicU64, addr: u64, len: u64) {
        // A peer's BAR, whichever path reaches it (messages through the
        // client, or the zero-copy peer window).
        if matches!(
            self.gate.locate(addr, len),
            BusTarget::PeerBar | BusTarget::PeerDirect
        ) {
            Stats::add(counter, len);
        }
    }
}

/// The TX engine's thread: one descriptor after the other until the
/// device shuts down.
fn tx_engine(device: &Device) {
    while let Next::Work(work) = device.next(Dir::Tx, Wait::Block) {
        tx_descriptor(device, work);
    }
}

/// Sends the frame of one TX descriptor and completes it (both engines'
/// modes run this).
fn tx_descriptor(device: &Device, work: Work) {
    let desc = match device.fetch(work) {
        Ok(desc) => desc,
        Err(None) => return,
        Err(Some((irq, status))) => {
            device.complete(work, irq, status, 0, false);
            return;
        }
    };
    let mut payload = vec![0u8; desc.len as usize];
    if let Err(e) = device.gate.bound(work.epoch).read(desc.addr, &mut payload) {
        if device.dma_failed("TX buffer read", &e) {
            device.complete(work, desc.wants_irq(), Status::DmaError, 0, false);
        }
        return;
    }
    // The buffer is read: from here on the engine touches no guest
    // buffer for this descriptor (a driver quiescing may go on).
    device.lock().tx.busy = false;
    device.count_peer(&device.stats.tx_peer_bar_bytes, desc.addr, desc.len.into());
    let decision = device
        .faults
        .when_armed(NicFaults::decide)
        .unwrap_or_default();
    // The wire does what the armed specs decided; the NIC's own
    // counters say what was asked of it.
    if decision.delay.is_some() {
        Stats::add(&device.stats.wire_delays, 1);
    }
    if decision.corrupt {
        Stats::add(&device.stats.wire_corrupts, 1);
    }
    let impairment = Impairment {
        drop: decision.drop,
        delay: decision.delay,
        corrupt: decision.corrupt,
        reorder: 0,
    };
    // A reset or ring disable (a new generation) or shutdown ends the
    // wait for the wire, whatever the peer does: the wire asks this
    // every 20 ms while a send waits, so TX never stays stuck in a
    // send across a reset.
    let give_up =
        || device.stopping.load(Ordering::SeqCst) || device.generation(Dir::Tx) != work.generation;
    let status = match device
        .wire
        .send_impaired(Frame::new(payload), impairment, &give_up)
    {
        Ok(Sent::Dropped) => {
            Stats::add(&device.stats.wire_drops, 1);
            Status::Ok
        }
        Ok(Sent::Delivered | Sent::Held) => Status::Ok,
        // A peer that read nothing for the send timeout is cut off:
        // nothing was sent.
        Err(SendError::LinkDown | SendError::TimedOut) => Status::LinkDown,
        Err(SendError::TooLong) => Status::TooLong,
        Err(SendError::Stopped) => return,
    };
    if status == Status::Ok {
        Stats::add(&device.stats.tx_packets, 1);
        Stats::add(&device.stats.tx_bytes, desc.len.into());
    }
    let done = if status == Status::Ok { desc.len } else { 0 };
    device.complete(
        work,
        desc.wants_irq(),
        status,
        done,
        decision.drop_interrupt,
    );
}

/// The RX engine's thread: steps until the device shuts down.
fn rx_engine(device: &Device) {
    let mut rx = RxEngine::default();
    while rx.step(device, Wait::Block) != Progress::Stop {}
}

/// What one engine step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Moved a frame or a descriptor (or dropped one).
    Worked,
    /// Nothing to do now.
    Idle,
    /// The device is shutting down.
    Stop,
}

/// The RX engine's state between steps.
#[derive(Default)]
struct RxEngine {
    /// A frame taken off the wire and not yet in a buffer: it waits for
    /// the next descriptor of the same ring generation (a bad descriptor
    /// consumes none); a reset or RX disable discards it.
    pending: Option<(u64, Frame)>,
}

impl RxEngine {
    /// One step: drains a frame while RX is off, or takes a frame (or
    /// keeps the pending one) into the next descriptor.
    fn step(&mut self, device: &Device, wait: Wait) -> Progress {
        let work = match device.next(Dir::Rx, wait) {
            Next::Stop => return Progress::Stop,
            Next::Idle => return Progress::Idle,
            Next::Drain => {
                // RX is off: frames arriving now are dropped, as a NIC
                // with its receiver disabled does.
                let mut worked = false;
                if self.pending.take().is_some() {
                    Stats::add(&device.stats.rx_discarded, 1);
                    worked = true;
                }
                if let Some(frame) = device.wire.recv_timeout(wait.poll()) {
                    worked = true;
                    // RX may have been enabled while this waited: then the
                    // frame is the new ring's.
                    let regs = device.lock();
                    if regs.rx.enabled {
                        self.pending = Some((regs.rx.generation, frame));
                    } else {
                        Stats::add(&device.stats.rx_discarded, 1);
                    }
                }
                return if worked {
                    Progress::Worked
                } else {
                    Progress::Idle
                };
            }
            Next::Work(work) => work,
        };
        if self
            .pending
            .as_ref()
            .is_some_and(|(g, _)| *g != work.generation)
        {
            self.pending = None;
            Stats::add(&device.stats.rx_discarded, 1);
        }
        if self.pending.is_none() {
            match device.wire.recv_timeout(wait.poll()) {
                Some(frame) => self.pending = Some((work.generation, frame)),
                None => return Progress::Idle,
            }
        }
        self.fill(device, work);
        Progress::Worked
    }

    /// Puts the pending frame into `work`'s descriptor and completes it.
    fn fill(&mut self, device: &Device, work: Work) {
        let desc = match device.fetch(work) {
            Ok(desc) => desc,
            Err(None) => return,
            Err(Some((irq, status))) => {
                device.complete(work, irq, status, 0, false);
                return;
            }
        };
        let Some((_, frame)) = self.pending.take() else {
            return;
        };
        let len = frame.payload.len().min(desc.len as usize);
        let memory = device.gate.bound(work.epoch);
        if let Err(e) = memory.write(desc.addr, &frame.payload[..len]) {
            if device.dma_failed("RX buffer write", &e) {
                device.complete(work, desc.wants_irq(), Status::DmaError, 0, false);
            } else {
                Stats::add(&device.stats.rx_discarded, 1);
            }
            return;
        }
        device.count_peer(&device.stats.rx_peer_bar_bytes, desc.addr, len as u64);
        let status = if len < frame.payload.len() {
            Stats::add(&device.stats.rx_truncated, 1);
            Status::Truncated
        } else if !frame.fcs_ok() {
            Stats::add(&device.stats.rx_fcs_errors, 1);
            Status::BadFcs
        } else {
            Status::Ok
        };
        Stats::add(&device.stats.rx_packets, 1);
        Stats::add(&device.stats.rx_bytes, len as u64);
        device.complete(work, desc.wants_irq(), status, len as u32, false);
    }
}

/// A handle to the NIC's counters, faults and reset that the control
/// socket's thread can use while the transport owns the device.
#[derive(Clone)]
pub struct NicControl(Arc<Device>);

impl NicControl {
    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.0.stats.snapshot()
    }

    /// Arms a wire fault; returns its ID. Refused when the NIC keeps as
    /// many as it may ([`p2plab_fault::DEFAULT_MAX_ARMED`]).
    pub fn inject(&self, spec: NicFaultSpec) -> Result<u64, ArmError> {
        let id = self.0.faults.with(|faults| faults.arm(spec))?;
        tracing::info!(id, %spec, "fault armed");
        Ok(id)
    }

    /// The armed faults and how often each fired.
    pub fn report(&self) -> Vec<ArmedReport> {
        self.0.faults.with(|faults| faults.report())
    }

    /// Whether the wire has a peer.
    pub fn link_up(&self) -> bool {
        self.0.wire.link_up()
    }

    /// The wire's counters (frames each way, FCS errors, refused peers,
    /// send timeouts...).
    pub fn wire_stats(&self) -> p2plab_wire::WireStatsSnapshot {
        self.0.wire.stats()
    }
}

impl DeviceControl for NicControl {
    /// The counters and whether the wire has a peer, flat, and the
    /// wire's own counters under `wire`.
    fn counters(&self) -> serde_json::Value {
        let mut value = counters_with(self.stats(), &[("link_up", self.link_up().into())]);
        if let Some(object) = value.as_object_mut() {
            let wire = serde_json::to_value(self.wire_stats()).unwrap_or_default();
            object.insert("wire".into(), wire);
        }
        value
    }

    fn inject(&self, spec: &str) -> Result<Armed, String> {
        arm_spec(spec, |spec| {
            NicControl::inject(self, spec).map_err(|e| e.to_string())
        })
    }

    /// Disarms every wire fault.
    fn clear(&self) {
        self.0.faults.with(NicFaults::clear);
    }

    /// What a function-level reset does (see [`Nic::reset`]).
    fn reset(&self) -> Result<(), String> {
        reset_device(&self.0).map_err(|e| e.to_string())
    }

    /// The readable BAR0 registers by name (the write-only doorbells
    /// left out), as the guest would read them now.
    fn registers(&self) -> Option<Vec<(&'static str, u64)>> {
        let link = self.link_up();
        let regs = self.0.lock();
        Some(register_values::<Reg>(|reg| {
            read_register(&self.0, &regs, link, reg)
        }))
    }

    fn tracer(&self) -> &p2plab_trace::Tracer {
        &self.0.trace
    }

    fn fault_report(&self) -> serde_json::Value {
        serde_json::to_value(self.report()).unwrap_or_default()
    }
}

/// The NIC-like device: BAR0 registers and the TX and RX engines.
pub struct Nic {
    device: Arc<Device>,
    engines: Vec<JoinHandle<()>>,
    /// The RX engine's state when the engines run on the caller's thread
    /// ([`Nic::with_engines_on_caller`]); `None` with engine threads.
    caller_rx: Option<Mutex<RxEngine>>,
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("mtu", &self.device.mtu)
            .finish_non_exhaustive()
    }
}

impl Nic {
    /// Builds the NIC on `wire` with frames up to `mtu` bytes and starts
    /// its engines.
    pub fn new(
        wire: Wire,
        mtu: u32,
        memory: Arc<dyn GuestMemory>,
        irq: Arc<dyn Interrupts>,
    ) -> io::Result<Self> {
        let device = Arc::new(Device::new(wire, mtu, memory, irq));
        let span = tracing::Span::current();
        let mut engines = Vec::new();
        for (name, engine) in [("nic-tx", tx_engine as fn(&Device)), ("nic-rx", rx_engine)] {
            let device = Arc::clone(&device);
            let span = span.clone();
            engines.push(
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || {
                        let _span = span.enter();
                        engine(&device)
                    })?,
            );
        }
        Ok(Self {
            device,
            engines,
            caller_rx: None,
        })
    }

    /// Builds the NIC with no engine threads: its TX and RX engines run
    /// on the caller's thread, one [`Nic::run_engines`] at a time, through
    /// the same descriptor, DMA, wire and completion code their threads
    /// run. For a fuzz target that cannot afford two threads per input;
    /// the engines then never wait: a wire whose receiver is full makes a
    /// send wait up to the wire's send timeout (give the wire a short one).
    pub fn with_engines_on_caller(
        wire: Wire,
        mtu: u32,
        memory: Arc<dyn GuestMemory>,
        irq: Arc<dyn Interrupts>,
    ) -> Self {
        Self {
            device: Arc::new(Device::new(wire, mtu, memory, irq)),
            engines: Vec::new(),
            caller_rx: Some(Mutex::new(RxEngine::default())),
        }
    }

    /// Runs both engines on this thread until neither has anything to do
    /// (no descriptor it may work on, no frame on the wire for it);
    /// returns how many steps they took. Does nothing (and returns 0) on
    /// a NIC whose engines have their own threads. A descriptor ring the
    /// engines go round without end would not return: that is the hang a
    /// caller's timeout should catch.
    pub fn run_engines(&self) -> u64 {
        let Some(rx) = &self.caller_rx else {
            return 0;
        };
        let mut rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
        let device = &self.device;
        let mut steps = 0;
        loop {
            // RX first: a frame it takes makes room on a loopback wire
            // for the next TX send.
            let rx_progress = rx.step(device, Wait::NoWait);
            let tx_progress = match device.next(Dir::Tx, Wait::NoWait) {
                Next::Work(work) => {
                    tx_descriptor(device, work);
                    Progress::Worked
                }
                Next::Stop => Progress::Stop,
                Next::Idle | Next::Drain => Progress::Idle,
            };
            if rx_progress != Progress::Worked && tx_progress != Progress::Worked {
                return steps;
            }
            steps += 1;
        }
    }

    /// A handle for the control socket.
    pub fn control(&self) -> NicControl {
        NicControl(Arc::clone(&self.device))
    }

    /// The frame limit in bytes.
    pub fn mtu(&self) -> u32 {
        self.device.mtu
    }

    /// A trapped BAR0 read of any size, assembled from the dwords it
    /// covers; reserved offsets read 0, bytes past the BAR 0xff.
    pub fn regs_read(&self, offset: u64, data: &mut [u8]) {
        let link = self.device.wire.link_up();
        let regs = self.device.lock();
        read_bytes(offset, data, REGS_BAR_SIZE, |at| {
            Reg::at(at).map_or(0, |(reg, half)| {
                half.of(read_register(&self.device, &regs, link, reg))
            })
        });
    }

    /// A trapped BAR0 write: aligned dwords, or aligned qwords (low dword
    /// first). Anything else is ignored and counted.
    pub fn regs_write(&self, offset: u64, data: &[u8]) {
        let refused = &self.device.stats.bad_register_accesses;
        let Some((dwords, count)) = accepted_write_dwords(offset, data, 8, refused) else {
            return;
        };
        let mut notify = false;
        {
            let mut regs = self.device.lock();
            for &(at, value) in &dwords[..count] {
                notify |= write_dword(&self.device, &mut regs, at, value);
            }
        }
        self.device.wake.notify_all();
        if notify {
            self.device.interrupt();
        }
    }

    /// Bus Master Enable changed in the PCI command register.
    pub fn set_bus_master(&self, enabled: bool) {
        self.device.gate.set_bus_master(enabled);
        self.device.lock().bus_master = enabled;
        self.device.wake.notify_all();
    }

    /// Device reset: registers to power-on values, work in flight dropped.
    /// Returns once the DMA gate is quiesced: nothing the engines took
    /// before the reset reaches guest memory any more.
    pub fn reset(&self) -> Result<(), QuiesceTimeout> {
        reset_device(&self.device)
    }
}

fn reset_device(device: &Device) -> Result<(), QuiesceTimeout> {
    {
        let mut regs = device.lock();
        let fresh = Registers {
            bus_master: regs.bus_master,
            shutdown: regs.shutdown,
            tx: Ring {
                generation: regs.tx.generation + 1,
                busy: regs.tx.busy,
                ..Ring::default()
            },
            rx: Ring {
                generation: regs.rx.generation + 1,
                busy: regs.rx.busy,
                ..Ring::default()
            },
            ..Registers::new()
        };
        *regs = fresh;
    }
    Stats::add(&device.stats.resets, 1);
    device.wake.notify_all();
    tracing::info!("device reset");
    device
        .trace
        .record("reset", || serde_json::json!({"name": "device reset"}));
    device.gate.quiesce()
}

/// What `reg` reads now (write-only ones read 0).
fn read_register(device: &Device, regs: &Registers, link_up: bool, reg: Reg) -> u64 {
    match reg {
        Reg::Id => ID_MAGIC.into(),
        Reg::Version => VERSION.into(),
        Reg::Mtu => device.mtu.into(),
        Reg::Status => regs.status(link_up).into(),
        Reg::Ctrl => regs.ctrl.into(),
        Reg::Error => regs.error.into(),
        Reg::Scratch => regs.scratch.into(),
        Reg::TxRingBase => regs.tx.base,
        Reg::TxRingSize => regs.tx.size.into(),
        Reg::TxHead => regs.tx.head.into(),
        Reg::TxTail => regs.tx.tail.into(),
        Reg::RxRingBase => regs.rx.base,
        Reg::RxRingSize => regs.rx.size.into(),
        Reg::RxHead => regs.rx.head.into(),
        Reg::RxTail => regs.rx.tail.into(),
        Reg::IntStatus => regs.int_status.into(),
        Reg::IntMask => regs.int_mask.into(),
        Reg::TxDoorbell | Reg::RxDoorbell => 0,
    }
}

/// One dword write under the lock; whether an interrupt must go out.
fn write_dword(device: &Device, regs: &mut Registers, offset: u64, value: u32) -> bool {
    let set_base = |ring: &mut Ring, half: Half| {
        if !ring.enabled {
            ring.base = half.replace(ring.base, value);
        }
    };
    let Some((reg, half)) = Reg::at(offset) else {
        tracing::debug!(offset, value, "write to a reserved offset ignored");
        return false;
    };
    match reg {
        Reg::Scratch => regs.scratch = value,
        Reg::Ctrl => {
            let ctrl = Ctrl::from_raw(value);
            let mut notify = false;
            for (dir, bit) in [(Dir::Tx, Ctrl::TX_ENABLE), (Dir::Rx, Ctrl::RX_ENABLE)] {
                let was_halted = regs.ring(dir).halted;
                notify |= set_enable(regs, dir, ctrl.contains(bit));
                if regs.ring(dir).halted && !was_halted {
                    Stats::add(&device.stats.ring_errors, 1);
                }
            }
            regs.ctrl = ctrl.known().raw();
            return notify;
        }
        Reg::TxRingBase => set_base(&mut regs.tx, half),
        Reg::RxRingBase => set_base(&mut regs.rx, half),
        Reg::TxRingSize if !regs.tx.enabled => regs.tx.size = value,
        Reg::RxRingSize if !regs.rx.enabled => regs.rx.size = value,
        Reg::TxDoorbell | Reg::RxDoorbell => {
            Stats::add(&device.stats.doorbells, 1);
            let dir = if reg == Reg::TxDoorbell {
                Dir::Tx
            } else {
                Dir::Rx
            };
            let ring = regs.ring(dir);
            if !ring.enabled {
                return false;
            }
            if value >= ring.size {
                Stats::add(&device.stats.ring_errors, 1);
                return regs.halt(dir, RingError::BadDoorbell);
            }
            ring.tail = value;
        }
        Reg::IntStatus => regs.int_status &= !value,
        Reg::IntMask => {
            regs.int_mask = IntCauses::from_raw(value).known().raw();
            return regs.int_status & !regs.int_mask != 0;
        }
        _ => tracing::debug!(
            register = reg.name(),
            value,
            "write to a read-only register ignored"
        ),
    }
    false
}

/// Enables or disables `dir`'s ring; whether an interrupt must go out.
fn set_enable(regs: &mut Registers, dir: Dir, enable: bool) -> bool {
    let ring = regs.ring(dir);
    match (ring.enabled, enable) {
        (false, true) => {
            ring.enabled = true;
            ring.head = 0;
            ring.tail = 0;
            ring.halted = false;
            if !valid_ring(ring.base, ring.size) {
                return regs.halt(dir, RingError::BadRing);
            }
            regs.error = 0;
            false
        }
        (true, false) => {
            ring.enabled = false;
            ring.halted = false;
            ring.generation += 1;
            false
        }
        _ => false,
    }
}

impl Drop for Nic {
    fn drop(&mut self) {
        self.device.stopping.store(true, Ordering::SeqCst);
        self.device.lock().shutdown = true;
        self.device.wake.notify_all();
        self.device.wire.shutdown();
        for engine in self.engines.drain(..) {
            if engine.join().is_err() {
                tracing::error!("NIC engine thread panicked");
            }
        }
    }
}
