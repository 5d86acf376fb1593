//! The wire's receive side as any peer can feed it: an arbitrary byte
//! stream, cut into arbitrary reads, through p2plab-wire's frame decoder;
//! each frame it yields then goes through a wire's send and receive path
//! (in-process pair: drop and corrupt faults, FCS and arrival-order
//! accounting) and through the reorder outbox. No socket: the decoder is
//! a pure state machine over bytes.
//!
//! Catches a panic or overflow in the decoder, the impairments or the
//! receive accounting; a decoder whose frames depend on where the reads
//! were cut (chunked and whole-stream decoding must agree), that hands
//! out a frame over its payload limit, that does not account for exactly
//! the bytes each frame took (a version-1 frame must re-encode to exactly
//! its bytes), or that yields frames after an error; a frame lost,
//! duplicated or altered between the two ends of a wire other than as
//! injected; counters that disagree with what was delivered; and a
//! reorder outbox that loses or duplicates frames.
//!
//! Input: byte 0 picks the payload limit and the read sizes, byte 1 the
//! faults, the rest is the stream.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use p2plab_wire::frame::{field, HEADER_LEN};
use p2plab_wire::{
    DecodeError, Decoder, Frame, Impairment, Outbox, Sent, Wire, WireOptions, DEFAULT_MAX_PAYLOAD,
};

/// xorshift32: the read sizes and faults, from one input byte.
struct Dice(u32);

impl Dice {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
}

/// Every frame of `stream` decoded in pieces of the given sizes, and the
/// error that ended it, if any; each frame with the stream bytes it took.
fn decode(
    stream: &[u8],
    max: u32,
    mut piece: impl FnMut() -> usize,
) -> (Vec<(Frame, std::ops::Range<usize>)>, Option<DecodeError>) {
    let mut decoder = Decoder::new(max);
    let mut frames = Vec::new();
    let mut pushed = 0;
    loop {
        loop {
            let before = decoder.consumed() as usize;
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    let after = decoder.consumed() as usize;
                    assert!(after <= pushed, "consumed bytes never pushed");
                    frames.push((frame, before..after));
                }
                Ok(None) => break,
                Err(e) => {
                    // Sticky: the stream is out of sync for good.
                    decoder.push(&[0; 64]);
                    assert_eq!(decoder.next_frame(), Err(e.clone()));
                    return (frames, Some(e));
                }
            }
        }
        if pushed == stream.len() {
            assert_eq!(
                decoder.consumed() as usize + decoder.buffered(),
                stream.len(),
                "bytes lost or invented"
            );
            return (frames, None);
        }
        let n = piece().clamp(1, stream.len() - pushed);
        decoder.push(&stream[pushed..pushed + n]);
        pushed += n;
    }
}

