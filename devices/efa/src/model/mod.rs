//! The EFA as a state machine: BAR0's registers and the readless read
//! mechanism, the doorbell page, and the threads behind them.
//!
//! - The register path (the transport's socket thread) latches registers,
//!   answers readless reads straight into guest RAM before it returns (the
//!   driver polls for the answer for at most 50 ms, and QEMU holds the vCPU
//!   until our reply), records doorbells and wakes a thread. It never waits
//!   for DMA that goes through QEMU, and never takes a lock that is held
//!   across DMA.
//! - The management thread ([`admin`]) runs admin commands in order, posts
//!   their completions, AENQ events (keep-alive, link state) and the CQ
//!   events the register path defers, and finishes the reset handshake.
//! - The send engine ([`send`]) takes WQEs out of the LLQ (BAR2, shared
//!   memory the guest writes directly), gathers their data through the MRs
//!   and puts packets on the fabric; it also retransmits and serves RDMA
//!   reads. The receive engine ([`recv`]) handles packets: deliveries into
//!   receive buffers, acknowledgements, read data, writes.
//! - [`events`] writes completions, event-queue entries and interrupts;
//!   [`fabric`] is the outgoing queue, its pump (where wire faults apply)
//!   and the link reader.
//!
//! All DMA goes through p2plab-kit's [`DmaGate`], bound to the epoch the
//! work was taken in: a reset (DEV_CTL or PCI) makes older work unable to
//! touch memory, and reports itself done only after what ran has drained.
//! Admin commands that free memory the engines may use (destroying a QP or
//! a CQ, deregistering an MR) take the data-path lock for writing, so once
//! their completion is posted no engine touches that memory again.

mod admin;
mod control;
mod events;
mod fabric;
mod recv;
mod reliability;
mod send;
pub(crate) mod state;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::fault::EfaFaults;
use p2plab_dma::{Access, DmaFault, DmaFaultKind, GuestMemory, RegionMemory};
use p2plab_kit::regs::{accepted_write_dwords, read_bytes};
use p2plab_kit::{DmaGate, Interrupts, QuiesceTimeout};

use crate::attrs::DeviceAttrs;
use crate::bytes::{put_u16, put_u32};
use crate::link::Link;
use crate::regs::*;
use crate::stats::Stats;

pub(crate) use admin::set_port;
pub use control::{EfaControl, ObjectCounts};
use fabric::Outbound;
use reliability::Reliability;
use state::{lock, MgmtJob, ResetPhase, State};

/// How the device runs, beyond its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EfaOptions {
    /// How often a KEEP_ALIVE event goes to the AENQ (None: never).
    pub keep_alive: Option<Duration>,
}

impl Default for EfaOptions {
    fn default() -> Self {
        Self {
            keep_alive: Some(Duration::from_secs(1)),
        }
    }
}

/// Packets waiting for the receive engine (from the link and from the
/// device itself).
const INBOUND_DEPTH: usize = 4096;

/// What the threads and the register path share.
pub(crate) struct Device {
    pub attrs: DeviceAttrs,
    /// Low bits of a memory key that are its slot + 1.
    pub key_bits: u32,
    pub state: Mutex<State>,
    /// Wakes the management thread (waits on `state`).
    pub mgmt_wake: Condvar,
    /// Wakes the send engine (waits on `state`).
    pub send_wake: Condvar,
    /// Engines hold it for reading while they use objects' memory;
    /// commands that free such memory take it for writing.
    pub datapath: RwLock<()>,
    pub gate: DmaGate,
    pub irq: Arc<dyn Interrupts>,
    pub llq: Arc<dyn RegionMemory>,
    pub link: Arc<dyn Link>,
    pub outbound: Outbound,
    pub inbound_tx: SyncSender<Vec<u8>>,
    pub inbound_rx: Mutex<Receiver<Vec<u8>>>,
    pub reliability: Mutex<Reliability>,
    pub stats: Stats,
    pub faults: Mutex<EfaFaults>,
    pub trace: p2plab_trace::Tracer,
    pub started: Instant,
    pub stopping: AtomicBool,
    pub next_msg_id: AtomicU64,
    pub options: EfaOptions,
    /// The engines run on the caller's thread ([`Efa::run_engines`]),
    /// not on threads of their own.
    pub engines_on_caller: bool,
}

