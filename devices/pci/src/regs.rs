//! Register offsets and bits of a type-0 PCI/PCIe configuration space, as
//! named in the PCI Local Bus 3.0 and PCI Express Base specifications.

/// Size of a PCI Express (extended) configuration space.
pub const CONFIG_SPACE_SIZE: usize = 4096;
/// End of the legacy (PCI-compatible) part; extended capabilities start here.
pub const LEGACY_CONFIG_SIZE: usize = 256;
/// The first extended capability header always sits here.
pub const EXT_CAP_START: usize = 0x100;

pub const VENDOR_ID: usize = 0x00;
pub const DEVICE_ID: usize = 0x02;
pub const COMMAND: usize = 0x04;
pub const STATUS: usize = 0x06;
pub const REVISION_ID: usize = 0x08;
/// Programming interface, sub-class, base class (three bytes).
pub const CLASS_PROG_IF: usize = 0x09;
pub const CACHE_LINE_SIZE: usize = 0x0c;
pub const LATENCY_TIMER: usize = 0x0d;
pub const HEADER_TYPE: usize = 0x0e;
pub const BIST: usize = 0x0f;
pub const BAR0: usize = 0x10;
pub const CARDBUS_CIS: usize = 0x28;
pub const SUBSYSTEM_VENDOR_ID: usize = 0x2c;
pub const SUBSYSTEM_ID: usize = 0x2e;
pub const EXPANSION_ROM: usize = 0x30;
pub const CAPABILITIES_POINTER: usize = 0x34;
pub const INTERRUPT_LINE: usize = 0x3c;
pub const INTERRUPT_PIN: usize = 0x3d;
pub const MIN_GNT: usize = 0x3e;
pub const MAX_LAT: usize = 0x3f;
/// Standard capabilities may start here (after the type-0 header).
pub const FIRST_CAP_OFFSET: usize = 0x40;

pub const NUM_BARS: usize = 6;

/// COMMAND register bits.
pub mod command {
    pub const IO_SPACE: u16 = 1 << 0;
    pub const MEMORY_SPACE: u16 = 1 << 1;
    pub const BUS_MASTER: u16 = 1 << 2;
    pub const PARITY_ERROR_RESPONSE: u16 = 1 << 6;
    pub const SERR_ENABLE: u16 = 1 << 8;
    pub const INTX_DISABLE: u16 = 1 << 10;
}

/// STATUS register bits.
pub mod status {
    pub const INTERRUPT_STATUS: u16 = 1 << 3;
    pub const CAP_LIST: u16 = 1 << 4;
    pub const MASTER_DATA_PARITY_ERROR: u16 = 1 << 8;
    pub const SIGNALED_TARGET_ABORT: u16 = 1 << 11;
    pub const RECEIVED_TARGET_ABORT: u16 = 1 << 12;
    pub const RECEIVED_MASTER_ABORT: u16 = 1 << 13;
    pub const SIGNALED_SYSTEM_ERROR: u16 = 1 << 14;
    pub const DETECTED_PARITY_ERROR: u16 = 1 << 15;
    /// The error bits software clears by writing 1.
    pub const W1C: u16 = MASTER_DATA_PARITY_ERROR
        | SIGNALED_TARGET_ABORT
        | RECEIVED_TARGET_ABORT
        | RECEIVED_MASTER_ABORT
        | SIGNALED_SYSTEM_ERROR
        | DETECTED_PARITY_ERROR;
}

/// Low bits of a BAR register.
pub mod bar {
    pub const IO_SPACE: u32 = 1 << 0;
    pub const MEM_TYPE_64: u32 = 0b10 << 1;
    pub const MEM_PREFETCHABLE: u32 = 1 << 3;
    pub const MEM_FLAGS_MASK: u32 = 0xf;
    pub const IO_FLAGS_MASK: u32 = 0x3;
}

/// Standard capability ids.
pub mod cap_id {
    pub const POWER_MANAGEMENT: u8 = 0x01;
    pub const MSI: u8 = 0x05;
    pub const PCI_EXPRESS: u8 = 0x10;
    pub const MSIX: u8 = 0x11;
}

/// Extended capability ids.
pub mod ext_cap_id {
    pub const DEVICE_SERIAL_NUMBER: u16 = 0x0003;
    pub const RESIZABLE_BAR: u16 = 0x0015;
}

/// Power Management capability layout.
pub mod pm {
    pub const LEN: usize = 8;
    /// Power Management Capabilities (PMC), 16 bits.
    pub const PMC: usize = 2;
    /// Power Management Control/Status (PMCSR), 16 bits.
    pub const PMCSR: usize = 4;
    /// PMC version field: 3 = PCI PM 1.2.
    pub const PMC_VERSION_1_2: u16 = 3;
    pub const PMCSR_STATE_MASK: u16 = 0x3;
    /// No_Soft_Reset: D3hot -> D0 keeps the function's state, so the guest
    /// need not restore config space after a D3 round trip.
    pub const PMCSR_NO_SOFT_RESET: u16 = 1 << 3;
}

