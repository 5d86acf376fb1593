//! The routing table each device server gets under a vIOMMU
//! (`--direct-peers`), derived from the machine the lab builds.
//!
//! QEMU's switch model has no peer routing: under a vIOMMU every DMA a
//! device makes goes to the IOMMU. A real PCIe switch routes a request
//! whose address falls in a peer's BAR straight to the peer when no port
//! on the path has ACS P2P redirect on; the guest kernel relies on that and
//! hands such a pair bus addresses (`PCI_P2PDMA_MAP_BUS_ADDR`). The
//! servers route those requests themselves (peer windows at the bus
//! address), but they cannot see the emulated switch, so they are told
//! which peers they reach that way. The launcher knows the machine it
//! builds, so it is the source of that table:
//!
//! - the PCIe tree: every `-device`'s `bus=` (the QEMU topology the user
//!   could also pass by hand);
//! - which ports have an ACS capability: QEMU 11.1's `pcie-root-port`
//!   and `ioh3420` have one (unless `disable-acs=on`); `xio3130-downstream`,
//!   `x3130-upstream` and the PCI bridges have none;
//! - what the guest kernel writes into ACS Control: with an IOMMU it turns
//!   on P2P Request and Completion Redirect on every port with the
//!   capability (`pci_request_acs` by the IOMMU driver, then
//!   `pci_std_enable_acs`, drivers/pci/pci.c of the 7.3 guest).
//!
//! A pair is direct when its nearest common upstream bridge is a bridge
//! (not the host bridge) and no bridge on the way up from either device
//! to it, that one included, redirects: the rule of the kernel's
//! `calc_map_type_and_dist` (drivers/pci/p2pdma.c). Everything else goes
//! up to the IOMMU.
//!
//! What would make the table wrong, and is refused or documented rather
//! than guessed: `pci=config_acs=` or `pci=disable_acs_redir=` on the
//! kernel command line (they name ports by the guest's bus numbers, which
//! the launcher does not model; the lab refuses to guess and asks for
//! explicit `--direct-peers` on the `#@server` lines), a bridge kind it
//! does not know (refused), and the guest changing ACS Control at run
//! time (`setpci`), which nobody tells the servers (docs: topologies.md).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};

/// QEMU devices that put the devices behind them under an IOMMU.
const IOMMUS: &[&str] = &["intel-iommu", "amd-iommu", "virtio-iommu-pci"];
/// Bridges QEMU 11.1 gives an ACS capability (unless `disable-acs=on`).
const ACS_PORTS: &[&str] = &["pcie-root-port", "ioh3420"];
/// Bridges without an ACS capability in QEMU 11.1.
const PLAIN_BRIDGES: &[&str] = &[
    "x3130-upstream",
    "xio3130-downstream",
    "pcie-pci-bridge",
    "pci-bridge",
    "i82801b11-bridge",
];
/// Kernel parameters (inside `pci=`) that change ACS Control per port.
const ACS_PARAMETERS: &[&str] = &["config_acs=", "disable_acs_redir="];

/// One `-device` of the QEMU command line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Device {
    driver: String,
    id: Option<String>,
    /// The bus it plugs into (`None`: the root bus).
    bus: Option<String>,
    /// `disable-acs=on` (a root port without its ACS capability).
    acs_disabled: bool,
    /// The vfio-user socket's file stem (the server id), for vfio-user-pci.
    server: Option<String>,
}

