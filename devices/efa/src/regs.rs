//! The PCI function the upstream `efa` driver binds to: identity, BAR
//! layout, and BAR0's register map and bits.
//!
//! Names follow the driver's `efa_regs_defs.h` after `EFA_REGS_` (and
//! without the `_OFF`/`_MASK` suffixes), so a register found in a trace or
//! in `p2plab-ctl status` is the one the driver's source names.
//!
//! BARs (the driver needs BAR0 and BAR2 to be memory BARs; the doorbell BAR
//! is the one `DEVICE_ATTR.db_bar` names):
//!
//! | BAR | what | how the guest reaches it |
//! |---|---|---|
//! | 0 | registers, 4 KiB | trapped |
//! | 1 | MSI-X table and PBA | served by the PCI layer |
//! | 2 | LLQ memory: every QP's send-queue ring, 64 KiB per QP | mmapped shared memory (a memfd): descriptor stores never trap |
//! | 4 | doorbells: one 4 KiB page per UAR | trapped |

pub use p2plab_kit::{ClassCode, MsixBar, PciIds};

/// Amazon's PCI vendor ID.
pub const AMAZON_VENDOR_ID: u16 = 0x1d0f;
/// The EFA device ID the lab uses. perftest 25.01 recognises an EFA only
/// by 0xefa0..=0xefa3 (and then uses the verbs its SRD tests need); the
/// upstream driver binds 0xefa0..=0xefa4.
pub const EFA_DEVICE_ID: u16 = 0xefa1;
/// The identity without flags: 1d0f:efa1, subsystem the same (the
/// subsystem device ID is what `ibv_devinfo` shows as `hw_ver`).
pub const DEFAULT_IDS: PciIds = PciIds::new(AMAZON_VENDOR_ID, EFA_DEVICE_ID);
/// Network controller, Ethernet, as real EFA functions report.
pub const CLASS_CODE: ClassCode = ClassCode::new(0x02, 0x00, 0x00);

/// BAR0: the registers, trapped.
pub const REGS_BAR: u8 = 0;
/// BAR0's size.
pub const REGS_BAR_SIZE: u64 = 4096;
/// BAR2: LLQ memory (the driver's `EFA_MEM_BAR`), shared with QEMU.
pub const LLQ_BAR: u8 = 2;
/// BAR4: the doorbell pages (`DEVICE_ATTR.db_bar`), trapped.
pub const DB_BAR: u8 = 4;
/// Bytes of one doorbell page; one per UAR.
pub const DB_PAGE_SIZE: u64 = 4096;
/// The management vector: admin completions and AENQ events.
pub const MGMNT_VECTOR: u16 = 0;

/// Admin API version the device reports in VERSION: 0.1, which means
/// 64-byte admin SQ entries and no CRC in completions.
pub const ADMIN_API_VERSION: u32 = 0x0001;
/// CONTROLLER_VERSION: 0.0.1, implementation 0x50 ("P").
pub const CONTROLLER_VERSION: u32 = 0x5000_0001;
/// Reset polls the driver may make (100 ms each) before giving up.
pub const RESET_TIMEOUT_POLLS: u32 = 10;
/// DMA address width the device handles.
pub const DMA_ADDR_WIDTH: u32 = 48;

/// CAPS bits 5:1: reset timeout in 100 ms units.
pub const CAPS_RESET_TIMEOUT_SHIFT: u32 = 1;
/// CAPS bits 15:8: DMA address width.
pub const CAPS_DMA_ADDR_WIDTH_SHIFT: u32 = 8;
/// CAPS bits 19:16: admin command timeout in 100 ms units (0: the
/// driver's 30 s default).
pub const CAPS_ADMIN_CMD_TO_SHIFT: u32 = 16;

/// What CAPS reads.
pub const CAPS: u32 =
    RESET_TIMEOUT_POLLS << CAPS_RESET_TIMEOUT_SHIFT | DMA_ADDR_WIDTH << CAPS_DMA_ADDR_WIDTH_SHIFT;

