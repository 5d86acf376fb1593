//! The PCI identity flags every device server takes (`--vendor-id`,
//! `--device-id`, `--subsystem-vendor-id`, `--subsystem-id`), over the
//! device's own identity.

use clap::Args;
use p2plab_kit::PciIds;

/// PCI identity flags. Flatten into a binary's `Args` with
/// `#[command(flatten)] ids: PciIdArgs`; [`ids`](Self::ids) applies them
/// over the device's own identity.
#[derive(Debug, Clone, Default, Args)]
pub struct PciIdArgs {
    /// PCI vendor ID (hex); defaults to the device's own.
    #[arg(long, value_name = "ID", value_parser = parse_pci_id)]
    pub vendor_id: Option<u16>,
    /// PCI device ID (hex); defaults to the device's own.
    #[arg(long, value_name = "ID", value_parser = parse_pci_id)]
    pub device_id: Option<u16>,
    /// PCI subsystem vendor ID (hex); defaults to the vendor ID.
    #[arg(long, value_name = "ID", value_parser = parse_pci_id)]
    pub subsystem_vendor_id: Option<u16>,
    /// PCI subsystem ID (hex); defaults to the device ID.
    #[arg(long, value_name = "ID", value_parser = parse_pci_id)]
    pub subsystem_id: Option<u16>,
}

impl PciIdArgs {
    /// `device`'s identity with the flags given applied.
    pub fn ids(&self, device: PciIds) -> PciIds {
        let vendor_id = self.vendor_id.unwrap_or(device.vendor_id);
        let device_id = self.device_id.unwrap_or(device.device_id);
        PciIds {
            vendor_id,
            device_id,
            subsystem_vendor_id: self.subsystem_vendor_id.unwrap_or(vendor_id),
            subsystem_id: self.subsystem_id.unwrap_or(device_id),
            revision: device.revision,
        }
    }
}

/// A 16-bit PCI ID, hex with or without `0x` (`5032`, `0x5032`).
pub fn parse_pci_id(text: &str) -> Result<u16, String> {
    let t = text.trim();
    let hex = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if hex.is_empty() || hex.len() > 4 {
        return Err(format!("'{text}' is not a 16-bit hex ID"));
    }
    let id =
        u16::from_str_radix(hex, 16).map_err(|_| format!("'{text}' is not a 16-bit hex ID"))?;
    if id == 0xffff {
        return Err("0xffff means 'no device' on PCI".into());
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        ids: PciIdArgs,
    }

    /// Catches: a bad ID accepted (0xffff is "no device"), or a hex
    /// spelling refused.
    #[test]
    fn pci_ids_parse_as_hex() {
        assert_eq!(parse_pci_id("5032"), Ok(0x5032));
        assert_eq!(parse_pci_id("0x4750"), Ok(0x4750));
        assert_eq!(parse_pci_id("0X1b36"), Ok(0x1b36));
        assert!(parse_pci_id("0xffff").is_err());
        assert!(parse_pci_id("12345").is_err());
        assert!(parse_pci_id("0x").is_err());
        assert!(parse_pci_id("zz").is_err());
    }

    /// Catches: flags that do not override the device's identity, or a
    /// subsystem that does not follow an overridden vendor/device ID.
    #[test]
    fn flags_apply_over_the_device_identity() {
        let device = PciIds::new(0x5032, 0x4e49);
        let none = Flags::try_parse_from(["dev"]).unwrap();
        assert_eq!(none.ids.ids(device), device);
        let some = Flags::try_parse_from(["dev", "--device-id", "0x1234"]).unwrap();
        let ids = some.ids.ids(device);
        assert_eq!((ids.device_id, ids.subsystem_id), (0x1234, 0x1234));
        assert_eq!((ids.vendor_id, ids.subsystem_vendor_id), (0x5032, 0x5032));
        let sub = Flags::try_parse_from(["dev", "--subsystem-id", "7"]).unwrap();
        assert_eq!(sub.ids.ids(device).subsystem_id, 7);
        assert!(Flags::try_parse_from(["dev", "--vendor-id", "0xffff"]).is_err());
    }
}
