//! The TCP transport's peer check, as a pure state machine (no I/O, so
//! the fuzz target and the tests drive it with any bytes): both ends
//! prove they hold the same pre-shared key ([`WireKey`]) without sending
//! it, by an HMAC-SHA256 over both ends' fresh nonces.
//!
//! On the stream, before any frame, each end sends
//!
//! | bytes | what |
//! |---|---|
//! | 40 | HELLO: `P2WH`, version 1, its role (1 listener, 2 dialer), 2 reserved zero bytes, a 32-byte nonce from the OS's CSPRNG |
//! | 32 | PROOF, once the peer's HELLO arrived: HMAC-SHA256(key, `p2plab-wire tcp v1` ‖ sender's role ‖ listener's nonce ‖ dialer's nonce) |
//!
//! and checks the peer's PROOF in constant time. The role in the MAC
//! means a proof made by one side is never valid for the other (a
//! listener cannot be used to answer its own challenge), a fresh nonce on
//! each side means a recorded handshake cannot be replayed, and a HELLO
//! carrying our own nonce back is refused outright. Anything else (a bad
//! magic, version, role or reserved byte) fails at once: the caller
//! closes the connection and logs why.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::key::WireKey;

/// HELLO's first bytes.
pub const HELLO_MAGIC: [u8; 4] = *b"P2WH";
/// The handshake's version.
pub const HANDSHAKE_VERSION: u8 = 1;
/// Bytes of a HELLO.
pub const HELLO_LEN: usize = 40;
/// Bytes of a PROOF.
pub const PROOF_LEN: usize = 32;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// What the MAC covers first: names the protocol, so a MAC made with the
/// same key for anything else never passes.
const LABEL: &[u8] = b"p2plab-wire tcp v1";

type HmacSha256 = Hmac<Sha256>;

/// Which end of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Accepted the connection.
    Listener,
    /// Made it.
    Dialer,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Role::Listener => 1,
            Role::Dialer => 2,
        }
    }

    fn other(self) -> Role {
        match self {
            Role::Listener => Role::Dialer,
            Role::Dialer => Role::Listener,
        }
    }
}

/// Why a handshake failed (the log line says it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("the peer's first bytes are not a p2plab wire HELLO (magic {0:02x?}); not a p2plab-wire peer")]
    BadMagic([u8; 4]),
    #[error("the peer speaks handshake version {0}, we speak {HANDSHAKE_VERSION}")]
    Version(u8),
    #[error("the peer says it is the {0}, as we are (two listeners or two dialers?)")]
    SameRole(&'static str),
    #[error("the peer's HELLO has an unknown role {0} or reserved bits set")]
    BadHello(u8),
    #[error("the peer sent our own nonce back (a reflected handshake)")]
    Reflected,
    #[error("the peer's proof does not match our key: it holds another key, or none")]
    WrongKey,
    #[error("a handshake message of {got} bytes where {want} were due")]
    Length { got: usize, want: usize },
    #[error("the handshake is over")]
    Finished,
    #[error("the key cannot key an HMAC")]
    Key,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the peer's HELLO.
    Hello,
    /// Waiting for the peer's PROOF.
    Proof,
    /// The peer proved it holds the key.
    Done,
    /// Failed; nothing more is taken.
    Failed,
}

/// One end's handshake.
pub struct Handshake {
    role: Role,
    key: WireKey,
    nonce: [u8; NONCE_LEN],
    peer_nonce: [u8; NONCE_LEN],
    state: State,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("role", &self.role)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// Starts a handshake with our `nonce` (fresh from [`fresh_nonce`]
    /// outside tests); returns it and our HELLO, to send at once.
    pub fn start(role: Role, key: &WireKey, nonce: [u8; NONCE_LEN]) -> (Self, [u8; HELLO_LEN]) {
        let mut hello = [0u8; HELLO_LEN];
        hello[..4].copy_from_slice(&HELLO_MAGIC);
        hello[4] = HANDSHAKE_VERSION;
        hello[5] = role.byte();
        hello[8..].copy_from_slice(&nonce);
        let handshake = Self {
            role,
            key: key.clone(),
            nonce,
            peer_nonce: [0; NONCE_LEN],
            state: State::Hello,
        };
        (handshake, hello)
    }

    /// How many bytes the next message from the peer has (0 once done or
    /// failed): read exactly that many, so no frame byte after the
    /// handshake is taken by it.
    pub fn wants(&self) -> usize {
        match self.state {
            State::Hello => HELLO_LEN,
            State::Proof => PROOF_LEN,
            State::Done | State::Failed => 0,
        }
    }

