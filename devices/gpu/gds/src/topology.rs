//! Where the file's storage and the GPU sit in the PCIe tree, read from
//! sysfs. The kernel's P2PDMA rule: two devices below a common PCIe bridge
//! (switch or root port, without ACS redirection) may do P2P; devices whose
//! only common ancestor is the host bridge may only if the kernel
//! whitelists that host bridge. The library does not predict the kernel's
//! answer from this (it always lets the kernel decide); it uses it to say
//! *why* when the kernel refuses, and to skip P2P for files that do not
//! live on a PCI device at all.

use std::path::{Path, PathBuf};

/// A PCI function name like `0000:03:00.0`.
pub fn is_bdf(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 | 10 => true,
            11 => (b'0'..=b'7').contains(c),
            _ => c.is_ascii_hexdigit(),
        })
}

/// A device's place in the tree: its host bridge (`pci0000:00`) and the
/// PCI functions from the root port down to the device itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciChain {
    pub host_bridge: String,
    pub functions: Vec<String>,
}

impl PciChain {
    /// From a canonical sysfs device path, e.g.
    /// `/sys/devices/pci0000:00/0000:00:10.0/0000:01:00.0/.../nvme/nvme0/nvme0n1`.
    pub fn from_sysfs_path(path: &Path) -> Option<PciChain> {
        let mut host_bridge = None;
        let mut functions = Vec::new();
        for part in path.iter().filter_map(|p| p.to_str()) {
            if host_bridge.is_none() {
                if part.starts_with("pci") && part.len() > 3 && part[3..].contains(':') {
                    host_bridge = Some(part.to_owned());
                }
            } else if is_bdf(part) {
                functions.push(part.to_owned());
            }
        }
        let host_bridge = host_bridge?;
        (!functions.is_empty()).then_some(PciChain {
            host_bridge,
            functions,
        })
    }

    /// The device itself (the last function of the chain).
    pub fn device(&self) -> &str {
        self.functions.last().map(String::as_str).unwrap_or("")
    }
}

/// How two devices are connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Relation {
    /// Both sit below this PCIe bridge (a switch port or a root port).
    SharedBridge { bridge: String },
    /// Only the host bridge is common: P2P needs the kernel's whitelist.
    HostBridgeOnly { host_bridge: String },
    /// Different host bridges.
    NoCommonHostBridge,
}

impl Relation {
    pub fn between(a: &PciChain, b: &PciChain) -> Relation {
        if a.host_bridge != b.host_bridge {
            return Relation::NoCommonHostBridge;
        }
        // Common upstream functions, excluding the devices themselves.
        let up_a = &a.functions[..a.functions.len() - 1];
        let up_b = &b.functions[..b.functions.len() - 1];
        let common = up_a
            .iter()
            .zip(up_b)
            .take_while(|(x, y)| x == y)
            .map(|(x, _)| x)
            .last();
        match common {
            Some(bridge) => Relation::SharedBridge {
                bridge: bridge.clone(),
            },
            None => Relation::HostBridgeOnly {
                host_bridge: a.host_bridge.clone(),
            },
        }
    }

    /// Short stable name for JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Relation::SharedBridge { .. } => "shared_bridge",
            Relation::HostBridgeOnly { .. } => "host_bridge_only",
            Relation::NoCommonHostBridge => "no_common_host_bridge",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Relation::SharedBridge { bridge } => format!("both below PCIe bridge {bridge}"),
            Relation::HostBridgeOnly { host_bridge } => format!(
                "they share no PCIe switch or root port, only host bridge {host_bridge}, \
                 which the kernel's P2PDMA whitelist must know"
            ),
            Relation::NoCommonHostBridge => "they sit below different host bridges".to_owned(),
        }
    }
}

/// The PCI chain of the block device `major:minor` (a file's `st_dev`),
/// following NVMe multipath heads and stacked devices (dm, md) to the
/// first PCI device below them. None: not on a PCI device (tmpfs, 9p...).
pub fn block_device_chain(sysfs: &Path, major: u32, minor: u32) -> Option<PciChain> {
    let dev = std::fs::canonicalize(sysfs.join(format!("dev/block/{major}:{minor}"))).ok()?;
    chain_below(&dev, 4)
}

fn chain_below(dev: &Path, depth: u32) -> Option<PciChain> {
    if let Some(chain) = PciChain::from_sysfs_path(dev) {
        return Some(chain);
    }
    if depth == 0 {
        return None;
    }
    // A partition's parent holds `multipath/` or `slaves/` of the whole disk.
    let candidates = [Some(dev), dev.parent()];
    for dir in candidates.into_iter().flatten() {
        for sub in ["multipath", "slaves"] {
            let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
                continue;
            };
            let mut targets: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .filter_map(|e| std::fs::canonicalize(e.path()).ok())
                .collect();
            targets.sort();
            if let Some(chain) = targets.iter().find_map(|t| chain_below(t, depth - 1)) {
                return Some(chain);
            }
        }
    }
    None
}

