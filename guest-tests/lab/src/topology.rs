//! Topology files: QEMU arguments a user can also pass by hand, plus the
//! device servers the lab must start before QEMU.
//!
//! Format, one item per line:
//! - `-option value`: a QEMU option and its value, split at the first run of
//!   blanks (the value itself never contains blanks, so the file also works
//!   as `qemu-system-x86_64 $(grep -v '^#' FILE | sed s,@RUN@,DIR,g)`).
//! - `#@server ID BINARY ARGS...`: a vfio-user server to start; the lab adds
//!   `--socket @RUN@/ID.sock --log-file @RUN@/ID.log --stats-file
//!   @RUN@/ID.stats.json`.
//! - `#@disk PATH SIZE`: a backing file QEMU opens itself; the lab creates it
//!   sparse with SIZE (`1G`, `512M`) when it is missing.
//! - `#` comments and blank lines are ignored.
//!
//! Placeholders: `@RUN@` is the run folder, `@STATE@` the folder for state
//! kept across boots (namespace backing files).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// One device server process the topology needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The device id; also the QEMU `-device` id and the socket name.
    pub id: String,
    /// The server binary's file name (`p2plab-nvme`, `p2plab-gpu`).
    pub binary: String,
    pub args: Vec<String>,
}

/// A file QEMU needs to exist before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub name: String,
    pub qemu_args: Vec<String>,
    pub servers: Vec<ServerSpec>,
    pub disks: Vec<DiskSpec>,
}

/// `1G`, `512M`, `4096K` or plain bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' | b'k' => (&text[..text.len() - 1], 10),
        b'M' | b'm' => (&text[..text.len() - 1], 20),
        b'G' | b'g' => (&text[..text.len() - 1], 30),
        b'T' | b't' => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// Values for the placeholders.
#[derive(Debug, Clone)]
pub struct Placeholders {
    pub run: PathBuf,
    pub state: PathBuf,
}

impl Placeholders {
    fn expand(&self, text: &str) -> String {
        text.replace("@RUN@", &self.run.to_string_lossy())
            .replace("@STATE@", &self.state.to_string_lossy())
    }
}

