//! Memory regions: the page list REG_MR hands over, in its three forms,
//! and the translation of an MR's I/O virtual addresses to bus addresses.
//!
//! The driver (`efa_verbs.c`) passes up to four entries inline, a
//! contiguous list through one control buffer ("direct"), or, for a list
//! in vmalloc memory, a chain of 4 KiB chunks: each chunk holds up to 510
//! pointers to pages of the list (512 entries each) and, at byte 4080,
//! the control buffer of the next chunk. Every entry is a bus address
//! aligned to the MR's page size: guest RAM for ordinary MRs, a peer
//! device's BAR for dma-buf MRs of P2P memory. The device reads the list
//! once at registration, checking every length, count and alignment, with
//! a walk bounded by the page count (a hostile chain cannot loop).

use p2plab_dma::{DmaFault, GuestMemory};

use crate::admin::{CtrlBuff, PblSource, RegMr};
use crate::bytes::u64_at;

/// Size of a chunk of a chained page list.
pub const CHUNK_SIZE: usize = 4096;
/// Page-list pointers in a full chunk.
pub const PTRS_PER_CHUNK: usize = (CHUNK_SIZE - CtrlBuff::SIZE) / 8;
/// Where a chunk holds the next chunk's control buffer.
pub const CHUNK_NEXT_AT: usize = PTRS_PER_CHUNK * 8;
/// Bytes of a full chunk (pointers and the next-chunk buffer).
pub const CHUNK_USED_SIZE: usize = CHUNK_NEXT_AT + CtrlBuff::SIZE;
/// Page-list entries in one 4 KiB page of the list.
pub const ENTRIES_PER_PAGE: usize = 512;

