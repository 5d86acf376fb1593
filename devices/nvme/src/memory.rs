//! How the controller reaches memory: guest memory through the transport,
//! its own Controller Memory Buffer and Persistent Memory Region locally,
//! and the router that decides which one an address belongs to.
//!
//! The traits ([`GuestMemory`], [`RegionMemory`]) and the typed
//! [`DmaFault`] are p2plab-dma's, shared by every device model; unit tests
//! run against its in-memory fakes and the server binary hands the
//! transport's DMA space over as is. What is NVMe-specific stays here: the
//! CMB/PMR windows ([`DmaRouter`]) and the file-backed PMR ([`FileRegion`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use p2plab_dma::{
    checked_range, Access, BusTarget, DmaFault, DmaFaultKind, GuestMemory, RegionMemory,
    VolatileSlice,
};
use p2plab_fault::Shared;

use crate::fault::{NvmeFaults, PeerEffect};
use crate::stats::Stats;

/// Where an access was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    /// Bytes served from the controller's own CMB.
    pub cmb: u64,
    /// Bytes served from the controller's own PMR.
    pub pmr: u64,
    /// Bytes that went to guest memory through the transport.
    pub host: u64,
}

impl Placement {
    pub fn add(&mut self, other: Placement) {
        self.cmb += other.cmb;
        self.pmr += other.pmr;
        self.host += other.host;
    }
}

/// No window is decoded.
const NO_WINDOW: u64 = u64::MAX;

/// One of the controller's own memories, decoded at a bus address while
/// enabled.
struct Window {
    memory: Option<Arc<dyn RegionMemory>>,
    base: AtomicU64,
}

impl Window {
    fn new(memory: Option<Arc<dyn RegionMemory>>) -> Self {
        Self {
            memory,
            base: AtomicU64::new(NO_WINDOW),
        }
    }

    fn set(&self, base: Option<u64>) {
        let value = match (&self.memory, base) {
            (Some(_), Some(base)) => base,
            _ => NO_WINDOW,
        };
        self.base.store(value, Ordering::Release);
    }

