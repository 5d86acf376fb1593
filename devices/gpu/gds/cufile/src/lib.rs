//! libcufile.so for p2plab: NVIDIA cuFile's documented C API
//! (`include/cufile.h`, written from the public API reference) over
//! p2plab-gds. Programs written for cuFile link with `-lcufile` and run
//! unchanged but for how they allocate GPU memory (p2plab's p2pmem through
//! `p2plab_gds_mem_alloc`, which this library exports as well). Which path
//! a transfer took and why stays available through the p2plab extension
//! `p2plab_cufile_last_report` (`include/cufile_p2plab.h`).
//!
//! [`error`] holds cuFile's numbers and the mapping from p2plab-gds's;
//! [`api`] the entry points.

pub mod api;
pub mod error;

pub use api::*;
pub use error::OpError;
