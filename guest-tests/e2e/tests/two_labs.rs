//! Two labs, one wire (issue 25): two `efa-tcp` labs, each in its own
//! network namespace joined by a veth pair, their EFAs' wire over TCP
//! (`p2plab-vm --efa-wire tcp-listen:10.77.0.1:18600` in one,
//! `tcp-connect:10.77.0.1:18600` in the other, one pre-shared key file),
//! and unmodified perftest between the two guests.
//!
//! This suite runs TWO guests at once (TCG, 2 vCPUs and 1 GiB each, on the
//! same shared cores): run it alone under the e2e lock, which the caller
//! holds for the whole test (`flock /tmp/p2plab-e2e.lock scripts/test
//! --e2e-only --suite two_labs`). It needs root (`ip netns`).
//!
//! `two_labs_rdma_over_tcp_between_network_namespaces`:
//! 1. Both guests reach each other over their own IP link (perftest's
//!    setup channel), the driver binds each lab's EFA (port ACTIVE) and
//!    the two EFAs have the GIDs the launcher gave (`--efa-gid`).
//!    Catches: a launcher that drops `--efa-gid`, or two labs that cannot
//!    reach each other at all.
//! 2. perftest's ib_send_bw and ib_read_bw (SRD, `-x 0`) run between the
//!    guests: both ends exit 0, their result rows parse with the message
//!    size and iteration count asked for (and a bandwidth above zero unless
//!    perftest's TCG clock calibration failed, which it says).
//!    Catches: an SRD data path that breaks across two processes on two
//!    network stacks (packets lost or unanswered over TCP).
//! 3. Both servers' stats files: their wire came up once over TCP and its
//!    counters show the traffic
//!    crossed it (frames each way, at least the payload perftest moved:
//!    ib_read_bw's responses from lab A, ib_send_bw's messages from lab B,
//!    one connection, no protocol error, no refused peer), and the EFA
//!    counters agree (lab A served the reads, lab B received nothing it did
//!    not ask for).
//!    Catches: a TCP wire that never comes up between two namespaces (the
//!    handshake, the key, `--efa-wire`/`--efa-wire-key`), traffic that did
//!    not go over it (a loopback shortcut), a wire that reconnected or
//!    refused its peer meanwhile.
//!
//! 4. GPU memory to GPU memory across the labs, both ways: `p2plab-efa-check
//!    gpu-xfer --role src` in one guest, `--role dst` in the other, each
//!    with dma-buf MRs of its own gpu0's VRAM on its own efa_0, exchanging
//!    QPN, GID, rkey, address, length and CRC over the guests' IP link
//!    (lab A listens). 4 MiB of a seeded pattern go A -> B in SRD SENDs,
//!    then B RDMA-reads A's buffer; then the same B -> A. Both ends verify;
//!    the destination GPU engine's CRC32C of what it received and of what
//!    it read equal the source GPU engine's CRC of its buffer, which equals
//!    the pattern's; the source heard the destination's CRCs back.
//!    Catches: dma-buf MRs that cannot be used across two processes on two
//!    labs (an rkey or address the wire's peer cannot use, a GID or QPN
//!    from the exchange the EFA does not route by), data lost, altered or
//!    misplaced between two GPUs over TCP, an out-of-band exchange that
//!    mixes up its fields.
//! 5. The servers' counters around each direction (`p2plab-ctl efa0|gpu0
//!    status` in each guest, `--guest-control efa0,gpu0`): each lab's efa0
//!    moved exactly 2 × 4 MiB to or from its GPU's BAR (`peer_bar_bytes`),
//!    at least that by the zero-copy peer path (`dma_peer_*`), nothing by
//!    DMA messages through QEMU and guest RAM only for descriptors and
//!    completions; the source GPU served 2 × 4 MiB to peers and took none,
//!    the destination GPU took 2 × 4 MiB and served none; the source lab's
//!    wire sent at least the payload and the other lab's took it, with no
//!    reconnection and no protocol error.
//!    Catches: GPU payload bounced through guest RAM or QEMU on either
//!    side, a transfer that did not cross the TCP wire, a wire that
//!    reconnected mid-transfer.
//! 6. Lab A alone: a `--role dst --listen 127.0.0.1:...` end fed by a
//!    hostile peer (bash over /dev/tcp): six bytes of a hello then EOF, a
//!    whole hello announcing 1 GiB for 1 MiB buffers, a connection that
//!    stays silent past `--timeout 5`. Each ends with exit 2 and a
//!    `peer_error=` that names what was wrong (the byte counts, the
//!    lengths, the timeout), and goes no further.
//!    Catches: an out-of-band exchange that hangs on a short read or a
//!    silent peer, or trusts a length beyond its buffers.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use p2plab_lab::LabPaths;
use serde_json::Value;

