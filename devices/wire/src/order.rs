//! Arrival order on the receiving end: which frames came after a frame
//! that was sent later than them.

/// The highest sequence number seen on the current link.
#[derive(Debug, Default)]
pub struct ArrivalOrder {
    link: Option<u64>,
    highest: u32,
}

impl ArrivalOrder {
    /// Notes a frame numbered `seq` arriving on link `link` (a new
    /// connection starts counting afresh); whether it came in order
    /// (numbers wrap: "later" is up to 2^31 ahead).
    pub fn arrive(&mut self, link: u64, seq: u32) -> bool {
        if self.link != Some(link) {
            self.link = Some(link);
            self.highest = seq;
            return true;
        }
        let ahead = seq.wrapping_sub(self.highest);
        if ahead != 0 && ahead < 1 << 31 {
            self.highest = seq;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a late frame counted as in order (or the reverse), gaps
    /// (drops) taken for reordering, wrap-around misread, or a new link
    /// compared with the old one's numbers.
    #[test]
    fn late_frames_are_out_of_order_gaps_and_wraps_are_not() {
        let mut order = ArrivalOrder::default();
        let got: Vec<bool> = [(0, 1), (0, 2), (0, 4), (0, 3), (0, 5), (0, 5)]
            .iter()
            .map(|&(l, s)| order.arrive(l, s))
            .collect();
        assert_eq!(got, [true, true, true, false, true, false]);
        assert!(order.arrive(1, 7), "a new link starts afresh");
        assert!(!order.arrive(1, 6));
        assert!(order.arrive(2, u32::MAX - 1));
        assert!(order.arrive(2, u32::MAX));
        assert!(order.arrive(2, 0), "wrapped");
        assert!(!order.arrive(2, u32::MAX), "late across the wrap");
    }
}
