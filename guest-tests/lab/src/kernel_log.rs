//! The clean-boot check: the guest's kernel log, saved at the end of every
//! exec run, must hold no NVMe timeout, controller or engine reset, WARN,
//! BUG, Oops, call trace or hung task that the run did not ask for.
//!
//! The guest side is the exec wrapper the launcher writes (`exec.sh` runs
//! the command in `script.sh`, then copies `/dev/kmsg` to `kmsg.txt` in the
//! run folder's `guest/`). `/dev/kmsg` rather than `dmesg`: a test that
//! clears the ring buffer (`dmesg -C`) only moves the syslog clear mark,
//! and a fresh reader of `/dev/kmsg` still starts at the first record.
//!
//! A test declares what it provokes as [`Expected`] lines (a pattern and a
//! count range) in `LabOptions::kernel_log`; every complaint must match one
//! of them, and every expectation must be met.

use std::fmt::Write as _;

/// The guest's copy of `/dev/kmsg`, in the run folder's `guest/`.
pub const KMSG_FILE: &str = "kmsg.txt";

/// One kernel log record.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelLine {
    /// Record sequence number; the first record of a boot is 0.
    pub seq: u64,
    /// Syslog level, 0 (emerg) to 7 (debug).
    pub level: u8,
    /// Seconds since boot.
    pub time: f64,
    pub text: String,
}

/// Parses `/dev/kmsg` records (`PRIO,SEQ,USEC,FLAGS[,...];TEXT`, one per
/// line; lines that start with a space are the record's key=value
/// dictionary and are skipped). Lines that are not records are skipped too:
/// a record cut by a full ring buffer must not fail the check by itself.
pub fn parse_kmsg(text: &str) -> Vec<KernelLine> {
    text.lines()
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| {
            let (header, message) = line.split_once(';')?;
            let mut fields = header.split(',');
            let prio: u32 = fields.next()?.parse().ok()?;
            let seq: u64 = fields.next()?.parse().ok()?;
            let usec: u64 = fields.next()?.parse().ok()?;
            Some(KernelLine {
                seq,
                level: (prio & 7) as u8,
                time: usec as f64 / 1e6,
                text: unescape(message),
            })
        })
        .collect()
}

