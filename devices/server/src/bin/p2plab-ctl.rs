//! `p2plab-ctl`: talks to a running p2plab device server through its
//! control socket (status, fault injection, reset), or to every server of
//! a run at once (marks and the provenance verdict).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use p2plab_server::control::{request, request_over_port, ControlRequest};
use p2plab_server::provenance::{Mark, Provenance, Servers};

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-ctl",
    version,
    about = "Control a running p2plab device server: status, fault injection, reset, trace",
    after_help = "Examples:\n  \
        p2plab-ctl runs/latest/nvme0.ctl status --json\n  \
        p2plab-ctl runs/latest/nvme0.ctl inject timeout,count=1,opcode=read\n  \
        p2plab-ctl runs/latest/nvme0.ctl inject media-error:lba=100-199\n  \
        p2plab-ctl runs/latest/nvme0.ctl clear\n  \
        p2plab-ctl runs/latest/nvme0.ctl trace on --follow\n  \
        p2plab-ctl runs/latest/gpu0.ctl inject hang,count=1,opcode=checksum\n  \
        p2plab-ctl runs/latest mark before; ...; p2plab-ctl runs/latest provenance --since before"
)]
struct Args {
    /// On the host: the server's control socket (`NAME.ctl` in the run
    /// folder; its vfio-user socket `NAME.sock` works too). In the guest:
    /// the device id (`nvme0`), reached through the virtio-serial port
    /// `p2plab.ctl.ID` that the lab connects to the server's guest control
    /// socket when asked (`run-vm --guest-control`), or the port's device
    /// node (`/dev/vport1p1`). For `mark` and `provenance`: the run folder
    /// on the host (`runs/latest`), `all` in the guest (with
    /// `--guest-control`).
    #[arg(value_name = "SOCKET|ID|RUN")]
    socket: PathBuf,

    /// Print the server's reply as JSON.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Live state: registers, queues, BARs, counters, armed injections.
    Status,
    /// Arm fault injections (see README "Breaking things on purpose"),
    /// e.g. `status=0x281,dnr,count=3,opcode=read`, `timeout,count=1`,
    /// `media-error:lba=100-199`, `cfs`, `drop-irq,count=1`.
    Inject {
        #[arg(value_name = "SPEC", required = true)]
        specs: Vec<String>,
    },
    /// Disarm every injection (media-error blocks read fine again).
    Clear,
    /// Reset the device as a function-level reset would (host only).
    Reset,
    /// Switch the decoded trace on or off, or show where it stands; with
    /// --follow, print its events as they come (host only; Ctrl-C ends).
    Trace {
        #[arg(value_name = "on|off")]
        state: Option<OnOff>,
        /// Print each new event as a human-readable line (raw JSON with
        /// --json) until interrupted.
        #[arg(long)]
        follow: bool,
        /// With --follow: start at the beginning of the trace file rather
        /// than at its end.
        #[arg(long, requires = "follow")]
        from_start: bool,
    },
    /// Keep every server's counters now under NAME (in `RUN/marks/`, or
    /// --marks-dir), for `provenance`.
    Mark {
        #[arg(value_name = "NAME")]
        name: String,
        /// Where marks are kept (default: RUN/marks on the host,
        /// /run/p2plab-ctl/marks in the guest).
        #[arg(long, value_name = "DIR")]
        marks_dir: Option<PathBuf>,
    },
    /// Did any byte of the transfers to or from the GPU go through guest
    /// RAM between two marks? Exit status 0: no; 1: yes, or fewer than
    /// --min-p2p bytes moved peer-to-peer; 2: cannot tell (a server
    /// restarted, a mark is missing).
    Provenance {
        /// The earlier mark.
        #[arg(long, value_name = "NAME")]
        since: String,
        /// The later mark (default: the servers' counters now).
        #[arg(long, value_name = "NAME")]
        until: Option<String>,
        /// The GPU to judge (repeatable; default: every GPU of the run).
        #[arg(long = "device", value_name = "ID")]
        devices: Vec<String>,
        /// Also fail unless at least this many bytes moved peer-to-peer
        /// (`16M`): catches P2P that silently never touched the GPU.
        #[arg(long, value_name = "BYTES", default_value = "0", value_parser = parse_bytes)]
        min_p2p: u64,
        /// Where marks are kept (see `mark`).
        #[arg(long, value_name = "DIR")]
        marks_dir: Option<PathBuf>,
    },
}

