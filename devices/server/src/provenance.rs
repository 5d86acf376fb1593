//! Provenance of the bytes a GPU moved: between two marks, did any byte of
//! the transfers to or from the GPU bounce through guest RAM?
//!
//! A **mark** is every server's `status` of one run, taken at one moment
//! and kept under a name (`p2plab-ctl RUN mark NAME`). The verdict compares
//! two marks (or a mark and now):
//!
//! - **bounced**: bytes the GPU's engine copied between guest RAM and VRAM
//!   (`bytes_ram_to_vram`, `bytes_vram_to_ram`): data that reached or left
//!   the GPU through system memory, as GDS compat mode or a dma-buf that
//!   migrated to system memory followed by a copy does;
//! - **peer-to-peer**: bytes other devices wrote into or read from VRAM
//!   directly (`peer_inbound_*`, the zero-copy peer path), and bytes the
//!   GPU's engine copied between VRAM and a peer's BAR;
//! - **by message**: bytes devices moved to fd-less ranges through QEMU
//!   (`dma_message_*`): peer BARs reached through the root complex (under
//!   a vIOMMU with ACS redirect, or with the peer path off). With guest RAM
//!   shared (`memory-backend-memfd,share=on`, as every lab topology has)
//!   such a range is never RAM; which BAR it is, the servers cannot tell.
//!
//! The verdict fails when any byte bounced, or when fewer bytes than asked
//! moved peer-to-peer (a P2P transfer that silently went elsewhere and
//! never touched the GPU). What the servers cannot see is not judged: CPU
//! loads and stores through a BAR mapping (QEMU maps the BAR into the
//! guest, so they never reach a server).
//!
//! A server that restarted between the marks (its pid changed, or a
//! counter went back) makes the answer unknown, never a pass.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::control::{request, request_over_port, ControlRequest};

/// Longest mark name; names are `[A-Za-z0-9._-]`, not starting with `.`.
const MAX_NAME: usize = 64;
/// Largest mark file read back (a mark of a few servers is a few KiB).
const MAX_MARK_BYTES: u64 = 16 << 20;

/// How to reach the servers of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Servers {
    /// On the host: the run folder, whose `<id>.ctl` sockets are the
    /// servers' control sockets.
    RunDir(PathBuf),
    /// In the guest: every virtio-serial port named `p2plab.ctl.<id>`,
    /// as `(id, device node)`.
    GuestPorts(Vec<(String, PathBuf)>),
}

impl Servers {
    /// Every server's id and status, in id order. A server that does not
    /// answer is an error: a verdict without it could miss its bytes.
    pub fn statuses(&self) -> Result<BTreeMap<String, Value>> {
        let mut out = BTreeMap::new();
        match self {
            Servers::RunDir(dir) => {
                let entries = std::fs::read_dir(dir)
                    .with_context(|| format!("reading the run folder {}", dir.display()))?;
                for entry in entries.flatten() {
                    let path = entry.path();
                    let is_socket = entry.file_type().is_ok_and(|t| {
                        use std::os::unix::fs::FileTypeExt;
                        t.is_socket()
                    });
                    if !is_socket || path.extension().is_none_or(|e| e != "ctl") {
                        continue;
                    }
                    let id = stem(&path);
                    let status = request(&path, &ControlRequest::Status)
                        .with_context(|| format!("{id}: status"))?;
                    out.insert(id, status);
                }
            }
            Servers::GuestPorts(ports) => {
                for (id, port) in ports {
                    let status = request_over_port(port, &ControlRequest::Status)
                        .with_context(|| format!("{id}: status through {}", port.display()))?;
                    out.insert(id.clone(), status);
                }
            }
        }
        if out.is_empty() {
            bail!("no device server answers here ({self})");
        }
        Ok(out)
    }

    /// Where marks are kept: `<run>/marks` on the host; in the guest
    /// `/run/p2plab-ctl/marks`.
    pub fn default_marks_dir(&self) -> PathBuf {
        match self {
            Servers::RunDir(dir) => dir.join("marks"),
            Servers::GuestPorts(_) => PathBuf::from("/run/p2plab-ctl/marks"),
        }
    }

