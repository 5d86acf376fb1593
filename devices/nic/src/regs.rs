//! The guest-visible hardware interface: PCI identity, BAR layout, BAR0's
//! register map and bits, the descriptor format and status codes.
//!
//! The guest driver spells the same things in C in
//! `guest-driver/p2plab_nic_hw.h`; `tests/guest_header.rs` compares every
//! name and value both ways, so change both together. Registers and bits
//! are declared with p2plab-kit's `registers!` and `bit_flags!`, named as
//! in the header after `NIC_REG_`, `NIC_STATUS_`...

pub use p2plab_kit::{ClassCode, MsixBar, PciIds};

/// The identity without flags: p2plab's vendor ID (shared by its
/// devices), device ID "NI", revision 1.
pub const DEFAULT_IDS: PciIds = PciIds::new(p2plab_kit::P2PLAB_VENDOR_ID, 0x4e49);
/// Network controller, Ethernet, prog-if 0.
pub const CLASS_CODE: ClassCode = ClassCode::new(0x02, 0x00, 0x00);

/// BAR0: trapped control registers, 32-bit memory.
pub const REGS_BAR: u8 = 0;
/// Size of BAR0.
pub const REGS_BAR_SIZE: u64 = 4096;
/// BAR4: the MSI-X table and PBA (owned by the PCI layer), with one
/// vector for every cause (INT_STATUS says which).
pub const MSIX: MsixBar = MsixBar { bar: 4, vectors: 1 };
/// The vector both engines signal.
pub const NIC_VECTOR: u16 = 0;

/// What the ID register reads ("P2NI").
pub const ID_MAGIC: u32 = 0x5032_4e49;
/// Interface major version; the driver refuses another major.
pub const VERSION_MAJOR: u16 = 1;
/// What the VERSION register reads: major << 16 | minor 0.
pub const VERSION: u32 = (VERSION_MAJOR as u32) << 16;

/// Ring sizes the engines accept (entries, a power of two).
pub const MIN_RING_ENTRIES: u32 = 2;
/// See [`MIN_RING_ENTRIES`].
pub const MAX_RING_ENTRIES: u32 = 4096;
/// Largest frame (`--mtu`) the server accepts.
pub const MAX_MTU: u32 = 1 << 20;
/// Smallest frame limit the server accepts.
pub const MIN_MTU: u32 = 256;
/// Frame limit without `--mtu`: 64 KiB, so 256 MiB is 4096 frames.
pub const DEFAULT_MTU: u32 = 64 << 10;

p2plab_kit::registers! {
    /// A BAR0 register, named as in the C header after `NIC_REG_`.
    pub enum Reg, offsets in reg {
        /// [`ID_MAGIC`].
        Id(ID) = 0x000, Bits32, ReadOnly;
        /// [`VERSION`].
        Version(VERSION) = 0x004, Bits32, ReadOnly;
        /// The largest frame in bytes (`--mtu`).
        Mtu(MTU) = 0x008, Bits32, ReadOnly;
        /// [`DeviceStatus`] bits.
        Status(STATUS) = 0x00c, Bits32, ReadOnly;
        /// [`Ctrl`] bits.
        Ctrl(CTRL) = 0x010, Bits32, ReadWrite;
        /// Status code of the most recent ring-level error (0: none);
        /// cleared when a ring is enabled and by reset.
        Error(ERROR) = 0x014, Bits32, ReadOnly;
        /// Free for the driver.
        Scratch(SCRATCH) = 0x018, Bits32, ReadWrite;
        /// TX ring base (guest-physical, descriptor aligned); ignored
        /// while TX is enabled.
        TxRingBase(TX_RING_BASE) = 0x020, Bits64, ReadWrite;
        /// TX ring size in entries; ignored while TX is enabled.
        TxRingSize(TX_RING_SIZE) = 0x028, Bits32, ReadWrite;
        /// Index of the next TX descriptor the device takes.
        TxHead(TX_HEAD) = 0x02c, Bits32, ReadOnly;
        /// Writing `v` makes `v` the TX tail and wakes the TX engine.
        TxDoorbell(TX_DOORBELL) = 0x030, Bits32, WriteOnly;
        /// The TX tail.
        TxTail(TX_TAIL) = 0x034, Bits32, ReadOnly;
        /// RX ring base.
        RxRingBase(RX_RING_BASE) = 0x040, Bits64, ReadWrite;
        /// RX ring size in entries.
        RxRingSize(RX_RING_SIZE) = 0x048, Bits32, ReadWrite;
        /// Index of the next RX descriptor the device fills.
        RxHead(RX_HEAD) = 0x04c, Bits32, ReadOnly;
        /// Writing `v` makes `v` the RX tail (buffers posted up to it).
        RxDoorbell(RX_DOORBELL) = 0x050, Bits32, WriteOnly;
        /// The RX tail.
        RxTail(RX_TAIL) = 0x054, Bits32, ReadOnly;
        /// [`IntCauses`] raised and not yet cleared (write 1 to clear).
        IntStatus(INT_STATUS) = 0x060, Bits32, ReadWrite1Clear;
        /// [`IntCauses`] masked (a set bit masks); all masked after reset.
        IntMask(INT_MASK) = 0x064, Bits32, ReadWrite;
    }
}

