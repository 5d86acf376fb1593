//! The send engine: doorbells, WQEs taken out of the LLQ, packets out.
//!
//! A doorbell write (register path) only records the new producer count
//! and wakes the engine. The engine takes one WQE at a time, round robin
//! over the QPs: it copies the 64 bytes out of BAR2 under the state lock
//! (plain shared memory, no DMA), checks the phase against its own count,
//! parses the copy, resolves the AH and the MRs, gathers the data through
//! the gate, and queues packets. SRD messages stay in the reliability
//! table until acknowledged; the engine also sends them again when their
//! time is up and serves the RDMA reads peers ask for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use p2plab_dma::{DmaFaultKind, GuestMemory};
use p2plab_kit::Epoch;

use super::reliability::{rto, segment_len, segments, Pending, Work, MAX_TRIES, RNR_FOREVER};
use super::state::{lock, Mr, Qp, SendJob};
use super::{events, Device, Progress};
use crate::admin::mr_access;
use crate::defs::{device_caps, IoOp, IoStatus, QpType};
use crate::frame::{Body, Header, Packet, SEGMENT_SIZE};
use crate::io::{parse_tx_wqe, wqe_phase, Buf, Cqe, TxBody, TxWqe, TX_WQE_SIZE};
use crate::regs::DB_PAGE_SIZE;
use crate::stats::Stats;

/// Longest the engine sleeps without a reason to wake.
const IDLE: Duration = Duration::from_millis(50);
/// Where CQ doorbells start in a UAR page.
pub(crate) const CQ_DB_BASE: u64 = 0x800;

/// A send-queue doorbell's offset in the doorbell BAR.
pub(crate) fn sq_db_offset(uar: u16, slot: usize) -> u64 {
    u64::from(uar) * DB_PAGE_SIZE + slot as u64 * 8
}

/// A CQ doorbell's offset in the doorbell BAR.
pub(crate) fn cq_db_offset(uar: u16, slot: usize) -> u64 {
    u64::from(uar) * DB_PAGE_SIZE + CQ_DB_BASE + slot as u64 * 4
}

/// A 32-bit write to the doorbell BAR: (page → UAR, offset → queue of that
/// UAR). Writes that reach no queue are counted and ignored.
pub(crate) fn doorbell(device: &Device, offset: u64, value: u32) {
    let uar = usize::try_from(offset / DB_PAGE_SIZE).unwrap_or(usize::MAX);
    let within = offset % DB_PAGE_SIZE;
    let mut state = device.lock();
    let bad = |device: &Device, what: &str| {
        Stats::add(&device.stats.bad_doorbells, 1);
        p2plab_ratelimit::log_limited!(debug, offset, value, "doorbell ignored: {what}");
    };
    if state.objects.uars.get(uar).is_none() {
        return bad(device, "no such UAR");
    }
    if within < CQ_DB_BASE {
        let slot = (within / 8) as usize;
        let rq = within % 8 == 4;
        let Some(qp) = state
            .objects
            .qps
            .get_mut(slot)
            .filter(|qp| usize::from(qp.uar) == uar)
        else {
            return bad(device, "no QP there");
        };
        let producer = value as u16;
        if rq {
            if u32::from(producer.wrapping_sub(qp.rq_head)) > qp.rq_entries {
                return bad(device, "RQ producer beyond the ring");
            }
            qp.rq_tail = producer;
            Stats::add(&device.stats.rq_doorbells, 1);
        } else {
            if u32::from(producer.wrapping_sub(qp.sq_head)) > qp.sq_entries {
                return bad(device, "SQ producer beyond the ring");
            }
            qp.sq_tail = producer;
            Stats::add(&device.stats.sq_doorbells, 1);
            drop(state);
            device.send_wake.notify_all();
        }
    } else {
        let slot = ((within - CQ_DB_BASE) / 4) as usize;
        let Some(cq) = state
            .objects
            .cqs
            .get(slot)
            .filter(|cq| usize::from(cq.uar) == uar)
        else {
            return bad(device, "no CQ there");
        };
        let _ = cq;
        Stats::add(&device.stats.cq_doorbells, 1);
        drop(state);
        if value & (1 << 31) != 0 {
            events::arm_cq(device, slot as u16, value as u16);
        }
    }
}

