//! The decision: which bytes of a read or write can go P2P (O_DIRECT
//! between the file and the GPU's BAR) and which take the compat path, and
//! why. Pure: it sees facts gathered elsewhere (file size, O_DIRECT
//! alignment, holes, what the driver knows of the topology) and returns a
//! plan of segments, so every rule is unit-tested without a VM.

use std::ops::Range;

use crate::report::{Reason, Route};

/// Whether the file can be opened with O_DIRECT at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirectIo {
    Available,
    /// The file system refused O_DIRECT: why (open failed with an errno,
    /// or statx reported no O_DIRECT support for the file).
    Unavailable {
        why: String,
    },
}

/// What the planner needs to know about the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileFacts {
    pub size: u64,
    /// File offsets and lengths of O_DIRECT I/O must be multiples of this.
    pub offset_align: u64,
    /// Buffer addresses of O_DIRECT I/O must be multiples of this.
    pub mem_align: u64,
    pub direct: DirectIo,
    /// The handle was opened with O_APPEND.
    pub append_only: bool,
}

/// What the planner needs to know about the GPU buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferFacts {
    /// Virtual address of the buffer's byte 0.
    pub addr: u64,
    /// VRAM with struct pages (p2pmem), which O_DIRECT can target.
    pub p2pmem: bool,
}

/// What the driver knows about P2P between the file's device and the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let the kernel decide: try P2P.
    Try,
    /// Compat for every byte, for this reason (a cached refusal, storage
    /// that is not PCI, a forced policy).
    Compat { reason: Reason, detail: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub write: bool,
    pub file_offset: u64,
    pub buf_offset: u64,
    pub len: u64,
}

/// One piece of the transfer and the route it will take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub file_offset: u64,
    pub buf_offset: u64,
    pub len: u64,
    pub route: Route,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub segments: Vec<Segment>,
    /// A read that reaches past end of file: fewer bytes than requested.
    pub eof: bool,
}

fn compat(reason: Reason, detail: String) -> Route {
    Route::Compat { reason, detail }
}

fn align_down(value: u64, align: u64) -> u64 {
    value - value % align
}

