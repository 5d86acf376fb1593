//! Registered GPU memory ([`GpuBuffer`]) and a P2P refusal ([`Refusal`]):
//! what the executor works on and reports, without knowing the driver
//! that registered the buffer or remembers the refusal.

use std::sync::Arc;

use crate::error::{ErrorCode, GdsError, Result};
use crate::gpu::GpuDevice;
use crate::report::Reason;
use crate::vram::{VramKind, VramLocation, VramMapping};

/// A P2P refusal the driver remembers for a (file system, GPU) pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub errno: i32,
    pub detail: String,
}

/// Registered GPU memory: where it is in VRAM and the GPU it belongs to.
#[derive(Debug)]
pub struct GpuBuffer {
    pub addr: u64,
    pub len: u64,
    pub location: VramLocation,
    gpu: Arc<GpuDevice>,
    /// Keeps a library-made mapping alive while registered.
    _owner: Option<Arc<VramMapping>>,
}

impl GpuBuffer {
    /// A buffer at `[addr, addr + len)` found at `location` on `gpu`;
    /// `owner` keeps a library-made mapping alive while registered.
    pub(crate) fn new(
        addr: u64,
        len: u64,
        location: VramLocation,
        gpu: Arc<GpuDevice>,
        owner: Option<Arc<VramMapping>>,
    ) -> Self {
        Self {
            addr,
            len,
            location,
            gpu,
            _owner: owner,
        }
    }

    pub fn gpu(&self) -> &GpuDevice {
        &self.gpu
    }

    pub fn p2pmem(&self) -> bool {
        self.location.kind == VramKind::P2pmem
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.location.vram_offset + offset),
            _ => Err(GdsError::new(
                ErrorCode::MemoryNotRegistered,
                format!(
                    "[{offset}, +{len}) reaches past the registered {} bytes",
                    self.len
                ),
            )
            .with_errno(libc::EINVAL)),
        }
    }

    /// VRAM offset of buffer byte `offset`.
    pub fn vram_offset(&self, offset: u64) -> u64 {
        self.location.vram_offset + offset
    }

    /// CRC32C of buffer bytes `[offset, offset + len)`, computed by the
    /// GPU's engine in VRAM.
    pub fn checksum(&self, offset: u64, len: u64) -> Result<u32> {
        let vram = self.check_range(offset, len)?;
        self.gpu.checksum(vram, len)
    }

    /// Host memory -> buffer at `offset` (the GPU engine copies).
    pub fn copy_from_host(&self, offset: u64, data: &[u8]) -> Result<()> {
        let vram = self.check_range(offset, data.len() as u64)?;
        self.gpu.copy_to_vram(vram, data)
    }

    /// Buffer at `offset` -> host memory (the GPU engine copies).
    pub fn copy_to_host(&self, offset: u64, data: &mut [u8]) -> Result<()> {
        let vram = self.check_range(offset, data.len() as u64)?;
        self.gpu.copy_from_vram(vram, data)
    }

    pub fn fill(&self, offset: u64, len: u64, pattern: u32) -> Result<()> {
        let vram = self.check_range(offset, len)?;
        self.gpu.fill(vram, len, pattern)
    }
}
