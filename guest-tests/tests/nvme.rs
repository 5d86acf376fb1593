//! Issue 3 end to end: the unmodified Linux nvme driver and nvme-cli against
//! p2plab-nvme, with the data checked by reading it back, the CMB checked in
//! sysfs, dmesg and the server's own counters, and persistence across boots.

mod common;

use common::{run_guest, test_state_dir, Boot, GuestRun};
use serde_json::Value;

/// Namespace 1 comes from the topology (1 GiB file, 512-byte blocks);
/// namespace 2 is added here (256 MiB in memory, 4096-byte blocks).
fn two_namespaces() -> Vec<(String, Vec<String>)> {
    vec![(
        "nvme0".into(),
        vec!["--namespace".into(), "mem,size=256M,lba=4096".into()],
    )]
}

const SCRIPT: &str = r#"
set -u
out=/run/p2plab
fail() { echo "FAILED: $*"; exit 1; }
# Namespaces by NSID: Linux names them in probe order, which varies.
ns1=$(p2plab-nvme-ns 1) || fail "no namespace 1"
ns2=$(p2plab-nvme-ns 2) || fail "no namespace 2"
[ -b $ns1 ] && [ -b $ns2 ] || fail "no block devices for $ns1 $ns2"
ctrl=/sys/class/nvme/nvme0
bdf=$(basename "$(readlink -f $ctrl/device)")

nvme list -o json > $out/list.json
nvme id-ctrl /dev/nvme0 -o json > $out/id-ctrl.json
nvme id-ns $ns1 -o json > $out/id-ns1.json
nvme id-ns $ns2 -o json > $out/id-ns2.json
nvme ns-descs $ns1 -o json > $out/ns-descs1.json
nvme ns-descs $ns2 -o json > $out/ns-descs2.json
echo "BOGUS_IDS=$(dmesg | grep -c 'bogus')"

# Data-path commands, each checked by reading back.
dd if=/dev/urandom of=/tmp/rand bs=4096 count=16 2>/dev/null
dd if=/tmp/rand of=$ns1 bs=4096 count=16 oflag=direct 2>/dev/null
cmp <(dd if=$ns1 bs=4096 count=16 iflag=direct 2>/dev/null) /tmp/rand && echo "READBACK=ok" || echo "READBACK=bad"
nvme write-zeroes $ns1 --start-block=8 --block-count=7 >/dev/null && echo "WZ_CMD=ok"
zeros=$(dd if=$ns1 bs=512 skip=8 count=8 iflag=direct 2>/dev/null | tr -d '\0' | wc -c)
echo "WZ_NONZERO_BYTES=$zeros"
kept=$(cmp <(dd if=$ns1 bs=512 count=8 iflag=direct 2>/dev/null) <(dd if=/tmp/rand bs=512 count=8 2>/dev/null) && echo ok || echo bad)
echo "WZ_NEIGHBOURS=$kept"
nvme dsm $ns1 --ad --slbs=32 --blocks=32 >/dev/null && echo "DSM_CMD=ok"
echo "DSM_NONZERO_BYTES=$(dd if=$ns1 bs=512 skip=32 count=32 iflag=direct 2>/dev/null | tr -d '\0' | wc -c)"
nvme flush $ns1 >/dev/null && echo "FLUSH_CMD=ok"

# fio verify workloads: sizes, depths, engines, several jobs on several queues.
for bs in 4k 128k; do for qd in 1 32; do for engine in libaio io_uring; do
  fio --name=v --filename=$ns1 --direct=1 --rw=randwrite --bs=$bs --iodepth=$qd \
      --ioengine=$engine --size=32M --offset=64M --verify=crc32c --do_verify=1 \
      --verify_fatal=1 --output-format=terse >/dev/null 2>$out/fio.err \
    && echo "FIO_${bs}_QD${qd}_${engine}=ok" || { echo "FIO_${bs}_QD${qd}_${engine}=failed"; cat $out/fio.err; }
done; done; done
fio --name=par --filename=$ns2 --direct=1 --rw=randrw --bs=16k --iodepth=16 \
    --ioengine=io_uring --numjobs=4 --size=16M --offset_increment=32M --verify=md5 \
    --verify_fatal=1 --group_reporting --output-format=terse >/dev/null 2>$out/fio.err \
  && echo "FIO_PARALLEL=ok" || { echo "FIO_PARALLEL=failed"; cat $out/fio.err; }
echo "IO_QUEUES=$(ls -d /sys/block/${ns1#/dev/}/mq/* | wc -l)"

