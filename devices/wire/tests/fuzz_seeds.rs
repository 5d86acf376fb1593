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