/// Plans `req`. `holes(start, end)` lists the holes of the file inside
/// `[start, end)` (only asked for reads that may go P2P).
pub fn plan(
    req: &Request,
    file: &FileFacts,
    buf: &BufferFacts,
    verdict: &Verdict,
    holes: &dyn Fn(u64, u64) -> Vec<Range<u64>>,
) -> Plan {
    let offset_align = file.offset_align.max(1);
    let mem_align = file.mem_align.max(1);
    if req.len == 0 {
        return Plan::default();
    }
    // A read covers at most the bytes up to end of file.
    let (end, eof) = if req.write {
        (req.file_offset.saturating_add(req.len), false)
    } else if req.file_offset >= file.size {
        return Plan {
            segments: Vec::new(),
            eof: true,
        };
    } else {
        let want_end = req.file_offset.saturating_add(req.len);
        (want_end.min(file.size), want_end > file.size)
    };
    let mut out = Planner {
        req: *req,
        segments: Vec::new(),
    };
    let whole = |out: &mut Planner, route: Route| {
        out.push(req.file_offset, end, route);
    };

    // Reasons that decide for the whole request.
    if !buf.p2pmem {
        whole(
            &mut out,
            compat(
                Reason::NotP2pmem,
                "the GPU buffer maps VRAM through /dev/p2plab-gpuN: no struct pages, \
                 O_DIRECT cannot pin it (allocate it from p2pmem instead)"
                    .to_owned(),
            ),
        );
        return out.finish(eof);
    }
    if let Verdict::Compat { reason, detail } = verdict {
        whole(&mut out, compat(*reason, detail.clone()));
        return out.finish(eof);
    }
    if let DirectIo::Unavailable { why } = &file.direct {
        whole(
            &mut out,
            compat(
                Reason::FsNoDirectIo,
                format!("the file system does not do O_DIRECT on this file: {why}"),
            ),
        );
        return out.finish(eof);
    }
    if req.write && file.append_only {
        whole(
            &mut out,
            compat(
                Reason::Append,
                "the handle is O_APPEND: the kernel writes at end of file, wherever it is \
                 then, so O_DIRECT alignment cannot be known beforehand"
                    .to_owned(),
            ),
        );
        return out.finish(eof);
    }
    if !req.file_offset.is_multiple_of(offset_align) {
        let route = if req.write && req.file_offset >= file.size {
            compat(
                Reason::Append,
                format!(
                    "the write appends at offset {} (file size {}), which is not a multiple \
                     of {offset_align} (the file's O_DIRECT alignment)",
                    req.file_offset, file.size
                ),
            )
        } else {
            compat(
                Reason::Alignment,
                format!(
                    "file offset {} is not a multiple of {offset_align} (the file's O_DIRECT \
                     alignment)",
                    req.file_offset
                ),
            )
        };
        whole(&mut out, route);
        return out.finish(eof);
    }
    let addr = buf.addr.wrapping_add(req.buf_offset);
    if !addr.is_multiple_of(mem_align) {
        whole(
            &mut out,
            compat(
                Reason::Alignment,
                format!(
                    "GPU address {addr:#x} (buffer offset {}) is not a multiple of {mem_align} \
                     (the file's O_DIRECT memory alignment)",
                    req.buf_offset
                ),
            ),
        );
        return out.finish(eof);
    }

    if req.write {
        out.aligned_piece(req.file_offset, end, file, offset_align, mem_align, buf);
        return out.finish(eof);
    }
    // Reads: holes have no blocks to DMA from.
    let mut pos = req.file_offset;
    let mut hole_list: Vec<Range<u64>> = holes(req.file_offset, end)
        .into_iter()
        .map(|h| h.start.max(req.file_offset)..h.end.min(end))
        .filter(|h| h.start < h.end)
        .collect();
    hole_list.sort_by_key(|h| h.start);
    for hole in hole_list {
        if hole.start < pos {
            continue;
        }
        out.aligned_piece(pos, hole.start, file, offset_align, mem_align, buf);
        out.push(
            hole.start,
            hole.end,
            compat(
                Reason::Sparse,
                format!(
                    "bytes [{}, {}) are a hole of a sparse file (or unwritten preallocation): no data \
                     blocks to DMA from",
                    hole.start, hole.end
                ),
            ),
        );
        pos = hole.end;
    }
    out.aligned_piece(pos, end, file, offset_align, mem_align, buf);
    out.finish(eof)
}

struct Planner {
    req: Request,
    segments: Vec<Segment>,
}

impl Planner {
    fn push(&mut self, start: u64, end: u64, route: Route) {
        if start >= end {
            return;
        }
        let buf_offset = self.req.buf_offset + (start - self.req.file_offset);
        if let Some(last) = self.segments.last_mut() {
            if last.route == route && last.file_offset + last.len == start {
                last.len += end - start;
                return;
            }
        }
        self.segments.push(Segment {
            file_offset: start,
            buf_offset,
            len: end - start,
            route,
        });
    }

