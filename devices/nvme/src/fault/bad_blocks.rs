//! The persistent unreadable blocks that `media-error` specs leave, until
//! the guest rewrites or deallocates them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::filter::LbaRange;

/// A bad-block range as `status` reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BadRangeReport {
    pub nsid: u32,
    pub first: u64,
    pub last: u64,
}

/// Unreadable blocks per namespace: disjoint, inclusive ranges keyed by
/// their first block, so that finding the one a read touches is a lookup,
/// not a scan, however finely the guest's writes have split them.
#[derive(Debug, Clone, Default)]
pub struct BadBlocks {
    /// nsid -> (first -> last).
    ranges: BTreeMap<u32, BTreeMap<u64, u64>>,
}

/// The last block of `blocks` blocks from `slba` (`blocks` > 0).
fn last_of(slba: u64, blocks: u64) -> u64 {
    slba.saturating_add(blocks - 1)
}

impl BadBlocks {
    /// Marks a range unreadable (merging with neighbours).
    pub fn add(&mut self, nsid: u32, range: LbaRange) {
        let list = self.ranges.entry(nsid).or_default();
        let (mut first, mut last) = (range.first, range.last);
        // Every range that overlaps or touches [first, last] merges into it.
        let touching: Vec<(u64, u64)> = list
            .range(..=last.saturating_add(1))
            .rev()
            .take_while(|&(_, &l)| l.saturating_add(1) >= first)
            .map(|(&f, &l)| (f, l))
            .collect();
        for (f, l) in touching {
            list.remove(&f);
            first = first.min(f);
            last = last.max(l);
        }
        list.insert(first, last);
    }

    /// The first unreadable block among `blocks` blocks from `slba`.
    pub fn first_bad(&self, nsid: u32, slba: u64, blocks: u64) -> Option<u64> {
        if blocks == 0 {
            return None;
        }
        let list = self.ranges.get(&nsid)?;
        if let Some((_, &l)) = list.range(..=slba).next_back() {
            if l >= slba {
                return Some(slba);
            }
        }
        list.range(slba..=last_of(slba, blocks))
            .next()
            .map(|(&f, _)| f)
    }

    /// The blocks were rewritten or deallocated: they read fine again.
    pub fn repair(&mut self, nsid: u32, slba: u64, blocks: u64) {
        if blocks == 0 {
            return;
        }
        let Some(list) = self.ranges.get_mut(&nsid) else {
            return;
        };
        let end = last_of(slba, blocks);
        let hit: Vec<(u64, u64)> = list
            .range(..=end)
            .rev()
            .take_while(|&(_, &l)| l >= slba)
            .map(|(&f, &l)| (f, l))
            .collect();
        for (f, l) in hit {
            list.remove(&f);
            if f < slba {
                list.insert(f, slba - 1);
            }
            if l > end {
                list.insert(end + 1, l);
            }
        }
        if list.is_empty() {
            self.ranges.remove(&nsid);
        }
    }

    /// Every bad range, by namespace.
    pub fn report(&self) -> Vec<BadRangeReport> {
        self.ranges
            .iter()
            .flat_map(|(&nsid, list)| {
                list.iter()
                    .map(move |(&first, &last)| BadRangeReport { nsid, first, last })
            })
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The whole namespace was formatted.
    pub fn forget_namespace(&mut self, nsid: u32) {
        self.ranges.remove(&nsid);
    }
}
