//! The decoded trace of the engine, read back from its file as JSON.
//!
//! Catches: a job traced under the wrong opcode name, operands without
//! their location (guest RAM vs own VRAM), a missing status or latency, an
//! injected job error or lost interrupt not marked as injected, and a
//! reset that leaves no event.

use crate::rig::*;
use p2plab_gpu::GpuFaultSpec;

#[test]
fn jobs_injected_faults_and_resets_are_decoded() {
    let path = std::env::temp_dir().join(format!("p2plab-gpu-trace-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut rig = Rig::ready();
    rig.gpu.tracer().configure(&path, "gpu-test");
    rig.gpu.tracer().enable().unwrap();

    let data = pattern(4096, 3);
    rig.poke(DATA_GPA, &data);
    let r = rig.run(cmd(op::COPY_TO_VRAM, DATA_GPA, 0x2000, 4096));
    assert_eq!(r.status, StatusCode::Ok.code());
    let spec: GpuFaultSpec = "job-error=0x06,opcode=fill,count=1".parse().unwrap();
    rig.gpu.inject(spec).unwrap();
    let r = rig.run(fill_cmd(0, 4096, 7));
    assert_eq!(r.status, StatusCode::VramIo.code());
    rig.gpu.reset().unwrap();
    rig.gpu.tracer().disable();

    let text = std::fs::read_to_string(&path).unwrap();
    let events = p2plab_trace::parse_lines(&text).unwrap();
    assert_eq!(events[0]["kind"], "trace-start");
    let jobs: Vec<_> = events.iter().filter(|e| e["kind"] == "job").collect();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let copy = jobs[0];
    assert_eq!(copy["name"], "COPY_TO_VRAM");
    assert_eq!(copy["len"], 4096);
    assert_eq!(copy["src"]["addr"], format!("{DATA_GPA:#x}"));
    assert_eq!(copy["src"]["at"], "ram");
    assert_eq!(copy["dst"]["vram_offset"], "0x2000");
    assert_eq!(copy["dst"]["at"], "own-vram");
    assert_eq!(copy["status"], StatusCode::Ok.name());
    assert!(copy["dur_ns"].as_u64().is_some());
    assert!(copy.get("injected").is_none());
    let fill = jobs[1];
    assert_eq!(fill["name"], "FILL");
    assert_eq!(fill["status"], StatusCode::VramIo.name());
    assert_eq!(fill["injected"], true);
    let fault = events.iter().find(|e| e["kind"] == "fault").unwrap();
    assert_eq!(
        (fault["name"].as_str(), fault["error"].as_u64()),
        (Some("FILL"), Some(6))
    );
    assert_eq!(fault["injected"], true);
    assert!(events.iter().any(|e| e["kind"] == "irq"));
    assert!(events
        .iter()
        .any(|e| e["kind"] == "reset" && e["name"] == "device reset"));
    std::fs::remove_file(&path).unwrap();
}