/// AQ_CAPS / ACQ_CAPS / AENQ_CAPS bits 15:0: queue depth in entries.
pub const QUEUE_CAPS_DEPTH_MASK: u32 = 0xffff;
/// AQ_CAPS bits 31:16: SQ entry size in bytes.
pub const AQ_CAPS_ENTRY_SIZE_SHIFT: u32 = 16;
/// ACQ_CAPS / AENQ_CAPS bits 23:16: entry size in bytes.
pub const CQ_CAPS_ENTRY_SIZE_SHIFT: u32 = 16;
/// ACQ_CAPS / AENQ_CAPS bits 31:24: the MSI-X vector.
pub const CQ_CAPS_VECTOR_SHIFT: u32 = 24;
/// DEV_CTL bits 31:28: why the driver resets the device.
pub const DEV_CTL_RESET_REASON_SHIFT: u32 = 28;
/// MMIO_REG_READ bits 15:0: the request ID the response must carry.
pub const MMIO_REG_READ_REQ_ID_MASK: u32 = 0xffff;
/// MMIO_REG_READ bits 31:16: the register to read.
pub const MMIO_REG_READ_REG_OFF_SHIFT: u32 = 16;
/// EQ_DB bits 15:0: the event queue.
pub const EQ_DB_EQN_MASK: u32 = 0xffff;
/// EQ_DB bit 31: arm it.
pub const EQ_DB_ARM: u32 = 1 << 31;

p2plab_kit::registers! {
    /// A BAR0 register, named as in `efa_regs_defs.h` after `EFA_REGS_`.
    pub enum Reg, offsets in reg {
        /// Admin API version, [`ADMIN_API_VERSION`].
        Version(VERSION) = 0x00, Bits32, ReadOnly;
        /// [`CONTROLLER_VERSION`].
        ControllerVersion(CONTROLLER_VERSION) = 0x04, Bits32, ReadOnly;
        /// [`CAPS`]: reset timeout, DMA width, admin timeout.
        Caps(CAPS) = 0x08, Bits32, ReadOnly;
        /// Admin SQ base, low dword.
        AqBaseLo(AQ_BASE_LO) = 0x10, Bits32, ReadWrite;
        /// Admin SQ base, high dword.
        AqBaseHi(AQ_BASE_HI) = 0x14, Bits32, ReadWrite;
        /// Admin SQ depth (15:0) and entry size (31:16).
        AqCaps(AQ_CAPS) = 0x18, Bits32, ReadWrite;
        /// Admin CQ base, low dword.
        AcqBaseLo(ACQ_BASE_LO) = 0x20, Bits32, ReadWrite;
        /// Admin CQ base, high dword.
        AcqBaseHi(ACQ_BASE_HI) = 0x24, Bits32, ReadWrite;
        /// Admin CQ depth, entry size, MSI-X vector.
        AcqCaps(ACQ_CAPS) = 0x28, Bits32, ReadWrite;
        /// The admin SQ producer count: processes entries up to it.
        AqProdDb(AQ_PROD_DB) = 0x2c, Bits32, WriteOnly;
        /// AENQ depth, entry size, MSI-X vector.
        AenqCaps(AENQ_CAPS) = 0x34, Bits32, ReadWrite;
        /// AENQ base, low dword.
        AenqBaseLo(AENQ_BASE_LO) = 0x38, Bits32, ReadWrite;
        /// AENQ base, high dword.
        AenqBaseHi(AENQ_BASE_HI) = 0x3c, Bits32, ReadWrite;
        /// AENQ entries the driver consumed so far.
        AenqConsDb(AENQ_CONS_DB) = 0x40, Bits32, ReadWrite;
        /// [`IntrMask`]: management interrupts masked (admin polling).
        IntrMask(INTR_MASK) = 0x4c, Bits32, ReadWrite;
        /// [`DevCtl`]: the reset handshake.
        DevCtl(DEV_CTL) = 0x54, Bits32, ReadWrite;
        /// [`DevSts`].
        DevSts(DEV_STS) = 0x58, Bits32, ReadOnly;
        /// A readless register read request: offset (31:16), ID (15:0).
        MmioRegRead(MMIO_REG_READ) = 0x5c, Bits32, WriteOnly;
        /// Where readless responses go, low dword.
        MmioRespLo(MMIO_RESP_LO) = 0x60, Bits32, ReadWrite;
        /// Where readless responses go, high dword.
        MmioRespHi(MMIO_RESP_HI) = 0x64, Bits32, ReadWrite;
        /// Arms an event queue: EQN (15:0), arm (31).
        EqDb(EQ_DB) = 0x68, Bits32, WriteOnly;
    }
}

