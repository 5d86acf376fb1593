//! Shared pieces of the end-to-end suites: boot a lab, run a guest script,
//! and read what it reported.
//!
//! Guest scripts report facts as `KEY=VALUE` lines on their output; the host
//! side asserts on them, so a failure names the fact and shows the value.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use p2plab_lab::kernel_log::Expected;
use p2plab_lab::{GuestControl, GuestScript, Lab, LabOptions, Outcome, Timeout};
use serde_json::Value;

/// Boot budget per VM under TCG on a 2-core machine, generous on purpose:
/// the suites check outcomes, never speed. Given as a TCG budget
/// (`Timeout::TcgBudget`, `Lab::budget`): the lab scales it under KVM.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

/// A finished guest run and its reported facts.
pub struct GuestRun {
    pub outcome: Outcome,
    pub facts: BTreeMap<String, String>,
}

impl GuestRun {
    pub fn run_dir(&self) -> &Path {
        &self.outcome.run_dir
    }

    pub fn output(&self) -> &str {
        &self.outcome.output
    }

    /// A reported fact; panics with the guest output when it is missing.
    pub fn fact(&self, key: &str) -> &str {
        match self.facts.get(key) {
            Some(v) => v,
            None => panic!(
                "the guest did not report {key}; its output was:\n{}\n(run folder {})",
                self.outcome.output,
                self.run_dir().display()
            ),
        }
    }

    pub fn fact_u64(&self, key: &str) -> u64 {
        let text = self.fact(key);
        let parsed = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => text.parse(),
        };
        parsed.unwrap_or_else(|_| panic!("{key}={text:?} is not a number"))
    }

    /// Asserts a fact equals `want`, naming it on failure.
    pub fn expect(&self, key: &str, want: &str) {
        let got = self.fact(key);
        assert_eq!(
            got,
            want,
            "fact {key} (run folder {})",
            self.run_dir().display()
        );
    }

    pub fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.run_dir().join(name)).unwrap_or_default()
    }
}

impl GuestRun {
    /// The facts one part of a shared boot reported under `prefix` (see
    /// [`shared_boot_script`]), with the prefix taken off: the part's checks
    /// read the same keys as when it had a boot of its own.
    pub fn part(&self, prefix: &str) -> GuestRun {
        let facts = self
            .facts
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_owned(), v.clone())))
            .collect();
        GuestRun {
            outcome: self.outcome.clone(),
            facts,
        }
    }
}

/// One guest script that runs several suites' scripts in turn in one boot,
/// each in its own bash (its `exit`, `set -u` and functions stay its own).
/// A part's output lines get its prefix, so two parts that report the same
/// key never mask each other (read them back with [`GuestRun::part`]). The
/// script stops with the failing part's status when one fails.
pub fn shared_boot_script(parts: &[(&str, &GuestScript)]) -> GuestScript {
    GuestScript::in_parts(parts).unwrap_or_else(|err| panic!("the shared boot's script: {err:#}"))
}

/// Extra knobs for one boot.
#[derive(Default)]
pub struct Boot {
    pub server_args: Vec<(String, Vec<String>)>,
    pub append: Vec<String>,
    /// Extra QEMU arguments, after the topology's (a later `-cpu` wins and
    /// is the TCG vCPU the lab reads the vendor need from; no `-accel`).
    pub qemu_args: Vec<String>,
    pub share: Option<PathBuf>,
    /// `@STATE@` for this boot; default: a fresh folder per test process.
    pub state: Option<PathBuf>,
    /// Kernel-log complaints this boot provokes on purpose (the clean-boot
    /// check fails on any other).
    pub kernel_log: Vec<Expected>,
    /// The servers the guest script drives itself (`p2plab-ctl ID` in the
    /// guest); none unless named.
    pub guest_control: GuestControl,
}

