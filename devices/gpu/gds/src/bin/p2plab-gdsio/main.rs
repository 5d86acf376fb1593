//! `p2plab-gdsio`: a gdsio-like workload tool on p2plab-gds, for the guest.
//!
//! ```text
//! p2plab-gdsio read  --file F [--size B] [--io-size B] [--threads N] [--file-offset B] [--gpu-offset B] [--verify] [--json]
//! p2plab-gdsio write --file F --size B [--seed N] [--append] ... [--verify] [--json]
//! p2plab-gdsio info  [--file F] [--json]
//! ```
//! Reads fill a GPU buffer from the file, writes write the buffer (filled
//! with a seeded pattern by the GPU engine) to the file. It prints
//! throughput, the path taken (p2p, compat, mixed) and why, and with
//! `--verify` compares the GPU engine's CRC32C of the buffer with the
//! CPU's CRC32C of the file range. Exit status: 0 ok, 1 I/O errors or a
//! verify mismatch, 2 bad usage or setup failure.

mod info;
mod text;
mod workload;

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use p2plab_gds::{Driver, GpuBuffer, VramMapping};
use serde_json::{json, Value};

use info::{fs_type, route_json};
use workload::{Shape, Summary};

#[derive(Parser, Debug)]
#[command(
    name = "p2plab-gdsio",
    about = "gdsio-like file <-> GPU workloads on p2plab-gds"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// File -> GPU memory.
    Read(IoArgs),
    /// GPU memory -> file.
    Write(IoArgs),
    /// GPUs, and where a file's storage sits relative to the GPU.
    Info(InfoArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BufferKind {
    /// VRAM from the GPU's p2pmem (P2P-capable).
    P2pmem,
    /// VRAM mapped through /dev/p2plab-gpuN (compat only).
    Devmap,
}

#[derive(Args, Debug)]
struct IoArgs {
    /// The file (created by write if missing).
    #[arg(long)]
    file: PathBuf,
    /// Total bytes (read: default up to end of file).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Bytes per call.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    io_size: u64,
    /// Parallel threads.
    #[arg(long, default_value_t = 1)]
    threads: u64,
    /// First file offset.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    file_offset: u64,
    /// Offset in the GPU buffer of the first byte.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    gpu_offset: u64,
    /// The GPU (PCI name); default: the first p2plab GPU with p2pmem.
    #[arg(long)]
    gpu: Option<String>,
    /// Where the GPU buffer comes from.
    #[arg(long, value_enum, default_value = "p2pmem")]
    buffer: BufferKind,
    /// VRAM offset of a devmap buffer (default: the top of VRAM).
    #[arg(long, value_parser = parse_size)]
    devmap_offset: Option<u64>,
    /// Open the file without O_DIRECT (the library reopens it with).
    #[arg(long)]
    no_direct: bool,
    /// Write: open the file with O_APPEND.
    #[arg(long)]
    append: bool,
    /// Write: seed of the data pattern the GPU buffer is filled with.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Force compat mode (P2PLAB_GDS_FORCE_COMPAT).
    #[arg(long)]
    force_compat: bool,
    /// Compare the GPU's CRC32C of the buffer with the file's.
    #[arg(long)]
    verify: bool,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct InfoArgs {
    #[arg(long)]
    file: Option<PathBuf>,
    #[arg(long)]
    gpu: Option<String>,
    #[arg(long)]
    json: bool,
}

fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value = match digits.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => digits.parse(),
    }
    .map_err(|_| format!("not a size: {text:?}"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("too large: {text:?}"))
}

fn open_file(args: &IoArgs, write: bool) -> Result<File> {
    let mut flags = libc::O_CLOEXEC;
    if !args.no_direct {
        flags |= libc::O_DIRECT;
    }
    let mut options = OpenOptions::new();
    if write && args.append {
        options.append(true).create(true);
    } else if write {
        options.read(true).write(true).create(true);
    } else {
        options.read(true);
    }
    options
        .custom_flags(flags)
        .open(&args.file)
        .with_context(|| format!("opening {}", args.file.display()))
}

/// CRC32C of `len` bytes of `path` at `offset`, read through the page cache.
fn file_crc(path: &std::path::Path, offset: u64, len: u64) -> Result<u32> {
    let file = File::open(path).with_context(|| format!("reopening {}", path.display()))?;
    let mut crc = 0u32;
    let mut chunk = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        let got = file.read_at(&mut chunk[..n], offset + done)?;
        if got == 0 {
            bail!("{} ends {} bytes early", path.display(), len - done);
        }
        crc = crc32c::crc32c_append(crc, &chunk[..got]);
        done += got as u64;
    }
    Ok(crc)
}

fn make_buffer(driver: &Driver, args: &IoArgs, len: u64) -> Result<GpuBuffer> {
    let mapping = match args.buffer {
        BufferKind::P2pmem => driver.alloc_vram(args.gpu.as_deref(), len)?,
        BufferKind::Devmap => {
            let bdf = driver.pick_gpu(args.gpu.as_deref())?;
            let gpu = driver.gpu(&bdf)?;
            let len_pages = len.next_multiple_of(4096);
            let offset = match args.devmap_offset {
                Some(o) => o,
                None => gpu
                    .vram_size
                    .checked_sub(len_pages)
                    .context("the buffer is larger than VRAM")?,
            };
            driver.map_vram(Some(&bdf), offset, len)?
        }
    };
    let mapping: Arc<VramMapping> = Arc::new(mapping);
    Ok(driver.register_mapping(mapping)?)
}

