//! One lab run: device servers, QEMU and the guest, from start to clean-up.

use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use crate::accel::{
    self, Accel, AccelChoice, AccelRequest, HostCpu, Requested, SplitArgs, Timeout,
};
use crate::console::{ExecLine, ExecTracker, LogFollower};
use crate::guest_script::{self, GuestScript};
use crate::kernel_log::{self, KernelLogCheck};
use crate::paths::LabPaths;
use crate::process::{LabProcess, Lifetime};
use crate::setup;
use crate::topology::{Placeholders, Topology};

/// Kernel command line every boot gets; user extras follow it.
///
/// `pci=no_e820`: with the AMD-vendor `-cpu max`, QEMU reserves the
/// HyperTransport hole (0xfd00000000-0xffffffffff) in the e820 map, and the
/// firmware puts the 64-bit PCI window inside it. Linux keeps the firmware's
/// assignments at boot but clips new ones against e820, so a device
/// re-plugged with `device_add` would get no 64-bit BAR (no CMB, no VRAM:
/// "BAR 2 ...: can't assign; no space"). See README "Hot unplug".
///
/// `log_buf_len=1M`: the clean-boot check reads the whole kernel log at the
/// end of a run; Debian's 128 KiB ring would drop the oldest records of a
/// long one (a full nvme suite run logs about 45 KiB).
pub const BASE_CMDLINE: &str =
    "console=ttyS0 quiet loglevel=4 panic=-1 rdinit=/init pci=no_e820 log_buf_len=1M";

/// The guest's `/run/p2plab/exec.sh`: the command (`script.sh`), then a
/// copy of the kernel log for the clean-boot check.
const EXEC_WRAPPER: &str = include_str!("../guest/exec.sh");

/// Files of the run folder's `guest/` that the launcher and the guest init
/// write themselves: a guest file may not take their names.
const RESERVED_GUEST_FILES: &[&str] = &[
    "script.sh",
    "exec.sh",
    "output.txt",
    "kmsg.txt",
    "exit-status",
];

/// How long a guest may take from QEMU's start to its command's first
/// line, as a TCG budget ([`LabOptions::boot_timeout`] overrides it). A
/// boot takes 4 to 10 s under TCG on a 2-core machine and under a minute
/// at ten times its load, so this fails a guest that hung in its kernel
/// (seen once: both vCPUs spinning with interrupts off before `/init`,
/// silent) in minutes, not after the whole run's timeout.
pub const BOOT_BUDGET: Duration = Duration::from_secs(180);

/// The file of the run folder that gets the vCPUs' state when a guest
/// timed out.
pub const VCPU_DUMP: &str = "vcpus-at-timeout.txt";

/// Exit status of the launcher when the lab itself failed (not the guest
/// command): the same convention as `docker run`.
pub const LAB_FAILURE: i32 = 125;

/// What a run should do once the guest is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The guest console on this terminal.
    Interactive,
    /// Run a shell command line in the guest and return its exit status.
    Exec(String),
    /// Boot, optionally run a command, and leave everything running.
    Keep(Option<String>),
}

/// Which device servers the guest may drive through a control channel of
/// its own (`run-vm --guest-control`): a virtio-serial port
/// `p2plab.ctl.<id>` per device, wired by QEMU to that server's guest
/// control socket (`<id>.guest.ctl`, the server's `--guest-control-socket`),
/// where the guest may ask for status, inject, clear and trace but not
/// reset (the server's rules: docs/reference/security.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GuestControl {
    /// No channel: the guest reaches no server's control socket.
    #[default]
    Off,
    /// Every device server of the topology.
    All,
    /// These device ids.
    Devices(Vec<String>),
}

impl std::str::FromStr for GuestControl {
    type Err = String;

    /// `all`, `off`, or device ids separated by commas (`nvme0,gpu0`).
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "all" => return Ok(Self::All),
            "off" | "none" => return Ok(Self::Off),
            _ => {}
        }
        let ids: Vec<String> = text.split(',').map(str::to_owned).collect();
        for id in &ids {
            let plain = !id.is_empty()
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !plain {
                return Err(format!(
                    "{text:?}: expected all, off, or device ids like nvme0,gpu0"
                ));
            }
        }
        Ok(Self::Devices(ids))
    }
}