nvme smart-log /dev/nvme0 -o json > $out/smart.json
nvme error-log /dev/nvme0 -e 8 -o json > $out/error-log.json
nvme fw-log /dev/nvme0 -o json > $out/fw-log.json
# Error Recovery (5) is namespace specific: ask namespace 1 for it.
feature() {
  v=$(nvme get-feature /dev/nvme0 "$@" 2>&1 | sed -n 's/.*Current value:[ ]*\(0x\)\{0,1\}\([0-9a-fA-F]*\).*/0x\2/p')
  echo "${v:-error}"
}
for f in 1 2 4 6 7 8 9 10 11; do echo "FEATURE_$f=$(feature -f $f)"; done
echo "FEATURE_5=$(feature -f 5 -n 1)"
echo "FEATURE_TIMESTAMP=$(nvme get-feature /dev/nvme0 -f 0xe -H 2>&1 | grep -c -i 'timestamp')"
nvme set-feature /dev/nvme0 -f 4 --value=336 >/dev/null 2>&1
echo "FEATURE_4_AFTER_SET=$(feature -f 4)"

# The CMB: registered and published as p2pmem, I/O SQs placed in it.
echo "CMBSZ=$(cat $ctrl/cmbsz)"
echo "CMBLOC=$(cat $ctrl/cmbloc)"
echo "P2P_ADDED=$(dmesg | grep -c "$bdf: added peer-to-peer DMA memory")"
echo "P2P_PUBLISHED=$(cat /sys/bus/pci/devices/$bdf/p2pmem/published)"
echo "P2P_SIZE=$(cat /sys/bus/pci/devices/$bdf/p2pmem/size)"
dmesg | grep -iE 'nvme|p2p' | tail -n 20
exit 0
"#;

fn json(run: &GuestRun, name: &str) -> Value {
    let text = std::fs::read_to_string(run.run_dir().join("guest").join(name))
        .unwrap_or_else(|e| panic!("guest did not write {name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {text}"))
}

fn num(v: &Value, key: &str) -> u64 {
    match &v[key] {
        Value::Number(n) => n.as_u64().unwrap_or_else(|| panic!("{key}: {n}")),
        Value::String(s) => s.trim().parse().unwrap_or_else(|_| panic!("{key}: {s}")),
        other => panic!("{key} missing or odd: {other}"),
    }
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} missing: {v}"))
        .trim()
}

