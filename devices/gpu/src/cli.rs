//! Value parsers for the `p2plab-gpu` command line. clap prefixes their
//! errors with the flag, e.g. "invalid value '3G' for '--vram-size'".

use crate::regs::{MAX_VRAM_SIZE, MIN_VRAM_SIZE};

/// A byte count: digits with an optional binary suffix K, M, G or T
/// (case-insensitive, optionally followed by "iB" or "B"): `1G`, `256M`,
/// `64GiB`, `1073741824`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("'{text}' is not a size (e.g. 256M, 1G, 64G)"));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "'{text}': unknown size suffix '{suffix}' (use K, M, G or T)"
            ))
        }
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("'{text}' is too large"))?;
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// A VRAM (BAR2) size: a power of two from 256 MiB to 1 TiB.
pub fn parse_vram_size(text: &str) -> Result<u64, String> {
    let size = parse_size(text)?;
    if !size.is_power_of_two() {
        return Err(format!(
            "{size} bytes is not a power of two (a PCI BAR must be)"
        ));
    }
    if !(MIN_VRAM_SIZE..=MAX_VRAM_SIZE).contains(&size) {
        return Err(format!(
            "{} MiB is outside {} MiB ..= {} GiB",
            size >> 20,
            MIN_VRAM_SIZE >> 20,
            MAX_VRAM_SIZE >> 30
        ));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("64g"), Ok(64 << 30));
        assert_eq!(parse_size("64GiB"), Ok(64 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184G").is_err(), "overflow");
    }

    #[test]
    fn vram_sizes() {
        assert_eq!(parse_vram_size("256M"), Ok(256 << 20));
        assert_eq!(parse_vram_size("1G"), Ok(1 << 30));
        assert_eq!(parse_vram_size("64G"), Ok(64 << 30));
        assert_eq!(parse_vram_size("1T"), Ok(1 << 40));
        let err = parse_vram_size("3G").unwrap_err();
        assert!(err.contains("power of two"), "{err}");
        let err = parse_vram_size("128M").unwrap_err();
        assert!(err.contains("outside"), "{err}");
        assert!(parse_vram_size("2T").is_err());
        assert!(parse_vram_size("banana").is_err());
    }
}
