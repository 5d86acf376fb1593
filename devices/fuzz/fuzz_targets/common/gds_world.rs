//! The world the GDS and cuFile C-ABI targets call into: a test GPU
//! (`p2plab_gds::testing::FakeGpu`) on tmpfs, injected as the library's
//! driver, and the byte reader both targets decode their call sequences
//! with.

// Each target uses its part of this module.
#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use p2plab_gds::ffi;
use p2plab_gds::testing::FakeGpu;

/// VRAM of the test GPU; sizes in the input are folded around it.
pub const VRAM: u64 = 256 << 10;

pub struct World {
    pub gpu: Arc<FakeGpu>,
    /// The GPU's files and the target's own files (`a` exists).
    pub dir: PathBuf,
    /// The file system's device (placed on PCI or not by the input).
    pub st_dev: u64,
}

/// Built once per process: the GPU and the driver injection stay up
/// across inputs.
pub fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        // tmpfs: no disk I/O however many writes the fuzzer makes.
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "p2plab-fuzz-{}-{}",
            env!("CARGO_BIN_NAME"),
            std::process::id()
        ));
        let gpu = FakeGpu::new(&dir, VRAM).expect("the test GPU");
        let for_abi = gpu.clone();
        ffi::inject_driver(Some(Box::new(move || Ok(for_abi.driver()))));
        std::fs::write(dir.join("a"), b"").expect("a file");
        let st_dev = std::fs::metadata(dir.join("a")).expect("a file").dev();
        World { gpu, dir, st_dev }
    })
}

/// The input, read front to back; `None` once it runs out.
pub struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    pub fn u32(&mut self) -> Option<u32> {
        let b = self.0.get(..4)?;
        self.0 = &self.0[4..];
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        let b = self.0.get(..8)?;
        self.0 = &self.0[8..];
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
    /// A size or offset: small and near the interesting edges most of
    /// the time, anything otherwise.
    pub fn amount(&mut self) -> Option<u64> {
        let kind = self.u8()?;
        let raw = self.u64()?;
        Some(match kind % 4 {
            0 => raw % 4096,
            1 => raw % (2 * VRAM),
            2 => (raw % 64) * 512,
            _ => raw,
        })
    }
}
