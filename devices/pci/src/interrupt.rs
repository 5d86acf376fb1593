//! Interrupt delivery shared between the socket thread (which applies the
//! client's SET_IRQS and the guest's config writes) and the device's worker
//! threads (which call [`InterruptController::notify`]).
//!
//! Delivery means writing the eventfd the client bound to the vector; QEMU
//! turns that into an MSI-X message (or an INTx assertion) for the guest.
//!
//! Every bound eventfd is made non-blocking, and a write that would block
//! (the client filled the counter to its maximum) drops the signal and
//! counts it ([`InterruptController::dropped_signals`]): no thread ever
//! blocks on a client's fd, least of all under the interrupt lock.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use p2plab_ratelimit::log_limited;
use p2plab_vfio_user::fdkind::set_nonblocking;
use p2plab_vfio_user::{DeviceError, IrqAction, IrqData, IrqInfo, IrqSet};
use tracing::{debug, trace};
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_AUTOMASKED, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE,
    VFIO_PCI_ERR_IRQ_INDEX, VFIO_PCI_INTX_IRQ_INDEX, VFIO_PCI_MSIX_IRQ_INDEX,
    VFIO_PCI_MSI_IRQ_INDEX, VFIO_PCI_REQ_IRQ_INDEX,
};
use vmm_sys_util::eventfd::EventFd;

use crate::msix::{
    ClientMask, FireOutcome, MsixAccessError, MsixControl, MsixState, VectorBinding,
};

/// What became of a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// An eventfd was signalled.
    Signalled,
    /// The vector (or INTx) is masked; it fires when unmasked.
    Pending,
    /// No interrupt mechanism is enabled and bound, or the vector does not
    /// exist. Nothing happened.
    Dropped,
}

/// INTx as vfio models it: one eventfd, automasked after each assertion
/// until the client unmasks it (after the guest's EOI).
#[derive(Debug, Default)]
struct IntxLine {
    eventfd: Option<EventFd>,
    masked: bool,
    pending: bool,
    /// COMMAND.INTX_DISABLE.
    disabled_by_command: bool,
}

#[derive(Debug)]
struct Inner {
    msix: Option<MsixState>,
    msix_fds: Vec<Option<EventFd>>,
    intx: IntxLine,
}

/// The interrupt state of one PCI function. Cheap to share: clone the
/// `Arc` into worker threads and call [`notify`](Self::notify).
#[derive(Debug)]
pub struct InterruptController {
    /// INTx pin from config space (0 = none).
    intx_pin: u8,
    inner: Mutex<Inner>,
    /// Signals lost because an eventfd write failed (a full counter).
    dropped: AtomicU64,
}

/// Makes a bound eventfd non-blocking; the transport already does this for
/// fds from the socket, this covers every other caller of `set_irqs`.
fn make_nonblocking(eventfd: &EventFd) {
    // SAFETY: `eventfd` owns the fd and outlives the borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(eventfd.as_raw_fd()) };
    if let Err(error) = set_nonblocking(fd) {
        log_limited!(warn, %error, "cannot make an interrupt eventfd non-blocking");
    }
}

impl InterruptController {
    /// Writes one signal to `eventfd` without ever blocking.
    fn signal(&self, eventfd: &EventFd, what: &str, vector: u16) -> Delivery {
        match eventfd.write(1) {
            Ok(()) => {
                trace!(what, vector, "interrupt signalled");
                Delivery::Signalled
            }
            Err(error) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                log_limited!(
                    warn,
                    what,
                    vector,
                    %error,
                    "interrupt dropped: writing its eventfd failed (a full counter?)"
                );
                Delivery::Dropped
            }
        }
    }
}

fn invalid(what: &'static str) -> DeviceError {
    DeviceError::invalid(what)
}

impl InterruptController {
    /// `msix_vectors` = 0 means no MSI-X; `intx_pin` = 0 means no INTx.
    pub fn new(msix_vectors: u16, intx_pin: u8) -> Arc<Self> {
        let msix = (msix_vectors > 0).then(|| MsixState::new(msix_vectors));
        let vectors = msix.as_ref().map_or(0, |m| usize::from(m.vectors()));
        Arc::new(Self {
            intx_pin,
            inner: Mutex::new(Inner {
                msix,
                msix_fds: (0..vectors).map(|_| None).collect(),
                intx: IntxLine::default(),
            }),
            dropped: AtomicU64::new(0),
        })
    }

