//! Type-0 PCI Express configuration space (4096 bytes) with per-byte write
//! masks, BAR size probing, a capability list and extended capabilities.
//!
//! The guest's writes go through [`ConfigSpace::write`], which applies the
//! masks and returns what changed as [`ConfigChange`] values, so a device can
//! react (move a DMA window when a BAR moves, start DMA when bus mastering is
//! turned on, ...).

use std::ops::Range;

use tracing::debug;

use crate::bar::{BarKind, BarSpec};
use crate::caps::{ExtCapability, MsixCapSpec, PcieCapSpec};
use crate::msix::MsixControl;
use crate::regs::{self, cap_id, command, ext_cap_id, pcie, pm, rebar, status};

const SIZE: usize = regs::CONFIG_SPACE_SIZE;

/// The COMMAND register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Command(pub u16);

impl Command {
    /// I/O Space Enable: I/O BARs decode.
    pub fn io_enabled(self) -> bool {
        self.0 & command::IO_SPACE != 0
    }
    /// Memory Space Enable: memory BARs decode.
    pub fn memory_enabled(self) -> bool {
        self.0 & command::MEMORY_SPACE != 0
    }
    /// Bus Master Enable: the function may DMA.
    pub fn bus_master(self) -> bool {
        self.0 & command::BUS_MASTER != 0
    }
    /// Interrupt Disable: INTx must not be asserted.
    pub fn intx_disabled(self) -> bool {
        self.0 & command::INTX_DISABLE != 0
    }
}

/// Device power state from the Power Management capability (PMCSR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerState {
    /// Fully on.
    D0,
    /// Light sleep; not supported here (a write of D1 is discarded).
    D1,
    /// Deeper sleep; not supported here (a write of D2 is discarded).
    D2,
    /// Off but still powered: only config space answers.
    D3Hot,
}

impl PowerState {
    fn from_bits(bits: u16) -> Self {
        match bits & pm::PMCSR_STATE_MASK {
            0 => PowerState::D0,
            1 => PowerState::D1,
            2 => PowerState::D2,
            _ => PowerState::D3Hot,
        }
    }
}

/// What a config-space write changed. One write may produce several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigChange {
    /// COMMAND changed (memory/IO decode, bus mastering, INTx disable...).
    CommandChanged {
        /// Before the write.
        old: Command,
        /// After it.
        new: Command,
    },
    /// Where a BAR decodes changed: `Some(address)` while the BAR is
    /// programmed with a usable address and its decode is on (COMMAND.MEM
    /// or COMMAND.IO), `None` otherwise. A COMMAND write that toggles decode
    /// produces one of these per affected BAR, after `CommandChanged`.
    BarMoved {
        /// The BAR (0..=5; a 64-bit BAR by its lower index).
        index: u8,
        /// Where it decoded before.
        old: Option<u64>,
        /// Where it decodes now.
        new: Option<u64>,
    },
    /// The guest wrote a new size through the Resizable BAR capability.
    BarResized {
        /// The BAR.
        index: u8,
        /// Its size before, in bytes.
        old_size: u64,
        /// Its size now, in bytes.
        new_size: u64,
    },
    /// MSI-X Message Control changed; this is its new value.
    MsixControlChanged(MsixControl),
    /// PMCSR PowerState changed (only D0 and D3hot are accepted).
    PowerStateChanged {
        /// Before the write.
        old: PowerState,
        /// After it.
        new: PowerState,
    },
    /// A write touched a device-defined extended capability added with
    /// [`ConfigSpaceBuilder::ext_capability`] that has writable bits.
    ExtCapabilityWritten {
        /// The capability's id.
        id: u16,
        /// Where its header is in config space; read the new value there.
        offset: u16,
    },
}

/// A config access the guest (or client) got wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The access does not fit in the 4096 bytes.
    #[error("config access at {offset:#x} of {len} bytes is outside the 4096-byte config space")]
    OutOfRange {
        /// Offset of the access.
        offset: u64,
        /// Its size in bytes.
        len: usize,
    },
    /// An access of no bytes.
    #[error("zero-length config access")]
    Empty,
}

/// A device description the builder cannot turn into a valid config space.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PCI function description: {0}")]
pub struct BuildError(
    /// What is wrong, naming the BAR or capability.
    pub String,
);

fn build_err<T>(msg: impl Into<String>) -> Result<T, BuildError> {
    Err(BuildError(msg.into()))
}

/// A BAR as the function implements it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarInfo {
    /// Memory (32/64-bit) or I/O.
    pub kind: BarKind,
    /// Current size (Resizable BAR may change it).
    pub size: u64,
    /// Whether the BAR is marked prefetchable.
    pub prefetchable: bool,
}

#[derive(Debug, Clone)]
struct RebarEntry {
    bar: u8,
    /// Bit n set: 2^(n+20) bytes supported.
    supported: u64,
    /// Offset of the entry's control register in config space.
    ctrl_offset: usize,
}

/// Where the builder put a standard capability.
#[derive(Debug, Clone, Copy)]
struct PlacedCap {
    id: u8,
    offset: usize,
}

/// Where the builder put an extended capability.
#[derive(Debug, Clone, Copy)]
struct PlacedExtCap {
    id: u16,
    offset: usize,
    len: usize,
    /// The guest can change some of its bits (write or write-1-to-clear).
    writable: bool,
}

#[derive(Debug, Clone, Default)]
struct Layout {
    pm: Option<usize>,
    msix: Option<(usize, MsixCapSpec)>,
    pcie: Option<usize>,
    rebar: Option<(usize, Vec<RebarEntry>)>,
    /// Every standard capability.
    caps: Vec<PlacedCap>,
    /// Every extended capability.
    ext_caps: Vec<PlacedExtCap>,
}

