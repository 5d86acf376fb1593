//! Benchmark tables for the docs, generated from the `results.json` files
//! `scripts/bench` writes (kept in `guest-tests/bench/`), so nobody copies
//! figures by hand.
//!
//! A page asks for a table with a pair of markers:
//!
//! ```text
//! <!-- bench-table guest-tests/bench/results-page.json -->
//! (generated: the run's date, machine and settings, then the tables)
//! <!-- end bench-table -->
//! ```
//!
//! `p2plab-docs bench-tables` rewrites what is between them; the
//! `bench_tables` test fails when a page differs from what its JSON gives.
//! Cells read as the bench prints them: the median of the rounds with the
//! min–max spread; a ratio is the median of the per-round ratios.

use std::fmt::Write as _;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// The line that opens a generated table; the JSON's repository path
/// follows it.
pub const BEGIN: &str = "<!-- bench-table ";
/// The line that closes it.
pub const END: &str = "<!-- end bench-table -->";

/// One marked region of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// The JSON file's repository path, as the marker names it.
    pub json: String,
    /// Byte range of the generated text (between the marker lines).
    pub body: std::ops::Range<usize>,
    /// Line number of the opening marker.
    pub line: usize,
}

/// Every marked region of `page`.
pub fn regions(page: &str) -> Result<Vec<Region>> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut open: Option<(String, usize, usize)> = None;
    for (i, line) in page.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += line.len();
        let text = line.trim();
        if let Some(rest) = text.strip_prefix(BEGIN.trim_end()) {
            if open.is_some() {
                bail!("line {}: bench-table marker inside another", i + 1);
            }
            let json = rest.trim().trim_end_matches("-->").trim().to_string();
            if json.is_empty() {
                bail!("line {}: bench-table marker without a JSON path", i + 1);
            }
            open = Some((json, offset, i + 1));
        } else if text == END {
            let (json, body_start, line) = open
                .take()
                .ok_or_else(|| anyhow!("line {}: end of a bench-table never opened", i + 1))?;
            out.push(Region {
                json,
                body: body_start..start,
                line,
            });
        }
    }
    if let Some((json, _, line)) = open {
        bail!("line {line}: bench-table for {json} is never closed");
    }
    Ok(out)
}

/// The spread of a figure as the JSON holds it.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(v: &Value) -> Option<Spread> {
    Some(Spread {
        median: v.get("median")?.as_f64()?,
        min: v.get("min")?.as_f64()?,
        max: v.get("max")?.as_f64()?,
    })
}

/// The bench's spread of samples: the median (the mean of the middle two
/// for an even count), min and max.
fn spread_of(values: &[f64]) -> Option<Spread> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let (min, max) = (*v.first()?, *v.last()?);
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread { median, min, max })
}

fn figure_cell(s: Option<Spread>) -> String {
    s.map_or("-".into(), |s| {
        format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max)
    })
}

fn ratio_cell(s: Option<Spread>) -> String {
    s.map_or("-".into(), |s| {
        format!("{:.2} ({:.2}–{:.2})", s.median, s.min, s.max)
    })
}

fn samples(v: Option<&Value>) -> Vec<f64> {
    v.and_then(|v| v.get("samples"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Result<&'a str> {
    let mut at = v;
    for key in path {
        at = at
            .get(key)
            .ok_or_else(|| anyhow!("no {} in the results", path.join(".")))?;
    }
    at.as_str()
        .ok_or_else(|| anyhow!("{} is not a string", path.join(".")))
}

fn array<'a>(v: &'a Value, key: &str) -> Result<&'a [Value]> {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .ok_or_else(|| anyhow!("no {key} list in the results"))
}