    /// `(base, end)` while decoded.
    fn span(&self) -> Option<(u64, u64, &Arc<dyn RegionMemory>)> {
        let memory = self.memory.as_ref()?;
        match self.base.load(Ordering::Acquire) {
            NO_WINDOW => None,
            base => Some((base, base.saturating_add(memory.size()), memory)),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum Target {
    #[default]
    Host,
    Cmb(u64),
    Pmr(u64),
}

/// The pieces of one access, kept inline: two windows cut a range into at
/// most five pieces (host, window, host, window, host), since every piece
/// ends at the range's end or at a window's start or end.
#[derive(Default)]
struct Pieces {
    items: [(u64, u64, Target); 5],
    len: usize,
}

impl Pieces {
    /// Appends a piece; `None` if all five slots are taken (impossible by
    /// the argument above, but a fault is better than a panic).
    fn push(&mut self, piece: (u64, u64, Target)) -> Option<()> {
        let slot = self.items.get_mut(self.len)?;
        *slot = piece;
        self.len += 1;
        Some(())
    }
}

impl IntoIterator for Pieces {
    type Item = (u64, u64, Target);
    type IntoIter = std::iter::Take<std::array::IntoIter<(u64, u64, Target), 5>>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter().take(self.len)
    }
}

/// The controller's armed injections, shared with the router so that
/// `peer-fail`/`peer-stall` act on each transfer to a peer BAR: only the
/// router sees where a transfer goes, and only those transfers may spend a
/// spec's `count=`.
#[derive(Clone)]
pub struct PeerFaults {
    /// While nothing is armed, the hot path skips the lock and the
    /// `locate` call.
    pub faults: Arc<Shared<NvmeFaults>>,
    /// The controller's decoded trace: each fired injection is a `fault`
    /// event marked `injected`.
    pub trace: Arc<p2plab_trace::Tracer>,
}

/// The controller's view of the bus: addresses inside its enabled CMB or
/// PMR are served from local memory, everything else from guest memory.
/// Accesses that straddle a window edge are split.
pub struct DmaRouter {
    guest: Arc<dyn GuestMemory>,
    cmb: Window,
    pmr: Window,
    stats: Arc<Stats>,
    peer_faults: Option<PeerFaults>,
}

impl DmaRouter {
    pub fn new(
        guest: Arc<dyn GuestMemory>,
        cmb: Option<Arc<dyn RegionMemory>>,
        stats: Arc<Stats>,
    ) -> Self {
        Self::with_pmr(guest, cmb, None, stats)
    }

    pub fn with_pmr(
        guest: Arc<dyn GuestMemory>,
        cmb: Option<Arc<dyn RegionMemory>>,
        pmr: Option<Arc<dyn RegionMemory>>,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            guest,
            cmb: Window::new(cmb),
            pmr: Window::new(pmr),
            stats,
            peer_faults: None,
        }
    }

    /// Lets armed `peer-fail`/`peer-stall` injections act on transfers to
    /// peer BARs.
    pub fn attach_peer_faults(&mut self, faults: PeerFaults) {
        self.peer_faults = Some(faults);
    }

    /// An injected `peer-fail` or `peer-stall` on a transfer of
    /// `[addr, addr+len)` to guest memory, when that is a peer BAR.
    fn inject_peer_fault(&self, addr: u64, len: u64) -> Result<(), DmaFault> {
        let Some(faults) = &self.peer_faults else {
            return Ok(());
        };
        if !faults.faults.is_armed()
            || !matches!(
                self.guest.locate(addr, len),
                BusTarget::PeerBar | BusTarget::PeerDirect
            )
        {
            return Ok(());
        }
        let Some(effect) = faults.faults.with(NvmeFaults::peer_transfer) else {
            return Ok(());
        };
        self.stats.injected_faults.fetch_add(1, Ordering::Relaxed);
        faults.trace.record("fault", || {
            let (name, stall_us) = match effect {
                PeerEffect::Fail => ("peer-fail", 0),
                PeerEffect::Stall(d) => ("peer-stall", d.as_micros()),
            };
            serde_json::json!({
                "name": name,
                "addr": format!("{addr:#x}"),
                "len": len,
                "at": BusTarget::PeerBar.name(),
                "stall_us": u64::try_from(stall_us).unwrap_or(u64::MAX),
                "injected": true,
            })
        });
        match effect {
            PeerEffect::Fail => {
                tracing::info!(addr, len, "injected peer-fail on a transfer to a peer BAR");
                Err(DmaFault::new(
                    DmaFaultKind::Injected,
                    addr,
                    len,
                    "injected peer-fail",
                ))
            }
            PeerEffect::Stall(delay) => {
                tracing::info!(addr, len, ?delay, "injected peer-stall");
                std::thread::sleep(delay);
                Ok(())
            }
        }
    }

    pub fn cmb(&self) -> Option<&Arc<dyn RegionMemory>> {
        self.cmb.memory.as_ref()
    }

    pub fn pmr(&self) -> Option<&Arc<dyn RegionMemory>> {
        self.pmr.memory.as_ref()
    }

    /// Starts (`Some(base)`) or stops decoding the CMB at a bus address.
    pub fn set_window(&self, base: Option<u64>) {
        self.cmb.set(base);
    }

    /// Starts or stops decoding the PMR at a bus address.
    pub fn set_pmr_window(&self, base: Option<u64>) {
        self.pmr.set(base);
    }

    pub fn window(&self) -> Option<u64> {
        self.cmb.span().map(|(base, _, _)| base)
    }

    /// Where `[addr, addr+len)` lives, for traces: `own-cmb`, `own-pmr`,
    /// or what the guest memory says (`ram`, `peer-bar`, ...).
    pub fn locate(&self, addr: u64, len: u64) -> &'static str {
        let inside = |w: &Window| {
            w.span()
                .is_some_and(|(base, end, _)| addr >= base && addr < end)
        };
        if inside(&self.cmb) {
            "own-cmb"
        } else if inside(&self.pmr) {
            "own-pmr"
        } else {
            self.guest.locate(addr, len).name()
        }
    }