/// `4096`, `64K`, `16M`, `1G`.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{text:?} is not a byte count like 4096, 64K or 16M"))
}

/// The servers of the run `arg` names: a run folder on the host, `all`
/// in the guest.
fn run_servers(arg: &Path) -> Result<Servers, String> {
    if arg.is_dir() {
        return Ok(Servers::RunDir(arg.to_path_buf()));
    }
    if arg == Path::new("all") {
        return Servers::guest_ports().map_err(|e| format!("{e:#}"));
    }
    Err(format!(
        "{}: mark and provenance take a run folder (runs/latest) on the host, or `all` in the guest",
        arg.display()
    ))
}

/// `mark` and `provenance`: every server of a run at once.
fn run_level(arg: &Path, command: Command, json: bool) -> ExitCode {
    const CANNOT_TELL: u8 = 2;
    let servers = match run_servers(arg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("p2plab-ctl: {e}");
            return ExitCode::from(CANNOT_TELL);
        }
    };
    match command {
        Command::Mark { name, marks_dir } => {
            let dir = marks_dir.unwrap_or_else(|| servers.default_marks_dir());
            match Mark::take(&name, &servers).and_then(|m| Ok((m.save(&dir)?, m))) {
                Ok((path, mark)) => {
                    if json {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&mark).unwrap_or_default()
                        );
                    } else {
                        let ids: Vec<&str> = mark.servers.keys().map(String::as_str).collect();
                        println!("mark {name}: {} ({})", path.display(), ids.join(", "));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("p2plab-ctl: mark {name}: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Provenance {
            since,
            until,
            devices,
            min_p2p,
            marks_dir,
        } => {
            let dir = marks_dir.unwrap_or_else(|| servers.default_marks_dir());
            let answer = Mark::load(&dir, &since).and_then(|a| {
                let b = match &until {
                    Some(name) => Mark::load(&dir, name)?,
                    None => Mark::take("now", &servers)?,
                };
                Provenance::between(&a, &b, &devices)
            });
            match answer {
                Ok(answer) => {
                    let failure = answer.failure(min_p2p);
                    if json {
                        let mut value = serde_json::to_value(&answer).unwrap_or_default();
                        if let Some(object) = value.as_object_mut() {
                            object.insert("bounced_bytes".into(), answer.bounced().into());
                            object.insert("p2p_bytes".into(), answer.peer_to_peer().into());
                            object.insert("pass".into(), failure.is_none().into());
                            object.insert("why".into(), failure.clone().into());
                        }
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&value).unwrap_or_default()
                        );
                    } else {
                        print!("{}", answer.report(min_p2p));
                    }
                    if failure.is_some() {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(e) => {
                    eprintln!("p2plab-ctl: provenance: cannot tell: {e:#}");
                    ExitCode::from(CANNOT_TELL)
                }
            }
        }
        _ => ExitCode::from(CANNOT_TELL),
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// Prints the events appended to the trace file at `path`, forever.
fn follow(path: &Path, from_start: bool, json: bool) -> anyhow::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut file = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("opening the trace {}: {e}", path.display()))?;
    if !from_start {
        file.seek(SeekFrom::End(0))?;
    }
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let shown = if json {
                text.to_string()
            } else {
                match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(event) => p2plab_trace::human(&event),
                    Err(_) => format!("(unreadable line) {text}"),
                }
            };
            // A closed pipe (`| head`) ends the follow quietly.
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{shown}").and_then(|()| out.flush()).is_err() {
                return Ok(());
            }
        }
    }
}

/// Where requests go.
enum Target {
    Socket(PathBuf),
    Port(PathBuf),
}

