//! Controller configuration, its validation, and the BAR layout it implies.

/// Most I/O queue pairs a controller may be configured with.
pub const MAX_IO_QUEUES: u16 = 256;
/// CMB sizes and placement are multiples of 2 MiB: Linux ignores a CMB
/// whose bus address or size is not 2 MiB aligned.
pub const CMB_ALIGN: u64 = 2 << 20;
/// Largest CMB accepted (CMBSZ.SZ counts 1 MiB units in 20 bits).
pub const MAX_CMB_SIZE: u64 = 64 << 30;
/// Largest PMR accepted.
pub const MAX_PMR_SIZE: u64 = 64 << 30;
/// Controller registers before the doorbells.
pub const REGISTERS_SIZE: u64 = 0x1000;
/// Smallest BAR0.
pub const MIN_BAR0_SIZE: u64 = 16 << 10;

/// What is fixed for the controller's lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Serial number, up to 20 ASCII characters.
    pub serial: String,
    /// Model number, up to 40 ASCII characters.
    pub model: String,
    /// Firmware revision, up to 8 ASCII characters.
    pub firmware: String,
    /// PCI vendor and subsystem vendor ID reported in Identify.
    pub pci_vendor_id: u16,
    pub pci_subsystem_vendor_id: u16,
    pub ieee_oui: [u8; 3],
    pub controller_id: u16,
    /// I/O queue pairs the host may create (1..=256); MSI-X vectors are one
    /// more (the admin queue's).
    pub max_io_queues: u16,
    /// Largest queue in entries (CAP.MQES + 1), 2..=4096.
    pub max_queue_entries: u32,
    /// Maximum Data Transfer Size as a power of two of 4 KiB pages;
    /// 0 means no limit.
    pub mdts: u8,
    /// Controller Memory Buffer in bytes; 0 disables it.
    pub cmb_size: u64,
    /// Persistent Memory Region in bytes (a power of two, at least 4 KiB);
    /// 0 for none.
    pub pmr_size: u64,
    /// Asynchronous Event Request Limit, 0's based.
    pub aerl: u8,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            serial: "P2PLAB0001".into(),
            model: "p2plab NVMe controller".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            pci_vendor_id: 0x1b36,
            pci_subsystem_vendor_id: 0x1af4,
            ieee_oui: [0x02, 0x50, 0x4c],
            controller_id: 0,
            max_io_queues: 64,
            max_queue_entries: 1024,
            mdts: 7,
            cmb_size: 64 << 20,
            pmr_size: 0,
            aerl: 3,
        }
    }
}

/// A configuration value out of range; names the field (which the server
/// binary maps to its option).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: &'static str,
    pub message: String,
}

fn err(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        message: message.into(),
    }
}

fn ascii(field: &'static str, text: &str, max: usize) -> Result<(), ConfigError> {
    if text.is_empty() || text.len() > max || !text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(err(
            field,
            format!("{text:?} must be 1 to {max} printable ASCII characters"),
        ));
    }
    Ok(())
}

/// Where things are in BAR0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar0Layout {
    pub size: u64,
    pub doorbells_end: u64,
    pub msix_table_offset: u64,
    pub msix_pba_offset: u64,
}