#[test]
fn linux_nvme_driver_and_nvme_cli_against_p2plab_nvme() {
    let run = run_guest(
        "lab",
        SCRIPT,
        Boot {
            server_args: two_namespaces(),
            ..Boot::default()
        },
    );

    // Identify controller.
    let ctrl = json(&run, "id-ctrl.json");
    assert_eq!(num(&ctrl, "sqes"), 0x66, "SQ entry size 64");
    assert_eq!(num(&ctrl, "cqes"), 0x44, "CQ entry size 16");
    assert_eq!(num(&ctrl, "nn"), 2);
    assert!(num(&ctrl, "mdts") > 0, "MDTS is enforced, so advertised");
    assert!(!text(&ctrl, "sn").is_empty() && !text(&ctrl, "mn").is_empty());
    assert!(!text(&ctrl, "fr").is_empty());
    assert_ne!(num(&ctrl, "sgls") & 0x3, 0, "SGLs advertised");
    let oncs = num(&ctrl, "oncs");
    for (bit, what) in [
        (0, "Compare"),
        (2, "DSM"),
        (3, "Write Zeroes"),
        (7, "Verify"),
    ] {
        assert_ne!(oncs & (1 << bit), 0, "ONCS advertises {what}");
    }
    assert!(num(&ctrl, "ver") >= 0x10400);

    // Namespaces: sizes and LBA formats.
    let ns1 = json(&run, "id-ns1.json");
    let ns2 = json(&run, "id-ns2.json");
    assert_eq!(num(&ns1, "nsze"), (1u64 << 30) / 512);
    assert_eq!(num(&ns2, "nsze"), (256u64 << 20) / 4096);
    let lbads = |ns: &Value| {
        let index = (num(ns, "flbas") & 0xf) as usize;
        num(&ns["lbafs"][index], "ds")
    };
    assert_eq!(lbads(&ns1), 9);
    assert_eq!(lbads(&ns2), 12);
    assert_ne!(text(&ns1, "nguid"), text(&ns2, "nguid"), "unique NGUIDs");
    run.expect("BOGUS_IDS", "0");
    let list = json(&run, "list.json");
    let devices = list["Devices"].to_string();
    assert!(
        devices.contains("nvme0n1") && devices.contains("nvme0n2"),
        "{devices}"
    );

    // Data path.
    run.expect("READBACK", "ok");
    run.expect("WZ_CMD", "ok");
    run.expect("WZ_NONZERO_BYTES", "0");
    run.expect("WZ_NEIGHBOURS", "ok");
    run.expect("DSM_CMD", "ok");
    run.expect("DSM_NONZERO_BYTES", "0");
    run.expect("FLUSH_CMD", "ok");
    for bs in ["4k", "128k"] {
        for qd in [1, 32] {
            for engine in ["libaio", "io_uring"] {
                run.expect(&format!("FIO_{bs}_QD{qd}_{engine}"), "ok");
            }
        }
    }
    run.expect("FIO_PARALLEL", "ok");
    assert!(run.fact_u64("IO_QUEUES") >= 2, "one I/O queue per vCPU");

    // Logs and features.
    let smart = json(&run, "smart.json");
    assert!(num(&smart, "data_units_written") > 0);
    assert!(num(&smart, "data_units_read") > 0);
    assert!(num(&smart, "host_write_commands") > 100);
    assert!(num(&smart, "host_read_commands") > 100);
    let temperature = num(&smart, "temperature");
    assert!(
        (273..373).contains(&temperature),
        "temperature {temperature} K"
    );
    let fw = json(&run, "fw-log.json");
    assert!(
        fw.to_string().contains(text(&ctrl, "fr")),
        "fw-log shows the running firmware: {fw}"
    );
    let errors = json(&run, "error-log.json");
    assert!(errors.is_object() || errors.is_array());
    assert_ne!(run.fact("FEATURE_TIMESTAMP"), "0", "timestamp feature");
    for f in ["1", "2", "4", "5", "6", "7", "8", "9", "10", "11"] {
        assert_ne!(
            run.fact(&format!("FEATURE_{f}")),
            "error",
            "get-feature {f}"
        );
    }
    assert_eq!(
        run.fact_u64("FEATURE_4_AFTER_SET"),
        0x150,
        "temperature threshold set+get"
    );
    assert_eq!(
        run.fact_u64("FEATURE_7") & 0xffff,
        run.fact_u64("FEATURE_7") >> 16,
        "NSQA == NCQA"
    );

    // CMB.
    assert_ne!(run.fact_u64("CMBSZ"), 0);
    run.expect("P2P_ADDED", "1");
    run.expect("P2P_PUBLISHED", "1");
    assert_eq!(run.fact_u64("P2P_SIZE"), 64 << 20);
    let stats: Value = serde_json::from_str(&common::server_stats(&run, "nvme0"))
        .expect("nvme0.stats.json is JSON");
    let cmb_sqes = stats
        .pointer("/cmb/sq_entries_fetched")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    assert!(
        cmb_sqes > 0,
        "I/O submission queues live in the CMB: {stats}"
    );
}

/// Data written in one boot is read back in the next from the same backing
/// file, and the host sees it in that file.
#[test]
fn data_survives_a_server_restart() {
    let state = test_state_dir("persist");
    let write = r#"
set -e
dd if=/dev/urandom of=/run/p2plab/blob bs=1M count=4 2>/dev/null
dd if=/run/p2plab/blob of=$(p2plab-nvme-ns 1) bs=1M seek=100 oflag=direct conv=fsync 2>/dev/null
echo "SUM=$(md5sum < /run/p2plab/blob | cut -d' ' -f1)"
"#;
    let first = run_guest(
        "lab",
        write,
        Boot {
            state: Some(state.clone()),
            ..Boot::default()
        },
    );
    let sum = first.fact("SUM").to_owned();
    let blob = std::fs::read(first.run_dir().join("guest/blob")).expect("blob on the host");
    let image = std::fs::read(state.join("nvme0n1.img")).expect("backing file");
    assert_eq!(
        &image[100 << 20..104 << 20],
        &blob[..],
        "backing file holds the data"
    );

    let read = r#"
set -e
echo "SUM=$(dd if=$(p2plab-nvme-ns 1) bs=1M skip=100 count=4 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
"#;
    let second = run_guest(
        "lab",
        read,
        Boot {
            state: Some(state),
            ..Boot::default()
        },
    );
    assert_eq!(second.fact("SUM"), sum);
}
