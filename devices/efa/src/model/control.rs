//! The control verbs (`p2plab-ctl status|inject|clear|reset|trace`) on a
//! handle to the device's shared state.

use std::sync::Arc;

use crate::fault::{EfaAction, EfaFaultSpec};
use p2plab_kit::regs::register_values;
use p2plab_kit::{arm_spec, counters_with, Armed, DeviceControl};

use super::Device;
use crate::defs::{AdminStatus, IoStatus};
use crate::regs::Reg;
use crate::stats::StatsSnapshot;

/// A cheap handle to the EFA for the control socket and the stats file.
#[derive(Clone)]
pub struct EfaControl(Arc<Device>);

impl std::fmt::Debug for EfaControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EfaControl").finish_non_exhaustive()
    }
}

/// How many objects of each kind the device holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObjectCounts {
    /// User access regions.
    pub uars: u64,
    /// Protection domains.
    pub pds: u64,
    /// Address handles.
    pub ahs: u64,
    /// Memory regions.
    pub mrs: u64,
    /// Completion queues.
    pub cqs: u64,
    /// Event queues.
    pub eqs: u64,
    /// Queue pairs.
    pub qps: u64,
}

impl EfaControl {
    pub(crate) fn new(device: Arc<Device>) -> Self {
        Self(device)
    }

    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.0.stats.snapshot()
    }

    /// The live objects.
    pub fn objects(&self) -> ObjectCounts {
        let state = self.0.lock();
        let o = &state.objects;
        ObjectCounts {
            uars: o.uars.count() as u64,
            pds: o.pds.count() as u64,
            ahs: o.ahs.count() as u64,
            mrs: o.mrs.count() as u64,
            cqs: o.cqs.count() as u64,
            eqs: o.eqs.count() as u64,
            qps: o.qps.count() as u64,
        }
    }

    /// Whether the fabric port is up: a peer on the link and no
    /// `link-down` fault.
    pub fn link_up(&self) -> bool {
        self.0.link.is_up() && self.0.port_up()
    }

    /// Arms a fault; returns its ID.
    pub fn arm(&self, spec: EfaFaultSpec) -> Result<u64, String> {
        match spec.action {
            EfaAction::AdminError(status) if AdminStatus::from_code(status).is_none() => {
                return Err(format!("admin-error={status}: not an admin status (1..=7)"));
            }
            EfaAction::CqError(status) if IoStatus::from_code(status).is_none() => {
                return Err(format!("cq-error={status}: not a completion status"));
            }
            _ => {}
        }
        let id = self.0.faults().arm(spec).map_err(|e| e.to_string())?;
        tracing::info!(id, %spec, "fault armed");
        if spec.action == EfaAction::LinkDown {
            super::set_port(&self.0, false);
        }
        Ok(id)
    }

    /// The device's decoded trace recorder.
    pub fn trace(&self) -> &p2plab_trace::Tracer {
        &self.0.trace
    }
}

impl DeviceControl for EfaControl {
    /// The counters, the live objects, and whether the port is up, flat;
    /// the wire's own counters under `wire` when the port has a wire.
    fn counters(&self) -> serde_json::Value {
        let o = self.objects();
        let mut json = counters_with(
            self.stats(),
            &[
                ("link_up", u64::from(self.link_up())),
                ("uars", o.uars),
                ("pds", o.pds),
                ("ahs", o.ahs),
                ("mrs", o.mrs),
                ("cqs", o.cqs),
                ("eqs", o.eqs),
                ("qps", o.qps),
            ],
        );
        if let (Some(object), Some(wire)) = (json.as_object_mut(), self.0.link.counters()) {
            object.insert("wire".into(), wire);
        }
        json
    }

    fn inject(&self, spec: &str) -> Result<Armed, String> {
        arm_spec(spec, |spec: EfaFaultSpec| self.arm(spec))
    }

    /// Disarms everything; a port taken down by `link-down` comes back up.
    fn clear(&self) {
        let was_down = self.0.faults().link_down();
        self.0.faults().clear();
        if was_down {
            super::set_port(&self.0, true);
        }
    }

    /// A reset nobody asked for: the device drops everything, as after a
    /// PCI reset, and the driver finds its queues gone.
    fn reset(&self) -> Result<(), String> {
        super::host_reset(&self.0).map_err(|e| e.to_string())
    }

    fn fault_report(&self) -> serde_json::Value {
        serde_json::to_value(self.0.faults().report()).unwrap_or_default()
    }

    /// The readable BAR0 registers by name, as a readless read returns
    /// them now.
    fn registers(&self) -> Option<Vec<(&'static str, u64)>> {
        let state = self.0.lock();
        Some(register_values::<Reg>(|reg| {
            u64::from(super::read_register(&state, reg.offset()))
        }))
    }

    fn tracer(&self) -> &p2plab_trace::Tracer {
        &self.0.trace
    }
}
