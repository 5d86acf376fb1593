//! What the guest scripts print, read back: the rest of a result line,
//! the copy and transfer lines of p2plab-p2pio and p2plab-nic-tool, and
//! the servers' CPU cost between two marks.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::jobs::CPU_SERVERS;

/// What follows `prefix` on the first line of `output` that has it
/// (console noise may precede it on the line).
pub fn after<'a>(output: &'a str, prefix: &str) -> Option<&'a str> {
    output
        .lines()
        .find_map(|l| l.find(prefix).map(|at| &l[at + prefix.len()..]))
}

/// The number after `KEY=` among a line's space-separated words.
fn number(line: &str, key: &str) -> Result<f64> {
    word_value(line, key)
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("no {key} in {line:?}"))
}

fn word_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// MiB/s of one copy line, which must have moved `len` bytes without errors.
pub fn copy_mib_per_sec(line: &str, len: u64) -> Result<f64> {
    if number(line, "ERRORS")? != 0.0 || number(line, "BYTES")? != len as f64 {
        bail!("the copy failed or was short: {line:?}");
    }
    number(line, "MIB_PER_SEC")
}

/// MiB/s of one transfer line, which must have moved and verified `len`
/// bytes without a failed completion.
pub fn rdma_mib_per_sec(line: &str, len: u64) -> Result<f64> {
    if word_value(line, "verify") != Some("ok")
        || number(line, "bytes")? != len as f64
        || number(line, "tx_errors")? != 0.0
        || number(line, "rx_errors")? != 0.0
    {
        bail!("the transfer failed, was short or did not verify: {line:?}");
    }
    number(line, "mib_per_s")
}

/// Server CPU time per MiB the NVMe moved during one job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServerCost {
    /// All the CPU time of the servers.
    pub total: f64,
    /// Without the time their workers spun while idle, waiting for the
    /// guest's next command (`idle_poll_cpu_us`): what moving the bytes
    /// cost. A job the guest runs slower leaves the servers idle longer,
    /// so only this part compares the two paths' cost per byte.
    pub busy: f64,
}