const ITERS: u64 = 200;
const SEND_SIZE: u64 = 4096;
const READ_SIZE: u64 = 65536;
const ADDR_A: &str = "10.77.0.1";
const ADDR_B: &str = "10.77.0.2";
const GUEST_A: &str = "192.168.77.1";
const GUEST_B: &str = "192.168.77.2";
const WIRE_PORT: u16 = 18600;
const GUEST_NET_PORT: u16 = 18700;
/// Bytes of each GPU-to-GPU transfer, and its SEND size (the guest script's).
const GPU_SIZE: u64 = 4 << 20;
const GPU_MSG: u64 = 8192;

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// Two network namespaces joined by a veth pair (A 10.77.0.1, B
/// 10.77.0.2); removed (with the veth) when dropped, whatever happened.
struct Namespaces {
    a: String,
    b: String,
}

impl Namespaces {
    fn new() -> Self {
        let id = std::process::id();
        let ns = Self {
            a: format!("p2plab-a-{id}"),
            b: format!("p2plab-b-{id}"),
        };
        let (va, vb) = (format!("p2pa{id}"), format!("p2pb{id}"));
        ip(&["netns", "add", &ns.a]);
        ip(&["netns", "add", &ns.b]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", &ns.a]);
        ip(&["link", "set", &vb, "netns", &ns.b]);
        for (name, dev, addr) in [(&ns.a, &va, ADDR_A), (&ns.b, &vb, ADDR_B)] {
            ip(&["-n", name, "link", "set", "lo", "up"]);
            ip(&["-n", name, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", name, "link", "set", dev, "up"]);
        }
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// A lab launcher running in a namespace; stopped (SIGTERM: it stops its
/// servers and QEMU) if the test ends before it does.
struct RunningLab {
    name: &'static str,
    child: Option<Child>,
    stdout: PathBuf,
    runs: PathBuf,
}

impl RunningLab {
    fn wait(&mut self, budget: Duration) -> (i32, String) {
        let deadline = Instant::now() + budget;
        let mut child = self.child.take().expect("waited once");
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                self.child = Some(child);
                panic!("lab {} did not finish within {budget:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let output = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        (status.code().unwrap_or(-1), output)
    }

    /// The EFA server's stats file of the lab's run.
    fn efa_stats(&self) -> Value {
        let path = self.runs.join("latest/efa0.stats.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()))
    }
}

impl Drop for RunningLab {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // SAFETY: kill(2) on the pid of our own child, not yet reaped
            // (try_wait has not returned its status), so the pid is still
            // its own.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let _ = child.wait();
        }
    }
}

/// The result row of a perftest output (the line after `#bytes`), as
/// numbers; whether its clock calibration failed.
fn perftest_row(text: &str) -> (Vec<f64>, bool) {
    let calibration_failed = text.contains("Correlation coefficient");
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("#bytes") {
            let row = lines.next().unwrap_or_default();
            let numbers = row
                .split_whitespace()
                .map(|w| w.parse().unwrap_or(f64::NAN))
                .collect();
            return (numbers, calibration_failed);
        }
    }
    panic!("no perftest result row in:\n{text}");
}

fn check_perftest(side: &str, text: &str, size: u64) {
    let (row, calibration_failed) = perftest_row(text);
    assert!(row.len() >= 4, "{side}: short result row {row:?}:\n{text}");
    assert_eq!(row[0], size as f64, "{side}: message size:\n{text}");
    assert_eq!(row[1], ITERS as f64, "{side}: iterations:\n{text}");
    if !calibration_failed {
        assert!(row[3] > 0.0, "{side}: average bandwidth 0:\n{text}");
    }
}

fn wire(stats: &Value, name: &str) -> u64 {
    stats["wire"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no wire counter {name} in {stats}"))
}

fn efa(stats: &Value, name: &str) -> u64 {
    stats[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {stats}"))
}

#[test]
fn two_labs_rdma_over_tcp_between_network_namespaces() {
    let paths = LabPaths::discover().expect("the checkout");
    let vm = paths.server_binary("p2plab-vm").expect("p2plab-vm built");
    // The guest environment and overlay once, before two launchers could
    // race to build them.
    run(Command::new(&vm)
        .arg("--setup-only")
        .arg("--config")
        .arg("efa-tcp"));

    let work = std::env::temp_dir().join(format!("p2plab-two-labs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let key = work.join("wire.key");
    std::fs::write(
        &key,
        "9c4f2b7e1a0d3c6f8e5b2a9d7c4f1e0b3a6d9c2f5e8b1a4d7c0f3e6b9a2d5c8f\n",
    )
    .unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();

    let ns = Namespaces::new();
    let start = |name: &'static str,
                 netns: &str,
                 wire: String,
                 gid: &str,
                 args: [&str; 4],
                 netdev: String,
                 mac: &str| {
        let share = work.join(format!("share-{name}"));
        let runs = work.join(format!("runs-{name}"));
        std::fs::create_dir_all(&share).unwrap();
        std::fs::write(
            share.join("two-labs.sh"),
            include_str!("../guest/two-labs.sh"),
        )
        .unwrap();
        let stdout = work.join(format!("{name}.out"));
        let exec = format!(
            "bash /mnt/host/two-labs.sh {} {} {} {} {ITERS} {GPU_SIZE}",
            args[0], args[1], args[2], args[3]
        );
        let child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(&vm)
            .args(["--config", "efa-tcp", "--accel", "tcg", "--timeout", "1500"])
            .arg("--efa-wire")
            .arg(wire)
            .arg("--efa-wire-key")
            .arg(&key)
            .args(["--efa-gid", gid])
            .args(["--guest-control", "efa0,gpu0"])
            .arg("--share")
            .arg(&share)
            .arg("--state")
            .arg(work.join(format!("state-{name}")))
            .args(["--exec", &exec])
            .arg("--")
            .args(["-netdev", &netdev])
            .args([
                "-device",
                &format!("virtio-net-pci,netdev=labnet,mac={mac}"),
            ])
            .env("P2PLAB_RUNS", &runs)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting p2plab-vm");
        RunningLab {
            name,
            child: Some(child),
            stdout,
            runs,
        }
    };
    let mac_a = "52:54:00:77:00:01";
    let mac_b = "52:54:00:77:00:02";
    let mut lab_a = start(
        "a",
        &ns.a,
        format!("tcp-listen:{ADDR_A}:{WIRE_PORT}"),
        "fd00:7032:efa0::a",
        ["server", GUEST_A, GUEST_B, mac_a],
        format!(
            "stream,id=labnet,server=on,addr.type=inet,addr.host={ADDR_A},addr.port={GUEST_NET_PORT}"
        ),
        mac_a,
    );
    // Lab A's QEMU listens for the guests' link before lab B's dials it.
    std::thread::sleep(Duration::from_secs(20));
    let mut lab_b = start(
        "b",
        &ns.b,
        format!("tcp-connect:{ADDR_A}:{WIRE_PORT}"),
        "fd00:7032:efa0::b",
        ["client", GUEST_B, GUEST_A, mac_b],
        format!(
            "stream,id=labnet,server=off,addr.type=inet,addr.host={ADDR_A},addr.port={GUEST_NET_PORT},reconnect-ms=500"
        ),
        mac_b,
    );
    let budget = Duration::from_secs(1800);
    let (status_b, out_b) = lab_b.wait(budget);
    let (status_a, out_a) = lab_a.wait(budget);
    let facts_a = common::parse_facts(&out_a);
    let facts_b = common::parse_facts(&out_b);
    let fact = |facts: &std::collections::BTreeMap<String, String>, out: &str, key: &str| {
        facts
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("the guest did not report {key}:\n{out}"))
    };
    eprintln!("lab a:\n{out_a}\nlab b:\n{out_b}");
    assert_eq!(status_a, 0, "lab a's guest script:\n{out_a}");
    assert_eq!(status_b, 0, "lab b's guest script:\n{out_b}");

    // 1. Ports up, two GIDs.
    for (facts, out) in [(&facts_a, &out_a), (&facts_b, &out_b)] {
        // The init loads virtio_net for the lab's virtio-net NIC.
        assert_eq!(fact(facts, out, "VIRTIO_NET"), "loaded");
        assert_eq!(
            fact(facts, out, "PEER_PING"),
            "1",
            "no IP path between the guests"
        );
        assert_eq!(fact(facts, out, "PORT_STATE"), "ACTIVE");
        assert_eq!(fact(facts, out, "DONE"), "1");
    }
    assert_eq!(
        fact(&facts_a, &out_a, "GID"),
        "fd00:7032:efa0:0000:0000:0000:0000:000a"
    );
    assert_eq!(
        fact(&facts_b, &out_b, "GID"),
        "fd00:7032:efa0:0000:0000:0000:0000:000b"
    );

    // 2. perftest, both ends.
    for (name, size) in [("send_bw", SEND_SIZE), ("read_bw", READ_SIZE)] {
        let key = format!("{}_EXIT", name.to_uppercase());
        assert_eq!(fact(&facts_a, &out_a, &key), "0", "server {name}");
        assert_eq!(fact(&facts_b, &out_b, &key), "0", "client {name}");
        for side in ["server", "client"] {
            let lab = if side == "server" { "a" } else { "b" };
            let path = work.join(format!("share-{lab}/{side}/{name}.txt"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            check_perftest(&format!("{side} {name}"), &text, size);
        }
    }

    // 3. The traffic crossed the TCP wire.
    let (a, b) = (lab_a.efa_stats(), lab_b.efa_stats());
    for (lab, stats) in [("a", &a), ("b", &b)] {
        assert_eq!(
            wire(stats, "connections"),
            1,
            "lab {lab} reconnected: {stats}"
        );
        assert_eq!(wire(stats, "protocol_errors"), 0, "lab {lab}: {stats}");
        assert_eq!(wire(stats, "peers_refused"), 0, "lab {lab}: {stats}");
        assert!(wire(stats, "frames_sent") > 0 && wire(stats, "frames_received") > 0);
    }
    // ib_read_bw: lab A served ITERS reads of READ_SIZE to lab B.
    assert!(efa(&a, "read_resp_bytes") >= ITERS * READ_SIZE, "{a}");
    assert!(efa(&b, "read_bytes") >= ITERS * READ_SIZE, "{b}");
    assert!(wire(&a, "bytes_sent") >= ITERS * READ_SIZE, "{a}");
    // ib_send_bw: lab B sent ITERS messages of SEND_SIZE to lab A.
    assert!(efa(&a, "recv_bytes") >= ITERS * SEND_SIZE, "{a}");
    assert!(wire(&b, "bytes_sent") >= ITERS * SEND_SIZE, "{b}");
    // Nothing else is on this wire: what one took, the other sent (a
    // retransmission written just before the other lab stopped may be
    // sent and never taken).
    assert!(wire(&a, "bytes_sent") >= wire(&b, "bytes_received"));
    assert!(wire(&b, "bytes_sent") >= wire(&a, "bytes_received"));
    assert!(wire(&a, "bytes_received") >= ITERS * SEND_SIZE, "{a}");
    assert!(wire(&b, "bytes_received") >= ITERS * READ_SIZE, "{b}");

    // 4-6. GPU memory to GPU memory across the labs, and hostile peers.
    let share_a = work.join("share-a/server");
    let share_b = work.join("share-b/client");
    check_gpu_transfer("A -> B", &share_a, &share_b, "gpu_ab");
    check_gpu_transfer("B -> A", &share_b, &share_a, "gpu_ba");
    for (facts, out) in [(&facts_a, &out_a), (&facts_b, &out_b)] {
        assert_eq!(fact(facts, out, "GPU_AB_EXIT"), "0", "gpu-xfer A -> B");
        assert_eq!(fact(facts, out, "GPU_BA_EXIT"), "0", "gpu-xfer B -> A");
    }
    for (name, words) in [
        (
            "hostile_short",
            "the peer closed the connection after 6 of the 72 bytes of its hello",
        ),
        (
            "hostile_length",
            "the peer would send 1073741824 bytes: beyond this end's 1048576-byte buffers",
        ),
        (
            "hostile_silent",
            "timed out after 5 s waiting for the peer's hello (0 of 72 bytes)",
        ),
    ] {
        let key = format!("{}_EXIT", name.to_uppercase());
        assert_eq!(fact(&facts_a, &out_a, &key), "2", "{name}");
        let end = tool_facts(&share_a, name);
        let error = end
            .get("peer_error")
            .unwrap_or_else(|| panic!("{name}: no peer_error: {end:?}"));
        assert!(error.starts_with(words), "{name}: {error}");
        assert!(!end.contains_key("verify"), "{name} went on: {end:?}");
    }

    drop(ns);
    let _ = std::fs::remove_dir_all(&work);
}

/// The `key=value` lines of one `p2plab-efa-check` run the guest saved
/// (lower-case keys; its messages on stderr are in the same file).
fn tool_facts(dir: &Path, name: &str) -> std::collections::BTreeMap<String, String> {
    let path = dir.join(format!("{name}.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            let is_key = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            is_key.then(|| (key.to_owned(), value.to_owned()))
        })
        .collect()
}

/// A counter of a `p2plab-ctl ID status` file the guest saved (`wire.NAME`
/// for the wire's).
fn status_counter(dir: &Path, file: &str, name: &str) -> u64 {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()));
    let value = match name.strip_prefix("wire.") {
        Some(wire) => &json["wire"][wire],
        None => &json[name],
    };
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{} has no counter {name}: {json}", path.display()))
}

/// Steps 4 and 5 for one direction: `p2plab-efa-check gpu-xfer --role src`
/// in the lab whose share is `src`, `--role dst` in `dst`'s.
fn check_gpu_transfer(what: &str, src: &Path, dst: &Path, name: &str) {
    let messages = GPU_SIZE / GPU_MSG;
    let s = tool_facts(src, name);
    let d = tool_facts(dst, name);
    let get = |end: &std::collections::BTreeMap<String, String>, side: &str, key: &str| {
        end.get(key)
            .cloned()
            .unwrap_or_else(|| panic!("{what} {side}: no {key} in {end:?}"))
    };
    let num = |end, side, key| -> u64 {
        let text = get(end, side, key);
        text.parse()
            .unwrap_or_else(|_| panic!("{what} {side}: {key}={text}"))
    };
    // 4. Both ends verified; the destination's GPU CRCs are the source's.
    for (end, side) in [(&s, "src"), (&d, "dst")] {
        assert_eq!(get(end, side, "verify"), "ok", "{what} {side}: {end:?}");
        assert_eq!(get(end, side, "dereg"), "ok", "{what} {side}");
        assert_eq!(num(end, side, "bytes"), GPU_SIZE, "{what} {side}");
        assert_eq!(num(end, side, "messages"), messages, "{what} {side}");
    }
    assert_eq!(get(&s, "src", "role"), "src");
    assert_eq!(get(&d, "dst", "role"), "dst");
    assert_eq!(num(&s, "src", "send_ok"), messages, "{what}");
    assert_eq!(num(&d, "dst", "recv_ok"), messages, "{what}");
    assert_eq!(num(&d, "dst", "missing"), 0, "{what}");
    assert_eq!(num(&d, "dst", "duplicates"), 0, "{what}");
    assert_eq!(num(&d, "dst", "read_bytes"), GPU_SIZE, "{what}");
    let expected = get(&s, "src", "expected_crc");
    assert_ne!(expected, "0x00000000");
    assert_eq!(
        get(&s, "src", "src_crc"),
        expected,
        "{what}: the source GPU's CRC"
    );
    for key in ["peer_crc", "dst_crc", "read_crc"] {
        assert_eq!(
            get(&d, "dst", key),
            expected,
            "{what}: the destination's {key}"
        );
    }
    for key in ["peer_dst_crc", "peer_read_crc"] {
        assert_eq!(
            get(&s, "src", key),
            expected,
            "{what}: {key} as the source heard it"
        );
    }
    // The ends found each other by what they exchanged: each one's peer
    // QPN is a QP of the other lab (the GIDs were checked in step 1).
    assert_ne!(num(&s, "src", "peer_qpn"), 0);
    assert_ne!(num(&d, "dst", "peer_qpn"), 0);

    // 5. The servers' counters around the run, in each lab.
    let delta = |dir: &Path, device: &str, counter: &str| -> u64 {
        let before = status_counter(dir, &format!("before-{name}-{device}.json"), counter);
        let after = status_counter(dir, &format!("after-{name}-{device}.json"), counter);
        after.checked_sub(before).unwrap_or_else(|| {
            panic!("{what}: {device} {counter} went back from {before} to {after}")
        })
    };
    // SENDs and read responses out of the source's VRAM, into the
    // destination's: twice the payload through each EFA's peer BAR.
    let payload = 2 * GPU_SIZE;
    for (dir, side) in [(src, "src"), (dst, "dst")] {
        assert_eq!(
            delta(dir, "efa0", "peer_bar_bytes"),
            payload,
            "{what} {side}: payload to or from the GPU's BAR"
        );
        for counter in ["dma_message_read_bytes", "dma_message_write_bytes"] {
            assert_eq!(
                delta(dir, "efa0", counter),
                0,
                "{what} {side} {counter}: through QEMU"
            );
        }
        let ram =
            delta(dir, "efa0", "dma_mmap_read_bytes") + delta(dir, "efa0", "dma_mmap_write_bytes");
        assert!(
            ram < GPU_SIZE / 16,
            "{what} {side}: {ram} bytes of guest RAM, more than descriptors and completions"
        );
        assert_eq!(
            delta(dir, "efa0", "wire.connections"),
            0,
            "{what} {side}: the wire reconnected"
        );
        assert_eq!(
            delta(dir, "efa0", "wire.protocol_errors"),
            0,
            "{what} {side}"
        );
    }
    assert!(
        delta(src, "efa0", "dma_peer_read_bytes") >= payload,
        "{what}"
    );
    assert!(
        delta(dst, "efa0", "dma_peer_write_bytes") >= payload,
        "{what}"
    );
    assert_eq!(
        delta(src, "gpu0", "peer_inbound_read_bytes"),
        payload,
        "{what}"
    );
    assert_eq!(delta(src, "gpu0", "peer_inbound_write_bytes"), 0, "{what}");
    assert_eq!(
        delta(dst, "gpu0", "peer_inbound_write_bytes"),
        payload,
        "{what}"
    );
    assert_eq!(delta(dst, "gpu0", "peer_inbound_read_bytes"), 0, "{what}");
    assert_eq!(delta(src, "efa0", "send_bytes"), GPU_SIZE, "{what}");
    assert_eq!(delta(src, "efa0", "read_resp_bytes"), GPU_SIZE, "{what}");
    assert_eq!(delta(dst, "efa0", "recv_bytes"), GPU_SIZE, "{what}");
    assert_eq!(delta(dst, "efa0", "read_bytes"), GPU_SIZE, "{what}");
    // The TCP wire carried them: the source's lab sent, the other took,
    // the payload at least (headers and acks on top).
    assert!(delta(src, "efa0", "wire.bytes_sent") >= payload, "{what}");
    assert!(
        delta(dst, "efa0", "wire.bytes_received") >= payload,
        "{what}"
    );
}