    /// `[start, end)` with a P2P-able start: P2P for the aligned head, compat
    /// for a tail that is not a whole number of O_DIRECT blocks.
    fn aligned_piece(
        &mut self,
        start: u64,
        end: u64,
        file: &FileFacts,
        offset_align: u64,
        mem_align: u64,
        buf: &BufferFacts,
    ) {
        if start >= end {
            return;
        }
        let addr = buf
            .addr
            .wrapping_add(self.req.buf_offset + (start - self.req.file_offset));
        if !start.is_multiple_of(offset_align) || !addr.is_multiple_of(mem_align) {
            self.push(
                start,
                end,
                compat(
                    Reason::Alignment,
                    format!(
                        "data at file offset {start} (after a hole) is not aligned to \
                         {offset_align}"
                    ),
                ),
            );
            return;
        }
        let head_end = start + align_down(end - start, offset_align);
        self.push(start, head_end, Route::P2p);
        if head_end == end {
            return;
        }
        let tail = end - head_end;
        let route = if self.req.write && end > file.size {
            compat(
                Reason::Append,
                format!(
                    "the write extends the file to {end} bytes, not a multiple of \
                     {offset_align}: its last {tail} bytes go through the page cache"
                ),
            )
        } else if !self.req.write && end == file.size {
            compat(
                Reason::EofTail,
                format!(
                    "the file ends inside a block (size {}): its last {tail} bytes go through \
                     the page cache",
                    file.size
                ),
            )
        } else {
            compat(
                Reason::Alignment,
                format!(
                    "length {} is not a multiple of {offset_align}: the last {tail} bytes go \
                     through the page cache",
                    end - start
                ),
            )
        };
        self.push(head_end, end, route);
    }

