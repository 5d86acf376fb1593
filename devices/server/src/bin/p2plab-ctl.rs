//! `p2plab-ctl`: talks to a running p2plab device server through its
//! control socket (status, fault injection, reset).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use p2plab_server::control::{request, ControlRequest};

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-ctl",
    version,
    about = "Control a running p2plab device server: status, fault injection, reset",
    after_help = "Examples:\n  \
        p2plab-ctl runs/latest/nvme0.ctl status --json\n  \
        p2plab-ctl runs/latest/nvme0.ctl inject timeout,count=1,opcode=read\n  \
        p2plab-ctl runs/latest/nvme0.ctl inject media-error:lba=100-199\n  \
        p2plab-ctl runs/latest/nvme0.ctl clear"
)]
struct Args {
    /// The server's control socket (`NAME.ctl` in the run folder). Its
    /// vfio-user socket (`NAME.sock`) works too.
    #[arg(value_name = "SOCKET")]
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

fn control_path(socket: PathBuf) -> PathBuf {
    if socket.extension().is_some_and(|e| e == "sock") {
        socket.with_extension("ctl")
    } else {
        socket
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let path = control_path(args.socket);
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
        match request(&path, req) {
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
