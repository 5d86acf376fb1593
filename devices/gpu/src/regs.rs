//! The guest-visible hardware interface outside the ring: PCI identity,
//! BAR layout, and BAR0's register map with its bit fields.
//!
//! The guest driver spells the same things in C in
//! `guest-driver/p2plab_gpu_hw.h`; `tests/guest_header/` compares every
//! name and value both ways, so change both together (and README.md's
//! tables). The ring entry format is in [`crate::command`], the opcodes in
//! [`crate::engine::opcodes`], the status codes in [`crate::status`].

use crate::bits::bit_flags;

// ---- PCI identity ----

/// Default PCI vendor ID. 0x5032 ("P2") is not assigned in pci.ids, so no
/// in-tree Linux driver claims it; only our guest driver binds to it.
pub const DEFAULT_VENDOR_ID: u16 = 0x5032;
/// Default PCI device ID ("GP").
pub const DEFAULT_DEVICE_ID: u16 = 0x4750;
/// PCI revision ID.
pub const REVISION_ID: u8 = 1;

/// The three bytes of a PCI class code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassCode {
    /// Base class (0x03: display controller).
    pub base: u8,
    /// Sub-class (0x02: 3D controller).
    pub sub: u8,
    /// Programming interface.
    pub prog_if: u8,
}

impl ClassCode {
    /// As config space holds it in bits 31:8 of dword 2, shifted down.
    pub const fn as_u24(self) -> u32 {
        (self.base as u32) << 16 | (self.sub as u32) << 8 | self.prog_if as u32
    }
}

/// Display controller, 3D controller, prog-if 0.
pub const CLASS_CODE: ClassCode = ClassCode {
    base: 0x03,
    sub: 0x02,
    prog_if: 0x00,
};

// ---- BARs ----

/// BAR0: trapped control registers, 32-bit non-prefetchable memory.
pub const REGS_BAR: u8 = 0;
/// Size of BAR0.
pub const REGS_BAR_SIZE: u64 = 4096;
/// BAR2: VRAM, 64-bit prefetchable memory, mapped by QEMU from our memfd.
pub const VRAM_BAR: u8 = 2;
/// BAR4: MSI-X table and PBA (owned by the PCI layer, not by this model).
pub const MSIX_BAR: u8 = 4;
/// Size of BAR4.
pub const MSIX_BAR_SIZE: u64 = 4096;
/// Where the MSI-X table starts in BAR4.
pub const MSIX_TABLE_OFFSET: u32 = 0;
/// Where the MSI-X Pending Bit Array starts in BAR4.
pub const MSIX_PBA_OFFSET: u32 = 2048;
/// One vector signals every engine interrupt cause (see [`IntCauses`]).
pub const MSIX_VECTORS: u16 = 1;
/// The vector the engine signals.
pub const ENGINE_VECTOR: u16 = 0;

/// VRAM size limits. The BAR must be a power of two; 256 MiB matches the
/// smallest Resizable BAR size GPUs commonly report, and 64 GiB is what the
/// project promises (larger sizes work too; the limit is the guest's MMIO
/// window, not this model).
pub const MIN_VRAM_SIZE: u64 = 256 << 20;
/// Largest VRAM the server accepts.
pub const MAX_VRAM_SIZE: u64 = 1 << 40;
/// VRAM size without `--vram-size`.
pub const DEFAULT_VRAM_SIZE: u64 = 1 << 30;

// ---- Identity registers' values ----

/// What the ID register reads.
pub const ID_MAGIC: u32 = 0x5032_4750;
/// Interface major version; the driver refuses another major.
pub const VERSION_MAJOR: u16 = 1;
/// Interface minor version.
pub const VERSION_MINOR: u16 = 0;
/// What the VERSION register reads: major << 16 | minor.
pub const VERSION: u32 = (VERSION_MAJOR as u32) << 16 | VERSION_MINOR as u32;

/// Ring sizes the engine accepts (entries, and a power of two).
pub const MIN_RING_ENTRIES: u32 = 2;
/// See [`MIN_RING_ENTRIES`].
pub const MAX_RING_ENTRIES: u32 = 65536;

// ---- BAR0 register map ----

/// How many bits a register has. A 64-bit register is two dwords, low at
/// its offset and high at offset + 4, accessed one at a time or as one
/// 8-byte access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// 32 bits.
    Bits32,
    /// 64 bits (two dwords).
    Bits64,
}

/// What the guest may do with a register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads return device state; writes are ignored.
    ReadOnly,
    /// Reads return what was written (possibly masked).
    ReadWrite,
    /// Writing 1 to a bit clears it.
    ReadWrite1Clear,
    /// Writes act; reads return 0.
    WriteOnly,
}