    fn finish(self, eof: bool) -> Plan {
        Plan {
            segments: self.segments,
            eof,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn file(size: u64) -> FileFacts {
        FileFacts {
            size,
            offset_align: 512,
            mem_align: 4,
            direct: DirectIo::Available,
            append_only: false,
        }
    }

    fn gpu() -> BufferFacts {
        BufferFacts {
            addr: 0x7f00_0000_0000,
            p2pmem: true,
        }
    }

    fn read(file_offset: u64, buf_offset: u64, len: u64) -> Request {
        Request {
            write: false,
            file_offset,
            buf_offset,
            len,
        }
    }

    fn write(file_offset: u64, buf_offset: u64, len: u64) -> Request {
        Request {
            write: true,
            ..read(file_offset, buf_offset, len)
        }
    }

    fn no_holes(_: u64, _: u64) -> Vec<Range<u64>> {
        Vec::new()
    }

    fn run(req: Request, f: &FileFacts) -> Plan {
        plan(&req, f, &gpu(), &Verdict::Try, &no_holes)
    }

    /// (file_offset, len, route name, reason) per segment.
    fn shape(p: &Plan) -> Vec<(u64, u64, &'static str, Option<Reason>)> {
        p.segments
            .iter()
            .map(|s| match &s.route {
                Route::P2p => (s.file_offset, s.len, "p2p", None),
                Route::Compat { reason, .. } => (s.file_offset, s.len, "compat", Some(*reason)),
            })
            .collect()
    }

    #[test]
    fn aligned_read_inside_the_file_is_all_p2p() {
        let p = run(read(MIB, 4096, 8 * MIB), &file(64 * MIB));
        assert_eq!(shape(&p), vec![(MIB, 8 * MIB, "p2p", None)]);
        assert_eq!(p.segments[0].buf_offset, 4096);
        assert!(!p.eof);
    }

    #[test]
    fn aligned_write_is_all_p2p_even_when_it_extends_the_file() {
        assert_eq!(
            shape(&run(write(0, 0, 4 * MIB), &file(0))),
            vec![(0, 4 * MIB, "p2p", None)]
        );
        assert_eq!(
            shape(&run(write(MIB, 0, MIB), &file(64 * MIB))),
            vec![(MIB, MIB, "p2p", None)]
        );
    }

    #[test]
    fn unaligned_file_offset_sends_everything_to_compat() {
        let p = run(read(1000, 0, MIB), &file(64 * MIB));
        assert_eq!(
            shape(&p),
            vec![(1000, MIB, "compat", Some(Reason::Alignment))]
        );
        let Route::Compat { detail, .. } = &p.segments[0].route else {
            unreachable!()
        };
        assert!(detail.contains("file offset 1000"), "{detail}");
    }

    #[test]
    fn unaligned_gpu_address_sends_everything_to_compat() {
        let p = run(read(0, 1, MIB), &file(64 * MIB));
        assert_eq!(shape(&p), vec![(0, MIB, "compat", Some(Reason::Alignment))]);
        // Aligned to the memory alignment (4) is enough for the buffer.
        assert_eq!(
            shape(&run(read(0, 4, MIB), &file(64 * MIB))),
            vec![(0, MIB, "p2p", None)]
        );
    }

    #[test]
    fn unaligned_length_inside_the_file_splits_off_a_compat_tail() {
        let p = run(read(0, 0, 4096 + 100), &file(MIB));
        assert_eq!(
            shape(&p),
            vec![
                (0, 4096, "p2p", None),
                (4096, 100, "compat", Some(Reason::Alignment))
            ]
        );
        assert_eq!(p.segments[1].buf_offset, 4096);
    }

    #[test]
    fn short_file_reads_to_eof_with_a_compat_tail() {
        let p = run(read(0, 0, MIB), &file(10_000));
        assert!(p.eof);
        assert_eq!(
            shape(&p),
            vec![
                (0, 9728, "p2p", None),
                (9728, 272, "compat", Some(Reason::EofTail))
            ]
        );
        // A block-aligned size needs no tail, only the EOF flag.
        let p = run(read(0, 0, MIB), &file(8192));
        assert!(p.eof);
        assert_eq!(shape(&p), vec![(0, 8192, "p2p", None)]);
        // Starting at or past EOF moves nothing.
        let p = run(read(8192, 0, MIB), &file(8192));
        assert!(p.eof);
        assert!(p.segments.is_empty());
    }

    #[test]
    fn holes_go_compat_and_data_between_them_p2p() {
        let holes = |s: u64, e: u64| -> Vec<Range<u64>> {
            assert_eq!((s, e), (0, 16 * MIB));
            // A hole that starts before the range is clipped.
            vec![8 * MIB..16 * MIB, 0..4 * MIB]
        };
        let p = plan(
            &read(0, 0, 16 * MIB),
            &file(16 * MIB),
            &gpu(),
            &Verdict::Try,
            &holes,
        );
        assert_eq!(
            shape(&p),
            vec![
                (0, 4 * MIB, "compat", Some(Reason::Sparse)),
                (4 * MIB, 4 * MIB, "p2p", None),
                (8 * MIB, 8 * MIB, "compat", Some(Reason::Sparse)),
            ]
        );
        assert_eq!(p.segments[2].buf_offset, 8 * MIB);
    }

    #[test]
    fn data_after_an_unaligned_hole_end_is_compat() {
        let holes = |_: u64, _: u64| -> Vec<Range<u64>> { std::iter::once(0..1000).collect() };
        let p = plan(
            &read(0, 0, 8192),
            &file(8192),
            &gpu(),
            &Verdict::Try,
            &holes,
        );
        assert_eq!(
            shape(&p),
            vec![
                (0, 1000, "compat", Some(Reason::Sparse)),
                (1000, 7192, "compat", Some(Reason::Alignment))
            ]
        );
    }

    #[test]
    fn writes_never_ask_for_holes() {
        let holes = |_: u64, _: u64| -> Vec<Range<u64>> { panic!("asked for holes") };
        let p = plan(
            &write(0, 0, MIB),
            &file(16 * MIB),
            &gpu(),
            &Verdict::Try,
            &holes,
        );
        assert_eq!(shape(&p), vec![(0, MIB, "p2p", None)]);
    }

    #[test]
    fn appends_are_compat_and_say_so() {
        // Appending at an unaligned end of file.
        let p = run(write(10_000, 0, 5000), &file(10_000));
        assert_eq!(
            shape(&p),
            vec![(10_000, 5000, "compat", Some(Reason::Append))]
        );
        // Extending to an unaligned size: aligned head P2P, tail appended.
        let p = run(write(8192, 0, 5000), &file(8192));
        assert_eq!(
            shape(&p),
            vec![
                (8192, 4608, "p2p", None),
                (12800, 392, "compat", Some(Reason::Append))
            ]
        );
        // An O_APPEND handle: the kernel picks the offset.
        let mut f = file(8192);
        f.append_only = true;
        assert_eq!(
            shape(&run(write(0, 0, 4096), &f)),
            vec![(0, 4096, "compat", Some(Reason::Append))]
        );
        // O_APPEND does not matter for reads.
        assert_eq!(
            shape(&run(read(0, 0, 4096), &f)),
            vec![(0, 4096, "p2p", None)]
        );
        // An unaligned overwrite inside the file is alignment, not append.
        assert_eq!(
            shape(&run(write(1000, 0, 5000), &file(MIB))),
            vec![(1000, 5000, "compat", Some(Reason::Alignment))]
        );
    }

    #[test]
    fn whole_request_reasons_win_over_everything_else() {
        let f = file(MIB);
        let verdict = Verdict::Compat {
            reason: Reason::Topology,
            detail: "no switch".to_owned(),
        };
        let p = plan(&read(1000, 1, MIB), &f, &gpu(), &verdict, &no_holes);
        assert!(p.eof);
        assert_eq!(
            shape(&p),
            vec![(1000, MIB - 1000, "compat", Some(Reason::Topology))]
        );

        let devmap = BufferFacts {
            p2pmem: false,
            ..gpu()
        };
        let p = plan(&read(0, 0, 4096), &f, &devmap, &Verdict::Try, &no_holes);
        assert_eq!(
            shape(&p),
            vec![(0, 4096, "compat", Some(Reason::NotP2pmem))]
        );

        let mut no_direct = file(MIB);
        no_direct.direct = DirectIo::Unavailable {
            why: "statx".to_owned(),
        };
        let p = plan(
            &write(0, 0, 4096),
            &no_direct,
            &gpu(),
            &Verdict::Try,
            &no_holes,
        );
        assert_eq!(
            shape(&p),
            vec![(0, 4096, "compat", Some(Reason::FsNoDirectIo))]
        );
    }

    #[test]
    fn zero_length_plans_nothing() {
        let p = run(read(0, 0, 0), &file(MIB));
        assert!(p.segments.is_empty());
        assert!(!p.eof);
    }

    #[test]
    fn segments_cover_the_request_exactly() {
        // Exhaustive over small shapes: the segments tile [offset, end)
        // without gaps or overlaps, and buffer offsets follow file offsets.
        for size in [0u64, 511, 512, 1000, 4096, 5000] {
            for off in [0u64, 1, 512, 1000, 4096] {
                for len in [1u64, 511, 512, 4096, 4097] {
                    for w in [false, true] {
                        let req = Request {
                            write: w,
                            file_offset: off,
                            buf_offset: 8,
                            len,
                        };
                        let holes = |s: u64, e: u64| -> Vec<Range<u64>> {
                            std::iter::once(s.max(1024)..e.min(2048)).collect()
                        };
                        let p = plan(&req, &file(size), &gpu(), &Verdict::Try, &holes);
                        let end = if w { off + len } else { (off + len).min(size) };
                        let mut pos = off;
                        for s in &p.segments {
                            assert_eq!(s.file_offset, pos, "{req:?} size {size}: {p:?}");
                            assert_eq!(s.buf_offset, 8 + (pos - off));
                            assert!(s.len > 0);
                            if s.route == Route::P2p {
                                assert_eq!(s.file_offset % 512, 0);
                                assert_eq!(s.len % 512, 0);
                            }
                            pos += s.len;
                        }
                        if w || off < size {
                            assert_eq!(pos, end, "{req:?} size {size}: {p:?}");
                        } else {
                            assert!(p.segments.is_empty());
                        }
                    }
                }
            }
        }
    }
}