/// A state folder private to this test binary run, under target/.
pub fn test_state_dir(name: &str) -> PathBuf {
    // One folder per call: two tests of one binary that boot the same
    // topology in parallel (`cargo test` without `--test-threads=1`)
    // must not share a namespace image, or each reads the other's data.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/e2e-state")
        .join(format!("{name}-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the test state folder");
    dir
}

/// Boots `topology`, runs `script` in the guest and collects its facts.
/// The script's exit status must be 0.
pub fn run_guest(topology: &str, script: &GuestScript, boot: Boot) -> GuestRun {
    run_guest_with(topology, script, boot, |_| ()).0
}

/// [`run_guest`] with a host side: `host` runs on the started lab while the
/// guest boots and runs `script` (they meet through files in the guest's
/// `/run/p2plab`, see `Lab::wait_guest_file`), and its result comes back
/// with the guest's.
pub fn run_guest_with<T>(
    topology: &str,
    script: &GuestScript,
    boot: Boot,
    host: impl FnOnce(&mut Lab) -> T,
) -> (GuestRun, T) {
    let mut options = LabOptions::exec(topology, script)
        .unwrap_or_else(|err| panic!("the guest script: {err:#}"));
    options.timeout = Some(Timeout::TcgBudget(BOOT_TIMEOUT));
    options.server_args = boot.server_args;
    options.append = boot.append;
    options.qemu_args = boot.qemu_args;
    options.share = boot.share;
    options.state = Some(boot.state.unwrap_or_else(|| test_state_dir(topology)));
    options.stream_output = std::env::var_os("P2PLAB_STREAM").is_some();
    options.log_level = Some("debug".to_owned());
    options.kernel_log.expected = boot.kernel_log;
    options.guest_control = boot.guest_control;
    let mut lab = Lab::start(&options).unwrap_or_else(|err| panic!("the lab failed: {err:#}"));
    let hosted = host(&mut lab);
    let outcome = lab
        .finish(&options)
        .unwrap_or_else(|err| panic!("the lab failed: {err:#}"));
    let facts = parse_facts(&outcome.output);
    let run = GuestRun { outcome, facts };
    assert_eq!(
        run.outcome.status,
        Some(0),
        "the guest script failed; output:\n{}\n(run folder {})",
        run.outcome.output,
        run.run_dir().display()
    );
    (run, hosted)
}

/// Ends a lab started by hand (`Lab::start`), waits for its guest, and
/// returns its facts; panics unless the guest script exited 0.
pub fn finish_lab(lab: Lab, options: &LabOptions) -> GuestRun {
    let outcome = lab
        .finish(options)
        .unwrap_or_else(|err| panic!("the lab failed: {err:#}"));
    let facts = parse_facts(&outcome.output);
    let run = GuestRun { outcome, facts };
    assert_eq!(
        run.outcome.status,
        Some(0),
        "the guest script failed; output:\n{}\n(run folder {})",
        run.outcome.output,
        run.run_dir().display()
    );
    run
}

/// `KEY=VALUE` lines (see `p2plab_lab::facts`).
pub fn parse_facts(output: &str) -> BTreeMap<String, String> {
    p2plab_lab::facts::parse(output)
}

/// Reads a server's JSON stats file from the run folder.
pub fn server_stats(run: &GuestRun, id: &str) -> String {
    run.file(&format!("{id}.stats.json"))
}

/// Bytes a server's debug log shows moved by DMA messages (`read` or
/// `write`) to guest-physical addresses inside `[start, end]`.
pub fn message_dma_bytes_in(log: &str, direction: &str, start: u64, end: u64) -> u64 {
    let marker = format!(
        "dma {direction} via DMA_{} messages",
        direction.to_uppercase()
    );
    dma_bytes_in(log, &marker, start, end)
}

/// Bytes the server's debug log shows moving through peer windows (the
/// zero-copy peer path) in `direction` ("read" or "write") inside
/// `[start, end]`.
pub fn peer_dma_bytes_in(log: &str, direction: &str, start: u64, end: u64) -> u64 {
    let marker = match direction {
        "read" => "dma read from peer window",
        _ => "dma write to peer window",
    };
    dma_bytes_in(log, marker, start, end)
}

fn dma_bytes_in(log: &str, marker: &str, start: u64, end: u64) -> u64 {
    log.lines()
        .filter(|line| line.contains(marker))
        .filter_map(|line| {
            let field = |name: &str| -> Option<u64> {
                let at = line.find(name)? + name.len();
                line[at..].split_whitespace().next()?.parse().ok()
            };
            Some((field("gpa=")?, field("len=")?))
        })
        .filter(|&(gpa, len)| gpa >= start && gpa + len <= end + 1)
        .map(|(_, len)| len)
        .sum()
}

pub fn stats(run: &GuestRun, id: &str) -> Value {
    let text = server_stats(run, id);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{id}.stats.json ({e}): {text}"))
}

/// A counter found by key anywhere in a stats document.
pub fn counter(v: &Value, key: &str) -> u64 {
    fn find<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
        match v {
            Value::Object(map) => map
                .get(key)
                .or_else(|| map.values().find_map(|child| find(child, key))),
            _ => None,
        }
    }
    find(v, key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no counter {key} in {v}"))
}

/// The two marks (`p2plab_server::provenance::Mark`, every server's status)
/// a guest script takes around one phase, in the run folder's `marks/`
/// as `<phase>-start` and `<phase>-end`.
pub struct Phase {
    pub start: p2plab_server::provenance::Mark,
    pub end: p2plab_server::provenance::Mark,
}

/// The host side of a guest script's phases (`phase` in the guest
/// libraries): for each phase in order, wait for the guest's
/// `ready-NAME`, take `p2plab-ctl RUN mark NAME-start`, answer
/// `marked-NAME`; then `done-NAME`, `NAME-end`, `measured-NAME`. Each
/// wait may take `timeout` (already scaled for the accelerator).
pub fn mark_phases(lab: &mut Lab, phases: &[&str], timeout: Duration) {
    let ctl = lab
        .paths
        .server_binary("p2plab-ctl")
        .unwrap_or_else(|e| panic!("{e:#}"));
    for name in phases {
        for (guest, mark, reply) in [("ready", "start", "marked"), ("done", "end", "measured")] {
            lab.wait_guest_file(&format!("{guest}-{name}"), timeout)
                .unwrap_or_else(|e| panic!("{e:#}"));
            let out = std::process::Command::new(&ctl)
                .arg(&lab.run_dir)
                .arg("mark")
                .arg(format!("{name}-{mark}"))
                .output()
                .expect("running p2plab-ctl");
            assert!(
                out.status.success(),
                "p2plab-ctl mark {name}-{mark}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            lab.write_guest_file(&format!("{reply}-{name}"), "")
                .expect("signalling the guest");
        }
    }
}

impl Phase {
    pub fn of(run: &GuestRun, name: &str) -> Phase {
        let dir = run.run_dir().join("marks");
        let load = |which: &str| {
            p2plab_server::provenance::Mark::load(&dir, &format!("{name}-{which}"))
                .unwrap_or_else(|e| panic!("{e:#}"))
        };
        Phase {
            start: load("start"),
            end: load("end"),
        }
    }

    /// How much counter `key` of server `id` grew during the phase.
    pub fn delta(&self, id: &str, key: &str) -> u64 {
        let (Some(a), Some(b)) = (self.start.counter(id, key), self.end.counter(id, key)) else {
            panic!("no counter {key} of {id} in the marks {}", self.start.name);
        };
        b.checked_sub(a)
            .unwrap_or_else(|| panic!("{id} {key} went back: {a} -> {b}"))
    }
}