/// What one engine step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Handled something (a command, a WQE, a packet, a timer...).
    Worked,
    /// Nothing to do now.
    Idle,
    /// The device is shutting down.
    Stop,
}

/// The engines' state between steps when they run on the caller's
/// thread.
struct CallerEngines {
    management: admin::Management,
    next_qp: usize,
    /// A packet the pump holds back (reorder fault).
    held: Option<Vec<u8>>,
    /// A packet from the link waiting for room in the inbound queue.
    pending: Option<Vec<u8>>,
}

impl Device {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn faults(&self) -> MutexGuard<'_, EfaFaults> {
        lock(&self.faults)
    }

    pub(crate) fn gid(&self) -> [u8; 16] {
        self.attrs.gid
    }

    /// Counts a failed DMA unless a reset overtook its work; whether it
    /// was a real failure.
    pub(crate) fn dma_failed(&self, what: &str, fault: &DmaFault) -> bool {
        if fault.kind == DmaFaultKind::Reset {
            tracing::debug!(error = %fault, "{what} dropped: the device was reset");
            return false;
        }
        p2plab_ratelimit::log_limited!(debug, error = %fault, "{what} failed");
        Stats::add(&self.stats.dma_errors, 1);
        true
    }

    fn wake_all(&self) {
        self.mgmt_wake.notify_all();
        self.send_wake.notify_all();
    }
}

impl Device {
    /// The shared state of a device with `attrs` (checked).
    fn new(
        attrs: DeviceAttrs,
        options: EfaOptions,
        memory: Arc<dyn GuestMemory>,
        llq: Arc<dyn RegionMemory>,
        link: Arc<dyn Link>,
        irq: Arc<dyn Interrupts>,
        engines_on_caller: bool,
    ) -> io::Result<Self> {
        attrs
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if llq.size() < u64::from(attrs.max_qp) * u64::from(attrs.max_llq_size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "LLQ memory smaller than max_qp * max_llq_size",
            ));
        }
        let (inbound_tx, inbound_rx) = sync_channel(INBOUND_DEPTH);
        let key_bits = 32 - attrs.max_mr.leading_zeros();
        Ok(Device {
            key_bits,
            state: Mutex::new(State::new(&attrs)),
            attrs,
            mgmt_wake: Condvar::new(),
            send_wake: Condvar::new(),
            datapath: RwLock::new(()),
            gate: DmaGate::new(memory),
            irq,
            llq,
            link,
            outbound: Outbound::new(),
            inbound_tx,
            inbound_rx: Mutex::new(inbound_rx),
            reliability: Mutex::new(Reliability::default()),
            stats: Stats::default(),
            faults: Mutex::new(EfaFaults::default()),
            trace: p2plab_trace::Tracer::new(),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            next_msg_id: AtomicU64::new(first_message_id()),
            options,
            engines_on_caller,
        })
    }
}

/// A thread's body.
type Engine = fn(&Device);

/// The EFA function's model: registers, doorbells and engines.
pub struct Efa {
    device: Arc<Device>,
    threads: Vec<JoinHandle<()>>,
    /// The engines' state when they run on the caller's thread
    /// ([`Efa::with_engines_on_caller`]); `None` with engine threads.
    caller: Option<Mutex<CallerEngines>>,
}

impl std::fmt::Debug for Efa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Efa")
            .field("gid", &crate::attrs::format_gid(&self.device.attrs.gid))
            .finish_non_exhaustive()
    }
}

