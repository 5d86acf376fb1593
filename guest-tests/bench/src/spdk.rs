//! SPDK as a second anchor (`--anchor spdk=DIR`): the user's own SPDK
//! build (the project neither vendors nor downloads it) serves an NVMe
//! controller over vfio-user (`nvmf_tgt`, the VFIOUSER transport) from an
//! aio bdev over a file of the same size as p2plab-nvme's namespace; the
//! bench attaches it to the guest with QEMU's `vfio-user-pci`, as it does
//! p2plab-nvme, and runs the same jobs in the same rounds.
//!
//! SPDK's aio bdev opens its file with O_DIRECT, so it compares only with
//! `--caching direct` (p2plab-nvme O_DIRECT, QEMU's nvme `cache=none`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::hostcpu::rpc_call;
use anyhow::{bail, Context, Result};

/// The oldest SPDK whose nvmf_tgt has the VFIOUSER transport with the RPCs
/// the bench uses (`framework_get_reactors`' tick_rate included).
const MIN_VERSION: (u32, u32) = (22, 1);

/// The subsystem the bench creates in nvmf_tgt.
const NQN: &str = "nqn.2019-07.io.spdk:p2plab-bench";

/// An SPDK build folder, checked.
#[derive(Clone, Debug)]
pub struct SpdkBuild {
    pub dir: PathBuf,
    pub nvmf_tgt: PathBuf,
    pub rpc_py: PathBuf,
    /// `major.minor` from include/spdk/version.h.
    pub version: String,
}

/// Checks that `dir` is an SPDK source tree built with vfio-user: its
/// `build/bin/nvmf_tgt`, `scripts/rpc.py`, a version new enough and
/// `CONFIG_VFIO_USER` in its build configuration.
pub fn check_build(dir: &Path) -> Result<SpdkBuild> {
    let hint = "build SPDK with `./configure --with-vfio-user && make` \
                (docs/user-guide/benchmarks.md, \"Building SPDK\")";
    if !dir.is_dir() {
        bail!("--anchor spdk={}: no such folder", dir.display());
    }
    let dir = dir
        .canonicalize()
        .with_context(|| format!("--anchor spdk={}", dir.display()))?;
    let nvmf_tgt = dir.join("build/bin/nvmf_tgt");
    if !is_executable(&nvmf_tgt) {
        bail!(
            "--anchor spdk={}: no executable build/bin/nvmf_tgt; {hint}",
            dir.display()
        );
    }
    let rpc_py = dir.join("scripts/rpc.py");
    if !rpc_py.is_file() {
        bail!(
            "--anchor spdk={}: no scripts/rpc.py (an SPDK source tree, not an install, is needed)",
            dir.display()
        );
    }
    let header = dir.join("include/spdk/version.h");
    let text = std::fs::read_to_string(&header).with_context(|| {
        format!(
            "--anchor spdk={}: reading {} (is this SPDK?)",
            dir.display(),
            header.display()
        )
    })?;
    let (major, minor) = parse_version(&text)
        .with_context(|| format!("{}: no SPDK_VERSION_MAJOR/MINOR", header.display()))?;
    if (major, minor) < MIN_VERSION {
        bail!(
            "--anchor spdk={}: SPDK {major}.{minor:02} is too old; the bench needs {}.{:02} or newer \
             (nvmf_tgt's VFIOUSER transport)",
            dir.display(),
            MIN_VERSION.0,
            MIN_VERSION.1
        );
    }
    let config = dir.join("mk/config.mk");
    let config_text = std::fs::read_to_string(&config).with_context(|| {
        format!(
            "--anchor spdk={}: reading {}",
            dir.display(),
            config.display()
        )
    })?;
    if !has_vfio_user(&config_text) {
        bail!(
            "--anchor spdk={}: built without vfio-user (mk/config.mk has no CONFIG_VFIO_USER=y); {hint}",
            dir.display()
        );
    }
    Ok(SpdkBuild {
        dir,
        nvmf_tgt,
        rpc_py,
        version: format!("{major}.{minor:02}"),
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// (major, minor) of SPDK's include/spdk/version.h.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let define = |name: &str| {
        text.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == "#define" && words.next()? == name)
                .then(|| words.next()?.parse::<u32>().ok())
                .flatten()
        })
    };
    Some((define("SPDK_VERSION_MAJOR")?, define("SPDK_VERSION_MINOR")?))
}

/// Whether mk/config.mk turns vfio-user on (`CONFIG_VFIO_USER?=y`).
fn has_vfio_user(config: &str) -> bool {
    config.lines().any(|l| {
        let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        l == "CONFIG_VFIO_USER?=y" || l == "CONFIG_VFIO_USER=y"
    })
}

