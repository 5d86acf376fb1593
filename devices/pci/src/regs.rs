//! Register offsets and bits of a type-0 PCI/PCIe configuration space, as
//! named in the PCI Local Bus 3.0 and PCI Express Base specifications.

/// Size of a PCI Express (extended) configuration space.
pub const CONFIG_SPACE_SIZE: usize = 4096;
/// End of the legacy (PCI-compatible) part; extended capabilities start here.
pub const LEGACY_CONFIG_SIZE: usize = 256;
/// The first extended capability header always sits here.
pub const EXT_CAP_START: usize = 0x100;

/// Vendor ID, 16 bits (0xffff would mean "no function here").
pub const VENDOR_ID: usize = 0x00;
/// Device ID, 16 bits.
pub const DEVICE_ID: usize = 0x02;
/// Command register, 16 bits: decode enables, bus mastering, INTx disable.
pub const COMMAND: usize = 0x04;
/// Status register, 16 bits: capability list flag and error bits.
pub const STATUS: usize = 0x06;
/// Revision ID, 8 bits.
pub const REVISION_ID: usize = 0x08;
/// Programming interface, sub-class, base class (three bytes).
pub const CLASS_PROG_IF: usize = 0x09;
/// Cache Line Size, 8 bits; read/write, no effect on PCIe.
pub const CACHE_LINE_SIZE: usize = 0x0c;
/// Latency Timer, 8 bits; hardwired to 0 on PCIe.
pub const LATENCY_TIMER: usize = 0x0d;
/// Header Type, 8 bits; 0 = type-0 endpoint, single function.
pub const HEADER_TYPE: usize = 0x0e;
/// Built-in self test, 8 bits; 0 = not supported.
pub const BIST: usize = 0x0f;
/// The first of the six 32-bit Base Address Registers (BAR n at 0x10 + 4n).
pub const BAR0: usize = 0x10;
/// CardBus CIS pointer, unused.
pub const CARDBUS_CIS: usize = 0x28;
/// Subsystem Vendor ID, 16 bits.
pub const SUBSYSTEM_VENDOR_ID: usize = 0x2c;
/// Subsystem ID, 16 bits.
pub const SUBSYSTEM_ID: usize = 0x2e;
/// Expansion ROM base address; no ROM here, so it reads 0.
pub const EXPANSION_ROM: usize = 0x30;
/// Offset of the first standard capability, 8 bits.
pub const CAPABILITIES_POINTER: usize = 0x34;
/// Interrupt Line, 8 bits: scratch for the guest's IRQ routing.
pub const INTERRUPT_LINE: usize = 0x3c;
/// Interrupt Pin, 8 bits: 0 = none, 1..=4 = INTA#..INTD#.
pub const INTERRUPT_PIN: usize = 0x3d;
/// Min_Gnt, unused on PCIe.
pub const MIN_GNT: usize = 0x3e;
/// Max_Lat, unused on PCIe.
pub const MAX_LAT: usize = 0x3f;
/// Standard capabilities may start here (after the type-0 header).
pub const FIRST_CAP_OFFSET: usize = 0x40;

/// BAR registers in a type-0 header (a 64-bit BAR takes two).
pub const NUM_BARS: usize = 6;

/// COMMAND register bits.
pub mod command {
    /// I/O Space Enable: I/O BARs decode.
    pub const IO_SPACE: u16 = 1 << 0;
    /// Memory Space Enable: memory BARs decode.
    pub const MEMORY_SPACE: u16 = 1 << 1;
    /// Bus Master Enable: the function may issue DMA.
    pub const BUS_MASTER: u16 = 1 << 2;
    /// Parity Error Response.
    pub const PARITY_ERROR_RESPONSE: u16 = 1 << 6;
    /// SERR# Enable.
    pub const SERR_ENABLE: u16 = 1 << 8;
    /// Interrupt Disable: INTx may not be asserted.
    pub const INTX_DISABLE: u16 = 1 << 10;
}