/// A WQE taken off a send queue, with what the engine needs of its QP.
struct Taken {
    qp: Qp,
    raw: [u8; TX_WQE_SIZE],
    index: u16,
    epoch: Epoch,
}

/// What a completion of a send-queue WQE needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    pub qp_num: u16,
    pub send_cq: u16,
    pub req_id: u16,
    pub op: IoOp,
    pub comp_req: bool,
    pub epoch: Epoch,
    pub bytes: u64,
}

impl Completion {
    pub(crate) fn of(pending: &Pending) -> Self {
        Self {
            qp_num: pending.qp_num,
            send_cq: pending.send_cq,
            req_id: pending.req_id,
            op: pending.op,
            comp_req: pending.comp_req,
            epoch: pending.epoch,
            bytes: pending.bytes,
        }
    }
}

/// Completes a send-queue WQE (call without the data-path lock): an
/// error always gets a completion, success one if it was asked for.
pub(crate) fn complete_send(device: &Device, c: Completion, status: IoStatus) {
    let _datapath = device.datapath.read();
    let alive = device
        .lock()
        .objects
        .qp_by_num(c.qp_num, device.attrs.max_qp)
        .is_some_and(|(_, qp)| qp.send_cq == c.send_cq);
    if !alive {
        return;
    }
    let stats = &device.stats;
    match (c.op, status == IoStatus::Ok) {
        (IoOp::RdmaRead, true) => {
            Stats::add(&stats.read_wrs, 1);
            Stats::add(&stats.read_bytes, c.bytes);
        }
        (IoOp::RdmaRead, false) => Stats::add(&stats.read_wr_err, 1),
        (IoOp::RdmaWrite, true) => {
            Stats::add(&stats.write_wrs, 1);
            Stats::add(&stats.write_bytes, c.bytes);
        }
        (IoOp::RdmaWrite, false) => Stats::add(&stats.write_wr_err, 1),
        (_, true) => {
            Stats::add(&stats.send_wrs, 1);
            Stats::add(&stats.send_bytes, c.bytes);
        }
        (_, false) => {}
    }
    if c.comp_req || status != IoStatus::Ok {
        device.post_cqe(
            c.send_cq,
            c.epoch,
            Cqe::send(c.req_id, status, c.op, c.qp_num),
        );
    }
}

/// The send engine's thread.
pub(crate) fn send_engine(device: &Device) {
    let mut next_qp = 0usize;
    while send_step(device, &mut next_qp, true) != Progress::Stop {}
}

/// One step of the send engine: timers due, then a read to serve or a
/// WQE to run (round robin from `next_qp`). With `wait` it waits for
/// work or the next timer (the thread); without, it returns
/// [`Progress::Idle`] instead (the engines on the caller's thread).
pub(crate) fn send_step(device: &Device, next_qp: &mut usize, wait: bool) -> Progress {
    let next_deadline = run_timers(device);
    let mut state = device.lock();
    if state.shutdown {
        return Progress::Stop;
    }
    if let Some(job) = state.send_jobs.pop_front() {
        drop(state);
        match job {
            SendJob::ServeRead {
                header,
                rkey,
                addr,
                length,
            } => serve_read(device, header, rkey, addr, length),
        }
        return Progress::Worked;
    }
    if let Some(taken) = take_wqe(device, &mut state, next_qp) {
        drop(state);
        execute(device, taken);
        return Progress::Worked;
    }
    if !wait {
        return Progress::Idle;
    }
    let wait = next_deadline
        .map_or(IDLE, |d| d.saturating_duration_since(Instant::now()))
        .clamp(Duration::from_micros(100), IDLE);
    drop(
        device
            .send_wake
            .wait_timeout(state, wait)
            .unwrap_or_else(|e| e.into_inner()),
    );
    Progress::Idle
}

