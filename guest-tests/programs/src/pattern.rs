//! The seeded data pattern of `p2plab-pcimem fill`/`check`, shared with the
//! host side of the tests so they can check a BAR's backing file.

/// The pattern word at `index` (8-byte words from the start of the range)
/// for a seed (xorshift-mixed).
pub fn word(seed: u64, index: u64) -> u64 {
    let mut x = seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

/// `len` bytes of the pattern as a little-endian guest stores them
/// (`len` is rounded down to whole words).
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    (0..(len / 8) as u64)
        .flat_map(|i| word(seed, i).to_le_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_the_words_in_little_endian_order() {
        let b = bytes(7, 17);
        assert_eq!(b.len(), 16);
        assert_eq!(b[..8], word(7, 0).to_le_bytes());
        assert_eq!(b[8..], word(7, 1).to_le_bytes());
        assert_ne!(word(7, 0), word(8, 0), "the seed matters");
        assert_ne!(word(7, 0), word(7, 1), "the index matters");
    }
}
