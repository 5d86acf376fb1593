//! Register tables: one way for every device to declare its BAR
//! registers ([`registers!`](crate::registers)) and their single-bit
//! fields ([`bit_flags!`](crate::bit_flags)), the one helper for 64-bit
//! registers split in dwords ([`Half`]), and the dword plumbing of a
//! trapped BAR access ([`write_dwords`], [`read_bytes`]).
//!
//! Every name is spelled as in the device's C header after its prefix
//! (`REG_` + `RING_BASE`, `STATUS_` + `READY`), which is how each
//! device's header test finds a name's C twin and compares values both
//! ways.

/// How many bits a register has. A 64-bit register is two dwords, low at
/// its offset and high at offset + 4, accessed one at a time or as one
/// 8-byte access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// 32 bits.
    Bits32,
    /// 64 bits (two dwords).
    Bits64,
}

impl Width {
    /// Its size in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            Width::Bits32 => 4,
            Width::Bits64 => 8,
        }
    }
}

/// What the guest may do with a register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads return device state; writes are ignored.
    ReadOnly,
    /// Reads return what was written (possibly masked).
    ReadWrite,
    /// Writing 1 to a bit clears it.
    ReadWrite1Clear,
    /// Writes act; reads return 0.
    WriteOnly,
}

/// Which dword of a register an access hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// Bits 31:0, at the register's offset.
    Low,
    /// Bits 63:32 of a 64-bit register, at offset + 4.
    High,
}

impl Half {
    /// This half of `value`.
    pub const fn of(self, value: u64) -> u32 {
        match self {
            Half::Low => value as u32,
            Half::High => (value >> 32) as u32,
        }
    }

    /// `value` with this half replaced by `dword`.
    pub const fn replace(self, value: u64, dword: u32) -> u64 {
        match self {
            Half::Low => (value & !0xffff_ffff) | dword as u64,
            Half::High => (value & 0xffff_ffff) | (dword as u64) << 32,
        }
    }

    /// How far this dword is from the register's offset.
    pub const fn offset(self) -> u64 {
        match self {
            Half::Low => 0,
            Half::High => 4,
        }
    }
}

/// What [`registers!`](crate::registers) generates, so code that lists
/// registers (the control socket's `registers`, header tests) works for
/// every device.
pub trait RegisterMap: Copy + Eq + std::fmt::Debug + 'static {
    /// Every register, in offset order.
    const ALL: &'static [Self];
    /// Byte offset in the BAR.
    fn offset(self) -> u64;
    /// Name as in the C header (after `REG_`).
    fn name(self) -> &'static str;
    /// 32 or 64 bits.
    fn width(self) -> Width;
    /// What the guest may do with it.
    fn access(self) -> Access;

    /// The register a dword-aligned `offset` falls in, and which of its
    /// dwords; `None` for a reserved offset.
    fn at(offset: u64) -> Option<(Self, Half)> {
        Self::ALL.iter().find_map(|&reg| {
            if offset == reg.offset() {
                Some((reg, Half::Low))
            } else if reg.width() == Width::Bits64 && offset == reg.offset() + 4 {
                Some((reg, Half::High))
            } else {
                None
            }
        })
    }

    /// Byte offset of one dword of the register.
    fn dword_offset(self, half: Half) -> u64 {
        self.offset() + half.offset()
    }
}

