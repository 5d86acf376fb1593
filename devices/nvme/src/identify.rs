//! Identify data structures that describe the controller.

use crate::config::ControllerConfig;
use crate::features::{CRITICAL_TEMPERATURE, WARNING_TEMPERATURE};
use crate::logs::ERROR_LOG_ENTRIES;
use crate::spec::{put_ascii, put_u16, put_u32, put_u8};

/// The version this controller reports in VS and Identify (1.4.0): the
/// CMBMSC scheme is from 1.4, and hosts treat 2.0 controllers differently
/// (command set independent Identify) in ways this model does not need.
pub const VERSION: u32 = 0x0001_0400;

/// OACS bits.
const OACS_FORMAT_NVM: u16 = 1 << 1;
const OACS_DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;

/// ONCS bits: Compare, Dataset Management, Write Zeroes, Save/Select in
/// features, Timestamp, Verify.
pub const ONCS: u16 = (1 << 0) | (1 << 2) | (1 << 3) | (1 << 4) | (1 << 6) | (1 << 7);

/// SGLS: supported with byte-aligned data blocks (01b), Bit Bucket
/// descriptors (bit 16), SGLs longer than the transfer (bit 18: Linux
/// maps a passthrough command's whole user buffer, which may exceed it).
pub const SGLS: u32 = 0x1 | (1 << 16) | (1 << 18);

/// Identify Controller (CNS 01h).
pub fn controller(cfg: &ControllerConfig, namespaces: u32) -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    put_u16(&mut d, 0, cfg.pci_vendor_id); // VID
    put_u16(&mut d, 2, cfg.pci_subsystem_vendor_id); // SSVID
    put_ascii(&mut d, 4, 20, &cfg.serial); // SN
    put_ascii(&mut d, 24, 40, &cfg.model); // MN
    put_ascii(&mut d, 64, 8, &cfg.firmware); // FR
    put_u8(&mut d, 72, 6); // RAB: 64 commands
                           // IEEE OUI, least significant byte first.
    put_u8(&mut d, 73, cfg.ieee_oui[2]);
    put_u8(&mut d, 74, cfg.ieee_oui[1]);
    put_u8(&mut d, 75, cfg.ieee_oui[0]);
    put_u8(&mut d, 76, 0); // CMIC: one port, one controller
    put_u8(&mut d, 77, cfg.mdts); // MDTS
    put_u16(&mut d, 78, cfg.controller_id); // CNTLID
    put_u32(&mut d, 80, VERSION); // VER
                                  // OAES: Namespace Attribute Notices.
    put_u32(&mut d, 92, 1 << 8);
    put_u8(&mut d, 111, 1); // CNTRLTYPE: I/O controller
    put_u16(&mut d, 256, OACS_FORMAT_NVM | OACS_DOORBELL_BUFFER_CONFIG); // OACS
    put_u8(&mut d, 258, 3); // ACL: 4 concurrent Aborts
    put_u8(&mut d, 259, cfg.aerl); // AERL
    put_u8(&mut d, 260, (1 << 1) | 1); // FRMW: one slot, read-only
                                       // LPA: SMART per namespace, Commands Effects log, extended data (LPO).
    put_u8(&mut d, 261, 0x1 | 0x2 | 0x4);
    put_u8(&mut d, 262, (ERROR_LOG_ENTRIES - 1) as u8); // ELPE
    put_u8(&mut d, 263, 0); // NPSS: one power state
    put_u16(&mut d, 266, WARNING_TEMPERATURE); // WCTEMP
    put_u16(&mut d, 268, CRITICAL_TEMPERATURE); // CCTEMP
    put_u8(&mut d, 512, 0x66); // SQES: 64 bytes
    put_u8(&mut d, 513, 0x44); // CQES: 16 bytes
    put_u32(&mut d, 516, namespaces); // NN
    put_u16(&mut d, 520, ONCS);
    // FNA 0: Format applies per namespace, no crypto erase.
    put_u8(&mut d, 524, 0);
    // VWC: present, Flush with NSID FFFFFFFFh supported.
    put_u8(&mut d, 525, 0x1 | 0x6);
    put_u32(&mut d, 536, SGLS);
    let nqn = format!("nqn.2024-01.io.p2plab:nvme:{}", cfg.serial);
    let mut nqn_field = vec![0u8; 256];
    for (dst, src) in nqn_field.iter_mut().zip(nqn.bytes().take(255)) {
        *dst = src;
    }
    crate::spec::put_bytes(&mut d, 768, &nqn_field); // SUBNQN
                                                     // Power State 0: 25 W max, tiny latencies.
    put_u16(&mut d, 2048, 2500);
    put_u32(&mut d, 2048 + 4, 16);
    put_u32(&mut d, 2048 + 8, 4);
    d
}

/// I/O Command Set specific Identify Controller for NVM (CNS 06h, CSI 0):
/// every limit 0, meaning none beyond MDTS.
pub fn controller_nvm() -> Vec<u8> {
    vec![0u8; 4096]
}

/// Active namespace ID list (CNS 02h/07h): NSIDs above `after`.
pub fn active_namespaces(namespaces: u32, after: u32) -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    for (i, nsid) in (after.saturating_add(1)..=namespaces)
        .take(1024)
        .enumerate()
    {
        put_u32(&mut d, i * 4, nsid);
    }
    d
}

/// I/O Command Set Independent Identify Namespace (CNS 08h).
pub fn namespace_independent() -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    put_u8(&mut d, 14, 1); // NSTAT: namespace ready
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_controller_fields() {
        let cfg = ControllerConfig {
            serial: "SER123".into(),
            mdts: 7,
            ..ControllerConfig::default()
        };
        let d = controller(&cfg, 2);
        assert_eq!(&d[4..10], b"SER123");
        assert_eq!(d[10], b' ');
        assert_eq!(d[77], 7);
        assert_eq!(u32::from_le_bytes(d[80..84].try_into().unwrap()), VERSION);
        assert_eq!(u32::from_le_bytes(d[516..520].try_into().unwrap()), 2);
        assert_eq!((d[512], d[513]), (0x66, 0x44));
        assert_eq!(u32::from_le_bytes(d[536..540].try_into().unwrap()) & 3, 1);
        assert!(
            String::from_utf8_lossy(&d[768..1024]).starts_with("nqn.2024-01.io.p2plab:nvme:SER123")
        );
        assert_eq!(d[1023], 0, "SUBNQN is NUL terminated");
    }

    #[test]
    fn active_list_starts_after_the_given_nsid() {
        let d = active_namespaces(3, 1);
        assert_eq!(u32::from_le_bytes(d[0..4].try_into().unwrap()), 2);
        assert_eq!(u32::from_le_bytes(d[4..8].try_into().unwrap()), 3);
        assert_eq!(u32::from_le_bytes(d[8..12].try_into().unwrap()), 0);
        assert!(active_namespaces(3, 3).iter().all(|&b| b == 0));
    }
}
