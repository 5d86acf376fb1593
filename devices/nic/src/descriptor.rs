//! Descriptors as the guest lays them out ([`crate::regs`]'s `DESC_*`),
//! parsed from untrusted bytes, and the status codes the device writes
//! back.

use crate::regs::*;

/// A descriptor's status codes (`DESC_STATUS_*` in the C header), and the
/// ring-level errors the ERROR register reports (`ERR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The frame was sent (TX) or received whole (RX).
    Ok,
    /// The device could not read or write the buffer.
    DmaError,
    /// TX: the frame is longer than the MTU; nothing was sent.
    TooLong,
    /// RX: the frame arrived with a bad frame check sequence (a corrupted
    /// wire); its bytes were delivered.
    BadFcs,
    /// RX: the frame was longer than the buffer; the buffer holds its start.
    Truncated,
    /// TX: no peer on the wire; nothing was sent.
    LinkDown,
    /// The descriptor asks for something the device does not do (zero
    /// length, unknown flags).
    BadDescriptor,
}

impl Status {
    /// Every status, for the header check.
    pub const ALL: &'static [Status] = &[
        Status::Ok,
        Status::DmaError,
        Status::TooLong,
        Status::BadFcs,
        Status::Truncated,
        Status::LinkDown,
        Status::BadDescriptor,
    ];

    /// The code the device writes (never 0: 0 means "device owns it").
    pub const fn code(self) -> u16 {
        match self {
            Status::Ok => 1,
            Status::DmaError => 2,
            Status::TooLong => 3,
            Status::BadFcs => 4,
            Status::Truncated => 5,
            Status::LinkDown => 6,
            Status::BadDescriptor => 7,
        }
    }

    /// Name as in the C header after `DESC_STATUS_`.
    pub const fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::DmaError => "DMA_ERROR",
            Status::TooLong => "TOO_LONG",
            Status::BadFcs => "BAD_FCS",
            Status::Truncated => "TRUNCATED",
            Status::LinkDown => "LINK_DOWN",
            Status::BadDescriptor => "BAD_DESCRIPTOR",
        }
    }
}

/// Ring-level errors in the ERROR register (`ERR_*` in the C header): the
/// engine halts until the ring is disabled and enabled again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// The ring size is not a power of two in range, or the base is not
    /// descriptor aligned.
    BadRing,
    /// Fetching a descriptor or writing its status failed.
    RingDma,
    /// The doorbell named an index outside the ring.
    BadDoorbell,
}

impl RingError {
    /// Every ring error, for the header check.
    pub const ALL: &'static [RingError] = &[
        RingError::BadRing,
        RingError::RingDma,
        RingError::BadDoorbell,
    ];

    /// The ERROR register's value.
    pub const fn code(self) -> u32 {
        match self {
            RingError::BadRing => 0x10,
            RingError::RingDma => 0x11,
            RingError::BadDoorbell => 0x12,
        }
    }

    /// Name as in the C header after `ERR_`.
    pub const fn name(self) -> &'static str {
        match self {
            RingError::BadRing => "BAD_RING",
            RingError::RingDma => "RING_DMA",
            RingError::BadDoorbell => "BAD_DOORBELL",
        }
    }
}

/// The fields of a descriptor the device reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Bus address of the buffer.
    pub addr: u64,
    /// TX: frame length; RX: buffer capacity.
    pub len: u32,
    /// [`DescFlags`] bits.
    pub flags: u16,
}

/// Why a descriptor cannot be used (it completes with BAD_DESCRIPTOR or
/// TOO_LONG).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorError {
    /// Flags without a name in [`DescFlags`].
    UnknownFlags(u16),
    /// A zero length.
    Empty,
    /// Longer than the MTU.
    TooLong { len: u32, mtu: u32 },
    /// The buffer wraps the 64-bit bus address space.
    Wraps,
}

impl DescriptorError {
    /// The status the descriptor completes with.
    pub fn status(self) -> Status {
        match self {
            DescriptorError::TooLong { .. } => Status::TooLong,
            _ => Status::BadDescriptor,
        }
    }
}

fn u64_at(raw: &[u8; DESC_SIZE as usize], at: u64) -> u64 {
    let at = at as usize;
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[at..at + 8]);
    u64::from_le_bytes(b)
}

