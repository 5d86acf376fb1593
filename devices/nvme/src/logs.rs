//! Log pages, the error log behind them, and asynchronous events.

use std::collections::{BTreeSet, VecDeque};

use crate::spec::{aen, log, put_u16, put_u32, put_u64, put_u8, Status};

/// Error Information log entries kept (Identify ELPE + 1).
pub const ERROR_LOG_ENTRIES: usize = 64;
const ERROR_ENTRY_SIZE: usize = 64;

/// One Error Information log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorEntry {
    pub sqid: u16,
    /// 0xffff when the error is not tied to a command (bad doorbell).
    pub cid: u16,
    pub status: Status,
    pub nsid: u32,
    pub lba: u64,
}

/// The newest [`ERROR_LOG_ENTRIES`] errors and the lifetime count.
#[derive(Debug, Default)]
pub struct ErrorLog {
    entries: VecDeque<(u64, ErrorEntry)>,
    count: u64,
}

impl ErrorLog {
    pub fn record(&mut self, entry: ErrorEntry) {
        self.count += 1;
        if self.entries.len() == ERROR_LOG_ENTRIES {
            self.entries.pop_back();
        }
        self.entries.push_front((self.count, entry));
    }

    /// Errors recorded since the controller started.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The log page, newest entry first; unused entries are zero.
    pub fn page(&self) -> Vec<u8> {
        let mut d = vec![0u8; ERROR_LOG_ENTRIES * ERROR_ENTRY_SIZE];
        for (i, (count, e)) in self.entries.iter().enumerate() {
            let at = i * ERROR_ENTRY_SIZE;
            put_u64(&mut d, at, *count);
            put_u16(&mut d, at + 8, e.sqid);
            put_u16(&mut d, at + 10, e.cid);
            // Status Field with the phase tag bit clear.
            put_u16(&mut d, at + 12, e.status.raw() << 1);
            // Parameter Error Location: not reported.
            put_u16(&mut d, at + 14, 0xffff);
            put_u64(&mut d, at + 16, e.lba);
            put_u32(&mut d, at + 24, e.nsid);
        }
        d
    }
}

/// SMART / Health Critical Warning bit 1: a temperature threshold is
/// crossed.
pub const CRITICAL_WARNING_TEMPERATURE: u8 = 1 << 1;

/// SMART / Health counters for one namespace or the whole controller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmartCounters {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_commands: u64,
    pub write_commands: u64,
    pub busy_minutes: u64,
    pub power_cycles: u64,
    pub power_on_hours: u64,
    pub unsafe_shutdowns: u64,
    pub media_errors: u64,
    pub error_log_entries: u64,
    pub temperature: u16,
    pub critical_warning: u8,
}

/// SMART / Health Information (02h), 512 bytes.
pub fn smart_page(c: &SmartCounters) -> Vec<u8> {
    let mut d = vec![0u8; 512];
    put_u8(&mut d, 0, c.critical_warning);
    put_u16(&mut d, 1, c.temperature);
    put_u8(&mut d, 3, 100); // Available Spare
    put_u8(&mut d, 4, 10); // Available Spare Threshold
    put_u8(&mut d, 5, 0); // Percentage Used
                          // Data units are thousands of 512-byte units, rounded up.
    let units = |bytes: u64| (bytes / 512).div_ceil(1000);
    crate::spec::put_u128(&mut d, 32, units(c.bytes_read));
    crate::spec::put_u128(&mut d, 48, units(c.bytes_written));
    crate::spec::put_u128(&mut d, 64, c.read_commands);
    crate::spec::put_u128(&mut d, 80, c.write_commands);
    crate::spec::put_u128(&mut d, 96, c.busy_minutes);
    crate::spec::put_u128(&mut d, 112, c.power_cycles);
    crate::spec::put_u128(&mut d, 128, c.power_on_hours);
    crate::spec::put_u128(&mut d, 144, c.unsafe_shutdowns);
    crate::spec::put_u128(&mut d, 160, c.media_errors);
    crate::spec::put_u128(&mut d, 176, c.error_log_entries);
    d
}