impl Topology {
    pub fn load(path: &Path, vars: &Placeholders) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading topology {}", path.display()))?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self::parse(&name, &text, vars).with_context(|| format!("in {}", path.display()))
    }

    pub fn parse(name: &str, text: &str, vars: &Placeholders) -> Result<Self> {
        let mut qemu_args = Vec::new();
        let mut servers: Vec<ServerSpec> = Vec::new();
        let mut disks = Vec::new();
        for (number, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let lineno = number + 1;
            if let Some(directive) = line.strip_prefix("#@server") {
                let mut words = directive.split_whitespace();
                let (Some(id), Some(binary)) = (words.next(), words.next()) else {
                    bail!("line {lineno}: `#@server` needs an id and a binary");
                };
                if servers.iter().any(|s| s.id == id) {
                    bail!("line {lineno}: server id {id:?} appears twice");
                }
                if !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    bail!("line {lineno}: server id {id:?} must be alphanumeric");
                }
                servers.push(ServerSpec {
                    id: id.to_owned(),
                    binary: binary.to_owned(),
                    args: words.map(|w| vars.expand(w)).collect(),
                });
                continue;
            }
            if let Some(directive) = line.strip_prefix("#@disk") {
                let words: Vec<&str> = directive.split_whitespace().collect();
                let [path, size] = words[..] else {
                    bail!("line {lineno}: `#@disk` needs a path and a size");
                };
                let Some(size) = parse_size(size) else {
                    bail!("line {lineno}: bad disk size {size:?}");
                };
                disks.push(DiskSpec {
                    path: PathBuf::from(vars.expand(path)),
                    size,
                });
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !line.starts_with('-') {
                bail!("line {lineno}: expected a QEMU option starting with '-', got {line:?}");
            }
            match line.split_once(char::is_whitespace) {
                Some((option, value)) => {
                    qemu_args.push(option.to_owned());
                    qemu_args.push(vars.expand(value.trim()));
                }
                None => qemu_args.push(line.to_owned()),
            }
        }
        let topology = Self {
            name: name.to_owned(),
            qemu_args,
            servers,
            disks,
        };
        topology.check_sockets(vars)?;
        Ok(topology)
    }

    /// Every server's socket must be referenced by a QEMU device, and every
    /// vfio-user device must have a server: a mismatch would hang QEMU.
    fn check_sockets(&self, vars: &Placeholders) -> Result<()> {
        let joined = self.qemu_args.join(" ");
        for server in &self.servers {
            let socket = vars.run.join(format!("{}.sock", server.id));
            if !joined.contains(&*socket.to_string_lossy()) {
                bail!(
                    "server {:?} has no vfio-user-pci device using @RUN@/{}.sock",
                    server.id,
                    server.id
                );
            }
        }
        let devices = joined.matches("\"vfio-user-pci\"").count();
        if devices != self.servers.len() {
            bail!(
                "{} vfio-user-pci devices but {} #@server lines",
                devices,
                self.servers.len()
            );
        }
        Ok(())
    }

    pub fn server_mut(&mut self, id: &str) -> Option<&mut ServerSpec> {
        self.servers.iter_mut().find(|s| s.id == id)
    }

    pub fn server(&self, id: &str) -> Option<&ServerSpec> {
        self.servers.iter().find(|s| s.id == id)
    }

    /// The JSON `-device` value whose `"id"` is `id`: what QMP `device_add`
    /// takes to plug that device again.
    pub fn device_json(&self, id: &str) -> Result<serde_json::Value> {
        let mut args = self.qemu_args.iter();
        while let Some(arg) = args.next() {
            if arg != "-device" {
                continue;
            }
            let Some(value) = args.next() else { break };
            if !value.starts_with('{') {
                continue;
            }
            let device: serde_json::Value = serde_json::from_str(value)
                .with_context(|| format!("-device {value}: not valid JSON"))?;
            if device["id"] == id {
                return Ok(device);
            }
        }
        bail!(
            "topology {} has no JSON -device with id {id:?} (device_add needs the JSON form)",
            self.name
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Placeholders {
        Placeholders {
            run: PathBuf::from("/r"),
            state: PathBuf::from("/s"),
        }
    }

    #[test]
    fn finds_a_device_json_by_id() {
        let text = "#@server nvme0 p2plab-nvme\n-device pcie-root-port,id=rp0\n\
                    -device {\"driver\":\"vfio-user-pci\",\"id\":\"nvme0\",\"bus\":\"dn0\",\"socket\":{\"type\":\"unix\",\"path\":\"@RUN@/nvme0.sock\"}}\n";
        let t = Topology::parse("lab", text, &vars()).unwrap();
        let device = t.device_json("nvme0").unwrap();
        assert_eq!(device["bus"], "dn0");
        assert_eq!(device["socket"]["path"], "/r/nvme0.sock");
        let err = t.device_json("rp0").unwrap_err().to_string();
        assert!(err.contains("JSON form"), "{err}");
    }

    #[test]
    fn parses_options_servers_and_placeholders() {
        let text = "# lab\n#@server nvme0 p2plab-nvme --namespace file=@STATE@/a.img\n\n\
                    -machine q35\n-nographic\n\
                    -device {\"driver\":\"vfio-user-pci\",\"id\":\"nvme0\",\"socket\":{\"type\":\"unix\",\"path\":\"@RUN@/nvme0.sock\"}}\n";
        let t = Topology::parse("lab", text, &vars()).unwrap();
        assert_eq!(t.qemu_args[0..3], ["-machine", "q35", "-nographic"]);
        assert!(t.qemu_args[4].contains("\"path\":\"/r/nvme0.sock\""));
        assert_eq!(t.servers.len(), 1);
        assert_eq!(t.servers[0].args, ["--namespace", "file=/s/a.img"]);
    }

    #[test]
    fn disk_directive_and_sizes() {
        let t = Topology::parse("a", "#@disk @STATE@/d.img 1G\n-m 1G\n", &vars()).unwrap();
        assert_eq!(
            t.disks,
            [DiskSpec {
                path: "/s/d.img".into(),
                size: 1 << 30
            }]
        );
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("12"), Some(12));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999T"), None);
        assert!(Topology::parse("a", "#@disk /x\n", &vars()).is_err());
    }

    #[test]
    fn refuses_server_without_device() {
        let err = Topology::parse("x", "#@server gpu0 p2plab-gpu\n-m 1G\n", &vars()).unwrap_err();
        assert!(format!("{err:#}").contains("gpu0"), "{err:#}");
    }

    #[test]
    fn refuses_device_without_server_and_junk_lines() {
        let dev = "-device {\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"@RUN@/x.sock\"}}\n";
        assert!(Topology::parse("x", dev, &vars()).is_err());
        let err = Topology::parse("x", "machine q35\n", &vars()).unwrap_err();
        assert!(format!("{err:#}").contains("line 1"));
    }

    #[test]
    fn every_shipped_topology_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../qemu-configs");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "args") {
                let t = Topology::load(&path, &vars()).unwrap();
                assert!(
                    t.qemu_args.contains(&"-machine".to_owned()),
                    "{}",
                    path.display()
                );
                seen += 1;
            }
        }
        assert!(
            seen >= 2,
            "expected the default and separate-root-ports topologies"
        );
    }
}