    /// The CMB offset of `addr` when it lies inside the decoded CMB.
    pub fn cmb_offset(&self, addr: u64) -> Option<u64> {
        let (base, end, _) = self.cmb.span()?;
        (addr >= base && addr < end).then(|| addr - base)
    }

    /// Splits `[addr, addr+len)` into pieces wholly inside one window or
    /// wholly outside both: `(addr, len, target)`. Runs for every DMA
    /// access (each SQ entry, data buffer, CQ entry, shadow doorbell
    /// poll), so it allocates nothing.
    fn pieces(&self, addr: u64, len: u64) -> Result<Pieces, DmaFault> {
        let end = addr
            .checked_add(len)
            .ok_or_else(|| DmaFault::unmapped(addr, len, "address range wraps around"))?;
        let cmb = self.cmb.span().map(|(b, e, _)| (b, e, true));
        let pmr = self.pmr.span().map(|(b, e, _)| (b, e, false));
        let windows = [cmb, pmr];
        let windows = windows.iter().flatten();
        let mut out = Pieces::default();
        let mut at = addr;
        while at < end {
            let piece = if let Some(&(base, wend, is_cmb)) =
                windows.clone().find(|(b, e, _)| at >= *b && at < *e)
            {
                let stop = end.min(wend);
                let offset = at - base;
                let target = if is_cmb {
                    Target::Cmb(offset)
                } else {
                    Target::Pmr(offset)
                };
                (at, stop - at, target)
            } else {
                // Guest memory up to the next window that starts above.
                let next = windows
                    .clone()
                    .map(|(b, _, _)| *b)
                    .filter(|b| *b > at)
                    .min()
                    .unwrap_or(end);
                (at, end.min(next) - at, Target::Host)
            };
            out.push(piece).ok_or_else(|| {
                DmaFault::unmapped(addr, len, "range splits into too many pieces")
            })?;
            at += piece.1;
        }
        Ok(out)
    }

    fn local(&self, target: Target) -> Option<(&Arc<dyn RegionMemory>, u64)> {
        match target {
            Target::Cmb(offset) => self.cmb.memory.as_ref().map(|m| (m, offset)),
            Target::Pmr(offset) => self.pmr.memory.as_ref().map(|m| (m, offset)),
            Target::Host => None,
        }
    }

