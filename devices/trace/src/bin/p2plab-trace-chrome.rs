//! `p2plab-trace-chrome`: device trace files (`*.trace.jsonl`) to one
//! Chrome trace-event JSON file for ui.perfetto.dev or chrome://tracing.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "p2plab-trace-chrome",
    version,
    about = "Convert p2plab device traces (*.trace.jsonl) into one Chrome/Perfetto trace-event JSON file",
    after_help = "Example:\n  p2plab-trace-chrome runs/latest/*.trace.jsonl -o runs/latest/trace.json\n  \
        then open runs/latest/trace.json in https://ui.perfetto.dev"
)]
struct Args {
    /// Trace files, one per device.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    /// Output file (default: standard output).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

fn run(args: &Args) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for path in &args.files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let lines = p2plab_trace::parse_lines(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        files.push((path.display().to_string(), lines));
    }
    let doc = p2plab_trace::chrome::convert(&files).map_err(anyhow::Error::msg)?;
    let text = serde_json::to_string(&doc)?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => println!("{text}"),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("p2plab-trace-chrome: {e}");
            ExitCode::FAILURE
        }
    }
}