/// Why a page list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PblError {
    /// Lengths, counts or sizes that do not describe the MR.
    #[error("page list does not match the MR: {0}")]
    Mismatch(&'static str),
    /// A control buffer or chunk that cannot be one.
    #[error("malformed page list: {0}")]
    Malformed(&'static str),
    /// An entry not aligned to the page size.
    #[error("page list entry {index} ({addr:#x}) is not aligned to the page size")]
    Unaligned {
        /// Which entry.
        index: usize,
        /// Its value.
        addr: u64,
    },
    /// The list could not be read from guest memory.
    #[error("cannot read the page list: {0}")]
    Dma(#[from] DmaFault),
}

/// The number of pages of size `1 << shift` that `[iova, iova+length)`
/// touches, or `None` if it overflows or is empty.
pub fn pages_spanned(iova: u64, length: u64, shift: u8) -> Option<u64> {
    if length == 0 || shift >= 64 {
        return None;
    }
    let page = 1u64 << shift;
    let start = iova & !(page - 1);
    let end = iova.checked_add(length)?.checked_add(page - 1)? & !(page - 1);
    Some((end - start) >> shift)
}

/// A registered MR's translation: IOVA range and page list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageList {
    /// log2 of the page size.
    pub page_shift: u8,
    /// First valid IOVA.
    pub iova: u64,
    /// Bytes valid from `iova`.
    pub length: u64,
    /// Bus address of each page, in IOVA order.
    pub pages: Vec<u64>,
}

impl PageList {
    /// Reads and checks the page list of `cmd` through `memory` (page
    /// size, length and page count already checked by the caller against
    /// the device's limits, see [`pages_spanned`]).
    pub fn read(memory: &dyn GuestMemory, cmd: &RegMr) -> Result<Self, PblError> {
        let page_num = cmd.page_num as usize;
        if pages_spanned(cmd.iova, cmd.mr_length, cmd.page_shift) != Some(u64::from(cmd.page_num)) {
            return Err(PblError::Mismatch(
                "page_num is not the pages the IOVA range spans",
            ));
        }
        let pages = match cmd.pbl {
            PblSource::Inline(entries) => {
                if page_num > entries.len() {
                    return Err(PblError::Mismatch("more than 4 inline entries"));
                }
                entries[..page_num].to_vec()
            }
            PblSource::Direct(buffer) => {
                let bytes = page_num * 8;
                if (buffer.length as usize) < bytes {
                    return Err(PblError::Malformed(
                        "control buffer shorter than the page list",
                    ));
                }
                read_entries(memory, buffer.addr, page_num)?
            }
            PblSource::Chained(first) => read_chain(memory, first, page_num)?,
        };
        let page = 1u64 << cmd.page_shift;
        if let Some((index, &addr)) = pages.iter().enumerate().find(|(_, &a)| a & (page - 1) != 0) {
            return Err(PblError::Unaligned { index, addr });
        }
        Ok(Self {
            page_shift: cmd.page_shift,
            iova: cmd.iova,
            length: cmd.mr_length,
            pages,
        })
    }

    /// Whether `[va, va+len)` lies inside the MR.
    pub fn contains(&self, va: u64, len: u64) -> bool {
        va >= self.iova
            && va
                .checked_add(len)
                .zip(self.iova.checked_add(self.length))
                .is_some_and(|(end, mr_end)| end <= mr_end)
    }

    /// Appends the bus segments behind `[va, va+len)` to `out`, merging
    /// contiguous pages; `false` (and nothing appended) when the range
    /// leaves the MR.
    pub fn segments(&self, va: u64, len: u64, out: &mut Vec<(u64, usize)>) -> bool {
        if !self.contains(va, len) {
            return false;
        }
        let page = 1u64 << self.page_shift;
        let base = self.iova & !(page - 1);
        let start = out.len();
        let mut at = va;
        let mut left = len;
        while left > 0 {
            let index = ((at - base) >> self.page_shift) as usize;
            let Some(&page_addr) = self.pages.get(index) else {
                out.truncate(start);
                return false;
            };
            let in_page = at & (page - 1);
            let take = left.min(page - in_page);
            let bus = page_addr + in_page;
            let extends = out.len() > start
                && out
                    .last()
                    .is_some_and(|&(last, last_len)| last + last_len as u64 == bus);
            match out.last_mut() {
                Some((_, last_len)) if extends => *last_len += take as usize,
                _ => out.push((bus, take as usize)),
            }
            at += take;
            left -= take;
        }
        true
    }
}

/// `count` u64 entries at `addr`.
fn read_entries(memory: &dyn GuestMemory, addr: u64, count: usize) -> Result<Vec<u64>, PblError> {
    let mut raw = vec![0u8; count * 8];
    memory.read(addr, &mut raw)?;
    Ok(raw.chunks_exact(8).map(|e| u64_at(e, 0)).collect())
}

/// Walks a chunk chain for `page_num` entries.
fn read_chain(
    memory: &dyn GuestMemory,
    first: CtrlBuff,
    page_num: usize,
) -> Result<Vec<u64>, PblError> {
    let list_pages = page_num.div_ceil(ENTRIES_PER_PAGE);
    let max_chunks = list_pages.div_ceil(PTRS_PER_CHUNK);
    let mut pages = Vec::with_capacity(page_num);
    let mut chunk = first;
    let mut chunks = 0usize;
    let mut raw = vec![0u8; CHUNK_USED_SIZE];
    while pages.len() < page_num {
        chunks += 1;
        if chunks > max_chunks {
            return Err(PblError::Malformed("more chunks than the page list needs"));
        }
        let length = chunk.length as usize;
        if length <= CtrlBuff::SIZE
            || length > CHUNK_USED_SIZE
            || !(length - CtrlBuff::SIZE).is_multiple_of(8)
        {
            return Err(PblError::Malformed("chunk length"));
        }
        let pointers = (length - CtrlBuff::SIZE) / 8;
        let raw = &mut raw[..length];
        memory.read(chunk.addr, raw)?;
        for i in 0..pointers {
            let left = page_num - pages.len();
            if left == 0 {
                break;
            }
            let list_page = u64_at(raw, i * 8);
            let entries = read_entries(memory, list_page, left.min(ENTRIES_PER_PAGE))?;
            pages.extend(entries);
        }
        if pages.len() < page_num {
            if length != CHUNK_USED_SIZE {
                return Err(PblError::Malformed("chain ends before the page list does"));
            }
            chunk = CtrlBuff::at(raw, CHUNK_NEXT_AT);
        }
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2plab_dma::testing::FakeGuestMemory;

    const PAGE: u64 = 4096;

    fn reg(pbl: PblSource, iova: u64, length: u64, shift: u8) -> RegMr {
        RegMr {
            pd: 1,
            pbl,
            mr_length: length,
            page_shift: shift,
            phys_mode: false,
            permissions: 1,
            page_num: pages_spanned(iova, length, shift).unwrap() as u32,
            iova,
        }
    }

    /// Builds a chained list in `memory` as `pbl_chunk_list_create` does:
    /// the flat list in pages at `list_base`, chunks at `chunk_base`.
    fn build_chain(
        memory: &FakeGuestMemory,
        entries: &[u64],
        list_base: u64,
        chunk_base: u64,
    ) -> CtrlBuff {
        for (i, e) in entries.iter().enumerate() {
            memory
                .write(list_base + i as u64 * 8, &e.to_le_bytes())
                .unwrap();
        }
        let list_pages = entries.len().div_ceil(ENTRIES_PER_PAGE);
        let chunks = list_pages.div_ceil(PTRS_PER_CHUNK);
        let mut lengths = vec![CHUNK_USED_SIZE as u32; chunks];
        if !list_pages.is_multiple_of(PTRS_PER_CHUNK) {
            lengths[chunks - 1] = ((list_pages % PTRS_PER_CHUNK) * 8 + 12) as u32;
        }
        for p in 0..list_pages {
            let chunk = p / PTRS_PER_CHUNK;
            let slot = p % PTRS_PER_CHUNK;
            let at = chunk_base + chunk as u64 * PAGE + slot as u64 * 8;
            memory
                .write(at, &(list_base + p as u64 * PAGE).to_le_bytes())
                .unwrap();
        }
        for (c, &length) in lengths.iter().enumerate().skip(1) {
            let at = chunk_base + (c as u64 - 1) * PAGE + CHUNK_NEXT_AT as u64;
            memory.write_u32(at, length).unwrap();
            let next = chunk_base + c as u64 * PAGE;
            memory.write_u32(at + 4, next as u32).unwrap();
            memory.write_u32(at + 8, (next >> 32) as u32).unwrap();
        }
        CtrlBuff {
            length: lengths[0],
            addr: chunk_base,
        }
    }

    /// Catches: the chunk geometry (510 pointers, next buffer at 4080,
    /// 512 entries per list page) read off by one, at the exact page
    /// counts where a chunk or list page fills up.
    #[test]
    fn chained_lists_decode_at_every_boundary() {
        for page_num in [5usize, 512, 513, 510 * 512, 510 * 512 + 1, 1021 * 512 + 7] {
            let memory = FakeGuestMemory::new()
                .with_region(0x100_0000, 8 << 20)
                .with_region(0x800_0000, 16 << 10);
            let entries: Vec<u64> = (0..page_num as u64)
                .map(|i| (i + 0x10_0000) << 12)
                .collect();
            let first = build_chain(&memory, &entries, 0x100_0000, 0x800_0000);
            let cmd = reg(PblSource::Chained(first), 0, page_num as u64 * PAGE, 12);
            let list = PageList::read(&memory, &cmd).unwrap_or_else(|e| panic!("{page_num}: {e}"));
            assert_eq!(list.pages, entries, "{page_num}");
        }
    }

    /// Catches: a chain that runs short, or a chunk of a length that
    /// cannot be one, being accepted.
    #[test]
    fn bad_chains_are_refused() {
        let memory = FakeGuestMemory::new().with_region(0x10_0000, 1 << 20);
        let entries: Vec<u64> = (0..600u64).map(|i| i << 12).collect();
        let first = build_chain(&memory, &entries, 0x10_0000, 0x18_0000);
        let short = CtrlBuff {
            length: 8 + 12,
            ..first
        };
        let cmd = reg(PblSource::Chained(short), 0, 600 * PAGE, 12);
        assert!(matches!(
            PageList::read(&memory, &cmd),
            Err(PblError::Malformed(_))
        ));
        for length in [0u32, 12, 13, 4100] {
            let cmd = reg(
                PblSource::Chained(CtrlBuff { length, ..first }),
                0,
                600 * PAGE,
                12,
            );
            assert!(PageList::read(&memory, &cmd).is_err(), "{length}");
        }
        let unmapped = reg(
            PblSource::Direct(CtrlBuff {
                length: 80,
                addr: 0xdead_0000,
            }),
            0,
            10 * PAGE,
            12,
        );
        assert!(matches!(
            PageList::read(&memory, &unmapped),
            Err(PblError::Dma(_))
        ));
    }

    /// Catches: a page count that does not match the range, a misaligned
    /// entry, or a direct buffer shorter than the list being accepted.
    #[test]
    fn inconsistent_registrations_are_refused() {
        let memory = FakeGuestMemory::new().with_region(0x10_0000, 1 << 20);
        let mut cmd = reg(PblSource::Inline([0x1000, 0x2000, 0, 0]), 0x800, 0x1000, 12);
        assert_eq!(cmd.page_num, 2);
        assert!(PageList::read(&memory, &cmd).is_ok());
        cmd.page_num = 3;
        assert!(matches!(
            PageList::read(&memory, &cmd),
            Err(PblError::Mismatch(_))
        ));
        let unaligned = reg(PblSource::Inline([0x1000, 0x2800, 0, 0]), 0x800, 0x1000, 12);
        assert_eq!(
            PageList::read(&memory, &unaligned),
            Err(PblError::Unaligned {
                index: 1,
                addr: 0x2800
            })
        );
        let short = reg(
            PblSource::Direct(CtrlBuff {
                length: 8,
                addr: 0x10_0000,
            }),
            0,
            2 * PAGE,
            12,
        );
        assert!(matches!(
            PageList::read(&memory, &short),
            Err(PblError::Malformed(_))
        ));
        assert_eq!(pages_spanned(u64::MAX - 10, 100, 12), None);
        assert_eq!(pages_spanned(0, 0, 12), None);
    }

    /// Catches: IOVA translation that forgets the offset of an unaligned
    /// IOVA inside its first (2 MiB) page, splits wrongly at a page
    /// boundary, or lets a range leave the MR.
    #[test]
    fn iovas_translate_through_large_pages() {
        let shift = 21;
        let iova = 0x7f00_0012_3456;
        let length = 2 << 20;
        let page_num = pages_spanned(iova, length, shift).unwrap();
        assert_eq!(page_num, 2);
        let list = PageList {
            page_shift: shift,
            iova,
            length,
            pages: vec![0x4000_0000, 0x8000_0000],
        };
        let mut out = Vec::new();
        assert!(list.segments(iova, 16, &mut out));
        assert_eq!(out, vec![(0x4000_0000 + 0x12_3456, 16)]);
        out.clear();
        let boundary = (iova & !((1 << 21) - 1)) + (1 << 21) - 8;
        assert!(list.segments(boundary, 16, &mut out));
        assert_eq!(out, vec![(0x401f_fff8, 8), (0x8000_0000, 8)]);
        out.clear();
        assert!(!list.segments(iova - 1, 2, &mut out));
        assert!(!list.segments(iova + length - 1, 2, &mut out));
        assert!(out.is_empty());
        let contiguous = PageList {
            page_shift: 12,
            iova: 0,
            length: 3 * PAGE,
            pages: vec![0x1000, 0x2000, 0x9000],
        };
        assert!(contiguous.segments(0, 3 * PAGE, &mut out));
        assert_eq!(out, vec![(0x1000, 8192), (0x9000, 4096)]);
    }
}
