//! What the device tells the driver about itself: the attributes GET_FEATURE
//! answers with, set by the server (`--gid`, `--max-qp`...). The driver
//! caches them at probe and derives everything `ibv_devinfo -v` prints from
//! them; the device enforces the same limits.
//!
//! Feature layouts are the driver's (`efa_admin_cmds_defs.h`): each encoder
//! returns the 56 bytes at offset 8 of the admin completion.

use crate::bytes::{put, put_u16, put_u32, put_u64, put_u8};
use crate::defs::{device_caps, FeatureId, AENQ_GROUPS_SUPPORTED};

/// Bytes of feature data in a GET_FEATURE completion.
pub const FEATURE_DATA_LEN: usize = 56;

/// The inline data a 64-byte TX WQE has room for.
pub const INLINE_BUF_SIZE: u32 = 32;
/// Buffer descriptors a TX WQE has room for.
pub const MAX_SEND_SGES: u16 = 2;
/// Receive descriptors one receive WQE may chain.
pub const MAX_RECV_SGES: u16 = 2;
/// Bytes of one TX WQE in the LLQ.
pub const TX_WQE_SIZE: u32 = 64;
/// Bytes of one receive descriptor.
pub const RX_DESC_SIZE: u32 = 16;
/// QPs a UAR page has doorbells for: SQ at `8 * slot`, RQ at
/// `8 * slot + 4`.
pub const MAX_QP_LIMIT: u32 = 256;
/// CQs a UAR page has doorbells for, at `0x800 + 4 * slot`.
pub const MAX_CQ_LIMIT: u32 = 512;
/// Memory keys are 24 bits: `slot + 1` in the low bits, a generation
/// above, so a slot's next MR gets another key.
pub const MAX_MR_LIMIT: u32 = 1 << 16;
/// Largest page list the device accepts (16 GiB of 4 KiB pages).
pub const MAX_MR_PAGES_LIMIT: u32 = 1 << 22;

/// The attributes of one EFA function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttrs {
    /// The port's GID (GID[0]): the device's fabric address.
    pub gid: [u8; 16],
    /// Largest SEND or UD message in bytes (the port's `max_msg_sz`).
    pub mtu: u32,
    /// Node GUID.
    pub guid: u64,
    /// Firmware version (the driver keeps it, `ibv_devinfo` shows 0.0.0.0).
    pub fw_version: u32,
    /// Device version.
    pub device_version: u32,
    /// [`device_caps`] bits.
    pub device_caps: u32,
    /// Largest RDMA read or write of one WQE.
    pub max_rdma_size: u32,
    /// Link speed in Gb/s.
    pub max_link_speed_gbps: u16,
    /// Page sizes REG_MR accepts (bit k: 2^k).
    pub page_size_cap: u64,
    /// QPs (a power of two, at most [`MAX_QP_LIMIT`]).
    pub max_qp: u32,
    /// WQEs in a send queue (the LLQ holds `max_llq_size / 64`).
    pub max_sq_depth: u32,
    /// Receive descriptors in a receive queue.
    pub max_rq_depth: u32,
    /// CQs (at most [`MAX_CQ_LIMIT`]).
    pub max_cq: u32,
    /// Entries in a CQ.
    pub max_cq_depth: u32,
    /// MRs.
    pub max_mr: u32,
    /// Pages one MR may span.
    pub max_mr_pages: u32,
    /// Protection domains.
    pub max_pd: u32,
    /// Address handles.
    pub max_ah: u32,
    /// Bytes of LLQ (BAR2) per QP: its send ring.
    pub max_llq_size: u32,
    /// Event queues (0: no CQ events).
    pub max_eq: u32,
    /// Entries per event queue (a power of two).
    pub max_eq_depth: u32,
    /// User access regions: doorbell pages in BAR4.
    pub max_uar: u32,
    /// HW_HINTS.mmio_read_timeout in ms (0: the driver's 50 ms).
    pub mmio_read_timeout_ms: u16,
}

