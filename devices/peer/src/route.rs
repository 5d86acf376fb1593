//! Where a device's DMA to an address inside a peer's BAR goes: the
//! routing table a server is given.
//!
//! A PCIe request whose address falls in a BAR of a device below the same
//! switch goes straight to that device when no port on the path has ACS
//! P2P redirect on: the switch routes it by address and the IOMMU never
//! sees it. Any other request goes up to the root complex. Without an
//! IOMMU the root complex routes a peer's bus address to the peer too, so
//! every bus address inside a peer BAR reaches the peer. With an IOMMU the
//! root complex translates what arrives: a bus address means nothing there
//! (Linux reserves the host bridge's memory windows in every IOVA domain,
//! `iova_reserve_pci_windows`, so it is no IOVA either) and the access
//! faults, as the IOMMU would fault it. The guest then reaches the peer's
//! BAR through an IOVA it maps, which QEMU sends as a DMA_MAP without an
//! fd (and offset 0, so nothing in it says which BAR it is): that range is
//! served by DMA_READ/DMA_WRITE messages, which QEMU translates through
//! its IOMMU model to the BAR.
//!
//! The servers cannot see the emulated switch's config space, so they
//! cannot work this out themselves: the launcher, which built the machine
//! (the topology's `-device` tree, the vIOMMU, the kernel command line),
//! tells each server which peers it reaches at their bus addresses
//! ([`DirectPeers`], `--direct-peers`). A user then keeps a peer window
//! only for those peers (see [`crate::UserSession::with_route`]).

use std::collections::BTreeSet;
use std::fmt;

/// How a request from this device to an address inside one peer's BAR
/// travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The bus address reaches the peer's BAR: a switch routes it (one
    /// switch, no ACS redirect on the path), or nothing translates it on
    /// its way through the root complex (no IOMMU). The user keeps a peer
    /// window at the BAR's bus address.
    BusAddress,
    /// The request goes up to an IOMMU, which translates it: the BAR is
    /// reached only through the IOVAs the guest maps for it (message
    /// ranges from QEMU), and its bus address faults. No window.
    Translated,
}

/// The routing table of one server: the peers whose BARs its DMA reaches
/// at their bus addresses. Peers are named by their server id (the
/// `--socket` file stem, which is also the QEMU device id in the lab).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DirectPeers {
    /// Every peer (no IOMMU between this device and any peer).
    #[default]
    All,
    /// Only these (under an IOMMU: the peers below the same switch with
    /// no ACS redirect on the path); the empty set is `none`.
    Only(BTreeSet<String>),
}

/// Longest peer id accepted (a socket file stem).
const MAX_ID: usize = 64;

impl DirectPeers {
    /// How this device's DMA reaches the BARs of peer `id`.
    pub fn route_to(&self, id: &str) -> Route {
        match self {
            DirectPeers::All => Route::BusAddress,
            DirectPeers::Only(ids) if ids.contains(id) => Route::BusAddress,
            DirectPeers::Only(_) => Route::Translated,
        }
    }

    /// `all`, `none`, or a comma-separated list of server ids
    /// (`gpu0,nvme1`; letters, digits, `-`, `_`). The error names the bad
    /// part.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "all" => return Ok(DirectPeers::All),
            "none" => return Ok(DirectPeers::Only(BTreeSet::new())),
            _ => {}
        }
        let mut ids = BTreeSet::new();
        for id in text.split(',') {
            if id == "all" || id == "none" {
                return Err(format!(
                    "{text:?}: `{id}` stands alone, not in a list of peers"
                ));
            }
            let valid = !id.is_empty()
                && id.len() <= MAX_ID
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !valid {
                return Err(format!(
                    "{text:?}: {id:?} is not a server id (letters, digits, - and _, at most {MAX_ID})"
                ));
            }
            if !ids.insert(id.to_owned()) {
                return Err(format!("{text:?}: {id:?} is listed twice"));
            }
        }
        Ok(DirectPeers::Only(ids))
    }
}

impl fmt::Display for DirectPeers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirectPeers::All => f.write_str("all"),
            DirectPeers::Only(ids) if ids.is_empty() => f.write_str("none"),
            DirectPeers::Only(ids) => {
                let list: Vec<&str> = ids.iter().map(String::as_str).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

impl std::str::FromStr for DirectPeers {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Self::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a table that routes a peer it does not list by bus address
    /// (under an IOMMU that DMA would reach a BAR real hardware sends to
    /// the IOMMU, which faults it), or one that refuses a listed peer or
    /// any peer without an IOMMU (`all`).
    #[test]
    fn only_listed_peers_are_reached_at_their_bus_address() {
        let all = DirectPeers::default();
        assert_eq!(all.route_to("gpu0"), Route::BusAddress);
        assert_eq!(all.route_to("anything"), Route::BusAddress);
        let switch = DirectPeers::parse("gpu0,nvme1").unwrap();
        assert_eq!(switch.route_to("gpu0"), Route::BusAddress);
        assert_eq!(switch.route_to("nvme1"), Route::BusAddress);
        assert_eq!(switch.route_to("nvme2"), Route::Translated);
        assert_eq!(switch.route_to("gpu"), Route::Translated, "no prefix match");
        assert_eq!(switch.route_to(""), Route::Translated);
        let none = DirectPeers::parse("none").unwrap();
        assert_eq!(none.route_to("gpu0"), Route::Translated);
    }

    /// Catches: a flag value taken silently when it is not a table (an
    /// empty item, a path, `all` inside a list, a duplicate), or a table
    /// that does not print back as it was given (the lab writes it to the
    /// server's command line and tests read it back).
    #[test]
    fn the_flag_parses_strictly_and_prints_back() {
        for good in ["all", "none", "gpu0", "gpu0,nvme1", "nic-0,nic_1"] {
            let parsed = DirectPeers::parse(good).unwrap();
            assert_eq!(parsed.to_string(), good);
            assert_eq!(good.parse::<DirectPeers>().unwrap(), parsed);
        }
        assert_eq!(
            DirectPeers::parse("nvme1,gpu0").unwrap().to_string(),
            "gpu0,nvme1",
            "sorted"
        );
        for bad in [
            "",
            ",",
            "gpu0,",
            "gpu0,,nvme1",
            "all,gpu0",
            "gpu0,none",
            "../gpu0",
            "gpu 0",
            "gpu0,gpu0",
        ] {
            let err = DirectPeers::parse(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
        assert!(DirectPeers::parse(&"x".repeat(MAX_ID + 1)).is_err());
    }
}
