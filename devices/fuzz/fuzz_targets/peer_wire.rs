//! Frames on a peer socket, as another server (or anything that connects
//! to `<run>/peers/<id>.sock`) may send them: any 32 bytes. Catches a
//! panic in the decoder, and an accepted frame that does not encode back
//! to the bytes it came from (a field the decoder reads but the encoder
//! drops, stray bytes let through, or the reverse).
#![no_main]

use libfuzzer_sys::fuzz_target;
use p2plab_peer::wire::{Frame, FRAME};

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks_exact(FRAME) {
        let mut bytes = [0u8; FRAME];
        bytes.copy_from_slice(chunk);
        let Ok(frame) = Frame::decode(&bytes) else {
            continue;
        };
        // Every accepted frame has exactly one encoding: the bytes it came
        // from (unused fields must be zero).
        assert_eq!(frame.encode(), bytes, "{frame:?}");
    }
});