/// Values compared before and after a write to describe what changed.
struct Snapshot {
    command: Command,
    decoded: [Option<u64>; regs::NUM_BARS],
    msix_control: Option<MsixControl>,
    pmcsr: Option<u16>,
    rebar_ctrl: Vec<u32>,
}

/// What [`ConfigSpace::reset`] restores.
#[derive(Debug, Clone)]
struct Pristine {
    bytes: Box<[u8; SIZE]>,
    wmask: Box<[u8; SIZE]>,
    bars: [Option<BarInfo>; regs::NUM_BARS],
}

/// A type-0 PCI Express configuration space.
#[derive(Debug, Clone)]
pub struct ConfigSpace {
    bytes: Box<[u8; SIZE]>,
    wmask: Box<[u8; SIZE]>,
    w1c: Box<[u8; SIZE]>,
    bars: [Option<BarInfo>; regs::NUM_BARS],
    layout: Layout,
    /// State at build time, restored by [`ConfigSpace::reset`].
    pristine: Box<Pristine>,
}

fn get16(buf: &[u8; SIZE], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}

fn get32(buf: &[u8; SIZE], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

fn put16(buf: &mut [u8; SIZE], at: usize, value: u16) {
    buf[at..at + 2].copy_from_slice(&value.to_le_bytes());
}

fn put32(buf: &mut [u8; SIZE], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn overlaps(a: &Range<usize>, start: usize, len: usize) -> bool {
    a.start < start + len && start < a.end
}

impl ConfigSpace {
    /// Copies `data.len()` bytes from `offset`.
    pub fn read(&self, offset: u64, data: &mut [u8]) -> Result<(), ConfigError> {
        let range = Self::check_range(offset, data.len())?;
        data.copy_from_slice(&self.bytes[range]);
        Ok(())
    }

    /// A guest write: only writable bits change, write-1-to-clear bits clear.
    /// Returns what changed.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<Vec<ConfigChange>, ConfigError> {
        let range = Self::check_range(offset, data.len())?;
        let before = self.snapshot();
        let bytes = &mut self.bytes[range.clone()];
        let wmask = &self.wmask[range.clone()];
        let w1c = &self.w1c[range.clone()];
        for (((byte, &value), &writable), &clearable) in
            bytes.iter_mut().zip(data).zip(wmask).zip(w1c)
        {
            *byte = ((*byte & !writable) | (value & writable)) & !(value & clearable);
        }
        let mut changes = Vec::new();
        self.fix_power_state(&range, &before);
        self.apply_rebar_writes(&range, &before, &mut changes);
        self.describe_changes(&range, &before, &mut changes);
        if tracing::enabled!(tracing::Level::DEBUG) {
            let mut raw = [0u8; 8];
            let shown = data.len().min(8);
            raw[..shown].copy_from_slice(&data[..shown]);
            debug!(
                offset = format_args!("{:#05x}", range.start),
                len = data.len(),
                value = format_args!("{:#x}", u64::from_le_bytes(raw)),
                register = self.register_name(range.start),
                ?changes,
                "config write"
            );
        }
        Ok(changes)
    }

    /// The device reports an error condition in STATUS (e.g.
    /// [`status::RECEIVED_MASTER_ABORT`] after a failed DMA). Only the
    /// write-1-to-clear error bits can be raised; the guest clears them.
    pub fn raise_status(&mut self, bits: u16) {
        let bits = bits & status::W1C;
        let value = get16(&self.bytes, regs::STATUS) | bits;
        put16(&mut self.bytes, regs::STATUS, value);
    }

    /// The STATUS register.
    pub fn status(&self) -> u16 {
        get16(&self.bytes, regs::STATUS)
    }

    /// Back to the state the builder produced (a function-level reset).
    pub fn reset(&mut self) {
        self.bytes.copy_from_slice(&self.pristine.bytes[..]);
        self.wmask.copy_from_slice(&self.pristine.wmask[..]);
        self.bars = self.pristine.bars;
    }

    fn check_range(offset: u64, len: usize) -> Result<Range<usize>, ConfigError> {
        if len == 0 {
            return Err(ConfigError::Empty);
        }
        let out_of_range = ConfigError::OutOfRange { offset, len };
        let start = usize::try_from(offset).map_err(|_| out_of_range)?;
        let end = start.checked_add(len).ok_or(out_of_range)?;
        if end > SIZE {
            return Err(out_of_range);
        }
        Ok(start..end)
    }

    /// Reads a little-endian value of up to 4 bytes; `None` beyond the end.
    pub fn read_u32(&self, offset: u64) -> Option<u32> {
        let mut buf = [0u8; 4];
        self.read(offset, &mut buf).ok()?;
        Some(u32::from_le_bytes(buf))
    }

    /// Reads a little-endian u16; `None` beyond the end.
    pub fn read_u16(&self, offset: u64) -> Option<u16> {
        let mut buf = [0u8; 2];
        self.read(offset, &mut buf).ok()?;
        Some(u16::from_le_bytes(buf))
    }

    /// Reads one byte; `None` beyond the end.
    pub fn read_u8(&self, offset: u64) -> Option<u8> {
        let mut buf = [0u8; 1];
        self.read(offset, &mut buf).ok()?;
        Some(buf[0])
    }

    /// The COMMAND register.
    pub fn command(&self) -> Command {
        Command(get16(&self.bytes, regs::COMMAND))
    }

    /// Vendor ID.
    pub fn vendor_id(&self) -> u16 {
        get16(&self.bytes, regs::VENDOR_ID)
    }

    /// Device ID.
    pub fn device_id(&self) -> u16 {
        get16(&self.bytes, regs::DEVICE_ID)
    }

    /// 1 = INTA# .. 4 = INTD#, 0 = no INTx.
    pub fn interrupt_pin(&self) -> u8 {
        self.bytes[regs::INTERRUPT_PIN]
    }

    /// Whether the guest allows the function to DMA (COMMAND.BME).
    pub fn bus_master_enabled(&self) -> bool {
        self.command().bus_master()
    }

    /// Whether memory BARs decode (COMMAND.MEM).
    pub fn memory_decode_enabled(&self) -> bool {
        self.command().memory_enabled()
    }

    /// The BAR at `index`, if the function implements one there (the upper
    /// half of a 64-bit BAR is not a BAR of its own).
    pub fn bar(&self, index: usize) -> Option<BarInfo> {
        *self.bars.get(index)?
    }

    /// Current size of BAR `index`, if the function implements it.
    pub fn bar_size(&self, index: usize) -> Option<u64> {
        Some(self.bar(index)?.size)
    }

    /// The address the guest wrote into the BAR, flags stripped, whether or
    /// not decode is on. While the guest probes the size this is the size
    /// mask, not an address.
    pub fn bar_programmed_address(&self, index: usize) -> Option<u64> {
        let bar = self.bar(index)?;
        let at = regs::BAR0 + index * 4;
        let low = u64::from(get32(&self.bytes, at));
        let raw = if bar.kind == BarKind::Memory64 {
            low | (u64::from(get32(&self.bytes, at + 4)) << 32)
        } else {
            low
        };
        Some(raw & BarSpec::address_mask(bar.kind, bar.size))
    }

    /// Where the BAR decodes: `Some(address)` when its decode is enabled in
    /// COMMAND and it holds a usable address.
    pub fn bar_address(&self, index: usize) -> Option<u64> {
        let bar = self.bar(index)?;
        let cmd = self.command();
        let decoding = match bar.kind {
            BarKind::Io => cmd.io_enabled(),
            BarKind::Memory32 | BarKind::Memory64 => cmd.memory_enabled(),
        };
        if !decoding {
            return None;
        }
        let address = self.bar_programmed_address(index)?;
        // Like a PCI host bridge: 0 means "not assigned", and a BAR whose
        // range would wrap (or reach the top of a 32-bit space, as the
        // all-ones size-probe value does) does not decode.
        if address == 0 {
            return None;
        }
        let last = address.checked_add(bar.size - 1)?;
        match bar.kind {
            BarKind::Memory64 if last == u64::MAX => None,
            BarKind::Memory32 | BarKind::Io if last >= u64::from(u32::MAX) => None,
            _ => Some(address),
        }
    }

    /// Which BAR decodes `address`, and the offset in it.
    pub fn bar_at(&self, address: u64) -> Option<(usize, u64)> {
        (0..regs::NUM_BARS).find_map(|index| {
            let base = self.bar_address(index)?;
            let size = self.bar_size(index)?;
            let offset = address.checked_sub(base)?;
            (offset < size).then_some((index, offset))
        })
    }

    /// The MSI-X capability's layout, if the function has one.
    pub fn msix(&self) -> Option<MsixCapSpec> {
        self.layout.msix.map(|(_, spec)| spec)
    }

    /// MSI-X Message Control, if the function has MSI-X.
    pub fn msix_control(&self) -> Option<MsixControl> {
        let (at, _) = self.layout.msix?;
        Some(MsixControl::from_register(get16(
            &self.bytes,
            at + regs::msix::CONTROL,
        )))
    }

    /// The PMCSR power state (D0 without a Power Management capability).
    pub fn power_state(&self) -> PowerState {
        match self.layout.pm {
            Some(at) => PowerState::from_bits(get16(&self.bytes, at + pm::PMCSR)),
            None => PowerState::D0,
        }
    }

    /// Offset of the standard capability `id`.
    pub fn capability_offset(&self, id: u8) -> Option<usize> {
        self.layout
            .caps
            .iter()
            .find(|cap| cap.id == id)
            .map(|cap| cap.offset)
    }

    /// Offset of the extended capability `id`.
    pub fn ext_capability_offset(&self, id: u16) -> Option<usize> {
        self.layout
            .ext_caps
            .iter()
            .find(|cap| cap.id == id)
            .map(|cap| cap.offset)
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            command: self.command(),
            decoded: std::array::from_fn(|index| self.bar_address(index)),
            msix_control: self.msix_control(),
            pmcsr: self.layout.pm.map(|at| get16(&self.bytes, at + pm::PMCSR)),
            rebar_ctrl: self
                .layout
                .rebar
                .iter()
                .flat_map(|(_, entries)| entries.iter())
                .map(|entry| get32(&self.bytes, entry.ctrl_offset))
                .collect(),
        }
    }

    /// PMCSR PowerState only takes the states the function supports (D0,
    /// D3hot). The spec says a write of an unsupported state completes but
    /// is discarded.
    fn fix_power_state(&mut self, range: &Range<usize>, before: &Snapshot) {
        let (Some(at), Some(old)) = (self.layout.pm, before.pmcsr) else {
            return;
        };
        if !overlaps(range, at + pm::PMCSR, 2) {
            return;
        }
        let now = get16(&self.bytes, at + pm::PMCSR);
        if matches!(PowerState::from_bits(now), PowerState::D1 | PowerState::D2) {
            let kept = (now & !pm::PMCSR_STATE_MASK) | (old & pm::PMCSR_STATE_MASK);
            put16(&mut self.bytes, at + pm::PMCSR, kept);
        }
    }

    /// A write to a Resizable BAR control register: accept a supported
    /// size, then resize the BAR (its size mask and address bits follow).
    fn apply_rebar_writes(
        &mut self,
        range: &Range<usize>,
        before: &Snapshot,
        changes: &mut Vec<ConfigChange>,
    ) {
        let Some((_, entries)) = self.layout.rebar.clone() else {
            return;
        };
        for (entry, &old_ctrl) in entries.iter().zip(&before.rebar_ctrl) {
            if !overlaps(range, entry.ctrl_offset, 4) {
                continue;
            }
            let ctrl = get32(&self.bytes, entry.ctrl_offset);
            let code = (ctrl & rebar::CTRL_SIZE_MASK) >> rebar::CTRL_SIZE_SHIFT;
            let old_code = (old_ctrl & rebar::CTRL_SIZE_MASK) >> rebar::CTRL_SIZE_SHIFT;
            if code == old_code {
                continue;
            }
            if entry.supported & (1u64 << code) == 0 {
                debug!(
                    bar = entry.bar,
                    code, "resizable BAR: unsupported size ignored"
                );
                put32(&mut self.bytes, entry.ctrl_offset, old_ctrl);
                continue;
            }
            let index = usize::from(entry.bar);
            let Some(mut bar) = self.bar(index) else {
                continue;
            };
            let old_size = bar.size;
            bar.size = 1u64 << (code + rebar::MIN_SIZE_LOG2);
            self.bars[index] = Some(bar);
            self.program_bar_masks(index, bar);
            debug!(bar = index, old_size, new_size = bar.size, "BAR resized");
            changes.push(ConfigChange::BarResized {
                index: entry.bar,
                old_size,
                new_size: bar.size,
            });
        }
    }

    /// Sets the write mask of a BAR's register(s) for its current size and
    /// clears the address bits that are now below the size.
    fn program_bar_masks(&mut self, index: usize, bar: BarInfo) {
        let at = regs::BAR0 + index * 4;
        let mask = BarSpec::address_mask(bar.kind, bar.size);
        let low_flags = match bar.kind {
            BarKind::Io => regs::bar::IO_FLAGS_MASK,
            _ => regs::bar::MEM_FLAGS_MASK,
        };
        let low = get32(&self.bytes, at);
        put32(&mut self.wmask, at, mask as u32);
        put32(
            &mut self.bytes,
            at,
            (low & (mask as u32)) | (low & low_flags),
        );
        if bar.kind == BarKind::Memory64 {
            let high = get32(&self.bytes, at + 4);
            put32(&mut self.wmask, at + 4, (mask >> 32) as u32);
            put32(&mut self.bytes, at + 4, high & ((mask >> 32) as u32));
        }
    }

    fn describe_changes(
        &self,
        range: &Range<usize>,
        before: &Snapshot,
        changes: &mut Vec<ConfigChange>,
    ) {
        let command = self.command();
        if command != before.command {
            changes.push(ConfigChange::CommandChanged {
                old: before.command,
                new: command,
            });
        }
        for index in 0..regs::NUM_BARS {
            let new = self.bar_address(index);
            if new != before.decoded[index] {
                debug!(
                    bar = index,
                    old = ?before.decoded[index].map(|a| format!("{a:#x}")),
                    new = ?new.map(|a| format!("{a:#x}")),
                    size = ?self.bar_size(index),
                    "BAR moved"
                );
                changes.push(ConfigChange::BarMoved {
                    index: index as u8,
                    old: before.decoded[index],
                    new,
                });
            }
        }
        if let (Some(old), Some(new)) = (before.msix_control, self.msix_control()) {
            if old != new {
                debug!(
                    enabled = new.enabled,
                    function_masked = new.function_masked,
                    "MSI-X control changed"
                );
                changes.push(ConfigChange::MsixControlChanged(new));
            }
        }
        if let (Some(at), Some(old)) = (self.layout.pm, before.pmcsr) {
            let old = PowerState::from_bits(old);
            let new = PowerState::from_bits(get16(&self.bytes, at + pm::PMCSR));
            if old != new {
                debug!(?old, ?new, "power state changed");
                changes.push(ConfigChange::PowerStateChanged { old, new });
            }
        }
        for cap in &self.layout.ext_caps {
            let custom = cap.id != ext_cap_id::RESIZABLE_BAR;
            if custom && cap.writable && overlaps(range, cap.offset, cap.len) {
                changes.push(ConfigChange::ExtCapabilityWritten {
                    id: cap.id,
                    offset: cap.offset as u16,
                });
            }
        }
    }

    /// A name for the register at `offset`, for logs.
    pub fn register_name(&self, offset: usize) -> &'static str {
        let header = match offset {
            0x00..=0x01 => Some("VENDOR_ID"),
            0x02..=0x03 => Some("DEVICE_ID"),
            0x04..=0x05 => Some("COMMAND"),
            0x06..=0x07 => Some("STATUS"),
            0x08 => Some("REVISION_ID"),
            0x09..=0x0b => Some("CLASS_CODE"),
            0x0c => Some("CACHE_LINE_SIZE"),
            0x0d => Some("LATENCY_TIMER"),
            0x0e => Some("HEADER_TYPE"),
            0x0f => Some("BIST"),
            0x10..=0x13 => Some("BAR0"),
            0x14..=0x17 => Some("BAR1"),
            0x18..=0x1b => Some("BAR2"),
            0x1c..=0x1f => Some("BAR3"),
            0x20..=0x23 => Some("BAR4"),
            0x24..=0x27 => Some("BAR5"),
            0x28..=0x2b => Some("CARDBUS_CIS"),
            0x2c..=0x2d => Some("SUBSYSTEM_VENDOR_ID"),
            0x2e..=0x2f => Some("SUBSYSTEM_ID"),
            0x30..=0x33 => Some("EXPANSION_ROM"),
            0x34 => Some("CAPABILITIES_POINTER"),
            0x3c => Some("INTERRUPT_LINE"),
            0x3d => Some("INTERRUPT_PIN"),
            0x3e => Some("MIN_GNT"),
            0x3f => Some("MAX_LAT"),
            0x35..=0x3b => Some("RESERVED"),
            _ => None,
        };
        if let Some(name) = header {
            return name;
        }
        if let Some(at) = self.layout.pm {
            if (at..at + pm::LEN).contains(&offset) {
                return match offset - at {
                    0..=1 => "PM.HEADER",
                    2..=3 => "PM.PMC",
                    4..=5 => "PM.PMCSR",
                    _ => "PM.DATA",
                };
            }
        }
        if let Some((at, _)) = self.layout.msix {
            if (at..at + regs::msix::LEN).contains(&offset) {
                return match offset - at {
                    0..=1 => "MSIX.HEADER",
                    2..=3 => "MSIX.CONTROL",
                    4..=7 => "MSIX.TABLE",
                    _ => "MSIX.PBA",
                };
            }
        }
        if let Some(at) = self.layout.pcie {
            if (at..at + pcie::LEN).contains(&offset) {
                return match offset - at {
                    0..=1 => "PCIE.HEADER",
                    2..=3 => "PCIE.CAPS",
                    0x04..=0x07 => "PCIE.DEVCAP",
                    0x08..=0x09 => "PCIE.DEVCTL",
                    0x0a..=0x0b => "PCIE.DEVSTA",
                    0x0c..=0x0f => "PCIE.LNKCAP",
                    0x10..=0x11 => "PCIE.LNKCTL",
                    0x12..=0x13 => "PCIE.LNKSTA",
                    0x24..=0x27 => "PCIE.DEVCAP2",
                    0x28..=0x29 => "PCIE.DEVCTL2",
                    0x2a..=0x2b => "PCIE.DEVSTA2",
                    0x2c..=0x2f => "PCIE.LNKCAP2",
                    0x30..=0x31 => "PCIE.LNKCTL2",
                    0x32..=0x33 => "PCIE.LNKSTA2",
                    _ => "PCIE.SLOT_ROOT",
                };
            }
        }
        for cap in &self.layout.ext_caps {
            if (cap.offset..cap.offset + cap.len).contains(&offset) {
                return match cap.id {
                    ext_cap_id::RESIZABLE_BAR => "EXT.RESIZABLE_BAR",
                    ext_cap_id::DEVICE_SERIAL_NUMBER => "EXT.DEVICE_SERIAL_NUMBER",
                    _ => "EXT.DEVICE_DEFINED",
                };
            }
        }
        if offset < regs::LEGACY_CONFIG_SIZE {
            "UNUSED"
        } else {
            "EXT.UNUSED"
        }
    }
}

