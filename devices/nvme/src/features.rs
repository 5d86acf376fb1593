//! Get / Set Features state (NVMe base 2.0, 5.27.1).
//!
//! Pure state: the admin worker decodes the command, calls in here and
//! does any data transfer (Timestamp) itself.

use std::time::Instant;

use crate::fields::{GetFeatures, Select, SetFeatures};
use crate::spec::{feature, Status, NSID_ALL};

/// Composite temperature reported in SMART, in Kelvin (40 C).
pub const COMPOSITE_TEMPERATURE: u16 = 313;
/// Warning and critical composite temperature thresholds (Identify WCTEMP,
/// CCTEMP), in Kelvin.
pub const WARNING_TEMPERATURE: u16 = 343;
pub const CRITICAL_TEMPERATURE: u16 = 373;

/// Async Event Configuration bits this controller can generate: SMART
/// critical warnings 7:0 and Namespace Attribute Notices (bit 8).
pub const SUPPORTED_ASYNC_EVENTS: u32 = 0x1ff;
/// Async Event Configuration bit 1: report the SMART temperature critical
/// warning.
pub const AEC_SMART_TEMPERATURE: u32 = 1 << 1;

/// The Timestamp feature's milliseconds (bits 47:0 of its 8 bytes).
pub const TIMESTAMP_MS_MASK: u64 = 0xffff_ffff_ffff;
/// Timestamp Origin (bits 51:49); 001b: set by the host.
const TIMESTAMP_ORIGIN_SHIFT: u32 = 49;

/// Feature capabilities returned for SEL = 011b (Supported Capabilities).
const CAP_NAMESPACE_SPECIFIC: u32 = 1 << 1;
const CAP_CHANGEABLE: u32 = 1 << 2;

#[derive(Debug, Clone)]
pub struct Features {
    pub arbitration: u32,
    pub power_state: u32,
    pub temp_over: u16,
    pub temp_under: u16,
    /// Error Recovery per namespace (index nsid - 1): TLER.
    pub error_recovery: Vec<u32>,
    pub volatile_write_cache: bool,
    pub interrupt_coalescing: u32,
    /// Interrupt Vector Configuration: Coalescing Disable per vector.
    pub coalescing_disabled: Vec<bool>,
    pub write_atomicity_normal: bool,
    pub async_event_config: u32,
    /// Host timestamp in ms and when it was set; `None` after reset.
    pub timestamp: Option<(u64, Instant)>,
    /// I/O queues allocated by Number of Queues (0's based NSQA, NCQA).
    pub queues_allocated: u32,
}

/// What a Get or Set Features command needs from the controller.
pub struct FeatureContext {
    pub namespaces: u32,
    pub vectors: u16,
    pub max_io_queues: u16,
    /// I/O queues exist: Number of Queues may no longer change.
    pub queues_created: bool,
}

/// Temperature Threshold (04h) Dword 11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemperatureThreshold {
    /// Temperature Threshold in Kelvin (15:0).
    pub tmpth: u16,
    /// Threshold Temperature Select (19:16): 0 is the composite sensor,
    /// Fh all sensors.
    pub tmpsel: u8,
    /// Threshold Type Select (21:20): 0 over, 1 under.
    pub thsel: u8,
}

impl TemperatureThreshold {
    pub fn from_dword(cdw11: u32) -> Self {
        Self {
            tmpth: (cdw11 & 0xffff) as u16,
            tmpsel: ((cdw11 >> 16) & 0xf) as u8,
            thsel: ((cdw11 >> 20) & 0x3) as u8,
        }
    }
}

/// Power Management (02h) Dword 11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerManagement {
    /// Power State (4:0).
    pub ps: u8,
    /// Workload Hint (7:5).
    pub wh: u8,
}

impl PowerManagement {
    pub fn from_dword(cdw11: u32) -> Self {
        Self {
            ps: (cdw11 & 0x1f) as u8,
            wh: ((cdw11 >> 5) & 0x7) as u8,
        }
    }