impl Efa {
    /// Builds the device with `attrs` (checked), reaching guest memory
    /// through `memory`, its LLQ (BAR2) in `llq`, the fabric through
    /// `link`, and starts its threads.
    pub fn new(
        attrs: DeviceAttrs,
        options: EfaOptions,
        memory: Arc<dyn GuestMemory>,
        llq: Arc<dyn RegionMemory>,
        link: Arc<dyn Link>,
        irq: Arc<dyn Interrupts>,
    ) -> io::Result<Self> {
        let device = Arc::new(Device::new(attrs, options, memory, llq, link, irq, false)?);
        let span = tracing::Span::current();
        let mut threads = Vec::new();
        let engines: [(&str, Engine); 5] = [
            ("efa-mgmt", admin::management_thread),
            ("efa-send", send::send_engine),
            ("efa-recv", recv::receive_engine),
            ("efa-pump", fabric::pump),
            ("efa-link", fabric::link_reader),
        ];
        for (name, engine) in engines {
            let shared = Arc::clone(&device);
            let span = span.clone();
            let spawned = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    let _span = span.enter();
                    engine(&shared)
                });
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(e) => {
                    stop(&device, &mut threads);
                    return Err(e);
                }
            }
        }
        Ok(Self {
            device,
            threads,
            caller: None,
        })
    }

    /// Builds the device as [`Efa::new`] does, but starts no thread: its
    /// engines (management, send, receive, the pump and the link reader)
    /// run on the caller's thread, one [`Efa::run_engines`] at a time,
    /// through the same step functions their threads loop over. For a
    /// fuzz target that cannot afford five threads per input. What
    /// differs: nothing waits (a send finding the outgoing queue full
    /// drops the packet and counts it instead of waiting for the pump; a
    /// packet the pump holds back for a reorder goes out once the queue
    /// is empty), and timers (retransmits, keep-alives) fire only in a
    /// `run_engines` after they are due.
    pub fn with_engines_on_caller(
        attrs: DeviceAttrs,
        options: EfaOptions,
        memory: Arc<dyn GuestMemory>,
        llq: Arc<dyn RegionMemory>,
        link: Arc<dyn Link>,
        irq: Arc<dyn Interrupts>,
    ) -> io::Result<Self> {
        let device = Arc::new(Device::new(attrs, options, memory, llq, link, irq, true)?);
        let management = admin::Management::new(&device);
        Ok(Self {
            device,
            threads: Vec::new(),
            caller: Some(Mutex::new(CallerEngines {
                management,
                next_qp: 0,
                held: None,
                pending: None,
            })),
        })
    }

    /// Runs the engines on this thread, a step of each in turn, until a
    /// round in which none had anything to do; returns how many rounds
    /// did something. Does nothing (and returns 0) on a device whose
    /// engines have threads. Engines that keep finding work without end
    /// would not return: that is the hang a caller's timeout should
    /// catch.
    pub fn run_engines(&self) -> u64 {
        let Some(caller) = &self.caller else {
            return 0;
        };
        let mut engines = lock(caller);
        let CallerEngines {
            management,
            next_qp,
            held,
            pending,
        } = &mut *engines;
        let device = &*self.device;
        let mut rounds = 0;
        loop {
            let steps = [
                management.step(device, false),
                send::send_step(device, next_qp, false),
                fabric::pump_step(device, held, false),
                fabric::link_step(device, pending, false),
                recv::receive_step(device, false),
            ];
            if !steps.contains(&Progress::Worked) {
                return rounds;
            }
            rounds += 1;
        }
    }

    /// A handle for the control socket.
    pub fn control(&self) -> EfaControl {
        EfaControl::new(Arc::clone(&self.device))
    }

    /// The attributes the device reports.
    pub fn attrs(&self) -> &DeviceAttrs {
        &self.device.attrs
    }

    /// A trapped BAR0 read of any size: the registers as the driver's
    /// readless reads see them (the driver itself never reads BAR0).
    pub fn regs_read(&self, offset: u64, data: &mut [u8]) {
        let state = self.device.lock();
        read_bytes(offset, data, REGS_BAR_SIZE, |at| read_register(&state, at));
    }

    /// A trapped BAR0 write: aligned dwords (or qwords, low dword first);
    /// anything else is ignored and counted.
    pub fn regs_write(&self, offset: u64, data: &[u8]) {
        let refused = &self.device.stats.bad_register_accesses;
        let Some((dwords, count)) = accepted_write_dwords(offset, data, 8, refused) else {
            return;
        };
        for &(at, value) in &dwords[..count] {
            write_register(&self.device, at, value);
        }
    }

    /// A trapped read of the doorbell BAR: doorbells read 0.
    pub fn db_read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    /// A trapped write to the doorbell BAR (32-bit doorbells).
    pub fn db_write(&self, offset: u64, data: &[u8]) {
        let refused = &self.device.stats.bad_register_accesses;
        let Some((dwords, count)) = accepted_write_dwords(offset, data, 4, refused) else {
            return;
        };
        for &(at, value) in &dwords[..count] {
            send::doorbell(&self.device, at, value);
        }
    }

    /// Bus Master Enable changed in the PCI command register.
    pub fn set_bus_master(&self, enabled: bool) {
        self.device.gate.set_bus_master(enabled);
        self.device.lock().bus_master = enabled;
        self.device.wake_all();
    }

    /// A PCI-level reset (FLR, or the client went away): everything back
    /// to power-on. Returns once no DMA of work taken before it can still
    /// run.
    pub fn reset(&self) -> Result<(), QuiesceTimeout> {
        reset_device(&self.device, true);
        self.device.gate.quiesce()
    }
}

