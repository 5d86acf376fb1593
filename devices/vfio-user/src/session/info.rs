//! Device, region and interrupt information, and SET_IRQS.

use std::os::fd::{AsFd, FromRawFd, IntoRawFd, OwnedFd};

use tracing::debug;
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_TYPE_MASK,
    VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_BOOL, VFIO_IRQ_SET_DATA_EVENTFD,
    VFIO_IRQ_SET_DATA_NONE, VFIO_IRQ_SET_DATA_TYPE_MASK, VFIO_REGION_INFO_CAP_SPARSE_MMAP,
    VFIO_REGION_INFO_FLAG_CAPS, VFIO_REGION_INFO_FLAG_MMAP,
};
use vmm_sys_util::eventfd::EventFd;

use super::{CommandOutcome, Refusal, Reply, Session};
use crate::device::{IrqAction, IrqData, IrqSet};
use crate::fdkind::{fd_target, is_eventfd, set_nonblocking};
use crate::protocol::{Reader, Writer};

/// Size of `struct vfio_region_info` (argsz .. offset).
const REGION_INFO_SIZE: usize = 32;
/// Size of `struct vfio_device_info` and `struct vfio_irq_info` replies.
const DEVICE_INFO_SIZE: u32 = 16;
const IRQ_INFO_SIZE: u32 = 16;

