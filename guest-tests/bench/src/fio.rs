//! fio's JSON report of one job, read into the figures the bench compares.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::jobs::Metric;

/// One fio result for the job's busy direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// fio's own CPU time in the guest (user + system, its thread only)
    /// per MiB it moved: under TCG the guest's vCPU is often what limits
    /// a job, and this tells how much of it each byte took.
    pub guest_cpu_us_per_mib: f64,
}

impl Sample {
    /// The figure `metric` judges the job by.
    pub fn figure(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Iops => self.iops,
            Metric::MibPerSec => self.bytes_per_sec / (1024.0 * 1024.0),
            Metric::LatencyUs => self.p50_us,
        }
    }
}

/// The sample of fio's `--output-format=json` report: the first job's
/// direction that did I/O. A figure missing from the report is an error,
/// never a zero.
pub fn parse(json: &str) -> Result<Sample> {
    let value: Value = serde_json::from_str(json).context("fio output is not JSON")?;
    let job = value
        .get("jobs")
        .and_then(|j| j.get(0))
        .context("fio JSON has no jobs")?;
    for dir in ["read", "write"] {
        let Some(stats) = job.get(dir) else { continue };
        let iops = stats.get("iops").and_then(Value::as_f64).unwrap_or(0.0);
        if iops > 0.0 {
            let number = |pointer: &str| -> Result<f64> {
                stats
                    .pointer(pointer)
                    .and_then(Value::as_f64)
                    .with_context(|| format!("fio JSON has no {dir}{pointer}"))
            };
            let job_number = |key: &str| -> Result<f64> {
                job.get(key)
                    .and_then(Value::as_f64)
                    .with_context(|| format!("fio JSON has no {key}"))
            };
            let cpu_share = (job_number("usr_cpu")? + job_number("sys_cpu")?) / 100.0;
            let runtime_us = job_number("job_runtime")? * 1000.0;
            let mib = number("/io_bytes")? / (1024.0 * 1024.0);
            if mib <= 0.0 {
                bail!("fio moved no bytes");
            }
            return Ok(Sample {
                iops,
                bytes_per_sec: number("/bw_bytes")?,
                p50_us: number("/clat_ns/percentile/50.000000")? / 1000.0,
                p99_us: number("/clat_ns/percentile/99.000000")? / 1000.0,
                guest_cpu_us_per_mib: cpu_share * runtime_us / mib,
            });
        }
    }
    bail!("fio reported no I/O")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: figures taken from the idle direction, missing CPU time
    /// or percentiles read as zero, and a report without I/O accepted.
    #[test]
    fn parses_fio_json_for_the_busy_direction() {
        let json = r#"{"jobs":[{"job_runtime":2000,"usr_cpu":10.0,"sys_cpu":40.0,
            "read":{"iops":0,"bw_bytes":0},"write":{"iops":2000.5,"bw_bytes":8194048,
            "io_bytes":16388096,"clat_ns":{"percentile":{"50.000000":45000,"99.000000":123000}}}}]}"#;
        let s = parse(json).unwrap();
        assert_eq!(
            s,
            Sample {
                iops: 2000.5,
                bytes_per_sec: 8194048.0,
                p50_us: 45.0,
                p99_us: 123.0,
                // Half of 2 s of CPU over 15.63 MiB.
                guest_cpu_us_per_mib: 0.5 * 2_000_000.0 / (16388096.0 / 1048576.0),
            }
        );
        let no_cpu = json.replace(r#""usr_cpu":10.0,"#, "");
        assert!(parse(&no_cpu).is_err(), "missing CPU time is an error");
        assert!(parse(r#"{"jobs":[{"read":{"iops":0}}]}"#).is_err());
        assert!(
            parse(r#"{"jobs":[{"read":{"iops":5,"bw_bytes":1}}]}"#).is_err(),
            "missing percentiles are an error, not zero"
        );
        assert!(parse("fio: error").is_err());
    }
}
