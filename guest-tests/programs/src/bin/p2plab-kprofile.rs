//! Where the guest kernel spends its vCPU time, for a guest booted with
//! `profile=2` (`scripts/run-vm --append profile=2`).
//!
//! Under TCG the guest's vCPU is often what limits a workload, and the
//! host's `perf` sees only QEMU's translated code. The kernel's own
//! profiler (`/proc/profile`, one counter per 4 bytes of kernel text,
//! bumped on every timer tick) needs no PMU and no tools in the guest; this
//! program resets it and prints the ticks per kernel function, named from
//! `/proc/kallsyms`.
//!
//! ```text
//! p2plab-kprofile reset
//! fio ...
//! p2plab-kprofile top --count 20        # or --json
//! ```

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "p2plab-kprofile",
    about = "Guest kernel time per function, from /proc/profile (boot with profile=2)"
)]
struct Cli {
    /// The profile buffer (the kernel's /proc/profile).
    #[arg(long, default_value = "/proc/profile")]
    profile: PathBuf,
    /// The kernel's symbol table.
    #[arg(long, default_value = "/proc/kallsyms")]
    kallsyms: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Zero every counter (start of a measurement).
    Reset,
    /// The functions with the most ticks since boot or the last reset.
    Top {
        /// How many functions to print.
        #[arg(long, default_value_t = 25)]
        count: usize,
        /// Print JSON: {"ticks": total, "functions": [{"symbol", "ticks"}]}.
        #[arg(long)]
        json: bool,
    },
}

/// Kernel text symbols (`t`/`T`/`w`/`W` lines of kallsyms), sorted by
/// address.
struct Symbols {
    starts: Vec<u64>,
    names: Vec<String>,
    stext: u64,
}

impl Symbols {
    fn parse(kallsyms: &str) -> Result<Symbols> {
        let mut text: Vec<(u64, &str)> = Vec::new();
        let mut stext = None;
        for line in kallsyms.lines() {
            let mut fields = line.split_whitespace();
            let (Some(address), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(address) = u64::from_str_radix(address, 16) else {
                continue;
            };
            if name == "_stext" {
                stext = Some(address);
            }
            if matches!(kind, "t" | "T" | "w" | "W") {
                text.push((address, name));
            }
        }
        let stext = stext.context("kallsyms has no _stext")?;
        if stext == 0 {
            bail!(
                "kallsyms hides its addresses (all zero): run as root with \
                 `sysctl kernel.kptr_restrict=0`"
            );
        }
        text.sort_unstable();
        Ok(Symbols {
            starts: text.iter().map(|(a, _)| *a).collect(),
            names: text.iter().map(|(_, n)| (*n).to_owned()).collect(),
            stext,
        })
    }

    /// The function whose text holds `address`.
    fn name(&self, address: u64) -> &str {
        match self.starts.partition_point(|&start| start <= address) {
            0 => "(before the first symbol)",
            i => &self.names[i - 1],
        }
    }
}

/// Ticks per function from the raw profile buffer: a native-endian u32
/// holding the bytes of text per counter, then one u32 counter per step
/// from `_stext` on.
fn ticks_per_function(profile: &[u8], symbols: &Symbols) -> Result<(u64, Vec<(String, u64)>)> {
    let words: Vec<u32> = profile
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let Some((&step, counters)) = words.split_first() else {
        bail!("the profile buffer is empty");
    };
    if step == 0 || !step.is_power_of_two() {
        bail!("the profile buffer's step is {step}, not a power of two");
    }
    let mut per_function: HashMap<&str, u64> = HashMap::new();
    let mut total = 0u64;
    for (index, &count) in counters.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let offset = (index as u64).saturating_mul(u64::from(step));
        let name = symbols.name(symbols.stext.saturating_add(offset));
        *per_function.entry(name).or_default() += u64::from(count);
        total += u64::from(count);
    }
    let mut sorted: Vec<(String, u64)> = per_function
        .into_iter()
        .map(|(name, ticks)| (name.to_owned(), ticks))
        .collect();
    sorted.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok((total, sorted))
}

