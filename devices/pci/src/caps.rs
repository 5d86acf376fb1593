//! Descriptions of the capabilities a function advertises. The config space
//! builder lays them out and links them.

use crate::regs::ext_cap_id;

/// Where the MSI-X table and Pending Bit Array live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixCapSpec {
    /// Number of vectors, 1..=2048.
    pub vectors: u16,
    /// BAR index (BIR) holding the table.
    pub table_bar: u8,
    /// Offset of the table in that BAR; 8-byte aligned.
    pub table_offset: u32,
    /// BAR index holding the PBA.
    pub pba_bar: u8,
    /// Offset of the PBA in that BAR; 8-byte aligned.
    pub pba_offset: u32,
}

impl MsixCapSpec {
    /// Bytes the table occupies.
    pub fn table_len(&self) -> u64 {
        u64::from(self.vectors) * crate::regs::msix::ENTRY_SIZE
    }

    /// Bytes the PBA occupies: one bit per vector in whole qwords.
    pub fn pba_len(&self) -> u64 {
        u64::from(self.vectors).div_ceil(64) * 8
    }
}

/// PCI Express link speed, as encoded in the Link Capabilities register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkSpeed {
    /// 2.5 GT/s
    Gen1 = 1,
    /// 5 GT/s
    Gen2 = 2,
    /// 8 GT/s
    Gen3 = 3,
    /// 16 GT/s
    Gen4 = 4,
    /// 32 GT/s
    Gen5 = 5,
}

impl LinkSpeed {
    pub(crate) fn code(self) -> u16 {
        self as u16
    }

    /// Supported Link Speeds Vector of Link Capabilities 2: this speed and
    /// every slower one (bit 1 = 2.5 GT/s).
    pub(crate) fn supported_vector(self) -> u32 {
        let mut vector = 0;
        for code in 1..=self as u32 {
            vector |= 1 << code;
        }
        vector
    }
}

/// The PCI Express capability of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieCapSpec {
    /// Top link speed, reported as both supported and negotiated.
    pub link_speed: LinkSpeed,
    /// Lanes: 1, 2, 4, 8, 12, 16 or 32.
    pub link_width: u8,
    /// Max_Payload_Size supported in bytes: 128..=4096, a power of two.
    pub max_payload_size: u16,
}

impl Default for PcieCapSpec {
    /// A Gen3 x4 endpoint with 256-byte payloads, like a typical NVMe SSD.
    fn default() -> Self {
        Self {
            link_speed: LinkSpeed::Gen3,
            link_width: 4,
            max_payload_size: 256,
        }
    }
}

impl PcieCapSpec {
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        if ![1, 2, 4, 8, 12, 16, 32].contains(&self.link_width) {
            return Err("PCIe link width must be 1, 2, 4, 8, 12, 16 or 32");
        }
        if !self.max_payload_size.is_power_of_two()
            || !(128..=4096).contains(&self.max_payload_size)
        {
            return Err("PCIe max payload size must be a power of two in 128..=4096");
        }
        Ok(())
    }

    /// The DevCap Max_Payload_Size field: 0 = 128 bytes.
    pub(crate) fn mps_code(&self) -> u32 {
        self.max_payload_size.trailing_zeros().saturating_sub(7)
    }
}

/// An arbitrary extended capability (config offset 0x100 and up). The
/// builder writes the header (id, version, next pointer); `body` is what
/// follows the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtCapability {
    /// Extended capability id (PCI-SIG assigned, or 0x000b for a
    /// vendor-specific one).
    pub id: u16,
    /// Capability version, 4 bits.
    pub version: u8,
    /// The bytes after the 4-byte header, as the guest first reads them.
    pub body: Vec<u8>,
    /// Per-byte mask of bits the guest may write; missing bytes are
    /// read-only.
    pub write_mask: Vec<u8>,
    /// Per-byte mask of bits the guest clears by writing 1.
    pub w1c_mask: Vec<u8>,
}

impl ExtCapability {
    /// A capability whose body the guest cannot change.
    pub fn read_only(id: u16, version: u8, body: Vec<u8>) -> Self {
        Self {
            id,
            version,
            body,
            write_mask: Vec::new(),
            w1c_mask: Vec::new(),
        }
    }

    /// Device Serial Number (id 0x0003): a 64-bit IEEE EUI-64 style serial.
    pub fn device_serial_number(serial: u64) -> Self {
        Self::read_only(
            ext_cap_id::DEVICE_SERIAL_NUMBER,
            1,
            serial.to_le_bytes().to_vec(),
        )
    }

    /// Bytes including the 4-byte header.
    pub(crate) fn len(&self) -> usize {
        4 + self.body.len()
    }
}