/// Server CPU time per MiB the NVMe moved during one job: the CPU of every
/// [`CPU_SERVERS`] process between the job's marks, over nvme0's data
/// bytes (both directions) in the same window. Ramp time included on both
/// sides, so the ratio of two jobs is fair.
pub fn cpu_us_per_mib(output: &str, label: &str) -> Result<ServerCost> {
    let status = |at: &str, server: &str| -> Result<Value> {
        let line = after(output, &format!("CPU {label} {at} {server} "))
            .with_context(|| format!("no CPU mark {at} of {label} for {server}"))?;
        serde_json::from_str(line)
            .with_context(|| format!("the status of {server} at the {at} of {label}: {line:?}"))
    };
    let cpu = |v: &Value| -> Result<(f64, f64)> {
        let p = &v["process"];
        match (
            p["cpu_user_us"].as_u64(),
            p["cpu_system_us"].as_u64(),
            p["idle_poll_cpu_us"].as_u64(),
        ) {
            (Some(user), Some(system), Some(idle)) => Ok(((user + system) as f64, idle as f64)),
            _ => bail!("no process CPU time in {v}"),
        }
    };
    let bytes = |v: &Value| -> Result<f64> {
        let c = &v["counters"];
        match (c["bytes_read"].as_u64(), c["bytes_written"].as_u64()) {
            (Some(r), Some(w)) => Ok((r + w) as f64),
            _ => bail!("no NVMe byte counters in {v}"),
        }
    };
    let (mut cpu_us, mut idle_us) = (0.0, 0.0);
    for server in CPU_SERVERS {
        let (end, end_idle) = cpu(&status("end", server)?)?;
        let (begin, begin_idle) = cpu(&status("begin", server)?)?;
        cpu_us += end - begin;
        idle_us += end_idle - begin_idle;
    }
    let moved = bytes(&status("end", "nvme0")?)? - bytes(&status("begin", "nvme0")?)?;
    if moved <= 0.0 {
        bail!("{label}: nvme0 moved no data between the CPU marks");
    }
    let mib = moved / (1024.0 * 1024.0);
    Ok(ServerCost {
        total: cpu_us / mib,
        busy: (cpu_us - idle_us).max(0.0) / mib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a CPU-per-byte figure taken from the wrong marks or the
    /// wrong server, one computed when nothing moved, or a busy figure that
    /// does not take the idle polling out.
    #[test]
    fn cpu_cost_is_the_servers_cpu_over_the_bytes_moved_between_marks() {
        let status = |cpu: u64, idle: u64, read: u64| {
            format!(
                r#"{{"counters":{{"bytes_read":{read},"bytes_written":0}},"process":{{"cpu_user_us":{cpu},"cpu_system_us":5,"idle_poll_cpu_us":{idle}}}}}"#
            )
        };
        let output = [
            format!("CPU ram-x begin nvme0 {}", status(1_000, 100, 0)),
            format!("CPU ram-x begin gpu0 {}", status(70, 0, 0)),
            "BENCH ram-x {}".to_owned(),
            format!("CPU ram-x end nvme0 {}", status(3_000, 900, 4 << 20)),
            format!("CPU ram-x end gpu0 {}", status(270, 0, 0)),
            format!("CPU p2p-x begin nvme0 {}", status(3_000, 900, 4 << 20)),
            format!("CPU p2p-x begin gpu0 {}", status(270, 0, 0)),
            format!("CPU p2p-x end nvme0 {}", status(3_000, 900, 4 << 20)),
            format!("CPU p2p-x end gpu0 {}", status(270, 0, 0)),
        ]
        .join("\n");
        // (2000 + 200) µs over 4 MiB, 800 µs of it idle polling.
        assert_eq!(
            cpu_us_per_mib(&output, "ram-x").unwrap(),
            ServerCost {
                total: 550.0,
                busy: 350.0
            }
        );
        let old_server = output.replace(r#","idle_poll_cpu_us":900"#, "");
        assert!(
            cpu_us_per_mib(&old_server, "ram-x").is_err(),
            "a server that does not report idle polling has no busy figure"
        );
        assert!(cpu_us_per_mib(&output, "p2p-x").is_err(), "nothing moved");
        assert!(cpu_us_per_mib(&output, "other").is_err(), "no marks");
    }

    /// Catches: a copy that failed or moved less than asked counted as a
    /// figure.
    #[test]
    fn copy_lines_must_move_everything() {
        let ok =
            "P2P_BAR=ram P2P_BUFFER_LEN=8388608 BYTES=1048576 IOS=1 ERRORS=0 MIB_PER_SEC=123.5 ";
        assert_eq!(copy_mib_per_sec(ok, 1 << 20).unwrap(), 123.5);
        assert!(copy_mib_per_sec(ok, 2 << 20).is_err(), "short copy");
        let failed = "BYTES=1048576 IOS=1 ERRORS=1 MIB_PER_SEC=1.0";
        assert!(copy_mib_per_sec(failed, 1 << 20).is_err());
        assert!(copy_mib_per_sec("p2plab-p2pio: opening ...", 1 << 20).is_err());
    }

    /// Catches: a transfer that did not verify, was short or had a failed
    /// completion counted as a figure.
    #[test]
    fn rdma_lines_must_move_and_verify_everything() {
        let ok = "map_type=3 src_crc=0x1 dst_crc=0x1 post_errno=0 revoked_wcs=0 bytes=1048576 posts=4 \
                  tx_done=4 tx_bytes=1048576 tx_frames=16 tx_errors=0 rx_done=4 rx_bytes=1048576 \
                  rx_frames=16 rx_errors=0 first_error=0x0 mismatched_bytes=0 verify=ok ms=20 mib_per_s=50.5 ";
        assert_eq!(rdma_mib_per_sec(ok, 1 << 20).unwrap(), 50.5);
        assert!(rdma_mib_per_sec(ok, 2 << 20).is_err(), "short transfer");
        let mismatch = ok.replace("verify=ok", "verify=mismatch");
        assert!(rdma_mib_per_sec(&mismatch, 1 << 20).is_err());
        let failed_rx = ok.replace("rx_errors=0", "rx_errors=1");
        assert!(rdma_mib_per_sec(&failed_rx, 1 << 20).is_err());
        assert!(
            rdma_mib_per_sec("p2plab-nic-tool: /dev/p2plab-nic0: No such file", 1 << 20).is_err()
        );
    }

    /// Catches: a result line found by a prefix in the middle of another
    /// word's line, or the console noise before it kept.
    #[test]
    fn after_takes_the_rest_of_the_first_line_with_the_prefix() {
        let output = "boot\n[  1.0] noise COPY ram BYTES=1\nCOPY ram BYTES=2\n";
        assert_eq!(after(output, "COPY ram "), Some("BYTES=1"));
        assert_eq!(after(output, "COPY gpu "), None);
    }
}