/// Declares a BAR's register map: an enum with one variant per register
/// that implements [`RegisterMap`], and a module of offset constants
/// named as in the C header.
///
/// ```
/// p2plab_kit::registers! {
///     /// BAR0.
///     pub enum Reg, offsets in reg {
///         /// Identifies the device.
///         Id(ID) = 0x000, Bits32, ReadOnly;
///         /// A 64-bit base address.
///         Base(BASE) = 0x008, Bits64, ReadWrite;
///     }
/// }
/// use p2plab_kit::regs::{Half, RegisterMap};
/// assert_eq!(reg::BASE, 0x008);
/// assert_eq!(Reg::at(0x00c), Some((Reg::Base, Half::High)));
/// assert_eq!(Reg::Base.name(), "BASE");
/// ```
#[macro_export]
macro_rules! registers {
    (
        $(#[$meta:meta])*
        $vis:vis enum $reg_ty:ident, offsets in $offsets:ident {
            $( $(#[$doc:meta])* $reg:ident($konst:ident) = $offset:literal, $width:ident, $access:ident; )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $reg_ty {
            $( $(#[$doc])* $reg, )+
        }

        /// Register offsets in the BAR, named as in the C header.
        #[allow(missing_docs, dead_code)]
        $vis mod $offsets {
            $( pub const $konst: u64 = $offset; )+
        }

        #[allow(dead_code)]
        impl $reg_ty {
            /// Every register, in offset order.
            pub const ALL: &'static [$reg_ty] = &[$($reg_ty::$reg),+];

            /// Byte offset in the BAR.
            pub const fn offset(self) -> u64 {
                match self { $($reg_ty::$reg => $offset,)+ }
            }

            /// Name as in the C header (after its register prefix).
            pub const fn name(self) -> &'static str {
                match self { $($reg_ty::$reg => stringify!($konst),)+ }
            }

            /// 32 or 64 bits.
            pub const fn width(self) -> $crate::regs::Width {
                match self { $($reg_ty::$reg => $crate::regs::Width::$width,)+ }
            }

            /// What the guest may do with it.
            pub const fn access(self) -> $crate::regs::Access {
                match self { $($reg_ty::$reg => $crate::regs::Access::$access,)+ }
            }

            /// The register a dword-aligned `offset` falls in, and which
            /// of its dwords; `None` for a reserved offset.
            pub fn at(offset: u64) -> Option<($reg_ty, $crate::regs::Half)> {
                <$reg_ty as $crate::regs::RegisterMap>::at(offset)
            }

            /// Byte offset of one dword of the register.
            pub const fn dword_offset(self, half: $crate::regs::Half) -> u64 {
                self.offset() + half.offset()
            }
        }

        impl $crate::regs::RegisterMap for $reg_ty {
            const ALL: &'static [$reg_ty] = $reg_ty::ALL;

            fn offset(self) -> u64 {
                $reg_ty::offset(self)
            }

            fn name(self) -> &'static str {
                $reg_ty::name(self)
            }

            fn width(self) -> $crate::regs::Width {
                $reg_ty::width(self)
            }

            fn access(self) -> $crate::regs::Access {
                $reg_ty::access(self)
            }
        }
    };
}

/// Declares a bit-flag type: a newtype over the raw integer with one
/// associated constant per bit, so code says `RingCtrl::IN_VRAM` where it
/// would say `1 << 1`, and a reader finds a bit by its name. Unknown bits
/// are kept, never silently dropped: the device decides what they mean
/// (ignored for a register, an error for a command). Each bit's name is
/// spelled as in the C header after `prefix`.
///
/// ```
/// p2plab_kit::bit_flags! {
///     /// A control register.
///     pub struct Ctrl(u32), prefix "CTRL_" {
///         /// Go.
///         ENABLE = 1 << 0;
///     }
/// }
/// assert!(Ctrl::from_raw(3).contains(Ctrl::ENABLE));
/// assert!(Ctrl::from_raw(3).has_unknown());
/// ```
#[macro_export]
macro_rules! bit_flags {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($raw:ty), prefix $prefix:literal {
            $( $(#[$bit_meta:meta])* $bit:ident = $value:expr; )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
        $vis struct $name($raw);

        #[allow(dead_code)]
        impl $name {
            $( $(#[$bit_meta])* pub const $bit: $name = $name($value); )+

            /// Every named bit.
            pub const ALL: $name = $name(0 $(| $value)+);
            /// Each named bit with its name (without the prefix).
            pub const NAMED: &'static [(&'static str, $name)] =
                &[$((stringify!($bit), $name::$bit)),+];
            /// What the C header puts before each bit's name.
            pub const PREFIX: &'static str = $prefix;

            /// No bit set.
            pub const fn empty() -> Self {
                $name(0)
            }

            /// The bits of a raw word, unknown ones included.
            pub const fn from_raw(raw: $raw) -> Self {
                $name(raw)
            }

            /// The raw word.
            pub const fn raw(self) -> $raw {
                self.0
            }

            /// Whether every bit of `other` is set.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any bit of `other` is set.
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }

            /// Only the named bits.
            pub const fn known(self) -> Self {
                $name(self.0 & Self::ALL.0)
            }

            /// Whether a bit without a name is set.
            pub const fn has_unknown(self) -> bool {
                self.0 & !Self::ALL.0 != 0
            }

            /// These bits without those of `other`.
            pub const fn without(self, other: Self) -> Self {
                $name(self.0 & !other.0)
            }

            /// These bits with those of `other` set or cleared.
            pub const fn with(self, other: Self, on: bool) -> Self {
                if on {
                    $name(self.0 | other.0)
                } else {
                    $name(self.0 & !other.0)
                }
            }
        }

        impl std::ops::BitOr for $name {
            type Output = Self;
            fn bitor(self, other: Self) -> Self {
                $name(self.0 | other.0)
            }
        }

        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, other: Self) {
                self.0 |= other.0;
            }
        }

        impl std::ops::BitAnd for $name {
            type Output = Self;
            fn bitand(self, other: Self) -> Self {
                $name(self.0 & other.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let names: Vec<&str> = Self::NAMED
                    .iter()
                    .filter(|(_, bit)| self.contains(*bit))
                    .map(|(name, _)| *name)
                    .collect();
                write!(f, "{}({}", stringify!($name), names.join(" | "))?;
                if self.has_unknown() {
                    write!(f, " + unknown {:#x}", self.0 & !Self::ALL.0)?;
                }
                f.write_str(")")
            }
        }
    };
}

/// A trapped register write as the dwords it is made of: a 4-byte
/// aligned dword, or a qword at a multiple of `qword_alignment` (4 or 8,
/// as the device's spec says), low dword first. `None` for any other size
/// or alignment, which a device ignores (and counts), as hardware drops
/// it.
pub fn write_dwords(
    offset: u64,
    data: &[u8],
    qword_alignment: u64,
) -> Option<([(u64, u32); 2], usize)> {
    let dword = |at: usize| {
        let mut word = [0u8; 4];
        word.copy_from_slice(&data[at..at + 4]);
        u32::from_le_bytes(word)
    };
    match data.len() {
        4 if offset.is_multiple_of(4) => Some(([(offset, dword(0)), (0, 0)], 1)),
        8 if offset.is_multiple_of(qword_alignment.max(4)) => Some((
            [(offset, dword(0)), (offset.saturating_add(4), dword(4))],
            2,
        )),
        _ => None,
    }
}

/// [`write_dwords`] for a device that drops any other access as hardware
/// does: the refused one is logged at debug level (a guest can trigger
/// it at will) and counted in `refused`.
pub fn accepted_write_dwords(
    offset: u64,
    data: &[u8],
    qword_alignment: u64,
    refused: &std::sync::atomic::AtomicU64,
) -> Option<([(u64, u32); 2], usize)> {
    let dwords = write_dwords(offset, data, qword_alignment);
    if dwords.is_none() {
        tracing::debug!(
            offset,
            len = data.len(),
            "unsupported register write ignored"
        );
        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    dwords
}

/// A trapped read of any size and alignment, assembled from the
/// dword-aligned dwords `dword_at` returns; bytes at or past `size` (the
/// BAR's end) read 0xff.
pub fn read_bytes(offset: u64, data: &mut [u8], size: u64, mut dword_at: impl FnMut(u64) -> u32) {
    let mut cached: Option<(u64, u32)> = None;
    for (i, byte) in data.iter_mut().enumerate() {
        let at = offset.saturating_add(i as u64);
        *byte = if at < size {
            let aligned = at & !3;
            let dword = match cached {
                Some((cached_at, value)) if cached_at == aligned => value,
                _ => {
                    let value = dword_at(aligned);
                    cached = Some((aligned, value));
                    value
                }
            };
            (dword >> ((at & 3) * 8)) as u8
        } else {
            0xff
        };
    }
}

/// Every readable register of `R` by name with the value `read` gives
/// (write-only ones left out): what the control socket's `status` lists.
pub fn register_values<R: RegisterMap>(mut read: impl FnMut(R) -> u64) -> Vec<(&'static str, u64)> {
    R::ALL
        .iter()
        .filter(|reg| reg.access() != Access::WriteOnly)
        .map(|&reg| (reg.name(), read(reg)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::registers! {
        /// A test map.
        pub enum TestReg, offsets in test_reg {
            /// 32 bits.
            A(A_REG) = 0x000, Bits32, ReadOnly;
            /// 64 bits.
            B(B_REG) = 0x008, Bits64, ReadWrite;
            /// Write-only.
            C(C_REG) = 0x010, Bits32, WriteOnly;
        }
    }

    crate::bit_flags! {
        /// A test word.
        pub struct Word(u8), prefix "WORD_" {
            /// Bit 0.
            A = 1 << 0;
            /// Bit 2.
            C = 1 << 2;
        }
    }

    /// Catches: a register table that finds the wrong register or half
    /// for an offset, or names it differently from its constant.
    #[test]
    fn every_dword_finds_its_register() {
        assert_eq!(TestReg::at(0x008), Some((TestReg::B, Half::Low)));
        assert_eq!(TestReg::at(0x00c), Some((TestReg::B, Half::High)));
        assert_eq!(TestReg::at(0x004), None, "reserved");
        assert_eq!(TestReg::at(0x014), None, "past a 32-bit register");
        assert_eq!(TestReg::B.dword_offset(Half::High), 0x00c);
        assert_eq!(test_reg::B_REG, 0x008);
        assert_eq!(TestReg::C.name(), "C_REG");
        let listed = register_values::<TestReg>(|reg| reg.offset() + 1);
        assert_eq!(listed, vec![("A_REG", 1), ("B_REG", 9)]);
    }

    /// Catches: flag helpers that drop unknown bits or misname them.
    #[test]
    fn named_bits_and_unknown_ones() {
        assert_eq!(Word::ALL.raw(), 0b101);
        assert_eq!(Word::PREFIX, "WORD_");
        assert_eq!(Word::NAMED, &[("A", Word::A), ("C", Word::C)]);
        let word = Word::from_raw(0b1000_0011);
        assert!(word.contains(Word::A) && !word.contains(Word::A | Word::C));
        assert!(word.intersects(Word::A | Word::C));
        assert!(word.has_unknown());
        assert_eq!(word.known(), Word::A);
        assert_eq!(word.without(Word::A).raw(), 0b1000_0010);
        assert_eq!(word.with(Word::C, true).raw(), 0b1000_0111);
        assert_eq!(format!("{word:?}"), "Word(A + unknown 0x82)");
        assert_eq!(format!("{:?}", Word::empty()), "Word()");
    }

    /// Catches: halves that split or join a 64-bit value wrongly.
    #[test]
    fn halves_split_and_join() {
        let value = 0x1122_3344_5566_7788;
        assert_eq!(Half::Low.of(value), 0x5566_7788);
        assert_eq!(Half::High.of(value), 0x1122_3344);
        assert_eq!(
            Half::High.replace(value, 0xaabb_ccdd),
            0xaabb_ccdd_5566_7788
        );
        assert_eq!(Half::Low.replace(value, 1), 0x1122_3344_0000_0001);
    }

    /// Catches: a write split into the wrong dwords, or an odd access
    /// taken as a register write.
    #[test]
    fn writes_split_into_dwords_or_are_refused() {
        let one = write_dwords(0x1c, &[1, 0, 0, 0], 8).unwrap();
        assert_eq!(&one.0[..one.1], &[(0x1c, 1)]);
        let two = write_dwords(0x20, &[1, 0, 0, 0, 2, 0, 0, 0], 8).unwrap();
        assert_eq!(&two.0[..two.1], &[(0x20, 1), (0x24, 2)]);
        assert!(write_dwords(0x24, &[0; 8], 8).is_none(), "misaligned qword");
        let four = write_dwords(0x24, &[0; 8], 4).unwrap();
        assert_eq!(four.1, 2, "a dword-aligned qword where the spec allows it");
        assert!(write_dwords(0x1d, &[0; 4], 8).is_none(), "misaligned dword");
        assert!(write_dwords(0x1c, &[0; 2], 8).is_none(), "word");
        assert!(write_dwords(0x1e, &[0; 8], 4).is_none(), "misaligned qword");
    }

    /// Catches: a read of odd size or alignment that picks the wrong
    /// bytes, or reads past the BAR as anything but 0xff.
    #[test]
    fn reads_assemble_bytes_from_dwords() {
        let mut data = [0u8; 4];
        read_bytes(
            0x6,
            &mut data,
            0x8,
            |at| if at == 4 { 0x4433_2211 } else { 0 },
        );
        assert_eq!(data, [0x33, 0x44, 0xff, 0xff]);
    }
}
