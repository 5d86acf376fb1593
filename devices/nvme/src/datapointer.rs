//! Data pointers: PRP entries and lists, SGLs, and moving data through them.
//!
//! A command's data pointer is walked into a list of [`Segment`]s before any
//! data moves, so every malformed pointer is refused with its specific status
//! and nothing half-happens. Walking only reads lists (PRP list pages, SGL
//! segments) through the [`DmaRouter`], so lists in the CMB work too.

use crate::command::Command;
use crate::memory::{DmaRouter, Placement};
use crate::spec::Status;

/// A piece of the host buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: u64,
    pub len: u64,
    /// SGL Bit Bucket: the controller discards this part of the data.
    pub bit_bucket: bool,
}

impl Segment {
    /// `len` bytes of host memory at `addr`.
    fn data(addr: u64, len: u64) -> Self {
        Self {
            addr,
            len,
            bit_bucket: false,
        }
    }
}

/// Which way data flows, from the controller's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Controller to host (Read, Identify, Get Log Page...).
    ToHost,
    /// Host to controller (Write, Compare, Set Features data...).
    FromHost,
}

/// Which way a command moves data, as its opcode's bits 1:0 say (NVMe base
/// 2.0, "Opcodes for Admin Commands"): the `data` of a command table row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataTransfer {
    /// 00b: no data.
    None = 0b00,
    /// 01b: host to controller (Write, Set Features...).
    HostToController = 0b01,
    /// 10b: controller to host (Read, Identify...).
    ControllerToHost = 0b10,
    /// 11b: both ways.
    Bidirectional = 0b11,
}

impl DataTransfer {
    /// The direction a handler maps its data pointer in, if it has one.
    pub fn direction(self) -> Option<Direction> {
        match self {
            DataTransfer::HostToController => Some(Direction::FromHost),
            DataTransfer::ControllerToHost => Some(Direction::ToHost),
            DataTransfer::None | DataTransfer::Bidirectional => None,
        }
    }
}

/// Which data pointer forms a command set accepts (CDW0 PSDT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPointers {
    /// PRPs only: admin commands over PCIe.
    PrpOnly,
    /// PRPs or SGLs: NVM I/O commands.
    PrpOrSgl,
}

/// The upper bound on SGL descriptors walked for one command. The
/// specification sets none; this keeps a hostile chain from costing more
/// than a few page reads (Linux uses at most a few hundred).
pub const MAX_SGL_DESCRIPTORS: u64 = 4096;

const SGL_DATA_BLOCK: u8 = 0x0;
const SGL_BIT_BUCKET: u8 = 0x1;
const SGL_SEGMENT: u8 = 0x2;
const SGL_LAST_SEGMENT: u8 = 0x3;
const SGL_DESCRIPTOR_SIZE: u64 = 16;

/// A mapped host buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataBuffer {
    segments: Vec<Segment>,
    len: u64,
}