/// STATUS register bits.
pub mod status {
    /// Interrupt Status: INTx is asserted.
    pub const INTERRUPT_STATUS: u16 = 1 << 3;
    /// Capabilities List: the capability pointer at 0x34 is valid.
    pub const CAP_LIST: u16 = 1 << 4;
    /// Master Data Parity Error.
    pub const MASTER_DATA_PARITY_ERROR: u16 = 1 << 8;
    /// Signaled Target Abort: the function completed a request with an abort.
    pub const SIGNALED_TARGET_ABORT: u16 = 1 << 11;
    /// Received Target Abort: a DMA of the function was aborted.
    pub const RECEIVED_TARGET_ABORT: u16 = 1 << 12;
    /// Received Master Abort: a DMA of the function got an Unsupported
    /// Request (e.g. to an unmapped address).
    pub const RECEIVED_MASTER_ABORT: u16 = 1 << 13;
    /// Signaled System Error.
    pub const SIGNALED_SYSTEM_ERROR: u16 = 1 << 14;
    /// Detected Parity Error.
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
    /// Bit 0 set: an I/O BAR (else memory).
    pub const IO_SPACE: u32 = 1 << 0;
    /// Memory BAR type field (bits 2:1) = 0b10: 64-bit, the next BAR
    /// register holds the high dword.
    pub const MEM_TYPE_64: u32 = 0b10 << 1;
    /// Prefetchable memory: reads have no side effects.
    pub const MEM_PREFETCHABLE: u32 = 1 << 3;
    /// The read-only flag bits of a memory BAR.
    pub const MEM_FLAGS_MASK: u32 = 0xf;
    /// The read-only flag bits of an I/O BAR.
    pub const IO_FLAGS_MASK: u32 = 0x3;
}

/// Standard capability ids.
pub mod cap_id {
    /// PCI Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x01;
    /// MSI (not offered by these functions; listed for lookups).
    pub const MSI: u8 = 0x05;
    /// PCI Express.
    pub const PCI_EXPRESS: u8 = 0x10;
    /// MSI-X.
    pub const MSIX: u8 = 0x11;
}

/// Extended capability ids.
pub mod ext_cap_id {
    /// Device Serial Number.
    pub const DEVICE_SERIAL_NUMBER: u16 = 0x0003;
    /// Resizable BAR.
    pub const RESIZABLE_BAR: u16 = 0x0015;
}

/// Power Management capability layout.
pub mod pm {
    /// Bytes the capability takes.
    pub const LEN: usize = 8;
    /// Power Management Capabilities (PMC), 16 bits.
    pub const PMC: usize = 2;
    /// Power Management Control/Status (PMCSR), 16 bits.
    pub const PMCSR: usize = 4;
    /// PMC version field: 3 = PCI PM 1.2.
    pub const PMC_VERSION_1_2: u16 = 3;
    /// PMCSR PowerState field: 0 = D0 .. 3 = D3hot.
    pub const PMCSR_STATE_MASK: u16 = 0x3;
    /// No_Soft_Reset: D3hot -> D0 keeps the function's state, so the guest
    /// need not restore config space after a D3 round trip.
    pub const PMCSR_NO_SOFT_RESET: u16 = 1 << 3;
}

/// MSI-X capability layout.
pub mod msix {
    /// Bytes the capability takes.
    pub const LEN: usize = 12;
    /// Message Control, 16 bits.
    pub const CONTROL: usize = 2;
    /// Table Offset/BIR, 32 bits: BAR index in bits 2:0, offset above.
    pub const TABLE: usize = 4;
    /// PBA Offset/BIR, 32 bits, laid out like the table's.
    pub const PBA: usize = 8;
    /// Message Control Table Size field: vectors - 1.
    pub const CONTROL_TABLE_SIZE_MASK: u16 = 0x07ff;
    /// Message Control Function Mask.
    pub const CONTROL_FUNCTION_MASK: u16 = 1 << 14;
    /// Message Control MSI-X Enable.
    pub const CONTROL_ENABLE: u16 = 1 << 15;
    /// The BAR Indicator (BIR) bits of Table/PBA Offset; an offset must
    /// leave them clear (8-byte alignment).
    pub const BIR_MASK: u32 = 0x7;
    /// Most vectors one function can have.
    pub const MAX_VECTORS: u16 = 2048;
    /// Bytes per table entry: address low, address high, data, vector control.
    pub const ENTRY_SIZE: u64 = 16;
    /// Offset of Vector Control inside an entry.
    pub const ENTRY_VECTOR_CONTROL: u64 = 12;
    /// Vector Control Mask Bit: the vector is masked.
    pub const VECTOR_CONTROL_MASK_BIT: u32 = 1;
}