    fn account(placement: &mut Placement, target: Target, n: u64) {
        match target {
            Target::Cmb(_) => placement.cmb += n,
            Target::Pmr(_) => placement.pmr += n,
            Target::Host => placement.host += n,
        }
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<Placement, DmaFault> {
        let mut placement = Placement::default();
        let mut done = 0usize;
        for (at, len, target) in self.pieces(addr, buf.len() as u64)? {
            let len = len as usize;
            let part = &mut buf[done..done + len];
            match self.local(target) {
                Some((memory, offset)) => memory.read(offset, part)?,
                None => self
                    .inject_peer_fault(at, len as u64)
                    .and_then(|()| self.guest.read(at, part))
                    .inspect_err(|_| {
                        self.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                    })?,
            }
            Self::account(&mut placement, target, len as u64);
            done += len;
        }
        let s = &self.stats;
        s.cmb_read_bytes.fetch_add(placement.cmb, Ordering::Relaxed);
        s.pmr_read_bytes.fetch_add(placement.pmr, Ordering::Relaxed);
        s.host_read_bytes
            .fetch_add(placement.host, Ordering::Relaxed);
        Ok(placement)
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Result<Placement, DmaFault> {
        let mut placement = Placement::default();
        let mut done = 0usize;
        for (at, len, target) in self.pieces(addr, data.len() as u64)? {
            let len = len as usize;
            let part = &data[done..done + len];
            match self.local(target) {
                Some((memory, offset)) => memory.write(offset, part)?,
                None => self
                    .inject_peer_fault(at, len as u64)
                    .and_then(|()| self.guest.write(at, part))
                    .inspect_err(|_| {
                        self.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                    })?,
            }
            Self::account(&mut placement, target, len as u64);
            done += len;
        }
        let s = &self.stats;
        s.cmb_write_bytes
            .fetch_add(placement.cmb, Ordering::Relaxed);
        s.pmr_write_bytes
            .fetch_add(placement.pmr, Ordering::Relaxed);
        s.host_write_bytes
            .fetch_add(placement.host, Ordering::Relaxed);
        Ok(placement)
    }

    /// Zero-copy access for a data transfer: calls `f` with the memory
    /// behind `segments` (see [`GuestMemory::with_direct`]), or with the
    /// CMB's own memory when every byte lies there, and says where the
    /// bytes were. `Ok(None)`, without calling `f`, when the buffer mixes
    /// windows and guest memory, when the memory can only be copied (the
    /// file-backed PMR, memory reached by messages), or while a
    /// `peer-fail`/`peer-stall` injection is armed (it acts per copied
    /// piece): the caller then copies with [`read`](Self::read) /
    /// [`write`](Self::write).
    pub fn with_direct(
        &self,
        segments: &[(u64, usize)],
        access: Access,
        f: &mut dyn FnMut(&[VolatileSlice<'_>]) -> std::io::Result<()>,
    ) -> Result<Option<(Placement, std::io::Result<()>)>, DmaFault> {
        if self
            .peer_faults
            .as_ref()
            .is_some_and(|p| p.faults.is_armed())
        {
            return Ok(None);
        }
        let mut total = 0u64;
        let mut local = Vec::new();
        let mut host = 0usize;
        for &(addr, len) in segments {
            for (_, n, target) in self.pieces(addr, len as u64)? {
                match self.local(target) {
                    Some((memory, offset)) => local.push((memory, offset, target, n)),
                    None => host += 1,
                }
            }
            total += len as u64;
        }
        if !local.is_empty() {
            // Wholly in the CMB/PMR (a copy between two queues' buffers
            // there, a peer's data staged in it): hand out our own memory.
            // A buffer that mixes windows and guest memory copies.
            if host > 0 {
                return Ok(None);
            }
            let mut slices = Vec::with_capacity(local.len());
            for &(memory, offset, _, n) in &local {
                let n =
                    usize::try_from(n).map_err(|_| DmaFault::unmapped(offset, n, "too long"))?;
                match memory.direct_slice(offset, n) {
                    Some(slice) => slices.push(slice),
                    None => return Ok(None),
                }
            }
            let mut placement = Placement::default();
            for &(_, _, target, n) in &local {
                Self::account(&mut placement, target, n);
            }
            let s = &self.stats;
            if matches!(access, Access::Read | Access::ReadWrite) {
                s.cmb_read_bytes.fetch_add(placement.cmb, Ordering::Relaxed);
                s.pmr_read_bytes.fetch_add(placement.pmr, Ordering::Relaxed);
            }
            if matches!(access, Access::Write | Access::ReadWrite) {
                s.cmb_write_bytes
                    .fetch_add(placement.cmb, Ordering::Relaxed);
                s.pmr_write_bytes
                    .fetch_add(placement.pmr, Ordering::Relaxed);
            }
            return Ok(Some((placement, f(&slices))));
        }
        let outcome = self
            .guest
            .with_direct(segments, access, f)
            .inspect_err(|_| {
                self.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            })?;
        let Some(result) = outcome else {
            return Ok(None);
        };
        let s = &self.stats;
        if matches!(access, Access::Read | Access::ReadWrite) {
            s.host_read_bytes.fetch_add(total, Ordering::Relaxed);
        }
        if matches!(access, Access::Write | Access::ReadWrite) {
            s.host_write_bytes.fetch_add(total, Ordering::Relaxed);
        }
        let placement = Placement {
            host: total,
            ..Placement::default()
        };
        Ok(Some((placement, result)))
    }

    pub fn read_u32(&self, addr: u64) -> Result<u32, DmaFault> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub fn write_u32(&self, addr: u64, value: u32) -> Result<(), DmaFault> {
        self.write(addr, &value.to_le_bytes()).map(|_| ())
    }
}

/// A file as device memory: the Persistent Memory Region, reached with
/// pread/pwrite (DMA and trapped guest accesses to BAR4 alike; the file is
/// never handed to the client); [`flush`](RegionMemory::flush) is
/// fdatasync.
pub struct FileRegion {
    file: std::fs::File,
    size: u64,
    label: String,
}

impl FileRegion {
    /// Opens `path`, creating it sparse with `size` bytes if missing. An
    /// existing file keeps its contents and must have `size` bytes when one
    /// is given.
    pub fn open(path: &std::path::Path, size: Option<u64>) -> Result<Self, String> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::OpenOptionsExt;
        let label = path.display().to_string();
        let existing = path.exists();
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(!existing)
            // A file we create is ours alone; create_new (O_EXCL) never
            // follows a symlink planted at the path after the check.
            .mode(0o600)
            .truncate(false)
            .open(path)
            .map_err(|e| format!("{label}: {e}"))?;
        let actual = file
            .seek(SeekFrom::End(0))
            .map_err(|e| format!("{label}: {e}"))?;
        let size = match (existing, size) {
            (false, Some(size)) => {
                file.set_len(size).map_err(|e| format!("{label}: {e}"))?;
                size
            }
            (false, None) => {
                let _ = std::fs::remove_file(path);
                return Err(format!("{label} does not exist; give a size to create it"));
            }
            (true, Some(size)) if size != actual => {
                return Err(format!(
                    "{label} exists with {actual} bytes, but size={size} was asked for"
                ))
            }
            (true, _) => actual,
        };
        Ok(Self { file, size, label })
    }

    pub fn describe(&self) -> &str {
        &self.label
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), DmaFault> {
        checked_range(offset, len, self.size).map(|_| ())
    }
}

/// The PMR as given on the command line: `file=PATH[,size=SIZE]` (or a bare
/// `PATH`). A missing file is created sparse with SIZE bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmrSpec {
    pub path: std::path::PathBuf,
    pub size: Option<u64>,
}

impl std::str::FromStr for PmrSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut path = None;
        let mut size = None;
        for (i, part) in text.split(',').enumerate() {
            let part = part.trim();
            match part.split_once('=') {
                Some(("file" | "path", v)) if !v.trim().is_empty() => {
                    path = Some(std::path::PathBuf::from(v.trim()))
                }
                Some(("size", v)) => size = Some(crate::namespace::parse_size(v)?),
                None if i == 0 && !part.is_empty() => path = Some(part.into()),
                _ => {
                    return Err(format!(
                        "{part:?} is not understood (use file=PATH[,size=SIZE])"
                    ))
                }
            }
        }
        let path = path.ok_or("the PMR needs file=PATH")?;
        if let Some(size) = size {
            if !size.is_power_of_two() || size < 4096 {
                return Err(format!("size {size} is not a power of two of at least 4K"));
            }
        }
        Ok(Self { path, size })
    }
}