impl Default for DeviceAttrs {
    fn default() -> Self {
        Self {
            gid: [
                0xfd, 0x00, 0x70, 0x32, 0xef, 0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
            ],
            mtu: 8928,
            guid: 0x7032_efa0_0000_0001,
            fw_version: 0x0001_0000,
            device_version: 0x0000_0001,
            device_caps: device_caps::RDMA_READ | device_caps::RNR_RETRY | device_caps::RDMA_WRITE,
            max_rdma_size: 1 << 30,
            max_link_speed_gbps: 100,
            page_size_cap: 0x7fff_f000,
            max_qp: 64,
            max_sq_depth: 1024,
            max_rq_depth: 4096,
            max_cq: 64,
            max_cq_depth: 8192,
            max_mr: 1024,
            max_mr_pages: MAX_MR_PAGES_LIMIT,
            max_pd: 64,
            max_ah: 256,
            max_llq_size: 64 << 10,
            max_eq: 4,
            max_eq_depth: 512,
            max_uar: 64,
            mmio_read_timeout_ms: 0,
        }
    }
}

/// Why a set of attributes cannot describe a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad device attributes: {0}")]
pub struct AttrsError(pub String);

impl DeviceAttrs {
    /// The GET_FEATURE bits the device answers (DEVICE_ATTR,
    /// AENQ_CONFIG, NETWORK_ATTR, QUEUE_ATTR_1, HW_HINTS, HOST_INFO,
    /// QUEUE_ATTR_2, and EVENT_QUEUE_ATTR with event queues).
    pub fn supported_features(&self) -> u64 {
        let mut bits = 0u64;
        for id in FeatureId::ALL {
            if *id != FeatureId::EventQueueAttr || self.max_eq > 0 {
                bits |= 1 << id.code();
            }
        }
        bits
    }

    /// MSI-X vectors: the management vector and one per event queue.
    pub fn msix_vectors(&self) -> u16 {
        u16::try_from(self.max_eq + 1).unwrap_or(u16::MAX)
    }

    /// BAR2's size: every QP's LLQ ring, a power of two.
    pub fn llq_bar_size(&self) -> u64 {
        (u64::from(self.max_qp) * u64::from(self.max_llq_size)).next_power_of_two()
    }

    /// BAR4's size: one doorbell page per UAR, a power of two.
    pub fn db_bar_size(&self) -> u64 {
        (u64::from(self.max_uar) * crate::regs::DB_PAGE_SIZE).next_power_of_two()
    }

    /// Checks the limits the device's layout depends on.
    pub fn validate(&self) -> Result<(), AttrsError> {
        let fail = |what: String| Err(AttrsError(what));
        if !self.max_qp.is_power_of_two() || self.max_qp > MAX_QP_LIMIT {
            return fail(format!(
                "max_qp {} must be a power of two up to {MAX_QP_LIMIT}",
                self.max_qp
            ));
        }
        if self.max_cq == 0 || self.max_cq > MAX_CQ_LIMIT {
            return fail(format!("max_cq {} must be 1..={MAX_CQ_LIMIT}", self.max_cq));
        }
        if self.max_mr == 0 || self.max_mr > MAX_MR_LIMIT {
            return fail(format!("max_mr {} must be 1..={MAX_MR_LIMIT}", self.max_mr));
        }
        if self.max_mr_pages == 0 || self.max_mr_pages > MAX_MR_PAGES_LIMIT {
            return fail(format!(
                "max_mr_pages {} must be 1..={MAX_MR_PAGES_LIMIT}",
                self.max_mr_pages
            ));
        }
        if !self.max_llq_size.is_power_of_two()
            || self.max_llq_size < 4096
            || self.max_llq_size > 1 << 20
        {
            return fail(format!(
                "max_llq_size {} must be a power of two in 4 KiB..=1 MiB",
                self.max_llq_size
            ));
        }
        if self.max_sq_depth == 0 || self.max_sq_depth > self.max_llq_size / TX_WQE_SIZE {
            return fail(format!(
                "max_sq_depth {} must be 1..={} (max_llq_size / 64)",
                self.max_sq_depth,
                self.max_llq_size / TX_WQE_SIZE
            ));
        }
        if self.max_rq_depth == 0 || self.max_rq_depth > 1 << 15 {
            return fail(format!(
                "max_rq_depth {} must be 1..=32768",
                self.max_rq_depth
            ));
        }
        if self.max_cq_depth == 0 || self.max_cq_depth > 1 << 15 {
            return fail(format!(
                "max_cq_depth {} must be 1..=32768",
                self.max_cq_depth
            ));
        }
        if self.max_pd == 0 || self.max_pd > 1 << 15 {
            return fail(format!("max_pd {} must be 1..=32768", self.max_pd));
        }
        if self.max_ah == 0 || self.max_ah > 1 << 15 {
            return fail(format!("max_ah {} must be 1..=32768", self.max_ah));
        }
        if self.max_uar == 0 || self.max_uar > 1024 {
            return fail(format!("max_uar {} must be 1..=1024", self.max_uar));
        }
        if self.max_eq > 32 {
            return fail(format!("max_eq {} must be at most 32", self.max_eq));
        }
        if self.max_eq > 0
            && (!self.max_eq_depth.is_power_of_two()
                || !(16..=1 << 15).contains(&self.max_eq_depth))
        {
            return fail(format!(
                "max_eq_depth {} must be a power of two in 16..=32768",
                self.max_eq_depth
            ));
        }
        if !(256..=65535 - 64).contains(&self.mtu) {
            return fail(format!("mtu {} must be 256..=65471", self.mtu));
        }
        if self.page_size_cap & (1 << 12) == 0 {
            return fail("page_size_cap must include 4 KiB pages".into());
        }
        if self.max_rdma_size == 0 {
            return fail("max_rdma_size must not be 0".into());
        }
        if self.gid == [0; 16] {
            return fail("the GID must not be all zeros".into());
        }
        Ok(())
    }