impl Drop for Efa {
    fn drop(&mut self) {
        stop(&self.device, &mut self.threads);
    }
}

fn stop(device: &Device, threads: &mut Vec<JoinHandle<()>>) {
    device.stopping.store(true, Ordering::SeqCst);
    device.lock().shutdown = true;
    device.wake_all();
    device.outbound.wake_all();
    device.link.shutdown();
    for thread in threads.drain(..) {
        if thread.join().is_err() {
            tracing::error!("EFA engine thread panicked");
        }
    }
}

/// A message-ID base unlikely to repeat across server restarts, so a peer
/// that remembers recent IDs never takes a new message for an old one.
fn first_message_id() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    now ^ u64::from(std::process::id()) << 48
}

/// DEV_STS now.
fn dev_sts(state: &State) -> u32 {
    DevSts::READY
        .with(
            DevSts::RESET_IN_PROGRESS,
            state.regs.reset != ResetPhase::Idle,
        )
        .with(DevSts::RESET_FINISHED, state.regs.reset_finished)
        .raw()
}

/// What the register at dword offset `at` reads (0 for write-only and
/// reserved ones).
pub(crate) fn read_register(state: &State, at: u64) -> u32 {
    let regs = &state.regs;
    let Some((reg, _)) = Reg::at(at) else {
        return 0;
    };
    match reg {
        Reg::Version => ADMIN_API_VERSION,
        Reg::ControllerVersion => CONTROLLER_VERSION,
        Reg::Caps => CAPS,
        Reg::AqBaseLo => regs.aq_base as u32,
        Reg::AqBaseHi => (regs.aq_base >> 32) as u32,
        Reg::AqCaps => regs.aq_caps,
        Reg::AcqBaseLo => regs.acq_base as u32,
        Reg::AcqBaseHi => (regs.acq_base >> 32) as u32,
        Reg::AcqCaps => regs.acq_caps,
        Reg::AenqCaps => regs.aenq_caps,
        Reg::AenqBaseLo => regs.aenq_base as u32,
        Reg::AenqBaseHi => (regs.aenq_base >> 32) as u32,
        Reg::AenqConsDb => regs.aenq_cons,
        Reg::IntrMask => regs.intr_mask,
        Reg::DevCtl => regs.dev_ctl,
        Reg::DevSts => dev_sts(state),
        Reg::MmioRespLo => regs.mmio_resp as u32,
        Reg::MmioRespHi => (regs.mmio_resp >> 32) as u32,
        Reg::AqProdDb | Reg::MmioRegRead | Reg::EqDb => 0,
    }
}

