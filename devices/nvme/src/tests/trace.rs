//! The decoded trace, read back from its file as JSON: commands by spec
//! name with their fields, data pointers and where they live, status
//! names, injected faults marked, doorbells, interrupts, register writes
//! and resets.

use super::harness::*;
use crate::command::CommandBuilder;
use crate::spec::{io as op, Status};
use serde_json::Value;

fn trace_file(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "p2plab-nvme-trace-{}-{name}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

fn events(path: &std::path::Path) -> Vec<Value> {
    p2plab_trace::parse_lines(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

/// Catches commands traced under the wrong name or fields, data pointers
/// placed in the wrong memory (RAM vs own CMB), a missing latency, an
/// injected status not marked as injected, and missing doorbell,
/// interrupt, register and reset events.
#[test]
fn commands_faults_doorbells_and_resets_are_decoded() {
    let path = trace_file("decoded");
    let mut h = Host::new();
    h.map_cmb();
    h.enable();
    h.create_pair(1);
    h.ctrl.tracer().configure(&path, "nvme-test");
    h.ctrl.tracer().enable().unwrap();

    // Write 16 blocks from RAM (PRP1) and the CMB (PRP2).
    let write = CommandBuilder::new(op::WRITE, 0)
        .nsid(1)
        .slba(32)
        .cdw(12, 15)
        .prp1(DATA)
        .prp2(CMB_BAR + 0x10_0000)
        .build();
    assert_eq!(h.io(1, write).status, Status::SUCCESS);
    h.ctrl
        .inject("status=0x281,dnr,count=1,opcode=read".parse().unwrap())
        .unwrap();
    let read = CommandBuilder::new(op::READ, 0)
        .nsid(1)
        .slba(40)
        .cdw(12, 0)
        .prp1(DATA)
        .build();
    let got = h.io(1, read).status;
    assert_eq!(got, Status::UNRECOVERED_READ_ERROR.with_dnr());
    h.ctrl
        .inject("media-error:lba=50-50".parse().unwrap())
        .unwrap();
    let read = CommandBuilder::new(op::READ, 0)
        .nsid(1)
        .slba(48)
        .cdw(12, 3)
        .prp1(DATA)
        .build();
    assert_eq!(h.io(1, read).status, Status::UNRECOVERED_READ_ERROR);
    h.write32(crate::registers::reg::INTMS, 0);
    h.ctrl.reset();
    h.ctrl.tracer().disable();

    let events = events(&path);
    assert_eq!(events[0]["kind"], "trace-start");
    assert_eq!(events[0]["device"], "nvme-test");
    let cmds = of_kind(&events, "cmd");
    assert_eq!(cmds.len(), 3, "{cmds:?}");
    let w = cmds[0];
    assert_eq!(w["name"], "Write");
    assert_eq!(w["opcode"], "0x1");
    assert_eq!(w["sqid"], 1);
    assert_eq!(w["nsid"], 1);
    assert_eq!(w["slba"], 32);
    assert_eq!(w["nlb"], 16);
    assert_eq!(w["data"]["form"], "prp");
    assert_eq!(w["data"]["prp1"]["addr"], format!("{DATA:#x}"));
    assert_eq!(w["data"]["prp1"]["at"], "ram");
    assert_eq!(w["data"]["prp2"]["at"], "own-cmb");
    assert_eq!(w["status"], "Successful Completion");
    assert!(w["dur_ns"].as_u64().is_some());
    assert!(w.get("injected").is_none(), "not injected");

    let r = cmds[1];
    assert_eq!(r["name"], "Read");
    assert_eq!((r["slba"].as_u64(), r["nlb"].as_u64()), (Some(40), Some(1)));
    assert_eq!(r["status"], "Unrecovered Read Error");
    assert_eq!(r["status_raw"], "0x4281");
    assert_eq!(r["injected"], true);
    let faults = of_kind(&events, "fault");
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert_eq!(faults[0]["name"], "Read");
    assert_eq!(faults[0]["cid"], r["cid"]);
    assert_eq!(faults[0]["slba"], 40);
    assert_eq!(faults[0]["injected"], true);
    assert_eq!(faults[0]["effects"][0], "status 0x281 dnr");
    assert_eq!(faults[1]["name"], "media-error");
    assert_eq!(
        (faults[1]["slba"].as_u64(), faults[1]["nlb"].as_u64()),
        (Some(48), Some(4))
    );
    assert_eq!(faults[1]["bad_lba"], 50);
    assert_eq!(faults[1]["injected"], true);
    assert_eq!(cmds[2]["status"], "Unrecovered Read Error");

    let doorbells = of_kind(&events, "doorbell");
    assert!(doorbells
        .iter()
        .any(|d| d["name"] == "SQ tail" && d["sqid"] == 1));
    assert!(doorbells
        .iter()
        .any(|d| d["name"] == "CQ head" && d["cqid"] == 1));
    assert!(of_kind(&events, "irq").iter().any(|i| i["cqid"] == 1));
    let regs = of_kind(&events, "reg-write");
    assert!(regs.iter().any(|r| r["name"] == "INTMS"), "{regs:?}");
    assert_eq!(of_kind(&events, "reset")[0]["name"], "function reset");
    assert_eq!(events.last().unwrap()["kind"], "trace-stop");
    std::fs::remove_file(&path).unwrap();
}

/// Catches a tracer that records while off (the hot path must stay one
/// atomic load).
#[test]
fn off_records_nothing() {
    let path = trace_file("off");
    let mut h = Host::new();
    h.enable();
    h.create_pair(1);
    h.ctrl.tracer().configure(&path, "nvme-test");
    let read = CommandBuilder::new(op::READ, 0)
        .nsid(1)
        .cdw(12, 0)
        .prp1(DATA)
        .build();
    assert_eq!(h.io(1, read).status, Status::SUCCESS);
    assert!(!path.exists());
    assert_eq!(h.ctrl.tracer().status().events, 0);
}

/// Catches a held (injected `timeout`) command whose hold or abort leaves
/// no trace: the fault, the Abort, and the held command's Command Abort
/// Requested completion.
#[test]
fn held_command_and_its_abort_are_traced() {
    let path = trace_file("held");
    let mut h = Host::new();
    h.enable();
    h.create_pair(1);
    h.ctrl.tracer().configure(&path, "nvme-test");
    h.ctrl.tracer().enable().unwrap();
    h.ctrl
        .inject("timeout,count=1,opcode=read".parse().unwrap())
        .unwrap();
    let read = CommandBuilder::new(op::READ, 0)
        .nsid(1)
        .slba(7)
        .cdw(12, 0)
        .prp1(DATA)
        .build();
    let held = h.submit(1, read);
    assert!(h
        .try_reap(1, std::time::Duration::from_millis(100))
        .is_none());
    let abort = CommandBuilder::new(crate::spec::admin::ABORT, 0)
        .cdw(10, 1 | (u32::from(held) << 16))
        .build();
    assert_eq!(h.admin(abort).status, Status::SUCCESS);
    assert_eq!(h.reap(1).status, Status::ABORT_REQUESTED);
    h.ctrl.tracer().disable();

    let events = events(&path);
    let fault = of_kind(&events, "fault")[0];
    assert_eq!(fault["name"], "Read");
    assert_eq!(fault["slba"], 7);
    assert_eq!(fault["effects"][0], "hang");
    let cmds = of_kind(&events, "cmd");
    let abort = cmds.iter().find(|c| c["name"] == "Abort").unwrap();
    assert_eq!(abort["sqid"], 0);
    assert_eq!(abort["status"], "Successful Completion");
    let ended = cmds.iter().find(|c| c["name"] == "Read").unwrap();
    assert_eq!(ended["cid"], held);
    assert_eq!(ended["status"], "Command Abort Requested");
    assert_eq!(ended["injected"], true);
    std::fs::remove_file(&path).unwrap();
}