/// The PCI chain of the function `bdf`.
pub fn pci_device_chain(sysfs: &Path, bdf: &str) -> Option<PciChain> {
    let dev = std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bdf)).ok()?;
    PciChain::from_sysfs_path(&dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(path: &str) -> PciChain {
        PciChain::from_sysfs_path(Path::new(path)).expect(path)
    }

    #[test]
    fn bdf_names() {
        assert!(is_bdf("0000:03:00.0"));
        assert!(is_bdf("0000:ab:1f.7"));
        assert!(!is_bdf("0000:03:00.8"));
        assert!(!is_bdf("pci0000:00"));
        assert!(!is_bdf("nvme0n1"));
        assert!(!is_bdf("0000:03:00.0x"));
    }

    #[test]
    fn chains_from_paths() {
        let c = chain("/sys/devices/pci0000:00/0000:00:10.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/nvme/nvme0/nvme0n1/nvme0n1p1");
        assert_eq!(c.host_bridge, "pci0000:00");
        assert_eq!(
            c.functions,
            [
                "0000:00:10.0",
                "0000:01:00.0",
                "0000:02:00.0",
                "0000:03:00.0"
            ]
        );
        assert_eq!(c.device(), "0000:03:00.0");
        assert!(PciChain::from_sysfs_path(Path::new("/sys/devices/virtual/block/loop0")).is_none());
        assert!(PciChain::from_sysfs_path(Path::new("/sys/devices/pci0000:00/pci_bus")).is_none());
    }

    #[test]
    fn relation_of_the_lab_switch_and_of_separate_root_ports() {
        let nvme =
            chain("/sys/devices/pci0000:00/0000:00:10.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
        let gpu =
            chain("/sys/devices/pci0000:00/0000:00:10.0/0000:01:00.0/0000:02:01.0/0000:04:00.0");
        assert_eq!(
            Relation::between(&nvme, &gpu),
            Relation::SharedBridge {
                bridge: "0000:01:00.0".to_owned()
            }
        );
        let nvme = chain("/sys/devices/pci0000:00/0000:00:10.0/0000:01:00.0");
        let gpu = chain("/sys/devices/pci0000:00/0000:00:11.0/0000:02:00.0");
        let rel = Relation::between(&nvme, &gpu);
        assert_eq!(
            rel,
            Relation::HostBridgeOnly {
                host_bridge: "pci0000:00".to_owned()
            }
        );
        assert!(rel.describe().contains("whitelist"));
        // Two functions on the root bus: only the host bridge.
        let a = chain("/sys/devices/pci0000:00/0000:00:04.0");
        let b = chain("/sys/devices/pci0000:00/0000:00:05.0");
        assert_eq!(rel.name(), Relation::between(&a, &b).name());
        let far = chain("/sys/devices/pci0000:40/0000:40:01.0");
        assert_eq!(Relation::between(&a, &far), Relation::NoCommonHostBridge);
    }

    /// A fake sysfs: devices, /dev/block links, an NVMe multipath head.
    #[test]
    fn block_devices_resolve_through_links_and_multipath_heads() {
        let root = std::env::temp_dir().join(format!("p2plab-gds-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pci = root.join("devices/pci0000:00/0000:00:10.0/0000:01:00.0/0000:03:00.0");
        let ns = pci.join("nvme/nvme0/nvme0c0n1");
        let head = root.join("devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1");
        std::fs::create_dir_all(&ns).unwrap();
        std::fs::create_dir_all(head.join("nvme0n1p1")).unwrap();
        std::fs::create_dir_all(head.join("multipath")).unwrap();
        std::os::unix::fs::symlink(&ns, head.join("multipath/nvme0c0n1")).unwrap();
        let tmpfs = root.join("devices/virtual/block/ram0");
        std::fs::create_dir_all(&tmpfs).unwrap();
        std::fs::create_dir_all(root.join("dev/block")).unwrap();
        std::os::unix::fs::symlink(&head, root.join("dev/block/259:0")).unwrap();
        std::os::unix::fs::symlink(head.join("nvme0n1p1"), root.join("dev/block/259:1")).unwrap();
        std::os::unix::fs::symlink(&tmpfs, root.join("dev/block/1:0")).unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(&pci, root.join("bus/pci/devices/0000:03:00.0")).unwrap();

        for minor in [0, 1] {
            let c = block_device_chain(&root, 259, minor).expect("multipath head resolves");
            assert_eq!(c.device(), "0000:03:00.0");
        }
        assert!(block_device_chain(&root, 1, 0).is_none());
        assert!(block_device_chain(&root, 7, 7).is_none());
        assert_eq!(
            pci_device_chain(&root, "0000:03:00.0").unwrap().device(),
            "0000:03:00.0"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