impl RegionMemory for FileRegion {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        use std::os::unix::fs::FileExt;
        self.check(offset, buf.len())?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| DmaFault::io(offset, buf.len() as u64, e.to_string()))
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DmaFault> {
        use std::os::unix::fs::FileExt;
        self.check(offset, data.len())?;
        self.file
            .write_all_at(data, offset)
            .map_err(|e| DmaFault::io(offset, data.len() as u64, e.to_string()))
    }

    fn flush(&self) -> Result<(), DmaFault> {
        self.file
            .sync_data()
            .map_err(|e| DmaFault::io(0, self.size, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2plab_dma::testing::FakeGuestMemory;
    use p2plab_dma::HeapRegion;

    fn router() -> DmaRouter {
        let guest = FakeGuestMemory::new().with_region(0x10000, 0x10000);
        DmaRouter::new(
            Arc::new(guest),
            Some(Arc::new(HeapRegion::new(0x2000))),
            Arc::new(Stats::default()),
        )
    }

    #[test]
    fn without_window_everything_goes_to_guest_memory() {
        let r = router();
        let p = r.write(0x10000, &[1, 2, 3]).unwrap();
        assert_eq!(
            p,
            Placement {
                cmb: 0,
                pmr: 0,
                host: 3
            }
        );
        let mut b = [0; 3];
        r.read(0x10000, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3]);
        assert!(
            r.read(0x0, &mut b).is_err(),
            "unmapped guest address faults"
        );
    }

    #[test]
    fn cmb_window_is_served_locally_and_split_at_its_edges() {
        let r = router();
        // CMB decoded at 0x1f000..0x21000, overlapping the end of guest RAM.
        r.set_window(Some(0x1f000));
        assert_eq!(r.cmb_offset(0x1f000), Some(0));
        assert_eq!(r.cmb_offset(0x20fff), Some(0x1fff));
        assert_eq!(r.cmb_offset(0x21000), None);
        let data: Vec<u8> = (0..32).collect();
        let p = r.write(0x1eff0, &data).unwrap();
        assert_eq!(
            p,
            Placement {
                cmb: 16,
                pmr: 0,
                host: 16
            }
        );
        let mut local = [0u8; 16];
        r.cmb().unwrap().read(0, &mut local).unwrap();
        assert_eq!(&local[..], &data[16..]);
        let mut back = [0u8; 32];
        assert_eq!(r.read(0x1eff0, &mut back).unwrap().cmb, 16);
        assert_eq!(back.to_vec(), data);
        // Past the CMB end there is no guest memory at 0x21000: fault.
        assert!(r.write(0x20ff0, &[0; 32]).is_err());
        r.set_window(None);
        assert_eq!(r.cmb_offset(0x1f000), None);
    }

    /// Catches a zero-copy transfer that hands out the wrong memory for
    /// a buffer in the CMB (or counts it as host traffic), or one that
    /// goes zero-copy for a buffer straddling the CMB and guest RAM.
    #[test]
    fn zero_copy_reaches_the_cmb_or_guest_memory_but_never_both() {
        let cmb = p2plab_vfio_user::SharedMemory::new("test-cmb", 0x2000).unwrap();
        let cmb = Arc::new(cmb);
        let stats = Arc::new(Stats::default());
        let r = DmaRouter::new(
            Arc::new(FakeGuestMemory::new().with_region(0x10000, 0x10000)),
            Some(Arc::new(p2plab_vfio_user::SharedRegion::new(
                cmb.clone(),
                0x2000,
            ))),
            stats.clone(),
        );
        r.set_window(Some(0x40000));
        let fill = |byte: u8| {
            move |slices: &[VolatileSlice<'_>]| -> std::io::Result<()> {
                slices
                    .iter()
                    .for_each(|s| s.copy_from(&vec![byte; s.len()]));
                Ok(())
            }
        };
        let (placement, result) = r
            .with_direct(&[(0x40010, 8), (0x41000, 8)], Access::Write, &mut fill(7))
            .unwrap()
            .expect("all in the CMB: direct");
        result.unwrap();
        assert_eq!(
            placement,
            Placement {
                cmb: 16,
                pmr: 0,
                host: 0
            }
        );
        let mut seen = [0u8; 8];
        cmb.read_at(0x1000, &mut seen).unwrap();
        assert_eq!(seen, [7; 8]);
        assert_eq!(stats.cmb_write_bytes.load(Ordering::Relaxed), 16);
        assert_eq!(stats.host_write_bytes.load(Ordering::Relaxed), 0);
        let (placement, _) = r
            .with_direct(&[(0x10000, 8)], Access::Write, &mut fill(9))
            .unwrap()
            .expect("all in guest RAM: direct");
        assert_eq!(placement.host, 8);
        assert!(
            r.with_direct(&[(0x10000, 8), (0x40000, 8)], Access::Read, &mut fill(1))
                .unwrap()
                .is_none(),
            "mixed: copied"
        );
        assert!(r
            .with_direct(&[(0x60000, 8)], Access::Read, &mut fill(1))
            .is_err());
    }

    #[test]
    fn cmb_and_pmr_windows_side_by_side() {
        let guest = FakeGuestMemory::new().with_region(0x10000, 0x10000);
        let r = DmaRouter::with_pmr(
            Arc::new(guest),
            Some(Arc::new(HeapRegion::new(0x1000))),
            Some(Arc::new(HeapRegion::new(0x1000))),
            Arc::new(Stats::default()),
        );
        // Guest RAM | CMB | PMR | guest RAM, all contiguous.
        r.set_window(Some(0x12000));
        r.set_pmr_window(Some(0x13000));
        let data: Vec<u8> = (0..0x3000u32).map(|i| (i % 253) as u8).collect();
        let p = r.write(0x11800, &data[..0x3000]).unwrap();
        assert_eq!(
            p,
            Placement {
                cmb: 0x1000,
                pmr: 0x1000,
                host: 0x1000
            }
        );
        let mut back = vec![0u8; 0x3000];
        r.read(0x11800, &mut back).unwrap();
        assert_eq!(back, data);
        let mut pmr = [0u8; 4];
        r.pmr().unwrap().read(0, &mut pmr).unwrap();
        assert_eq!(&pmr, &data[0x1800..0x1804]);
        r.set_pmr_window(None);
        assert_eq!(
            r.read(0x13000, &mut pmr).unwrap().host,
            4,
            "PMR no longer decoded"
        );
    }

    /// Catches a fixed piece table too small for the worst split (host,
    /// window, host, window, host), and overlapping windows that loop.
    #[test]
    fn the_most_fragmented_access_fits_in_five_pieces() {
        let guest = FakeGuestMemory::new().with_region(0x10000, 0x10000);
        let r = DmaRouter::with_pmr(
            Arc::new(guest),
            Some(Arc::new(HeapRegion::new(0x1000))),
            Some(Arc::new(HeapRegion::new(0x1000))),
            Arc::new(Stats::default()),
        );
        r.set_window(Some(0x12000));
        r.set_pmr_window(Some(0x14000));
        let data: Vec<u8> = (0..0x5000u32).map(|i| (i % 251) as u8).collect();
        let p = r.write(0x11000, &data).unwrap();
        assert_eq!(
            p,
            Placement {
                cmb: 0x1000,
                pmr: 0x1000,
                host: 0x3000
            }
        );
        assert_eq!(r.pieces(0x11000, 0x5000).unwrap().into_iter().count(), 5);
        let mut back = vec![0u8; 0x5000];
        r.read(0x11000, &mut back).unwrap();
        assert_eq!(back, data);
        // Overlapping windows (a guest may program both BARs on top of
        // each other): the CMB wins where they overlap, nothing loops.
        r.set_pmr_window(Some(0x12800));
        let p = r.read(0x11000, &mut back).unwrap();
        assert_eq!(p.cmb + p.pmr + p.host, 0x5000);
        assert_eq!((p.cmb, p.pmr), (0x1000, 0x800));
    }

    #[test]
    fn file_regions_persist_and_parse() {
        let path = std::env::temp_dir().join(format!("p2plab-nvme-pmr-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        assert!(
            FileRegion::open(&path, None).is_err(),
            "missing file without a size"
        );
        let r = FileRegion::open(&path, Some(8192)).unwrap();
        r.write(4096, b"persistent").unwrap();
        r.flush().unwrap();
        assert!(r.write(8190, b"xyz").is_err(), "past the end");
        drop(r);
        let r = FileRegion::open(&path, None).unwrap();
        assert_eq!(r.size(), 8192);
        let mut got = [0u8; 10];
        r.read(4096, &mut got).unwrap();
        assert_eq!(&got, b"persistent");
        assert!(
            FileRegion::open(&path, Some(4096)).is_err(),
            "size mismatch"
        );
        let _ = std::fs::remove_file(&path);
        let spec: PmrSpec = "file=/tmp/p.img,size=1M".parse().unwrap();
        assert_eq!(
            (spec.path.to_str(), spec.size),
            (Some("/tmp/p.img"), Some(1 << 20))
        );
        assert!("file=/tmp/p,size=3K".parse::<PmrSpec>().is_err());
        assert!("size=4K".parse::<PmrSpec>().is_err());
    }

    #[test]
    fn wrapping_ranges_fault() {
        let r = router();
        let mut b = [0u8; 8];
        assert!(r.read(u64::MAX - 3, &mut b).is_err());
    }

    fn router_with_peer(spec: &str) -> (DmaRouter, Arc<Stats>) {
        let (router, stats, _) = router_with_peer_traced(spec);
        (router, stats)
    }

    fn router_with_peer_traced(spec: &str) -> (DmaRouter, Arc<Stats>, Arc<p2plab_trace::Tracer>) {
        let guest = FakeGuestMemory::new()
            .with_region(RAM, 0x10000)
            .with_peer_region(PEER, 0x10000);
        let stats = Arc::new(Stats::default());
        let mut router = DmaRouter::new(Arc::new(guest), None, Arc::clone(&stats));
        let mut faults = NvmeFaults::default();
        faults.arm(spec.parse().unwrap()).unwrap();
        let trace = Arc::new(p2plab_trace::Tracer::new());
        router.attach_peer_faults(PeerFaults {
            faults: Arc::new(Shared::new(faults)),
            trace: Arc::clone(&trace),
        });
        (router, stats, trace)
    }

    const RAM: u64 = 0x10_0000;
    const PEER: u64 = 0xe000_0000;

    /// Catches a peer-fail that hits RAM transfers, spends its count on
    /// them, never fires, or does not end as a Data Transfer Error.
    #[test]
    fn peer_fail_fails_one_transfer_to_a_peer_bar_only() {
        let (r, stats, trace) = router_with_peer_traced("peer-fail,count=1");
        let trace_file = std::env::temp_dir().join(format!(
            "p2plab-nvme-peer-fail-{}.jsonl",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&trace_file);
        trace.configure(&trace_file, "nvme-test");
        trace.enable().unwrap();
        let mut buf = [0u8; 512];
        r.read(RAM, &mut buf).unwrap();
        r.write(RAM, &buf).unwrap();
        let fault = r.write(PEER + 0x1000, &buf).unwrap_err();
        assert_eq!(
            (fault.kind, fault.addr),
            (DmaFaultKind::Injected, PEER + 0x1000)
        );
        r.write(PEER + 0x1000, &buf).unwrap();
        r.read(PEER, &mut buf).unwrap();
        let counters = stats.snapshot();
        assert_eq!((counters.injected_faults, counters.dma_faults), (1, 1));
        trace.disable();
        let text = std::fs::read_to_string(&trace_file).unwrap();
        let _ = std::fs::remove_file(&trace_file);
        let faults: Vec<_> = p2plab_trace::parse_lines(&text)
            .unwrap()
            .into_iter()
            .filter(|e| e["kind"] == "fault")
            .collect();
        assert_eq!(faults.len(), 1, "{text}");
        assert_eq!(faults[0]["name"], "peer-fail");
        assert_eq!(faults[0]["injected"], true);
        assert_eq!(faults[0]["addr"], format!("{:#x}", PEER + 0x1000));

        // Through a command's data pointer: the status the guest sees.
        let (r, _) = router_with_peer("peer-fail");
        let page = 4096;
        let to_peer = crate::datapointer::map_prp(&r, PEER, 0, 512, page).unwrap();
        assert_eq!(
            to_peer.write_to_host(&r, &[7; 512]),
            Err(crate::spec::Status::DATA_TRANSFER_ERROR)
        );
        let to_ram = crate::datapointer::map_prp(&r, RAM, 0, 512, page).unwrap();
        to_ram.write_to_host(&r, &[7; 512]).unwrap();
    }

    /// Catches a peer-stall that does not wait, fails the transfer, or
    /// delays RAM transfers.
    #[test]
    fn peer_stall_delays_peer_transfers_then_moves_the_data() {
        let stall = std::time::Duration::from_millis(30);
        let (r, stats) = router_with_peer("peer-stall=30ms,count=1");
        let started = std::time::Instant::now();
        r.write(RAM, &[1; 64]).unwrap();
        assert!(started.elapsed() < stall, "RAM transfers are not stalled");
        let started = std::time::Instant::now();
        r.write(PEER, &[9; 64]).unwrap();
        assert!(started.elapsed() >= stall);
        let mut back = [0u8; 64];
        r.read(PEER, &mut back).unwrap();
        assert_eq!(back, [9; 64]);
        assert_eq!(stats.snapshot().injected_faults, 1);
    }
}