/// `20261123-230543` as `2026-11-23 23:05:43`.
fn format_date(stamp: &str) -> Result<String> {
    let ok = stamp.len() == 15
        && stamp.as_bytes()[8] == b'-'
        && stamp
            .chars()
            .enumerate()
            .all(|(i, c)| i == 8 || c.is_ascii_digit());
    if !ok {
        bail!("date_utc {stamp:?} is not YYYYMMDD-HHMMSS");
    }
    let s = stamp;
    Ok(format!(
        "{}-{}-{} {}:{}:{}",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15]
    ))
}

/// One comparison table: a header and rows of (figure, left, right,
/// ratio) from a list of the bench's rows.
fn comparison(out: &mut String, header: [&str; 4], rows: &[Value], left: &str, right: &str) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n| {} | {} | {} | {} |",
        header[0], header[1], header[2], header[3]
    );
    out.push_str("|---|--:|--:|--:|\n");
    for row in rows {
        let figure = row.get("figure").and_then(Value::as_str).unwrap_or("?");
        let _ = writeln!(
            out,
            "| {figure} | {} | {} | {} |",
            figure_cell(row.get(left).and_then(spread)),
            figure_cell(row.get(right).and_then(spread)),
            ratio_cell(row.get("ratio").and_then(spread)),
        );
    }
}

/// The generated text for one results file: a line with the run's date,
/// machine and settings, then one table per part the run measured.
pub fn render(results: &Value) -> Result<String> {
    let date = format_date(str_at(results, &["date_utc"])?)?;
    let machine = results
        .get("machine")
        .ok_or_else(|| anyhow!("no machine in the results"))?;
    let cpu = str_at(machine, &["cpu_model"])?;
    let cpus = machine.get("cpus").and_then(Value::as_u64).unwrap_or(0);
    let kernel = str_at(machine, &["host_kernel"])?;
    let load: Vec<&str> = str_at(machine, &["load_average_at_end"])?
        .split_whitespace()
        .take(3)
        .collect();
    let rounds = results.get("rounds").and_then(Value::as_u64).unwrap_or(0);
    let compared = array(results, "compared")?;
    let p2p = array(results, "p2p")?;
    let rdma_rows = array(results, "rdma_rows")?;
    let efa_rows = results
        .get("efa_rows")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);

    let mut out = String::new();
    let _ = write!(
        out,
        "\nRun of {date} UTC on {cpu} ({cpus} CPUs, host kernel {kernel}), load \
         average {} at the end; {rounds} rounds, each cell the median (min–max) \
         of the rounds, each ratio the median of the per-round ratios.",
        load.join(" ")
    );
    if !compared.is_empty() || !p2p.is_empty() {
        let runtime = results
            .get("runtime_s")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let caching = str_at(results, &["caching"])?;
        let _ = write!(out, " fio jobs of {runtime} s, `--caching {caching}`");
        if !compared.is_empty() {
            let _ = write!(
                out,
                "; the anchor's drive: `{}`",
                str_at(results, &["anchor", "drive"])?
            );
        }
        out.push('.');
    }
    if !rdma_rows.is_empty() {
        let mtus: Vec<String> = results
            .pointer("/rdma/mtus")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|m| m.to_string()).collect())
            .unwrap_or_default();
        let _ = write!(
            out,
            " RDMA: {} per transfer in {} posts, MTU {}.",
            str_at(results, &["rdma", "len"])?,
            str_at(results, &["rdma", "post"])?,
            mtus.join(" and ")
        );
    }
    if !efa_rows.is_empty() {
        let wrs: Vec<&str> = results
            .pointer("/efa/read_wrs")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let _ = write!(
            out,
            " EFA: one boot of `{}`, {} per call in SRD SENDs of {}, then RDMA-read back in \
             work requests of {}; GPU memory and guest RAM interleaved.",
            str_at(results, &["efa", "topology"])?,
            str_at(results, &["efa", "len"])?,
            str_at(results, &["efa", "msg"])?,
            wrs.join(", ")
        );
    }
    out.push('\n');

    comparison(
        &mut out,
        ["workload", "p2plab-nvme", "qemu nvme", "ratio"],
        compared,
        "p2plab_nvme",
        "qemu_nvme",
    );
    let compared_spdk = results
        .get("compared_spdk")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    if !compared_spdk.is_empty() {
        let _ = write!(
            out,
            "\nSPDK {} `nvmf_tgt` (VFIOUSER transport, aio bdev, one reactor) attached with \
             `vfio-user-pci`, booted in the same rounds:\n",
            str_at(results, &["spdk", "version"])?
        );
    }
    comparison(
        &mut out,
        ["workload", "p2plab-nvme", "spdk nvmf_tgt", "ratio"],
        compared_spdk,
        "p2plab_nvme",
        "spdk",
    );
    render_host_cpu(&mut out, results);
    comparison(
        &mut out,
        [
            "P2P workload (p2plab, same boot)",
            "GPU p2pmem",
            "guest RAM",
            "ratio",
        ],
        p2p,
        "p2p",
        "ram",
    );
    comparison(
        &mut out,
        [
            "RDMA workload (same boot)",
            "GPU memory",
            "guest RAM",
            "ratio",
        ],
        rdma_rows,
        "gpu",
        "ram",
    );
    comparison(
        &mut out,
        [
            "EFA workload (same boot)",
            "GPU memory (dma-buf)",
            "guest RAM",
            "ratio",
        ],
        efa_rows,
        "gpu",
        "ram",
    );
    render_efa_paths(&mut out, results);
    render_rss(&mut out, results);
    render_nic_paths(&mut out, results);
    Ok(out)
}