/// kmsg escapes unprintable bytes as `\xNN`; a message with a newline in it
/// would otherwise not be one line.
fn unescape(text: &str) -> String {
    if !text.contains("\\x") {
        return text.to_owned();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && bytes.get(i + 1) == Some(&b'x') {
            let hex = text
                .get(i + 2..i + 4)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(byte) = hex {
                out.push(if byte == b'\n' { b' ' } else { byte });
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `*` matches any run of characters; the pattern may match anywhere in
/// the text (there are no anchors). Case matters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*').filter(|p| !p.is_empty());
    let mut rest = text;
    parts.all(|part| match rest.find(part) {
        Some(at) => {
            rest = &rest[at + part.len()..];
            true
        }
        None => false,
    })
}

/// What counts as a complaint: (kind, pattern). A line is one complaint
/// however many patterns it matches.
const COMPLAINTS: &[(&str, &str)] = &[
    ("nvme timeout", "nvme*timeout"),
    ("nvme timeout", "nvme*I/O tag*QID"),
    ("controller reset", "nvme*reset controller"),
    ("controller reset", "nvme*will reset"),
    ("controller reset", "nvme*resetting controller"),
    ("controller reset", "nvme*Removing after probe failure"),
    (
        "controller reset",
        "nvme*Disabling device after reset failure",
    ),
    ("GPU engine reset", "p2plab_gpu*resetting the engine"),
    ("GPU engine reset", "p2plab_gpu*engine reset failed"),
    ("GPU engine halted", "p2plab_gpu*engine halted"),
    (
        "GPU lost interrupt",
        "p2plab_gpu*retired without an interrupt",
    ),
    // The upstream efa driver (issue 24) on p2plab-efa: an admin command
    // the device left unanswered or answered without MSI-X, a readless
    // register read that timed out, an AENQ event it has no handler for
    // (the lab's link-state notifications: a test provokes them).
    (
        "EFA admin timeout",
        "efa*didn't receive any MSI-X interrupt",
    ),
    ("EFA admin timeout", "efa*didn't send any completion"),
    ("EFA admin queue closed", "efa*Admin queue is closed"),
    (
        "EFA register read timeout",
        "efa*Reading register timed out",
    ),
    ("EFA unhandled AENQ event", "efa*Unknown event was received"),
    ("WARN", "WARNING:"),
    ("BUG", "BUG:"),
    ("BUG", "kernel BUG at"),
    ("Oops", "Oops"),
    ("call trace", "Call Trace:"),
    ("refcount", "refcount_t:"),
    ("hung task", "blocked for more than"),
    ("hung task", "soft lockup"),
];

/// Lines that match a complaint pattern in every stock boot and mean
/// nothing: keep this list short, each with its reason. Empty: the stock
/// `lab` boot (7.3.4+deb13 guest, QEMU 11.1 TCG) logs no complaint; its
/// only warnings are about TSC calibration, MTRRs, an ACPI IRQ override
/// and the out-of-tree GPU module's taint, none of which match.
const BOOT_NOISE: &[&str] = &[];

/// The complaint kind of a line, if it is one.
pub fn complaint_kind(text: &str) -> Option<&'static str> {
    if BOOT_NOISE.iter().any(|p| glob_match(p, text)) {
        return None;
    }
    COMPLAINTS
        .iter()
        .find(|(_, pattern)| glob_match(pattern, text))
        .map(|(kind, _)| *kind)
}

/// A complaint a test provokes on purpose: lines matching `pattern`, at
/// least `min` and at most `max` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub pattern: String,
    pub min: usize,
    pub max: usize,
}

impl Expected {
    pub fn exactly(pattern: &str, count: usize) -> Self {
        Self::between(pattern, count, count)
    }

    pub fn between(pattern: &str, min: usize, max: usize) -> Self {
        Self {
            pattern: pattern.to_owned(),
            min,
            max,
        }
    }
}

/// How a run's kernel log is checked.
#[derive(Debug, Clone)]
pub struct KernelLogCheck {
    /// Fail the run on a finding; otherwise print the findings and go on
    /// (the interactive CLI and the benchmarks).
    pub enforce: bool,
    pub expected: Vec<Expected>,
}

impl Default for KernelLogCheck {
    fn default() -> Self {
        Self {
            enforce: true,
            expected: Vec::new(),
        }
    }
}

/// Checks `lines` against `expected`. Each complaint is counted against the
/// first expectation it matches; the error lists every unexpected line and
/// every unmet count.
pub fn check(lines: &[KernelLine], expected: &[Expected]) -> Result<(), String> {
    let mut report = String::new();
    // A wrapped ring buffer lost the oldest records, and with them maybe a
    // complaint: the check cannot vouch for the boot.
    match lines.first() {
        None => report.push_str("  the kernel log copy holds no record\n"),
        Some(first) if first.seq > 0 => {
            let _ = writeln!(
                report,
                "  the kernel log lost its records before #{} (ring buffer wrapped; \
                 raise log_buf_len)",
                first.seq
            );
        }
        Some(_) => {}
    }
    let mut counts = vec![0usize; expected.len()];
    let mut unexpected = Vec::new();
    for line in lines {
        let Some(kind) = complaint_kind(&line.text) else {
            continue;
        };
        match expected
            .iter()
            .position(|e| glob_match(&e.pattern, &line.text))
        {
            Some(i) => counts[i] += 1,
            None => unexpected.push((kind, line)),
        }
    }
    for (kind, line) in &unexpected {
        let _ = writeln!(report, "  {kind}: [{:>10.6}] {}", line.time, line.text);
    }
    for (e, &n) in expected.iter().zip(&counts) {
        if n < e.min || n > e.max {
            let want = if e.min == e.max {
                format!("{}", e.min)
            } else {
                format!("{}..={}", e.min, e.max)
            };
            let _ = writeln!(
                report,
                "  expected {want} complaint line(s) like {:?}, found {n}",
                e.pattern
            );
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> KernelLine {
        KernelLine {
            seq: 0,
            level: 4,
            time: 1.0,
            text: text.to_owned(),
        }
    }

    #[test]
    fn kmsg_records_parse_with_level_time_and_unescaped_text() {
        let text = "6,339,5140900,-;nvme nvme0: 2/0/0 default/read/poll queues\n \
                    SUBSYSTEM=pci\n \
                    DEVICE=+pci:0000:03:00.0\n\
                    12,340,6000000,-;WARNING: a\\x0ab\n\
                    garbage without a header\n\
                    4,341,7,c;\n";
        let lines = parse_kmsg(text);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].seq, 339);
        assert_eq!(lines[0].level, 6);
        assert!((lines[0].time - 5.1409).abs() < 1e-9);
        assert_eq!(lines[0].text, "nvme nvme0: 2/0/0 default/read/poll queues");
        assert_eq!(lines[1].level, 4, "facility bits are not the level");
        assert_eq!(lines[1].text, "WARNING: a b");
        assert_eq!(lines[2].text, "");
    }

    #[test]
    fn globs_match_in_order_anywhere() {
        assert!(glob_match(
            "nvme*timeout",
            "nvme nvme0: I/O tag 3 QID 1 timeout, aborting"
        ));
        assert!(!glob_match("timeout*nvme", "nvme nvme0: timeout"));
        assert!(glob_match("Oops", "Oops: general protection fault"));
        assert!(glob_match("", "anything"));
        assert!(!glob_match("a*b*c", "acb"));
    }

    #[test]
    fn complaints_are_recognised_and_benign_lines_are_not() {
        for (text, kind) in [
            (
                "nvme nvme0: I/O tag 12 (100c) opcode 0x2 (Read) QID 1 timeout, aborting req_op:READ(0) size:4096",
                "nvme timeout",
            ),
            (
                "nvme nvme0: controller is down; will reset: CSTS=0x3, PCI_STATUS=0x10",
                "controller reset",
            ),
            ("WARNING: CPU: 1 PID: 7 at mm/foo.c:12 bar+0x1/0x2", "WARN"),
            ("BUG: kernel NULL pointer dereference, address: 0", "BUG"),
            ("Oops: 0000 [#1] PREEMPT SMP NOPTI", "Oops"),
            ("Call Trace:", "call trace"),
            ("INFO: task fio:123 blocked for more than 120 seconds.", "hung task"),
            (
                "p2plab_gpu 0000:04:00.0: job fence 7 timed out (status 0x1, device fence 6); resetting the engine",
                "GPU engine reset",
            ),
        ] {
            assert_eq!(complaint_kind(text), Some(kind), "{text}");
        }
        for text in [
            "nvme nvme0: 2/0/0 default/read/poll queues",
            "nvme 0000:03:00.0: added peer-to-peer DMA memory 0xfe00000000-0xfe03ffffff",
            "p2plab_gpu 0000:04:00.0: engine reset done (1 so far)",
            "blk_update_request: critical medium error, dev nvme0n1, sector 3000",
        ] {
            assert_eq!(complaint_kind(text), None, "{text}");
        }
    }

    #[test]
    fn an_unasked_complaint_fails_and_names_the_line() {
        let lines = [
            line("nvme nvme0: 2/0/0 default/read/poll queues"),
            line("nvme nvme0: I/O tag 1 QID 1 timeout, aborting"),
        ];
        let err = check(&lines, &[]).unwrap_err();
        assert!(err.contains("nvme timeout"), "{err}");
        assert!(err.contains("I/O tag 1 QID 1 timeout, aborting"), "{err}");
        assert_eq!(check(&lines[..1], &[]), Ok(()));
    }

    #[test]
    fn a_wrapped_or_empty_log_fails() {
        let mut late = line("nvme nvme0: 2/0/0 default/read/poll queues");
        late.seq = 1200;
        let err = check(&[late], &[]).unwrap_err();
        assert!(err.contains("before #1200"), "{err}");
        let err = check(&[], &[]).unwrap_err();
        assert!(err.contains("no record"), "{err}");
    }

    #[test]
    fn expectations_allow_their_lines_and_enforce_their_counts() {
        let lines = [
            line("nvme nvme0: I/O tag 1 QID 1 timeout, aborting"),
            line("nvme nvme0: I/O tag 2 QID 1 timeout, aborting"),
            line("nvme nvme0: controller is down; will reset: CSTS=0x3"),
        ];
        let aborting = Expected::exactly("timeout, aborting", 2);
        let reset = Expected::exactly("will reset", 1);
        assert_eq!(check(&lines, &[aborting.clone(), reset.clone()]), Ok(()));
        // Too few: the reset the test asked for did not happen.
        let err = check(&lines[..2], &[aborting.clone(), reset.clone()]).unwrap_err();
        assert!(
            err.contains("expected 1") && err.contains("found 0"),
            "{err}"
        );
        // Too many.
        let err = check(&lines, &[Expected::exactly("timeout, aborting", 1), reset]).unwrap_err();
        assert!(err.contains("found 2"), "{err}");
        // An expectation does not cover other complaints.
        let err = check(&lines, &[aborting]).unwrap_err();
        assert!(err.contains("will reset: CSTS=0x3"), "{err}");
        // A range.
        assert_eq!(check(&lines, &[Expected::between("nvme*", 0, 3)]), Ok(()));
    }
}
