//! Named single-bit fields of a register or command word.
//!
//! [`bit_flags!`] declares a newtype over the raw integer with one
//! associated constant per bit, so code says `RingCtrl::IN_VRAM` where it
//! used to say `1 << 1`, and a reader finds a bit by grepping its name.
//! Unknown bits are kept, never silently dropped: the device decides what
//! they mean (ignored for a register, an error for a command).

/// Declares a bit-flag type. Each bit's name is spelled as in the guest
/// driver's header after `prefix` (`RING_CTRL_` + `IN_VRAM`), which is how
/// `tests/guest_header/` finds its C twin.
macro_rules! bit_flags {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($raw:ty), prefix $prefix:literal {
            $( $(#[$bit_meta:meta])* $bit:ident = $value:expr; )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
        pub struct $name($raw);

        impl $name {
            $( $(#[$bit_meta])* pub const $bit: $name = $name($value); )+

            /// Every named bit.
            pub const ALL: $name = $name(0 $(| $value)+);
            /// Each named bit with its name (without the prefix).
            pub const NAMED: &'static [(&'static str, $name)] =
                &[$((stringify!($bit), $name::$bit)),+];
            /// What the guest driver's header puts before each bit's name.
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

pub(crate) use bit_flags;

#[cfg(test)]
mod tests {
    bit_flags! {
        /// A test word.
        pub struct Word(u8), prefix "WORD_" {
            /// Bit 0.
            A = 1 << 0;
            /// Bit 2.
            C = 1 << 2;
        }
    }

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
        assert_eq!(format!("{word:?}"), "Word(A + unknown 0x82)");
        assert_eq!(format!("{:?}", Word::empty()), "Word()");
    }
}