fuzz_target!(|data: &[u8]| {
    let [shape, faults, stream @ ..] = data else {
        return;
    };
    let max = [16, 4096, 65536, DEFAULT_MAX_PAYLOAD][usize::from(shape & 3)];
    let mut reads = Dice(u32::from(*shape) | 0x100);
    let (frames, error) = decode(stream, max, || match reads.next() % 4 {
        0 => 1,
        1 => (reads.next() % 8) as usize,
        2 => (reads.next() % 200) as usize,
        _ => (reads.next() % 70_000) as usize,
    });
    let (whole, whole_error) = decode(stream, max, || stream.len());
    assert_eq!(
        error, whole_error,
        "the error depends on where reads were cut"
    );
    assert_eq!(
        frames.len(),
        whole.len(),
        "frames depend on where reads were cut"
    );

    for ((frame, range), (same, same_range)) in frames.iter().zip(&whole) {
        assert_eq!(frame, same);
        assert_eq!(range, same_range);
        assert!(frame.payload.len() <= max as usize, "over the limit");
        let raw = &stream[range.clone()];
        let header_len = usize::from(raw[field::HEADER_WORDS.offset]) * 8;
        assert_eq!(raw.len(), header_len + frame.payload.len());
        assert_eq!(&raw[header_len..], &frame.payload[..]);
        let encoded = frame.encode();
        if header_len == HEADER_LEN {
            assert_eq!(raw, &encoded[..], "a v1 frame must re-encode to its bytes");
        } else {
            // A longer header: the known fields are the same, the rest skipped.
            assert_eq!(&raw[8..HEADER_LEN], &encoded[8..HEADER_LEN]);
        }
    }

    // Through a wire: the receiving end gets each frame sent, as sent.
    let options = WireOptions {
        max_payload: max,
        queue_frames: 4,
        send_timeout: Duration::from_secs(5),
        ..WireOptions::default()
    };
    let (a, b) = Wire::pair_with(options);
    let mut dice = Dice(u32::from(*faults) | 0x200);
    let (mut delivered, mut bad_fcs, mut drops, mut corrupts) = (0u64, 0u64, 0u64, 0u64);
    let mut outbox = Outbox::default();
    // Per held frame: how many later frames it waits for, and how many
    // had gone out when it was held.
    let mut held = std::collections::HashMap::new();
    let mut sent_plain = 0u32;
    let mut out = Vec::new();
    let now = Instant::now();
    for (i, (frame, _)) in frames.iter().enumerate() {
        let roll = dice.next() % 8;
        let impairment = Impairment {
            drop: roll == 0,
            corrupt: roll == 1,
            ..Impairment::NONE
        };
        match a.send_impaired(frame.clone(), impairment, &|| false) {
            Ok(Sent::Dropped) => drops += 1,
            Ok(Sent::Delivered) => {
                let got = b
                    .recv_timeout(Duration::ZERO)
                    .expect("a frame sent but not received");
                assert_eq!((got.dst, got.src), (frame.dst, frame.src));
                if impairment.corrupt {
                    corrupts += 1;
                    if frame.fcs_ok() {
                        assert!(!got.fcs_ok(), "corruption the FCS did not see");
                    }
                } else {
                    assert_eq!((&got.payload, got.fcs), (&frame.payload, frame.fcs));
                }
                delivered += 1;
                bad_fcs += u64::from(!got.fcs_ok());
            }
            other => panic!("send of frame {i}: {other:?}"),
        }
        // The reorder outbox, on the frames' indices.
        let mut tagged = frame.clone();
        tagged.seq = i as u32;
        if roll == 2 {
            let after = dice.next() % 4 + 1;
            held.insert(tagged.seq, (after, sent_plain));
            outbox.hold(tagged, after, now);
        } else {
            sent_plain += 1;
            let released = outbox.send(tagged);
            assert_eq!(released[0].seq, i as u32, "the frame sent is not first");
            for frame in &released[1..] {
                let (after, at) = held[&frame.seq];
                assert_eq!(
                    sent_plain - at,
                    after,
                    "released after the wrong number of frames"
                );
            }
            out.extend(released.iter().map(|f| f.seq));
        }
    }
    assert!(
        b.recv_timeout(Duration::ZERO).is_none(),
        "a frame nobody sent"
    );
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.drops, sa.corrupts, sa.frames_sent),
        (drops, corrupts, delivered)
    );
    assert_eq!((sb.frames_received, sb.fcs_errors), (delivered, bad_fcs));
    assert_eq!(
        sb.out_of_order, 0,
        "frames of one sender counted out of order"
    );

    let expired = outbox.expire(now + Duration::from_secs(3600));
    for frame in &expired {
        let (after, at) = held[&frame.seq];
        assert!(sent_plain - at < after, "a frame held past its release");
    }
    out.extend(expired.iter().map(|f| f.seq));
    assert!(outbox.is_empty());
    let mut sorted = out.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..frames.len() as u32).collect::<Vec<_>>(),
        "frames lost or doubled"
    );
});