/// The next WQE to work on, round robin over the QPs.
fn take_wqe(
    device: &Device,
    state: &mut super::state::State,
    next_qp: &mut usize,
) -> Option<Taken> {
    if !state.bus_master {
        return None;
    }
    let slots = device.attrs.max_qp as usize;
    for i in 0..slots {
        let slot = (*next_qp + i) % slots;
        let Some(qp) = state.objects.qps.get_mut(slot) else {
            continue;
        };
        if !qp.can_send() || qp.sq_pending() == 0 {
            continue;
        }
        let index = qp.sq_head;
        let at = qp.llq_offset + u64::from(u32::from(index) % qp.sq_entries) * TX_WQE_SIZE as u64;
        let mut raw = [0u8; TX_WQE_SIZE];
        if let Err(fault) = device.llq.read(at, &mut raw) {
            tracing::error!(error = %fault, "LLQ read outside BAR2");
            return None;
        }
        qp.sq_head = qp.sq_head.wrapping_add(1);
        *next_qp = slot + 1;
        return Some(Taken {
            qp: qp.clone(),
            raw,
            index,
            epoch: device.gate.epoch(),
        });
    }
    None
}

/// Why a WQE cannot go: the status its completion gets (`None`: the work
/// vanished with a reset).
type Refusal = Option<IoStatus>;

fn refuse(status: IoStatus) -> Refusal {
    Some(status)
}

/// Runs one WQE.
fn execute(device: &Device, taken: Taken) {
    let expected_phase = (u32::from(taken.index) / taken.qp.sq_entries) % 2 == 1;
    let parsed = if wqe_phase(&taken.raw) != expected_phase {
        Err(crate::io::BadWqe {
            req_id: crate::bytes::u16_at(&taken.raw, 0),
            comp_req: true,
            op: IoOp::Send,
            status: IoStatus::LocalQpInternalError,
            why: "WQE phase does not match the doorbell",
        })
    } else {
        parse_tx_wqe(&taken.raw)
    };
    let completion = |req_id, op, comp_req, bytes| Completion {
        qp_num: taken.qp.num,
        send_cq: taken.qp.send_cq,
        req_id,
        op,
        comp_req,
        epoch: taken.epoch,
        bytes,
    };
    let wqe = match parsed {
        Ok(wqe) => wqe,
        Err(bad) => {
            Stats::add(&device.stats.bad_wqes, 1);
            p2plab_ratelimit::log_limited!(debug, qp = taken.qp.num, why = bad.why, "bad WQE");
            device.trace.record("wqe", || {
                serde_json::json!({"name": "bad WQE", "qp_num": taken.qp.num, "req_id": bad.req_id, "why": bad.why})
            });
            complete_send(device, completion(bad.req_id, bad.op, true, 0), bad.status);
            return;
        }
    };
    trace_wqe(device, &taken, &wqe);
    let op = wqe.op();
    let started = match &wqe.body {
        TxBody::Inline(_) | TxBody::Gather(_) => send_message(device, &taken, &wqe),
        TxBody::Read { remote, local } => start_read(device, &taken, &wqe, *remote, *local),
        TxBody::Write { remote, local } => start_write(device, &taken, &wqe, *remote, *local),
    };
    if let Err(Some(status)) = started {
        Stats::add(&device.stats.bad_wqes, 1);
        complete_send(device, completion(wqe.req_id, op, wqe.comp_req, 0), status);
    }
}