/// PCI Express capability layout (version 2, 0x3c bytes). Register names
/// as in the PCIe Base spec's "PCI Express Capability Structure".
pub mod pcie {
    /// Bytes the capability takes (version 2, up to Link Status 2).
    pub const LEN: usize = 0x3c;
    /// PCI Express Capabilities register, 16 bits: version, port type.
    pub const CAPS: usize = 0x02;
    /// Device Capabilities, 32 bits.
    pub const DEVCAP: usize = 0x04;
    /// Device Control, 16 bits.
    pub const DEVCTL: usize = 0x08;
    /// Device Status, 16 bits.
    pub const DEVSTA: usize = 0x0a;
    /// Link Capabilities, 32 bits: max speed and width.
    pub const LNKCAP: usize = 0x0c;
    /// Link Control, 16 bits.
    pub const LNKCTL: usize = 0x10;
    /// Link Status, 16 bits: negotiated speed and width.
    pub const LNKSTA: usize = 0x12;
    /// Device Capabilities 2, 32 bits.
    pub const DEVCAP2: usize = 0x24;
    /// Device Control 2, 16 bits.
    pub const DEVCTL2: usize = 0x28;
    /// Device Status 2, 16 bits.
    pub const DEVSTA2: usize = 0x2a;
    /// Link Capabilities 2, 32 bits: supported speeds vector.
    pub const LNKCAP2: usize = 0x2c;
    /// Link Control 2, 16 bits: target link speed.
    pub const LNKCTL2: usize = 0x30;
    /// Link Status 2, 16 bits: equalization results.
    pub const LNKSTA2: usize = 0x32;

    /// Capability version 2 (the layout above).
    pub const CAPS_VERSION_2: u16 = 2;
    /// Device/port type 0: PCI Express Endpoint.
    pub const CAPS_TYPE_ENDPOINT: u16 = 0 << 4;

    /// Extended Tag Field Supported (8-bit tags).
    pub const DEVCAP_EXT_TAG: u32 = 1 << 5;
    /// Endpoint L0s Acceptable Latency: "no limit".
    pub const DEVCAP_L0S_NO_LIMIT: u32 = 0b111 << 6;
    /// Endpoint L1 Acceptable Latency: "no limit".
    pub const DEVCAP_L1_NO_LIMIT: u32 = 0b111 << 9;
    /// Role-Based Error Reporting (required of PCIe 1.1+ functions).
    pub const DEVCAP_ROLE_BASED_ERR: u32 = 1 << 15;

    /// Enable Relaxed Ordering (on at reset, as the spec says).
    pub const DEVCTL_RELAXED_ORDERING: u16 = 1 << 4;
    /// Enable No Snoop (on at reset).
    pub const DEVCTL_NO_SNOOP: u16 = 1 << 11;
    /// Max_Read_Request_Size = 512 bytes, the reset value.
    pub const DEVCTL_MRRS_512: u16 = 2 << 12;
    /// Error reporting enables, relaxed ordering, MPS, extended tag, phantom
    /// functions, aux power, no snoop, MRRS. Bit 15 (initiate FLR) stays
    /// read-only zero: the function does not advertise FLR.
    pub const DEVCTL_WRITABLE: u16 = 0x7fff;
    /// Correctable/non-fatal/fatal/unsupported request detected.
    pub const DEVSTA_W1C: u16 = 0x000f;

    /// ASPM Optionality Compliance (required since PCIe 3.0).
    pub const LNKCAP_ASPM_OPT_COMPLIANCE: u32 = 1 << 22;
    /// ASPM control, RCB, common clock, extended synch, HW autonomous width
    /// disable. Link disable/retrain are reserved for endpoints.
    pub const LNKCTL_WRITABLE: u16 = 0x0003 | 0x0008 | 0x0040 | 0x0080 | 0x0200;
    /// Slot Clock Configuration: uses the slot's reference clock.
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
    /// First entry's Resizable BAR Capability register (sizes supported).
    pub const CAP: usize = 4;
    /// First entry's Resizable BAR Control register.
    pub const CTRL: usize = 8;
    /// Control: which BAR the entry describes.
    pub const CTRL_BAR_INDEX_MASK: u32 = 0x7;
    /// Control (first entry only): how many resizable BARs follow.
    pub const CTRL_NUM_BARS_SHIFT: u32 = 5;
    /// Control: BAR Size field, log2(size) - 20.
    pub const CTRL_SIZE_SHIFT: u32 = 8;
    /// Control: the BAR Size field.
    pub const CTRL_SIZE_MASK: u32 = 0x3f << CTRL_SIZE_SHIFT;
    /// Bit `n + 4` of the capability register means 2^(n+20) bytes.
    pub const CAP_SIZES_SHIFT: u32 = 4;
    /// log2 of the smallest size the capability can describe (1 MiB).
    pub const MIN_SIZE_LOG2: u32 = 20;
    /// The capability register covers 1 MiB .. 128 TiB.
    pub const MAX_SIZE_LOG2: u32 = 47;
}