/// Which dword of a register an access hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// Bits 31:0, at the register's offset.
    Low,
    /// Bits 63:32 of a 64-bit register, at offset + 4.
    High,
}

impl Half {
    /// This half of `value`.
    pub const fn of(self, value: u64) -> u32 {
        match self {
            Half::Low => value as u32,
            Half::High => (value >> 32) as u32,
        }
    }

    /// `value` with this half replaced by `dword`.
    pub const fn replace(self, value: u64, dword: u32) -> u64 {
        match self {
            Half::Low => (value & !0xffff_ffff) | dword as u64,
            Half::High => (value & 0xffff_ffff) | (dword as u64) << 32,
        }
    }
}

/// Declares the register map: one row per register, spelled as in the
/// guest driver's header after `REG_`.
macro_rules! registers {
    ($( $(#[$doc:meta])* $reg:ident = $offset:literal, $name:literal, $width:ident, $access:ident; )+) => {
        /// A BAR0 register (32-bit little-endian dwords).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reg {
            $( $(#[$doc])* $reg, )+
        }

        impl Reg {
            /// Every register, in offset order.
            pub const ALL: &'static [Reg] = &[$(Reg::$reg),+];

            /// Byte offset in BAR0.
            pub const fn offset(self) -> u64 {
                match self { $(Reg::$reg => $offset,)+ }
            }

            /// Name as in README.md and (after `REG_`) the driver's header.
            pub const fn name(self) -> &'static str {
                match self { $(Reg::$reg => $name,)+ }
            }

            /// 32 or 64 bits.
            pub const fn width(self) -> Width {
                match self { $(Reg::$reg => Width::$width,)+ }
            }

            /// What the guest may do with it.
            pub const fn access(self) -> Access {
                match self { $(Reg::$reg => Access::$access,)+ }
            }
        }
    };
}

registers! {
    /// [`ID_MAGIC`].
    Id = 0x000, "ID", Bits32, ReadOnly;
    /// [`VERSION`].
    Version = 0x004, "VERSION", Bits32, ReadOnly;
    /// VRAM (BAR2) size in bytes.
    VramSize = 0x008, "VRAM_SIZE", Bits64, ReadOnly;
    /// [`Status`] bits.
    Status = 0x010, "STATUS", Bits32, ReadOnly;
    /// Status code of the most recent error ([`crate::status::StatusCode`]);
    /// cleared by enabling the ring and by reset.
    EngineError = 0x014, "ENGINE_ERROR", Bits32, ReadOnly;
    /// Free for the driver; lets tests prove a trapped round trip.
    Scratch = 0x01c, "SCRATCH", Bits32, ReadWrite;
    /// Ring base: a guest-physical address, or a VRAM offset with
    /// [`RingCtrl::IN_VRAM`]; must be command-size aligned. Writes are
    /// ignored while the ring is enabled.
    RingBase = 0x020, "RING_BASE", Bits64, ReadWrite;
    /// Ring size in entries, a power of two in
    /// [`MIN_RING_ENTRIES`]..=[`MAX_RING_ENTRIES`]. Ignored while enabled.
    RingSize = 0x028, "RING_SIZE", Bits32, ReadWrite;
    /// [`RingCtrl`] bits.
    RingCtrl = 0x02c, "RING_CTRL", Bits32, ReadWrite;
    /// Index of the next entry the engine will fetch.
    RingHead = 0x030, "RING_HEAD", Bits32, ReadOnly;
    /// Index one past the last entry the driver has filled. Writing it
    /// does not start the engine; the doorbell does.
    RingTail = 0x034, "RING_TAIL", Bits32, ReadWrite;
    /// Writing `v` sets the tail to `v` and wakes the engine.
    Doorbell = 0x038, "DOORBELL", Bits32, WriteOnly;
    /// Fence of the most recently retired command; read it with one
    /// 8-byte access to avoid a torn value.
    Fence = 0x040, "FENCE", Bits64, ReadOnly;
    /// Result of the most recent successful checksum command.
    Checksum = 0x048, "CHECKSUM", Bits32, ReadOnly;
    /// [`IntCauses`] raised and not yet cleared.
    IntStatus = 0x050, "INT_STATUS", Bits32, ReadWrite1Clear;
    /// [`IntCauses`] masked (a set bit masks); all masked after reset.
    IntMask = 0x054, "INT_MASK", Bits32, ReadWrite;
    /// Commands retired with status OK (wrapping).
    JobsCompleted = 0x060, "JOBS_COMPLETED", Bits32, ReadOnly;
    /// Commands retired with an error status (wrapping).
    JobsFailed = 0x064, "JOBS_FAILED", Bits32, ReadOnly;
    /// VRAM errors the engine reported (reads of a bad VRAM range that
    /// failed a job with VRAM_IO), wrapping; cleared by reset.
    VramErrCount = 0x068, "VRAM_ERR_COUNT", Bits32, ReadOnly;
    /// VRAM offset of the first bad byte of the most recent VRAM error.
    VramErrAddr = 0x070, "VRAM_ERR_ADDR", Bits64, ReadOnly;
}

impl Reg {
    /// The register a dword-aligned `offset` falls in, and which of its
    /// dwords; `None` for a reserved offset.
    pub fn at(offset: u64) -> Option<(Reg, Half)> {
        Reg::ALL.iter().find_map(|&reg| {
            if offset == reg.offset() {
                Some((reg, Half::Low))
            } else if reg.width() == Width::Bits64 && offset == reg.offset() + 4 {
                Some((reg, Half::High))
            } else {
                None
            }
        })
    }

    /// Byte offset of one dword of the register.
    pub const fn dword_offset(self, half: Half) -> u64 {
        match half {
            Half::Low => self.offset(),
            Half::High => self.offset() + 4,
        }
    }
}

bit_flags! {
    /// The STATUS register.
    pub struct Status(u32), prefix "STATUS_" {
        /// Always set: the device is up.
        READY = 1 << 0;
        /// RING_CTRL.ENABLE is set.
        RING_ENABLED = 1 << 1;
        /// The engine has work: a command in flight or entries between
        /// head and tail.
        BUSY = 1 << 2;
        /// The engine stopped on a ring-level error; disable the ring to
        /// recover.
        HALTED = 1 << 3;
        /// Mirrors Bus Master Enable in the PCI command register.
        BUS_MASTER = 1 << 4;
    }
}

bit_flags! {
    /// The RING_CTRL register; other bits read as 0.
    pub struct RingCtrl(u32), prefix "RING_CTRL_" {
        /// The engine consumes the ring.
        ENABLE = 1 << 0;
        /// The ring lives in VRAM at offset RING_BASE instead of guest
        /// memory.
        IN_VRAM = 1 << 1;
    }
}

impl RingCtrl {
    /// Whether ENABLE is set.
    pub const fn enabled(self) -> bool {
        self.contains(Self::ENABLE)
    }

    /// Whether IN_VRAM is set.
    pub const fn in_vram(self) -> bool {
        self.contains(Self::IN_VRAM)
    }
}

bit_flags! {
    /// Interrupt causes: the INT_STATUS and INT_MASK registers.
    pub struct IntCauses(u32), prefix "INT_" {
        /// A command with [`crate::command::CommandFlags::IRQ`] retired.
        FENCE = 1 << 0;
        /// A command failed or the engine halted; see ENGINE_ERROR.
        ERROR = 1 << 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_ordered_aligned_and_disjoint() {
        let mut end = 0;
        for reg in Reg::ALL {
            assert!(reg.offset() >= end, "{} overlaps", reg.name());
            assert_eq!(reg.offset() % 4, 0, "{}", reg.name());
            let bytes = match reg.width() {
                Width::Bits32 => 4,
                Width::Bits64 => 8,
            };
            end = reg.offset() + bytes;
            assert!(end <= REGS_BAR_SIZE);
        }
    }

    #[test]
    fn every_dword_finds_its_register() {
        assert_eq!(Reg::at(0x008), Some((Reg::VramSize, Half::Low)));
        assert_eq!(Reg::at(0x00c), Some((Reg::VramSize, Half::High)));
        assert_eq!(Reg::at(0x02c), Some((Reg::RingCtrl, Half::Low)));
        assert_eq!(Reg::at(0x018), None, "reserved");
        assert_eq!(Reg::at(0x030 + 4), Some((Reg::RingTail, Half::Low)));
        for reg in Reg::ALL {
            assert_eq!(Reg::at(reg.offset()), Some((*reg, Half::Low)));
        }
    }

    #[test]
    fn halves_split_and_join() {
        let value = 0x1122_3344_5566_7788;
        assert_eq!(Half::Low.of(value), 0x5566_7788);
        assert_eq!(Half::High.of(value), 0x1122_3344);
        assert_eq!(
            Half::High.replace(value, 0xaabb_ccdd),
            0xaabb_ccdd_5566_7788
        );
        assert_eq!(Half::Low.replace(value, 1), 0x1122_3344_0000_0001);
        assert_eq!(VERSION, 0x0001_0000);
        assert_eq!(CLASS_CODE.as_u24(), 0x03_02_00);
    }
}