/// Parses a `-device` value: the JSON form or `driver,key=value,...`.
fn parse_device(value: &str) -> Result<Device> {
    let truthy = |v: &str| matches!(v, "on" | "true" | "yes" | "1");
    if value.starts_with('{') {
        let json: serde_json::Value = serde_json::from_str(value)
            .map_err(|e| anyhow::anyhow!("-device {value}: not valid JSON ({e})"))?;
        let text = |key: &str| json[key].as_str().map(str::to_owned);
        let Some(driver) = text("driver") else {
            bail!("-device {value}: no \"driver\"");
        };
        let server = json["socket"]["path"].as_str().and_then(|p| {
            std::path::Path::new(p)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        });
        let acs_disabled = match &json["disable-acs"] {
            serde_json::Value::Bool(b) => *b,
            serde_json::Value::String(s) => truthy(s),
            _ => false,
        };
        return Ok(Device {
            driver,
            id: text("id"),
            bus: text("bus"),
            acs_disabled,
            server,
        });
    }
    let mut device = Device {
        driver: String::new(),
        id: None,
        bus: None,
        acs_disabled: false,
        server: None,
    };
    for (index, item) in value.split(',').enumerate() {
        match item.split_once('=') {
            Some(("driver", v)) => device.driver = v.to_owned(),
            Some(("id", v)) => device.id = Some(v.to_owned()),
            Some(("bus", v)) => device.bus = Some(v.to_owned()),
            Some(("disable-acs", v)) => device.acs_disabled = truthy(v),
            Some(_) => {}
            None if index == 0 => device.driver = item.to_owned(),
            None => {}
        }
    }
    if device.driver.is_empty() {
        bail!("-device {value}: no driver");
    }
    Ok(device)
}

/// Why a pair is or is not routed by its switch, for the run folder's
/// `routing.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairRoute {
    /// Below one bridge (named) with no ACS redirect on the path.
    Switch { common: String },
    /// Below one bridge, but these ports redirect (ACS capability, turned
    /// on by the kernel under an IOMMU).
    Redirected { common: String, ports: Vec<String> },
    /// No common bridge: only the host bridge joins them.
    HostBridge,
}

impl PairRoute {
    pub fn is_direct(&self) -> bool {
        matches!(self, PairRoute::Switch { .. })
    }
}

impl std::fmt::Display for PairRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PairRoute::Switch { common } => {
                write!(
                    f,
                    "direct: one switch ({common}), no ACS redirect on the path"
                )
            }
            PairRoute::Redirected { common, ports } => write!(
                f,
                "through the IOMMU: below {common}, but ACS redirect on {}",
                ports.join(", ")
            ),
            PairRoute::HostBridge => {
                f.write_str("through the IOMMU: no common bridge below the host bridge")
            }
        }
    }
}

/// What the lab derived for one vIOMMU machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// The IOMMU device (`intel-iommu`...).
    pub iommu: String,
    /// Per server id, the `--direct-peers` value (`none` or sorted ids).
    pub direct_peers: BTreeMap<String, String>,
    /// Per (server, peer), in order, how a request between them travels.
    pub pairs: Vec<(String, String, PairRoute)>,
}

impl Routing {
    /// The table as the run folder's `routing.txt` holds it.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "# DMA routing under {} (the servers' --direct-peers)\n",
            self.iommu
        );
        for (id, peers) in &self.direct_peers {
            text.push_str(&format!("{id} --direct-peers {peers}\n"));
        }
        for (a, b, route) in &self.pairs {
            text.push_str(&format!("#   {a} -> {b}: {route}\n"));
        }
        text
    }
}