/// Firmware Slot Information (03h): one read-only slot, active.
pub fn firmware_slot_page(revision: &str) -> Vec<u8> {
    let mut d = vec![0u8; 512];
    put_u8(&mut d, 0, 0x01); // AFI: slot 1 active
    crate::spec::put_ascii(&mut d, 8, 8, revision);
    d
}

/// Changed Namespace List (04h).
pub fn changed_namespaces_page(changed: &BTreeSet<u32>) -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    if changed.len() > 1024 {
        put_u32(&mut d, 0, 0xffff_ffff);
    } else {
        for (i, nsid) in changed.iter().enumerate() {
            put_u32(&mut d, i * 4, *nsid);
        }
    }
    d
}

/// Commands Supported and Effects (05h) for the NVM command set: one
/// dword per opcode, admin commands first, then I/O commands. The command
/// tables supply the dwords, so the page lists exactly what they dispatch.
pub fn commands_effects_page(admin: &[u32; 256], io: &[u32; 256]) -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    for (opcode, (acs, iocs)) in admin.iter().zip(io).enumerate() {
        put_u32(&mut d, opcode * 4, *acs);
        put_u32(&mut d, 1024 + opcode * 4, *iocs);
    }
    d
}

/// Log pages this controller returns.
pub fn log_name(lid: u8) -> &'static str {
    match lid {
        log::ERROR_INFORMATION => "Error Information",
        log::SMART_HEALTH => "SMART / Health Information",
        log::FIRMWARE_SLOT => "Firmware Slot Information",
        log::CHANGED_NAMESPACES => "Changed Namespace List",
        log::COMMANDS_EFFECTS => "Commands Supported and Effects",
        _ => "unsupported log page",
    }
}

/// An asynchronous event waiting for an Asynchronous Event Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: u8,
    pub info: u8,
    pub log_page: u8,
}

impl AsyncEvent {
    pub fn error(info: u8) -> Self {
        Self {
            kind: aen::TYPE_ERROR,
            info,
            log_page: log::ERROR_INFORMATION,
        }
    }

    /// Completion Dword 0 of the Asynchronous Event Request.
    pub fn dword0(&self) -> u32 {
        u32::from(self.kind & 0x7) | (u32::from(self.info) << 8) | (u32::from(self.log_page) << 16)
    }
}

/// Events queued at most; more are dropped (the host is not listening).
pub const MAX_QUEUED_EVENTS: usize = 64;

/// Outstanding Asynchronous Event Requests and queued events. After an
/// event of a type is reported, that type stays masked until the host reads
/// the associated log page without Retain Asynchronous Event.
#[derive(Debug, Default)]
pub struct AsyncEvents {
    outstanding: Vec<u16>,
    queued: VecDeque<AsyncEvent>,
    masked: u8,
}

impl AsyncEvents {
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Parks an Asynchronous Event Request, or refuses it over the limit.
    pub fn park(&mut self, cid: u16, limit: usize) -> Result<(), Status> {
        if self.outstanding.len() >= limit {
            return Err(Status::ASYNC_EVENT_LIMIT_EXCEEDED);
        }
        self.outstanding.push(cid);
        Ok(())
    }

    /// Removes a parked request (Abort); true if it was there.
    pub fn unpark(&mut self, cid: u16) -> bool {
        match self.outstanding.iter().position(|&c| c == cid) {
            Some(i) => {
                self.outstanding.remove(i);
                true
            }
            None => false,
        }
    }

    pub fn push(&mut self, event: AsyncEvent) {
        if self.queued.len() < MAX_QUEUED_EVENTS {
            self.queued.push_back(event);
        } else {
            tracing::debug!(?event, "asynchronous event queue full, event dropped");
        }
    }

