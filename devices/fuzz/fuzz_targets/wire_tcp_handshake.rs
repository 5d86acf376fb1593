//! The TCP wire's handshake and the framing behind it, as a stranger on
//! the network can feed them: p2plab-wire's `Handshake` (a pure state
//! machine) takes the peer's bytes in the message sizes it asks for; once
//! the peer proved the key, the rest of the stream goes, cut into
//! arbitrary reads, through the frame decoder as the link would.
//!
//! Catches a panic or overflow in the handshake or the decoder; a
//! handshake that passes a peer that did not prove the key (a wrong key,
//! any changed byte of an honest peer's messages, its own nonce sent
//! back, or raw bytes that are not exactly an honest HELLO and PROOF), or
//! that fails an honest peer holding the key; a handshake that takes
//! bytes after it ended or after it failed (a frame byte eaten, or a
//! failed peer read on); and a decoder that hands out a frame over its
//! payload limit behind a passed handshake.
//!
//! Input: byte 0 picks our role (bit 0), the peer's key (bit 1: the same
//! or another), the mode (bit 2: the rest is the peer's raw bytes, or an
//! honest peer whose messages get one byte changed) and the payload limit
//! (bits 3-4). Honest mode: bytes 1..33 are the peer's nonce, byte 33
//! which of its 72 bytes to change and byte 34 the XOR (0: none); the
//! rest follows the handshake on the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p2plab_wire::handshake::{HELLO_LEN, NONCE_LEN, PROOF_LEN};
use p2plab_wire::{Decoder, Handshake, Role, WireKey, DEFAULT_MAX_PAYLOAD};

const KEY: &[u8] = b"p2plab fuzz key: 32 bytes or more, shared";
const OTHER_KEY: &[u8] = b"p2plab fuzz key: another one, 32 bytes or more";
/// Our nonce (a real end draws it from the OS).
const OUR_NONCE: [u8; NONCE_LEN] = [0x11; NONCE_LEN];

fn key(bytes: &[u8]) -> WireKey {
    match WireKey::from_bytes(bytes.to_vec()) {
        Ok(key) => key,
        Err(e) => panic!("the fuzz keys are long enough: {e}"),
    }
}

/// What an honest peer with `peer_key` and `nonce` sends to an end that
/// sent `our_hello`: its HELLO and its PROOF (none if our HELLO is
/// refused, e.g. the nonces are equal).
fn honest(
    peer_role: Role,
    peer_key: &WireKey,
    nonce: [u8; NONCE_LEN],
    our_hello: &[u8],
) -> Vec<u8> {
    let (mut peer, hello) = Handshake::start(peer_role, peer_key, nonce);
    let mut bytes = hello.to_vec();
    if let Ok(Some(proof)) = peer.take(our_hello) {
        bytes.extend_from_slice(&proof);
    }
    bytes
}

/// Feeds `stream` to `handshake` as the transport does (exactly the
/// bytes it wants, one message at a time); how many bytes it took.
fn drive(handshake: &mut Handshake, stream: &[u8]) -> usize {
    let mut at = 0;
    loop {
        let want = handshake.wants();
        if want == 0 || at + want > stream.len() {
            return at;
        }
        let failed = handshake.take(&stream[at..at + want]).is_err();
        at += want;
        if failed {
            assert_eq!(handshake.wants(), 0, "a failed handshake asks for more");
            assert!(!handshake.is_done());
            return at;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    let role = if knobs & 1 == 0 {
        Role::Listener
    } else {
        Role::Dialer
    };
    let peer_role = if role == Role::Listener {
        Role::Dialer
    } else {
        Role::Listener
    };
    let ours = key(KEY);
    let same_key = knobs & 2 == 0;
    let peer_key = if same_key { key(KEY) } else { key(OTHER_KEY) };
    let max = [16, 4096, 65536, DEFAULT_MAX_PAYLOAD][usize::from((knobs >> 3) & 3)];
    let (mut handshake, our_hello) = Handshake::start(role, &ours, OUR_NONCE);

    let (stream, should_pass) = if knobs & 4 == 0 {
        // Raw bytes: they pass only if they are exactly what an honest
        // peer with our key and their nonce sends.
        let should = rest.len() >= HELLO_LEN + PROOF_LEN && {
            let mut nonce = [0u8; NONCE_LEN];
            nonce.copy_from_slice(&rest[8..HELLO_LEN]);
            let expected = honest(peer_role, &ours, nonce, &our_hello);
            expected.len() == HELLO_LEN + PROOF_LEN && rest[..HELLO_LEN + PROOF_LEN] == expected[..]
        };
        (rest.to_vec(), should)
    } else {
        let [nonce @ .., at, xor] = rest.get(..NONCE_LEN + 2).unwrap_or(&[]) else {
            return;
        };
        let mut peer_nonce = [0u8; NONCE_LEN];
        peer_nonce.copy_from_slice(nonce);
        let mut stream = honest(peer_role, &peer_key, peer_nonce, &our_hello);
        let honest_len = stream.len();
        if *xor != 0 {
            let i = usize::from(*at) % honest_len;
            stream[i] ^= xor;
        }
        stream.extend_from_slice(&rest[NONCE_LEN + 2..]);
        let should = same_key && *xor == 0 && peer_nonce != OUR_NONCE;
        (stream, should)
    };

    let took = drive(&mut handshake, &stream);
    assert_eq!(
        handshake.is_done(),
        should_pass,
        "the handshake's verdict is wrong (mode {}, same key {same_key})",
        knobs & 4
    );
    if !handshake.is_done() {
        return;
    }
    assert_eq!(
        took,
        HELLO_LEN + PROOF_LEN,
        "the handshake took frame bytes"
    );

    // Behind it, the link reads frames in arbitrary slices.
    let frames = &stream[took..];
    let mut decoder = Decoder::new(max);
    let mut at = 0;
    let mut slice = usize::from(knobs) + 1;
    while at < frames.len() {
        let n = slice.min(frames.len() - at);
        decoder.push(&frames[at..at + n]);
        at += n;
        slice = slice * 7 % 1021 + 1;
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => assert!(frame.payload.len() <= max as usize, "over the limit"),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
