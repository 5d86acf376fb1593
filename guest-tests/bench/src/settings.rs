//! What a bench run did, as its reports state it: when, how many rounds of
//! what, and the boots' topologies and extra arguments.

use std::path::PathBuf;

use p2plab_lab::Accel;

/// The settings of one bench run (from the command line and the anchor
/// topology the run wrote).
pub struct Settings {
    /// `YYYYmmdd-HHMMSS`, UTC, when the run started.
    pub date_utc: String,
    pub rounds: u32,
    pub runtime_s: u32,
    /// The accelerator every boot of the run used (`kvm`, `tcg`): one for
    /// all, so the sides compare under the same one.
    pub accel: Accel,
    /// p2plab-nvme's `--caching`.
    pub caching: &'static str,
    pub ours_topology: String,
    /// Extra arguments of every NVMe server.
    pub nvme_extra_args: Vec<String>,
    /// The anchor topology as run (a copy with the cache mode set).
    pub anchor_topology: PathBuf,
    /// Its `-drive` line as run.
    pub anchor_drive: String,
    /// The SPDK anchor, with `--anchor spdk=DIR`.
    pub spdk: Option<SpdkSettings>,
    pub copy_topology: String,
    pub copy_len: String,
    pub rdma_topology: String,
    pub rdma_len: String,
    pub rdma_post: String,
    pub rdma_mtus: Vec<u32>,
}

/// The SPDK anchor as run.
pub struct SpdkSettings {
    /// The SPDK build folder and its version (include/spdk/version.h).
    pub dir: PathBuf,
    pub version: String,
    /// QEMU's anchor topology without its nvme, as run.
    pub topology: PathBuf,
    /// The `-device vfio-user-pci` argument that attaches nvmf_tgt's
    /// controller.
    pub device: String,
    /// The aio bdev's backing file.
    pub disk: PathBuf,
}