    /// The guest's control ports (`/sys/class/virtio-ports/*/name` =
    /// `p2plab.ctl.<id>`).
    pub fn guest_ports() -> Result<Self> {
        let mut ports = Vec::new();
        let entries = std::fs::read_dir("/sys/class/virtio-ports")
            .context("no virtio-serial ports (/sys/class/virtio-ports): is the lab's guest control channel on?")?;
        for entry in entries.flatten() {
            let Ok(name) = std::fs::read_to_string(entry.path().join("name")) else {
                continue;
            };
            if let Some(id) = name.trim().strip_prefix("p2plab.ctl.") {
                ports.push((id.to_owned(), Path::new("/dev").join(entry.file_name())));
            }
        }
        ports.sort();
        if ports.is_empty() {
            bail!("no virtio-serial port named p2plab.ctl.<id>: is the lab's guest control channel on?");
        }
        Ok(Servers::GuestPorts(ports))
    }
}

impl std::fmt::Display for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Servers::RunDir(dir) => write!(f, "run folder {}", dir.display()),
            Servers::GuestPorts(_) => f.write_str("the guest's p2plab.ctl ports"),
        }
    }
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every server's status at one moment, under a name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    /// The name it was taken under (`now` for an unsaved one).
    pub name: String,
    /// When, in milliseconds since the Unix epoch.
    pub taken_unix_ms: u64,
    /// Each server's `status` reply, by id.
    pub servers: BTreeMap<String, Value>,
}

/// Checks a mark name: `[A-Za-z0-9._-]`, 1 to 64 characters, not
/// starting with `.` (so it is a plain file name in the marks folder).
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !ok {
        bail!("mark name {name:?}: use 1 to {MAX_NAME} of A-Z a-z 0-9 . _ - (not starting with .)");
    }
    Ok(())
}

impl Mark {
    /// Takes every server's status now.
    pub fn take(name: &str, servers: &Servers) -> Result<Self> {
        check_name(name)?;
        let servers = servers.statuses()?;
        let taken_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Ok(Mark {
            name: name.to_owned(),
            taken_unix_ms,
            servers,
        })
    }

    /// Writes the mark to `<dir>/<name>.json` (replacing one of that name),
    /// creating `dir` if needed.
    pub fn save(&self, dir: &Path) -> Result<PathBuf> {
        check_name(&self.name)?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{}.json", self.name));
        let tmp = dir.join(format!(".{}.json.tmp", self.name));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Reads mark `name` back from `dir`.
    pub fn load(dir: &Path, name: &str) -> Result<Self> {
        use std::io::Read;
        check_name(name)?;
        let path = dir.join(format!("{name}.json"));
        let file = std::fs::File::open(&path)
            .with_context(|| format!("no mark {name:?} ({})", path.display()))?;
        let mut text = String::new();
        file.take(MAX_MARK_BYTES)
            .read_to_string(&mut text)
            .with_context(|| format!("reading {}", path.display()))?;
        let mark: Mark = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a mark", path.display()))?;
        if mark.name != name {
            bail!("{}: holds mark {:?}", path.display(), mark.name);
        }
        Ok(mark)
    }

    /// A counter of server `id` found by key anywhere in its status (the
    /// NVMe nests its DMA paths under `dma`); `None` if absent.
    pub fn counter(&self, id: &str, key: &str) -> Option<u64> {
        find_u64(self.servers.get(id)?, key)
    }
}

/// A counter found by key anywhere in a status document.
fn find_u64(value: &Value, key: &str) -> Option<u64> {
    match value {
        Value::Object(map) => map
            .get(key)
            .and_then(Value::as_u64)
            .or_else(|| map.values().find_map(|child| find_u64(child, key))),
        _ => None,
    }
}

/// What one GPU's data did between two marks, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceProvenance {
    /// Its server id.
    pub device: String,
    /// Copied by its engine from guest RAM into VRAM (bounced in).
    pub ram_to_device: u64,
    /// Copied by its engine from VRAM to guest RAM (bounced out).
    pub device_to_ram: u64,
    /// Written into VRAM by other devices directly (peer path).
    pub written_by_peers: u64,
    /// Read from VRAM by other devices directly (peer path).
    pub read_by_peers: u64,
    /// Copied by its engine between VRAM and a peer's BAR.
    pub engine_peer_bytes: u64,
}

impl DeviceProvenance {
    /// Bytes that went through guest RAM.
    pub fn bounced(&self) -> u64 {
        self.ram_to_device.saturating_add(self.device_to_ram)
    }

    /// Bytes the device itself saw move peer-to-peer.
    pub fn peer_to_peer(&self) -> u64 {
        self.written_by_peers
            .saturating_add(self.read_by_peers)
            .saturating_add(self.engine_peer_bytes)
    }
}