    /// The feature data GET_FEATURE answers for `feature`, with the AENQ
    /// groups the driver enabled; `None` for a feature it cannot get.
    pub fn feature_data(
        &self,
        feature: FeatureId,
        aenq_enabled: u32,
    ) -> Option<[u8; FEATURE_DATA_LEN]> {
        let mut d = [0u8; FEATURE_DATA_LEN];
        match feature {
            FeatureId::DeviceAttr => {
                put_u64(&mut d, 0, self.supported_features());
                put_u64(&mut d, 8, self.page_size_cap);
                put_u32(&mut d, 16, self.fw_version);
                put_u32(&mut d, 20, 1); // admin_api_version
                put_u32(&mut d, 24, self.device_version);
                put_u16(&mut d, 28, u16::from(crate::regs::DB_BAR));
                put_u8(&mut d, 30, 48); // phys_addr_width
                put_u8(&mut d, 31, 48); // virt_addr_width
                put_u32(&mut d, 32, self.device_caps);
                put_u32(&mut d, 36, self.max_rdma_size);
                // The driver copies this field into ib_device.node_guid,
                // a big-endian value: ibv_devinfo shows its bytes in
                // order, so `--guid 0x7032efa000000001` reads
                // 7032:efa0:0000:0001.
                d[40..48].copy_from_slice(&self.guid.to_be_bytes());
                put_u16(&mut d, 48, self.max_link_speed_gbps);
            }
            FeatureId::QueueAttr1 => {
                put_u32(&mut d, 0, self.max_qp);
                put_u32(&mut d, 4, self.max_sq_depth);
                put_u32(&mut d, 8, INLINE_BUF_SIZE);
                put_u32(&mut d, 12, self.max_rq_depth);
                put_u32(&mut d, 16, self.max_cq);
                put_u32(&mut d, 20, self.max_cq_depth);
                put_u16(&mut d, 24, 1); // sub_cqs_per_cq
                put_u16(&mut d, 26, 0); // min_sq_depth
                put_u16(&mut d, 28, MAX_SEND_SGES);
                put_u16(&mut d, 30, MAX_RECV_SGES);
                put_u32(&mut d, 32, self.max_mr);
                put_u32(&mut d, 36, self.max_mr_pages);
                put_u32(&mut d, 40, self.max_pd);
                put_u32(&mut d, 44, self.max_ah);
                put_u32(&mut d, 48, self.max_llq_size);
                put_u16(&mut d, 52, 1); // max_wr_rdma_sges
                put_u16(&mut d, 54, 0); // max_tx_batch: unlimited
            }
            FeatureId::QueueAttr2 => {
                put_u16(&mut d, 0, INLINE_BUF_SIZE as u16);
            }
            FeatureId::NetworkAttr => {
                put(&mut d, 0, &self.gid);
                put_u32(&mut d, 16, self.mtu);
            }
            FeatureId::HwHints => {
                put_u16(&mut d, 0, self.mmio_read_timeout_ms);
            }
            FeatureId::AenqConfig => {
                put_u32(&mut d, 0, AENQ_GROUPS_SUPPORTED);
                put_u32(&mut d, 4, aenq_enabled);
            }
            FeatureId::EventQueueAttr if self.max_eq > 0 => {
                put_u32(&mut d, 0, self.max_eq);
                put_u32(&mut d, 4, self.max_eq_depth);
                put_u32(&mut d, 8, 1); // completion events
            }
            FeatureId::EventQueueAttr | FeatureId::HostInfo => return None,
        }
        Some(d)
    }
}

