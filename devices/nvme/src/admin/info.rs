//! What the host asks about and tunes: Identify, Get Log Page, Get and Set
//! Features.

use std::time::Instant;

use tracing::{debug, warn};

use super::ADMIN_COMMANDS;
use crate::context::{CommandContext, CommandResult, Outcome};
use crate::features::{self, FeatureContext, SetEffect};
use crate::fields::{GetFeatures, GetLogPage, Identify, Select, SetFeatures};
use crate::identify;
use crate::io::IO_COMMANDS;
use crate::lock;
use crate::logs::{self, AsyncEvent};
use crate::spec::{aen, cns, feature, log, Status, CSI_NVM, NSID_ALL};
use crate::state::{AdminState, ControllerState};

pub(super) fn identify(cx: &mut CommandContext<'_>, f: Identify) -> CommandResult {
    let state = cx.state;
    let nsid = f.nsid;
    let count = state.namespace_count();
    let data = match f.cns {
        cns::NAMESPACE => state.check_nsid(nsid)?.identify(),
        cns::CONTROLLER => identify::controller(&state.cfg, count),
        cns::ACTIVE_NAMESPACES => {
            if nsid >= NSID_ALL - 1 {
                return Err(Status::INVALID_NAMESPACE);
            }
            identify::active_namespaces(count, nsid)
        }
        cns::NAMESPACE_DESCRIPTORS => state.check_nsid(nsid)?.identification_descriptors(),
        cns::CSI_NAMESPACE => {
            state.check_nsid(nsid)?;
            if f.csi != CSI_NVM {
                return Err(Status::INVALID_FIELD);
            }
            // The NVM command set adds nothing without metadata or PI.
            vec![0u8; 4096]
        }
        cns::CSI_CONTROLLER => {
            if f.csi != CSI_NVM {
                return Err(Status::INVALID_FIELD);
            }
            identify::controller_nvm()
        }
        cns::CSI_ACTIVE_NAMESPACES => {
            if nsid >= NSID_ALL - 1 {
                return Err(Status::INVALID_NAMESPACE);
            }
            if f.csi != CSI_NVM {
                return Err(Status::INVALID_FIELD);
            }
            identify::active_namespaces(count, nsid)
        }
        cns::INDEPENDENT_NAMESPACE => {
            state.check_nsid(nsid)?;
            identify::namespace_independent()
        }
        _ => return Err(Status::INVALID_FIELD),
    };
    cx.send(&data)?;
    Ok(Outcome::success())
}

pub(super) fn get_log_page(cx: &mut CommandContext<'_>, f: GetLogPage) -> CommandResult {
    let state = cx.state;
    let (len, offset) = (f.bytes(), f.lpo);
    if offset % 4 != 0 {
        return Err(Status::INVALID_FIELD);
    }
    if state.cfg.max_transfer().is_some_and(|max| len > max) {
        return Err(Status::INVALID_FIELD);
    }
    let page = match f.lid {
        log::ERROR_INFORMATION => {
            let mut admin = lock(&state.admin);
            if !f.rae {
                admin.events.clear(aen::TYPE_ERROR);
            }
            admin.error_log.page()
        }
        log::SMART_HEALTH => {
            let scope = match f.nsid {
                0 | NSID_ALL => None,
                n => Some(state.check_nsid(n)?.nsid()),
            };
            let counters = state.smart_counters(scope);
            if !f.rae {
                lock(&state.admin).events.clear(aen::TYPE_SMART);
            }
            logs::smart_page(&counters)
        }
        log::FIRMWARE_SLOT => logs::firmware_slot_page(&state.cfg.firmware),
        log::CHANGED_NAMESPACES => {
            let mut admin = lock(&state.admin);
            let page = logs::changed_namespaces_page(&admin.changed_namespaces);
            admin.changed_namespaces.clear();
            if !f.rae {
                admin.events.clear(aen::TYPE_NOTICE);
            }
            page
        }
        log::COMMANDS_EFFECTS => {
            if f.csi != CSI_NVM {
                return Err(Status::INVALID_FIELD);
            }
            logs::commands_effects_page(&ADMIN_COMMANDS.effects(), &IO_COMMANDS.effects())
        }
        _ => return Err(Status::INVALID_LOG_PAGE),
    };
    let size = page.len() as u64;
    if offset >= size {
        return Err(Status::INVALID_FIELD);
    }
    let end = size.min(offset + len);
    let part = page
        .get(offset as usize..end as usize)
        .ok_or(Status::INVALID_FIELD)?;
    debug!(log = logs::log_name(f.lid), offset, len, "log page");
    cx.send(part)?;
    Ok(Outcome::success())
}

fn feature_context(state: &ControllerState, admin: &AdminState) -> FeatureContext {
    FeatureContext {
        namespaces: state.namespace_count(),
        vectors: state.cfg.msix_vectors(),
        max_io_queues: state.cfg.max_io_queues,
        queues_created: admin.queues_created,
    }
}

pub(super) fn get_features(cx: &mut CommandContext<'_>, f: GetFeatures) -> CommandResult {
    let state = cx.state;
    if f.fid == feature::OCP_ERROR_INJECTION {
        return super::ocp::get_error_injection(cx, &f);
    }
    if f.fid == feature::TIMESTAMP && f.sel != Select::Capabilities {
        let bytes = if f.sel == Select::Current {
            lock(&state.admin).features.timestamp_bytes()
        } else {
            [0u8; 8]
        };
        cx.send(&bytes)?;
        return Ok(Outcome::success());
    }
    let admin = lock(&state.admin);
    let value = admin.features.get(&f, &feature_context(state, &admin))?;
    debug!(
        feature = features::name(f.fid),
        select = ?f.sel,
        value = format_args!("{value:#x}"),
        "get features"
    );
    Ok(Outcome::with_result(value))
}

pub(super) fn set_features(cx: &mut CommandContext<'_>, f: SetFeatures) -> CommandResult {
    let state = cx.state;
    if f.fid == feature::OCP_ERROR_INJECTION {
        return super::ocp::set_error_injection(cx, &f);
    }
    if f.fid == feature::TIMESTAMP {
        if f.sv {
            return Err(Status::FEATURE_NOT_SAVEABLE);
        }
        let data = cx.receive(8)?;
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&data);
        let ms = u64::from_le_bytes(raw) & features::TIMESTAMP_MS_MASK;
        lock(&state.admin).features.timestamp = Some((ms, Instant::now()));
        return Ok(Outcome::success());
    }
    let (result, effect, aec) = {
        let mut admin = lock(&state.admin);
        let ctx = feature_context(state, &admin);
        let (result, effect) = admin.features.set(&f, &ctx)?;
        (result, effect, admin.features.async_event_config)
    };
    debug!(
        feature = features::name(f.fid),
        value = format_args!("{:#x}", f.cdw11),
        "set features"
    );
    match effect {
        SetEffect::None => {}
        SetEffect::FlushCaches => {
            for ns in &state.namespaces {
                if let Err(e) = ns.backend().flush() {
                    warn!(nsid = ns.nsid(), %e, "flush on write cache disable failed");
                    return Err(Status::INTERNAL_ERROR);
                }
            }
        }
        SetEffect::TemperatureEvent => {
            // SMART critical warning: temperature.
            if aec & features::AEC_SMART_TEMPERATURE != 0 {
                lock(&state.admin).events.push(AsyncEvent {
                    kind: aen::TYPE_SMART,
                    info: aen::SMART_TEMPERATURE,
                    log_page: log::SMART_HEALTH,
                });
            }
        }
    }
    Ok(Outcome::with_result(result))
}
