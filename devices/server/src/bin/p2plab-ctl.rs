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
    about = "Control a running p2plab device server: status, fault injection, reset",
    after_help = "Examples:\n  \
        p2plab-ctl runs/latest/nvme0.ctl status --json\n  \
        p2plab-ctl runs/latest/nvme0.ctl inject timeout,count=1,opcode=read\n  \
        p2plab-ctl runs/latest/nvme0.ctl inject media-error:lba=100-199\n  \
        p2plab-ctl runs/latest/nvme0.ctl clear\n  \
        p2plab-ctl runs/latest/gpu0.ctl inject hang,count=1,opcode=checksum"
)]
struct Args {
    /// On the host: the server's control socket (`NAME.ctl` in the run
    /// folder; its vfio-user socket `NAME.sock` works too). In the guest:
    /// the device id (`nvme0`), reached through the virtio-serial port
    /// `p2plab.ctl.ID` that the lab connects to that socket, or the port's
    /// device node (`/dev/vport1p1`).
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
    /// Reset the device as a function-level reset would.
    Reset,
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
        "{text}: no control socket there, and no virtio-serial port p2plab.ctl.{text}"
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
    let requests: Vec<ControlRequest> = match args.command {
        Command::Status => vec![ControlRequest::Status],
        Command::Inject { specs } => specs
            .into_iter()
            .map(|spec| ControlRequest::Inject { spec })
            .collect(),
        Command::Clear => vec![ControlRequest::Clear],
        Command::Reset => vec![ControlRequest::Reset],
    };
    for req in &requests {
        let reply = match &target {
            Target::Socket(p) => request(p, req),
            Target::Port(p) => request_over_port(p, req),
        };
        match reply {
            Ok(result) => {
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
