//! The receive engine: every packet from the fabric (or from the device
//! itself) is checked, then delivered.
//!
//! - SEND: the destination QP must exist, be of the same transport, be
//!   able to receive and have the packet's qkey. A receive WQE is taken
//!   from its ring (descriptors copied once and checked), the data is
//!   scattered through the MRs, a receive completion is written, and an
//!   SRD sender gets an acknowledgement carrying the status it completes
//!   with. No receive posted: SRD answers RNR (the sender tries again), UD
//!   drops. UD data lands after a 40-byte zeroed GRH prefix.
//! - SRD duplicates (a retransmission whose acknowledgement was lost) are
//!   acknowledged again with the remembered status, never delivered twice.
//! - Acknowledgements and read data finish the sender's messages; write
//!   segments land in the target MR; read requests go to the send engine,
//!   which may wait for room on the fabric where this engine must not.

use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::time::Duration;

use p2plab_kit::Epoch;

use super::reliability::{segment_len, Work};
use super::send::{
    complete_send, mr_for, rnr_retry, still_registered, write_imm_packet, write_mr, Completion,
};
use super::state::{lock, Qp, SendJob};
use super::{Device, Progress};
use crate::admin::mr_access;
use crate::attrs::MAX_RECV_SGES;
use crate::defs::{IoOp, IoQueue, IoStatus, QpType};
use crate::frame::{Body, Header, Packet, SEGMENT_SIZE};
use crate::io::{parse_rx_desc, Cqe, RxDesc, RX_DESC_SIZE};
use crate::stats::Stats;

/// Bytes of the GRH space in front of UD data.
pub const UD_PREFIX: usize = 40;
/// The offset an acknowledgement of a write's immediate carries.
const IMM_ACK: u64 = u64::MAX;

/// The receive engine's thread.
pub(crate) fn receive_engine(device: &Device) {
    while receive_step(device, true) != Progress::Stop {}
}

/// One step of the receive engine: the next inbound packet, handled.
/// With `wait` it waits up to 20 ms for one (the thread); without, it
/// takes only one already there (the engines on the caller's thread).
pub(crate) fn receive_step(device: &Device, wait: bool) -> Progress {
    if device.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return Progress::Stop;
    }
    let packet = {
        let inbound = lock(&device.inbound_rx);
        let received = if wait {
            inbound.recv_timeout(Duration::from_millis(20))
        } else {
            inbound.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            })
        };
        match received {
            Ok(packet) => packet,
            Err(RecvTimeoutError::Timeout) => return Progress::Idle,
            Err(RecvTimeoutError::Disconnected) => return Progress::Stop,
        }
    };
    handle_packet(device, &packet);
    Progress::Worked
}

/// Handles one packet's bytes.
pub(crate) fn handle_packet(device: &Device, bytes: &[u8]) {
    Stats::add(&device.stats.rx_pkts, 1);
    Stats::add(&device.stats.rx_bytes, bytes.len() as u64);
    let packet = match Packet::decode(bytes) {
        Ok(packet) => packet,
        Err(e) => {
            Stats::add(&device.stats.bad_packets, 1);
            Stats::add(&device.stats.rx_drops, 1);
            p2plab_ratelimit::log_limited!(debug, error = %e, "packet dropped");
            return;
        }
    };
    let header = packet.header;
    if header.dst_gid != device.gid() {
        Stats::add(&device.stats.rx_drops, 1);
        return;
    }
    device.trace.record("packet", || {
        serde_json::json!({
            "name": packet.kind().name(),
            "src_qp": header.src_qp,
            "dst_qp": header.dst_qp,
            "msg_id": p2plab_trace::hex(header.msg_id),
            "len": bytes.len(),
        })
    });
    match packet.body {
        Body::Send {
            reliable,
            imm,
            data,
        } => on_send(device, &header, reliable, imm, &data, None),
        Body::WriteImm { imm, total } => {
            on_send(device, &header, true, Some(imm), &[], Some(total))
        }
        Body::Ack { status, offset } => on_ack(device, &header, status, offset),
        Body::ReadReq { rkey, addr, length } => {
            device.lock().send_jobs.push_back(SendJob::ServeRead {
                header,
                rkey,
                addr,
                length,
            });
            device.send_wake.notify_all();
        }
        Body::ReadResp {
            status,
            offset,
            data,
        } => on_read_data(device, &header, status, offset, &data),
        Body::Write {
            rkey,
            addr,
            offset,
            total,
            data,
        } => on_write(device, &header, rkey, addr, offset, total, &data),
    }
}

