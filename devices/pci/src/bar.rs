//! Base Address Register descriptions.

use crate::regs::bar as bits;

/// What address space a BAR decodes and how wide its address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    /// 32-bit memory BAR.
    Memory32,
    /// 64-bit memory BAR; it uses the next BAR register as its high dword.
    Memory64,
    /// I/O port BAR.
    Io,
}

impl BarKind {
    /// Whether the BAR decodes memory (32- or 64-bit), not I/O ports.
    pub fn is_memory(self) -> bool {
        !matches!(self, BarKind::Io)
    }
}

/// A BAR the device implements, as given to the config space builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarSpec {
    /// Memory (32/64-bit) or I/O.
    pub kind: BarKind,
    /// Size in bytes; a power of two.
    pub size: u64,
    /// Reads have no side effects, so the host may prefetch and merge them
    /// (and place the BAR above 4 GiB behind a bridge's prefetchable window).
    pub prefetchable: bool,
}

impl BarSpec {
    /// A non-prefetchable 32-bit memory BAR.
    pub const fn memory32(size: u64) -> Self {
        Self {
            kind: BarKind::Memory32,
            size,
            prefetchable: false,
        }
    }

    /// A non-prefetchable 64-bit memory BAR.
    pub const fn memory64(size: u64) -> Self {
        Self {
            kind: BarKind::Memory64,
            size,
            prefetchable: false,
        }
    }

    /// An I/O port BAR.
    pub const fn io(size: u64) -> Self {
        Self {
            kind: BarKind::Io,
            size,
            prefetchable: false,
        }
    }

    /// Marks a memory BAR prefetchable.
    pub const fn prefetchable(mut self) -> Self {
        self.prefetchable = true;
        self
    }

    /// Read-only low bits of the BAR register (space, type, prefetchable).
    pub(crate) fn flag_bits(&self) -> u32 {
        match self.kind {
            BarKind::Io => bits::IO_SPACE,
            BarKind::Memory32 | BarKind::Memory64 => {
                let mut flags = 0;
                if self.kind == BarKind::Memory64 {
                    flags |= bits::MEM_TYPE_64;
                }
                if self.prefetchable {
                    flags |= bits::MEM_PREFETCHABLE;
                }
                flags
            }
        }
    }

    /// Mask of the address bits the guest may program, over the full
    /// address width (the 64-bit value of a 64-bit BAR).
    pub(crate) fn address_mask(kind: BarKind, size: u64) -> u64 {
        let low_flags = match kind {
            BarKind::Io => u64::from(bits::IO_FLAGS_MASK),
            _ => u64::from(bits::MEM_FLAGS_MASK),
        };
        let width_mask = match kind {
            BarKind::Memory64 => u64::MAX,
            BarKind::Memory32 | BarKind::Io => u64::from(u32::MAX),
        };
        !(size.wrapping_sub(1)) & !low_flags & width_mask
    }

    /// Why this BAR cannot be built, if it cannot.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        if !self.size.is_power_of_two() {
            return Err("BAR size must be a power of two");
        }
        match self.kind {
            BarKind::Io => {
                if self.prefetchable {
                    return Err("an I/O BAR cannot be prefetchable");
                }
                if !(4..=256).contains(&self.size) {
                    return Err("I/O BAR size must be 4..=256 bytes");
                }
            }
            BarKind::Memory32 => {
                if !(16..=(1 << 31)).contains(&self.size) {
                    return Err("32-bit memory BAR size must be 16 bytes..=2 GiB");
                }
            }
            BarKind::Memory64 => {
                if !(16..=(1 << 63)).contains(&self.size) {
                    return Err("64-bit memory BAR size must be 16 bytes..=2^63");
                }
            }
        }
        Ok(())
    }
}
