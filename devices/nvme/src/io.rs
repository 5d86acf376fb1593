//! NVM command set I/O commands, run on the I/O queue workers.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::command::{Command, Completion};
use crate::controller::Shared;
use crate::datapointer::{DataBuffer, Direction};
use crate::memory::Placement;
use crate::namespace::{io_error_status, Namespace};
use crate::spec::{io, Status, NSID_ALL};
use crate::worker::Scratch;

type Handled = Result<Completion, Status>;

const FUA: u32 = 1 << 30;
const DEALLOCATE: u32 = 1 << 25;
/// Data moves through the worker's bounce buffer in pieces of at most this
/// size, so memory stays bounded even without an MDTS limit.
const IO_CHUNK: u64 = 1 << 20;

pub(crate) fn execute(shared: &Shared, cmd: &Command, scratch: &mut Scratch) -> Completion {
    let result = match cmd.opcode() {
        io::FLUSH
        | io::WRITE
        | io::READ
        | io::COMPARE
        | io::WRITE_ZEROES
        | io::DATASET_MANAGEMENT
        | io::VERIFY
            if cmd.fuse() != 0 =>
        {
            // No fused operations (FUSES = 0).
            Err(Status::INVALID_FIELD)
        }
        io::FLUSH => flush(shared, cmd),
        io::WRITE
        | io::READ
        | io::COMPARE
        | io::WRITE_ZEROES
        | io::DATASET_MANAGEMENT
        | io::VERIFY => match namespace_for(shared, cmd) {
            Ok(ns) => match cmd.opcode() {
                io::WRITE => write(shared, ns, cmd, scratch),
                io::READ => read(shared, ns, cmd, scratch),
                io::COMPARE => compare(shared, ns, cmd, scratch),
                io::WRITE_ZEROES => write_zeroes(shared, ns, cmd),
                io::DATASET_MANAGEMENT => dataset_management(shared, ns, cmd),
                _ => verify(shared, ns, cmd, scratch),
            },
            Err(status) => Err(status),
        },
        _ => Err(Status::INVALID_OPCODE),
    };
    result.unwrap_or_else(Completion::error)
}

fn namespace_for<'a>(shared: &'a Shared, cmd: &Command) -> Result<&'a Namespace, Status> {
    let ns = shared.check_nsid(cmd.nsid())?;
    if ns.is_formatting() {
        return Err(Status::FORMAT_IN_PROGRESS);
    }
    Ok(ns)
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// The LBA range of a read/write-like command, with MDTS enforced.
fn data_range(shared: &Shared, ns: &Namespace, cmd: &Command) -> Result<(u64, u64), Status> {
    let (offset, len) = ns.byte_range(cmd.slba(), u64::from(cmd.nlb()))?;
    if shared.cfg.max_transfer().is_some_and(|max| len > max) {
        return Err(Status::INVALID_FIELD);
    }
    Ok((offset, len))
}

fn map(shared: &Shared, cmd: &Command, len: u64, dir: Direction) -> Result<DataBuffer, Status> {
    DataBuffer::map(&shared.mem, cmd, len, dir, shared.page_size(), true)
}

fn count_data(shared: &Shared, placement: Placement, to_host: bool) {
    let s = &shared.stats;
    if to_host {
        add(&s.data_to_cmb_bytes, placement.cmb);
        add(&s.data_to_host_bytes, placement.host);
    } else {
        add(&s.data_from_cmb_bytes, placement.cmb);
        add(&s.data_from_host_bytes, placement.host);
    }
}

fn backend_error(shared: &Shared, ns: &Namespace, e: &std::io::Error, writing: bool) -> Status {
    add(&shared.stats.backend_errors, 1);
    tracing::warn!(nsid = ns.nsid(), %e, writing, "backing store error");
    io_error_status(e, writing)
}

fn count_read(shared: &Shared, ns: &Namespace, bytes: u64) {
    for c in [&ns.counters, &shared.totals] {
        add(&c.read_commands, 1);
        add(&c.bytes_read, bytes);
    }
}

fn count_write(shared: &Shared, ns: &Namespace, bytes: u64) {
    for c in [&ns.counters, &shared.totals] {
        add(&c.write_commands, 1);
        add(&c.bytes_written, bytes);
    }
}

/// Write-through when the host turned the volatile write cache off.
fn write_cache_enabled(shared: &Shared) -> bool {
    crate::lock(&shared.admin).features.volatile_write_cache
}

fn read(shared: &Shared, ns: &Namespace, cmd: &Command, scratch: &mut Scratch) -> Handled {
    let (offset, len) = data_range(shared, ns, cmd)?;
    let buf = map(shared, cmd, len, Direction::ToHost)?;
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(IO_CHUNK);
        let data = scratch.data(n as usize);
        ns.backend()
            .read_at(offset + done, data)
            .map_err(|e| backend_error(shared, ns, &e, false))?;
        let placement = buf.write_to_host_at(&shared.mem, done, data)?;
        count_data(shared, placement, true);
        done += n;
    }
    add(&shared.stats.read_commands, 1);
    add(&shared.stats.bytes_read, len);
    count_read(shared, ns, len);
    Ok(Completion::success())
}