p2plab_kit::bit_flags! {
    /// DEV_STS (`EFA_REGS_DEV_STS_*_MASK`).
    pub struct DevSts(u32), prefix "DEV_STS_" {
        /// Always set: the device takes commands.
        READY = 1 << 0;
        /// Never set (the admin-queue restart is not used by the driver).
        AQ_RESTART_IN_PROGRESS = 1 << 1;
        /// Never set.
        AQ_RESTART_FINISHED = 1 << 2;
        /// Set from the reset write until the reset has ended (the driver
        /// cleared DEV_CTL.DEV_RESET and the device's DMA has quiesced).
        RESET_IN_PROGRESS = 1 << 3;
        /// Set once a reset has ended.
        RESET_FINISHED = 1 << 4;
        /// Never set.
        FATAL_ERROR = 1 << 5;
    }
}

p2plab_kit::bit_flags! {
    /// DEV_CTL (`EFA_REGS_DEV_CTL_*_MASK`); bits 31:28 are the reason.
    pub struct DevCtl(u32), prefix "DEV_CTL_" {
        /// Begins a reset while set; clearing it ends the reset.
        DEV_RESET = 1 << 0;
        /// Ignored (unused by the driver).
        AQ_RESTART = 1 << 1;
    }
}

p2plab_kit::bit_flags! {
    /// INTR_MASK (`EFA_REGS_INTR_MASK_*_MASK`).
    pub struct IntrMask(u32), prefix "INTR_MASK_" {
        /// Management interrupts masked: the driver polls the admin CQ.
        EN = 1 << 0;
    }
}

/// Reset reasons the driver writes in DEV_CTL (`enum
/// efa_regs_reset_reason_types`), for logs and traces.
pub fn reset_reason_name(reason: u32) -> &'static str {
    match reason {
        0 => "NORMAL",
        1 => "KEEP_ALIVE_TO",
        2 => "ADMIN_TO",
        3 => "INIT_ERR",
        4 => "DRIVER_INVALID_STATE",
        5 => "OS_TRIGGER",
        6 => "SHUTDOWN",
        7 => "USER_TRIGGER",
        8 => "GENERIC",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: register offsets drifting from `efa_regs_defs.h` (the
    /// driver writes them by these numbers).
    #[test]
    fn offsets_are_the_drivers() {
        let expected = [
            ("VERSION", 0x0),
            ("CONTROLLER_VERSION", 0x4),
            ("CAPS", 0x8),
            ("AQ_BASE_LO", 0x10),
            ("AQ_BASE_HI", 0x14),
            ("AQ_CAPS", 0x18),
            ("ACQ_BASE_LO", 0x20),
            ("ACQ_BASE_HI", 0x24),
            ("ACQ_CAPS", 0x28),
            ("AQ_PROD_DB", 0x2c),
            ("AENQ_CAPS", 0x34),
            ("AENQ_BASE_LO", 0x38),
            ("AENQ_BASE_HI", 0x3c),
            ("AENQ_CONS_DB", 0x40),
            ("INTR_MASK", 0x4c),
            ("DEV_CTL", 0x54),
            ("DEV_STS", 0x58),
            ("MMIO_REG_READ", 0x5c),
            ("MMIO_RESP_LO", 0x60),
            ("MMIO_RESP_HI", 0x64),
            ("EQ_DB", 0x68),
        ];
        let table: Vec<(&str, u64)> = Reg::ALL.iter().map(|r| (r.name(), r.offset())).collect();
        assert_eq!(table, expected);
    }

    /// Catches: CAPS values the driver refuses (a zero reset timeout, a
    /// DMA width outside 32..=64).
    #[test]
    fn caps_carry_what_the_driver_checks() {
        assert_eq!(
            (CAPS >> CAPS_RESET_TIMEOUT_SHIFT) & 0x1f,
            RESET_TIMEOUT_POLLS
        );
        assert_eq!((CAPS >> CAPS_DMA_ADDR_WIDTH_SHIFT) & 0xff, 48);
        assert_eq!((CAPS >> CAPS_ADMIN_CMD_TO_SHIFT) & 0xf, 0);
        assert_eq!(CAPS, 0x3014);
    }
}