fn u32_at(raw: &[u8; DESC_SIZE as usize], at: u64) -> u32 {
    let at = at as usize;
    let mut b = [0u8; 4];
    b.copy_from_slice(&raw[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u16_at(raw: &[u8; DESC_SIZE as usize], at: u64) -> u16 {
    let at = at as usize;
    u16::from_le_bytes([raw[at], raw[at + 1]])
}

impl Descriptor {
    /// Parses the 32 bytes the guest wrote. A TX descriptor's length must
    /// be at most `mtu`; an RX buffer may be any non-zero size (a longer
    /// one is used up to the MTU).
    pub fn parse(
        raw: &[u8; DESC_SIZE as usize],
        mtu: u32,
        tx: bool,
    ) -> Result<Self, DescriptorError> {
        let desc = Descriptor {
            addr: u64_at(raw, DESC_ADDR),
            len: u32_at(raw, DESC_LEN),
            flags: u16_at(raw, DESC_FLAGS),
        };
        if DescFlags::from_raw(desc.flags).has_unknown() {
            return Err(DescriptorError::UnknownFlags(desc.flags));
        }
        if desc.len == 0 {
            return Err(DescriptorError::Empty);
        }
        if tx && desc.len > mtu {
            return Err(DescriptorError::TooLong { len: desc.len, mtu });
        }
        if desc.addr.checked_add(u64::from(desc.len)).is_none() {
            return Err(DescriptorError::Wraps);
        }
        Ok(desc)
    }

    /// Whether the driver wants an interrupt when it completes.
    pub fn wants_irq(&self) -> bool {
        DescFlags::from_raw(self.flags).contains(DescFlags::IRQ)
    }
}

/// Builds a descriptor's bytes (for tests and fuzz seeds; the guest
/// driver does this in C).
pub fn encode(addr: u64, len: u32, flags: u16, cookie: u64) -> [u8; DESC_SIZE as usize] {
    let mut raw = [0u8; DESC_SIZE as usize];
    raw[DESC_ADDR as usize..][..8].copy_from_slice(&addr.to_le_bytes());
    raw[DESC_LEN as usize..][..4].copy_from_slice(&len.to_le_bytes());
    raw[DESC_FLAGS as usize..][..2].copy_from_slice(&flags.to_le_bytes());
    raw[DESC_COOKIE as usize..][..8].copy_from_slice(&cookie.to_le_bytes());
    raw
}

/// Whether `entries` is a ring size the engines accept.
pub fn valid_ring(base: u64, entries: u32) -> bool {
    entries.is_power_of_two()
        && (MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&entries)
        && base.is_multiple_of(DESC_SIZE)
        && base.checked_add(u64::from(entries) * DESC_SIZE).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Would catch a field read from the wrong offset or a bad descriptor
    /// accepted.
    #[test]
    fn parse_reads_fields_and_refuses_bad_ones() {
        let raw = encode(0x1234_5000, 4096, DescFlags::IRQ.raw(), 0xdead);
        let d = Descriptor::parse(&raw, 65536, true).unwrap();
        assert_eq!(
            (d.addr, d.len, d.flags),
            (0x1234_5000, 4096, DescFlags::IRQ.raw())
        );
        assert!(d.wants_irq());
        assert_eq!(
            Descriptor::parse(&encode(0, 4096, 0x8000, 0), 65536, true),
            Err(DescriptorError::UnknownFlags(0x8000))
        );
        assert_eq!(
            Descriptor::parse(&encode(0, 0, 0, 0), 65536, false),
            Err(DescriptorError::Empty)
        );
        let too_long = Descriptor::parse(&encode(0, 65537, 0, 0), 65536, true).unwrap_err();
        assert_eq!(too_long.status(), Status::TooLong);
        assert!(Descriptor::parse(&encode(0, 1 << 20, 0, 0), 65536, false).is_ok());
        assert_eq!(
            Descriptor::parse(&encode(u64::MAX - 10, 100, 0, 0), 65536, false),
            Err(DescriptorError::Wraps)
        );
    }

    #[test]
    fn ring_geometry() {
        assert!(valid_ring(0x1000, 256));
        assert!(!valid_ring(0x1010, 256), "misaligned");
        assert!(!valid_ring(0x1000, 3));
        assert!(!valid_ring(0x1000, 1));
        assert!(!valid_ring(0x1000, 8192));
        assert!(!valid_ring(u64::MAX - 31, 2));
    }

    #[test]
    fn status_codes_are_distinct_and_never_zero() {
        let mut codes: Vec<u16> = Status::ALL.iter().map(|s| s.code()).collect();
        assert!(!codes.contains(&0));
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Status::ALL.len());
    }
}