    /// Signals dropped because their eventfd could not take them (the
    /// client let its counter fill up, or closed something odd).
    pub fn dropped_signals(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The controller matching a config space's MSI-X capability and pin.
    pub fn for_config(config: &crate::ConfigSpace) -> Arc<Self> {
        Self::new(
            config.msix().map_or(0, |m| m.vectors),
            config.interrupt_pin(),
        )
    }

    /// INTx pin (0 = none).
    pub fn intx_pin(&self) -> u8 {
        self.intx_pin
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A worker that panicked while holding the lock leaves consistent
        // plain data behind; keep delivering interrupts.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Number of MSI-X vectors (0 without MSI-X).
    pub fn msix_vectors(&self) -> u16 {
        self.lock().msix.as_ref().map_or(0, MsixState::vectors)
    }

    /// Whether MSI-X is enabled in Message Control.
    pub fn msix_enabled(&self) -> bool {
        self.lock().msix.as_ref().is_some_and(MsixState::enabled)
    }

    /// Whether `vector` has its pending bit set.
    pub fn msix_pending(&self, vector: u16) -> bool {
        self.lock()
            .msix
            .as_ref()
            .is_some_and(|m| m.is_pending(vector))
    }

    /// The device raises `vector`: an MSI-X message if MSI-X is enabled,
    /// otherwise INTx (the vector number is then irrelevant). Safe to call
    /// from any thread.
    pub fn notify(&self, vector: u16) -> Delivery {
        let mut inner = self.lock();
        let inner = &mut *inner;
        if let Some(msix) = inner.msix.as_mut() {
            if msix.enabled() {
                return match msix.fire(vector) {
                    FireOutcome::Deliver => match inner.msix_fds.get(usize::from(vector)) {
                        Some(Some(eventfd)) => self.signal(eventfd, "msix", vector),
                        _ => Delivery::Dropped,
                    },
                    FireOutcome::Pending => {
                        trace!(vector, "MSI-X vector masked, now pending");
                        Delivery::Pending
                    }
                    FireOutcome::NotEnabled => Delivery::Dropped,
                };
            }
        }
        self.assert_intx(&mut inner.intx)
    }

    fn assert_intx(&self, intx: &mut IntxLine) -> Delivery {
        let pin = self.intx_pin;
        if pin == 0 || intx.disabled_by_command {
            return Delivery::Dropped;
        }
        let Some(eventfd) = intx.eventfd.as_ref() else {
            return Delivery::Dropped;
        };
        if intx.masked {
            intx.pending = true;
            return Delivery::Pending;
        }
        intx.masked = true;
        self.signal(eventfd, "intx", 0)
    }

    fn deliver_msix(&self, inner: &Inner, vectors: &[u16]) {
        for &vector in vectors {
            if let Some(Some(eventfd)) = inner.msix_fds.get(usize::from(vector)) {
                debug!(vector, "delivering pending MSI-X vector");
                self.signal(eventfd, "msix", vector);
            }
        }
    }

    fn unmask_intx(&self, intx: &mut IntxLine) {
        intx.masked = false;
        if intx.pending {
            intx.pending = false;
            self.assert_intx(intx);
        }
    }

    /// MSI-X Message Control changed in config space.
    pub fn set_msix_control(&self, control: MsixControl) {
        let mut inner = self.lock();
        if let Some(msix) = inner.msix.as_mut() {
            let ready = msix.set_control(control);
            self.deliver_msix(&inner, &ready);
        }
    }

    /// COMMAND.INTX_DISABLE changed.
    pub fn set_intx_disabled(&self, disabled: bool) {
        let mut inner = self.lock();
        inner.intx.disabled_by_command = disabled;
        if disabled {
            inner.intx.pending = false;
        }
    }

    /// See [`MsixState::set_table_masks_delivery`].
    pub fn set_table_masks_delivery(&self, on: bool) {
        let mut inner = self.lock();
        if let Some(msix) = inner.msix.as_mut() {
            let ready = msix.set_table_masks_delivery(on);
            self.deliver_msix(&inner, &ready);
        }
    }

    /// A BAR read that hit the MSI-X table (see [`MsixState::table_read`]).
    pub fn msix_table_read(&self, offset: u64, data: &mut [u8]) -> Result<(), MsixAccessError> {
        match self.lock().msix.as_ref() {
            Some(msix) => msix.table_read(offset, data),
            None => Err(MsixAccessError::OutOfRange {
                offset,
                len: data.len(),
            }),
        }
    }

    /// A BAR write that hit the MSI-X table; delivers vectors it unmasks.
    pub fn msix_table_write(&self, offset: u64, data: &[u8]) -> Result<(), MsixAccessError> {
        let mut inner = self.lock();
        let Some(msix) = inner.msix.as_mut() else {
            return Err(MsixAccessError::OutOfRange {
                offset,
                len: data.len(),
            });
        };
        let ready = msix.table_write(offset, data)?;
        self.deliver_msix(&inner, &ready);
        Ok(())
    }

    /// A BAR read that hit the PBA.
    pub fn msix_pba_read(&self, offset: u64, data: &mut [u8]) -> Result<(), MsixAccessError> {
        match self.lock().msix.as_ref() {
            Some(msix) => msix.pba_read(offset, data),
            None => Err(MsixAccessError::OutOfRange {
                offset,
                len: data.len(),
            }),
        }
    }

    /// A BAR write that hit the PBA (read-only: checked, then ignored).
    pub fn msix_pba_write(&self, offset: u64, data: &[u8]) -> Result<(), MsixAccessError> {
        match self.lock().msix.as_mut() {
            Some(msix) => msix.pba_write(offset, data),
            None => Err(MsixAccessError::OutOfRange {
                offset,
                len: data.len(),
            }),
        }
    }

    /// Device reset (or client gone): MSI-X off, table masked, nothing
    /// pending, every eventfd dropped.
    pub fn reset(&self) {
        let mut inner = self.lock();
        if let Some(msix) = inner.msix.as_mut() {
            msix.reset();
        }
        inner.msix_fds.iter_mut().for_each(|fd| *fd = None);
        inner.intx = IntxLine::default();
    }

    /// Answer to GET_IRQ_INFO.
    pub fn irq_info(&self, index: u32) -> Result<IrqInfo, DeviceError> {
        let info = match index {
            VFIO_PCI_INTX_IRQ_INDEX => IrqInfo {
                flags: VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_MASKABLE | VFIO_IRQ_INFO_AUTOMASKED,
                count: u32::from(self.intx_pin != 0),
            },
            VFIO_PCI_MSIX_IRQ_INDEX => IrqInfo {
                flags: VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_MASKABLE,
                count: u32::from(self.msix_vectors()),
            },
            // No MSI capability; no error/request notification.
            VFIO_PCI_MSI_IRQ_INDEX | VFIO_PCI_ERR_IRQ_INDEX | VFIO_PCI_REQ_IRQ_INDEX => IrqInfo {
                flags: VFIO_IRQ_INFO_EVENTFD,
                count: 0,
            },
            _ => return Err(invalid("no such IRQ index")),
        };
        Ok(info)
    }

    /// Applies a SET_IRQS request.
    pub fn set_irqs(&self, request: IrqSet) -> Result<(), DeviceError> {
        debug!(
            index = request.index,
            action = ?request.action,
            start = request.start,
            count = request.count,
            data = match &request.data {
                IrqData::None => "none",
                IrqData::Bool(_) => "bool",
                IrqData::EventFds(_) => "eventfd",
            },
            "SET_IRQS"
        );
        match request.index {
            VFIO_PCI_MSIX_IRQ_INDEX => self.set_msix_irqs(request),
            VFIO_PCI_INTX_IRQ_INDEX => self.set_intx_irqs(request),
            VFIO_PCI_MSI_IRQ_INDEX | VFIO_PCI_ERR_IRQ_INDEX | VFIO_PCI_REQ_IRQ_INDEX => {
                // Nothing to route; only "disable all" makes sense.
                if request.count == 0 && request.action == IrqAction::Trigger {
                    Ok(())
                } else {
                    Err(invalid("this IRQ index has no vectors"))
                }
            }
            _ => Err(invalid("no such IRQ index")),
        }
    }

    /// The vectors a request acts on, checked against `available`.
    fn request_range(
        request: &IrqSet,
        available: u32,
    ) -> Result<std::ops::Range<u32>, DeviceError> {
        let end = request
            .start
            .checked_add(request.count)
            .ok_or_else(|| invalid("IRQ range overflows"))?;
        if end > available {
            return Err(invalid("IRQ range beyond the vectors"));
        }
        let expected = request.count as usize;
        match &request.data {
            IrqData::Bool(flags) if flags.len() != expected => {
                Err(invalid("DATA_BOOL length does not match count"))
            }
            IrqData::EventFds(fds) if fds.len() != expected => {
                Err(invalid("DATA_EVENTFD length does not match count"))
            }
            _ => Ok(request.start..end),
        }
    }

    /// Vectors of the range selected by DATA_NONE (all) or DATA_BOOL.
    fn selected(range: std::ops::Range<u32>, data: &IrqData) -> Vec<u16> {
        range
            .enumerate()
            .filter(|&(i, _)| match data {
                IrqData::Bool(flags) => flags.get(i).copied().unwrap_or(false),
                _ => true,
            })
            .filter_map(|(_, vector)| u16::try_from(vector).ok())
            .collect()
    }

    fn set_msix_irqs(&self, request: IrqSet) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let Some(msix) = inner.msix.as_mut() else {
            return if request.count == 0 && request.action == IrqAction::Trigger {
                Ok(())
            } else {
                Err(invalid("the function has no MSI-X"))
            };
        };
        // TRIGGER with count 0 and DATA_NONE (or an empty fd list) tears
        // every vector down.
        if request.count == 0 && request.action == IrqAction::Trigger {
            if matches!(request.data, IrqData::None | IrqData::EventFds(_)) {
                for vector in 0..msix.vectors() {
                    msix.set_binding(vector, VectorBinding::Unbound);
                }
                inner.msix_fds.iter_mut().for_each(|fd| *fd = None);
                debug!("MSI-X: all eventfds released");
            }
            return Ok(());
        }
        let range = Self::request_range(&request, u32::from(msix.vectors()))?;
        let mut ready = Vec::new();
        match (request.action, request.data) {
            (IrqAction::Trigger, IrqData::EventFds(fds)) => {
                for (vector, eventfd) in range.zip(fds) {
                    let Ok(vector) = u16::try_from(vector) else {
                        continue;
                    };
                    if let Some(eventfd) = &eventfd {
                        make_nonblocking(eventfd);
                    }
                    let binding = if eventfd.is_some() {
                        VectorBinding::Bound
                    } else {
                        VectorBinding::Unbound
                    };
                    if let Some(slot) = inner.msix_fds.get_mut(usize::from(vector)) {
                        *slot = eventfd;
                    }
                    debug!(vector, ?binding, "MSI-X eventfd");
                    ready.extend(msix.set_binding(vector, binding));
                }
            }
            (IrqAction::Trigger, data) => {
                // Loopback: the client asks us to fire these vectors.
                for vector in Self::selected(range, &data) {
                    if msix.fire(vector) == FireOutcome::Deliver {
                        ready.push(vector);
                    }
                }
            }
            (IrqAction::Mask | IrqAction::Unmask, IrqData::EventFds(_)) => {
                return Err(invalid("MSI-X mask/unmask takes DATA_NONE or DATA_BOOL"));
            }
            (action, data) => {
                let mask = if action == IrqAction::Mask {
                    ClientMask::Masked
                } else {
                    ClientMask::Unmasked
                };
                for vector in Self::selected(range, &data) {
                    debug!(vector, ?mask, "MSI-X client mask");
                    ready.extend(msix.set_client_mask(vector, mask));
                }
            }
        }
        self.deliver_msix(inner, &ready);
        Ok(())
    }

    fn set_intx_irqs(&self, request: IrqSet) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        if request.count == 0 && request.action == IrqAction::Trigger {
            inner.intx.eventfd = None;
            inner.intx.masked = false;
            inner.intx.pending = false;
            debug!("INTx eventfd released");
            return Ok(());
        }
        let range = Self::request_range(&request, u32::from(self.intx_pin != 0))?;
        let selected = !Self::selected(range, &request.data).is_empty();
        match (request.action, request.data) {
            (IrqAction::Trigger, IrqData::EventFds(mut fds)) => {
                inner.intx.eventfd = fds.pop().flatten();
                if let Some(eventfd) = &inner.intx.eventfd {
                    make_nonblocking(eventfd);
                }
                inner.intx.masked = false;
                inner.intx.pending = false;
                debug!(bound = inner.intx.eventfd.is_some(), "INTx eventfd");
            }
            (IrqAction::Trigger, _) => {
                if selected {
                    self.assert_intx(&mut inner.intx);
                }
            }
            (IrqAction::Mask | IrqAction::Unmask, IrqData::EventFds(_)) => {
                // An unmask eventfd (KVM resamplefd) needs KVM; not here.
                return Err(invalid("INTx mask/unmask eventfds are not supported"));
            }
            (IrqAction::Mask, _) => {
                if selected {
                    inner.intx.masked = true;
                }
            }
            (IrqAction::Unmask, _) => {
                if selected {
                    self.unmask_intx(&mut inner.intx);
                }
            }
        }
        Ok(())
    }
}
