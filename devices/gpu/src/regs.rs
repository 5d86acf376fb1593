//! The guest-visible hardware interface outside the ring: PCI identity,
//! BAR layout, and BAR0's register map with its bit fields.
//!
//! The guest driver spells the same things in C in
//! `guest-driver/p2plab_gpu_hw.h`; `tests/guest_header/` compares every
//! name and value both ways, so change both together (and README.md's
//! tables). The ring entry format is in [`crate::command`], the opcodes in
//! [`crate::engine::opcodes`], the status codes in [`crate::status`].

use p2plab_kit::bit_flags;

// ---- PCI identity ----

pub use p2plab_kit::{ClassCode, MsixBar, PciIds};

/// The identity without flags: p2plab's vendor ID, device ID "GP",
/// revision 1.
pub const DEFAULT_IDS: PciIds = PciIds::new(p2plab_kit::P2PLAB_VENDOR_ID, 0x4750);

/// Display controller, 3D controller, prog-if 0.
pub const CLASS_CODE: ClassCode = ClassCode::new(0x03, 0x02, 0x00);

// ---- BARs ----

/// BAR0: trapped control registers, 32-bit non-prefetchable memory.
pub const REGS_BAR: u8 = 0;
/// Size of BAR0.
pub const REGS_BAR_SIZE: u64 = 4096;
/// BAR2: VRAM, 64-bit prefetchable memory, mapped by QEMU from our memfd.
pub const VRAM_BAR: u8 = 2;
/// BAR4: the MSI-X table and PBA (owned by the PCI layer, not by this
/// model), with one vector for every engine interrupt cause (see
/// [`IntCauses`]).
pub const MSIX: MsixBar = MsixBar { bar: 4, vectors: 1 };
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

pub use p2plab_kit::regs::{Access, Half, Width};

p2plab_kit::registers! {
    /// A BAR0 register (32-bit little-endian dwords).
    pub enum Reg, offsets in reg {
        /// [`ID_MAGIC`].
        Id(ID) = 0x000, Bits32, ReadOnly;
        /// [`VERSION`].
        Version(VERSION) = 0x004, Bits32, ReadOnly;
        /// VRAM (BAR2) size in bytes.
        VramSize(VRAM_SIZE) = 0x008, Bits64, ReadOnly;
        /// [`Status`] bits.
        Status(STATUS) = 0x010, Bits32, ReadOnly;
        /// Status code of the most recent error ([`crate::status::StatusCode`]);
        /// cleared by enabling the ring and by reset.
        EngineError(ENGINE_ERROR) = 0x014, Bits32, ReadOnly;
        /// Free for the driver; lets tests prove a trapped round trip.
        Scratch(SCRATCH) = 0x01c, Bits32, ReadWrite;
        /// Ring base: a guest-physical address, or a VRAM offset with
        /// [`RingCtrl::IN_VRAM`]; must be command-size aligned. Writes are
        /// ignored while the ring is enabled.
        RingBase(RING_BASE) = 0x020, Bits64, ReadWrite;
        /// Ring size in entries, a power of two in
        /// [`MIN_RING_ENTRIES`]..=[`MAX_RING_ENTRIES`]. Ignored while enabled.
        RingSize(RING_SIZE) = 0x028, Bits32, ReadWrite;
        /// [`RingCtrl`] bits.
        RingCtrl(RING_CTRL) = 0x02c, Bits32, ReadWrite;
        /// Index of the next entry the engine will fetch.
        RingHead(RING_HEAD) = 0x030, Bits32, ReadOnly;
        /// Index one past the last entry the driver has filled. Writing it
        /// does not start the engine; the doorbell does.
        RingTail(RING_TAIL) = 0x034, Bits32, ReadWrite;
        /// Writing `v` sets the tail to `v` and wakes the engine.
        Doorbell(DOORBELL) = 0x038, Bits32, WriteOnly;
        /// Fence of the most recently retired command; read it with one
        /// 8-byte access to avoid a torn value.
        Fence(FENCE) = 0x040, Bits64, ReadOnly;
        /// Result of the most recent successful checksum command.
        Checksum(CHECKSUM) = 0x048, Bits32, ReadOnly;
        /// [`IntCauses`] raised and not yet cleared.
        IntStatus(INT_STATUS) = 0x050, Bits32, ReadWrite1Clear;
        /// [`IntCauses`] masked (a set bit masks); all masked after reset.
        IntMask(INT_MASK) = 0x054, Bits32, ReadWrite;
        /// Commands retired with status OK (wrapping).
        JobsCompleted(JOBS_COMPLETED) = 0x060, Bits32, ReadOnly;
        /// Commands retired with an error status (wrapping).
        JobsFailed(JOBS_FAILED) = 0x064, Bits32, ReadOnly;
        /// VRAM errors the engine reported (reads of a bad VRAM range that
        /// failed a job with VRAM_IO), wrapping; cleared by reset.
        VramErrCount(VRAM_ERR_COUNT) = 0x068, Bits32, ReadOnly;
        /// VRAM offset of the first bad byte of the most recent VRAM error.
        VramErrAddr(VRAM_ERR_ADDR) = 0x070, Bits64, ReadOnly;
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
    fn identity_values() {
        assert_eq!(VERSION, 0x0001_0000);
        assert_eq!(CLASS_CODE.as_u24(), 0x03_02_00);
    }
}
