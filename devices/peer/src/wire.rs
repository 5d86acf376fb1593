//! The peer socket's messages: fixed 32-byte little-endian frames.
//!
//! ```text
//! offset 0  u32 kind   1 = BAR    (owner -> user, 1 fd: the BAR's memfd)
//!                      2 = PLACE  (owner -> user)
//!                      3 = ACK    (user -> owner)
//!                      4 = HELLO  (owner -> user, 1 fd: placement page)
//!                      5 = COUNTERS (user -> owner, 1 fd: counter page)
//! offset 4  u32 bar    BAR index (0..=5); 0 for HELLO and COUNTERS
//! offset 8  u64 a      BAR: size in bytes; PLACE and ACK: sequence number;
//!                      HELLO and COUNTERS: protocol version
//! offset 16 u64 b      PLACE: bus address, or NOT_DECODING; else 0
//! offset 24 u64 c      BAR: slot (in both pages); else 0
//! ```
//!
//! A connection runs: owner HELLO, then per BAR a BAR and a PLACE; the
//! user answers HELLO with COUNTERS and every PLACE with an ACK; later
//! PLACEs follow the guest's BAR changes. Each side checks every field
//! and every fd; a frame it cannot accept ends the connection (the user
//! then loses the owner's windows, which is safe: DMA falls back to the
//! message path).

/// Bytes in every frame.
pub const FRAME: usize = 32;
/// A PLACE address meaning "the BAR does not decode memory now".
pub const NOT_DECODING: u64 = u64::MAX;
/// Highest BAR index of a PCI function.
pub const MAX_BAR: u32 = 5;
/// The protocol HELLO and COUNTERS carry; a peer speaking another is
/// refused (servers of one run come from one build).
pub const VERSION: u64 = 2;

/// One message on a peer socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// The owner shares BAR `bar` (`size` bytes; its memfd rides along).
    /// `slot` is the BAR's word in the placement page and its counters
    /// in the counter page.
    Bar {
        /// BAR index.
        bar: u32,
        /// Bytes of memory behind the BAR.
        size: u64,
        /// Counter slot of this BAR in the counter page.
        slot: u64,
    },
    /// BAR `bar` now decodes at `addr` (None: not at all). The user
    /// answers with ACK `seq` once no access runs through the old place.
    Place {
        /// BAR index.
        bar: u32,
        /// Sequence number the ACK repeats.
        seq: u64,
        /// Bus address, or None while the BAR does not decode.
        addr: Option<u64>,
    },
    /// The user applied PLACE `seq` of BAR `bar`.
    Ack {
        /// BAR index.
        bar: u32,
        /// The PLACE's sequence number.
        seq: u64,
    },
    /// First frame of an owner; its placement page rides along (sealed
    /// against writes by anyone but the owner).
    Hello {
        /// Protocol version ([`VERSION`]).
        version: u64,
    },
    /// The user's answer to HELLO; its counter page rides along (sealed
    /// against writes by anyone but the user).
    Counters {
        /// Protocol version ([`VERSION`]).
        version: u64,
    },
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFrame(pub String);

impl std::fmt::Display for BadFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad peer frame: {}", self.0)
    }
}

fn u32_at(b: &[u8; FRAME], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8; FRAME], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl Frame {
    /// The frame's bytes.
    pub fn encode(&self) -> [u8; FRAME] {
        let (kind, bar, a, b, c) = match *self {
            Frame::Bar { bar, size, slot } => (1u32, bar, size, 0, slot),
            Frame::Place { bar, seq, addr } => (2, bar, seq, addr.unwrap_or(NOT_DECODING), 0),
            Frame::Ack { bar, seq } => (3, bar, seq, 0, 0),
            Frame::Hello { version } => (4, 0, version, 0, 0),
            Frame::Counters { version } => (5, 0, version, 0, 0),
        };
        let mut out = [0u8; FRAME];
        out[0..4].copy_from_slice(&kind.to_le_bytes());
        out[4..8].copy_from_slice(&bar.to_le_bytes());
        out[8..16].copy_from_slice(&a.to_le_bytes());
        out[16..24].copy_from_slice(&b.to_le_bytes());
        out[24..32].copy_from_slice(&c.to_le_bytes());
        out
    }

    /// Parses and checks a frame: kind, BAR index, unused fields zero, a
    /// placement that fits the address space is checked by the user
    /// (it knows the size).
    pub fn decode(bytes: &[u8; FRAME]) -> Result<Frame, BadFrame> {
        let kind = u32_at(bytes, 0);
        let bar = u32_at(bytes, 4);
        let (a, b, c) = (u64_at(bytes, 8), u64_at(bytes, 16), u64_at(bytes, 24));
        if bar > MAX_BAR {
            return Err(BadFrame(format!("BAR index {bar} (at most {MAX_BAR})")));
        }
        match kind {
            1 if b == 0 => Ok(Frame::Bar {
                bar,
                size: a,
                slot: c,
            }),
            2 if c == 0 => Ok(Frame::Place {
                bar,
                seq: a,
                addr: (b != NOT_DECODING).then_some(b),
            }),
            3 if b == 0 && c == 0 => Ok(Frame::Ack { bar, seq: a }),
            4 if bar == 0 && b == 0 && c == 0 => Ok(Frame::Hello { version: a }),
            5 if bar == 0 && b == 0 && c == 0 => Ok(Frame::Counters { version: a }),
            1..=5 => Err(BadFrame(format!(
                "kind {kind} with a non-zero unused field or BAR index"
            ))),
            _ => Err(BadFrame(format!("unknown kind {kind}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches an encoder and decoder that disagree, or a decoder that
    /// lets through an unknown kind, a BAR index past 5 (or any on a
    /// HELLO) or stray bytes.
    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        for f in [
            Frame::Bar {
                bar: 2,
                size: 1 << 30,
                slot: 1,
            },
            Frame::Place {
                bar: 2,
                seq: 7,
                addr: Some(0x1_8000_0000),
            },
            Frame::Place {
                bar: 5,
                seq: 8,
                addr: None,
            },
            Frame::Ack { bar: 0, seq: 9 },
            Frame::Hello { version: VERSION },
            Frame::Counters { version: VERSION },
        ] {
            assert_eq!(Frame::decode(&f.encode()), Ok(f));
        }
        let mut bad = Frame::Ack { bar: 0, seq: 1 }.encode();
        bad[0] = 9;
        assert!(Frame::decode(&bad).is_err());
        let mut bad = Frame::Ack { bar: 0, seq: 1 }.encode();
        bad[4] = 6;
        assert!(Frame::decode(&bad).is_err());
        let mut bad = Frame::Ack { bar: 0, seq: 1 }.encode();
        bad[20] = 1;
        assert!(Frame::decode(&bad).is_err());
        let mut bad = Frame::Hello { version: VERSION }.encode();
        bad[4] = 1;
        assert!(Frame::decode(&bad).is_err(), "HELLO names no BAR");
    }
}