fn set_low(value: u64, low: u32) -> u64 {
    (value & !0xffff_ffff) | u64::from(low)
}

fn set_high(value: u64, high: u32) -> u64 {
    (value & 0xffff_ffff) | u64::from(high) << 32
}

/// One dword written to BAR0.
fn write_register(device: &Device, at: u64, value: u32) {
    let Some((reg, _)) = Reg::at(at) else {
        tracing::debug!(
            offset = at,
            value,
            "write to a reserved register offset ignored"
        );
        return;
    };
    let mut state = device.lock();
    let regs = &mut state.regs;
    match reg {
        Reg::AqBaseLo => regs.aq_base = set_low(regs.aq_base, value),
        Reg::AqBaseHi => regs.aq_base = set_high(regs.aq_base, value),
        Reg::AqCaps => regs.aq_caps = value,
        Reg::AcqBaseLo => regs.acq_base = set_low(regs.acq_base, value),
        Reg::AcqBaseHi => regs.acq_base = set_high(regs.acq_base, value),
        Reg::AcqCaps => regs.acq_caps = value,
        Reg::AenqCaps => regs.aenq_caps = value,
        Reg::AenqBaseLo => regs.aenq_base = set_low(regs.aenq_base, value),
        Reg::AenqBaseHi => regs.aenq_base = set_high(regs.aenq_base, value),
        Reg::AenqConsDb => {
            regs.aenq_cons = value;
            drop(state);
            device.mgmt_wake.notify_all();
        }
        Reg::AqProdDb => {
            state.admin.sq_tail = value as u16;
            drop(state);
            device.mgmt_wake.notify_all();
        }
        Reg::IntrMask => regs.intr_mask = IntrMask::from_raw(value).known().raw(),
        Reg::MmioRespLo => regs.mmio_resp = set_low(regs.mmio_resp, value),
        Reg::MmioRespHi => regs.mmio_resp = set_high(regs.mmio_resp, value),
        Reg::MmioRegRead => {
            let answer = readless_answer(&state, value);
            drop(state);
            readless_write(device, answer);
        }
        Reg::DevCtl => {
            let ctl = DevCtl::from_raw(value);
            let was = DevCtl::from_raw(regs.dev_ctl);
            regs.dev_ctl = value;
            let start = ctl.contains(DevCtl::DEV_RESET) && !was.contains(DevCtl::DEV_RESET);
            let end = !ctl.contains(DevCtl::DEV_RESET) && regs.reset == ResetPhase::Requested;
            drop(state);
            if start {
                let reason = value >> DEV_CTL_RESET_REASON_SHIFT;
                tracing::info!(
                    reason = reset_reason_name(reason),
                    "the driver resets the device"
                );
                device.trace.record("reset", || {
                    serde_json::json!({"name": "DEV_CTL reset", "reset_reason": reset_reason_name(reason)})
                });
                reset_device(device, false);
            } else if end {
                device.lock().regs.reset = ResetPhase::Draining;
                device.mgmt_wake.notify_all();
            }
        }
        Reg::EqDb => {
            drop(state);
            events::arm_eq(device, value);
        }
        Reg::Version | Reg::ControllerVersion | Reg::Caps | Reg::DevSts => {
            tracing::debug!(
                register = reg.name(),
                value,
                "write to a read-only register ignored"
            );
        }
    }
}

/// A readless read's answer: where it goes and what it says.
struct ReadlessAnswer {
    addr: u64,
    offset: u16,
    response: [u8; 8],
}