/// The answer between two marks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Provenance {
    /// The earlier mark.
    pub since: String,
    /// The later mark (`now`: taken for this answer).
    pub until: String,
    /// Milliseconds between them.
    pub elapsed_ms: u64,
    /// Each GPU judged.
    pub devices: Vec<DeviceProvenance>,
    /// Bytes each other server moved to or from fd-less ranges through
    /// QEMU (peer BARs through the root complex; not attributed to a
    /// device).
    pub by_message: BTreeMap<String, u64>,
    /// Bytes each other server moved to or from guest RAM (its own I/O and
    /// queues; context, not judged).
    pub other_ram_dma: BTreeMap<String, u64>,
}

/// The keys a GPU's status has and an NVMe's has not.
const GPU_KEYS: [&str; 4] = [
    "bytes_ram_to_vram",
    "bytes_vram_to_ram",
    "bytes_host_to_vram",
    "bytes_vram_to_host",
];

impl Provenance {
    /// Compares `since` with `until` for `devices` (server ids; empty:
    /// every server whose status has the GPU's RAM counters).
    pub fn between(since: &Mark, until: &Mark, devices: &[String]) -> Result<Self> {
        let judged: Vec<String> = if devices.is_empty() {
            until
                .servers
                .keys()
                .filter(|id| until.counter(id, GPU_KEYS[0]).is_some())
                .cloned()
                .collect()
        } else {
            devices.to_vec()
        };
        if judged.is_empty() {
            bail!(
                "no GPU among the servers of mark {:?} (name one with --device)",
                until.name
            );
        }
        let delta = |id: &str, key: &str, required: bool| -> Result<u64> {
            let (Some(a), Some(b)) = (since.counter(id, key), until.counter(id, key)) else {
                if required {
                    bail!(
                        "{id}: no counter {key} in both marks {:?} and {:?} (is {id} a GPU, and in both?)",
                        since.name,
                        until.name
                    );
                }
                return Ok(0);
            };
            b.checked_sub(a).with_context(|| {
                format!(
                    "{id}: {key} went back from {a} to {b}: the server restarted between the marks"
                )
            })
        };
        for id in since
            .servers
            .keys()
            .filter(|id| until.servers.contains_key(*id))
        {
            let (a, b) = (since.counter(id, "pid"), until.counter(id, "pid"));
            if a.is_some() && b.is_some() && a != b {
                bail!(
                    "{id}: pid {} at mark {:?}, {} at mark {:?}: the server restarted between the marks",
                    a.unwrap_or(0),
                    since.name,
                    b.unwrap_or(0),
                    until.name
                );
            }
        }
        let mut out = Provenance {
            since: since.name.clone(),
            until: until.name.clone(),
            elapsed_ms: until.taken_unix_ms.saturating_sub(since.taken_unix_ms),
            ..Provenance::default()
        };
        for id in &judged {
            let [ram_in, ram_out, host_in, host_out] = [
                delta(id, GPU_KEYS[0], true)?,
                delta(id, GPU_KEYS[1], true)?,
                delta(id, GPU_KEYS[2], true)?,
                delta(id, GPU_KEYS[3], true)?,
            ];
            out.devices.push(DeviceProvenance {
                device: id.clone(),
                ram_to_device: ram_in,
                device_to_ram: ram_out,
                written_by_peers: delta(id, "peer_inbound_write_bytes", false)?,
                read_by_peers: delta(id, "peer_inbound_read_bytes", false)?,
                engine_peer_bytes: host_in
                    .saturating_sub(ram_in)
                    .saturating_add(host_out.saturating_sub(ram_out)),
            });
        }
        for id in until.servers.keys().filter(|id| !judged.contains(id)) {
            if !since.servers.contains_key(id) {
                continue;
            }
            let message = delta(id, "dma_message_read_bytes", false)?.saturating_add(delta(
                id,
                "dma_message_write_bytes",
                false,
            )?);
            let ram = delta(id, "dma_mmap_read_bytes", false)?.saturating_add(delta(
                id,
                "dma_mmap_write_bytes",
                false,
            )?);
            out.by_message.insert(id.clone(), message);
            out.other_ram_dma.insert(id.clone(), ram);
        }
        Ok(out)
    }

    /// Bytes of the judged devices that went through guest RAM.
    pub fn bounced(&self) -> u64 {
        self.devices
            .iter()
            .fold(0u64, |sum, d| sum.saturating_add(d.bounced()))
    }

    /// Bytes that moved peer-to-peer: seen by the judged devices, plus
    /// every other server's message bytes (peer BARs through QEMU).
    pub fn peer_to_peer(&self) -> u64 {
        let seen = self
            .devices
            .iter()
            .fold(0u64, |sum, d| sum.saturating_add(d.peer_to_peer()));
        self.by_message
            .values()
            .fold(seen, |sum, b| sum.saturating_add(*b))
    }

