//! The NVM command set: its command table and handlers, run on the I/O
//! queue workers.

use std::sync::atomic::{AtomicU64, Ordering};

use p2plab_dma::Access;

use crate::context::{CommandContext, CommandResult, Outcome};
use crate::datapointer::{DataBuffer, DataPointers, DataTransfer, Direction};
use crate::fault::LbaRange;
use crate::fields::{CommandFields, DatasetManagement, DsmRange, Flush, ReadWrite, WriteZeroes};
use crate::memory::Placement;
use crate::namespace::{io_error_status, FlushError, MediaAccess, Namespace};
use crate::spec::effects::{CSUPP, LBCC};
use crate::spec::{io, Status, NSID_ALL};
use crate::state::ControllerState;
use crate::table::{CommandRow, CommandTable};

/// Every NVM command this controller supports.
pub(crate) static IO_COMMANDS: CommandTable = CommandTable::new(
    "unsupported I/O opcode",
    DataPointers::PrpOrSgl,
    &[
        CommandRow {
            opcode: io::FLUSH,
            name: "Flush",
            fault_name: "flush",
            run: |cx, cmd| flush(cx, Flush::parse(cmd)?),
            effects: CSUPP | LBCC,
            data: DataTransfer::None,
        },
        CommandRow {
            opcode: io::WRITE,
            name: "Write",
            fault_name: "write",
            run: |cx, cmd| write(cx, ReadWrite::parse(cmd)?),
            effects: CSUPP | LBCC,
            data: DataTransfer::HostToController,
        },
        CommandRow {
            opcode: io::READ,
            name: "Read",
            fault_name: "read",
            run: |cx, cmd| read(cx, ReadWrite::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::ControllerToHost,
        },
        CommandRow {
            opcode: io::COMPARE,
            name: "Compare",
            fault_name: "compare",
            run: |cx, cmd| compare(cx, ReadWrite::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::HostToController,
        },
        CommandRow {
            opcode: io::WRITE_ZEROES,
            name: "Write Zeroes",
            fault_name: "write-zeroes",
            run: |cx, cmd| write_zeroes(cx, WriteZeroes::parse(cmd)?),
            effects: CSUPP | LBCC,
            data: DataTransfer::None,
        },
        CommandRow {
            opcode: io::DATASET_MANAGEMENT,
            name: "Dataset Management",
            fault_name: "dsm",
            run: |cx, cmd| dataset_management(cx, DatasetManagement::parse(cmd)?),
            effects: CSUPP | LBCC,
            data: DataTransfer::HostToController,
        },
        CommandRow {
            opcode: io::VERIFY,
            name: "Verify",
            fault_name: "verify",
            run: |cx, cmd| verify(cx, ReadWrite::parse(cmd)?),
            effects: CSUPP,
            data: DataTransfer::None,
        },
    ],
);

/// Data moves through the worker's bounce buffer in pieces of at most this
/// size, so memory stays bounded even without an MDTS limit.
const IO_CHUNK: u64 = 1 << 20;

/// Runs one I/O command.
pub(crate) fn execute(cx: &mut CommandContext<'_>) -> Outcome {
    let result = IO_COMMANDS.find(cx.cmd.opcode()).and_then(|row| {
        // No fused operations (FUSES = 0).
        if cx.cmd.fuse() != 0 {
            return Err(Status::INVALID_FIELD);
        }
        IO_COMMANDS.run(row, cx)
    });
    Outcome::of(result)
}

/// The namespace a command names, if it may take I/O now.
fn namespace(state: &ControllerState, nsid: u32) -> Result<&Namespace, Status> {
    let ns = state.check_nsid(nsid)?;
    if ns.is_formatting() {
        return Err(Status::FORMAT_IN_PROGRESS);
    }
    Ok(ns)
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// The LBA range of a read/write-like command, with MDTS enforced.
fn data_range(
    state: &ControllerState,
    ns: &Namespace,
    f: &ReadWrite,
) -> Result<(u64, u64), Status> {
    let (offset, len) = ns.byte_range(f.slba, f.blocks())?;
    if state.cfg.max_transfer().is_some_and(|max| len > max) {
        return Err(Status::INVALID_FIELD);
    }
    Ok((offset, len))
}

fn count_data(state: &ControllerState, placement: Placement, direction: Direction) {
    let s = &state.stats;
    match direction {
        Direction::ToHost => {
            add(&s.data_to_cmb_bytes, placement.cmb);
            add(&s.data_to_host_bytes, placement.host);
        }
        Direction::FromHost => {
            add(&s.data_from_cmb_bytes, placement.cmb);
            add(&s.data_from_host_bytes, placement.host);
        }
    }
}

fn backend_error(
    state: &ControllerState,
    ns: &Namespace,
    e: &std::io::Error,
    access: MediaAccess,
) -> Status {
    add(&state.stats.backend_errors, 1);
    p2plab_ratelimit::log_limited!(warn, nsid = ns.nsid(), %e, ?access, "backing store error");
    io_error_status(e, access)
}

/// Flushes `ns`; a failure, now or at any flush since the last
/// controller reset, is a Write Fault.
fn flush_namespace(state: &ControllerState, ns: &Namespace) -> Result<(), Status> {
    match ns.flush() {
        Ok(()) => Ok(()),
        Err(FlushError::Failed(e)) => Err(backend_error(state, ns, &e, MediaAccess::Write)),
        Err(FlushError::Sticky) => {
            add(&state.stats.sticky_flush_failures, 1);
            p2plab_ratelimit::log_limited!(
                warn,
                nsid = ns.nsid(),
                "flush refused: an earlier flush failed (reset the controller)"
            );
            Err(Status::WRITE_FAULT)
        }
    }
}

fn count_read(state: &ControllerState, ns: &Namespace, bytes: u64) {
    for c in [&ns.counters, &state.totals] {
        add(&c.read_commands, 1);
        add(&c.bytes_read, bytes);
    }
}

fn count_write(state: &ControllerState, ns: &Namespace, bytes: u64) {
    for c in [&ns.counters, &state.totals] {
        add(&c.write_commands, 1);
        add(&c.bytes_written, bytes);
    }
}

/// Write-through when the host turned the volatile write cache off.
fn write_cache_enabled(state: &ControllerState) -> bool {
    crate::lock(&state.admin).features.volatile_write_cache
}

/// Fails a read of blocks that an injected media error made unreadable.
fn check_media(state: &ControllerState, ns: &Namespace, f: &ReadWrite) -> Result<(), Status> {
    match state.first_bad_block(ns.nsid(), f.slba, f.blocks()) {
        Some(lba) => {
            add(&state.stats.injected_media_errors, 1);
            tracing::info!(nsid = ns.nsid(), lba, "injected media error");
            Err(Status::UNRECOVERED_READ_ERROR)
        }
        None => Ok(()),
    }
}

/// Injected `corrupt`: flips bit 0 of the first byte of every block of
/// `range` that lies in `data`, which holds blocks from `first_lba` on.
fn corrupt(data: &mut [u8], first_lba: u64, block_size: u64, range: LbaRange) {
    for (i, block) in data.chunks_mut(block_size as usize).enumerate() {
        let lba = first_lba + i as u64;
        if (range.first..=range.last).contains(&lba) {
            if let Some(byte) = block.first_mut() {
                *byte ^= 1;
            }
        }
    }
}

/// Moves `[done, done+n)` of the host buffer `buf` to or from the media at
/// `offset + done` without a bounce buffer: one preadv/pwritev straight
/// between the backing file and guest memory (or a peer's BAR memory).
/// `false` when that memory must be copied (a buffer mixing the CMB and
/// guest memory, the PMR, an SGL Bit Bucket, memory reached only by
/// messages): nothing moved, the caller copies.
fn transfer_direct(
    state: &ControllerState,
    ns: &Namespace,
    buf: &DataBuffer,
    offset: u64,
    done: u64,
    n: u64,
    direction: Direction,
) -> Result<bool, Status> {
    let Some(segments) = buf.direct_segments(done, n)? else {
        return Ok(false);
    };
    let at = offset + done;
    let backend = ns.backend();
    let (result, media) = match direction {
        Direction::ToHost => (
            state
                .mem
                .with_direct(&segments, Access::Write, &mut |slices| {
                    backend.read_vectored_at(at, slices)
                }),
            MediaAccess::Read,
        ),
        Direction::FromHost => (
            state
                .mem
                .with_direct(&segments, Access::Read, &mut |slices| {
                    backend.write_vectored_at(at, slices)
                }),
            MediaAccess::Write,
        ),
    };
    match result {
        Ok(None) => Ok(false),
        Ok(Some((placement, Ok(())))) => {
            count_data(state, placement, direction);
            Ok(true)
        }
        Ok(Some((_, Err(e)))) => Err(backend_error(state, ns, &e, media)),
        Err(e) => {
            tracing::debug!(%e, "zero-copy data transfer failed");
            Err(Status::DATA_TRANSFER_ERROR)
        }
    }
}

fn read(cx: &mut CommandContext<'_>, f: ReadWrite) -> CommandResult {
    let state = cx.state;
    let ns = namespace(state, f.nsid)?;
    let (offset, len) = data_range(state, ns, &f)?;
    check_media(state, ns, &f)?;
    let buf = cx.map_data(len)?;
    let block_size = u64::from(ns.block_size());
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(IO_CHUNK);
        // An injected corruption flips bits on the way, so it copies.
        if cx.corrupt.is_none()
            && transfer_direct(state, ns, &buf, offset, done, n, Direction::ToHost)?
        {
            done += n;
            continue;
        }
        let data = cx.buffers.transfer(n as usize);
        ns.backend()
            .read_at(offset + done, data)
            .map_err(|e| backend_error(state, ns, &e, MediaAccess::Read))?;
        if let Some(range) = cx.corrupt {
            corrupt(data, f.slba + done / block_size, block_size, range);
        }
        let placement = buf.write_to_host_at(&state.mem, done, data)?;
        count_data(state, placement, Direction::ToHost);
        done += n;
    }
    add(&state.stats.read_commands, 1);
    add(&state.stats.bytes_read, len);
    count_read(state, ns, len);
    Ok(Outcome::success())
}

fn write(cx: &mut CommandContext<'_>, f: ReadWrite) -> CommandResult {
    let state = cx.state;
    let ns = namespace(state, f.nsid)?;
    let (offset, len) = data_range(state, ns, &f)?;
    let buf = cx.map_data(len)?;
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(IO_CHUNK);
        if transfer_direct(state, ns, &buf, offset, done, n, Direction::FromHost)? {
            done += n;
            continue;
        }
        let data = cx.buffers.transfer(n as usize);
        let placement = buf.read_from_host_at(&state.mem, done, data)?;
        count_data(state, placement, Direction::FromHost);
        ns.backend()
            .write_at(offset + done, data)
            .map_err(|e| backend_error(state, ns, &e, MediaAccess::Write))?;
        done += n;
    }
    if f.fua || !write_cache_enabled(state) {
        flush_namespace(state, ns)?;
    }
    state.repair_blocks(ns.nsid(), f.slba, f.blocks());
    add(&state.stats.write_commands, 1);
    add(&state.stats.bytes_written, len);
    count_write(state, ns, len);
    Ok(Outcome::success())
}

fn compare(cx: &mut CommandContext<'_>, f: ReadWrite) -> CommandResult {
    let state = cx.state;
    let ns = namespace(state, f.nsid)?;
    let (offset, len) = data_range(state, ns, &f)?;
    check_media(state, ns, &f)?;
    let buf = cx.map_data(len)?;
    add(&state.stats.compare_commands, 1);
    count_read(state, ns, len);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(IO_CHUNK);
        let (host, media) = cx.buffers.host_and_media(n as usize);
        let placement = buf.read_from_host_at(&state.mem, done, host)?;
        count_data(state, placement, Direction::FromHost);
        ns.backend()
            .read_at(offset + done, media)
            .map_err(|e| backend_error(state, ns, &e, MediaAccess::Read))?;
        if host != media {
            return Err(Status::COMPARE_FAILURE);
        }
        done += n;
    }
    Ok(Outcome::success())
}