    /// Pairs parked requests with unmasked events, masking their types.
    pub fn take_deliverable(&mut self) -> Vec<(u16, AsyncEvent)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.queued.len() && !self.outstanding.is_empty() {
            let Some(event) = self.queued.get(i).copied() else {
                break;
            };
            let bit = 1u8 << (event.kind & 0x7);
            if self.masked & bit != 0 {
                i += 1;
                continue;
            }
            self.queued.remove(i);
            self.masked |= bit;
            let cid = self.outstanding.remove(0);
            out.push((cid, event));
        }
        out
    }

    /// The host read the log page of `kind` without RAE: unmask the type
    /// and forget queued events of it (the log now reports them).
    pub fn clear(&mut self, kind: u8) {
        self.masked &= !(1u8 << (kind & 0x7));
        self.queued.retain(|e| e.kind != kind);
    }

    /// Controller reset: requests are dropped without completions.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_log_keeps_the_newest_first() {
        let mut log = ErrorLog::default();
        for cid in 0..70u16 {
            log.record(ErrorEntry {
                sqid: 1,
                cid,
                status: Status::INVALID_FIELD,
                nsid: 1,
                lba: u64::from(cid),
            });
        }
        assert_eq!(log.count(), 70);
        let page = log.page();
        assert_eq!(page.len(), 64 * 64);
        assert_eq!(u64::from_le_bytes(page[0..8].try_into().unwrap()), 70);
        assert_eq!(u16::from_le_bytes([page[10], page[11]]), 69);
        assert_eq!(u16::from_le_bytes([page[12], page[13]]), 0x4002 << 1);
        let last = 63 * 64;
        assert_eq!(
            u64::from_le_bytes(page[last..last + 8].try_into().unwrap()),
            7
        );
    }

    #[test]
    fn smart_units_round_up() {
        let page = smart_page(&SmartCounters {
            bytes_read: 512,
            bytes_written: 512 * 1001,
            temperature: 313,
            ..Default::default()
        });
        assert_eq!(u64::from_le_bytes(page[32..40].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(page[48..56].try_into().unwrap()), 2);
        assert_eq!(u16::from_le_bytes([page[1], page[2]]), 313);
    }

    #[test]
    fn events_are_masked_until_the_log_is_read() {
        let mut ev = AsyncEvents::default();
        ev.push(AsyncEvent::error(aen::ERROR_INVALID_DOORBELL_VALUE));
        assert!(ev.take_deliverable().is_empty(), "no request parked");
        ev.park(7, 4).unwrap();
        ev.park(8, 4).unwrap();
        let got = ev.take_deliverable();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 7);
        assert_eq!(got[0].1.dword0(), 0x01_01_00);
        ev.push(AsyncEvent::error(aen::ERROR_INVALID_DOORBELL_REGISTER));
        assert!(ev.take_deliverable().is_empty(), "errors masked");
        ev.clear(aen::TYPE_ERROR);
        assert!(
            ev.take_deliverable().is_empty(),
            "queued error dropped by the log read"
        );
        ev.push(AsyncEvent::error(aen::ERROR_INVALID_DOORBELL_REGISTER));
        assert_eq!(ev.take_deliverable(), vec![(8, AsyncEvent::error(0))]);
        for cid in 0..4 {
            ev.park(cid, 4).unwrap();
        }
        assert_eq!(ev.park(9, 4), Err(Status::ASYNC_EVENT_LIMIT_EXCEEDED));
        assert!(ev.unpark(2));
        assert!(!ev.unpark(2));
    }

    #[test]
    fn effects_page_puts_admin_then_io_dwords_by_opcode() {
        let mut admin = [0u32; 256];
        let mut io = [0u32; 256];
        admin[0x06] = 1;
        admin[0xff] = 0x1f;
        io[0x01] = 3;
        let page = commands_effects_page(&admin, &io);
        let dword = |at: usize| u32::from_le_bytes(page[at..at + 4].try_into().unwrap());
        assert_eq!(page.len(), 4096);
        assert_eq!((dword(0x06 * 4), dword(0xff * 4)), (1, 0x1f));
        assert_eq!((dword(1024 + 4), dword(1024 + 8)), (3, 0));
        assert!(page[2048..].iter().all(|&b| b == 0), "reserved tail");
    }
}