/// Sends an acknowledgement (never waits: a lost one is asked for again).
fn ack(device: &Device, header: &Header, status: IoStatus, offset: u64) {
    let reply = header.reply();
    let packet = Packet {
        header: reply,
        body: Body::Ack {
            status: status.code(),
            offset,
        },
    };
    device.transmit(&reply.dst_gid, packet.encode(), false);
}

/// The QP a packet is for, with the epoch to do its DMA in.
fn target_qp(device: &Device, header: &Header) -> Option<(usize, Qp, Epoch)> {
    let state = device.lock();
    let epoch = device.gate.epoch();
    state
        .objects
        .qp_by_num(header.dst_qp, device.attrs.max_qp)
        .map(|(slot, qp)| (slot, qp.clone(), epoch))
}

/// A receive WQE taken off a QP's ring.
struct Receive {
    req_id: u16,
    bufs: Vec<RxDesc>,
}

/// Takes the next receive WQE of `qp` (`Ok(None)`: none posted). A
/// malformed one is consumed and reported with its request ID.
fn take_receive(
    device: &Device,
    slot: usize,
    qp: &Qp,
    epoch: Epoch,
) -> Result<Option<Receive>, (u16, IoStatus)> {
    let posted = qp.rq_tail.wrapping_sub(qp.rq_head);
    if posted == 0 || qp.rq_entries == 0 {
        return Ok(None);
    }
    let memory = device.gate.bound(epoch);
    let mut descs = Vec::new();
    let mut outcome = Err((0, IoStatus::LocalQpInternalError));
    for k in 0..u16::min(posted, MAX_RECV_SGES) {
        let index = qp.rq_head.wrapping_add(k);
        let at = qp.rq_ring + u64::from(u32::from(index) % qp.rq_entries) * RX_DESC_SIZE as u64;
        let mut raw = [0u8; RX_DESC_SIZE];
        if let Err(fault) = p2plab_dma::GuestMemory::read(&memory, at, &mut raw) {
            if !device.dma_failed("receive descriptor read", &fault) {
                return Ok(None);
            }
            descs.push(parse_rx_desc(&raw));
            break;
        }
        let desc = parse_rx_desc(&raw);
        descs.push(desc);
        if k == 0 && !desc.first {
            break;
        }
        if desc.last {
            outcome = Ok(());
            break;
        }
    }
    let consumed = descs.len().max(1) as u16;
    let req_id = descs.first().map_or(0, |d| d.req_id);
    {
        let mut state = device.lock();
        match state.objects.qps.get_mut(slot) {
            Some(current) if current.num == qp.num && current.rq_head == qp.rq_head => {
                current.rq_head = current.rq_head.wrapping_add(consumed);
            }
            _ => return Ok(None),
        }
    }
    match outcome {
        Ok(()) => Ok(Some(Receive {
            req_id,
            bufs: descs,
        })),
        Err((_, status)) => Err((req_id, status)),
    }
}

/// The receiver's AH number for `gid` in `pd`, or 0xffff.
fn ah_of(device: &Device, pd: u16, gid: &[u8; 16]) -> u16 {
    device
        .lock()
        .objects
        .ahs
        .iter()
        .find(|(_, ah)| ah.pd == pd && ah.gid == *gid)
        .map_or(0xffff, |(slot, _)| slot as u16)
}

/// A SEND, or (with `write_total`) the immediate of a finished write.
fn on_send(
    device: &Device,
    header: &Header,
    reliable: bool,
    imm: Option<u32>,
    data: &[u8],
    write_total: Option<u32>,
) {
    let imm_ack = if write_total.is_some() { IMM_ACK } else { 0 };
    if reliable {
        if let Some(status) = lock(&device.reliability).seen.get(header) {
            Stats::add(&device.stats.duplicates, 1);
            ack(
                device,
                header,
                IoStatus::from_code(status).unwrap_or(IoStatus::RemoteBadStatus),
                imm_ack,
            );
            return;
        }
    }
    let answer = {
        let _datapath = device.datapath.read();
        deliver(device, header, reliable, imm, data, write_total)
    };
    let Some(status) = answer else {
        return;
    };
    if reliable {
        if status != IoStatus::RemoteRnr {
            lock(&device.reliability).seen.record(header, status.code());
        }
        ack(device, header, status, imm_ack);
    }
}