fn verify(cx: &mut CommandContext<'_>, f: ReadWrite) -> CommandResult {
    let state = cx.state;
    let ns = namespace(state, f.nsid)?;
    // Verify moves no data, so MDTS does not apply; read it all back to
    // find unreadable blocks.
    let (offset, len) = ns.byte_range(f.slba, f.blocks())?;
    check_media(state, ns, &f)?;
    let mut at = offset;
    while at < offset + len {
        let n = (offset + len - at).min(IO_CHUNK);
        let chunk = cx.buffers.transfer(n as usize);
        ns.backend()
            .read_at(at, chunk)
            .map_err(|e| backend_error(state, ns, &e, MediaAccess::Read))?;
        at += n;
    }
    add(&state.stats.verify_commands, 1);
    count_read(state, ns, len);
    Ok(Outcome::success())
}

fn write_zeroes(cx: &mut CommandContext<'_>, f: WriteZeroes) -> CommandResult {
    let state = cx.state;
    let ns = namespace(state, f.nsid)?;
    let (offset, len) = ns.byte_range(f.slba, f.blocks())?;
    let backend = ns.backend();
    let result = if f.deac {
        // Deallocated blocks read as zeroes (DLFEAT), so this is exact.
        backend.discard(offset, len)
    } else {
        backend.write_zeroes(offset, len)
    };
    result.map_err(|e| backend_error(state, ns, &e, MediaAccess::Write))?;
    if f.fua || !write_cache_enabled(state) {
        flush_namespace(state, ns)?;
    }
    state.repair_blocks(ns.nsid(), f.slba, f.blocks());
    add(&state.stats.write_zeroes_commands, 1);
    for c in [&ns.counters, &state.totals] {
        add(&c.write_commands, 1);
    }
    Ok(Outcome::success())
}