    /// Whether the peer proved it holds the key.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Takes the peer's next message (exactly [`Handshake::wants`]
    /// bytes); returns what to send back, if anything.
    pub fn take(&mut self, message: &[u8]) -> Result<Option<[u8; PROOF_LEN]>, HandshakeError> {
        let result = self.step(message);
        if result.is_err() {
            self.state = State::Failed;
        }
        result
    }

    fn step(&mut self, message: &[u8]) -> Result<Option<[u8; PROOF_LEN]>, HandshakeError> {
        let want = self.wants();
        if want == 0 {
            return Err(HandshakeError::Finished);
        }
        if message.len() != want {
            return Err(HandshakeError::Length {
                got: message.len(),
                want,
            });
        }
        match self.state {
            State::Hello => {
                self.check_hello(message)?;
                self.state = State::Proof;
                Ok(Some(self.proof(self.role)?))
            }
            State::Proof => {
                self.check_proof(message)?;
                self.state = State::Done;
                Ok(None)
            }
            State::Done | State::Failed => Err(HandshakeError::Finished),
        }
    }

    fn check_hello(&mut self, hello: &[u8]) -> Result<(), HandshakeError> {
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&hello[..4]);
        if magic != HELLO_MAGIC {
            return Err(HandshakeError::BadMagic(magic));
        }
        if hello[4] != HANDSHAKE_VERSION {
            return Err(HandshakeError::Version(hello[4]));
        }
        let role = hello[5];
        if role == self.role.byte() {
            return Err(HandshakeError::SameRole(match self.role {
                Role::Listener => "listener",
                Role::Dialer => "dialer",
            }));
        }
        if role != self.role.other().byte() || hello[6] != 0 || hello[7] != 0 {
            return Err(HandshakeError::BadHello(role));
        }
        self.peer_nonce.copy_from_slice(&hello[8..]);
        if self.peer_nonce == self.nonce {
            return Err(HandshakeError::Reflected);
        }
        Ok(())
    }

    /// The MAC `sender` proves itself with.
    fn mac(&self, sender: Role) -> Result<HmacSha256, HandshakeError> {
        // HMAC takes a key of any length; the error exists for other MACs.
        let mut mac =
            HmacSha256::new_from_slice(self.key.bytes()).map_err(|_| HandshakeError::Key)?;
        let (listener, dialer) = match self.role {
            Role::Listener => (&self.nonce, &self.peer_nonce),
            Role::Dialer => (&self.peer_nonce, &self.nonce),
        };
        mac.update(LABEL);
        mac.update(&[sender.byte()]);
        mac.update(listener);
        mac.update(dialer);
        Ok(mac)
    }

    fn proof(&self, sender: Role) -> Result<[u8; PROOF_LEN], HandshakeError> {
        Ok(self.mac(sender)?.finalize().into_bytes().into())
    }

    fn check_proof(&self, proof: &[u8]) -> Result<(), HandshakeError> {
        // Constant time: the hmac crate's comparison.
        self.mac(self.role.other())?
            .verify_slice(proof)
            .map_err(|_| HandshakeError::WrongKey)
    }
}

/// Checks a HELLO's first 4 bytes as soon as they arrive, so a peer that
/// speaks something else is refused for what it is (and at once), not
/// for closing the connection before a whole HELLO arrived.
pub fn check_magic(first: [u8; 4]) -> Result<(), HandshakeError> {
    if first == HELLO_MAGIC {
        Ok(())
    } else {
        Err(HandshakeError::BadMagic(first))
    }
}