    /// The dword as Get Features reports it.
    pub fn value(&self) -> u32 {
        u32::from(self.ps) | (u32::from(self.wh) << 5)
    }
}

/// Error Recovery (05h) Dword 11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorRecovery {
    /// Time Limited Error Recovery, in 100 ms units (15:0).
    pub tler: u16,
    /// Deallocated or Unwritten Logical Block Error Enable (16).
    pub dulbe: bool,
}

impl ErrorRecovery {
    pub fn from_dword(cdw11: u32) -> Self {
        Self {
            tler: (cdw11 & 0xffff) as u16,
            dulbe: cdw11 & (1 << 16) != 0,
        }
    }
}

/// Number of Queues (07h) Dword 11 and completion Dword 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumberOfQueues {
    /// Number of I/O Submission Queues Requested (or Allocated), 0's based.
    pub nsqr: u16,
    /// Number of I/O Completion Queues Requested (or Allocated), 0's based.
    pub ncqr: u16,
}

impl NumberOfQueues {
    pub fn from_dword(dword: u32) -> Self {
        Self {
            nsqr: (dword & 0xffff) as u16,
            ncqr: (dword >> 16) as u16,
        }
    }

    pub fn value(&self) -> u32 {
        u32::from(self.nsqr) | (u32::from(self.ncqr) << 16)
    }
}

/// Interrupt Coalescing (08h) Dword 11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterruptCoalescing {
    /// Aggregation Threshold, 0's based (7:0).
    pub thr: u8,
    /// Aggregation Time in 100 µs units (15:8).
    pub time: u8,
}

impl InterruptCoalescing {
    pub fn from_dword(cdw11: u32) -> Self {
        Self {
            thr: (cdw11 & 0xff) as u8,
            time: ((cdw11 >> 8) & 0xff) as u8,
        }
    }

    pub fn value(&self) -> u32 {
        u32::from(self.thr) | (u32::from(self.time) << 8)
    }
}

/// Interrupt Vector Configuration (09h) Dword 11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterruptVectorConfig {
    /// Interrupt Vector (15:0).
    pub iv: u16,
    /// Coalescing Disable (16).
    pub cd: bool,
}

impl InterruptVectorConfig {
    pub fn from_dword(cdw11: u32) -> Self {
        Self {
            iv: (cdw11 & 0xffff) as u16,
            cd: cdw11 & (1 << 16) != 0,
        }
    }

    pub fn value(&self) -> u32 {
        u32::from(self.iv) | (u32::from(self.cd) << 16)
    }
}

/// Whether a feature identifier is implemented, and its capabilities.
pub fn capabilities(fid: u8) -> Option<u32> {
    match fid {
        feature::ERROR_RECOVERY => Some(CAP_CHANGEABLE | CAP_NAMESPACE_SPECIFIC),
        feature::ARBITRATION
        | feature::POWER_MANAGEMENT
        | feature::TEMPERATURE_THRESHOLD
        | feature::VOLATILE_WRITE_CACHE
        | feature::NUMBER_OF_QUEUES
        | feature::INTERRUPT_COALESCING
        | feature::INTERRUPT_VECTOR_CONFIG
        | feature::WRITE_ATOMICITY
        | feature::ASYNC_EVENT_CONFIG
        | feature::TIMESTAMP => Some(CAP_CHANGEABLE),
        _ => None,
    }
}

pub fn name(fid: u8) -> &'static str {
    match fid {
        feature::ARBITRATION => "Arbitration",
        feature::POWER_MANAGEMENT => "Power Management",
        feature::TEMPERATURE_THRESHOLD => "Temperature Threshold",
        feature::ERROR_RECOVERY => "Error Recovery",
        feature::VOLATILE_WRITE_CACHE => "Volatile Write Cache",
        feature::NUMBER_OF_QUEUES => "Number of Queues",
        feature::INTERRUPT_COALESCING => "Interrupt Coalescing",
        feature::INTERRUPT_VECTOR_CONFIG => "Interrupt Vector Configuration",
        feature::WRITE_ATOMICITY => "Write Atomicity Normal",
        feature::ASYNC_EVENT_CONFIG => "Asynchronous Event Configuration",
        feature::TIMESTAMP => "Timestamp",
        _ => "unsupported feature",
    }
}