/// Fills `[offset, offset + len)` of the buffer with the seeded pattern,
/// through the GPU engine.
fn fill_pattern(buf: &GpuBuffer, offset: u64, len: u64, seed: u64) -> Result<()> {
    let mut chunk = vec![0u8; 4 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        workload::pattern(seed, done, &mut chunk[..n]);
        buf.copy_from_host(offset + done, &chunk[..n])?;
        done += n as u64;
    }
    Ok(())
}

fn run_io(args: &IoArgs, write: bool) -> Result<(Value, bool)> {
    if args.io_size == 0 || args.threads == 0 {
        bail!("--io-size and --threads must be > 0");
    }
    let driver = Driver::open()?;
    if args.force_compat {
        driver.set_force_compat(true);
    }
    let file = open_file(args, write)?;
    let handle = driver.register_file(file.as_fd())?;
    let size_before = handle.size()?;
    let size = match args.size {
        Some(s) => s,
        None if write => bail!("write needs --size"),
        None => size_before.saturating_sub(args.file_offset),
    };
    if size == 0 {
        bail!("nothing to do: size 0");
    }
    let buf_len = args
        .gpu_offset
        .checked_add(size)
        .context("--gpu-offset + --size overflows")?;
    let buf = make_buffer(&driver, args, buf_len)?;
    if write {
        fill_pattern(&buf, args.gpu_offset, size, args.seed)?;
    } else {
        // Poison, so bytes a read fails to deliver cannot pass --verify.
        buf.fill(args.gpu_offset, size, 0xdead_beef)?;
    }

    let shape = Shape {
        write,
        size,
        io_size: args.io_size,
        threads: args.threads,
        file_offset: args.file_offset,
        gpu_offset: args.gpu_offset,
    };
    let summary: Summary = workload::run(&driver, &handle, &buf, shape);
    if write {
        file.sync_all().context("fsync")?;
    }

    let mut ok = summary.errors == 0;
    let verify = if args.verify && summary.bytes > 0 {
        // O_APPEND writes land at the end of file as it was.
        let start = if write && args.append {
            size_before
        } else {
            args.file_offset
        };
        let gpu_crc = buf.checksum(args.gpu_offset, summary.bytes)?;
        let file_crc = file_crc(&args.file, start, summary.bytes)?;
        ok &= gpu_crc == file_crc;
        json!({
            "ok": gpu_crc == file_crc,
            "bytes": summary.bytes,
            "file_offset": start,
            "gpu_crc": format!("{gpu_crc:08x}"),
            "file_crc": format!("{file_crc:08x}"),
        })
    } else {
        Value::Null
    };
    let mut out = json!({
        "op": if write { "write" } else { "read" },
        "file": args.file.display().to_string(),
        "fs_type": fs_type(&file),
        "app_direct": handle.app_direct,
        "dio_offset_align": handle.offset_align,
        "dio_mem_align": handle.mem_align,
        "file_size_before": size_before,
        "file_size_after": handle.size()?,
        "gpu": buf.location.bdf,
        "buffer": {
            "kind": buf.location.kind.name(),
            "bar": p2plab_gds::vram::VRAM_BAR,
            "vram_offset": buf.location.vram_offset,
            "size": buf.len,
        },
        "size": size,
        "io_size": args.io_size,
        "threads": args.threads,
        "file_offset": args.file_offset,
        "gpu_offset": args.gpu_offset,
        "force_compat": driver.force_compat(),
        "route": route_json(&driver, &handle, &buf.location.bdf),
        "verify": verify,
    });
    if let (Value::Object(o), Value::Object(s)) = (&mut out, summary.to_json()) {
        o.extend(s);
    }
    Ok((out, ok))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (json_out, result) = match &cli.command {
        Command::Read(a) => (a.json, run_io(a, false)),
        Command::Write(a) => (a.json, run_io(a, true)),
        Command::Info(a) => (a.json, info::run_info(a).map(|v| (v, true))),
    };
    match result {
        Ok((v, ok)) => {
            if json_out {
                println!("{v}");
            } else if matches!(cli.command, Command::Info(_)) {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                text::print_text(&v);
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(err) => {
            if json_out {
                println!("{}", json!({ "error": format!("{err:#}") }));
            }
            eprintln!("p2plab-gdsio: {err:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("0x10"), Ok(16));
        assert_eq!(parse_size("10000"), Ok(10000));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn cli_parses_a_gdsio_line() {
        let cli = Cli::try_parse_from([
            "p2plab-gdsio",
            "read",
            "--file",
            "/mnt/f",
            "--size",
            "32M",
            "--io-size",
            "1M",
            "--threads",
            "2",
            "--gpu-offset",
            "1",
            "--verify",
            "--json",
        ])
        .unwrap();
        let Command::Read(a) = cli.command else {
            panic!("not read")
        };
        assert_eq!(
            (a.size, a.io_size, a.threads, a.gpu_offset),
            (Some(32 << 20), 1 << 20, 2, 1)
        );
        assert!(a.verify && a.json && !a.no_direct);
        assert!(Cli::try_parse_from(["p2plab-gdsio", "read", "--size", "1M"]).is_err());
        assert!(
            Cli::try_parse_from(["p2plab-gdsio", "read", "--file", "f", "--buffer", "x"]).is_err()
        );
    }
}