fn write(shared: &Shared, ns: &Namespace, cmd: &Command, scratch: &mut Scratch) -> Handled {
    let (offset, len) = data_range(shared, ns, cmd)?;
    let buf = map(shared, cmd, len, Direction::FromHost)?;
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(IO_CHUNK);
        let data = scratch.data(n as usize);
        let placement = buf.read_from_host_at(&shared.mem, done, data)?;
        count_data(shared, placement, false);
        ns.backend()
            .write_at(offset + done, data)
            .map_err(|e| backend_error(shared, ns, &e, true))?;
        done += n;
    }
    if cmd.cdw12() & FUA != 0 || !write_cache_enabled(shared) {
        ns.backend()
            .flush()
            .map_err(|e| backend_error(shared, ns, &e, true))?;
    }
    add(&shared.stats.write_commands, 1);
    add(&shared.stats.bytes_written, len);
    count_write(shared, ns, len);
    Ok(Completion::success())
}

fn compare(shared: &Shared, ns: &Namespace, cmd: &Command, scratch: &mut Scratch) -> Handled {
    let (offset, len) = data_range(shared, ns, cmd)?;
    let buf = map(shared, cmd, len, Direction::FromHost)?;
    add(&shared.stats.compare_commands, 1);
    count_read(shared, ns, len);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(IO_CHUNK);
        let (host, media) = scratch.both(n as usize);
        let placement = buf.read_from_host_at(&shared.mem, done, host)?;
        count_data(shared, placement, false);
        ns.backend()
            .read_at(offset + done, media)
            .map_err(|e| backend_error(shared, ns, &e, false))?;
        if host != media {
            return Err(Status::COMPARE_FAILURE);
        }
        done += n;
    }
    Ok(Completion::success())
}

fn verify(shared: &Shared, ns: &Namespace, cmd: &Command, scratch: &mut Scratch) -> Handled {
    // Verify moves no data, so MDTS does not apply; read it all back to
    // find unreadable blocks.
    let (offset, len) = ns.byte_range(cmd.slba(), u64::from(cmd.nlb()))?;
    let mut at = offset;
    while at < offset + len {
        let n = (offset + len - at).min(IO_CHUNK);
        let chunk = scratch.data(n as usize);
        ns.backend()
            .read_at(at, chunk)
            .map_err(|e| backend_error(shared, ns, &e, false))?;
        at += n;
    }
    add(&shared.stats.verify_commands, 1);
    count_read(shared, ns, len);
    Ok(Completion::success())
}

fn write_zeroes(shared: &Shared, ns: &Namespace, cmd: &Command) -> Handled {
    let (offset, len) = ns.byte_range(cmd.slba(), u64::from(cmd.nlb()))?;
    let backend = ns.backend();
    let result = if cmd.cdw12() & DEALLOCATE != 0 {
        // Deallocated blocks read as zeroes (DLFEAT), so this is exact.
        backend.discard(offset, len)
    } else {
        backend.write_zeroes(offset, len)
    };
    result.map_err(|e| backend_error(shared, ns, &e, true))?;
    if cmd.cdw12() & FUA != 0 || !write_cache_enabled(shared) {
        backend
            .flush()
            .map_err(|e| backend_error(shared, ns, &e, true))?;
    }
    add(&shared.stats.write_zeroes_commands, 1);
    for c in [&ns.counters, &shared.totals] {
        add(&c.write_commands, 1);
    }
    Ok(Completion::success())
}

fn dataset_management(shared: &Shared, ns: &Namespace, cmd: &Command) -> Handled {
    let ranges = (cmd.cdw10() & 0xff) as usize + 1;
    let deallocate = cmd.cdw11() & (1 << 2) != 0;
    let buf = map(shared, cmd, (ranges * 16) as u64, Direction::FromHost)?;
    let mut raw = vec![0u8; ranges * 16];
    let placement = buf.read_from_host(&shared.mem, &mut raw)?;
    count_data(shared, placement, false);
    add(&shared.stats.dsm_commands, 1);
    if !deallocate {
        // Integral read/write hints only: nothing to do.
        return Ok(Completion::success());
    }
    // Check every range before touching any.
    let mut extents = Vec::with_capacity(ranges);
    for range in raw.chunks_exact(16) {
        let nlb = u32::from_le_bytes([range[4], range[5], range[6], range[7]]);
        let mut slba = [0u8; 8];
        slba.copy_from_slice(&range[8..16]);
        let slba = u64::from_le_bytes(slba);
        if nlb == 0 {
            continue;
        }
        extents.push(ns.byte_range(slba, u64::from(nlb))?);
    }
    for (offset, len) in extents {
        ns.backend().discard(offset, len).map_err(|e| {
            add(&shared.stats.backend_errors, 1);
            tracing::warn!(nsid = ns.nsid(), %e, "deallocate failed");
            Status::INTERNAL_ERROR
        })?;
    }
    Ok(Completion::success())
}

fn flush(shared: &Shared, cmd: &Command) -> Handled {
    let targets: Vec<&Namespace> = match cmd.nsid() {
        NSID_ALL => shared.namespaces.iter().map(|n| n.as_ref()).collect(),
        nsid => vec![shared.check_nsid(nsid)?.as_ref()],
    };
    for ns in targets {
        ns.backend()
            .flush()
            .map_err(|e| backend_error(shared, ns, &e, true))?;
    }
    add(&shared.stats.flush_commands, 1);
    Ok(Completion::success())
}