/// Delivers a message into a receive WQE; the status for the sender, or
/// `None` when it is dropped without an answer.
fn deliver(
    device: &Device,
    header: &Header,
    reliable: bool,
    imm: Option<u32>,
    data: &[u8],
    write_total: Option<u32>,
) -> Option<IoStatus> {
    let drop_it = |device: &Device| {
        Stats::add(&device.stats.rx_drops, 1);
        None
    };
    let Some((slot, qp, epoch)) = target_qp(device, header) else {
        return if reliable {
            Some(IoStatus::RemoteBadDestQpn)
        } else {
            drop_it(device)
        };
    };
    let transport_matches = (qp.ty == QpType::Srd) == reliable;
    if !transport_matches || !qp.can_receive() {
        return if reliable {
            Some(IoStatus::RemoteBadDestQpn)
        } else {
            drop_it(device)
        };
    }
    if write_total.is_none() && header.qkey != qp.qkey {
        Stats::add(&device.stats.qkey_viol, 1);
        return if reliable {
            Some(IoStatus::RemoteBadDestQpn)
        } else {
            drop_it(device)
        };
    }
    let receive = match take_receive(device, slot, &qp, epoch) {
        Ok(Some(receive)) => receive,
        Ok(None) => {
            if reliable {
                Stats::add(&device.stats.rnr_naks, 1);
                return Some(IoStatus::RemoteRnr);
            }
            return drop_it(device);
        }
        Err((req_id, status)) => {
            let cqe = recv_cqe(
                device,
                &qp,
                header,
                req_id,
                status,
                0,
                imm,
                write_total.is_some(),
            );
            device.post_cqe(qp.recv_cq, epoch, cqe);
            return Some(IoStatus::RemoteBadStatus);
        }
    };
    let mut payload = Vec::new();
    let message: &[u8] = if qp.ty == QpType::Ud {
        payload.resize(UD_PREFIX, 0);
        payload.extend_from_slice(data);
        &payload
    } else {
        data
    };
    let capacity: u64 = receive.bufs.iter().map(|b| u64::from(b.buf.length)).sum();
    let (local, remote) = if message.len() as u64 > capacity {
        (IoStatus::LocalBadLength, IoStatus::RemoteBadLength)
    } else {
        match scatter(device, &qp, &receive.bufs, message, epoch) {
            Ok(()) => (IoStatus::Ok, IoStatus::Ok),
            Err(None) => return None,
            Err(Some(status)) => (status, IoStatus::RemoteBadStatus),
        }
    };
    let length = write_total.unwrap_or(message.len() as u32);
    let cqe = recv_cqe(
        device,
        &qp,
        header,
        receive.req_id,
        local,
        length,
        imm,
        write_total.is_some(),
    );
    if device.post_cqe(qp.recv_cq, epoch, cqe) && local == IoStatus::Ok {
        Stats::add(&device.stats.recv_wrs, 1);
        Stats::add(&device.stats.recv_bytes, message.len() as u64);
    }
    Some(remote)
}

#[allow(clippy::too_many_arguments)]
fn recv_cqe(
    device: &Device,
    qp: &Qp,
    header: &Header,
    req_id: u16,
    status: IoStatus,
    length: u32,
    imm: Option<u32>,
    write: bool,
) -> Cqe {
    let ah = ah_of(device, qp.pd, &header.src_gid);
    let set_src_addr = device
        .lock()
        .objects
        .cqs
        .get(usize::from(qp.recv_cq))
        .is_some_and(|cq| cq.set_src_addr);
    Cqe {
        req_id,
        status,
        queue: IoQueue::RecvQueue,
        op: if write { IoOp::RdmaWrite } else { IoOp::Send },
        qp_num: qp.num,
        length,
        ah,
        src_qp: header.src_qp,
        imm,
        src_addr: (ah == 0xffff && set_src_addr).then_some(header.src_gid),
    }
}