fn dataset_management(cx: &mut CommandContext<'_>, f: DatasetManagement) -> CommandResult {
    let state = cx.state;
    let ns = namespace(state, f.nsid)?;
    let len = f.ranges() * DsmRange::SIZE;
    let buf = cx.map_data(len as u64)?;
    let mut raw = vec![0u8; len];
    let placement = buf.read_from_host(&state.mem, &mut raw)?;
    count_data(state, placement, Direction::FromHost);
    add(&state.stats.dsm_commands, 1);
    if !f.ad {
        // Integral read/write hints only: nothing to do.
        return Ok(Outcome::success());
    }
    // Check every range before touching any.
    let mut extents = Vec::with_capacity(f.ranges());
    let (ranges, _) = raw.as_chunks::<{ DsmRange::SIZE }>();
    for range in ranges.iter().map(DsmRange::parse) {
        if range.nlb == 0 {
            continue;
        }
        extents.push((
            ns.byte_range(range.slba, u64::from(range.nlb))?,
            range.slba,
            u64::from(range.nlb),
        ));
    }
    for ((offset, len), slba, blocks) in extents {
        ns.backend().discard(offset, len).map_err(|e| {
            add(&state.stats.backend_errors, 1);
            p2plab_ratelimit::log_limited!(warn, nsid = ns.nsid(), %e, "deallocate failed");
            Status::INTERNAL_ERROR
        })?;
        state.repair_blocks(ns.nsid(), slba, blocks);
    }
    Ok(Outcome::success())
}

fn flush(cx: &mut CommandContext<'_>, f: Flush) -> CommandResult {
    let state = cx.state;
    let targets: Vec<&Namespace> = match f.nsid {
        NSID_ALL => state.namespaces.iter().map(|n| n.as_ref()).collect(),
        nsid => vec![state.check_nsid(nsid)?.as_ref()],
    };
    for ns in targets {
        flush_namespace(state, ns)?;
    }
    add(&state.stats.flush_commands, 1);
    Ok(Outcome::success())
}