impl GuestControl {
    /// The device ids of `topology` this selects, in topology order; a
    /// named id the topology lacks is an error naming the ones it has.
    pub fn select(&self, topology: &Topology) -> Result<Vec<String>> {
        let all = topology.servers.iter().map(|s| s.id.clone());
        match self {
            Self::Off => Ok(Vec::new()),
            Self::All => Ok(all.collect()),
            Self::Devices(ids) => {
                for id in ids {
                    if topology.server(id).is_none() {
                        let known: Vec<String> = all.clone().collect();
                        bail!(
                            "--guest-control {id}: topology {} has no device server {id:?} \
                             (it has {})",
                            topology.name,
                            if known.is_empty() {
                                "none".to_owned()
                            } else {
                                known.join(", ")
                            }
                        );
                    }
                }
                Ok(topology
                    .servers
                    .iter()
                    .filter(|s| ids.contains(&s.id))
                    .map(|s| s.id.clone())
                    .collect())
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct LabOptions {
    /// A topology name in `qemu-configs/` or a path to a topology file.
    pub topology: String,
    pub mode: Mode,
    /// A host folder the guest sees at /mnt/host.
    pub share: Option<PathBuf>,
    /// Boot this kernel image instead of the guest environment's.
    pub kernel: Option<PathBuf>,
    /// Extra kernel command-line words.
    pub append: Vec<String>,
    /// Give up on an exec run (or, kept without a command, on the boot)
    /// after this long.
    pub timeout: Option<Timeout>,
    /// Give up on a guest that has not started its command after this
    /// long; `None`: [`BOOT_BUDGET`] under TCG, scaled.
    pub boot_timeout: Option<Timeout>,
    /// The accelerator (`--accel`); `None`: `P2PLAB_ACCEL`, else auto.
    pub accel: Option<AccelRequest>,
    /// Passed to the device servers as `--log-level`.
    pub log_level: Option<String>,
    /// Extra arguments for a server, by device id.
    pub server_args: Vec<(String, Vec<String>)>,
    /// Extra arguments for every device server of the topology.
    pub every_server_args: Vec<String>,
    /// Extra QEMU arguments.
    pub qemu_args: Vec<String>,
    /// Print boot messages and progress to stderr.
    pub verbose: bool,
    /// Echo the exec command's output to our stdout while it runs.
    pub stream_output: bool,
    /// Folder for state kept across boots (`@STATE@`); default `.cache/state`.
    pub state: Option<PathBuf>,
    /// The clean-boot check of exec runs: complaints in the guest's kernel
    /// log that the run expects (see `kernel_log`).
    pub kernel_log: KernelLogCheck,
    /// Files the command needs beside it, as (path under `/run/p2plab`,
    /// text), written before QEMU starts (a [`GuestScript`]'s libraries).
    pub guest_files: Vec<(String, String)>,
    /// The servers the guest may drive itself (`p2plab-ctl ID ...` in the
    /// guest); none unless asked.
    pub guest_control: GuestControl,
}

impl LabOptions {
    pub fn new(topology: &str, mode: Mode) -> Self {
        Self {
            topology: topology.to_owned(),
            mode,
            share: None,
            kernel: None,
            append: Vec::new(),
            timeout: None,
            boot_timeout: None,
            accel: None,
            log_level: None,
            server_args: Vec::new(),
            every_server_args: Vec::new(),
            qemu_args: Vec::new(),
            verbose: false,
            stream_output: true,
            state: None,
            kernel_log: KernelLogCheck::default(),
            guest_files: Vec::new(),
            guest_control: GuestControl::Off,
        }
    }

    /// Options that run `script` in the guest of `topology` and return its
    /// exit status (the files it needs go along).
    pub fn exec(topology: &str, script: &GuestScript) -> Result<Self> {
        let mut options = Self::new(topology, Mode::Exec(script.render()?));
        options.guest_files = script.files();
        Ok(options)
    }
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub run_dir: PathBuf,
    /// The guest command's exit status (exec and keep-with-command modes).
    pub status: Option<i32>,
    /// The command's console output, between the markers.
    pub output: String,
    /// Peak resident memory (VmHWM, bytes) of QEMU and each server, read
    /// just before they were stopped.
    pub peak_rss: Vec<(String, u64)>,
    /// The accelerator the guest ran under.
    pub accel: Accel,
}

/// Set by SIGINT/SIGTERM/SIGHUP; every wait loop checks it.
fn interrupted() -> &'static Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        for signal in [
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ] {
            if let Err(err) = signal_hook::flag::register(signal, Arc::clone(&flag)) {
                tracing::warn!("cannot catch signal {signal}: {err}");
            }
        }
        flag
    })
}

/// The run was ended by SIGINT/SIGTERM/SIGHUP; everything was stopped.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted; the servers and QEMU were stopped")
    }
}

impl std::error::Error for Interrupted {}

fn check_interrupted() -> Result<()> {
    if interrupted().load(Ordering::Relaxed) {
        return Err(Interrupted.into());
    }
    Ok(())
}

/// Prints a progress line on stderr.
fn progress(message: impl std::fmt::Display) {
    eprintln!("p2plab: {message}");
}

/// Makes a fresh run folder under `runs/` and points `runs/latest` at it.
fn new_run_dir(paths: &LabPaths) -> Result<PathBuf> {
    std::fs::create_dir_all(&paths.runs)
        .with_context(|| format!("creating {}", paths.runs.display()))?;
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = format!("{}-{}", format_utc(secs), std::process::id());
    let mut dir = paths.runs.join(&base);
    let mut n = 1;
    while dir.exists() {
        dir = paths.runs.join(format!("{base}.{n}"));
        n += 1;
    }
    std::fs::create_dir_all(dir.join("guest"))
        .with_context(|| format!("creating {}", dir.display()))?;
    let latest = paths.runs.join("latest");
    let tmp = paths.runs.join(format!(".latest.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    if let Some(name) = dir.file_name() {
        if std::os::unix::fs::symlink(name, &tmp).is_ok() {
            let _ = std::fs::rename(&tmp, &latest);
        }
    }
    Ok(dir)
}

/// `YYYYmmdd-HHMMSS` in UTC, without a date crate (run and bench folders).
pub fn format_utc(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Waits until the server has created its socket, or fails with the tail of
/// its log if it exited first.
fn wait_for_socket(server: &mut LabProcess, socket: &Path, stderr_log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::fs::metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
            return Ok(());
        }
        if let Some(status) = server.try_wait()? {
            bail!(
                "{} exited ({status}) before creating {}:\n{}",
                server.name,
                socket.display(),
                tail(stderr_log, 20)
            );
        }
        check_interrupted()?;
        if Instant::now() > deadline {
            bail!(
                "{} did not create {} within 30 s",
                server.name,
                socket.display()
            );
        }
        sleep(Duration::from_millis(10));
    }
}

