//! What the library asks the kernel besides files and sysfs: to open a
//! GPU's device node (the p2plab_gpu driver's ioctls) and where a buffer
//! is physically (pagemap). [`Kernel`] asks the real kernel; a test GPU
//! (the `testing` feature's [`FakeGpu`](crate::testing::FakeGpu)) answers
//! for itself, so that the rest (sysfs, /proc/self/maps, mmap, file I/O,
//! the planner, the registrations, the C ABI) runs for real with no
//! guest driver.

use std::fmt::Debug;

use crate::error::Result;
use crate::gpu::{DevNode, GpuNode};
use crate::vram::physical_contiguous;

pub trait Platform: Send + Sync + Debug {
    /// Opens a GPU's device node (`/dev/p2plab-gpuN`).
    fn open_gpu_node(&self, path: &str) -> std::io::Result<Box<dyn GpuNode>>;

    /// The physical address of `[addr, addr + len)` of this process,
    /// which must be present and physically contiguous.
    fn physical_address(&self, addr: u64, len: u64) -> Result<u64>;
}

/// The running kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct Kernel;

impl Platform for Kernel {
    fn open_gpu_node(&self, path: &str) -> std::io::Result<Box<dyn GpuNode>> {
        Ok(Box::new(DevNode::open(path)?))
    }

    fn physical_address(&self, addr: u64, len: u64) -> Result<u64> {
        physical_contiguous(addr, len)
    }
}