/// A nonce from the OS's CSPRNG.
pub fn fresh_nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> WireKey {
        WireKey::from_bytes(text.as_bytes().to_vec()).unwrap()
    }

    /// Runs both ends against each other; each end's result.
    fn run(
        listener_key: &WireKey,
        dialer_key: &WireKey,
    ) -> (Result<(), HandshakeError>, Result<(), HandshakeError>) {
        let (mut l, l_hello) = Handshake::start(Role::Listener, listener_key, [1; 32]);
        let (mut d, d_hello) = Handshake::start(Role::Dialer, dialer_key, [2; 32]);
        let l_proof = l.take(&d_hello).unwrap().unwrap();
        let d_proof = d.take(&l_hello).unwrap().unwrap();
        let l_result = l.take(&d_proof).map(|reply| assert!(reply.is_none()));
        let d_result = d.take(&l_proof).map(|reply| assert!(reply.is_none()));
        (l_result, d_result)
    }

    const KEY_A: &str = "0123456789abcdef0123456789abcdef-a";
    const KEY_B: &str = "0123456789abcdef0123456789abcdef-b";

    /// Catches: a handshake that fails between two ends holding the same
    /// key, or one that passes between ends holding different keys.
    #[test]
    fn same_key_passes_other_key_fails_both_ways() {
        let (l, d) = run(&key(KEY_A), &key(KEY_A));
        assert_eq!((l, d), (Ok(()), Ok(())));
        let (l, d) = run(&key(KEY_A), &key(KEY_B));
        assert_eq!(l, Err(HandshakeError::WrongKey));
        assert_eq!(d, Err(HandshakeError::WrongKey));
    }

    /// Catches: a proof that does not depend on the sender's role, so a
    /// peer could send back the listener's own proof (reflection), or one
    /// that ignores a nonce (replay of a recorded handshake).
    #[test]
    fn reflected_and_replayed_proofs_fail() {
        let k = key(KEY_A);
        let (mut l, _) = Handshake::start(Role::Listener, &k, [1; 32]);
        let (_, d_hello) = Handshake::start(Role::Dialer, &k, [2; 32]);
        let l_proof = l.take(&d_hello).unwrap().unwrap();
        // The listener's own proof, sent back.
        assert_eq!(l.take(&l_proof), Err(HandshakeError::WrongKey));

        // A proof recorded from a dialer with nonce 2, replayed against a
        // listener with another nonce.
        let (mut recorded_l, recorded_hello) = Handshake::start(Role::Listener, &k, [7; 32]);
        let (mut d, _) = Handshake::start(Role::Dialer, &k, [2; 32]);
        let recorded_proof = d.take(&recorded_hello).unwrap().unwrap();
        recorded_l.take(&d_hello).unwrap();
        assert!(recorded_l.take(&recorded_proof).is_ok());
        let (mut fresh_l, _) = Handshake::start(Role::Listener, &k, [9; 32]);
        fresh_l.take(&d_hello).unwrap();
        assert_eq!(fresh_l.take(&recorded_proof), Err(HandshakeError::WrongKey));
    }

    /// Catches: HELLOs that are not ours taken (magic, version, role,
    /// reserved bits, our own nonce), wrong lengths, or messages after
    /// the end.
    #[test]
    fn bad_hellos_are_refused_with_their_reason() {
        let k = key(KEY_A);
        let (_, good) = Handshake::start(Role::Dialer, &k, [2; 32]);
        type Edit = Box<dyn Fn(&mut [u8; HELLO_LEN])>;
        let cases: Vec<(Edit, HandshakeError)> = vec![
            (
                Box::new(|h| h[..4].copy_from_slice(b"GET ")),
                HandshakeError::BadMagic(*b"GET "),
            ),
            (Box::new(|h| h[4] = 2), HandshakeError::Version(2)),
            (Box::new(|h| h[5] = 1), HandshakeError::SameRole("listener")),
            (Box::new(|h| h[5] = 9), HandshakeError::BadHello(9)),
            (Box::new(|h| h[7] = 1), HandshakeError::BadHello(2)),
            (
                Box::new(|h| h[8..].copy_from_slice(&[1; 32])),
                HandshakeError::Reflected,
            ),
        ];
        for (edit, want) in cases {
            let mut hello = good;
            edit(&mut hello);
            let (mut l, _) = Handshake::start(Role::Listener, &k, [1; 32]);
            assert_eq!(l.take(&hello), Err(want));
            assert_eq!(l.wants(), 0, "a failed handshake takes nothing more");
        }
        let (mut l, _) = Handshake::start(Role::Listener, &k, [1; 32]);
        assert_eq!(
            l.take(&good[..10]),
            Err(HandshakeError::Length { got: 10, want: 40 })
        );
        let (l, d) = run(&k, &k);
        assert!(l.is_ok() && d.is_ok());
        let (mut l, _) = Handshake::start(Role::Listener, &k, [1; 32]);
        let (mut d, d_hello) = Handshake::start(Role::Dialer, &k, [2; 32]);
        let (_, l_hello) = Handshake::start(Role::Listener, &k, [1; 32]);
        l.take(&d_hello).unwrap();
        let d_proof = d.take(&l_hello).unwrap().unwrap();
        l.take(&d_proof).unwrap();
        assert!(l.is_done());
        assert_eq!(l.take(&[0; 32]), Err(HandshakeError::Finished));
    }

    /// Catches: a nonce source that repeats.
    #[test]
    fn nonces_are_fresh() {
        assert_ne!(fresh_nonce().unwrap(), fresh_nonce().unwrap());
    }
}