fn trace_wqe(device: &Device, taken: &Taken, wqe: &TxWqe) {
    device.trace.record("wqe", || {
        let (length, extra) = match &wqe.body {
            TxBody::Inline(data) => (data.len() as u64, serde_json::json!({"inline_msg": true})),
            TxBody::Gather(bufs) => (
                bufs.iter().map(|b| u64::from(b.length)).sum(),
                serde_json::json!({"sgl": bufs.iter().map(|b| serde_json::json!({"length": b.length, "lkey": b.lkey, "buf_addr": p2plab_trace::hex(b.addr)})).collect::<Vec<_>>()}),
            ),
            TxBody::Read { remote, local } | TxBody::Write { remote, local } => (
                u64::from(remote.length),
                serde_json::json!({"rkey": remote.lkey, "remote_addr": p2plab_trace::hex(remote.addr), "lkey": local.lkey, "local_addr": p2plab_trace::hex(local.addr)}),
            ),
        };
        serde_json::json!({
            "name": wqe.op().name(),
            "qp_num": taken.qp.num,
            "req_id": wqe.req_id,
            "dest_qp_num": wqe.dest_qp,
            "ah": wqe.ah,
            "qkey": p2plab_trace::hex(u64::from(wqe.qkey)),
            "has_imm": wqe.imm.is_some(),
            "length": length,
            "data": extra,
        })
    });
}

/// The destination GID of `ah`, if it is an AH of the QP's PD.
fn resolve_ah(device: &Device, qp: &Qp, ah: u16) -> Result<[u8; 16], IoStatus> {
    let state = device.lock();
    state
        .objects
        .ahs
        .get(usize::from(ah))
        .filter(|a| a.pd == qp.pd)
        .map(|a| a.gid)
        .ok_or(IoStatus::LocalInvalidAh)
}

/// The MR behind `key` if the QP's PD owns it and it has `access`.
pub(crate) fn mr_for(device: &Device, pd: u16, key: u32, access: u8) -> Option<Arc<Mr>> {
    let state = device.lock();
    state
        .objects
        .mr_by_key(key, device.key_bits)
        .filter(|mr| mr.pd == pd && mr.access & access == access)
        .cloned()
}

/// Whether `mr` is still registered (not deregistered and replaced).
pub(crate) fn still_registered(device: &Device, mr: &Arc<Mr>) -> bool {
    device
        .lock()
        .objects
        .mr_by_key(mr.key, device.key_bits)
        .is_some_and(|current| Arc::ptr_eq(current, mr))
}

/// Reads `len` bytes at `va` of `mr` for work of `epoch`.
pub(crate) fn read_mr(
    device: &Device,
    mr: &Mr,
    va: u64,
    len: usize,
    epoch: Epoch,
) -> Result<Vec<u8>, Refusal> {
    let mut segments = Vec::new();
    if !mr.list.segments(va, len as u64, &mut segments) {
        return Err(refuse(IoStatus::LocalInvalidLkey));
    }
    let memory = device.gate.bound(epoch);
    let mut data = vec![0u8; len];
    let mut at = 0;
    for (addr, seg_len) in segments {
        if let Err(fault) = memory.read(addr, &mut data[at..at + seg_len]) {
            return Err(if device.dma_failed("data read", &fault) {
                refuse(IoStatus::LocalQpInternalError)
            } else {
                None
            });
        }
        count_peer(device, addr, seg_len as u64);
        at += seg_len;
    }
    Ok(data)
}

/// Writes `data` at `va` of `mr` for work of `epoch`.
pub(crate) fn write_mr(
    device: &Device,
    mr: &Mr,
    va: u64,
    data: &[u8],
    epoch: Epoch,
) -> Result<(), Option<DmaFaultKind>> {
    let mut segments = Vec::new();
    if !mr.list.segments(va, data.len() as u64, &mut segments) {
        return Err(Some(DmaFaultKind::Unmapped));
    }
    let memory = device.gate.bound(epoch);
    let mut at = 0;
    for (addr, seg_len) in segments {
        if let Err(fault) = memory.write(addr, &data[at..at + seg_len]) {
            return Err(device
                .dma_failed("data write", &fault)
                .then_some(fault.kind));
        }
        count_peer(device, addr, seg_len as u64);
        at += seg_len;
    }
    Ok(())
}

