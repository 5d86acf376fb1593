//! The TCP transport's pre-shared key (`--wire-key FILE`): both labs hold
//! a copy of one file, and the handshake proves it without sending it.
//!
//! The file must be a regular file owned by the server's uid that no one
//! else may read or write (mode 0600 or 0400: no group or other bits), as
//! ssh insists for a private key; its bytes, without trailing whitespace,
//! are the key: at least 32 of them (`openssl rand -hex 32` writes 64).

use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

/// Fewest key bytes taken: 32 (256 bits when random; a hex line of 16
/// random bytes still has 128).
pub const MIN_KEY_LEN: usize = 32;
/// Most key bytes taken (a key file is small; anything larger is a
/// mistake, such as naming a log file).
pub const MAX_KEY_LEN: usize = 4096;

/// A pre-shared key. Its bytes never reach a log line (`Debug` says only
/// its length).
#[derive(Clone)]
pub struct WireKey(Arc<Vec<u8>>);

impl std::fmt::Debug for WireKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WireKey({} bytes)", self.0.len())
    }
}

impl WireKey {
    /// Reads the key at `path`, refusing a file anyone but its owner (us)
    /// can read or write, a file someone else owns, or one that is not a
    /// regular file; the error says which and how to fix it.
    pub fn load(path: &Path) -> io::Result<Self> {
        let shown = path.display();
        let mut file = std::fs::File::open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("wire key {shown}: {e}")))?;
        // The checks are on the file we opened, not on the path: nothing
        // swapped in between is read.
        let meta = file.metadata()?;
        let ours = p2plab_vfio_user::server::current_uid();
        let refuse = |why: String| io::Error::new(io::ErrorKind::PermissionDenied, why);
        if !meta.file_type().is_file() {
            return Err(refuse(format!("wire key {shown}: not a regular file")));
        }
        if meta.uid() != ours {
            return Err(refuse(format!(
                "wire key {shown}: owned by uid {}, not by this server's uid {ours}",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(refuse(format!(
                "wire key {shown}: mode {:04o} lets others read or write it; chmod 600 {shown}",
                meta.mode() & 0o7777
            )));
        }
        let mut bytes = Vec::new();
        file.by_ref()
            .take(MAX_KEY_LEN as u64 + 1)
            .read_to_end(&mut bytes)?;
        if bytes.len() > MAX_KEY_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("wire key {shown}: longer than {MAX_KEY_LEN} bytes"),
            ));
        }
        Self::from_bytes(bytes).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("wire key {shown}: {e}"))
        })
    }

    /// A key from `bytes` (trailing whitespace dropped, so a key written
    /// with `echo` or an editor matches one written without).
    pub fn from_bytes(mut bytes: Vec<u8>) -> Result<Self, String> {
        while bytes.last().is_some_and(u8::is_ascii_whitespace) {
            bytes.pop();
        }
        if bytes.len() < MIN_KEY_LEN {
            return Err(format!(
                "{} bytes is too short a key (at least {MIN_KEY_LEN}: `openssl rand -hex 32`)",
                bytes.len()
            ));
        }
        if bytes.len() > MAX_KEY_LEN {
            return Err(format!("longer than {MAX_KEY_LEN} bytes"));
        }
        Ok(Self(Arc::new(bytes)))
    }

    /// The key's bytes (for the MAC).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    /// Catches: a key file others can read (or write) taken, a short key
    /// taken, a directory read as a key, or a good key refused.
    #[test]
    fn key_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("p2plab-wire-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = "a".repeat(64);
        let good = write(&dir, "good", &format!("{key}\n"), 0o600);
        let loaded = WireKey::load(&good).unwrap();
        assert_eq!(loaded.bytes(), key.as_bytes(), "trailing newline dropped");
        assert!(WireKey::load(&write(&dir, "ro", &key, 0o400)).is_ok());
        for mode in [0o640, 0o604, 0o660, 0o644] {
            let err = WireKey::load(&write(&dir, &format!("m{mode:o}"), &key, mode)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "mode {mode:o}");
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
        let short = WireKey::load(&write(&dir, "short", "tooshort\n", 0o600)).unwrap_err();
        assert_eq!(short.kind(), io::ErrorKind::InvalidData);
        let huge = WireKey::load(&write(&dir, "huge", &"k".repeat(5000), 0o600)).unwrap_err();
        assert_eq!(huge.kind(), io::ErrorKind::InvalidData);
        assert!(WireKey::load(&dir).is_err(), "a directory is no key");
        assert!(WireKey::load(&dir.join("missing")).is_err());
        assert!(
            !format!("{loaded:?}").contains("aaaa"),
            "Debug shows no key bytes"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
