//! DMA_MAP and DMA_UNMAP.

use std::os::fd::OwnedFd;

use tracing::debug;
use vfio_bindings::bindings::vfio::{
    VFIO_DMA_UNMAP_FLAG_ALL, VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP,
};

use super::{CommandOutcome, Refusal, Reply, Session};
use crate::dma::{DmaError, Perms};
use crate::protocol::{Reader, Writer, DMA_MAP_READ, DMA_MAP_WRITE};

impl Session<'_> {
    pub(super) fn dma_map(&mut self, payload: &[u8], mut fds: Vec<OwnedFd>) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let (Some(_argsz), Some(map_flags), Some(offset), Some(gpa), Some(size)) =
            (r.u32(), r.u32(), r.u64(), r.u64(), r.u64())
        else {
            return Err(Refusal::inval("DMA_MAP payload shorter than 32 bytes"));
        };
        debug!(
            gpa,
            size,
            offset,
            flags = map_flags,
            fd = !fds.is_empty(),
            "DMA_MAP"
        );
        if map_flags & !(DMA_MAP_READ | DMA_MAP_WRITE) != 0 {
            return Err(Refusal::inval(format!(
                "unknown DMA_MAP flags {map_flags:#x}"
            )));
        }
        let perms = Perms {
            read: map_flags & DMA_MAP_READ != 0,
            write: map_flags & DMA_MAP_WRITE != 0,
        };
        if !perms.read && !perms.write {
            return Err(Refusal::inval("DMA_MAP with neither read nor write"));
        }
        if size == 0 {
            return Err(Refusal::inval("DMA_MAP of size 0"));
        }
        if fds.len() > 1 {
            return Err(Refusal::inval("DMA_MAP with more than one fd"));
        }
        if self.dma.mapping_count() >= self.config.max_dma_maps as usize {
            return Err(Refusal::new(
                libc::ENOSPC,
                format!(
                    "already {} DMA mappings (max_dma_maps)",
                    self.config.max_dma_maps
                ),
            ));
        }
        if !fds.is_empty() {
            // Each fd-backed range keeps its fd open and its memory mapped.
            if self.dma.fd_mapping_count() >= self.config.max_fd_dma_maps as usize {
                return Err(Refusal::new(
                    libc::ENOSPC,
                    format!(
                        "already {} DMA mappings with an fd (max_fd_dma_maps)",
                        self.config.max_fd_dma_maps
                    ),
                ));
            }
            let total = self.dma.fd_mapped_bytes().saturating_add(size);
            if total > self.config.max_dma_mapped_bytes {
                return Err(Refusal::new(
                    libc::ENOSPC,
                    format!(
                        "{total:#x} bytes of fd-backed DMA mappings would exceed \
                         max_dma_mapped_bytes {:#x}",
                        self.config.max_dma_mapped_bytes
                    ),
                ));
            }
        }
        match fds.pop() {
            Some(fd) => self.dma.map_fd(gpa, size, perms, fd, offset)?,
            None => self.dma.map_message_only(gpa, size, perms)?,
        }
        self.device.dma_changed();
        Ok(Reply::empty())
    }

    pub(super) fn dma_unmap(&mut self, payload: &[u8]) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let (Some(_argsz), Some(unmap_flags), Some(gpa), Some(size)) =
            (r.u32(), r.u32(), r.u64(), r.u64())
        else {
            return Err(Refusal::inval("DMA_UNMAP payload shorter than 24 bytes"));
        };
        debug!(gpa, size, flags = unmap_flags, "DMA_UNMAP");
        if unmap_flags & VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP != 0 {
            return Err(Refusal::new(
                libc::ENOTSUP,
                "dirty page tracking is not supported",
            ));
        }
        if unmap_flags & !VFIO_DMA_UNMAP_FLAG_ALL != 0 {
            return Err(Refusal::inval(format!(
                "unknown DMA_UNMAP flags {unmap_flags:#x}"
            )));
        }
        if unmap_flags & VFIO_DMA_UNMAP_FLAG_ALL != 0 {
            if gpa != 0 || size != 0 {
                return Err(Refusal::inval("unmap-all with a non-zero range"));
            }
            // Returns once no device access touches the memory any more.
            let drained = self.dma.unmap_all();
            self.device.dma_changed();
            drained?;
        } else {
            if size == 0 {
                return Err(Refusal::inval("DMA_UNMAP of size 0"));
            }
            // Returns once no device access touches the memory any more;
            // an access still running after the timeout fails the unmap
            // (the range is gone either way).
            let drained = self.dma.unmap(gpa, size);
            if matches!(drained, Ok(_) | Err(DmaError::StillInUse { .. })) {
                self.device.dma_changed();
            }
            match drained {
                // Kernel VFIO answers an unmap that covers no mapping with
                // success (0 bytes unmapped), and QEMU relies on it: with a
                // vIOMMU it unmaps whole IOVA windows, mapped or not.
                Err(DmaError::Unmapped { .. }) => {
                    debug!(gpa, size, "DMA_UNMAP covers no mapping: nothing to do");
                }
                other => {
                    other?;
                }
            }
        }
        // The reply echoes the request's entry.
        let mut w = Writer::with_capacity(24);
        w.u32(24).u32(unmap_flags).u64(gpa).u64(size);
        Ok(Reply::with(w.finish()))
    }
}