    /// Why the verdict fails, if it does: any byte bounced, or fewer than
    /// `min_p2p` bytes moved peer-to-peer.
    pub fn failure(&self, min_p2p: u64) -> Option<String> {
        if self.bounced() > 0 {
            let who: Vec<String> = self
                .devices
                .iter()
                .filter(|d| d.bounced() > 0)
                .map(|d| format!("{} {}", d.device, bytes(d.bounced())))
                .collect();
            return Some(format!(
                "{} of the transfers to or from the GPU went through guest RAM ({})",
                bytes(self.bounced()),
                who.join(", ")
            ));
        }
        if self.peer_to_peer() < min_p2p {
            return Some(format!(
                "only {} moved peer-to-peer, {} expected",
                bytes(self.peer_to_peer()),
                bytes(min_p2p)
            ));
        }
        None
    }

    /// The answer in words, one fact a line, the verdict last.
    pub fn report(&self, min_p2p: u64) -> String {
        let mut text = format!(
            "provenance between mark {:?} and {:?} ({} ms):\n",
            self.since, self.until, self.elapsed_ms
        );
        for d in &self.devices {
            text.push_str(&format!(
                "  {}: through guest RAM {} (RAM -> VRAM {}, VRAM -> RAM {}, by its engine); \
                 peer-to-peer {} (written by peers {}, read by peers {}, its engine <-> peer BARs {})\n",
                d.device,
                bytes(d.bounced()),
                bytes(d.ram_to_device),
                bytes(d.device_to_ram),
                bytes(d.peer_to_peer()),
                bytes(d.written_by_peers),
                bytes(d.read_by_peers),
                bytes(d.engine_peer_bytes),
            ));
        }
        let list = |map: &BTreeMap<String, u64>| -> String {
            let items: Vec<String> = map
                .iter()
                .map(|(id, b)| format!("{id} {}", bytes(*b)))
                .collect();
            if items.is_empty() {
                "none".to_owned()
            } else {
                items.join(", ")
            }
        };
        text.push_str(&format!(
            "  by message through QEMU (peer BARs, device not known): {}\n",
            list(&self.by_message)
        ));
        text.push_str(&format!(
            "  guest RAM DMA of the other devices (their own I/O, not judged): {}\n",
            list(&self.other_ram_dma)
        ));
        match self.failure(min_p2p) {
            Some(why) => text.push_str(&format!("FAIL: {why}\n")),
            None => text.push_str(&format!(
                "PASS: no byte went through guest RAM; {} peer-to-peer\n",
                bytes(self.peer_to_peer())
            )),
        }
        text
    }
}