/// The NVMe servers' host CPU per I/O and per MiB of each compared job,
/// one column per server the run had.
fn render_host_cpu(out: &mut String, results: &Value) {
    let Some(jobs) = results
        .get("host_cpu")
        .and_then(Value::as_object)
        .filter(|j| !j.is_empty())
    else {
        return;
    };
    let servers: Vec<(&str, &str)> = [
        ("p2plab_nvme", "p2plab-nvme"),
        ("qemu_nvme", "qemu nvme"),
        ("spdk", "spdk nvmf_tgt"),
    ]
    .into_iter()
    .filter(|(key, _)| jobs.values().any(|j| j.get(*key).is_some()))
    .collect();
    out.push_str("\n| server CPU (host) |");
    for (_, name) in &servers {
        let _ = write!(out, " {name} |");
    }
    out.push_str("\n|---|");
    out.push_str(&"--:|".repeat(servers.len()));
    out.push('\n');
    let figures = [
        ("busy_us_per_io", "busy µs/IO", 1),
        ("total_us_per_io", "total µs/IO", 1),
        ("busy_us_per_mib", "busy µs/MiB", 0),
        ("total_us_per_mib", "total µs/MiB", 0),
    ];
    for (job, by_server) in jobs {
        for (key, what, decimals) in figures {
            let _ = write!(out, "| {job} {what} |");
            for (server, _) in &servers {
                let cell = by_server
                    .get(*server)
                    .and_then(|f| f.get(key))
                    .and_then(spread)
                    .map_or("-".into(), |s| {
                        format!(
                            "{:.d$} ({:.d$}–{:.d$})",
                            s.median,
                            s.min,
                            s.max,
                            d = decimals
                        )
                    });
                let _ = write!(out, " {cell} |");
            }
            out.push('\n');
        }
    }
}

/// The counters EFA path table shows: (server, counter).
const EFA_PATH_COUNTERS: [(&str, &str); 8] = [
    ("efa0", "peer_bar_bytes"),
    ("efa0", "dma_peer_read_bytes"),
    ("efa0", "dma_mmap_read_bytes"),
    ("efa0", "dma_message_read_bytes"),
    ("efa1", "peer_bar_bytes"),
    ("efa1", "dma_peer_write_bytes"),
    ("efa1", "dma_mmap_write_bytes"),
    ("efa1", "dma_message_write_bytes"),
];

