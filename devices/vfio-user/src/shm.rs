//! Device backing memory that QEMU can mmap: a sparse memfd mapped
//! MAP_SHARED into this process. Used for BARs handed to the client with an
//! fd (an NVMe CMB, GPU VRAM), and usable as a local DMA window.
//!
//! The client gets the memfd itself, so it is sealed once sized (shrink,
//! grow, seal): a client that truncated it would make our next access to
//! the mapping raise SIGBUS.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::sync::Arc;

use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory, VolatileSlice};

use crate::dma::{DmaError, LocalMemory};

/// A memfd of `size` bytes, mapped read/write and shared. Pages cost host
/// memory only once touched, so a 64 GiB VRAM is fine.
#[derive(Debug)]
pub struct SharedMemory {
    name: String,
    file: Arc<File>,
    region: MmapRegion,
}

impl SharedMemory {
    /// Creates the memfd (named `name` in `/proc/<pid>/fd`, for debugging),
    /// sizes it, seals its size (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL)
    /// and maps it.
    pub fn new(name: &str, size: u64) -> io::Result<Self> {
        if size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shared memory size must be > 0",
            ));
        }
        let map_len = usize::try_from(size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size too large"))?;
        let cname = CString::new(name.replace('\0', "_"))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: memfd_create reads a valid NUL-terminated string and
        // returns a new fd or -1.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a freshly created fd that nothing else owns.
        let file = unsafe { File::from_raw_fd(raw) };
        file.set_len(size)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS with an int argument on our own memfd, made
        // with MFD_ALLOW_SEALING; it only restricts later size changes.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let file = Arc::new(file);
        let region = MmapRegion::build(
            Some(FileOffset::from_arc(Arc::clone(&file), 0)),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
        )
        .map_err(|e| io::Error::other(format!("mmap of {name} ({size} bytes): {e}")))?;
        Ok(SharedMemory {
            name: name.to_owned(),
            file,
            region,
        })
    }

    /// The name given at creation (shown as `memfd:<name>` in
    /// `/proc/<pid>/maps`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.region.size() as u64
    }

    /// The memfd, e.g. for [`crate::RegionInfo::fd`]. Valid as long as
    /// `self` lives.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The whole mapping as a volatile slice (zero-copy access).
    pub fn as_volatile_slice(&self) -> VolatileSlice<'_> {
        self.region.as_volatile_slice()
    }

    /// `len` bytes at `offset`, or an error if that leaves the memory.
    pub fn slice(&self, offset: u64, len: usize) -> Result<VolatileSlice<'_>, DmaError> {
        let start = usize::try_from(offset).map_err(|_| self.out_of_bounds(offset, len))?;
        self.region
            .get_slice(start, len)
            .map_err(|_| self.out_of_bounds(offset, len))
    }

    /// Copies `buf.len()` bytes from `offset` into `buf`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.slice(offset, buf.len())?.copy_to(buf);
        Ok(())
    }

    /// Copies `data` to `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DmaError> {
        self.slice(offset, data.len())?.copy_from(data);
        Ok(())
    }

    fn out_of_bounds(&self, offset: u64, len: usize) -> DmaError {
        DmaError::OutOfBounds {
            offset,
            len: len as u64,
            size: self.size(),
        }
    }
}

impl AsFd for SharedMemory {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl AsRawFd for SharedMemory {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

impl LocalMemory for SharedMemory {
    fn size(&self) -> u64 {
        SharedMemory::size(self)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        SharedMemory::read_at(self, offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DmaError> {
        SharedMemory::write_at(self, offset, data)
    }
    fn direct_slice(
        &self,
        offset: u64,
        len: usize,
        _access: crate::dma::Access,
    ) -> Option<VolatileSlice<'_>> {
        let start = usize::try_from(offset).ok()?;
        self.as_volatile_slice().subslice(start, len).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn reads_back_writes_and_shares_through_the_fd() {
        let shm = SharedMemory::new("test-shm", 1 << 20).unwrap();
        assert_eq!(shm.size(), 1 << 20);
        shm.write_at(4096, b"p2plab").unwrap();
        let mut back = [0u8; 6];
        shm.read_at(4096, &mut back).unwrap();
        assert_eq!(&back, b"p2plab");

        // Another view of the same memfd (as QEMU would have) sees it.
        let dup = shm.as_fd().try_clone_to_owned().unwrap();
        let file = File::from(dup);
        let mut via_fd = [0u8; 6];
        file.read_exact_at(&mut via_fd, 4096).unwrap();
        assert_eq!(&via_fd, b"p2plab");
        file.write_all_at(b"QEMU", 8192).unwrap();
        let mut seen = [0u8; 4];
        shm.read_at(8192, &mut seen).unwrap();
        assert_eq!(&seen, b"QEMU");
    }

    #[test]
    fn out_of_range_is_an_error() {
        let shm = SharedMemory::new("test-shm", 8192).unwrap();
        let mut buf = [0u8; 16];
        assert!(matches!(
            shm.read_at(8190, &mut buf),
            Err(DmaError::OutOfBounds { .. })
        ));
        assert!(shm.write_at(u64::MAX, &buf).is_err());
        assert!(SharedMemory::new("zero", 0).is_err());
    }

    /// Catches shared memory a client can resize through the fd we hand
    /// it: a shrink would SIGBUS the server on its next access.
    #[test]
    fn the_fd_handed_out_cannot_be_resized() {
        let shm = SharedMemory::new("sealed", 1 << 20).unwrap();
        let client = File::from(shm.as_fd().try_clone_to_owned().unwrap());
        let shrink = client.set_len(4096).unwrap_err();
        assert_eq!(shrink.raw_os_error(), Some(libc::EPERM), "{shrink}");
        let grow = client.set_len(2 << 20).unwrap_err();
        assert_eq!(grow.raw_os_error(), Some(libc::EPERM), "{grow}");
        // Nor can the seals be taken off or changed.
        // SAFETY: F_GET_SEALS only reads the fd's state.
        let seals = unsafe { libc::fcntl(shm.fd(), libc::F_GET_SEALS) };
        let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        assert_eq!(seals & want, want);
        assert_eq!(client.metadata().unwrap().len(), 1 << 20);
        shm.write_at((1 << 20) - 4, b"last").unwrap();
    }

    #[test]
    fn large_sizes_stay_sparse() {
        // 16 GiB of address space; only the touched page costs memory.
        let shm = SharedMemory::new("big", 16 << 30).unwrap();
        shm.write_at((16 << 30) - 8, &[1u8; 8]).unwrap();
        // SAFETY: `stat` is plain data, for which all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes into a valid stat struct.
        assert_eq!(unsafe { libc::fstat(shm.fd(), &mut st) }, 0);
        assert!(st.st_blocks * 512 < 1 << 20, "blocks: {}", st.st_blocks);
    }
}