/// Writes `message` across the receive buffers.
fn scatter(
    device: &Device,
    qp: &Qp,
    bufs: &[RxDesc],
    message: &[u8],
    epoch: Epoch,
) -> Result<(), Option<IoStatus>> {
    let mut rest = message;
    for desc in bufs {
        if rest.is_empty() {
            break;
        }
        let take = rest.len().min(desc.buf.length as usize);
        let mr = mr_for(device, qp.pd, desc.buf.lkey, mr_access::LOCAL_WRITE)
            .ok_or(Some(IoStatus::LocalInvalidLkey))?;
        match write_mr(device, &mr, desc.buf.addr, &rest[..take], epoch) {
            Ok(()) => {}
            Err(None) => return Err(None),
            Err(Some(p2plab_dma::DmaFaultKind::Unmapped))
                if !mr.list.contains(desc.buf.addr, take as u64) =>
            {
                return Err(Some(IoStatus::LocalInvalidLkey))
            }
            Err(Some(_)) => return Err(Some(IoStatus::LocalQpInternalError)),
        }
        rest = &rest[take..];
    }
    Ok(())
}

/// What finishing a message needs after the reliability lock is let go.
enum Finish {
    Done(Completion, IoStatus),
    SendImm([u8; 16], Vec<u8>),
}

/// An acknowledgement of a SEND, a write segment or a write's immediate.
fn on_ack(device: &Device, header: &Header, status: u8, offset: u64) {
    let status = IoStatus::from_code(status).unwrap_or(IoStatus::RemoteBadStatus);
    let finish = {
        let mut rel = lock(&device.reliability);
        let Some(p) = rel.pending.get_mut(&header.msg_id) else {
            return;
        };
        if p.header.dst_gid != header.src_gid || p.header.dst_qp != header.src_qp {
            return;
        }
        let peer = header.src_gid;
        let finish = match &mut p.work {
            Work::Send { .. } => match status {
                IoStatus::RemoteRnr if rnr_retry(p) => None,
                _ => Some(Finish::Done(Completion::of(p), status)),
            },
            Work::Write {
                acked,
                left,
                imm,
                imm_packet,
                remote,
                ..
            } => {
                if offset == IMM_ACK {
                    match status {
                        IoStatus::RemoteRnr if rnr_retry(p) => None,
                        _ => Some(Finish::Done(Completion::of(p), status)),
                    }
                } else if status != IoStatus::Ok {
                    Some(Finish::Done(Completion::of(p), status))
                } else {
                    let index = (offset / SEGMENT_SIZE as u64) as usize;
                    match acked.get_mut(index) {
                        Some(seen) if !*seen && offset.is_multiple_of(SEGMENT_SIZE as u64) => {
                            *seen = true;
                            *left -= 1;
                        }
                        _ => {}
                    }
                    if *left > 0 || imm_packet.is_some() {
                        None
                    } else if let Some(imm) = *imm {
                        let packet = write_imm_packet(&p.header, imm, remote.length);
                        *imm_packet = Some(packet.clone());
                        p.tries = 1;
                        p.deadline = std::time::Instant::now() + super::reliability::rto(1);
                        Some(Finish::SendImm(p.header.dst_gid, packet))
                    } else {
                        Some(Finish::Done(Completion::of(p), IoStatus::Ok))
                    }
                }
            }
            Work::Read { .. } => None,
        };
        rel.answered.insert(peer);
        if matches!(finish, Some(Finish::Done(..))) {
            rel.pending.remove(&header.msg_id);
        }
        finish
    };
    match finish {
        Some(Finish::Done(c, status)) => complete_send(device, c, status),
        Some(Finish::SendImm(dst, packet)) => {
            device.transmit(&dst, packet, false);
        }
        None => {}
    }
}

