//! `p2plab-p2pio`: a guest program that moves data between NVMe block
//! devices and PCI peer-to-peer memory the way user-space P2PDMA does since
//! Linux 6.2: it mmaps `/sys/bus/pci/devices/<bdf>/p2pmem/allocate` and does
//! O_DIRECT reads and writes with that mapping as the buffer, so the NVMe
//! controller DMAs straight to or from the peer's BAR.
//!
//! ```text
//! p2plab-p2pio --p2pmem BDF read  --dev /dev/nvme0n1 [--offset B] --len B [--chunk B] [--threads N]
//! p2plab-p2pio --p2pmem BDF write --dev /dev/nvme0n1 [--offset B] --len B ...
//! p2plab-p2pio --p2pmem BDF copy  --src /dev/nvme0n1 --dst /dev/nvme1n1 --len B ...
//! ```
//! `--p2pmem ram` uses a buffer in guest RAM instead, the same way, so a
//! benchmark can hold the P2P path against the RAM path.
//! `--fill SEED` writes a pattern into the buffer with the CPU before
//! `write`; `--verify SEED` checks the buffer after `read`; `--hook CMD`
//! runs `sh -c CMD` while the buffer is mapped (after `read`, before
//! `write`), with P2P_BAR, P2P_BAR_OFFSET and P2P_LEN in its environment, so
//! a device engine can work on the same bytes. Sizes take K/M/G suffixes.
//! It reports `KEY=VALUE` lines: where the buffer lives (BAR and offset),
//! bytes moved, errors (an errno per failed chunk is printed to stderr).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    /// Block device -> p2p buffer.
    Read,
    /// p2p buffer -> block device.
    Write,
    /// Source block device -> p2p buffer -> destination block device.
    Copy,
}

#[derive(Parser, Debug)]
#[command(name = "p2plab-p2pio")]
struct Cli {
    /// PCI device providing p2pmem: a BDF like 0000:03:00.0, or `ram`
    /// for a buffer in guest RAM (the reference the P2P path is held to).
    #[arg(long, value_name = "BDF|ram")]
    p2pmem: String,
    op: Op,
    /// Block device for read/write.
    #[arg(long)]
    dev: Option<PathBuf>,
    /// Source and destination for copy.
    #[arg(long)]
    src: Option<PathBuf>,
    #[arg(long)]
    dst: Option<PathBuf>,
    /// Byte offset on the block device(s).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    offset: u64,
    /// Bytes to move.
    #[arg(long, value_parser = parse_size)]
    len: u64,
    /// Bytes per I/O.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    chunk: u64,
    /// Parallel threads, each with its own part of the buffer.
    #[arg(long, default_value_t = 1)]
    threads: u64,
    /// Size of the p2p buffer (default: len, capped at 64 MiB for copy).
    #[arg(long, value_parser = parse_size)]
    buffer: Option<u64>,
    /// Fill the buffer with this pattern seed before a write.
    #[arg(long, value_parser = parse_size)]
    fill: Option<u64>,
    /// Check the buffer against this pattern seed after a read.
    #[arg(long, value_parser = parse_size)]
    verify: Option<u64>,
    /// Shell command to run while the buffer is mapped.
    #[arg(long)]
    hook: Option<String>,
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

/// A mapping of p2pmem/allocate (memory carved from the device's BAR), or
/// of anonymous guest RAM.
struct P2pBuffer {
    base: *mut u8,
    len: usize,
    _file: Option<File>,
}

// SAFETY: the mapping is plain shared memory; threads use disjoint parts.
unsafe impl Sync for P2pBuffer {}

impl P2pBuffer {
    /// `len` bytes of guest RAM, populated and shared like a p2pmem mapping.
    fn ram(len: usize) -> Result<Self> {
        // SAFETY: a fresh anonymous mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("mmap of {len} bytes of RAM"));
        }
        Ok(Self {
            base: base.cast(),
            len,
            _file: None,
        })
    }

    fn allocate(bdf: &str, len: usize) -> Result<Self> {
        let path = format!("/sys/bus/pci/devices/{bdf}/p2pmem/allocate");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {path} (is the device's p2pmem published?)"))?;
        // SAFETY: a fresh shared mapping of the allocate file; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("mmap of {len} bytes of {path}"));
        }
        Ok(Self {
            base: base.cast(),
            len,
            _file: Some(file),
        })
    }

    fn ptr(&self, offset: u64) -> *mut u8 {
        // SAFETY: callers pass offsets below len (checked by `chunks`).
        unsafe { self.base.add(offset as usize) }
    }

