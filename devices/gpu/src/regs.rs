//! The guest-visible ABI of the device: PCI identity, BAR layout, BAR0
//! register map, command ring format and status codes.
//!
//! Everything here is mirrored in `guest-driver/p2plab_gpu_hw.h` and
//! documented in `README.md`; change all three together.

/// Default PCI vendor ID. 0x5032 ("P2") is not assigned in pci.ids, so no
/// in-tree Linux driver claims it; only our guest driver binds to it.
pub const DEFAULT_VENDOR_ID: u16 = 0x5032;
/// Default PCI device ID ("GP").
pub const DEFAULT_DEVICE_ID: u16 = 0x4750;
/// PCI class code: display controller (0x03), 3D controller (0x02), prog-if 0.
pub const CLASS_CODE: u32 = 0x03_02_00;

/// BAR0: trapped control registers, 32-bit non-prefetchable memory.
pub const REGS_BAR: u8 = 0;
pub const REGS_BAR_SIZE: u64 = 4096;
/// BAR2: VRAM, 64-bit prefetchable memory, mapped by QEMU from our memfd.
pub const VRAM_BAR: u8 = 2;
/// BAR4: MSI-X table and PBA (owned by the PCI layer, not by this model).
pub const MSIX_BAR: u8 = 4;
pub const MSIX_BAR_SIZE: u64 = 4096;
pub const MSIX_TABLE_OFFSET: u32 = 0;
pub const MSIX_PBA_OFFSET: u32 = 2048;
/// Vector 0 signals every engine interrupt cause (see [`INT_FENCE`], [`INT_ERROR`]).
pub const MSIX_VECTORS: u16 = 1;
pub const ENGINE_VECTOR: u16 = 0;

/// VRAM size limits. The BAR must be a power of two; 256 MiB matches the
/// smallest Resizable BAR size GPUs commonly report, and 64 GiB is what the
/// project promises (larger sizes work too; the limit is the guest's MMIO
/// window, not this model).
pub const MIN_VRAM_SIZE: u64 = 256 << 20;
pub const MAX_VRAM_SIZE: u64 = 1 << 40;
pub const DEFAULT_VRAM_SIZE: u64 = 1 << 30;

// ---- BAR0 register offsets (all registers are 32 bits, little-endian) ----

/// RO: [`ID_MAGIC`].
pub const REG_ID: u64 = 0x000;
/// RO: major << 16 | minor.
pub const REG_VERSION: u64 = 0x004;
/// RO: VRAM (BAR2) size in bytes, low and high halves.
pub const REG_VRAM_SIZE_LO: u64 = 0x008;
pub const REG_VRAM_SIZE_HI: u64 = 0x00c;
/// RO: `STATUS_*` bits.
pub const REG_STATUS: u64 = 0x010;
/// RO: status code of the most recent error (`ERR_*`); cleared by enabling
/// the ring and by reset.
pub const REG_ENGINE_ERROR: u64 = 0x014;
/// RW: free for the driver; lets tests prove a trapped round trip.
pub const REG_SCRATCH: u64 = 0x01c;
/// RW: ring base, guest-physical address (or VRAM offset with
/// [`RING_CTRL_IN_VRAM`]); must be [`COMMAND_SIZE`]-aligned. Writes are
/// ignored while the ring is enabled.
pub const REG_RING_BASE_LO: u64 = 0x020;
pub const REG_RING_BASE_HI: u64 = 0x024;
/// RW: ring size in entries, a power of two in
/// [`MIN_RING_ENTRIES`]..=[`MAX_RING_ENTRIES`]. Ignored while enabled.
pub const REG_RING_SIZE: u64 = 0x028;
/// RW: `RING_CTRL_*` bits.
pub const REG_RING_CTRL: u64 = 0x02c;
/// RO: index of the next entry the engine will fetch.
pub const REG_RING_HEAD: u64 = 0x030;
/// RW: index one past the last entry the driver has filled. Writing it
/// does not start the engine; the doorbell does.
pub const REG_RING_TAIL: u64 = 0x034;
/// WO: writing `v` sets the tail to `v` and wakes the engine. Reads as 0.
pub const REG_DOORBELL: u64 = 0x038;
/// RO: fence value of the most recently retired command (64 bits; read it
/// with one 8-byte access to avoid a torn value).
pub const REG_FENCE_LO: u64 = 0x040;
pub const REG_FENCE_HI: u64 = 0x044;
/// RO: result of the most recent successful checksum command.
pub const REG_CHECKSUM: u64 = 0x048;
/// RW1C: `INT_*` cause bits.
pub const REG_INT_STATUS: u64 = 0x050;
/// RW: a set bit masks that cause. All causes are masked after reset.
pub const REG_INT_MASK: u64 = 0x054;
/// RO: commands retired with [`STATUS_OK`] / with an error (wrapping).
pub const REG_JOBS_COMPLETED: u64 = 0x060;
pub const REG_JOBS_FAILED: u64 = 0x064;

pub const ID_MAGIC: u32 = 0x5032_4750;
pub const VERSION: u32 = 0x0001_0000;

pub const STATUS_READY: u32 = 1 << 0;
pub const STATUS_RING_ENABLED: u32 = 1 << 1;
/// The engine has work: a command in flight or entries between head and tail.
pub const STATUS_BUSY: u32 = 1 << 2;
/// The engine stopped on a ring-level error; disable the ring to recover.
pub const STATUS_HALTED: u32 = 1 << 3;
/// Mirrors the Bus Master Enable bit of the PCI command register.
pub const STATUS_BUS_MASTER: u32 = 1 << 4;