impl ControllerConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        ascii("serial", &self.serial, 20)?;
        ascii("model", &self.model, 40)?;
        ascii("firmware", &self.firmware, 8)?;
        if self.max_io_queues == 0 || self.max_io_queues > MAX_IO_QUEUES {
            return Err(err(
                "max_io_queues",
                format!("{} is not in 1..={MAX_IO_QUEUES}", self.max_io_queues),
            ));
        }
        if !(2..=4096).contains(&self.max_queue_entries) {
            return Err(err(
                "max_queue_entries",
                format!("{} is not in 2..=4096", self.max_queue_entries),
            ));
        }
        if self.mdts > 15 {
            return Err(err("mdts", format!("{} is not in 0..=15", self.mdts)));
        }
        if !self.cmb_size.is_multiple_of(CMB_ALIGN) || self.cmb_size > MAX_CMB_SIZE {
            return Err(err(
                "cmb_size",
                format!(
                    "{} bytes is not a multiple of 2 MiB up to {} GiB (or 0 for no CMB)",
                    self.cmb_size,
                    MAX_CMB_SIZE >> 30
                ),
            ));
        }
        if self.pmr_size != 0
            && (!self.pmr_size.is_power_of_two() || !(4096..=MAX_PMR_SIZE).contains(&self.pmr_size))
        {
            return Err(err(
                "pmr_size",
                format!(
                    "{} bytes is not a power of two from 4 KiB to {} GiB",
                    self.pmr_size,
                    MAX_PMR_SIZE >> 30
                ),
            ));
        }
        if self.aerl > 15 {
            return Err(err("aerl", "at most 16 outstanding requests (aerl 15)"));
        }
        Ok(())
    }

    /// MSI-X vectors: one per I/O queue plus the admin queue's.
    pub fn msix_vectors(&self) -> u16 {
        self.max_io_queues + 1
    }

    /// BAR0: registers, doorbells for every queue pair, then the MSI-X
    /// table and PBA on their own pages (so the guest can never map them
    /// together with the registers), rounded to a power of two.
    pub fn bar0_layout(&self) -> Bar0Layout {
        let page = 4096u64;
        let doorbells_end = REGISTERS_SIZE + 8 * (u64::from(self.max_io_queues) + 1);
        let msix_table_offset = doorbells_end.div_ceil(page) * page;
        let table_len = 16 * u64::from(self.msix_vectors());
        let msix_pba_offset = (msix_table_offset + table_len).div_ceil(page) * page;
        let pba_len = u64::from(self.msix_vectors()).div_ceil(64) * 8;
        let size = (msix_pba_offset + pba_len)
            .max(MIN_BAR0_SIZE)
            .next_power_of_two();
        Bar0Layout {
            size,
            doorbells_end,
            msix_table_offset,
            msix_pba_offset,
        }
    }

    /// The CMB BAR (a power of two holding the CMB at offset 0), if any.
    pub fn cmb_bar_size(&self) -> Option<u64> {
        (self.cmb_size > 0).then(|| self.cmb_size.next_power_of_two())
    }

    /// Largest data transfer in bytes, if limited.
    pub fn max_transfer(&self) -> Option<u64> {
        (self.mdts > 0).then(|| 4096u64 << self.mdts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_lay_out_bar0() {
        let c = ControllerConfig::default();
        c.validate().unwrap();
        let l = c.bar0_layout();
        assert_eq!(l.size, 16 << 10);
        assert_eq!(l.msix_table_offset, 0x2000);
        assert_eq!(l.msix_pba_offset, 0x3000);
        assert_eq!(c.cmb_bar_size(), Some(64 << 20));
        assert_eq!(c.max_transfer(), Some(512 << 10));
    }

    #[test]
    fn bar0_grows_for_many_queues() {
        let c = ControllerConfig {
            max_io_queues: 256,
            ..ControllerConfig::default()
        };
        let l = c.bar0_layout();
        assert!(l.msix_table_offset >= l.doorbells_end);
        assert!(l.msix_pba_offset >= l.msix_table_offset + 16 * 257);
        assert!(l.size.is_power_of_two() && l.size >= l.msix_pba_offset + 40);
    }

    #[test]
    fn bad_values_name_their_field() {
        let bad = |c: ControllerConfig| c.validate().unwrap_err().field;
        let d = ControllerConfig::default;
        assert_eq!(
            bad(ControllerConfig {
                serial: "x".repeat(21),
                ..d()
            }),
            "serial"
        );
        assert_eq!(
            bad(ControllerConfig {
                model: String::new(),
                ..d()
            }),
            "model"
        );
        assert_eq!(
            bad(ControllerConfig {
                firmware: "é".into(),
                ..d()
            }),
            "firmware"
        );
        assert_eq!(
            bad(ControllerConfig {
                max_io_queues: 0,
                ..d()
            }),
            "max_io_queues"
        );
        assert_eq!(
            bad(ControllerConfig {
                max_queue_entries: 1,
                ..d()
            }),
            "max_queue_entries"
        );
        assert_eq!(bad(ControllerConfig { mdts: 16, ..d() }), "mdts");
        assert_eq!(
            bad(ControllerConfig {
                cmb_size: 3 << 20,
                ..d()
            }),
            "cmb_size"
        );
        let odd = ControllerConfig {
            cmb_size: 6 << 20,
            ..d()
        };
        odd.validate().unwrap();
        assert_eq!(
            odd.cmb_bar_size(),
            Some(8 << 20),
            "BAR rounds up to a power of two"
        );
    }
}