    /// Physical address of the first byte, from /proc/self/pagemap.
    fn physical_address(&self) -> Result<u64> {
        // Touching is not needed: p2pmem mappings are populated at mmap.
        let vaddr = self.base as u64;
        let mut pagemap = File::open("/proc/self/pagemap").context("opening pagemap")?;
        let mut entry = [0u8; 8];
        use std::io::{Read, Seek, SeekFrom};
        pagemap.seek(SeekFrom::Start(vaddr / 4096 * 8))?;
        pagemap.read_exact(&mut entry)?;
        let entry = u64::from_le_bytes(entry);
        if entry & (1 << 63) == 0 {
            bail!("buffer page not present in pagemap");
        }
        let pfn = entry & ((1 << 55) - 1);
        if pfn == 0 {
            bail!("pagemap hides PFNs (needs CAP_SYS_ADMIN)");
        }
        Ok(pfn * 4096 + vaddr % 4096)
    }
}

impl Drop for P2pBuffer {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `allocate` mapped.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// Which BAR of `bdf` holds `phys`, and at what offset.
fn locate_in_bar(bdf: &str, phys: u64) -> Result<(usize, u64)> {
    let table = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bdf}/resource"))?;
    for (index, line) in table.lines().enumerate().take(6) {
        let fields: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok())
            .collect();
        if let [start, end, _flags] = fields[..] {
            if start != 0 && (start..=end).contains(&phys) {
                return Ok((index, phys - start));
            }
        }
    }
    bail!("physical address {phys:#x} is in no BAR of {bdf}")
}

fn pattern_word(seed: u64, index: u64) -> u64 {
    let mut x = seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

fn open_direct(path: &Path, write: bool) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT", path.display()))
}

/// Stats shared by the worker threads.
#[derive(Default)]
struct Totals {
    bytes: AtomicU64,
    ios: AtomicU64,
    errors: AtomicU64,
}

/// One O_DIRECT transfer between `file` at `file_offset` and the buffer.
fn transfer(
    file: &File,
    write: bool,
    buf: *mut u8,
    len: u64,
    file_offset: u64,
) -> std::io::Result<()> {
    let mut done = 0u64;
    while done < len {
        let off = libc::off_t::try_from(file_offset + done)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: buf..buf+len lies inside the p2p mapping owned by the
        // caller for the duration of the call; the kernel validates the rest.
        let n = unsafe {
            let p = buf.add(done as usize).cast();
            let count = (len - done) as usize;
            if write {
                libc::pwrite(file.as_raw_fd(), p, count, off)
            } else {
                libc::pread(file.as_raw_fd(), p, count, off)
            }
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        done += n as u64;
    }
    Ok(())
}

/// Runs `step(chunk_index, buffer_offset, device_offset, chunk_len)` over
/// all chunks, `threads` at a time, each thread on its own buffer part.
fn run_chunks<F>(cli: &Cli, buffer_len: u64, totals: &Totals, step: F)
where
    F: Fn(u64, u64, u64) -> std::io::Result<()> + Sync,
{
    let chunks = cli.len.div_ceil(cli.chunk);
    let threads = cli.threads.clamp(1, chunks.max(1));
    let slots = buffer_len / cli.chunk;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let step = &step;
            scope.spawn(move || {
                // Thread t owns buffer slots t, t+threads, ...; it cycles
                // through them when the buffer is smaller than --len.
                let per_thread = (slots / threads).max(1);
                let mut index = t;
                while index < chunks {
                    let dev_off = cli.offset + index * cli.chunk;
                    let len = cli.chunk.min(cli.len - index * cli.chunk);
                    let round = index / threads;
                    let buf_off = (t + (round % per_thread) * threads) * cli.chunk;
                    match step(buf_off, dev_off, len) {
                        Ok(()) => {
                            totals.bytes.fetch_add(len, Ordering::Relaxed);
                            totals.ios.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => {
                            totals.errors.fetch_add(1, Ordering::Relaxed);
                            eprintln!("p2plab-p2pio: chunk at device offset {dev_off:#x}: {err}");
                        }
                    }
                    index += threads;
                }
            });
        }
    });
}

