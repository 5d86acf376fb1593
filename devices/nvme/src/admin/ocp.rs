//! The OCP Datacenter NVMe SSD Error Injection feature (FID C0h), the
//! in-band way a guest arms faults (`nvme ocp set-error-injection
//! --no-uuid`). Each entry becomes an injection spec of the `p2plab-fault`
//! crate, armed like one from the control socket:
//!
//! | OCP type | injection |
//! |---|---|
//! | 1 CPU/controller hang | `timeout,no-abort` (Linux's Abort fails, it resets the controller) |
//! | 2 NAND hang | `timeout,opcode=read` (an Abort aborts it) |
//! | 4 logical firmware error, 5 DRAM corruption (critical path), 8 SRAM corruption, 9 HW malfunction | `cfs` |
//! | 6 DRAM corruption (non-critical path) | `corrupt` (Read data) |
//! | 7 NAND corruption | `status=0x281,opcode=read` (Unrecovered Read Error) |
//! | 10 no more NAND spares | `status=0x280,opcode=write` (Write Fault) |
//!
//! Entry flags: Enable (bit 0) arms it; Single Instance (bit 1) fires once
//! (`count=1`). NRTDP, the number of reads that trigger it, lets that many
//! reads pass first (`opcode=read,after=N`). Other types (PLP defect,
//! incomplete shutdown) are refused with Invalid Field, and so is a set
//! that does not fit beside what the host armed (the controller keeps at
//! most `fault::MAX_ARMED` specs); a refused set leaves the previous one
//! armed.

use crate::fault::FaultSpec;
use tracing::info;

use crate::context::{CommandContext, CommandResult, Outcome};
use crate::fields::{GetFeatures, Select, SetFeatures};
use crate::lock;
use crate::spec::Status;

/// Bytes per entry, and the most entries (NUM is 7 bits, 127 at most).
pub(crate) const ENTRY_SIZE: usize = 32;
pub(crate) const MAX_ENTRIES: usize = 127;

// A full set of entries fits the controller's cap on armed specs, with
// room for one the host arms.
const _: () = assert!(MAX_ENTRIES < crate::fault::MAX_ARMED);

/// The injection an entry asks for (None: a disabled entry).
pub(crate) fn entry_spec(entry: &[u8; ENTRY_SIZE]) -> Result<Option<FaultSpec>, Status> {
    let enable = entry[0] & 1 != 0;
    let single = entry[0] & 2 != 0;
    let kind = u16::from_le_bytes([entry[2], entry[3]]);
    let nrtdp = u16::from_le_bytes([entry[4], entry[5]]);
    let base = match kind {
        1 => "timeout,no-abort",
        2 => "timeout,opcode=read",
        4 | 5 | 8 | 9 => "cfs",
        6 => "corrupt",
        7 => "status=0x281,opcode=read",
        10 => "status=0x280,opcode=write",
        _ => return Err(Status::INVALID_FIELD),
    };
    if !enable {
        return Ok(None);
    }
    let mut text = base.to_owned();
    if single {
        text.push_str(",count=1");
    }
    if nrtdp > 0 {
        if !text.contains("opcode=") {
            text.push_str(",opcode=read");
        }
        text.push_str(&format!(",after={nrtdp}"));
    }
    // The table above only builds specs the parser accepts; a refusal
    // would be this crate's bug, reported as such rather than a panic.
    text.parse().map(Some).map_err(|_| Status::INTERNAL_ERROR)
}

/// Set Features C0h: NUM (CDW11 6:0) entries replace the previous ones.
pub(crate) fn set_error_injection(cx: &mut CommandContext<'_>, f: &SetFeatures) -> CommandResult {
    if f.sv {
        return Err(Status::FEATURE_NOT_SAVEABLE);
    }
    let num = (f.cdw11 & 0x7f) as usize;
    let mut entries = Vec::with_capacity(num);
    if num > 0 {
        let data = cx.receive(num * ENTRY_SIZE)?;
        for chunk in data.chunks_exact(ENTRY_SIZE) {
            let mut entry = [0u8; ENTRY_SIZE];
            entry.copy_from_slice(chunk);
            // Check every entry before arming any.
            entries.push((entry, entry_spec(&entry)?));
        }
    }
    let state = cx.state;
    let mut admin = lock(&state.admin);
    let previous: Vec<u64> = admin
        .ocp_error_injection
        .iter()
        .filter_map(|&(_, id)| id)
        .collect();
    let specs: Vec<FaultSpec> = entries.iter().filter_map(|&(_, spec)| spec).collect();
    // All or nothing: entries that do not fit beside what the host armed
    // leave the previous set armed.
    let mut ids = state
        .replace_faults(&previous, &specs)
        .map_err(|e| {
            info!(error = %e, entries = specs.len(), "OCP error injection refused");
            Status::INVALID_FIELD
        })?
        .into_iter();
    let mut armed = Vec::with_capacity(entries.len());
    for (entry, spec) in entries {
        let id = spec.and_then(|_| ids.next());
        info!(
            kind = u16::from_le_bytes([entry[2], entry[3]]),
            ?id,
            "OCP error injection entry"
        );
        armed.push((entry, id));
    }
    admin.ocp_error_injection = armed;
    Ok(Outcome::success())
}

/// Get Features C0h: Dword 0 NUME (6:0), and the entries as data (127
/// entries' worth, unused ones zero).
pub(crate) fn get_error_injection(cx: &mut CommandContext<'_>, f: &GetFeatures) -> CommandResult {
    if f.sel == Select::Capabilities {
        // Changeable, not saveable, not namespace specific.
        return Ok(Outcome::with_result(0b100));
    }
    let mut data = vec![0u8; MAX_ENTRIES * ENTRY_SIZE];
    let count = if f.sel == Select::Default {
        0
    } else {
        let admin = lock(&cx.state.admin);
        for (slot, (entry, _)) in data
            .chunks_exact_mut(ENTRY_SIZE)
            .zip(admin.ocp_error_injection.iter())
        {
            slot.copy_from_slice(entry);
        }
        admin.ocp_error_injection.len()
    };
    cx.send(&data)?;
    Ok(Outcome::with_result(count as u32))
}