/// Builds a [`ConfigSpace`].
///
/// ```
/// use p2plab_pci::{BarSpec, ConfigSpaceBuilder, MsixCapSpec, PcieCapSpec};
/// let config = ConfigSpaceBuilder::new(0x1b36, 0x0010)
///     .class_code(0x01, 0x08, 0x02)
///     .bar(0, BarSpec::memory64(16 * 1024))
///     .power_management()
///     .msix(MsixCapSpec { vectors: 8, table_bar: 0, table_offset: 0x2000,
///                         pba_bar: 0, pba_offset: 0x3000 })
///     .pcie(PcieCapSpec::default())
///     .build()
///     .unwrap();
/// assert_eq!(config.vendor_id(), 0x1b36);
/// ```
#[derive(Debug, Clone)]
pub struct ConfigSpaceBuilder {
    vendor_id: u16,
    device_id: u16,
    subsystem_vendor_id: u16,
    subsystem_id: u16,
    /// Base class, sub-class, programming interface.
    class_code: (u8, u8, u8),
    revision: u8,
    interrupt_pin: u8,
    bars: [Option<BarSpec>; regs::NUM_BARS],
    power_management: bool,
    msix: Option<MsixCapSpec>,
    pcie: Option<PcieCapSpec>,
    resizable_bars: Vec<(u8, Vec<u64>)>,
    ext_caps: Vec<ExtCapability>,
    /// Mistakes found while building up; `build()` reports the first.
    errors: Vec<String>,
}