fn run(cli: &Cli) -> Result<bool> {
    if cli.len == 0 || cli.chunk == 0 || !cli.chunk.is_multiple_of(512) {
        bail!("--len must be > 0 and --chunk a non-zero multiple of 512");
    }
    let default_buffer = if cli.op == Op::Copy {
        cli.len.min(64 << 20)
    } else {
        cli.len
    };
    let buffer_len = cli
        .buffer
        .unwrap_or(default_buffer)
        .max(cli.chunk * cli.threads.min(cli.len.div_ceil(cli.chunk)));
    let buffer_len = buffer_len.div_ceil(4096) * 4096;
    if cli.op != Op::Copy
        && buffer_len < cli.len
        && (cli.verify.is_some() || cli.hook.is_some() || cli.fill.is_some())
    {
        bail!("--fill/--verify/--hook need a buffer as large as --len");
    }
    let in_ram = cli.p2pmem == "ram";
    let (buffer, bar, bar_offset) = if in_ram {
        if cli.hook.is_some() {
            bail!("--hook needs a device buffer, not --p2pmem ram");
        }
        let buffer = P2pBuffer::ram(usize::try_from(buffer_len)?)?;
        println!("P2P_BAR=ram");
        (buffer, 0, 0)
    } else {
        let buffer = P2pBuffer::allocate(&cli.p2pmem, usize::try_from(buffer_len)?)?;
        let phys = buffer.physical_address()?;
        let (bar, bar_offset) = locate_in_bar(&cli.p2pmem, phys)?;
        println!("P2P_BUFFER_PHYS={phys:#x}");
        println!("P2P_BAR={bar}");
        println!("P2P_BAR_OFFSET={bar_offset:#x}");
        (buffer, bar, bar_offset)
    };
    println!("P2P_BUFFER_LEN={buffer_len}");

    let run_hook = |stage: &str| -> Result<()> {
        if let Some(hook) = &cli.hook {
            let status = std::process::Command::new("sh")
                .arg("-c")
                .arg(hook)
                .env("P2P_BAR", bar.to_string())
                .env("P2P_BAR_OFFSET", format!("{bar_offset:#x}"))
                .env("P2P_LEN", cli.len.to_string())
                .env("P2P_STAGE", stage)
                .status()
                .context("running --hook")?;
            println!("HOOK_STATUS={}", status.code().unwrap_or(-1));
            if !status.success() {
                bail!("--hook failed ({status})");
            }
        }
        Ok(())
    };

    if let Some(seed) = cli.fill {
        for i in 0..cli.len / 8 {
            // SAFETY: i*8+8 <= len <= buffer_len (checked above).
            unsafe {
                buffer
                    .ptr(i * 8)
                    .cast::<u64>()
                    .write_volatile(pattern_word(seed, i))
            };
        }
    }
    if cli.op == Op::Write {
        run_hook("before-write")?;
    }

    let totals = Totals::default();
    let started = std::time::Instant::now();
    match cli.op {
        Op::Read | Op::Write => {
            let dev = cli
                .dev
                .as_deref()
                .context("--dev is needed for read and write")?;
            let write = cli.op == Op::Write;
            let file = open_direct(dev, write)?;
            run_chunks(cli, buffer_len, &totals, |buf_off, dev_off, len| {
                transfer(&file, write, buffer.ptr(buf_off), len, dev_off)
            });
            if write {
                // SAFETY: fdatasync on our own fd.
                if unsafe { libc::fdatasync(file.as_raw_fd()) } != 0 {
                    bail!("fdatasync: {}", std::io::Error::last_os_error());
                }
            }
        }
        Op::Copy => {
            let src = open_direct(
                cli.src.as_deref().context("--src is needed for copy")?,
                false,
            )?;
            let dst = open_direct(
                cli.dst.as_deref().context("--dst is needed for copy")?,
                true,
            )?;
            run_chunks(cli, buffer_len, &totals, |buf_off, dev_off, len| {
                transfer(&src, false, buffer.ptr(buf_off), len, dev_off)?;
                transfer(&dst, true, buffer.ptr(buf_off), len, dev_off)
            });
            // SAFETY: fdatasync on our own fd.
            if unsafe { libc::fdatasync(dst.as_raw_fd()) } != 0 {
                bail!("fdatasync: {}", std::io::Error::last_os_error());
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let bytes = totals.bytes.load(Ordering::Relaxed);
    let errors = totals.errors.load(Ordering::Relaxed);
    println!("BYTES={bytes}");
    println!("IOS={}", totals.ios.load(Ordering::Relaxed));
    println!("ERRORS={errors}");
    println!(
        "MIB_PER_SEC={:.1}",
        bytes as f64 / (1024.0 * 1024.0) / secs.max(1e-9)
    );

    if cli.op == Op::Read {
        run_hook("after-read")?;
        if let Some(seed) = cli.verify {
            let mut bad = 0u64;
            for i in 0..cli.len / 8 {
                // SAFETY: as for --fill.
                let got = unsafe { buffer.ptr(i * 8).cast::<u64>().read_volatile() };
                if got != pattern_word(seed, i) {
                    bad += 1;
                }
            }
            println!("VERIFY_BAD_WORDS={bad}");
            if bad != 0 {
                return Ok(false);
            }
        }
    }
    Ok(errors == 0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!("p2plab-p2pio: {err:#}");
            ExitCode::from(2)
        }
    }
}
