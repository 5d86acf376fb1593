//! The `wire_frames` fuzz target's committed seeds still decode to what
//! each was made for (byte 0 and 1 are the target's knobs; byte 0's low
//! bits pick the payload limit).
//!
//! Catches: a decoder or format change that leaves the seeds exercising
//! nothing (every seed an early error, or none), so the fuzz campaign
//! would start from noise without anyone noticing.

use std::path::PathBuf;

use p2plab_wire::{DecodeError, Decoder, Frame, DEFAULT_MAX_PAYLOAD};

fn seed(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds/wire_frames")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The frames of a seed, and the error that ended its stream.
fn decode(name: &str) -> (Vec<Frame>, Option<DecodeError>) {
    let bytes = seed(name);
    let max = [16, 4096, 65536, DEFAULT_MAX_PAYLOAD][usize::from(bytes[0] & 3)];
    let mut decoder = Decoder::new(max);
    decoder.push(&bytes[2..]);
    let mut frames = Vec::new();
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => return (frames, None),
            Err(e) => return (frames, Some(e)),
        }
    }
}

#[test]
fn each_seed_decodes_as_it_was_made() {
    let (frames, error) = decode("three-frames");
    assert_eq!((frames.len(), error), (3, None));
    assert_eq!(frames[1].dst.port, 0x12345);
    assert_eq!(frames[1].src.port, 7);
    assert!(frames.iter().all(Frame::fcs_ok));
    let (frames, _) = decode("bad-fcs");
    assert!(frames.len() == 1 && !frames[0].fcs_ok());
    let (frames, _) = decode("long-header");
    assert_eq!(frames[0].payload, b"a later revision");
    assert!(matches!(decode("garbage"), (f, Some(DecodeError::Magic(_))) if f.is_empty()));
    assert!(matches!(
        decode("too-long").1,
        Some(DecodeError::TooLong { len: 17, max: 16 })
    ));
    assert!(matches!(
        decode("version-2").1,
        Some(DecodeError::Version { found: 2 })
    ));
    assert!(matches!(
        decode("flags-set").1,
        Some(DecodeError::Flags(0x8000))
    ));
    assert_eq!(
        decode("cut-short"),
        (vec![], None),
        "a frame cut short waits"
    );
    let (frames, error) = decode("faults-on-many");
    assert_eq!((frames.len(), error), (24, None));
    let (frames, error) = decode("fragments");
    assert!(!frames.is_empty() && frames.len() < 24 && error.is_none());
}

/// The `wire_tcp_handshake` seed's verdict when its bytes (raw mode: the
/// peer's stream after the knob byte) meet our handshake as the fuzz
/// target runs it: our role from knob bit 0, the fuzz key, nonce 0x11s.
fn handshake_verdict(name: &str) -> Result<bool, p2plab_wire::HandshakeError> {
    use p2plab_wire::{Handshake, Role, WireKey};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds/wire_tcp_handshake")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let role = if bytes[0] & 1 == 0 {
        Role::Listener
    } else {
        Role::Dialer
    };
    let key = WireKey::from_bytes(b"p2plab fuzz key: 32 bytes or more, shared".to_vec()).unwrap();
    let (mut handshake, _) = Handshake::start(role, &key, [0x11; 32]);
    let mut at = 1;
    while handshake.wants() > 0 && at + handshake.wants() <= bytes.len() {
        let want = handshake.wants();
        handshake.take(&bytes[at..at + want])?;
        at += want;
    }
    Ok(handshake.is_done())
}

/// Catches: a handshake whose MAC input (label, role byte, nonce order)
/// drifted from the documented one: the raw seeds' proofs were computed
/// independently (Python's hmac and hashlib, docs/reference/wire.md's
/// layout), so both honest seeds must pass and the altered ones fail for
/// their reason; also a seed set that stopped exercising the paths.
#[test]
fn each_handshake_seed_meets_its_verdict() {
    use p2plab_wire::HandshakeError;
    assert_eq!(handshake_verdict("raw-honest-dialer-peer"), Ok(true));
    assert_eq!(handshake_verdict("raw-honest-listener-peer"), Ok(true));
    assert_eq!(
        handshake_verdict("raw-wrong-proof"),
        Err(HandshakeError::WrongKey)
    );
    assert_eq!(
        handshake_verdict("raw-listener-proof-reflected"),
        Err(HandshakeError::WrongKey)
    );
    assert!(matches!(
        handshake_verdict("raw-garbage"),
        Err(HandshakeError::BadMagic(_))
    ));
    assert_eq!(
        handshake_verdict("raw-own-nonce"),
        Err(HandshakeError::Reflected)
    );
    assert_eq!(handshake_verdict("raw-trickle-cut"), Ok(false));
}
