//! What one read or write did: which path moved which bytes, and why the
//! compat path ran. Every call returns one of these; the C ABI flattens it
//! into `struct p2plab_gds_io_report`, p2plab-gdsio prints it as JSON.

use serde_json::{json, Value};

/// How bytes moved between the file and GPU memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Path {
    /// Nothing moved (size 0, or the read started at or past EOF).
    None = 0,
    /// O_DIRECT straight between the file's device and the GPU's BAR.
    P2p = 1,
    /// Through a bounce buffer in host RAM (page cache I/O + GPU engine copy).
    Compat = 2,
    /// Part P2P, part compat.
    Mixed = 3,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::None => "none",
            Path::P2p => "p2p",
            Path::Compat => "compat",
            Path::Mixed => "mixed",
        }
    }

    pub fn from_bytes(p2p: u64, compat: u64) -> Path {
        match (p2p > 0, compat > 0) {
            (false, false) => Path::None,
            (true, false) => Path::P2p,
            (false, true) => Path::Compat,
            (true, true) => Path::Mixed,
        }
    }
}

/// Why (part of) a transfer took the compat path. The values are bits of
/// `p2plab_gds_io_report.reasons`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Reason {
    /// File offset, GPU address or length is not a multiple of the file's
    /// O_DIRECT alignment (statx STATX_DIOALIGN).
    Alignment = 1 << 0,
    /// The last, partial block of the file (its size is not aligned).
    EofTail = 1 << 1,
    /// A hole of a sparse file: no blocks to DMA from, the kernel would
    /// only zero-fill.
    Sparse = 1 << 2,
    /// An append: the handle is O_APPEND (the kernel picks the offset), or
    /// the write extends the file from an offset or to a size O_DIRECT
    /// cannot use.
    Append = 1 << 3,
    /// The file system does no O_DIRECT on the file: the open failed, or
    /// statx reports no O_DIRECT support (ext4 data=journal).
    FsNoDirectIo = 1 << 4,
    /// The file system or block layer refused O_DIRECT I/O into GPU
    /// memory (EINVAL, EREMOTEIO, EOPNOTSUPP...), topology permitting.
    FsRefused = 1 << 5,
    /// The kernel refused P2P between the file's device and the GPU: they
    /// share no PCIe switch and the host bridge is not whitelisted.
    Topology = 1 << 6,
    /// The file is not on a PCI block device (tmpfs, 9p, ...).
    NotPciStorage = 1 << 7,
    /// The GPU buffer is a /dev/p2plab-gpuN mapping: VRAM without
    /// struct pages, which O_DIRECT cannot pin.
    NotP2pmem = 1 << 8,
    /// The policy forces compat mode (P2PLAB_GDS_FORCE_COMPAT).
    Forced = 1 << 9,
}

impl Reason {
    pub const ALL: [Reason; 10] = [
        Reason::Alignment,
        Reason::EofTail,
        Reason::Sparse,
        Reason::Append,
        Reason::FsNoDirectIo,
        Reason::FsRefused,
        Reason::Topology,
        Reason::NotPciStorage,
        Reason::NotP2pmem,
        Reason::Forced,
    ];

    pub fn bit(self) -> u32 {
        self as u32
    }

    /// Stable lower-case name, used in JSON and by p2plab_gds_reason_name.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Alignment => "alignment",
            Reason::EofTail => "eof_tail",
            Reason::Sparse => "sparse",
            Reason::Append => "append",
            Reason::FsNoDirectIo => "fs_no_direct_io",
            Reason::FsRefused => "fs_refused",
            Reason::Topology => "topology",
            Reason::NotPciStorage => "not_pci_storage",
            Reason::NotP2pmem => "not_p2pmem",
            Reason::Forced => "forced",
        }
    }

    pub fn from_bit(bit: u32) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.bit() == bit)
    }

    /// The reasons whose bits are set in `mask`, in bit order.
    pub fn from_mask(mask: u32) -> Vec<Reason> {
        Reason::ALL
            .into_iter()
            .filter(|r| mask & r.bit() != 0)
            .collect()
    }
}

/// Which path one piece of a transfer takes, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    P2p,
    Compat { reason: Reason, detail: String },
}

/// One contiguous piece of a transfer as it ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentReport {
    pub file_offset: u64,
    pub buf_offset: u64,
    pub len: u64,
    /// Bytes actually moved (less than len at EOF or on error).
    pub done: u64,
    pub route: Route,
}