/// A segment of RDMA read data (or the read's error).
fn on_read_data(device: &Device, header: &Header, status: u8, offset: u64, data: &[u8]) {
    let (mr, local, epoch) = {
        let mut rel = lock(&device.reliability);
        let Some(p) = rel.pending.get_mut(&header.msg_id) else {
            return;
        };
        if p.header.dst_gid != header.src_gid || p.header.dst_qp != header.src_qp {
            return;
        }
        let epoch = p.epoch;
        let Work::Read {
            mr,
            local,
            length,
            received,
            ..
        } = &p.work
        else {
            return;
        };
        if status != 0 {
            let status = IoStatus::from_code(status).unwrap_or(IoStatus::RemoteBadStatus);
            let c = Completion::of(p);
            rel.answered.insert(header.src_gid);
            rel.pending.remove(&header.msg_id);
            drop(rel);
            complete_send(device, c, status);
            return;
        }
        let index = (offset / SEGMENT_SIZE as u64) as usize;
        let fits = offset.is_multiple_of(SEGMENT_SIZE as u64)
            && received.get(index) == Some(&false)
            && data.len() == segment_len(*length, index);
        if !fits {
            Stats::add(&device.stats.duplicates, 1);
            return;
        }
        (std::sync::Arc::clone(mr), *local + offset, epoch)
    };
    let written = {
        let _datapath = device.datapath.read();
        if still_registered(device, &mr) {
            write_mr(device, &mr, local, data, epoch)
        } else {
            Err(Some(p2plab_dma::DmaFaultKind::Unmapped))
        }
    };
    let finish = {
        let mut rel = lock(&device.reliability);
        rel.answered.insert(header.src_gid);
        let Some(p) = rel.pending.get_mut(&header.msg_id) else {
            return;
        };
        match (&mut p.work, written) {
            (_, Err(None)) => None,
            (_, Err(Some(_))) => Some((Completion::of(p), IoStatus::LocalQpInternalError)),
            (Work::Read { received, left, .. }, Ok(())) => {
                let index = (offset / SEGMENT_SIZE as u64) as usize;
                if let Some(seen) = received.get_mut(index) {
                    if !*seen {
                        *seen = true;
                        *left -= 1;
                        // The timer measures silence, not the whole
                        // read: a 4 MiB read behind three others takes
                        // longer than one timeout to arrive, and asking
                        // for all of it again while its data still flows
                        // only doubles the traffic (per-packet
                        // retransmission on real SRD never does that).
                        p.deadline = std::time::Instant::now() + super::reliability::rto(p.tries);
                    }
                }
                (*left == 0).then(|| (Completion::of(p), IoStatus::Ok))
            }
            _ => None,
        }
        .inspect(|_| {
            rel.pending.remove(&header.msg_id);
        })
    };
    if let Some((c, status)) = finish {
        complete_send(device, c, status);
    }
}

/// A segment of an RDMA write into one of this device's MRs.
#[allow(clippy::too_many_arguments)]
fn on_write(
    device: &Device,
    header: &Header,
    rkey: u32,
    addr: u64,
    offset: u64,
    total: u32,
    data: &[u8],
) {
    let status = {
        let _datapath = device.datapath.read();
        write_segment(device, header, rkey, addr, offset, total, data)
    };
    if let Some(status) = status {
        if status == IoStatus::Ok {
            Stats::add(&device.stats.write_recv_bytes, data.len() as u64);
        }
        ack(device, header, status, offset);
    }
}

#[allow(clippy::too_many_arguments)]
fn write_segment(
    device: &Device,
    header: &Header,
    rkey: u32,
    addr: u64,
    offset: u64,
    total: u32,
    data: &[u8],
) -> Option<IoStatus> {
    let Some((_, qp, epoch)) = target_qp(device, header) else {
        return Some(IoStatus::RemoteBadDestQpn);
    };
    if qp.ty != QpType::Srd || !qp.can_receive() {
        return Some(IoStatus::RemoteBadDestQpn);
    }
    let in_write = offset
        .checked_add(data.len() as u64)
        .is_some_and(|end| end <= u64::from(total))
        && total <= device.attrs.max_rdma_size;
    let Some(mr) = mr_for(device, qp.pd, rkey, mr_access::REMOTE_WRITE)
        .filter(|mr| in_write && mr.list.contains(addr, u64::from(total)))
    else {
        return Some(IoStatus::RemoteBadAddress);
    };
    match write_mr(device, &mr, addr + offset, data, epoch) {
        Ok(()) => Some(IoStatus::Ok),
        Err(None) => None,
        Err(Some(_)) => Some(IoStatus::RemoteBadStatus),
    }
}