p2plab_kit::bit_flags! {
    /// The STATUS register.
    pub struct DeviceStatus(u32), prefix "STATUS_" {
        /// Always set.
        READY = 1 << 0;
        /// The wire has a peer (always, for the loopback wire).
        LINK_UP = 1 << 1;
        /// CTRL.TX_ENABLE is set.
        TX_ENABLED = 1 << 2;
        /// CTRL.RX_ENABLE is set.
        RX_ENABLED = 1 << 3;
        /// Bus Master Enable in the PCI command register.
        BUS_MASTER = 1 << 4;
        /// An engine stopped on a ring-level error; disable and re-enable
        /// that ring to recover.
        HALTED = 1 << 5;
        /// The TX engine may read a TX buffer (it took a descriptor and
        /// has not finished reading its buffer). After clearing
        /// CTRL.TX_ENABLE, the driver waits for this to clear before it
        /// frees TX buffers.
        TX_BUSY = 1 << 6;
        /// The RX engine holds a descriptor (it may write its buffer).
        RX_BUSY = 1 << 7;
    }
}

p2plab_kit::bit_flags! {
    /// The CTRL register; other bits read as 0.
    pub struct Ctrl(u32), prefix "CTRL_" {
        /// The TX engine consumes the TX ring.
        TX_ENABLE = 1 << 0;
        /// The RX engine fills the RX ring.
        RX_ENABLE = 1 << 1;
    }
}

p2plab_kit::bit_flags! {
    /// Interrupt causes: the INT_STATUS and INT_MASK registers.
    pub struct IntCauses(u32), prefix "INT_" {
        /// A TX descriptor with [`DescFlags::IRQ`] completed.
        TX = 1 << 0;
        /// An RX descriptor with [`DescFlags::IRQ`] completed.
        RX = 1 << 1;
        /// An engine halted (see ERROR).
        ERROR = 1 << 2;
    }
}

// ---- Descriptors (TX and RX rings share the layout) ----

/// Bytes per descriptor.
pub const DESC_SIZE: u64 = 32;
/// Offset of the buffer's bus address (u64).
pub const DESC_ADDR: u64 = 0;
/// Offset of the length (u32): TX frame bytes, RX buffer capacity.
pub const DESC_LEN: u64 = 8;
/// Offset of the flags (u16, `DESC_FLAG_*`).
pub const DESC_FLAGS: u64 = 12;
/// Offset of the status (u16): 0 while the device owns the descriptor,
/// then a `DESC_STATUS_*` code the device writes last.
pub const DESC_STATUS: u64 = 14;
/// Offset of the driver's cookie (u64), never touched by the device.
pub const DESC_COOKIE: u64 = 16;
/// Offset of the bytes the device moved (u32), written before status.
pub const DESC_DONE_LEN: u64 = 24;

p2plab_kit::bit_flags! {
    /// A descriptor's flags; a flag without a name fails the descriptor.
    pub struct DescFlags(u16), prefix "DESC_FLAG_" {
        /// Raise the TX/RX interrupt cause when it completes.
        IRQ = 1 << 0;
    }
}
