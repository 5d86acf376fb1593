//! The guest-visible hardware interface: PCI identity, BAR layout, BAR0's
//! register map and bits, the descriptor format and status codes.
//!
//! The guest driver spells the same things in C in
//! `guest-driver/p2plab_nic_hw.h`; `tests/guest_header.rs` compares every
//! name and value both ways, so change both together.

/// PCI vendor ID (shared with the other p2plab devices, unassigned in
/// pci.ids, so no in-tree driver claims it).
pub const DEFAULT_VENDOR_ID: u16 = 0x5032;
/// PCI device ID ("NI").
pub const DEFAULT_DEVICE_ID: u16 = 0x4e49;
/// PCI revision ID.
pub const REVISION_ID: u8 = 1;
/// Network controller, Ethernet, prog-if 0 (base, sub, prog-if).
pub const CLASS_CODE: (u8, u8, u8) = (0x02, 0x00, 0x00);

/// BAR0: trapped control registers, 32-bit memory.
pub const REGS_BAR: u8 = 0;
/// Size of BAR0.
pub const REGS_BAR_SIZE: u64 = 4096;
/// BAR4: MSI-X table and PBA (owned by the PCI layer).
pub const MSIX_BAR: u8 = 4;
/// Size of BAR4.
pub const MSIX_BAR_SIZE: u64 = 4096;
/// Where the MSI-X table starts in BAR4.
pub const MSIX_TABLE_OFFSET: u32 = 0;
/// Where the MSI-X Pending Bit Array starts in BAR4.
pub const MSIX_PBA_OFFSET: u32 = 2048;
/// One vector for every cause (INT_STATUS says which).
pub const MSIX_VECTORS: u16 = 1;
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

/// BAR0 registers: (name as in the C header after `REG_`, offset, 64-bit).
pub const REGISTERS: &[(&str, u64, bool)] = &[
    ("ID", REG_ID, false),
    ("VERSION", REG_VERSION, false),
    ("MTU", REG_MTU, false),
    ("STATUS", REG_STATUS, false),
    ("CTRL", REG_CTRL, false),
    ("ERROR", REG_ERROR, false),
    ("SCRATCH", REG_SCRATCH, false),
    ("TX_RING_BASE", REG_TX_RING_BASE, true),
    ("TX_RING_SIZE", REG_TX_RING_SIZE, false),
    ("TX_HEAD", REG_TX_HEAD, false),
    ("TX_DOORBELL", REG_TX_DOORBELL, false),
    ("TX_TAIL", REG_TX_TAIL, false),
    ("RX_RING_BASE", REG_RX_RING_BASE, true),
    ("RX_RING_SIZE", REG_RX_RING_SIZE, false),
    ("RX_HEAD", REG_RX_HEAD, false),
    ("RX_DOORBELL", REG_RX_DOORBELL, false),
    ("RX_TAIL", REG_RX_TAIL, false),
    ("INT_STATUS", REG_INT_STATUS, false),
    ("INT_MASK", REG_INT_MASK, false),
];

/// [`ID_MAGIC`], read-only.
pub const REG_ID: u64 = 0x000;
/// [`VERSION`], read-only.
pub const REG_VERSION: u64 = 0x004;
/// The largest frame in bytes (`--mtu`), read-only.
pub const REG_MTU: u64 = 0x008;
/// `STATUS_*` bits, read-only.
pub const REG_STATUS: u64 = 0x00c;
/// `CTRL_*` bits, read-write.
pub const REG_CTRL: u64 = 0x010;
/// Status code of the most recent ring-level error (0: none), read-only;
/// cleared when a ring is enabled and by reset.
pub const REG_ERROR: u64 = 0x014;
/// Free for the driver.
pub const REG_SCRATCH: u64 = 0x018;
/// TX ring base (guest-physical, descriptor aligned), 64-bit; ignored
/// while TX is enabled.
pub const REG_TX_RING_BASE: u64 = 0x020;
/// TX ring size in entries; ignored while TX is enabled.
pub const REG_TX_RING_SIZE: u64 = 0x028;
/// Index of the next TX descriptor the device takes, read-only.
pub const REG_TX_HEAD: u64 = 0x02c;
/// Writing `v` makes `v` the TX tail and wakes the TX engine.
pub const REG_TX_DOORBELL: u64 = 0x030;
/// The TX tail, read-only.
pub const REG_TX_TAIL: u64 = 0x034;
/// RX ring base, 64-bit.
pub const REG_RX_RING_BASE: u64 = 0x040;
/// RX ring size in entries.
pub const REG_RX_RING_SIZE: u64 = 0x048;
/// Index of the next RX descriptor the device fills, read-only.
pub const REG_RX_HEAD: u64 = 0x04c;
/// Writing `v` makes `v` the RX tail (buffers posted up to it).
pub const REG_RX_DOORBELL: u64 = 0x050;
/// The RX tail, read-only.
pub const REG_RX_TAIL: u64 = 0x054;
/// `INT_*` causes raised and not yet cleared (write 1 to clear).
pub const REG_INT_STATUS: u64 = 0x060;
/// `INT_*` causes masked (a set bit masks); all masked after reset.
pub const REG_INT_MASK: u64 = 0x064;

/// STATUS: always set.
pub const STATUS_READY: u32 = 1 << 0;
/// STATUS: the wire has a peer (always, for the loopback wire).
pub const STATUS_LINK_UP: u32 = 1 << 1;
/// STATUS: CTRL.TX_ENABLE is set.
pub const STATUS_TX_ENABLED: u32 = 1 << 2;
/// STATUS: CTRL.RX_ENABLE is set.
pub const STATUS_RX_ENABLED: u32 = 1 << 3;
/// STATUS: Bus Master Enable in the PCI command register.
pub const STATUS_BUS_MASTER: u32 = 1 << 4;
/// STATUS: an engine stopped on a ring-level error; disable and re-enable
/// that ring to recover.
pub const STATUS_HALTED: u32 = 1 << 5;
/// STATUS: the TX engine may read a TX buffer (it took a descriptor and
/// has not finished reading its buffer). After clearing CTRL.TX_ENABLE,
/// the driver waits for this to clear before it frees TX buffers.
pub const STATUS_TX_BUSY: u32 = 1 << 6;
/// STATUS: the RX engine holds a descriptor (it may write its buffer).
pub const STATUS_RX_BUSY: u32 = 1 << 7;

/// CTRL: the TX engine consumes the TX ring.
pub const CTRL_TX_ENABLE: u32 = 1 << 0;
/// CTRL: the RX engine fills the RX ring.
pub const CTRL_RX_ENABLE: u32 = 1 << 1;

/// Interrupt cause: a TX descriptor with `DESC_FLAG_IRQ` completed.
pub const INT_TX: u32 = 1 << 0;
/// Interrupt cause: an RX descriptor with `DESC_FLAG_IRQ` completed.
pub const INT_RX: u32 = 1 << 1;
/// Interrupt cause: an engine halted (see ERROR).
pub const INT_ERROR: u32 = 1 << 2;
/// Every interrupt cause.
pub const INT_ALL: u32 = INT_TX | INT_RX | INT_ERROR;

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

/// Descriptor flag: raise the TX/RX interrupt cause when it completes.
pub const DESC_FLAG_IRQ: u16 = 1 << 0;
/// Every flag the device knows; others fail the descriptor.
pub const DESC_FLAGS_ALL: u16 = DESC_FLAG_IRQ;