/// The routing table for the servers `servers` (their ids) of a machine
/// given by `qemu_args` whose guest boots with `cmdline` (every word).
/// `None` when the machine has no IOMMU: then every peer address reaches
/// the peer (the servers' default, `--direct-peers all`).
pub fn derive(
    qemu_args: &[String],
    servers: &[String],
    cmdline: &[String],
) -> Result<Option<Routing>> {
    let mut devices = Vec::new();
    let mut args = qemu_args.iter();
    while let Some(arg) = args.next() {
        if arg == "-device" {
            if let Some(value) = args.next() {
                devices.push(parse_device(value)?);
            }
        }
    }
    let Some(iommu) = devices.iter().find(|d| IOMMUS.contains(&d.driver.as_str())) else {
        return Ok(None);
    };
    let iommu = iommu.driver.clone();
    for word in cmdline {
        let Some(options) = word.strip_prefix("pci=") else {
            continue;
        };
        if let Some(p) = options
            .split(',')
            .find(|o| ACS_PARAMETERS.iter().any(|p| o.starts_with(p)))
        {
            bail!(
                "the kernel parameter pci={p} changes ACS redirect per port under {iommu}: the lab \
                 cannot derive which peers a switch routes directly; put --direct-peers on each \
                 #@server line of the topology (all|none|ID,...)"
            );
        }
    }
    let by_id: BTreeMap<&str, &Device> = devices
        .iter()
        .filter_map(|d| Some((d.id.as_deref()?, d)))
        .collect();
    // The bridges above a device, nearest first. A bus that is no device's
    // id is a root bus (`pcie.0`) or a bus of a non-bridge (none here).
    let chain = |device: &Device| -> Result<Vec<&Device>> {
        let mut up = Vec::new();
        let mut bus = device.bus.as_deref();
        while let Some(name) = bus {
            let Some(bridge) = by_id.get(name) else { break };
            if up.len() > 64 || up.iter().any(|b: &&Device| b.id == bridge.id) {
                bail!("-device {name}: the bus= chain loops");
            }
            let kind = bridge.driver.as_str();
            if !ACS_PORTS.contains(&kind) && !PLAIN_BRIDGES.contains(&kind) {
                bail!(
                    "-device {kind} (id {name}) is a bridge the lab's routing does not know \
                     (does it have ACS?); put --direct-peers on each #@server line"
                );
            }
            up.push(*bridge);
            bus = bridge.bus.as_deref();
        }
        Ok(up)
    };
    let redirects =
        |bridge: &Device| ACS_PORTS.contains(&bridge.driver.as_str()) && !bridge.acs_disabled;
    let mut placed = Vec::new();
    for id in servers {
        let Some(device) = devices
            .iter()
            .find(|d| d.driver == "vfio-user-pci" && d.server.as_deref() == Some(id.as_str()))
        else {
            bail!("server {id} has no vfio-user-pci device with socket {id}.sock");
        };
        placed.push((id.clone(), chain(device)?));
    }
    let mut direct_peers = BTreeMap::new();
    let mut pairs = Vec::new();
    for (a, up_a) in &placed {
        let mut peers = BTreeSet::new();
        for (b, up_b) in &placed {
            if a == b {
                continue;
            }
            let common = up_a.iter().position(|x| up_b.iter().any(|y| y.id == x.id));
            let route = match common {
                None => PairRoute::HostBridge,
                Some(ia) => {
                    let common = up_a[ia];
                    let ib = up_b
                        .iter()
                        .position(|y| y.id == common.id)
                        .unwrap_or(up_b.len());
                    let ports: Vec<String> = up_a[..=ia]
                        .iter()
                        .chain(up_b[..ib].iter())
                        .filter(|p| redirects(p))
                        .map(|p| p.id.clone().unwrap_or_default())
                        .collect();
                    let name = common.id.clone().unwrap_or_default();
                    if ports.is_empty() {
                        PairRoute::Switch { common: name }
                    } else {
                        PairRoute::Redirected {
                            common: name,
                            ports,
                        }
                    }
                }
            };
            if route.is_direct() {
                peers.insert(b.clone());
            }
            pairs.push((a.clone(), b.clone(), route));
        }
        let value = if peers.is_empty() {
            "none".to_owned()
        } else {
            peers.into_iter().collect::<Vec<_>>().join(",")
        };
        direct_peers.insert(a.clone(), value);
    }
    Ok(Some(Routing {
        iommu,
        direct_peers,
        pairs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Placeholders, Topology};
    use std::path::{Path, PathBuf};

    fn shipped(name: &str) -> Topology {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../qemu-configs")
            .join(format!("{name}.args"));
        let vars = Placeholders {
            run: PathBuf::from("/r"),
            state: PathBuf::from("/s"),
        };
        Topology::load(&path, &vars).unwrap()
    }

    fn routing_of(t: &Topology, cmdline: &[&str]) -> Result<Option<Routing>> {
        let ids: Vec<String> = t.servers.iter().map(|s| s.id.clone()).collect();
        let words: Vec<String> = cmdline.iter().map(|w| (*w).to_owned()).collect();
        derive(&t.qemu_args, &ids, &words)
    }

    fn args(lines: &[&str]) -> Vec<String> {
        lines
            .iter()
            .flat_map(|l| ["-device".to_owned(), (*l).to_owned()])
            .collect()
    }

    fn vfio(id: &str, bus: &str) -> String {
        format!(
            "{{\"driver\":\"vfio-user-pci\",\"id\":\"{id}\",\"bus\":\"{bus}\",\"socket\":{{\"type\":\"unix\",\"path\":\"/r/{id}.sock\"}}}}"
        )
    }

    /// Catches: a lab that routes peers across ports with ACS (under an
    /// IOMMU the kernel turns redirect on there, so real hardware sends
    /// those requests to the IOMMU), one that does not route peers below
    /// one plain switch directly (the kernel hands them bus addresses, which
    /// would then fault), and one that routes devices on separate root
    /// ports directly (only the host bridge joins them).
    #[test]
    fn direct_only_below_one_switch_without_acs_ports() {
        let iommu = "intel-iommu,caching-mode=on";
        let plain = args(&[
            iommu,
            "pcie-root-port,id=rp0,bus=pcie.0,chassis=1",
            "x3130-upstream,id=up0,bus=rp0",
            "xio3130-downstream,id=dn0,bus=up0,chassis=2",
            "xio3130-downstream,id=dn1,bus=up0,chassis=3",
            "pcie-root-port,id=rp1,bus=pcie.0,chassis=4",
            &vfio("nvme0", "dn0"),
            &vfio("gpu0", "dn1"),
            &vfio("nic0", "rp1"),
        ]);
        let ids: Vec<String> = ["nvme0", "gpu0", "nic0"].map(String::from).to_vec();
        let r = derive(&plain, &ids, &[]).unwrap().unwrap();
        assert_eq!(r.iommu, "intel-iommu");
        assert_eq!(r.direct_peers["nvme0"], "gpu0");
        assert_eq!(r.direct_peers["gpu0"], "nvme0");
        assert_eq!(r.direct_peers["nic0"], "none");
        assert!(r
            .pairs
            .contains(&("nvme0".into(), "nic0".into(), PairRoute::HostBridge)));

        // The same switch whose downstream ports are root ports (ACS).
        let acs = args(&[
            "amd-iommu,dma-remap=on",
            "pcie-root-port,id=rp0,bus=pcie.0",
            "x3130-upstream,id=up0,bus=rp0",
            "pcie-root-port,id=dn0,bus=up0",
            "pcie-root-port,id=dn1,bus=up0,disable-acs=on",
            "pcie-root-port,id=dn2,bus=up0",
            &vfio("nvme0", "dn0"),
            &vfio("gpu0", "dn1"),
            &vfio("nic0", "dn2"),
        ]);
        let r = derive(&acs, &ids, &[]).unwrap().unwrap();
        assert_eq!(r.direct_peers["nvme0"], "none");
        assert_eq!(r.direct_peers["gpu0"], "none", "nvme0's port redirects");
        assert!(r.pairs.contains(&(
            "gpu0".into(),
            "nic0".into(),
            PairRoute::Redirected {
                common: "up0".into(),
                ports: vec!["dn2".into()]
            }
        )));
        // Only an ACS-less path below the common switch is direct: the
        // root port above it does not count.
        let below = args(&[
            "virtio-iommu-pci",
            "pcie-root-port,id=rp0",
            "x3130-upstream,id=up0,bus=rp0",
            "xio3130-downstream,id=dn0,bus=up0",
            "pcie-root-port,id=dn1,bus=up0,disable-acs=true",
            &vfio("nvme0", "dn0"),
            &vfio("gpu0", "dn1"),
        ]);
        let ids2: Vec<String> = ["nvme0", "gpu0"].map(String::from).to_vec();
        let r = derive(&below, &ids2, &[]).unwrap().unwrap();
        assert_eq!(r.direct_peers["nvme0"], "gpu0");
    }

    /// Catches: a table derived where the lab cannot know it (a kernel
    /// parameter that changes ACS Control per port, a bridge kind of
    /// unknown ACS), and a table handed out without an IOMMU (every peer
    /// address reaches the peer there; the servers' default says so).
    #[test]
    fn refuses_what_it_cannot_model_and_stays_out_without_an_iommu() {
        let lab = shipped("lab");
        assert_eq!(routing_of(&lab, &[]).unwrap(), None);
        let viommu = shipped("viommu");
        let err = routing_of(&viommu, &["pci=no_e820,config_acs=1xx@0000:02:00.0"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("config_acs") && err.contains("#@server"),
            "{err}"
        );
        assert!(routing_of(&viommu, &["pci=disable_acs_redir=0000:02:00.0"]).is_err());
        assert!(routing_of(&viommu, &["pci=no_e820", "intel_iommu=on"]).is_ok());
        let odd = args(&[
            "intel-iommu",
            "pxb-pcie,id=pxb0,bus_nr=64",
            &vfio("nvme0", "pxb0"),
        ]);
        let err = derive(&odd, &["nvme0".to_owned()], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("pxb-pcie"), "{err}");
        let missing = derive(&args(&["intel-iommu"]), &["gpu0".to_owned()], &[]);
        assert!(missing.is_err());
    }

    /// Catches: shipped vIOMMU topologies whose derived table disagrees
    /// with what their headers and the P2P matrix say (the e2e suite checks
    /// the guest's side: ACS Control bits and the kernel's map type).
    #[test]
    fn shipped_viommu_topologies_route_as_documented() {
        let r = routing_of(&shipped("viommu"), &[]).unwrap().unwrap();
        assert_eq!(r.direct_peers["nvme0"], "gpu0,nvme1");
        assert_eq!(r.direct_peers["nvme1"], "gpu0,nvme0");
        assert_eq!(r.direct_peers["gpu0"], "nvme0,nvme1");
        let r = routing_of(&shipped("viommu-amd"), &["iommu.strict=1"])
            .unwrap()
            .unwrap();
        assert_eq!(r.iommu, "amd-iommu");
        assert!(r.direct_peers.values().all(|v| v == "none"), "{r:?}");
        let r = routing_of(&shipped("viommu-acs"), &[]).unwrap().unwrap();
        assert!(r.direct_peers.values().all(|v| v == "none"), "{r:?}");
        let text = r.describe();
        assert!(text.contains("nvme0 --direct-peers none"), "{text}");
        assert!(text.contains("ACS redirect on"), "{text}");
    }

    /// Catches: a `dgx` topology file whose device tree no longer gives
    /// the pairs its header and the book promise: each NVMe with the GPU
    /// of its own switch, nvme2/nvme3 with gpu3/gpu2 through the shared
    /// switch, every other NVMe -> GPU pair only through the host bridge
    /// (the `dgx` e2e suite expects exactly these pairs allowed and the
    /// rest refused). The tree is read as the routing reads it, with an
    /// IOMMU added so that it derives the pairs (no port below a common
    /// switch has ACS, so the IOMMU changes none of them).
    #[test]
    fn dgx_pairs_meet_where_its_header_says() {
        let mut dgx = shipped("dgx");
        dgx.qemu_args.extend([
            "-device".to_owned(),
            "intel-iommu,caching-mode=on".to_owned(),
        ]);
        let r = routing_of(&dgx, &[]).unwrap().unwrap();
        let route = |a: &str, b: &str| {
            r.pairs
                .iter()
                .find(|(x, y, _)| x == a && y == b)
                .map(|(_, _, route)| route.clone())
                .unwrap_or_else(|| panic!("no pair {a} -> {b}"))
        };
        for n in 0..4 {
            for g in 0..4 {
                let (nvme, gpu) = (format!("nvme{n}"), format!("gpu{g}"));
                let want = match (n, g) {
                    _ if n == g => PairRoute::Switch {
                        common: format!("up{n}"),
                    },
                    (2, 3) | (3, 2) => PairRoute::Switch {
                        common: "upS".into(),
                    },
                    _ => PairRoute::HostBridge,
                };
                assert_eq!(route(&nvme, &gpu), want, "{nvme} -> {gpu}");
            }
        }
        assert_eq!(r.direct_peers["nvme2"], "gpu2,gpu3,nvme3");
        assert_eq!(r.direct_peers["gpu0"], "nvme0");
    }

    #[test]
    fn parses_both_device_forms() {
        let d = parse_device("pcie-root-port,id=rp0,bus=pcie.0,disable-acs=on").unwrap();
        assert_eq!(d.driver, "pcie-root-port");
        assert_eq!(d.id.as_deref(), Some("rp0"));
        assert!(d.acs_disabled);
        let d = parse_device("id=x,driver=ioh3420").unwrap();
        assert_eq!(d.driver, "ioh3420");
        let d = parse_device(&vfio("gpu0", "dn1")).unwrap();
        assert_eq!(d.server.as_deref(), Some("gpu0"));
        assert_eq!(d.bus.as_deref(), Some("dn1"));
        assert!(parse_device("{\"id\":1}").is_err());
        assert!(parse_device("{not json").is_err());
    }
}