/// Reads the register a readless request names (under the state lock).
fn readless_answer(state: &State, request: u32) -> ReadlessAnswer {
    let req_id = (request & MMIO_REG_READ_REQ_ID_MASK) as u16;
    let offset = (request >> MMIO_REG_READ_REG_OFF_SHIFT) as u16;
    let value = read_register(state, u64::from(offset));
    let mut response = [0u8; 8];
    put_u16(&mut response, 0, req_id);
    put_u16(&mut response, 2, offset);
    put_u32(&mut response, 4, value);
    ReadlessAnswer {
        addr: state.regs.mmio_resp,
        offset,
        response,
    }
}

/// Writes a readless answer `{req_id, reg_off, reg_val}` into the response
/// buffer with `req_id` last, before the register write returns. Only
/// memory the device reaches directly is written from here; anything else
/// goes to the management thread (and will likely be late).
fn readless_write(device: &Device, answer: ReadlessAnswer) {
    let ReadlessAnswer {
        addr,
        offset,
        response,
    } = answer;
    if addr == 0 {
        Stats::add(&device.stats.readless_failures, 1);
        p2plab_ratelimit::log_limited!(debug, offset, "readless read without a response address");
        return;
    }
    let mut write = |slices: &[p2plab_dma::VolatileSlice<'_>]| {
        // The value first, the request ID last: the driver polls the ID.
        write_at(slices, 2, &response[2..]);
        std::sync::atomic::fence(Ordering::Release);
        write_at(slices, 0, &response[..2]);
        Ok(())
    };
    match device
        .gate
        .with_direct(&[(addr, 8)], Access::Write, &mut write)
    {
        Ok(Some(_)) => Stats::add(&device.stats.readless_reads, 1),
        Ok(None) => {
            // Not direct guest RAM: a message through QEMU, which the
            // socket thread must not wait for.
            let epoch = device.gate.epoch();
            device.lock().mgmt_jobs.push_back(MgmtJob::Readless {
                addr,
                response,
                epoch,
            });
            device.mgmt_wake.notify_all();
            Stats::add(&device.stats.readless_failures, 1);
        }
        Err(fault) => {
            Stats::add(&device.stats.readless_failures, 1);
            device.dma_failed("readless response", &fault);
        }
    }
}

/// Copies `bytes` to offset `at` of the memory `slices` cover in order.
pub(crate) fn write_at(slices: &[p2plab_dma::VolatileSlice<'_>], at: usize, bytes: &[u8]) {
    let mut skip = at;
    let mut bytes = bytes;
    for slice in slices {
        if bytes.is_empty() {
            return;
        }
        if skip >= slice.len() {
            skip -= slice.len();
            continue;
        }
        let take = bytes.len().min(slice.len() - skip);
        if let Ok(part) = slice.subslice(skip, take) {
            part.copy_from(&bytes[..take]);
        }
        bytes = &bytes[take..];
        skip = 0;
    }
}

/// Tears everything down: objects, queues, work in flight. A DEV_CTL
/// reset keeps the readless address (the driver rewrites it anyway) and
/// starts the handshake; a PCI reset goes back to power-on.
fn reset_device(device: &Device, pci: bool) {
    {
        let mut state = device.lock();
        let mmio_resp = state.regs.mmio_resp;
        let dev_ctl = state.regs.dev_ctl;
        state.objects.clear();
        state.admin = Default::default();
        state.aenq_pending.clear();
        state.mgmt_jobs.clear();
        state.send_jobs.clear();
        state.regs = state::Registers::new();
        if !pci {
            state.regs.mmio_resp = mmio_resp;
            state.regs.dev_ctl = dev_ctl;
            state.regs.reset = ResetPhase::Requested;
        }
        // Work taken before this line can no longer start an access.
        device.gate.invalidate();
    }
    lock(&device.reliability).clear();
    device.outbound.clear();
    Stats::add(&device.stats.resets, 1);
    device.wake_all();
}

/// A reset the host asks for (`p2plab-ctl reset`): as a PCI reset, and
/// returns once the DMA of older work has drained.
pub(crate) fn host_reset(device: &Device) -> Result<(), QuiesceTimeout> {
    reset_device(device, true);
    device.gate.quiesce()
}