/// The bytes each EFA server moved per DMA path, summed over the calls of
/// each memory (the deltas the bench kept around every call).
fn render_efa_paths(out: &mut String, results: &Value) {
    let Some(calls) = results
        .pointer("/efa/calls")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
    else {
        return;
    };
    let header: Vec<String> = EFA_PATH_COUNTERS
        .iter()
        .map(|(s, c)| format!("{s} {c}"))
        .collect();
    let _ = writeln!(out, "\n| EFA calls | {} |", header.join(" | "));
    let _ = writeln!(out, "|---|{}", "--:|".repeat(header.len()));
    for memory in ["gpu", "ram"] {
        let of: Vec<&Value> = calls
            .iter()
            .filter(|c| c.get("memory").and_then(Value::as_str) == Some(memory))
            .collect();
        let cells: Vec<String> = EFA_PATH_COUNTERS
            .iter()
            .map(|(server, counter)| {
                of.iter()
                    .filter_map(|c| c.pointer(&format!("/counter_deltas/{server}/{counter}")))
                    .filter_map(Value::as_u64)
                    .sum::<u64>()
                    .to_string()
            })
            .collect();
        let _ = writeln!(
            out,
            "| {memory}, {} calls | {} |",
            of.len(),
            cells.join(" | ")
        );
    }
}

/// Peak RSS per process, p2plab's lab against the anchor's.
fn render_rss(out: &mut String, results: &Value) {
    let ours = results
        .pointer("/peak_rss_mib/ours")
        .and_then(Value::as_object);
    let Some(ours) = ours.filter(|o| !o.is_empty()) else {
        return;
    };
    let anchor = results.pointer("/peak_rss_mib/anchor");
    out.push_str("\n| peak RSS MiB | p2plab lab | anchor lab | ratio |\n|---|--:|--:|--:|\n");
    for (name, v) in ours {
        let left = samples(Some(v));
        let right = samples(anchor.and_then(|a| a.get(name)));
        let ratios: Vec<f64> = left
            .iter()
            .zip(&right)
            .filter(|(_, &r)| r > 0.0)
            .map(|(l, r)| l / r)
            .collect();
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} |",
            figure_cell(spread_of(&left)),
            figure_cell(spread_of(&right)),
            ratio_cell(spread_of(&ratios)),
        );
    }
}

