//! How a device model signals the host: one trait, so a model runs with
//! the PCI function's interrupt controller in the server and with a
//! recorder in tests.

use std::sync::{Arc, OnceLock};

use p2plab_pci::{Delivery, InterruptController};

/// Delivers interrupt vectors; callable from any thread (engines and
/// workers call it, never with a lock of their own held).
pub trait Interrupts: Send + Sync + 'static {
    /// Signals `vector` (MSI-X, or INTx when MSI-X is off). Whether it is
    /// delivered, pended (masked) or dropped is the controller's business.
    fn notify(&self, vector: u16);
}

/// The PCI layer's controller: MSI-X (or INTx) onto the eventfds the
/// client bound.
impl Interrupts for InterruptController {
    fn notify(&self, vector: u16) {
        match InterruptController::notify(self, vector) {
            Delivery::Signalled => tracing::trace!(vector, "interrupt sent"),
            Delivery::Pending => tracing::debug!(vector, "interrupt pending (masked)"),
            Delivery::Dropped => {
                tracing::debug!(vector, "interrupt dropped: no MSI-X/INTx enabled and bound")
            }
        }
    }
}

/// Interrupts for a model built before its PCI function: the function
/// creates the interrupt controller and hands it over with
/// [`bind`](Self::bind) (`PciFunction::new`'s closure). Until then, and
/// if never bound, a vector is dropped (logged at debug).
#[derive(Debug, Default)]
pub struct LateInterrupts(OnceLock<Arc<InterruptController>>);

impl LateInterrupts {
    /// Unbound, shared with the model and with the closure that binds it.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// From now on, vectors go to `controller`. Only the first binding
    /// counts; a function binds once.
    pub fn bind(&self, controller: Arc<InterruptController>) {
        if self.0.set(controller).is_err() {
            tracing::warn!("interrupts bound twice; keeping the first controller");
        }
    }
}

impl Interrupts for LateInterrupts {
    fn notify(&self, vector: u16) {
        match self.0.get() {
            Some(controller) => Interrupts::notify(controller.as_ref(), vector),
            None => tracing::debug!(vector, "interrupt dropped: no controller bound yet"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a late-bound sink that loses vectors after binding, or
    /// panics before it: before `bind` a vector is dropped quietly, after
    /// it the controller gets it (pending, as every vector is masked).
    #[test]
    fn late_interrupts_reach_the_controller_once_bound() {
        let late = LateInterrupts::new();
        late.notify(1);
        let controller = InterruptController::new(2, 0);
        controller.set_msix_control(p2plab_pci::MsixControl {
            enabled: true,
            function_masked: true,
        });
        late.bind(Arc::clone(&controller));
        assert!(!controller.msix_pending(1), "the early vector was dropped");
        late.notify(1);
        assert!(
            controller.msix_pending(1),
            "the vector reached the controller"
        );
    }
}