/// MSI-X capability layout.
pub mod msix {
    pub const LEN: usize = 12;
    pub const CONTROL: usize = 2;
    pub const TABLE: usize = 4;
    pub const PBA: usize = 8;
    pub const CONTROL_TABLE_SIZE_MASK: u16 = 0x07ff;
    pub const CONTROL_FUNCTION_MASK: u16 = 1 << 14;
    pub const CONTROL_ENABLE: u16 = 1 << 15;
    pub const BIR_MASK: u32 = 0x7;
    pub const MAX_VECTORS: u16 = 2048;
    /// Bytes per table entry: address low, address high, data, vector control.
    pub const ENTRY_SIZE: u64 = 16;
    pub const ENTRY_VECTOR_CONTROL: u64 = 12;
    pub const VECTOR_CONTROL_MASK_BIT: u32 = 1;
}

/// PCI Express capability layout (version 2, 0x3c bytes).
pub mod pcie {
    pub const LEN: usize = 0x3c;
    pub const CAPS: usize = 0x02;
    pub const DEVCAP: usize = 0x04;
    pub const DEVCTL: usize = 0x08;
    pub const DEVSTA: usize = 0x0a;
    pub const LNKCAP: usize = 0x0c;
    pub const LNKCTL: usize = 0x10;
    pub const LNKSTA: usize = 0x12;
    pub const DEVCAP2: usize = 0x24;
    pub const DEVCTL2: usize = 0x28;
    pub const DEVSTA2: usize = 0x2a;
    pub const LNKCAP2: usize = 0x2c;
    pub const LNKCTL2: usize = 0x30;
    pub const LNKSTA2: usize = 0x32;

    pub const CAPS_VERSION_2: u16 = 2;
    pub const CAPS_TYPE_ENDPOINT: u16 = 0 << 4;

    pub const DEVCAP_EXT_TAG: u32 = 1 << 5;
    /// Endpoint L0s/L1 acceptable latency: "no limit".
    pub const DEVCAP_L0S_NO_LIMIT: u32 = 0b111 << 6;
    pub const DEVCAP_L1_NO_LIMIT: u32 = 0b111 << 9;
    pub const DEVCAP_ROLE_BASED_ERR: u32 = 1 << 15;

    pub const DEVCTL_RELAXED_ORDERING: u16 = 1 << 4;
    pub const DEVCTL_NO_SNOOP: u16 = 1 << 11;
    pub const DEVCTL_MRRS_512: u16 = 2 << 12;
    /// Error reporting enables, relaxed ordering, MPS, extended tag, phantom
    /// functions, aux power, no snoop, MRRS. Bit 15 (initiate FLR) stays
    /// read-only zero: the function does not advertise FLR.
    pub const DEVCTL_WRITABLE: u16 = 0x7fff;
    /// Correctable/non-fatal/fatal/unsupported request detected.
    pub const DEVSTA_W1C: u16 = 0x000f;

    pub const LNKCAP_ASPM_OPT_COMPLIANCE: u32 = 1 << 22;
    /// ASPM control, RCB, common clock, extended synch, HW autonomous width
    /// disable. Link disable/retrain are reserved for endpoints.
    pub const LNKCTL_WRITABLE: u16 = 0x0003 | 0x0008 | 0x0040 | 0x0080 | 0x0200;
    pub const LNKSTA_SLOT_CLOCK: u16 = 1 << 12;

    /// Completion timeout disable supported.
    pub const DEVCAP2_CTD_SUPPORTED: u32 = 1 << 4;
    /// Completion timeout disable.
    pub const DEVCTL2_WRITABLE: u16 = 1 << 4;
    /// Target link speed, enter compliance, HW autonomous speed disable.
    pub const LNKCTL2_WRITABLE: u16 = 0x003f;
    /// Equalization complete and phases 1-3 successful (8 GT/s and up).
    pub const LNKSTA2_EQ_COMPLETE: u16 = 0x001e;
}

/// Resizable BAR extended capability layout.
pub mod rebar {
    /// Per-BAR entry: capability register then control register.
    pub const ENTRY_LEN: usize = 8;
    pub const CAP: usize = 4;
    pub const CTRL: usize = 8;
    pub const CTRL_BAR_INDEX_MASK: u32 = 0x7;
    pub const CTRL_NUM_BARS_SHIFT: u32 = 5;
    pub const CTRL_SIZE_SHIFT: u32 = 8;
    pub const CTRL_SIZE_MASK: u32 = 0x3f << CTRL_SIZE_SHIFT;
    /// Bit `n + 4` of the capability register means 2^(n+20) bytes.
    pub const CAP_SIZES_SHIFT: u32 = 4;
    pub const MIN_SIZE_LOG2: u32 = 20;
    /// The capability register covers 1 MiB .. 128 TiB.
    pub const MAX_SIZE_LOG2: u32 = 47;
}