/// Counts bytes that went to or from a peer device's BAR.
fn count_peer(device: &Device, addr: u64, len: u64) {
    if matches!(
        device.gate.locate(addr, len),
        p2plab_dma::BusTarget::PeerBar | p2plab_dma::BusTarget::PeerDirect
    ) {
        Stats::add(&device.stats.peer_bar_bytes, len);
    }
}

/// A new message ID.
fn message_id(device: &Device) -> u64 {
    device
        .next_msg_id
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn header(device: &Device, taken: &Taken, wqe: &TxWqe, dst: [u8; 16], msg_id: u64) -> Header {
    Header {
        src_gid: device.gid(),
        dst_gid: dst,
        src_qp: taken.qp.num,
        dst_qp: wqe.dest_qp,
        qkey: wqe.qkey,
        msg_id,
    }
}

fn pending(taken: &Taken, wqe: &TxWqe, header: Header, work: Work, bytes: u64) -> Pending {
    Pending {
        qp_num: taken.qp.num,
        send_cq: taken.qp.send_cq,
        req_id: wqe.req_id,
        comp_req: wqe.comp_req,
        op: wqe.op(),
        epoch: taken.epoch,
        header,
        work,
        bytes,
        deadline: Instant::now() + rto(1),
        tries: 1,
        rnr_tries: 0,
        rnr_limit: taken.qp.rnr_retry,
        rnr_wait: false,
    }
}

/// A SEND: gathered, put on the fabric, tracked until acknowledged (SRD)
/// or completed at once (UD).
fn send_message(device: &Device, taken: &Taken, wqe: &TxWqe) -> Result<(), Refusal> {
    let (dst, data) = {
        let _datapath = device.datapath.read();
        let dst = resolve_ah(device, &taken.qp, wqe.ah).map_err(refuse)?;
        let data = match &wqe.body {
            TxBody::Inline(data) => data.clone(),
            TxBody::Gather(bufs) => {
                let total: u64 = bufs.iter().map(|b| u64::from(b.length)).sum();
                if total > u64::from(device.attrs.mtu) {
                    return Err(refuse(IoStatus::LocalBadLength));
                }
                let mut data = Vec::with_capacity(total as usize);
                for buf in bufs {
                    let mr = mr_for(device, taken.qp.pd, buf.lkey, 0)
                        .ok_or(Some(IoStatus::LocalInvalidLkey))?;
                    data.extend(read_mr(
                        device,
                        &mr,
                        buf.addr,
                        buf.length as usize,
                        taken.epoch,
                    )?);
                }
                data
            }
            _ => return Err(refuse(IoStatus::LocalUnsupportedOp)),
        };
        if data.len() > device.attrs.mtu as usize {
            return Err(refuse(IoStatus::LocalBadLength));
        }
        (dst, data)
    };
    let reliable = taken.qp.ty == QpType::Srd;
    let bytes = data.len() as u64;
    let msg_id = message_id(device);
    let packet = Packet {
        header: header(device, taken, wqe, dst, msg_id),
        body: Body::Send {
            reliable,
            imm: wqe.imm,
            data,
        },
    };
    let encoded = packet.encode();
    if !reliable {
        // UD: done once it left, whatever happens to it.
        if device.port_up() {
            device.transmit(&dst, encoded, true);
        }
        let c = Completion {
            qp_num: taken.qp.num,
            send_cq: taken.qp.send_cq,
            req_id: wqe.req_id,
            op: IoOp::Send,
            comp_req: wqe.comp_req,
            epoch: taken.epoch,
            bytes,
        };
        complete_send(device, c, IoStatus::Ok);
        return Ok(());
    }
    if !device.port_up() {
        return Err(refuse(IoStatus::LocalUnreachRemote));
    }
    lock(&device.reliability).pending.insert(
        msg_id,
        pending(
            taken,
            wqe,
            packet.header,
            Work::Send {
                packet: encoded.clone(),
            },
            bytes,
        ),
    );
    device.transmit(&dst, encoded, true);
    Ok(())
}

/// Checks the local buffer of an RDMA of `remote.length` bytes.
fn rdma_local(
    device: &Device,
    taken: &Taken,
    remote: Buf,
    local: Buf,
    access: u8,
    cap: u32,
) -> Result<Arc<Mr>, Refusal> {
    if device.attrs.device_caps & cap == 0 || taken.qp.ty != QpType::Srd {
        return Err(refuse(IoStatus::LocalUnsupportedOp));
    }
    if remote.length > local.length || remote.length > device.attrs.max_rdma_size {
        return Err(refuse(IoStatus::LocalBadLength));
    }
    let mr =
        mr_for(device, taken.qp.pd, local.lkey, access).ok_or(Some(IoStatus::LocalInvalidLkey))?;
    if !mr.list.contains(local.addr, u64::from(remote.length)) {
        return Err(refuse(IoStatus::LocalInvalidLkey));
    }
    Ok(mr)
}

/// An RDMA read: asks the target for the data; completes when all of it
/// has landed in the local buffer.
fn start_read(
    device: &Device,
    taken: &Taken,
    wqe: &TxWqe,
    remote: Buf,
    local: Buf,
) -> Result<(), Refusal> {
    let (dst, mr) = {
        let _datapath = device.datapath.read();
        let mr = rdma_local(
            device,
            taken,
            remote,
            local,
            mr_access::LOCAL_WRITE,
            device_caps::RDMA_READ,
        )?;
        (resolve_ah(device, &taken.qp, wqe.ah).map_err(refuse)?, mr)
    };
    let completion = Completion {
        qp_num: taken.qp.num,
        send_cq: taken.qp.send_cq,
        req_id: wqe.req_id,
        op: IoOp::RdmaRead,
        comp_req: wqe.comp_req,
        epoch: taken.epoch,
        bytes: 0,
    };
    if remote.length == 0 {
        complete_send(device, completion, IoStatus::Ok);
        return Ok(());
    }
    if !device.port_up() {
        return Err(refuse(IoStatus::LocalUnreachRemote));
    }
    let msg_id = message_id(device);
    let packet = Packet {
        header: header(device, taken, wqe, dst, msg_id),
        body: Body::ReadReq {
            rkey: remote.lkey,
            addr: remote.addr,
            length: remote.length,
        },
    };
    let request = packet.encode();
    let count = segments(remote.length);
    let work = Work::Read {
        request: request.clone(),
        mr,
        local: local.addr,
        length: remote.length,
        received: vec![false; count],
        left: count,
    };
    lock(&device.reliability).pending.insert(
        msg_id,
        pending(taken, wqe, packet.header, work, u64::from(remote.length)),
    );
    device.transmit(&dst, request, true);
    Ok(())
}

/// An RDMA write: its data in segments the target acknowledges one by
/// one, then (with immediate data) the immediate.
fn start_write(
    device: &Device,
    taken: &Taken,
    wqe: &TxWqe,
    remote: Buf,
    local: Buf,
) -> Result<(), Refusal> {
    let (dst, mr) = {
        let _datapath = device.datapath.read();
        let mr = rdma_local(device, taken, remote, local, 0, device_caps::RDMA_WRITE)?;
        (resolve_ah(device, &taken.qp, wqe.ah).map_err(refuse)?, mr)
    };
    if remote.length == 0 && wqe.imm.is_none() {
        let c = Completion {
            qp_num: taken.qp.num,
            send_cq: taken.qp.send_cq,
            req_id: wqe.req_id,
            op: IoOp::RdmaWrite,
            comp_req: wqe.comp_req,
            epoch: taken.epoch,
            bytes: 0,
        };
        complete_send(device, c, IoStatus::Ok);
        return Ok(());
    }
    if !device.port_up() {
        return Err(refuse(IoStatus::LocalUnreachRemote));
    }
    let msg_id = message_id(device);
    let head = header(device, taken, wqe, dst, msg_id);
    let count = segments(remote.length);
    let imm_packet = (count == 0).then(|| write_imm_packet(&head, wqe.imm.unwrap_or(0), 0));
    let work = Work::Write {
        mr: Arc::clone(&mr),
        local: local.addr,
        remote,
        acked: vec![false; count],
        left: count,
        imm: wqe.imm,
        imm_packet: imm_packet.clone(),
    };
    lock(&device.reliability).pending.insert(
        msg_id,
        pending(taken, wqe, head, work, u64::from(remote.length)),
    );
    if let Some(packet) = imm_packet {
        device.transmit(&dst, packet, true);
        return Ok(());
    }
    for index in 0..count {
        if !send_write_segment(device, &head, &mr, local.addr, remote, index, taken.epoch) {
            break;
        }
    }
    Ok(())
}

/// The packet carrying a finished write's immediate.
pub(crate) fn write_imm_packet(head: &Header, imm: u32, total: u32) -> Vec<u8> {
    Packet {
        header: *head,
        body: Body::WriteImm { imm, total },
    }
    .encode()
}

/// Reads and sends segment `index` of a write; false when the write
/// cannot go on (its MR is gone or a reset overtook it).
fn send_write_segment(
    device: &Device,
    head: &Header,
    mr: &Arc<Mr>,
    local: u64,
    remote: Buf,
    index: usize,
    epoch: Epoch,
) -> bool {
    let offset = (index * SEGMENT_SIZE) as u64;
    let len = segment_len(remote.length, index);
    let data = {
        let _datapath = device.datapath.read();
        if !still_registered(device, mr) {
            return false;
        }
        match read_mr(device, mr, local + offset, len, epoch) {
            Ok(data) => data,
            Err(_) => return false,
        }
    };
    let packet = Packet {
        header: *head,
        body: Body::Write {
            rkey: remote.lkey,
            addr: remote.addr,
            offset,
            total: remote.length,
            data,
        },
    };
    device.transmit(&head.dst_gid, packet.encode(), true)
}

/// What a due message needs.
enum Resend {
    Packet(Vec<u8>),
    Segments {
        head: Header,
        mr: Arc<Mr>,
        local: u64,
        remote: Buf,
        indices: Vec<usize>,
        epoch: Epoch,
    },
    GiveUp(Completion, IoStatus),
}

/// Sends due messages again (or gives up on them); the next deadline.
fn run_timers(device: &Device) -> Option<Instant> {
    let now = Instant::now();
    let (due, next) = lock(&device.reliability).due(now);
    for msg_id in due {
        let action = {
            let mut rel = lock(&device.reliability);
            let answered = rel.answered.clone();
            let Some(p) = rel.pending.get_mut(&msg_id) else {
                continue;
            };
            if p.rnr_wait {
                p.rnr_wait = false;
                p.deadline = now + rto(p.tries);
                resend_of(p)
            } else {
                p.tries += 1;
                Stats::add(&device.stats.retrans_timeout_events, 1);
                let reached = answered.contains(&p.header.dst_gid);
                if p.tries > MAX_TRIES {
                    let status = if reached {
                        IoStatus::LocalUnrespRemote
                    } else {
                        IoStatus::LocalUnreachRemote
                    };
                    Stats::add(&device.stats.unresponsive_remote_events, 1);
                    let c = Completion::of(p);
                    rel.pending.remove(&msg_id);
                    Resend::GiveUp(c, status)
                } else {
                    if reached {
                        Stats::add(&device.stats.impaired_remote_conn_events, 1);
                    }
                    p.deadline = now + rto(p.tries);
                    resend_of(p)
                }
            }
        };
        match action {
            Resend::Packet(packet) => {
                Stats::add(&device.stats.retrans_pkts, 1);
                Stats::add(&device.stats.retrans_bytes, packet.len() as u64);
                let dst = crate::bytes::gid_at(&packet, 24);
                device.transmit(&dst, packet, true);
            }
            Resend::Segments {
                head,
                mr,
                local,
                remote,
                indices,
                epoch,
            } => {
                for index in indices {
                    Stats::add(&device.stats.retrans_pkts, 1);
                    Stats::add(
                        &device.stats.retrans_bytes,
                        segment_len(remote.length, index) as u64,
                    );
                    if !send_write_segment(device, &head, &mr, local, remote, index, epoch) {
                        break;
                    }
                }
            }
            Resend::GiveUp(c, status) => complete_send(device, c, status),
        }
    }
    next
}

fn resend_of(p: &Pending) -> Resend {
    match &p.work {
        Work::Send { packet } => Resend::Packet(packet.clone()),
        Work::Read { request, .. } => Resend::Packet(request.clone()),
        Work::Write {
            imm_packet: Some(packet),
            ..
        } => Resend::Packet(packet.clone()),
        Work::Write {
            mr,
            local,
            remote,
            acked,
            ..
        } => Resend::Segments {
            head: p.header,
            mr: Arc::clone(mr),
            local: *local,
            remote: *remote,
            indices: acked
                .iter()
                .enumerate()
                .filter(|(_, &a)| !a)
                .map(|(i, _)| i)
                .collect(),
            epoch: p.epoch,
        },
    }
}

/// Marks a message for an RNR retry after the delay; false when its RNR
/// retries are spent.
pub(crate) fn rnr_retry(p: &mut Pending) -> bool {
    p.rnr_tries += 1;
    if p.rnr_limit != RNR_FOREVER && p.rnr_tries > u32::from(p.rnr_limit) {
        return false;
    }
    p.rnr_wait = true;
    p.deadline = Instant::now() + super::reliability::RNR_DELAY;
    true
}

/// Serves an RDMA read a peer asked for: the data in segments, or the
/// error.
fn serve_read(device: &Device, request: Header, rkey: u32, addr: u64, length: u32) {
    let reply = request.reply();
    let send = |status: IoStatus, offset: u64, data: Vec<u8>| {
        let packet = Packet {
            header: reply,
            body: Body::ReadResp {
                status: status.code(),
                offset,
                data,
            },
        };
        device.transmit(&reply.dst_gid, packet.encode(), true)
    };
    let checked = {
        let _datapath = device.datapath.read();
        let epoch = device.gate.epoch();
        let qp = device
            .lock()
            .objects
            .qp_by_num(request.dst_qp, device.attrs.max_qp)
            .map(|(_, qp)| qp.clone());
        match qp {
            Some(qp) if qp.ty == QpType::Srd && qp.can_receive() => {
                match mr_for(device, qp.pd, rkey, mr_access::REMOTE_READ) {
                    Some(mr)
                        if length <= device.attrs.max_rdma_size
                            && mr.list.contains(addr, u64::from(length)) =>
                    {
                        Ok((mr, epoch))
                    }
                    _ => Err(IoStatus::RemoteBadAddress),
                }
            }
            _ => Err(IoStatus::RemoteBadDestQpn),
        }
    };
    let (mr, epoch) = match checked {
        Ok(ok) => ok,
        Err(status) => {
            send(status, 0, Vec::new());
            return;
        }
    };
    for index in 0..segments(length) {
        let offset = (index * SEGMENT_SIZE) as u64;
        let len = segment_len(length, index);
        let data = {
            let _datapath = device.datapath.read();
            if !still_registered(device, &mr) {
                Err(IoStatus::RemoteBadAddress)
            } else {
                read_mr(device, &mr, addr + offset, len, epoch)
                    .map_err(|e| e.map_or(IoStatus::RemoteAbort, |_| IoStatus::RemoteBadStatus))
            }
        };
        match data {
            Ok(data) => {
                Stats::add(&device.stats.read_resp_bytes, data.len() as u64);
                if !send(IoStatus::Ok, offset, data) {
                    return;
                }
            }
            Err(status) => {
                send(status, offset, Vec::new());
                return;
            }
        }
    }
}