impl Session<'_> {
    pub(super) fn device_get_info(&mut self, payload: &[u8]) -> CommandOutcome {
        let argsz = Reader::new(payload)
            .u32()
            .ok_or_else(|| Refusal::inval("DEVICE_GET_INFO without argsz"))?;
        if argsz < DEVICE_INFO_SIZE {
            return Err(Refusal::inval(format!(
                "DEVICE_GET_INFO argsz {argsz} < {DEVICE_INFO_SIZE}"
            )));
        }
        let info = self.device.device_info();
        let mut w = Writer::with_capacity(16);
        w.u32(DEVICE_INFO_SIZE)
            .u32(info.flags)
            .u32(info.num_regions)
            .u32(info.num_irqs);
        Ok(Reply::with(w.finish()))
    }

    pub(super) fn check_region_index(&self, index: u32) -> Result<(), Refusal> {
        let regions = self.device.device_info().num_regions;
        if index >= regions {
            return Err(Refusal::inval(format!(
                "region {index} does not exist ({regions} regions)"
            )));
        }
        Ok(())
    }

    pub(super) fn region_info(&mut self, payload: &[u8]) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let (Some(argsz), Some(_flags), Some(index)) = (r.u32(), r.u32(), r.u32()) else {
            return Err(Refusal::inval("GET_REGION_INFO payload too short"));
        };
        if payload.len() < REGION_INFO_SIZE || (argsz as usize) < REGION_INFO_SIZE {
            return Err(Refusal::inval(format!(
                "GET_REGION_INFO argsz {argsz} / payload {} < {REGION_INFO_SIZE}",
                payload.len()
            )));
        }
        self.check_region_index(index)?;
        let info = self.device.region_info(index)?;

        // Sparse-mmap capability, placed right after vfio_region_info.
        let mut caps = Writer::default();
        if !info.mmap_areas.is_empty() {
            let nr_areas = u32::try_from(info.mmap_areas.len())
                .map_err(|_| Refusal::inval("too many mmap areas"))?;
            caps.u16(VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16)
                .u16(1) // capability version
                .u32(0) // next: end of the list
                .u32(nr_areas)
                .u32(0); // reserved
            for area in &info.mmap_areas {
                caps.u64(area.offset).u64(area.size);
            }
        }
        let caps = caps.finish();
        let needed = REGION_INFO_SIZE + caps.len();
        let needed32 =
            u32::try_from(needed).map_err(|_| Refusal::inval("region info too large"))?;
        // VFIO semantics: if the caller's buffer is too small, report the
        // size needed and leave the capabilities (and the fd) for the retry.
        let complete = argsz as usize >= needed;

        let mut region_flags = info.flags;
        if info.fd.is_some() {
            region_flags |= VFIO_REGION_INFO_FLAG_MMAP;
        }
        let mut cap_offset = 0;
        if complete && !caps.is_empty() {
            region_flags |= VFIO_REGION_INFO_FLAG_CAPS;
            cap_offset = REGION_INFO_SIZE as u32;
        } else {
            region_flags &= !VFIO_REGION_INFO_FLAG_CAPS;
        }
        debug!(
            index,
            size = info.size,
            flags = region_flags,
            fd = info.fd.is_some(),
            areas = info.mmap_areas.len(),
            argsz,
            needed,
            "GET_REGION_INFO"
        );
        let mut w = Writer::with_capacity(needed);
        w.u32(needed32)
            .u32(region_flags)
            .u32(index)
            .u32(cap_offset)
            .u64(info.size)
            .u64(info.fd_offset);
        if complete {
            w.bytes(&caps);
        }
        Ok(Reply {
            payload: w.finish(),
            fd: if complete { info.fd } else { None },
        })
    }

    pub(super) fn irq_info(&mut self, payload: &[u8]) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let (Some(argsz), Some(_flags), Some(index)) = (r.u32(), r.u32(), r.u32()) else {
            return Err(Refusal::inval("GET_IRQ_INFO payload too short"));
        };
        if argsz < IRQ_INFO_SIZE {
            return Err(Refusal::inval(format!(
                "GET_IRQ_INFO argsz {argsz} < {IRQ_INFO_SIZE}"
            )));
        }
        self.check_irq_index(index)?;
        let info = self.device.irq_info(index)?;
        debug!(
            index,
            flags = info.flags,
            count = info.count,
            "GET_IRQ_INFO"
        );
        let mut w = Writer::with_capacity(16);
        w.u32(IRQ_INFO_SIZE)
            .u32(info.flags)
            .u32(index)
            .u32(info.count);
        Ok(Reply::with(w.finish()))
    }

    pub(super) fn check_irq_index(&self, index: u32) -> Result<(), Refusal> {
        let irqs = self.device.device_info().num_irqs;
        if index >= irqs {
            return Err(Refusal::inval(format!(
                "irq index {index} does not exist ({irqs} indexes)"
            )));
        }
        Ok(())
    }

    pub(super) fn set_irqs(&mut self, payload: &[u8], fds: Vec<OwnedFd>) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let (Some(_argsz), Some(set_flags), Some(index), Some(start), Some(count)) =
            (r.u32(), r.u32(), r.u32(), r.u32(), r.u32())
        else {
            return Err(Refusal::inval("SET_IRQS payload shorter than 20 bytes"));
        };
        debug!(
            index,
            start,
            count,
            flags = set_flags,
            fds = fds.len(),
            "SET_IRQS"
        );
        let data_kind = set_flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
        let action_kind = set_flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
        if set_flags & !(VFIO_IRQ_SET_DATA_TYPE_MASK | VFIO_IRQ_SET_ACTION_TYPE_MASK) != 0
            || data_kind.count_ones() != 1
            || action_kind.count_ones() != 1
        {
            return Err(Refusal::inval(format!(
                "SET_IRQS flags {set_flags:#x} must name one data type and one action"
            )));
        }
        let action = match action_kind {
            VFIO_IRQ_SET_ACTION_MASK => IrqAction::Mask,
            VFIO_IRQ_SET_ACTION_UNMASK => IrqAction::Unmask,
            VFIO_IRQ_SET_ACTION_TRIGGER => IrqAction::Trigger,
            _ => return Err(Refusal::inval("unknown SET_IRQS action")),
        };
        self.check_irq_index(index)?;

        // count 0 + DATA_NONE + TRIGGER: disable every vector of the index.
        if count == 0 && data_kind == VFIO_IRQ_SET_DATA_NONE && action == IrqAction::Trigger {
            if !fds.is_empty() {
                return Err(Refusal::inval("fds sent with DATA_NONE"));
            }
            self.device.set_irqs(IrqSet {
                index,
                action,
                start,
                count: 0,
                data: IrqData::EventFds(Vec::new()),
            })?;
            return Ok(Reply::empty());
        }

        if count == 0 {
            // Nothing to act on. QEMU never sends this; refuse the data
            // kinds where it would be ambiguous with "disable all".
            if data_kind == VFIO_IRQ_SET_DATA_NONE && fds.is_empty() {
                return Ok(Reply::empty());
            }
            return Err(Refusal::inval("SET_IRQS with count 0"));
        }
        let vectors = self.device.irq_info(index)?.count;
        match start.checked_add(count) {
            Some(end) if end <= vectors => {}
            _ => {
                return Err(Refusal::inval(format!(
                    "vectors {start}+{count} exceed the {vectors} of irq index {index}"
                )))
            }
        }
        let data = match data_kind {
            VFIO_IRQ_SET_DATA_NONE => {
                if !fds.is_empty() {
                    return Err(Refusal::inval("fds sent with DATA_NONE"));
                }
                IrqData::None
            }
            VFIO_IRQ_SET_DATA_BOOL => {
                if !fds.is_empty() {
                    return Err(Refusal::inval("fds sent with DATA_BOOL"));
                }
                let bools = r.take(count as usize).ok_or_else(|| {
                    Refusal::inval(format!("DATA_BOOL needs {count} bytes of data"))
                })?;
                IrqData::Bool(bools.iter().map(|&b| b != 0).collect())
            }
            VFIO_IRQ_SET_DATA_EVENTFD => {
                if fds.is_empty() {
                    // No fds: unbind the vectors (QEMU sends -1 this way).
                    IrqData::EventFds((0..count).map(|_| None).collect())
                } else if fds.len() == count as usize {
                    // Only real eventfds, made non-blocking: a pipe or a
                    // counter pre-filled to its maximum would otherwise
                    // block the thread that signals the interrupt.
                    for (i, fd) in fds.iter().enumerate() {
                        if !is_eventfd(fd.as_fd()) {
                            let what = fd_target(fd.as_fd()).unwrap_or_else(|e| e.to_string());
                            return Err(Refusal::inval(format!(
                                "DATA_EVENTFD fd {i} is not an eventfd ({what})"
                            )));
                        }
                        set_nonblocking(fd.as_fd()).map_err(|e| {
                            Refusal::new(
                                e.raw_os_error().unwrap_or(libc::EINVAL),
                                format!("cannot make interrupt eventfd {i} non-blocking: {e}"),
                            )
                        })?;
                    }
                    IrqData::EventFds(
                        fds.into_iter()
                            // SAFETY: each fd was received over the socket
                            // and is owned by us alone; EventFd takes over
                            // that ownership.
                            .map(|fd| Some(unsafe { EventFd::from_raw_fd(fd.into_raw_fd()) }))
                            .collect(),
                    )
                } else {
                    return Err(Refusal::inval(format!(
                        "DATA_EVENTFD with {} fds for {count} vectors",
                        fds.len()
                    )));
                }
            }
            _ => return Err(Refusal::inval("unknown SET_IRQS data type")),
        };
        self.device.set_irqs(IrqSet {
            index,
            action,
            start,
            count,
            data,
        })?;
        Ok(Reply::empty())
    }
}