impl ConfigSpaceBuilder {
    /// A function with these ids, INTA#, no BARs and no capabilities.
    /// Subsystem ids default to the vendor/device ids.
    pub fn new(vendor_id: u16, device_id: u16) -> Self {
        Self {
            vendor_id,
            device_id,
            subsystem_vendor_id: vendor_id,
            subsystem_id: device_id,
            class_code: (0xff, 0, 0),
            revision: 0,
            interrupt_pin: 1,
            bars: [None; regs::NUM_BARS],
            power_management: false,
            msix: None,
            pcie: None,
            resizable_bars: Vec::new(),
            ext_caps: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Subsystem Vendor ID and Subsystem ID.
    pub fn subsystem(mut self, vendor_id: u16, id: u16) -> Self {
        self.subsystem_vendor_id = vendor_id;
        self.subsystem_id = id;
        self
    }

    /// Base class, sub-class and programming interface, e.g. NVMe is
    /// `(0x01, 0x08, 0x02)`.
    pub fn class_code(mut self, base: u8, sub: u8, prog_if: u8) -> Self {
        self.class_code = (base, sub, prog_if);
        self
    }

    /// Revision ID (default 0).
    pub fn revision(mut self, revision: u8) -> Self {
        self.revision = revision;
        self
    }

    /// 0 = no INTx, 1..=4 = INTA#..INTD#.
    pub fn interrupt_pin(mut self, pin: u8) -> Self {
        self.interrupt_pin = pin;
        self
    }

    /// Implements BAR `index` (0..=5). A 64-bit BAR also takes `index + 1`.
    pub fn bar(mut self, index: usize, spec: BarSpec) -> Self {
        match self.bars.get_mut(index) {
            Some(slot) => *slot = Some(spec),
            None => self.errors.push(format!("there is no BAR{index}")),
        }
        self
    }

    /// Adds a Power Management capability (D0 and D3hot, No_Soft_Reset).
    pub fn power_management(mut self) -> Self {
        self.power_management = true;
        self
    }

    /// Adds an MSI-X capability; table and PBA live in the given BAR(s).
    pub fn msix(mut self, spec: MsixCapSpec) -> Self {
        self.msix = Some(spec);
        self
    }

    /// Adds a PCI Express endpoint capability (version 2).
    pub fn pcie(mut self, spec: PcieCapSpec) -> Self {
        self.pcie = Some(spec);
        self
    }

    /// Makes memory BAR `bar` resizable through the Resizable BAR extended
    /// capability. `sizes` are the supported sizes (powers of two from
    /// 1 MiB to 128 TiB) and must include the BAR's size.
    pub fn resizable_bar(mut self, bar: u8, sizes: &[u64]) -> Self {
        self.resizable_bars.push((bar, sizes.to_vec()));
        self
    }

    /// Adds an extended capability.
    pub fn ext_capability(mut self, cap: ExtCapability) -> Self {
        self.ext_caps.push(cap);
        self
    }

    /// Adds a Device Serial Number extended capability.
    pub fn device_serial_number(self, serial: u64) -> Self {
        self.ext_capability(ExtCapability::device_serial_number(serial))
    }

    /// Lays out BARs and capabilities and checks the description; the
    /// error names the first BAR or capability that cannot be built.
    pub fn build(self) -> Result<ConfigSpace, BuildError> {
        if let Some(first) = self.errors.first() {
            return build_err(first.clone());
        }
        let mut bytes = Box::new([0u8; SIZE]);
        let mut wmask = Box::new([0u8; SIZE]);
        let mut w1c = Box::new([0u8; SIZE]);
        let mut layout = Layout::default();

        put16(&mut bytes, regs::VENDOR_ID, self.vendor_id);
        put16(&mut bytes, regs::DEVICE_ID, self.device_id);
        if self.vendor_id == 0xffff {
            return build_err("vendor id 0xffff means 'no device'");
        }
        bytes[regs::REVISION_ID] = self.revision;
        bytes[regs::CLASS_PROG_IF] = self.class_code.2;
        bytes[regs::CLASS_PROG_IF + 1] = self.class_code.1;
        bytes[regs::CLASS_PROG_IF + 2] = self.class_code.0;
        put16(
            &mut bytes,
            regs::SUBSYSTEM_VENDOR_ID,
            self.subsystem_vendor_id,
        );
        put16(&mut bytes, regs::SUBSYSTEM_ID, self.subsystem_id);
        if self.interrupt_pin > 4 {
            return build_err("interrupt pin must be 0..=4");
        }
        bytes[regs::INTERRUPT_PIN] = self.interrupt_pin;
        wmask[regs::INTERRUPT_LINE] = 0xff;
        wmask[regs::CACHE_LINE_SIZE] = 0xff;
        w1c[regs::STATUS..regs::STATUS + 2].copy_from_slice(&status::W1C.to_le_bytes());

        let bars = Self::layout_bars(&self.bars, &mut bytes, &mut wmask)?;
        let has_io_bar = bars.iter().flatten().any(|b| b.kind == BarKind::Io);
        let mut command_mask = command::MEMORY_SPACE
            | command::BUS_MASTER
            | command::PARITY_ERROR_RESPONSE
            | command::SERR_ENABLE
            | command::INTX_DISABLE;
        if has_io_bar {
            command_mask |= command::IO_SPACE;
        }
        put16(&mut wmask, regs::COMMAND, command_mask);

        let mut caps = CapChain::new();
        if self.power_management {
            let at = caps.add(&mut bytes, cap_id::POWER_MANAGEMENT, pm::LEN)?;
            put16(&mut bytes, at + pm::PMC, pm::PMC_VERSION_1_2);
            put16(&mut bytes, at + pm::PMCSR, pm::PMCSR_NO_SOFT_RESET);
            put16(&mut wmask, at + pm::PMCSR, pm::PMCSR_STATE_MASK);
            layout.pm = Some(at);
        }
        if let Some(spec) = self.msix {
            Self::check_msix(&spec, &bars)?;
            let at = caps.add(&mut bytes, cap_id::MSIX, regs::msix::LEN)?;
            put16(&mut bytes, at + regs::msix::CONTROL, spec.vectors - 1);
            put16(
                &mut wmask,
                at + regs::msix::CONTROL,
                regs::msix::CONTROL_ENABLE | regs::msix::CONTROL_FUNCTION_MASK,
            );
            put32(
                &mut bytes,
                at + regs::msix::TABLE,
                spec.table_offset | u32::from(spec.table_bar),
            );
            put32(
                &mut bytes,
                at + regs::msix::PBA,
                spec.pba_offset | u32::from(spec.pba_bar),
            );
            layout.msix = Some((at, spec));
        }
        if let Some(spec) = self.pcie {
            spec.check().map_err(|e| BuildError(e.into()))?;
            let at = caps.add(&mut bytes, cap_id::PCI_EXPRESS, pcie::LEN)?;
            Self::write_pcie(&spec, at, &mut bytes, &mut wmask, &mut w1c);
            layout.pcie = Some(at);
        }
        if caps.any() {
            let status = get16(&bytes, regs::STATUS) | status::CAP_LIST;
            put16(&mut bytes, regs::STATUS, status);
        }
        layout.caps = caps.added;

        let mut ext = ExtCapChain::new();
        if !self.resizable_bars.is_empty() {
            let (at, entries) = Self::write_rebar(
                &self.resizable_bars,
                &bars,
                &mut ext,
                &mut bytes,
                &mut wmask,
            )?;
            layout.rebar = Some((at, entries));
        }
        for cap in &self.ext_caps {
            if cap.version > 0xf {
                return build_err("extended capability version is 4 bits");
            }
            let at = ext.add(&mut bytes, cap.id, cap.version, cap.len())?;
            let body = at + 4..at + cap.len();
            bytes[body.clone()].copy_from_slice(&cap.body);
            for (dst, &m) in wmask[body.clone()].iter_mut().zip(&cap.write_mask) {
                *dst = m;
            }
            for (dst, &m) in w1c[body].iter_mut().zip(&cap.w1c_mask) {
                *dst = m;
            }
            let writable = cap.write_mask.iter().chain(&cap.w1c_mask).any(|&m| m != 0);
            ext.added.push(PlacedExtCap {
                id: cap.id,
                offset: at,
                len: cap.len(),
                writable,
            });
        }
        layout.ext_caps = ext.added;

        Ok(ConfigSpace {
            pristine: Box::new(Pristine {
                bytes: bytes.clone(),
                wmask: wmask.clone(),
                bars,
            }),
            bytes,
            wmask,
            w1c,
            bars,
            layout,
        })
    }

    fn layout_bars(
        specs: &[Option<BarSpec>; regs::NUM_BARS],
        bytes: &mut [u8; SIZE],
        wmask: &mut [u8; SIZE],
    ) -> Result<[Option<BarInfo>; regs::NUM_BARS], BuildError> {
        let mut bars = [None; regs::NUM_BARS];
        let mut upper_half_of = None;
        for (index, spec) in specs.iter().enumerate() {
            let Some(spec) = spec else {
                continue;
            };
            if upper_half_of == Some(index) {
                return build_err(format!(
                    "BAR{index} is the upper half of 64-bit BAR{}",
                    index - 1
                ));
            }
            spec.check()
                .map_err(|e| BuildError(format!("BAR{index}: {e}")))?;
            if spec.kind == BarKind::Memory64 {
                if index + 1 >= regs::NUM_BARS {
                    return build_err(format!("64-bit BAR{index} needs a next BAR register"));
                }
                upper_half_of = Some(index + 1);
            }
            let info = BarInfo {
                kind: spec.kind,
                size: spec.size,
                prefetchable: spec.prefetchable,
            };
            bars[index] = Some(info);
            put32(bytes, regs::BAR0 + index * 4, spec.flag_bits());
            let mask = BarSpec::address_mask(spec.kind, spec.size);
            put32(wmask, regs::BAR0 + index * 4, mask as u32);
            if spec.kind == BarKind::Memory64 {
                put32(wmask, regs::BAR0 + index * 4 + 4, (mask >> 32) as u32);
            }
        }
        Ok(bars)
    }

    fn check_msix(
        spec: &MsixCapSpec,
        bars: &[Option<BarInfo>; regs::NUM_BARS],
    ) -> Result<(), BuildError> {
        if spec.vectors == 0 || spec.vectors > regs::msix::MAX_VECTORS {
            return build_err("MSI-X needs 1..=2048 vectors");
        }
        let region = |what: &str, bir: u8, offset: u32, len: u64| -> Result<(), BuildError> {
            if offset & regs::msix::BIR_MASK != 0 {
                return build_err(format!("MSI-X {what} offset must be 8-byte aligned"));
            }
            let bar = bars
                .get(usize::from(bir))
                .copied()
                .flatten()
                .filter(|b| b.kind.is_memory())
                .ok_or_else(|| BuildError(format!("MSI-X {what} BAR{bir} is not a memory BAR")))?;
            if u64::from(offset) + len > bar.size {
                return build_err(format!("MSI-X {what} does not fit in BAR{bir}"));
            }
            Ok(())
        };
        region("table", spec.table_bar, spec.table_offset, spec.table_len())?;
        region("PBA", spec.pba_bar, spec.pba_offset, spec.pba_len())?;
        if spec.table_bar == spec.pba_bar {
            let table =
                u64::from(spec.table_offset)..u64::from(spec.table_offset) + spec.table_len();
            let pba = u64::from(spec.pba_offset)..u64::from(spec.pba_offset) + spec.pba_len();
            if table.start < pba.end && pba.start < table.end {
                return build_err("MSI-X table and PBA overlap");
            }
        }
        Ok(())
    }

    fn write_pcie(
        spec: &PcieCapSpec,
        at: usize,
        bytes: &mut [u8; SIZE],
        wmask: &mut [u8; SIZE],
        w1c: &mut [u8; SIZE],
    ) {
        let speed = spec.link_speed.code();
        let width = u16::from(spec.link_width);
        put16(
            bytes,
            at + pcie::CAPS,
            pcie::CAPS_VERSION_2 | pcie::CAPS_TYPE_ENDPOINT,
        );
        put32(
            bytes,
            at + pcie::DEVCAP,
            spec.mps_code()
                | pcie::DEVCAP_EXT_TAG
                | pcie::DEVCAP_L0S_NO_LIMIT
                | pcie::DEVCAP_L1_NO_LIMIT
                | pcie::DEVCAP_ROLE_BASED_ERR,
        );
        put16(
            bytes,
            at + pcie::DEVCTL,
            pcie::DEVCTL_RELAXED_ORDERING | pcie::DEVCTL_NO_SNOOP | pcie::DEVCTL_MRRS_512,
        );
        put16(wmask, at + pcie::DEVCTL, pcie::DEVCTL_WRITABLE);
        put16(w1c, at + pcie::DEVSTA, pcie::DEVSTA_W1C);
        put32(
            bytes,
            at + pcie::LNKCAP,
            u32::from(speed) | (u32::from(width) << 4) | pcie::LNKCAP_ASPM_OPT_COMPLIANCE,
        );
        put16(wmask, at + pcie::LNKCTL, pcie::LNKCTL_WRITABLE);
        put16(
            bytes,
            at + pcie::LNKSTA,
            speed | (width << 4) | pcie::LNKSTA_SLOT_CLOCK,
        );
        put32(bytes, at + pcie::DEVCAP2, pcie::DEVCAP2_CTD_SUPPORTED);
        put16(wmask, at + pcie::DEVCTL2, pcie::DEVCTL2_WRITABLE);
        put32(
            bytes,
            at + pcie::LNKCAP2,
            spec.link_speed.supported_vector(),
        );
        put16(bytes, at + pcie::LNKCTL2, speed);
        put16(wmask, at + pcie::LNKCTL2, pcie::LNKCTL2_WRITABLE);
        if spec.link_speed >= crate::caps::LinkSpeed::Gen3 {
            put16(bytes, at + pcie::LNKSTA2, pcie::LNKSTA2_EQ_COMPLETE);
        }
    }

    fn write_rebar(
        requests: &[(u8, Vec<u64>)],
        bars: &[Option<BarInfo>; regs::NUM_BARS],
        ext: &mut ExtCapChain,
        bytes: &mut [u8; SIZE],
        wmask: &mut [u8; SIZE],
    ) -> Result<(usize, Vec<RebarEntry>), BuildError> {
        if requests.len() > regs::NUM_BARS {
            return build_err("at most 6 resizable BARs");
        }
        let len = 4 + rebar::ENTRY_LEN * requests.len();
        let at = ext.add(bytes, ext_cap_id::RESIZABLE_BAR, 1, len)?;
        let mut entries = Vec::new();
        for (n, (bar, sizes)) in requests.iter().enumerate() {
            let info = bars
                .get(usize::from(*bar))
                .copied()
                .flatten()
                .filter(|b| b.kind.is_memory())
                .ok_or_else(|| BuildError(format!("resizable BAR{bar} is not a memory BAR")))?;
            if entries.iter().any(|e: &RebarEntry| e.bar == *bar) {
                return build_err(format!("BAR{bar} listed twice as resizable"));
            }
            let mut supported = 0u64;
            for &size in sizes {
                let log2 = size.trailing_zeros();
                if !size.is_power_of_two()
                    || !(rebar::MIN_SIZE_LOG2..=rebar::MAX_SIZE_LOG2).contains(&log2)
                {
                    return build_err(format!(
                        "resizable BAR{bar}: size {size:#x} is not a power of two in 1 MiB..=128 TiB"
                    ));
                }
                if info.kind == BarKind::Memory32 && size > 1 << 31 {
                    return build_err(format!("resizable 32-bit BAR{bar}: size {size:#x} > 2 GiB"));
                }
                supported |= 1 << (log2 - rebar::MIN_SIZE_LOG2);
            }
            let current_log2 = info.size.trailing_zeros();
            if current_log2 < rebar::MIN_SIZE_LOG2
                || supported & (1 << (current_log2 - rebar::MIN_SIZE_LOG2)) == 0
            {
                return build_err(format!(
                    "resizable BAR{bar}: its size {:#x} is not among the supported sizes",
                    info.size
                ));
            }
            let entry_at = at + rebar::ENTRY_LEN * n;
            // Sizes beyond bit 31 would need the extended capability bits;
            // MAX_SIZE_LOG2 keeps them out.
            put32(
                bytes,
                entry_at + rebar::CAP,
                (supported << rebar::CAP_SIZES_SHIFT) as u32,
            );
            let mut ctrl =
                u32::from(*bar) | ((current_log2 - rebar::MIN_SIZE_LOG2) << rebar::CTRL_SIZE_SHIFT);
            if n == 0 {
                ctrl |= (requests.len() as u32) << rebar::CTRL_NUM_BARS_SHIFT;
            }
            put32(bytes, entry_at + rebar::CTRL, ctrl);
            put32(wmask, entry_at + rebar::CTRL, rebar::CTRL_SIZE_MASK);
            entries.push(RebarEntry {
                bar: *bar,
                supported,
                ctrl_offset: entry_at + rebar::CTRL,
            });
        }
        ext.added.push(PlacedExtCap {
            id: ext_cap_id::RESIZABLE_BAR,
            offset: at,
            len,
            writable: true,
        });
        Ok((at, entries))
    }
}

/// Links standard capabilities from the pointer at 0x34.
struct CapChain {
    next_free: usize,
    /// Where the pointer to the next capability goes.
    link_at: usize,
    added: Vec<PlacedCap>,
}

impl CapChain {
    fn new() -> Self {
        Self {
            next_free: regs::FIRST_CAP_OFFSET,
            link_at: regs::CAPABILITIES_POINTER,
            added: Vec::new(),
        }
    }

    fn any(&self) -> bool {
        !self.added.is_empty()
    }

    fn add(&mut self, bytes: &mut [u8; SIZE], id: u8, len: usize) -> Result<usize, BuildError> {
        let at = self.next_free.next_multiple_of(4);
        if at + len > regs::LEGACY_CONFIG_SIZE {
            return build_err("capabilities do not fit in the first 256 bytes");
        }
        bytes[at] = id;
        bytes[at + 1] = 0;
        bytes[self.link_at] = at as u8;
        self.link_at = at + 1;
        self.next_free = at + len;
        self.added.push(PlacedCap { id, offset: at });
        Ok(at)
    }
}

/// Links extended capabilities from 0x100.
struct ExtCapChain {
    next_free: usize,
    /// Offset of the previous header, whose next pointer the next one sets.
    previous: Option<usize>,
    added: Vec<PlacedExtCap>,
}

impl ExtCapChain {
    fn new() -> Self {
        Self {
            next_free: regs::EXT_CAP_START,
            previous: None,
            added: Vec::new(),
        }
    }

    fn add(
        &mut self,
        bytes: &mut [u8; SIZE],
        id: u16,
        version: u8,
        len: usize,
    ) -> Result<usize, BuildError> {
        let at = self.next_free.next_multiple_of(4);
        if at + len > SIZE {
            return build_err("extended capabilities do not fit in 4096 bytes");
        }
        put32(bytes, at, u32::from(id) | (u32::from(version & 0xf) << 16));
        if let Some(previous) = self.previous {
            let header = get32(bytes, previous) | ((at as u32) << 20);
            put32(bytes, previous, header);
        }
        self.previous = Some(at);
        self.next_free = at + len;
        Ok(at)
    }
}