impl DataBuffer {
    /// Walks the data pointer of `cmd` for `len` bytes, in one of the
    /// `accepted` forms.
    pub fn map(
        mem: &DmaRouter,
        cmd: &Command,
        len: u64,
        dir: Direction,
        page_size: u64,
        accepted: DataPointers,
    ) -> Result<Self, Status> {
        match cmd.psdt() {
            0 => map_prp(mem, cmd.prp1(), cmd.prp2(), len, page_size),
            // 01b: SGL, metadata pointer is a buffer; 10b: metadata pointer
            // is an SGL too. This controller transfers no metadata, so both
            // describe the data the same way.
            1 | 2 if accepted == DataPointers::PrpOrSgl => map_sgl(mem, &cmd.sgl1(), len, dir),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `segment`, merged into the last one when contiguous.
    fn push(&mut self, segment: Segment) {
        if segment.len == 0 {
            return;
        }
        self.len += segment.len;
        if let Some(last) = self.segments.last_mut() {
            if last.bit_bucket == segment.bit_bucket
                && last.addr.checked_add(last.len) == Some(segment.addr)
            {
                last.len += segment.len;
                return;
            }
        }
        self.segments.push(segment);
    }

    /// Copies `data` (exactly [`len`](Self::len) bytes) into the host buffer.
    pub fn write_to_host(&self, mem: &DmaRouter, data: &[u8]) -> Result<Placement, Status> {
        if data.len() as u64 != self.len {
            return Err(Status::INTERNAL_ERROR);
        }
        self.write_to_host_at(mem, 0, data)
    }

    /// Fills `buf` (exactly [`len`](Self::len) bytes) from the host buffer.
    pub fn read_from_host(&self, mem: &DmaRouter, buf: &mut [u8]) -> Result<Placement, Status> {
        if buf.len() as u64 != self.len {
            return Err(Status::INTERNAL_ERROR);
        }
        self.read_from_host_at(mem, 0, buf)
    }

    /// The pieces of `[offset, offset+len)` of the buffer: (segment, offset
    /// inside the segment, length), so large transfers can move in chunks.
    fn pieces(&self, offset: u64, len: u64) -> Result<Vec<(Segment, u64, u64)>, Status> {
        let end = offset.checked_add(len).ok_or(Status::INTERNAL_ERROR)?;
        if end > self.len {
            return Err(Status::INTERNAL_ERROR);
        }
        let mut out = Vec::new();
        let mut seg_start = 0u64;
        for s in &self.segments {
            let seg_end = seg_start + s.len;
            let from = offset.max(seg_start);
            let to = end.min(seg_end);
            if from < to {
                out.push((*s, from - seg_start, to - from));
            }
            if seg_end >= end {
                break;
            }
            seg_start = seg_end;
        }
        Ok(out)
    }

    /// The host memory of `[offset, offset+len)` of the buffer as
    /// `(address, length)` pieces, for a zero-copy transfer; `None` when
    /// part of it is an SGL Bit Bucket (the data must be cut, so it is
    /// copied).
    pub fn direct_segments(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<(u64, usize)>>, Status> {
        let mut out = Vec::new();
        for (s, inner, n) in self.pieces(offset, len)? {
            if s.bit_bucket {
                return Ok(None);
            }
            let n = usize::try_from(n).map_err(|_| Status::INTERNAL_ERROR)?;
            out.push((s.addr + inner, n));
        }
        Ok(Some(out))
    }

    /// Copies `data` into the host buffer starting `offset` bytes in.
    pub fn write_to_host_at(
        &self,
        mem: &DmaRouter,
        offset: u64,
        data: &[u8],
    ) -> Result<Placement, Status> {
        let mut placement = Placement::default();
        let mut at = 0usize;
        for (s, inner, n) in self.pieces(offset, data.len() as u64)? {
            let n = n as usize;
            let part = data.get(at..at + n).ok_or(Status::INTERNAL_ERROR)?;
            if !s.bit_bucket {
                let p = mem.write(s.addr + inner, part).map_err(|e| {
                    tracing::debug!(%e, "data transfer to host failed");
                    Status::DATA_TRANSFER_ERROR
                })?;
                placement.add(p);
            }
            at += n;
        }
        Ok(placement)
    }

    /// Fills `buf` from the host buffer starting `offset` bytes in.
    pub fn read_from_host_at(
        &self,
        mem: &DmaRouter,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<Placement, Status> {
        let mut placement = Placement::default();
        let mut at = 0usize;
        for (s, inner, n) in self.pieces(offset, buf.len() as u64)? {
            let n = n as usize;
            let part = buf.get_mut(at..at + n).ok_or(Status::INTERNAL_ERROR)?;
            if s.bit_bucket {
                // Bit buckets are refused for host-to-controller transfers
                // when mapping; never reached.
                return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID);
            }
            let p = mem.read(s.addr + inner, part).map_err(|e| {
                tracing::debug!(%e, "data transfer from host failed");
                Status::DATA_TRANSFER_ERROR
            })?;
            placement.add(p);
            at += n;
        }
        Ok(placement)
    }
}

fn read_u64s(mem: &DmaRouter, addr: u64, count: u64) -> Result<Vec<u64>, Status> {
    let mut raw = vec![0u8; (count * 8) as usize];
    mem.read(addr, &mut raw).map_err(|e| {
        tracing::debug!(%e, "reading a PRP list failed");
        Status::DATA_TRANSFER_ERROR
    })?;
    Ok(raw
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect())
}

/// PRP1/PRP2 and PRP lists (NVMe base 2.0, 4.1.1).
pub fn map_prp(
    mem: &DmaRouter,
    prp1: u64,
    prp2: u64,
    len: u64,
    page_size: u64,
) -> Result<DataBuffer, Status> {
    let mut buf = DataBuffer::default();
    if len == 0 {
        return Ok(buf);
    }
    let mask = page_size - 1;
    // The first entry may carry an offset, dword aligned.
    if prp1 & 0x3 != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    let first = len.min(page_size - (prp1 & mask));
    if prp1.checked_add(first).is_none() {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    buf.push(Segment::data(prp1, first));
    let mut remaining = len - first;
    if remaining == 0 {
        return Ok(buf);
    }
    if remaining <= page_size {
        // PRP2 is the second data page, with no offset.
        if prp2 & mask != 0 || prp2.checked_add(remaining).is_none() {
            return Err(Status::PRP_OFFSET_INVALID);
        }
        buf.push(Segment::data(prp2, remaining));
        return Ok(buf);
    }
    // PRP2 points to a PRP list; the first list may start at an offset
    // (qword aligned) and then runs to the end of its page.
    if prp2 & 0x7 != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    let mut list = prp2;
    loop {
        let slots = (page_size - (list & mask)) / 8;
        let needed = remaining.div_ceil(page_size);
        let chained = needed > slots;
        let data_entries = if chained { slots - 1 } else { needed };
        let entries = read_u64s(mem, list, data_entries + u64::from(chained))?;
        for &entry in entries.iter().take(data_entries as usize) {
            if entry & mask != 0 {
                return Err(Status::PRP_OFFSET_INVALID);
            }
            let n = remaining.min(page_size);
            if entry.checked_add(n).is_none() {
                return Err(Status::PRP_OFFSET_INVALID);
            }
            buf.push(Segment::data(entry, n));
            remaining -= n;
        }
        if !chained {
            return Ok(buf);
        }
        // The last slot of a full list page points at the next list page,
        // which starts on a page boundary: every further page holds at
        // least page_size/8 - 1 data entries, so the walk terminates.
        let next = entries.last().copied().unwrap_or(0);
        if next & mask != 0 {
            return Err(Status::PRP_OFFSET_INVALID);
        }
        list = next;
    }
}

#[derive(Debug, Clone, Copy)]
struct SglDescriptor {
    addr: u64,
    len: u32,
    kind: u8,
    subtype: u8,
}

impl SglDescriptor {
    fn parse(raw: &[u8]) -> Self {
        let mut a = [0u8; 8];
        a.copy_from_slice(raw.get(0..8).unwrap_or(&[0; 8]));
        let mut l = [0u8; 4];
        l.copy_from_slice(raw.get(8..12).unwrap_or(&[0; 4]));
        let id = raw.get(15).copied().unwrap_or(0xff);
        Self {
            addr: u64::from_le_bytes(a),
            len: u32::from_le_bytes(l),
            kind: id >> 4,
            subtype: id & 0xf,
        }
    }

    fn is_segment(&self) -> bool {
        self.kind == SGL_SEGMENT || self.kind == SGL_LAST_SEGMENT
    }
}

/// Builds a 16-byte SGL descriptor (tests, and documentation of the layout).
pub fn sgl_descriptor(kind: u8, addr: u64, len: u32) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[15] = kind << 4;
    d
}

/// Scatter gather lists (NVMe base 2.0, 4.1.2): Data Block, Bit Bucket,
/// Segment and Last Segment descriptors, address subtype.
pub fn map_sgl(
    mem: &DmaRouter,
    sgl1: &[u8; 16],
    len: u64,
    dir: Direction,
) -> Result<DataBuffer, Status> {
    let mut buf = DataBuffer::default();
    let mut remaining = len;
    let first = SglDescriptor::parse(sgl1);
    match first.kind {
        SGL_DATA_BLOCK | SGL_BIT_BUCKET => {
            map_sgl_data(&[first], &mut remaining, dir, &mut buf)?;
        }
        SGL_SEGMENT | SGL_LAST_SEGMENT => {
            let mut budget = MAX_SGL_DESCRIPTORS;
            let mut segment = first;
            loop {
                if segment.subtype != 0 {
                    return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID);
                }
                let seg_len = u64::from(segment.len);
                if seg_len == 0 || seg_len % SGL_DESCRIPTOR_SIZE != 0 {
                    return Err(Status::INVALID_SGL_SEGMENT_DESCRIPTOR);
                }
                if segment.addr.checked_add(seg_len).is_none() {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                let count = seg_len / SGL_DESCRIPTOR_SIZE;
                if count > budget {
                    return Err(Status::INVALID_SGL_DESCRIPTOR_COUNT);
                }
                budget -= count;
                let mut raw = vec![0u8; seg_len as usize];
                mem.read(segment.addr, &mut raw).map_err(|e| {
                    tracing::debug!(%e, "reading an SGL segment failed");
                    Status::DATA_TRANSFER_ERROR
                })?;
                let descriptors: Vec<SglDescriptor> = raw
                    .chunks_exact(SGL_DESCRIPTOR_SIZE as usize)
                    .map(SglDescriptor::parse)
                    .collect();
                let Some((last, body)) = descriptors.split_last() else {
                    return Err(Status::INVALID_SGL_SEGMENT_DESCRIPTOR);
                };
                if !last.is_segment() {
                    map_sgl_data(&descriptors, &mut remaining, dir, &mut buf)?;
                    break;
                }
                // A Last Segment holds no further segment descriptor.
                if segment.kind == SGL_LAST_SEGMENT {
                    return Err(Status::INVALID_SGL_SEGMENT_DESCRIPTOR);
                }
                let before = remaining;
                map_sgl_data(body, &mut remaining, dir, &mut buf)?;
                // The transfer is complete: the rest of the chain is excess.
                if remaining == 0 {
                    break;
                }
                // A segment that moves no data and only links onward could
                // loop forever through a self-referencing chain: refuse it.
                if remaining == before {
                    return Err(Status::INVALID_SGL_SEGMENT_DESCRIPTOR);
                }
                segment = *last;
            }
        }
        _ => return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
    }
    if remaining != 0 {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    Ok(buf)
}

fn map_sgl_data(
    descriptors: &[SglDescriptor],
    remaining: &mut u64,
    dir: Direction,
    buf: &mut DataBuffer,
) -> Result<(), Status> {
    for d in descriptors {
        // Identify SGLS bit 18: descriptors may describe more than the
        // transfer; the excess is not touched. Linux 7.x maps a user
        // passthrough's whole buffer this way (`nvme io-passthru
        // --data-len 4096` reading one 512-byte block, blktests nvme/046).
        if *remaining == 0 {
            break;
        }
        match d.kind {
            SGL_DATA_BLOCK if d.subtype == 0 => {}
            // Bit buckets only make sense when the controller sends data.
            SGL_BIT_BUCKET if dir == Direction::ToHost => {}
            SGL_SEGMENT | SGL_LAST_SEGMENT => return Err(Status::INVALID_SGL_DESCRIPTOR_COUNT),
            _ => return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
        }
        let len = u64::from(d.len).min(*remaining);
        if len == 0 {
            continue;
        }
        let bit_bucket = d.kind == SGL_BIT_BUCKET;
        if !bit_bucket && d.addr.checked_add(len).is_none() {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        buf.push(Segment {
            addr: if bit_bucket { 0 } else { d.addr },
            len,
            bit_bucket,
        });
        *remaining -= len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Stats;
    use p2plab_dma::testing::FakeGuestMemory;
    use p2plab_dma::{GuestMemory, HeapRegion};
    use std::sync::Arc;

    const PS: u64 = 4096;
    const RAM: u64 = 0x10_0000;
    const RAM_SIZE: usize = 0x10_0000;

    fn setup() -> (Arc<FakeGuestMemory>, DmaRouter) {
        let guest = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
        let router = DmaRouter::new(
            guest.clone(),
            Some(Arc::new(HeapRegion::new(0x20_0000))),
            Arc::new(Stats::default()),
        );
        (guest, router)
    }

    fn put_list(guest: &FakeGuestMemory, at: u64, entries: &[u64]) {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        guest.write(at, &bytes).unwrap();
    }

    fn segs(b: &DataBuffer) -> Vec<(u64, u64)> {
        b.segments().iter().map(|s| (s.addr, s.len)).collect()
    }

    #[test]
    fn prp1_alone_and_with_offset() {
        let (_, r) = setup();
        let b = map_prp(&r, RAM + 0x200, 0, 0x800, PS).unwrap();
        assert_eq!(segs(&b), vec![(RAM + 0x200, 0x800)]);
        // Crosses into PRP2 because of the offset.
        let b = map_prp(&r, RAM + 0xe00, RAM + 0x5000, 0x1000, PS).unwrap();
        assert_eq!(segs(&b), vec![(RAM + 0xe00, 0x200), (RAM + 0x5000, 0xe00)]);
        assert_eq!(b.len(), 0x1000);
    }

    #[test]
    fn prp_offset_rules() {
        let (_, r) = setup();
        assert_eq!(
            map_prp(&r, RAM + 2, 0, 16, PS),
            Err(Status::PRP_OFFSET_INVALID),
            "PRP1 must be dword aligned"
        );
        assert_eq!(
            map_prp(&r, RAM, RAM + 0x10, 0x2000, PS),
            Err(Status::PRP_OFFSET_INVALID),
            "PRP2 as a data pointer has no offset"
        );
        assert_eq!(
            map_prp(&r, RAM, RAM + 0x4004, 0x3000, PS),
            Err(Status::PRP_OFFSET_INVALID),
            "a PRP list pointer is qword aligned"
        );
        // Found by the nvme_prp_sgl fuzz target: a second data page at the
        // very top of the address space, whose end does not fit in 64 bits.
        assert_eq!(
            map_prp(&r, RAM, u64::MAX - PS + 1, 0x2000, PS),
            Err(Status::PRP_OFFSET_INVALID),
            "PRP2's page ends past 2^64"
        );
    }

    #[test]
    fn prp_list_entries_must_be_page_aligned() {
        let (g, r) = setup();
        put_list(&g, RAM + 0x8000, &[RAM + 0x1000, RAM + 0x2010]);
        assert_eq!(
            map_prp(&r, RAM, RAM + 0x8000, 0x3000, PS),
            Err(Status::PRP_OFFSET_INVALID)
        );
    }

    #[test]
    fn prp_list_with_offset_chains_across_pages() {
        let (g, r) = setup();
        // The first list starts 16 bytes before the end of its page: one
        // data entry, then a pointer to the next list page.
        let list1 = RAM + 0x8ff0;
        let list2 = RAM + 0xa000;
        put_list(&g, list1, &[RAM + 0x1000, list2]);
        put_list(&g, list2, &[RAM + 0x3000, RAM + 0x4000, RAM + 0x6000]);
        let b = map_prp(&r, RAM, list1, 5 * PS - 0x100, PS).unwrap();
        assert_eq!(
            segs(&b),
            vec![(RAM, 0x2000), (RAM + 0x3000, 0x2000), (RAM + 0x6000, 0xf00)]
        );
    }

    #[test]
    fn prp_chain_pointer_must_be_page_aligned_and_lists_must_be_readable() {
        let (g, r) = setup();
        let list1 = RAM + 0x8ff0;
        put_list(&g, list1, &[RAM + 0x1000, RAM + 0xa008]);
        assert_eq!(
            map_prp(&r, RAM, list1, 4 * PS, PS),
            Err(Status::PRP_OFFSET_INVALID)
        );
        assert_eq!(
            map_prp(&r, RAM, 0x5000_0000, 4 * PS, PS),
            Err(Status::DATA_TRANSFER_ERROR),
            "list outside guest memory"
        );
    }

    #[test]
    fn a_prp_list_page_pointing_at_itself_terminates() {
        let (g, r) = setup();
        // Every page: 511 data entries to the same page, last slot -> self.
        let list = RAM + 0x8000;
        let mut entries = vec![RAM; 511];
        entries.push(list);
        put_list(&g, list, &entries);
        // 2000 pages of data: needs several trips round the self loop, and
        // ends because each trip consumes 511 entries.
        let b = map_prp(&r, RAM, list, 2000 * PS, PS).unwrap();
        assert_eq!(b.len(), 2000 * PS);
    }

    #[test]
    fn sgl_single_data_block_and_bit_bucket() {
        let (_, r) = setup();
        let d = sgl_descriptor(SGL_DATA_BLOCK, RAM + 3, 100);
        let b = map_sgl(&r, &d, 100, Direction::ToHost).unwrap();
        assert_eq!(segs(&b), vec![(RAM + 3, 100)]);
        assert_eq!(
            map_sgl(&r, &d, 101, Direction::ToHost),
            Err(Status::DATA_SGL_LENGTH_INVALID),
            "SGL shorter than the transfer"
        );
        // SGLS bit 18: an SGL longer than the transfer moves only the
        // transfer's bytes, from the start of the SGL.
        let b = map_sgl(&r, &d, 99, Direction::ToHost).unwrap();
        assert_eq!(
            segs(&b),
            vec![(RAM + 3, 99)],
            "SGL longer than the transfer"
        );
        let bb = sgl_descriptor(SGL_BIT_BUCKET, 0, 64);
        assert!(map_sgl(&r, &bb, 64, Direction::ToHost).is_ok());
        assert_eq!(
            map_sgl(&r, &bb, 64, Direction::FromHost),
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
        let keyed = sgl_descriptor(0x4, RAM, 64);
        assert_eq!(
            map_sgl(&r, &keyed, 64, Direction::ToHost),
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
    }

    fn put_descs(g: &FakeGuestMemory, at: u64, descs: &[[u8; 16]]) {
        let bytes: Vec<u8> = descs.iter().flatten().copied().collect();
        g.write(at, &bytes).unwrap();
    }

    #[test]
    fn sgl_segment_chain_with_bit_bucket() {
        let (g, r) = setup();
        let seg1 = RAM + 0x9000;
        let seg2 = RAM + 0xa000;
        put_descs(
            &g,
            seg1,
            &[
                sgl_descriptor(SGL_DATA_BLOCK, RAM + 0x1000, 0x100),
                sgl_descriptor(SGL_BIT_BUCKET, 0, 0x80),
                sgl_descriptor(SGL_LAST_SEGMENT, seg2, 32),
            ],
        );
        put_descs(
            &g,
            seg2,
            &[
                sgl_descriptor(SGL_DATA_BLOCK, RAM + 0x3000, 0),
                sgl_descriptor(SGL_DATA_BLOCK, RAM + 0x3000, 0x80),
            ],
        );
        let first = sgl_descriptor(SGL_SEGMENT, seg1, 48);
        let b = map_sgl(&r, &first, 0x200, Direction::ToHost).unwrap();
        assert_eq!(b.len(), 0x200);
        assert_eq!(b.segments().len(), 3);
        assert!(b.segments()[1].bit_bucket);
        // Data lands around the bit bucket.
        let data: Vec<u8> = (0..0x200u32).map(|i| i as u8).collect();
        b.write_to_host(&r, &data).unwrap();
        let mut got = vec![0u8; 0x80];
        g.read(RAM + 0x3000, &mut got).unwrap();
        assert_eq!(&got[..], &data[0x180..]);

        // SGLS bit 18: a transfer that ends inside the first segment never
        // follows the chain (here into a segment outside guest memory).
        put_descs(
            &g,
            seg1,
            &[
                sgl_descriptor(SGL_DATA_BLOCK, RAM + 0x1000, 0x1000),
                sgl_descriptor(SGL_DATA_BLOCK, RAM + 0x4000, 0x100),
                sgl_descriptor(SGL_LAST_SEGMENT, 0x7000_0000, 32),
            ],
        );
        let b = map_sgl(&r, &first, 0x200, Direction::ToHost).unwrap();
        assert_eq!(segs(&b), vec![(RAM + 0x1000, 0x200)]);
    }

    #[test]
    fn sgl_malformed_segments() {
        let (g, r) = setup();
        let seg = RAM + 0x9000;
        let check = |first: [u8; 16], len: u64| map_sgl(&r, &first, len, Direction::ToHost);
        assert_eq!(
            check(sgl_descriptor(SGL_SEGMENT, seg, 24), 16),
            Err(Status::INVALID_SGL_SEGMENT_DESCRIPTOR),
            "segment length not a multiple of 16"
        );
        assert_eq!(
            check(sgl_descriptor(SGL_LAST_SEGMENT, seg, 0), 16),
            Err(Status::INVALID_SGL_SEGMENT_DESCRIPTOR),
            "empty segment"
        );
        // A segment descriptor in the middle of a segment.
        put_descs(
            &g,
            seg,
            &[
                sgl_descriptor(SGL_SEGMENT, seg, 32),
                sgl_descriptor(SGL_DATA_BLOCK, RAM, 16),
            ],
        );
        assert_eq!(
            check(sgl_descriptor(SGL_LAST_SEGMENT, seg, 32), 16),
            Err(Status::INVALID_SGL_DESCRIPTOR_COUNT)
        );
        // A Last Segment that chains onward.
        put_descs(
            &g,
            seg,
            &[
                sgl_descriptor(SGL_DATA_BLOCK, RAM, 16),
                sgl_descriptor(SGL_SEGMENT, seg, 32),
            ],
        );
        assert_eq!(
            check(sgl_descriptor(SGL_LAST_SEGMENT, seg, 32), 64),
            Err(Status::INVALID_SGL_SEGMENT_DESCRIPTOR)
        );
        assert_eq!(
            check(sgl_descriptor(SGL_SEGMENT, 0x7000_0000, 32), 64),
            Err(Status::DATA_TRANSFER_ERROR),
            "segment outside guest memory"
        );
    }

    #[test]
    fn sgl_self_referencing_segment_loops_are_refused() {
        let (g, r) = setup();
        let seg = RAM + 0x9000;
        // Moves no data and points at itself.
        put_descs(&g, seg, &[sgl_descriptor(SGL_SEGMENT, seg, 16)]);
        assert_eq!(
            map_sgl(
                &r,
                &sgl_descriptor(SGL_SEGMENT, seg, 16),
                512,
                Direction::ToHost
            ),
            Err(Status::INVALID_SGL_SEGMENT_DESCRIPTOR)
        );
        // Moves 1 byte per trip round the loop: the descriptor budget ends it.
        put_descs(
            &g,
            seg,
            &[
                sgl_descriptor(SGL_DATA_BLOCK, RAM, 1),
                sgl_descriptor(SGL_SEGMENT, seg, 32),
            ],
        );
        assert_eq!(
            map_sgl(
                &r,
                &sgl_descriptor(SGL_SEGMENT, seg, 32),
                1 << 20,
                Direction::ToHost
            ),
            Err(Status::INVALID_SGL_DESCRIPTOR_COUNT)
        );
    }

    #[test]
    fn data_moves_through_prps_and_faults_become_data_transfer_errors() {
        let (g, r) = setup();
        let b = map_prp(&r, RAM + 0xf00, RAM + 0x2000, 0x300, PS).unwrap();
        let data = vec![0xabu8; 0x300];
        b.write_to_host(&r, &data).unwrap();
        let mut back = vec![0u8; 0x300];
        b.read_from_host(&r, &mut back).unwrap();
        assert_eq!(back, data);
        let mut one = [0u8; 1];
        g.read(RAM + 0x2000 + 0x1ff, &mut one).unwrap();
        assert_eq!(one[0], 0xab);
        // Mapping does not touch data pages; the transfer faults.
        let bad = map_prp(&r, 0x7000_0000, 0, 512, PS).unwrap();
        assert_eq!(
            bad.write_to_host(&r, &[0; 512]),
            Err(Status::DATA_TRANSFER_ERROR)
        );
        assert_eq!(
            bad.write_to_host(&r, &[0; 4]),
            Err(Status::INTERNAL_ERROR),
            "length mismatch is a controller bug, not a guest error"
        );
    }

    #[test]
    fn transfers_in_pieces_line_up_with_the_segments() {
        let (g, r) = setup();
        // Three segments: 0x100 at the end of a page, then two pages.
        let list = RAM + 0x9000;
        put_list(&g, list, &[RAM + 0x3000, RAM + 0x5000]);
        let b = map_prp(&r, RAM + 0xf00, list, 0x100 + 2 * PS, PS).unwrap();
        assert_eq!(b.segments().len(), 3);
        let data: Vec<u8> = (0..b.len() as usize).map(|i| (i % 251) as u8).collect();
        for (start, piece) in [(0usize, 0x180usize), (0x180, 0x1000), (0x1180, 0xf80)] {
            b.write_to_host_at(&r, start as u64, &data[start..start + piece])
                .unwrap();
        }
        let mut whole = vec![0u8; data.len()];
        b.read_from_host(&r, &mut whole).unwrap();
        assert_eq!(whole, data);
        let mut mid = vec![0u8; 0x200];
        b.read_from_host_at(&r, 0x1000, &mut mid).unwrap();
        assert_eq!(&mid[..], &data[0x1000..0x1200]);
        assert_eq!(
            b.write_to_host_at(&r, 0x2000, &[0; 0x200]),
            Err(Status::INTERNAL_ERROR),
            "past the end of the buffer"
        );
    }

    #[test]
    fn data_in_the_cmb_is_served_locally() {
        let (_, r) = setup();
        r.set_window(Some(0x8000_0000));
        let b = map_prp(&r, 0x8000_0000, 0, 512, PS).unwrap();
        let p = b.write_to_host(&r, &[7u8; 512]).unwrap();
        assert_eq!(
            p,
            Placement {
                cmb: 512,
                pmr: 0,
                host: 0
            }
        );
        let mut x = [0u8; 512];
        r.cmb().unwrap().read(0, &mut x).unwrap();
        assert_eq!(x, [7u8; 512]);
    }
}
