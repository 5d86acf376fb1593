//! Little-endian fields in fixed-size records (admin entries, WQEs,
//! completions, frames). Reads past a record's end give 0 and writes past
//! it are dropped, so a parser built on them cannot panic on any input;
//! the records' layouts keep every field inside.

/// `N` bytes at `at`, zero past the end.
fn get<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = at.checked_add(N).and_then(|end| bytes.get(at..end)) {
        out.copy_from_slice(src);
    }
    out
}

/// The byte at `at`.
pub fn u8_at(bytes: &[u8], at: usize) -> u8 {
    bytes.get(at).copied().unwrap_or(0)
}

/// The little-endian u16 at `at`.
pub fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(get(bytes, at))
}

/// The little-endian u32 at `at`.
pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(get(bytes, at))
}

/// The little-endian u64 at `at`.
pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(get(bytes, at))
}

/// A 64-bit address stored as two dwords, low first (`struct
/// efa_common_mem_addr`, and the `addr_lo`/`addr_hi` pairs of WQEs).
pub fn addr_at(bytes: &[u8], at: usize) -> u64 {
    u64::from(u32_at(bytes, at)) | u64::from(u32_at(bytes, at + 4)) << 32
}

/// The 16 bytes at `at` (a GID).
pub fn gid_at(bytes: &[u8], at: usize) -> [u8; 16] {
    get(bytes, at)
}

/// Copies `value` to `at`, as far as it fits.
pub fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    if let Some(dst) = at
        .checked_add(value.len())
        .and_then(|end| bytes.get_mut(at..end))
    {
        dst.copy_from_slice(value);
    }
}

/// Stores `value` at `at`.
pub fn put_u8(bytes: &mut [u8], at: usize, value: u8) {
    put(bytes, at, &[value]);
}

/// Stores little-endian `value` at `at`.
pub fn put_u16(bytes: &mut [u8], at: usize, value: u16) {
    put(bytes, at, &value.to_le_bytes());
}

/// Stores little-endian `value` at `at`.
pub fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    put(bytes, at, &value.to_le_bytes());
}

/// Stores little-endian `value` at `at`.
pub fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    put(bytes, at, &value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a field read past a short record that panics instead of
    /// reading 0, or a write past it that lands anywhere.
    #[test]
    fn fields_past_the_end_read_zero_and_write_nothing() {
        let mut record = [0u8; 8];
        put_u32(&mut record, 4, 0xdead_beef);
        put_u32(&mut record, 6, 1);
        put_u64(&mut record, usize::MAX - 2, 1);
        assert_eq!(u32_at(&record, 4), 0xdead_beef);
        assert_eq!(u32_at(&record, 6), 0);
        assert_eq!(u64_at(&record, usize::MAX), 0);
        assert_eq!(u16_at(&record, 6), 0xdead);
        put_u32(&mut record, 0, 0x1000);
        assert_eq!(addr_at(&record, 0), 0xdead_beef_0000_1000);
        assert_eq!(u8_at(&record, 8), 0);
    }
}