/// The effect of a Set Features the controller must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetEffect {
    None,
    /// The write cache was turned off: flush what it holds.
    FlushCaches,
    /// A temperature threshold now trips: raise a SMART event.
    TemperatureEvent,
}

impl Features {
    pub fn new(namespaces: u32, vectors: u16, max_io_queues: u16) -> Self {
        Self {
            // Arbitration Burst 111b: no limit.
            arbitration: 0x7,
            power_state: 0,
            temp_over: WARNING_TEMPERATURE,
            temp_under: 0,
            error_recovery: vec![0; namespaces as usize],
            volatile_write_cache: true,
            interrupt_coalescing: 0,
            coalescing_disabled: vec![false; usize::from(vectors)],
            write_atomicity_normal: false,
            async_event_config: 0,
            timestamp: None,
            queues_allocated: Self::queues_value(max_io_queues),
        }
    }

    fn queues_value(max_io_queues: u16) -> u32 {
        let n = max_io_queues.max(1) - 1;
        NumberOfQueues { nsqr: n, ncqr: n }.value()
    }

    /// A temperature threshold is crossed (SMART critical warning bit 1).
    pub fn temperature_alarm(&self) -> bool {
        COMPOSITE_TEMPERATURE >= self.temp_over || COMPOSITE_TEMPERATURE <= self.temp_under
    }

    /// The Timestamp feature's 8 bytes: milliseconds (47:0), Synch = 0
    /// (the clock never stopped), Timestamp Origin 001b once the host set it.
    pub fn timestamp_bytes(&self) -> [u8; 8] {
        let (value, origin) = match self.timestamp {
            Some((ms, at)) => (ms.wrapping_add(at.elapsed().as_millis() as u64), 1u64),
            None => (0, 0),
        };
        ((value & TIMESTAMP_MS_MASK) | (origin << TIMESTAMP_ORIGIN_SHIFT)).to_le_bytes()
    }

    /// Get Features for everything except Timestamp's data buffer; returns
    /// Dword 0 of the completion.
    pub fn get(&self, cmd: &GetFeatures, ctx: &FeatureContext) -> Result<u32, Status> {
        let (fid, nsid) = (cmd.fid, cmd.nsid);
        let caps = capabilities(fid).ok_or(Status::INVALID_FIELD)?;
        if caps & CAP_NAMESPACE_SPECIFIC != 0 && (nsid == 0 || nsid > ctx.namespaces) {
            return Err(Status::INVALID_NAMESPACE);
        }
        if cmd.sel == Select::Capabilities {
            return Ok(caps);
        }
        // Nothing is saveable, so the saved value is the default.
        let defaults;
        let f = if cmd.sel == Select::Current {
            self
        } else {
            defaults = Features::new(ctx.namespaces, ctx.vectors, ctx.max_io_queues);
            &defaults
        };
        Ok(match fid {
            feature::ARBITRATION => f.arbitration,
            feature::POWER_MANAGEMENT => f.power_state,
            feature::TEMPERATURE_THRESHOLD => {
                let asked = TemperatureThreshold::from_dword(cmd.cdw11);
                // Only the composite sensor exists; other sensors read 0.
                let value = match (asked.tmpsel, asked.thsel) {
                    (0, 0) => f.temp_over,
                    (0, 1) => f.temp_under,
                    (_, 0 | 1) => 0,
                    _ => return Err(Status::INVALID_FIELD),
                };
                u32::from(value)
            }
            feature::ERROR_RECOVERY => f
                .error_recovery
                .get((nsid - 1) as usize)
                .copied()
                .unwrap_or(0),
            feature::VOLATILE_WRITE_CACHE => u32::from(f.volatile_write_cache),
            feature::NUMBER_OF_QUEUES => f.queues_allocated,
            feature::INTERRUPT_COALESCING => f.interrupt_coalescing,
            feature::INTERRUPT_VECTOR_CONFIG => {
                let iv = InterruptVectorConfig::from_dword(cmd.cdw11).iv;
                let disabled = f
                    .coalescing_disabled
                    .get(usize::from(iv))
                    .ok_or(Status::INVALID_FIELD)?;
                // The admin vector never coalesces.
                InterruptVectorConfig {
                    iv,
                    cd: *disabled || iv == 0,
                }
                .value()
            }
            feature::WRITE_ATOMICITY => u32::from(f.write_atomicity_normal),
            feature::ASYNC_EVENT_CONFIG => f.async_event_config,
            _ => return Err(Status::INVALID_FIELD),
        })
    }