/// Parses a GID as an IPv6 address (`fd00::1`).
pub fn parse_gid(text: &str) -> Result<[u8; 16], String> {
    let address: std::net::Ipv6Addr = text
        .parse()
        .map_err(|_| format!("{text:?} is not a GID (an IPv6 address such as fd00::1)"))?;
    let gid = address.octets();
    if gid == [0; 16] {
        return Err("the GID must not be all zeros".into());
    }
    Ok(gid)
}

/// A GID as an IPv6 address, as `ibv_devinfo` prints it in hex words.
pub fn format_gid(gid: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*gid).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{u16_at, u32_at, u64_at};

    /// Catches: feature layouts drifting from the driver's structs (the
    /// offsets are those `efa_admin_cmds_defs.h` gives), or a feature the
    /// driver must get missing from supported_features.
    #[test]
    fn features_land_where_the_driver_reads_them() {
        let attrs = DeviceAttrs::default();
        attrs.validate().unwrap();
        let features = attrs.supported_features();
        assert_eq!(features & 0x3c, 0x3c, "probe needs 2, 3, 4, 5");
        assert_eq!(features, 0x2fe);
        let dev = attrs.feature_data(FeatureId::DeviceAttr, 0).unwrap();
        assert_eq!(u64_at(&dev, 0), 0x2fe);
        assert_eq!(u64_at(&dev, 8), 0x7fff_f000);
        assert_eq!(u32_at(&dev, 20), 1, "admin_api_version");
        assert_eq!(u16_at(&dev, 28), 4, "db_bar");
        assert_eq!(u32_at(&dev, 32), 0b1011);
        assert_eq!(dev[40..48], attrs.guid.to_be_bytes(), "guid, big-endian");
        let q = attrs.feature_data(FeatureId::QueueAttr1, 0).unwrap();
        assert_eq!(u32_at(&q, 0), 64);
        assert_eq!(u32_at(&q, 8), 32, "inline_buf_size");
        assert_eq!(u16_at(&q, 24), 1, "sub_cqs_per_cq");
        assert_eq!(u32_at(&q, 48), 65536, "max_llq_size");
        assert_eq!(u16_at(&q, 54), 0, "max_tx_batch");
        let net = attrs.feature_data(FeatureId::NetworkAttr, 0).unwrap();
        assert_eq!(&net[..16], &attrs.gid);
        assert_eq!(u32_at(&net, 16), 8928);
        let aenq = attrs.feature_data(FeatureId::AenqConfig, 0x1e).unwrap();
        assert_eq!((u32_at(&aenq, 0), u32_at(&aenq, 4)), (0x1e, 0x1e));
        assert!(attrs.feature_data(FeatureId::HostInfo, 0).is_none());
        assert_eq!(attrs.llq_bar_size(), 4 << 20);
        assert_eq!(attrs.db_bar_size(), 256 << 10);
        assert_eq!(attrs.msix_vectors(), 5);
    }

    /// Catches: attributes the layout cannot hold being accepted.
    #[test]
    fn bad_attributes_are_refused() {
        let bad = [
            DeviceAttrs {
                max_qp: 48,
                ..Default::default()
            },
            DeviceAttrs {
                max_sq_depth: 2048,
                ..Default::default()
            },
            DeviceAttrs {
                max_eq_depth: 100,
                ..Default::default()
            },
            DeviceAttrs {
                gid: [0; 16],
                ..Default::default()
            },
            DeviceAttrs {
                page_size_cap: 1 << 21,
                ..Default::default()
            },
        ];
        for attrs in bad {
            assert!(attrs.validate().is_err(), "{attrs:?}");
        }
        let no_eq = DeviceAttrs {
            max_eq: 0,
            ..Default::default()
        };
        no_eq.validate().unwrap();
        assert_eq!(no_eq.supported_features() & 0x80, 0);
        assert!(no_eq.feature_data(FeatureId::EventQueueAttr, 0).is_none());
    }

    #[test]
    fn gids_parse_as_ipv6() {
        assert_eq!(parse_gid("fd00::2").unwrap()[15], 2);
        assert!(parse_gid("::").is_err());
        assert!(parse_gid("10.0.0.1").is_err());
        assert_eq!(format_gid(&parse_gid("fd00::2").unwrap()), "fd00::2");
    }
}