/// One line of what each vCPU was doing, from QEMU's `info registers -a`:
/// its instruction pointer, privilege level, whether interrupts were on
/// (RFLAGS.IF) and whether it was halted.
pub fn vcpu_summary(registers: &str) -> String {
    #[derive(Default)]
    struct Vcpu {
        index: String,
        ip: String,
        cpl: String,
        interrupts: &'static str,
        halted: bool,
    }
    let field = |line: &str, name: &str| {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(name))
            .map(str::to_owned)
    };
    let mut vcpus: Vec<Vcpu> = Vec::new();
    for line in registers.lines() {
        if let Some(index) = line.strip_prefix("CPU#") {
            vcpus.push(Vcpu {
                index: index.trim().to_owned(),
                interrupts: "?",
                ..Vcpu::default()
            });
        }
        let Some(vcpu) = vcpus.last_mut() else {
            continue;
        };
        // RIP/RFL in long mode, EIP/EFL before it.
        if let Some(ip) = field(line, "RIP=").or_else(|| field(line, "EIP=")) {
            vcpu.ip = ip;
        }
        if let Some(flags) = field(line, "RFL=").or_else(|| field(line, "EFL=")) {
            vcpu.interrupts = match u64::from_str_radix(&flags, 16) {
                Ok(flags) if flags & (1 << 9) != 0 => "on",
                Ok(_) => "off",
                Err(_) => "?",
            };
            vcpu.cpl = field(line, "CPL=").unwrap_or_default();
            vcpu.halted = field(line, "HLT=").as_deref() == Some("1");
        }
    }
    if vcpus.is_empty() {
        return "no CPU in QEMU's answer".to_owned();
    }
    vcpus
        .iter()
        .map(|v| {
            format!(
                "#{} RIP={} (CPL {}, interrupts {}{})",
                v.index,
                v.ip,
                v.cpl,
                v.interrupts,
                if v.halted { ", halted" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The last `lines` lines of a file, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    all[start..].join("\n")
}

/// A running lab; dropping it stops everything it started.
pub struct Lab {
    pub paths: LabPaths,
    pub run_dir: PathBuf,
    /// The topology as started (placeholders expanded, extra server
    /// arguments added): what `start_server` and `device_json` use again.
    pub topology: Topology,
    /// The accelerator and vCPU QEMU runs with, and the line that said so.
    pub accel: AccelChoice,
    /// The topology's and the run's QEMU arguments without `-accel`/`-cpu`.
    qemu_args: SplitArgs,
    pub(crate) servers: Vec<LabProcess>,
    pub(crate) qemu: Option<LabProcess>,
    /// Passed to every server start, restarts included.
    log_level: Option<String>,
    /// The servers whose guest control socket the guest gets a port to.
    guest_control: Vec<String>,
    lifetime: Lifetime,
    /// Left running on purpose (`--keep`): dropping must not tidy up.
    detached: bool,
    /// Held while this lab may use the state folder's disk images.
    _state_lock: std::fs::File,
}

impl Lab {
    /// Runs the lab as `options` says and returns when it is over (or, with
    /// `Mode::Keep`, when the guest is up and the command has run).
    pub fn run(options: &LabOptions) -> Result<Outcome> {
        Self::start(options)?.finish(options)
    }

    /// Starts the servers and QEMU and returns at once, with the guest
    /// booting: the caller may act on the running lab (see `control`) and
    /// then waits with [`Lab::finish`].
    pub fn start(options: &LabOptions) -> Result<Lab> {
        interrupted();
        let mut paths = LabPaths::discover()?;
        if let Some(state) = &options.state {
            paths.state = state.clone();
        }
        let topology_path = paths.topology(&options.topology)?;
        if let Some(share) = &options.share {
            if !share.is_dir() {
                bail!("--share {}: not a folder", share.display());
            }
        }
        if let Some(kernel) = &options.kernel {
            if !kernel.is_file() {
                bail!("--kernel {}: no such file", kernel.display());
            }
        }
        setup::ensure_guest_env(&paths)?;
        setup::ensure_overlay(&paths)?;
        check_interrupted()?;

        let run_dir = new_run_dir(&paths)?;
        progress(format_args!("run folder {}", run_dir.display()));
        std::fs::create_dir_all(&paths.state)
            .with_context(|| format!("creating {}", paths.state.display()))?;
        let vars = Placeholders {
            run: run_dir.clone(),
            state: paths.state.clone(),
        };
        let mut topology = Topology::load(&topology_path, &vars)?;
        for server in &mut topology.servers {
            server
                .args
                .extend(options.every_server_args.iter().cloned());
        }
        for (id, extra) in &options.server_args {
            let Some(server) = topology.server_mut(id) else {
                bail!("topology {} has no device server {id:?}", topology.name);
            };
            server.args.extend(extra.iter().cloned());
        }
        route_servers(&mut topology, options, &run_dir)?;
        // In the topology as started, so a restarted server opens its
        // guest socket again (and QEMU reconnects to it).
        let guest_control = options.guest_control.select(&topology)?;
        for id in &guest_control {
            if let Some(server) = topology.server_mut(id) {
                server.args.push("--guest-control-socket".to_owned());
                server
                    .args
                    .push(guest_control_socket(&run_dir, id).display().to_string());
            }
        }

        // Decided before anything starts: a forced KVM that cannot run is
        // an error with nothing to clean up.
        let (qemu_args, accel) = choose_accel(&topology, options)?;
        progress(&accel.line);
        std::fs::write(run_dir.join("accel.txt"), format!("{}\n", accel.line))?;

        let state_lock = lock_state(&paths.state)?;
        for disk in &topology.disks {
            ensure_disk(&disk.path, disk.size)?;
        }
        let lifetime = match options.mode {
            Mode::Keep(_) => Lifetime::Detached,
            _ => Lifetime::TiedToLauncher,
        };
        let mut lab = Lab {
            paths,
            run_dir,
            topology,
            accel,
            qemu_args,
            servers: Vec::new(),
            qemu: None,
            log_level: options.log_level.clone(),
            guest_control,
            lifetime,
            detached: false,
            _state_lock: state_lock,
        };
        let ids: Vec<String> = lab.topology.servers.iter().map(|s| s.id.clone()).collect();
        for id in &ids {
            let server = lab.spawn_server(id)?;
            lab.servers.push(server);
            if options.verbose {
                progress(format_args!(
                    "{id} listening on {}",
                    lab.run_dir.join(format!("{id}.sock")).display()
                ));
            }
        }
        lab.start_qemu(options)?;
        Ok(lab)
    }

    /// The run folder of this lab (console.log, the servers' stats files).
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The process id of QEMU (named `qemu`) and of each device server
    /// (named by its device id), while they run.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.qemu
            .iter()
            .chain(self.servers.iter())
            .filter_map(|p| Some((p.name.clone(), p.pid()?)))
            .collect()
    }

    /// A wait on the guest whose TCG budget is `tcg`, under this lab's
    /// accelerator (see `accel`: TCG keeps it as written).
    pub fn budget(&self, tcg: Duration) -> Duration {
        self.accel.accel.scale(tcg)
    }

    /// Starts the server of device `id` as the topology says and waits for
    /// its socket. Its log and stats files are the run folder's
    /// `<id>.log`/`<id>.stats.json` (a restarted server appends to the log).
    pub(crate) fn spawn_server(&self, id: &str) -> Result<LabProcess> {
        let Some(spec) = self.topology.server(id) else {
            bail!(
                "topology {} has no device server {id:?}",
                self.topology.name
            );
        };
        let binary = self.paths.server_binary(&spec.binary)?;
        let socket = self.run_dir.join(format!("{id}.sock"));
        let stderr_log = self.run_dir.join(format!("{id}.stderr"));
        // A socket left by a server that was killed would pass for the new
        // one's before it binds.
        if std::fs::symlink_metadata(&socket).is_ok_and(|m| m.file_type().is_socket()) {
            std::fs::remove_file(&socket)
                .with_context(|| format!("removing the stale {}", socket.display()))?;
        }
        let mut command = Command::new(&binary);
        command
            .args(&spec.args)
            .arg("--socket")
            .arg(&socket)
            .arg("--log-file")
            .arg(self.run_dir.join(format!("{id}.log")))
            .arg("--stats-file")
            .arg(self.run_dir.join(format!("{id}.stats.json")));
        if let Some(level) = &self.log_level {
            command.arg("--log-level").arg(level);
        }
        std::fs::write(
            self.run_dir.join(format!("{id}.cmdline")),
            shell_words(&command),
        )?;
        let mut server = LabProcess::spawn(id, command, &stderr_log, self.lifetime)?;
        wait_for_socket(&mut server, &socket, &stderr_log)?;
        Ok(server)
    }

    fn start_qemu(&mut self, options: &LabOptions) -> Result<()> {
        let lifetime = self.lifetime;
        let topology = &self.topology;
        let run = &self.run_dir;
        let split = setup::use_usr_image(&self.paths, options.kernel.is_some());
        let initramfs = setup::boot_initramfs(&self.paths, split)?;
        let kernel = options
            .kernel
            .clone()
            .unwrap_or_else(|| self.paths.kernel());
        let mut cmdline = BASE_CMDLINE.to_owned();
        if matches!(options.mode, Mode::Keep(_)) {
            cmdline.push_str(" p2plab.keep");
        }
        for extra in &options.append {
            cmdline.push(' ');
            cmdline.push_str(extra);
        }
        let guest_dir = run.join("guest");
        match &options.mode {
            Mode::Exec(script) | Mode::Keep(Some(script)) => {
                let mut text = script.clone();
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                std::fs::write(guest_dir.join("script.sh"), text)?;
                std::fs::write(guest_dir.join("exec.sh"), EXEC_WRAPPER)?;
                write_guest_files(&guest_dir, &options.guest_files)?;
            }
            _ => {}
        }

        let mut command = Command::new(self.paths.qemu());
        command.args(self.qemu_args.head(&self.accel));
        command
            .arg("-kernel")
            .arg(&kernel)
            .arg("-initrd")
            .arg(&initramfs)
            .arg("-append")
            .arg(&cmdline)
            .arg("-name")
            // Named threads (`CPU 0/TCG`, `worker`...): the bench tells the
            // vCPUs from the threads that emulate devices by these names.
            .arg(format!("p2plab-{},debug-threads=on", topology.name))
            .arg("-pidfile")
            .arg(run.join("qemu.pid"))
            .arg("-qmp")
            .arg(format!(
                "unix:{},server=on,wait=off",
                run.join("qmp.sock").display()
            ));
        add_9p_share(&mut command, "p2plab-run", &guest_dir, false);
        if split {
            command.args(setup::usr_image_args(&self.paths));
        }
        command.args(control_port_args(run, &self.guest_control));
        if let Some(share) = &options.share {
            let share = share
                .canonicalize()
                .with_context(|| format!("--share {}", share.display()))?;
            add_9p_share(&mut command, "p2plab-share", &share, false);
        }
        let console_log = run.join("console.log");
        let interactive = options.mode == Mode::Interactive;
        if interactive {
            command
                .arg("-chardev")
                .arg(format!(
                    "stdio,id=con,mux=on,signal=off,logfile={}",
                    console_log.display()
                ))
                .arg("-serial")
                .arg("chardev:con")
                .arg("-mon")
                .arg("chardev=con,mode=readline");
        } else {
            command
                .arg("-chardev")
                .arg(format!(
                    "socket,id=con,path={},server=on,wait=off,logfile={}",
                    run.join("console.sock").display(),
                    console_log.display()
                ))
                .arg("-serial")
                .arg("chardev:con")
                .arg("-monitor")
                .arg(format!(
                    "unix:{},server=on,wait=off",
                    run.join("monitor.sock").display()
                ));
        }
        command.args(&self.qemu_args.extra);
        std::fs::write(run.join("qemu.cmdline"), shell_words(&command))?;
        let qemu_log = run.join("qemu.log");
        let qemu = if interactive {
            progress("guest console follows; Ctrl-A X quits QEMU, `poweroff` ends the lab");
            let log = std::fs::File::create(&qemu_log)?;
            command.stderr(log);
            LabProcess::spawn_configured("qemu", command, lifetime)?
        } else {
            LabProcess::spawn("qemu", command, &qemu_log, lifetime)?
        };
        self.qemu = Some(qemu);
        Ok(())
    }

    /// Waits for the run to end (or, when kept, for the command) and tidies
    /// up. `options` must be the ones the lab was started with.
    pub fn finish(mut self, options: &LabOptions) -> Result<Outcome> {
        let mut outcome = Outcome {
            run_dir: self.run_dir.clone(),
            status: None,
            output: String::new(),
            peak_rss: Vec::new(),
            accel: self.accel.accel,
        };
        match &options.mode {
            Mode::Interactive => {
                self.wait_qemu(None)?;
            }
            Mode::Exec(_) => {
                self.follow_exec(options, &mut outcome, true)?;
                self.use_exact_output(&mut outcome);
                outcome.peak_rss = self.peak_rss();
                self.check_kernel_log(&options.kernel_log)?;
            }
            Mode::Keep(command) => {
                if command.is_some() {
                    self.follow_exec(options, &mut outcome, false)?;
                    self.use_exact_output(&mut outcome);
                } else {
                    let timeout = options.timeout.map(|t| t.under(self.accel.accel));
                    self.wait_for_console_line(crate::console::READY, timeout)?;
                }
                self.detach()?;
                return Ok(outcome);
            }
        }
        self.stop_servers();
        Ok(outcome)
    }

    /// Replaces the console's copy of the command's output by the copy the
    /// guest wrote to `/run/p2plab/output.txt`: on the console, kernel
    /// messages printed meanwhile can land in the middle of a line (a
    /// `KEY=VALUE` fact cut in two by an I/O error report).
    fn use_exact_output(&self, outcome: &mut Outcome) {
        if let Ok(text) = std::fs::read_to_string(self.run_dir.join("guest/output.txt")) {
            outcome.output = text;
        }
    }

    /// Streams the exec command's output until its exit marker; with
    /// `until_exit`, also waits for QEMU to power off.
    fn follow_exec(
        &mut self,
        options: &LabOptions,
        outcome: &mut Outcome,
        until_exit: bool,
    ) -> Result<()> {
        let console_log = self.run_dir.join("console.log");
        let mut follower = LogFollower::new(&console_log);
        let mut tracker = ExecTracker::default();
        let timeout = options.timeout.map(|t| t.under(self.accel.accel));
        let deadline = timeout.map(|t| Instant::now() + t);
        let boot_timeout = options
            .boot_timeout
            .unwrap_or(Timeout::TcgBudget(BOOT_BUDGET))
            .under(self.accel.accel);
        let boot_deadline = Instant::now() + boot_timeout;
        let stdout = std::io::stdout();
        loop {
            for line in follower.poll_lines() {
                match tracker.classify(&line) {
                    ExecLine::Boot(text) if options.verbose => eprintln!("{text}"),
                    ExecLine::Boot(_) | ExecLine::Begin => {}
                    ExecLine::Output(text) => {
                        if tracker.status.is_none() {
                            if options.stream_output {
                                let mut out = stdout.lock();
                                let _ = writeln!(out, "{text}");
                                let _ = out.flush();
                            }
                            outcome.output.push_str(&text);
                            outcome.output.push('\n');
                        } else if options.verbose {
                            eprintln!("{text}");
                        }
                    }
                    ExecLine::Exit(status) => {
                        outcome.status = Some(status);
                        if !until_exit {
                            return Ok(());
                        }
                    }
                }
            }
            let exited = match self.qemu.as_mut() {
                Some(q) => q.try_wait()?,
                None => None,
            };
            if let Some(status) = exited {
                // Pick up the last lines written before QEMU went away.
                for line in follower.poll_lines() {
                    if let ExecLine::Output(text) = tracker.classify(&line) {
                        if tracker.status.is_none() {
                            outcome.output.push_str(&text);
                            outcome.output.push('\n');
                        }
                    }
                }
                if let Some(s) = tracker.status {
                    outcome.status = Some(s);
                }
                let file_status = std::fs::read_to_string(self.run_dir.join("guest/exit-status"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                if let Some(s) = file_status {
                    outcome.status = Some(s);
                }
                if outcome.status.is_none() {
                    bail!(
                        "QEMU exited ({status}) before the guest command finished; \
                         console tail:\n{}\nQEMU log tail:\n{}",
                        tail(&console_log, 30),
                        tail(&self.run_dir.join("qemu.log"), 10)
                    );
                }
                return Ok(());
            }
            if !tracker.started() && Instant::now() > boot_deadline {
                bail!(
                    "the guest did not start its command within {boot_timeout:?} ({}): it hung \
                     while booting; {}; console tail:\n{}",
                    self.accel.accel,
                    self.save_vcpu_state(),
                    tail(&console_log, 30)
                );
            }
            if let Some(deadline) = deadline {
                if Instant::now() > deadline {
                    bail!(
                        "the guest did not finish within {:?} ({}); {}; console tail:\n{}",
                        timeout.unwrap_or_default(),
                        self.accel.accel,
                        self.save_vcpu_state(),
                        tail(&console_log, 30)
                    );
                }
            }
            check_interrupted()?;
            sleep(Duration::from_millis(20));
        }
    }

    /// Saves what the vCPUs are doing to [`VCPU_DUMP`] in the run folder
    /// (QEMU's `info registers -a`, through QMP) and says where, with each
    /// vCPU's instruction pointer, for a guest that stopped making
    /// progress. A dump that cannot be taken is said too.
    fn save_vcpu_state(&self) -> String {
        let path = self.run_dir.join(VCPU_DUMP);
        let dump = (|| -> Result<String> {
            let mut qmp = self.qmp()?;
            let mut text = String::new();
            for command in ["info status", "info registers -a"] {
                let reply = qmp.execute(
                    "human-monitor-command",
                    Some(serde_json::json!({ "command-line": command })),
                )?;
                text.push_str(&format!("# {command}\n{}\n", reply.as_str().unwrap_or("")));
            }
            std::fs::write(&path, &text)?;
            Ok(text)
        })();
        match dump {
            Ok(text) => format!(
                "vCPUs: {} (all registers in {})",
                vcpu_summary(&text),
                path.display()
            ),
            Err(e) => format!("the vCPUs' state could not be read: {e:#}"),
        }
    }

    fn wait_for_console_line(&mut self, needle: &str, timeout: Option<Duration>) -> Result<()> {
        let console_log = self.run_dir.join("console.log");
        let mut follower = LogFollower::new(&console_log);
        let deadline =
            Instant::now() + timeout.unwrap_or_else(|| self.budget(Duration::from_secs(300)));
        loop {
            if follower.poll_lines().iter().any(|l| l.contains(needle))
                || follower.take_partial().contains(needle)
            {
                return Ok(());
            }
            if let Some(q) = self.qemu.as_mut() {
                if let Some(status) = q.try_wait()? {
                    bail!(
                        "QEMU exited ({status}) during boot; console tail:\n{}",
                        tail(&console_log, 30)
                    );
                }
            }
            check_interrupted()?;
            if Instant::now() > deadline {
                bail!(
                    "the guest did not come up; {}; console tail:\n{}",
                    self.save_vcpu_state(),
                    tail(&console_log, 30)
                );
            }
            sleep(Duration::from_millis(50));
        }
    }

    fn wait_qemu(&mut self, timeout: Option<Duration>) -> Result<()> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let Some(q) = self.qemu.as_mut() else {
                return Ok(());
            };
            if q.try_wait()?.is_some() {
                return Ok(());
            }
            // Ctrl-C on a raw console goes to the guest; SIGTERM/SIGHUP end the lab.
            check_interrupted()?;
            if deadline.is_some_and(|d| Instant::now() > d) {
                bail!("QEMU did not exit in time");
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// The clean-boot check on the kernel log the guest saved at the end of
    /// its command: fails (or, without `enforce`, warns) on complaints the
    /// run did not expect.
    fn check_kernel_log(&self, check: &KernelLogCheck) -> Result<()> {
        let path = self.run_dir.join("guest").join(kernel_log::KMSG_FILE);
        let findings = match std::fs::read_to_string(&path) {
            Ok(text) => kernel_log::check(&kernel_log::parse_kmsg(&text), &check.expected),
            Err(err) => Err(format!(
                "  the guest saved no kernel log at {} ({err})\n",
                path.display()
            )),
        };
        let Err(report) = findings else {
            return Ok(());
        };
        let what = format!(
            "the guest's kernel log has complaints this run did not expect \
             (README \"Clean boots\"); run folder {}:\n{report}",
            self.run_dir.display()
        );
        if check.enforce {
            bail!("{what}");
        }
        progress(format_args!("warning: {what}"));
        Ok(())
    }

    /// VmHWM of the servers (still running) and of QEMU (if still there).
    fn peak_rss(&self) -> Vec<(String, u64)> {
        self.qemu
            .iter()
            .chain(self.servers.iter())
            .filter_map(|p| Some((p.name.clone(), p.peak_rss()?)))
            .collect()
    }

    fn stop_servers(&mut self) {
        if let Some(mut qemu) = self.qemu.take() {
            qemu.stop(Duration::from_secs(5));
        }
        // All servers shut down side by side (each takes about 0.2 s,
        // mostly its peer threads noticing the others are gone).
        for server in &mut self.servers {
            server.terminate();
        }
        for mut server in self.servers.drain(..).rev() {
            server.stop(Duration::from_secs(5));
        }
        remove_sockets(&self.run_dir);
    }

    /// Leaves QEMU and the servers running and records their pids so
    /// `--stop` can end them later.
    fn detach(mut self) -> Result<()> {
        let mut pids = String::new();
        if let Some(qemu) = self.qemu.take() {
            if let Some(pid) = qemu.release() {
                pids.push_str(&format!("qemu {pid}\n"));
            }
        }
        for server in self.servers.drain(..) {
            let name = server.name.clone();
            if let Some(pid) = server.release() {
                pids.push_str(&format!("{name} {pid}\n"));
            }
        }
        self.detached = true;
        std::fs::write(self.run_dir.join("pids"), pids)?;
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if !self.detached {
            self.stop_servers();
        }
    }
}

/// Stops a lab left up with `--keep`, from the pids recorded in its folder.
pub fn stop_kept(run_dir: &Path) -> Result<()> {
    let pids_file = run_dir.join("pids");
    let text = std::fs::read_to_string(&pids_file).with_context(|| {
        format!(
            "--stop {}: no pids file (was it started with --keep?)",
            run_dir.display()
        )
    })?;
    let mut pids = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some(name), Some(pid)) = (
            words.next(),
            words.next().and_then(|p| p.parse::<u32>().ok()),
        ) {
            pids.push((name.to_owned(), pid));
        }
    }
    for (name, pid) in &pids {
        if crate::process::signal_pid(*pid, libc::SIGTERM) {
            progress(format_args!("stopping {name} (pid {pid})"));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && pids.iter().any(|(_, p)| crate::process::pid_alive(*p)) {
        sleep(Duration::from_millis(50));
    }
    for (_, pid) in &pids {
        crate::process::signal_pid(*pid, libc::SIGKILL);
    }
    std::fs::remove_file(&pids_file)?;
    remove_sockets(run_dir);
    Ok(())
}

/// Under a vIOMMU, gives every server that has no `--direct-peers` of its
/// own the routing table derived from the machine (see `routing`), and
/// writes it to the run folder's `routing.txt`.
fn route_servers(topology: &mut Topology, options: &LabOptions, run_dir: &Path) -> Result<()> {
    let has_table = |args: &[String]| {
        args.iter()
            .any(|a| a == "--direct-peers" || a.starts_with("--direct-peers="))
    };
    if topology.servers.iter().all(|s| has_table(&s.args)) {
        return Ok(());
    }
    let mut qemu_args = topology.qemu_args.clone();
    qemu_args.extend(options.qemu_args.iter().cloned());
    let cmdline: Vec<String> = BASE_CMDLINE
        .split_whitespace()
        .chain(options.append.iter().flat_map(|a| a.split_whitespace()))
        .map(str::to_owned)
        .collect();
    let ids: Vec<String> = topology.servers.iter().map(|s| s.id.clone()).collect();
    let Some(routing) = crate::routing::derive(&qemu_args, &ids, &cmdline)
        .with_context(|| format!("routing the device servers of topology {}", topology.name))?
    else {
        return Ok(());
    };
    for server in &mut topology.servers {
        if has_table(&server.args) {
            continue;
        }
        if let Some(peers) = routing.direct_peers.get(&server.id) {
            server.args.push("--direct-peers".to_owned());
            server.args.push(peers.clone());
        }
    }
    std::fs::write(run_dir.join("routing.txt"), routing.describe())
        .with_context(|| format!("writing {}", run_dir.join("routing.txt").display()))?;
    Ok(())
}

/// Splits the accelerator's arguments out of the topology's and the run's
/// QEMU arguments and decides the accelerator for this boot (see `accel`).
fn choose_accel(topology: &Topology, options: &LabOptions) -> Result<(SplitArgs, AccelChoice)> {
    let split = accel::split_args(&topology.qemu_args, &options.qemu_args)?;
    let requested = Requested::resolve(options.accel)?;
    let choice = accel::choose(
        &requested,
        &topology.name,
        split.tcg_cpu.as_deref(),
        accel::kvm_usable,
        HostCpu::read,
    )?;
    Ok((split, choice))
}

/// The accelerator a run with `options` would get, without starting
/// anything (`p2plab-vm --setup-only` reports it).
pub fn preview_accel(paths: &LabPaths, options: &LabOptions) -> Result<AccelChoice> {
    let vars = Placeholders {
        run: paths.runs.join("preview"),
        state: paths.state.clone(),
    };
    let topology = Topology::load(&paths.topology(&options.topology)?, &vars)?;
    Ok(choose_accel(&topology, options)?.1)
}

/// Takes the state folder for this lab, waiting while another lab holds
/// it. Its disk images (`nvme0n1.img`...) are one device's media shared by
/// every boot that names the folder: two guests at once would write each
/// other's blocks and read back the other's data (two e2e tests of one
/// suite run in parallel threads did exactly that: a CRC "mismatch" that
/// was the other guest's pattern). The lock goes with the launcher, so a
/// `--keep` lab holds it only until its launcher exits.
fn lock_state(state: &Path) -> Result<std::fs::File> {
    let path = state.join(".lab.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => return Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {}
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
    progress(format_args!(
        "waiting for the state folder {}: another lab uses its disk images \
         (give this one --state DIR to run both at once)",
        state.display()
    ));
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

/// Creates a sparse backing file when it is missing; an existing one keeps
/// its data (boots share state through it).
fn ensure_disk(path: &Path, size: u64) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    file.set_len(size)
        .with_context(|| format!("sizing {}", path.display()))?;
    Ok(())
}

fn remove_sockets(run_dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(run_dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_socket()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// The guest control socket of device `id` in the run folder.
fn guest_control_socket(run: &Path, id: &str) -> PathBuf {
    run.join(format!("{id}.guest.ctl"))
}

/// QEMU arguments for the guest's own control channel: one virtio-serial
/// port per server in `ids` (those `--guest-control` selected), named
/// `p2plab.ctl.<id>` (the guest's `p2plab-ctl <id>` finds it), with QEMU
/// as the client of that server's guest control socket. QEMU reconnects
/// when a server is restarted. No ids, no arguments: the guest reaches
/// no control socket.
fn control_port_args(run: &Path, ids: &[String]) -> Vec<String> {
    if ids.is_empty() {
        return Vec::new();
    }
    let mut args = vec![
        "-device".to_owned(),
        "virtio-serial-pci,id=p2plab-ctl".to_owned(),
    ];
    for id in ids {
        args.push("-chardev".to_owned());
        args.push(format!(
            "socket,id=ctl-{id},path={},reconnect-ms=1000",
            guest_control_socket(run, id).display()
        ));
        args.push("-device".to_owned());
        args.push(format!(
            "virtserialport,bus=p2plab-ctl.0,chardev=ctl-{id},name=p2plab.ctl.{id}"
        ));
    }
    args
}

fn add_9p_share(command: &mut Command, tag: &str, dir: &Path, readonly: bool) {
    let ro = if readonly { ",readonly=on" } else { "" };
    command
        .arg("-fsdev")
        .arg(format!(
            "local,id={tag},path={},security_model=none{ro}",
            dir.display()
        ))
        .arg("-device")
        .arg(format!("virtio-9p-pci,fsdev={tag},mount_tag={tag}"));
}

/// Writes the files an exec command needs beside it into the run folder's
/// `guest/` (`/run/p2plab` in the guest). Paths stay inside it and leave
/// the launcher's own files alone.
fn write_guest_files(guest_dir: &Path, files: &[(String, String)]) -> Result<()> {
    for (name, text) in files {
        let relative = Path::new(name);
        let inside = !name.is_empty()
            && relative
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !inside || RESERVED_GUEST_FILES.contains(&name.as_str()) {
            bail!("guest file {name:?}: not a free path inside /run/p2plab");
        }
        let path = guest_dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A command line quoted for a POSIX shell, to reproduce a run by hand.
fn shell_words(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    let quoted: Vec<String> = words.iter().map(|w| guest_script::quote(w)).collect();
    let mut text = quoted.join(" ");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a hang report that names the wrong vCPU state: interrupts
    /// read from the wrong RFLAGS bit, a halted vCPU shown as running, a
    /// vCPU dropped, or real-mode registers (EIP/EFL) not read at all.
    #[test]
    fn the_vcpu_summary_reads_qemus_register_dump() {
        let dump = "\
# info registers -a

CPU#0
RAX=0000000000000000 RBX=ffffffff83a0c940 RCX=0000000000000001
RIP=ffffffff811c4e52 RFL=00000046 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0
ES =0000 0000000000000000 00000000 00000000
CR0=80050033 CR2=0000000000000000 CR3=000000000361c000 CR4=00350ef0

CPU#1
RIP=ffffffff81f3b1c5 RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1

CPU#2
EIP=0000fff0 EFL=00000002 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=0
";
        assert_eq!(
            vcpu_summary(dump),
            "#0 RIP=ffffffff811c4e52 (CPL 0, interrupts off); \
             #1 RIP=ffffffff81f3b1c5 (CPL 0, interrupts on, halted); \
             #2 RIP=0000fff0 (CPL 0, interrupts off)"
        );
        assert_eq!(vcpu_summary("Error: no vCPU"), "no CPU in QEMU's answer");
    }

    fn topology(ids: &[&str]) -> Topology {
        Topology {
            name: "t".to_owned(),
            qemu_args: Vec::new(),
            servers: ids
                .iter()
                .map(|id| crate::topology::ServerSpec {
                    id: (*id).to_owned(),
                    binary: "p2plab-nvme".to_owned(),
                    args: Vec::new(),
                })
                .collect(),
            disks: Vec::new(),
        }
    }

    /// Catches a guest control channel that is on without being asked
    /// for, a selection that reaches other devices than named, or a
    /// device name the topology lacks taken silently.
    #[test]
    fn the_guest_control_channel_is_off_unless_asked() {
        let t = topology(&["nvme0", "gpu0", "nic0"]);
        let run = Path::new("/r");
        assert_eq!(
            LabOptions::new("lab", Mode::Interactive).guest_control,
            GuestControl::Off
        );
        assert!(GuestControl::Off.select(&t).unwrap().is_empty());
        assert!(
            control_port_args(run, &[]).is_empty(),
            "no port, no virtio-serial device"
        );

        let all: GuestControl = "all".parse().unwrap();
        assert_eq!(all.select(&t).unwrap(), ["nvme0", "gpu0", "nic0"]);
        let some: GuestControl = "nic0,nvme0".parse().unwrap();
        let ids = some.select(&t).unwrap();
        assert_eq!(ids, ["nvme0", "nic0"]);
        let args = control_port_args(run, &ids);
        let chardevs: Vec<&String> = args.iter().filter(|a| a.starts_with("socket,")).collect();
        assert_eq!(
            chardevs,
            [
                "socket,id=ctl-nvme0,path=/r/nvme0.guest.ctl,reconnect-ms=1000",
                "socket,id=ctl-nic0,path=/r/nic0.guest.ctl,reconnect-ms=1000"
            ]
        );
        assert!(args.iter().any(|a| a.ends_with("name=p2plab.ctl.nic0")));
        assert!(!args.iter().any(|a| a.contains("gpu0")));

        let err = "gpu1"
            .parse::<GuestControl>()
            .unwrap()
            .select(&t)
            .unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("\"gpu1\"") && err.contains("nvme0, gpu0, nic0"),
            "{err}"
        );
        for bad in ["", "nvme0,", "a b", "../x"] {
            assert!(bad.parse::<GuestControl>().is_err(), "{bad:?}");
        }
        assert_eq!("off".parse::<GuestControl>().unwrap(), GuestControl::Off);
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "19700101-000000");
        assert_eq!(format_utc(1_795_312_496), "20261122-015456");
    }

    /// Catches: guest files written outside the run folder's `guest/`
    /// (an absolute path or `..`), over the launcher's own files, or not
    /// written at all.
    #[test]
    fn guest_files_stay_inside_the_guest_folder() {
        let dir = std::env::temp_dir().join(format!("p2plab-guest-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = vec![("lib/a.sh".to_owned(), "echo a\n".to_owned())];
        write_guest_files(&dir, &files).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("lib/a.sh")).unwrap(),
            "echo a\n"
        );
        for bad in ["/etc/x", "../x", "lib/../../x", "", "script.sh", "exec.sh"] {
            let files = vec![(bad.to_owned(), String::new())];
            assert!(write_guest_files(&dir, &files).is_err(), "{bad:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The shipped topologies, their TCG `-cpu`, and what KVM on an Intel
    /// and on an AMD Zen host gives each (the table in the book's
    /// reference, "Accelerators").
    const VCPU_TABLE: &[(&str, &str, Accel, Accel)] = &[
        ("anchor-qemu-nvme", "max", Accel::Kvm, Accel::Kvm),
        ("lab", "max", Accel::Kvm, Accel::Kvm),
        ("lab-pmr", "max", Accel::Kvm, Accel::Kvm),
        ("rdma", "max", Accel::Kvm, Accel::Kvm),
        ("rdma-efa", "max", Accel::Kvm, Accel::Kvm),
        ("efa-tcp", "max", Accel::Kvm, Accel::Kvm),
        ("two-nvme", "max", Accel::Kvm, Accel::Kvm),
        ("dgx", "max,vendor=GenuineIntel", Accel::Kvm, Accel::Tcg),
        (
            "rdma-separate",
            "max,vendor=GenuineIntel",
            Accel::Kvm,
            Accel::Tcg,
        ),
        (
            "rdma-efa-separate",
            "max,vendor=GenuineIntel",
            Accel::Kvm,
            Accel::Tcg,
        ),
        (
            "same-switch-acs",
            "max,vendor=GenuineIntel",
            Accel::Kvm,
            Accel::Tcg,
        ),
        (
            "separate-root-ports",
            "max,vendor=GenuineIntel",
            Accel::Kvm,
            Accel::Tcg,
        ),
        ("viommu", "max,vendor=GenuineIntel", Accel::Kvm, Accel::Tcg),
        (
            "viommu-acs",
            "max,vendor=GenuineIntel",
            Accel::Kvm,
            Accel::Tcg,
        ),
        ("separate-root-ports-zen", "EPYC", Accel::Tcg, Accel::Kvm),
        ("viommu-amd", "EPYC", Accel::Tcg, Accel::Kvm),
    ];

    /// Catches: two labs using one state folder's disk images at once
    /// (each guest would read back the other's blocks): the second must
    /// wait until the first lets go, and a lab on another folder must not.
    #[test]
    fn a_state_folder_serves_one_lab_at_a_time() {
        let base = std::env::temp_dir().join(format!("p2plab-state-lock-{}", std::process::id()));
        let (one, other) = (base.join("one"), base.join("other"));
        std::fs::create_dir_all(&one).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let first = lock_state(&one).unwrap();
        let _elsewhere = lock_state(&other).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let one = one.clone();
            std::thread::spawn(move || {
                let lock = lock_state(&one);
                tx.send(()).unwrap();
                lock.map(drop)
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a second lab took a state folder in use"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the second lab never got the folder back");
        waiter.join().unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&base);
    }

    /// Catches: a shipped topology whose QEMU command line gets no
    /// `-accel`, two of them, the wrong `-cpu` for its accelerator (KVM:
    /// `host`; TCG: the topology's own), a vendor-dependent topology run
    /// under KVM on a host of the other vendor, or a new topology missing
    /// from the documented table.
    #[test]
    fn every_shipped_topology_gets_its_accelerator_and_vcpu() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../qemu-configs");
        let vars = Placeholders {
            run: PathBuf::from("/r"),
            state: PathBuf::from("/s"),
        };
        let mut shipped: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let path = e.unwrap().path();
                let is_args = path.extension().is_some_and(|x| x == "args");
                is_args.then(|| path.file_stem().unwrap().to_string_lossy().into_owned())
            })
            .collect();
        shipped.sort();
        let mut listed: Vec<String> = VCPU_TABLE.iter().map(|r| r.0.to_owned()).collect();
        listed.sort();
        assert_eq!(shipped, listed, "qemu-configs/ and the -cpu table differ");

        let host = |vendor: &str, family| HostCpu {
            vendor: vendor.to_owned(),
            family,
        };
        let count = |args: &[String], word: &str| args.iter().filter(|a| *a == word).count();
        let value = |args: &[String], word: &str| {
            let at = args.iter().position(|a| a == word).unwrap();
            args[at + 1].clone()
        };
        for &(name, tcg_cpu, on_intel, on_zen) in VCPU_TABLE {
            let topology = Topology::load(&dir.join(format!("{name}.args")), &vars).unwrap();
            let options = LabOptions::new(name, Mode::Interactive);
            let split = accel::split_args(&topology.qemu_args, &options.qemu_args).unwrap();
            assert_eq!(split.tcg_cpu.as_deref(), Some(tcg_cpu), "{name}");
            let auto = Requested::flag(AccelRequest::Auto);
            for (host, want) in [
                (host("GenuineIntel", 6), on_intel),
                (host("AuthenticAMD", 0x19), on_zen),
            ] {
                let cases = [(Ok(()), want), (Err("broken".to_owned()), Accel::Tcg)];
                for (probe, want) in cases {
                    let choice =
                        accel::choose(&auto, name, Some(tcg_cpu), || probe, || Ok(host.clone()))
                            .unwrap();
                    let args = split.head(&choice);
                    assert_eq!(choice.accel, want, "{name} on {host}");
                    assert_eq!(count(&args, "-accel"), 1, "{name}: {args:?}");
                    assert_eq!(count(&args, "-cpu"), 1, "{name}: {args:?}");
                    let (accel_arg, cpu) = match want {
                        Accel::Kvm => ("kvm", "host"),
                        Accel::Tcg => ("tcg,thread=multi", &*accel::tcg_vcpu(tcg_cpu)),
                    };
                    assert_eq!(value(&args, "-accel"), accel_arg, "{name} on {host}");
                    assert_eq!(value(&args, "-cpu"), cpu, "{name} on {host}");
                }
            }
        }
    }

    #[test]
    fn shell_quoting_round_trips_awkward_words() {
        let mut c = Command::new("qemu");
        c.arg("-device").arg("{\"a\":1}").arg("it's");
        assert_eq!(shell_words(&c), "qemu -device '{\"a\":1}' 'it'\\''s'\n");
    }
}