    /// Set Features for everything except Timestamp; returns Dword 0 of the
    /// completion and what the controller must do next.
    pub fn set(
        &mut self,
        cmd: &SetFeatures,
        ctx: &FeatureContext,
    ) -> Result<(u32, SetEffect), Status> {
        let (fid, nsid, cdw11) = (cmd.fid, cmd.nsid, cmd.cdw11);
        let caps = capabilities(fid).ok_or(Status::INVALID_FIELD)?;
        if cmd.sv {
            return Err(Status::FEATURE_NOT_SAVEABLE);
        }
        if caps & CAP_NAMESPACE_SPECIFIC != 0 {
            if nsid == 0 || (nsid != NSID_ALL && nsid > ctx.namespaces) {
                return Err(Status::INVALID_NAMESPACE);
            }
        } else if nsid != 0 && nsid != NSID_ALL {
            if nsid > ctx.namespaces {
                return Err(Status::INVALID_NAMESPACE);
            }
            return Err(Status::FEATURE_NOT_NAMESPACE_SPECIFIC);
        }
        let mut effect = SetEffect::None;
        let mut result = 0;
        match fid {
            feature::ARBITRATION => self.arbitration = cdw11,
            feature::POWER_MANAGEMENT => {
                // One power state (NPSS = 0); no workload hints.
                let pm = PowerManagement::from_dword(cdw11);
                if pm.ps != 0 || pm.wh != 0 {
                    return Err(Status::INVALID_FIELD);
                }
                self.power_state = pm.value();
            }
            feature::TEMPERATURE_THRESHOLD => {
                let t = TemperatureThreshold::from_dword(cdw11);
                match (t.tmpsel, t.thsel) {
                    (0 | 0xf, 0) => self.temp_over = t.tmpth,
                    (0 | 0xf, 1) => self.temp_under = t.tmpth,
                    _ => return Err(Status::INVALID_FIELD),
                }
                if self.temperature_alarm() {
                    effect = SetEffect::TemperatureEvent;
                }
            }
            feature::ERROR_RECOVERY => {
                let er = ErrorRecovery::from_dword(cdw11);
                // DULBE needs NSFEAT bit 2, which this controller clears.
                if er.dulbe {
                    return Err(Status::INVALID_FIELD);
                }
                let value = u32::from(er.tler);
                if nsid == NSID_ALL {
                    self.error_recovery.iter_mut().for_each(|v| *v = value);
                } else if let Some(v) = self.error_recovery.get_mut((nsid - 1) as usize) {
                    *v = value;
                }
            }
            feature::VOLATILE_WRITE_CACHE => {
                // WCE, Volatile Write Cache Enable (bit 0).
                let wce = cdw11 & 1 != 0;
                if self.volatile_write_cache && !wce {
                    effect = SetEffect::FlushCaches;
                }
                self.volatile_write_cache = wce;
            }
            feature::NUMBER_OF_QUEUES => {
                if ctx.queues_created {
                    return Err(Status::COMMAND_SEQUENCE_ERROR);
                }
                let asked = NumberOfQueues::from_dword(cdw11);
                if asked.nsqr == 0xffff || asked.ncqr == 0xffff {
                    return Err(Status::INVALID_FIELD);
                }
                // Like QEMU: always allocate the configured maximum; the
                // host uses min(requested, allocated).
                self.queues_allocated = Self::queues_value(ctx.max_io_queues);
                result = self.queues_allocated;
            }
            feature::INTERRUPT_COALESCING => {
                self.interrupt_coalescing = InterruptCoalescing::from_dword(cdw11).value()
            }
            feature::INTERRUPT_VECTOR_CONFIG => {
                let config = InterruptVectorConfig::from_dword(cdw11);
                let slot = self
                    .coalescing_disabled
                    .get_mut(usize::from(config.iv))
                    .ok_or(Status::INVALID_FIELD)?;
                *slot = config.cd;
            }
            // DN, Disable Normal (bit 0).
            feature::WRITE_ATOMICITY => self.write_atomicity_normal = cdw11 & 1 != 0,
            feature::ASYNC_EVENT_CONFIG => {
                self.async_event_config = cdw11 & SUPPORTED_ASYNC_EVENTS;
                if self.temperature_alarm() {
                    effect = SetEffect::TemperatureEvent;
                }
            }
            _ => return Err(Status::INVALID_FIELD),
        }
        Ok((result, effect))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(fid: u8, sel: Select, nsid: u32, cdw11: u32) -> GetFeatures {
        GetFeatures {
            nsid,
            fid,
            sel,
            cdw11,
        }
    }

    /// Set Features with CDW10 spelled out: FID in 7:0, SV in bit 31.
    fn set(fid: u8, nsid: u32, cdw10: u32, cdw11: u32) -> SetFeatures {
        assert_eq!(cdw10 & 0x7fff_ff00, 0, "only FID and SV");
        SetFeatures {
            nsid,
            fid,
            sv: cdw10 & (1 << 31) != 0,
            cdw11,
        }
    }

    fn ctx() -> FeatureContext {
        FeatureContext {
            namespaces: 2,
            vectors: 5,
            max_io_queues: 4,
            queues_created: false,
        }
    }

    #[test]
    fn number_of_queues_reports_the_maximum_and_locks_after_creation() {
        let mut f = Features::new(2, 5, 4);
        let c = ctx();
        assert_eq!(
            f.get(&get(feature::NUMBER_OF_QUEUES, Select::Current, 0, 0), &c),
            Ok(0x0003_0003)
        );
        assert_eq!(
            f.set(&set(feature::NUMBER_OF_QUEUES, 0, 0, 0x0001_0001), &c),
            Ok((0x0003_0003, SetEffect::None))
        );
        assert_eq!(
            f.set(&set(feature::NUMBER_OF_QUEUES, 0, 0, 0xffff), &c),
            Err(Status::INVALID_FIELD)
        );
        let created = FeatureContext {
            queues_created: true,
            ..ctx()
        };
        assert_eq!(
            f.set(&set(feature::NUMBER_OF_QUEUES, 0, 0, 0), &created),
            Err(Status::COMMAND_SEQUENCE_ERROR)
        );
    }

    #[test]
    fn temperature_threshold_round_trip_and_alarm() {
        let mut f = Features::new(2, 5, 4);
        let c = ctx();
        assert_eq!(
            f.get(
                &get(feature::TEMPERATURE_THRESHOLD, Select::Current, 0, 0),
                &c
            ),
            Ok(u32::from(WARNING_TEMPERATURE))
        );
        assert_eq!(
            f.set(&set(feature::TEMPERATURE_THRESHOLD, 0, 0, 0x150), &c),
            Ok((0, SetEffect::None))
        );
        assert_eq!(
            f.get(
                &get(feature::TEMPERATURE_THRESHOLD, Select::Current, 0, 0),
                &c
            ),
            Ok(0x150)
        );
        assert_eq!(
            f.get(
                &get(feature::TEMPERATURE_THRESHOLD, Select::Default, 0, 0),
                &c
            ),
            Ok(u32::from(WARNING_TEMPERATURE))
        );
        // Over-threshold below the current temperature trips the alarm.
        assert_eq!(
            f.set(&set(feature::TEMPERATURE_THRESHOLD, 0, 0, 300), &c),
            Ok((0, SetEffect::TemperatureEvent))
        );
        assert!(f.temperature_alarm());
        assert_eq!(
            f.set(
                &set(feature::TEMPERATURE_THRESHOLD, 0, 0, 300 | (2 << 20)),
                &c
            ),
            Err(Status::INVALID_FIELD)
        );
    }

    #[test]
    fn namespace_scoping_and_saving() {
        let mut f = Features::new(2, 5, 4);
        let c = ctx();
        assert_eq!(
            f.set(&set(feature::ARBITRATION, 1, 0, 0), &c),
            Err(Status::FEATURE_NOT_NAMESPACE_SPECIFIC)
        );
        assert_eq!(
            f.set(&set(feature::ARBITRATION, 0, 1 << 31, 0), &c),
            Err(Status::FEATURE_NOT_SAVEABLE)
        );
        assert_eq!(
            f.get(&get(feature::ERROR_RECOVERY, Select::Current, 0, 0), &c),
            Err(Status::INVALID_NAMESPACE)
        );
        f.set(&set(feature::ERROR_RECOVERY, 2, 0, 77), &c).unwrap();
        assert_eq!(
            f.get(&get(feature::ERROR_RECOVERY, Select::Current, 2, 0), &c),
            Ok(77)
        );
        assert_eq!(
            f.get(&get(feature::ERROR_RECOVERY, Select::Current, 1, 0), &c),
            Ok(0)
        );
        assert_eq!(
            f.set(&set(feature::ERROR_RECOVERY, 1, 0, 1 << 16), &c),
            Err(Status::INVALID_FIELD),
            "DULBE unsupported"
        );
        assert_eq!(
            f.get(
                &get(feature::ERROR_RECOVERY, Select::Capabilities, 1, 0),
                &c
            ),
            Ok(0b110)
        );
        assert_eq!(
            f.get(&get(0x0c, Select::Current, 0, 0), &c),
            Err(Status::INVALID_FIELD)
        );
    }

    #[test]
    fn vectors_write_cache_and_timestamp() {
        let mut f = Features::new(2, 5, 4);
        let c = ctx();
        assert_eq!(
            f.get(
                &get(feature::INTERRUPT_VECTOR_CONFIG, Select::Current, 0, 5),
                &c
            ),
            Err(Status::INVALID_FIELD)
        );
        f.set(
            &set(feature::INTERRUPT_VECTOR_CONFIG, 0, 0, 3 | (1 << 16)),
            &c,
        )
        .unwrap();
        assert_eq!(
            f.get(
                &get(feature::INTERRUPT_VECTOR_CONFIG, Select::Current, 0, 3),
                &c
            ),
            Ok(3 | (1 << 16))
        );
        assert_eq!(
            f.set(&set(feature::VOLATILE_WRITE_CACHE, 0, 0, 0), &c),
            Ok((0, SetEffect::FlushCaches))
        );
        assert_eq!(
            f.get(
                &get(feature::VOLATILE_WRITE_CACHE, Select::Current, 0, 0),
                &c
            ),
            Ok(0)
        );
        assert_eq!(f.timestamp_bytes(), [0; 8]);
        f.timestamp = Some((1000, Instant::now()));
        let ts = u64::from_le_bytes(f.timestamp_bytes());
        assert!((1000..2000).contains(&(ts & 0xffff_ffff_ffff)));
        assert_eq!((ts >> 49) & 0x7, 1, "origin: set by host");
    }
}
