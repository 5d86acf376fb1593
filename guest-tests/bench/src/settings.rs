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
    pub copy_topology: String,
    pub copy_len: String,
    pub rdma_topology: String,
    pub rdma_len: String,
    pub rdma_post: String,
    pub rdma_mtus: Vec<u32>,
}