/// The virtio-serial port named `p2plab.ctl.ID` (guest side).
fn guest_port(id: &str) -> Option<PathBuf> {
    let want = format!("p2plab.ctl.{id}");
    std::fs::read_dir("/sys/class/virtio-ports")
        .ok()?
        .flatten()
        .find(|entry| {
            std::fs::read_to_string(entry.path().join("name")).is_ok_and(|name| name.trim() == want)
        })
        .map(|entry| Path::new("/dev").join(entry.file_name()))
}

fn target(arg: PathBuf) -> Result<Target, String> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::metadata(&arg) {
        if meta.file_type().is_char_device() {
            return Ok(Target::Port(arg));
        }
    }
    if arg.extension().is_some_and(|e| e == "sock") {
        return Ok(Target::Socket(arg.with_extension("ctl")));
    }
    if arg.exists() {
        return Ok(Target::Socket(arg));
    }
    let text = arg.to_string_lossy();
    if !text.contains('/') {
        if let Some(port) = guest_port(&text) {
            return Ok(Target::Port(port));
        }
    }
    Err(format!(
        "{text}: no control socket there, and no virtio-serial port p2plab.ctl.{text} \
         (in a guest, the lab adds one only when asked: scripts/run-vm --guest-control {text})"
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    if matches!(
        args.command,
        Command::Mark { .. } | Command::Provenance { .. }
    ) {
        return run_level(&args.socket, args.command, args.json);
    }
    let target = match target(args.socket) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("p2plab-ctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = match &target {
        Target::Socket(p) | Target::Port(p) => p.clone(),
    };
    let follow_from = match &args.command {
        Command::Trace {
            follow: true,
            from_start,
            ..
        } => Some(*from_start),
        _ => None,
    };
    let requests: Vec<ControlRequest> = match args.command {
        Command::Status => vec![ControlRequest::Status],
        Command::Inject { specs } => specs
            .into_iter()
            .map(|spec| ControlRequest::Inject { spec })
            .collect(),
        Command::Clear => vec![ControlRequest::Clear],
        Command::Reset => vec![ControlRequest::Reset],
        Command::Trace { state, .. } => vec![ControlRequest::Trace {
            on: state.map(|s| matches!(s, OnOff::On)),
        }],
        Command::Mark { .. } | Command::Provenance { .. } => Vec::new(),
    };
    for req in &requests {
        let reply = match &target {
            Target::Socket(p) => request(p, req),
            Target::Port(p) => request_over_port(p, req),
        };
        match reply {
            Ok(result) => {
                if let (Some(from_start), Target::Socket(_)) = (follow_from, &target) {
                    let Some(trace) = result["path"].as_str() else {
                        eprintln!("p2plab-ctl: {}: no trace file", path.display());
                        return ExitCode::FAILURE;
                    };
                    return match follow(Path::new(trace), from_start, args.json) {
                        Ok(()) => ExitCode::SUCCESS,
                        Err(e) => {
                            eprintln!("p2plab-ctl: {e}");
                            ExitCode::FAILURE
                        }
                    };
                } else if follow_from.is_some() {
                    eprintln!("p2plab-ctl: --follow reads the trace file, which is on the host");
                    return ExitCode::FAILURE;
                }
                if args.json || matches!(req, ControlRequest::Status) {
                    let text = serde_json::to_string_pretty(&result).unwrap_or_default();
                    println!("{text}");
                } else {
                    match (req, result.get("id")) {
                        (ControlRequest::Inject { spec }, Some(id)) => {
                            println!("armed {id}: {}", result["spec"].as_str().unwrap_or(spec))
                        }
                        (ControlRequest::Clear, _) => println!("cleared"),
                        (ControlRequest::Reset, _) => println!("reset"),
                        (ControlRequest::Trace { .. }, _) => println!(
                            "trace {} -> {} ({} events, {} of {} bytes{})",
                            if result["on"] == true { "on" } else { "off" },
                            result["path"].as_str().unwrap_or("(no file)"),
                            result["events"],
                            result["bytes"],
                            result["max_bytes"],
                            if result["stopped_at_cap"] == true {
                                "; stopped at the cap"
                            } else {
                                ""
                            }
                        ),
                        _ => println!("{result}"),
                    }
                }
            }
            Err(e) => {
                eprintln!("p2plab-ctl: {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
