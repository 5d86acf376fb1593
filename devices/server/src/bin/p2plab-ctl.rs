//! `p2plab-ctl`: talks to a running p2plab device server through its
//! control socket (status, fault injection, reset).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use p2plab_server::control::{request, request_over_port, ControlRequest};

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
        p2plab-ctl runs/latest/gpu0.ctl inject hang,count=1,opcode=checksum"
)]
struct Args {
    /// On the host: the server's control socket (`NAME.ctl` in the run
    /// folder; its vfio-user socket `NAME.sock` works too). In the guest:
    /// the device id (`nvme0`), reached through the virtio-serial port
    /// `p2plab.ctl.ID` that the lab connects to the server's guest control
    /// socket when asked (`run-vm --guest-control`), or the port's device
    /// node (`/dev/vport1p1`).
    #[arg(value_name = "SOCKET|ID")]
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