/// A running nvmf_tgt serving one vfio-user NVMe controller.
pub struct Target {
    child: Child,
    pub pid: u32,
    /// Its JSON-RPC socket.
    pub rpc: PathBuf,
    /// The controller's vfio-user socket, for QEMU's `vfio-user-pci`.
    pub controller: PathBuf,
    log: PathBuf,
}

/// What a target serves.
pub struct TargetSpec<'a> {
    pub build: &'a SpdkBuild,
    /// A fresh folder for its sockets and log.
    pub folder: &'a Path,
    /// The namespace's backing file (created sparse like the others when
    /// missing) and its size.
    pub disk: &'a Path,
    pub disk_size: u64,
    /// nvmf_tgt's reactor core mask (`-m`).
    pub core_mask: &'a str,
}

impl Target {
    /// Starts nvmf_tgt and configures it through `scripts/rpc.py`: the
    /// VFIOUSER transport, an aio bdev over the disk, a subsystem with
    /// that namespace, and a listener whose socket QEMU attaches.
    pub fn start(spec: &TargetSpec) -> Result<Target> {
        std::fs::create_dir_all(spec.folder)
            .with_context(|| format!("creating {}", spec.folder.display()))?;
        ensure_disk(spec.disk, spec.disk_size)?;
        let rpc = spec.folder.join("spdk.sock");
        let listen = spec.folder.join("nvme0");
        std::fs::create_dir_all(&listen)
            .with_context(|| format!("creating {}", listen.display()))?;
        let log = spec.folder.join("nvmf_tgt.log");
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        // Without hugepages: the guest's RAM reaches nvmf_tgt as the memfd
        // QEMU shares (the topology's memory-backend-memfd,share=on), which
        // it maps itself; its own buffers need no more than ordinary memory.
        // --no-pci: it serves a file, and must not probe the host's PCI
        // devices. A shared-library build (`--with-shared`, or a packaged
        // DPDK) finds its libraries under build/.
        let lib_path = [
            spec.build.dir.join("build/lib"),
            spec.build.dir.join("build/libvfio-user/usr/local/lib"),
        ]
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
        let child = Command::new(&spec.build.nvmf_tgt)
            .args([
                "-m",
                spec.core_mask,
                "--no-huge",
                "-s",
                "1024",
                "--no-pci",
                "-r",
            ])
            .arg(&rpc)
            .env("LD_LIBRARY_PATH", lib_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", spec.build.nvmf_tgt.display()))?;
        let pid = child.id();
        let mut target = Target {
            child,
            pid,
            rpc,
            controller: listen.join("cntrl"),
            log,
        };
        target.wait_for_rpc()?;
        let disk = spec.disk.to_string_lossy();
        let listen = listen.to_string_lossy();
        let steps: [&[&str]; 5] = [
            &["nvmf_create_transport", "-t", "VFIOUSER"],
            &["bdev_aio_create", &disk, "aio0", "512"],
            &[
                "nvmf_create_subsystem",
                NQN,
                "-a",
                "-s",
                "SPDK00000000000001",
            ],
            &["nvmf_subsystem_add_ns", NQN, "aio0"],
            &[
                "nvmf_subsystem_add_listener",
                NQN,
                "-t",
                "VFIOUSER",
                "-a",
                &listen,
                "-s",
                "0",
            ],
        ];
        for step in steps {
            target.rpc_py(spec.build, step)?;
        }
        target.wait_for(|t| Ok(t.controller.exists()), "the controller socket")?;
        Ok(target)
    }

    /// The tail of nvmf_tgt's log, for error messages.
    fn log_tail(&self) -> String {
        p2plab_lab::lab::tail(&self.log, 20)
    }

    /// An error if nvmf_tgt has exited, with its status and log.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "SPDK's nvmf_tgt exited ({status}); its log {}:\n{}",
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    fn wait_for(&mut self, ready: impl Fn(&Self) -> Result<bool>, what: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.check_alive()?;
            if ready(self)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "SPDK's nvmf_tgt gave no {what} within 60 s; its log {}:\n{}",
                    self.log.display(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_for_rpc(&mut self) -> Result<()> {
        self.wait_for(
            |t| Ok(rpc_call(&t.rpc, "spdk_get_version", None).is_ok()),
            "RPC socket",
        )
    }

    /// One `scripts/rpc.py -s SOCKET ARGS...` call; an error names the call.
    fn rpc_py(&mut self, build: &SpdkBuild, args: &[&str]) -> Result<()> {
        let out = Command::new(&build.rpc_py)
            .arg("-s")
            .arg(&self.rpc)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", build.rpc_py.display()))?;
        if !out.status.success() {
            self.check_alive()?;
            bail!(
                "SPDK's rpc.py {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            );
        }
        Ok(())
    }

    /// Stops nvmf_tgt (SIGTERM, then SIGKILL after 10 s).
    pub fn stop(mut self) -> Result<()> {
        self.check_alive()?;
        p2plab_lab::process::signal_pid(self.pid, 15);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A sparse file of `size` bytes at `path` unless one is there (like the
/// lab's `#@disk` files); one of another size is an error.
fn ensure_disk(path: &Path, size: u64) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() == size => Ok(()),
        Ok(m) => bail!(
            "{} has {} bytes, not the {size} of p2plab-nvme's namespace; remove it",
            path.display(),
            m.len()
        ),
        Err(_) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            file.set_len(size)
                .with_context(|| format!("sizing {}", path.display()))
        }
    }
}

/// QEMU's argument that attaches the target's controller as `nvme0` on
/// port `bus`, the way the topologies attach p2plab-nvme.
pub fn device_arg(controller: &Path, bus: &str) -> String {
    serde_json::json!({
        "driver": "vfio-user-pci",
        "id": "nvme0",
        "bus": bus,
        "socket": {"type": "unix", "path": controller.to_string_lossy()},
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Catches: a version read from the wrong define (the *_STRING ones
    /// follow) or a header without one taken for a version.
    #[test]
    fn version_comes_from_the_header_defines() {
        let h = "#define SPDK_VERSION_MAJOR\t26\n#define SPDK_VERSION_MINOR\t9\n\
                 #define SPDK_VERSION_MAJOR_STRING SPDK_VERSION_STRINGIFY(SPDK_VERSION_MAJOR)\n";
        assert_eq!(parse_version(h), Some((26, 9)));
        assert_eq!(parse_version("#define SPDK_VERSION_MAJOR 26\n"), None);
        assert!((21, 10) < MIN_VERSION && (26, 9) >= MIN_VERSION);
    }

    /// Catches: a build without vfio-user taken for one with it.
    #[test]
    fn vfio_user_is_read_from_config_mk() {
        assert!(has_vfio_user(
            "# x\nCONFIG_VFIO_USER?=y\nCONFIG_VFIO_USER_DIR?=\n"
        ));
        assert!(!has_vfio_user(
            "CONFIG_VFIO_USER?=n\nCONFIG_VFIO_USER_DIR?=y\n"
        ));
    }

    /// Catches: a folder without nvmf_tgt, rpc.py or vfio-user accepted,
    /// each error naming what is missing.
    #[test]
    fn a_folder_that_is_not_a_vfio_user_build_is_refused() {
        let dir = std::env::temp_dir().join(format!("p2plab-spdk-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let err = |d: &Path| format!("{:#}", check_build(d).unwrap_err());
        assert!(err(&dir.join("none")).contains("no such folder"));
        std::fs::create_dir_all(dir.join("build/bin")).unwrap();
        assert!(err(&dir).contains("build/bin/nvmf_tgt"));
        let tgt = dir.join("build/bin/nvmf_tgt");
        std::fs::write(&tgt, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tgt, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(err(&dir).contains("scripts/rpc.py"));
        std::fs::create_dir_all(dir.join("scripts")).unwrap();
        std::fs::write(dir.join("scripts/rpc.py"), "").unwrap();
        std::fs::create_dir_all(dir.join("include/spdk")).unwrap();
        std::fs::write(
            dir.join("include/spdk/version.h"),
            "#define SPDK_VERSION_MAJOR 21\n#define SPDK_VERSION_MINOR 10\n",
        )
        .unwrap();
        assert!(err(&dir).contains("too old"));
        std::fs::write(
            dir.join("include/spdk/version.h"),
            "#define SPDK_VERSION_MAJOR 26\n#define SPDK_VERSION_MINOR 9\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("mk")).unwrap();
        std::fs::write(dir.join("mk/config.mk"), "CONFIG_VFIO_USER?=n\n").unwrap();
        assert!(err(&dir).contains("without vfio-user"));
        std::fs::write(dir.join("mk/config.mk"), "CONFIG_VFIO_USER?=y\n").unwrap();
        let build = check_build(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(build.version, "26.09");
    }

    /// Catches: the device attached under another id or port, or a
    /// socket path that is not the controller's.
    #[test]
    fn device_arg_attaches_the_controller_as_nvme0() {
        let arg = device_arg(Path::new("/r/spdk/nvme0/cntrl"), "dn0");
        let v: Value = serde_json::from_str(&arg).unwrap();
        assert_eq!(v["driver"], "vfio-user-pci");
        assert_eq!(v["id"], "nvme0");
        assert_eq!(v["bus"], "dn0");
        assert_eq!(v["socket"]["path"], "/r/spdk/nvme0/cntrl");
    }
}