/// `16777216` → `16777216 B (16.0 MiB)`; small counts stay plain.
fn bytes(n: u64) -> String {
    if n < 1024 {
        return format!("{n} B");
    }
    let units = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{n} B ({value:.1} {})", units[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpu(ram_in: u64, ram_out: u64, host_in: u64, host_out: u64, peer_w: u64, pid: u64) -> Value {
        json!({
            "bytes_ram_to_vram": ram_in,
            "bytes_vram_to_ram": ram_out,
            "bytes_host_to_vram": host_in,
            "bytes_vram_to_host": host_out,
            "peer_inbound_write_bytes": peer_w,
            "peer_inbound_read_bytes": 0,
            "dma_mmap_read_bytes": 999_999,
            "process": {"pid": pid},
        })
    }

    fn nvme(message: u64, mmap: u64) -> Value {
        json!({
            "dma": {"dma_message_write_bytes": message, "dma_message_read_bytes": 0,
                    "dma_mmap_write_bytes": mmap, "dma_mmap_read_bytes": 0},
            "process": {"pid": 7},
        })
    }

    fn mark(name: &str, at: u64, servers: &[(&str, Value)]) -> Mark {
        Mark {
            name: name.into(),
            taken_unix_ms: at,
            servers: servers
                .iter()
                .map(|(id, v)| ((*id).to_owned(), v.clone()))
                .collect(),
        }
    }

    /// Catches: a verdict that passes a bounce (the GPU engine copied
    /// between RAM and VRAM), that fails real P2P (peers writing VRAM, the
    /// engine copying to a peer BAR, message bytes through QEMU), that
    /// counts the GPU's ring and completion DMA (dma_mmap_*) as a bounce,
    /// or that passes when nothing moved peer-to-peer though some was
    /// expected.
    #[test]
    fn bounces_fail_and_peer_to_peer_passes() {
        let a = mark(
            "a",
            1000,
            &[("gpu0", gpu(0, 0, 0, 0, 0, 5)), ("nvme0", nvme(0, 0))],
        );
        let p2p = mark(
            "p2p",
            1500,
            &[
                ("gpu0", gpu(0, 0, 4096, 0, 1 << 20, 5)),
                ("nvme0", nvme(8192, 1 << 20)),
            ],
        );
        let answer = Provenance::between(&a, &p2p, &[]).unwrap();
        assert_eq!(answer.devices.len(), 1, "the GPU found by its counters");
        let d = &answer.devices[0];
        assert_eq!(
            (d.written_by_peers, d.engine_peer_bytes, d.bounced()),
            (1 << 20, 4096, 0)
        );
        assert_eq!(answer.by_message["nvme0"], 8192);
        assert_eq!(answer.other_ram_dma["nvme0"], 1 << 20);
        assert_eq!(answer.peer_to_peer(), (1 << 20) + 4096 + 8192);
        assert_eq!(answer.failure(0), None);
        assert_eq!(answer.failure((1 << 20) + 4096 + 8192), None);
        assert!(answer.failure((1 << 20) + 4096 + 8193).is_some());
        assert!(answer.report(0).contains("PASS"), "{}", answer.report(0));
        assert_eq!(answer.elapsed_ms, 500);

        let bounce = mark(
            "bounce",
            2000,
            &[
                ("gpu0", gpu(100, 3, 4196, 3, 1 << 20, 5)),
                ("nvme0", nvme(8192, 1 << 20)),
            ],
        );
        let answer = Provenance::between(&p2p, &bounce, &["gpu0".into()]).unwrap();
        assert_eq!(answer.bounced(), 103);
        assert_eq!(answer.devices[0].engine_peer_bytes, 0);
        let why = answer.failure(0).unwrap();
        assert!(why.contains("103 B") && why.contains("gpu0"), "{why}");
        assert!(answer.report(0).contains("FAIL"));
        let nothing = Provenance::between(&bounce, &bounce, &[]).unwrap();
        assert_eq!(nothing.failure(0), None);
        assert!(nothing.failure(1).unwrap().contains("only 0 B"));
    }

    /// Catches: an answer given across a server restart (counters start
    /// over, so deltas would be garbage or negative), or for a device that
    /// is no GPU or is missing from a mark.
    #[test]
    fn restarts_and_missing_devices_are_errors_not_verdicts() {
        let a = mark("a", 0, &[("gpu0", gpu(50, 0, 50, 0, 0, 5))]);
        let went_back = mark("b", 1, &[("gpu0", gpu(10, 0, 10, 0, 0, 5))]);
        let err = Provenance::between(&a, &went_back, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("restarted"), "{err}");
        let new_pid = mark("c", 1, &[("gpu0", gpu(60, 0, 60, 0, 0, 6))]);
        let err = Provenance::between(&a, &new_pid, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("pid 5") && err.contains("restarted"), "{err}");
        let only_nvme = mark("d", 0, &[("nvme0", nvme(0, 0))]);
        assert!(Provenance::between(&only_nvme, &only_nvme, &[]).is_err());
        assert!(Provenance::between(&only_nvme, &only_nvme, &["nvme0".into()]).is_err());
        assert!(Provenance::between(&a, &a, &["gpu1".into()]).is_err());
    }

    /// Catches: mark names that escape the marks folder or hide as dot
    /// files, and marks that do not read back as they were saved.
    #[test]
    fn marks_round_trip_under_safe_names_only() {
        for bad in ["", "../x", "a/b", ".hidden", "x y", &"n".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let dir = std::env::temp_dir().join(format!("p2plab-marks-{}", std::process::id()));
        let m = mark("before-1.a_b", 42, &[("gpu0", gpu(1, 2, 3, 4, 5, 6))]);
        let path = m.save(&dir).unwrap();
        assert_eq!(path, dir.join("before-1.a_b.json"));
        assert_eq!(Mark::load(&dir, "before-1.a_b").unwrap(), m);
        assert!(Mark::load(&dir, "missing").is_err());
        std::fs::write(dir.join("junk.json"), "{").unwrap();
        assert!(Mark::load(&dir, "junk").is_err());
        let other = mark("other", 1, &[]);
        std::fs::write(
            dir.join("renamed.json"),
            serde_json::to_vec(&other).unwrap(),
        )
        .unwrap();
        assert!(
            Mark::load(&dir, "renamed").is_err(),
            "a file holding another mark"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