/// The outcome of one read or write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IoReport {
    pub write: bool,
    pub requested: u64,
    pub p2p_bytes: u64,
    pub compat_bytes: u64,
    /// The read ended at end of file before `requested` bytes.
    pub eof: bool,
    /// errno of a P2P attempt that the kernel refused (the bytes were then
    /// moved in compat mode); 0 when none was refused.
    pub p2p_errno: i32,
    pub segments: Vec<SegmentReport>,
}

impl IoReport {
    pub fn bytes(&self) -> u64 {
        self.p2p_bytes + self.compat_bytes
    }

    pub fn path(&self) -> Path {
        Path::from_bytes(self.p2p_bytes, self.compat_bytes)
    }

    /// Bits of every reason a segment took the compat path for.
    pub fn reason_mask(&self) -> u32 {
        self.segments
            .iter()
            .filter_map(|s| match &s.route {
                Route::Compat { reason, .. } => Some(reason.bit()),
                Route::P2p => None,
            })
            .fold(0, |a, b| a | b)
    }

    /// Why the compat path ran, each distinct sentence once; empty when
    /// everything went P2P.
    pub fn detail(&self) -> String {
        let mut seen: Vec<&str> = Vec::new();
        for s in &self.segments {
            if let Route::Compat { detail, .. } = &s.route {
                if !seen.contains(&detail.as_str()) {
                    seen.push(detail);
                }
            }
        }
        seen.join("; ")
    }

    pub fn to_json(&self) -> Value {
        let segments: Vec<Value> = self
            .segments
            .iter()
            .map(|s| {
                let (route, reason, detail) = match &s.route {
                    Route::P2p => ("p2p", Value::Null, Value::Null),
                    Route::Compat { reason, detail } => {
                        ("compat", json!(reason.name()), json!(detail))
                    }
                };
                json!({
                    "file_offset": s.file_offset,
                    "buf_offset": s.buf_offset,
                    "len": s.len,
                    "done": s.done,
                    "route": route,
                    "reason": reason,
                    "detail": detail,
                })
            })
            .collect();
        let reasons: Vec<&str> = Reason::from_mask(self.reason_mask())
            .into_iter()
            .map(Reason::name)
            .collect();
        json!({
            "op": if self.write { "write" } else { "read" },
            "requested": self.requested,
            "bytes": self.bytes(),
            "path": self.path().name(),
            "p2p_bytes": self.p2p_bytes,
            "compat_bytes": self.compat_bytes,
            "reasons": reasons,
            "detail": self.detail(),
            "eof": self.eof,
            "p2p_errno": self.p2p_errno,
            "segments": segments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_bits_are_distinct_and_named() {
        let mut mask = 0;
        for r in Reason::ALL {
            assert_eq!(mask & r.bit(), 0, "{r:?}");
            mask |= r.bit();
            assert_eq!(Reason::from_bit(r.bit()), Some(r));
        }
        assert_eq!(Reason::from_mask(mask).len(), Reason::ALL.len());
    }

    #[test]
    fn path_follows_the_bytes() {
        assert_eq!(Path::from_bytes(0, 0), Path::None);
        assert_eq!(Path::from_bytes(1, 0), Path::P2p);
        assert_eq!(Path::from_bytes(0, 1), Path::Compat);
        assert_eq!(Path::from_bytes(1, 1), Path::Mixed);
    }

    #[test]
    fn report_json_names_reasons_once() {
        let compat = |reason, detail: &str| Route::Compat {
            reason,
            detail: detail.to_owned(),
        };
        let report = IoReport {
            write: false,
            requested: 3000,
            p2p_bytes: 1024,
            compat_bytes: 1000,
            eof: true,
            p2p_errno: 0,
            segments: vec![
                SegmentReport {
                    file_offset: 0,
                    buf_offset: 0,
                    len: 1024,
                    done: 1024,
                    route: Route::P2p,
                },
                SegmentReport {
                    file_offset: 1024,
                    buf_offset: 1024,
                    len: 500,
                    done: 500,
                    route: compat(Reason::Sparse, "hole"),
                },
                SegmentReport {
                    file_offset: 1524,
                    buf_offset: 1524,
                    len: 500,
                    done: 500,
                    route: compat(Reason::Sparse, "hole"),
                },
            ],
        };
        let v = report.to_json();
        assert_eq!(v["path"], "mixed");
        assert_eq!(v["bytes"], 2024);
        assert_eq!(v["reasons"], json!(["sparse"]));
        assert_eq!(v["detail"], "hole");
        assert_eq!(v["segments"][0]["route"], "p2p");
        assert_eq!(v["segments"][1]["reason"], "sparse");
    }
}
