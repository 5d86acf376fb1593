//! Trapped region accesses: REGION_READ, REGION_WRITE, REGION_WRITE_MULTI.

use tracing::debug;
use vfio_bindings::bindings::vfio::{VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE};

use super::{CommandOutcome, Hex, Refusal, Reply, Session};
use crate::protocol::{Reader, Writer};

/// Which way a trapped region access goes; the region must allow it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

/// One entry of REGION_WRITE_MULTI: offset, region, count, 8 data bytes.
const WRITE_MULTI_ENTRY: usize = 24;
const WRITE_MULTI_DATA: usize = 8;

impl Session<'_> {
    /// Checks a region access against the region's size and flags.
    fn check_access(
        &self,
        index: u32,
        offset: u64,
        count: usize,
        direction: Direction,
    ) -> Result<(), Refusal> {
        if count > self.config.max_data_xfer_size as usize {
            return Err(Refusal::new(
                libc::E2BIG,
                format!("access of {count} bytes exceeds max_data_xfer_size"),
            ));
        }
        self.check_region_index(index)?;
        let info = self.device.region_info(index)?;
        let (needed, allowed) = match direction {
            Direction::Read => (VFIO_REGION_INFO_FLAG_READ, "readable"),
            Direction::Write => (VFIO_REGION_INFO_FLAG_WRITE, "writable"),
        };
        if info.flags & needed == 0 {
            return Err(Refusal::new(
                libc::EACCES,
                format!("region {index} is not {allowed}"),
            ));
        }
        match offset.checked_add(count as u64) {
            Some(end) if end <= info.size => Ok(()),
            _ => Err(Refusal::inval(format!(
                "access {offset:#x}+{count} outside region {index} of {} bytes",
                info.size
            ))),
        }
    }

    pub(super) fn region_read(&mut self, payload: &[u8]) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let (Some(offset), Some(index), Some(count)) = (r.u64(), r.u32(), r.u32()) else {
            return Err(Refusal::inval("REGION_READ payload shorter than 16 bytes"));
        };
        self.check_access(index, offset, count as usize, Direction::Read)?;
        let mut data = vec![0u8; count as usize];
        if count > 0 {
            self.device.region_read(index, offset, &mut data)?;
        }
        debug!(region = index, offset, len = count, data = ?Hex(&data), "REGION_READ");
        let mut w = Writer::with_capacity(16 + data.len());
        w.u64(offset).u32(index).u32(count).bytes(&data);
        Ok(Reply::with(w.finish()))
    }

    pub(super) fn region_write(&mut self, payload: &[u8]) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let (Some(offset), Some(index), Some(count)) = (r.u64(), r.u32(), r.u32()) else {
            return Err(Refusal::inval("REGION_WRITE payload shorter than 16 bytes"));
        };
        let data = r.rest();
        if data.len() != count as usize {
            return Err(Refusal::inval(format!(
                "REGION_WRITE count {count} but {} data bytes",
                data.len()
            )));
        }
        self.check_access(index, offset, data.len(), Direction::Write)?;
        debug!(region = index, offset, len = count, data = ?Hex(data), "REGION_WRITE");
        if count > 0 {
            self.device.region_write(index, offset, data)?;
        }
        let mut w = Writer::with_capacity(16);
        w.u64(offset).u32(index).u32(count);
        Ok(Reply::with(w.finish()))
    }

    pub(super) fn region_write_multi(&mut self, payload: &[u8]) -> CommandOutcome {
        let mut r = Reader::new(payload);
        let wr_cnt = r
            .u64()
            .ok_or_else(|| Refusal::inval("REGION_WRITE_MULTI without wr_cnt"))?;
        let expected = usize::try_from(wr_cnt)
            .ok()
            .and_then(|n| n.checked_mul(WRITE_MULTI_ENTRY));
        if expected != Some(r.rest().len()) {
            return Err(Refusal::inval(format!(
                "REGION_WRITE_MULTI wr_cnt {wr_cnt} but {} bytes of entries",
                r.rest().len()
            )));
        }
        // Check every entry before applying any, so a bad one does not
        // leave half the batch applied.
        let mut writes = Vec::with_capacity(expected.unwrap_or(0) / WRITE_MULTI_ENTRY);
        for _ in 0..wr_cnt {
            let (Some(offset), Some(index), Some(count), Some(data)) =
                (r.u64(), r.u32(), r.u32(), r.take(WRITE_MULTI_DATA))
            else {
                return Err(Refusal::inval("truncated REGION_WRITE_MULTI entry"));
            };
            let data = data
                .get(..count as usize)
                .filter(|d| !d.is_empty())
                .ok_or_else(|| {
                    Refusal::inval(format!("REGION_WRITE_MULTI entry count {count} not 1..=8"))
                })?;
            self.check_access(index, offset, data.len(), Direction::Write)?;
            writes.push((index, offset, data));
        }
        for (index, offset, data) in writes {
            debug!(region = index, offset, len = data.len(), data = ?Hex(data), "REGION_WRITE (multi)");
            self.device.region_write(index, offset, data)?;
        }
        let mut w = Writer::with_capacity(8);
        w.u64(wr_cnt);
        Ok(Reply::with(w.finish()))
    }
}