pub const RING_CTRL_ENABLE: u32 = 1 << 0;
/// The ring lives in VRAM at offset RING_BASE instead of guest memory.
pub const RING_CTRL_IN_VRAM: u32 = 1 << 1;
pub const RING_CTRL_WRITABLE: u32 = RING_CTRL_ENABLE | RING_CTRL_IN_VRAM;

/// A command with [`CMD_FLAG_IRQ`] retired.
pub const INT_FENCE: u32 = 1 << 0;
/// A command failed or the engine halted; see REG_ENGINE_ERROR.
pub const INT_ERROR: u32 = 1 << 1;
pub const INT_ALL: u32 = INT_FENCE | INT_ERROR;

pub const MIN_RING_ENTRIES: u32 = 2;
pub const MAX_RING_ENTRIES: u32 = 65536;

// ---- Command format ----

/// Every ring entry is 64 bytes, little-endian:
///
/// | offset | size | field                                              |
/// |--------|------|----------------------------------------------------|
/// | 0x00   | 1    | opcode (`OP_*`)                                    |
/// | 0x01   | 1    | flags (`CMD_FLAG_*`)                               |
/// | 0x02   | 2    | reserved, must be 0                                |
/// | 0x04   | 4    | pattern (FILL: 32-bit pattern; others must be 0)   |
/// | 0x08   | 8    | fence value published when the command retires     |
/// | 0x10   | 8    | src (guest-physical address or VRAM offset)        |
/// | 0x18   | 8    | dst (guest-physical address or VRAM offset)        |
/// | 0x20   | 8    | length in bytes                                    |
/// | 0x28   | 8    | completion record address (guest-physical)         |
/// | 0x30   | 16   | reserved, must be 0                                |
pub const COMMAND_SIZE: u64 = 64;

pub const OP_NOP: u8 = 0x00;
/// src = guest-physical address, dst = VRAM offset.
pub const OP_COPY_TO_VRAM: u8 = 0x01;
/// src = VRAM offset, dst = guest-physical address.
pub const OP_COPY_FROM_VRAM: u8 = 0x02;
/// src, dst = VRAM offsets; overlapping ranges behave like memmove.
pub const OP_COPY_VRAM: u8 = 0x03;
/// dst = VRAM offset, filled with the little-endian 32-bit pattern
/// repeated from dst onwards.
pub const OP_FILL: u8 = 0x04;
/// src = VRAM offset; CRC32C (Castagnoli, as iSCSI) of the range goes to
/// the completion record's result and REG_CHECKSUM.
pub const OP_CHECKSUM: u8 = 0x05;

/// Raise [`INT_FENCE`] when this command retires.
pub const CMD_FLAG_IRQ: u8 = 1 << 0;
/// Write a completion record to the address at 0x28.
pub const CMD_FLAG_COMPLETION: u8 = 1 << 1;
pub const CMD_FLAGS_KNOWN: u8 = CMD_FLAG_IRQ | CMD_FLAG_COMPLETION;

/// Completion record, 16 bytes little-endian, written before the fence
/// register is updated: fence (u64), status (u32, `STATUS_*`/`ERR_*` code),
/// result (u32: the CRC32C for OP_CHECKSUM, 0 otherwise).
pub const COMPLETION_SIZE: usize = 16;

// ---- Status codes (completion record status and REG_ENGINE_ERROR) ----

pub const STATUS_OK: u32 = 0;
/// Command errors: the command retires (fence advances) with this status.
pub const ERR_BAD_OPCODE: u32 = 0x01;
pub const ERR_BAD_COMMAND: u32 = 0x02;
pub const ERR_VRAM_RANGE: u32 = 0x03;
pub const ERR_HOST_DMA: u32 = 0x04;
pub const ERR_NO_BUS_MASTER: u32 = 0x05;
pub const ERR_VRAM_IO: u32 = 0x06;
pub const ERR_COMPLETION_WRITE: u32 = 0x07;
/// Ring errors: the engine halts (STATUS_HALTED) without retiring anything.
pub const ERR_RING_MISALIGNED: u32 = 0x10;
pub const ERR_RING_BAD_SIZE: u32 = 0x11;
pub const ERR_RING_RANGE: u32 = 0x12;
pub const ERR_RING_FETCH: u32 = 0x13;
pub const ERR_BAD_TAIL: u32 = 0x14;

/// A short name for a status code, for logs.
pub fn status_name(code: u32) -> &'static str {
    match code {
        STATUS_OK => "ok",
        ERR_BAD_OPCODE => "bad opcode",
        ERR_BAD_COMMAND => "bad command (reserved field or flag set)",
        ERR_VRAM_RANGE => "VRAM range out of bounds",
        ERR_HOST_DMA => "guest memory access failed",
        ERR_NO_BUS_MASTER => "bus mastering disabled",
        ERR_VRAM_IO => "VRAM backing I/O failed",
        ERR_COMPLETION_WRITE => "completion record write failed",
        ERR_RING_MISALIGNED => "ring base misaligned",
        ERR_RING_BAD_SIZE => "ring size not a power of two in range",
        ERR_RING_RANGE => "ring outside VRAM or address space",
        ERR_RING_FETCH => "ring entry fetch failed",
        ERR_BAD_TAIL => "tail beyond ring size",
        _ => "unknown",
    }
}