/// The bytes each NIC moved per DMA path, one row per RDMA boot.
fn render_nic_paths(out: &mut String, results: &Value) {
    let Some(boots) = results
        .pointer("/rdma/nic_dma_paths")
        .and_then(Value::as_array)
        .filter(|b| !b.is_empty())
    else {
        return;
    };
    let mut keys: Vec<String> = boots
        .iter()
        .filter_map(|b| b.get("bytes").and_then(Value::as_object))
        .flat_map(|o| o.keys().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    let _ = writeln!(out, "\n| RDMA boot, MTU | {} |", keys.join(" | "));
    let _ = writeln!(out, "|---|{}", "--:|".repeat(keys.len()));
    for boot in boots {
        let mtu = boot.get("mtu").map_or("?".into(), Value::to_string);
        let cells: Vec<String> = keys
            .iter()
            .map(|k| {
                boot.get("bytes")
                    .and_then(|b| b.get(k))
                    .map_or("-".into(), Value::to_string)
            })
            .collect();
        let _ = writeln!(out, "| {mtu} | {} |", cells.join(" | "));
    }
}

/// `page` with every marked region regenerated; `read_json` reads a
/// repository path.
pub fn regenerate(page: &str, read_json: impl Fn(&str) -> Result<String>) -> Result<String> {
    let mut out = String::new();
    let mut from = 0;
    for region in regions(page)? {
        let text = read_json(&region.json)?;
        let results: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", region.json))?;
        let body = render(&results).with_context(|| format!("rendering {}", region.json))?;
        out.push_str(&page[from..region.body.start]);
        out.push_str(&body);
        out.push('\n');
        from = region.body.end;
    }
    out.push_str(&page[from..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    // Catches: cells rounded or spread differently from `scripts/bench`'s
    // table, a regeneration that touches text outside its markers or is not
    // stable, and malformed markers or dates taken silently.
    use super::*;

    fn results() -> Value {
        serde_json::json!({
            "date_utc": "20261123-230543",
            "machine": {"cpu_model": "AMD EPYC", "cpus": 2, "host_kernel": "6.18",
                        "load_average_at_end": "1.39 1.73 1.70 2/81 14504"},
            "rounds": 3, "runtime_s": 15, "caching": "page",
            "anchor": {"drive": "-drive cache=writeback"},
            "compared": [{"figure": "4k IOPS",
                "p2plab_nvme": {"median": 37126.99, "min": 35330.6, "max": 38056.9},
                "qemu_nvme": {"median": 20162.3, "min": 19631.7, "max": 20500.7},
                "ratio": {"median": 1.811, "min": 1.7523, "max": 1.9385}}],
            "p2p": [], "rdma_rows": [],
            "peak_rss_mib": {"ours": {"qemu": {"samples": [1036.6, 1036.7, 1022.8]}},
                             "anchor": {"qemu": {"samples": [1009.2, 1007.8, 1017.7]}}},
            "rdma": {"nic_dma_paths": []}
        })
    }

    #[test]
    fn renders_the_cells_as_the_bench_prints_them() {
        let text = render(&results()).unwrap();
        assert!(text.contains("Run of 2026-11-23 23:05:43 UTC on AMD EPYC (2 CPUs, host kernel 6.18), load average 1.39 1.73 1.70 at the end; 3 rounds"), "{text}");
        assert!(
            text.contains(
                "| 4k IOPS | 37127 (35331–38057) | 20162 (19632–20501) | 1.81 (1.75–1.94) |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| qemu | 1037 (1023–1037) | 1009 (1008–1018) | 1.03 (1.01–1.03) |"),
            "{text}"
        );
        assert!(!text.contains("P2P workload"), "empty parts have no table");
    }

    /// Catches: the SPDK comparison or the host CPU table left out of the
    /// docs, a server's column filled from another's figures, or a column
    /// for SPDK when the run had none.
    #[test]
    fn spdk_rows_and_host_cpu_are_rendered() {
        let mut r = results();
        let text = render(&r).unwrap();
        assert!(
            !text.contains("spdk") && !text.contains("server CPU (host)"),
            "{text}"
        );
        let s = |m: f64| serde_json::json!({"median": m, "min": m - 0.5, "max": m + 0.5});
        r["host_cpu"] = serde_json::json!({"4k": {
            "p2plab_nvme": {"busy_us_per_io": s(3.0), "total_us_per_io": s(9.0),
                            "busy_us_per_mib": s(768.0), "total_us_per_mib": s(2304.0)},
            "qemu_nvme": {"busy_us_per_io": s(5.0), "total_us_per_io": s(5.0),
                          "busy_us_per_mib": s(1280.0), "total_us_per_mib": s(1280.0)}}});
        let text = render(&r).unwrap();
        assert!(
            text.contains("| server CPU (host) | p2plab-nvme | qemu nvme |\n|---|--:|--:|\n"),
            "{text}"
        );
        assert!(
            text.contains("| 4k busy µs/IO | 3.0 (2.5–3.5) | 5.0 (4.5–5.5) |"),
            "{text}"
        );
        assert!(
            text.contains("| 4k total µs/MiB | 2304 (2304–2304) | 1280 (1280–1280) |"),
            "{text}"
        );
        r["host_cpu"]["4k"]["spdk"] = serde_json::json!({"busy_us_per_io": s(2.0)});
        r["spdk"] = serde_json::json!({"version": "26.09"});
        r["compared_spdk"] = serde_json::json!([{"figure": "4k IOPS",
            "p2plab_nvme": s(100.0), "spdk": s(200.0), "ratio": s(0.5)}]);
        let text = render(&r).unwrap();
        assert!(text.contains("SPDK 26.09 `nvmf_tgt`"), "{text}");
        assert!(
            text.contains("| workload | p2plab-nvme | spdk nvmf_tgt | ratio |"),
            "{text}"
        );
        assert!(
            text.contains("| 4k IOPS | 100 (100–100) | 200 (200–200) | 0.50 (0.00–1.00) |"),
            "{text}"
        );
        assert!(
            text.contains("| 4k busy µs/IO | 3.0 (2.5–3.5) | 5.0 (4.5–5.5) | 2.0 (1.5–2.5) |"),
            "{text}"
        );
        assert!(
            text.contains("| 4k busy µs/MiB | 768 (768–768) | 1280 (1280–1280) | - |"),
            "{text}"
        );
    }

    #[test]
    fn efa_rows_and_their_paths_are_rendered() {
        let mut r = results();
        r["compared"] = serde_json::json!([]);
        r["efa"] = serde_json::json!({"topology": "rdma-efa", "len": "8M", "msg": "8K",
            "read_wrs": ["64K", "1M"], "calls": [
                {"memory": "gpu", "counter_deltas": {"efa0": {"peer_bar_bytes": 5}, "efa1": {"peer_bar_bytes": 7}}},
                {"memory": "gpu", "counter_deltas": {"efa0": {"peer_bar_bytes": 5}, "efa1": {"peer_bar_bytes": 7}}},
                {"memory": "ram", "counter_deltas": {"efa0": {"dma_mmap_read_bytes": 9}}}]});
        r["efa_rows"] = serde_json::json!([{"figure": "rdma-read 1M WRs MiB/s",
            "gpu": {"median": 30.4, "min": 29.6, "max": 31.0},
            "ram": {"median": 32.0, "min": 30.0, "max": 33.0},
            "ratio": {"median": 0.951, "min": 0.9, "max": 1.0}}]);
        let text = render(&r).unwrap();
        assert!(text.contains("EFA: one boot of `rdma-efa`, 8M per call in SRD SENDs of 8K, then RDMA-read back in work requests of 64K, 1M"), "{text}");
        assert!(
            text.contains(
                "| rdma-read 1M WRs MiB/s | 30 (30–31) | 32 (30–33) | 0.95 (0.90–1.00) |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| gpu, 2 calls | 10 | 0 | 0 | 0 | 14 | 0 | 0 | 0 |"),
            "{text}"
        );
        assert!(text.contains("| ram, 1 calls | 0 | 0 | 9 | 0 |"), "{text}");
    }

    #[test]
    fn regions_are_replaced_and_nothing_else() {
        let page =
            "# B\n\nbefore\n<!-- bench-table x.json -->\nold\n<!-- end bench-table -->\nafter\n";
        let out = regenerate(page, |path| {
            assert_eq!(path, "x.json");
            Ok(results().to_string())
        })
        .unwrap();
        assert!(out.starts_with("# B\n\nbefore\n<!-- bench-table x.json -->\n\nRun of"));
        assert!(
            out.ends_with("|\n\n<!-- end bench-table -->\nafter\n"),
            "{out}"
        );
        assert!(!out.contains("old"));
        // Regenerating the output changes nothing.
        let again = regenerate(&out, |_| Ok(results().to_string())).unwrap();
        assert_eq!(again, out);
    }

    #[test]
    fn bad_markers_and_dates_are_refused() {
        assert!(regions("<!-- bench-table a.json -->\n").is_err());
        assert!(regions("<!-- end bench-table -->\n").is_err());
        assert!(regions("<!-- bench-table -->\nx\n<!-- end bench-table -->\n").is_err());
        assert!(format_date("2026-11-23").is_err());
    }
}