fn read_profile(cli: &Cli) -> Result<Vec<u8>> {
    std::fs::read(&cli.profile).with_context(|| {
        format!(
            "reading {} (is the guest booted with profile=2? scripts/run-vm --append profile=2)",
            cli.profile.display()
        )
    })
}

/// The symbol table; when the kernel hides its addresses
/// (`kernel.kptr_restrict`), this lab guest's root lifts that and reads
/// again.
fn read_symbols(cli: &Cli) -> Result<Symbols> {
    let read = || {
        std::fs::read_to_string(&cli.kallsyms)
            .with_context(|| format!("reading {}", cli.kallsyms.display()))
    };
    match Symbols::parse(&read()?) {
        Err(_) if std::fs::write(KPTR_RESTRICT, b"0").is_ok() => Symbols::parse(&read()?),
        parsed => parsed,
    }
}

const KPTR_RESTRICT: &str = "/proc/sys/kernel/kptr_restrict";

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Reset => {
            // Any write zeroes the counters.
            std::fs::write(&cli.profile, b"0").with_context(|| {
                format!(
                    "resetting {} (booted with profile=2? root?)",
                    cli.profile.display()
                )
            })?;
        }
        Command::Top { count, json } => {
            let profile = read_profile(&cli)?;
            let symbols = read_symbols(&cli)?;
            let (total, functions) = ticks_per_function(&profile, &symbols)?;
            if json {
                let functions: Vec<_> = functions
                    .iter()
                    .take(count)
                    .map(|(symbol, ticks)| serde_json::json!({"symbol": symbol, "ticks": ticks}))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"ticks": total, "functions": functions})
                );
            } else {
                println!("{total} ticks in the kernel (idle included)");
                for (symbol, ticks) in functions.iter().take(count) {
                    let share = 100.0 * *ticks as f64 / total.max(1) as f64;
                    println!("{ticks:>9} {share:>5.1}%  {symbol}");
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81000000 T startup_64
ffffffff81000100 t helper
ffffffff81000200 D some_data
ffffffff81000300 T busy_function
";

    fn buffer(step: u32, counters: &[u32]) -> Vec<u8> {
        std::iter::once(step)
            .chain(counters.iter().copied())
            .flat_map(u32::to_ne_bytes)
            .collect()
    }

    /// Catches a profile read with the wrong step (the first word is bytes
    /// per counter, not a shift), counters charged to the wrong function,
    /// or data symbols taken for functions.
    #[test]
    fn ticks_go_to_the_function_that_holds_the_counter() {
        let symbols = Symbols::parse(KALLSYMS).unwrap();
        // Step 64: counter i covers _stext + 64 * i.
        let mut counters = vec![0u32; 16];
        counters[1] = 2; // 0x40: startup_64
        counters[4] = 5; // 0x100: helper
        counters[9] = 7; // 0x240: helper (some_data is not text)
        counters[12] = 11; // 0x300: busy_function
        let (total, functions) = ticks_per_function(&buffer(64, &counters), &symbols).unwrap();
        assert_eq!(total, 25);
        assert_eq!(
            functions,
            vec![
                ("helper".to_owned(), 12),
                ("busy_function".to_owned(), 11),
                ("startup_64".to_owned(), 2),
            ]
        );
    }

    /// Catches a tool that prints garbage names when kallsyms hides its
    /// addresses, or that accepts a truncated or malformed buffer.
    #[test]
    fn hidden_symbols_and_bad_buffers_are_errors() {
        let hidden = KALLSYMS
            .lines()
            .map(|l| format!("0000000000000000{}", &l[16..]))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(Symbols::parse(&hidden).is_err());
        assert!(Symbols::parse("").is_err());
        let symbols = Symbols::parse(KALLSYMS).unwrap();
        assert!(ticks_per_function(&[], &symbols).is_err());
        assert!(ticks_per_function(&buffer(3, &[1]), &symbols).is_err());
        assert!(ticks_per_function(&buffer(0, &[1]), &symbols).is_err());
    }
}
