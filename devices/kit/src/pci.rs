//! A device's PCI identity and the config-space parts every p2plab device
//! shares: who it says it is ([`PciIds`], [`ClassCode`]), MSI-X in a BAR
//! of its own ([`MsixBar`]), and a PCIe endpoint capability.

use p2plab_pci::{BarSpec, ConfigSpaceBuilder, LinkSpeed, MsixCapSpec, PcieCapSpec};

/// The vendor ID every p2plab-made device uses (0x5032, "P2"): unassigned
/// in pci.ids, so no in-tree Linux driver claims such a device; only
/// p2plab's guest drivers bind to it.
pub const P2PLAB_VENDOR_ID: u16 = 0x5032;

/// The three bytes of a PCI class code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassCode {
    /// Base class (0x01 storage, 0x02 network, 0x03 display...).
    pub base: u8,
    /// Sub-class.
    pub sub: u8,
    /// Programming interface.
    pub prog_if: u8,
}

impl ClassCode {
    /// Base class, sub-class, programming interface.
    pub const fn new(base: u8, sub: u8, prog_if: u8) -> Self {
        Self { base, sub, prog_if }
    }

    /// As config space holds it in bits 31:8 of dword 2, shifted down.
    pub const fn as_u24(self) -> u32 {
        (self.base as u32) << 16 | (self.sub as u32) << 8 | self.prog_if as u32
    }
}

/// Who the function says it is in config space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciIds {
    /// Vendor ID.
    pub vendor_id: u16,
    /// Device ID.
    pub device_id: u16,
    /// Subsystem vendor ID.
    pub subsystem_vendor_id: u16,
    /// Subsystem ID.
    pub subsystem_id: u16,
    /// Revision ID.
    pub revision: u8,
}

impl PciIds {
    /// `vendor_id:device_id`, the same as subsystem, revision 1.
    pub const fn new(vendor_id: u16, device_id: u16) -> Self {
        Self {
            vendor_id,
            device_id,
            subsystem_vendor_id: vendor_id,
            subsystem_id: device_id,
            revision: 1,
        }
    }

    /// A config space with this identity and `class`, to add BARs and
    /// capabilities to.
    pub fn config_space(&self, class: ClassCode) -> ConfigSpaceBuilder {
        ConfigSpaceBuilder::new(self.vendor_id, self.device_id)
            .subsystem(self.subsystem_vendor_id, self.subsystem_id)
            .class_code(class.base, class.sub, class.prog_if)
            .revision(self.revision)
    }
}

/// MSI-X in a 4 KiB 32-bit memory BAR of its own: the table at offset 0,
/// the Pending Bit Array at 2048 (room for 128 vectors). The PCI layer
/// serves both; the model never sees those accesses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixBar {
    /// The BAR's index.
    pub bar: u8,
    /// How many vectors.
    pub vectors: u16,
}

impl MsixBar {
    /// The BAR's size.
    pub const SIZE: u64 = 4096;
    /// Where the table starts.
    pub const TABLE_OFFSET: u32 = 0;
    /// Where the Pending Bit Array starts.
    pub const PBA_OFFSET: u32 = 2048;

    /// `builder` with this BAR and the MSI-X capability pointing into it.
    pub fn add_to(self, builder: ConfigSpaceBuilder) -> ConfigSpaceBuilder {
        builder
            .bar(usize::from(self.bar), BarSpec::memory32(Self::SIZE))
            .msix(MsixCapSpec {
                vectors: self.vectors,
                table_bar: self.bar,
                table_offset: Self::TABLE_OFFSET,
                pba_bar: self.bar,
                pba_offset: Self::PBA_OFFSET,
            })
    }
}

/// A PCIe endpoint capability with this link, 256-byte max payload.
pub fn pcie_endpoint(link_speed: LinkSpeed, link_width: u8) -> PcieCapSpec {
    PcieCapSpec {
        link_speed,
        link_width,
        max_payload_size: 256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: an identity or MSI-X BAR that config space does not show
    /// where the PCI spec puts it.
    #[test]
    fn identity_and_msix_land_in_config_space() {
        let ids = PciIds {
            subsystem_id: 0x1234,
            revision: 7,
            ..PciIds::new(0x5032, 0x4e49)
        };
        let class = ClassCode {
            base: 0x02,
            sub: 0x00,
            prog_if: 0x01,
        };
        let builder = ids.config_space(class);
        let config = MsixBar { bar: 4, vectors: 3 }
            .add_to(builder)
            .pcie(pcie_endpoint(LinkSpeed::Gen4, 8))
            .build()
            .unwrap();
        assert_eq!(config.read_u32(0).unwrap(), 0x4e49_5032);
        assert_eq!(config.read_u32(8).unwrap(), 0x0200_0107);
        assert_eq!(config.read_u32(0x2c).unwrap(), 0x1234_5032);
        assert_eq!(config.bar_size(4), Some(MsixBar::SIZE));
        let msix = config.msix().unwrap();
        assert_eq!(
            (msix.vectors, msix.table_bar, msix.pba_offset),
            (3, 4, 2048)
        );
        assert_eq!(class.as_u24(), 0x02_00_01);
    }
}
